"""The forgotten permutation: Meta's interleaved weights fed to the half layout, measured.

Chapter "RoPE in practice" (section "The forgotten permutation, measured", exercise
ex-forgotten-permutation, equations rope-half and rope-permutation) and its companion page
"RoPE in practice: two choices RoPE leaves open" (section "Why a forgotten permutation's error
grows past the score size") share this toy; Su et al., "RoFormer: Enhanced Transformer with Rotary
Position Embedding" (2021) for RoPE and its interleaved layout.

The toy: two attention heads of size ``HEAD_DIM = 16`` on hidden vectors of size ``HIDDEN = 32``,
random float64 weights ``w_q``, ``w_k`` of shape ``(NUM_HEADS * HEAD_DIM, HIDDEN)`` and random
float64 tokens of shape ``(seq, HIDDEN)``. A query is ``q = W_q h`` (row-vector form: one token
per row, ``tokens @ w_q.T``), split into heads; both query and key are rotated with
``rope_tutor.apply_rope`` at positions ``0 .. seq - 1``. Meta's model rotates with
``layout="interleaved"``; a conversion that forgot to permute the rows of ``W_q`` and ``W_k``
feeds the same weights to ``layout="half"``. ``band_errors`` measures the damage: the mean
absolute score error over the mean absolute correct score, per band of distances ``|m - n|``.
At distance 0 both layouts give the exact score (``distance_zero_error``), since
``<R q, R k> = <q, k>`` for one rotation ``R``.

Every random tensor is drawn on the CPU in float64 and then moved, so a seed gives the same
numbers on every device. ``draw_weights`` and ``draw_tokens`` draw from a generator passed in
(the chapter passes none: torch's global stream, seeded by ``rope_tutor.notebook_setup``);
``seeded_draw(seed)`` is the chapter's "ten more draws", each from its own generator. The
module holds constants only, no state.
"""

from __future__ import annotations

import torch

from rope_tutor import _checks
from rope_tutor.rope import LAYOUTS, apply_rope, rope_frequencies

__all__ = [
    "BANDS",
    "DTYPE",
    "HEAD_DIM",
    "HIDDEN",
    "LONG_SEQ",
    "NUM_HEADS",
    "SHORT_SEQ",
    "SLOW_SPEED",
    "attention_scores",
    "band_errors",
    "distance_zero_error",
    "distances",
    "draw_tokens",
    "draw_weights",
    "feature_pairs",
    "feature_speeds",
    "head_vectors",
    "seeded_draw",
    "slow_features",
]

#: Size of a token's hidden vector h.
HIDDEN = 32
#: Number of attention heads.
NUM_HEADS = 2
#: Size d_h of each head: 8 rotated pairs.
HEAD_DIM = 16
#: Tokens of the chapter's small toy, whose score matrices are compared entry by entry.
SHORT_SEQ = 7
#: Tokens of the measurement: distances 0 .. 511.
LONG_SEQ = 512
#: The bands of distances ``d = |m - n|`` (inclusive) of the chapter's table: 1, 3, 12, 48 and 447
#: distances.
BANDS: tuple[tuple[int, int], ...] = ((1, 1), (2, 4), (5, 16), (17, 64), (65, 511))
#: A feature is slow if it turns by less than this many radians per token in both layouts.
SLOW_SPEED = 0.05
#: The dtype of every tensor of the toy.
DTYPE = torch.float64


def draw_weights(
    generator: torch.Generator | None = None, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random query and key weights ``(w_q, w_k)``, each ``(NUM_HEADS * HEAD_DIM, HIDDEN)`` float64.

    Standard normal entries, drawn on the CPU from ``generator`` (``None``: torch's global
    stream), ``w_q`` first, then moved to ``device`` (``None``: left on the CPU).
    """
    shape = (NUM_HEADS * HEAD_DIM, HIDDEN)
    w_q = torch.randn(shape, generator=generator, dtype=DTYPE).to(device)
    w_k = torch.randn(shape, generator=generator, dtype=DTYPE).to(device)
    return w_q, w_k


def draw_tokens(
    seq: int, generator: torch.Generator | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """``seq`` random hidden vectors, ``(seq, HIDDEN)`` float64, drawn like ``draw_weights``.

    Raises ``ValueError`` if ``seq`` is not a positive int.
    """
    seq = _checks.integer("seq", seq)
    return torch.randn((seq, HIDDEN), generator=generator, dtype=DTYPE).to(device)


def seeded_draw(
    seed: int, device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One of the chapter's extra draws: ``(w_q, w_k, tokens)``, from its own seeded generator.

    ``w_q`` and ``w_k`` as in ``draw_weights``, then ``tokens`` of shape ``(LONG_SEQ, HIDDEN)``,
    all float64, in that order from ``torch.Generator().manual_seed(seed)``, so torch's global
    stream is left alone; moved to ``device``. Raises ``ValueError`` if ``seed`` is not an int >= 0.
    """
    seed = _checks.integer("seed", seed, minimum=0)
    generator = torch.Generator().manual_seed(seed)
    w_q, w_k = draw_weights(generator, device)
    return w_q, w_k, draw_tokens(LONG_SEQ, generator, device)


def _check_toy(w: torch.Tensor, tokens: torch.Tensor, num_heads: int, name: str = "w") -> int:
    """The head size of weights ``w`` split into ``num_heads`` heads, after checking the shapes."""
    num_heads = _checks.integer("num_heads", num_heads)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 2:
        raise ValueError(
            f"{name} must be a 2-D floating-point tensor (heads * head_dim, hidden), "
            f"got {name}={w!r:.80}"
        )
    if not isinstance(tokens, torch.Tensor) or not tokens.is_floating_point() or tokens.dim() != 2:
        raise ValueError(
            f"tokens must be a 2-D floating-point tensor (seq, hidden), got tokens={tokens!r:.80}"
        )
    if tokens.shape[1] != w.shape[1]:
        raise ValueError(
            f"tokens must have {name}'s hidden size {w.shape[1]} as last dimension, "
            f"got tokens of shape {tuple(tokens.shape)}"
        )
    rows = w.shape[0]
    if rows % num_heads or (rows // num_heads) % 2:
        raise ValueError(
            f"{name} must have num_heads * head_dim rows with an even head_dim, "
            f"got {name} with {rows} rows and num_heads={num_heads}"
        )
    return rows // num_heads


def head_vectors(w: torch.Tensor, tokens: torch.Tensor, num_heads: int = NUM_HEADS) -> torch.Tensor:
    """The queries (``w = w_q``) or keys (``w = w_k``) of every token, before RoPE.

    ``w`` is ``(num_heads * head_dim, hidden)``, ``tokens`` ``(seq, hidden)``; returns
    ``(num_heads, seq, head_dim)`` in their dtype: ``q = W_q h`` in row-vector form, one token per
    row, split into heads. Raises ``ValueError`` naming the argument for a shape that does not fit
    or an odd head size.
    """
    head_dim = _check_toy(w, tokens, num_heads)
    return (tokens @ w.T).view(len(tokens), num_heads, head_dim).transpose(0, 1)


def attention_scores(
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    layout: str,
    tokens: torch.Tensor,
    num_heads: int = NUM_HEADS,
) -> torch.Tensor:
    """The toy's attention scores (logits before scaling and softmax) with RoPE in ``layout``.

    ``w_q`` and ``w_k`` are ``(num_heads * head_dim, hidden)``, ``tokens`` ``(seq, hidden)``, at
    positions ``0 .. seq - 1``; ``layout`` is ``"interleaved"`` (Meta's model) or ``"half"``
    (Hugging Face's, equation rope-half). Returns ``(num_heads, seq, seq)`` in the inputs' dtype:
    entry ``[h, m, n]`` is ``<RoPE(q_m, m), RoPE(k_n, n)>`` of head ``h``. Raises ``ValueError``
    naming the argument for an unknown layout, shapes that do not fit or an odd head size.
    """
    layout = _checks.choice("layout", layout, LAYOUTS)
    _check_toy(w_q, tokens, num_heads, "w_q")
    _check_toy(w_k, tokens, num_heads, "w_k")
    if w_q.shape != w_k.shape:
        raise ValueError(f"w_q must have w_k's shape {tuple(w_k.shape)}, got {tuple(w_q.shape)}")
    positions = torch.arange(len(tokens), device=tokens.device)
    q = head_vectors(w_q, tokens, num_heads)  # (heads, seq, head_dim)
    k = head_vectors(w_k, tokens, num_heads)
    q, k = apply_rope(q, positions, layout=layout), apply_rope(k, positions, layout=layout)
    return q @ k.transpose(-2, -1)


def distances(seq: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The distance ``|m - n|`` of every query position m and key position n: ``(seq, seq)`` int64.

    Raises ``ValueError`` if ``seq`` is not a positive int.
    """
    seq = _checks.integer("seq", seq)
    return (torch.arange(seq, device=device)[:, None] - torch.arange(seq, device=device)).abs()


def _check_bands(bands: tuple[tuple[int, int], ...], seq: int) -> tuple[tuple[int, int], ...]:
    try:
        checked = tuple(
            (_checks.integer("low", low, minimum=0), _checks.integer("high", high, minimum=0))
            for low, high in bands
        )
    except (TypeError, ValueError):
        raise ValueError(f"bands must be pairs of ints (low, high), got bands={bands!r}") from None
    if not checked or any(not low <= high < seq for low, high in checked):
        raise ValueError(
            f"bands must be non-empty pairs with 0 <= low <= high < seq = {seq}, "
            f"got bands={bands!r}"
        )
    return checked


def band_errors(
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    tokens: torch.Tensor,
    *,
    bands: tuple[tuple[int, int], ...] = BANDS,
    reference: str = "interleaved",
    used: str = "half",
    num_heads: int = NUM_HEADS,
) -> list[float]:
    """Mean ``|score error|`` / mean ``|correct score|`` per band of distances, a float each.

    The correct scores are ``attention_scores`` in the ``reference`` layout (Meta's weights:
    interleaved), the wrong ones in the ``used`` layout (the forgotten permutation: half); the
    means run over both heads and every pair of positions with ``low <= |m - n| <= high``. Shapes as
    in ``attention_scores``. With ``used == reference`` every error is exactly 0. Raises
    ``ValueError`` naming the argument for a band outside ``0 .. seq - 1`` or ``low > high``, an
    unknown layout or shapes that do not fit.
    """
    bands = _check_bands(bands, len(tokens) if isinstance(tokens, torch.Tensor) else 0)
    correct = attention_scores(w_q, w_k, reference, tokens, num_heads)
    wrong = attention_scores(w_q, w_k, used, tokens, num_heads)
    distance = distances(len(tokens), tokens.device)
    in_band = [(distance >= low) & (distance <= high) for low, high in bands]
    return [
        ((correct - wrong)[:, band].abs().mean() / correct[:, band].abs().mean()).item()
        for band in in_band
    ]


def distance_zero_error(
    w_q: torch.Tensor,
    w_k: torch.Tensor,
    tokens: torch.Tensor,
    *,
    reference: str = "interleaved",
    used: str = "half",
    num_heads: int = NUM_HEADS,
) -> float:
    """The largest ``|score error|`` at distance 0 (query and key at one position), a float.

    The diagonal of the score matrices of ``band_errors``: 0 up to rounding for any weights, since
    both vectors get the same rotation and rotations keep inner products. Raises ``ValueError`` as
    ``attention_scores``.
    """
    correct = attention_scores(w_q, w_k, reference, tokens, num_heads)
    wrong = attention_scores(w_q, w_k, used, tokens, num_heads)
    return (correct - wrong).diagonal(dim1=-2, dim2=-1).abs().max().item()


def feature_pairs(head_dim: int, layout: str) -> torch.Tensor:
    """The pair that turns each feature j of a head: ``(head_dim,)`` int64.

    ``j // 2`` in the interleaved layout (pairs ``(x[2i], x[2i+1])``), ``j mod head_dim / 2`` in
    the half layout (pairs ``(x[i], x[i + head_dim/2])``, equation rope-half). Raises
    ``ValueError`` for an odd ``head_dim`` or an unknown ``layout``.
    """
    head_dim = _checks.even_dim("head_dim", head_dim)
    layout = _checks.choice("layout", layout, LAYOUTS)
    features = torch.arange(head_dim)
    return features // 2 if layout == "interleaved" else features % (head_dim // 2)


def feature_speeds(head_dim: int, layout: str, base: float = 10000.0) -> torch.Tensor:
    """Radians per token that each feature turns by, theta of its pair: ``(head_dim,)`` float32.

    Equation rope-theta: ``rope_frequencies(head_dim, base)[feature_pairs(head_dim, layout)]``.
    Raises ``ValueError`` as ``feature_pairs`` and ``rope_frequencies``.
    """
    pairs = feature_pairs(head_dim, layout)  # checks head_dim and layout first
    return rope_frequencies(head_dim, base)[pairs]


def slow_features(head_dim: int = HEAD_DIM, threshold: float = SLOW_SPEED) -> torch.Tensor:
    """Features turning by less than ``threshold`` rad/token in both layouts: ``(head_dim,)`` bool.

    The chapter's *slow* features (``SLOW_SPEED`` = 0.05: features 6, 7 and 11 to 15 for
    ``head_dim = 16``); the others are *fast*. Raises ``ValueError`` for an odd ``head_dim`` or a
    threshold that is not a finite real number.
    """
    threshold = _checks.real("threshold", threshold)
    slow_interleaved = feature_speeds(head_dim, "interleaved") < threshold
    return slow_interleaved & (feature_speeds(head_dim, "half") < threshold)
