"""Tests of Part V, the lab (rope_tutor.lab): model, data, training schedule, evaluation, command.

The slow test re-trains one arm of "Train short, test long" at the book's configuration and
compares it with the numbers saved in rope_tutor/results/lab/seed_1/.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rope_tutor as rt
from rope_tutor import lab
from rope_tutor.lab.data import (
    corpus_files,
    fixed_target_windows,
    load_corpus,
    needle_batch,
    training_batches,
)
from rope_tutor.lab.evaluate import (
    cache_losses,
    cached_logits,
    chunked_loss,
    fixed_target_losses,
    needle_accuracy,
    per_position_loss,
)
from rope_tutor.lab.extend import extension_methods
from rope_tutor.lab.model import ENCODINGS, ModelConfig, TinyLM, load_checkpoint, save_checkpoint
from rope_tutor.lab.settings import BOOK, QUICK, SEED_STRIDE, load_corpus_for
from rope_tutor.lab.summary import write_summary
from rope_tutor.lab.train import TrainConfig, fit, learning_rate, train
from rope_tutor.results import RESULTS_DIR

DATA = RESULTS_DIR / "lab"
#: The folder holding the rope_tutor under test, so that the command runs that same code.
PACKAGE_PARENT = Path(rt.__file__).resolve().parent.parent


def make_model(encoding: str, *, num_layers: int = 2, context: int = 32, seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(
        ModelConfig(encoding=encoding, num_layers=num_layers, dim=32, num_heads=2, context=context)
    ).eval()


def random_tokens(batch: int, seq: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# The model


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_changing_a_future_byte_never_changes_an_earlier_output(encoding: str) -> None:
    model = make_model(encoding)
    tokens = random_tokens(2, 32)
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.allclose(before[:, :20], after[:, :20], atol=1e-6, rtol=0)
    assert not torch.allclose(before[:, 20:], after[:, 20:], atol=1e-4)  # the change is seen


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_forward_and_backward_are_causal_on_the_device(encoding: str, device: str) -> None:
    """On each device: the logits equal the CPU's, and in the backward pass the outputs before
    position 20 send no gradient to the inputs at positions 20 and later (and some to earlier)."""
    model = make_model(encoding)
    tokens = random_tokens(2, 32)
    with torch.no_grad():
        on_cpu = model(tokens)
    model = model.to(device)
    inputs: list[torch.Tensor] = []

    def leaf(module, args, output):  # the embedded bytes, as a leaf we can differentiate against
        inputs.append(output.detach().requires_grad_())
        return inputs[-1]

    handle = model.embed.register_forward_hook(leaf)
    try:
        logits = model(tokens.to(device))
    finally:
        handle.remove()
    assert logits.device.type == device
    torch.testing.assert_close(logits.detach().cpu(), on_cpu, rtol=1e-4, atol=1e-4)
    (grad,) = torch.autograd.grad(logits[:, :20].square().sum(), inputs)
    assert torch.equal(grad[:, 20:], torch.zeros_like(grad[:, 20:]))
    assert (grad[:, :20].abs().sum(-1) > 0).all()


@pytest.mark.parametrize("encoding", [e for e in ENCODINGS if e != "none"])
def test_each_encoding_gives_the_model_word_order(encoding: str) -> None:
    # With one layer and no position encoding, the last output depends on the earlier bytes only
    # as a set (attention is a weighted average over keys): swapping two of them changes nothing.
    # Every position encoding must break this symmetry.
    tokens = random_tokens(1, 24)
    swapped = tokens.clone()
    swapped[0, [3, 10]] = tokens[0, [10, 3]]
    with torch.no_grad():
        nope = make_model("none", num_layers=1)
        assert torch.allclose(nope(tokens)[0, -1], nope(swapped)[0, -1], atol=1e-5)
        model = make_model(encoding, num_layers=1)
        assert not torch.allclose(model(tokens)[0, -1], model(swapped)[0, -1], atol=1e-4)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_forward_returns_the_attention_weights_of_its_own_logits(encoding: str) -> None:
    """``return_attention=True`` gives the same logits as the default (SDPA) pass, causal rows
    that sum to 1, and, in layer 1, the softmax of q·k/sqrt(d_h) (+ the ALiBi bias) by hand."""
    model = make_model(encoding).double()
    tokens = random_tokens(2, 12)
    with torch.no_grad():
        plain = model(tokens)
        logits, weights = model(tokens, return_attention=True)
        x = model.embed(tokens) * math.sqrt(model.config.dim)
        if encoding == "learned":
            x = x + model.positional(torch.arange(12))
        elif encoding == "sinusoidal":
            x = x + rt.sinusoidal_encoding(12, model.config.dim).double()
        attn = model.blocks[0].attn
        q, k, _ = attn.qkv(model.blocks[0].attn_norm(x)).view(2, 12, 3, 2, 16).unbind(dim=2)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # (batch, heads, seq, head_dim)
        if encoding == "rope":
            q, k = attn.rotary(q, k, torch.arange(12))
        future = torch.ones(12, 12, dtype=torch.bool).triu(1)
        scores = (q @ k.transpose(-2, -1) / 4.0).masked_fill(future, -math.inf)
        if encoding == "alibi":
            scores = scores + rt.alibi_bias(2, 12).double()
    torch.testing.assert_close(logits, plain, rtol=0, atol=1e-10)
    assert len(weights) == 2 and all(w.shape == (2, 2, 12, 12) for w in weights)
    for w in weights:
        assert (w.triu(1) == 0).all()
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 12, dtype=torch.float64))
    torch.testing.assert_close(weights[0], scores.softmax(-1), rtol=0, atol=1e-12)


def test_learned_table_cannot_run_past_its_size() -> None:
    model = make_model("learned", context=32)
    with torch.no_grad():
        model(random_tokens(1, 32))  # fits
        with pytest.raises(IndexError, match="max_positions=32"):
            model(random_tokens(1, 33))


@pytest.mark.parametrize(
    "scaling",
    [
        {"rope_type": "default"},
        {"rope_type": "linear", "factor": 1.0},
        {"rope_type": "ntk", "factor": 1.0},
        {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 32},
        # dynamic NTK is plain RoPE up to its window, whatever the factor
        {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 64},
    ],
)
def test_rope_scaling_at_factor_one_is_the_identity(scaling: dict) -> None:
    model = make_model("rope")
    tokens = random_tokens(2, 64)
    with torch.no_grad():
        plain = model(tokens)
        model.set_rope_scaling(scaling)
        assert torch.equal(model(tokens), plain)


def test_rope_scaling_changes_the_model_and_is_refused_without_rope() -> None:
    model = make_model("rope")
    tokens = random_tokens(1, 64)
    with torch.no_grad():
        plain = model(tokens)
        model.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
        stretched = model(tokens)
        model.set_rope_scaling(None)
        assert torch.equal(model(tokens), plain)
    assert not torch.allclose(stretched, plain, atol=1e-4)
    with pytest.raises(ValueError, match="encoding='rope'"):
        make_model("alibi").set_rope_scaling({"rope_type": "linear", "factor": 2.0})


def test_position_interpolation_reads_position_m_as_m_over_s() -> None:
    # Independent of the scaling code: PI with factor 2 rotates q and k at position m by the
    # angles plain RoPE uses at m / 2, written here from the RoFormer formula.
    head_dim, s = 8, 2.0
    q = torch.randn(1, 1, 6, head_dim, dtype=torch.float64)
    theta = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = (torch.arange(6, dtype=torch.float64)[:, None] / s) * theta  # (seq, d/2)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # half layout
    rotated = q * cos + torch.cat((-q[..., head_dim // 2 :], q[..., : head_dim // 2]), -1) * sin
    rotary = rt.RotaryEmbedding(head_dim, scaling={"rope_type": "linear", "factor": s})
    q_rot, _ = rotary(q, q, torch.arange(6))
    assert torch.allclose(q_rot, rotated, atol=1e-12)


def test_bad_configuration_is_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match="encoding="):
        ModelConfig(encoding="t5")
    with pytest.raises(ValueError, match="dim=30"):
        ModelConfig(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="int64"):
        make_model("none")(torch.zeros(1, 4))


def test_checkpoint_round_trip_with_safetensors(tmp_path: Path) -> None:
    model = make_model("rope")
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, path)
    loaded = load_checkpoint(path)
    assert loaded.config == model.config
    tokens = random_tokens(2, 40)
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))
    # the file is plain tensors: safetensors can read it without any of our code
    from safetensors.torch import load_file

    assert set(load_file(str(path))) == set(model.state_dict())


def test_checkpoint_of_another_shape_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    save_checkpoint(make_model("learned"), path)
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as handle:
        state = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        config = json.loads(handle.metadata()["config"])
    config["encoding"] = "none"  # metadata no longer matches the tensors (extra table)
    save_file(state, str(path), metadata={"config": json.dumps(config)})
    with pytest.raises(ValueError, match="does not hold the weights"):
        load_checkpoint(path)


# ----------------------------------------------------------------------------------------------
# Data


def test_corpus_is_sorted_split_by_file_and_checksummed(tmp_path: Path) -> None:
    import hashlib
    import zlib

    for i in range(40):
        (tmp_path / f"m{i:02d}.py").write_text(f"x{i} = {i}\n" * 5)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "zz.py").write_text("never read\n")
    corpus = load_corpus(300, 60, root=tmp_path)
    files = sorted(tmp_path.glob("m*.py"))
    validation = [f for f in files if zlib.crc32(f.name.encode()) % 10 == 0]
    expected_train = b"".join(f.read_bytes() for f in files if f not in validation)
    expected_validation = b"".join(f.read_bytes() for f in validation)
    assert bytes(corpus.train.tolist()) == expected_train[:300]
    assert bytes(corpus.validation.tolist()) == expected_validation[:60]
    assert corpus.train_sha256 == hashlib.sha256(expected_train[:300]).hexdigest()
    listed = corpus_files(tmp_path)  # the order and split load_corpus uses, as the chapters read it
    assert [path for path, _ in listed] == files  # tests/zz.py is left out
    assert [path for path, split in listed if split == "validation"] == validation
    with pytest.raises(RuntimeError, match="too little"):
        load_corpus(10**6, 60, root=tmp_path)
    with pytest.raises(ValueError, match="train_bytes=0"):
        load_corpus(0, 60, root=tmp_path)


def test_data_order_depends_only_on_the_seed() -> None:
    data = torch.arange(1000, dtype=torch.uint8)
    first = training_batches(data, 4, 16, 10, seed=3)
    assert torch.equal(first, training_batches(data, 4, 16, 10, seed=3))
    assert not torch.equal(first, training_batches(data, 4, 16, 10, seed=4))
    assert int(first.max()) + 17 <= 1000  # every window fits


def test_needle_sequences_hide_the_key_once_and_ask_for_it_at_the_end() -> None:
    tokens, depth = needle_batch(16, 64, 4, torch.Generator().manual_seed(0))
    assert tokens.shape == (16, 64)
    for row, start in zip(tokens, depth.tolist(), strict=True):
        text = bytes(row.tolist()).decode()
        key = text[-4:]
        assert text[-5] == "=" and key.isupper() and len(set(key)) == 4
        assert text[start : start + 5] == "=" + key
        assert text.count("=") == 2  # the needle and the question, nothing else
    assert sorted(set(depth.tolist())) != [int(depth[0])]  # depths vary
    with pytest.raises(ValueError, match="too short"):
        needle_batch(1, 9, 4, torch.Generator())


# ----------------------------------------------------------------------------------------------
# Training schedule and evaluation protocols


def test_learning_rate_warms_up_linearly_then_decays_by_cosine() -> None:
    config = TrainConfig(steps=110, lr=1.0, warmup_steps=10, final_lr_fraction=0.1)
    assert learning_rate(0, config) == pytest.approx(0.1)
    assert learning_rate(9, config) == pytest.approx(1.0)
    assert learning_rate(10, config) == pytest.approx(1.0)
    middle = 10 + (110 - 10 - 1) / 2
    assert learning_rate(int(middle), config) == pytest.approx(
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * int(middle - 10) / 99))
    )
    assert learning_rate(109, config) == pytest.approx(0.1)


def test_training_is_deterministic_and_lowers_the_loss() -> None:
    offsets = random_tokens(64, 1)
    tokens = 97 + (torch.arange(17)[None, :] + offsets) % 7  # "abcdefgabc..." from random starts

    def batch(step: int):
        rows = tokens[(4 * step) % 64 : (4 * step) % 64 + 4]
        return rows[:, :-1], rows[:, 1:], None

    config = TrainConfig(steps=12, batch_size=4, lr=3e-3, warmup_steps=2)
    runs = []
    for _ in range(2):
        model = make_model("rope", context=16)
        runs.append(train(model, batch, config, progress=False))
    assert runs[0] == runs[1]
    assert runs[0][-1] < runs[0][0]


def cyclic_batches(config: TrainConfig):
    """Batches of "abcdefgabc..." windows whose start offsets are drawn from ``config.seed``."""
    generator = torch.Generator().manual_seed(config.seed)
    offsets = torch.randint(0, 7, (config.steps, config.batch_size, 1), generator=generator)
    windows = 97 + (torch.arange(17) + offsets) % 7  # (steps, batch, 17)

    def batch(step: int):
        return windows[step, :, :-1], windows[step, :, 1:], None

    return batch


def test_fit_is_the_same_run_for_the_same_seed_and_arm() -> None:
    # Independent of fit: the same run written out by hand (seed, build, train) gives the same
    # losses and weights, bit for bit.
    config = TrainConfig(steps=6, batch_size=4, lr=3e-3, warmup_steps=2, seed=3)
    arm = ModelConfig(encoding="rope", num_layers=1, dim=32, num_heads=2, context=16)
    fitted = fit(arm, cyclic_batches, config, progress=False)
    rt.seed_everything(3, threads=None)
    by_hand = TinyLM(arm)
    assert train(by_hand, cyclic_batches(config), config, progress=False) == fitted.losses
    weights = fitted.model.state_dict()
    assert all(torch.equal(weights[name], t) for name, t in by_hand.state_dict().items())
    assert fitted.seed == 3 and fitted.seconds > 0
    other_seed = fit(arm, cyclic_batches, config, seed=4, progress=False)
    assert other_seed.seed == 4 and other_seed.losses != fitted.losses
    other_arm = fit(
        ModelConfig(encoding="alibi", num_layers=1, dim=32, num_heads=2, context=16),
        cyclic_batches,
        config,
        progress=False,
    )
    assert other_arm.losses != fitted.losses


def test_fit_keeps_the_thread_count_its_caller_pinned() -> None:
    # python -m rope_tutor.lab --threads N pins N once; a training run must not reset it.
    config = TrainConfig(steps=1, batch_size=2, warmup_steps=1)
    pinned = torch.get_num_threads()
    try:
        for threads in (2, 1):
            torch.set_num_threads(threads)
            fit(make_model("rope", context=16).config, cyclic_batches, config, progress=False)
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(pinned)


def test_fit_fine_tunes_a_copy_with_the_scaling_in_place() -> None:
    config = TrainConfig(steps=3, batch_size=4, lr=3e-3, warmup_steps=1, seed=1)
    base = make_model("rope", context=16)
    before = {name: tensor.clone() for name, tensor in base.state_dict().items()}
    pi = {"rope_type": "linear", "factor": 2.0}
    tuned = fit(base, cyclic_batches, config, scaling=pi, progress=False)
    assert tuned.model is not base and tuned.model.rope_scaling == pi
    assert base.rope_scaling is None
    assert all(torch.equal(before[n], t) for n, t in base.state_dict().items())  # untouched
    # the copy starts from base's weights: its first loss is base's loss on the first batch
    inputs, targets, _ = cyclic_batches(config)(0)
    base.set_rope_scaling(pi)
    with torch.no_grad():
        first = torch.nn.functional.cross_entropy(base(inputs).flatten(0, 1), targets.flatten())
    assert tuned.losses[0] == pytest.approx(first.item(), rel=1e-6)
    with pytest.raises(TypeError, match="arm must be"):
        fit("rope", cyclic_batches, config, progress=False)


def test_the_lab_imports_modules_not_the_package_front_door() -> None:
    import ast

    import rope_tutor.lab

    for path in Path(rope_tutor.lab.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                assert all(alias.name != "rope_tutor" for alias in node.names), path.name
            if isinstance(node, ast.ImportFrom) and node.module == "rope_tutor":
                # only the version constant, which lives in the package's __init__
                assert [alias.name for alias in node.names] == ["__version__"], path.name


def test_fixed_target_protocol_scores_the_same_bytes_with_more_context() -> None:
    model = make_model("alibi")
    data = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0))
    windows = fixed_target_windows(data.to(torch.uint8), 3, 64, seed=5)
    result = fixed_target_losses(model, windows, [16, 64], targets=16)
    # with context == targets, the score is the mean loss of a 16-byte window from scratch
    curve = per_position_loss(model, windows[:, -17:])
    assert result[16][0] == pytest.approx(curve.mean().item(), rel=1e-6)
    assert set(result) == {16, 64}
    with pytest.raises(ValueError, match="contexts"):
        fixed_target_losses(model, windows, [8], targets=16)


def _dynamic_ntk_theta(head_dim: int, base: float, window: int, length: int) -> torch.Tensor:
    """theta(length) of dynamic NTK, factor 1, written from the formula (chapter "NTK-aware
    scaling", (dynamic-ntk-base)): b' = b max(1, length / window)^(d/(d-2)), float64 (d/2,)."""
    scale = max(1.0, length / window)
    new_base = base * scale ** (head_dim / (head_dim - 2))
    return new_base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def _cached_logits_by_angles(model: TinyLM, tokens: torch.Tensor, cache: str) -> torch.Tensor:
    """An independent reference for ``cached_logits`` under dynamic NTK (factor 1): every score
    at once, pairs as complex numbers, pair p of score (i, j) turned by (i - j) theta_p(i + 1)
    (raw keys) or i theta_p(i + 1) - j theta_p(j + 1) (rotated keys), causal softmax."""
    config = model.config
    batch, n = tokens.shape
    hd, half = model.head_dim, model.head_dim // 2
    theta = torch.stack(
        [_dynamic_ntk_theta(hd, config.rope_base, config.context, m + 1) for m in range(n)]
    )  # (n, hd/2): row i is theta(i + 1)
    pos = torch.arange(n, dtype=torch.float64)
    if cache == "raw":
        angle = (pos[:, None] - pos[None, :])[..., None] * theta[:, None, :]
    else:
        own = pos[:, None] * theta  # (n, hd/2): position m at length m + 1
        angle = own[:, None, :] - own[None, :, :]
    phase = torch.polar(torch.ones_like(angle), angle)  # (n, n, hd/2)
    blocked = ~torch.ones(n, n, dtype=torch.bool).tril()
    x = model.embed(tokens).double() * math.sqrt(config.dim)
    for block in model.blocks:
        attn = block.attn
        qkv = attn.qkv(block.attn_norm(x)).view(batch, n, 3, attn.num_heads, hd)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # (batch, heads, n, hd)
        zq = torch.complex(q[..., :half], q[..., half:])  # half layout: pair p is (x[p], x[p+d/2])
        zk = torch.complex(k[..., :half], k[..., half:])
        scores = (zq[..., :, None, :] * zk[..., None, :, :].conj() * phase).sum(-1).real
        weights = (scores / math.sqrt(hd)).masked_fill(blocked, float("-inf")).softmax(-1)
        y = (weights @ v).transpose(1, 2).reshape(batch, n, config.dim)
        x = x + attn.out(y)
        x = x + block.mlp(block.mlp_norm(x))
    return torch.nn.functional.linear(model.final_norm(x), model.embed.weight)


@pytest.mark.parametrize(
    "scaling", [None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "ntk", "factor": 4.0}]
)
def test_cached_logits_is_the_forward_when_theta_does_not_depend_on_the_length(scaling) -> None:
    model = make_model("rope", context=8).double()
    model.set_rope_scaling(scaling)
    tokens = random_tokens(2, 24)
    with torch.no_grad():
        forward = model(tokens)  # one causal pass, the model's own code
    for cache in ("raw", "rotated"):
        assert torch.allclose(cached_logits(model, tokens, cache), forward, rtol=0, atol=1e-10)


def test_cached_logits_matches_the_score_angles_under_dynamic_ntk() -> None:
    window = 8
    model = make_model("rope", context=window).double()
    dynamic = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": window}
    model.set_rope_scaling(dynamic)
    tokens = random_tokens(2, 3 * window)
    with torch.no_grad():
        raw, rotated = (cached_logits(model, tokens, c) for c in ("raw", "rotated"))
        for cache, got in (("raw", raw), ("rotated", rotated)):
            expected = _cached_logits_by_angles(model, tokens, cache)
            # the package's theta is float32 (rope_parameters): ~1e-8 relative, 1e-9 here
            assert torch.allclose(got, expected, rtol=0, atol=1e-7), cache
        # inside the window both are the model's forward; past it the rotated keys drift
        assert torch.allclose(raw[:, :window], model(tokens[:, :window]), rtol=0, atol=1e-10)
        assert torch.equal(raw[:, :window], rotated[:, :window])
        assert (raw[:, window:] - rotated[:, window:]).abs().amax() > 1e-3


def test_cached_logits_with_raw_keys_is_a_fresh_pass_for_one_layer() -> None:
    # With one layer a key depends on its byte only, so re-rotating the cached raw keys at length
    # l gives what the model's own forward over the first l bytes computes for its last byte.
    window = 8
    model = make_model("rope", num_layers=1, context=window).double()
    model.set_rope_scaling(
        {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": window}
    )
    tokens = random_tokens(1, 3 * window)
    with torch.no_grad():
        raw = cached_logits(model, tokens, "raw")
        for length in (1, window, window + 1, 2 * window + 3, 3 * window):
            fresh = model(tokens[:, :length])[:, -1]
            assert torch.allclose(raw[:, length - 1], fresh, rtol=0, atol=1e-10), length


def test_cached_logits_refuses_bad_input_with_the_value() -> None:
    tokens = random_tokens(1, 4)
    with pytest.raises(ValueError, match="cache="):
        cached_logits(make_model("rope"), tokens, "after")
    with pytest.raises(ValueError, match="encoding='rope'"):
        cached_logits(make_model("alibi"), tokens, "raw")
    with pytest.raises(ValueError, match="int64"):
        cached_logits(make_model("rope"), tokens.float(), "raw")


def test_cache_losses_reads_each_model_three_ways_and_restores_its_scaling() -> None:
    window = 8
    models = [make_model("rope", context=window, seed=seed).double() for seed in (0, 1)]
    models[1].set_rope_scaling({"rope_type": "linear", "factor": 2.0})  # restored afterwards
    dynamic = {"rope_type": "dynamic", "factor": 1.0, "original_max_position_embeddings": window}
    windows = random_tokens(3, 2 * window + 1)
    losses = cache_losses(models, windows, dynamic)
    assert set(losses) == {"none", "raw", "rotated"}
    assert all(v.shape == (2, 3, 2 * window) for v in losses.values())
    assert models[0].rope_scaling is None and models[1].rope_scaling["rope_type"] == "linear"
    with torch.no_grad():
        for k, model in enumerate(models):
            model.set_rope_scaling(None)
            own = torch.nn.functional.cross_entropy(
                model(windows[:, :-1]).transpose(1, 2), windows[:, 1:], reduction="none"
            )
            assert torch.equal(losses["none"][k], own)
            model.set_rope_scaling(dynamic)
            for cache in ("raw", "rotated"):
                # the reference computes each score's angles directly, not through cached_logits
                logits = _cached_logits_by_angles(model, windows[:, :-1], cache)
                expected = torch.nn.functional.cross_entropy(
                    logits.transpose(1, 2), windows[:, 1:], reduction="none"
                )
                assert torch.allclose(losses[cache][k], expected, rtol=0, atol=1e-6), cache
    # inside the window the three readings agree; past it the caches differ
    assert torch.allclose(losses["raw"][..., :window], losses["none"][..., :window], atol=1e-10)
    assert torch.equal(losses["raw"][..., :window], losses["rotated"][..., :window])
    assert (losses["raw"][..., window:] - losses["rotated"][..., window:]).abs().amax() > 1e-6
    with pytest.raises(ValueError, match="int64"):
        cache_losses(models, windows.float(), dynamic)


def test_chunked_protocol_cuts_the_stream_into_non_overlapping_chunks() -> None:
    model = make_model("alibi")
    data = torch.randint(0, 256, (600,), generator=torch.Generator().manual_seed(0))
    whole = chunked_loss(model, data, 256, 512)
    first = per_position_loss(model, data[:257].long()[None]).mean().item()
    second = per_position_loss(model, data[256:513].long()[None]).mean().item()
    assert whole == pytest.approx((first + second) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="multiple"):
        chunked_loss(model, data, 100, 512)


class InductionOracle(torch.nn.Module):
    """Solves the needle task by the rule written out: at each position, find the previous
    occurrence of the current byte and predict the byte that followed it."""

    def __init__(self) -> None:
        super().__init__()
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(*tokens.shape, 256)
        for b, row in enumerate(tokens.tolist()):
            for t, byte in enumerate(row):
                earlier = [j for j in range(t) if row[j] == byte]
                if earlier:
                    logits[b, t, row[earlier[-1] + 1]] = 1.0
        return logits


def test_needle_accuracy_scores_the_key_after_the_cue() -> None:
    oracle = InductionOracle()
    for cue in (0, 1):
        result = needle_accuracy(oracle, 48, 12, 5, seed=0, cue=cue)
        assert result["exact_match"] == 1.0 and result["per_letter"] == 1.0
    constant = make_model("none")  # an untrained model almost never retrieves a 4-letter key
    assert needle_accuracy(constant, 48, 12, 5, seed=0, cue=1)["exact_match"] < 0.2
    with pytest.raises(ValueError, match="cue"):
        needle_accuracy(oracle, 48, 2, 5, seed=0, cue=5)


def test_static_methods_use_one_factor_and_yarn_beta_is_rescaled_to_the_window() -> None:
    methods = extension_methods(BOOK)
    assert methods["rope"] is None
    assert {methods[m]["factor"] for m in ("pi", "ntk", "yarn_paper_beta")} == {4.0}
    assert methods["yarn_paper_beta"]["beta_fast"] == 32.0
    assert methods["yarn_rescaled_beta"]["beta_fast"] == 32.0 * 128 / 4096
    assert methods["dynamic_ntk"]["original_max_position_embeddings"] == 128


# ----------------------------------------------------------------------------------------------
# Saved results and the command line


def run_lab(*args: str, timeout: int) -> None:
    path = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": path}
    subprocess.run(
        [sys.executable, "-m", "rope_tutor.lab", *args, "--no-progress"],
        env=env,
        check=True,
        timeout=timeout,
    )


def test_saved_results_carry_provenance_and_sanity_checks() -> None:
    corpus = load_corpus_for(BOOK)  # the pinned sympy: the same bytes on every machine
    seeds = lab.load_seeds("train_short_test_long.json")
    assert list(seeds) == list(BOOK.seeds)
    for seed, data in seeds.items():
        prov = data["provenance"]
        for key in ("rope_tutor", "torch", "threads", "train_sha256", "seed", "steps"):
            assert key in prov
        assert prov["threads"] == 2
        assert prov["run_seed"] == seed
        assert prov["seed"] == BOOK.for_seed(seed).pretrain.seed
        assert prov["train_sha256"] == corpus.train_sha256
        assert prov["validation_sha256"] == corpus.validation_sha256
        assert data["arms"]["learned"]["fixed_target"]["2"] is None  # no table row past T
    for seed, extend in lab.load_seeds("extend_rope.json").items():
        assert extend["sanity"]["pi_factor_1_equals_rope"] is True
        # step 0 of the PI curve is the model before fine-tuning, PI at inference
        pi = extend["inference"]["pi"]["fixed_target"]
        assert extend["pi_curve"]["fixed_target"]["0"] == {m: v["mean"] for m, v in pi.items()}, (
            seed
        )
    for needle in lab.load_seeds("needle.json").values():
        for arm in needle["arms"].values():
            if "in_window" in arm:  # a length sweep is only reported once retrieval is learned
                assert ("sweep" in arm) == (arm["in_window"]["exact_match"] >= 0.95)


def test_saved_summary_is_what_the_summary_step_writes(tmp_path: Path) -> None:
    """``summary.json`` is re-derived from the saved seed files by the code, and its intervals
    and paired differences are re-computed here by hand (Student t, closed form for n = 3)."""
    shutil.copytree(DATA, tmp_path / "lab")
    (tmp_path / "lab" / "summary.json").unlink()
    assert write_summary(tmp_path / "lab") == json.loads((DATA / "summary.json").read_text())
    summary = json.loads((DATA / "summary.json").read_text())
    assert summary["seeds"] == list(BOOK.seeds)
    for seed in BOOK.seeds:  # every file summarised is named with its checksum and provenance
        for name in ("train_short_test_long.json", "extend_rope.json", "needle.json"):
            entry = summary["runs"][f"seed_{seed}"][name]
            digest = hashlib.sha256((DATA / f"seed_{seed}" / name).read_bytes()).hexdigest()
            assert entry["sha256"] == digest
            assert entry["provenance"]["run_seed"] == seed
    t2 = 0.95 / math.sqrt(2 * 0.975 * 0.025)  # Student t, 2 degrees of freedom, 97.5%
    files = lab.load_seeds("train_short_test_long.json")
    for arm in ("alibi", "sinusoidal", "none"):
        for m in ("1", "4", "16"):
            a = [files[s]["arms"][arm]["fixed_target"][m]["mean"] for s in BOOK.seeds]
            b = [files[s]["arms"]["rope"]["fixed_target"][m]["mean"] for s in BOOK.seeds]
            d = [x - y for x, y in zip(a, b, strict=True)]
            mean = sum(d) / 3
            half = t2 * math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
            entry = summary["versus_rope"]["language_model"][arm][m]
            assert entry["mean"] == pytest.approx(mean, abs=1e-5)
            assert entry["high"] - entry["low"] == pytest.approx(2 * half, abs=2e-5)
            tie = entry["low"] <= 0 <= entry["high"]
            assert (entry["verdict"] == "tie") == tie


@pytest.mark.slow
def test_quick_configuration_runs_every_experiment_and_resumes(tmp_path: Path) -> None:
    run_lab("all", "--quick", "--threads", "2", "--out", str(tmp_path), timeout=600)
    assert {p.name for p in tmp_path.iterdir()} == {
        "seed_0",
        "seed_1",
        "summary.json",
        "timings.json",
    }
    for seed in QUICK.seeds:
        folder = tmp_path / f"seed_{seed}"
        names = {p.name for p in folder.iterdir()}
        expected = {
            "train_short_test_long.json",
            "extend_rope.json",
            "yarn_beta.json",
            "heldout.json",
            "more_methods.json",
            "heldout_short_long.json",
            "base_sweep.json",
            "alibi_checkpoint.json",
            "alibi.safetensors",
            "needle.json",
            "heldout_needle.json",
            "needle_rope.safetensors",
            "rope.safetensors",
        }
        if seed in QUICK.other_needle_seeds:
            expected |= {"needle_alibi.json", "heldout_needle_alibi.json"}
        assert names == expected, seed
        extend = json.loads((folder / "extend_rope.json").read_text())
        assert extend["sanity"]["pi_factor_1_equals_rope"] is True
        assert list(extend["pi_curve"]["fixed_target"]) == [str(k) for k in QUICK.pi_curve_steps]
        assert set(extend["finetuned"]) == {
            "finetune_plain",
            "finetune_pi",
            "finetune_ntk",
            "finetune_yarn",
        }
        for name in {n for n in names if n.endswith(".json")}:
            prov = json.loads((folder / name).read_text())["provenance"]
            assert prov["command"] == f"python -m rope_tutor.lab {WRITTEN_BY[name]}", name
            assert prov["threads"] == 2, name  # --threads holds for the whole run
            assert prov["run_seed"] == seed, name
        train = json.loads((folder / "train_short_test_long.json").read_text())["provenance"]
        assert train["seed"] == QUICK.for_seed(seed).pretrain.seed
    first = json.loads((tmp_path / "seed_0" / "train_short_test_long.json").read_text())
    second = json.loads((tmp_path / "seed_1" / "train_short_test_long.json").read_text())
    assert first["arms"]["rope"]["train_loss"] != second["arms"]["rope"]["train_loss"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["runs"]) == {"seed_0", "seed_1"}

    # Resume: a second run keeps every finished file; a deleted one is the only step re-run.
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.glob("seed_*/*")}
    (tmp_path / "seed_1" / "yarn_beta.json").unlink()
    run_lab("all", "--quick", "--threads", "2", "--out", str(tmp_path), timeout=600)
    for path, stamp in stamps.items():
        if path.name != "yarn_beta.json" or path.parent.name != "seed_1":
            assert path.stat().st_mtime_ns == stamp, path
    assert (tmp_path / "seed_1" / "yarn_beta.json").is_file()


#: The subcommand that writes each saved file (``all`` runs every one of them).
WRITTEN_BY = {
    "train_short_test_long.json": "train-short-test-long",
    "extend_rope.json": "extend",
    "yarn_beta.json": "yarn-beta",
    "heldout.json": "heldout",
    "more_methods.json": "more-methods",
    "heldout_short_long.json": "heldout-short-long",
    "base_sweep.json": "base-sweep",
    "alibi_checkpoint.json": "alibi-checkpoint",
    "needle.json": "passkey",
    "heldout_needle.json": "heldout-needle",
    "needle_alibi.json": "needle-arm --encoding alibi",
    "heldout_needle_alibi.json": "heldout-needle-arm --encoding alibi",
}


def test_saved_results_name_the_subcommand_that_reproduces_them() -> None:
    for seed in BOOK.seeds:
        for name, subcommand in WRITTEN_BY.items():
            if "alibi" in name and seed not in BOOK.other_needle_seeds:
                continue
            saved = json.loads((DATA / f"seed_{seed}" / name).read_text())["provenance"]
            assert saved["command"] == f"python -m rope_tutor.lab {subcommand}", (name, saved)


def test_settings_for_a_seed_shift_every_training_seed_and_no_evaluation_seed() -> None:
    one = BOOK.for_seed(1)
    assert one.run_seed == 1 and BOOK.for_seed(0) == BOOK
    for name in ("pretrain", "finetune", "needle_train", "needle_finetune"):
        assert getattr(one, name).seed == getattr(BOOK, name).seed + SEED_STRIDE
        assert getattr(one.for_seed(2), name).seed == getattr(BOOK, name).seed + 2 * SEED_STRIDE
    assert one.eval_seed == BOOK.eval_seed
    with pytest.raises(ValueError, match="run_seed=-1"):
        BOOK.for_seed(-1)


def test_corpus_is_the_pinned_sympy_and_another_version_is_refused(monkeypatch) -> None:
    corpus = load_corpus(2000, 500)
    assert corpus.source.startswith("sympy==1.14.0")
    monkeypatch.setattr("importlib.metadata.version", lambda name: "1.13.3")
    with pytest.raises(RuntimeError, match=r"sympy==1\.13\.3 is installed"):
        load_corpus(2000, 500)


#: Same machine and torch build: bitwise equal. Another CPU (a different vector unit) changes the
#: last bits of reductions, which 500 training steps amplify; 0.02 nats is well below every gap
#: the chapter interprets (the smallest, between arms in window, is about 0.05 nats).
TOLERANCE = 0.02


@pytest.mark.slow
def test_rope_arm_reproduces_the_saved_numbers(tmp_path: Path) -> None:
    """Seed 1's RoPE arm re-trained from scratch by the command matches the saved one: the corpus
    is the pinned sympy, so this runs on every machine."""
    saved = json.loads((DATA / "seed_1" / "train_short_test_long.json").read_text())
    assert saved["provenance"]["train_sha256"] == load_corpus_for(BOOK).train_sha256
    run_lab("arm", "--encoding", "rope", "--seeds", "1", "--out", str(tmp_path), timeout=900)
    fresh = json.loads((tmp_path / "seed_1" / "arm_rope.json").read_text())
    assert fresh["provenance"]["seed"] == saved["provenance"]["seed"] == SEED_STRIDE
    book = saved["arms"]["rope"]
    for multiple, value in book["fixed_target"].items():
        assert fresh["fixed_target"][multiple]["mean"] == pytest.approx(
            value["mean"], abs=TOLERANCE
        )
    for multiple, value in book["chunked"].items():
        assert fresh["chunked"][multiple] == pytest.approx(value, abs=TOLERANCE)
