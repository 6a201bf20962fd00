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
    "UNTABLED",
    "VOCAB",
    "WINDOW",
    "PreviousTokenModel",
    "accuracy",
    "accuracy_per_query",
    "attention_map",
    "back_weights",
    "bag_of_tokens_accuracy",
    "compare_maps",
    "copy_rows",
    "far_from_band",
    "fine_tune",
    "fine_tune_table",
    "fine_tuned_measures",
    "interpolate_rows",
    "long_accuracy",
    "long_accuracy_per_query",
    "long_ids",
    "on_previous_and_twin",
    "position_only_logits",
    "random_length",
    "random_tokens",
    "row_statistics",
    "seam_and_rest",
    "seed_glue_values",
    "seed_run",
    "seed_runs",
    "seed_summary",
    "shrink_seam",
    "train",
    "train_steps",
    "twin_keys",
    "two_back_accuracy",
    "weak_positions",
    "weakest_position",
    "window_bias",
    "windowed_accuracies",
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


def train_steps(
    model: PreviousTokenModel,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    steps: int,
    length: int,
) -> None:
    """``steps`` optimiser steps on fresh batches of 64 ``length``-token sequences drawn from
    ``generator``: the cross-entropy of the previous token at positions 1 .. length - 1."""
    device = _device(model)
    for _ in range(steps):
        token_ids = random_tokens(generator, 64, device, length=length)
        logits = model(token_ids)[:, 1:]  # the prediction at each position 1 .. length - 1
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), token_ids[:, :-1].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


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
    train_steps(model, optimizer, torch.Generator().manual_seed(1), STEPS, SEQ_LEN)
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
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(5)  # training sequences, apart from the test ones
    train_steps(model, optimizer, generator, FINE_TUNE_STEPS, 2 * SEQ_LEN)
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


def _check_tokens(token_ids: torch.Tensor, name: str = "token_ids") -> None:
    if token_ids.dim() != 2 or token_ids.dtype != torch.int64 or token_ids.shape[1] < 2:
        raise ValueError(f"{name} must be int64 of shape (batch, seq) with seq >= 2, got"
                         f" {name}.shape={tuple(token_ids.shape)}, dtype={token_ids.dtype}")


def bag_of_tokens_accuracy(token_ids: torch.Tensor) -> float:
    """The accuracy of the best position-blind guess of the previous token (chapter 2, "the bag").

    ``token_ids``: int64 ``(batch, seq)``. For every query ``t = 1 .. seq - 1`` the guess is the
    most frequent token among the sequence's other ``seq - 1`` tokens (order ignored; ties go to
    the smallest token id, as ``argmax``); it is right when it equals the token at ``t - 1``.
    Returns the fraction of right guesses over all queries and sequences.
    """
    _check_tokens(token_ids)
    counts = F.one_hot(token_ids, VOCAB).sum(1)  # (batch, VOCAB): the bag of each sequence
    hits = []
    for t in range(1, token_ids.shape[1]):  # query t: the most frequent token among the others
        guess = (counts - F.one_hot(token_ids[:, t], VOCAB)).argmax(-1)
        hits.append((guess == token_ids[:, t - 1]).float())
    return torch.stack(hits).mean().item()


@torch.no_grad()
def attention_map(
    model: PreviousTokenModel, token_ids: torch.Tensor, start: int = 0
) -> torch.Tensor:
    """float32 ``(batch, seq, seq)`` on the CPU: the attention weights of ``model``'s head.

    ``token_ids``: int64 ``(batch, seq)`` on the model's device, numbered from position ``start``.
    Entry ``[b, m, n]`` is the softmax weight of query ``m`` on key ``n`` in sequence ``b``
    (chapter 2's attention maps; average over ``dim=0`` for the maps the chapter draws).
    """
    _check_tokens(token_ids)
    q, k, v = model.attention.qkv(model.embed(token_ids, start)).chunk(3, dim=-1)
    return attention(q, k, v, return_weights=True)[1].cpu()


@torch.no_grad()
def position_only_logits(
    model: PreviousTokenModel, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """float32 ``(n, n)`` on the CPU: the position-only logits ``S[m, n] = P[m] W_q (P[n] W_k)^T
    / sqrt(d_h)`` of chapter 2 (``d_h = DIM``: one head), the attention logits of the rows alone.

    ``rows``: float32 ``(n, DIM)`` position rows; by default the model's trained rows
    ``0 .. SEQ_LEN - 1``. Their softmax over ``dim=-1`` is the map "the positions alone ask for".
    """
    if rows is None:
        rows = _table(model).detach()[:SEQ_LEN]
    if rows.dim() != 2 or rows.shape[1] != DIM:
        raise ValueError(f"rows must have shape (n, {DIM}), got rows.shape={tuple(rows.shape)}")
    q_pos, k_pos, _ = model.attention.qkv(rows.to(_device(model))).chunk(3, dim=-1)
    return (q_pos @ k_pos.T / DIM**0.5).cpu()


def compare_maps(position_weights: torch.Tensor, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """How the position-only map matches the measured attention (chapter 2, both pages).

    ``position_weights``: float32 ``(seq, seq)``, the softmax of ``position_only_logits``;
    ``weights``: float32 ``(batch, seq, seq)``, ``attention_map`` of ``batch`` sequences. Returns
    tensors by name, for the queries ``m = 1 .. seq - 1``: ``from_positions`` ``(seq - 1,)``, the
    position-only weight on key ``m - 1``; ``map_gap`` (0-dim), the largest ``|difference|`` from
    the averaged map; ``per_sequence`` ``(batch, seq - 1, seq)``, the queries' rows of each map;
    ``sequence_gap`` ``(batch,)``, the largest ``|difference|`` from each sequence's map; and
    ``each_on_previous`` ``(batch, seq - 1)``, each sequence's weight of query ``m`` on key
    ``m - 1``.
    """
    seq = position_weights.shape[0]
    square = tuple(position_weights.shape) == (seq, seq)
    if not square or weights.dim() != 3 or weights.shape[1:] != (seq, seq):
        raise ValueError(f"position_weights must be (seq, seq) and weights (batch, seq, seq), got"
                         f" position_weights.shape={tuple(position_weights.shape)},"
                         f" weights.shape={tuple(weights.shape)}")
    per_sequence = weights[:, 1:]  # (batch, seq - 1, seq): queries 1..seq-1
    return {
        "from_positions": position_weights.diagonal(offset=-1),
        "map_gap": (position_weights[1:] - weights.mean(0)[1:]).abs().max(),
        "per_sequence": per_sequence,
        "sequence_gap": (per_sequence - position_weights[1:]).abs().amax(dim=(1, 2)),
        # row i of per_sequence is query i + 1, whose previous key is key i: its main diagonal
        "each_on_previous": per_sequence.diagonal(dim1=1, dim2=2),
    }


def row_statistics(model: PreviousTokenModel) -> dict[str, float]:
    """Lengths and cosines of the position table's rows (chapter 2, "What the table learns").

    Floats by name: ``related_trained`` / ``related_untrained``, the mean ``|cos|`` of two distinct
    rows among rows ``0..15`` (trained) / ``16..31`` (never trained); ``length_trained`` /
    ``length_untrained``, the mean Euclidean length of those rows; ``neighbours`` and
    ``neighbours_abs``, the mean cosine and mean ``|cos|`` of the rows ``t`` and ``t + 1``
    (``t = 0..14``); ``length_ratio``, ``length_trained / length_untrained``.
    """
    rows = _table(model).detach().cpu()  # (TABLE_ROWS, DIM)
    unit_rows = rows / rows.norm(dim=-1, keepdim=True)
    cosine = unit_rows @ unit_rows.T  # (32, 32)
    off_diagonal = ~torch.eye(SEQ_LEN, dtype=torch.bool)
    length_trained = rows[:SEQ_LEN].norm(dim=-1).mean().item()
    length_untrained = rows[SEQ_LEN:].norm(dim=-1).mean().item()
    return {
        "related_trained": cosine[:SEQ_LEN, :SEQ_LEN][off_diagonal].abs().mean().item(),
        "related_untrained": cosine[SEQ_LEN:, SEQ_LEN:][off_diagonal].abs().mean().item(),
        "length_trained": length_trained,
        "length_untrained": length_untrained,
        "neighbours": cosine[:SEQ_LEN, :SEQ_LEN].diagonal(1).mean().item(),
        "neighbours_abs": cosine[:SEQ_LEN, :SEQ_LEN].diagonal(1).abs().mean().item(),
        "length_ratio": length_trained / length_untrained,
    }


def twin_keys() -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``(30,)``, ``(30,)``: the queries ``t = 1..31`` but the seam's (16), and for each the
    twin of its previous key in the copied table: the key 16 positions from ``t - 1``, same row."""
    queries = torch.tensor([t for t in range(1, 2 * SEQ_LEN) if t != SEQ_LEN])
    return queries, torch.where(queries > SEQ_LEN, queries - 1 - SEQ_LEN, queries - 1 + SEQ_LEN)


def windowed_accuracies(
    copied: PreviousTokenModel, control: PreviousTokenModel, window: int = WINDOW
) -> dict[str, torch.Tensor | float]:
    """Chapter 2's window test on the 32-token test sequences, before any training on them.

    ``copied``: the model with its table extended by ``copy_rows``; ``control``: the trained
    model, rows 16..31 left random. Returns ``windowed_per_query`` (float32 ``(31,)``, the copied
    model's per-query accuracy under ``window_bias(window)``), and the mean accuracies
    ``control_full`` (full attention) and ``control_windowed`` (the window) of the control.
    """
    bias = window_bias(window, device=_device(copied))  # (32, 32): 0 inside, -inf outside
    return {
        "windowed_per_query": long_accuracy(copied, bias),
        "control_full": long_accuracy(control).mean().item(),
        "control_windowed": long_accuracy(control, bias).mean().item(),
    }


@torch.no_grad()
def two_back_accuracy(model: PreviousTokenModel) -> float:
    """The fraction of the predictions of the queries at positions 2..31, on the 512 32-token test
    sequences, that equal the token at ``t - 2`` (the interpolated table's error, chapter 2)."""
    ids = long_ids(_device(model))
    return (model(ids)[:, 2:].argmax(-1) == ids[:, :-2]).float().mean().item()


def _check_map(weights: torch.Tensor, first_query: int, depth: int) -> None:
    if weights.dim() != 2 or weights.shape[0] != weights.shape[1]:
        raise ValueError("weights must be a square (seq, seq) map, got"
                         f" weights.shape={tuple(weights.shape)}")
    if not 0 <= depth - 1 <= first_query < weights.shape[0]:
        raise ValueError(f"first_query must be in {max(depth - 1, 0)}..{weights.shape[0] - 1}"
                         f" (depth={depth}), got first_query={first_query!r}")


def back_weights(weights: torch.Tensor, first_query: int = 4, depth: int = 5) -> list[float]:
    """``[w_0, ..., w_{depth-1}]``: ``w_b`` is the mean weight of the queries ``t = first_query ..
    seq - 1`` on the key ``t - b``, from a float32 ``(seq, seq)`` attention map ``weights``."""
    _check_map(weights, first_query, depth)
    t = torch.arange(first_query, weights.shape[0])
    return [weights[t, t - b].mean().item() for b in range(depth)]


def far_from_band(
    weights: torch.Tensor, first_query: int = 4, back: int = 4
) -> dict[str, torch.Tensor | float | int]:
    """The weight away from the band of an attention map (chapter 2, the interpolated table).

    From a float32 ``(seq, seq)`` map ``weights``, for the queries ``t = first_query .. seq - 1``:
    ``on_later_keys``, the mean over those queries of their weight on the keys after ``t``;
    ``far_back`` (float32 ``(seq - first_query,)``), the weight of each on the keys ``t - back`` and
    earlier; ``far_query`` and ``far_key``, the query and key of the largest such single weight.
    """
    _check_map(weights, first_query, back)
    seq = weights.shape[0]
    t = torch.arange(first_query, seq)
    far_keys = torch.arange(seq)[None, :] <= t[:, None] - back  # keys t - back and earlier
    far_weights = torch.where(far_keys, weights[t], 0.0)  # (seq - first_query, seq)
    far_query, far_key = divmod(far_weights.argmax().item(), seq)
    return {
        "on_later_keys": torch.stack([weights[q, q + 1 :].sum() for q in t.tolist()]).mean().item(),
        "far_back": far_weights.sum(-1),
        "far_query": far_query + first_query,  # row 0 of far_weights is query first_query
        "far_key": far_key,
    }


def seed_runs(seeds: range | list[int], device: torch.device | str) -> list[dict[str, float]]:
    """``seed_run`` for each seed of ``seeds``: the rows of chapter 2's per-seed tables.

    Each seed trains its own model (``train(seed=seed)``), then fine-tunes four 32-row starts
    (``fine_tune``): new rows left random, copied rows, interpolated rows, and copied rows with the
    seam's row shrunk to a random row's length (``shrink_seam``). Deterministic: every draw has its
    own fixed seed. Returns one dict per seed, in the order of ``seeds``.
    """
    seeds = [_checks.integer(f"seeds[{i}]", s, minimum=0) for i, s in enumerate(seeds)]
    if not seeds:
        raise ValueError("seeds must name at least one seed, got seeds=[]")
    runs = []
    for seed in seeds:
        model = train(use_positions=True, seed=seed, device=device)
        runs.append(seed_run(model, {
            "random": long_accuracy_per_query(fine_tune(model)),
            "copied": long_accuracy_per_query(fine_tune(copy_rows(model))),
            "interp": long_accuracy_per_query(fine_tune(interpolate_rows(model))),
            "shrunk": long_accuracy_per_query(
                fine_tune(shrink_seam(copy_rows(model), random_length(model)))),
        }))
    return runs


#: The measurements of ``seed_run`` that the per-seed tables do not show (asserted, not glued).
UNTABLED = ("pair_min", "pair_max", "random_below_first", "shrunk_below", "row0_ratio")


def fine_tuned_measures(
    control: PreviousTokenModel,
    tuned_random: PreviousTokenModel,
    tuned_copied: PreviousTokenModel,
    tuned_interp: PreviousTokenModel,
) -> dict[str, torch.Tensor]:
    """Chapter 2's measurements of the short training on 32 tokens, on the 512 test sequences.

    ``control``: the trained model before the short training, rows 16..31 left random;
    ``tuned_*``: ``fine_tune`` of the control, of ``copy_rows(control)`` and of
    ``interpolate_rows(control)``. float32 CPU tensors by name: ``control_before`` ``(31,)``, the
    control's per-query accuracy (queries 1..31); ``late_on_trained`` ``(16,)``, the control's mean
    weight of each query 16..31 on the keys 0..15; ``random``, ``copied``, ``interp`` ``(31,)``,
    the per-query accuracies after the training; ``interp_on_previous``, ``copied_on_previous``
    and ``copied_on_twin`` ``(31,)``, from ``on_previous_and_twin`` after the training.
    """
    late_weights = attention_map(control, long_ids(_device(control))).mean(0)  # (32, 32)
    interp_on_previous, _ = on_previous_and_twin(tuned_interp)
    copied_on_previous, copied_on_twin = on_previous_and_twin(tuned_copied)
    return {
        "control_before": long_accuracy_per_query(control),
        "late_on_trained": late_weights[SEQ_LEN:, :SEQ_LEN].sum(-1),
        "random": long_accuracy_per_query(tuned_random),
        "copied": long_accuracy_per_query(tuned_copied),
        "interp": long_accuracy_per_query(tuned_interp),
        "interp_on_previous": interp_on_previous,
        "copied_on_previous": copied_on_previous,
        "copied_on_twin": copied_on_twin,
    }


def fine_tune_table(arms: dict[str, tuple[float, torch.Tensor]]) -> str:
    """The table that both chapter 2 pages print after the short training, one line per start:
    its name, its mean accuracy ``before`` and after, the seam query's (position 16) and the weakest
    other query's accuracy after. ``arms``: name -> (before, per-query accuracy ``(31,)`` after)."""
    lines = [f"after {FINE_TUNE_STEPS} steps on 32 tokens, accuracy on 32 tokens:",
             " " * 24 + "before  after   query at 16 (seam)  weakest query other than 16"]
    for name, (before, after) in arms.items():
        seam, weakest = seam_and_rest(after)
        lines.append(f"  {name:<21} {before:.2f}    {after.mean():.2f}    {seam:.2f}"
                     f"                {weakest:.2f}")
    return "\n".join(lines)


def seed_summary(runs: list[dict[str, float]]) -> dict:
    """What chapter 2's pages read off the per-seed runs (``seed_runs``; seed ``i``: run ``i``).

    By name: ``column`` (key -> the list of that measurement over the seeds); the per-seed lists
    ``full_edge`` (copied minus control, full attention, before the short training),
    ``interp_gain`` and ``copied_edge`` (interpolated / copied minus control after it) and
    ``interp_worst`` (the weakest interpolated query, the seam's included); ``failed``, the seed
    where the control did worst after the training; ``spread``, max minus min over the seeds of the
    three accuracies after it; ``copied_ahead``, the number of seeds where copying beats the
    control; ``small_edges``, copying's lead (rounded to 2 decimals) in the seeds where it is ahead,
    ``failed`` aside; ``seeds_mean``, the mean accuracies after the training; ``seam_repaired``,
    the seeds whose copied seam query is right more than 0.95 of the time; ``copied_no_weak``, those
    with no copied query below 0.9; ``shrunk_broken``, the seeds whose shrunk-seam arm has a query
    right less than 0.1 of the time, seam aside.
    """
    if not runs:
        raise ValueError("runs must hold at least one run, got runs=[]")
    column = {key: [run[key] for run in runs] for key in runs[0]}
    seeds = range(len(runs))

    def minus(a: str, b: str) -> list[float]:
        return [x - y for x, y in zip(column[a], column[b], strict=True)]

    copied_edge = minus("copied_tuned", "random_tuned")
    failed = min(seeds, key=lambda s: column["random_tuned"][s])
    tuned = ("random_tuned", "interp_tuned", "copied_tuned")
    return {
        "column": column,
        "full_edge": minus("copied_long", "control_full"),
        "interp_gain": minus("interp_tuned", "random_tuned"),
        "interp_worst": [min(w, s) for w, s in zip(column["interp_weakest"], column["interp_seam"],
                                                    strict=True)],
        "copied_edge": copied_edge,
        "copied_ahead": sum(e > 0 for e in copied_edge),
        "failed": failed,
        "spread": {key: max(column[key]) - min(column[key]) for key in tuned},
        "small_edges": [round(e, 2) for s, e in enumerate(copied_edge) if e > 0 and s != failed],
        "seeds_mean": {key: sum(column[key]) / len(runs) for key in tuned},
        "seam_repaired": sum(s > 0.95 for s in column["copied_seam"]),
        "copied_no_weak": sum(min(w, s) > 0.9 for w, s in zip(
            column["copied_weakest"], column["copied_seam"], strict=True)),
        "shrunk_broken": [s for s in seeds if column["shrunk_weakest"][s] < 0.1],
    }


def seed_glue_values(runs: list[dict[str, float]]) -> dict[str, float | int]:
    """The values of the per-seed runs that chapter 2's pages glue, by name.

    ``seed{i}_{key}`` for run ``i`` of ``runs`` (from ``seed_runs``) and every key but
    ``UNTABLED``: counts and positions (keys ending in ``peak``, ``_at``, ``_below``, ``_first``)
    as they are, the rest rounded to 2 decimals, as the tables print them; ``seed{i}_interp_worst``;
    and the ``seeds_*`` ranges and counts over the seeds, read off ``seed_summary``.
    """
    summary = seed_summary(runs)
    column, shrunk_broken = summary["column"], summary["shrunk_broken"]
    small_edges = summary["small_edges"]
    values: dict[str, float | int] = {}
    for seed, run in enumerate(runs):
        for key, value in run.items():
            if key in UNTABLED:
                continue
            exact = key.endswith(("peak", "_at", "_below", "_first"))  # integers
            values[f"seed{seed}_{key}"] = value if exact else round(value, 2)
    for seed, worst in enumerate(summary["interp_worst"]):
        values[f"seed{seed}_interp_worst"] = round(worst, 2)

    def low(key: str, digits: int | None = 2) -> float | int:
        return min(column[key]) if digits is None else round(min(column[key]), digits)

    def high(key: str, digits: int | None = 2) -> float | int:
        return max(column[key]) if digits is None else round(max(column[key]), digits)

    if shrunk_broken:
        values["seeds_shrunk_broken"] = len(shrunk_broken)
        broken = [column["shrunk_weakest"][s] for s in shrunk_broken]
        values["seeds_shrunk_weakest_min"] = round(min(broken), 2)
        values["seeds_shrunk_weakest_max"] = round(max(broken), 2)
    values["seeds_copied_no_weak"] = summary["copied_no_weak"]
    values |= {
        "seeds_map_gap_max": high("gap"),
        "seeds_neighbours_min": low("neighbours"),
        "seeds_neighbours_max": high("neighbours"),
        "seeds_pair_min": low("pair_min"),
        "seeds_pair_max": high("pair_max"),
        "seeds_neighbours_abs_min": low("neighbours_abs"),
        "seeds_neighbours_abs_max": high("neighbours_abs"),
        "seeds_related_min": low("related"),
        "seeds_related_max": high("related"),
        "seeds_related_untrained_min": low("related_untrained"),
        "seeds_related_untrained_max": high("related_untrained"),
        "seeds_interp_min": low("interp"),
        "seeds_interp_max": high("interp"),
        "seeds_two_back_min": low("two_back"),
        "seeds_two_back_max": high("two_back"),
        "seeds_interp_tuned_min": low("interp_tuned"),
        "seeds_seam_repaired": summary["seam_repaired"],
        "seeds_copied_ahead": summary["copied_ahead"],
        "seeds_random_tuned_min": low("random_tuned"),
        "seeds_random_tuned_max": high("random_tuned"),
        "seeds_random_weakest_min": low("random_weakest"),
        "seeds_random_weakest_max": high("random_weakest"),
        "seeds_random_weakest_at_min": low("random_weakest_at", None),
        "seeds_random_weakest_at_max": high("random_weakest_at", None),
        "seeds_random_seam_min": low("random_seam"),
        "seeds_random_below_min": low("random_below", None),
        "seeds_random_below_max": high("random_below", None),
        "seeds_random_below_first_min": low("random_below_first", None),
        "seeds_interp_gain_min": round(min(summary["interp_gain"]), 2),
        "seeds_interp_gain_max": round(max(summary["interp_gain"]), 2),
        "seeds_copied_tuned_min": low("copied_tuned"),
        "seeds_copied_tuned_max": high("copied_tuned"),
        "seeds_seam_failed": len(runs) - summary["seam_repaired"],
    }
    if small_edges:
        values["seeds_copied_edge_min"] = min(small_edges)  # already rounded as the table rounds
        values["seeds_copied_edge_max"] = max(small_edges)
    failed = summary["failed"]
    values |= {
        "seeds_copied_edge_failed": round(summary["copied_edge"][failed], 2),
        "seeds_control_failed": failed,
        "seeds_failed_below": column["random_below"][failed],  # its queries below 0.9, of 30
    }
    values |= {f"seeds_{key}_mean": round(mean, 2) for key, mean in summary["seeds_mean"].items()}
    return values
