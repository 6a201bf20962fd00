"""Evaluation protocols of the lab (losses in nats per byte; divide by ln 2 for bits per byte).

Part V, "Train short, test long" and "Finding the needle".

- ``fixed_target_losses``: the same last ``targets`` bytes of every validation window are
  predicted with 1x, 2x, ... their training context before them; only the amount of context (and
  the positions it sits at) changes, never the content being scored.
- ``per_position_loss``: loss at each position of a long window, averaged over windows: shows
  where an encoding leaves its training range.
- ``chunked_loss``: ALiBi's protocol, the validation stream cut into non-overlapping chunks of one
  length, every byte scored (early bytes of each chunk see little context).
- ``needle_accuracy``: exact match of the key in the synthetic needle task, teacher-forced.
- ``cached_logits``: a RoPE model read one byte at a time with a KV cache, as generation does,
  keys cached before or after rotation (chapter "NTK-aware scaling": with dynamic NTK the two
  differ past the trained window).
- ``cache_losses``: the per-byte losses of several models read without scaling and, under one
  scaling, with each cache (the measurement of that chapter).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from rope_tutor.attention import attention
from rope_tutor.lab.data import needle_batch
from rope_tutor.rope import RotaryEmbedding, apply_rope

__all__ = [
    "CACHES",
    "cache_losses",
    "cached_logits",
    "fixed_target_losses",
    "fixed_target_window_losses",
    "per_position_loss",
    "chunked_loss",
    "needle_accuracy",
    "needle_depth_bins",
    "needle_hits",
    "needle_predictions",
]

#: What a KV cache holds for the keys: ``"raw"`` (before rotation) or ``"rotated"`` (after).
CACHES = ("raw", "rotated")

#: Evaluation batches hold at most this many bytes, which bounds the attention-score memory.
TOKENS_PER_BATCH = 8192


def _token_losses(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every next byte: windows ``(n, L + 1)`` -> float32 ``(n, L)``."""
    length = windows.shape[1] - 1
    per_batch = max(1, TOKENS_PER_BATCH // length)
    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for chunk in windows.split(per_batch):
            chunk = chunk.to(device)
            logits = model(chunk[:, :-1])
            losses = F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none")
            out.append(losses.float().cpu())
    return torch.cat(out)


def fixed_target_losses(
    model: torch.nn.Module, windows: torch.Tensor, contexts: list[int], targets: int
) -> dict[int, tuple[float, float]]:
    """Mean loss on the last ``targets`` bytes of each window, given ``context`` bytes of input.

    ``windows`` is int64 ``(n, max(contexts) + 1)``. For each ``context`` the model reads
    ``windows[:, -context - 1 : -1]`` and is scored on its last ``targets`` predictions.
    Returns ``{context: (mean, standard_error)}`` over the ``n`` windows.
    """
    result = {}
    for context, losses in fixed_target_window_losses(model, windows, contexts, targets).items():
        result[context] = (
            losses.mean().item(),
            (losses.std() / math.sqrt(len(losses))).item(),
        )
    return result


def fixed_target_window_losses(
    model: torch.nn.Module, windows: torch.Tensor, contexts: list[int], targets: int
) -> dict[int, torch.Tensor]:
    """Per-window losses of ``fixed_target_losses``: ``{context: float32 (n,)}``, the mean loss
    on the last ``targets`` bytes of each of the ``n`` windows given ``context`` bytes of input.

    What intervals over windows as well as seeds need (``rope_tutor.lab.stats.crossed_difference``).
    Raises ``ValueError`` when a context does not lie in ``[targets, windows.shape[1] - 1]``.
    """
    if max(contexts) + 1 > windows.shape[1] or min(contexts) < targets:
        raise ValueError(
            f"contexts {contexts} must lie in [targets={targets}, {windows.shape[1] - 1}]"
        )
    return {
        context: _token_losses(model, windows[:, -context - 1 :])[:, -targets:].mean(dim=1)
        for context in contexts
    }


def per_position_loss(model: torch.nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """Loss at each position of ``windows`` ``(n, L + 1)``, averaged over windows: ``(L,)``."""
    return _token_losses(model, windows).mean(dim=0)


def chunked_loss(model: torch.nn.Module, data: torch.Tensor, length: int, num_bytes: int) -> float:
    """Mean loss over the first ``num_bytes`` targets of ``data`` cut into chunks of ``length``.

    ALiBi's evaluation (Press et al., 2022): non-overlapping chunks, every byte scored with the
    context its chunk gives it. ``num_bytes`` must be a multiple of ``length``.
    """
    if num_bytes % length:
        raise ValueError(f"num_bytes={num_bytes} must be a multiple of length={length}")
    starts = torch.arange(0, num_bytes, length)
    index = starts[:, None] + torch.arange(length + 1)[None, :]
    return _token_losses(model, data[index].long()).mean().item()


def needle_depth_bins(
    depth: torch.Tensor, length: int, key_length: int, depth_bins: int = 4
) -> torch.Tensor:
    """The depth bin of each needle: int64 ``(n,)`` in ``[0, depth_bins)`` from the needle starts
    ``depth`` ``(n,)`` of ``needle_batch`` sequences of ``length`` bytes; equal-width bins over
    the ``length - 2 * (1 + key_length) + 1`` possible starts, bin 0 = needle near the start
    (farthest from the question), the last bin = nearest to it."""
    room = length - 2 * (1 + key_length)
    return torch.clamp(depth * depth_bins // (room + 1), max=depth_bins - 1)


def needle_predictions(
    model: torch.nn.Module,
    length: int,
    num_samples: int,
    key_length: int,
    seed: int,
    cue: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced predictions of every scored key letter on ``num_samples`` needle sequences
    of ``length`` bytes drawn from ``seed`` (``needle_batch``): the argmax after each letter of the
    final key and the key letters themselves, both int64 byte values ``(num_samples,
    key_length - cue)`` (the first ``cue`` letters are given, not scored), and the needle starts,
    int64 ``(num_samples,)``. Raises ``ValueError`` naming a ``cue`` outside ``[0, key_length)``."""
    if not 0 <= cue < key_length:
        raise ValueError(f"cue must be in [0, key_length={key_length}), got cue={cue}")
    generator = torch.Generator().manual_seed(seed)
    tokens, depth = needle_batch(num_samples, length, key_length, generator)
    device = next(model.parameters()).device
    predicted = []
    per_batch = max(1, TOKENS_PER_BATCH // length)
    scored = key_length - cue
    with torch.no_grad():
        for chunk in tokens.split(per_batch):
            logits = model(chunk[:, :-1].to(device))[:, -scored:]
            predicted.append(logits.argmax(dim=-1).cpu())
    return torch.cat(predicted), tokens[:, -scored:], depth


def needle_hits(
    model: torch.nn.Module,
    length: int,
    num_samples: int,
    key_length: int,
    seed: int,
    cue: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced hits of every scored key letter on ``num_samples`` needle sequences of
    ``length`` bytes drawn from ``seed`` (``needle_batch``), sample by sample: bool
    ``(num_samples, key_length - cue)`` (the argmax after each letter of the final
    key is the next letter; the first ``cue`` letters are given, not scored) and the needle
    starts, int64 ``(num_samples,)``: ``needle_predictions`` compared with the key. Raises
    ``ValueError`` naming a ``cue`` outside ``[0, key_length)``."""
    predicted, key, depth = needle_predictions(model, length, num_samples, key_length, seed, cue)
    return predicted == key, depth


def needle_accuracy(
    model: torch.nn.Module,
    length: int,
    num_samples: int,
    key_length: int,
    seed: int,
    depth_bins: int = 4,
    cue: int = 0,
) -> dict[str, object]:
    """Teacher-forced retrieval accuracy on ``num_samples`` needle sequences of ``length`` bytes.

    A sample counts as retrieved when the argmax prediction of every key letter after the final
    marker is right, except the first ``cue`` letters, which the question gives away (with
    ``cue=1`` the first letter is a lookup key and the other letters its value: associative
    recall). Returns ``{"exact_match", "per_letter", "by_depth"}``: fractions, and the
    exact match per equal-width bin of needle depth (first bin = needle near the start).
    The per-sample hits are ``needle_hits``'.
    """
    hits, depth = needle_hits(model, length, num_samples, key_length, seed, cue)
    exact = hits.all(dim=1).float()
    bins = needle_depth_bins(depth, length, key_length, depth_bins)
    by_depth = [
        exact[bins == b].mean().item() if (bins == b).any() else None for b in range(depth_bins)
    ]
    return {
        "exact_match": exact.mean().item(),
        "per_letter": hits.float().mean().item(),
        "by_depth": by_depth,
    }


def _rotate_at_length(
    rotary: RotaryEmbedding, z: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``z`` ``(..., seq, hd)`` rotated as ``rotary`` would, under theta(max(positions) + 1)."""
    return apply_rope(
        z,
        positions,
        base=rotary.base,
        layout=rotary.layout,
        scaling=rotary.scaling,
        rotary_dim=rotary.rotary_dim,
    )


@torch.no_grad()
def cached_logits(model: torch.nn.Module, tokens: torch.Tensor, cache: str) -> torch.Tensor:
    """Logits of a RoPE lab model reading ``tokens`` one byte at a time with a KV cache.

    Chapter "NTK-aware scaling", section "The pitfall: cache keys before rotation"; the mismatch
    is the one the YaRN paper warns about for dynamic scaling (Peng et al., 2023). ``model`` is a
    ``TinyLM`` with ``encoding="rope"``, its ``rope_scaling`` in force; ``tokens`` is int64
    ``(batch, n)``. Returns the logits ``(batch, n, vocab_size)`` in the model's dtype.

    Byte t arrives at length l = t + 1: its hidden states in every layer are computed then, once,
    and its key and value are kept. theta(l) are the frequencies of the model's scaling at length
    l (``rope_parameters`` with ``seq_len=l``: for dynamic NTK, equation (dynamic-ntk-base)). The
    query of byte t is rotated by ``t theta(t + 1)``; the key of byte j <= t by

    - ``j theta(t + 1)`` with ``cache="raw"``: keys are cached before rotation and re-rotated at
      every step, so pair p of score (t, j) turns by ``(t - j) theta_p(t + 1)``, a function of the
      distance, as RoPE intends;
    - ``j theta(j + 1)`` with ``cache="rotated"``: each key keeps the rotation it had when it was
      cached, so pair p turns by ``t theta_p(t + 1) - j theta_p(j + 1)``.

    The two agree, and equal ``model(tokens)``, when theta does not depend on the length (plain
    RoPE, the static methods, dynamic NTK within the trained window). Raises ``ValueError`` for
    a model without RoPE, ``tokens`` that are not int64 ``(batch, n)`` or an unknown ``cache``.
    """
    if getattr(getattr(model, "config", None), "encoding", None) != "rope":
        raise ValueError("model must be a TinyLM with encoding='rope'")
    if tokens.dim() != 2 or tokens.dtype != torch.long:
        raise ValueError(
            f"tokens must be an int64 tensor of shape (batch, n), got dtype {tokens.dtype} "
            f"and shape {tuple(tokens.shape)}"
        )
    if cache not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, got cache={cache!r}")
    batch, n = tokens.shape
    dim = model.config.dim
    param = next(model.parameters())
    shape = (len(model.blocks), batch, model.config.num_heads, n, model.head_dim)
    keys = torch.empty(shape, dtype=param.dtype, device=param.device)  # per layer, as cached
    values = torch.empty_like(keys)
    out = []
    for t in range(n):  # byte t arrives: the length is t + 1
        x = model.embed(tokens[:, t : t + 1]) * math.sqrt(dim)  # (batch, 1, dim)
        now = torch.tensor([t], device=tokens.device)
        for layer, block in enumerate(model.blocks):
            attn = block.attn
            rotary = attn.rotary
            qkv = attn.qkv(block.attn_norm(x)).view(batch, 1, 3, attn.num_heads, attn.head_dim)
            q, k, v = (part.transpose(1, 2) for part in qkv.unbind(dim=2))  # (batch, heads, 1, hd)
            q = _rotate_at_length(rotary, q, now)
            keys[layer, :, :, t : t + 1] = (
                k if cache == "raw" else _rotate_at_length(rotary, k, now)
            )
            values[layer, :, :, t : t + 1] = v
            k_all = keys[layer, :, :, : t + 1]  # (batch, heads, t + 1, hd)
            if cache == "raw":
                k_all = _rotate_at_length(rotary, k_all, torch.arange(t + 1, device=tokens.device))
            y = attention(q, k_all, values[layer, :, :, : t + 1])  # only past keys: no mask
            x = x + attn.out(y.transpose(1, 2).reshape(batch, 1, dim))
            x = x + block.mlp(block.mlp_norm(x))
        out.append(F.linear(model.final_norm(x), model.embed.weight))  # tied output layer
    return torch.cat(out, dim=1)


@torch.no_grad()
def cache_losses(
    models: Sequence[torch.nn.Module], windows: torch.Tensor, scaling: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Per-byte losses (nats) of each model on ``windows``, read three ways.

    Chapter "NTK-aware scaling", section "What the outdated keys cost". ``windows`` is int64
    ``(n_windows, span + 1)``: bytes ``[:, :-1]`` are read, bytes ``[:, 1:]`` predicted. Returns
    ``{"none": ..., "raw": ..., "rotated": ...}``, each ``(len(models), n_windows, span)`` in the
    models' dtype: ``"none"`` the model's own forward pass without scaling, ``"raw"`` and
    ``"rotated"`` ``cached_logits`` with that cache under ``scaling``. Each model's scaling is
    restored afterwards. Raises ``ValueError`` for ``windows`` that are not int64 ``(n, span + 1)``
    with ``span >= 1`` (and, through ``cached_logits``, for a model without RoPE).
    """
    if windows.dim() != 2 or windows.dtype != torch.long or windows.shape[1] < 2:
        raise ValueError(
            f"windows must be an int64 tensor of shape (n, span + 1), span >= 1, got dtype "
            f"{windows.dtype} and shape {tuple(windows.shape)}"
        )
    inputs, targets = windows[:, :-1], windows[:, 1:]

    def per_byte(logits: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")

    losses: dict[str, list[torch.Tensor]] = {name: [] for name in ("none", *CACHES)}
    for model in models:
        before = getattr(model, "rope_scaling", None)
        try:
            model.set_rope_scaling(None)
            losses["none"].append(per_byte(model(inputs)))
            model.set_rope_scaling(scaling)
            for cache in CACHES:
                losses[cache].append(per_byte(cached_logits(model, inputs, cache)))
        finally:
            model.set_rope_scaling(before)
    return {name: torch.stack(rows) for name, rows in losses.items()}
