"""Part IV: context-extension methods for RoPE, one small function each behind one registry.

The registry speaks Hugging Face's ``rope_scaling`` vocabulary: ``scaling["rope_type"]`` picks the
method. Chapters "The extrapolation problem" to "Beyond: NTK-by-parts and YaRN".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from rope_tutor.rope import rope_frequencies

__all__ = ["SCALINGS", "rope_parameters"]

ScalingFunction = Callable[[int, float, Mapping[str, Any], int | None], tuple[torch.Tensor, float]]


def _default(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """Unscaled RoPE: theta_i = base ** (-2i/dim), attention factor 1 (Su et al., 2021)."""
    return rope_frequencies(dim, base), 1.0


#: rope_type -> method. Adding a method is adding one function and one line here.
SCALINGS: dict[str, ScalingFunction] = {
    "default": _default,
}


def rope_parameters(
    dim: int,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    *,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Frequencies and attention factor of RoPE under a context-extension method.

    Returns ``(inv_freq, attention_factor)``: ``inv_freq`` is float32 of shape ``(dim // 2,)``;
    cos and sin are multiplied by ``attention_factor`` (so attention logits scale by its square).
    ``scaling`` is a Hugging Face style ``rope_scaling`` dict; ``None`` means no scaling.
    Raises ``ValueError`` naming the key and value for an unknown ``rope_type``.
    """
    scaling = dict(scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in SCALINGS:
        raise ValueError(f"unknown rope_type {kind!r}; expected one of {sorted(SCALINGS)}")
    return SCALINGS[kind](dim, base, scaling, seq_len)
