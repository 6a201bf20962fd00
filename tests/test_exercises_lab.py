"""Part V checkers accept a right answer and reject typical wrong ones, all written here.

None of the answers below reuses the package or the checker module's mistakes: each is a learner's
attempt written from the chapters' text.
"""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.exercises import check, get_exercise, list_exercises

# --- never_turn (chapter "Train short, test long") ---------------------------------------------


def never_turn_right(head_dim, base, context):
    turns = [context * base ** (-2 * i / head_dim) / (2 * math.pi) for i in range(head_dim // 2)]
    return torch.tensor([t < 1 for t in turns])


def never_turn_by_wavelength(head_dim, base, context):
    """Also right: a pair never turns when its wavelength 2 pi / theta_i exceeds the window."""
    wavelength = 2 * math.pi * base ** (2 * torch.arange(head_dim // 2) / head_dim)
    return wavelength > context


def never_turn_radians(head_dim, base, context):
    return torch.tensor([context * base ** (-2 * i / head_dim) < 1 for i in range(head_dim // 2)])


def never_turn_inverted(head_dim, base, context):
    return ~never_turn_right(head_dim, base, context)


def never_turn_i_over_d(head_dim, base, context):
    turns = [context * base ** (-i / head_dim) / (2 * math.pi) for i in range(head_dim // 2)]
    return torch.tensor([t < 1 for t in turns])


def never_turn_as_indices(head_dim, base, context):
    return torch.nonzero(never_turn_right(head_dim, base, context)).flatten()


def test_never_turn_accepts_right_answers() -> None:
    assert check("never_turn", never_turn_right, verbose=False)
    assert check("never_turn", never_turn_by_wavelength, verbose=False)


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (never_turn_radians, "2 pi"),
        (never_turn_inverted, "opposite set"),
        (never_turn_i_over_d, "-i / head_dim"),
        (never_turn_as_indices, None),
    ],
)
def test_never_turn_rejects_typical_mistakes(wrong, named, capsys) -> None:
    assert not check("never_turn", wrong)
    out = capsys.readouterr().out
    if named is not None:
        assert named in out, out


def test_never_turn_counts_of_chapter_11() -> None:
    """The counts chapter 11 states, against the closed form: pair i turns iff
    i <= (d / 2) ln(L / 2 pi) / ln(base), so floor(...) + 1 pairs turn."""
    reference = get_exercise("never_turn").reference
    for head_dim, base, context, turning in ((32, 1e4, 128, 6), (128, 1e4, 1024, 36)):
        closed_form = math.floor(head_dim / 2 * math.log(context / (2 * math.pi)) / math.log(base))
        assert closed_form + 1 == turning
        never = reference(head_dim, base, context)
        assert int((~never).sum()) == turning
        assert not never[:turning].any() and never[turning:].all()  # the slow pairs, a suffix


# --- needle_guess_accuracy (chapter "Finding the needle") --------------------------------------


def guess_right(key_length, cue=0):
    chance = 1.0
    for j in range(cue, key_length):
        chance /= 26 - j
    return chance


def guess_by_counting(key_length, cue=0):
    """Also right: one ordered completion out of 26!/(26-k)! / (26!/(26-cue)!) equally likely."""
    return math.perm(26 - cue, key_length - cue) ** -1.0


def guess_with_repeats(key_length, cue=0):
    return 26.0 ** -(key_length - cue)


def guess_all_letters(key_length, cue=0):
    return guess_right(key_length, 0)


def guess_unordered(key_length, cue=0):
    return 1 / math.comb(26 - cue, key_length - cue)


def guess_bytes(key_length, cue=0):
    return 256.0 ** -(key_length - cue)


def test_guess_accuracy_by_hand() -> None:
    reference = get_exercise("needle_guess_accuracy").reference
    assert reference(3) == pytest.approx(1 / 15600, rel=1e-12)  # 26 * 25 * 24
    assert reference(3, cue=1) == pytest.approx(1 / 600, rel=1e-12)  # 25 * 24
    with pytest.raises(ValueError, match="cue=3"):
        reference(3, cue=3)


def test_guess_accuracy_accepts_right_answers() -> None:
    assert check("needle_guess_accuracy", guess_right, verbose=False)
    assert check("needle_guess_accuracy", guess_by_counting, verbose=False)


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (guess_with_repeats, "distinct"),
        (guess_all_letters, "cue letters"),
        (guess_unordered, "order"),
        (guess_bytes, "256 bytes"),
    ],
)
def test_guess_accuracy_rejects_typical_mistakes(wrong, named, capsys) -> None:
    assert not check("needle_guess_accuracy", wrong)
    assert named in capsys.readouterr().out


def test_lab_exercises_come_in_book_order() -> None:
    names = list_exercises()  # Part V's, the real-model chapter's (which follows), then Part VI's
    assert names[-4:] == ["never_turn", "needle_guess_accuracy", "hf_dynamic_base", "rope_floor"]
    assert get_exercise("never_turn").chapter == "lab_train_short_test_long"
    assert get_exercise("needle_guess_accuracy").chapter == "lab_passkey"
