"""Part IV: every context-extension method against Hugging Face, its formula, and its properties.

Hugging Face ``transformers`` (a pinned test-only dependency) is the reference for default,
linear, dynamic, yarn, llama3 and longrope; static NTK (not in Hugging Face) is checked against
its formula written out here. Hugging Face v5 quirks handled below (see the research notes):
dynamic NTK reads the trained window from ``max_position_embeddings``, and ``original_max_position
_embeddings`` must agree with ``max_position_embeddings / factor`` for the versions to agree.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

import rope_tutor as rt

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

DIMS = (32, 64, 128)
BASES = (10000.0, 500000.0)


def hf_rope_parameters(dim: int, base: float, scaling: dict, seq_len: int | None):
    """Hugging Face's own initialisation function for ``scaling`` on a Llama config."""
    params = {key: value for key, value in scaling.items()}
    kind = params.get("rope_type", "default")
    window = params.get("original_max_position_embeddings")
    if kind == "dynamic":
        # HF reads the trained window from max_position_embeddings (and does not know the key).
        max_positions = params.pop("original_max_position_embeddings")
    elif window is not None:
        max_positions = int(params.get("factor", 1.0) * window)
    else:
        max_positions = 4096
    params["rope_theta"] = base
    config = LlamaConfig(
        hidden_size=4 * dim,
        num_attention_heads=4,
        head_dim=dim,
        max_position_embeddings=max_positions,
        rope_parameters=params,
    )
    if kind == "default":
        init = LlamaRotaryEmbedding.compute_default_rope_parameters
    else:
        init = ROPE_INIT_FUNCTIONS[kind]
    inv_freq, attention_factor = init(config, device="cpu", seq_len=seq_len)
    return inv_freq, float(attention_factor)


def factor_list(dim: int, seed: int, low: float, high: float) -> list[float]:
    rng = random.Random(seed)
    return sorted(round(rng.uniform(low, high), 4) for _ in range(dim // 2))


YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 4096}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

# (id, scaling, seq_len); longrope lists are filled in per head size.
HF_CASES = [
    ("default", {"rope_type": "default"}, None),
    ("linear-2", {"rope_type": "linear", "factor": 2.0}, None),
    ("linear-8", {"rope_type": "linear", "factor": 8.0}, None),
    *[
        (
            f"dynamic-seq{seq_len}",
            {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 2048},
            seq_len,
        )
        for seq_len in (None, 100, 2048, 2049, 4096, 8192, 30000)
    ],
    ("yarn-default-betas", YARN, None),
    ("yarn-custom-betas", {**YARN, "beta_fast": 16.0, "beta_slow": 2.0}, None),
    ("yarn-no-truncate", {**YARN, "factor": 32.0, "truncate": False}, None),
    ("yarn-mscale-equal", {**YARN, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}, None),
    ("yarn-mscale-differ", {**YARN, "mscale": 0.707, "mscale_all_dim": 1.0}, None),
    ("yarn-attention-factor", {**YARN, "factor": 4.0, "attention_factor": 1.5}, None),
    ("yarn-short-window", {**YARN, "factor": 2.0, "original_max_position_embeddings": 512}, None),
    ("llama3", LLAMA3, None),
    ("llama3-32", {**LLAMA3, "factor": 32.0}, None),
    ("longrope-short", {"rope_type": "longrope", "factor": 32.0}, None),
    ("longrope-short-at-window", {"rope_type": "longrope", "factor": 32.0}, 4096),
    ("longrope-long", {"rope_type": "longrope", "factor": 32.0}, 4097),
    ("longrope-attention-factor", {"rope_type": "longrope", "attention_factor": 1.25}, 9000),
]


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize(
    ("scaling", "seq_len"), [case[1:] for case in HF_CASES], ids=[case[0] for case in HF_CASES]
)
def test_matches_hugging_face(dim: int, base: float, scaling: dict, seq_len: int | None) -> None:
    scaling = dict(scaling)
    if scaling["rope_type"] == "longrope":
        scaling["original_max_position_embeddings"] = 4096
        scaling["short_factor"] = factor_list(dim, 1, 1.0, 1.2)
        scaling["long_factor"] = factor_list(dim, 2, 1.0, 40.0)
    inv_freq, attention_factor = rt.rope_parameters(dim, base, scaling, seq_len=seq_len)
    expected_inv_freq, expected_attention_factor = hf_rope_parameters(dim, base, scaling, seq_len)
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (dim // 2,)
    # HF evaluates the un-truncated YaRN ramp in float32; its error (about 1e-7) is amplified by up
    # to s in the blended frequency, so there HF itself is only good to ~2e-6 (ours is checked
    # against the float64 formula in test_yarn_without_truncation_matches_the_float64_formula).
    rtol = 3e-6 if scaling.get("truncate") is False else 1e-6
    torch.testing.assert_close(inv_freq, expected_inv_freq.float(), rtol=rtol, atol=0.0)
    assert attention_factor == pytest.approx(expected_attention_factor, rel=1e-12)


def test_yarn_without_truncation_matches_the_float64_formula() -> None:
    dim, base, window, factor = 128, 10000.0, 4096, 32.0

    def index_of(turns: float) -> float:
        return dim * math.log(window / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(index_of(32), 0.0), min(index_of(1), dim - 1.0)
    interpolate = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    theta = base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    expected = theta / factor * interpolate + theta * (1 - interpolate)
    scaling = {**YARN, "factor": factor, "truncate": False}
    inv_freq, _ = rt.rope_parameters(dim, base, scaling)
    torch.testing.assert_close(inv_freq.double(), expected, rtol=2e-7, atol=0.0)


def test_hugging_face_cases_are_not_all_the_default() -> None:
    """Guard against a parity test that passes because nothing is scaled."""
    default, _ = rt.rope_parameters(128, 10000.0)
    changed = [
        name
        for name, scaling, seq_len in HF_CASES
        if scaling["rope_type"] not in ("default", "longrope")
        and not torch.equal(rt.rope_parameters(128, 10000.0, scaling, seq_len=seq_len)[0], default)
    ]
    assert "linear-2" in changed and "yarn-default-betas" in changed and "llama3" in changed
    assert "dynamic-seq8192" in changed and "dynamic-seq2048" not in changed


# --- static NTK: the formula written independently -------------------------------------------


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("base", BASES)
@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0, 16.0])
def test_static_ntk_matches_its_formula(dim: int, base: float, factor: float) -> None:
    new_base = base * factor ** (dim / (dim - 2))
    expected = [new_base ** (-(2 * i) / dim) for i in range(dim // 2)]
    inv_freq, attention_factor = rt.rope_parameters(
        dim, base, {"rope_type": "ntk", "factor": factor}
    )
    expected = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(inv_freq.double(), expected, rtol=1e-6, atol=0.0)
    assert attention_factor == 1.0
    assert rt.ntk_scaled_base(base, factor, dim) == pytest.approx(new_base, rel=1e-12)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("factor", [2.0, 4.0, 10.0])
def test_ntk_interpolates_slowest_pair_by_s_and_leaves_fastest(dim: int, factor: float) -> None:
    scale = rt.effective_scale_factors(dim, 10000.0, {"rope_type": "ntk", "factor": factor})
    assert scale[0].item() == pytest.approx(1.0, rel=1e-6)
    assert scale[-1].item() == pytest.approx(factor, rel=1e-6)
    # In between: s_i = s ** (2i / (d - 2)), geometric in the pair index.
    expected = torch.tensor([factor ** (2 * i / (dim - 2)) for i in range(dim // 2)])
    torch.testing.assert_close(scale, expected.double(), rtol=1e-6, atol=0.0)


def test_dynamic_at_factor_one_still_stretches_past_the_window() -> None:
    """Its effective factor is s l / L - (s - 1), which is l / L at s = 1: not the identity."""
    scaling = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": 64}
    inv_freq, _ = rt.rope_parameters(32, 10000.0, scaling, seq_len=256)
    expected, _ = rt.rope_parameters(32, 10000.0, {"rope_type": "ntk", "factor": 4.0})
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0.0)


# --- properties ------------------------------------------------------------------------------


def _every_method_at_factor_one(dim: int) -> list[dict]:
    ones = [1.0] * (dim // 2)
    return [
        {"rope_type": "linear", "factor": 1.0},
        {"rope_type": "ntk", "factor": 1.0},
        {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": 64},
        {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 64},
        {**LLAMA3, "factor": 1.0},
        {
            "rope_type": "longrope",
            "factor": 1.0,
            "original_max_position_embeddings": 64,
            "short_factor": ones,
            "long_factor": ones,
        },
    ]


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("seq_len", [None, 10, 64])
def test_every_method_at_factor_one_is_the_default(dim: int, seq_len: int | None) -> None:
    """Within the trained window of 64 (dynamic NTK is not the identity past it, see below)."""
    default = rt.rope_frequencies(dim, 10000.0)
    for scaling in _every_method_at_factor_one(dim):
        inv_freq, attention_factor = rt.rope_parameters(dim, 10000.0, scaling, seq_len=seq_len)
        torch.testing.assert_close(inv_freq, default, rtol=1e-6, atol=0.0, msg=str(scaling))
        assert attention_factor == 1.0, scaling


def test_registry_holds_every_method() -> None:
    assert set(rt.SCALINGS) == {
        "default",
        "linear",
        "ntk",
        "dynamic",
        "yarn",
        "llama3",
        "longrope",
    }


@pytest.mark.parametrize("seq_len", [None, 1, 500, 2047, 2048])
def test_dynamic_is_the_default_up_to_the_trained_window(seq_len: int | None) -> None:
    scaling = {"rope_type": "dynamic", "factor": 8.0, "original_max_position_embeddings": 2048}
    inv_freq, _ = rt.rope_parameters(64, 10000.0, scaling, seq_len=seq_len)
    assert torch.equal(inv_freq, rt.rope_frequencies(64, 10000.0))


def test_dynamic_grows_past_the_window_and_reaches_its_documented_base() -> None:
    scaling = {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 1024}
    dim = 64
    just_past, _ = rt.rope_parameters(dim, 10000.0, scaling, seq_len=1025)
    assert (just_past < rt.rope_frequencies(dim, 10000.0)).sum() == dim // 2 - 1  # all but pair 0
    # At l = s L the base is b (s^2 - s + 1)^(d/(d-2)) (13 for s = 4), not the static s^(d/(d-2)).
    at_target, _ = rt.rope_parameters(dim, 10000.0, scaling, seq_len=4096)
    expected = rt.rope_parameters(dim, 10000.0, {"rope_type": "ntk", "factor": 13.0})[0]
    torch.testing.assert_close(at_target, expected, rtol=1e-6, atol=0.0)


def test_pi_is_positions_divided_by_the_factor() -> None:
    apply_rope = getattr(rt, "apply_rope", None)
    if apply_rope is None:
        pytest.skip("rt.apply_rope (Part II) is not available yet")
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, 32, generator=generator, dtype=torch.float64)
    positions = torch.arange(40)
    for layout in ("half", "interleaved"):
        for factor in (2.0, 4.0, 8.0):
            scaled = apply_rope(
                x,
                positions,
                base=10000.0,
                layout=layout,
                scaling={"rope_type": "linear", "factor": factor},
            )
            divided = apply_rope(x, positions.double() / factor, base=10000.0, layout=layout)
            torch.testing.assert_close(scaled, divided, rtol=1e-6, atol=1e-6)


def test_yarn_ramp_keeps_fast_pairs_and_interpolates_slow_pairs() -> None:
    dim, base, window = 128, 10000.0, 4096
    turns = [window / (2 * math.pi * base ** (2 * i / dim)) for i in range(dim // 2)]
    gamma = rt.yarn_ramp(dim, base, window)
    for i, r in enumerate(turns):
        if r >= 32:
            assert gamma[i] == 1.0, (i, r)
        if r < 1:
            assert gamma[i] == 0.0, (i, r)
    assert torch.all(gamma[1:] <= gamma[:-1])  # non-increasing in the pair index
    assert 0 < gamma.min() + 1 and ((gamma > 0) & (gamma < 1)).any()
    # The YaRN frequencies are that blend of the original and the PI frequency.
    theta = torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    inv_freq, _ = rt.rope_parameters(dim, base, {**YARN, "factor": 8.0})
    torch.testing.assert_close(
        inv_freq.double(), gamma * theta + (1 - gamma) * theta / 8, rtol=1e-6, atol=0.0
    )


def test_yarn_correction_range_matches_the_rotation_count() -> None:
    # Pair i turns window / (2 pi base^(2i/d)) times; index where that equals 32 (and 1).
    dim, base, window = 128, 10000.0, 4096
    exact = [dim * math.log(window / (2 * math.pi * r)) / (2 * math.log(base)) for r in (32, 1)]
    assert rt.yarn_correction_range(dim, base, window, truncate=False) == pytest.approx(exact)
    assert rt.yarn_correction_range(dim, base, window) == (
        math.floor(exact[0]),
        math.ceil(exact[1]),
    )


@pytest.mark.parametrize(
    ("factor", "published"), [(2, 1.069), (4, 1.139), (8, 1.208), (16, 1.277), (32, 1.347)]
)
def test_yarn_temperature_matches_the_paper(factor: float, published: float) -> None:
    """Values of sqrt(1/t) printed in Peng et al. (2023), appendix A.2."""
    assert rt.yarn_mscale(factor) == pytest.approx(published, abs=5e-4)
    _, attention_factor = rt.rope_parameters(64, 10000.0, {**YARN, "factor": float(factor)})
    assert attention_factor == pytest.approx(published, abs=5e-4)


def test_llama3_bands_by_wavelength() -> None:
    """Wavelengths below 8192/4 untouched, above 8192/1 divided by 8 (Meta's apply_scaling)."""
    dim, base = 128, 500000.0
    inv_freq, attention_factor = rt.rope_parameters(dim, base, LLAMA3)
    theta = rt.rope_frequencies(dim, base).double()
    wavelength = 2 * math.pi / theta
    short, long_ = wavelength < 2048, wavelength > 8192
    assert short.any() and long_.any() and (~short & ~long_).any()
    torch.testing.assert_close(inv_freq.double()[short], theta[short], rtol=1e-6, atol=0.0)
    torch.testing.assert_close(inv_freq.double()[long_], theta[long_] / 8, rtol=1e-6, atol=0.0)
    assert attention_factor == 1.0


def test_longrope_attention_factor_test_vector() -> None:
    """Phi-3-mini-128k style: 131072 / 4096 = 32 gives sqrt(1 + ln 32 / ln 4096) = 1.190238071."""
    ones = [1.0] * 48
    scaling = {
        "rope_type": "longrope",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "short_factor": ones,
        "long_factor": [2.0] * 48,
    }
    short, attention_factor = rt.rope_parameters(96, 10000.0, scaling, seq_len=10)
    long_, _ = rt.rope_parameters(96, 10000.0, scaling, seq_len=5000)
    assert attention_factor == pytest.approx(1.190238071, abs=1e-9)
    torch.testing.assert_close(short, rt.rope_frequencies(96, 10000.0))
    torch.testing.assert_close(long_, rt.rope_frequencies(96, 10000.0) / 2)


def test_rotations_per_window_formula() -> None:
    turns = rt.rotations_per_window(8, 100.0, 1000)
    expected = [1000 / (2 * math.pi * 100.0 ** (2 * i / 8)) for i in range(4)]
    torch.testing.assert_close(turns, torch.tensor(expected, dtype=torch.float64))


def test_legacy_type_key_and_matching_rope_theta_are_accepted() -> None:
    new = rt.rope_parameters(32, 500000.0, {"rope_type": "linear", "factor": 2.0})
    old = rt.rope_parameters(32, 500000.0, {"type": "linear", "factor": 2, "rope_theta": 500000.0})
    assert torch.equal(new[0], old[0]) and new[1] == old[1]


def test_scaling_dict_is_not_modified() -> None:
    scaling = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}
    rt.rope_parameters(16, 10000.0, scaling)
    assert scaling == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}


# --- bad settings: a ValueError that names the key and the value ------------------------------

BAD = [
    ({"rope_type": "ntk-by-parts", "factor": 2.0}, ["rope_type", "ntk-by-parts"]),
    ({"rope_type": "linear"}, ["factor"]),
    ({"rope_type": "linear", "factor": 0.5}, ["factor", "0.5"]),
    ({"rope_type": "ntk", "factor": "4"}, ["factor", "'4'"]),
    ({"rope_type": "ntk", "factor": True}, ["factor", "True"]),
    ({"rope_type": "ntk", "factor": float("nan")}, ["factor", "nan"]),
    ({"rope_type": "dynamic", "factor": 2.0}, ["original_max_position_embeddings"]),
    (
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 2048.5},
        ["original_max_position_embeddings", "2048.5"],
    ),
    ({**YARN, "beta_fast": 1.0, "beta_slow": 32.0}, ["beta_fast", "beta_slow", "swap"]),
    ({**YARN, "beta_slow": 0.0}, ["beta_slow", "0.0"]),
    ({**YARN, "beta_fats": 32.0}, ["beta_fats", "32.0"]),
    ({**YARN, "truncate": "no"}, ["truncate", "'no'"]),
    ({**YARN, "attention_factor": -1.0}, ["attention_factor", "-1.0"]),
    ({**YARN, "factor": None}, ["factor", "None"]),
    ({**LLAMA3, "low_freq_factor": 4.0}, ["low_freq_factor", "high_freq_factor", "4.0"]),
    ({**LLAMA3, "low_freq_factor": 5.0}, ["low_freq_factor", "5.0"]),
    ({k: v for k, v in LLAMA3.items() if k != "high_freq_factor"}, ["high_freq_factor"]),
    ({"rope_type": "linear", "factor": 2.0, "rope_theta": 500000.0}, ["rope_theta", "500000.0"]),
    (
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "short_factor": [1.0] * 3,
            "long_factor": [1.0] * 4,
        },
        ["short_factor", "4"],
    ),
    (
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "short_factor": [1.0] * 4,
            "long_factor": [1.0, 1.0, "x", 1.0],
        },
        ["long_factor", "'x'"],
    ),
    (
        {
            "rope_type": "longrope",
            "original_max_position_embeddings": 64,
            "short_factor": [1.0] * 4,
            "long_factor": [1.0] * 4,
        },
        ["factor"],
    ),
]


@pytest.mark.parametrize(("scaling", "words"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_settings_raise_naming_key_and_value(scaling: dict, words: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        rt.rope_parameters(8, 10000.0, scaling)
    for word in words:
        assert word in str(error.value), (word, str(error.value))


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: rt.rope_parameters(2, 10000.0, {"rope_type": "ntk", "factor": 2.0}), ["dim"]),
        (lambda: rt.ntk_scaled_base(10000.0, 4.0, 7), ["dim", "7"]),
        (lambda: rt.rope_parameters(7, 10000.0), ["dim", "7"]),
        (lambda: rt.rope_parameters(8, 10000.0, seq_len=0), ["seq_len", "0"]),
        (lambda: rt.rope_parameters(8, 10000.0, seq_len=3.5), ["seq_len", "3.5"]),
        (lambda: rt.yarn_ramp(64, 10000.0, 4096, beta_fast=1, beta_slow=32), ["beta_fast"]),
    ],
)
def test_bad_arguments_raise(call, words: list[str]) -> None:
    with pytest.raises(ValueError) as error:
        call()
    for word in words:
        assert word in str(error.value)
