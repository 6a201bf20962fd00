"""Reading the saved runs of chapter "A real model past its window": bins, ranges, ties, windows.

Chapter "A real model past its window" (``13b_real_model``) and its evidence page
(``13b_real_model_evidence``). The runs saved by ``python -m rope_tutor.real`` hold, for each pass
over a text, the mean loss (nats/token) of consecutive ``bin_size``-token bins of positions, and,
for each sliding-window sweep, ``(begin, end, scored, nats)`` per window. Both pages read them
with the functions here, so that each computation has one implementation:

- ``pass_bins`` finds one pass's bins; ``dynamic_curve`` joins dynamic NTK's pieces to the
  unscaled pass;
- ``range_mean`` is the mean loss over positions ``[lo, hi)``; ``paired_bins`` the mean of the
  per-bin differences of two passes over ``[lo, hi)`` and its standard error, and ``is_tie`` the
  chapter's one tie rule, ``|mean| < 2 SE``; ``minus_reference`` and ``across_texts`` apply them
  to every method, range and text; ``compact_table`` lays ``across_texts``' intervals out as text;
- ``break_position`` dates where the unscaled model breaks;
- ``window_means`` and ``one_pass_mean`` read sliding windows and check their first window
  against the one pass; ``later_windows`` compares two methods on the windows after the first;
- ``retrieval_rate`` is a probe cell's rate with its 95 % Wilson interval;
- ``never_met_turns`` sums the turns of angle the unturned pairs reach that training never showed.

Functions take the loaded JSON results (``rope_tutor.results.load``) or lists taken from them and
return numbers; the pages glue and assert.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scipy.stats import binomtest

from rope_tutor.lab.stats import Interval, mean_interval, paired_difference

__all__ = [
    "across_texts",
    "break_position",
    "compact_table",
    "dynamic_curve",
    "is_tie",
    "later_windows",
    "minus_reference",
    "never_met_turns",
    "one_pass_mean",
    "paired_bins",
    "pass_bins",
    "range_mean",
    "retrieval_rate",
    "window_means",
]


def _check_range(lo: int, hi: int, bin_size: int, n_bins: int) -> tuple[int, int]:
    if bin_size <= 0:
        raise ValueError(f"bin_size must be positive, got bin_size={bin_size}")
    if lo % bin_size or hi % bin_size:
        raise ValueError(
            f"lo and hi must be multiples of bin_size={bin_size}, got lo={lo}, hi={hi}"
        )
    if not 0 <= lo < hi <= n_bins * bin_size:
        raise ValueError(
            f"need 0 <= lo < hi <= {n_bins * bin_size} (the bins' positions), got lo={lo}, hi={hi}"
        )
    return lo // bin_size, hi // bin_size


def pass_bins(
    run: Mapping[str, Any], method: str, factor: float | None = None, length: int | None = None
) -> list[float]:
    """The bins (mean loss per ``bin_size`` positions, nats/token) of the one pass of ``run`` with
    this ``method`` (and ``factor``, ``length`` when given).

    ``run`` is a loaded loss run (``{"passes": {key: {"method", "factor", "length", "bins"}}}``).
    Raises ``ValueError`` naming the arguments when no pass or more than one matches.
    """
    found = [
        p["bins"]
        for p in run["passes"].values()
        if p["method"] == method
        and (factor is None or p["factor"] == factor)
        and (length is None or p["length"] == length)
    ]
    if len(found) != 1:
        raise ValueError(
            f"expected one pass with method={method!r}, factor={factor}, length={length}, "
            f"found {len(found)}"
        )
    return list(found[0])


def dynamic_curve(
    unscaled: Sequence[float], pieces: Iterable[Mapping[str, Any]], window: int, bin_size: int
) -> list[float]:
    """Dynamic NTK's bins over a whole pass: the unscaled model's below ``window`` (dynamic NTK is
    plain RoPE there), then each piece's bins from its ``first_bin`` on.

    ``pieces`` are passes with ``first_bin`` and ``bins``; each pass keeps only its last piece,
    scored at the factor of its own length. The pieces must tile the bins from ``window //
    bin_size`` to ``len(unscaled)`` exactly, else ``ValueError``.
    """
    if bin_size <= 0 or window % bin_size:
        raise ValueError(
            "window must be a multiple of a positive bin_size, "
            f"got window={window}, bin_size={bin_size}"
        )
    curve = list(unscaled[: window // bin_size])
    for piece in sorted(pieces, key=lambda p: p["first_bin"]):
        if piece["first_bin"] != len(curve):
            raise ValueError(
                "pieces must tile the bins past the window: a piece starts at "
                f"first_bin={piece['first_bin']}, expected {len(curve)}"
            )
        curve.extend(piece["bins"])
    if len(curve) != len(unscaled):
        raise ValueError(f"pieces end at bin {len(curve)}, the unscaled pass at {len(unscaled)}")
    return curve


def range_mean(bins: Sequence[float], lo: int, hi: int, bin_size: int) -> float:
    """Mean loss (nats/token) over positions ``[lo, hi)``: the mean of the bins there (every bin
    counts alike). ``lo`` and ``hi`` are multiples of ``bin_size`` inside the pass, else
    ``ValueError``."""
    a, b = _check_range(lo, hi, bin_size, len(bins))
    return sum(bins[a:b]) / (b - a)


def paired_bins(
    a: Sequence[float], b: Sequence[float], lo: int, hi: int, bin_size: int
) -> tuple[float, float]:
    """Mean of the per-bin differences ``a[i] - b[i]`` over positions ``[lo, hi)`` and its
    standard error ``sd / sqrt(n)`` (sd with n - 1), n the bins in the range.

    The chapter compares two passes over the same tokens bin by bin ("One tie rule for the whole
    chapter"). Raises ``ValueError`` for passes of different lengths, a range of fewer than two
    bins, or a range as ``range_mean`` refuses it.
    """
    if len(a) != len(b):
        raise ValueError(f"a and b must have the same bins, got len(a)={len(a)}, len(b)={len(b)}")
    i, j = _check_range(lo, hi, bin_size, len(a))
    if j - i < 2:
        raise ValueError(f"a standard error needs at least two bins, got lo={lo}, hi={hi}")
    diffs = [x - y for x, y in zip(a[i:j], b[i:j], strict=True)]
    mean = sum(diffs) / len(diffs)
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    return mean, se


def is_tie(mean: float, se: float) -> bool:
    """The chapter's one tie rule: a mean paired difference within two standard errors,
    ``|mean| < 2 se``. Raises ``ValueError`` for a negative ``se``."""
    if se < 0:
        raise ValueError(f"se must be non-negative, got se={se}")
    return abs(mean) < 2 * se


def minus_reference(
    curves: Mapping[str, Mapping[str, Sequence[float]]],
    methods: Iterable[str],
    spans: Mapping[str, tuple[int, int]],
    bin_size: int,
    reference: str = "yarn",
) -> dict[tuple[str, str, str], tuple[float, float]]:
    """``paired_bins(method - reference)`` for every text, method and span of positions.

    ``curves`` maps text -> method -> bins; ``spans`` maps a span's name to ``(lo, hi)`` in
    tokens. Returns ``{(text, method, span): (mean, se)}`` (nats/token; above 0: the reference
    is lower), skipping a method a text did not run.
    """
    methods = tuple(methods)
    return {
        (text, m, name): paired_bins(by_method[m], by_method[reference], lo, hi, bin_size)
        for text, by_method in curves.items()
        for m in methods
        if m in by_method
        for name, (lo, hi) in spans.items()
    }


def across_texts(
    differences: Mapping[tuple[str, str, str], tuple[float, float]],
    methods: Iterable[str],
    spans: Iterable[str],
) -> dict[tuple[str, str], Interval]:
    """The mean over texts of each method's mean difference in each span, with its Student-t
    interval across texts (``mean_interval``: with three texts, 2 degrees of freedom).

    ``differences`` is ``minus_reference``'s output; a method needs at least two texts.
    """
    spans = tuple(spans)
    out = {}
    for m in methods:
        for span in spans:
            values = [v[0] for (_, m_, s_), v in differences.items() if (m_, s_) == (m, span)]
            out[(m, span)] = mean_interval(values)
    return out


def compact_table(
    title: str,
    intervals: Mapping[tuple[str, str], Interval],
    spans: Sequence[str],
    columns: Mapping[str, str],
    digits: int = 3,
    reference: str = "YaRN",
) -> str:
    """Each method minus the reference (a column) over each span (a row) as lines of text: the
    interval (``intervals[(method, span)]``, e.g. ``across_texts``' output) and whether it resolves.

    ``columns`` maps each method to its column heading, in order. A cell ends in ``=`` when the
    interval holds 0 (not resolved), ``↑`` when it lies wholly above 0 (the reference lower) and
    ``↓`` when wholly below; the last line is that legend, naming ``reference``. Returns the
    lines joined by newlines (the pages print it).
    """
    lines = [title, f"{'':>19} | " + " | ".join(f"{name:<25}" for name in columns.values())]
    for span in spans:
        cells = []
        for method in columns:
            iv = intervals[(method, span)]
            mark = "=" if iv.holds(0.0) else ("↑" if iv.low > 0 else "↓")
            cells.append(f"{iv.format(digits, signed=True)} {mark}")
        lines.append(f"{span:>19} | " + " | ".join(f"{c:<25}" for c in cells))
    lines.append(
        f"↑ resolved, {reference} lower | ↓ resolved, {reference} higher"
        " | = not resolved (the interval holds 0)"
    )
    return "\n".join(lines)


def break_position(
    unscaled: Sequence[float],
    reference: Sequence[float],
    window: int,
    bin_size: int,
    threshold: float = 0.5,
) -> int:
    """The position (tokens) where the unscaled model breaks: the start of the first bin from
    ``window`` on whose loss is more than ``threshold`` nats/token above ``reference``'s (static
    NTK at s = 2 in the chapter), provided it stays above in every later bin.

    Raises ``ValueError`` for passes of different lengths, when no bin crosses, or when the loss
    crosses and comes back (then the model has not broken for good).
    """
    if len(unscaled) != len(reference):
        raise ValueError(
            "unscaled and reference must have the same bins, "
            f"got {len(unscaled)} and {len(reference)}"
        )
    if bin_size <= 0 or window % bin_size:
        raise ValueError(
            "window must be a multiple of a positive bin_size, "
            f"got window={window}, bin_size={bin_size}"
        )
    above = [u - r > threshold for u, r in zip(unscaled, reference, strict=True)]
    first = next((i for i in range(window // bin_size, len(above)) if above[i]), None)
    if first is None:
        raise ValueError(
            f"no bin past window={window} is above the reference by threshold={threshold}"
        )
    if not all(above[first:]):
        raise ValueError(
            f"the loss crosses threshold={threshold} at position {first * bin_size} and comes back"
        )
    return first * bin_size


def window_means(sweeps: Mapping[str, Any], method: str, window_tokens: int) -> list[float]:
    """Mean loss (nats/token) of each window of the one sweep with this ``method`` and window
    size: ``nats / scored`` per window, in order (the first window scores all but its first token,
    each later one only the tokens the window before did not). Raises ``ValueError`` naming the
    arguments when no sweep or more than one matches."""
    found = [
        e for e in sweeps.values() if e["method"] == method and e["window_tokens"] == window_tokens
    ]
    if len(found) != 1:
        raise ValueError(
            f"expected one sweep with method={method!r}, window_tokens={window_tokens}, "
            f"found {len(found)}"
        )
    return [nats / scored for _, _, scored, nats in found[0]["windows"]]


def one_pass_mean(bins: Sequence[float], bin_size: int) -> float:
    """Mean loss per token (nats/token) of a whole pass from its bins: every token weighted alike,
    the first bin scoring ``bin_size - 1`` tokens (the first token has no prediction). It is what
    a sliding sweep's first window scores."""
    if bin_size < 2:
        raise ValueError(f"bin_size must be at least 2, got bin_size={bin_size}")
    if not bins:
        raise ValueError("bins must not be empty")
    weights = [bin_size - 1] + [bin_size] * (len(bins) - 1)
    return sum(w * b for w, b in zip(weights, bins, strict=True)) / sum(weights)


def later_windows(means: Sequence[float], reference: Sequence[float]) -> Interval:
    """``means[i] - reference[i]`` over the windows after the first (nats/token), with the paired
    Student-t interval over those windows (``paired_difference``). The later windows score the
    same positions of each window (its last ``stride`` tokens), which the first does not."""
    return paired_difference(means[1:], reference[1:])


def retrieval_rate(retrieved: Iterable[bool]) -> tuple[int, int, float, float]:
    """Keys retrieved ``k`` of ``n`` prompts and the 95 % Wilson interval ``(low, high)`` of the
    rate (scipy's ``binomtest``). Raises ``ValueError`` for no prompts."""
    hits = [bool(r) for r in retrieved]
    if not hits:
        raise ValueError("retrieved must hold at least one prompt, got none")
    k = sum(hits)
    ci = binomtest(k, len(hits)).proportion_ci(confidence_level=0.95, method="wilson")
    return k, len(hits), float(ci.low), float(ci.high)


def never_met_turns(
    wavelengths: Sequence[float], factors: Sequence[float], window: int, position: float
) -> float:
    """Turns of angle never met in training that pairs reach by ``position``, summed over them.

    Pair i (``wavelengths[i]`` tokens per turn, longer than ``window``) met the fraction
    ``window / wavelength_i`` of its circle in training; slowed by ``factors[i]`` it reaches
    ``position / (wavelength_i * factor_i)`` turns (at most 1 counts). The sum of
    ``max(0, min(reached, 1) - window / wavelength_i)``, in turns. Pass the unturned pairs only.
    """
    if len(wavelengths) != len(factors):
        raise ValueError(
            f"one factor per pair: got {len(wavelengths)} wavelengths and {len(factors)} factors"
        )
    if any(w <= window for w in wavelengths):
        raise ValueError(
            f"pass only pairs that never finish a turn within window={window}, "
            f"got wavelengths={list(wavelengths)}"
        )
    if any(f <= 0 for f in factors):
        raise ValueError(f"factors must be positive, got factors={list(factors)}")
    return sum(
        max(0.0, min(position / (w * f), 1.0) - window / w)
        for w, f in zip(wavelengths, factors, strict=True)
    )
