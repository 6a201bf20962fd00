"""Step 1b of the lab, chapter "Train short, test long": a held-out sample of text.

Part V. Chapter 11's verdicts rest on one sample of text: the ``eval_windows`` validation windows
of ``eval_seed``, the same for every seed and encoding, so the luck of that draw is shared by
every number and invisible in the seeds' spread. ``heldout-short-long`` trains every encoding of
step 1 again, exactly as step 1 does (``train_language_model``: same seed, batches and steps), and
scores it per window, at every multiple of T, on two samples (``heldout.evaluation_samples``, as
for chapter 12): the book's windows, which also checks that the run reproduces step 1's means
(``reproduction``), and ``heldout_windows`` windows drawn with ``heldout_seed`` (2027, fixed before
any result was seen) that share no byte with the book's. A learned table cannot run past its size:
those multiples are left out. It writes ``heldout_short_long.json``, whose per-window losses let
``rope_tutor.lab.stats.crossed_difference`` count windows as well as seeds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rope_tutor.lab.data import Corpus
from rope_tutor.lab.heldout import (
    SAMPLES,
    evaluation_samples,
    samples_protocol,
    samples_record,
    score_samples,
)
from rope_tutor.lab.model import ENCODINGS
from rope_tutor.lab.records import rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.short_long import train_language_model
from rope_tutor.lab.stats import Interval, crossed_difference, paired_difference

__all__ = ["comparisons", "heldout_short_long", "sample_verdicts"]


def _step1_means(out_dir: Path) -> dict[str, dict[str, float]]:
    """Step 1's fixed-target means on the book's windows, by encoding and multiple (empty when
    ``train_short_test_long.json`` is not in ``out_dir``)."""
    path = out_dir / "train_short_test_long.json"
    if not path.is_file():
        return {}
    arms = json.loads(path.read_text(encoding="utf-8"))["arms"]
    return {
        encoding: {m: v["mean"] for m, v in arm["fixed_target"].items() if v is not None}
        for encoding, arm in arms.items()
    }


def heldout_short_long(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Every encoding of step 1, trained again and scored per window on the book's and a held-out
    sample at every multiple it can run. Writes ``heldout_short_long.json``."""
    window, multiples = settings.context, list(settings.multiples)
    windows, book_starts, held_starts = evaluation_samples(settings, corpus)
    split = len(book_starts)
    arms: dict[str, Any] = {}
    for encoding in tqdm(ENCODINGS, desc="held-out, step 1", disable=not progress):
        model = train_language_model(encoding, settings, corpus, progress=progress).model
        scores: dict[str, dict[str, list[float]]] = {sample: {} for sample in SAMPLES}
        for m in multiples:
            try:
                one = score_samples(model, windows, split, [m], window)
            except IndexError:  # a learned table has no row for this position
                continue
            for sample in SAMPLES:
                scores[sample][str(m)] = one[sample][str(m)]
        arms[encoding] = scores

    saved, worst, compared = _step1_means(out_dir), 0.0, 0
    for encoding, scores in arms.items():
        for m, values in scores["book"].items():
            if m in saved.get(encoding, {}):
                worst = max(worst, abs(sum(values) / len(values) - saved[encoding][m]))
                compared += 1
    payload = {
        "experiment": "every encoding of step 1 per window, on the book's and a held-out sample",
        "protocol": {
            **samples_protocol(settings, split),
            "trained": "trained again, as step 1 (same seed, batches and steps)",
        },
        **samples_record(settings, corpus, "heldout-short-long", book_starts, held_starts),
        "reproduction": {"max_abs": rounded(worst, 6), "compared": compared},
        "arms": arms,
    }
    write_result(out_dir / "heldout_short_long.json", payload)
    return payload


#: One comparison of step 1: (name, arm a, multiple of a, arm b, multiple of b); the difference
#: is a's fixed-target loss minus b's.
Comparison = tuple[str, str, int, str, int]


def comparisons(runs: dict[int, dict[str, Any]]) -> list[Comparison]:
    """Every fixed-target comparison chapter 11 draws its verdicts from: each pair of encodings at
    each multiple both can run (in ``ENCODINGS`` order, a minus b), and each encoding's growth
    between any two multiples it can run (the longer minus the shorter). ``runs`` maps a seed to
    its ``heldout_short_long.json``; the multiples are those every seed scored."""
    first = next(iter(runs.values()))["arms"]
    can = {e: [int(m) for m in first[e]["heldout"]] for e in ENCODINGS if e in first}
    out: list[Comparison] = []
    for i, a in enumerate(can):
        for b in list(can)[i + 1 :]:
            for m in sorted(set(can[a]) & set(can[b])):
                out.append((f"{a} - {b} at {m}x", a, m, b, m))
    for a, ms in can.items():
        for j, m in enumerate(ms):
            for m_long in ms[j + 1 :]:
                out.append((f"{a} {m_long}x - {m}x", a, m_long, a, m))
    return out


def sample_verdicts(runs: dict[int, dict[str, Any]]) -> dict[str, dict[str, Interval]]:
    """For each of ``comparisons(runs)``: ``book``, the interval over seeds of the per-seed means
    on the book's windows (what chapter 11 states, ``paired_difference``), and ``heldout``, the
    interval over seeds and windows on the held-out sample (``crossed_difference``)."""
    seeds = sorted(runs)
    result = {}
    for name, a, m_a, b, m_b in comparisons(runs):
        arms = [runs[s]["arms"] for s in seeds]
        book_a = [sum(x[a]["book"][str(m_a)]) / len(x[a]["book"][str(m_a)]) for x in arms]
        book_b = [sum(x[b]["book"][str(m_b)]) / len(x[b]["book"][str(m_b)]) for x in arms]
        result[name] = {
            "book": paired_difference(book_a, book_b),
            "heldout": crossed_difference(
                [x[a]["heldout"][str(m_a)] for x in arms], [x[b]["heldout"][str(m_b)] for x in arms]
            ),
        }
    return result
