"""Part I: the sinusoidal table against the paper's formula, its properties, the learned table."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rope_tutor.absolute import (
    LearnedPositionalEmbedding,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_relative_map,
)


def paper_table(num_positions: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """Vaswani et al. (2017), section 3.5, written out with scalar loops in float64."""
    table = np.zeros((num_positions, dim))
    for pos in range(num_positions):
        for i in range(dim // 2):
            angle = pos / base ** (2 * i / dim)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table


# --- sinusoidal_encoding: values -------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_positions", "dim", "base"),
    [(1, 2, 10000.0), (7, 4, 10000.0), (64, 16, 10000.0), (33, 10, 500.0), (128, 64, 1e6)],
)
def test_sinusoidal_matches_the_papers_formula(num_positions: int, dim: int, base: float) -> None:
    table = sinusoidal_encoding(num_positions, dim, base)
    assert table.shape == (num_positions, dim)
    assert table.dtype == torch.float32
    np.testing.assert_allclose(table.numpy(), paper_table(num_positions, dim, base), atol=2e-7)


def test_sinusoidal_large_positions_are_accurate() -> None:
    """Angles are formed in float64: position 100 000 is as accurate as float32 allows."""
    table = sinusoidal_encoding(100_001, 8)
    np.testing.assert_allclose(table[-1].numpy(), paper_table(100_001, 8)[-1], atol=1e-6)


def test_sinusoidal_float64_table_matches_the_formula_to_double_precision() -> None:
    """dtype=torch.float64 keeps the float64 angles' table: no float32 rounding (up to 3e-8)."""
    table = sinusoidal_encoding(1000, 16, dtype=torch.float64)
    assert table.dtype == torch.float64
    np.testing.assert_allclose(table.numpy(), paper_table(1000, 16, 10000.0), rtol=0, atol=1e-12)
    # the float32 default is the same table rounded once
    assert torch.equal(sinusoidal_encoding(1000, 16), table.float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, "float64"])
def test_sinusoidal_dtype_must_be_float32_or_float64(dtype: object) -> None:
    message = r"dtype must be torch\.float32 or torch\.float64, got dtype="
    with pytest.raises(ValueError, match=message):
        sinusoidal_encoding(4, 4, dtype=dtype)


def test_sinusoidal_known_values() -> None:
    # Position 0 is (sin 0, cos 0) = (0, 1) in every pair; pair 0 has frequency 1 for any base.
    table = sinusoidal_encoding(3, 6, base=7.0)
    assert torch.equal(table[0], torch.tensor([0.0, 1.0, 0.0, 1.0, 0.0, 1.0]))
    assert table[2, 0].item() == pytest.approx(math.sin(2.0), abs=1e-7)
    assert table[2, 3].item() == pytest.approx(math.cos(2.0 / 7.0 ** (2 / 6)), abs=1e-7)


def test_sinusoidal_frequencies_and_wavelengths() -> None:
    frequencies = sinusoidal_frequencies(8, base=10000.0)
    expected = [10000.0 ** (-2 * i / 8) for i in range(4)]
    np.testing.assert_allclose(frequencies.numpy(), expected, rtol=1e-15)
    assert frequencies.dtype == torch.float64
    # The longest wavelength 2π·base^((d-2)/d) approaches 2π·base as d grows.
    longest = 2 * math.pi / sinusoidal_frequencies(512)[-1].item()
    assert longest == pytest.approx(2 * math.pi * 10000.0 ** (510 / 512))


# --- sinusoidal_encoding: properties ---------------------------------------------------------


@pytest.mark.parametrize("dim", [2, 8, 64, 130])
def test_every_row_has_norm_sqrt_half_dim(dim: int) -> None:
    norms = sinusoidal_encoding(200, dim).double().norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, math.sqrt(dim / 2)))


def test_dot_product_depends_only_on_the_offset() -> None:
    """PE(p)·PE(p+k) = Σ_i cos(k θ_i), whatever p."""
    dim, base = 32, 10000.0
    table = sinusoidal_encoding(600, dim, base).double()
    thetas = [base ** (-2 * i / dim) for i in range(dim // 2)]
    for offset in (0, 1, 5, 37, 250):
        dots = (table[: 600 - offset] * table[offset:]).sum(-1)  # one per p
        expected = sum(math.cos(offset * theta) for theta in thetas)
        torch.testing.assert_close(dots, torch.full_like(dots, expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("offset", [-7, -1, 0, 1, 2, 13, 100, 2.5])
def test_relative_map_shifts_every_position(offset: float) -> None:
    dim, base = 16, 10000.0
    table = sinusoidal_encoding(400, dim, base).double()
    shift = sinusoidal_relative_map(offset, dim, base).double()
    positions = np.arange(10, 300, 7)
    # PE(p + k) from the paper's formula at the (possibly fractional) shifted positions.
    for p in positions:
        target = [
            f((p + offset) / base ** (2 * i / dim))
            for i in range(dim // 2)
            for f in (math.sin, math.cos)
        ]
        np.testing.assert_allclose((shift @ table[p]).numpy(), target, atol=2e-6)


def test_relative_map_is_a_block_diagonal_rotation_group() -> None:
    dim = 12
    m3, m4, m7 = (sinusoidal_relative_map(k, dim).double() for k in (3, 4, 7))
    torch.testing.assert_close(m3 @ m4, m7)  # M_a M_b = M_{a+b}
    torch.testing.assert_close(m3.T @ m3, torch.eye(dim, dtype=torch.float64))  # orthogonal
    torch.testing.assert_close(sinusoidal_relative_map(-3, dim).double(), m3.T)
    torch.testing.assert_close(sinusoidal_relative_map(0, dim), torch.eye(dim))
    off_block = m7.clone()
    for i in range(dim // 2):
        off_block[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = 0
    assert torch.count_nonzero(off_block) == 0
    # Block i for offset k: [[cos kθ, sin kθ], [-sin kθ, cos kθ]], written out.
    theta = 10000.0 ** (-2 * 1 / dim)
    c, s = math.cos(7 * theta), math.sin(7 * theta)
    torch.testing.assert_close(m7[2:4, 2:4], torch.tensor([[c, s], [-s, c]], dtype=torch.float64))


def test_projections_break_the_relative_property_unless_they_commute() -> None:
    """(W_q PE(p))·(W_k PE(p+k)) depends on p for random W; not when W_qᵀW_k commutes with M_k."""
    dim, offset = 16, 5
    table = torch.from_numpy(paper_table(300, dim))  # float64, so that exact zeros show
    generator = torch.Generator().manual_seed(0)
    w_q, w_k = torch.randn(2, dim, dim, generator=generator, dtype=torch.float64)

    def scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ((table[:-offset] @ a.T) * (table[offset:] @ b.T)).sum(-1)

    assert scores(w_q, w_k).std() > 0.5
    # A block-diagonal W_qᵀW_k with blocks a·I + b·J (J the 90° rotation) commutes with every M_k.
    coefficients = torch.randn(dim // 2, 2, generator=generator, dtype=torch.float64)
    blocks = [
        torch.tensor([[a, b], [-b, a]], dtype=torch.float64) for a, b in coefficients.tolist()
    ]
    structured = torch.block_diag(*blocks)
    for k in (1, 7, 40):
        shift = sinusoidal_relative_map(k, dim).double()
        torch.testing.assert_close(structured @ shift, shift @ structured)
    assert scores(torch.eye(dim, dtype=torch.float64), structured).std() < 1e-10


# --- sinusoidal: bad input -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_positions": 4, "dim": 7}, "dim must be a positive even int.*dim=7"),
        ({"num_positions": 4, "dim": 0}, "dim must be a positive even int.*dim=0"),
        ({"num_positions": 4, "dim": -2}, "dim must be a positive even int.*dim=-2"),
        ({"num_positions": 0, "dim": 4}, "num_positions must be a positive int.*num_positions=0"),
        ({"num_positions": -3, "dim": 4}, "num_positions must be a positive int.*=-3"),
        ({"num_positions": 2.0, "dim": 4}, r"num_positions must be a positive int.*=2\.0"),
        ({"num_positions": True, "dim": 4}, "num_positions must be a positive int.*=True"),
        ({"num_positions": 4, "dim": 4, "base": 0.0}, r"base must be .*greater than 1.*base=0\.0"),
        ({"num_positions": 4, "dim": 4, "base": -10.0}, r"base must be .*base=-10\.0"),
        ({"num_positions": 4, "dim": 4, "base": 1.0}, r"base must be .*base=1\.0"),
        ({"num_positions": 4, "dim": 4, "base": float("nan")}, "base must be .*base=nan"),
        ({"num_positions": 4, "dim": 4, "base": float("inf")}, "base must be .*base=inf"),
        ({"num_positions": 4, "dim": 4, "base": "10000"}, "base must be .*base='10000'"),
    ],
)
def test_sinusoidal_bad_input_names_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sinusoidal_encoding(**kwargs)


def test_numpy_integers_are_accepted() -> None:
    torch.testing.assert_close(
        sinusoidal_encoding(np.int64(5), np.int32(4)), sinusoidal_encoding(5, 4)
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((float("inf"), 4), "offset must be a finite real number, got offset=inf"),
        (("3", 4), "offset must be .*offset='3'"),
        ((1, 5), "dim must be a positive even int.*dim=5"),
        ((1, 4, 0.5), r"base must be .*base=0\.5"),
    ],
)
def test_relative_map_bad_input(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sinusoidal_relative_map(*args)


# --- LearnedPositionalEmbedding --------------------------------------------------------------


def test_learned_lookup_returns_the_rows_of_the_table() -> None:
    torch.manual_seed(0)
    embedding = LearnedPositionalEmbedding(10, 6)
    positions = torch.tensor([[0, 3, 9], [9, 9, 1]])
    out = embedding(positions)
    assert out.shape == (2, 3, 6)
    weight = embedding.table.weight.detach()
    for b in range(2):
        for t in range(3):
            assert torch.equal(out[b, t], weight[positions[b, t]])
    assert 0.01 < weight.std().item() < 0.03  # GPT-2's N(0, 0.02²) initialisation
    assert "max_positions=10, dim=6" in repr(embedding)


def test_learned_table_is_trained_only_where_positions_were_seen() -> None:
    torch.manual_seed(0)
    embedding = LearnedPositionalEmbedding(8, 4)
    before = embedding.table.weight.detach().clone()
    embedding(torch.arange(5)).pow(2).sum().backward()
    grad = embedding.table.weight.grad
    assert grad[:5].abs().sum() > 0
    assert torch.count_nonzero(grad[5:]) == 0
    assert torch.equal(embedding.table.weight.detach(), before)


def test_empty_positions_are_fine() -> None:
    out = LearnedPositionalEmbedding(4, 3)(torch.zeros(0, dtype=torch.long))
    assert out.shape == (0, 3)


@pytest.mark.parametrize(
    ("positions", "error", "message"),
    [
        (
            torch.tensor([0, 4]),
            IndexError,
            "position 4 is beyond the learned table.*max_positions=4",
        ),
        (torch.tensor([[1, 2], [100, 3]]), IndexError, "position 100 .*max_positions=4"),
        (torch.tensor([-1, 2]), IndexError, "positions must be >= 0, got position -1"),
        (torch.tensor([0.0, 1.0]), ValueError, "positions must be an integer tensor.*float32"),
        (torch.tensor([True, False]), ValueError, "positions must be an integer tensor.*bool"),
        ([0, 1], ValueError, r"positions must be an integer tensor, got list: \[0, 1\]"),
    ],
)
def test_learned_bad_positions_raise_clearly(positions: object, error: type, message: str) -> None:
    embedding = LearnedPositionalEmbedding(4, 2)
    with pytest.raises(error, match=message):
        embedding(positions)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 4), "max_positions must be a positive int, got max_positions=0"),
        ((-5, 4), "max_positions must be a positive int, got max_positions=-5"),
        ((8.0, 4), r"max_positions must be a positive int, got max_positions=8\.0"),
        ((8, 0), "dim must be a positive int, got dim=0"),
        ((8, -1), "dim must be a positive int, got dim=-1"),
    ],
)
def test_learned_bad_sizes_raise(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LearnedPositionalEmbedding(*args)
