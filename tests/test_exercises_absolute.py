"""Part I checkers accept a right answer and reject typical wrong ones, all written here.

Every candidate below is written independently of the package and of the checker's own Mistakes.
"""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.exercises import check, list_exercises

PART_I = ["attention", "add_learned_positions", "sinusoidal_encoding", "relative_map"]


def test_part_one_names_are_registered_in_book_order() -> None:
    names = list_exercises()
    assert names[: len(PART_I)] == PART_I


# --- attention -------------------------------------------------------------------------------


def right_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    logits = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))
    return (weights / weights.sum(-1, keepdim=True)) @ v


def attention_without_scale(q, k, v):
    return torch.softmax(torch.einsum("...qd,...kd->...qk", q, k), -1) @ v


def attention_softmax_on_queries(q, k, v):
    logits = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    return torch.softmax(logits, -2) @ v


def attention_scaled_by_key_count(q, k, v):
    logits = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(k.shape[-2])
    return torch.softmax(logits, -1) @ v


def attention_returns_weights(q, k, v):
    logits = torch.einsum("...qd,...kd->...qk", q, k) / math.sqrt(q.shape[-1])
    return torch.softmax(logits, -1)


def attention_self_similarity(q, k, v):  # uses q for the keys
    logits = q @ q.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(logits, -1) @ v


def attention_compares_queries_with_values(q, k, v):  # errata: values multiplied instead of keys
    scores = torch.einsum("...qd,...kd->...qk", q, v) * q.shape[-1] ** -0.5
    return torch.softmax(scores, -1) @ v


def attention_without_softmax(q, k, v):
    return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])) @ v


# --- add_learned_positions -------------------------------------------------------------------


def right_add_learned_positions(token_ids, token_table, position_table, start=0):
    batch, seq = token_ids.shape
    out = torch.empty(batch, seq, token_table.shape[1])
    for b in range(batch):
        for t in range(seq):
            out[b, t] = token_table[token_ids[b, t]] + position_table[start + t]
    return out


def positions_counted_from_one(token_ids, token_table, position_table, start=0):
    seq = token_ids.shape[1]
    return token_table[token_ids] + position_table[start + 1 : start + seq + 1]


def positions_along_the_batch(token_ids, token_table, position_table, start=0):
    batch = token_ids.shape[0]
    return token_table[token_ids] + position_table[start : start + batch][:, None, :]


def position_rows_from_token_ids(token_ids, token_table, position_table, start=0):
    return token_table[token_ids] + position_table[token_ids]


def start_ignored(token_ids, token_table, position_table, start=0):
    seq = token_ids.shape[1]
    return token_table[token_ids] + position_table[:seq]


def positions_concatenated(token_ids, token_table, position_table, start=0):
    seq = token_ids.shape[1]
    positions = position_table[start : start + seq].expand(token_ids.shape[0], -1, -1)
    return torch.cat((token_table[token_ids], positions), -1)


def tokens_only(token_ids, token_table, position_table, start=0):
    return token_table[token_ids]


def positions_subtract_start(token_ids, token_table, position_table, start=0):
    seq = token_ids.shape[1]
    return token_table[token_ids] + position_table[torch.arange(seq) - start]


# --- sinusoidal_encoding ---------------------------------------------------------------------


def sinusoidal_table(num_positions, dim, base, column):
    """A table whose column j is ``column(p, j)``: builds the right answer and the wrong ones."""
    return torch.tensor(
        [[column(p, j, dim, base) for j in range(dim)] for p in range(num_positions)],
        dtype=torch.float32,
    )


def interleaved(p, j, dim, base):
    angle = p / base ** (2 * (j // 2) / dim)
    return math.sin(angle) if j % 2 == 0 else math.cos(angle)


def right_sinusoidal(num_positions, dim, base=10000.0):
    return sinusoidal_table(num_positions, dim, base, interleaved)


def sines_then_cosines(num_positions, dim, base=10000.0):
    def column(p, j, dim, base):
        i, is_cos = j % (dim // 2), j >= dim // 2
        angle = p / base ** (2 * i / dim)
        return math.cos(angle) if is_cos else math.sin(angle)

    return sinusoidal_table(num_positions, dim, base, column)


def cosine_first(num_positions, dim, base=10000.0):
    def column(p, j, dim, base):
        angle = p / base ** (2 * (j // 2) / dim)
        return math.cos(angle) if j % 2 == 0 else math.sin(angle)

    return sinusoidal_table(num_positions, dim, base, column)


def base_fixed_at_10000(num_positions, dim, base=10000.0):
    return sinusoidal_table(num_positions, dim, 10000.0, interleaved)


def exponent_without_two(num_positions, dim, base=10000.0):
    def column(p, j, dim, base):
        angle = p / base ** ((j // 2) / dim)
        return math.sin(angle) if j % 2 == 0 else math.cos(angle)

    return sinusoidal_table(num_positions, dim, base, column)


def exponent_over_column_index(num_positions, dim, base=10000.0):  # uses j, not 2·(j // 2)
    def column(p, j, dim, base):
        angle = p / base ** (j / dim)
        return math.sin(angle) if j % 2 == 0 else math.cos(angle)

    return sinusoidal_table(num_positions, dim, base, column)


def frequency_index_from_one(num_positions, dim, base=10000.0):
    def column(p, j, dim, base):
        angle = p / base ** (2 * (j // 2 + 1) / dim)
        return math.sin(angle) if j % 2 == 0 else math.cos(angle)

    return sinusoidal_table(num_positions, dim, base, column)


def positions_from_one(num_positions, dim, base=10000.0):
    return sinusoidal_table(num_positions + 1, dim, base, interleaved)[1:]


def multiplied_by_the_wavelength(num_positions, dim, base=10000.0):
    def column(p, j, dim, base):
        angle = p * base ** (2 * (j // 2) / dim)
        return math.sin(angle) if j % 2 == 0 else math.cos(angle)

    return sinusoidal_table(num_positions, dim, base, column)


# --- relative_map ----------------------------------------------------------------------------


def rotation_blocks(offset, dim, base, block):
    matrix = torch.zeros(dim, dim)
    for i in range(dim // 2):
        angle = offset / base ** (2 * i / dim)
        matrix[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(block(angle))
    return matrix


def right_relative_map(offset, dim, base=10000.0):
    # sin(a + b) = sin a cos b + cos a sin b;  cos(a + b) = cos a cos b - sin a sin b
    return rotation_blocks(
        offset, dim, base, lambda b: [[math.cos(b), math.sin(b)], [-math.sin(b), math.cos(b)]]
    )


def textbook_rotation(offset, dim, base=10000.0):
    return rotation_blocks(
        offset, dim, base, lambda b: [[math.cos(b), -math.sin(b)], [math.sin(b), math.cos(b)]]
    )


def map_for_the_backward_shift(offset, dim, base=10000.0):
    return right_relative_map(-offset, dim, base)


def base_ignored_in_the_map(offset, dim, base=10000.0):
    return right_relative_map(offset, dim)


def map_for_split_halves(offset, dim, base=10000.0):
    half = dim // 2
    matrix = torch.zeros(dim, dim)
    for i in range(half):
        angle = offset / base ** (2 * i / dim)
        matrix[i, i] = matrix[half + i, half + i] = math.cos(angle)
        matrix[i, half + i], matrix[half + i, i] = math.sin(angle), -math.sin(angle)
    return matrix


def rotation_blocks_fixed_angle(offset, dim, base=10000.0):  # forgets the frequencies
    block = [[math.cos(offset), math.sin(offset)], [-math.sin(offset), math.cos(offset)]]
    return torch.block_diag(*[torch.tensor(block)] * (dim // 2))


def identity_map(offset, dim, base=10000.0):
    return torch.eye(dim)


# --- the checks ------------------------------------------------------------------------------

RIGHT = {
    "attention": right_attention,
    "add_learned_positions": right_add_learned_positions,
    "sinusoidal_encoding": right_sinusoidal,
    "relative_map": right_relative_map,
}

WRONG = [
    ("attention", attention_without_scale),
    ("attention", attention_softmax_on_queries),
    ("attention", attention_scaled_by_key_count),
    ("attention", attention_returns_weights),
    ("attention", attention_self_similarity),
    ("attention", attention_without_softmax),
    ("attention", attention_compares_queries_with_values),
    ("add_learned_positions", positions_counted_from_one),
    ("add_learned_positions", positions_along_the_batch),
    ("add_learned_positions", position_rows_from_token_ids),
    ("add_learned_positions", start_ignored),
    ("add_learned_positions", positions_concatenated),
    ("add_learned_positions", tokens_only),
    ("add_learned_positions", positions_subtract_start),
    ("sinusoidal_encoding", sines_then_cosines),
    ("sinusoidal_encoding", cosine_first),
    ("sinusoidal_encoding", base_fixed_at_10000),
    ("sinusoidal_encoding", exponent_without_two),
    ("sinusoidal_encoding", exponent_over_column_index),
    ("sinusoidal_encoding", frequency_index_from_one),
    ("sinusoidal_encoding", positions_from_one),
    ("sinusoidal_encoding", multiplied_by_the_wavelength),
    ("relative_map", textbook_rotation),
    ("relative_map", map_for_the_backward_shift),
    ("relative_map", base_ignored_in_the_map),
    ("relative_map", map_for_split_halves),
    ("relative_map", rotation_blocks_fixed_angle),
    ("relative_map", identity_map),
]


@pytest.mark.parametrize("name", PART_I)
def test_accepts_an_independent_right_answer(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert check(name, RIGHT[name]) is True
    assert f"✓ {name}: correct on all" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "candidate"), WRONG, ids=[w[1].__name__ for w in WRONG])
def test_rejects_a_typical_wrong_answer(name: str, candidate, capsys) -> None:
    assert check(name, candidate) is False
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {name}:")
    assert "Hint:" in out


@pytest.mark.parametrize(
    ("name", "candidate", "named"),
    [
        ("attention", attention_without_scale, "you forgot the 1/sqrt(head_dim) scale"),
        ("attention", attention_softmax_on_queries, "normalises over the queries"),
        ("add_learned_positions", positions_counted_from_one, "start at 1 (off by one)"),
        ("add_learned_positions", position_rows_from_token_ids, "indexed the position table"),
        ("add_learned_positions", start_ignored, "ignores start"),
        ("attention", attention_compares_queries_with_values, "values multiplied instead of keys"),
        ("sinusoidal_encoding", sines_then_cosines, "the 'half' layout"),
        ("sinusoidal_encoding", cosine_first, "sin/cos swapped"),
        ("sinusoidal_encoding", base_fixed_at_10000, "ignores the base"),
        ("sinusoidal_encoding", frequency_index_from_one, "index starts at 1"),
        ("relative_map", textbook_rotation, "rotate the wrong way"),
        ("relative_map", map_for_split_halves, "laid out for the half layout"),
        ("relative_map", base_ignored_in_the_map, "ignores the base"),
    ],
)
def test_typical_mistakes_are_named(name, candidate, named, capsys) -> None:
    assert check(name, candidate) is False
    assert named in capsys.readouterr().out


# ---- the dtype policy: a float answer keeps the dtype of the float inputs ----------------------


@pytest.mark.parametrize(
    ("name", "right"),
    [("attention", right_attention), ("add_learned_positions", right_add_learned_positions)],
)
def test_float_answers_must_keep_the_inputs_dtype(name, right, capsys) -> None:
    """The tables and q, k, v are float32: the right values returned as float64 are refused."""
    assert check(name, right, verbose=False)
    assert not check(name, lambda *a, **k: right(*a, **k).double())
    out = capsys.readouterr().out
    assert f"✗ {name}: the values are right, the dtype is not, on input 1" in out
    assert "expected dtype torch.float32, got dtype torch.float64" in out
