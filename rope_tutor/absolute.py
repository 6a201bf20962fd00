"""Part I: absolute position encodings (the learned table and Vaswani's sinusoids).

Chapters "Learned absolute positions" and "Sinusoidal encoding". Vaswani et al., "Attention Is
All You Need" (2017), section 3.5; the learned table as in BERT (Devlin et al., 2019) and GPT-2
(Radford et al., 2019).
"""

from __future__ import annotations

import torch
from torch import nn

from rope_tutor import _checks

__all__ = [
    "LearnedPositionalEmbedding",
    "sinusoidal_encoding",
    "sinusoidal_frequencies",
    "sinusoidal_relative_map",
]


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequency of each sin/cos pair: ``theta_i = base ** (-2i / dim)``, i < dim/2.

    Equation (sinusoidal-theta) in "Sinusoidal encoding"; Vaswani et al. (2017), section 3.5. The
    wavelength of pair ``i`` is ``2 pi / theta_i`` positions. Returns a float64 tensor of shape
    ``(dim // 2,)`` (the callers form angles in float64). RoPE's frequencies (equation
    (rope-theta), ``rope_frequencies``) and every context-extension method of Part IV start from
    this function: the formula is written once, here, where the book first teaches it. Raises
    ``ValueError`` if ``dim`` is not a positive even int or ``base`` is not a finite number
    greater than 1.
    """
    dim = _checks.even_dim("dim", dim)
    base = _checks.base(base)
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i / dim
    return base**-exponents


def sinusoidal_encoding(
    num_positions: int, dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Vaswani et al.'s sinusoidal position encoding, in the paper's interleaved layout.

    ``PE[p, 2i] = sin(p / base^(2i/dim))``, ``PE[p, 2i+1] = cos(p / base^(2i/dim))``,
    i = 0 .. dim/2 - 1, for positions p = 0 .. num_positions - 1.

    Equation (sinusoidal-pe) in "Sinusoidal encoding"; Vaswani et al., "Attention Is All You Need"
    (2017), section 3.5. Angles are formed in float64 and the result is returned in ``dtype``
    (``torch.float32``, the default, or ``torch.float64`` for a table without float32 rounding),
    shape ``(num_positions, dim)``; every row has norm ``sqrt(dim / 2)``. Raises ``ValueError`` if
    ``num_positions`` or ``dim`` is not a positive int, if ``dim`` is odd, if ``base`` is not a
    finite number greater than 1, or if ``dtype`` is neither ``torch.float32`` nor
    ``torch.float64``.
    """
    num_positions = _checks.integer("num_positions", num_positions)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got dtype={dtype!r}")
    inv_freq = sinusoidal_frequencies(dim, base)  # (dim/2,)
    positions = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    angles = positions * inv_freq  # (P, dim/2)
    encoding = torch.stack((angles.sin(), angles.cos()), dim=-1)  # (P, dim/2, 2)
    return encoding.reshape(num_positions, dim).to(dtype)


def sinusoidal_relative_map(offset: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The matrix ``M_k`` with ``PE(p + k) = M_k PE(p)`` for every position p (``k = offset``).

    Block-diagonal: pair ``i`` (columns ``2i, 2i+1``, holding ``(sin, cos)``) is multiplied by
    ``[[cos(k theta_i), sin(k theta_i)], [-sin(k theta_i), cos(k theta_i)]]``, a rotation that
    depends on the offset ``k`` only. Equation (sinusoidal-shift) in "Sinusoidal encoding";
    Vaswani et al. (2017), section 3.5, state that such a linear map exists.

    ``offset`` may be any finite real number (negative offsets give ``M_k`` transposed). Returns a
    float32 tensor of shape ``(dim, dim)``, built from float64 angles. Raises ``ValueError`` for a
    non-finite offset, an odd or non-positive ``dim`` or a ``base`` not greater than 1.
    """
    offset = _checks.real("offset", offset)
    angles = offset * sinusoidal_frequencies(dim, base)  # (dim/2,)
    cos, sin = angles.cos(), angles.sin()
    blocks = torch.stack((torch.stack((cos, sin), -1), torch.stack((-sin, cos), -1)), -2)
    return torch.block_diag(*blocks).to(torch.float32)  # (dim, dim)


class LearnedPositionalEmbedding(nn.Module):
    """A learned table of ``max_positions`` position vectors (BERT, GPT-2), added to token vectors.

    ``forward(positions)`` takes an integer tensor of any shape and returns ``(*positions.shape,
    dim)``: row ``p`` of the table for each position ``p``. The rows start as N(0, 0.02^2) noise,
    as in Hugging Face's GPT-2 and nanoGPT (OpenAI's original GPT-2 code draws this table with
    standard deviation 0.01), and are trained with the model. A position outside
    ``[0, max_positions)`` has no row in the table: it raises ``IndexError`` naming the position
    and the table size instead of indexing garbage (or, on a GPU, failing with an opaque
    device-side assertion). A
    floating-point or boolean ``positions`` raises ``ValueError``, like every other bad argument
    of the package. Chapter "Learned absolute positions".
    """

    def __init__(self, max_positions: int, dim: int) -> None:
        super().__init__()
        self.max_positions = _checks.integer("max_positions", max_positions)
        self.dim = _checks.integer("dim", dim)
        self.table = nn.Embedding(self.max_positions, self.dim)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if not isinstance(positions, torch.Tensor):
            raise ValueError(
                f"positions must be an integer tensor, got {type(positions).__name__}: "
                f"{positions!r}"
            )
        if (
            positions.dtype.is_floating_point
            or positions.dtype.is_complex
            or positions.dtype == torch.bool
        ):
            raise ValueError(f"positions must be an integer tensor, got dtype {positions.dtype}")
        if positions.numel():
            low, high = int(positions.min()), int(positions.max())
            if low < 0:
                raise IndexError(f"positions must be >= 0, got position {low}")
            if high >= self.max_positions:
                raise IndexError(
                    f"position {high} is beyond the learned table: it has max_positions="
                    f"{self.max_positions} rows (positions 0..{self.max_positions - 1})"
                )
        return self.table(positions)

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, dim={self.dim}"
