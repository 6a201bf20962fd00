"""Part III: attention with linear biases (ALiBi).

Chapter "ALiBi: attention with linear biases". Press, Smith & Lewis, "Train Short, Test Long:
Attention with Linear Biases Enables Input Length Extrapolation" (ICLR 2022). No position embedding
is added anywhere; each head ``h`` adds ``-s_h * (i - j)`` to the logit of query ``i`` and key
``j``, after the ``1/sqrt(head_dim)`` scaling (the bias is not divided by it).
"""

from __future__ import annotations

import math

import torch

from rope_tutor import _checks
from rope_tutor.attention import attention

__all__ = ["alibi_attention", "alibi_bias", "alibi_slopes"]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The head-specific slopes ``s_h`` of ALiBi, float32, shape ``(num_heads,)``.

    For ``num_heads = n`` a power of two, ``s_h = 2 ** (-8h / n)`` for ``h = 1 .. n``: a geometric
    sequence from ``2 ** (-8/n)`` down to ``1/256`` (equation (alibi-slopes)). For other ``n`` the
    rule of the authors' code, ``get_slopes`` (equation (alibi-slopes-general)), not the formula
    read literally (the paper, Press, Smith & Lewis 2022, trained only power-of-two head counts):
    the ``c = 2 ** floor(log2 n)`` slopes of ``c`` heads, then every other slope of ``2c`` heads,
    starting with the first, ``n - c`` of them, i.e. ``2 ** (-8(2j - 1) / (2c))`` for
    ``j = 1 .. n - c``. The list is not sorted. GPT-NeoX, Bloom and MPT use the same slopes.

    Computed in float64 and returned as float32. Raises ``ValueError`` if ``num_heads`` is not an
    int >= 1.
    """
    n = _checks.integer("num_heads", num_heads)
    c = 2 ** int(math.floor(math.log2(n)))
    exponents = torch.cat(
        (
            torch.arange(1, c + 1, dtype=torch.float64) / c,  # h / c, h = 1 .. c
            (2 * torch.arange(1, n - c + 1, dtype=torch.float64) - 1) / (2 * c),  # (2j - 1) / 2c
        )
    )
    return torch.exp2(-8.0 * exponents).to(torch.float32)


def _linear_bias(
    slopes: torch.Tensor,
    query_positions: torch.Tensor,
    key_positions: torch.Tensor,
    causal: bool,
) -> torch.Tensor:
    """``-s_h (i - j)`` (future keys ``-inf``) or ``-s_h |i - j|``: ``(heads, queries, keys)``."""
    distance = (query_positions[:, None] - key_positions[None, :]).to(slopes.dtype)  # i - j
    if causal:  # a future key is infinitely far: -m * inf = -inf, in the same single pass
        distance = distance.masked_fill(distance < 0, float("inf"))
    else:
        distance = distance.abs()
    return -slopes[:, None, None] * distance  # (heads, queries, keys)


def alibi_bias(
    num_heads: int,
    query_len: int,
    key_len: int | None = None,
    *,
    causal: bool = True,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ALiBi bias added to the logits: float32, shape ``(num_heads, query_len, key_len)``.

    Entry ``[h, i, j]`` is ``-s_h (i - j)`` with ``s_h = alibi_slopes(num_heads)[h]``, and ``-inf``
    for future keys ``j > i`` when ``causal`` (equation (alibi-bias-causal)); without ``causal`` it
    is ``-s_h |i - j|`` (equation (alibi-bias-bidirectional)). ``key_len`` defaults to
    ``query_len``; when it is larger, the queries are the last ``query_len`` of the ``key_len``
    positions (decoding with a cache), so query ``i`` sits at position ``key_len - query_len + i``.
    Press, Smith & Lewis (2022), section 3.

    The tensor is quadratic in the length (``4 * num_heads * query_len * key_len`` bytes): for long
    sequences use ``alibi_attention``, which never builds it whole. Raises ``ValueError`` if
    ``num_heads`` is not an int >= 1, a length is not an int >= 0, or ``query_len > key_len``.
    """
    slopes = alibi_slopes(num_heads).to(device)
    query_len = _checks.integer("query_len", query_len, minimum=0)
    key_len = query_len if key_len is None else _checks.integer("key_len", key_len, minimum=0)
    if query_len > key_len:
        raise ValueError(
            f"query_len={query_len} must not exceed key_len={key_len} "
            "(the queries are the last query_len of the key_len positions)"
        )
    positions = torch.arange(key_len, device=device)
    return _linear_bias(slopes, positions[key_len - query_len :], positions, causal)


def alibi_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    block_size: int = 256,
    scale: float | None = None,
    slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention with ALiBi, building the bias one block of queries at a time.

    ``softmax(q kᵀ · scale + B) v`` with ``B`` the ALiBi bias of ``alibi_bias`` (equation
    (alibi-score)); ``scale`` defaults to ``1/sqrt(head_dim)`` and multiplies the dot products
    only, not the bias. Shapes: ``q`` is ``(..., heads, query_len, head_dim)``, ``k`` and ``v`` are
    ``(..., heads, key_len, head_dim)``; the queries are the last ``query_len`` positions. Returns
    ``(..., heads, query_len, head_dim)``. ``slopes`` (positive, shape ``(heads,)``) defaults to
    ``alibi_slopes(heads)``. Press, Smith & Lewis (2022).

    The full ``(heads, query_len, key_len)`` bias is never built: each block of ``block_size``
    queries gets its own ``(heads, block_size, keys)`` slice, so the bias takes
    ``4 * heads * block_size * key_len`` bytes at most instead of ``4 * heads * query_len *
    key_len``. With ``causal`` a block only reads the keys up to its last query, which skips the
    fully masked part of the score matrix. The bias is built in float32 and cast to ``q.dtype``.

    Raises ``ValueError`` for ``q`` with fewer than 3 dims, ``block_size`` not an int >= 1,
    ``query_len > key_len``, ``slopes`` not positive or of the wrong shape, or mismatched ``q``,
    ``k``, ``v``.
    """
    if q.dim() < 3:
        raise ValueError(
            f"q must have shape (..., heads, query_len, head_dim), got {tuple(q.shape)}"
        )
    if k.dim() != q.dim() or k.shape[-3] != q.shape[-3]:
        raise ValueError(
            f"q and k must have the same heads: q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    block_size = _checks.integer("block_size", block_size)
    num_heads, query_len, key_len = q.shape[-3], q.shape[-2], k.shape[-2]
    if query_len > key_len:
        raise ValueError(
            f"query_len={query_len} (q {tuple(q.shape)}) must not exceed key_len={key_len} "
            f"(k {tuple(k.shape)}): the queries are the last query_len positions"
        )
    if slopes is None:
        slopes = alibi_slopes(num_heads)
    elif tuple(slopes.shape) != (num_heads,) or not bool((slopes > 0).all()):
        raise ValueError(
            f"slopes must be positive with shape ({num_heads},), got shape {tuple(slopes.shape)}"
        )
    slopes = slopes.to(device=q.device, dtype=torch.float32)

    offset = key_len - query_len
    positions = torch.arange(key_len, device=q.device)
    outputs = []
    for start in range(0, query_len, block_size) or range(1):
        stop = min(start + block_size, query_len)
        keys_seen = offset + stop if causal else key_len  # later keys are all masked
        bias = _linear_bias(
            slopes, positions[offset + start : offset + stop], positions[:keys_seen], causal
        )  # (heads, block, keys_seen)
        outputs.append(
            attention(
                q[..., start:stop, :],
                k[..., :keys_seen, :],
                v[..., :keys_seen, :],
                bias=bias,
                scale=scale,
            )
        )
    return torch.cat(outputs, dim=-2)
