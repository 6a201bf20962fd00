"""The RoPE checkers accept right answers and reject wrong ones, both written here independently."""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.exercises import check, get_exercise, list_exercises

NAMES = ["rotate_half", "apply_rope_interleaved", "rope_matrix", "layout_permutation"]


# ---- right answers, written with loops (not with the package) -----------------------------------


def rotate_half_by_index(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    for i in range(half):
        out[..., i] = -x[..., i + half]
        out[..., i + half] = x[..., i]
    return out


def rope_interleaved_by_loops(x, positions, base=10000.0, *, sign=1, index_from=0, pairs="adj"):
    """Interleaved RoPE by loops; the keyword arguments inject the mistakes tested below."""
    dim = x.shape[-1]
    out = x.clone()
    for row, m in enumerate(positions.tolist()):
        for i in range(dim // 2):
            angle = sign * m * base ** (-2 * (i + index_from) / dim)
            a, b = (2 * i, 2 * i + 1) if pairs == "adj" else (i, i + dim // 2)
            xa, xb = x[..., row, a], x[..., row, b]
            out[..., row, a] = xa * math.cos(angle) - xb * math.sin(angle)
            out[..., row, b] = xb * math.cos(angle) + xa * math.sin(angle)
    return out


def rope_matrix_by_loops(position, dim, base=10000.0, *, transpose=False, index_from=0):
    matrix = torch.zeros(dim, dim, dtype=torch.float64)  # the chapter's template: float64
    for i in range(dim // 2):
        angle = position * base ** (-2 * (i + index_from) / dim)
        block = torch.tensor(
            [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]]
        )
        matrix[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = block.T if transpose else block
    return matrix


def permutation_by_list(head_dim: int) -> torch.Tensor:
    return torch.tensor(
        [2 * j for j in range(head_dim // 2)] + [2 * j + 1 for j in range(head_dim // 2)]
    )


def test_registered_in_book_order() -> None:
    names = list_exercises()
    assert all(name in names for name in NAMES)
    assert [names.index(n) for n in NAMES] == sorted(names.index(n) for n in NAMES)
    if "sinusoidal_encoding" in names:
        assert names.index("sinusoidal_encoding") < names.index("rotate_half")
    assert get_exercise("rope_matrix").chapter == "rope_derivation"


def test_right_answers_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("rotate_half", rotate_half_by_index)
    assert check("apply_rope_interleaved", rope_interleaved_by_loops)
    assert check("rope_matrix", rope_matrix_by_loops)
    assert check("layout_permutation", permutation_by_list)
    assert capsys.readouterr().out.count("✓") == 4


# ---- wrong answers ------------------------------------------------------------------------------


def rotate_half_sign_flipped(x):
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], -x[..., :half]), dim=-1)


def rotate_adjacent(x):  # interleaved rotate where half is asked
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    return out


def rotate_half_forgot_minus(x):
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], x[..., :half]), dim=-1)


def rotate_half_returns_a_list(x):
    return rotate_half_by_index(x).tolist()


@pytest.mark.parametrize(
    ("candidate", "named"),
    [
        (rotate_half_sign_flipped, "signs are flipped"),
        (rotate_adjacent, "interleaved"),
        (rotate_half_forgot_minus, "forgot the minus"),
        (rotate_half_returns_a_list, None),
        (lambda x: x, None),
    ],
)
def test_rotate_half_rejects(candidate, named, capsys: pytest.CaptureFixture[str]) -> None:
    assert not check("rotate_half", candidate)
    out = capsys.readouterr().out
    assert "✗ rotate_half" in out
    if named:
        assert named in out


@pytest.mark.parametrize(
    ("candidate", "named"),
    [
        (lambda x, p, base=10000.0: rope_interleaved_by_loops(x, p, base, sign=-1), "wrong way"),
        (
            lambda x, p, base=10000.0: rope_interleaved_by_loops(x, p, base, pairs="half"),
            "half layout",
        ),
        (lambda x, p, base=10000.0: rope_interleaved_by_loops(x, p, 10000.0), "ignore the base"),
        (lambda x, p, base=1000.0: rope_interleaved_by_loops(x, p, base), "base 1000"),
        (lambda x, p, base=10000.0: rope_interleaved_by_loops(x, p, 1000.0), "base 1000"),
        (
            lambda x, p, base=10000.0: rope_interleaved_by_loops(x, p, base, index_from=1),
            "starts at 1",
        ),
        (
            lambda x, p, base=10000.0: rope_interleaved_by_loops(x, p + 1, base),
            None,
        ),  # 1-based positions
        (lambda x, p, base=10000.0: x, None),
        (lambda x, p, base=10000.0: 1 / 0, "raised ZeroDivisionError"),
    ],
)
def test_apply_rope_interleaved_rejects(candidate, named, capsys) -> None:
    assert not check("apply_rope_interleaved", candidate)
    out = capsys.readouterr().out
    assert "✗ apply_rope_interleaved" in out
    if named:
        assert named in out


def test_apply_rope_interleaved_exponent_over_d_rejected(capsys) -> None:
    def exponent_i_over_d(x, positions, base=10000.0):
        dim = x.shape[-1]
        theta = base ** (-torch.arange(dim // 2, dtype=torch.float64) / dim)
        angles = positions.double()[:, None] * theta
        x0, x1 = x[..., 0::2].double(), x[..., 1::2].double()
        c, s = angles.cos(), angles.sin()
        return torch.stack((x0 * c - x1 * s, x1 * c + x0 * s), -1).flatten(-2)

    assert not check("apply_rope_interleaved", exponent_i_over_d)
    assert "-2i/d" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("candidate", "named"),
    [
        (lambda m, d, base=10000.0: rope_matrix_by_loops(m, d, base, transpose=True), "transpose"),
        (lambda m, d, base=10000.0: rope_matrix_by_loops(m, d, base, index_from=1), "starts at 1"),
        (lambda m, d, base=10000.0: rope_matrix_by_loops(m, d), "ignores the base"),
        (lambda m, d, base=10000.0: rope_matrix_by_loops(m, d, 1000.0), "base 1000"),
        (lambda m, d, base=1000.0: rope_matrix_by_loops(m, d, base), "base 1000"),
        (lambda m, d, base=10000.0: torch.eye(d), None),
        (lambda m, d, base=10000.0: rope_matrix_by_loops(m, d, base)[: d // 2], None),
    ],
)
def test_rope_matrix_rejects(candidate, named, capsys) -> None:
    assert not check("rope_matrix", candidate)
    out = capsys.readouterr().out
    assert "✗ rope_matrix" in out
    if named:
        assert named in out


def test_rope_matrix_half_pairs_rejected(capsys) -> None:
    def half_pairs(position, dim, base=10000.0):
        matrix = torch.zeros(dim, dim)
        for i in range(dim // 2):
            angle = position * base ** (-2 * i / dim)
            a, b = i, i + dim // 2
            matrix[a, a] = matrix[b, b] = math.cos(angle)
            matrix[a, b], matrix[b, a] = -math.sin(angle), math.sin(angle)
        return matrix

    assert not check("rope_matrix", half_pairs)
    assert "half layout" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("candidate", "named"),
    [
        (lambda d: torch.tensor([j // 2 + (j % 2) * d // 2 for j in range(d)]), "inverse"),
        (lambda d: torch.arange(d), "identity"),
        (lambda d: torch.arange(d).flip(0), None),
        (lambda d: permutation_by_list(d).tolist(), None),
    ],
)
def test_layout_permutation_rejects(candidate, named, capsys) -> None:
    assert not check("layout_permutation", candidate)
    out = capsys.readouterr().out
    assert "✗ layout_permutation" in out
    if named:
        assert named in out


def test_apply_rope_interleaved_discarded_rotate_rejected(capsys) -> None:
    """The errata's bug: rotate(x) computed, its result dropped, so out = x * (cos + sin)."""

    def discarded_by_loops(x, positions, base=10000.0):
        dim = x.shape[-1]
        out = x.clone()
        for row, m in enumerate(positions.tolist()):
            for i in range(dim // 2):
                angle = m * base ** (-2 * i / dim)
                for j in (2 * i, 2 * i + 1):
                    out[..., row, j] = x[..., row, j] * (math.cos(angle) + math.sin(angle))
        return out

    assert not check("apply_rope_interleaved", discarded_by_loops)
    out = capsys.readouterr().out
    assert "thrown away" in out and "discarded rotate_half" in out


def test_base_1000_hint_is_not_given_for_other_slips(capsys) -> None:
    """The base-1000 hint names only that typo: a sign error still gets its own message."""
    assert not check(
        "apply_rope_interleaved",
        lambda x, p, base=10000.0: rope_interleaved_by_loops(x, p, base, sign=-1),
    )
    out = capsys.readouterr().out
    assert "wrong way" in out and "base 1000" not in out


# ---- the dtype policy: any signed integer dtype for indices, the inputs' dtype for floats --------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
def test_layout_permutation_accepts_any_signed_integer_dtype(dtype) -> None:
    """An int32 permutation indexes a tensor exactly as an int64 one does."""
    assert check("layout_permutation", lambda d: permutation_by_list(d).to(dtype), verbose=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
def test_layout_permutation_refuses_float_and_unsigned_indices(dtype, capsys) -> None:
    assert not check("layout_permutation", lambda d: permutation_by_list(d).to(dtype))
    out = capsys.readouterr().out
    assert "✗ layout_permutation: the values are right, the dtype is not" in out
    assert f"expected a signed integer dtype (such as torch.int64), got dtype {dtype}" in out


@pytest.mark.parametrize(
    ("name", "right"),
    [("rotate_half", rotate_half_by_index), ("apply_rope_interleaved", rope_interleaved_by_loops)],
)
def test_float_answers_must_keep_the_inputs_dtype(name, right, capsys) -> None:
    """The inputs are float32: the right values returned as float64 (or float16) are refused."""
    assert check(name, right, verbose=False)
    for wrong in (torch.float64, torch.float16):
        assert not check(name, lambda *a, _w=wrong, **k: right(*a, **k).to(_w))
        out = capsys.readouterr().out
        if wrong == torch.float64:  # float16 may already fail on the values
            assert f"expected dtype torch.float32, got dtype {wrong}" in out
            assert ".to(x.dtype)" in out


def test_rope_matrix_is_float64_as_the_template_builds_it(capsys) -> None:
    assert not check("rope_matrix", lambda *a, **k: rope_matrix_by_loops(*a, **k).float())
    out = capsys.readouterr().out
    assert "expected dtype torch.float64, got dtype torch.float32" in out
    assert ".to(torch.float64)" in out
