"""Part I exercises: attention, learned positions, the sinusoidal table and its relative map.

Registered in the order of the book: ``attention`` ("Why position?"), ``add_learned_positions``
("Learned absolute positions"), ``sinusoidal_encoding`` and ``relative_map`` ("Sinusoidal
encoding").
"""

from __future__ import annotations

import math

import torch

from rope_tutor.absolute import sinusoidal_encoding, sinusoidal_relative_map
from rope_tutor.attention import attention
from rope_tutor.exercises.framework import Case, Exercise, Mistake, register

# ---------------------------------------------------------------------------------------------
# attention (chapter "Why position?")


def _qkv_case(description: str, seed: int, q_shape: tuple[int, ...], key_len: int) -> Case:
    """Random q, k, v with ``q_shape = (..., query_len, head_dim)`` and ``key_len`` keys."""

    def make() -> tuple[tuple[torch.Tensor, ...], dict[str, int]]:
        generator = torch.Generator().manual_seed(seed)
        kv_shape = (*q_shape[:-2], key_len, q_shape[-1])
        q = torch.randn(q_shape, generator=generator)
        k = torch.randn(kv_shape, generator=generator)
        v = torch.randn(kv_shape, generator=generator)
        return (q, k, v), {}

    return Case(description, make)


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return attention(q, k, v)


def _attention_unscaled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (q @ k.transpose(-2, -1)).softmax(dim=-1) @ v


def _attention_scaled_by_dim(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (q @ k.transpose(-2, -1) / q.shape[-1]).softmax(dim=-1) @ v


def _attention_softmax_over_queries(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return logits.softmax(dim=-2) @ v


def _attention_values_for_keys(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    logits = q @ v.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return logits.softmax(dim=-1) @ v


register(
    Exercise(
        name="attention",
        summary="scaled dot-product attention softmax(q kᵀ / sqrt(head_dim)) v, no mask",
        signature="(q, k, v) -> Tensor[..., query_len, head_dim]",
        reference=_reference_attention,
        cases=(
            _qkv_case("q, k, v of shape (4, 8) (one head, 4 tokens)", 1, (4, 8), 4),
            _qkv_case(
                "q (2, 3, 5, 16), k and v (2, 3, 7, 16): batch 2, 3 heads", 2, (2, 3, 5, 16), 7
            ),
            _qkv_case("q (1, 1, 6, 4), k and v (1, 1, 6, 4)", 3, (1, 1, 6, 4), 6),
        ),
        hint=(
            "the logits are q @ k.transpose(-2, -1) divided by sqrt(head_dim); the softmax runs "
            "over the keys (the last axis), and the weights multiply v."
        ),
        mistakes=(
            Mistake(
                "you forgot the 1/sqrt(head_dim) scale: the softmax is too peaked.",
                _attention_unscaled,
            ),
            Mistake(
                "you divided the logits by head_dim; the scale is 1/sqrt(head_dim).",
                _attention_scaled_by_dim,
            ),
            Mistake(
                "your softmax normalises over the queries (dim=-2); each query's weights over the "
                "keys must sum to 1, so use softmax(dim=-1).",
                _attention_softmax_over_queries,
            ),
            Mistake(
                "values multiplied instead of keys: your logits are q @ v.transpose(-2, -1); the "
                "queries are compared with the keys, q @ k.transpose(-2, -1), and the weights then "
                "average the values.",
                _attention_values_for_keys,
            ),
        ),
        chapter="why_position",
    )
)

# ---------------------------------------------------------------------------------------------
# add_learned_positions (chapter "Learned absolute positions")


def _embedding_case(
    seed: int, batch: int, seq: int, vocab: int, max_positions: int, dim: int, start: int
) -> Case:
    def make() -> tuple[tuple[torch.Tensor, ...], dict[str, int]]:
        generator = torch.Generator().manual_seed(seed)
        token_ids = torch.randint(vocab, (batch, seq), generator=generator)
        token_table = torch.randn(vocab, dim, generator=generator)
        position_table = torch.randn(max_positions, dim, generator=generator)
        return (token_ids, token_table, position_table), {"start": start}

    description = (
        f"token_ids of shape ({batch}, {seq}), token_table ({vocab}, {dim}), "
        f"position_table ({max_positions}, {dim}), start={start}"
    )
    return Case(description, make)


def _reference_add_learned_positions(
    token_ids: torch.Tensor,
    token_table: torch.Tensor,
    position_table: torch.Tensor,
    start: int = 0,
) -> torch.Tensor:
    seq = token_ids.shape[-1]
    positions = torch.arange(start, start + seq)  # (seq,)
    return token_table[token_ids] + position_table[positions]  # (batch, seq, dim)


def _positions_from_one(
    token_ids: torch.Tensor, token_table: torch.Tensor, position_table: torch.Tensor, start: int = 0
) -> torch.Tensor:
    seq = token_ids.shape[-1]
    return token_table[token_ids] + position_table[start + 1 : start + 1 + seq]


def _positions_from_token_ids(
    token_ids: torch.Tensor, token_table: torch.Tensor, position_table: torch.Tensor, start: int = 0
) -> torch.Tensor:
    return token_table[token_ids] + position_table[token_ids]


def _ignores_start(
    token_ids: torch.Tensor, token_table: torch.Tensor, position_table: torch.Tensor, start: int = 0
) -> torch.Tensor:
    return _reference_add_learned_positions(token_ids, token_table, position_table)


register(
    Exercise(
        name="add_learned_positions",
        summary="token vectors plus learned position vectors, positions start .. start+seq-1",
        signature=("(token_ids, token_table, position_table, start=0) -> Tensor[batch, seq, dim]"),
        reference=_reference_add_learned_positions,
        cases=(
            _embedding_case(seed=4, batch=2, seq=5, vocab=6, max_positions=8, dim=4, start=0),
            _embedding_case(seed=5, batch=3, seq=4, vocab=7, max_positions=8, dim=6, start=3),
            _embedding_case(seed=6, batch=1, seq=9, vocab=5, max_positions=12, dim=3, start=0),
        ),
        hint=(
            "look up each token's row in token_table, then add row start + t of position_table to "
            "the token at sequence index t (the same row for every sequence of the batch)."
        ),
        mistakes=(
            Mistake(
                "your positions start at 1 (off by one): the first token has position start, "
                "which is 0 by default.",
                _positions_from_one,
            ),
            Mistake(
                "you indexed the position table with the token ids; it is indexed by where the "
                "token sits in the sequence.",
                _positions_from_token_ids,
            ),
            Mistake(
                "your function ignores start: positions run from start to start + seq - 1.",
                _ignores_start,
            ),
        ),
        chapter="learned_absolute",
    )
)

# ---------------------------------------------------------------------------------------------
# sinusoidal_encoding (chapter "Sinusoidal encoding")


def _half_layout(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * base ** (
        -torch.arange(0, dim, 2, dtype=torch.float64) / dim
    )
    return torch.cat((angles.sin(), angles.cos()), dim=-1).float()


def _sin_cos_swapped(num_positions: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    angles = torch.arange(num_positions, dtype=torch.float64)[:, None] * base ** (
        -torch.arange(0, dim, 2, dtype=torch.float64) / dim
    )
    return torch.stack((angles.cos(), angles.sin()), dim=-1).reshape(num_positions, dim).float()


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
                "sin/cos swapped: your even columns hold cos(p θ_i) and your odd columns "
                "sin(p θ_i); the paper puts the sine in column 2i and the cosine in column 2i+1.",
                _sin_cos_swapped,
            ),
            Mistake(
                "your function ignores the base argument (it always uses 10000).", _ignores_base
            ),
            Mistake(
                "your frequency index starts at 1: the first pair must have frequency base**0 = 1.",
                _exponent_off_by_one,
            ),
        ),
        dtype=torch.float32,
        chapter="sinusoidal",
    )
)

# ---------------------------------------------------------------------------------------------
# relative_map (chapter "Sinusoidal encoding")


def _pair_angles(offset: float, dim: int, base: float) -> torch.Tensor:
    return offset * base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)


def _block_diagonal(top_right_sign: float, offset: float, dim: int, base: float) -> torch.Tensor:
    angles = _pair_angles(offset, dim, base)
    cos, sin = angles.cos(), angles.sin()
    blocks = [
        torch.tensor([[c, top_right_sign * s], [-top_right_sign * s, c]])
        for c, s in zip(cos, sin, strict=True)
    ]
    return torch.block_diag(*blocks).float()


def _textbook_rotation(offset: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    return _block_diagonal(-1.0, offset, dim, base)


def _half_layout_map(offset: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    angles = _pair_angles(offset, dim, base)
    cos, sin = torch.diag(angles.cos()), torch.diag(angles.sin())
    return torch.cat((torch.cat((cos, sin), 1), torch.cat((-sin, cos), 1)), 0).float()


def _relative_map_ignores_base(offset: float, dim: int, base: float = 10000.0) -> torch.Tensor:
    return sinusoidal_relative_map(offset, dim)


register(
    Exercise(
        name="relative_map",
        summary="the matrix M_k with PE(p + k) = M_k PE(p), interleaved layout",
        signature="(offset, dim, base=10000.0) -> Tensor[dim, dim]",
        reference=sinusoidal_relative_map,
        cases=(
            Case.of(1, 2),
            Case.of(3, 8),
            Case.of(-2, 6),
            Case.of(5, 8, base=100.0),
        ),
        hint=(
            "expand sin((p+k)θ) and cos((p+k)θ) with the angle-sum formulas: each (sin, cos) pair "
            "of columns is multiplied by a 2×2 block built from cos(kθ_i) and sin(kθ_i), and "
            "the matrix is block-diagonal."
        ),
        mistakes=(
            Mistake(
                "your 2×2 blocks rotate the wrong way: you used R(kθ) = [[cos, -sin], [sin, cos]], "
                "but the pair is stored as (sin, cos), and for that order the angle-sum formulas "
                "give R(-kθ) = [[cos, sin], [-sin, cos]].",
                _textbook_rotation,
            ),
            Mistake(
                "your matrix is laid out for the half layout (all sines, then all cosines); the "
                "table is interleaved, so the blocks sit on the diagonal.",
                _half_layout_map,
            ),
            Mistake(
                "your function ignores the base argument (it always uses 10000).",
                _relative_map_ignores_base,
            ),
        ),
        dtype=torch.float32,
        chapter="sinusoidal",
    )
)
