"""Step 3b of the lab, chapter "Finding the needle": a held-out sample of prompts, and the
retrieval model's checkpoint.

Part V. Chapter 13's verdicts rest on one sample of needles per length: the ``needle_samples``
prompts of ``needle_seed`` (evaluation seed ``eval_seed + multiple``), the same for every seed and
arm, so the luck of that draw is shared by every number and invisible in the seeds' spread.
``heldout-needle`` trains the RoPE retrieval model of ``needle.json`` again, exactly as the
``passkey`` step does (``passkey.train_needle_arm`` and ``passkey.extended_models``: same seeds,
batches and steps), and

- scores every arm on the book's needles, which checks that the run reproduces ``needle.json``
  (``reproduction``);
- scores every arm, needle by needle, on ``needle_heldout_samples`` other prompts per length,
  drawn with ``heldout_needle_seed`` (``heldout_seed + multiple``; ``heldout_seed`` = 2027 was
  fixed before any result was seen, and is never used to choose anything);
- saves the trained model (no scaling, before any fine-tune) as ``needle_rope.safetensors``,
  read back with ``rope_tutor.lab.load_model("needle_rope", seed)``.

It writes ``heldout_needle.json``. ``sample_verdicts`` recomputes chapter 13's comparisons on the
book's needles (from ``needle.json``, paired by seed, as the chapter states them; and with the
models trained again) and on the held-out ones (``rope_tutor.lab.stats.crossed_difference``: seeds
and needles both counted).

``heldout_needle_arm`` does the same for an encoding of ``passkey.OTHER_ENCODINGS`` (ALiBi): it
trains the model of ``needle_<encoding>.json`` again (``needle-arm``'s recipe), scores it on the
book's needles (``reproduction`` against that file) and on the same held-out needles, and writes
``heldout_needle_<encoding>.json`` (``python -m rope_tutor.lab heldout-needle-arm --encoding
alibi``; ``heldout-needle`` and ``all`` run it at ``other_needle_seeds``). ``arm_verdicts``
recomputes chapter 13's verdicts on that encoding, minus plain RoPE at each length.

Training again on another CPU is not bit-identical: 3,000 steps amplify the last bits of the
kernels' rounding. The saved run (``needle.json``, an Intel Xeon) and this step's (an AMD EPYC,
same thread count) give the same in-window retrieval within a few keys of 100 and the same final
training loss within a few thousandths of a nat, but beyond the window a seed's exact match can
move by tens of points, as much as between training seeds. The checkpoint is this step's model:
its own numbers on the book's needles are the file's ``book``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rope_tutor.lab.evaluate import needle_depth_bins, needle_hits
from rope_tutor.lab.model import TinyLM, save_checkpoint
from rope_tutor.lab.passkey import (
    extended_models,
    needle_protocol,
    needle_provenance,
    needle_sweep,
    train_needle_arm,
)
from rope_tutor.lab.records import rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.stats import Interval, crossed_difference, paired_difference

__all__ = [
    "FINETUNE_BASE",
    "arm_verdicts",
    "comparisons",
    "heldout_needle",
    "heldout_needle_arm",
    "heldout_needle_seed",
    "heldout_rates",
    "sample_verdicts",
]

#: Each fine-tuned arm of ``needle.json`` and the same method at inference (chapter 13's gains).
FINETUNE_BASE: dict[str, str] = {
    "rope+plain_finetuned": "rope",
    "rope+pi_finetuned": "rope+pi",
    "rope+ntk_finetuned": "rope+ntk",
    "rope+yarn_paper_beta_finetuned": "rope+yarn_paper_beta",
}

#: The depth quarter chapter 13 follows with the length: the nearest to the question.
NEAREST = 3


def heldout_needle_seed(settings: LabSettings, multiple: int) -> int:
    """The seed of the held-out needles at ``multiple * T``: ``heldout_seed + multiple``
    (the book's are ``eval_seed + multiple``, ``passkey.needle_seed``)."""
    return settings.heldout_seed + multiple


def _heldout_hits(model: TinyLM, settings: LabSettings, multiple: int) -> tuple[str, list[int]]:
    """The held-out needles at ``multiple * T``: per needle, the number of scored key letters
    right, as one digit per needle, and the needles' depth quarters (0 = farthest)."""
    length = multiple * settings.context
    hits, depth = needle_hits(
        model,
        length,
        settings.needle_heldout_samples,
        settings.needle_key_length,
        seed=heldout_needle_seed(settings, multiple),
        cue=settings.needle_cue,
    )
    letters = "".join(str(v) for v in hits.sum(dim=1).tolist())
    bins = needle_depth_bins(depth, length, settings.needle_key_length).tolist()
    return letters, bins


def _differences(saved: dict[str, Any], again: dict[str, Any]) -> float:
    """Largest |difference| between two ``needle_accuracy`` records (every fraction)."""
    pairs = [
        (saved["exact_match"], again["exact_match"]),
        (saved["per_letter"], again["per_letter"]),
    ]
    pairs += [(a, b) for a, b in zip(saved["by_depth"], again["by_depth"], strict=True)]
    return max(abs(a - b) for a, b in pairs if a is not None and b is not None)


def _reproduction(
    book: dict[str, Any], out_dir: Path, file: str = "needle.json", trained: str = "rope"
) -> dict[str, Any]:
    """How this run's book-needle scores compare with ``file`` in ``out_dir``: the largest
    |difference| of any fraction (exact match, per letter, per depth quarter) over the arms and
    lengths both have, how many measurements differ at all, and the final training loss's
    difference (arm ``trained``). Empty when the file is not there."""
    path = out_dir / file
    if not path.is_file():
        return {}
    saved = json.loads(path.read_text(encoding="utf-8"))["arms"]
    worst, compared, differ = 0.0, 0, 0
    for name, entry in book.items():
        if name not in saved:
            continue
        records = [(saved[name].get("in_window"), entry.get("in_window"))]
        records += [(saved[name]["sweep"][m], v) for m, v in entry.get("sweep", {}).items()]
        for a, b in records:
            if a is None or b is None:
                continue
            gap = _differences(a, b)
            worst, compared, differ = max(worst, gap), compared + 1, differ + (gap > 0)
    loss_gap = abs(saved[trained]["final_train_loss"] - book[trained]["final_train_loss"])
    return {
        "max_abs": rounded(worst, 6),
        "compared": compared,
        "differ": differ,
        "final_train_loss_abs": rounded(loss_gap, 6),
    }


def _provenance_and_samples(
    settings: LabSettings, step: str, bins: dict[str, list[int]], *, finetune: bool
) -> dict[str, Any]:
    """The ``provenance`` and ``samples`` entries of a held-out needle file: the step's
    provenance with both evaluation seeds, and per length the held-out needles' seed and depth
    quarters."""
    return {
        "provenance": {
            **needle_provenance(settings, step, finetune=finetune),
            "eval_seed": settings.eval_seed,
            "heldout_seed": settings.heldout_seed,
        },
        "samples": {
            "heldout": {
                m: {"seed": heldout_needle_seed(settings, int(m)), "depth_quarter": b}
                for m, b in bins.items()
            }
        },
    }


def heldout_needle(
    settings: LabSettings, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train the RoPE retrieval model of ``needle.json`` again, save it as
    ``needle_rope.safetensors``, and score every arm on the book's and on held-out needles.
    Writes ``heldout_needle.json``. As in ``passkey``, the scaled and fine-tuned arms exist only
    when the model passes the 95% bar in its window."""
    model, result = train_needle_arm("rope", settings, progress=progress)
    save_checkpoint(model, out_dir / "needle_rope.safetensors")
    multiples = list(settings.needle_multiples)
    book: dict[str, Any] = {
        "rope": {
            k: result[k]
            for k in ("final_train_loss", "in_window", "learned", "sweep")
            if k in result
        }
    }
    held: dict[str, dict[str, str]] = {}
    bins: dict[str, list[int]] = {}

    def score(name: str, arm_model: TinyLM) -> None:
        held[name] = {}
        for m in multiples:
            held[name][str(m)], bins[str(m)] = _heldout_hits(arm_model, settings, m)

    score("rope", model)
    if result["learned"]:
        arms = extended_models(model, settings, progress=progress)
        for name, _scaling, arm_model, _seconds in tqdm(
            arms, desc="held-out needles", disable=not progress
        ):
            book[name] = {"sweep": needle_sweep(arm_model, settings)}
            score(name, arm_model)
    protocol = {k: v for k, v in needle_protocol(settings).items() if k != "samples_per_length"}
    payload = {
        "experiment": "finding the needle, trained again, on the book's and a held-out sample",
        "protocol": {
            **protocol,
            "book": f"the book's {settings.needle_samples} needles per length (seed "
            f"{settings.eval_seed} + multiple), as in needle.json",
            "heldout": f"{settings.needle_heldout_samples} needles per length drawn with seed "
            f"{settings.heldout_seed} + multiple",
            "hits": "per held-out needle, the number of key letters the model gets right, one "
            "digit per needle; exact match is that number equal to the key length minus the cue",
            "trained": "trained again, as the passkey step (same seeds, batches and steps); the "
            "model before scaling or fine-tuning is needle_rope.safetensors",
        },
        **_provenance_and_samples(settings, "heldout-needle", bins, finetune=True),
        "reproduction": _reproduction(book, out_dir),
        "book": book,
        "heldout": held,
    }
    write_result(out_dir / "heldout_needle.json", payload)
    return payload


def heldout_needle_arm(
    encoding: str, settings: LabSettings, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Train the retrieval model of ``needle_<encoding>.json`` again (``passkey.needle_arm``:
    ``train_needle_arm`` with the RoPE arm's seeds, batches and steps) and score it on the book's
    needles (``book``; ``reproduction`` compares them with ``needle_<encoding>.json``) and,
    needle by needle, on the held-out needles of ``heldout_needle.json`` (same seeds, so the
    same prompts as the RoPE arms). Writes ``heldout_needle_<encoding>.json``, laid out like
    ``heldout_needle.json`` with the one arm (``python -m rope_tutor.lab heldout-needle-arm
    --encoding <encoding>``). The model is not saved. Raises ``ValueError`` naming an unknown
    ``encoding``, or ``"rope"`` (whose held-out run is ``heldout_needle``)."""
    if encoding == "rope":
        raise ValueError(
            "encoding='rope' is trained again by heldout_needle (heldout-needle), "
            f"got encoding={encoding!r}"
        )
    model, result = train_needle_arm(encoding, settings, progress=progress)
    book = {
        encoding: {
            k: result[k]
            for k in ("final_train_loss", "in_window", "learned", "sweep")
            if k in result
        }
    }
    held: dict[str, str] = {}
    bins: dict[str, list[int]] = {}
    for m in tqdm(settings.needle_multiples, desc="held-out needles", disable=not progress):
        held[str(m)], bins[str(m)] = _heldout_hits(model, settings, m)
    protocol = {
        k: v
        for k, v in needle_protocol(settings).items()
        if k not in ("samples_per_length", "finetune")
    }
    payload = {
        "experiment": f"finding the needle with {encoding}, trained again, on the book's and a "
        "held-out sample",
        "protocol": {
            **protocol,
            "book": f"the book's {settings.needle_samples} needles per length (seed "
            f"{settings.eval_seed} + multiple), as in needle_{encoding}.json",
            "heldout": f"{settings.needle_heldout_samples} needles per length drawn with seed "
            f"{settings.heldout_seed} + multiple, as in heldout_needle.json",
            "hits": "per held-out needle, the number of key letters the model gets right, one "
            "digit per needle; exact match is that number equal to the key length minus the cue",
            "trained": f"trained again, as needle-arm --encoding {encoding} (same seeds, batches "
            "and steps); the model is not saved",
        },
        **_provenance_and_samples(
            settings, f"heldout-needle-arm --encoding {encoding}", bins, finetune=False
        ),
        "reproduction": _reproduction(book, out_dir, f"needle_{encoding}.json", encoding),
        "book": book,
        "heldout": {encoding: held},
    }
    write_result(out_dir / f"heldout_needle_{encoding}.json", payload)
    return payload


def heldout_rates(run: dict[str, Any], name: str, multiple: int | str) -> list[float]:
    """Exact match (1.0 or 0.0) of arm ``name`` on each held-out needle at ``multiple`` x T, from
    one seed's ``heldout_needle.json``."""
    hits = run["heldout"][name][str(multiple)]
    scored = run["protocol"]["key_length"] - run["protocol"]["cue"]
    return [float(int(c) == scored) for c in hits]


def _nearest(run: dict[str, Any], name: str, multiple: int) -> float:
    """Held-out exact match of ``name`` at ``multiple`` x T over the nearest depth quarter."""
    exact = heldout_rates(run, name, multiple)
    quarters = run["samples"]["heldout"][str(multiple)]["depth_quarter"]
    near = [e for e, q in zip(exact, quarters, strict=True) if q == NEAREST]
    return sum(near) / len(near)


#: One comparison of chapter 13: (name, arm a, arm b, multiple, kind); ``kind`` "arms" is a's
#: exact match minus b's at ``multiple`` x T, on the same needles; "nearest" is plain RoPE's
#: nearest-quarter exact match at T minus at ``multiple`` x T (a = b = "rope").
Comparison = tuple[str, str, str, int, str]


def comparisons(runs: dict[int, dict[str, Any]]) -> list[Comparison]:
    """Every comparison chapter 13 draws a verdict from, given ``runs`` (seed -> ``needle.json``):
    each swept arm minus plain RoPE at each length; each fine-tuned arm minus the same method at
    inference (``FINETUNE_BASE``); at each length, the arm with the highest mean minus every other
    arm (unless its mirror image is already listed); and plain RoPE's nearest depth quarter at T
    minus at each longer length."""
    first = next(iter(runs.values()))
    names = [n for n, arm in first["arms"].items() if "sweep" in arm]
    multiples = [int(m) for m in first["protocol"]["multiples"]]
    out: dict[str, Comparison] = {}
    for m in multiples:
        for name in names[1:]:
            out.setdefault(
                f"{name} - rope at {m}x", (f"{name} - rope at {m}x", name, "rope", m, "arms")
            )
    for ft, base in FINETUNE_BASE.items():
        if ft in names:
            for m in multiples:
                out.setdefault(
                    f"{ft} - {base} at {m}x", (f"{ft} - {base} at {m}x", ft, base, m, "arms")
                )
    for m in multiples:
        mean = {
            n: sum(r["arms"][n]["sweep"][str(m)]["exact_match"] for r in runs.values())
            for n in names
        }
        best = max(names, key=lambda n: mean[n])
        for name in names:
            mirror = f"{name} - {best} at {m}x"  # already there as an arm minus plain RoPE
            if name != best and mirror not in out:
                key = f"{best} - {name} at {m}x"
                out.setdefault(key, (key, best, name, m, "arms"))
    for m in multiples[1:]:
        key = f"rope nearest quarter 1x - {m}x"
        out[key] = (key, "rope", "rope", m, "nearest")
    return list(out.values())


def sample_verdicts(
    runs: dict[int, dict[str, Any]], held: dict[int, dict[str, Any]]
) -> dict[str, dict[str, Interval]]:
    """For each of ``comparisons(runs)``, three intervals of the difference:

    - ``book``: over seeds, of the per-seed differences on the book's needles (``needle.json``,
      ``paired_difference``): what chapter 13 states;
    - ``again``: the same on the book's needles, with the models trained again
      (``heldout_needle.json``'s ``book``): the part of a change due to the training run;
    - ``heldout``: on the held-out needles, with the models trained again: over seeds and needles
      (``crossed_difference``) for two arms at one length, over seeds (``paired_difference`` of
      the per-seed rates) for the nearest quarter at two lengths, whose needles differ.

    ``runs`` and ``held`` map the same seeds to their ``needle.json`` and ``heldout_needle.json``.
    Raises ``ValueError`` when their seeds differ."""
    if sorted(runs) != sorted(held):
        raise ValueError(
            f"runs and held must have the same seeds, got {sorted(runs)} and {sorted(held)}"
        )
    seeds = sorted(runs)
    again = {s: {"arms": held[s]["book"]} for s in seeds}

    def rates(files: dict[int, dict[str, Any]], arm: str, m: int, quarter: int | None) -> list:
        sweeps = [files[s]["arms"][arm]["sweep"][str(m)] for s in seeds]
        return [x["exact_match"] if quarter is None else x["by_depth"][quarter] for x in sweeps]

    result = {}
    for name, a, b, m, kind in comparisons(runs):
        if kind == "arms":
            book = paired_difference(rates(runs, a, m, None), rates(runs, b, m, None))
            rerun = paired_difference(rates(again, a, m, None), rates(again, b, m, None))
            heldout = crossed_difference(
                [heldout_rates(held[s], a, m) for s in seeds],
                [heldout_rates(held[s], b, m) for s in seeds],
            )
        else:
            book = paired_difference(rates(runs, a, 1, NEAREST), rates(runs, b, m, NEAREST))
            rerun = paired_difference(rates(again, a, 1, NEAREST), rates(again, b, m, NEAREST))
            heldout = paired_difference(
                [_nearest(held[s], a, 1) for s in seeds],
                [_nearest(held[s], b, m) for s in seeds],
            )
        result[name] = {"book": book, "again": rerun, "heldout": heldout}
    return result


def arm_verdicts(
    runs: dict[int, dict[str, Any]],
    held: dict[int, dict[str, Any]],
    arm_runs: dict[int, dict[str, Any]],
    arm_held: dict[int, dict[str, Any]],
    encoding: str = "alibi",
) -> dict[str, dict[str, Interval]]:
    """Chapter 13's verdicts on one more encoding (``needle_<encoding>.json``, ``passkey``'s
    ``OTHER_ENCODINGS``): ``"<encoding> - rope at <m>x"``, its exact match minus plain RoPE's at
    each length, with the three intervals of ``sample_verdicts``: ``book`` over seeds on the
    book's needles (``needle_<encoding>.json`` and ``needle.json``, paired by seed), ``again``
    the same with both models trained again (the ``book`` of ``heldout_needle_<encoding>.json``
    and of ``heldout_needle.json``), ``heldout`` on the held-out needles over seeds and needles
    (``crossed_difference``; both files score the same prompts).

    The four arguments map the same seeds to those four files. Raises ``ValueError`` when their
    seeds differ, or when a seed's ``encoding`` model has no length sweep (it missed the 95%
    bar, saved or trained again: the chapter compares only swept seeds)."""
    seeds = sorted(runs)
    for name, files in (("held", held), ("arm_runs", arm_runs), ("arm_held", arm_held)):
        if sorted(files) != seeds:
            raise ValueError(
                f"runs and {name} must have the same seeds, got {seeds} and {sorted(files)}"
            )
    for s in seeds:
        for label, arms in (("saved", arm_runs[s]["arms"]), ("trained again", arm_held[s]["book"])):
            if "sweep" not in arms[encoding]:
                raise ValueError(f"seed {s}'s {encoding} model ({label}) has no length sweep")

    def rates(arms: dict[int, dict[str, Any]], arm: str, m: int) -> list[float]:
        return [arms[s][arm]["sweep"][str(m)]["exact_match"] for s in seeds]

    book = {s: {**runs[s]["arms"], **arm_runs[s]["arms"]} for s in seeds}
    again = {s: {**held[s]["book"], **arm_held[s]["book"]} for s in seeds}
    result = {}
    for m in (int(k) for k in runs[seeds[0]]["protocol"]["multiples"]):
        result[f"{encoding} - rope at {m}x"] = {
            "book": paired_difference(rates(book, encoding, m), rates(book, "rope", m)),
            "again": paired_difference(rates(again, encoding, m), rates(again, "rope", m)),
            "heldout": crossed_difference(
                [heldout_rates(arm_held[s], encoding, m) for s in seeds],
                [heldout_rates(held[s], "rope", m) for s in seeds],
            ),
        }
    return result
