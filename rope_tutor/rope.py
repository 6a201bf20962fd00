"""Part II: rotary position embedding (RoPE).

Chapters "Deriving rotary position embedding" and "RoPE in practice". Su et al., "RoFormer:
Enhanced Transformer with Rotary Position Embedding" (2021).
"""

from __future__ import annotations

import torch

__all__ = ["rope_frequencies"]


def rope_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequency of each rotated pair: theta_i = base ** (-2i / dim), i = 0 .. dim/2 - 1.

    Equation (rope-theta) in "Deriving rotary position embedding"; Su et al., RoFormer (2021),
    eq. 15. Computed in float64 and returned as float32, shape ``(dim // 2,)``. Raises
    ``ValueError`` if ``dim`` is not a positive even int or ``base`` is not greater than 1.
    """
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim must be a positive even int, got dim={dim!r}")
    if not base > 1:
        raise ValueError(f"base must be greater than 1, got base={base!r}")
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i / dim
    return (base**-exponents).to(torch.float32)
