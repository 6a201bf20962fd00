"""Statistics over training seeds: a mean with its interval, and paired differences between arms.

Part V. Every ranking in chapters "Train short, test long", "Extending a trained RoPE model" and
"Finding the needle" rests on several training seeds (``LabSettings.seeds``). Arms of one seed
share their evaluation data (the same windows, the same needles), so two arms are compared seed
by seed: ``paired_difference`` takes the n per-seed differences a_i - b_i and gives their mean
with a Student-t interval, mean +- t_{n-1} * sd / sqrt(n) (sd with n - 1 in the denominator).
With three seeds t_2 at 95% is 4.30, so only a gap large against its seed-to-seed spread counts;
``verdict`` calls anything whose interval holds 0 a tie.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

__all__ = ["CONFIDENCE", "Interval", "mean_interval", "paired_difference", "verdict"]

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


def verdict(difference: Interval, *, lower_is_better: bool) -> str:
    """``"tie"`` when ``difference`` (a - b) holds 0, else ``"better"`` or ``"worse"`` for a.

    ``lower_is_better`` is True for a loss, False for an accuracy.
    """
    if difference.holds(0.0):
        return "tie"
    a_lower = difference.high < 0
    return "better" if a_lower == lower_is_better else "worse"
