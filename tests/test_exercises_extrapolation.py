"""Chapter 7's checker (`incomplete_pairs`) accepts right answers and rejects typical wrong ones.

Every answer below is a learner's attempt written here from the chapter's definitions (pair i turns
at theta_i = b^(-2i/d_h), its wavelength is 2 pi / theta_i), without the package. The expected
counts of the two published settings come from Liu et al.'s critical dimension, which the authors
state for LLaMA 2 (92 features, so 36 features = 18 pairs never complete a turn).
"""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.exercises import check, get_exercise


def loop_right(dim, base, window):
    count = 0
    for i in range(dim // 2):
        wavelength = 2 * math.pi * base ** (2 * i / dim)
        if wavelength > window:
            count += 1
    return count


def turns_right(dim, base, window):
    """Also right: count the pairs whose number of turns in the window is below one."""
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return int((window * theta / (2 * math.pi) < 1).sum())


def closed_form_right(dim, base, window):
    """Also right: Liu et al.'s critical dimension, d_extra = 2 ceil((d/2) log_b(L / 2 pi))."""
    x = dim / 2 * math.log(window / (2 * math.pi), base)
    complete = min(max(math.ceil(x), 0), dim // 2)
    return dim // 2 - complete


def tensor_right(dim, base, window):
    """Also right: a one-element tensor is accepted as a number."""
    return torch.tensor(loop_right(dim, base, window))


def counts_complete(dim, base, window):
    return dim // 2 - loop_right(dim, base, window)


def counts_features(dim, base, window):
    return 2 * loop_right(dim, base, window)


def no_two_pi(dim, base, window):
    return sum(base ** (2 * i / dim) > window for i in range(dim // 2))


def exponent_i_over_dim(dim, base, window):
    return sum(2 * math.pi * base ** (i / dim) > window for i in range(dim // 2))


def closed_form_floor(dim, base, window):
    x = dim / 2 * math.log(window / (2 * math.pi), base)
    return dim // 2 - min(max(math.floor(x), 0), dim // 2)


def closed_form_unclamped(dim, base, window):
    """Forgets that the count lies between 0 and dim / 2 when the window is very long or short."""
    return dim // 2 - math.ceil(dim / 2 * math.log(window / (2 * math.pi), base))


def natural_log(dim, base, window):
    x = dim / 2 * math.log(window / (2 * math.pi))
    return dim // 2 - min(max(math.ceil(x), 0), dim // 2)


def returns_mask(dim, base, window):
    theta = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    return window * theta / (2 * math.pi) < 1


RIGHT = [loop_right, turns_right, closed_form_right, tensor_right]
WRONG = [
    counts_complete,
    counts_features,
    no_two_pi,
    exponent_i_over_dim,
    closed_form_floor,
    closed_form_unclamped,
    natural_log,
    returns_mask,
]


def test_published_settings() -> None:
    """LLaMA 2 (d_h 128, b 1e4, L 4096): 92 of 128 features turn fully (Liu et al.), 18 pairs do
    not; SmolLM2 (d_h 64, b 1e5, L 8192): pairs 20 to 31 do not."""
    assert loop_right(128, 10000.0, 4096) == (128 - 92) // 2 == 18
    assert loop_right(64, 100000.0, 8192) == 12


@pytest.mark.parametrize("answer", RIGHT, ids=[f.__name__ for f in RIGHT])
def test_checker_accepts_a_right_answer(answer, capsys) -> None:
    assert check("incomplete_pairs", answer)
    assert "✓" in capsys.readouterr().out


@pytest.mark.parametrize("answer", WRONG, ids=[f.__name__ for f in WRONG])
def test_checker_rejects_a_wrong_answer(answer, capsys) -> None:
    assert not check("incomplete_pairs", answer)
    assert "✗" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        (counts_complete, "DO complete a turn"),
        (counts_features, "counted features, not pairs"),
        (no_two_pi, "a turn is 2 pi radians"),
        (exponent_i_over_dim, "not i / dim"),
        (closed_form_floor, "not floor(x)"),
    ],
)
def test_checker_names_the_common_mistake(answer, words, capsys) -> None:
    assert not check("incomplete_pairs", answer)
    assert words in capsys.readouterr().out


def test_checker_survives_a_crashing_answer(capsys) -> None:
    def crashes(dim, base, window):
        raise RuntimeError("not written yet")

    assert not check("incomplete_pairs", crashes)
    assert "not written yet" in capsys.readouterr().out


def test_registered_mistakes_are_really_wrong() -> None:
    exercise = get_exercise("incomplete_pairs")
    assert exercise.chapter == "extrapolation_problem"
    for mistake in exercise.mistakes:
        assert not check("incomplete_pairs", mistake.implementation, verbose=False), mistake.message
