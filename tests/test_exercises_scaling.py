"""Part IV checkers accept a right answer and reject typical wrong ones, all written here.

None of the answers below reuses the package or the checker module's mistakes: each is a learner's
attempt written from the chapter's equations.
"""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.exercises import check, get_exercise


def pair_frequencies(dim, base):
    return torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)


# --- linear_scaling --------------------------------------------------------------------------


def pi_right(dim, base, factor):
    return (pair_frequencies(dim, base) / factor).float()


def pi_from_positions(dim, base, factor):
    """Also right: the angle at position 1 read as 1 / factor."""
    position = torch.tensor([1.0], dtype=torch.float64) / factor
    return (position[:, None] * pair_frequencies(dim, base)[None, :])[0].float()


def pi_times_factor(dim, base, factor):
    return (pair_frequencies(dim, base) * factor).float()


def pi_base_divided(dim, base, factor):
    return pair_frequencies(dim, base / factor).float()


def pi_only_slowest_pair(dim, base, factor):
    theta = pair_frequencies(dim, base)
    theta[-1] /= factor
    return theta.float()


def pi_returns_list(dim, base, factor):
    return [t / factor for t in pair_frequencies(dim, base).tolist()]


# --- ntk_base --------------------------------------------------------------------------------


def ntk_right(base, factor, dim):
    return base * math.exp(math.log(factor) * dim / (dim - 2))


def ntk_scales_base_by_s(base, factor, dim):
    return base * factor


def ntk_squares(base, factor, dim):
    return base * factor**2


def ntk_exponent_over_dim(base, factor, dim):
    return base * factor ** (2 / dim)


def ntk_forgets_base(base, factor, dim):
    return 10000.0 * factor ** (dim / (dim - 2))


# --- yarn_ramp -------------------------------------------------------------------------------


def pair_index_for_turns(turns, dim, base, window):
    # pair i turns window / (2 pi base^(2i/dim)) times; solve for i
    return dim / 2 * math.log(window / (2 * math.pi * turns)) / math.log(base)


def ramp_from_bounds(low, high, dim):
    gamma = []
    for i in range(dim // 2):
        t = (i - low) / (high - low) if high != low else float(i >= low)
        gamma.append(1.0 - min(max(t, 0.0), 1.0))
    return torch.tensor(gamma, dtype=torch.float64)


def ramp_right(dim, base, window, beta_fast=32.0, beta_slow=1.0):
    low = max(math.floor(pair_index_for_turns(beta_fast, dim, base, window)), 0)
    high = min(math.ceil(pair_index_for_turns(beta_slow, dim, base, window)), dim - 1)
    return ramp_from_bounds(low, high, dim)


def ramp_unclamped(dim, base, window, beta_fast=32.0, beta_slow=1.0):
    """Floor and ceil, no clamp to [0, dim - 1]: right whenever some pair turns beta_fast times."""
    low = math.floor(pair_index_for_turns(beta_fast, dim, base, window))
    high = math.ceil(pair_index_for_turns(beta_slow, dim, base, window))
    return ramp_from_bounds(low, high, dim)


def ramp_swapped(dim, base, window, beta_fast=32.0, beta_slow=1.0):
    return ramp_right(dim, base, window, beta_fast=beta_slow, beta_slow=beta_fast)


def ramp_interpolation_weight(dim, base, window, beta_fast=32.0, beta_slow=1.0):
    return 1 - ramp_right(dim, base, window, beta_fast, beta_slow)


def ramp_ignores_betas(dim, base, window, beta_fast=32.0, beta_slow=1.0):
    return ramp_right(dim, base, window)


def ramp_by_turns(dim, base, window, beta_fast=32.0, beta_slow=1.0):
    """The paper's gamma(r) on the rotation count r, without the code's integer boundaries."""
    gamma = []
    for i in range(dim // 2):
        r = window / (2 * math.pi * base ** (2 * i / dim))
        gamma.append(min(max((r - beta_slow) / (beta_fast - beta_slow), 0.0), 1.0))
    return torch.tensor(gamma, dtype=torch.float64)


def ramp_step(dim, base, window, beta_fast=32.0, beta_slow=1.0):
    """Keep the pairs that complete a turn, interpolate the rest: no ramp at all."""
    turns = [window / (2 * math.pi * base ** (2 * i / dim)) for i in range(dim // 2)]
    return torch.tensor([1.0 if r >= 1 else 0.0 for r in turns], dtype=torch.float64)


# --- yarn_parameters -------------------------------------------------------------------------


def yarn_right(dim, base, factor, window):
    gamma = ramp_right(dim, base, window)
    theta = pair_frequencies(dim, base)
    temperature = 1.0 if factor <= 1 else 1 + 0.1 * math.log(factor)
    return (theta * gamma + theta / factor * (1 - gamma)).float(), temperature


def yarn_without_temperature(dim, base, factor, window):
    return yarn_right(dim, base, factor, window)[0], 1.0


def yarn_logit_temperature(dim, base, factor, window):
    inv_freq, temperature = yarn_right(dim, base, factor, window)
    return inv_freq, temperature * temperature


def yarn_log10_temperature(dim, base, factor, window):
    inv_freq, _ = yarn_right(dim, base, factor, window)
    return inv_freq, 1 + 0.1 * math.log10(factor)


def yarn_swapped_betas(dim, base, factor, window):
    gamma = ramp_swapped(dim, base, window)
    theta = pair_frequencies(dim, base)
    return (theta * gamma + theta / factor * (1 - gamma)).float(), 1 + 0.1 * math.log(factor)


def yarn_ntk_base(dim, base, factor, window):
    new_base = base * factor ** (dim / (dim - 2))
    return pair_frequencies(dim, new_base).float(), 1 + 0.1 * math.log(factor)


def yarn_blend_reversed(dim, base, factor, window):
    gamma = ramp_right(dim, base, window)
    theta = pair_frequencies(dim, base)
    return (theta / factor * gamma + theta * (1 - gamma)).float(), 1 + 0.1 * math.log(factor)


RIGHT = [
    ("linear_scaling", pi_right),
    ("linear_scaling", pi_from_positions),
    ("ntk_base", ntk_right),
    ("yarn_ramp", ramp_right),
    ("yarn_parameters", yarn_right),
]

WRONG = [
    ("linear_scaling", pi_times_factor),
    ("linear_scaling", pi_base_divided),
    ("linear_scaling", pi_only_slowest_pair),
    ("linear_scaling", pi_returns_list),
    ("ntk_base", ntk_scales_base_by_s),
    ("ntk_base", ntk_squares),
    ("ntk_base", ntk_exponent_over_dim),
    ("ntk_base", ntk_forgets_base),
    ("yarn_ramp", ramp_swapped),
    ("yarn_ramp", ramp_interpolation_weight),
    ("yarn_ramp", ramp_ignores_betas),
    ("yarn_ramp", ramp_unclamped),
    ("yarn_ramp", ramp_by_turns),
    ("yarn_ramp", ramp_step),
    ("yarn_parameters", yarn_without_temperature),
    ("yarn_parameters", yarn_logit_temperature),
    ("yarn_parameters", yarn_log10_temperature),
    ("yarn_parameters", yarn_swapped_betas),
    ("yarn_parameters", yarn_ntk_base),
    ("yarn_parameters", yarn_blend_reversed),
]


@pytest.mark.parametrize(("name", "answer"), RIGHT, ids=[f.__name__ for _, f in RIGHT])
def test_checker_accepts_a_right_answer(name, answer, capsys) -> None:
    assert check(name, answer)
    assert "✓" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "answer"), WRONG, ids=[f.__name__ for _, f in WRONG])
def test_checker_rejects_a_wrong_answer(name, answer, capsys) -> None:
    assert not check(name, answer)
    assert "✗" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("name", "answer", "words"),
    [
        ("ntk_base", ntk_scales_base_by_s, "dim / (dim - 2)"),
        ("yarn_ramp", ramp_swapped, "swapped beta_fast and beta_slow"),
        ("yarn_ramp", ramp_unclamped, "clamp the boundaries to [0, dim - 1]"),
        ("yarn_parameters", yarn_without_temperature, "forgot the temperature"),
        ("yarn_parameters", yarn_logit_temperature, "its square"),
        ("yarn_parameters", yarn_swapped_betas, "swapped beta_fast and beta_slow"),
        ("linear_scaling", pi_times_factor, "multiplied the frequencies"),
    ],
)
def test_checker_names_the_common_mistake(name, answer, words, capsys) -> None:
    assert not check(name, answer)
    assert words in capsys.readouterr().out


def test_the_lab_head_needs_the_clamp() -> None:
    """The lab's head (d_h = 32, T = 128) is where the clamp matters: i(beta_fast) < 0 there, so
    the unclamped ramp starts at low = -1 and partly interpolates the fastest pair, while on
    Llama 2's head (d_h = 128, L = 4096) both answers agree."""
    assert math.floor(pair_index_for_turns(32.0, 32, 10000.0, 128)) == -1
    assert ramp_unclamped(32, 10000.0, 128)[0] < 1.0 == ramp_right(32, 10000.0, 128)[0]
    assert torch.equal(ramp_unclamped(128, 10000.0, 4096), ramp_right(128, 10000.0, 4096))
    assert any(c.make() == ((32, 10000.0, 128), {}) for c in get_exercise("yarn_ramp").cases)


def test_only_the_lab_head_catches_the_missing_clamp() -> None:
    """The unclamped ramp agrees with the right one on every other input of the checker (the 5
    that it used to pass), so the lab's head is the input that catches it."""
    caught = []
    for case in get_exercise("yarn_ramp").cases:
        args, kwargs = case.make()
        right = ramp_right(*args, **kwargs)
        if not torch.allclose(ramp_unclamped(*args, **kwargs), right, rtol=0.0, atol=1e-12):
            caught.append(args)
    assert caught == [(32, 10000.0, 128)]


def test_checker_survives_a_crashing_answer(capsys) -> None:
    def crashes(*args):
        raise RuntimeError("not written yet")

    for name in ("linear_scaling", "ntk_base", "yarn_ramp", "yarn_parameters"):
        assert not check(name, crashes)
    assert "not written yet" in capsys.readouterr().out


def test_registered_mistakes_are_really_wrong() -> None:
    """Each registered mistake must itself fail its checker (else its message could never show)."""
    for name in ("linear_scaling", "ntk_base", "yarn_ramp", "yarn_parameters"):
        exercise = get_exercise(name)
        assert exercise.chapter
        for mistake in exercise.mistakes:
            assert not check(name, mistake.implementation, verbose=False), mistake.message
