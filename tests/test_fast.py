"""Part VI: ``apply_rope_fast`` against Part II's reference ``apply_rope`` and Hugging Face.

The two functions share their checks and their cos/sin (the same float32 or float64 angles);
they differ in the order of the arithmetic and, for bfloat16 and float16, in nothing but where
the single rounding happens. So they must agree to a few units in the last place of the compute
dtype, and, in a low-precision dtype, to one unit of that dtype.
"""

from __future__ import annotations

import pytest
import torch
from rope_cases import SCALINGS, assert_agree, gaussian

import rope_tutor as rt
from rope_tutor.fast import apply_rope_fast
from rope_tutor.rope import apply_rope

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
LAYOUTS = ["half", "interleaved"]

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("rotary_dim", [None, 16, 8])
@pytest.mark.parametrize("with_out", [False, True], ids=["new", "out"])
def test_fast_agrees_with_reference(dtype, layout, rotary_dim, with_out, device) -> None:
    x = gaussian(2, 3, 40, 16, seed=1, dtype=dtype)
    positions = torch.arange(40) * 37  # up to 1443
    reference = apply_rope(x, positions, layout=layout, rotary_dim=rotary_dim)  # on the CPU
    x_on, positions_on = x.to(device), positions.to(device)
    out = torch.full_like(x_on, float("nan")) if with_out else None
    fast = apply_rope_fast(x_on, positions_on, layout=layout, rotary_dim=rotary_dim, out=out)
    assert fast.device == x_on.device
    assert_agree(fast.cpu(), reference, x)
    if with_out:
        assert fast is out
    if rotary_dim == 8:  # the pass-through features are copied exactly
        assert torch.equal(fast[..., 8:].cpu(), x[..., 8:])


@pytest.mark.parametrize("name", list(SCALINGS))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fast_agrees_with_reference_for_every_scaling(name, layout, dtype, device) -> None:
    x = gaussian(1, 2, 50, 20, seed=2, dtype=dtype)
    positions = torch.arange(50) * 3  # up to 147: past the trained window of 32
    kwargs = {"base": 500.0, "layout": layout, "scaling": SCALINGS[name], "rotary_dim": 16}
    reference = apply_rope(x, positions, **kwargs)  # on the CPU
    x_on, positions_on = x.to(device), positions.to(device)
    assert_agree(apply_rope_fast(x_on, positions_on, **kwargs).cpu(), reference, x)
    out = torch.empty_like(x_on)
    assert_agree(apply_rope_fast(x_on, positions_on, **kwargs, out=out).cpu(), reference, x)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_non_contiguous_input_and_out(layout, dtype) -> None:
    # (batch, seq, heads, head_dim) transposed to (batch, heads, seq, head_dim), as in HF models.
    x = gaussian(2, 30, 3, 16, seed=3, dtype=dtype).transpose(1, 2)
    # Every other feature of a wider tensor: stride 2 in the last dim.
    strided = gaussian(2, 3, 30, 32, seed=4, dtype=dtype)[..., ::2]
    for tensor in (x, strided):
        assert not tensor.is_contiguous()
        reference = apply_rope(tensor, torch.arange(30), layout=layout)
        assert_agree(apply_rope_fast(tensor, torch.arange(30), layout=layout), reference, tensor)
        # A KV-cache-like destination: a transposed slice of a larger buffer.
        cache = torch.zeros(2, 40, 3, 16, dtype=dtype)
        out = cache[:, 5:35].transpose(1, 2)
        got = apply_rope_fast(tensor, torch.arange(30), layout=layout, out=out)
        assert got is out
        assert_agree(out, reference, tensor)
        assert torch.equal(cache[:, :5], torch.zeros_like(cache[:, :5]))  # nothing else written
        assert torch.equal(cache[:, 35:], torch.zeros_like(cache[:, 35:]))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_low_precision_blocks_cover_every_row(threads: int, layout: str) -> None:
    # 2 * 4 * 1100 * 64 = 563,200 elements: several blocks of 2**18 (1 thread) or 2**15 - 1.
    x = gaussian(2, 4, 1100, 64, seed=5, dtype=torch.bfloat16)
    positions = torch.arange(1100) * 7
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fast = apply_rope_fast(x, positions, layout=layout)
    finally:
        torch.set_num_threads(before)
    assert_agree(fast, apply_rope(x, positions, layout=layout), x)


# The comparison with Hugging Face's Llama code, with and without out=, is parametrised with
# apply_rope's in tests/test_rope.py (test_rope_matches_hf_llama).


def test_positions_default_to_zero_to_seq_minus_one() -> None:
    x = gaussian(3, 12, 8, seed=8)
    assert torch.equal(apply_rope_fast(x), apply_rope_fast(x, torch.arange(12)))


def test_input_is_not_modified_and_gradients_flow(device: str) -> None:
    for layout in LAYOUTS:
        x = gaussian(2, 10, 8, seed=9, dtype=torch.float64).to(device).requires_grad_()
        before = x.detach().clone()
        positions = torch.arange(10, device=device)
        apply_rope_fast(x, positions, layout=layout).square().sum().backward()
        assert torch.equal(x.detach(), before)
        # The rotation is orthogonal: d/dx |R x|^2 = 2 x.
        torch.testing.assert_close(x.grad, 2 * before, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_gradients_flow_into_out(layout: str, dtype: torch.dtype) -> None:
    x = gaussian(2, 10, 8, seed=10, dtype=dtype).requires_grad_()
    out = torch.empty(2, 10, 8, dtype=dtype)
    got = apply_rope_fast(x, torch.arange(10), layout=layout, out=out)
    assert got is out and out.requires_grad
    weights = gaussian(2, 10, 8, seed=11, dtype=dtype)
    (grad_fast,) = torch.autograd.grad((out * weights).sum(), x)
    reference = apply_rope(x, torch.arange(10), layout=layout)
    (grad_reference,) = torch.autograd.grad((reference * weights).sum(), x)
    assert_agree(grad_fast, grad_reference, weights)
    with pytest.raises(ValueError, match="out is a leaf tensor that requires grad"):
        apply_rope_fast(x, torch.arange(10), out=torch.empty_like(out).requires_grad_())


def test_is_exported_with_apply_ropes_keywords() -> None:
    import inspect

    assert rt.apply_rope_fast is apply_rope_fast
    reference = inspect.signature(apply_rope).parameters
    fast = inspect.signature(apply_rope_fast).parameters
    assert list(fast) == [*reference, "out"]
    for name in ("base", "layout", "scaling", "rotary_dim"):
        assert fast[name].default == reference[name].default
        assert fast[name].kind == reference[name].kind == inspect.Parameter.KEYWORD_ONLY
    assert fast["positions"].default is None and fast["out"].default is None


X = torch.zeros(2, 3, 8)


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (torch.zeros(2, 3, 6), r"out has shape \(2, 3, 6\).*expected shape \(2, 3, 8\)"),
        (torch.zeros(2, 3, 8, dtype=torch.float64), "dtype torch.float64.*expected.*float32"),
        (torch.zeros(2, 3, 8, device="meta"), "on meta.*expected.*on cpu"),
        (torch.zeros(8).expand(2, 3, 8), "out has a broadcast"),
        (X, "out overlaps x"),
        ([0.0] * 8, "out must be a tensor"),
    ],
)
def test_bad_out_raises_naming_out(out, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_rope_fast(X, torch.arange(3), out=out)


def test_overlapping_views_are_rejected_and_separate_halves_accepted() -> None:
    buffer = torch.zeros(2, 3, 16)
    x = buffer[..., :8]
    with pytest.raises(ValueError, match="out overlaps x"):
        apply_rope_fast(x, torch.arange(3), out=buffer[..., 4:12])
    out = torch.zeros(2, 3, 8)
    assert apply_rope_fast(x, torch.arange(3), out=out) is out


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"x": torch.zeros(2, 3, 7)}, r"x.shape\[-1\]=7"),
        ({"positions": torch.arange(4)}, "positions has length 4"),
        ({"layout": "neox"}, "layout='neox'"),
        ({"base": 1.0}, "base=1.0"),
        ({"rotary_dim": 10}, "rotary_dim=10"),
        ({"scaling": {"rope_type": "no-such-method"}}, "no-such-method"),
    ],
)
def test_bad_input_raises_like_apply_rope(kwargs: dict, message: str) -> None:
    arguments = {"x": X, "positions": torch.arange(3), **kwargs}
    x, positions = arguments.pop("x"), arguments.pop("positions")
    for function in (apply_rope, apply_rope_fast):
        with pytest.raises(ValueError, match=message):
            function(x, positions, **arguments)


# ----------------------------------------------------------------------------------------------
# Part VI internals: blocks and tables (added with the blocked CPU path)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("with_out", [False, True], ids=["new", "out"])
def test_blocks_cover_every_row_with_a_ragged_last_block(
    monkeypatch, threads: int, dtype, layout: str, with_out: bool
) -> None:
    from rope_tutor import fast

    # A sequence row holds 37 heads of 16 features; blocks of 3 rows over 41 rows: 14 blocks,
    # the last one of 2 rows.
    x = gaussian(1, 37, 41, 16, seed=10, dtype=dtype)
    monkeypatch.setattr(fast, "BLOCK_ELEMENTS", 3 * 37 * 16)
    monkeypatch.setattr(fast, "PARALLEL_BLOCK_ELEMENTS", 3 * 37 * 16)
    positions = torch.arange(41) * 11
    reference = apply_rope(x, positions, layout=layout)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = torch.full_like(x, float("nan")) if with_out else None
        got = apply_rope_fast(x, positions, layout=layout, out=out)
    finally:
        torch.set_num_threads(before)
    assert not got.isnan().any()
    assert_agree(got, reference, x)


def test_float32_blocks_equal_the_whole_tensor_rotation_exactly() -> None:
    # The blocked path runs the same operators as the whole-tensor one on each block, so the
    # values are identical, not merely close: blocking changes where, not what, is computed.
    from rope_tutor.fast import _rotate_whole, _tables

    x = gaussian(2, 8, 300, 64, seed=11)
    positions = torch.arange(300)
    for layout in LAYOUTS:
        tables = _tables(positions, 64, 10000.0, None, torch.float32)
        whole = _rotate_whole(x, tables, layout, None)
        assert torch.equal(apply_rope_fast(x, positions, layout=layout), whole)


def test_consecutive_calls_follow_positions_and_settings() -> None:
    """Each call builds its own tables: one call's settings never leak into the next."""
    x = gaussian(2, 6, 12, 16, seed=12)
    cases = [
        (torch.arange(12), {}),
        (torch.arange(12), {}),  # the same call again
        (torch.arange(12) + 5, {}),  # same length, other positions
        (torch.arange(12) + 5, {"base": 500.0}),
        (torch.arange(12) + 5, {"base": 500.0, "scaling": SCALINGS["linear"]}),
        (torch.arange(12) + 5, {"base": 500.0, "scaling": SCALINGS["ntk"]}),
        (torch.arange(12) + 5, {"base": 500.0, "rotary_dim": 8}),
        (torch.arange(12).double() / 3, {}),  # float positions
    ]
    for positions, kwargs in cases:
        reference = apply_rope(x, positions, **kwargs)
        assert_agree(apply_rope_fast(x, positions, **kwargs), reference, x)
        x64 = x.double()  # float64 tables for float64 input
        assert_agree(
            apply_rope_fast(x64, positions, **kwargs), apply_rope(x64, positions, **kwargs), x64
        )


def test_decode_step_writes_only_its_cache_slot() -> None:
    # One new token at position 100, rotated straight into slot 100 of a (batch, heads, seq,
    # head_dim) key cache: the KV-cache write that the out= path exists for.
    k_cache = torch.zeros(1, 4, 128, 32)
    k_new = gaussian(1, 4, 1, 32, seed=13)
    slot = k_cache[:, :, 100:101]
    apply_rope_fast(k_new, torch.tensor([100]), out=slot)
    assert_agree(k_cache[:, :, 100:101], apply_rope(k_new, torch.tensor([100])), k_new)
    k_cache[:, :, 100] = 0
    assert torch.equal(k_cache, torch.zeros_like(k_cache))


def _chapter_check(x: torch.Tensor, positions: torch.Tensor, layout: str) -> None:
    """The chapter's check (book/14_fast_rope.ipynb): new tensor and out= against apply_rope."""
    reference = apply_rope(x, positions, layout=layout)
    out = torch.full_like(x, float("nan"))
    for result in (
        apply_rope_fast(x, positions, layout=layout),
        apply_rope_fast(x, positions, layout=layout, out=out),
    ):
        assert_agree(result, reference, x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_chapter_check_reaches_the_block_loop_and_catches_a_wrong_one(
    monkeypatch, dtype, layout: str
) -> None:
    """A detached multi-block input runs the loop, and the check fails when the loop is wrong."""
    import builtins

    from rope_tutor import fast

    x = gaussian(2, 8, 256, 64, seed=13, dtype=dtype)  # one thread: two blocks of 128 rows
    positions = torch.arange(256)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert x.numel() == 2 * fast.BLOCK_ELEMENTS

        def no_whole_path(*args, **kwargs):
            raise AssertionError("the whole-tensor fallback ran instead of the block loop")

        with monkeypatch.context() as patch:  # the loop, not the fallback, computes the result
            patch.setattr(fast, "_rotate_whole", no_whole_path)
            _chapter_check(x, positions, layout)

        blocks_seen = []

        def wrong_zip(*iterables, strict=False):  # pairs each x block with the other's tables
            iterables = list(iterables)
            blocks_seen.append(len(iterables[0]))
            iterables[2] = iterables[2][::-1]
            return builtins.zip(*iterables, strict=strict)

        def skip_last_block(*iterables, strict=False):
            return list(builtins.zip(*iterables, strict=strict))[:-1]

        for wrong in (wrong_zip, skip_last_block):
            with monkeypatch.context() as patch:  # fast.zip shadows the builtin in the loop
                patch.setattr(fast, "zip", wrong, raising=False)
                with pytest.raises(AssertionError):
                    _chapter_check(x, positions, layout)
        assert blocks_seen and set(blocks_seen) == {2}  # the loop ran, over both blocks
        _chapter_check(x, positions, layout)  # restored: passes again
    finally:
        torch.set_num_threads(before)
