"""Part II: rotary position embedding (RoPE), written to be read.

Chapters "Deriving rotary position embedding" (equations rope-theta, rope-complex, rope-matrix,
rope-elementwise), "RoPE in practice" (the two layouts, the permutation between them) and "RoPE's
distance, base and precision: closer looks" (partial rotary, the cached ``RotaryEmbedding``).
Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (2021).

Two layouts pair the features of a head of size ``d`` differently; both rotate pair ``i`` by the
angle ``m * theta_i`` at position ``m``:

* ``"interleaved"``: pairs ``(x[2i], x[2i+1])`` (RoFormer paper, GPT-J, Meta's Llama code);
* ``"half"``: pairs ``(x[i], x[i + d/2])`` (GPT-NeoX, PaLM, Hugging Face ``transformers``).

Angles ``m * theta_i`` are always formed in float32, or float64 for float64 input, whatever the
input dtype; the rotation runs in that precision and the result is cast back to the input dtype.

``apply_rope`` here is the reference: a few lines that mirror equation (rope-elementwise). The
same operation written for speed is ``apply_rope_fast`` (Part VI, ``rope_tutor.fast``), which
imports this module and is tested against it; this module imports nothing from Part VI. The
frequencies theta_i come from Part I (``sinusoidal_frequencies``) through Part IV's registry
(``rope_parameters``), which does not import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rope_tutor import _checks
from rope_tutor.absolute import sinusoidal_frequencies
from rope_tutor.scaling import rope_parameters

__all__ = [
    "LAYOUTS",
    "RotaryEmbedding",
    "apply_rope",
    "apply_rope_complex",
    "check_rope_arguments",
    "check_rope_settings",
    "compute_dtype",
    "context_length",
    "half_to_interleaved_permutation",
    "interleaved_to_half_permutation",
    "rope_cos_sin",
    "rope_frequencies",
    "rope_matrix",
    "rope_with_bfloat16_angles",
    "rotate_half",
    "rotate_interleaved",
]

#: The feature layouts accepted by ``apply_rope`` and ``RotaryEmbedding``.
LAYOUTS = ("half", "interleaved")


def rope_frequencies(dim: int, base: float = 10000.0) -> torch.Tensor:
    """Angular frequency of each rotated pair: theta_i = base ** (-2i / dim), i = 0 .. dim/2 - 1.

    Equation (rope-theta) in "Deriving rotary position embedding"; Su et al., RoFormer (2021),
    eq. 15. The same frequencies as the sinusoidal encoding's (``sinusoidal_frequencies``,
    equation (sinusoidal-theta)), computed there in float64 and returned here as float32, shape
    ``(dim // 2,)``. Raises ``ValueError`` if ``dim`` is not a positive even int or ``base`` is
    not a finite number greater than 1.
    """
    return sinusoidal_frequencies(dim, base).to(torch.float32)


# ----------------------------------------------------------------------------------------------
# Input checks (every public function names the offending argument and value)
# ----------------------------------------------------------------------------------------------


def _check_x(name: str, x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {name}={x!r:.80}")
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., seq, dim), got shape {tuple(x.shape)}")
    return x


def _check_positions(positions: Any, seq: int | None, device: torch.device | None) -> torch.Tensor:
    """Positions as a 1-D real tensor (length ``seq`` unless None) on ``device``, finite, >= 0."""
    positions = torch.as_tensor(positions, device=device)
    if positions.dtype == torch.bool or positions.is_complex():
        raise ValueError(f"positions must hold integers or floats, got dtype {positions.dtype}")
    if positions.dim() != 1:
        raise ValueError(
            f"positions must be 1-D (seq,), got positions of shape {tuple(positions.shape)}"
        )
    if seq is not None and positions.shape[0] != seq:
        raise ValueError(
            f"positions has length {positions.shape[0]} but the sequence length "
            f"(dim -2 of the input) is {seq}"
        )
    if positions.numel() and (not torch.isfinite(positions).all() or (positions < 0).any()):
        raise ValueError(
            f"positions must be finite and >= 0, got min {positions.min().item()} "
            f"and max {positions.max().item()}"
        )
    return positions


def _check_rotary_dim(rotary_dim: Any, dim: int) -> int:
    if rotary_dim is None:
        return _checks.even_dim("x.shape[-1]", dim)
    rotary_dim = _checks.even_dim("rotary_dim", rotary_dim)
    if rotary_dim > dim:
        raise ValueError(f"rotary_dim={rotary_dim} exceeds the head dim {dim}")
    return rotary_dim


# The pieces below are public: Part VI (``rope_tutor.fast`` and the Triton kernel's wrapper
# ``rope_tutor.triton_rope``) checks its arguments and forms its angles with them, so that every
# form of RoPE in the package accepts the same input, raises the same message and turns by the
# same float32 (or float64) angles as the reference ``apply_rope``.


def check_rope_settings(
    x: Any, base: Any, layout: Any, rotary_dim: Any
) -> tuple[torch.Tensor, float, str, int]:
    """``(x, base, layout, rotary_dim)`` checked: the checks of ``apply_rope`` but the positions'.

    ``x`` must be a floating tensor ``(..., seq, dim)``, ``layout`` one of ``LAYOUTS``, ``base``
    a finite number > 1, ``rotary_dim`` ``None`` (then ``dim``, which must be even) or an even
    int <= ``dim``. Returns ``base`` as a float and ``rotary_dim`` as an int. Looks at shapes and
    dtypes only, never at a tensor's values (no host-device synchronisation). Raises
    ``ValueError`` naming the argument and its value.
    """
    x = _check_x("x", x)
    layout = _checks.choice("layout", layout, LAYOUTS)
    base = _checks.base(base)
    rotary_dim = _check_rotary_dim(rotary_dim, x.shape[-1])
    return x, base, layout, rotary_dim


def check_rope_arguments(
    x: Any, positions: Any, base: Any, layout: Any, rotary_dim: Any
) -> tuple[torch.Tensor, torch.Tensor, float, str, int]:
    """The checks ``apply_rope`` and ``apply_rope_fast`` share, in one order, with one message.

    ``check_rope_settings``, then ``positions``: a 1-D real tensor (or anything
    ``torch.as_tensor`` takes) of length ``x.shape[-2]``, finite and >= 0, returned on ``x``'s
    device. Reading the values synchronises host and device when ``x`` is on a GPU. Returns
    ``(x, positions, base, layout, rotary_dim)``; raises ``ValueError`` naming the argument.
    """
    x, base, layout, rotary_dim = check_rope_settings(x, base, layout, rotary_dim)
    positions = _check_positions(positions, x.shape[-2], x.device)
    return x, positions, base, layout, rotary_dim


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype angles and rotation are computed in for input of ``dtype``.

    float64 for float64 input, float32 for everything else (bfloat16, float16, float32): angles
    are never formed in a low-precision dtype (chapter "RoPE's base and precision").
    """
    return torch.float64 if dtype == torch.float64 else torch.float32


def context_length(positions: torch.Tensor) -> int:
    """The context length a scaling method sees: largest position + 1 (1 for no positions).

    ``positions`` is a real tensor of any shape. A Python int, so on a GPU it synchronises host and
    device: only the length-dependent methods (``"dynamic"``, ``"longrope"``) need it.
    """
    return int(positions.max().item()) + 1 if positions.numel() else 1


# ----------------------------------------------------------------------------------------------
# The rotation itself
# ----------------------------------------------------------------------------------------------


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Multiply each pair by i in the half layout: ``(x1, x2) -> (-x2, x1)`` with x1, x2 the halves.

    The rotate(x) of equation (rope-elementwise) for pairs ``(x[i], x[i + d/2])``, as in GPT-NeoX
    and Hugging Face ``transformers``. ``x`` is ``(..., d)`` with ``d`` even; same shape and dtype
    out. Raises ``ValueError`` for an odd last dim.
    """
    _checks.even_dim("x.shape[-1]", x.shape[-1])
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    """Multiply each pair by i in the interleaved layout: ``(x[2i], x[2i+1]) -> (-x[2i+1], x[2i])``.

    The rotate(x) of equation (rope-elementwise) for adjacent pairs, as in the RoFormer paper and
    GPT-J (``rotate_every_two``). ``x`` is ``(..., d)`` with ``d`` even; same shape and dtype out.
    Raises ``ValueError`` for an odd last dim.
    """
    _checks.even_dim("x.shape[-1]", x.shape[-1])
    return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, attention_factor: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention_factor * cos(m theta_i)`` and ``... sin(...)``, each ``(seq, d/2)`` in ``dtype``.

    The factors of equation (rope-elementwise) in "Deriving rotary position embedding"; Su et
    al., RoFormer (2021). ``positions`` is ``(seq,)``, ``inv_freq`` ``(d/2,)`` (theta_i, from
    ``rope_parameters``), ``attention_factor`` the scaling method's factor. The angles
    ``m * theta_i`` are formed in ``dtype`` (``compute_dtype`` of the input: float32 or float64),
    never in the model's dtype, on the device of ``positions``.
    """
    angles = positions.to(dtype)[:, None] * inv_freq.to(device=positions.device, dtype=dtype)
    return angles.cos() * attention_factor, angles.sin() * attention_factor


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Equation (rope-elementwise), ``x * cos + rotate(x) * sin``, on the first features of ``x``.

    ``x`` is ``(..., seq, d)`` in any floating dtype; ``cos`` and ``sin`` are ``(seq, r/2)``, one
    column per pair (already multiplied by the attention factor) in the compute dtype (float32
    or float64). The first ``r`` features are rotated in ``cos.dtype``, the other ``d - r`` pass
    through; the result has ``x``'s dtype.
    """
    rotary_dim = 2 * cos.shape[-1]
    xr = x[..., :rotary_dim].to(cos.dtype)
    if layout == "half":  # pair (x[i], x[i + r/2]) turns by theta_i: the angles twice, end to end
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        rotated = xr * cos + rotate_half(xr) * sin
    else:  # pair (x[2i], x[2i+1]) turns by theta_i: each angle twice, side by side
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        rotated = xr * cos + rotate_interleaved(xr) * sin
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def apply_rope(
    x: torch.Tensor,
    positions: torch.Tensor,
    *,
    base: float = 10000.0,
    layout: str = "half",
    scaling: Mapping[str, Any] | None = None,
    rotary_dim: int | None = None,
) -> torch.Tensor:
    """Rotate every pair of features of ``x`` by ``positions * theta_i``: RoPE, element-wise form.

    Equation (rope-elementwise) in "Deriving rotary position embedding", with theta_i from
    (rope-theta); Su et al., RoFormer (2021). ``x`` is ``(..., seq, dim)`` (for example
    ``(batch, heads, seq, head_dim)``), ``positions`` is ``(seq,)``, integers or floats >= 0.
    Returns the same shape and dtype as ``x``.

    ``layout`` is ``"half"`` (pairs ``(x[i], x[i + d/2])``, Hugging Face) or ``"interleaved"``
    (pairs ``(x[2i], x[2i+1])``, RoFormer/Meta). ``rotary_dim`` (partial rotary, chapter "RoPE's
    distance, base and precision: closer looks") rotates only the first ``rotary_dim`` features
    and computes theta from ``rotary_dim``; the rest pass through. Hugging Face's
    ``partial_rotary_factor`` f corresponds to ``rotary_dim = int(head_dim * f)``. ``scaling`` is a
    context-extension setting in Hugging Face's ``rope_scaling`` form (Part IV,
    ``rope_parameters``); cos and sin are multiplied by its attention factor. ``None`` is plain
    RoPE.

    Angles are formed in float32 (float64 for float64 ``x``); the result is cast back. This is
    the reference form, written to be read; ``apply_rope_fast`` (Part VI) computes the same
    values with less memory traffic. Raises ``ValueError`` naming the argument for an odd or
    non-int dim, a positions tensor of the wrong shape or length, negative or non-finite
    positions, an unknown layout, a base that is not a finite number greater than 1, or an
    invalid ``scaling``.
    """
    x, positions, base, layout, rotary_dim = check_rope_arguments(
        x, positions, base, layout, rotary_dim
    )
    # theta_i of (rope-theta) as the scaling method changes them, and its attention factor
    inv_freq, attention_factor = rope_parameters(
        rotary_dim, base, scaling, seq_len=context_length(positions)
    )
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor, compute_dtype(x.dtype))
    return _rotate(x, cos, sin, layout)  # x * cos + rotate(x) * sin


def apply_rope_complex(
    x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0
) -> torch.Tensor:
    """RoPE in Euler form: pair ``(x[2i], x[2i+1])`` is a complex number z_i, times e^(i m theta_i).

    Equation (rope-complex) in "Deriving rotary position embedding"; Su et al., RoFormer (2021),
    eq. 12, the form of Meta's Llama code. Interleaved layout, no scaling. ``x`` is
    ``(..., seq, dim)``, ``positions`` ``(seq,)``; same shape and dtype out. Computed in complex64
    (complex128 for float64 ``x``). Raises ``ValueError`` like ``apply_rope``.
    """
    x = _check_x("x", x)
    dim = _check_rotary_dim(None, x.shape[-1])
    base = _checks.base(base)
    positions = _check_positions(positions, x.shape[-2], x.device)
    real = compute_dtype(x.dtype)
    angles = positions.to(real)[:, None] * rope_frequencies(dim, base).to(
        device=x.device, dtype=real
    )  # (seq, dim/2)
    rotation = torch.polar(torch.ones_like(angles), angles)  # e^(i m theta_i)
    z = torch.view_as_complex(x.to(real).reshape(*x.shape[:-1], dim // 2, 2).contiguous())
    return torch.view_as_real(z * rotation).flatten(-2).to(x.dtype)


def rope_with_bfloat16_angles(
    x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0
) -> torch.Tensor:
    """RoPE with its angles formed in bfloat16: the bug, kept for comparison only; do not use.

    Chapter "RoPE's distance, base and precision", section "Precision: form the angles in
    float32": Hugging Face transformers 4.38.0 and 4.38.1 formed the angles ``m * theta_i`` in
    bfloat16 under ``torch.autocast`` (fixed by PR #29285). Here the positions and the float32
    frequencies are rounded to bfloat16, their product is rounded to bfloat16, and cos and sin are
    taken in bfloat16; the rotation is the half layout, ``x * cos + rotate_half(x) * sin``.
    ``x`` is ``(..., seq, dim)`` with ``dim`` even, ``positions`` a ``(seq,)`` tensor; raises
    ``ValueError`` otherwise. No scaling: ``apply_rope`` is the correct function.
    """
    if x.dim() < 2 or x.shape[-1] % 2:
        raise ValueError(f"x must be (..., seq, dim) with dim even, got shape {tuple(x.shape)}")
    if positions.dim() != 1 or positions.shape[0] != x.shape[-2]:
        raise ValueError(
            f"positions must be a (seq,) tensor with seq = x.shape[-2] = {x.shape[-2]}, got shape "
            f"{tuple(positions.shape)}"
        )
    angles = positions.to(torch.bfloat16)[:, None] * rope_frequencies(x.shape[-1], base).to(
        x.device, torch.bfloat16
    )  # (seq, dim/2), bfloat16
    cos = torch.cat((angles.cos(), angles.cos()), dim=-1)
    sin = torch.cat((angles.sin(), angles.sin()), dim=-1)
    return x * cos + rotate_half(x) * sin


def rope_matrix(position: float, dim: int, *, base: float = 10000.0) -> torch.Tensor:
    """The dense block-diagonal rotation R^d_{Theta,m}, float64 of shape ``(dim, dim)``.

    Equation (rope-matrix) in "Deriving rotary position embedding"; Su et al., RoFormer (2021),
    eq. 15. Block ``i`` is the 2-D rotation by ``position * theta_i`` acting on the interleaved
    pair ``(x[2i], x[2i+1])``: ``rope_matrix(m, d) @ x`` equals ``apply_rope(x, [m],
    layout="interleaved")`` for a column vector ``x``. Wasteful in practice (``dim**2`` numbers, of
    which ``2 * dim`` are non-zero): it exists to teach. Raises ``ValueError`` for an odd dim, a
    negative or non-finite position, or a base that is not a finite number greater than 1.
    """
    dim = _checks.even_dim("dim", dim)
    if isinstance(position, torch.Tensor) and position.numel() == 1:
        position = position.item()
    value = _checks.real("position", position)
    if value < 0:
        raise ValueError(f"position must be finite and >= 0, got position={position!r}")
    angles = value * rope_frequencies(dim, base).double()  # (dim/2,)
    cos, sin = angles.cos(), angles.sin()
    even = torch.arange(0, dim, 2)
    matrix = torch.zeros(dim, dim, dtype=torch.float64)
    matrix[even, even] = cos
    matrix[even, even + 1] = -sin
    matrix[even + 1, even] = sin
    matrix[even + 1, even + 1] = cos
    return matrix


# ----------------------------------------------------------------------------------------------
# The permutation between the layouts
# ----------------------------------------------------------------------------------------------


def interleaved_to_half_permutation(head_dim: int, num_heads: int = 1) -> torch.Tensor:
    """Feature order that turns interleaved-layout q/k into half-layout q/k: ``x_half = x[perm]``.

    Within each head, half-layout feature ``j`` comes from interleaved feature ``2j`` and feature
    ``j + head_dim/2`` from ``2j + 1``: ``[0, 2, 4, ..., 1, 3, 5, ...]``. Then
    ``apply_rope(x[..., perm], p, layout="half") == apply_rope(x, p, layout="interleaved")[...,
    perm]``, and since the same permutation is applied to q and k, attention scores are identical
    (chapter "RoPE in practice"). Applied to the rows of Meta's ``W_q`` and ``W_k`` (``W[perm]``)
    it is the permutation Hugging Face's Llama conversion script performs. With ``num_heads > 1``
    the result indexes ``num_heads * head_dim`` features, head after head. Returns int64
    ``(num_heads * head_dim,)``. Raises ``ValueError`` for an odd ``head_dim`` or
    ``num_heads < 1``.
    """
    head_dim = _checks.even_dim("head_dim", head_dim)
    num_heads = _checks.integer("num_heads", num_heads)
    within_head = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    offsets = torch.arange(num_heads)[:, None] * head_dim  # (num_heads, 1)
    return (offsets + within_head).flatten()


def half_to_interleaved_permutation(head_dim: int, num_heads: int = 1) -> torch.Tensor:
    """The inverse of ``interleaved_to_half_permutation``: ``x_interleaved = x_half[perm]``.

    ``[0, d/2, 1, d/2 + 1, ...]`` within each head: what converters from Hugging Face back to
    Meta's layout (GGUF, llama2.c) apply. Same arguments, return type and errors.
    """
    return torch.argsort(interleaved_to_half_permutation(head_dim, num_heads))


# ----------------------------------------------------------------------------------------------
# The module
# ----------------------------------------------------------------------------------------------


class RotaryEmbedding(nn.Module):
    """RoPE for queries and keys, with a cos/sin cache: ``forward(q, k, positions)``.

    Equation (rope-elementwise) in "Deriving rotary position embedding"; chapter "RoPE's distance,
    base and precision: closer looks"; Su et al., RoFormer (2021). ``dim`` is the head dim;
    ``rotary_dim`` (default ``dim``) the number of leading features rotated (partial rotary, theta
    computed from ``rotary_dim``); ``layout`` ``"half"`` or ``"interleaved"``; ``scaling`` a Part
    IV context-extension setting (``rope_parameters``), ``None`` for plain RoPE.

    ``forward`` takes ``q`` and ``k`` of shape ``(..., seq, dim)`` (for example ``(batch, heads,
    seq, head_dim)``, the ``rotary`` contract of ``SelfAttention``) and ``positions`` ``(seq,)``,
    and returns ``(q_rot, k_rot)`` of the same shapes and dtypes; the result equals ``apply_rope``
    on each. For integer positions, cos and sin are looked up in a table for positions
    ``0 .. max(positions)`` formed in float32 (float64 for float64 input) and kept for the next
    call with the same device, compute dtype and frequencies (the frequencies can depend on the
    length with a dynamic scaling); a longer input extends the table. Float positions are computed
    directly. The frequencies are recomputed from the configuration, never stored as weights.
    Raises ``ValueError`` for bad settings at construction and bad shapes or positions in forward.
    """

    def __init__(
        self,
        dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        scaling: Mapping[str, Any] | None = None,
        rotary_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.dim = _checks.even_dim("dim", dim)
        self.rotary_dim = _check_rotary_dim(rotary_dim, self.dim)
        self.base = _checks.base(base)
        self.layout = _checks.choice("layout", layout, LAYOUTS)
        self.scaling = dict(scaling) if scaling is not None else None
        rope_parameters(self.rotary_dim, self.base, self.scaling, seq_len=1)  # validate now
        # The cos/sin table lives on the module, one per RotaryEmbedding (no module-level state):
        # (device, compute dtype, inv_freq, attention_factor) -> cos, sin of (length, rotary_dim/2)
        self._cache: tuple[tuple[Any, ...], torch.Tensor, torch.Tensor] | None = None

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of the angles at ``positions`` (``(seq,)``), each ``(seq, rotary_dim // 2)``.

        Multiplied by the scaling's attention factor, in the compute dtype for input ``dtype``
        (float64 for float64, else float32), on the device of ``positions``. Integer positions
        are served from the cache.
        """
        positions = _check_positions(positions, None, None)
        compute = compute_dtype(dtype)
        length = context_length(positions)
        inv_freq, attention_factor = rope_parameters(
            self.rotary_dim, self.base, self.scaling, seq_len=length
        )
        if positions.is_floating_point():
            return rope_cos_sin(positions, inv_freq, attention_factor, compute)
        key = (positions.device, compute, tuple(inv_freq.tolist()), float(attention_factor))
        if self._cache is None or self._cache[0] != key or len(self._cache[1]) < length:
            table = torch.arange(length, device=positions.device)  # positions 0 .. length-1
            self._cache = (key, *rope_cos_sin(table, inv_freq, attention_factor, compute))
        _, cos, sin = self._cache
        return cos[positions], sin[positions]

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q`` and ``k`` (each ``(..., seq, dim)``) by ``positions`` (``(seq,)``)."""
        q, k = _check_x("q", q), _check_x("k", k)
        for name, t in (("q", q), ("k", k)):
            if t.shape[-1] != self.dim:
                raise ValueError(f"{name} has last dim {t.shape[-1]}, expected dim={self.dim}")
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(
                f"q and k have different sequence lengths: q {tuple(q.shape)}, k {tuple(k.shape)}"
            )
        if q.dtype != k.dtype or q.device != k.device:
            raise ValueError(
                f"q and k differ: q {q.dtype} on {q.device}, k {k.dtype} on {k.device}"
            )
        positions = _check_positions(positions, q.shape[-2], q.device)
        cos, sin = self.cos_sin(positions, q.dtype)
        return _rotate(q, cos, sin, self.layout), _rotate(k, cos, sin, self.layout)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"layout={self.layout!r}, scaling={self.scaling}"
        )
