"""Part VI: checks for a destination tensor, ``out=``, shared by both fast forms of RoPE.

Chapter "Making RoPE fast". ``apply_rope_fast`` (``rope_tutor.fast``) and the Triton kernel's
wrapper (``rope_tutor.triton_rope``) can write their result into a tensor the caller owns (a slot
of a KV cache, say); both check it here, with one message. Shapes, dtypes, strides and storage
pointers only: nothing here reads a tensor's values, so nothing synchronises host and device.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_out", "may_overlap"]


def check_out(out: Any, x: torch.Tensor, *, name: str = "out", source: str = "x") -> torch.Tensor:
    """``out`` if it can receive the rotation of ``x``; else ``ValueError`` naming ``name``.

    ``out`` must be a tensor of ``x``'s shape, dtype and device, with no broadcast (stride 0) dim,
    not a leaf that requires grad (while grad is enabled), and not overlapping ``x`` in memory
    (``may_overlap``). ``name`` and ``source`` are the argument names the messages use (``out``
    and ``x`` for ``apply_rope_fast``; ``out_q`` and ``q``, say, elsewhere).
    """
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"{name} must be a tensor or None, got {name}={out!r:.80}")
    expected = (
        f"expected shape {tuple(x.shape)}, dtype {x.dtype} on {x.device} (those of {source})"
    )
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"{name} has shape {tuple(out.shape)}, dtype {out.dtype} on {out.device}; {expected}"
        )
    if any(stride == 0 and size > 1 for stride, size in zip(out.stride(), out.shape, strict=True)):
        raise ValueError(
            f"{name} has a broadcast (stride 0) dim, strides {out.stride()}: several results "
            "would land on one element; expected a tensor with its own memory"
        )
    if out.requires_grad and out.is_leaf and torch.is_grad_enabled():
        raise ValueError(
            f"{name} is a leaf tensor that requires grad, which cannot be written in place; "
            f"expected a tensor without requires_grad (for example torch.empty_like({source}))"
        )
    if may_overlap(out, x):
        raise ValueError(
            f"{name} overlaps {source} in memory: the rotation reads {source} while it writes "
            f"{name}; expected a separate tensor (for example torch.empty_like({source}))"
        )
    return out


def may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if the byte ranges that ``a`` and ``b`` span in one storage intersect (conservative).

    Two interleaved views of one buffer (q and k sliced from a packed qkv tensor, say) count as
    overlapping even when they share no element.
    """
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def byte_range(t: torch.Tensor) -> tuple[int, int]:
        start = t.storage_offset() * t.element_size()
        span = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
        return start, start + (span + 1) * t.element_size()

    (a_start, a_stop), (b_start, b_stop) = byte_range(a), byte_range(b)
    return a_start < b_stop and b_start < a_stop
