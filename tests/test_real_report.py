"""rope_tutor.real.report against hand computations and mathematical properties."""

from __future__ import annotations

import math

import pytest

from rope_tutor.lab.stats import Interval
from rope_tutor.real import report


def test_pass_bins_finds_the_one_pass_and_names_a_missing_one() -> None:
    run = {
        "passes": {
            "a": {"method": "none", "factor": 1.0, "length": 4, "bins": [1.0, 2.0]},
            "b": {"method": "yarn", "factor": 2.0, "length": 4, "bins": [3.0, 4.0]},
            "c": {"method": "yarn", "factor": 4.0, "length": 8, "bins": [5.0]},
        }
    }
    assert report.pass_bins(run, "none") == [1.0, 2.0]
    assert report.pass_bins(run, "yarn", 2.0) == [3.0, 4.0]
    assert report.pass_bins(run, "yarn", length=8) == [5.0]
    with pytest.raises(ValueError, match="method='yarn'.*found 2"):
        report.pass_bins(run, "yarn")
    with pytest.raises(ValueError, match="method='pi'"):
        report.pass_bins(run, "pi")


def test_dynamic_curve_joins_the_pieces_and_refuses_a_gap() -> None:
    unscaled = [1.0, 2.0, 9.0, 9.0, 9.0]
    pieces = [{"first_bin": 4, "bins": [7.0]}, {"first_bin": 2, "bins": [5.0, 6.0]}]
    assert report.dynamic_curve(unscaled, pieces, 4, 2) == [1.0, 2.0, 5.0, 6.0, 7.0]
    with pytest.raises(ValueError, match="first_bin=4, expected 3"):
        report.dynamic_curve(unscaled, [{"first_bin": 2, "bins": [5.0]}, pieces[0]], 4, 2)
    with pytest.raises(ValueError, match="window=5"):
        report.dynamic_curve(unscaled, pieces, 5, 2)


def test_range_mean_by_hand_and_bad_ranges() -> None:
    bins = [1.0, 2.0, 4.0, 8.0]  # bins of 10 tokens
    assert report.range_mean(bins, 10, 30, 10) == (2.0 + 4.0) / 2
    assert report.range_mean(bins, 0, 40, 10) == 15.0 / 4
    with pytest.raises(ValueError, match="lo=5"):
        report.range_mean(bins, 5, 30, 10)
    with pytest.raises(ValueError, match="hi=50"):
        report.range_mean(bins, 0, 50, 10)
    with pytest.raises(ValueError, match="bin_size=0"):
        report.range_mean(bins, 0, 10, 0)


def test_paired_bins_mean_and_standard_error_by_hand() -> None:
    a = [5.0, 3.0, 4.0, 6.0, 0.0]
    b = [5.0, 2.0, 2.0, 3.0, 0.0]  # differences on bins 1..3: 1, 2, 3
    mean, se = report.paired_bins(a, b, 1, 4, 1)
    assert mean == 2.0
    assert math.isclose(se, 1.0 / math.sqrt(3))  # sd of 1, 2, 3 is 1
    with pytest.raises(ValueError, match="len\\(b\\)=4"):
        report.paired_bins(a, b[:4], 0, 2, 1)
    with pytest.raises(ValueError, match="at least two bins"):
        report.paired_bins(a, b, 1, 2, 1)


def test_is_tie_is_two_standard_errors() -> None:
    assert report.is_tie(0.19, 0.1) and report.is_tie(-0.19, 0.1)
    assert not report.is_tie(0.21, 0.1) and not report.is_tie(-0.21, 0.1)
    with pytest.raises(ValueError, match="se=-0.1"):
        report.is_tie(0.0, -0.1)


def test_minus_reference_and_across_texts() -> None:
    curves = {
        "t1": {"yarn": [1.0, 1.0, 1.0, 1.0], "ntk": [1.1, 1.3, 2.0, 2.0], "pi": [0.0] * 4},
        "t2": {"yarn": [0.0, 0.0, 0.0, 0.0], "ntk": [0.3, 0.5, 1.0, 3.0]},
        "t3": {"yarn": [2.0, 2.0, 2.0, 2.0], "ntk": [2.2, 2.2, 2.0, 2.0]},
    }
    spans = {"first": (0, 2), "second": (2, 4)}
    diff = report.minus_reference(curves, ("ntk", "pi"), spans, 1)
    assert math.isclose(diff[("t1", "ntk", "first")][0], 0.2)
    assert math.isclose(diff[("t2", "ntk", "second")][0], 2.0)
    assert ("t2", "pi", "first") not in diff and ("t1", "pi", "first") in diff
    across = report.across_texts(diff, ("ntk",), ("first",))
    per_text = [0.2, 0.4, 0.2]
    mean = sum(per_text) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in per_text) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # Student-t, 2 degrees of freedom, 97.5 %
    iv = across[("ntk", "first")]
    assert math.isclose(iv.mean, mean) and math.isclose(iv.high - iv.mean, half, rel_tol=1e-9)


def test_compact_table_marks_each_interval() -> None:
    intervals = {
        ("a", "early"): Interval(0.010, -0.020, 0.040, 3),  # holds 0: not resolved
        ("b", "early"): Interval(0.050, 0.010, 0.090, 3),  # wholly above 0: reference lower
        ("a", "late"): Interval(-0.050, -0.090, -0.010, 3),  # wholly below 0: reference higher
        ("b", "late"): Interval(0.0, 0.0, 0.020, 3),  # 0 on the edge counts as held
    }
    columns = {"a": "method A", "b": "method B"}
    text = report.compact_table("title", intervals, ["early", "late"], columns, reference="R")
    lines = text.split("\n")
    assert lines[0] == "title" and len(lines) == 5
    assert lines[1].split(" | ")[1:] == [f"{'method A':<25}", f"{'method B':<25}"]
    early, late = ([c.strip() for c in line.split(" | ")] for line in lines[2:4])
    assert early == ["early", "+0.010 [-0.020, +0.040] =", "+0.050 [+0.010, +0.090] ↑"]
    assert late == ["late", "-0.050 [-0.090, -0.010] ↓", "+0.000 [+0.000, +0.020] ="]
    assert all(len(c) == 25 for line in lines[2:4] for c in line.split(" | ")[1:])  # padded columns
    assert lines[4].startswith("↑ resolved, R lower | ↓ resolved, R higher")
    with pytest.raises(KeyError):
        report.compact_table("title", intervals, ["middle"], {"a": "method A"})


def test_break_position_is_the_first_bin_past_the_window_that_stays_above() -> None:
    reference = [1.0] * 8
    unscaled = [1.0, 2.0, 1.0, 1.2, 1.6, 1.7, 3.0, 5.0]  # bin 1 crosses, but inside the window
    assert report.break_position(unscaled, reference, 20, 10) == 40
    with pytest.raises(ValueError, match="comes back"):
        report.break_position([1.0, 1.0, 2.0, 1.0], [1.0] * 4, 10, 10)
    with pytest.raises(ValueError, match="threshold=0.5"):
        report.break_position([1.0] * 4, [1.0] * 4, 10, 10)


def test_window_means_one_pass_mean_and_later_windows() -> None:
    tokens = [3.0, 1.0, 2.0, 2.0, 4.0, 0.0]  # per-token losses; token 0 is never scored
    bins = [sum(tokens[1:3]) / 2, sum(tokens[3:6]) / 3]  # bins of 3: the first scores 2 tokens
    assert math.isclose(report.one_pass_mean(bins, 3), sum(tokens[1:]) / 5)
    sweeps = {
        "a": {"method": "yarn", "window_tokens": 4, "windows": [[0, 4, 3, 6.0], [2, 6, 2, 1.0]]},
        "b": {"method": "ntk", "window_tokens": 4, "windows": [[0, 4, 3, 9.0], [2, 6, 2, 3.0]]},
    }
    assert report.window_means(sweeps, "yarn", 4) == [2.0, 0.5]
    with pytest.raises(ValueError, match="window_tokens=8"):
        report.window_means(sweeps, "yarn", 8)
    iv = report.later_windows([9.0, 1.0, 2.0, 4.0], [0.0, 0.0, 1.0, 1.0])  # diffs 1, 1, 3
    assert math.isclose(iv.mean, 5.0 / 3) and iv.n == 3
    with pytest.raises(ValueError, match="bin_size=1"):
        report.one_pass_mean(bins, 1)


def test_retrieval_rate_is_the_wilson_interval() -> None:
    k, n, low, high = report.retrieval_rate([True] * 7 + [False] * 3)
    z = 1.959963984540054
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (k, n) == (7, 10)
    assert math.isclose(low, centre - half, rel_tol=1e-9) and math.isclose(
        high, centre + half, rel_tol=1e-9
    )
    assert report.retrieval_rate([True] * 10)[3] == 1.0
    with pytest.raises(ValueError, match="retrieved"):
        report.retrieval_rate([])


def test_never_met_turns_by_hand() -> None:
    # window 100; pair of wavelength 200 met half its circle; slowed by 2, at 600 it reaches
    # 600 / 400 = 1.5 turns -> capped at 1: half a turn never met. Wavelength 400 met a quarter;
    # slowed by 1 it reaches 1.5 -> 1 turn at 600 (three quarters never met), half a turn at 200.
    assert math.isclose(report.never_met_turns([200.0, 400.0], [2.0, 1.0], 100, 600), 0.5 + 0.75)
    assert math.isclose(report.never_met_turns([200.0, 400.0], [2.0, 1.0], 100, 200), 0.0 + 0.25)
    with pytest.raises(ValueError, match="window=100"):
        report.never_met_turns([50.0], [1.0], 100, 200)
    with pytest.raises(ValueError, match="factors"):
        report.never_met_turns([200.0], [0.0], 100, 200)
