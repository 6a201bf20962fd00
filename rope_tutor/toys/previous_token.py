"""The toy of chapter 2, "Learned absolute positions": previous-token copying.

At every position ``t >= 1`` of a sequence of random tokens the model must output the token at
``t - 1`` (position 0 has no target). Random tokens say nothing about which key came just before
a query, so only positions can solve the task. The model is one attention head between the input
``x_t = E[w_t] + P[t]`` of equation (learned-pe) in "Learned absolute positions" and a linear
read-out, trained on 16-token sequences with a 32-row table, so that rows 16 to 31 are never
trained. The chapter extends the table to 32 trained positions by copying rows (as Longformer,
Beltagy et al., 2020, section 5) or interpolating them (as the Vision Transformer, Dosovitskiy et
al., 2021, section 3.2), then trains briefly on 32-token inputs.

The chapter and its companion page import this module, so that both train and measure the same
seeded models: every draw of weights and tokens comes from its own fixed seed.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from rope_tutor import _checks
from rope_tutor.absolute import LearnedPositionalEmbedding
from rope_tutor.attention import SelfAttention, attention

__all__ = [
    "DIM",
    "FINE_TUNE_STEPS",
    "LR",
    "SEQ_LEN",
    "STEPS",
    "TABLE_ROWS",
    "VOCAB",
    "WINDOW",
    "PreviousTokenModel",
    "accuracy",
    "accuracy_per_query",
    "copy_rows",
    "fine_tune",
    "interpolate_rows",
    "long_accuracy",
    "long_accuracy_per_query",
    "long_ids",
    "on_previous_and_twin",
    "random_length",
    "random_tokens",
    "seam_and_rest",
    "seed_run",
    "shrink_seam",
    "train",
    "weak_positions",
    "weakest_position",
    "window_bias",
]

#: Vocabulary size, training sequence length, rows of the position table, model width (one head).
VOCAB, SEQ_LEN, TABLE_ROWS, DIM = 16, 16, 32, 32
#: Adam's learning rate and the number of training steps (batches of 64 sequences).
LR, STEPS = 1e-2, 200
#: Steps of the short training on 32-token inputs after the table is extended.
FINE_TUNE_STEPS = 100
#: The attention window of the copied table: keys with ``|m - n| < 8`` only, which reach 7
#: positions either side, fewer than the 15 of the nearest twin (the key 16 rows away).
WINDOW = 8


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def _table(model: PreviousTokenModel, name: str = "model") -> torch.Tensor:
    if model.positions is None:
        raise ValueError(f"{name} must have a position table (use_positions=True), got {name}"
                         " built with use_positions=False")
    return model.positions.table.weight


class PreviousTokenModel(nn.Module):
    """Token vectors (+ learned positions) -> one attention layer -> logits over the vocabulary.

    ``use_positions``: with a ``LearnedPositionalEmbedding(TABLE_ROWS, DIM)`` table added to the
    token vectors (equation (learned-pe)), or without positions. No residual connection, no causal
    mask. ``forward(token_ids, start)`` maps int64 ``token_ids`` of shape ``(batch, seq)`` to
    float32 logits of shape ``(batch, seq, VOCAB)``; ``start`` is the position of the first token.
    """

    def __init__(self, use_positions: bool) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, DIM)
        self.positions = LearnedPositionalEmbedding(TABLE_ROWS, DIM) if use_positions else None
        self.attention = SelfAttention(DIM, num_heads=1)
        self.read_out = nn.Linear(DIM, VOCAB)

    def embed(self, token_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """(batch, seq, DIM): token vectors plus the rows ``start .. start + seq - 1``."""
        seq = token_ids.shape[1]
        if self.positions is not None and not 0 <= start <= TABLE_ROWS - seq:
            raise ValueError(f"start must be in 0..{TABLE_ROWS - seq} for {seq} tokens and a"
                             f" table of {TABLE_ROWS} rows, got start={start!r}")
        x = self.tokens(token_ids)  # (batch, seq, DIM)
        if self.positions is not None:
            x = x + self.positions(torch.arange(start, start + seq, device=token_ids.device))
        return x

    def forward(self, token_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        return self.read_out(self.attention(self.embed(token_ids, start)))  # (batch, seq, VOCAB)


def random_tokens(
    generator: torch.Generator, batch: int, device: torch.device | str, length: int = SEQ_LEN
) -> torch.Tensor:
    """int64 tokens of shape ``(batch, length)``, uniform over the vocabulary, drawn on the CPU
    from ``generator`` (so the same on every device), then moved to ``device``."""
    batch = _checks.integer("batch", batch)
    length = _checks.integer("length", length)
    return torch.randint(VOCAB, (batch, length), generator=generator).to(device)


def train(
    use_positions: bool,
    optimizer_class: type[torch.optim.Optimizer] = torch.optim.Adam,
    seed: int = 0,
    *,
    device: torch.device | str,
    **options: float,
) -> PreviousTokenModel:
    """A model trained ``STEPS`` steps on fresh 16-token batches (64 sequences, positions 0..15).

    The loss is the cross-entropy of the previous token at positions 1 to 15. ``seed`` seeds the
    initial weights; the training sequences (generator seed 1) do not change with it. ``options``:
    extra optimiser settings (``weight_decay`` for AdamW). With positions, the model keeps its
    initial table in ``model.initial_rows`` (a plain CPU tensor, not a parameter: not trained).
    """
    torch.manual_seed(seed)
    model = PreviousTokenModel(use_positions).to(device)
    optimizer = optimizer_class(model.parameters(), lr=LR, **options)
    if use_positions:  # kept to compare with after training
        model.initial_rows = model.positions.table.weight.detach().cpu().clone()
    generator = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        token_ids = random_tokens(generator, 64, device)
        logits = model(token_ids)[:, 1:]  # predictions at positions 1..15
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), token_ids[:, :-1].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@torch.no_grad()
def accuracy_per_query(model: PreviousTokenModel, start: int = 0) -> torch.Tensor:
    """float32 ``(SEQ_LEN - 1,)`` on the CPU: the accuracy of the queries at sequence indices
    1..15 (positions ``start + 1 .. start + 15``) on 512 test sequences (generator seed 2)."""
    token_ids = random_tokens(torch.Generator().manual_seed(2), 512, _device(model))
    predictions = model(token_ids, start)[:, 1:].argmax(-1)
    return (predictions == token_ids[:, :-1]).float().mean(0).cpu()


def accuracy(model: PreviousTokenModel, start: int = 0) -> float:
    """The mean of ``accuracy_per_query(model, start)``: the fraction of right predictions."""
    return accuracy_per_query(model, start).mean().item()


def copy_rows(model: PreviousTokenModel) -> PreviousTokenModel:
    """A copy of ``model`` whose table rows 16..31 are copies of its rows 0..15 (``model`` is
    left as it is). Longformer (Beltagy et al., 2020, section 5) extended RoBERTa's table so."""
    _table(model)
    model = copy.deepcopy(model)
    with torch.no_grad():
        rows_table = model.positions.table.weight  # (32, DIM)
        rows_table[SEQ_LEN:] = rows_table[:SEQ_LEN]
    return model


def interpolate_rows(model: PreviousTokenModel) -> PreviousTokenModel:
    """A copy of ``model`` whose 32 rows are read off its rows 0..15 at ``p * 15 / 31``, linearly.

    Row ``p`` of the new table is ``(1 - a) P[r] + a P[r + 1]`` with ``r + a = p * 15/31``; rows
    0 and 31 equal the old rows 0 and 15 (the same as ``scipy.ndimage.zoom(order=1)``, the Vision
    Transformer's resize, Dosovitskiy et al., 2021, section 3.2). ``model`` is left as it is.
    """
    _table(model)
    model = copy.deepcopy(model)
    with torch.no_grad():
        trained = model.positions.table.weight[:SEQ_LEN].clone()  # (16, DIM)
        where = torch.arange(2 * SEQ_LEN, device=_device(model)) * (SEQ_LEN - 1) / (2 * SEQ_LEN - 1)
        low = where.floor().long()
        high, frac = (low + 1).clamp(max=SEQ_LEN - 1), (where - low)[:, None]
        model.positions.table.weight[:] = (1 - frac) * trained[low] + frac * trained[high]
    return model


def long_ids(device: torch.device | str) -> torch.Tensor:
    """The 512 test sequences of 32 tokens (positions 0..31): int64, ``(512, 32)``, on ``device``
    (generator seed 2, as the 16-token test sequences)."""
    return random_tokens(torch.Generator().manual_seed(2), 512, device, length=2 * SEQ_LEN)


def window_bias(
    window: int = WINDOW, *, device: torch.device | str = "cpu", length: int = 2 * SEQ_LEN
) -> torch.Tensor:
    """float32 ``(length, length)`` additive attention mask: 0 where ``|m - n| < window``, -inf
    elsewhere, so that query ``m`` attends only to the keys less than ``window`` positions away."""
    window = _checks.integer("window", window)
    length = _checks.integer("length", length)
    offsets = torch.arange(length, device=device)
    return torch.where((offsets[:, None] - offsets[None, :]).abs() < window, 0.0, float("-inf"))


@torch.no_grad()
def long_accuracy(model: PreviousTokenModel, bias: torch.Tensor | None = None) -> torch.Tensor:
    """float32 ``(31,)`` on the CPU: the accuracy of the queries at positions 1..31 on the 512
    32-token test sequences, the attention logits plus ``bias`` (a ``(32, 32)`` mask) if given."""
    ids = long_ids(_device(model))
    logits = model.read_out(model.attention(model.embed(ids), bias=bias))
    return (logits[:, 1:].argmax(-1) == ids[:, :-1]).float().mean(0).cpu()


def fine_tune(model: PreviousTokenModel) -> PreviousTokenModel:
    """A copy of ``model`` trained ``FINE_TUNE_STEPS`` Adam steps on 32-token batches.

    Positions 0..31, 64 sequences per step (generator seed 5, apart from the test sequences), the
    loss, learning rate and batch size of ``train``. ``model`` is left as it is.
    """
    model = copy.deepcopy(model)
    device = _device(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(5)  # training sequences, apart from the test ones
    for _ in range(FINE_TUNE_STEPS):
        token_ids = random_tokens(generator, 64, device, length=2 * SEQ_LEN)
        logits = model(token_ids)[:, 1:]  # predictions at positions 1..31
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), token_ids[:, :-1].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


@torch.no_grad()
def long_accuracy_per_query(model: PreviousTokenModel) -> torch.Tensor:
    """float32 ``(2 * SEQ_LEN - 1,)`` on the CPU: the accuracy of the queries at positions 1..31
    on the 512 32-token test sequences (``model``'s own forward pass)."""
    ids = long_ids(_device(model))
    return (model(ids)[:, 1:].argmax(-1) == ids[:, :-1]).float().mean(0).cpu()


def _check_per_query(per_query: torch.Tensor) -> None:
    if tuple(per_query.shape) != (2 * SEQ_LEN - 1,):
        raise ValueError(f"per_query must have shape ({2 * SEQ_LEN - 1},) (queries 1..31), got"
                         f" per_query.shape={tuple(per_query.shape)}")


def seam_and_rest(per_query: torch.Tensor) -> tuple[float, float]:
    """The accuracy of the seam query (position 16) and of the weakest other query, from a
    ``(31,)`` per-query accuracy (positions 1..31)."""
    _check_per_query(per_query)
    rest = torch.cat((per_query[: SEQ_LEN - 1], per_query[SEQ_LEN:]))
    return per_query[SEQ_LEN - 1].item(), rest.min().item()


def weakest_position(per_query: torch.Tensor) -> int:
    """The position (1..31, not 16) of the weakest query other than the seam's."""
    _check_per_query(per_query)
    rest_positions = [t for t in range(1, 2 * SEQ_LEN) if t != SEQ_LEN]
    rest = torch.cat((per_query[: SEQ_LEN - 1], per_query[SEQ_LEN:]))
    return rest_positions[rest.argmin().item()]


def weak_positions(per_query: torch.Tensor, below: float = 0.9) -> list[int]:
    """The positions (1..31, not 16) of the queries other than the seam's right less than
    ``below`` of the time."""
    _check_per_query(per_query)
    return [t for t in range(1, 2 * SEQ_LEN) if t != SEQ_LEN and per_query[t - 1] < below]


@torch.no_grad()
def on_previous_and_twin(model: PreviousTokenModel) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(31,)``, ``(31,)`` on the CPU: the mean attention weight of the queries at
    positions 1..31 on key ``t - 1`` and on its twin (the key 16 away from ``t - 1``), over the
    512 32-token test sequences."""
    ids = long_ids(_device(model))
    q, k, v = model.attention.qkv(model.embed(ids)).chunk(3, dim=-1)
    weights = attention(q, k, v, return_weights=True)[1].mean(0).cpu()  # (32, 32)
    t = torch.arange(1, 2 * SEQ_LEN)
    return weights[t, t - 1], weights[t, torch.where(t > SEQ_LEN, t - 1 - SEQ_LEN, t - 1 + SEQ_LEN)]


def shrink_seam(model: PreviousTokenModel, length: torch.Tensor) -> PreviousTokenModel:
    """A copy of ``model`` whose row 16 (the copied seam's, a copy of row 0) is scaled to
    ``length`` (a 0-dim tensor), the mean length of the random rows it replaced: same direction,
    a random row's length. ``model`` is left as it is."""
    _table(model)
    if not float(length) > 0:
        raise ValueError(f"length must be positive, got length={length!r}")
    model = copy.deepcopy(model)
    with torch.no_grad():
        seam_row = model.positions.table.weight[SEQ_LEN]  # (DIM,)
        seam_row *= length / seam_row.norm()
    return model


def random_length(model: PreviousTokenModel) -> torch.Tensor:
    """0-dim float32: the mean length of the table's rows 16..31 (never trained, still random)."""
    return _table(model).detach()[SEQ_LEN:].norm(dim=-1).mean()


def seed_run(model: PreviousTokenModel, tuned: dict[str, torch.Tensor]) -> dict[str, float]:
    """The measurements of one seed's trained ``model``, the rows of the chapter's per-seed tables.

    ``tuned``: ``long_accuracy_per_query`` after ``fine_tune``, ``(31,)``, for the arms
    ``"random"`` (new rows left random), ``"copied"``, ``"interp"`` and ``"shrunk"`` (copied rows,
    the seam's row scaled to a random row's length). Returns floats (and ints for counts and
    positions) by name: accuracy, where the position-only and measured maps peak, the rows'
    cosines and lengths, the extended tables before any training on 32 tokens (full attention
    and windowed), and each arm's accuracy, seam and weakest query after the short training.
    """
    rows = model.positions.table.weight.detach()[:SEQ_LEN]  # (16, DIM)
    unit = rows / rows.norm(dim=-1, keepdim=True)
    cos = unit @ unit.T  # (16, 16)
    off_diag = ~torch.eye(SEQ_LEN, dtype=torch.bool, device=cos.device)
    untrained = model.positions.table.weight.detach()[SEQ_LEN:]  # (16, DIM): rows 16..31
    unit_untrained = untrained / untrained.norm(dim=-1, keepdim=True)
    previous = torch.arange(SEQ_LEN - 1)  # the previous key of each query 1..15
    device = _device(model)
    ids = long_ids(device)
    bias = window_bias(WINDOW, device=device)
    with torch.no_grad():
        token_ids = random_tokens(torch.Generator().manual_seed(3), 256, device)  # the map's
        q, k, v = model.attention.qkv(model.embed(token_ids)).chunk(3, dim=-1)
        measured = attention(q, k, v, return_weights=True)[1].mean(0).cpu()  # (16, 16)
        q_pos, k_pos, _ = model.attention.qkv(rows).chunk(3, dim=-1)
        position_only = (q_pos @ k_pos.T / DIM**0.5).softmax(-1).cpu()  # (16, 16)
        predictions = interpolate_rows(model)(ids)[:, 1:].argmax(-1)  # positions 1..31
    copied = copy_rows(model)
    run = {
        "accuracy": accuracy(model),  # 16 tokens at positions 0..15
        "position_peak": (position_only[1:].argmax(-1) == previous).sum().item(),  # of 15
        "measured_peak": (measured[1:].argmax(-1) == previous).sum().item(),
        "gap": (position_only[1:] - measured[1:]).abs().max().item(),
        "neighbours": (unit[:-1] * unit[1:]).sum(-1).mean().item(),
        "neighbours_abs": cos.diagonal(1).abs().mean().item(),  # mean |cos| of rows t, t + 1
        "pair_min": cos.diagonal(1).min().item(),  # the single neighbour pairs' extremes
        "pair_max": cos.diagonal(1).max().item(),
        "related": cos[off_diag].abs().mean().item(),  # mean |cos| of any two trained rows
        "related_untrained": (unit_untrained @ unit_untrained.T)[off_diag].abs().mean().item(),
        "interp": (predictions == ids[:, :-1]).float().mean().item(),
        "two_back": (predictions[:, 1:] == ids[:, :-2]).float().mean().item(),
        # before any training on 32 tokens: copied rows and the control, full attention, windowed
        "copied_long": long_accuracy(copied).mean().item(),
        "control_full": long_accuracy(model).mean().item(),
        "windowed_long": long_accuracy(copied, bias).mean().item(),
        "control_windowed": long_accuracy(model, bias).mean().item(),
    }
    for arm, per_query in tuned.items():
        seam, weakest = seam_and_rest(per_query)
        run |= {f"{arm}_tuned": per_query.mean().item(), f"{arm}_seam": seam,
                f"{arm}_weakest": weakest}
    run["random_weakest_at"] = weakest_position(tuned["random"])  # a position 1..31
    run["shrunk_weakest_at"] = weakest_position(tuned["shrunk"])  # the shrunk arm's weakest
    run["shrunk_below"] = len(weak_positions(tuned["shrunk"]))  # its queries below 0.9
    weak = weak_positions(tuned["random"])  # the control's queries below 0.9, seam aside
    run |= {"random_below": len(weak), "random_below_first": min(weak)}
    run["row0_ratio"] = rows[0].norm().item() / untrained.norm(dim=-1).mean().item()
    return run
