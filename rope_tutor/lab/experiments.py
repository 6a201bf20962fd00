"""The three experiments of Part V, each writing JSON results with provenance into one folder.

- ``train_short_test_long``: chapter "Train short, test long" (every encoding, 1x..16x T).
- ``extend_rope``: chapter "Extending a trained RoPE model" (PI, NTK, dynamic NTK, YaRN at
  inference; the attention-temperature sweep; short fine-tunes at 4T).
- ``find_the_needle``: chapter "Finding the needle" (synthetic passkey retrieval vs length).

``python -m rope_tutor.lab all`` runs them in that order (see ``rope_tutor.lab.__main__``).
"""

from __future__ import annotations

import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

import rope_tutor as rt
from rope_tutor.lab.data import (
    Corpus,
    fixed_target_windows,
    load_corpus,
    needle_batch,
    slice_windows,
    training_batches,
)
from rope_tutor.lab.evaluate import (
    chunked_loss,
    fixed_target_losses,
    needle_accuracy,
    per_position_loss,
)
from rope_tutor.lab.model import ENCODINGS, ModelConfig, TinyLM, load_checkpoint, save_checkpoint
from rope_tutor.lab.train import TrainConfig, train
from rope_tutor.results import RESULTS_DIR
from rope_tutor.results import load as load_saved

__all__ = [
    "LabSettings",
    "BOOK",
    "QUICK",
    "extension_methods",
    "train_language_model",
    "evaluate_language_model",
    "run_arm",
    "train_short_test_long",
    "extend_rope",
    "find_the_needle",
    "load_results",
]

#: Where the lab's results are saved: package data, so the chapters find them wherever the package
#: is installed (``rope_tutor.results.load("lab/…")``).
DATA_DIR = RESULTS_DIR / "lab"


@dataclass(frozen=True)
class LabSettings:
    """Every knob of the lab. ``BOOK`` is what the chapters show; ``QUICK`` is for smoke tests."""

    name: str = "book"
    context: int = 128
    multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    num_layers: int = 2
    train_bytes: int = 4_000_000
    validation_bytes: int = 400_000
    pretrain: TrainConfig = field(
        default_factory=lambda: TrainConfig(steps=500, batch_size=16, lr=2e-3, warmup_steps=50)
    )
    eval_windows: int = 32
    eval_seed: int = 1234
    chunked_bytes: int = 16384
    extend_factor: float = 4.0
    temperature_factors: tuple[float, ...] = (2.0, 4.0, 8.0)
    logit_multipliers: tuple[float, ...] = (
        0.8,
        0.9,
        1.0,
        1.1,
        1.2,
        1.3,
        1.4,
        1.5,
        1.6,
        1.8,
        2.0,
        2.4,
    )
    finetune: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            steps=100, batch_size=4, lr=6e-4, warmup_steps=10, seed=1
        )
    )
    needle_encodings: tuple[str, ...] = ("rope",)
    needle_key_length: int = 3
    needle_cue: int = 0
    needle_train: TrainConfig = field(
        default_factory=lambda: TrainConfig(steps=3000, batch_size=32, lr=3e-3, warmup_steps=30)
    )
    needle_multiples: tuple[int, ...] = (1, 2, 4, 8)
    needle_samples: int = 100
    needle_finetune: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            steps=60, batch_size=8, lr=6e-4, warmup_steps=10, seed=1
        )
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


BOOK = LabSettings()
QUICK = replace(
    BOOK,
    name="quick",
    multiples=(1, 2, 4),
    train_bytes=200_000,
    validation_bytes=40_000,
    pretrain=TrainConfig(steps=8, batch_size=4, warmup_steps=2),
    eval_windows=4,
    chunked_bytes=2048,
    temperature_factors=(2.0,),
    logit_multipliers=(1.0, 1.2),
    finetune=TrainConfig(steps=3, batch_size=2, lr=6e-4, warmup_steps=1, seed=1),
    needle_encodings=("rope",),
    needle_train=TrainConfig(steps=8, batch_size=8, warmup_steps=2),
    needle_multiples=(1, 2),
    needle_samples=8,
    needle_finetune=TrainConfig(steps=3, batch_size=2, lr=6e-4, warmup_steps=1, seed=1),
)


def provenance(
    settings: LabSettings, corpus: Corpus | None, command: str, **extra: Any
) -> dict[str, Any]:
    """What produced a number: versions, threads, seeds, steps, the corpus checksums, and the
    subcommand that re-creates the file (``all`` runs every subcommand)."""
    record = {
        "rope_tutor": rt.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "settings": settings.name,
        "command": f"python -m rope_tutor.lab {command}",
    }
    if corpus is not None:
        record.update(corpus.provenance())
    record.update(extra)
    return record


def _round(value: float | None, digits: int = 5) -> float | None:
    return None if value is None else round(float(value), digits)


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# Language-model training and evaluation, shared by experiments 1 and 2


def language_model_batches(corpus: Corpus, context: int, config: TrainConfig):
    """``step -> (inputs, targets, None)`` over random training windows; the offsets depend only
    on ``config.seed``, ``config.steps``, ``config.batch_size`` and ``context``."""
    starts = training_batches(corpus.train, config.batch_size, context, config.steps, config.seed)

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, None]:
        windows = slice_windows(corpus.train, starts[step], context + 1)
        return windows[:, :-1], windows[:, 1:], None

    return batch


def train_language_model(
    encoding: str, settings: LabSettings, corpus: Corpus, *, progress: bool = True
) -> tuple[TinyLM, list[float], float]:
    """Seed, build and pre-train one arm; returns ``(model, losses, seconds)``."""
    rt.seed_everything(settings.pretrain.seed)
    model = TinyLM(
        ModelConfig(encoding=encoding, num_layers=settings.num_layers, context=settings.context)
    )
    batches = language_model_batches(corpus, settings.context, settings.pretrain)
    start = time.perf_counter()
    losses = train(model, batches, settings.pretrain, description=encoding, progress=progress)
    return model, losses, time.perf_counter() - start


def evaluate_language_model(
    model: TinyLM, settings: LabSettings, corpus: Corpus, *, chunked: bool = True
) -> dict[str, Any]:
    """Fixed-target sweep, per-position loss at the longest length and (optionally) chunked
    losses. Lengths a model cannot run (a learned table past its size) are recorded as ``None``
    with the error message."""
    contexts = [m * settings.context for m in settings.multiples]
    windows = fixed_target_windows(
        corpus.validation, settings.eval_windows, contexts[-1], settings.eval_seed
    )
    fixed, errors = {}, {}
    for multiple, context in zip(settings.multiples, contexts, strict=True):
        try:
            mean, error = fixed_target_losses(model, windows, [context], settings.context)[context]
            fixed[str(multiple)] = {"mean": _round(mean), "stderr": _round(error)}
        except IndexError as exc:  # the learned table has no row for this position
            fixed[str(multiple)] = None
            errors[str(multiple)] = str(exc)
    result: dict[str, Any] = {"fixed_target": fixed}
    if errors:
        result["errors"] = errors
    if fixed[str(settings.multiples[-1])] is not None:
        curve = per_position_loss(model, windows)
        result["per_position"] = [_round(v, 4) for v in curve.tolist()]
    if chunked:
        chunks = {}
        for multiple, context in zip(settings.multiples, contexts, strict=True):
            try:
                chunks[str(multiple)] = _round(
                    chunked_loss(model, corpus.validation, context, settings.chunked_bytes)
                )
            except IndexError:
                chunks[str(multiple)] = None
        result["chunked"] = chunks
    return result


# ----------------------------------------------------------------------------------------------
# Experiment 1


def _arm(
    encoding: str, settings: LabSettings, corpus: Corpus, *, progress: bool
) -> tuple[dict[str, Any], TinyLM]:
    model, losses, seconds = train_language_model(encoding, settings, corpus, progress=progress)
    result = evaluate_language_model(model, settings, corpus)
    result["train_loss"] = [
        _round(sum(losses[i : i + 10]) / len(losses[i : i + 10]), 4)
        for i in range(0, len(losses), 10)
    ]
    result["train_seconds"] = round(seconds, 1)
    return result, model


def run_arm(
    encoding: str, settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train and evaluate one arm of experiment 1 alone; writes ``arm_<encoding>.json``."""
    result, _ = _arm(encoding, settings, corpus, progress=progress)
    result["provenance"] = provenance(
        settings,
        corpus,
        f"arm --encoding {encoding}",
        seed=settings.pretrain.seed,
        steps=settings.pretrain.steps,
        train=settings.pretrain.to_dict(),
        num_layers=settings.num_layers,
    )
    _write(out_dir / f"arm_{encoding}.json", result)
    return result


def train_short_test_long(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train every encoding at T and evaluate it at every multiple of T. Writes
    ``train_short_test_long.json`` and the RoPE checkpoint ``rope.safetensors``."""
    arms = {}
    for encoding in ENCODINGS:
        arms[encoding], model = _arm(encoding, settings, corpus, progress=progress)
        if encoding == "rope":
            save_checkpoint(model, out_dir / "rope.safetensors")
    payload = {
        "experiment": "train short, test long",
        "protocol": {
            "context": settings.context,
            "multiples": list(settings.multiples),
            "fixed_target": f"mean loss (nats/byte) on the last {settings.context} bytes of "
            f"{settings.eval_windows} validation windows (seed {settings.eval_seed})",
            "chunked": f"mean loss over the first {settings.chunked_bytes} validation bytes "
            "cut into non-overlapping chunks of each length",
            "per_position": f"loss at each position of the {settings.multiples[-1]}x windows",
        },
        "provenance": provenance(
            settings,
            corpus,
            "train-short-test-long",
            seed=settings.pretrain.seed,
            steps=settings.pretrain.steps,
            train=settings.pretrain.to_dict(),
            num_layers=settings.num_layers,
        ),
        "arms": arms,
    }
    _write(out_dir / "train_short_test_long.json", payload)
    return payload


# ----------------------------------------------------------------------------------------------
# Experiment 2


def extension_methods(settings: LabSettings) -> dict[str, dict[str, Any] | None]:
    """The inference-time methods of experiment 2 as Hugging Face style ``rope_scaling`` dicts.

    Static methods use ONE factor s = ``extend_factor`` at every length, so that their cost at
    short lengths shows. Dynamic NTK recomputes s = max(1, l / T) from the length l it sees
    (``factor`` 1 is emozilla's alpha = 1). YaRN runs with the paper's beta (32, 1), tuned for
    LLaMA's 2k-4k windows, and with beta rescaled by T / 4096 (1, 1/32): beta counts turns of a
    pair inside the window, and a window 32x shorter holds 32x fewer turns.
    """
    s, window = settings.extend_factor, settings.context
    yarn = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": window}
    return {
        "rope": None,
        "pi": {"rope_type": "linear", "factor": s},
        "ntk": {"rope_type": "ntk", "factor": s},
        "dynamic_ntk": {
            "rope_type": "dynamic",
            "factor": 1.0,
            "original_max_position_embeddings": window,
        },
        "yarn_paper_beta": {**yarn, "beta_fast": 32.0, "beta_slow": 1.0},
        "yarn_rescaled_beta": {**yarn, **_rescaled_beta(window)},
    }


def _rescaled_beta(window: int) -> dict[str, float]:
    return {"beta_fast": 32.0 * window / 4096, "beta_slow": 1.0 * window / 4096}


def _rope_model(settings: LabSettings, corpus: Corpus, out_dir: Path) -> TinyLM:
    """The RoPE arm of experiment 1: loaded from its checkpoint, or trained when absent."""
    path = out_dir / "rope.safetensors"
    if path.exists():
        return load_checkpoint(path)
    model, _, _ = train_language_model("rope", settings, corpus)
    save_checkpoint(model, path)
    return model


def _finetune(
    model: TinyLM,
    scaling: dict[str, Any] | None,
    settings: LabSettings,
    corpus: Corpus,
    *,
    progress: bool,
    name: str,
) -> tuple[TinyLM, float]:
    """A copy of ``model`` fine-tuned at ``extend_factor * T`` with ``scaling`` in place."""
    rt.seed_everything(settings.finetune.seed)
    tuned = TinyLM(model.config)
    tuned.load_state_dict(model.state_dict())
    tuned.set_rope_scaling(scaling)
    length = int(settings.extend_factor * settings.context)
    batches = language_model_batches(corpus, length, settings.finetune)
    start = time.perf_counter()
    train(tuned, batches, settings.finetune, description=name, progress=progress)
    return tuned, time.perf_counter() - start


def extend_rope(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Context extension of the experiment-1 RoPE model. Writes ``extend_rope.json``."""
    base_model = _rope_model(settings, corpus, out_dir)
    methods = extension_methods(settings)
    inference = {}
    for name, scaling in methods.items():
        base_model.set_rope_scaling(scaling)
        inference[name] = {"scaling": scaling}
        inference[name].update(evaluate_language_model(base_model, settings, corpus, chunked=False))

    # Sanity check: PI with factor 1 is plain RoPE, bit for bit.
    base_model.set_rope_scaling({"rope_type": "linear", "factor": 1.0})
    pi_one = evaluate_language_model(base_model, settings, corpus, chunked=False)
    sanity = {
        "pi_factor_1_equals_rope": pi_one["fixed_target"] == inference["rope"]["fixed_target"]
    }

    # Attention temperature: YaRN (paper's beta) at factor s, scored on the same windows and
    # targets as above with s * T bytes of input, the logit multiplier 1/t swept (cos and sin are
    # multiplied by its square root), and once with YaRN's own 0.1 ln s + 1.
    windows = fixed_target_windows(
        corpus.validation,
        settings.eval_windows,
        settings.multiples[-1] * settings.context,
        settings.eval_seed,
    )
    temperature = {}
    for s in settings.temperature_factors:
        length = int(s * settings.context)
        yarn = {**methods["yarn_paper_beta"], "factor": s}
        sweep = {}
        for multiplier in (*settings.logit_multipliers, None):
            extra = {} if multiplier is None else {"attention_factor": math.sqrt(multiplier)}
            base_model.set_rope_scaling({**yarn, **extra})
            mean, _ = fixed_target_losses(base_model, windows, [length], settings.context)[length]
            sweep["yarn_formula" if multiplier is None else str(multiplier)] = _round(mean)
        temperature[str(s)] = {
            "sweep": sweep,
            "yarn_formula_multiplier": _round((0.1 * math.log(s) + 1) ** 2, 4),
        }
    base_model.set_rope_scaling(None)

    finetuned = {}
    s = settings.extend_factor
    tune_arms = {
        "finetune_plain": None,
        "finetune_pi": methods["pi"],
        "finetune_yarn": methods["yarn_paper_beta"],
    }
    for name, scaling in tune_arms.items():
        tuned, seconds = _finetune(
            base_model, scaling, settings, corpus, progress=progress, name=name
        )
        finetuned[name] = {"scaling": scaling, "train_seconds": round(seconds, 1)}
        finetuned[name].update(evaluate_language_model(tuned, settings, corpus, chunked=False))

    payload = {
        "experiment": "extending a trained RoPE model",
        "protocol": {
            "context": settings.context,
            "factor": s,
            "multiples": list(settings.multiples),
            "fixed_target": "as in train_short_test_long.json (same windows)",
            "finetune": f"{settings.finetune.steps} steps at {int(s * settings.context)} bytes, "
            f"batch {settings.finetune.batch_size}, peak lr {settings.finetune.lr}",
        },
        "provenance": provenance(
            settings,
            corpus,
            "extend",
            seed=settings.pretrain.seed,
            steps=settings.pretrain.steps,
            finetune=settings.finetune.to_dict(),
        ),
        "sanity": sanity,
        "inference": inference,
        "temperature": temperature,
        "finetuned": finetuned,
    }
    _write(out_dir / "extend_rope.json", payload)
    return payload


# ----------------------------------------------------------------------------------------------
# Experiment 3


def needle_batches(settings: LabSettings, config: TrainConfig, length: int):
    """``step -> (inputs, targets, weights)`` of the needle task; only the key letters after
    the cue are scored."""
    key, scored = settings.needle_key_length, settings.needle_key_length - settings.needle_cue

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
        tokens, _ = needle_batch(config.batch_size, length + 1, key, generator)
        weights = torch.zeros(config.batch_size, length)
        weights[:, -scored:] = 1.0
        return tokens[:, :-1], tokens[:, 1:], weights

    return batch


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


def find_the_needle(
    settings: LabSettings, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train a retrieval model per encoding at T, then sweep the length. Writes ``needle.json``.

    The length sweep of an arm is reported only when its in-window exact match is >= 95%.
    """
    arms = {}
    for encoding in settings.needle_encodings:
        config = settings.needle_train
        rt.seed_everything(config.seed)
        model = TinyLM(
            ModelConfig(encoding=encoding, num_layers=settings.num_layers, context=settings.context)
        )
        start = time.perf_counter()
        losses = train(
            model,
            needle_batches(settings, config, settings.context),
            config,
            description=f"needle-{encoding}",
            progress=progress,
        )
        seconds = time.perf_counter() - start
        in_window = needle_accuracy(
            model,
            settings.context,
            settings.needle_samples,
            settings.needle_key_length,
            seed=settings.eval_seed,
            cue=settings.needle_cue,
        )
        arm: dict[str, Any] = {
            "train_seconds": round(seconds, 1),
            "final_train_loss": _round(sum(losses[-20:]) / len(losses[-20:]), 4),
            "in_window": in_window,
            "learned": in_window["exact_match"] >= 0.95,
        }
        if arm["learned"]:
            arm["sweep"] = _needle_sweep(model, settings)
        arms[encoding] = arm

        if encoding == "rope" and arm["learned"]:
            for name, scaling in extension_methods(settings).items():
                if scaling is None:
                    continue
                model.set_rope_scaling(scaling)
                arms[f"rope+{name}"] = {"scaling": scaling, "sweep": _needle_sweep(model, settings)}
            pi = extension_methods(settings)["pi"]
            model.set_rope_scaling(pi)
            rt.seed_everything(settings.needle_finetune.seed)
            length = int(settings.extend_factor * settings.context)
            start = time.perf_counter()
            train(
                model,
                needle_batches(settings, settings.needle_finetune, length),
                settings.needle_finetune,
                description="needle-rope+pi-finetune",
                progress=progress,
            )
            arms["rope+pi_finetuned"] = {
                "scaling": pi,
                "train_seconds": round(time.perf_counter() - start, 1),
                "sweep": _needle_sweep(model, settings),
            }
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
            "threshold": "length sweep reported only when in-window exact match >= 0.95",
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
    _write(out_dir / "needle.json", payload)
    return payload


# ----------------------------------------------------------------------------------------------
# Summary


def write_summary(out_dir: Path) -> dict[str, Any]:
    """``summary.json``: every arm's fixed-target loss at each context multiple, gathered from
    the experiment files present in ``out_dir``."""
    arms: dict[str, Any] = {}
    provenance_record = None
    first = out_dir / "train_short_test_long.json"
    if first.exists():
        data = json.loads(first.read_text(encoding="utf-8"))
        provenance_record = data["provenance"]
        for name, arm in data["arms"].items():
            arms[name] = _means(arm["fixed_target"])
    second = out_dir / "extend_rope.json"
    if second.exists():
        data = json.loads(second.read_text(encoding="utf-8"))
        for group in ("inference", "finetuned"):
            for name, arm in data[group].items():
                key = f"rope+{name}" if group == "inference" and name != "rope" else name
                arms.setdefault(key, _means(arm["fixed_target"]))
    payload = {
        "description": "fixed-target loss (nats/byte on the same last T bytes) at each multiple "
        "of the training context T; null where the model cannot run",
        "provenance": provenance_record,
        "arms": arms,
    }
    _write(out_dir / "summary.json", payload)
    return payload


def _means(fixed: dict[str, Any]) -> dict[str, float | None]:
    return {m: (None if v is None else v["mean"]) for m, v in fixed.items()}


def load_corpus_for(settings: LabSettings) -> Corpus:
    return load_corpus(settings.train_bytes, settings.validation_bytes)


def load_results(name: str, data_dir: Path | None = None) -> dict[str, Any]:
    """A result file of the lab, e.g. ``load_results("summary.json")``, as a dict.

    Without ``data_dir`` it reads the results saved with the package
    (``rope_tutor.results.load("lab/" + name)``), so it works from any installation; with
    ``data_dir`` it reads ``data_dir / name`` (the ``--out`` folder of a run of your own). Raises
    ``FileNotFoundError`` naming the missing file.
    """
    if data_dir is None:
        return load_saved(f"lab/{name}")
    path = Path(data_dir) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: write it with `python -m rope_tutor.lab all --out {data_dir}`"
        )
    return json.loads(path.read_text(encoding="utf-8"))
