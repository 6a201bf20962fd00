"""Part VI: RoPE written for speed, ``apply_rope_fast``.

Chapter "Making RoPE fast". The same operation as Part II's reference ``apply_rope`` (equation
(rope-elementwise) of "Deriving rotary position embedding"; Su et al., RoFormer, 2021), with the
same arguments, checks and angles, computed with less memory traffic: applying RoPE is
memory-bound, so what counts is the bytes moved and the buffers allocated. This module imports
Part II (``rope_tutor.rope``) and Part IV's registry; neither imports it. The tests prove that
both functions agree for every layout, dtype, ``rotary_dim`` and scaling method.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rope_tutor.rope import (
    _check_rope_arguments,
    _compute_dtype,
    _cos_sin,
    _seq_len,
)
from rope_tutor.scaling import rope_parameters

__all__ = ["apply_rope_fast"]


def _check_out(out: Any, x: torch.Tensor) -> torch.Tensor:
    """``out`` if it can receive the result for ``x``: same shape, dtype and device, no overlap."""
    if not isinstance(out, torch.Tensor):
        raise ValueError(f"out must be a tensor or None, got out={out!r:.80}")
    expected = f"expected shape {tuple(x.shape)}, dtype {x.dtype} on {x.device} (those of x)"
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out has shape {tuple(out.shape)}, dtype {out.dtype} on {out.device}; {expected}"
        )
    if any(stride == 0 and size > 1 for stride, size in zip(out.stride(), out.shape, strict=True)):
        raise ValueError(
            f"out has a broadcast (stride 0) dim, strides {out.stride()}: several results would "
            "land on one element; expected a tensor with its own memory"
        )
    if _may_overlap(out, x):
        raise ValueError(
            "out overlaps x in memory: the rotation reads x while it writes out; expected a "
            "separate tensor (for example torch.empty_like(x))"
        )
    return out


def _may_overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True if the byte ranges that ``a`` and ``b`` span in one storage intersect (conservative)."""
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


def _rotate_fast(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Equation (rope-elementwise) for all features of ``x``, in ``x``'s dtype, into ``out``.

    ``x`` is ``(..., seq, r)`` in any floating dtype; ``cos`` and ``sin`` are ``(seq, r/2)`` in the
    compute dtype (float32 or float64), already multiplied by the attention factor. ``out`` (same
    shape and dtype as ``x``) receives the result, or a new tensor does when it is None. For
    input in the compute dtype the result is the only full-size buffer: in the half layout it
    starts as ``x * [cos, cos]`` and each half then gets ``-/+ (other half of x) * sin`` added in
    place; in the interleaved layout one complex multiply does everything in a single pass. Input
    in a lower precision (bfloat16, float16) is converted on the CPU in blocks of at most 2**18
    elements, so the float32 temporaries stay in the cache (on other devices, as a whole), and the
    result is rounded once. Differentiable when ``out`` is None (no ``out=`` arguments then).
    """
    compute = cos.dtype
    if layout == "half":
        half = cos.shape[-1]
        cos_both = torch.cat((cos, cos), dim=-1)  # (seq, r): the cos of both halves
    else:
        rotation = torch.complex(cos, sin)  # (seq, r/2): e^(i m theta_i), scaled

    def rotated(xc: torch.Tensor, rows: slice, dest: torch.Tensor | None) -> torch.Tensor:
        """The rotation of ``xc`` (compute dtype, sequence rows ``rows``), in ``dest`` if given."""
        if layout == "half":
            if dest is None:
                dest = xc * cos_both[rows]  # (x1 c, x2 c): the only full-size buffer
            else:
                torch.mul(xc, cos_both[rows], out=dest)
            dest[..., :half].addcmul_(xc[..., half:], sin[rows], value=-1)  # x1 c - x2 s
            dest[..., half:].addcmul_(xc[..., :half], sin[rows])  # x2 c + x1 s
            return dest
        if xc.stride(-1) != 1 or any(n % 2 for n in (xc.storage_offset(), *xc.stride()[:-1])):
            xc = xc.contiguous()  # view_as_complex needs each pair adjacent and aligned
        pairs = torch.view_as_complex(xc.unflatten(-1, (-1, 2)))  # x[2i] + i x[2i+1]
        result = torch.view_as_real(pairs * rotation[rows]).flatten(-2)
        return result if dest is None else dest.copy_(result)

    if x.dtype == compute:
        return rotated(x, slice(None), out)
    if x.device.type != "cpu":
        result = rotated(x.to(compute), slice(None), None)
        return result.to(x.dtype) if out is None else out.copy_(result)
    # Blocks of 2**18 elements on one thread. With more threads, each operator on a block would
    # split it and wait at its end for every thread, which takes milliseconds when another job
    # holds a core; blocks below PyTorch's grain size (2**15 elements) run on this thread alone.
    block = 2**18 if torch.get_num_threads() == 1 else 2**15 - 1
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype)
    step = max(1, block // max(1, x[..., :1, :].numel()))  # sequence rows per block
    for start in range(0, x.shape[-2], step):
        rows = slice(start, start + step)
        out[..., rows, :] = rotated(x[..., rows, :].to(compute), rows, None)  # rounded once
    return out


def apply_rope_fast(
    x: torch.Tensor,
    positions: torch.Tensor | None = None,
    *,
    base: float = 10000.0,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    rotary_dim: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``apply_rope`` computed for speed; the same values, optionally written into ``out``.

    Equation (rope-elementwise) in "Deriving rotary position embedding"; Su et al., RoFormer
    (2021); chapter "Making RoPE fast". ``x`` is ``(..., seq, dim)``, ``positions`` ``(seq,)``
    (integers or floats >= 0; ``None`` means ``0 .. seq - 1``); ``base``, ``layout``, ``scaling``
    and ``rotary_dim`` mean what they mean for ``apply_rope``, and are checked the same way.
    Angles are formed in float32 (float64 for float64 ``x``), as there. Returns a tensor of
    ``x``'s shape and dtype: ``out`` itself when it is given (it is written into, as a KV-cache
    write would), a new tensor otherwise. Differentiable when ``out`` is None.

    Raises ``ValueError`` like ``apply_rope``, and ``ValueError`` naming ``out`` and what was
    expected when ``out`` does not have ``x``'s shape, dtype and device, has a broadcast (stride
    0) dim, or overlaps ``x`` in memory.
    """
    if positions is None and isinstance(x, torch.Tensor) and x.dim() >= 2:
        positions = torch.arange(x.shape[-2], device=x.device)
    x, positions, base, layout, rotary_dim = _check_rope_arguments(
        x, positions, base, layout, rotary_dim
    )
    if out is not None:
        out = _check_out(out, x)
    inv_freq, attention_factor = rope_parameters(
        rotary_dim, base, scaling, seq_len=_seq_len(positions)
    )
    cos, sin = _cos_sin(positions, inv_freq, attention_factor, _compute_dtype(x.dtype))
    if rotary_dim == x.shape[-1]:
        return _rotate_fast(x, cos, sin, layout, out)
    if out is None:
        rotated = _rotate_fast(x[..., :rotary_dim], cos, sin, layout, None)
        return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
    _rotate_fast(x[..., :rotary_dim], cos, sin, layout, out[..., :rotary_dim])
    out[..., rotary_dim:] = x[..., rotary_dim:]  # the pass-through features
    return out
