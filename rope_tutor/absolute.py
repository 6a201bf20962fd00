"""Part I: absolute position encodings (the learned table and Vaswani's sinusoids).

Chapters "Learned absolute positions" and "Sinusoidal encoding".
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LearnedPositionalEmbedding", "sinusoidal_encoding"]


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def sinusoidal_encoding(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """Vaswani et al.'s sinusoidal position encoding, in the paper's interleaved layout.

    PE[p, 2i] = sin(p / base^(2i/dim)),  PE[p, 2i+1] = cos(p / base^(2i/dim)),  i = 0 .. dim/2 - 1.

    Equation (sinusoidal-pe) in "Sinusoidal encoding"; Vaswani et al., "Attention Is All You Need"
    (2017), section 3.5. Angles are formed in float64 and the result is returned as float32, shape
    ``(num_positions, dim)``. Raises ``ValueError`` if ``num_positions`` or ``dim`` is not a
    positive int, if ``dim`` is odd, or if ``base`` is not greater than 1.
    """
    _check_positive_int("num_positions", num_positions)
    _check_positive_int("dim", dim)
    if dim % 2:
        raise ValueError(f"dim must be even (sin/cos pairs), got dim={dim}")
    if not base > 1:
        raise ValueError(f"base must be greater than 1, got base={base!r}")
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = positions * inv_freq  # (P, dim/2)
    encoding = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (P, dim/2, 2)
    return encoding.reshape(num_positions, dim).to(torch.float32)


class LearnedPositionalEmbedding(nn.Module):
    """A learned table of ``max_positions`` position vectors (BERT, GPT-2), added to token vectors.

    ``forward(positions)`` takes an integer tensor of any shape and returns ``(*positions.shape,
    dim)``. A position outside ``[0, max_positions)`` has no row in the table: it raises
    ``IndexError`` naming the position and the table size instead of indexing garbage.
    Chapter "Learned absolute positions".
    """

    def __init__(self, max_positions: int, dim: int) -> None:
        super().__init__()
        self.max_positions = _check_positive_int("max_positions", max_positions)
        self.dim = _check_positive_int("dim", dim)
        self.table = nn.Embedding(max_positions, dim)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if positions.dtype.is_floating_point or positions.dtype == torch.bool:
            raise TypeError(f"positions must be an integer tensor, got dtype {positions.dtype}")
        if positions.numel():
            low, high = int(positions.min()), int(positions.max())
            if low < 0:
                raise IndexError(f"position {low} is negative; positions start at 0")
            if high >= self.max_positions:
                raise IndexError(
                    f"position {high} is beyond the learned table: it has max_positions="
                    f"{self.max_positions} rows (positions 0..{self.max_positions - 1})"
                )
        return self.table(positions)

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, dim={self.dim}"
