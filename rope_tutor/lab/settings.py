"""Every knob of the lab in one frozen dataclass: ``BOOK`` (what the chapters show) and ``QUICK``.

Part V. ``python -m rope_tutor.lab`` runs ``BOOK`` and, with ``--quick``, ``QUICK``: the same
steps in a tiny configuration (seconds) for smoke tests. Results go to ``DEFAULT_OUT_DIR``, the
package's saved results (``rope_tutor.results``), unless ``--out`` names another folder.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rope_tutor.lab.data import Corpus, load_corpus
from rope_tutor.lab.model import ModelConfig
from rope_tutor.lab.train import TrainConfig
from rope_tutor.results import RESULTS_DIR

__all__ = ["BOOK", "DEFAULT_OUT_DIR", "QUICK", "SEED_STRIDE", "LabSettings", "load_corpus_for"]

#: Run seed r trains with each ``TrainConfig``'s seed + ``SEED_STRIDE * r``.
SEED_STRIDE = 100

#: Where the lab writes its results by default: package data, so the chapters find them wherever
#: the package is installed (``rope_tutor.results.load("lab/…")``).
DEFAULT_OUT_DIR = RESULTS_DIR / "lab"


@dataclass(frozen=True)
class LabSettings:
    """Every knob of the lab. ``BOOK`` is what the chapters show; ``QUICK`` is for smoke tests.

    ``context`` is the training length T in bytes; ``multiples`` are the evaluation lengths in
    units of T. ``pretrain`` trains the language models of "Train short, test long",
    ``finetune`` their fine-tunes at ``extend_factor * T`` ("Extending a trained RoPE model"),
    ``heldout_windows`` windows drawn with ``heldout_seed``, sharing no byte with the
    ``eval_windows`` windows of ``eval_seed``, are the held-out sample of step 2c (``heldout``).
    ``rope_bases`` are the RoPE bases of step 1c (``base_sweep``): each trained as step 1's RoPE
    arm, whose base is ``ModelConfig().rope_base`` (10^4, one of them).
    ``needle_train`` and ``needle_finetune`` the retrieval models of "Finding the needle",
    scored on ``needle_samples`` needles per length (``eval_seed``) and, in step 3b
    (``heldout_needle``), on ``needle_heldout_samples`` others (``heldout_seed``).
    ``pi_curve_steps`` are the checkpoints of the longer PI fine-tune evaluated against steps.
    ``seeds`` are the training seeds ``python -m rope_tutor.lab all`` runs (``for_seed``; each
    into ``seed_<n>/`` of the output folder); ``other_needle_seeds`` those at which the
    encodings of ``passkey.OTHER_ENCODINGS`` are trained on the needle task too.
    ``run_seed`` is the seed these settings are for.
    """

    name: str = "book"
    context: int = 128
    multiples: tuple[int, ...] = (1, 2, 4, 8, 16)
    num_layers: int = 2
    train_bytes: int = 4_000_000
    validation_bytes: int = 400_000
    pretrain: TrainConfig = field(
        default_factory=lambda: TrainConfig(steps=500, batch_size=16, lr=2e-3, warmup_steps=50)
    )
    eval_windows: int = 32
    eval_seed: int = 1234
    heldout_windows: int = 128
    heldout_seed: int = 2027
    rope_bases: tuple[float, ...] = (20.0, 500.0, 10000.0, 1000000.0)
    chunked_bytes: int = 16384
    extend_factor: float = 4.0
    temperature_factors: tuple[float, ...] = (2.0, 4.0, 8.0)
    logit_multipliers: tuple[float, ...] = (
        0.8,
        0.9,
        1.0,
        1.1,
        1.2,
        1.3,
        1.4,
        1.5,
        1.6,
        1.8,
        2.0,
        2.4,
    )
    finetune: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            steps=100, batch_size=4, lr=6e-4, warmup_steps=10, seed=1
        )
    )
    needle_encodings: tuple[str, ...] = ("rope",)
    needle_key_length: int = 3
    needle_cue: int = 0
    needle_train: TrainConfig = field(
        default_factory=lambda: TrainConfig(steps=3000, batch_size=32, lr=3e-3, warmup_steps=30)
    )
    needle_multiples: tuple[int, ...] = (1, 2, 4, 8)
    needle_samples: int = 100
    needle_heldout_samples: int = 400
    needle_finetune: TrainConfig = field(
        default_factory=lambda: TrainConfig(
            steps=60, batch_size=8, lr=6e-4, warmup_steps=10, seed=1
        )
    )
    pi_curve_steps: tuple[int, ...] = (0, 25, 50, 100, 200, 400)
    seeds: tuple[int, ...] = (0, 1, 2)
    other_needle_seeds: tuple[int, ...] = (0, 1, 2)
    run_seed: int = 0

    def for_seed(self, run_seed: int) -> LabSettings:
        """These settings for training seed ``run_seed``: every ``TrainConfig``'s seed plus
        ``SEED_STRIDE * run_seed`` (run seed 0 keeps them). Evaluation samples (``eval_seed``) do
        not change, so every run seed is scored on the same windows and needles and differences
        between arms can be paired seed by seed. Raises ``ValueError`` for a negative seed."""
        if run_seed < 0:
            raise ValueError(f"run_seed must be >= 0, got run_seed={run_seed}")
        shift = SEED_STRIDE * (run_seed - self.run_seed)
        configs = {
            name: replace(getattr(self, name), seed=getattr(self, name).seed + shift)
            for name in ("pretrain", "finetune", "needle_train", "needle_finetune")
        }
        return replace(self, run_seed=run_seed, **configs)

    def model_config(self, encoding: str) -> ModelConfig:
        """The lab's model with position encoding ``encoding``: ``num_layers`` deep, trained
        (and, for a learned table, sized) at ``context``."""
        return ModelConfig(encoding=encoding, num_layers=self.num_layers, context=self.context)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


BOOK = LabSettings()
QUICK = replace(
    BOOK,
    name="quick",
    multiples=(1, 2, 4),
    train_bytes=200_000,
    validation_bytes=40_000,
    pretrain=TrainConfig(steps=8, batch_size=4, warmup_steps=2),
    eval_windows=4,
    heldout_windows=4,
    chunked_bytes=2048,
    temperature_factors=(2.0,),
    logit_multipliers=(1.0, 1.2),
    finetune=TrainConfig(steps=3, batch_size=2, lr=6e-4, warmup_steps=1, seed=1),
    needle_encodings=("rope",),
    needle_train=TrainConfig(steps=8, batch_size=8, warmup_steps=2),
    needle_multiples=(1, 2),
    needle_samples=8,
    needle_heldout_samples=8,
    needle_finetune=TrainConfig(steps=3, batch_size=2, lr=6e-4, warmup_steps=1, seed=1),
    pi_curve_steps=(0, 2, 4),
    seeds=(0, 1),
)


def load_corpus_for(settings: LabSettings) -> Corpus:
    """The byte corpus of ``settings``: ``train_bytes`` + ``validation_bytes`` of the corpus sources
    (``rope_tutor.lab.data.load_corpus``)."""
    return load_corpus(settings.train_bytes, settings.validation_bytes)
