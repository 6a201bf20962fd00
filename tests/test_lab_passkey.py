"""Tests of the passkey step of the lab (rope_tutor.lab.passkey): the extra needle arms, the
depth bins and the sample counts that chapter 13's heatmap regenerates from the seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rope_tutor as rt
from rope_tutor.lab.data import needle_batch
from rope_tutor.lab.evaluate import needle_depth_bins
from rope_tutor.lab.passkey import OTHER_ENCODINGS, needle_arm, needle_depth_counts, needle_seed
from rope_tutor.lab.settings import BOOK, QUICK
from rope_tutor.results import RESULTS_DIR

DATA = RESULTS_DIR / "lab"
SEEDS = [DATA / f"seed_{seed}" for seed in BOOK.seeds]
PACKAGE_PARENT = Path(rt.__file__).resolve().parent.parent


def test_depth_bins_are_equal_width_and_run_from_far_to_near() -> None:
    length, key_length = 128, 3
    room = length - 2 * (1 + key_length)  # the needle starts at 0 .. room
    depth = torch.arange(room + 1)
    bins = needle_depth_bins(depth, length, key_length, 4)
    assert bins[0] == 0 and bins[-1] == 3  # first start: farthest bin; last start: nearest
    assert bool((bins[1:] >= bins[:-1]).all())  # monotone in depth
    sizes = torch.bincount(bins, minlength=4)
    assert sizes.tolist() == [31, 30, 30, 30]  # bin floor(4 d / 121): d = 0..30, 31..60, ...


def test_depth_counts_are_the_samples_the_saved_fractions_were_measured_on() -> None:
    """Each saved fraction per depth bin times the regenerated count is a whole number of
    retrieved keys: the counts come from the very samples the saved run scored, which the
    file itself does not store."""
    checked = 0
    arms = []
    for folder in SEEDS:
        needle = json.loads((folder / "needle.json").read_text())
        assert needle["provenance"]["settings"] == BOOK.name
        arms.extend(needle["arms"].values())
    for arm in arms:
        measurements = {str(m): s for m, s in arm.get("sweep", {}).items()}
        if "in_window" in arm:
            measurements["in_window"] = arm["in_window"]
        for key, result in measurements.items():
            counts = needle_depth_counts(BOOK, None if key == "in_window" else int(key))
            assert sum(counts) == BOOK.needle_samples
            for fraction, count in zip(result["by_depth"], counts, strict=True):
                assert abs(fraction * count - round(fraction * count)) < 1e-4, (key, counts)
            hits = sum(round(f * c) for f, c in zip(result["by_depth"], counts, strict=True))
            assert abs(hits / BOOK.needle_samples - result["exact_match"]) < 1e-6
            checked += 1
    assert checked >= 20 * len(SEEDS)


def test_depth_counts_would_reject_the_wrong_seed() -> None:
    """The check above can fail: with the in-window seed instead of the sweep's, the 4T counts
    do not reproduce the saved fractions."""
    needle = json.loads((SEEDS[0] / "needle.json").read_text())
    by_depth = needle["arms"]["rope"]["sweep"]["4"]["by_depth"]
    assert needle_seed(BOOK, 4) != needle_seed(BOOK, None)
    length = 4 * BOOK.context
    generator = torch.Generator().manual_seed(needle_seed(BOOK, None))
    _, depth = needle_batch(BOOK.needle_samples, length, BOOK.needle_key_length, generator)
    wrong = torch.bincount(needle_depth_bins(depth, length, BOOK.needle_key_length), minlength=4)
    pairs = zip(by_depth, wrong.tolist(), strict=True)
    assert any(abs(f * c - round(f * c)) > 1e-3 for f, c in pairs)


def test_needle_arm_writes_its_own_file_with_provenance(tmp_path: Path) -> None:
    payload = needle_arm("alibi", QUICK, tmp_path, progress=False)
    written = json.loads((tmp_path / "needle_alibi.json").read_text())
    assert written == json.loads(json.dumps(payload))
    assert list(written["arms"]) == ["alibi"]
    prov = written["provenance"]
    assert prov["command"] == "python -m rope_tutor.lab needle-arm --encoding alibi"
    assert prov["settings"] == "quick" and prov["steps"] == QUICK.needle_train.steps
    assert "finetune" not in prov  # no fine-tune in this file
    arm = written["arms"]["alibi"]
    assert 0.0 <= arm["in_window"]["exact_match"] <= 1.0
    assert ("sweep" in arm) == arm["learned"] == (arm["in_window"]["exact_match"] >= 0.95)
    assert written["protocol"]["samples_per_length"] == QUICK.needle_samples
    assert "alibi" in OTHER_ENCODINGS


def test_needle_arm_rejects_an_unknown_encoding(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="encoding='t5'"):
        needle_arm("t5", QUICK, tmp_path, progress=False)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_needle_arm_subcommand(tmp_path: Path) -> None:
    path = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": path}
    command = ["-m", "rope_tutor.lab", "needle-arm", "--encoding", "alibi", "--quick"]
    subprocess.run(
        [
            sys.executable,
            *command,
            "--seeds",
            "0",
            "--threads",
            "2",
            "--out",
            str(tmp_path),
            "--no-progress",
        ],
        env=env,
        check=True,
        timeout=300,
    )
    prov = json.loads((tmp_path / "seed_0" / "needle_alibi.json").read_text())["provenance"]
    assert prov["command"] == "python -m rope_tutor.lab needle-arm --encoding alibi"
    assert prov["threads"] == 2
