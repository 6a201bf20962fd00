"""The shared attention helper against an explicit softmax(q kᵀ/√d + bias) v written in the test."""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.alibi import alibi_bias
from rope_tutor.attention import SelfAttention, attention, causal_mask


def naive_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Loops over queries; ``allowed[i, j]`` says whether query i may see key j."""
    q, k, v = q.double(), k.double(), v.double()
    query_len = q.shape[-2]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for i in range(query_len):
        logits = (q[..., i, None, :] * k).sum(-1) / math.sqrt(q.shape[-1])  # (..., key_len)
        if bias is not None:
            logits = logits + bias.double()[..., i, :]
        if allowed is not None:
            logits = logits.masked_fill(~allowed[i], float("-inf"))
        weights = torch.exp(logits - logits.max(-1, keepdim=True).values)
        weights = weights / weights.sum(-1, keepdim=True)
        out[..., i, :] = (weights[..., None] * v).sum(-2)
    return out


def random_qkv(query_len: int, key_len: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, query_len, 8, generator=generator)
    k = torch.randn(2, 3, key_len, 8, generator=generator)
    v = torch.randn(2, 3, key_len, 8, generator=generator)
    return q, k, v


# --- causal_mask -----------------------------------------------------------------------------


def test_causal_mask_square_is_lower_triangular() -> None:
    expected = torch.tensor([[i >= j for j in range(5)] for i in range(5)])
    assert torch.equal(causal_mask(5, 5), expected)


def test_causal_mask_with_cache_puts_queries_last() -> None:
    # 2 new queries at positions 3 and 4 of 5 keys.
    expected = torch.tensor([[True, True, True, True, False], [True] * 5])
    assert torch.equal(causal_mask(2, 5), expected)


@pytest.mark.parametrize(
    ("query_len", "key_len", "message"),
    [(6, 5, "query_len=6 must not exceed key_len=5"), (-1, 3, "query_len=-1")],
)
def test_causal_mask_bad_lengths(query_len: int, key_len: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        causal_mask(query_len, key_len)


# --- attention -------------------------------------------------------------------------------


@pytest.mark.parametrize("return_weights", [False, True])
def test_attention_matches_naive(return_weights: bool) -> None:
    q, k, v = random_qkv(4, 6)
    out = attention(q, k, v, return_weights=return_weights)
    if return_weights:
        out, weights = out
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4))
    torch.testing.assert_close(out.double(), naive_attention(q, k, v), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("query_len", "key_len"), [(5, 5), (2, 7), (1, 4)])
def test_causal_attention_both_paths_match_naive(query_len: int, key_len: int, device) -> None:
    q, k, v = random_qkv(query_len, key_len, seed=1)
    offset = key_len - query_len
    allowed = torch.tensor([[j <= offset + i for j in range(key_len)] for i in range(query_len)])
    expected = naive_attention(q, k, v, allowed=allowed)
    q, k, v = q.to(device), k.to(device), v.to(device)
    fast = attention(q, k, v, causal=True)
    explicit, weights = attention(q, k, v, causal=True, return_weights=True)
    torch.testing.assert_close(fast.cpu().double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit.cpu().double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.all(weights.cpu()[..., ~allowed] == 0)


def test_bias_is_added_to_the_logits_on_both_paths() -> None:
    q, k, v = random_qkv(3, 5, seed=2)
    distance = torch.arange(5)[None, :] - torch.arange(2, 5)[:, None]  # (3, 5)
    slopes = torch.tensor([0.5, 0.25, 0.125])[:, None, None]  # (heads, 1, 1)
    bias = slopes * distance.float()  # (3, 3, 5): broadcast over the batch
    offset_allowed = torch.tensor([[j <= 2 + i for j in range(5)] for i in range(3)])
    for causal in (False, True):
        allowed = offset_allowed if causal else None
        expected = naive_attention(q, k, v, allowed=allowed, bias=bias)
        fast = attention(q, k, v, causal=causal, bias=bias)
        explicit, _ = attention(q, k, v, causal=causal, bias=bias, return_weights=True)
        torch.testing.assert_close(fast.double(), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(explicit.double(), expected, atol=1e-5, rtol=1e-5)


def test_explicit_scale() -> None:
    q, k, v = random_qkv(3, 3, seed=3)
    # scale=2/sqrt(8) on q equals the default scale on 2q.
    torch.testing.assert_close(
        attention(q, k, v, scale=2 / math.sqrt(8)), attention(2 * q, k, v), atol=1e-5, rtol=1e-5
    )


def test_float64_stays_float64() -> None:
    q, k, v = (t.double() for t in random_qkv(3, 4))
    assert attention(q, k, v).dtype == torch.float64
    assert attention(q, k, v, return_weights=True)[1].dtype == torch.float64


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((4, 8), (4, 8), (2, 4, 8)), "same number of dims"),
        (((8,), (8,), (8,)), "same number of dims"),
        (((3, 8), (4, 6), (4, 6)), "q and k head_dim differ"),
        (((3, 8), (4, 8), (5, 8)), "k and v key_len differ"),
    ],
)
def test_attention_shape_errors(shapes: tuple, message: str) -> None:
    q, k, v = (torch.zeros(shape) for shape in shapes)
    with pytest.raises(ValueError, match=message):
        attention(q, k, v)


def test_attention_rejects_a_boolean_bias() -> None:
    q, k, v = random_qkv(3, 3)
    with pytest.raises(ValueError, match="bias must be a floating-point.*torch.bool"):
        attention(q, k, v, bias=torch.ones(3, 3, dtype=torch.bool))


# --- SelfAttention ---------------------------------------------------------------------------


def test_self_attention_is_permutation_equivariant() -> None:
    torch.manual_seed(0)
    layer = SelfAttention(16, 4)
    x = torch.randn(2, 7, 16)
    permutation = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    with torch.no_grad():
        torch.testing.assert_close(layer(x[:, permutation]), layer(x)[:, permutation])


def test_causal_self_attention_is_not_permutation_equivariant() -> None:
    torch.manual_seed(0)
    layer = SelfAttention(16, 4, causal=True)
    x = torch.randn(1, 5, 16)
    permutation = torch.tensor([4, 3, 2, 1, 0])
    with torch.no_grad():
        assert not torch.allclose(layer(x[:, permutation]), layer(x)[:, permutation], atol=1e-3)


def test_self_attention_matches_a_manual_multi_head_computation() -> None:
    torch.manual_seed(1)
    dim, heads = 12, 3
    layer = SelfAttention(dim, heads)
    x = torch.randn(2, 5, dim)
    w_q, w_k, w_v = layer.qkv.weight.detach().double().split(dim)  # each (dim, dim)
    xd = x.double()
    head_outputs = []
    for h in range(heads):
        rows = slice(4 * h, 4 * h + 4)
        q, k, v = xd @ w_q[rows].T, xd @ w_k[rows].T, xd @ w_v[rows].T  # (batch, seq, 4)
        head_outputs.append(naive_attention(q, k, v))
    expected = torch.cat(head_outputs, -1) @ layer.out.weight.detach().double().T
    with torch.no_grad():
        torch.testing.assert_close(layer(x).double(), expected, atol=1e-5, rtol=1e-5)


def test_self_attention_uses_the_rotary_module_and_positions() -> None:
    seen = {}

    def rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple:
        seen["shape"], seen["positions"] = tuple(q.shape), positions.tolist()
        return q, k

    layer = SelfAttention(8, 2, rotary=rotary)
    layer(torch.randn(1, 3, 8))
    assert seen == {"shape": (1, 2, 3, 4), "positions": [0, 1, 2]}
    layer(torch.randn(1, 3, 8), positions=torch.tensor([5, 6, 7]))
    assert seen["positions"] == [5, 6, 7]


def test_self_attention_bias_changes_the_output() -> None:
    torch.manual_seed(2)
    layer = SelfAttention(8, 2)
    x = torch.randn(1, 4, 8)
    bias = -torch.arange(4.0)[None, :].expand(4, 4).clone()
    with torch.no_grad():
        assert not torch.allclose(layer(x), layer(x, bias=bias))
        torch.testing.assert_close(layer(x, bias=torch.zeros(4, 4)), layer(x))


@pytest.mark.parametrize(
    ("dim", "heads", "message"),
    [
        (10, 3, "dim=10 must be a positive multiple of num_heads=3"),
        (8, 0, "num_heads must be a positive int, got num_heads=0"),
        (0, 2, "dim must be a positive int, got dim=0"),
        (-4, 2, "dim must be a positive int, got dim=-4"),
        (8.0, 2, r"dim must be a positive int, got dim=8\.0"),
    ],
)
def test_self_attention_bad_sizes(dim: int, heads: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SelfAttention(dim, heads)


@pytest.mark.parametrize("shape", [(4, 8), (1, 4, 6), (1, 2, 4, 8)])
def test_self_attention_bad_input_shape(shape: tuple) -> None:
    with pytest.raises(ValueError, match=r"x must have shape \(batch, seq, 8\)"):
        SelfAttention(8, 2)(torch.zeros(shape))


def test_self_attention_returns_the_weights_of_its_own_output() -> None:
    torch.manual_seed(3)
    layer = SelfAttention(16, 4, causal=True).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    bias = alibi_bias(4, 6).double()
    with torch.no_grad():
        plain = layer(x, bias=bias)  # SDPA
        out, weights = layer(x, bias=bias, return_weights=True)  # explicit softmax
        q, k, _ = layer.qkv(x).view(2, 6, 3, 4, 4).unbind(dim=2)
        logits = q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1) / 2.0 + bias
    assert weights.shape == (2, 4, 6, 6)
    torch.testing.assert_close(out, plain, rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, logits.softmax(-1), rtol=0, atol=1e-12)
    assert (weights.triu(1) == 0).all()
