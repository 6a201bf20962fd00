"""The Triton kernel of ``rope_tutor.triton_rope`` against Part II's reference, in the interpreter.

Not collected by itself (its name does not start with ``test_``): ``test_triton_rope.py`` runs it
in a subprocess with ``TRITON_INTERPRET=1``, which must be set before triton is imported, so that
no other test sees the interpreter. There the kernel runs, program by program, on CPU tensors:
the same kernel source as on a GPU, the same arguments, strides and masks.

The kernel and ``apply_rope`` share the float32 angles and the attention factor; they differ in
the order of the arithmetic and, in bfloat16 and float16, only in where the single rounding
happens. So they agree to a few units in the last place of float32, plus one unit of a
low-precision dtype (the bound of ``tests/test_fast.py``).
"""

from __future__ import annotations

import os

import pytest
import torch
from rope_cases import SCALINGS, assert_agree, gaussian

import rope_tutor as rt
from rope_tutor import rope_kernel, triton_rope
from rope_tutor.rope import apply_rope
from rope_tutor.triton_rope import apply_rope_qk, apply_rope_triton

if os.environ.get("TRITON_INTERPRET") != "1":  # pragma: no cover - guarded by the caller
    pytest.skip("run by test_triton_rope.py with TRITON_INTERPRET=1", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LAYOUTS = ["half", "interleaved"]


def reference_rows(x: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """``apply_rope`` per batch element with its row of ``(batch, seq)`` positions."""
    return torch.stack([apply_rope(x[b], positions[b], **kwargs) for b in range(x.shape[0])])


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Every launch of the kernel, recorded (so a test can tell the kernel ran, and how often)."""
    calls: list[dict] = []
    original = rope_kernel.launch

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(rope_kernel, "launch", counting)
    return calls


# -- the kernel equals the reference -------------------------------------------------------------


@pytest.mark.parametrize("mode", ["new", "out", "inplace"])
@pytest.mark.parametrize("rotary_dim", [None, 12, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_q_and_k_agree_with_reference(layout, dtype, rotary_dim, mode, launches) -> None:
    q = gaussian(2, 4, 7, 16, seed=1, dtype=dtype)  # grouped-query: 4 query heads, 2 key heads
    k = gaussian(2, 2, 7, 16, seed=2, dtype=dtype)
    positions = torch.arange(7) * 211  # up to 1266
    kwargs = {"layout": layout, "rotary_dim": rotary_dim}
    expected = [apply_rope(t, positions, **kwargs) for t in (q, k)]
    q_in, k_in = q.clone(), k.clone()
    if mode == "new":
        got = apply_rope_qk(q_in, k_in, positions, **kwargs)
        assert torch.equal(q_in, q) and torch.equal(k_in, k)  # inputs untouched
    elif mode == "out":
        outs = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
        got = apply_rope_qk(q_in, k_in, positions, **kwargs, out_q=outs[0], out_k=outs[1])
        assert got[0] is outs[0] and got[1] is outs[1]
    else:
        got = apply_rope_qk(q_in, k_in, positions, **kwargs, inplace=True)
        assert got[0] is q_in and got[1] is k_in
    assert len(launches) == 1  # q and k in one launch
    for g, e, x in zip(got, expected, (q, k), strict=True):
        assert_agree(g, e, x)
        if rotary_dim == 8:  # the features past rotary_dim are copied exactly
            assert torch.equal(g[..., 8:], x[..., 8:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", list(SCALINGS))
def test_every_scaling_method(name, layout, dtype) -> None:
    q = gaussian(1, 3, 50, 20, seed=3, dtype=dtype)
    k = gaussian(1, 1, 50, 20, seed=4, dtype=dtype)  # multi-query: one key head
    positions = torch.arange(50) * 3  # up to 147: past the trained window of 32
    kwargs = {"base": 500.0, "layout": layout, "scaling": SCALINGS[name], "rotary_dim": 16}
    got = apply_rope_qk(q, k, positions, **kwargs)
    for g, x in zip(got, (q, k), strict=True):
        assert_agree(g, apply_rope(x, positions, **kwargs), x)


@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1), (1, 3)], ids=str)
@pytest.mark.parametrize("seq", [1, 5, 33])
def test_head_counts_and_odd_lengths(heads, seq) -> None:
    q = gaussian(3, heads[0], seq, 16, seed=5)
    k = gaussian(3, heads[1], seq, 16, seed=6)
    got = apply_rope_qk(q, k)  # positions None: 0 .. seq - 1
    positions = torch.arange(seq)
    assert_agree(got[0], apply_rope(q, positions), q)
    assert_agree(got[1], apply_rope(k, positions), k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["int", "float"])
def test_positions_per_sequence_row_by_row(kind, layout, dtype) -> None:
    # Batched decode at different lengths: Hugging Face's position_ids, one row per sequence.
    q = gaussian(3, 4, 6, 16, seed=7, dtype=dtype)
    k = gaussian(3, 2, 6, 16, seed=8, dtype=dtype)
    generator = torch.Generator().manual_seed(9)
    positions = torch.randint(0, 3000, (3, 6), generator=generator)
    if kind == "float":
        positions = positions / 7.0
    got = apply_rope_qk(q, k, positions, layout=layout, scaling=SCALINGS["yarn"], rotary_dim=12)
    kwargs = {"layout": layout, "scaling": SCALINGS["yarn"], "rotary_dim": 12}
    assert_agree(got[0], reference_rows(q, positions, **kwargs), q)
    assert_agree(got[1], reference_rows(k, positions, **kwargs), k)
    # a row of (seq,) positions means the same row for every sequence
    shared = apply_rope_qk(q, k, positions[1], **kwargs)
    assert_agree(shared[0], apply_rope(q, positions[1], **kwargs), q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_non_contiguous_inputs_and_outputs(layout, dtype) -> None:
    # (batch, seq, heads, dim) transposed to (batch, heads, seq, dim), as in HF models.
    q = gaussian(2, 9, 4, 16, seed=10, dtype=dtype).transpose(1, 2)
    k = gaussian(2, 9, 2, 16, seed=11, dtype=dtype).transpose(1, 2)
    # every other feature of a wider tensor: stride 2 in the last dim
    k_strided = gaussian(2, 2, 9, 32, seed=12, dtype=dtype)[..., ::2]
    positions = torch.arange(9) + 100
    for kk in (k, k_strided):
        assert not q.is_contiguous() and not kk.is_contiguous()
        # KV-cache-like destinations: transposed slices of larger buffers
        cache_q = torch.zeros(2, 12, 4, 16, dtype=dtype)
        cache_k = torch.zeros(2, 12, 2, 16, dtype=dtype)
        out_q, out_k = cache_q[:, 2:11].transpose(1, 2), cache_k[:, 2:11].transpose(1, 2)
        apply_rope_qk(q, kk, positions, layout=layout, out_q=out_q, out_k=out_k)
        assert_agree(out_q, apply_rope(q, positions, layout=layout), q)
        assert_agree(out_k, apply_rope(kk, positions, layout=layout), kk)
        for cache in (cache_q, cache_k):  # nothing else written
            assert not cache[:, :2].any() and not cache[:, 11:].any()
        new = apply_rope_qk(q, kk, positions, layout=layout)
        assert_agree(new[1], apply_rope(kk, positions, layout=layout), kk)


def test_one_tensor_of_any_rank(launches) -> None:
    positions = torch.arange(5) * 3
    for shape in [(5, 16), (3, 5, 16), (2, 3, 5, 16), (2, 3, 2, 5, 16)]:
        x = gaussian(*shape, seed=13)
        assert_agree(apply_rope_triton(x, positions), apply_rope(x, positions), x)
    # a 5-D tensor whose leading dims do not merge as a view: rotated, then copied into out
    x = gaussian(2, 3, 2, 5, 16, seed=14).permute(1, 0, 2, 3, 4)
    out = torch.empty(2, 3, 2, 5, 16).permute(1, 0, 2, 3, 4)
    assert apply_rope_triton(x, positions, out=out) is out
    assert_agree(out, apply_rope(x, positions), x)
    inplace = x.clone()
    assert apply_rope_triton(inplace, positions, inplace=True) is inplace
    assert_agree(inplace, apply_rope(x, positions), x)
    assert len(launches) == 6  # four ranks, out=, in place


def test_empty_sequence_and_batch() -> None:
    for shape in [(2, 4, 0, 16), (0, 4, 3, 16)]:
        q, k = torch.zeros(shape), torch.zeros(shape[0], 1, *shape[2:])
        got = apply_rope_qk(q, k)
        assert got[0].shape == q.shape and got[1].shape == k.shape


# -- the backward: the same kernel turning by -theta ---------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 8])
def test_gradcheck(layout, rotary_dim) -> None:
    # float32 (float64 takes the reference path); the map is linear, so finite differences with
    # a large step are exact up to float32 rounding. yarn: an attention factor other than 1.
    q = gaussian(1, 2, 5, 12, seed=15).requires_grad_()
    k = gaussian(1, 1, 5, 12, seed=16).requires_grad_()
    positions = torch.tensor([[0, 3, 9, 27, 81]])
    settings = {"layout": layout, "rotary_dim": rotary_dim, "scaling": SCALINGS["yarn"]}

    def function(a, b):
        return apply_rope_qk(a, b, positions, **settings)

    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(
            function, (q, k), eps=1e-2, atol=2e-3, rtol=1e-3, fast_mode=True
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_equals_reference_backward(layout, dtype, launches) -> None:
    q = gaussian(2, 4, 6, 16, seed=17, dtype=dtype).requires_grad_()
    k = gaussian(2, 2, 6, 16, seed=18, dtype=dtype).requires_grad_()
    q_ref, k_ref = (t.detach().clone().requires_grad_() for t in (q, k))
    positions = torch.tensor([[1, 2, 3, 4, 5, 6], [40, 41, 42, 43, 44, 45]])
    kwargs = {"layout": layout, "rotary_dim": 12, "scaling": SCALINGS["yarn"]}
    grad_q = gaussian(2, 4, 6, 16, seed=19, dtype=dtype)
    grad_k = gaussian(2, 2, 6, 16, seed=20, dtype=dtype)
    q_rot, k_rot = apply_rope_qk(q, k, positions, **kwargs)
    torch.autograd.backward((q_rot, k_rot), (grad_q, grad_k))
    assert len(launches) == 2  # forward and backward, each one launch
    assert launches[1]["conjugate"] and not launches[0]["conjugate"]
    torch.autograd.backward(
        (reference_rows(q_ref, positions, **kwargs), reference_rows(k_ref, positions, **kwargs)),
        (grad_q, grad_k),
    )
    assert_agree(q.grad, q_ref.grad, grad_q)
    assert_agree(k.grad, k_ref.grad, grad_k)


def test_backward_of_out_and_of_one_output() -> None:
    q = gaussian(1, 2, 4, 8, seed=21).requires_grad_()
    k = gaussian(1, 2, 4, 8, seed=22).requires_grad_()
    out_q, out_k = torch.empty(1, 2, 4, 8), torch.empty(1, 2, 4, 8)
    got = apply_rope_qk(q, k, out_q=out_q, out_k=out_k)
    assert got[0] is out_q and out_q.requires_grad  # autograd saw one copy into out_q
    got[0].sum().backward()  # k's output unused: its gradient is zero
    expected = torch.autograd.grad(apply_rope(q, torch.arange(4)).sum(), q)[0]
    assert_agree(q.grad, expected, q.detach())
    assert k.grad is None or not k.grad.any()


# -- the paths around the kernel ------------------------------------------------------------------


def test_float64_takes_the_reference_path(launches) -> None:
    q, k = gaussian(1, 2, 3, 8, dtype=torch.float64), gaussian(1, 1, 3, 8, dtype=torch.float64)
    got = apply_rope_qk(q, k, torch.arange(3))
    assert launches == []  # no kernel: the reference computes float64
    torch.testing.assert_close(got[0], apply_rope(q, torch.arange(3)), rtol=0, atol=0)


def test_fast_path_on_the_cpu_is_unchanged(launches) -> None:
    x = gaussian(1, 2, 3, 8)
    rt.apply_rope_fast(x, torch.arange(3))
    assert launches == []  # apply_rope_fast sends only CUDA tensors to the kernel


def test_bad_positions_raise_like_apply_rope() -> None:
    q, k = gaussian(1, 2, 3, 8), gaussian(1, 1, 3, 8)
    for bad in ([0, -1, 2], [0.0, float("nan"), 1.0], [0.0, float("inf"), 1.0]):
        with pytest.raises(ValueError) as reference:
            apply_rope(q, torch.tensor(bad))
        with pytest.raises(ValueError) as kernel:
            apply_rope_qk(q, k, torch.tensor(bad))
        assert str(kernel.value) == str(reference.value)
    with pytest.raises(ValueError, match="finite and >= 0"):
        apply_rope_qk(q, k, torch.tensor([[0, 1, -2]]))


def test_length_dependent_methods_read_the_length() -> None:
    # Dynamic NTK and LongRoPE change their frequencies past the window of 32: the kernel sees
    # the frequencies of the largest position + 1, as apply_rope does.
    q, k = gaussian(1, 1, 3, 16, seed=23), gaussian(1, 1, 3, 16, seed=24)
    for name in ("dynamic", "longrope"):
        short = torch.tensor([0, 1, 2])
        long = torch.tensor([0, 1, 200])
        kwargs = {"scaling": SCALINGS[name]}
        got_short = apply_rope_qk(q, k, short, **kwargs)[0]
        got_long = apply_rope_qk(q, k, long, **kwargs)[0]
        assert_agree(got_short, apply_rope(q, short, **kwargs), q)
        assert_agree(got_long, apply_rope(q, long, **kwargs), q)
        assert not torch.allclose(got_short[..., 1, :], got_long[..., 1, :])  # position 1 moved
    assert triton_rope.LENGTH_DEPENDENT == {"dynamic", "longrope"}


def test_tile_shapes() -> None:
    # one program's tile: every pair of a head, up to 16 positions, about TILE_PAIRS pairs
    assert rope_kernel.tile_shape(32, 1, 64) == (32, 1, 64)  # a decode step: all heads at once
    assert rope_kernel.tile_shape(32, 8192, 64) == (2, 16, 64)  # prefill: 2 heads x 16 rows
    assert rope_kernel.tile_shape(3, 5, 6) == (4, 8, 8)  # powers of two, masked past the sizes
    for heads, seq, half in [(32, 1, 64), (32, 8192, 64), (8, 4096, 32), (1, 3, 128)]:
        block_h, block_s, block_half = rope_kernel.tile_shape(heads, seq, half)
        assert block_half >= half and block_h * block_s * block_half <= rope_kernel.TILE_PAIRS


@pytest.mark.parametrize("table", [False, True], ids=["sin-cos computed", "cos-sin table"])
@pytest.mark.parametrize("tile", [None, (1, 1), (4, 2), (8, 4)], ids=str)
def test_launch_options_agree_with_reference(tile, table) -> None:
    # The benchmark's alternatives (rope_tutor.gpu_bench --explore) compute the same values: any
    # tile, and f cos / f sin read from tables at the integer positions instead of computed.
    q, k = gaussian(2, 4, 7, 16, seed=3), gaussian(2, 2, 7, 16, seed=4)
    positions = torch.tensor([[0, 5, 9, 100, 2047, 3, 1], [7, 7, 7, 7, 7, 7, 0]])
    scaling = SCALINGS["yarn"]  # an attention factor other than 1
    inv_freq, factor = triton_rope.device_parameters(16, 10000.0, scaling, torch.device("cpu"))
    assert factor != 1.0
    tables = None
    if table:
        angles = torch.arange(2048, dtype=torch.float32)[:, None] * inv_freq
        tables = (angles.cos() * factor).contiguous(), (angles.sin() * factor).contiguous()
    out_q, out_k = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    rope_kernel.launch(
        q, k, out_q, out_k, positions, inv_freq, factor, interleaved=False, table=tables, tile=tile
    )
    for got, x in ((out_q, q), (out_k, k)):
        assert_agree(got, reference_rows(x, positions, scaling=scaling), x)


def test_the_kernels_sin_and_cos_agree_with_float64_to_float32_rounding() -> None:
    # rope_kernel._sin_cos (one float64 range reduction, Cephes' float32 polynomials) against the
    # exact sine and cosine of the same float32 angles: within 2 units in the last place of
    # float32 at 1 (2.4e-7), as torch's float32 sin and cos are, for angles up to 2e6 radians
    # (position 2 million at the fastest pair).
    import triton
    import triton.language as tl

    @triton.jit
    def sin_cos_kernel(X, S, C, N: tl.constexpr):
        i = tl.arange(0, N)
        s, c = rope_kernel._sin_cos(tl.load(X + i))
        tl.store(S + i, s)
        tl.store(C + i, c)

    generator = torch.Generator().manual_seed(5)
    n = 1 << 14
    scales = torch.tensor([1.0, 10.0, 8192.0, 2e6]).repeat_interleave(n // 4)
    x = (torch.rand(n, generator=generator, dtype=torch.float64) * scales).float()
    x[:8] = torch.tensor([0.0, 0.7853982, 1.5707964, 3.1415927, 4.712389, 6.2831855, 1e-30, 2e6])
    s, c = torch.empty_like(x), torch.empty_like(x)
    sin_cos_kernel[(1,)](x, s, c, n)
    exact = x.double()
    bound = 2 * torch.finfo(torch.float32).eps
    assert (s.double() - exact.sin()).abs().max() <= bound
    assert (c.double() - exact.cos()).abs().max() <= bound
