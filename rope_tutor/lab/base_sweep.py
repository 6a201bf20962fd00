"""Step 1c of the lab, chapter "Train short, test long": what RoPE's base does to a trained model.

Part V. Chapter "The extrapolation problem" teaches a trade-off: a small base b makes every pair
of theta_i = b^(-2i/d_h) turn inside the training window (no unseen angles past T, the regime of
Liu et al.'s base 500 for Llama 2, "Scaling Laws of RoPE-based Extrapolation", 2024), a large
base leaves the slow pairs short of a turn (unseen angles past T) but keeps angles that grow
steadily with the distance out to about 2 pi b. ``base_sweep`` tests it on trained models: RoPE
trained exactly as step 1 trains it (``train_language_model``: same seed, initial weights,
batches and steps) with each base of ``LabSettings.rope_bases``, scored per window at every
multiple of T on the book's windows and the held-out ones (``heldout.evaluation_samples``, seed
2027). Step 1's own base, 10^4, is trained again, which checks the set-up: its book-window means
must give back step 1's saved ones (``reproduction``). It writes ``base_sweep.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rope_tutor.lab.data import Corpus
from rope_tutor.lab.heldout import (
    evaluation_samples,
    samples_protocol,
    samples_record,
    score_samples,
)
from rope_tutor.lab.records import rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.short_long import train_language_model
from rope_tutor.scaling import rotations_per_window

__all__ = ["arm_key", "base_sweep"]


def arm_key(base: float) -> str:
    """The name of base ``base``'s arm in ``base_sweep.json``: the integer base, ``"500"``."""
    if base != int(base) or base <= 1:
        raise ValueError(f"base must be an integer greater than 1, got base={base}")
    return str(int(base))


def _reproduction(arms: dict[str, Any], step1_base: float, out_dir: Path) -> dict[str, Any]:
    """Step 1's base trained again against what step 1 saved in ``out_dir``: the largest
    |mean - saved mean| on the book's windows (``train_short_test_long.json``) and the largest
    per-window |difference| on both samples (``heldout_short_long.json``), where present."""
    ours = arms[arm_key(step1_base)]
    record: dict[str, Any] = {"base": step1_base}
    path = out_dir / "train_short_test_long.json"
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))["arms"]["rope"]["fixed_target"]
        diffs = [
            abs(sum(values) / len(values) - saved[m]["mean"]) for m, values in ours["book"].items()
        ]
        record["step1_means_max_abs"] = rounded(max(diffs), 6)
        record["step1_means_compared"] = len(diffs)
    path = out_dir / "heldout_short_long.json"
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))["arms"]["rope"]
        diffs = [
            abs(a - b)
            for sample in ("book", "heldout")
            for m, values in ours[sample].items()
            for a, b in zip(values, saved[sample][m], strict=True)
        ]
        record["heldout_windows_max_abs"] = rounded(max(diffs), 6)
        record["heldout_windows_compared"] = len(diffs)
    return record


def base_sweep(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """RoPE trained as step 1 with each base of ``settings.rope_bases``, scored per window on the
    book's and the held-out sample at every multiple of T. Writes ``base_sweep.json``.

    Each arm records its base, the ``ModelConfig`` it was built from, the base its trained
    model's rotary module used, the pairs (of d_h / 2) that make fewer than one turn in T
    (``rotations_per_window``, eq. rotations-per-window of "The extrapolation problem"), the
    training loss per 10 steps and the per-window losses ``{"book"|"heldout": {multiple: [...]}}``.
    """
    step1_base = settings.model_config("rope").rope_base
    if step1_base not in settings.rope_bases:
        raise ValueError(
            f"rope_bases={settings.rope_bases} must include step 1's base {step1_base}"
        )
    window, multiples = settings.context, list(settings.multiples)
    windows, book_starts, held_starts = evaluation_samples(settings, corpus)
    split = len(book_starts)
    arms: dict[str, Any] = {}
    for base in tqdm(settings.rope_bases, desc="base sweep", disable=not progress):
        fitted = train_language_model("rope", settings, corpus, rope_base=base, progress=progress)
        model = fitted.model
        turns = rotations_per_window(model.head_dim, base, window)
        losses = fitted.losses
        arms[arm_key(base)] = {
            "rope_base": base,
            "model": model.config.to_dict(),
            "rotary_base": model.blocks[0].attn.rotary.base,
            "pairs": len(turns),
            "pairs_short_of_a_turn": int((turns < 1).sum()),
            "train_loss": [
                rounded(sum(losses[i : i + 10]) / len(losses[i : i + 10]), 4)
                for i in range(0, len(losses), 10)
            ],
            "train_seconds": round(fitted.seconds, 1),
            **score_samples(model, windows, split, multiples, window),
        }
    record = samples_record(settings, corpus, "base-sweep", book_starts, held_starts)
    record["provenance"]["bases"] = list(settings.rope_bases)
    payload = {
        "experiment": "RoPE trained as step 1 with several bases, per window, on the book's and "
        "a held-out sample",
        "protocol": {
            **samples_protocol(settings, split),
            "trained": "as step 1's RoPE arm (same seed, initial weights, batches and steps); "
            "only the base differs",
            "bases": list(settings.rope_bases),
        },
        **record,
        "reproduction": _reproduction(arms, step1_base, out_dir),
        "arms": arms,
    }
    write_result(out_dir / "base_sweep.json", payload)
    return payload
