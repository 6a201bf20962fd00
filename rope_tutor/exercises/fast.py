"""Chapter "Making RoPE fast": the bytes a rotation of q and k must move, and its floor in time.

A fused rotation reads every element of q and k once and writes it once (equation
(rope-bytes-bound)): 2 e (H_q + H_kv) B N d bytes for a batch of B sequences of N tokens,
H_q query heads, H_kv key heads of d features and e bytes per element. Divided by a copy
bandwidth that counts bytes read plus bytes written, that is the least time any form can take.
"""

from __future__ import annotations

from rope_tutor.exercises.framework import Case, Exercise, Mistake, register


def _elements(batch: int, tokens: int, q_heads: int, kv_heads: int, head_dim: int) -> int:
    return batch * tokens * (q_heads + kv_heads) * head_dim


def _rope_floor(
    batch: int,
    tokens: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    bytes_per_element: int,
    bandwidth: float,
) -> tuple[int, float]:
    moved = 2 * bytes_per_element * _elements(batch, tokens, q_heads, kv_heads, head_dim)
    return moved, moved / bandwidth


def _reads_only(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = bytes_per_element * _elements(batch, tokens, q_heads, kv_heads, head_dim)
    return moved, moved / bandwidth


def _q_only(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * bytes_per_element * batch * tokens * q_heads * head_dim
    return moved, moved / bandwidth


def _k_with_q_heads(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * bytes_per_element * _elements(batch, tokens, q_heads, q_heads, head_dim)
    return moved, moved / bandwidth


def _no_batch(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 2 * bytes_per_element * _elements(1, tokens, q_heads, kv_heads, head_dim)
    return moved, moved / bandwidth


def _textbook_traffic(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 10 * bytes_per_element * _elements(batch, tokens, q_heads, kv_heads, head_dim)
    return moved, moved / bandwidth


def _bits(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth):
    moved = 16 * bytes_per_element * _elements(batch, tokens, q_heads, kv_heads, head_dim)
    return moved, moved / bandwidth


register(
    Exercise(
        name="rope_floor",
        summary="the bytes a fused rotation of q and k must move, and its bandwidth-bound time",
        signature=(
            "(batch, tokens, q_heads, kv_heads, head_dim, bytes_per_element, bandwidth) "
            "-> (bytes, seconds)"
        ),
        reference=_rope_floor,
        cases=(
            Case.of(3, 512, 16, 4, 64, 2, 20e9),  # first: every usual mistake gives another answer
            Case.of(1, 4096, 32, 32, 128, 4, 9.5e9),
            Case.of(8, 8192, 32, 8, 128, 2, 3.0e12),
            Case.of(64, 1, 32, 8, 128, 4, 3.0e12),
        ),
        hint=(
            "every element of q and of k is read once and written once: 2 e bytes per element; "
            "q has batch * tokens * q_heads * head_dim elements, k the same with kv_heads; the "
            "bandwidth counts bytes read plus bytes written, so the time is bytes / bandwidth."
        ),
        mistakes=(
            Mistake(
                "you counted each element once: the rotation must also write it, so 2 e bytes "
                "per element, and the copy bandwidth counts both.",
                _reads_only,
            ),
            Mistake("you left out k: the rotation turns the keys as well as the queries.", _q_only),
            Mistake(
                "you gave k as many heads as q: with grouped-query attention k has kv_heads.",
                _k_with_q_heads,
            ),
            Mistake("your bytes do not grow with the batch: every sequence is rotated.", _no_batch),
            Mistake(
                "that is the textbook form's traffic, five times the minimum; the floor is one "
                "read and one write of each element.",
                _textbook_traffic,
            ),
            Mistake("you counted bits, not bytes: bytes_per_element is already in bytes.", _bits),
        ),
        rtol=1e-9,
        atol=0.0,
        chapter="fast_rope",
    )
)
