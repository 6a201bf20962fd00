"""Step 1 of the lab, chapter "Train short, test long": every encoding trained at T, tested at
1x..16x T.

Part V. ``train_short_test_long`` trains one arm per position encoding (``ENCODINGS``) with
``LabSettings.pretrain`` and evaluates it with ``evaluate_language_model``: the fixed-target
sweep, the per-position loss and ALiBi's chunked loss (``rope_tutor.lab.evaluate``). It writes
``train_short_test_long.json`` and the RoPE checkpoint ``rope.safetensors``, which step 2
(``rope_tutor.lab.extend``) extends. ``run_arm`` re-trains one arm alone (``arm_<encoding>.json``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rope_tutor.lab.data import Corpus, fixed_target_windows, slice_windows, training_batches
from rope_tutor.lab.evaluate import chunked_loss, fixed_target_losses, per_position_loss
from rope_tutor.lab.model import ENCODINGS, TinyLM, save_checkpoint
from rope_tutor.lab.records import provenance, rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.train import BatchFactory, Fitted, TrainConfig, fit

__all__ = [
    "evaluate_language_model",
    "language_model_batches",
    "run_arm",
    "train_language_model",
    "train_short_test_long",
]


def language_model_batches(corpus: Corpus, context: int) -> BatchFactory:
    """``config -> (step -> (inputs, targets, None))`` over random training windows of
    ``context + 1`` bytes; the offsets depend only on ``config.seed``, ``config.steps``,
    ``config.batch_size`` and ``context``. Inputs and targets are int64 ``(batch, context)``."""

    def factory(config: TrainConfig):
        starts = training_batches(
            corpus.train, config.batch_size, context, config.steps, config.seed
        )

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor, None]:
            windows = slice_windows(corpus.train, starts[step], context + 1)
            return windows[:, :-1], windows[:, 1:], None

        return batch

    return factory


def train_language_model(
    encoding: str,
    settings: LabSettings,
    corpus: Corpus,
    *,
    seed: int | None = None,
    rope_base: float | None = None,
    progress: bool = True,
) -> Fitted:
    """Seed, build and pre-train one arm at T (``settings.pretrain``; ``seed`` defaults to its
    seed) with ``fit``. ``rope_base`` (RoPE only) replaces the model's base b of
    theta_i = b^(-2i/d_h) (chapter "RoPE's distance, base and precision"; default: the
    ``ModelConfig``'s 10^4); nothing else changes, not the initial weights nor the batches.
    Raises ``ValueError`` for ``rope_base`` with another encoding."""
    config = settings.model_config(encoding)
    if rope_base is not None:
        if encoding != "rope":
            raise ValueError(
                f"rope_base needs encoding='rope', got encoding={encoding!r}, rope_base={rope_base}"
            )
        config = replace(config, rope_base=float(rope_base))
    return fit(
        config,
        language_model_batches(corpus, settings.context),
        settings.pretrain,
        seed=seed,
        description=encoding if rope_base is None else f"{encoding}, b = {rope_base:g}",
        progress=progress,
    )


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
            fixed[str(multiple)] = {"mean": rounded(mean), "stderr": rounded(error)}
        except IndexError as exc:  # the learned table has no row for this position
            fixed[str(multiple)] = None
            errors[str(multiple)] = str(exc)
    result: dict[str, Any] = {"fixed_target": fixed}
    if errors:
        result["errors"] = errors
    if fixed[str(settings.multiples[-1])] is not None:
        curve = per_position_loss(model, windows)
        result["per_position"] = [rounded(v, 4) for v in curve.tolist()]
    if chunked:
        chunks = {}
        for multiple, context in zip(settings.multiples, contexts, strict=True):
            try:
                chunks[str(multiple)] = rounded(
                    chunked_loss(model, corpus.validation, context, settings.chunked_bytes)
                )
            except IndexError:
                chunks[str(multiple)] = None
        result["chunked"] = chunks
    return result


def _arm(
    encoding: str, settings: LabSettings, corpus: Corpus, *, progress: bool
) -> tuple[dict[str, Any], TinyLM]:
    """Train and evaluate one arm: its results (with the training loss per 10 steps) and model."""
    fitted = train_language_model(encoding, settings, corpus, progress=progress)
    result = evaluate_language_model(fitted.model, settings, corpus)
    losses = fitted.losses
    result["train_loss"] = [
        rounded(sum(losses[i : i + 10]) / len(losses[i : i + 10]), 4)
        for i in range(0, len(losses), 10)
    ]
    result["train_seconds"] = round(fitted.seconds, 1)
    return result, fitted.model


def _provenance(settings: LabSettings, corpus: Corpus, command: str) -> dict[str, Any]:
    return provenance(
        settings,
        corpus,
        command,
        seed=settings.pretrain.seed,
        steps=settings.pretrain.steps,
        train=settings.pretrain.to_dict(),
        num_layers=settings.num_layers,
    )


def run_arm(
    encoding: str, settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train and evaluate one arm of step 1 alone; writes ``arm_<encoding>.json``."""
    result, _ = _arm(encoding, settings, corpus, progress=progress)
    result["provenance"] = _provenance(settings, corpus, f"arm --encoding {encoding}")
    write_result(out_dir / f"arm_{encoding}.json", result)
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
        "provenance": _provenance(settings, corpus, "train-short-test-long"),
        "arms": arms,
    }
    write_result(out_dir / "train_short_test_long.json", payload)
    return payload
