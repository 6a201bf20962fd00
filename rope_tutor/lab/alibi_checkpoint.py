"""Step 1c of the lab, chapter "Train short, test long": the ALiBi arm's checkpoint.

Part V. Step 1 saves only the RoPE arm's weights (``rope.safetensors``). ``alibi-checkpoint``
trains the ALiBi arm again, exactly as step 1 does (``short_long.train_language_model``: same
seed, batches and steps), checks that it gives step 1's saved fixed-target means and training
curve back (``reproduction``), and saves it as ``alibi.safetensors``, read back with
``rope_tutor.lab.load_model("alibi", seed)`` (chapter "ALiBi" draws a trained model's per-head
attention from it). It writes ``alibi_checkpoint.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rope_tutor.lab.data import Corpus, fixed_target_windows
from rope_tutor.lab.evaluate import fixed_target_losses
from rope_tutor.lab.model import save_checkpoint
from rope_tutor.lab.records import provenance, rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.short_long import train_language_model

__all__ = ["alibi_checkpoint"]


def alibi_checkpoint(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train step 1's ALiBi arm again, save ``alibi.safetensors`` and write
    ``alibi_checkpoint.json``: its fixed-target means on the book's windows and, when
    ``train_short_test_long.json`` is in ``out_dir``, the largest |difference| from the saved
    means (nats/byte) and from the saved training curve (mean loss per 10 steps)."""
    fitted = train_language_model("alibi", settings, corpus, progress=progress)
    save_checkpoint(fitted.model, out_dir / "alibi.safetensors")
    contexts = [m * settings.context for m in settings.multiples]
    windows = fixed_target_windows(
        corpus.validation, settings.eval_windows, contexts[-1], settings.eval_seed
    )
    losses = fixed_target_losses(fitted.model, windows, contexts, settings.context)
    means = {
        str(m): rounded(losses[c][0]) for m, c in zip(settings.multiples, contexts, strict=True)
    }
    curve = [
        sum(fitted.losses[i : i + 10]) / len(fitted.losses[i : i + 10])
        for i in range(0, len(fitted.losses), 10)
    ]
    reproduction: dict[str, Any] = {}
    path = out_dir / "train_short_test_long.json"
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))["arms"]["alibi"]
        reproduction = {
            "fixed_target_max_abs": rounded(
                max(abs(means[m] - v["mean"]) for m, v in saved["fixed_target"].items()), 6
            ),
            "train_loss_max_abs": rounded(
                max(abs(a - b) for a, b in zip(curve, saved["train_loss"], strict=True)), 6
            ),
        }
    payload = {
        "experiment": "the ALiBi arm of train short, test long, trained again and saved",
        "protocol": {
            "context": settings.context,
            "multiples": list(settings.multiples),
            "fixed_target": "as in train_short_test_long.json, on its windows (seed "
            f"{settings.eval_seed})",
            "checkpoint": "alibi.safetensors, the model these means are measured on",
        },
        "provenance": provenance(
            settings,
            corpus,
            "alibi-checkpoint",
            seed=settings.pretrain.seed,
            steps=settings.pretrain.steps,
            train=settings.pretrain.to_dict(),
            num_layers=settings.num_layers,
        ),
        "fixed_target": means,
        "train_seconds": round(fitted.seconds, 1),
        "reproduction": reproduction,
    }
    write_result(out_dir / "alibi_checkpoint.json", payload)
    return payload
