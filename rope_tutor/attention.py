"""The small attention layer the chapters share.

``attention`` is scaled dot-product attention with an optional additive bias (ALiBi) and causal
mask; ``SelfAttention`` is a multi-head layer that takes an optional rotary module (RoPE). Chapter
"Why position?" shows that, without either, the layer is permutation-equivariant.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from rope_tutor import _checks

__all__ = ["SelfAttention", "attention", "causal_mask"]

#: A rotary module: ``(q, k, positions) -> (q_rotated, k_rotated)``, q and k of shape
#: ``(batch, heads, seq, head_dim)``; ``RotaryEmbedding`` has this signature.
Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def causal_mask(query_len: int, key_len: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``(query_len, key_len)`` mask, True where a query may attend to a key.

    The queries are the last ``query_len`` of the ``key_len`` positions (decoding with a cache):
    query ``i`` sits at position ``key_len - query_len + i`` and sees keys ``0 ..`` that position.
    Raises ``ValueError`` if ``query_len > key_len`` or a length is not an int >= 0.
    """
    query_len = _checks.integer("query_len", query_len, minimum=0)
    key_len = _checks.integer("key_len", key_len, minimum=0)
    if query_len > key_len:
        raise ValueError(f"query_len={query_len} must not exceed key_len={key_len}")
    offset = key_len - query_len
    query_positions = torch.arange(offset, key_len, device=device)[:, None]
    return torch.arange(key_len, device=device)[None, :] <= query_positions


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    bias: torch.Tensor | None = None,
    scale: float | None = None,
    return_weights: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``softmax(q kᵀ · scale + bias) v``, optionally causal.

    Shapes: ``q`` is ``(..., heads, query_len, head_dim)``, ``k`` and ``v`` are
    ``(..., heads, key_len, head_dim)``; ``bias`` broadcasts to ``(..., heads, query_len, key_len)``
    and is added to the logits (ALiBi). ``scale`` defaults to ``1/sqrt(head_dim)``. With
    ``causal=True`` the queries are the last ``query_len`` positions (see ``causal_mask``).

    Returns the output ``(..., heads, query_len, head_dim)``, and with ``return_weights=True`` also
    the attention weights ``(..., heads, query_len, key_len)`` (computed explicitly rather than by
    ``torch.nn.functional.scaled_dot_product_attention``, which is used otherwise).
    Raises ``ValueError`` for mismatched shapes, a ``scale`` that is not a finite real number, and
    a non-floating ``bias`` (a boolean mask is not an additive bias: pass ``causal=True`` or a
    bias with ``-inf`` entries).
    """
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(
            f"q, k and v must have the same number of dims (>= 2), got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head_dim differ: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v key_len differ: k {tuple(k.shape)}, v {tuple(v.shape)}")
    query_len, key_len = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else _checks.real("scale", scale)

    mask = None
    if bias is not None:
        if not bias.dtype.is_floating_point:
            raise ValueError(
                f"bias must be a floating-point (additive) tensor, got dtype {bias.dtype}"
            )
        mask = bias.to(q.dtype)
    if causal:
        allowed = causal_mask(query_len, key_len, device=q.device)
        blocked = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device)
        blocked = blocked.masked_fill(~allowed, float("-inf"))  # (query_len, key_len)
        mask = blocked if mask is None else mask + blocked

    if not return_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    logits = (q @ k.transpose(-2, -1)) * scale  # (..., heads, query_len, key_len)
    if mask is not None:
        logits = logits + mask
    weights = logits.softmax(dim=-1)
    return weights @ v, weights


class SelfAttention(nn.Module):
    """Multi-head self-attention with no position information of its own.

    ``forward(x, positions=None, bias=None)`` maps ``(batch, seq, dim)`` to ``(batch, seq, dim)``;
    with ``return_weights=True`` it also returns the attention weights ``(batch, heads, seq,
    seq)``, computed by the same projections and ``attention`` call, only with the explicit
    softmax instead of SDPA (chapter "ALiBi" draws a trained model's per-head maps with it).
    Position enters only through ``rotary`` (a module rotating q and k, e.g. ``RotaryEmbedding``;
    it needs ``positions``, default ``0 .. seq-1``) or an additive ``bias`` (e.g. ALiBi, shape
    broadcastable to ``(batch, heads, seq, seq)``). Without either the layer is
    permutation-equivariant (chapter "Why position?").
    """

    def __init__(
        self, dim: int, num_heads: int, *, causal: bool = False, rotary: Rotary | None = None
    ) -> None:
        super().__init__()
        dim, num_heads = _checks.integer("dim", dim), _checks.integer("num_heads", num_heads)
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be a positive multiple of num_heads={num_heads}")
        self.dim, self.num_heads, self.causal = dim, num_heads, causal
        self.head_dim = dim // num_heads
        self.rotary = rotary
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must have shape (batch, seq, {self.dim}), got {tuple(x.shape)}")
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.num_heads, self.head_dim).unbind(dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        if self.rotary is not None:
            if positions is None:
                positions = torch.arange(seq, device=x.device)
            q, k = self.rotary(q, k, positions)
        y = attention(q, k, v, causal=self.causal, bias=bias, return_weights=return_weights)
        weights = None
        if return_weights:
            y, weights = y  # weights: (batch, heads, seq, seq)
        out = self.out(y.transpose(1, 2).reshape(batch, seq, self.dim))
        return out if weights is None else (out, weights)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, causal={self.causal}"
