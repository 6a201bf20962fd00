"""Chapter 5's toy (rope_tutor.toys.layout_mismatch) against references built here: rotation
matrices written out entry by entry, torch's random stream called directly, and the properties the
chapter states (distance 0 exact, the permutation restores Meta's scores)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rope_tutor.toys import layout_mismatch as toy


def theta(head_dim: int, i: int) -> float:
    return 10000.0 ** (-2 * i / head_dim)  # (rope-theta), in Python floats


def theta32(head_dim: int, i: int) -> float:
    """theta_i rounded to float32, as rope_frequencies documents (the angles are then float64)."""
    return float(np.float32(theta(head_dim, i)))


def rotation(position: int, head_dim: int, layout: str) -> torch.Tensor:
    """RoPE's rotation at ``position``, written out entry by entry: (head_dim, head_dim) float64."""
    matrix = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    for i in range(head_dim // 2):
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + head_dim // 2)
        angle = position * theta32(head_dim, i)
        c, s = math.cos(angle), math.sin(angle)
        matrix[a, a], matrix[a, b], matrix[b, a], matrix[b, b] = c, -s, s, c
    return matrix


def reference_scores(w_q, w_k, tokens, num_heads: int, layout: str) -> torch.Tensor:
    """score[h, m, n] = (R_m W_q^h h_m) . (R_n W_k^h h_n), one pair of tokens at a time."""
    head_dim = w_q.shape[0] // num_heads
    seq = len(tokens)
    scores = torch.zeros(num_heads, seq, seq, dtype=torch.float64)
    for h in range(num_heads):
        rows = slice(h * head_dim, (h + 1) * head_dim)
        for m in range(seq):
            q = rotation(m, head_dim, layout) @ (w_q[rows] @ tokens[m])
            for n in range(seq):
                scores[h, m, n] = q @ (rotation(n, head_dim, layout) @ (w_k[rows] @ tokens[n]))
    return scores


def small_case(seed: int = 0, num_heads: int = 2, head_dim: int = 4, hidden: int = 6, seq: int = 9):
    generator = torch.Generator().manual_seed(seed)
    w_q, w_k = torch.randn(
        2, num_heads * head_dim, hidden, generator=generator, dtype=torch.float64
    )
    return w_q, w_k, torch.randn(seq, hidden, generator=generator, dtype=torch.float64)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_scores_equal_explicit_rotation_matrices(layout: str) -> None:
    w_q, w_k, tokens = small_case()
    scores = toy.attention_scores(w_q, w_k, layout, tokens, num_heads=2)
    assert scores.shape == (2, 9, 9) and scores.dtype == torch.float64
    expected = reference_scores(w_q, w_k, tokens, 2, layout)
    assert torch.allclose(scores, expected, rtol=0, atol=1e-12)


def test_band_errors_equal_their_definition() -> None:
    w_q, w_k, tokens = small_case(seed=3)
    bands = ((1, 1), (2, 3), (4, 8))
    meta = reference_scores(w_q, w_k, tokens, 2, "interleaved")
    forgot = reference_scores(w_q, w_k, tokens, 2, "half")
    expected = []
    for low, high in bands:
        pairs = [(m, n) for m in range(9) for n in range(9) if low <= abs(m - n) <= high]
        error = sum(abs(meta[h, m, n] - forgot[h, m, n]) for h in range(2) for m, n in pairs)
        size = sum(abs(meta[h, m, n]) for h in range(2) for m, n in pairs)
        expected.append(float(error / size))
    got = toy.band_errors(w_q, w_k, tokens, bands=bands, num_heads=2)
    assert got == pytest.approx(expected, rel=1e-9, abs=0)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_band_errors_are_exactly_zero_when_both_layouts_are_the_same(layout: str) -> None:
    w_q, w_k, tokens = toy.seeded_draw(4)
    errors = toy.band_errors(w_q, w_k, tokens, reference=layout, used=layout)
    assert errors == [0.0] * len(toy.BANDS)
    assert toy.distance_zero_error(w_q, w_k, tokens, reference=layout, used=layout) == 0.0


@pytest.mark.parametrize("seed", range(10))
def test_distance_zero_is_exact_in_every_draw(seed: int) -> None:
    # At m = n both vectors get the same rotation, which keeps inner products
    draw = toy.seeded_draw(seed)
    assert toy.distance_zero_error(*draw) < 1e-12
    assert min(toy.band_errors(*draw)) > 0.1  # elsewhere: not a rounding error


def test_permuted_rows_give_meta_scores_in_the_half_layout() -> None:
    # (rope-permutation): P puts each head's even features first, then the odd ones
    w_q, w_k = toy.draw_weights(torch.Generator().manual_seed(11))
    tokens = toy.draw_tokens(12, torch.Generator().manual_seed(12))
    within = list(range(0, toy.HEAD_DIM, 2)) + list(range(1, toy.HEAD_DIM, 2))
    perm = [h * toy.HEAD_DIM + j for h in range(toy.NUM_HEADS) for j in within]
    meta = toy.attention_scores(w_q, w_k, "interleaved", tokens)
    converted = toy.attention_scores(w_q[perm], w_k[perm], "half", tokens)
    assert torch.allclose(meta, converted, rtol=0, atol=1e-10)
    assert not torch.allclose(meta, toy.attention_scores(w_q, w_k, "half", tokens), atol=1e-3)


def test_head_vectors_split_the_projection_into_heads() -> None:
    w_q, _, tokens = small_case(num_heads=3, head_dim=2, seq=4)
    heads = toy.head_vectors(w_q, tokens, num_heads=3)
    assert heads.shape == (3, 4, 2)
    for h in range(3):
        for m in range(4):
            assert torch.allclose(
                heads[h, m], w_q[2 * h : 2 * h + 2] @ tokens[m], rtol=0, atol=1e-14
            )


def test_seeded_draw_is_deterministic_differs_between_seeds_and_leaves_the_global_stream() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first, again, other = toy.seeded_draw(0), toy.seeded_draw(0), toy.seeded_draw(1)
    assert torch.equal(torch.get_rng_state(), state)
    shapes = [(toy.NUM_HEADS * toy.HEAD_DIM, toy.HIDDEN)] * 2 + [(toy.LONG_SEQ, toy.HIDDEN)]
    assert [tuple(t.shape) for t in first] == shapes and all(
        t.dtype == torch.float64 for t in first
    )
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(torch.equal(a, b) for a, b in zip(first, other, strict=True))
    # the stream of torch.Generator().manual_seed(seed), drawn w_q, w_k, tokens in that order
    generator = torch.Generator().manual_seed(0)
    direct = [torch.randn(shape, generator=generator, dtype=torch.float64) for shape in shapes]
    assert all(torch.equal(a, b) for a, b in zip(first, direct, strict=True))


def test_draws_without_a_generator_continue_torchs_global_stream() -> None:
    torch.manual_seed(0)
    w_q, w_k = toy.draw_weights()
    tokens = toy.draw_tokens(toy.SHORT_SEQ)
    torch.manual_seed(0)
    direct = [torch.randn(32, 32, dtype=torch.float64) for _ in range(2)]
    direct.append(torch.randn(7, 32, dtype=torch.float64))
    assert all(torch.equal(a, b) for a, b in zip((w_q, w_k, tokens), direct, strict=True))


def test_distances() -> None:
    assert toy.distances(4).tolist() == [[abs(m - n) for n in range(4)] for m in range(4)]


def test_feature_speeds_and_the_slow_features() -> None:
    head_dim = toy.HEAD_DIM
    assert toy.feature_pairs(8, "interleaved").tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert toy.feature_pairs(8, "half").tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    for layout, pair in (
        ("interleaved", lambda j: j // 2),
        ("half", lambda j: j % (head_dim // 2)),
    ):
        expected = [theta(head_dim, pair(j)) for j in range(head_dim)]
        assert toy.feature_speeds(head_dim, layout).tolist() == pytest.approx(expected, rel=1e-6)
    slow = [
        j
        for j in range(head_dim)
        if theta(head_dim, j // 2) < 0.05 and theta(head_dim, j % (head_dim // 2)) < 0.05
    ]
    assert toy.slow_features().nonzero().flatten().tolist() == slow == [6, 7, 11, 12, 13, 14, 15]
    assert not toy.slow_features(threshold=1e-9).any() and toy.slow_features(threshold=2.0).all()


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda w_q, w_k, t: toy.attention_scores(w_q, w_k, "sideways", t), "layout"),
        (lambda w_q, w_k, t: toy.band_errors(w_q, w_k, t, bands=((1, 2),), used="Meta"), "layout"),
        (lambda w_q, w_k, t: toy.attention_scores(w_q, w_k, "half", t[:, :5]), "tokens"),
        (lambda w_q, w_k, t: toy.attention_scores(w_q, w_k[:-2], "half", t), "w_"),
        (lambda w_q, w_k, t: toy.attention_scores(w_q[:6], w_k[:6], "half", t), "w_q"),  # 3 + 3
        (lambda w_q, w_k, t: toy.attention_scores(w_q, w_k, "half", t, num_heads=0), "num_heads"),
        (lambda w_q, w_k, t: toy.attention_scores(w_q.long(), w_k, "half", t), "w_q"),
        (lambda w_q, w_k, t: toy.band_errors(w_q, w_k, t, bands=((3, 1),)), "bands"),
        (lambda w_q, w_k, t: toy.band_errors(w_q, w_k, t, bands=((1, 9),)), "bands"),
        (lambda w_q, w_k, t: toy.band_errors(w_q, w_k, t, bands=((1.5, 2),)), "bands"),
        (lambda w_q, w_k, t: toy.head_vectors(w_q, t, num_heads=3), "num_heads"),
    ],
)
def test_bad_input_raises_a_value_error_naming_the_argument(call, argument: str) -> None:
    w_q, w_k, tokens = small_case()  # 2 heads of size 4, hidden 6, 9 tokens
    with pytest.raises(ValueError, match=argument):
        call(w_q, w_k, tokens)


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: toy.seeded_draw(-1), "seed"),
        (lambda: toy.seeded_draw(1.5), "seed"),
        (lambda: toy.draw_tokens(0), "seq"),
        (lambda: toy.distances(-3), "seq"),
        (lambda: toy.feature_pairs(7, "half"), "head_dim"),
        (lambda: toy.feature_pairs(8, "diagonal"), "layout"),
        (lambda: toy.slow_features(15), "head_dim"),
        (lambda: toy.slow_features(threshold=float("nan")), "threshold"),
    ],
)
def test_bad_sizes_raise_a_value_error_naming_the_argument(call, argument: str) -> None:
    with pytest.raises(ValueError, match=argument):
        call()
