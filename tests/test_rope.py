"""Part II (RoPE) against Hugging Face transformers, a Meta-style complex implementation written
here, lucidrains' rotary-embedding-torch, and the mathematical properties RoPE is built for."""

from __future__ import annotations

import importlib
import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rotary_embedding_torch import RotaryEmbedding as LucidrainsRotaryEmbedding
from transformers import GPTNeoXConfig, LlamaConfig
from transformers.models.gpt_neox.modeling_gpt_neox import (
    GPTNeoXRotaryEmbedding,
)
from transformers.models.gpt_neox.modeling_gpt_neox import (
    apply_rotary_pos_emb as neox_apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import (
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)
from transformers.models.llama.modeling_llama import rotate_half as hf_rotate_half

import rope_tutor.absolute
import rope_tutor.scaling
from rope_tutor import SelfAttention
from rope_tutor.fast import apply_rope_fast
from rope_tutor.rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_complex,
    half_to_interleaved_permutation,
    interleaved_to_half_permutation,
    rope_frequencies,
    rope_matrix,
    rope_with_bfloat16_angles,
    rotate_half,
    rotate_interleaved,
)

FEW = settings(max_examples=50, deadline=None)
dims = st.integers(1, 32).map(lambda half: 2 * half)
big_positions = st.integers(0, 100_000)
seeds = st.integers(0, 2**31 - 1)


def gaussian(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# -- independent reference: Meta's Llama code style (complex numbers, interleaved pairs) ---------


def meta_precompute_freqs_cis(dim: int, end: int, theta: float = 10000.0) -> torch.Tensor:
    """e^(i t theta_j) for t in 0..end-1, complex64 (end, dim/2), as Meta's llama/model.py does."""
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs))


def meta_apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x (batch, seq, heads, dim); adjacent features form one complex number."""
    x_complex = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = x_complex * freqs_cis[None, :, None, :]  # (1, seq, 1, dim/2) broadcast
    return torch.view_as_real(rotated).flatten(3).type_as(x)


# -- reference implementations --------------------------------------------------------------------


def test_frequencies_match_hf_default_rope_parameters() -> None:
    config = LlamaConfig(
        hidden_size=128,
        num_attention_heads=2,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    hf_inv_freq, factor = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    assert factor == 1.0
    torch.testing.assert_close(rope_frequencies(64, 500000.0), hf_inv_freq, rtol=1e-6, atol=0)
    # theta_0 = 1 (index from 0) and theta_{d/2-1} = base^(-(d-2)/d): the paper's formula.
    assert rope_frequencies(64)[0].item() == 1.0
    assert math.isclose(rope_frequencies(64)[-1].item(), 10000 ** (-62 / 64), rel_tol=1e-6)


@pytest.mark.parametrize(("dim", "base"), [(8, 10000.0), (64, 500000.0), (128, 1e6)])
def test_rope_theta_is_the_sinusoidal_theta(dim: int, base: float) -> None:
    # One formula, b^(-2i/d), taught in Part I and reused by Part II and Part IV.
    theta = rope_tutor.absolute.sinusoidal_frequencies(dim, base)
    assert torch.equal(rope_frequencies(dim, base), theta.float())
    assert torch.equal(rope_tutor.scaling.rope_parameters(dim, base)[0], theta.float())
    exponent = torch.arange(dim // 2, dtype=torch.float64) * 2 / dim
    torch.testing.assert_close(theta, base**-exponent, rtol=1e-15, atol=0)


def test_rotate_half_matches_hf() -> None:
    x = gaussian(3, 5, 16, seed=1)
    torch.testing.assert_close(rotate_half(x), hf_rotate_half(x), rtol=0, atol=0)


# The name trap inside transformers itself (chapter "RoPE in practice", "Two layouts"): the Llama
# family's rotate_half is the half layout's, and so is GLM-4.5's (glm4_moe), but Cohere's function
# of the same name, GLM's and GLM-4's (whose docstrings say "Rotates half the hidden dims") and
# GPT-J's and CodeGen's rotate_every_two all swap adjacent features: the interleaved layout.
HALF_IN_TRANSFORMERS = ["llama", "mistral", "qwen2", "gemma", "gpt_neox", "glm4_moe"]
INTERLEAVED_IN_TRANSFORMERS = [
    ("cohere", "rotate_half"),
    ("glm", "rotate_half"),
    ("glm4", "rotate_half"),
    ("gptj", "rotate_every_two"),
    ("codegen", "rotate_every_two"),
]


def _transformers_function(model: str, name: str):
    module = importlib.import_module(f"transformers.models.{model}.modeling_{model}")
    return getattr(module, name)


@pytest.mark.parametrize("model", HALF_IN_TRANSFORMERS)
def test_the_llama_family_rotates_half(model: str) -> None:
    x = gaussian(2, 3, 5, 16, seed=11)  # (batch, heads, seq, head_dim)
    rotate = _transformers_function(model, "rotate_half")
    torch.testing.assert_close(rotate(x), rotate_half(x), rtol=0, atol=0)
    assert not torch.equal(rotate(x), rotate_interleaved(x))


@pytest.mark.parametrize(("model", "name"), INTERLEAVED_IN_TRANSFORMERS)
def test_cohere_glm_gptj_and_codegen_rotate_interleaved(model: str, name: str) -> None:
    x = gaussian(2, 3, 5, 16, seed=12)  # (batch, heads, seq, head_dim): GPT-J indexes 4 dims
    rotate = _transformers_function(model, name)
    torch.testing.assert_close(rotate(x), rotate_interleaved(x), rtol=0, atol=0)
    assert not torch.equal(rotate(x), rotate_half(x))


def test_cohere_says_its_rotate_half_differs_from_llama() -> None:
    source = inspect.getsource(_transformers_function("cohere", "rotate_half"))
    assert "different from e.g. Llama" in source


def test_rotate_interleaved_is_multiplication_by_i() -> None:
    x = gaussian(4, 10, seed=2)
    z = torch.view_as_complex(x.reshape(4, 5, 2).contiguous())
    expected = torch.view_as_real(1j * z).flatten(-2)
    torch.testing.assert_close(rotate_interleaved(x), expected, rtol=0, atol=0)


def _fast_into_a_buffer(x: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
    """``apply_rope_fast`` writing into a buffer it is given, as a KV-cache write does."""
    out = torch.empty_like(x)
    assert apply_rope_fast(x, positions, out=out, **kwargs) is out
    return out


@pytest.mark.parametrize(
    "rotate",
    [apply_rope, apply_rope_fast, _fast_into_a_buffer],
    ids=["apply_rope", "apply_rope_fast", "apply_rope_fast-out"],
)
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_matches_hf_llama(rotate, base: float, device: str) -> None:
    """The Part II reference and the Part VI fast path against Hugging Face's Llama code."""
    batch, heads, seq, head_dim = 2, 3, 40, 32
    config = LlamaConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    hf_rotary = LlamaRotaryEmbedding(config).to(device)
    q = gaussian(batch, heads, seq, head_dim, seed=3, dtype=torch.float32).to(device)
    k = gaussian(batch, heads, seq, head_dim, seed=4, dtype=torch.float32).to(device)
    positions = torch.arange(seq, device=device) * 50  # up to 1950
    cos, sin = hf_rotary(q, positions[None].expand(batch, seq))  # (batch, seq, head_dim)
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)

    torch.testing.assert_close(rotate(q, positions, base=base), hf_q, rtol=0, atol=2e-4)
    torch.testing.assert_close(rotate(k, positions, base=base), hf_k, rtol=0, atol=2e-4)


@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rotary_embedding_module_matches_hf_llama(base: float) -> None:
    batch, heads, seq, head_dim = 2, 3, 40, 32
    config = LlamaConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    q = gaussian(batch, heads, seq, head_dim, seed=3, dtype=torch.float32)
    k = gaussian(batch, heads, seq, head_dim, seed=4, dtype=torch.float32)
    positions = torch.arange(seq) * 50
    cos, sin = LlamaRotaryEmbedding(config)(q, positions[None].expand(batch, seq))
    hf_q, hf_k = apply_rotary_pos_emb(q, k, cos, sin)
    ours_q, ours_k = RotaryEmbedding(head_dim, base=base)(q, k, positions)
    torch.testing.assert_close(ours_q, hf_q, rtol=0, atol=2e-4)
    torch.testing.assert_close(ours_k, hf_k, rtol=0, atol=2e-4)


def test_partial_rotary_matches_hf_gpt_neox(device: str) -> None:
    heads, seq, head_dim, factor = 2, 12, 32, 0.25
    config = GPTNeoXConfig(
        hidden_size=heads * head_dim,
        num_attention_heads=heads,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": factor,
        },
    )
    q = gaussian(1, heads, seq, head_dim, seed=5, dtype=torch.float32).to(device)
    positions = torch.arange(seq, device=device) + 7
    cos, sin = GPTNeoXRotaryEmbedding(config).to(device)(q, positions[None])
    hf_q, _ = neox_apply_rotary_pos_emb(q, q, cos, sin)

    rotary_dim = int(head_dim * factor)
    ours = apply_rope(q, positions, rotary_dim=rotary_dim)
    torch.testing.assert_close(ours, hf_q, rtol=0, atol=1e-5)
    assert torch.equal(ours[..., rotary_dim:], q[..., rotary_dim:])  # pass-through untouched


def test_partial_rotary_test_vector() -> None:
    # head_dim 8, rotary_dim 4 -> theta = [1, 0.01] (from rotary_dim, not [1, 0.1] from head_dim)
    x = torch.arange(1.0, 9.0, dtype=torch.float64)[None]
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    expected = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 3 * c1 + 1 * s1, 4 * c2 + 2 * s2, 5, 6, 7, 8]
    got = apply_rope(x, [1], rotary_dim=4)[0]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))


def test_interleaved_matches_meta_complex(device: str) -> None:
    batch, seq, heads, head_dim = 2, 64, 3, 16
    x = gaussian(batch, seq, heads, head_dim, seed=6, dtype=torch.float32)
    expected = meta_apply_rotary_emb(x, meta_precompute_freqs_cis(head_dim, seq)).to(device)
    x = x.to(device)
    ours_layout = x.transpose(1, 2)  # (batch, heads, seq, head_dim): ours rotates along dim -2
    positions = torch.arange(seq, device=device)
    for ours in (
        apply_rope(ours_layout, positions, layout="interleaved"),
        apply_rope_complex(ours_layout, positions),
        RotaryEmbedding(head_dim, layout="interleaved")(ours_layout, ours_layout, positions)[0],
    ):
        torch.testing.assert_close(ours.transpose(1, 2), expected, rtol=0, atol=1e-5)


def test_interleaved_matches_lucidrains() -> None:
    # lucidrains' "rotate_half" swaps adjacent features: it is the interleaved layout.
    heads, seq, head_dim = 2, 30, 16
    x = gaussian(1, heads, seq, head_dim, seed=7, dtype=torch.float32)
    expected = LucidrainsRotaryEmbedding(dim=head_dim).rotate_queries_or_keys(x, offset=5)
    ours = apply_rope(x, torch.arange(seq) + 5, layout="interleaved")
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    # Partial: lucidrains rotates the first `dim` features of a larger head and passes the rest.
    partial = LucidrainsRotaryEmbedding(dim=8).rotate_queries_or_keys(x)
    ours = apply_rope(x, torch.arange(seq), layout="interleaved", rotary_dim=8)
    torch.testing.assert_close(ours, partial, rtol=0, atol=1e-5)


# -- the four forms are one operation -------------------------------------------------------------


@FEW
@given(dim=dims, position=big_positions, seed=seeds)
def test_dense_complex_interleaved_and_permuted_half_agree(dim: int, position: int, seed: int):
    x = gaussian(dim, seed=seed)
    dense = rope_matrix(position, dim) @ x  # column vector convention
    complex_form = apply_rope_complex(x[None], [position])[0]
    interleaved = apply_rope(x[None], [position], layout="interleaved")[0]
    perm = interleaved_to_half_permutation(dim)
    permuted_half = apply_rope(x[perm][None], [position], layout="half")[0]
    for other in (complex_form, interleaved, permuted_half[half_to_interleaved_permutation(dim)]):
        torch.testing.assert_close(other, dense, rtol=0, atol=1e-9)


def test_rope_matrix_is_block_diagonal_rotation() -> None:
    matrix = rope_matrix(3, 6, base=100.0)
    theta = [1.0, 100 ** (-2 / 6), 100 ** (-4 / 6)]
    for i, t in enumerate(theta):
        block = matrix[2 * i : 2 * i + 2, 2 * i : 2 * i + 2]
        c, s = math.cos(3 * t), math.sin(3 * t)
        expected = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
        torch.testing.assert_close(block, expected, rtol=0, atol=1e-6)  # theta is float32
    off_block = matrix.clone()
    for i in range(3):
        off_block[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = 0
    assert torch.count_nonzero(off_block) == 0
    torch.testing.assert_close(matrix.T @ matrix, torch.eye(6, dtype=torch.float64))


def test_permutation_values_and_hf_conversion_formula() -> None:
    assert interleaved_to_half_permutation(8).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert half_to_interleaved_permutation(8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    two_heads = interleaved_to_half_permutation(8, num_heads=2).tolist()
    assert two_heads == [0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15]
    # HF convert_llama_weights_to_hf.py permutes W_q rows by view/transpose/reshape.
    num_heads, head_dim, hidden = 4, 8, 12
    w = gaussian(num_heads * head_dim, hidden, seed=8)
    hf_permuted = (
        w.view(num_heads, head_dim // 2, 2, hidden)
        .transpose(1, 2)
        .reshape(num_heads * head_dim, hidden)
    )
    assert torch.equal(w[interleaved_to_half_permutation(head_dim, num_heads)], hf_permuted)


# -- properties -----------------------------------------------------------------------------------


def score(q: torch.Tensor, k: torch.Tensor, m: int, n: int, layout: str = "half") -> float:
    return float(
        apply_rope(q[None], [m], layout=layout)[0] @ apply_rope(k[None], [n], layout=layout)[0]
    )


@FEW
@given(dim=dims, m=big_positions, n=big_positions, shift=big_positions, seed=seeds)
def test_relative_position_invariance(dim: int, m: int, n: int, shift: int, seed: int) -> None:
    q, k = gaussian(2, dim, seed=seed)
    tolerance = 1e-9 * float(q.norm() * k.norm())
    for layout in ("half", "interleaved"):
        assert (
            abs(score(q, k, m, n, layout) - score(q, k, m + shift, n + shift, layout)) <= tolerance
        )


def test_relative_invariance_test_vector() -> None:
    # Reference-formulas note: seed-0 Gaussian q, k (d=8): <R_7 q, R_3 k> = <R_104 q, R_100 k>.
    torch.manual_seed(0)
    q, k = torch.randn(2, 8, dtype=torch.float64)
    assert math.isclose(score(q, k, 7, 3, "interleaved"), score(q, k, 104, 100, "interleaved"))
    assert score(q, k, 7, 3) != pytest.approx(score(q, k, 7, 4))  # and it does depend on m - n


@FEW
@given(
    dim=dims, position=big_positions, seed=seeds, layout=st.sampled_from(["half", "interleaved"])
)
def test_norm_preserved(dim: int, position: int, seed: int, layout: str) -> None:
    x = gaussian(3, dim, seed=seed)
    rotated = apply_rope(x, [position] * 3, layout=layout)
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)


@FEW
@given(dim=dims, m=big_positions, n=big_positions, seed=seeds)
def test_layouts_give_equal_scores_under_permutation(dim: int, m: int, n: int, seed: int) -> None:
    q, k = gaussian(2, dim, seed=seed)
    perm = interleaved_to_half_permutation(dim)
    interleaved = score(q, k, m, n, "interleaved")
    half = score(q[perm], k[perm], m, n, "half")
    assert abs(interleaved - half) <= 1e-9 * float(q.norm() * k.norm())


def test_layouts_differ_without_the_permutation() -> None:
    # The classic conversion bug: loading interleaved weights into a half-layout model.
    q, k = gaussian(2, 16, seed=17)
    assert not torch.allclose(
        apply_rope(q[None], [5]), apply_rope(q[None], [5], layout="interleaved")
    )
    assert score(q, k, 9, 2, "interleaved") != pytest.approx(score(q, k, 9, 2, "half"))


# -- precision ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_bfloat16_agrees_with_float64_at_long_positions(layout: str, device: str) -> None:
    dim, seq = 64, 257
    x64 = gaussian(2, seq, dim, seed=9)
    x16 = x64.to(torch.bfloat16)
    positions = torch.linspace(0, 100_000, seq).round().long()
    reference = apply_rope(x16.double(), positions, layout=layout)
    for rotate in (apply_rope, apply_rope_fast):  # on the device, angles still in float32
        on_device = rotate(x16.to(device), positions.to(device), layout=layout)
        assert on_device.dtype == torch.bfloat16 and on_device.device.type == device
        pair_norm = x16.double().abs().amax(dim=-1, keepdim=True) * math.sqrt(2)
        assert ((on_device.cpu().double() - reference).abs() <= 2 * 2**-8 * pair_norm).all()
    got = apply_rope(x16, positions, layout=layout)
    assert got.dtype == torch.bfloat16
    # bfloat16 keeps 8 significant bits: allow two units of 2^-8 relative to the pair's length.
    pair_norm = x16.double().abs().amax(dim=-1, keepdim=True) * math.sqrt(2)
    assert ((got.double() - reference).abs() <= 2 * 2**-8 * pair_norm).all()

    # The same bound fails if the angles are formed in bfloat16 (position 5000 becomes 4992).
    theta = rope_frequencies(dim).to(torch.bfloat16)
    angles = positions.to(torch.bfloat16)[:, None] * theta  # (seq, dim/2) in bfloat16
    cos = torch.cat((angles.cos(), angles.cos()), -1)
    sin = torch.cat((angles.sin(), angles.sin()), -1)
    naive = x16 * cos + rotate_half(x16) * sin
    if layout == "half":
        assert not ((naive.double() - reference).abs() <= 2 * 2**-8 * pair_norm).all()
    assert torch.tensor(5000, dtype=torch.bfloat16).item() == 4992


def test_float64_input_uses_float64_angles() -> None:
    x = gaussian(1, 1, 4, seed=10)
    position = 123_456
    got = apply_rope(x, [position], layout="interleaved")[0, 0]
    theta = [1.0, float(rope_frequencies(4)[1])]
    angle = [position * t for t in theta]  # Python floats are float64
    expected = [
        x[0, 0, 0] * math.cos(angle[0]) - x[0, 0, 1] * math.sin(angle[0]),
        x[0, 0, 1] * math.cos(angle[0]) + x[0, 0, 0] * math.sin(angle[0]),
        x[0, 0, 2] * math.cos(angle[1]) - x[0, 0, 3] * math.sin(angle[1]),
        x[0, 0, 3] * math.cos(angle[1]) + x[0, 0, 2] * math.sin(angle[1]),
    ]
    torch.testing.assert_close(got, torch.stack(expected), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_shape_and_dtype_preserved(dtype: torch.dtype, device: str) -> None:
    x = gaussian(2, 3, 5, 8, seed=11).to(device=device, dtype=dtype)
    positions = torch.arange(5, device=device)
    for layout in ("half", "interleaved"):
        out = apply_rope(x, positions, layout=layout)
        assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    q, k = RotaryEmbedding(8).to(device)(x, x, positions)
    assert q.dtype == k.dtype == dtype and q.device == x.device
    assert apply_rope_complex(x, positions).dtype == dtype


def test_position_zero_is_identity_and_float_positions_interpolate() -> None:
    x = gaussian(1, 16, seed=12)
    torch.testing.assert_close(apply_rope(x, [0]), x, rtol=0, atol=0)
    # Float positions: rotating by 2.5 = rotating by 5 with half the frequencies' angle.
    half_step = apply_rope(apply_rope(x, [2.5]), [2.5])
    torch.testing.assert_close(half_step, apply_rope(x, [5]), rtol=0, atol=1e-12)


# -- RotaryEmbedding: cache, attention, scaling wiring --------------------------------------------


def test_rotary_embedding_caches_and_equals_apply_rope(monkeypatch: pytest.MonkeyPatch) -> None:
    import rope_tutor.rope as rope

    calls = [[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 1, 4], [9, 8], list(range(20)), [0, 19]]
    inputs = [gaussian(2, len(p), 16, seed=len(p)) for p in calls]
    rotary = RotaryEmbedding(16, layout="interleaved", rotary_dim=12)
    builds, original = [], rope.rope_cos_sin

    def counting_cos_sin(positions, *rest):
        builds.append(len(positions))
        return original(positions, *rest)

    monkeypatch.setattr(rope, "rope_cos_sin", counting_cos_sin)
    outputs = [rotary(x, 2 * x, torch.tensor(p)) for x, p in zip(inputs, calls, strict=True)]
    assert builds == [10, 20]  # a table for 0..9, reused, then extended to 0..19 and reused
    monkeypatch.undo()
    for x, p, (q, k) in zip(inputs, calls, outputs, strict=True):
        expected = apply_rope(x, torch.tensor(p), layout="interleaved", rotary_dim=12)
        torch.testing.assert_close(q, expected, rtol=0, atol=0)
        torch.testing.assert_close(k, 2 * expected, rtol=0, atol=0)


def test_rotary_embedding_float_positions_and_dtypes() -> None:
    rotary = RotaryEmbedding(8)
    x = gaussian(3, 8, seed=13)
    positions = torch.tensor([0.5, 10.25, 3.0])
    torch.testing.assert_close(rotary(x, x, positions)[0], apply_rope(x, positions))
    cos32, _ = rotary.cos_sin(torch.arange(4), torch.bfloat16)
    cos64, _ = rotary.cos_sin(torch.arange(4), torch.float64)
    assert cos32.dtype == torch.float32 and cos64.dtype == torch.float64
    assert cos32.shape == (4, 4)


def test_self_attention_with_rope_depends_on_relative_position_only() -> None:
    torch.manual_seed(0)
    layer = SelfAttention(32, 4, causal=True, rotary=RotaryEmbedding(8)).double()
    x = gaussian(2, 10, 32, seed=14)
    positions = torch.arange(10)
    out = layer(x, positions=positions)
    torch.testing.assert_close(layer(x, positions=positions + 5000), out, rtol=0, atol=1e-9)
    assert not torch.allclose(layer(x, positions=positions * 2), out)  # distances matter


def rotate_by_hand(x: torch.Tensor, positions, inv_freq, factor: float) -> torch.Tensor:
    """Half-layout RoPE written out pair by pair in float64, cos and sin times ``factor``."""
    half = x.shape[-1] // 2
    expected = torch.empty_like(x)
    for row, m in enumerate(positions):
        for i in range(half):
            angle = float(m) * float(inv_freq[i])
            c, s = factor * math.cos(angle), factor * math.sin(angle)
            expected[row, i] = x[row, i] * c - x[row, i + half] * s
            expected[row, i + half] = x[row, i + half] * c + x[row, i] * s
    return expected


DYNAMIC = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 8}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}


@pytest.mark.parametrize("setting", [DYNAMIC, YARN], ids=["dynamic", "yarn"])
def test_scaling_is_wired_through_rope_parameters(setting: dict, device: str) -> None:
    # Positions up to 11: a scaling method sees seq_len = 12, past the trained window of 8.
    x = gaussian(2, 6, seed=15)
    positions = [4, 11]
    inv_freq, factor = rope_tutor.scaling.rope_parameters(6, 100.0, setting, seq_len=12)
    expected = rotate_by_hand(x, positions, inv_freq, factor)
    got = apply_rope(x.to(device), positions, base=100.0, scaling=setting).cpu()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    rotary = RotaryEmbedding(6, base=100.0, scaling=setting).to(device)
    q, _ = rotary(x.to(device), x.to(device), torch.tensor(positions, device=device))
    torch.testing.assert_close(q.cpu(), expected, rtol=0, atol=1e-12)
    if setting is DYNAMIC:  # the length matters: seq_len 11 would give other frequencies
        other, _ = rope_tutor.scaling.rope_parameters(6, 100.0, setting, seq_len=11)
        assert not torch.allclose(rotate_by_hand(x, positions, other, 1.0), got)
    else:  # YaRN's attention factor 0.1 ln(s) + 1 multiplies cos and sin (Peng et al., eq. 22)
        assert factor == pytest.approx(0.1 * math.log(4.0) + 1)


def test_linear_scaling_is_position_interpolation() -> None:
    # Chen et al. (2023): PI reads position m as m / s.
    x = gaussian(3, 8, seed=18)
    positions = torch.tensor([0, 7, 40])
    linear = apply_rope(x, positions, scaling={"rope_type": "linear", "factor": 4.0})
    torch.testing.assert_close(linear, apply_rope(x, positions / 4), rtol=0, atol=1e-6)


def test_no_scaling_equals_default_scaling() -> None:
    x = gaussian(4, 8, seed=16)
    plain = apply_rope(x, torch.arange(4))
    torch.testing.assert_close(
        apply_rope(x, torch.arange(4), scaling={"rope_type": "default"}), plain
    )
    with pytest.raises(ValueError, match="no-such-method"):
        apply_rope(x, torch.arange(4), scaling={"rope_type": "no-such-method"})
    with pytest.raises(ValueError, match="no-such-method"):
        RotaryEmbedding(8, scaling={"rope_type": "no-such-method"})


# -- bad input ------------------------------------------------------------------------------------

X = torch.zeros(2, 3, 8)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: apply_rope(torch.zeros(2, 3, 7), torch.arange(3)), "x.shape\\[-1\\]=7"),
        (lambda: apply_rope(X, torch.arange(4)), "positions has length 4"),
        (lambda: apply_rope(X, torch.arange(6).view(2, 3)), "positions must be 1-D"),
        (lambda: apply_rope(X, torch.tensor([0, -1, 2])), "positions must be finite and >= 0"),
        (lambda: apply_rope(X, torch.tensor([0, math.nan, 2])), "positions must be finite"),
        (lambda: apply_rope(X, torch.tensor([True, False, True])), "positions must hold"),
        (lambda: apply_rope(X, torch.arange(3), layout="neox"), "layout='neox'"),
        (lambda: apply_rope(X, torch.arange(3), base=0.0), "base=0.0"),
        (lambda: apply_rope(X, torch.arange(3), base=-5), "base=-5"),
        (lambda: apply_rope(X, torch.arange(3), rotary_dim=3), "rotary_dim=3"),
        (lambda: apply_rope(X, torch.arange(3), rotary_dim=10), "rotary_dim=10"),
        (lambda: apply_rope(X.long(), torch.arange(3)), "x must be a floating-point tensor"),
        (lambda: apply_rope(torch.zeros(8), torch.arange(1)), "x must have shape"),
        (lambda: apply_rope_complex(torch.zeros(3, 5), torch.arange(3)), "x.shape\\[-1\\]=5"),
        (lambda: rope_matrix(1, 5), "dim=5"),
        (lambda: rope_matrix(1, 4.0), "dim=4.0"),
        (lambda: rope_matrix(-2, 4), "position=-2"),
        (lambda: rope_matrix(1, 4, base=1.0), "base=1.0"),
        (lambda: rotate_half(torch.zeros(3)), "x.shape\\[-1\\]=3"),
        (lambda: rotate_interleaved(torch.zeros(5)), "x.shape\\[-1\\]=5"),
        (lambda: interleaved_to_half_permutation(7), "head_dim=7"),
        (lambda: interleaved_to_half_permutation(8, num_heads=0), "num_heads=0"),
        (lambda: RotaryEmbedding(7), "dim=7"),
        (lambda: RotaryEmbedding(8.0), "dim=8.0"),
        (lambda: RotaryEmbedding(8, layout="gptj"), "layout='gptj'"),
        (lambda: RotaryEmbedding(8, base=0), "base=0"),
        (lambda: RotaryEmbedding(8)(X, X[..., :6], torch.arange(3)), "k has last dim 6"),
        (lambda: RotaryEmbedding(8)(X, X[:, :2], torch.arange(3)), "different sequence lengths"),
        (lambda: RotaryEmbedding(8)(X, X, torch.arange(2)), "positions has length 2"),
    ],
)
def test_bad_input_raises_naming_the_argument(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()



def _wrap(angle: torch.Tensor) -> torch.Tensor:
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def test_rope_with_bfloat16_angles_rounds_the_angles_to_bfloat16() -> None:
    """The kept bug: pair j turns by bf16(bf16(m) * bf16(theta_j)), read back from cos and sin."""
    dim = 16
    positions = torch.tensor([0, 1, 255, 257, 3990, 4000, 5000, 65_537])
    x = torch.cat((torch.ones(len(positions), dim // 2), torch.zeros(len(positions), dim // 2)), -1)
    out = rope_with_bfloat16_angles(x.double(), positions)  # half layout: cos_j, then sin_j
    got = torch.atan2(out[:, dim // 2 :], out[:, : dim // 2])  # each pair's angle, (seq, dim/2)
    # Independent reference: round position and theta to bfloat16, multiply in float64 (exact for
    # two 8-bit significands), round the product to bfloat16 once.
    theta_bf16 = rope_frequencies(dim).to(torch.bfloat16).double()
    product = positions.to(torch.bfloat16).double()[:, None] * theta_bf16
    expected = product.to(torch.bfloat16).double()
    assert _wrap(got - expected).abs().max() < 2**-6  # cos and sin are bfloat16: about 2^-8 each
    exact = positions.double()[:, None] * rope_frequencies(dim).double()
    assert _wrap(exact - got)[positions == 5000, 0].abs().item() > 1  # 5000 turned as 4992


def test_rope_with_bfloat16_angles_equals_apply_rope_where_the_angles_are_exact() -> None:
    """base 256, dim 8: theta = 1, 1/4, 1/16, 1/64, so m theta_j is exact in bfloat16 to m = 256."""
    theta = rope_frequencies(8, 256.0)
    assert theta.tolist() == [1.0, 0.25, 0.0625, 0.015625]
    positions = torch.arange(0, 257)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(3, len(positions), 8, generator=generator, dtype=torch.float64)
    got = rope_with_bfloat16_angles(x, positions, base=256.0)
    want = apply_rope(x, positions, base=256.0)
    pair_len = torch.hypot(x[..., :4], x[..., 4:]).repeat(1, 1, 2)
    assert ((got - want).abs() <= 2 * 2**-8 * pair_len).all()  # only cos and sin are rounded
    far = torch.tensor([4001])  # not exact there: the bug shows
    broken, right = (f(x[:, :1], far, base=256.0) for f in (rope_with_bfloat16_angles, apply_rope))
    assert not torch.allclose(broken, right, atol=0.1)


def test_rope_with_bfloat16_angles_refuses_bad_shapes_with_the_value() -> None:
    x = torch.zeros(4, 8)
    with pytest.raises(ValueError, match=r"positions must .* got shape \(3,\)"):
        rope_with_bfloat16_angles(x, torch.arange(3))
    with pytest.raises(ValueError, match=r"dim even, got shape \(4, 7\)"):
        rope_with_bfloat16_angles(torch.zeros(4, 7), torch.arange(4))
