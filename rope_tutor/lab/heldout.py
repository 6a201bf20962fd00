"""Step 2c of the lab, chapter "Extending a trained RoPE model": a held-out sample of text.

Part V. Every verdict of that chapter rests on one sample of text: the same ``eval_windows``
validation windows (``eval_seed``) for every seed and arm. Seeds vary, the text does not, so the
luck of the draw is shared by every number and invisible in the seeds' spread. ``heldout``
re-scores every arm of steps 2 and 2b, per window, on two samples:

- ``book``: the chapter's own windows, which also checks that this run reproduces the saved
  means (``reproduction``);
- ``heldout``: ``heldout_windows`` windows drawn with ``heldout_seed`` (2027, fixed before any
  result was seen, and never used to choose anything) that share no byte with the book's
  windows (``rope_tutor.lab.data.heldout_windows``).

Inference-time arms are scored on the saved RoPE checkpoint; the fine-tuned arms and the PI
curve are fine-tuned again, exactly as step 2 does (``finetune_arms``, ``pi_curve_config``). The
per-window losses let ``rope_tutor.lab.stats.crossed_difference`` count windows as well as
seeds. It writes ``heldout.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from rope_tutor.lab.data import Corpus, fixed_target_starts, heldout_windows, slice_windows
from rope_tutor.lab.evaluate import fixed_target_window_losses
from rope_tutor.lab.extend import (
    extension_methods,
    finetune_arms,
    pi_curve_config,
    rope_checkpoint,
)
from rope_tutor.lab.model import TinyLM
from rope_tutor.lab.records import provenance, rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.short_long import language_model_batches
from rope_tutor.lab.summary import language_model_arms
from rope_tutor.lab.train import fit
from rope_tutor.lab.yarn_beta import MATCHED_METHODS, beta_arms, matched_scaling

__all__ = [
    "SAMPLES",
    "evaluation_samples",
    "heldout",
    "inference_arms",
    "samples_protocol",
    "samples_record",
    "score_samples",
]

#: The two samples of text every arm is scored on.
SAMPLES = ("book", "heldout")

#: An inference arm: (name, rope_scaling, the multiples of T it is scored at).
Arm = tuple[str, dict[str, Any] | None, list[int]]


def inference_arms(settings: LabSettings) -> list[Arm]:
    """Every inference-time arm of steps 2 and 2b, named as ``summary.json`` names them:
    ``rope`` and ``rope+<method>`` (``extension_methods``), ``rope+yarn_beta_<arm>``
    (``beta_arms``) at every multiple; ``matched_<method>`` at each multiple m > 1 with factor m;
    ``temperature_<s>_<multiplier>`` (YaRN at factor s with logit multiplier 1/t, or
    ``yarn_formula``) at multiple s, as step 2's temperature sweep."""
    multiples, window = list(settings.multiples), settings.context
    arms: list[Arm] = []
    for name, scaling in extension_methods(settings).items():
        arms.append((name if name == "rope" else f"rope+{name}", scaling, multiples))
    for name, scaling in beta_arms(settings).items():
        arms.append((f"rope+yarn_beta_{name}", scaling, multiples))
    for method in MATCHED_METHODS:
        for m in multiples:
            if m > 1:
                arms.append((f"matched_{method}", matched_scaling(method, m, window), [m]))
    yarn = extension_methods(settings)["yarn_paper_beta"]
    assert yarn is not None
    for s in settings.temperature_factors:
        for multiplier in (*settings.logit_multipliers, None):
            extra = {} if multiplier is None else {"attention_factor": math.sqrt(multiplier)}
            key = "yarn_formula" if multiplier is None else str(multiplier)
            arms.append((f"temperature_{s}_{key}", {**yarn, "factor": s, **extra}, [int(s)]))
    return arms


def evaluation_samples(
    settings: LabSettings, corpus: Corpus
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The book's windows followed by the held-out ones, as int64 ``(eval_windows +
    heldout_windows, multiples[-1] * context + 1)``, and the start offsets of each sample."""
    length = settings.multiples[-1] * settings.context
    book_starts = fixed_target_starts(
        corpus.validation, settings.eval_windows, length, settings.eval_seed
    )
    held, held_starts = heldout_windows(
        corpus.validation, settings.heldout_windows, length, settings.heldout_seed, book_starts
    )
    windows = torch.cat([slice_windows(corpus.validation, book_starts, length + 1), held])
    return windows, book_starts, held_starts


def samples_protocol(settings: LabSettings, split: int) -> dict[str, Any]:
    """The ``protocol`` entries of a file scored on ``evaluation_samples`` (``split`` book
    windows): the lengths, the fixed-target measure and the two samples."""
    return {
        "context": settings.context,
        "multiples": list(settings.multiples),
        "fixed_target": "as in train_short_test_long.json: loss (nats/byte) on the last T "
        "bytes of each window, given m x T bytes of input; one value per window",
        "book": f"the book's {split} windows (seed {settings.eval_seed})",
        "heldout": f"{settings.heldout_windows} windows drawn with seed "
        f"{settings.heldout_seed}, sharing no byte with the book's windows",
    }


def samples_record(
    settings: LabSettings,
    corpus: Corpus,
    command: str,
    book_starts: torch.Tensor,
    held_starts: torch.Tensor,
) -> dict[str, Any]:
    """The ``provenance`` and ``samples`` entries of a file scored on ``evaluation_samples``:
    the run's provenance (``command``, seeds, steps, fine-tuning, both evaluation seeds) and the
    start offsets of each sample's windows."""
    return {
        "provenance": provenance(
            settings,
            corpus,
            command,
            seed=settings.pretrain.seed,
            steps=settings.pretrain.steps,
            finetune=settings.finetune.to_dict(),
            eval_seed=settings.eval_seed,
            heldout_seed=settings.heldout_seed,
        ),
        "samples": {
            "book": {"seed": settings.eval_seed, "starts": book_starts.tolist()},
            "heldout": {"seed": settings.heldout_seed, "starts": held_starts.tolist()},
        },
    }


def score_samples(
    model: torch.nn.Module, windows: torch.Tensor, split: int, multiples: list[int], window: int
) -> dict[str, dict[str, list[float]]]:
    """Per-window fixed-target losses at each multiple, split into the two samples: the first
    ``split`` windows are the book's, the rest held out (``evaluation_samples``). Returns
    ``{"book": {multiple: [loss per window]}, "heldout": {...}}``, rounded to 5 decimals."""
    contexts = [m * window for m in multiples]
    losses = fixed_target_window_losses(model, windows, contexts, window)
    out: dict[str, dict[str, list[float]]] = {sample: {} for sample in SAMPLES}
    for m, context in zip(multiples, contexts, strict=True):
        values = [rounded(v) for v in losses[context].tolist()]
        out["book"][str(m)] = values[:split]
        out["heldout"][str(m)] = values[split:]
    return out


def _merge(arms: dict[str, Any], name: str, scores: dict[str, dict[str, list[float]]]) -> None:
    entry = arms.setdefault(name, {sample: {} for sample in SAMPLES})
    for sample in SAMPLES:
        entry[sample].update(scores[sample])


def _saved_means(out_dir: Path) -> dict[str, dict[str, float]]:
    """The book-sample means that steps 2 and 2b saved in ``out_dir``, by arm and multiple."""
    result = {}
    for name in ("extend_rope.json", "yarn_beta.json"):
        path = out_dir / name
        if path.is_file():
            result[name] = json.loads(path.read_text(encoding="utf-8"))
    arms = language_model_arms(result)
    if "extend_rope.json" in result:
        data = result["extend_rope.json"]
        arms["rope"] = {m: v["mean"] for m, v in data["inference"]["rope"]["fixed_target"].items()}
        for steps, by_multiple in data["pi_curve"]["fixed_target"].items():
            arms[f"pi_steps_{steps}"] = dict(by_multiple)
        for s, entry in data["temperature"].items():
            for key, value in entry["sweep"].items():
                arms[f"temperature_{float(s)}_{key}"] = {str(int(float(s))): value}
    return arms


def _reproduction(arms: dict[str, Any], saved: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Largest |re-run mean - saved mean| on the book's windows, over the inference-time arms
    and over the fine-tuned ones (fine-tuning again on another CPU may drift a little)."""
    worst = {"inference": 0.0, "finetuned": 0.0}
    compared = 0
    for name, entry in arms.items():
        group = "finetuned" if name.startswith(("finetune_", "pi_steps_")) else "inference"
        for m, values in entry["book"].items():
            if m in saved.get(name, {}):
                mean = sum(values) / len(values)
                worst[group] = max(worst[group], abs(mean - saved[name][m]))
                compared += 1
    return {f"max_abs_{k}": rounded(v, 6) for k, v in worst.items()} | {"compared": compared}


def heldout(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Every arm of steps 2 and 2b scored per window on the book's and a held-out sample.
    Writes ``heldout.json``."""
    window, multiples = settings.context, list(settings.multiples)
    windows, book_starts, held_starts = evaluation_samples(settings, corpus)
    split = len(book_starts)

    base: TinyLM = rope_checkpoint(settings, corpus, out_dir, progress=progress)
    arms: dict[str, Any] = {}
    for name, scaling, at in tqdm(
        inference_arms(settings), desc="held-out: inference", disable=not progress
    ):
        base.set_rope_scaling(scaling)
        _merge(arms, name, score_samples(base, windows, split, at, window))
    base.set_rope_scaling(None)

    tune_length = int(settings.extend_factor * window)
    methods = extension_methods(settings)
    for name, scaling in finetune_arms(methods).items():
        fitted = fit(
            base,
            language_model_batches(corpus, tune_length),
            settings.finetune,
            scaling=scaling,
            description=f"held-out: {name}",
            progress=progress,
        )
        _merge(arms, name, score_samples(fitted.model, windows, split, multiples, window))

    def checkpoint(steps_done: int, tuned: torch.nn.Module) -> None:
        if steps_done in settings.pi_curve_steps:
            _merge(
                arms,
                f"pi_steps_{steps_done}",
                score_samples(tuned, windows, split, multiples, window),
            )

    fit(
        base,
        language_model_batches(corpus, tune_length),
        pi_curve_config(settings),
        scaling=methods["pi"],
        description="held-out: pi-curve",
        progress=progress,
        checkpoint=checkpoint,
    )

    payload = {
        "experiment": "every arm of steps 2 and 2b per window, on the book's and a held-out sample",
        "protocol": {
            **samples_protocol(settings, split),
            "finetuned": "fine-tuned again, as step 2 (same seeds, batches and steps)",
        },
        **samples_record(settings, corpus, "heldout", book_starts, held_starts),
        "reproduction": _reproduction(arms, _saved_means(out_dir)),
        "arms": arms,
    }
    write_result(out_dir / "heldout.json", payload)
    return payload
