"""Tests of ``rope_tutor.lab.model.attention_probabilities``: the per-head attention weights of a
lab model, computed on ``TinyLM.forward``'s code path (chapter "Finding the needle")."""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor.alibi import alibi_bias
from rope_tutor.lab.model import ENCODINGS, ModelConfig, TinyLM, attention_probabilities

SEQ = 24


def _model(encoding: str, seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    model = TinyLM(ModelConfig(encoding=encoding, num_layers=2, dim=32, num_heads=4, context=32))
    for parameter in model.parameters():  # larger than the init, so that rows are not uniform
        torch.nn.init.normal_(parameter, std=0.3)
    return model.eval()


def _tokens(batch: int = 2, seq: int = SEQ) -> torch.Tensor:
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_logits_are_forwards_and_rows_are_causal_distributions(encoding: str) -> None:
    model, tokens = _model(encoding), _tokens()
    logits, weights = attention_probabilities(model, tokens)
    torch.testing.assert_close(logits, model(tokens), rtol=1e-5, atol=1e-5)
    assert weights.shape == (2, 2, 4, SEQ, SEQ) and weights.dtype == torch.float32
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 4, SEQ))
    future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
    assert (weights[..., future] == 0).all()
    assert weights[..., 1:, :].max() < 0.99  # beyond query 0, not one-hot: the test can fail


def test_rope_scaling_in_force_is_used() -> None:
    model, tokens = _model("rope"), _tokens()
    _, plain = attention_probabilities(model, tokens)
    model.set_rope_scaling({"rope_type": "linear", "factor": 4.0})
    logits, scaled = attention_probabilities(model, tokens)
    torch.testing.assert_close(logits, model(tokens), rtol=1e-5, atol=1e-5)
    assert (scaled - plain).abs().max() > 1e-3


@pytest.mark.parametrize("encoding", ["none", "alibi"])
def test_first_layer_matches_softmax_of_scores_by_hand(encoding: str) -> None:
    """Layer 0 from the weights alone: softmax(q k^T / sqrt(d_h) + bias), future masked."""
    model, tokens = _model(encoding), _tokens()
    _, weights = attention_probabilities(model, tokens)
    block, cfg = model.blocks[0], model.config
    with torch.no_grad():
        h = block.attn_norm(model.embed(tokens) * math.sqrt(cfg.dim))
        w_q, w_k, _ = block.attn.qkv.weight.split(cfg.dim)
        d_h = cfg.dim // cfg.num_heads
        q = (h @ w_q.T).view(2, SEQ, cfg.num_heads, d_h).transpose(1, 2)
        k = (h @ w_k.T).view(2, SEQ, cfg.num_heads, d_h).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d_h)
        if encoding == "alibi":
            scores = scores + alibi_bias(cfg.num_heads, SEQ)
        future = torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)
        expected = scores.masked_fill(future, float("-inf")).softmax(-1)
    torch.testing.assert_close(weights[0], expected, rtol=1e-5, atol=1e-6)


def test_bad_tokens_are_refused_with_their_dtype_and_shape() -> None:
    model = _model("rope")
    with pytest.raises(ValueError, match="int64 tensor of shape"):
        attention_probabilities(model, _tokens().float())
    with pytest.raises(ValueError, match=r"shape \(24,\)"):
        attention_probabilities(model, _tokens()[0])
