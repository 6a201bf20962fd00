"""ALiBi (Part III) against the authors' slope rule, Hugging Face Bloom, and softmax identities."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from rope_tutor import alibi_attention, alibi_bias, alibi_slopes, attention


def paper_get_slopes(n: int) -> list[float]:
    """The authors' recursive ``get_slopes`` (ofirpress/attention_with_linear_biases)."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_get_slopes(2 * closest)[0::2][: n - closest]


def relative_bias_by_loops(slopes: list[float], query_len: int, key_len: int, causal: bool):
    """-m (i - j), future keys -inf (causal), or -m |i - j|; queries are the last positions."""
    bias = torch.empty(len(slopes), query_len, key_len, dtype=torch.float64)
    for h, m in enumerate(slopes):
        for row in range(query_len):
            i = key_len - query_len + row
            for j in range(key_len):
                if causal:
                    bias[h, row, j] = -m * (i - j) if j <= i else float("-inf")
                else:
                    bias[h, row, j] = -m * abs(i - j)
    return bias


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 32, 48, 64, 112])
def test_slopes_follow_the_papers_rule(num_heads: int) -> None:
    expected = torch.tensor(paper_get_slopes(num_heads), dtype=torch.float32)
    got = alibi_slopes(num_heads)
    assert got.dtype == torch.float32 and got.shape == (num_heads,)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


def test_slopes_quoted_in_the_paper() -> None:
    # Section 3: "for a model with 8 heads ... 1/2, 1/4, ..., 1/256"; 16 heads: 1/sqrt(2), 1/2, ...
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    torch.testing.assert_close(
        alibi_slopes(16), torch.tensor([2 ** (-k / 2) for k in range(1, 17)]), rtol=1e-6, atol=0
    )
    assert alibi_slopes(4).tolist() == [1 / 4, 1 / 16, 1 / 64, 1 / 256]


@pytest.mark.parametrize("num_heads", [5, 6, 12, 20, 112])
def test_slopes_match_bloom(num_heads: int) -> None:
    bloom = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)  # (heads, 1, 2)
    torch.testing.assert_close(alibi_slopes(num_heads), bloom[:, 0, 1], rtol=1e-6, atol=0)


def test_naive_formula_is_not_the_papers_for_12_heads() -> None:
    naive = torch.exp2(-8 * torch.arange(1, 13, dtype=torch.float64) / 12).float()
    assert not torch.allclose(alibi_slopes(12), naive)
    naive_8 = torch.exp2(-8 * torch.arange(1, 9, dtype=torch.float64) / 8).float()
    assert torch.equal(alibi_slopes(8), naive_8)


@pytest.mark.parametrize(
    ("num_heads", "query_len", "key_len", "causal"),
    [(4, 5, None, True), (3, 3, 7, True), (6, 1, 9, True), (4, 5, None, False), (5, 2, 6, False)],
)
def test_bias_is_the_relative_form(num_heads, query_len, key_len, causal) -> None:
    got = alibi_bias(num_heads, query_len, key_len, causal=causal)
    keys = query_len if key_len is None else key_len
    expected = relative_bias_by_loops(paper_get_slopes(num_heads), query_len, keys, causal)
    assert got.dtype == torch.float32 and got.shape == (num_heads, query_len, keys)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("num_heads", "query_len", "key_len"), [(8, 10, 10), (12, 4, 9)])
def test_bias_equals_bloom_under_a_causal_softmax(num_heads, query_len, key_len) -> None:
    """Bloom adds +m j to every row; with the causal mask the softmax is the same as ours."""
    torch.manual_seed(0)
    logits = torch.randn(num_heads, query_len, key_len, dtype=torch.float64)
    bloom = build_alibi_tensor(torch.ones(1, key_len), num_heads, torch.float64)  # (H, 1, K)
    rows = torch.arange(key_len - query_len, key_len)[:, None]
    future = torch.arange(key_len)[None, :] > rows
    bloom_weights = (logits + bloom).masked_fill(future, float("-inf")).softmax(-1)
    ours = (logits + alibi_bias(num_heads, query_len, key_len).double()).softmax(-1)
    torch.testing.assert_close(ours, bloom_weights, rtol=1e-6, atol=1e-7)
    # the biases themselves differ (by -m i per row), so the test is not trivially true
    assert not torch.allclose(
        alibi_bias(num_heads, query_len, key_len).double().masked_fill(future, 0),
        bloom.expand(-1, query_len, -1).masked_fill(future, 0),
    )


def test_key_only_form_is_equal_causally_and_wrong_bidirectionally() -> None:
    torch.manual_seed(1)
    num_heads, length = 4, 12
    slopes = alibi_slopes(num_heads).double()[:, None, None]
    logits = torch.randn(num_heads, length, length, dtype=torch.float64)
    key_only = slopes * torch.arange(length, dtype=torch.float64)  # +m j, (H, 1, L)

    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    causal_key_only = (logits + key_only).masked_fill(future, float("-inf")).softmax(-1)
    causal_relative = (logits + alibi_bias(num_heads, length).double()).softmax(-1)
    torch.testing.assert_close(causal_key_only, causal_relative, rtol=1e-9, atol=1e-12)

    both_key_only = (logits + key_only).softmax(-1)
    both_relative = (logits + alibi_bias(num_heads, length, causal=False).double()).softmax(-1)
    assert (both_key_only - both_relative).abs().max() > 0.1


def test_bias_depends_only_on_distance_and_decoding_rows_match() -> None:
    full = alibi_bias(6, 9)
    assert torch.equal(full[:, 1:, 1:], full[:, :-1, :-1])
    assert torch.equal(alibi_bias(6, 1, 9), full[:, -1:, :])
    assert torch.equal(alibi_bias(6, 4, 9), full[:, -4:, :])
    both = alibi_bias(6, 9, causal=False)
    assert torch.equal(both, both.transpose(-1, -2))
    assert torch.equal(both.tril(), full.nan_to_num(neginf=0.0))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("query_len", "key_len", "block_size"), [(37, 37, 8), (13, 50, 5), (3, 3, 256)]
)
def test_blocked_attention_equals_materialized_bias(
    causal, query_len, key_len, block_size, device
) -> None:
    torch.manual_seed(2)
    heads, head_dim = 5, 8
    q = torch.randn(2, heads, query_len, head_dim)
    k, v = torch.randn(2, 2, heads, key_len, head_dim).unbind(0)
    full = attention(q, k, v, bias=alibi_bias(heads, query_len, key_len, causal=causal))
    q, k, v = q.to(device), k.to(device), v.to(device)
    blocked = alibi_attention(q, k, v, causal=causal, block_size=block_size)
    assert blocked.device == q.device
    torch.testing.assert_close(blocked.cpu(), full, rtol=1e-5, atol=1e-6)


def test_attention_adds_the_bias_after_scaling() -> None:
    """softmax(q k^T / sqrt(d) - m (i - j)) v, written out in float64: the bias is not scaled."""
    torch.manual_seed(3)
    q, k, v = torch.randn(3, 4, 6, 16, dtype=torch.float64).unbind(0)
    slopes = paper_get_slopes(4)
    bias = relative_bias_by_loops(slopes, 6, 6, causal=True)
    expected = ((q @ k.transpose(-1, -2)) / 4.0 + bias).softmax(-1) @ v
    torch.testing.assert_close(alibi_attention(q, k, v, block_size=4), expected)


def test_blocked_attention_never_builds_the_full_bias(monkeypatch: pytest.MonkeyPatch) -> None:
    import rope_tutor.alibi as module

    shapes = []
    original = module._linear_bias

    def recording(*args, **kwargs):
        bias = original(*args, **kwargs)
        shapes.append(tuple(bias.shape))
        return bias

    monkeypatch.setattr(module, "_linear_bias", recording)
    q = k = v = torch.zeros(1, 2, 64, 4)
    alibi_attention(q, k, v, block_size=16)
    assert shapes == [(2, 16, 16), (2, 16, 32), (2, 16, 48), (2, 16, 64)]


def test_custom_slopes_and_bfloat16() -> None:
    torch.manual_seed(4)
    q, k, v = torch.randn(3, 2, 7, 8).unbind(0)
    slopes = torch.tensor([0.3, 0.05])
    bias = -slopes[:, None, None] * (torch.arange(7)[:, None] - torch.arange(7)).clamp(min=0)
    bias = bias.masked_fill(torch.ones(7, 7, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(
        alibi_attention(q, k, v, slopes=slopes), attention(q, k, v, bias=bias)
    )
    low = alibi_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), alibi_attention(q, k, v), rtol=0.05, atol=0.05)


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: alibi_slopes(0), ["num_heads", "0"]),
        (lambda: alibi_slopes(-3), ["num_heads", "-3"]),
        (lambda: alibi_slopes(2.0), ["num_heads", "2.0"]),
        (lambda: alibi_slopes(True), ["num_heads", "True"]),
        (lambda: alibi_bias(0, 4), ["num_heads", "0"]),
        (lambda: alibi_bias(4, -1), ["query_len", "-1"]),
        (lambda: alibi_bias(4, 3, -2), ["key_len", "-2"]),
        (lambda: alibi_bias(4, 5, 3), ["query_len=5", "key_len=3"]),
        (lambda: alibi_bias(4, 2.5), ["query_len", "2.5"]),
        (lambda: alibi_bias(4, 2, "8"), ["key_len", "'8'"]),
        (lambda: alibi_attention(*torch.zeros(3, 2, 4, 8).unbind(0), block_size=0), ["block_size"]),
        (lambda: alibi_attention(*torch.zeros(3, 4, 8).unbind(0)), ["q must have shape"]),
        (
            lambda: alibi_attention(
                torch.zeros(2, 5, 8), torch.zeros(2, 3, 8), torch.zeros(2, 3, 8)
            ),
            ["query_len=5", "key_len=3"],
        ),
        (
            lambda: alibi_attention(*torch.zeros(3, 2, 4, 8).unbind(0), slopes=torch.ones(3)),
            ["slopes", "(2,)"],
        ),
        (
            lambda: alibi_attention(
                *torch.zeros(3, 2, 4, 8).unbind(0), slopes=torch.tensor([0.5, 0.0])
            ),
            ["slopes must be positive"],
        ),
        (
            lambda: alibi_attention(
                torch.zeros(2, 4, 8), torch.zeros(3, 4, 8), torch.zeros(3, 4, 8)
            ),
            ["heads"],
        ),
    ],
)
def test_bad_input_is_rejected_with_a_clear_message(call, names) -> None:
    with pytest.raises(ValueError) as error:
        call()
    for name in names:
        assert name in str(error.value)


def test_empty_lengths() -> None:
    assert alibi_bias(3, 0).shape == (3, 0, 0)
    assert alibi_bias(3, 0, 4).shape == (3, 0, 4)
    q = torch.zeros(1, 3, 0, 8)
    k = v = torch.zeros(1, 3, 4, 8)
    assert alibi_attention(q, k, v).shape == (1, 3, 0, 8)
