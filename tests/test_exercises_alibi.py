"""The ALiBi checkers accept the right answers and reject wrong ones written here independently."""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.exercises import check, get_exercise, list_exercises


def slopes_by_the_rule(num_heads: int) -> torch.Tensor:
    """A learner's correct answer: closed form, lower power of two then odd exponents of 2c."""
    c = 2 ** int(math.log2(num_heads))
    values = [2 ** (-8 * h / c) for h in range(1, c + 1)]
    values += [2 ** (-8 * (2 * j - 1) / (2 * c)) for j in range(1, num_heads - c + 1)]
    return torch.tensor(values)


def bias_by_loops(num_heads, query_len, key_len=None, causal=True) -> torch.Tensor:
    """A learner's correct answer, with Python loops."""
    key_len = query_len if key_len is None else key_len
    slopes = slopes_by_the_rule(num_heads).tolist()
    out = torch.zeros(num_heads, query_len, key_len)
    for h in range(num_heads):
        for row in range(query_len):
            i = key_len - query_len + row
            for j in range(key_len):
                if not causal:
                    out[h, row, j] = -slopes[h] * abs(i - j)
                elif j > i:
                    out[h, row, j] = float("-inf")
                else:
                    out[h, row, j] = -slopes[h] * (i - j)
    return out


def test_exercises_are_registered_in_book_order() -> None:
    names = list_exercises()
    assert "alibi_slopes" in names and "alibi_bias" in names
    assert names.index("alibi_slopes") < names.index("alibi_bias")
    assert get_exercise("alibi_slopes").chapter == "alibi"


def test_correct_answers_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("alibi_slopes", slopes_by_the_rule)
    assert check("alibi_bias", bias_by_loops)
    assert capsys.readouterr().out.count("✓") == 2


# ---- wrong slopes -------------------------------------------------------------------------------


def naive_geometric(num_heads: int) -> torch.Tensor:
    return torch.tensor([2 ** (-8 * (h + 1) / num_heads) for h in range(num_heads)])


def exponent_from_zero(num_heads: int) -> torch.Tensor:
    return torch.tensor([2 ** (-8 * h / num_heads) for h in range(num_heads)])


def exponent_one_too_far(num_heads: int) -> torch.Tensor:
    c = 2 ** int(math.log2(num_heads))
    values = [2 ** (-8 * (h + 1) / c) for h in range(1, c + 1)]
    values += [2 ** (-8 * (2 * j - 1) / (2 * c)) for j in range(1, num_heads - c + 1)]
    return torch.tensor(values)


def next_power_of_two_truncated(num_heads: int) -> torch.Tensor:
    c = 2 ** math.ceil(math.log2(num_heads))
    return torch.tensor([2 ** (-8 * h / c) for h in range(1, c + 1)][:num_heads])


def sorted_slopes(num_heads: int) -> torch.Tensor:
    return slopes_by_the_rule(num_heads).sort(descending=True).values


def odd_ones_of_the_wrong_parity(num_heads: int) -> torch.Tensor:
    c = 2 ** int(math.log2(num_heads))
    values = [2 ** (-8 * h / c) for h in range(1, c + 1)]
    values += [2 ** (-8 * (2 * j) / (2 * c)) for j in range(1, num_heads - c + 1)]
    return torch.tensor(values)


def float64_list(num_heads: int) -> list[float]:
    return slopes_by_the_rule(num_heads).tolist()


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (naive_geometric, "power of two"),
        (exponent_from_zero, "start at h = 0"),
        (exponent_one_too_far, None),
        (next_power_of_two_truncated, None),
        (sorted_slopes, "sorted"),
        (odd_ones_of_the_wrong_parity, "1st, 3rd"),
        (float64_list, None),
    ],
)
def test_wrong_slopes_are_rejected(wrong, named, capsys: pytest.CaptureFixture[str]) -> None:
    assert not check("alibi_slopes", wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ alibi_slopes")
    if named is not None:
        assert named in out


def test_naive_formula_is_rejected_on_a_non_power_of_two() -> None:
    """The naive formula is right for powers of two; the checker must catch it on 12 heads."""
    assert torch.allclose(naive_geometric(16), slopes_by_the_rule(16))
    assert not torch.allclose(naive_geometric(12), slopes_by_the_rule(12))
    assert not check("alibi_slopes", naive_geometric, verbose=False)


# ---- wrong biases -------------------------------------------------------------------------------


def _positions(query_len, key_len):
    key_len = query_len if key_len is None else key_len
    i = torch.arange(key_len - query_len, key_len)[:, None].float()
    j = torch.arange(key_len)[None, :].float()
    return i, j


def _slopes(num_heads):
    return slopes_by_the_rule(num_heads)[:, None, None]


def key_only(num_heads, query_len, key_len=None, causal=True):
    i, j = _positions(query_len, key_len)
    bias = (_slopes(num_heads) * j).expand(-1, len(i), -1)
    return bias.masked_fill(j > i, float("-inf")) if causal else bias


def flipped_sign(num_heads, query_len, key_len=None, causal=True):
    i, j = _positions(query_len, key_len)
    bias = _slopes(num_heads) * ((i - j) if causal else (i - j).abs())
    return bias.masked_fill(j > i, float("-inf")) if causal else bias


def divided_by_sqrt_d(num_heads, query_len, key_len=None, causal=True):
    return bias_by_loops(num_heads, query_len, key_len, causal) / math.sqrt(64)


def no_mask(num_heads, query_len, key_len=None, causal=True):
    i, j = _positions(query_len, key_len)
    return -_slopes(num_heads) * ((i - j) if causal else (i - j).abs())


def queries_at_the_start(num_heads, query_len, key_len=None, causal=True):
    key_len = query_len if key_len is None else key_len
    i = torch.arange(query_len)[:, None].float()
    j = torch.arange(key_len)[None, :].float()
    if causal:
        return (-_slopes(num_heads) * (i - j)).masked_fill(j > i, float("-inf"))
    return -_slopes(num_heads) * (i - j).abs()


def diagonal_masked_too(num_heads, query_len, key_len=None, causal=True):
    bias = bias_by_loops(num_heads, query_len, key_len, causal)
    if causal:
        i, j = _positions(query_len, key_len)
        bias = bias.masked_fill(j >= i, float("-inf"))
    return bias


def ignores_causal_flag(num_heads, query_len, key_len=None, causal=True):
    return bias_by_loops(num_heads, query_len, key_len, causal=True)


def naive_slopes_in_bias(num_heads, query_len, key_len=None, causal=True):
    i, j = _positions(query_len, key_len)
    slopes = naive_geometric(num_heads)[:, None, None]
    if causal:
        return (-slopes * (i - j)).masked_fill(j > i, float("-inf"))
    return -slopes * (i - j).abs()


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (key_only, "key-only"),
        (flipped_sign, "sign is flipped"),
        (divided_by_sqrt_d, None),
        (no_mask, None),
        (queries_at_the_start, None),
        (diagonal_masked_too, None),
        (ignores_causal_flag, None),
        (naive_slopes_in_bias, None),
    ],
)
def test_wrong_biases_are_rejected(wrong, named, capsys: pytest.CaptureFixture[str]) -> None:
    assert not check("alibi_bias", wrong)
    out = capsys.readouterr().out
    assert out.startswith("✗ alibi_bias")
    if named is not None:
        assert named in out


def test_a_candidate_that_raises_is_reported_not_raised(capsys) -> None:
    def broken(num_heads, query_len, key_len=None, causal=True):
        raise RuntimeError("not yet")

    assert not check("alibi_bias", broken)
    assert "RuntimeError: not yet" in capsys.readouterr().out


# ---- the dtype the exercise states (float32) ---------------------------------------------------


def slopes_in_float64(num_heads: int) -> torch.Tensor:
    """Right values, built as float64 (e.g. from float64 exponents) and never cast back."""
    c = 2 ** int(math.log2(num_heads))
    h = torch.arange(1, c + 1, dtype=torch.float64)
    j = torch.arange(1, num_heads - c + 1, dtype=torch.float64)
    return torch.cat((2.0 ** (-8 * h / c), 2.0 ** (-8 * (2 * j - 1) / (2 * c))))


def bias_in_float64(num_heads, query_len, key_len=None, causal=True) -> torch.Tensor:
    return bias_by_loops(num_heads, query_len, key_len, causal).double()


@pytest.mark.parametrize(
    ("name", "wrong"), [("alibi_slopes", slopes_in_float64), ("alibi_bias", bias_in_float64)]
)
def test_right_values_in_float64_are_rejected(name, wrong, capsys) -> None:
    assert not check(name, wrong)
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {name}: the values are right, the dtype is not")
    assert "expected dtype torch.float32, got dtype torch.float64" in out
