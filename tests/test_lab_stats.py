"""Tests of the lab's statistics over seeds (rope_tutor.lab.stats), against closed forms of the
Student t quantile and a simulation of the interval's coverage."""

from __future__ import annotations

import math
import random

import pytest

from rope_tutor.lab.stats import Interval, mean_interval, paired_difference, verdict


def _sd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_two_seeds_use_the_cauchy_quantile() -> None:
    """One degree of freedom: the t distribution is Cauchy, t_{0.975} = tan(0.475 pi)."""
    values = [1.0, 1.5]
    got = mean_interval(values)
    half = math.tan(math.pi * 0.475) * _sd(values) / math.sqrt(2)
    assert got.mean == pytest.approx(1.25)
    assert (got.low, got.high) == pytest.approx((1.25 - half, 1.25 + half))
    assert got.n == 2


def test_three_seeds_use_the_closed_form_of_two_degrees_of_freedom() -> None:
    """Two degrees of freedom: t_p = (2p - 1) / sqrt(2 p (1 - p)), 4.303 at p = 0.975."""
    values = [0.2, 0.5, 0.35]
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    assert t2 == pytest.approx(4.3027, abs=1e-4)  # printed t tables
    got = mean_interval(values)
    half = t2 * _sd(values) / math.sqrt(3)
    assert (got.low, got.high) == pytest.approx((0.35 - half, 0.35 + half))
    wider = mean_interval(values, confidence=0.99)
    assert wider.low < got.low and wider.high > got.high


def test_interval_covers_the_true_mean_at_its_confidence() -> None:
    """Simulated seeds: normal samples of three; the 95% interval holds the true mean in about
    95% of 4000 trials (binomial sd 0.34%, so +-1.5% cannot fail by chance)."""
    rng = random.Random(0)
    hits = sum(
        mean_interval([rng.gauss(2.0, 0.3) for _ in range(3)]).holds(2.0) for _ in range(4000)
    )
    assert abs(hits / 4000 - 0.95) < 0.015


def test_paired_difference_is_the_interval_of_per_seed_differences() -> None:
    a, b = [2.10, 2.00, 2.30], [2.00, 1.92, 2.18]
    got, by_hand = paired_difference(a, b), mean_interval([0.10, 0.08, 0.12])
    assert (got.mean, got.low, got.high) == pytest.approx((by_hand.mean, by_hand.low, by_hand.high))
    # pairing removes the seed-to-seed spread that both arms share
    unpaired = mean_interval(a).high - mean_interval(a).low
    paired = paired_difference(a, b)
    assert paired.high - paired.low < unpaired
    assert verdict(paired, lower_is_better=True) == "worse"  # a has the higher loss
    assert verdict(paired, lower_is_better=False) == "better"  # a has the higher accuracy


def test_verdict_calls_an_interval_holding_zero_a_tie() -> None:
    assert verdict(Interval(0.01, -0.02, 0.04, 3), lower_is_better=True) == "tie"
    assert verdict(Interval(-0.03, -0.05, -0.01, 3), lower_is_better=True) == "better"
    assert verdict(Interval(0.0, 0.0, 0.0, 3), lower_is_better=True) == "tie"


def test_format_and_dict() -> None:
    got = Interval(0.0123, -0.004, 0.0286, 3)
    assert got.format(signed=True) == "+0.012 [-0.004, +0.029]"
    assert got.format(2) == "0.01 [-0.00, 0.03]"
    tiny = Interval(-0.0004, -0.02, 0.02, 3)  # a mean that rounds to zero has no sign
    assert tiny.format(3, signed=True) == "+0.000 [-0.020, +0.020]"
    assert tiny.format(3) == "0.000 [-0.020, 0.020]"
    assert got.to_dict(3) == {"mean": 0.012, "low": -0.004, "high": 0.029, "n": 3}


@pytest.mark.parametrize(
    ("values", "match"),
    [([1.0], r"at least two seeds, got values=\[1\.0\]"), ([1.0, math.nan], "finite")],
)
def test_bad_values_are_named(values: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mean_interval(values)


def test_bad_confidence_and_unpaired_lengths_are_named() -> None:
    with pytest.raises(ValueError, match="confidence=1.5"):
        mean_interval([1.0, 2.0], confidence=1.5)
    with pytest.raises(ValueError, match=r"len\(a\)=2, len\(b\)=3"):
        paired_difference([1.0, 2.0], [1.0, 2.0, 3.0])
