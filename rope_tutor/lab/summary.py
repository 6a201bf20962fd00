"""The last step of the lab: ``summary.json``, every arm over every training seed, with intervals.

Part V. ``write_summary`` reads the result files of each ``seed_<n>/`` folder of a run and
writes one table:

- ``runs``: the provenance and SHA-256 of every file it summarises, seed by seed;
- ``language_model``: each arm's fixed-target loss (nats/byte) at each multiple of T, per seed,
  with the mean and its 95% Student-t interval (``rope_tutor.lab.stats``); arms are the
  encodings of step 1, ``rope+<method>`` (step 2 at inference), ``finetune_<method>`` and
  ``rope+yarn_beta_<arm>`` (step 2b) and step 2d's arms (``more_methods``);
- ``needle``: each retrieval arm's exact match at each multiple, likewise, with ``in_window``;
- ``versus_rope``: every arm minus plain RoPE of the same seed (paired), its interval and
  ``verdict`` ("better", "worse" or "tie", for loss lower is better, for exact match higher).

Only seeds that hold a file contribute to it; an interval needs two seeds.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from rope_tutor.lab.records import load_results, seed_folder, write_result
from rope_tutor.lab.stats import CONFIDENCE, mean_interval, paired_difference, verdict

__all__ = ["language_model_arms", "needle_arms", "write_summary"]

#: Per-seed values: arm -> multiple (a string) -> seed -> value.
Table = dict[str, dict[str, dict[int, float]]]


def _seeds(out_dir: Path) -> list[int]:
    names = (p.name.removeprefix("seed_") for p in out_dir.glob("seed_*") if p.is_dir())
    return sorted(int(n) for n in names if n.isdigit())


def _read(out_dir: Path, seed: int, name: str) -> dict[str, Any] | None:
    path = out_dir / seed_folder(seed) / name
    return load_results(f"{seed_folder(seed)}/{name}", out_dir) if path.is_file() else None


def language_model_arms(result: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{arm: {multiple: fixed-target mean}}`` of one seed, from ``{file name: result}``
    (``train_short_test_long.json``, ``extend_rope.json``, ``yarn_beta.json``,
    ``more_methods.json``, those present).
    Lengths a model cannot run (``None``) are left out."""
    arms: dict[str, dict[str, float]] = {}

    def add(name: str, fixed: dict[str, Any]) -> None:
        arms[name] = {m: v["mean"] for m, v in fixed.items() if v is not None}

    if "train_short_test_long.json" in result:
        for name, arm in result["train_short_test_long.json"]["arms"].items():
            add(name, arm["fixed_target"])
    if "extend_rope.json" in result:
        data = result["extend_rope.json"]
        for name, arm in data["inference"].items():
            if name != "rope":
                add(f"rope+{name}", arm["fixed_target"])
        for name, arm in data["finetuned"].items():
            add(name, arm["fixed_target"])
    if "yarn_beta.json" in result:
        data = result["yarn_beta.json"]
        for name, arm in data["beta"].items():
            add(f"rope+yarn_beta_{name}", arm["fixed_target"])
        for method, by_multiple in data["matched"].items():
            arms[f"matched_{method}"] = {m: v["mean"] for m, v in by_multiple.items()}
    if "more_methods.json" in result:  # per-window losses: the mean over the book's windows
        for name, arm in result["more_methods.json"]["arms"].items():
            arms[name] = {m: round(sum(v) / len(v), 5) for m, v in arm["book"].items()}
    return arms


def needle_arms(result: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """``{arm: {multiple: exact match}}`` of one seed (``"in_window"`` as one more multiple),
    from ``{file name: result}`` (``needle.json`` and ``needle_<encoding>.json``)."""
    arms: dict[str, dict[str, float]] = {}
    for name in sorted(result):
        if not name.startswith("needle"):
            continue
        for arm, data in result[name]["arms"].items():
            values = {}
            if "in_window" in data:
                values["in_window"] = data["in_window"]["exact_match"]
            for m, v in data.get("sweep", {}).items():
                values[m] = v["exact_match"]
            arms[arm] = values
    return arms


def _table(per_seed: dict[int, dict[str, dict[str, float]]]) -> Table:
    table: Table = defaultdict(lambda: defaultdict(dict))
    for seed, arms in per_seed.items():
        for arm, values in arms.items():
            for multiple, value in values.items():
                table[arm][multiple][seed] = value
    return table


def _aggregate(table: Table) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm, by_multiple in table.items():
        out[arm] = {}
        for multiple, values in by_multiple.items():
            entry: dict[str, Any] = {"per_seed": {str(s): v for s, v in sorted(values.items())}}
            if len(values) >= 2:
                entry.update(mean_interval([values[s] for s in sorted(values)]).to_dict())
            out[arm][multiple] = entry
    return out


def _versus(table: Table, reference: str, *, lower_is_better: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for arm, by_multiple in table.items():
        if arm == reference:
            continue
        for multiple, values in by_multiple.items():
            base = table.get(reference, {}).get(multiple, {})
            seeds = sorted(set(values) & set(base))
            if len(seeds) < 2:
                continue
            diff = paired_difference([values[s] for s in seeds], [base[s] for s in seeds])
            out.setdefault(arm, {})[multiple] = {
                **diff.to_dict(),
                "seeds": seeds,
                "verdict": verdict(diff, lower_is_better=lower_is_better),
            }
    return out


def write_summary(out_dir: Path) -> dict[str, Any]:
    """``summary.json`` of the run in ``out_dir``: provenance of every file, per-seed values,
    means with intervals and paired differences from plain RoPE. Returns what it writes."""
    out_dir = Path(out_dir)
    runs: dict[str, Any] = {}
    lm: dict[int, dict[str, dict[str, float]]] = {}
    needle: dict[int, dict[str, dict[str, float]]] = {}
    for seed in _seeds(out_dir):
        folder = out_dir / seed_folder(seed)
        files = sorted(p.name for p in folder.glob("*.json"))
        result = {name: _read(out_dir, seed, name) for name in files}
        runs[seed_folder(seed)] = {
            name: {
                "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest(),
                "provenance": data["provenance"],
            }
            for name, data in result.items()
        }
        lm[seed] = language_model_arms(result)
        needle[seed] = needle_arms(result)
    lm_table, needle_table = _table(lm), _table(needle)
    payload = {
        "description": "every arm of the lab over training seeds: language models' fixed-target "
        "loss (nats/byte on the same last T bytes) and retrieval models' exact match, per seed, "
        f"with the mean and its {CONFIDENCE:.0%} Student-t interval, and paired differences "
        "from plain RoPE of the same seed (verdict 'tie' when the interval holds 0)",
        "seeds": _seeds(out_dir),
        "runs": runs,
        "language_model": _aggregate(lm_table),
        "needle": _aggregate(needle_table),
        "versus_rope": {
            "language_model": _versus(lm_table, "rope", lower_is_better=True),
            "needle": _versus(needle_table, "rope", lower_is_better=False),
        },
    }
    write_result(out_dir / "summary.json", payload)
    return payload
