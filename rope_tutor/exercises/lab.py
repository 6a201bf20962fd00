"""Part V exercises (the lab): RoPE pairs that never turn in the window, and the needle task's
chance level."""

from __future__ import annotations

import math

import torch

from rope_tutor.exercises.framework import Case, Exercise, Mistake, register
from rope_tutor.scaling import rotations_per_window

# --- Train short, test long: pairs that never complete a turn ---------------------------------


def _never_turn(head_dim: int, base: float, context: int) -> torch.Tensor:
    return rotations_per_window(head_dim, base, context) < 1


def _theta(head_dim: int, base: float, exponent_scale: float = 2.0) -> torch.Tensor:
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    return base ** (-exponent_scale * i / head_dim)


def _never_turn_radians(head_dim: int, base: float, context: int) -> torch.Tensor:
    return context * _theta(head_dim, base) < 1  # compared the angle in radians with 1


def _never_turn_inverted(head_dim: int, base: float, context: int) -> torch.Tensor:
    return ~_never_turn(head_dim, base, context)


def _never_turn_exponent_i_over_d(head_dim: int, base: float, context: int) -> torch.Tensor:
    return context * _theta(head_dim, base, 1.0) / (2 * math.pi) < 1


def _never_turn_all_heads(head_dim: int, base: float, context: int) -> torch.Tensor:
    return _never_turn(2 * head_dim, base, context)  # frequencies of a dim twice as wide


register(
    Exercise(
        name="never_turn",
        summary="which RoPE pairs never complete a full turn over a window of `context` tokens",
        signature="(head_dim, base, context) -> BoolTensor[head_dim // 2]",
        reference=_never_turn,
        cases=(
            Case.of(32, 10000.0, 128),  # the lab's heads
            Case.of(128, 10000.0, 1024),  # the ALiBi paper's rotary baseline
            Case.of(128, 500000.0, 8192),  # Llama 3
            Case.of(16, 10000.0, 64),
            Case.of(64, 10000.0, 4096),
        ),
        hint=(
            "pair i turns by theta_i = base ** (-2 i / head_dim) radians per token, so over the "
            "window it makes context * theta_i / (2 pi) turns; True where that is below 1 (YaRN's "
            "r < 1)."
        ),
        mistakes=(
            Mistake(
                "you compared the angle in radians with 1: a full turn is 2 pi radians, so "
                "divide context * theta_i by 2 pi first.",
                _never_turn_radians,
            ),
            Mistake(
                "your answer is the opposite set: True should mark the pairs that do NOT "
                "complete a turn (fewer than one rotation in the window).",
                _never_turn_inverted,
            ),
            Mistake(
                "your frequencies use base ** (-i / head_dim); RoPE's are base ** (-2 i / "
                "head_dim), i = 0 .. head_dim/2 - 1.",
                _never_turn_exponent_i_over_d,
            ),
            Mistake(
                "your frequencies are those of a head twice as wide: the exponent's "
                "denominator is head_dim itself, with i counting pairs (i < head_dim / 2).",
                _never_turn_all_heads,
            ),
        ),
        chapter="lab_train_short_test_long",
    )
)

# --- Finding the needle: the chance level -----------------------------------------------------

#: The needle's key is drawn from the 26 capital letters, without repetition.
KEY_LETTERS = 26


def _guess_accuracy(key_length: int, cue: int = 0) -> float:
    if not 0 <= cue < key_length <= KEY_LETTERS:
        raise ValueError(
            f"need 0 <= cue < key_length <= 26, got cue={cue}, key_length={key_length}"
        )
    return math.prod(1.0 / (KEY_LETTERS - j) for j in range(cue, key_length))


def _guess_with_repeats(key_length: int, cue: int = 0) -> float:
    return (1.0 / KEY_LETTERS) ** (key_length - cue)


def _guess_ignores_cue(key_length: int, cue: int = 0) -> float:
    return _guess_accuracy(key_length, 0)


def _guess_bytes(key_length: int, cue: int = 0) -> float:
    return (1.0 / 256) ** (key_length - cue)


def _guess_unordered(key_length: int, cue: int = 0) -> float:
    scored = key_length - cue
    return 1.0 / math.comb(KEY_LETTERS - cue, scored)


def _guess_one_letter(key_length: int, cue: int = 0) -> float:
    return 1.0 / (KEY_LETTERS - cue)


register(
    Exercise(
        name="needle_guess_accuracy",
        summary="the exact match of a guesser that never finds the needle, teacher-forced",
        signature="(key_length, cue=0) -> float",
        reference=_guess_accuracy,
        cases=(
            Case.of(3),  # the book's task
            Case.of(4),
            Case.of(3, cue=1),
            Case.of(5, cue=2),
            Case.of(1),
        ),
        hint=(
            "the guesser knows the key is key_length distinct capital letters and, teacher-forced, "
            "sees the correct earlier letters; letter j (counting from 0, j >= cue) is one of the "
            "26 - j letters not used yet. Multiply the chances of the scored letters."
        ),
        mistakes=(
            Mistake(
                "you let every letter be any of 26: the key's letters are distinct, and "
                "teacher forcing shows the guesser the earlier ones, so letter j has 26 - j "
                "candidates.",
                _guess_with_repeats,
            ),
            Mistake(
                "you scored the cue letters too: the first `cue` letters are given away by the "
                "question and are not scored.",
                _guess_ignores_cue,
            ),
            Mistake(
                "you guessed among all 256 bytes: the guesser knows the key is capital letters.",
                _guess_bytes,
            ),
            Mistake(
                "you counted sets of letters, not sequences: the order of the key matters.",
                _guess_unordered,
            ),
            Mistake(
                "exact match needs every scored letter right, not only the first one.",
                _guess_one_letter,
            ),
        ),
        rtol=1e-9,
        atol=0.0,
        chapter="lab_passkey",
    )
)
