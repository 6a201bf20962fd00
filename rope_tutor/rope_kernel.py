"""Part VI: the Triton kernel that rotates q and k in one launch, and its thin launcher.

Chapter "Making RoPE fast", the GPU half. Equation (rope-elementwise) of "Deriving rotary
position embedding" (Su et al., RoFormer, 2021), for every pair ``i < r/2`` of every head of q
and of k at sequence position ``s`` of batch element ``b``::

    angle = m[b, s] * theta_i                              (float32; m = positions)
    c, s  = f * cos(angle), f * sin(angle)                 (f: the attention factor)
    out1  = x1 * c - x2 * s,   out2 = x2 * c + x1 * s      (float32, rounded once to x's dtype)

with the pair ``(x1, x2) = (x[i], x[i + r/2])`` in the half layout and ``(x[2i], x[2i+1])`` in
the interleaved one; features ``r .. dim - 1`` are copied. With ``CONJUGATE`` the kernel turns by
``-angle``: since ``f R(theta)`` has the transpose ``f R(-theta)``, that is the backward pass.

This module imports triton at its top, so nothing in the package imports it at import time: the
wrapper (``rope_tutor.triton_rope``) imports it on the first call that needs the kernel. Under
``TRITON_INTERPRET=1`` (set before triton is imported), the same kernel runs on CPU tensors in
Triton's interpreter; the tests check it there against the reference ``apply_rope``.

The layout of the work follows flash-attn's ``ops/triton/rotary.py`` (Tri Dao), with q and k in
one grid: each program loads one tile of ``BLOCK_H`` heads x ``BLOCK_S`` positions x all pairs
of one batch element, of q or of k, forms its angles from the positions and ``inv_freq`` (no
cos/sin table is built or read), and writes the tile once. Every element is read once and written
once, so the kernel moves the bytes of a copy of q and k.

Angles in the kernel rather than a cached cos/sin table: on an H100 (2026-11-26, the runs in
``results/gpu/rope_cuda_h100_2026-11-26_*.json``) the kernel launched alone reached 94 to 95 % of
the copy's bandwidth at the large prefill computing them, and 88 to 89 % reading tables; computing
them needs no table to build, keep, read or size to the longest position, so a decode step costs
one launch. sin and cos are ``_sin_cos``'s: one range reduction in float64 for both, then
single-precision polynomials, within a few units in the last place of float32 for any angle a model
reaches. libdevice's ``sinf`` and ``cosf`` (``tl.sin``, ``tl.cos``) were as accurate but, each with
its own reduction and an inlined slow path for huge angles, held bfloat16 to 75 % of the copy's
bandwidth in the first of those runs; the approximate hardware instructions are never used, since
their error grows with the angle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["launch", "rope_qk_kernel", "tile_shape"]

#: Pairs (``BLOCK_H * BLOCK_S * BLOCK_HALF``) per program: a tile of 2 * 2048 elements, 16 KiB of
#: float32, which four warps hold in registers (32 elements per thread).
TILE_PAIRS = 2048
#: Warps per program.
NUM_WARPS = 4


#: sin and cos on [-pi/4, pi/4]: the single-precision minimax polynomials of Cephes (Moshier),
#: ``sinf``/``cosf``, accurate to about one unit in the last place of float32 there.
_S1 = tl.constexpr(-1.6666654611e-1)
_S2 = tl.constexpr(8.3321608736e-3)
_S3 = tl.constexpr(-1.9515295891e-4)
_C1 = tl.constexpr(4.166664568298827e-2)
_C2 = tl.constexpr(-1.388731625493765e-3)
_C3 = tl.constexpr(2.443315711809948e-5)


@triton.jit
def _sin_cos(angle):
    """``(sin(angle), cos(angle))`` of a float32 tensor: one range reduction for both.

    ``angle = k * pi/2 + r`` with ``|r| <= pi/4`` (k and r computed in float64, so that the
    reduction is exact to float32's precision for any position a model reaches), then the two
    polynomials at ``r``, swapped and negated by the quadrant ``k mod 4``. A few dozen
    instructions and no branch, where libdevice's ``sinf`` and ``cosf`` each reduce the angle
    again and carry a slow path (Payne-Hanek) for huge angles that bloats the kernel's code.
    """
    x = angle.to(tl.float64)
    k = tl.floor(x * 0.6366197723675814 + 0.5)  # 2 / pi; k = round(angle / (pi/2))
    r = (x - k * 1.5707963267948966).to(tl.float32)
    z = r * r
    sin_r = r + r * z * (_S1 + z * (_S2 + z * _S3))
    cos_r = 1.0 - 0.5 * z + z * z * (_C1 + z * (_C2 + z * _C3))
    quadrant = k.to(tl.int32) & 3
    swap = (quadrant & 1) == 1  # quadrants 1 and 3: sin and cos trade places
    sin = tl.where(swap, cos_r, sin_r)
    cos = tl.where(swap, sin_r, cos_r)
    sin = tl.where(quadrant >= 2, -sin, sin)  # quadrants 2 and 3: sin < 0 ...
    cos = tl.where((quadrant == 1) | (quadrant == 2), -cos, cos)  # ... quadrants 1 and 2: cos < 0
    return sin, cos


@triton.jit
def _rotate_tile(
    X,
    OUT,
    stride_xb,
    stride_xh,
    stride_xs,
    stride_xd,
    stride_ob,
    stride_oh,
    stride_os,
    stride_od,
    b,
    h0,
    heads,
    rows,
    row_ok,
    pairs,
    pair_ok,
    cos,
    sin,
    HALF: tl.constexpr,
    REST: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    COPY_REST: tl.constexpr,
):
    """Rotate heads ``h0 .. h0 + BLOCK_H - 1`` (those < ``heads``) at ``rows`` of batch ``b``."""
    hs = h0 + tl.arange(0, BLOCK_H)
    # (BLOCK_H, BLOCK_S) offsets of each row's first feature, in int64 (large tensors)
    x_row = b.to(tl.int64) * stride_xb + hs[:, None].to(tl.int64) * stride_xh
    x_row += rows[None, :].to(tl.int64) * stride_xs
    o_row = b.to(tl.int64) * stride_ob + hs[:, None].to(tl.int64) * stride_oh
    o_row += rows[None, :].to(tl.int64) * stride_os
    ok = (hs[:, None] < heads) & row_ok[None, :]
    dtype = OUT.dtype.element_ty
    c = cos[None, :, :]
    s = sin[None, :, :]
    if INTERLEAVED:  # pair i: features 2i and 2i + 1, loaded as one contiguous row, then split
        features = tl.arange(0, 2 * BLOCK_HALF)
        row_mask = ok[:, :, None] & (features < 2 * HALF)[None, None, :]
        x = tl.load(
            X + x_row[:, :, None] + features[None, None, :] * stride_xd, mask=row_mask, other=0.0
        )
        x1, x2 = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_H, BLOCK_S, BLOCK_HALF, 2)))
        out = tl.join(x1 * c - x2 * s, x2 * c + x1 * s)  # (..., BLOCK_HALF, 2): pairs again
        out = tl.reshape(out, (BLOCK_H, BLOCK_S, 2 * BLOCK_HALF))
        where = o_row[:, :, None] + features[None, None, :] * stride_od
        tl.store(OUT + where, out.to(dtype), mask=row_mask)
    else:  # pair i: features i and i + r/2, two contiguous halves
        mask = ok[:, :, None] & pair_ok[None, None, :]
        first = x_row[:, :, None] + pairs[None, None, :] * stride_xd
        second = x_row[:, :, None] + (pairs + HALF)[None, None, :] * stride_xd
        x1 = tl.load(X + first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(X + second, mask=mask, other=0.0).to(tl.float32)
        out_first = o_row[:, :, None] + pairs[None, None, :] * stride_od
        out_second = o_row[:, :, None] + (pairs + HALF)[None, None, :] * stride_od
        tl.store(OUT + out_first, (x1 * c - x2 * s).to(dtype), mask=mask)
        tl.store(OUT + out_second, (x2 * c + x1 * s).to(dtype), mask=mask)
    if COPY_REST:  # the features past rotary_dim pass through (not needed in place)
        rest = tl.arange(0, BLOCK_REST)
        rest_mask = ok[:, :, None] & (rest < REST)[None, None, :]
        feature = 2 * HALF + rest
        kept = tl.load(
            X + x_row[:, :, None] + feature[None, None, :] * stride_xd, mask=rest_mask, other=0.0
        )
        tl.store(OUT + o_row[:, :, None] + feature[None, None, :] * stride_od, kept, mask=rest_mask)


@triton.jit
def rope_qk_kernel(
    Q,
    K,
    OUT_Q,
    OUT_K,
    POSITIONS,
    INV_FREQ,
    COS_TABLE,
    SIN_TABLE,
    attention_factor,
    seq_len,
    q_heads,
    k_heads,
    q_chunks,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_kd,
    stride_oqb,
    stride_oqh,
    stride_oqs,
    stride_oqd,
    stride_okb,
    stride_okh,
    stride_oks,
    stride_okd,
    stride_pb,
    stride_ps,
    HALF: tl.constexpr,
    REST: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    CONJUGATE: tl.constexpr,
    HAS_POSITIONS: tl.constexpr,
    COPY_REST: tl.constexpr,
    TABLE: tl.constexpr,
    CHECK_POSITIONS: tl.constexpr,
):
    """RoPE on q and k, ``(batch, heads, seq, dim)`` each, in one grid.

    Grid ``(cdiv(seq, BLOCK_S), batch, q_chunks + cdiv(k_heads, BLOCK_H))``: axis 2 below
    ``q_chunks = cdiv(q_heads, BLOCK_H)`` picks a chunk of q's heads, above it one of k's (k may
    have fewer heads, as in grouped-query attention). ``POSITIONS`` (any int or float dtype) is
    read at ``b * stride_pb + s * stride_ps`` (``stride_pb = 0`` for one ``(seq,)`` row shared
    by the batch); without ``HAS_POSITIONS`` the position of row ``s`` is ``s``. ``INV_FREQ`` is
    float32 ``(HALF,)``; ``attention_factor`` multiplies cos and sin.
    """
    pid_s = tl.program_id(0)
    b = tl.program_id(1)
    pid_h = tl.program_id(2)
    rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    row_ok = rows < seq_len
    pairs = tl.arange(0, BLOCK_HALF)
    pair_ok = pairs < HALF
    if HAS_POSITIONS:
        where = b.to(tl.int64) * stride_pb + rows.to(tl.int64) * stride_ps
        p = tl.load(POSITIONS + where, mask=row_ok, other=0)
    else:
        p = rows
    if TABLE:  # the measured alternative: f cos and f sin read from (positions, HALF) tables
        at = p.to(tl.int64)[:, None] * HALF + pairs[None, :]
        table_ok = row_ok[:, None] & pair_ok[None, :]
        cos = tl.load(COS_TABLE + at, mask=table_ok, other=0.0)
        sin = tl.load(SIN_TABLE + at, mask=table_ok, other=0.0)
    else:
        m = p.to(tl.float32)
        if CHECK_POSITIONS:  # a device-side assert (no host sync); compiled in with debug=True
            tl.device_assert((m >= 0) & (m < float("inf")), "positions must be finite and >= 0")
        theta = tl.load(INV_FREQ + pairs, mask=pair_ok, other=0.0)
        angle = m[:, None] * theta[None, :]  # (BLOCK_S, BLOCK_HALF), float32 as in apply_rope
        sin, cos = _sin_cos(angle)
        cos = cos * attention_factor
        sin = sin * attention_factor
    if CONJUGATE:  # the transpose of the rotation: the backward pass
        sin = -sin
    if pid_h < q_chunks:
        _rotate_tile(
            Q, OUT_Q, stride_qb, stride_qh, stride_qs, stride_qd,
            stride_oqb, stride_oqh, stride_oqs, stride_oqd,
            b, pid_h * BLOCK_H, q_heads, rows, row_ok, pairs, pair_ok, cos, sin,
            HALF, REST, BLOCK_H, BLOCK_S, BLOCK_HALF, BLOCK_REST, INTERLEAVED, COPY_REST,
        )  # fmt: skip
    else:
        _rotate_tile(
            K, OUT_K, stride_kb, stride_kh, stride_ks, stride_kd,
            stride_okb, stride_okh, stride_oks, stride_okd,
            b, (pid_h - q_chunks) * BLOCK_H, k_heads, rows, row_ok, pairs, pair_ok, cos, sin,
            HALF, REST, BLOCK_H, BLOCK_S, BLOCK_HALF, BLOCK_REST, INTERLEAVED, COPY_REST,
        )  # fmt: skip


def tile_shape(heads: int, seq: int, half: int) -> tuple[int, int, int]:
    """``(BLOCK_H, BLOCK_S, BLOCK_HALF)`` for these sizes: about ``TILE_PAIRS`` pairs a program.

    All the pairs of a head in one tile (``BLOCK_HALF``, a power of two >= ``half``); then as many
    positions as fit, at most 16 (a decode step has one); then heads, up to the larger head count.
    """
    block_half = _power_of_2(half)
    block_s = max(1, min(_power_of_2(seq), 16, TILE_PAIRS // block_half))
    block_h = max(1, min(_power_of_2(heads), TILE_PAIRS // (block_half * block_s)))
    return block_h, block_s, block_half


# Plain integer arithmetic on the host: triton.cdiv and triton.next_power_of_2 are jit functions,
# and each call of one from Python costs microseconds, which a decode step cannot spare.
def _power_of_2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``)."""
    return 1 << max(n - 1, 0).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch(
    q: torch.Tensor,
    k: torch.Tensor | None,
    out_q: torch.Tensor,
    out_k: torch.Tensor | None,
    positions: torch.Tensor | None,
    inv_freq: torch.Tensor,
    attention_factor: float,
    *,
    interleaved: bool,
    in_place: bool = False,
    conjugate: bool = False,
    check_positions: bool = True,
    table: tuple[torch.Tensor, torch.Tensor] | None = None,
    tile: tuple[int, int] | None = None,
    num_warps: int = NUM_WARPS,
) -> None:
    """One launch of ``rope_qk_kernel``: rotate ``q`` into ``out_q`` and ``k`` into ``out_k``.

    ``q`` and ``out_q`` are ``(batch, q_heads, seq, dim)``, ``k`` and ``out_k`` ``(batch,
    k_heads, seq, dim)`` (or both None), any strides, one dtype (float32, bfloat16 or float16),
    on one device; ``out_q`` may be ``q`` itself (in place), likewise ``out_k``. ``positions`` is
    ``(batch, seq)`` (a row per batch element; stride 0 along batch shares one row) or None for
    ``0 .. seq - 1``. ``inv_freq`` is float32 ``(r/2,)`` on the device, ``r`` the rotated
    features; ``attention_factor`` multiplies cos and sin. ``in_place`` says that ``out_q`` is
    ``q`` and ``out_k`` is ``k`` (the features past ``r`` are then left alone); ``conjugate``
    turns by minus the angle (the backward). Checks nothing on the host: the wrapper
    (``rope_tutor.triton_rope``) has. On a GPU, ``check_positions`` compiles in a device-side
    assert that every position is finite and >= 0 (a failure surfaces at the next
    synchronisation as "device-side assert triggered"); Triton's interpreter skips it.

    For measurement (the benchmark's alternatives): ``table`` = ``(f cos, f sin)``, float32
    ``(positions, r/2)`` contiguous tables, read at the integer positions instead of computing
    sin and cos; ``tile`` = ``(BLOCK_H, BLOCK_S)`` instead of ``tile_shape``'s; ``num_warps``.
    """
    batch, q_heads, seq, dim = q.shape
    half = inv_freq.shape[0]
    rest = dim - 2 * half
    k_heads = 0 if k is None else k.shape[1]
    if k is None:  # a grid with no chunk of k; the k arguments are never read
        k, out_k = q, out_q
    block_h, block_s, block_half = tile_shape(max(q_heads, k_heads), seq, half)
    if tile is not None:
        block_h, block_s = tile
    q_chunks = _cdiv(q_heads, block_h)
    grid = (_cdiv(seq, block_s), batch, q_chunks + _cdiv(k_heads, block_h))
    if positions is None:
        pos_arg, pos_strides = inv_freq, (0, 0)  # never read
    else:
        pos_arg, pos_strides = positions, positions.stride()
    cos_table, sin_table = (inv_freq, inv_freq) if table is None else table  # read with TABLE
    check = check_positions and positions is not None and table is None
    copy_rest = rest > 0 and not in_place
    options = {"debug": True, "sanitize_overflow": False} if check else {}
    rope_qk_kernel[grid](
        q, k, out_q, out_k, pos_arg, inv_freq, cos_table, sin_table, float(attention_factor),
        seq, q_heads, k_heads, q_chunks,
        *q.stride(), *k.stride(), *out_q.stride(), *out_k.stride(), *pos_strides,
        HALF=half, REST=rest, BLOCK_H=block_h, BLOCK_S=block_s, BLOCK_HALF=block_half,
        BLOCK_REST=_power_of_2(rest),
        INTERLEAVED=interleaved, CONJUGATE=conjugate, HAS_POSITIONS=positions is not None,
        COPY_REST=copy_rest, TABLE=table is not None, CHECK_POSITIONS=check,
        num_warps=num_warps, **options,
    )  # fmt: skip
