"""Step 3 of the lab, chapter "Finding the needle": synthetic passkey retrieval versus length.

Part V. ``find_the_needle`` trains a retrieval model per encoding at T on the needle task of
``rope_tutor.lab.data.needle_batch`` (``LabSettings.needle_train``), sweeps the length once the
model retrieves in its window, swaps in the methods of ``rope_tutor.lab.extend`` and fine-tunes
a copy with PI at ``extend_factor * T``. It writes ``needle.json``.

``needle_arm`` trains one more encoding (ALiBi, ``OTHER_ENCODINGS``) with the same recipe into
its own file, ``needle_<encoding>.json``, so that adding an arm never re-trains the RoPE arm of
``needle.json``. ``needle_depth_counts`` regenerates how many of a measurement's samples fall in
each depth bin (the files store the fraction per bin, not the count).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rope_tutor.lab.data import needle_batch
from rope_tutor.lab.evaluate import needle_accuracy, needle_depth_bins
from rope_tutor.lab.extend import extension_methods
from rope_tutor.lab.model import ENCODINGS, TinyLM
from rope_tutor.lab.records import provenance, rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.train import BatchFactory, TrainConfig, fit

__all__ = [
    "OTHER_ENCODINGS",
    "extended_models",
    "find_the_needle",
    "needle_arm",
    "needle_batches",
    "needle_depth_counts",
    "needle_protocol",
    "needle_provenance",
    "needle_seed",
    "needle_sweep",
    "train_needle_arm",
]

#: An arm's length sweep is reported only when its in-window exact match reaches this.
LEARNED_THRESHOLD = 0.95

#: The methods of ``extension_methods`` the retrieval model is also fine-tuned with ("rope":
#: plain RoPE fine-tuned at the longer length); arm names ``rope+<name>_finetuned``, plain is
#: ``rope+plain_finetuned``.
FINETUNED: tuple[str, ...] = ("rope", "pi", "ntk", "yarn_paper_beta")

#: Encodings that ``passkey`` (hence ``all``) also trains on the needle task, each with the
#: recipe of the RoPE arm and into its own file ``needle_<encoding>.json``.
OTHER_ENCODINGS: tuple[str, ...] = ("alibi",)


def needle_seed(settings: LabSettings, multiple: int | None) -> int:
    """The seed of the evaluation samples: ``eval_seed`` for the in-window measurement
    (``multiple=None``), ``eval_seed + multiple`` for the sweep at ``multiple * T``. Every arm
    of a sweep is scored on the same samples at a given length; the in-window measurement and
    the sweep's ``1`` entry use different samples of the same length."""
    return settings.eval_seed if multiple is None else settings.eval_seed + multiple


def needle_depth_counts(
    settings: LabSettings, multiple: int | None, depth_bins: int = 4
) -> list[int]:
    """How many of the ``needle_samples`` samples of one measurement lie in each depth bin
    (bin 0 = needle farthest from the question), regenerated from the measurement's seed
    (``needle_seed``). ``multiple=None`` is the in-window measurement."""
    length = settings.context * (1 if multiple is None else multiple)
    generator = torch.Generator().manual_seed(needle_seed(settings, multiple))
    _, depth = needle_batch(settings.needle_samples, length, settings.needle_key_length, generator)
    bins = needle_depth_bins(depth, length, settings.needle_key_length, depth_bins)
    return torch.bincount(bins, minlength=depth_bins).tolist()


def needle_batches(settings: LabSettings, length: int) -> BatchFactory:
    """``config -> (step -> (inputs, targets, weights))`` of the needle task at ``length``
    bytes; only the key letters after the cue are scored (weight 1, else 0). Batch ``step`` is
    drawn from a generator seeded with ``config.seed * 1_000_003 + step``."""
    key, scored = settings.needle_key_length, settings.needle_key_length - settings.needle_cue

    def factory(config: TrainConfig):
        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
            tokens, _ = needle_batch(config.batch_size, length + 1, key, generator)
            weights = torch.zeros(config.batch_size, length)
            weights[:, -scored:] = 1.0
            return tokens[:, :-1], tokens[:, 1:], weights

        return batch

    return factory


def needle_sweep(model: TinyLM, settings: LabSettings) -> dict[str, Any]:
    return {
        str(m): needle_accuracy(
            model,
            m * settings.context,
            settings.needle_samples,
            settings.needle_key_length,
            seed=needle_seed(settings, m),
            cue=settings.needle_cue,
        )
        for m in settings.needle_multiples
    }


def extended_models(
    model: TinyLM, settings: LabSettings, *, progress: bool
) -> Iterator[tuple[str, dict[str, Any] | None, TinyLM, float | None]]:
    """The arms of ``needle.json`` beyond plain RoPE, in the file's order, as ``(arm name,
    scaling, model, fine-tuning seconds or None)``: the trained RoPE retrieval model ``model``
    with each method of step 2 swapped in (``rope+<method>``; the same object, its scaling set
    until the next item), then copies fine-tuned at ``extend_factor * T``
    (``settings.needle_finetune``) with plain RoPE, PI, NTK-aware and YaRN (paper's beta) in
    place, as the language model of step 2 is (``rope+<method>_finetuned``). Consume each item
    before asking for the next; ``model`` is left with no scaling at the end."""
    methods = extension_methods(settings)
    for name, scaling in methods.items():
        if scaling is None:
            continue
        model.set_rope_scaling(scaling)
        yield f"rope+{name}", scaling, model, None
    model.set_rope_scaling(None)
    length = int(settings.extend_factor * settings.context)
    for name in FINETUNED:
        scaling = methods[name]
        fitted = fit(
            model,
            needle_batches(settings, length),
            settings.needle_finetune,
            scaling=scaling,
            description=f"needle-{name}-finetune",
            progress=progress,
        )
        arm = f"{'rope+plain' if name == 'rope' else 'rope+' + name}_finetuned"
        yield arm, scaling, fitted.model, fitted.seconds


def _extended_arms(model: TinyLM, settings: LabSettings, *, progress: bool) -> dict[str, Any]:
    """Every arm of ``extended_models`` with its length sweep (and, when fine-tuned, its
    training time)."""
    arms: dict[str, Any] = {}
    for name, scaling, arm_model, seconds in extended_models(model, settings, progress=progress):
        arms[name] = {"scaling": scaling}
        if seconds is not None:
            arms[name]["train_seconds"] = round(seconds, 1)
        arms[name]["sweep"] = needle_sweep(arm_model, settings)
    return arms


def train_needle_arm(
    encoding: str, settings: LabSettings, *, progress: bool
) -> tuple[TinyLM, dict[str, Any]]:
    """Train the retrieval model of ``encoding`` at T and measure it in its window; sweep the
    length when it passes ``LEARNED_THRESHOLD``. Returns the model and the arm's record."""
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got encoding={encoding!r}")
    fitted = fit(
        settings.model_config(encoding),
        needle_batches(settings, settings.context),
        settings.needle_train,
        description=f"needle-{encoding}",
        progress=progress,
    )
    in_window = needle_accuracy(
        fitted.model,
        settings.context,
        settings.needle_samples,
        settings.needle_key_length,
        seed=needle_seed(settings, None),
        cue=settings.needle_cue,
    )
    losses = fitted.losses
    result: dict[str, Any] = {
        "train_seconds": round(fitted.seconds, 1),
        "final_train_loss": rounded(sum(losses[-20:]) / len(losses[-20:]), 4),
        "in_window": in_window,
        "learned": in_window["exact_match"] >= LEARNED_THRESHOLD,
    }
    if result["learned"]:
        result["sweep"] = needle_sweep(fitted.model, settings)
    return fitted.model, result


def needle_protocol(settings: LabSettings) -> dict[str, Any]:
    """The ``protocol`` entry of ``needle.json``: the task, key, samples, lengths, bar and
    fine-tunes of ``settings``."""
    return {
        "context": settings.context,
        "task": "random lowercase filler with '=KEY' hidden at a uniform depth, ending with "
        f"'=KEY'; KEY = {settings.needle_key_length} distinct capital letters, the first "
        f"{settings.needle_cue} given (a cue, not scored); exact match of the teacher-forced "
        "argmax over the other key letters",
        "key_length": settings.needle_key_length,
        "cue": settings.needle_cue,
        "samples_per_length": settings.needle_samples,
        "multiples": list(settings.needle_multiples),
        "threshold": "length sweep reported only when in-window exact match >= "
        f"{LEARNED_THRESHOLD}",
        "finetune": f"plain, PI, NTK-aware and YaRN (factor {settings.extend_factor}) "
        f"{settings.needle_finetune.steps} steps each at "
        f"{int(settings.extend_factor * settings.context)} bytes",
    }


def needle_provenance(settings: LabSettings, command: str, *, finetune: bool) -> dict[str, Any]:
    """The ``provenance`` of a needle file written by ``command``: training recipe and seed, and
    the fine-tuning recipe when ``finetune``."""
    extra = {"finetune": settings.needle_finetune.to_dict()} if finetune else {}
    return provenance(
        settings,
        None,
        command,
        seed=settings.needle_train.seed,
        steps=settings.needle_train.steps,
        train=settings.needle_train.to_dict(),
        **extra,
        data="synthetic (rope_tutor.lab.data.needle_batch, seeded)",
    )


def find_the_needle(
    settings: LabSettings, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train a retrieval model per encoding at T, then sweep the length. Writes ``needle.json``.

    The length sweep of an arm is reported only when its in-window exact match is >= 95%.
    """
    arms = {}
    for encoding in settings.needle_encodings:
        model, result = train_needle_arm(encoding, settings, progress=progress)
        arms[encoding] = result
        if encoding == "rope" and result["learned"]:
            arms.update(_extended_arms(model, settings, progress=progress))
    payload = {
        "experiment": "finding the needle",
        "protocol": needle_protocol(settings),
        "provenance": needle_provenance(settings, "passkey", finetune=True),
        "arms": arms,
    }
    write_result(out_dir / "needle.json", payload)
    return payload


def needle_arm(
    encoding: str, settings: LabSettings, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train the retrieval model of one more ``encoding`` with the recipe of ``needle.json``'s
    RoPE arm (same steps, batches, seed and samples) and write ``needle_<encoding>.json``, laid
    out like ``needle.json`` with the one arm (``python -m rope_tutor.lab needle-arm
    --encoding <encoding>``). Raises ``ValueError`` naming an unknown ``encoding``."""
    _, result = train_needle_arm(encoding, settings, progress=progress)
    payload = {
        "experiment": "finding the needle",
        "protocol": {k: v for k, v in needle_protocol(settings).items() if k != "finetune"},
        "provenance": needle_provenance(
            settings, f"needle-arm --encoding {encoding}", finetune=False
        ),
        "arms": {encoding: result},
    }
    write_result(out_dir / f"needle_{encoding}.json", payload)
    return payload
