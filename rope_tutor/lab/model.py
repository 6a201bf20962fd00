"""A tiny byte-level decoder-only transformer whose position encoding is chosen by name.

Part V, "Train short, test long". The model is deliberately small and readable (in the spirit of
nanoGPT): pre-LayerNorm blocks of the package's own ``SelfAttention`` plus a GELU MLP, a tied
input/output byte embedding, no dropout, no biases in attention. Position enters in exactly one
of five ways, each implemented elsewhere in the package and only *called* here:

- ``"none"``: no position information at all (NoPE; Kazemnejad et al., 2023);
- ``"learned"``: ``LearnedPositionalEmbedding`` added to the byte embeddings (Part I);
- ``"sinusoidal"``: ``sinusoidal_encoding`` added to the byte embeddings (Part I; Vaswani et
  al., 2017);
- ``"rope"``: ``RotaryEmbedding`` rotating q and k in every layer (Part II; Su et al., 2021); a
  Hugging Face style ``rope_scaling`` dict can be swapped in at evaluation time (Part IV);
- ``"alibi"``: ``alibi_bias`` added to the attention logits (Part III; Press et al., 2022).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rope_tutor.absolute import LearnedPositionalEmbedding, sinusoidal_encoding
from rope_tutor.alibi import alibi_bias
from rope_tutor.attention import SelfAttention
from rope_tutor.rope import RotaryEmbedding

__all__ = [
    "ENCODINGS",
    "ModelConfig",
    "TinyLM",
    "attention_probabilities",
    "load_checkpoint",
    "save_checkpoint",
]

#: The position encodings the lab compares, in the order the chapters show them.
ENCODINGS = ("none", "learned", "sinusoidal", "rope", "alibi")


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a lab model. ``context`` is the training length T (the learned table's size)."""

    encoding: str = "rope"
    num_layers: int = 2
    dim: int = 128
    num_heads: int = 4
    context: int = 128
    vocab_size: int = 256
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}, got encoding={self.encoding!r}")
        if self.dim % self.num_heads or (self.dim // self.num_heads) % 2:
            raise ValueError(
                f"dim={self.dim} must split into num_heads={self.num_heads} heads of even size"
            )
        for name in ("num_layers", "context", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {name}={getattr(self, name)!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.dim)
        self.attn = SelfAttention(config.dim, config.num_heads, causal=True)
        self.mlp_norm = nn.LayerNorm(config.dim)
        self.mlp = nn.Sequential(
            nn.Linear(config.dim, 4 * config.dim),
            nn.GELU(),
            nn.Linear(4 * config.dim, config.dim),
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        bias: torch.Tensor | None,
        weights: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``weights``: when a list, this block's attention weights are appended to it."""
        normed = self.attn_norm(x)
        if weights is None:
            x = x + self.attn(normed, positions=positions, bias=bias)
        else:
            update, layer_weights = self.attn(
                normed, positions=positions, bias=bias, return_weights=True
            )
            weights.append(layer_weights)
            x = x + update
        return x + self.mlp(self.mlp_norm(x))


class TinyLM(nn.Module):
    """Byte-level causal language model. ``forward(tokens)`` maps ``(batch, seq)`` int64 byte ids to
    ``(batch, seq, vocab_size)`` float32 logits; position ``p`` only sees positions ``<= p``.

    Byte embeddings are multiplied by ``sqrt(dim)`` in every arm (Vaswani et al., 2017, section
    3.4), so that an added unit-amplitude sinusoidal encoding does not swamp them; the same scale
    is used for every encoding so that the arms differ in their position encoding only.
    ``set_rope_scaling`` swaps the RoPE scaling used from the next forward on (no retraining).
    ``forward(tokens, return_attention=True)`` also returns every layer's attention weights, the
    softmax of the logits (ALiBi: equation (alibi-score) of chapter "ALiBi"), computed by the
    same forward pass with the explicit softmax instead of SDPA.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.positional = (
            LearnedPositionalEmbedding(config.context, config.dim)
            if config.encoding == "learned"
            else None
        )
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.dim)
        self.rope_scaling: dict[str, Any] | None = None
        self.set_rope_scaling(None)

    @property
    def head_dim(self) -> int:
        return self.config.dim // self.config.num_heads

    def set_rope_scaling(self, scaling: Mapping[str, Any] | None) -> None:
        """Use a Hugging Face style ``rope_scaling`` dict (``None``: plain RoPE) in every layer.

        Raises ``ValueError`` if the model does not use RoPE and ``scaling`` is not ``None``.
        """
        if self.config.encoding != "rope":
            if scaling is not None:
                raise ValueError(
                    f"rope scaling needs encoding='rope', got encoding={self.config.encoding!r}"
                )
            return
        self.rope_scaling = dict(scaling) if scaling is not None else None
        rotary = RotaryEmbedding(
            self.head_dim, base=self.config.rope_base, layout="half", scaling=self.rope_scaling
        )
        for block in self.blocks:
            block.attn.rotary = rotary  # one parameter-free module shared by the layers

    def forward(
        self, tokens: torch.Tensor, *, return_attention: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Logits ``(batch, seq, vocab_size)``; with ``return_attention=True`` the pair
        ``(logits, weights)``, ``weights[layer]`` of shape ``(batch, heads, seq, seq)``: query
        ``i``'s weight on key ``j`` (0 for ``j > i``; each row sums to 1), in the dtype of the
        model. Raises ``ValueError`` for tokens that are not int64 ``(batch, seq)``."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(
                f"tokens must be an int64 tensor of shape (batch, seq), got dtype {tokens.dtype} "
                f"and shape {tuple(tokens.shape)}"
            )
        seq = tokens.shape[1]
        positions = torch.arange(seq, device=tokens.device)
        x = self.embed(tokens) * math.sqrt(self.config.dim)  # (batch, seq, dim)
        encoding = self.config.encoding
        if encoding == "learned":
            x = x + self.positional(positions)  # IndexError beyond the table, by design
        elif encoding == "sinusoidal":
            x = x + sinusoidal_encoding(seq, self.config.dim).to(x.device)
        bias = None
        if encoding == "alibi":
            bias = alibi_bias(self.config.num_heads, seq, device=x.device)  # (heads, seq, seq)
        weights: list[torch.Tensor] | None = [] if return_attention else None
        for block in self.blocks:
            x = block(x, positions, bias, weights)
        logits = F.linear(self.final_norm(x), self.embed.weight)  # tied output layer
        return logits if weights is None else (logits, tuple(weights))


@torch.no_grad()
def attention_probabilities(
    model: TinyLM, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's per-head attention probabilities of ``model`` reading ``tokens``, stacked.

    ``TinyLM.forward(tokens, return_attention=True)`` with its per-layer weights stacked into one
    tensor: the layers' ``softmax(q kᵀ / sqrt(head_dim) + bias)`` with the causal mask (chapter
    "Why position?"), which the layer otherwise computes fused. ``tokens`` is int64
    ``(batch, seq)``. Returns ``(logits, weights)``: float32 ``(batch, seq, vocab_size)`` logits,
    equal to ``model(tokens)`` up to rounding (the tests check it), and float32 weights
    ``(num_layers, batch, heads, seq, seq)``, where ``weights[l, b, h, i, j]`` is how much query
    ``i`` of head ``h`` in layer ``l`` attends to key ``j`` (each row sums to 1; 0 for ``j > i``).
    Raises ``ValueError`` like ``forward`` for tokens that are not an int64 ``(batch, seq)`` tensor.
    """
    logits, weights = model(tokens, return_attention=True)
    return logits, torch.stack(weights)


def _saved_state(model: TinyLM) -> dict[str, torch.Tensor]:
    # The rotary module holds no parameters, only tables it can rebuild: leave it out.
    return {
        name: tensor.detach().cpu().contiguous()
        for name, tensor in model.state_dict().items()
        if ".rotary." not in name
    }


def save_checkpoint(model: TinyLM, path: str | Path) -> None:
    """Write the weights as safetensors, with the ``ModelConfig`` in the file's metadata."""
    from safetensors.torch import save_file

    metadata = {"config": json.dumps(model.config.to_dict())}
    save_file(_saved_state(model), str(path), metadata=metadata)


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> TinyLM:
    """Rebuild a ``TinyLM`` from ``save_checkpoint``'s file (safetensors: no code is executed).

    Raises ``ValueError`` if the file's tensors do not match the model its metadata describes.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        config = ModelConfig(**json.loads(handle.metadata()["config"]))
        state = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    model = TinyLM(config)
    expected = _saved_state(model)
    if set(state) != set(expected) or any(state[n].shape != expected[n].shape for n in expected):
        raise ValueError(f"{path} does not hold the weights of a TinyLM with config {config}")
    model.load_state_dict(state, strict=False)
    return model.to(device).eval()
