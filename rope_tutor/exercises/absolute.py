"""Part I exercises: sinusoidal encoding (and more, added with the Part I chapters)."""

from __future__ import annotations

import torch

from rope_tutor.absolute import sinusoidal_encoding
from rope_tutor.exercises import Case, Exercise, Mistake, register


def _half_layout(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * base ** (
        -torch.arange(0, dim, 2, dtype=torch.float64) / dim
    )
    return torch.cat((angles.sin(), angles.cos()), dim=-1).float()


def _ignores_base(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    return sinusoidal_encoding(num_positions, dim)


def _exponent_off_by_one(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    i = torch.arange(1, dim // 2 + 1, dtype=torch.float64)
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * base ** (-2 * i / dim)
    return torch.stack((angles.sin(), angles.cos()), dim=-1).reshape(num_positions, dim).float()


register(
    Exercise(
        name="sinusoidal_encoding",
        summary="Vaswani's sinusoidal table, interleaved layout (sin at even, cos at odd columns)",
        signature="(num_positions, dim, base=10000.0) -> Tensor[num_positions, dim]",
        reference=sinusoidal_encoding,
        cases=(
            Case.of(4, 2),
            Case.of(8, 6),
            Case.of(16, 8, base=100.0),
            Case.of(50, 16),
        ),
        hint=(
            "column 2i holds sin(p / base**(2i/dim)) and column 2i+1 holds cos of the same angle; "
            "i runs from 0, and the base is the function's argument."
        ),
        mistakes=(
            Mistake(
                "your table puts all sines first and all cosines second (the 'half' layout); "
                "the paper interleaves them: sin in even columns, cos in odd columns.",
                _half_layout,
            ),
            Mistake(
                "your function ignores the base argument (it always uses 10000).", _ignores_base
            ),
            Mistake(
                "your frequency index starts at 1: the first pair must have frequency base**0 = 1.",
                _exponent_off_by_one,
            ),
        ),
        chapter="sinusoidal",
    )
)
