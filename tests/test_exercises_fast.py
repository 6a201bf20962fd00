"""The checker of chapter "Making RoPE fast" accepts right answers and rejects the usual wrong ones.

The answers below are a learner's attempts, written from the chapter's prose (equation
(rope-bytes-bound): every element of q and k read once and written once, over a bandwidth that
counts bytes read plus bytes written); none reuses the checker module.
"""

from __future__ import annotations

import pytest

from rope_tutor.exercises import check, get_exercise


def floor_right(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    q = batch * q_heads * tokens * head_dim
    k = batch * kv_heads * tokens * head_dim
    moved = (q + k) * bytes_per_element * 2  # read once, written once
    return moved, moved / bandwidth


def floor_reads_only(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = batch * tokens * (q_heads + kv_heads) * head_dim * bytes_per_element
    return moved, moved / bandwidth


def floor_q_only(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * batch * tokens * q_heads * head_dim * bytes_per_element
    return moved, moved / bandwidth


def floor_no_gqa(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * batch * tokens * 2 * q_heads * head_dim * bytes_per_element
    return moved, moved / bandwidth


def floor_no_batch(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * tokens * (q_heads + kv_heads) * head_dim * bytes_per_element
    return moved, moved / bandwidth


def floor_textbook(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 10 * batch * tokens * (q_heads + kv_heads) * head_dim * bytes_per_element
    return moved, moved / bandwidth


def floor_bits(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * batch * tokens * (q_heads + kv_heads) * head_dim * bytes_per_element * 8
    return moved, moved / bandwidth


def floor_time_twice(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * batch * tokens * (q_heads + kv_heads) * head_dim * bytes_per_element
    return moved, 2 * moved / bandwidth  # read and write each divided by the two-way bandwidth


def test_right_answer_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert check("rope_floor", floor_right)
    assert "✓" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("wrong", "named"),
    [
        (floor_reads_only, "must also write"),
        (floor_q_only, "left out k"),
        (floor_no_gqa, "kv_heads"),
        (floor_no_batch, "batch"),
        (floor_textbook, "textbook"),
        (floor_bits, "bits"),
    ],
)
def test_usual_mistakes_are_named(wrong, named, capsys: pytest.CaptureFixture[str]) -> None:
    assert not check("rope_floor", wrong)
    assert named in capsys.readouterr().out


def test_time_that_counts_the_bandwidth_one_way_is_rejected() -> None:
    assert not check("rope_floor", floor_time_twice, verbose=False)


def test_the_chapter_numbers() -> None:
    """The chapter's q alone (no k heads) at the saved one-thread copy_: 128 MiB moved."""
    reference = get_exercise("rope_floor").reference
    moved, seconds = reference(1, 4096, 32, 0, 128, 4, 9.5e9)
    assert moved == 128 * 2**20 and seconds == pytest.approx(moved / 9.5e9)
    moved, _ = reference(8, 8192, 32, 8, 128, 2, 3.0e12)  # Llama-3-8B's large prefill, bfloat16
    assert moved == 2 * 2 * 8 * 8192 * 40 * 128
