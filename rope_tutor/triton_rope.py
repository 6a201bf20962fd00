"""Part VI: RoPE on the GPU at the bandwidth of a copy: the Triton kernel's wrapper.

Chapter "Making RoPE fast", the GPU half. ``apply_rope_qk`` rotates a model's queries and keys
(equation (rope-elementwise) of "Deriving rotary position embedding"; Su et al., RoFormer, 2021)
in one launch of the kernel in ``rope_tutor.rope_kernel``; ``apply_rope_triton`` rotates one
tensor (``apply_rope_fast`` calls it for CUDA tensors). Both take the arguments of the reference
``apply_rope``, and return the same values: angles ``m * theta_i`` formed in float32 from the
positions and the frequencies of any Part IV method (``rope_parameters``), cos and sin multiplied
by its attention factor, the rotation in float32, one rounding to the input's dtype.

The kernel runs on CUDA tensors of dtype float32, bfloat16 or float16, and on CPU tensors under
Triton's interpreter (``TRITON_INTERPRET=1``, set before triton is first imported: how the tests
prove it on machines without a GPU). float64 input, CPU input without the interpreter, and a
machine without triton take the reference ``apply_rope`` instead, with the same values.

No host-device synchronisation, for a method whose frequencies do not depend on the length (all but
``"dynamic"`` and ``"longrope"``) and positions given as a tensor on the input's device (or None):
shapes and dtypes are checked on the host, the positions' values on the device (a device-side
assert in the kernel, which reads them anyway: no extra launch), and the frequencies are moved to
the device once per setting and kept (``device_parameters``). So a call can be captured in a CUDA
graph. triton is imported on the first call that runs the kernel, never by ``import rope_tutor``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

import torch

from rope_tutor.outputs import check_out, may_overlap
from rope_tutor.rope import apply_rope, check_rope_settings, context_length
from rope_tutor.scaling import rope_parameters

__all__ = [
    "KERNEL_DTYPES",
    "LENGTH_DEPENDENT",
    "apply_rope_qk",
    "apply_rope_triton",
    "device_parameters",
    "interpreting",
    "kernel_applies",
    "triton_available",
]

#: The dtypes the kernel rotates (in float32); float64 takes the reference path.
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: The Part IV methods whose frequencies depend on the context length (largest position + 1):
#: for them the length is read on the host, which synchronises host and device once per call.
LENGTH_DEPENDENT = frozenset({"dynamic", "longrope"})
#: Frequencies kept on their devices: (rotary_dim, base, setting, length, device) -> (inv_freq,
#: attention factor). Bounded: cleared when it grows past this many settings.
_PARAMETER_CACHE_SIZE = 64
_parameters: dict[tuple[Any, ...], tuple[torch.Tensor, float]] = {}


def triton_available() -> bool:
    """Whether triton can be imported (without importing it: a look at the installed modules)."""
    if "triton" in sys.modules:  # imported already: the common case, answered at once
        return sys.modules["triton"] is not None
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # blocked, or a module without a spec
        return False


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (kernels run on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")


def kernel_applies(x: Any) -> bool:
    """Whether the kernel rotates ``x``: a float32/bfloat16/float16 tensor on CUDA (or on the CPU
    under the interpreter), with triton installed. Metadata only; no synchronisation."""
    if not isinstance(x, torch.Tensor) or x.dtype not in KERNEL_DTYPES:
        return False
    if x.is_cuda:  # first, and alone: the common case costs no look at the environment
        return triton_available()
    return x.device.type == "cpu" and interpreting() and triton_available()


def _setting_key(scaling: Mapping[str, Any] | None) -> str:
    """A hashable, exact spelling of a scaling setting (floats by repr, lists kept in order)."""
    if not scaling:
        return "null"
    return json.dumps(dict(scaling) if scaling else None, sort_keys=True, default=repr)


def _method(scaling: Mapping[str, Any] | None) -> str:
    if not scaling:
        return "default"
    return str(scaling.get("rope_type", scaling.get("type", "default")))


def device_parameters(
    rotary_dim: int,
    base: float,
    scaling: Mapping[str, Any] | None,
    device: torch.device,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """``rope_parameters(rotary_dim, base, scaling, seq_len=seq_len)`` with ``inv_freq`` on
    ``device``: float32 ``(rotary_dim // 2,)`` and the attention factor (a float).

    Kept per setting and device after the first call (one host-to-device copy then, none
    after), so that later calls do not synchronise; ``seq_len`` is part of the key only for the
    ``LENGTH_DEPENDENT`` methods (the others ignore it). The tensor is shared by every later call
    with the same setting: read it, never write it. Raises ``ValueError`` like
    ``rope_parameters``.
    """
    length = seq_len if _method(scaling) in LENGTH_DEPENDENT else None
    key = (rotary_dim, float(base), _setting_key(scaling), length, device)
    if key not in _parameters:
        inv_freq, factor = rope_parameters(rotary_dim, base, scaling, seq_len=length)
        if len(_parameters) >= _PARAMETER_CACHE_SIZE:
            _parameters.clear()
        _parameters[key] = (inv_freq.to(device=device, dtype=torch.float32), float(factor))
    return _parameters[key]


# ----------------------------------------------------------------------------------------------
# Checks: shapes and dtypes on the host, values on the device
# ----------------------------------------------------------------------------------------------


def _check_qk(name: str, x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {name}={x!r:.80}")
    if x.dim() != 4:
        raise ValueError(
            f"{name} must have shape (batch, heads, seq, dim), got shape {tuple(x.shape)}"
        )
    return x


def _check_positions(positions: Any, x: torch.Tensor) -> torch.Tensor | None:
    """Positions ``(seq,)`` or ``(batch, seq)`` on ``x``'s device, values checked without a sync.

    On the CPU the values are checked at once, with ``apply_rope``'s message (``ValueError``);
    on a GPU by the kernel as it reads them (``rope_kernel.launch(check_positions=True)``): a
    device-side assert fails the stream (a ``RuntimeError``, "device-side assert triggered", at
    the next synchronisation) if a position is negative or not finite.
    """
    if positions is None:
        return None
    seq = x.shape[-2]
    if not (isinstance(positions, torch.Tensor) and positions.device == x.device):
        positions = torch.as_tensor(positions, device=x.device)
    if positions.dtype == torch.bool or positions.is_complex():
        raise ValueError(f"positions must hold integers or floats, got dtype {positions.dtype}")
    if positions.dim() == 2:
        if x.dim() < 3 or positions.shape != (x.shape[0], seq):
            raise ValueError(
                f"positions of shape {tuple(positions.shape)} must be (batch, seq) = "
                f"({x.shape[0] if x.dim() >= 3 else '-'}, {seq}) for x of shape {tuple(x.shape)}"
                " (one row of positions per batch element, dim 0 of the input)"
            )
    elif positions.dim() != 1:
        raise ValueError(
            "positions must be 1-D (seq,) or 2-D (batch, seq), got positions of shape "
            f"{tuple(positions.shape)}"
        )
    elif positions.shape[0] != seq:
        raise ValueError(
            f"positions has length {positions.shape[0]} but the sequence length "
            f"(dim -2 of the input) is {seq}"
        )
    if positions.numel() == 0:
        return positions
    if positions.device.type == "cpu":  # no device to wait for: apply_rope's check and message
        if not torch.isfinite(positions).all() or (positions < 0).any():
            raise ValueError(
                f"positions must be finite and >= 0, got min {positions.min().item()} "
                f"and max {positions.max().item()}"
            )
    # On a GPU the kernel itself asserts it, as it reads them (a device-side assert: no extra
    # launch, no synchronisation); where the kernel does not run, apply_rope checks them.
    return positions


def _as_4d(x: torch.Tensor) -> torch.Tensor:
    """``x`` ``(..., seq, dim)`` as a ``(batch, heads, seq, dim)`` view (batch = dim 0)."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[:, None]
    if x.dim() == 4:
        return x
    return x.view(x.shape[0], -1, *x.shape[-2:])  # raises for dims that cannot merge


# ----------------------------------------------------------------------------------------------
# The autograd function: forward and backward are the same kernel, with theta and -theta
# ----------------------------------------------------------------------------------------------


class _RopeQK(torch.autograd.Function):
    """``(q, k) -> (R q, R k)``; backward ``(g_q, g_k) -> (R^T g_q, R^T g_k)``, R^T = R(-theta)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        positions: torch.Tensor | None,
        inv_freq: torch.Tensor,
        attention_factor: float,
        interleaved: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out_q, out_k = torch.empty_like(q), torch.empty_like(k)
        _launch(q, k, out_q, out_k, positions, inv_freq, attention_factor, interleaved)
        ctx.save_for_backward(positions, inv_freq)
        ctx.settings = (attention_factor, interleaved)
        return out_q, out_k

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad_q: torch.Tensor, grad_k: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        positions, inv_freq = ctx.saved_tensors
        attention_factor, interleaved = ctx.settings
        dq, dk = torch.empty_like(grad_q), torch.empty_like(grad_k)
        _launch(
            grad_q, grad_k, dq, dk, positions, inv_freq, attention_factor, interleaved,
            conjugate=True,
        )  # fmt: skip
        return dq, dk, None, None, None, None


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    out_q: torch.Tensor,
    out_k: torch.Tensor,
    positions: torch.Tensor | None,
    inv_freq: torch.Tensor,
    attention_factor: float,
    interleaved: bool,
    *,
    in_place: bool = False,
    conjugate: bool = False,
) -> None:
    # triton is imported here, on the first launch, so that `import rope_tutor` never needs it
    from rope_tutor import rope_kernel

    if q.shape[-2] == 0 or q.shape[0] == 0:
        return
    batched = None
    if positions is not None:  # (batch, seq) for the kernel; a (seq,) row shared by the batch
        batched = positions if positions.dim() == 2 else positions.expand(q.shape[0], -1)
    rope_kernel.launch(
        q, k, out_q, out_k, batched, inv_freq, attention_factor,
        interleaved=interleaved, in_place=in_place, conjugate=conjugate,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------
# The public entry points
# ----------------------------------------------------------------------------------------------


def _reference(
    x: torch.Tensor,
    positions: torch.Tensor | None,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """``apply_rope`` on ``x``, row by row of the batch for ``(batch, seq)`` positions."""
    if positions is None:
        positions = torch.arange(x.shape[-2], device=x.device)
    if positions.dim() == 1:
        return apply_rope(x, positions, **kwargs)
    return torch.stack([apply_rope(x[b], positions[b], **kwargs) for b in range(x.shape[0])])


def apply_rope_qk(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None = None,
    *,
    base: float = 10000.0,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    rotary_dim: int | None = None,
    out_q: torch.Tensor | None = None,
    out_k: torch.Tensor | None = None,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on a layer's queries and keys in one kernel launch: ``(q_rot, k_rot)``.

    Equation (rope-elementwise) in "Deriving rotary position embedding"; Su et al., RoFormer
    (2021); chapter "Making RoPE fast". ``q`` is ``(batch, q_heads, seq, dim)`` and ``k``
    ``(batch, k_heads, seq, dim)`` (Hugging Face's layout; ``k_heads`` may differ, as in
    grouped-query or multi-query attention), any strides, one dtype and device. ``positions`` is
    ``(seq,)``, or ``(batch, seq)`` for one row per sequence (Hugging Face's ``position_ids``:
    sequences of a batch at different lengths), integers or floats >= 0, or None for ``0 .. seq
    - 1``. ``base``, ``layout`` (``"half"`` or ``"interleaved"``), ``scaling`` (a Part IV setting,
    ``rope_parameters``) and ``rotary_dim`` (the leading features rotated; the rest are copied)
    mean what they mean for ``apply_rope``, and the values are ``apply_rope``'s: on each tensor,
    and for ``(batch, seq)`` positions on each batch element with its row.

    The result goes into new tensors; into ``out_q`` and ``out_k`` when given (each of its
    tensor's shape and dtype: a KV-cache slot, say); or into ``q`` and ``k`` themselves with
    ``inplace=True`` (q and k must then share no element). Differentiable: the backward is the
    same kernel turning by ``-theta``; when q or k requires grad, ``out_q``/``out_k`` and
    ``inplace`` cost one copy each (autograd sees a copy into them).

    Runs the Triton kernel on CUDA for float32, bfloat16 and float16 (and on CPU tensors under
    ``TRITON_INTERPRET=1``); float64, or CPU tensors otherwise, take the reference ``apply_rope``.
    No host-device synchronisation when ``positions`` is a tensor on q's device or None, except
    for the methods in ``LENGTH_DEPENDENT`` (Dynamic NTK and LongRoPE choose their frequencies
    from the length, largest position + 1, which they need on the host) and on the first call
    with a setting (its frequencies are copied to the device once, ``device_parameters``).

    Raises ``ValueError`` naming the argument for anything ``apply_rope`` refuses, for q and k
    that differ in batch, sequence length, dim, dtype or device, for bad ``out_q``/``out_k``
    (``check_out``), or for ``inplace`` with ``out_q``/``out_k`` or with a leaf that requires
    grad. Bad position values raise ``ValueError`` on the CPU and fail the CUDA stream (device
    assert) on a GPU.
    """
    q, k = _check_qk("q", q), _check_qk("k", k)
    if rotary_dim is None and q.shape[-1] % 2:
        raise ValueError(f"q must have an even last dim (the head dim), got shape {tuple(q.shape)}")
    q, base, layout, rotary_dim = check_rope_settings(q, base, layout, rotary_dim)
    if (q.shape[0], q.shape[2], q.shape[3]) != (k.shape[0], k.shape[2], k.shape[3]):
        raise ValueError(
            f"q and k must agree in batch, seq and dim: q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if q.dtype != k.dtype or q.device != k.device:
        raise ValueError(f"q and k differ: q {q.dtype} on {q.device}, k {k.dtype} on {k.device}")
    if not isinstance(inplace, bool):
        raise ValueError(f"inplace must be True or False, got inplace={inplace!r}")
    if inplace and (out_q is not None or out_k is not None):
        raise ValueError("inplace=True writes into q and k: out_q and out_k must then be None")
    for name, x in (("q", q), ("k", k)):
        if inplace and x.requires_grad and x.is_leaf and torch.is_grad_enabled():
            raise ValueError(
                f"inplace=True with {name} a leaf tensor that requires grad, which cannot be "
                "written in place; expected inplace=False"
            )
    if out_q is not None:
        out_q = check_out(out_q, q, name="out_q", source="q")
        if may_overlap(out_q, k):
            raise ValueError("out_q overlaps k in memory; expected a separate tensor")
    if out_k is not None:
        out_k = check_out(out_k, k, name="out_k", source="k")
        if may_overlap(out_k, q) or (out_q is not None and may_overlap(out_k, out_q)):
            raise ValueError("out_k overlaps q or out_q in memory; expected a separate tensor")
    positions = _check_positions(positions, q)
    q_rot, k_rot = _rotate(
        q, k, positions, base, layout, scaling, rotary_dim,
        out_q=q if inplace else out_q, out_k=k if inplace else out_k, in_place=inplace,
    )  # fmt: skip
    return q_rot, k_rot


def apply_rope_triton(
    x: torch.Tensor,
    positions: torch.Tensor | None = None,
    *,
    base: float = 10000.0,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    rotary_dim: int | None = None,
    out: torch.Tensor | None = None,
    inplace: bool = False,
) -> torch.Tensor:
    """``apply_rope`` on one tensor through the kernel of ``apply_rope_qk``.

    ``x`` is ``(..., seq, dim)`` (dims before ``seq`` past the first are merged into one heads
    dim, which needs them to be mergeable as a view when more than four dims); ``positions``
    ``(seq,)``, ``(batch, seq)`` (batch = dim 0 of ``x``) or None. The other arguments, the
    result, the dtypes and devices that take the kernel, the synchronisations and the errors
    are those of ``apply_rope_qk``, with ``out`` for ``out_q``. ``apply_rope_fast`` calls it for
    CUDA tensors.
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor, got x={x!r:.80}")
    x, base, layout, rotary_dim = check_rope_settings(x, base, layout, rotary_dim)
    if not isinstance(inplace, bool):
        raise ValueError(f"inplace must be True or False, got inplace={inplace!r}")
    if inplace and out is not None:
        raise ValueError("inplace=True writes into x: out must then be None")
    if inplace and x.requires_grad and x.is_leaf and torch.is_grad_enabled():
        raise ValueError(
            "inplace=True with x a leaf tensor that requires grad, which cannot be written in "
            "place; expected inplace=False"
        )
    if out is not None:
        out = check_out(out, x)
    positions = _check_positions(positions, x)
    target = x if inplace else out
    try:
        x4 = _as_4d(x)
    except RuntimeError:  # dims that do not merge as a view: the kernel reads a copy
        x4 = x.reshape(x.shape[0], -1, *x.shape[-2:])
    out4 = None
    if target is not None:
        try:
            out4 = _as_4d(target)
        except RuntimeError:  # dims that do not merge as a view: rotate, then copy
            out4 = None
    empty = x4[:, :0]  # no k: a tensor with no heads
    rotated, _ = _rotate(
        x4, empty, positions, base, layout, scaling, rotary_dim,
        out_q=out4, out_k=None if out4 is None else empty, in_place=inplace and out4 is not None,
    )  # fmt: skip
    if target is None:
        return rotated.view(x.shape)
    if out4 is None:
        return target.copy_(rotated.view(x.shape))
    return target


def _rotate(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor | None,
    base: float,
    layout: str,
    scaling: Mapping[str, Any] | None,
    rotary_dim: int,
    *,
    out_q: torch.Tensor | None,
    out_k: torch.Tensor | None,
    in_place: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked arguments to the kernel (or to the reference), into ``out_q``/``out_k``."""
    kwargs = {"base": base, "layout": layout, "scaling": scaling, "rotary_dim": rotary_dim}
    if not kernel_applies(q):
        results = []
        for x, out in ((q, out_q), (k, out_k)):
            rotated = _reference(x, positions, kwargs)
            results.append(rotated if out is None else out.copy_(rotated))
        return results[0], results[1]
    seq_len = None
    if _method(scaling) in LENGTH_DEPENDENT:  # read on the host: one synchronisation
        seq_len = q.shape[-2] if positions is None else context_length(positions)
    inv_freq, factor = device_parameters(rotary_dim, base, scaling, q.device, seq_len)
    interleaved = layout == "interleaved"
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    if grad:  # new tensors through autograd, then (if asked) one copy into the destination
        q_rot, k_rot = _RopeQK.apply(q, k, positions, inv_freq, factor, interleaved)
        if out_q is not None:
            q_rot = out_q.copy_(q_rot)
        if out_k is not None:
            k_rot = out_k.copy_(k_rot)
        return q_rot, k_rot
    q_rot = torch.empty_like(q) if out_q is None else out_q
    k_rot = torch.empty_like(k) if out_k is None else out_k
    _launch(q, k, q_rot, k_rot, positions, inv_freq, factor, interleaved, in_place=in_place)
    return q_rot, k_rot
