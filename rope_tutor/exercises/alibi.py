"""Part III exercises: ALiBi slopes and bias (chapter "ALiBi: attention with linear biases")."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from rope_tutor.alibi import alibi_bias, alibi_slopes
from rope_tutor.exercises.framework import Case, Exercise, Mistake, register


def _geometric_slopes(num_heads: int, first: int) -> torch.Tensor:
    """2 ** (-8h / n) for h = first .. first + n - 1, whatever n is."""
    h = torch.arange(first, first + num_heads, dtype=torch.float64)
    return torch.exp2(-8.0 * h / num_heads).float()


def _naive_slopes(num_heads: int) -> torch.Tensor:
    return _geometric_slopes(num_heads, first=1)


def _slopes_from_zero(num_heads: int) -> torch.Tensor:
    return _geometric_slopes(num_heads, first=0)


def _sorted_slopes(num_heads: int) -> torch.Tensor:
    return alibi_slopes(num_heads).sort(descending=True).values


def _even_extra_slopes(num_heads: int) -> torch.Tensor:
    # takes slopes 2, 4, ... of the 2c set (the ones the c set already has) instead of 1, 3, ...
    c = 2 ** math.floor(math.log2(num_heads))
    extra = _naive_slopes(2 * c)[1::2][: num_heads - c]
    return torch.cat((_naive_slopes(c), extra))


register(
    Exercise(
        name="alibi_slopes",
        summary="ALiBi's head slopes, with the authors' code's rule for head counts not 2**k",
        signature="(num_heads) -> Tensor[num_heads]",
        reference=alibi_slopes,
        cases=(Case.of(1), Case.of(8), Case.of(16), Case.of(12), Case.of(6), Case.of(5)),
        hint=(
            "for H = num_heads a power of two the slopes are 2**(-8h/H), h = 1 .. H. Otherwise "
            "take the c = 2**floor(log2 H) slopes of c heads, then every other slope of 2c heads "
            "(the 1st, 3rd, 5th, ...) until you have H; keep that order. Return float32."
        ),
        mistakes=(
            Mistake(
                "you used 2**(-8h/H) for every head count H. That is right only when H is a power "
                "of two; otherwise the authors' code (get_slopes) takes the slopes of the nearest "
                "lower power of two, then every other slope of the next one.",
                _naive_slopes,
            ),
            Mistake(
                "your exponents start at h = 0 (the first slope is 1): they run h = 1 .. n, so "
                "the first slope is 2**(-8/n).",
                _slopes_from_zero,
            ),
            Mistake(
                "you sorted the slopes. The code's list is the c slopes of the lower power of two "
                "followed by the extra ones, unsorted; head h must get exactly its slope.",
                _sorted_slopes,
            ),
            Mistake(
                "your extra slopes are the 2nd, 4th, ... of the 2c set, which repeat slopes you "
                "already have; take the 1st, 3rd, 5th, ... ([0::2]).",
                _even_extra_slopes,
            ),
        ),
        dtype=torch.float32,
        chapter="alibi",
    )
)


def _bias_reference(
    num_heads: int, query_len: int, key_len: int | None = None, causal: bool = True
) -> torch.Tensor:
    return alibi_bias(num_heads, query_len, key_len, causal=causal)


def _distance(query_len: int, key_len: int | None, queries_last: bool = True) -> torch.Tensor:
    key_len = query_len if key_len is None else key_len
    first_query = key_len - query_len if queries_last else 0
    i = torch.arange(first_query, first_query + query_len, dtype=torch.float64)
    return i[:, None] - torch.arange(key_len, dtype=torch.float64)[None, :]  # i - j


def _finish(
    slopes: torch.Tensor,
    distance: torch.Tensor,
    causal: bool,
    form: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``form(m, i - j)`` per head, future keys ``-inf`` when causal, as float32."""
    bias = form(slopes.double()[:, None, None], distance)
    if causal:
        bias = bias.masked_fill(distance < 0, float("-inf"))
    return bias.float()


def _key_only(
    num_heads: int, query_len: int, key_len: int | None = None, causal: bool = True
) -> torch.Tensor:
    key_len = query_len if key_len is None else key_len
    j = torch.arange(key_len, dtype=torch.float64)
    return _finish(
        alibi_slopes(num_heads), _distance(query_len, key_len), causal, lambda m, d: m * j
    )


def _wrong_sign(
    num_heads: int, query_len: int, key_len: int | None = None, causal: bool = True
) -> torch.Tensor:
    form = (lambda m, d: m * d) if causal else (lambda m, d: m * d.abs())
    return _finish(alibi_slopes(num_heads), _distance(query_len, key_len), causal, form)


def _no_abs(
    num_heads: int, query_len: int, key_len: int | None = None, causal: bool = True
) -> torch.Tensor:
    return _finish(
        alibi_slopes(num_heads), _distance(query_len, key_len), causal, lambda m, d: -m * d
    )


def _queries_first(
    num_heads: int, query_len: int, key_len: int | None = None, causal: bool = True
) -> torch.Tensor:
    form = (lambda m, d: -m * d) if causal else (lambda m, d: -m * d.abs())
    distance = _distance(query_len, key_len, queries_last=False)
    return _finish(alibi_slopes(num_heads), distance, causal, form)


def _zero_above_diagonal(
    num_heads: int, query_len: int, key_len: int | None = None, causal: bool = True
) -> torch.Tensor:
    bias = alibi_bias(num_heads, query_len, key_len, causal=causal)
    return bias.nan_to_num(neginf=0.0)


register(
    Exercise(
        name="alibi_bias",
        summary="ALiBi's bias -s_h (m - n), query m, key n (causal: n > m masked) or -s_h |m - n|",
        signature=(
            "(num_heads, query_len, key_len=None, causal=True) "
            "-> Tensor[num_heads, query_len, key_len]"
        ),
        reference=_bias_reference,
        cases=(
            Case.of(4, 5),
            Case.of(8, 3, 7),
            Case.of(4, 5, causal=False),
            Case.of(2, 2, 6, causal=False),
            Case.of(12, 6),
            Case.of(6, 1, 9),
        ),
        hint=(
            "entry [h, r, n] is -s_h * (m - n) with s_h = alibi_slopes(num_heads)[h], where query "
            "row r sits at position m = key_len - query_len + r; causal: future keys (n > m) get "
            "-inf; not causal: -s_h * |m - n|. Return float32."
        ),
        mistakes=(
            Mistake(
                "you built the key-only form +s_h * n (the authors' code, Bloom). It gives the "
                "same softmax under a causal mask, but it is not the bias -s_h (m - n) asked for, "
                "and it is wrong for bidirectional attention.",
                _key_only,
            ),
            Mistake(
                "your sign is flipped: the bias is a penalty, -s_h (m - n) <= 0, so distant keys "
                "get smaller logits.",
                _wrong_sign,
            ),
            Mistake(
                "without the causal mask the distance must be |m - n|: keys on both sides are "
                "penalized, -s_h |m - n|.",
                _no_abs,
            ),
            Mistake(
                "your queries are the first query_len positions; they are the last ones (decoding "
                "with a cache): query row r sits at position key_len - query_len + r.",
                _queries_first,
            ),
            Mistake(
                "future keys must be -inf (masked), not 0: a 0 bias lets queries see the future.",
                _zero_above_diagonal,
            ),
        ),
        dtype=torch.float32,
        chapter="alibi",
    )
)
