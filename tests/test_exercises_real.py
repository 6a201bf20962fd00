"""The checker of chapter "A real model past its window" accepts right answers and rejects the
usual wrong ones, and its reference is transformers' own dynamic NTK base.

The answers below are a learner's attempts, written from the chapter's prose; none reuses the
checker module. The reference is compared with ``_compute_dynamic_ntk_parameters`` of
transformers (the implementation the chapter's model runs), when transformers is installed.
"""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.exercises import check, get_exercise


def dynamic_right(base, dim, length, window, factor):
    length = length if length > window else window
    scale = 1 + factor * (length - window) / window  # slope factor / L from 1 at the window
    return base * math.exp(math.log(scale) * dim / (dim - 2))


def dynamic_static(base, dim, length, window, factor):
    return base * factor ** (dim / (dim - 2))


def dynamic_emozilla_ratio(base, dim, length, window, factor):
    return base * (max(length, window) / window) ** (dim / (dim - 2))


def dynamic_times_factor(base, dim, length, window, factor):
    return base * (factor * max(length, window) / window) ** (dim / (dim - 2))


def dynamic_no_floor(base, dim, length, window, factor):
    return base * (factor * length / window - factor + 1) ** (dim / (dim - 2))


def dynamic_no_exponent(base, dim, length, window, factor):
    return base * (factor * max(length, window) / window - factor + 1)


def dynamic_exponent_inverted(base, dim, length, window, factor):
    return base * (factor * max(length, window) / window - factor + 1) ** ((dim - 2) / dim)


def test_right_answer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("hf_dynamic_base", dynamic_right)
    assert "✓" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (dynamic_static, "static NTK"),
        (dynamic_emozilla_ratio, "emozilla"),
        (dynamic_times_factor, "subtracts factor - 1"),
        (dynamic_no_floor, "max(l, L)"),
        (dynamic_no_exponent, "dim / (dim - 2)"),
        (dynamic_exponent_inverted, None),
    ],
)
def test_wrong_answers_fail_with_the_right_message(
    wrong, named, capsys: pytest.CaptureFixture[str]
) -> None:
    assert not check("hf_dynamic_base", wrong)
    out = capsys.readouterr().out
    assert "✗" in out
    if named is not None:
        assert named in out


@pytest.mark.parametrize("case", range(len(get_exercise("hf_dynamic_base").cases)))
def test_reference_is_transformers_dynamic_base(case: int) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    exercise = get_exercise("hf_dynamic_base")
    args, _ = exercise.cases[case].make()
    base, dim, length, window, factor = args
    config = transformers.LlamaConfig(
        hidden_size=dim * 2,
        num_attention_heads=2,
        head_dim=dim,
        max_position_embeddings=window,
        rope_parameters={"rope_type": "dynamic", "rope_theta": base, "factor": factor},
    )
    inv_freq, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, seq_len=length)
    expected = exercise.reference(*args)
    ours = 1.0 / expected ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    torch.testing.assert_close(inv_freq.double(), ours, rtol=1e-6, atol=0.0)


def test_at_factor_one_twice_the_window_is_static_ntk_with_s_two() -> None:
    """The chapter's claim: dynamic (factor 1) at l = 2L uses the static NTK base for s = 2."""
    reference = get_exercise("hf_dynamic_base").reference
    assert reference(100000.0, 64, 16384, 8192, 1.0) == pytest.approx(
        100000.0 * 2 ** (64 / 62), rel=1e-12
    )
