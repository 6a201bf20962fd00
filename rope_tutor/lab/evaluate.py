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
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rope_tutor.lab.data import needle_batch

__all__ = [
    "fixed_target_losses",
    "per_position_loss",
    "chunked_loss",
    "needle_accuracy",
    "needle_depth_bins",
]

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
    if max(contexts) + 1 > windows.shape[1] or min(contexts) < targets:
        raise ValueError(
            f"contexts {contexts} must lie in [targets={targets}, {windows.shape[1] - 1}]"
        )
    result = {}
    for context in contexts:
        losses = _token_losses(model, windows[:, -context - 1 :])[:, -targets:].mean(dim=1)
        result[context] = (
            losses.mean().item(),
            (losses.std() / math.sqrt(len(losses))).item(),
        )
    return result


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
    """
    generator = torch.Generator().manual_seed(seed)
    tokens, depth = needle_batch(num_samples, length, key_length, generator)
    device = next(model.parameters()).device
    correct = []
    per_batch = max(1, TOKENS_PER_BATCH // length)
    scored = key_length - cue
    if not 0 <= cue < key_length:
        raise ValueError(f"cue must be in [0, key_length={key_length}), got cue={cue}")
    with torch.no_grad():
        for chunk in tokens.split(per_batch):
            logits = model(chunk[:, :-1].to(device))[:, -scored:]
            correct.append(logits.argmax(dim=-1).cpu() == chunk[:, -scored:])
    hits = torch.cat(correct)  # (num_samples, scored)
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
