"""Training of the lab: AdamW, linear warm-up then cosine decay, gradient clipping.

Part V. ``train`` is the loop; ``fit`` is the one routine every step of the lab trains with:
seed, build (or copy) the model, time, train. Deterministic on a given machine: ``fit`` seeds
everything (``rope_tutor.runtime.seed_everything``), batches come from a function of the step
number only, there is no dropout and no data-loader worker. A ``tqdm`` bar shows progress on
stderr.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from tqdm import tqdm

from rope_tutor.lab.model import ModelConfig, TinyLM
from rope_tutor.runtime import seed_everything

__all__ = ["BatchFactory", "Checkpoint", "Fitted", "TrainConfig", "fit", "learning_rate", "train"]

#: ``step -> (inputs, targets, weights)``: int64 ``(batch, seq)`` inputs and targets, and either
#: ``None`` (every target counts) or float ``(batch, seq)`` weights of each target in the loss.
BatchFunction = Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]

#: ``(steps_done, model) -> None``: what ``train`` calls at every step count, 0 included.
Checkpoint = Callable[[int, torch.nn.Module], None]


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser settings. ``lr`` is the peak rate, reached after ``warmup_steps``."""

    steps: int = 600
    batch_size: int = 32
    lr: float = 2e-3
    warmup_steps: int = 50
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def learning_rate(step: int, config: TrainConfig) -> float:
    """Linear warm-up to ``lr`` over ``warmup_steps``, then cosine decay to
    ``final_lr_fraction * lr`` at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, config.steps - config.warmup_steps - 1)
    progress = min(1.0, (step - config.warmup_steps) / span)
    floor = config.final_lr_fraction
    return config.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: torch.nn.Module,
    batch_fn: BatchFunction,
    config: TrainConfig,
    *,
    description: str = "train",
    progress: bool = True,
    checkpoint: Checkpoint | None = None,
) -> list[float]:
    """Train ``model`` in place for ``config.steps`` steps; return the loss of every step.

    Weight decay applies to matrices only (not to LayerNorm gains or biases). The loss is the
    mean cross-entropy over targets, weighted by ``weights`` when ``batch_fn`` gives them.
    ``checkpoint(steps_done, model)`` is called before the first step (0) and after every step,
    with the model in eval mode; it must not change the model (the loss curve of PI's
    fine-tuning in chapter "Extending a trained RoPE model" evaluates with it).
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=config.betas,
    )

    def visit(steps_done: int) -> None:
        if checkpoint is not None:
            model.eval()
            checkpoint(steps_done, model)
            model.train()

    visit(0)
    model.train()
    losses = []
    bar = tqdm(range(config.steps), desc=description, disable=not progress, mininterval=2.0)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, config)
        inputs, targets, weights = batch_fn(step)
        logits = model(inputs)
        per_target = F.cross_entropy(
            logits.flatten(0, 1), targets.flatten(), reduction="none"
        ).view_as(targets)
        loss = (
            per_target.mean() if weights is None else (per_target * weights).sum() / weights.sum()
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        losses.append(loss.item())
        visit(step + 1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


#: ``config -> BatchFunction``: the batches of a run, drawn from ``config.seed``,
#: ``config.steps`` and ``config.batch_size`` only, so that the seed of a run is one parameter.
BatchFactory = Callable[[TrainConfig], BatchFunction]


@dataclass(frozen=True)
class Fitted:
    """What ``fit`` returns: the trained model, the loss of every step, the wall time in seconds
    (a budget record, not a result) and the seed the run used."""

    model: TinyLM
    losses: list[float]
    seconds: float
    seed: int


def fit(
    arm: ModelConfig | TinyLM,
    batches: BatchFactory,
    config: TrainConfig,
    *,
    seed: int | None = None,
    scaling: Mapping[str, Any] | None = None,
    description: str = "train",
    progress: bool = True,
    checkpoint: Checkpoint | None = None,
) -> Fitted:
    """Seed, build, time, train: the one training routine of every step of the lab.

    ``arm`` is what is trained: a ``ModelConfig`` (a new ``TinyLM`` built after seeding) or a
    trained ``TinyLM`` to fine-tune (a copy is trained; the model passed in is not changed).
    ``seed`` (default ``config.seed``) seeds Python, NumPy and torch before the model is built
    and draws the batches (``batches(config)`` with ``config.seed = seed``); the thread count
    is left as the caller pinned it (reductions, hence the last bits, depend on it).
    ``scaling`` is the Hugging Face style ``rope_scaling`` the model trains with (``None``:
    plain RoPE; it must be ``None`` for an encoding other than RoPE). ``checkpoint`` is passed
    to ``train`` (its time counts in ``seconds``).
    """
    if seed is not None:
        config = replace(config, seed=seed)
    seed_everything(config.seed, threads=None)  # the caller pins the threads (--threads)
    if isinstance(arm, ModelConfig):
        model = TinyLM(arm)
    elif isinstance(arm, TinyLM):
        model = TinyLM(arm.config)
        model.load_state_dict(arm.state_dict())
    else:
        raise TypeError(f"arm must be a ModelConfig or a TinyLM, got {type(arm).__name__}")
    model.set_rope_scaling(scaling)
    batch_fn = batches(config)
    start = time.perf_counter()
    losses = train(
        model, batch_fn, config, description=description, progress=progress, checkpoint=checkpoint
    )
    return Fitted(model, losses, time.perf_counter() - start, config.seed)
