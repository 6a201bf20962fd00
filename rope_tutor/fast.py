"""Part VI: RoPE written for speed, ``apply_rope_fast``.

Chapter "Making RoPE fast". The same operation as Part II's reference ``apply_rope`` (equation
(rope-elementwise) of "Deriving rotary position embedding"; Su et al., RoFormer, 2021), with the
same arguments, checks and angles, computed with less memory traffic: applying RoPE is
memory-bound, so what counts is the bytes moved and the buffers allocated. This module imports
Part II (``rope_tutor.rope``) and Part IV's registry; neither imports it. The tests prove that
both functions agree for every layout, dtype, ``rotary_dim`` and scaling method.

On a CUDA GPU the work is the Triton kernel's (``rope_tutor.triton_rope``, which this module
imports; triton itself is imported only when the kernel first runs): one launch, angles formed in
the kernel, no host-device synchronisation. The blocked loops below are the CPU's form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from rope_tutor.outputs import check_out
from rope_tutor.rope import check_rope_arguments, compute_dtype, context_length, rope_cos_sin
from rope_tutor.scaling import rope_parameters
from rope_tutor.triton_rope import apply_rope_triton, kernel_applies

__all__ = ["apply_rope_fast"]


#: Elements of x per block on the CPU with one thread: 2**17 float32 values are 512 KiB, so a
#: block of x, its block of the result and the float32 work buffer of a low-precision input
#: (2 MiB at most) stay in a core's L2 cache while the three or four operators of a block pass
#: over them.
BLOCK_ELEMENTS = 2**17
#: Elements per block with several threads. Each operator then splits its block between the
#: threads and ends by waiting for all of them; when another process holds a core, that wait
#: lasts until the descheduled thread runs again (measured on a busy 2-core machine: a few
#: milliseconds per operator call). Few, large blocks keep the number of waits per call small (4
#: blocks for a (1, 32, 4096, 128) q). The price: blocks larger than a core's cache, and for
#: low-precision input two float32 work buffers of 16 MiB, which glibc may map afresh (and so
#: fault in again) on every call; the benchmark's fault count shows when it does.
PARALLEL_BLOCK_ELEMENTS = 2**22


def _tables(
    positions: torch.Tensor,
    rotary_dim: int,
    base: float,
    scaling: Mapping[str, Any] | None,
    compute: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """cos, sin ``(seq, r/2)``, ``[cos, cos]`` ``(seq, r)`` and ``cos + i sin`` for these settings.

    Computed afresh on every call: this module keeps no state. For a ``(1, 32, 4096,
    128)`` float32 tensor they cost about a twentieth of the rotation on one CPU thread (3.8 ms
    against 67 ms, measured once); a model that wants them once for all its layers caches them on
    its rotary module (``RotaryEmbedding`` does).
    """
    inv_freq, attention_factor = rope_parameters(
        rotary_dim, base, scaling, seq_len=context_length(positions)
    )
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor, compute)
    cos_both = torch.cat((cos, cos), dim=-1)  # (seq, r): the cos of both halves
    rotation = torch.complex(cos, sin)  # (seq, r/2): e^(i m theta_i), scaled
    return cos, sin, cos_both, rotation


def _rotate_fast(
    x: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    layout: str,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Equation (rope-elementwise) for all features of ``x``, in ``x``'s dtype, into ``out``.

    ``x`` is ``(..., seq, r)`` in any floating dtype; ``tables`` are ``_tables``' cos, sin
    ``(seq, r/2)``, ``[cos, cos]`` ``(seq, r)`` and the complex rotation, in the compute dtype
    (float32 or float64). ``out`` (``x``'s shape and dtype) receives the result, or a new tensor
    does when it is None.

    On the CPU the work goes in blocks of sequence rows (``BLOCK_ELEMENTS`` elements on one
    thread, ``PARALLEL_BLOCK_ELEMENTS`` on several), written with
    ``out=`` operators straight into the result, so nothing but the result is allocated and the
    second and third passes of a block read data that is still in the cache:

    * half layout: ``out = x * [cos, cos]``, then ``out1 -= x2 * sin`` and ``out2 += x1 * sin``
      in place (``addcmul_``): three operators, one pass over memory;
    * interleaved layout: one complex multiply, ``(x[2i] + i x[2i+1]) * e^(i m theta_i)``;
    * bfloat16 and float16: each block is converted into a float32 work buffer (one operator,
      so that the others run in a single dtype, which PyTorch vectorises best), rotated into a
      second one and rounded once into the result.

    When autograd records (x requires grad, out is None) or off the CPU, the same arithmetic runs
    on the whole tensor with differentiable operators.
    """
    cos, sin, cos_both, rotation = tables
    compute = cos.dtype
    half = cos.shape[-1]
    if (x.requires_grad and torch.is_grad_enabled() and out is None) or x.device.type != "cpu":
        return _rotate_whole(x, tables, layout, out)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype)
    low_precision = x.dtype != compute
    block = BLOCK_ELEMENTS if torch.get_num_threads() == 1 else PARALLEL_BLOCK_ELEMENTS
    row = max(1, x.numel() // max(1, x.shape[-2]))  # elements of one sequence row, all heads
    step = max(1, block // row)  # sequence rows per block

    def split(t: torch.Tensor, dim: int = -2) -> tuple[torch.Tensor, ...]:
        """Views of ``t``'s blocks, all made at once (cheaper than slicing block by block)."""
        return (t,) if step >= x.shape[-2] else t.split(step, dim=dim)

    if layout == "interleaved":
        blocks = zip(split(x), split(out), split(rotation, 0), strict=True)
    elif low_precision:
        blocks = zip(split(x), split(out), split(cos_both, 0), split(sin, 0), strict=True)
    else:  # float32 or float64, half layout: the halves of every block, named once
        halves = (x.narrow(-1, 0, half), x.narrow(-1, half, half))
        out_halves = (out.narrow(-1, 0, half), out.narrow(-1, half, half))
        for xb, ob, cb, sb, x1, x2, o1, o2 in zip(
            split(x), split(out), split(cos_both, 0), split(sin, 0),
            *map(split, halves), *map(split, out_halves),
            strict=True,
        ):  # fmt: skip
            torch.mul(xb, cb, out=ob)  # (x1 c, x2 c)
            o1.addcmul_(x2, sb, value=-1)  # x1 c - x2 s
            o2.addcmul_(x1, sb)  # x2 c + x1 s
        return out
    if low_precision:  # two float32 blocks, reused: the converted x and the result
        work_shape = (*x.shape[:-2], min(step, x.shape[-2]), x.shape[-1])
        work = (torch.empty(work_shape, dtype=compute), torch.empty(work_shape, dtype=compute))
        full_work = _with_halves(*work, half)
    for xb, ob, *block_tables in blocks:
        if low_precision:  # convert once, so that every operator below runs in one dtype
            rows = xb.shape[-2]
            if rows == work[0].shape[-2]:
                source, dest, s1, s2, d1, d2 = full_work
            else:  # the last, shorter block
                source, dest, s1, s2, d1, d2 = _with_halves(
                    *(w.narrow(-2, 0, rows) for w in work), half
                )
            source.copy_(xb)
        else:
            source, dest = xb, ob
        if layout == "half":
            cb, sb = block_tables
            torch.mul(source, cb, out=dest)  # (x1 c, x2 c)
            d1.addcmul_(s2, sb, value=-1)  # x1 c - x2 s
            d2.addcmul_(s1, sb)  # x2 c + x1 s
        elif _pairs_aligned(source) and _pairs_aligned(dest):
            torch.mul(_as_complex(source), block_tables[0], out=_as_complex(dest))
        else:
            dest.copy_(_rotate_pairs(source, block_tables[0]))
        if low_precision:
            ob.copy_(dest)  # the single rounding to x's dtype
    return out


def _with_halves(source: torch.Tensor, dest: torch.Tensor, half: int) -> tuple[torch.Tensor, ...]:
    """``source``, ``dest`` and the two halves of each along the last dim."""
    return (
        source,
        dest,
        source.narrow(-1, 0, half),
        source.narrow(-1, half, half),
        dest.narrow(-1, 0, half),
        dest.narrow(-1, half, half),
    )


def _pairs_aligned(t: torch.Tensor) -> bool:
    """Whether ``view_as_complex`` can view ``t``'s last dim as pairs (adjacent, aligned)."""
    return t.stride(-1) == 1 and not any(n % 2 for n in (t.storage_offset(), *t.stride()[:-1]))


def _as_complex(t: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(t.unflatten(-1, (-1, 2)))  # x[2i] + i x[2i+1]


def _rotate_pairs(xc: torch.Tensor, rotation: torch.Tensor) -> torch.Tensor:
    """The interleaved rotation as a new tensor: one complex multiply (pairs made adjacent)."""
    if not _pairs_aligned(xc):
        xc = xc.contiguous()
    return torch.view_as_real(_as_complex(xc) * rotation).flatten(-2)


def _rotate_whole(
    x: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    layout: str,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """The rotation of ``_rotate_fast`` on the whole tensor, differentiable when ``out`` is None."""
    cos, sin, cos_both, rotation = tables
    half = cos.shape[-1]
    xc = x.to(cos.dtype)
    if layout == "half":
        result = xc * cos_both  # (x1 c, x2 c): the only full-size buffer
        result[..., :half].addcmul_(xc[..., half:], sin, value=-1)  # x1 c - x2 s
        result[..., half:].addcmul_(xc[..., :half], sin)  # x2 c + x1 s
    else:
        result = _rotate_pairs(xc, rotation)
    return result.to(x.dtype) if out is None else out.copy_(result)


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
    write would), a new tensor otherwise. Differentiable either way (with ``out``, through one
    copy into it, so an ``x`` that requires grad costs a temporary).

    On CUDA, for float32, bfloat16 and float16 with triton installed, the Triton kernel does the
    work (``apply_rope_triton``: the same values, one launch, no host-device synchronisation
    except for Dynamic NTK and LongRoPE, which need the length on the host; bad position values
    then fail the CUDA stream through a device-side assert instead of raising here, and
    ``positions`` may also be ``(batch, seq)``). Everywhere else the code below runs.

    Raises ``ValueError`` like ``apply_rope``, and ``ValueError`` naming ``out`` and what was
    expected when ``out`` does not have ``x``'s shape, dtype and device, has a broadcast (stride
    0) dim, overlaps ``x`` in memory, or is a leaf tensor that requires grad.
    """
    if isinstance(x, torch.Tensor) and x.device.type == "cuda" and kernel_applies(x):
        return apply_rope_triton(
            x, positions, base=base, layout=layout, scaling=scaling, rotary_dim=rotary_dim, out=out
        )
    if positions is None and isinstance(x, torch.Tensor) and x.dim() >= 2:
        positions = torch.arange(x.shape[-2], device=x.device)
    x, positions, base, layout, rotary_dim = check_rope_arguments(
        x, positions, base, layout, rotary_dim
    )
    if out is not None:
        out = check_out(out, x)
        if x.requires_grad and torch.is_grad_enabled():  # out= kernels are not differentiable
            rotated = apply_rope_fast(
                x, positions, base=base, layout=layout, scaling=scaling, rotary_dim=rotary_dim
            )
            return out.copy_(rotated)  # autograd sees one copy into out
    tables = _tables(positions, rotary_dim, base, scaling, compute_dtype(x.dtype))
    if rotary_dim == x.shape[-1]:
        return _rotate_fast(x, tables, layout, out)
    if out is None:
        rotated = _rotate_fast(x[..., :rotary_dim], tables, layout, None)
        return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
    _rotate_fast(x[..., :rotary_dim], tables, layout, out[..., :rotary_dim])
    out[..., rotary_dim:] = x[..., rotary_dim:]  # the pass-through features
    return out
