"""Statistics over training seeds: a mean with its interval, and paired differences between arms.

Part V. Every ranking in chapters "Train short, test long", "Extending a trained RoPE model" and
"Finding the needle" rests on several training seeds (``LabSettings.seeds``). Arms of one seed
share their evaluation data (the same windows, the same needles), so two arms are compared seed
by seed: ``paired_difference`` takes the n per-seed differences a_i - b_i and gives their mean
with a Student-t interval, mean +- t_{n-1} * sd / sqrt(n) (sd with n - 1 in the denominator).
With three seeds t_2 at 95% is 4.30, so only a gap large against its seed-to-seed spread counts;
``verdict`` calls anything whose interval holds 0 a tie.

Those intervals treat the evaluation windows as fixed: every seed is scored on the same windows,
so the luck of which text was drawn is shared by all seeds and does not show in their spread.
``crossed_difference`` counts it too: seeds and windows as two crossed random factors, the
"language-as-fixed-effect" correction of Clark (1973), with the variance of the grand mean
estimated from the two main-effect mean squares and a Welch-Satterthwaite number of degrees of
freedom.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

__all__ = [
    "CONFIDENCE",
    "Interval",
    "crossed_difference",
    "mean_interval",
    "paired_difference",
    "verdict",
]

#: The confidence of every interval of the lab.
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds and its two-sided interval ``[low, high]`` at ``confidence``."""

    mean: float
    low: float
    high: float
    n: int
    confidence: float = CONFIDENCE

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in ``[low, high]``."""
        return self.low <= value <= self.high

    def format(self, digits: int = 3, *, signed: bool = False) -> str:
        """``"0.123 [0.101, 0.145]"`` (``signed``: ``"+0.012 [-0.004, +0.028]"``).

        A mean that rounds to zero prints without a minus sign (``"+0.000"``, not ``"-0.000"``);
        a bound keeps its sign, which says on which side of zero it lies.
        """
        spec = f"{'+' if signed else ''}.{digits}f"
        mean = round(self.mean, digits) + 0.0  # -0.0 + 0.0 is +0.0
        return f"{mean:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"

    def to_dict(self, digits: int = 5) -> dict[str, float | int]:
        return {
            "mean": round(self.mean, digits),
            "low": round(self.low, digits),
            "high": round(self.high, digits),
            "n": self.n,
        }


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` (one per seed) and its Student-t interval at ``confidence``.

    Raises ``ValueError`` for fewer than two values, a value that is not finite, or a confidence
    outside (0, 1).
    """
    values = [float(v) for v in values]
    if len(values) < 2:
        raise ValueError(f"an interval needs at least two seeds, got values={values}")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"values must be finite, got values={values}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got confidence={confidence}")
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df=n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, confidence)


def paired_difference(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
) -> Interval:
    """Mean and interval of ``a[i] - b[i]`` over seeds: arm a against arm b, paired by seed.

    Raises ``ValueError`` when ``a`` and ``b`` have different lengths (they must be the same
    seeds), and as ``mean_interval`` does.
    """
    if len(a) != len(b):
        raise ValueError(
            f"paired values need one per seed on both sides, got len(a)={len(a)}, len(b)={len(b)}"
        )
    return mean_interval([float(x) - float(y) for x, y in zip(a, b, strict=True)], confidence)


def crossed_difference(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], confidence: float = CONFIDENCE
) -> Interval:
    """Mean of ``a[s][w] - b[s][w]`` over seeds s and windows w, with an interval that counts the
    draw of the windows as well as the seeds.

    ``a`` and ``b`` are ``(n_s, n_w)``: each arm's loss on window w for training seed s, the same
    windows for every seed. With d = a - b, seed means d_s, window means d_w and grand mean d,

        MS_seeds   = n_w * sum_s (d_s - d)^2 / (n_s - 1),
        MS_windows = n_s * sum_w (d_w - d)^2 / (n_w - 1),
        Var(d) ~= (MS_seeds + MS_windows) / (n_s * n_w),

    which over-estimates the variance of d under crossed random effects of seed and window (it
    keeps the residual term once more). The half-width is t_nu * sqrt(Var) with nu from
    Welch-Satterthwaite, but never less than that of the seeds alone (``paired_difference`` of
    the seed means, t with ``n_s - 1`` degrees of freedom): nu is estimated from a mean square
    with as few as two degrees of freedom and can come out far too large, which would let an
    interval that counts more noise be narrower. With one term negligible it is the other's
    interval: the seeds' or the windows' paired interval. Clark, "The language-as-fixed-effect
    fallacy" (1973). ``Interval.n`` is ``n_s * n_w``.

    Raises ``ValueError`` when the shapes differ, there are fewer than two seeds or windows, a
    value is not finite, or ``confidence`` is outside (0, 1).
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 2:
        raise ValueError(
            f"a and b must both be (seeds, windows), got shapes {x.shape} and {y.shape}"
        )
    n_s, n_w = x.shape
    if n_s < 2 or n_w < 2:
        raise ValueError(f"need at least two seeds and two windows, got shape {x.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("a and b must be finite")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got confidence={confidence}")
    d = x - y
    grand = float(d.mean())
    ms_seeds = n_w * float(((d.mean(axis=1) - grand) ** 2).sum()) / (n_s - 1)
    ms_windows = n_s * float(((d.mean(axis=0) - grand) ** 2).sum()) / (n_w - 1)
    total = ms_seeds + ms_windows
    seeds_only = mean_interval(d.mean(axis=1), confidence)  # what paired_difference gives
    if total == 0.0:
        return Interval(grand, grand, grand, n_s * n_w, confidence)
    nu = total**2 / (ms_seeds**2 / (n_s - 1) + ms_windows**2 / (n_w - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2, df=nu)) * math.sqrt(total / (n_s * n_w))
    half = max(half, seeds_only.high - grand)  # never narrower than the seeds alone
    return Interval(grand, grand - half, grand + half, n_s * n_w, confidence)


def verdict(difference: Interval, *, lower_is_better: bool) -> str:
    """``"tie"`` when ``difference`` (a - b) holds 0, else ``"better"`` or ``"worse"`` for a.

    ``lower_is_better`` is True for a loss, False for an accuracy.
    """
    if difference.holds(0.0):
        return "tie"
    a_lower = difference.high < 0
    return "better" if a_lower == lower_is_better else "worse"
