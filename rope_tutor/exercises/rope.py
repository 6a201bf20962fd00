"""Part II exercises: rotate_half, interleaved RoPE, the dense matrix, the layout permutation.

Chapters "Deriving rotary position embedding" (``rope_matrix``) and "RoPE in practice" (the
others). Each known mistake below is what a learner typically writes.
"""

from __future__ import annotations

import math

import torch

from rope_tutor.exercises.framework import Case, Exercise, Mistake, register
from rope_tutor.rope import (
    apply_rope,
    half_to_interleaved_permutation,
    interleaved_to_half_permutation,
    rope_matrix,
    rotate_half,
    rotate_interleaved,
)


def _tensor_case(description: str, make_args, **kwargs) -> Case:
    """A case whose tensors come from a fixed seed, rebuilt for every call."""

    def make():
        generator = torch.Generator().manual_seed(0)
        return make_args(generator), dict(kwargs)

    return Case(description, make)


def _randn(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator)


# -- rotate_half -----------------------------------------------------------------------------------


def _rotate_half_sign_flipped(x: torch.Tensor) -> torch.Tensor:
    return -rotate_half(x)


def _rotate_half_no_minus(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, x1), dim=-1)


register(
    Exercise(
        name="rotate_half",
        summary="multiply every pair (x[i], x[i + d/2]) by i: the half layout's rotate(x)",
        signature="(x) -> Tensor of x's shape",
        reference=rotate_half,
        cases=(
            _tensor_case("x of shape (8,)", lambda g: (_randn(g, 8),)),
            _tensor_case("x of shape (2, 3, 6)", lambda g: (_randn(g, 2, 3, 6),)),
            _tensor_case("x of shape (4, 16)", lambda g: (_randn(g, 4, 16),)),
        ),
        hint=(
            "split the last dim into halves x1 = x[..., :d/2] and x2 = x[..., d/2:] and return "
            "cat(-x2, x1) along the last dim."
        ),
        mistakes=(
            Mistake(
                "your signs are flipped: that is cat(x2, -x1), a rotation by -90 degrees; the "
                "minus sign goes on the second half, which moves to the front: cat(-x2, x1).",
                _rotate_half_sign_flipped,
            ),
            Mistake(
                "your function swaps adjacent features (x[2i], x[2i+1]): that is the interleaved "
                "layout's rotate; here the pairs are (x[i], x[i + d/2]).",
                rotate_interleaved,
            ),
            Mistake(
                "you swapped the halves but forgot the minus sign on x2: cat(-x2, x1).",
                _rotate_half_no_minus,
            ),
        ),
        chapter="rope_in_practice",
    )
)


# -- apply_rope_interleaved ------------------------------------------------------------------------


def _reference_interleaved(x, positions, base=10000.0):
    return apply_rope(x, positions, base=base, layout="interleaved")


def _rope_with_theta(x, positions, theta, layout="interleaved", sign=1.0):
    """RoPE with given frequencies (a helper to write the mistakes below)."""
    angles = sign * positions.double()[:, None] * theta.double()  # (seq, d/2)
    cos, sin = angles.cos(), angles.sin()
    xd = x.double()
    if layout == "interleaved":
        x0, x1 = xd[..., 0::2], xd[..., 1::2]
        return torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
    x0, x1 = xd.chunk(2, dim=-1)
    return torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)


def _theta(dim, base, first_index=0, step=2):
    i = torch.arange(first_index, first_index + dim // 2, dtype=torch.float64)
    return base ** (-step * i / dim)


def _interleaved_as_half(x, positions, base=10000.0):
    return _rope_with_theta(x, positions, _theta(x.shape[-1], base), layout="half")


def _interleaved_sign_flipped(x, positions, base=10000.0):
    return _rope_with_theta(x, positions, _theta(x.shape[-1], base), sign=-1.0)


def _interleaved_ignores_base(x, positions, base=10000.0):
    return _rope_with_theta(x, positions, _theta(x.shape[-1], 10000.0))


def _interleaved_one_indexed(x, positions, base=10000.0):
    return _rope_with_theta(x, positions, _theta(x.shape[-1], base, first_index=1))


def _interleaved_exponent_i_over_d(x, positions, base=10000.0):
    return _rope_with_theta(x, positions, _theta(x.shape[-1], base, step=1))


def _interleaved_base_1000(x, positions, base=1000.0):
    """The errata's typo: 1000 where the method says 10000 (here, as the default)."""
    return _rope_with_theta(x, positions, _theta(x.shape[-1], base))


def _interleaved_rotate_discarded(x, positions, base=10000.0):
    """The errata's hypothetical slip: x * cos + x * sin, the rotated copy of x never used.

    (A stray ``rotate_half(x)`` line before the correct return is harmless dead code; the slip is
    the return that uses ``x`` where ``rotate_half(x)`` belongs.)
    """
    angles = positions.double()[:, None] * _theta(x.shape[-1], base)  # (seq, d/2)
    cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
    return x.double() * cos + x.double() * sin


register(
    Exercise(
        name="apply_rope_interleaved",
        summary="RoPE in the interleaved layout: rotate (x[2i], x[2i+1]) by m * base**(-2i/d)",
        signature="(x, positions, base=10000.0) -> Tensor of x's shape",
        reference=_reference_interleaved,
        cases=(
            _tensor_case("x (5, 8), positions 0..4", lambda g: (_randn(g, 5, 8), torch.arange(5))),
            _tensor_case(
                "x (2, 3, 6, 16), positions 2, 9, 16, ..., 37",
                lambda g: (_randn(g, 2, 3, 6, 16), torch.arange(6) * 7 + 2),
            ),
            _tensor_case(
                "x (4, 12), positions [0, 3, 30, 90], base=100.0",
                lambda g: (_randn(g, 4, 12), torch.tensor([0, 3, 30, 90])),
                base=100.0,
            ),
        ),
        hint=(
            "theta_i = base**(-2i/d) for i = 0 .. d/2-1; at position m, out[2i] = x[2i] cos(m "
            "theta_i) - x[2i+1] sin(m theta_i) and out[2i+1] = x[2i+1] cos + x[2i] sin. positions "
            "index dim -2 of x."
        ),
        mistakes=(
            Mistake(
                "you paired x[i] with x[i + d/2] (the half layout); this exercise asks for "
                "adjacent pairs (x[2i], x[2i+1]).",
                _interleaved_as_half,
            ),
            Mistake(
                "your rotation goes the wrong way (angle -m theta): the first feature of each pair "
                "gets the minus sin term, out[2i] = x[2i] cos - x[2i+1] sin.",
                _interleaved_sign_flipped,
            ),
            Mistake(
                "your angles ignore the base argument (they always use 10000).",
                _interleaved_ignores_base,
            ),
            Mistake(
                "your pair index starts at 1 (as some write-ups print it): pair 0 must have "
                "theta_0 = base**0 = 1.",
                _interleaved_one_indexed,
            ),
            Mistake(
                "your exponent is -i/d; it is -2i/d (i counts pairs, 2i counts features).",
                _interleaved_exponent_i_over_d,
            ),
            Mistake(
                "your angles use base 1000; RoFormer, Llama 1 and Llama 2 use 10000 (the 1000 is "
                "a typo that circulates, see the errata page): the default is base=10000.0.",
                _interleaved_base_1000,
            ),
            Mistake(
                "you computed x * cos + x * sin: the rotated copy of x was computed and thrown "
                "away (the 'discarded rotate_half' bug of the errata page). The sin term "
                "multiplies the rotated x, (-x[2i+1], x[2i]), not x itself.",
                _interleaved_rotate_discarded,
            ),
        ),
        rtol=1e-4,
        atol=1e-4,
        chapter="rope_in_practice",
    )
)


# -- rope_matrix -----------------------------------------------------------------------------------


def _reference_matrix(position, dim, base=10000.0):
    return rope_matrix(position, dim, base=base)


def _matrix_from(theta, position, pairs):
    """Block-diagonal rotation acting on the given (first, second) feature pairs."""
    dim = 2 * len(pairs)
    matrix = torch.zeros(dim, dim, dtype=torch.float64)
    for (a, b), t in zip(pairs, theta.tolist(), strict=True):
        c, s = math.cos(position * t), math.sin(position * t)
        matrix[a, a], matrix[a, b], matrix[b, a], matrix[b, b] = c, -s, s, c
    return matrix


def _matrix_transposed(position, dim, base=10000.0):
    return rope_matrix(position, dim, base=base).T


def _matrix_half_pairs(position, dim, base=10000.0):
    pairs = [(i, i + dim // 2) for i in range(dim // 2)]
    return _matrix_from(_theta(dim, base), position, pairs)


def _matrix_one_indexed(position, dim, base=10000.0):
    pairs = [(2 * i, 2 * i + 1) for i in range(dim // 2)]
    return _matrix_from(_theta(dim, base, first_index=1), position, pairs)


def _matrix_ignores_base(position, dim, base=10000.0):
    return rope_matrix(position, dim)


def _matrix_base_1000(position, dim, base=1000.0):
    return rope_matrix(position, dim, base=base)


register(
    Exercise(
        name="rope_matrix",
        summary="the dense block-diagonal rotation R^d_{Theta,m} (interleaved pairs)",
        signature="(position, dim, base=10000.0) -> float64 Tensor[dim, dim]",
        reference=_reference_matrix,
        cases=(
            Case.of(1, 2),
            Case.of(3, 6),
            Case.of(7, 8, base=100.0),
            Case.of(42, 16),
        ),
        hint=(
            "R is zero except for 2x2 blocks on the diagonal; block i sits at rows/columns "
            "2i, 2i+1 and is [[cos, -sin], [sin, cos]] of the angle position * base**(-2i/dim)."
        ),
        mistakes=(
            Mistake(
                "your matrix is the transpose (the rotation by -m theta): the -sin belongs in the "
                "upper-right entry of each block, [[cos, -sin], [sin, cos]].",
                _matrix_transposed,
            ),
            Mistake(
                "your blocks act on (x[i], x[i + d/2]) (the half layout); R^d_{Theta,m} rotates "
                "adjacent pairs (x[2i], x[2i+1]).",
                _matrix_half_pairs,
            ),
            Mistake(
                "your pair index starts at 1: block 0 must rotate by position * base**0.",
                _matrix_one_indexed,
            ),
            Mistake("your matrix ignores the base argument.", _matrix_ignores_base),
            Mistake(
                "your angles use base 1000; the method's base is 10000 (1000 is a typo that "
                "circulates, see the errata page): the default is base=10000.0.",
                _matrix_base_1000,
            ),
        ),
        rtol=1e-5,
        atol=1e-5,
        dtype=torch.float64,  # the chapter's template builds the matrix in float64
        chapter="rope_derivation",
    )
)


# -- layout_permutation ----------------------------------------------------------------------------


def _permutation_identity(head_dim):
    return torch.arange(head_dim)


register(
    Exercise(
        name="layout_permutation",
        summary="the feature order perm with x_half = x_interleaved[perm] (Meta -> Hugging Face)",
        signature="(head_dim) -> integer Tensor[head_dim] (any integer dtype)",
        reference=interleaved_to_half_permutation,
        cases=(Case.of(4), Case.of(8), Case.of(16), Case.of(128)),
        hint=(
            "interleaved pair i is (x[2i], x[2i+1]); in the half layout pair i is (x[i], "
            "x[i + d/2]). So half feature i comes from interleaved feature 2i, and half feature "
            "i + d/2 from 2i + 1."
        ),
        mistakes=(
            Mistake(
                "that is the inverse permutation (half -> interleaved, [0, d/2, 1, d/2+1, ...]); "
                "here x_half = x_interleaved[perm], so perm starts [0, 2, 4, ...].",
                half_to_interleaved_permutation,
            ),
            Mistake(
                "the identity does not move any feature; the pairs must be regrouped.",
                _permutation_identity,
            ),
        ),
        chapter="rope_in_practice",
    )
)
