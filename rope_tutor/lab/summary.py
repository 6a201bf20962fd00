"""The last step of the lab: ``summary.json``, one table of every arm's fixed-target loss.

Part V. ``write_summary`` gathers the fixed-target means of steps 1 and 2 from the files present
in a run's folder (``train_short_test_long.json``, ``extend_rope.json``) and keeps the provenance
of step 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rope_tutor.lab.records import load_results, write_result

__all__ = ["write_summary"]


def write_summary(out_dir: Path) -> dict[str, Any]:
    """``summary.json``: every arm's fixed-target loss at each context multiple, gathered from
    the experiment files present in ``out_dir``."""
    arms: dict[str, Any] = {}
    provenance_record = None
    if (out_dir / "train_short_test_long.json").exists():
        data = load_results("train_short_test_long.json", out_dir)
        provenance_record = data["provenance"]
        for name, arm in data["arms"].items():
            arms[name] = _means(arm["fixed_target"])
    if (out_dir / "extend_rope.json").exists():
        data = load_results("extend_rope.json", out_dir)
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
    write_result(out_dir / "summary.json", payload)
    return payload


def _means(fixed: dict[str, Any]) -> dict[str, float | None]:
    return {m: (None if v is None else v["mean"]) for m, v in fixed.items()}
