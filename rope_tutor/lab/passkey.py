"""Step 3 of the lab, chapter "Finding the needle": synthetic passkey retrieval versus length.

Part V. ``find_the_needle`` trains a retrieval model per encoding at T on the needle task of
``rope_tutor.lab.data.needle_batch`` (``LabSettings.needle_train``), sweeps the length once the
model retrieves in its window, swaps in the methods of ``rope_tutor.lab.extend`` and fine-tunes
a copy with PI at ``extend_factor * T``. It writes ``needle.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from rope_tutor.lab.data import needle_batch
from rope_tutor.lab.evaluate import needle_accuracy
from rope_tutor.lab.extend import extension_methods
from rope_tutor.lab.model import TinyLM
from rope_tutor.lab.records import provenance, rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.train import BatchFactory, TrainConfig, fit

__all__ = ["find_the_needle", "needle_batches"]

#: An arm's length sweep is reported only when its in-window exact match reaches this.
LEARNED_THRESHOLD = 0.95


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


def _needle_sweep(model: TinyLM, settings: LabSettings) -> dict[str, Any]:
    return {
        str(m): needle_accuracy(
            model,
            m * settings.context,
            settings.needle_samples,
            settings.needle_key_length,
            seed=settings.eval_seed + m,
            cue=settings.needle_cue,
        )
        for m in settings.needle_multiples
    }


def _extended_arms(model: TinyLM, settings: LabSettings, *, progress: bool) -> dict[str, Any]:
    """The trained RoPE retrieval model with each method of step 2 swapped in, and a copy
    fine-tuned with PI at ``extend_factor * T`` (``settings.needle_finetune``)."""
    arms: dict[str, Any] = {}
    methods = extension_methods(settings)
    for name, scaling in methods.items():
        if scaling is None:
            continue
        model.set_rope_scaling(scaling)
        arms[f"rope+{name}"] = {"scaling": scaling, "sweep": _needle_sweep(model, settings)}
    model.set_rope_scaling(None)
    length = int(settings.extend_factor * settings.context)
    fitted = fit(
        model,
        needle_batches(settings, length),
        settings.needle_finetune,
        scaling=methods["pi"],
        description="needle-rope+pi-finetune",
        progress=progress,
    )
    arms["rope+pi_finetuned"] = {
        "scaling": methods["pi"],
        "train_seconds": round(fitted.seconds, 1),
        "sweep": _needle_sweep(fitted.model, settings),
    }
    return arms


def find_the_needle(
    settings: LabSettings, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train a retrieval model per encoding at T, then sweep the length. Writes ``needle.json``.

    The length sweep of an arm is reported only when its in-window exact match is >= 95%.
    """
    arms = {}
    for encoding in settings.needle_encodings:
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
            seed=settings.eval_seed,
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
            result["sweep"] = _needle_sweep(fitted.model, settings)
        arms[encoding] = result
        if encoding == "rope" and result["learned"]:
            arms.update(_extended_arms(fitted.model, settings, progress=progress))
    payload = {
        "experiment": "finding the needle",
        "protocol": {
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
            "finetune": f"PI (factor {settings.extend_factor}) "
            f"{settings.needle_finetune.steps} steps at "
            f"{int(settings.extend_factor * settings.context)} bytes",
        },
        "provenance": provenance(
            settings,
            None,
            "passkey",
            seed=settings.needle_train.seed,
            steps=settings.needle_train.steps,
            train=settings.needle_train.to_dict(),
            finetune=settings.needle_finetune.to_dict(),
            data="synthetic (rope_tutor.lab.data.needle_batch, seeded)",
        ),
        "arms": arms,
    }
    write_result(out_dir / "needle.json", payload)
    return payload
