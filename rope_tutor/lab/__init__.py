"""Part V, the lab: tiny byte-level language models trained short and tested long.

``python -m rope_tutor.lab all`` reproduces every number of chapters "Train short, test long",
"Extending a trained RoPE model" and "Finding the needle" into the package's saved results
(``rope_tutor/results/lab/``: one folder ``seed_<n>/`` per training seed and ``summary.json``,
read back with ``load_seeds`` and ``load_results``).
Readers import it as ``from rope_tutor import lab``.

Modules: ``settings`` (every knob: ``BOOK``, ``QUICK``); ``data``, ``model``, ``train`` (the
loop, and ``fit``, the one seed-build-time-train routine every step uses) and ``evaluate``; the
steps ``short_long`` ("Train short, test long"), ``extend`` ("Extending a trained RoPE model"),
``passkey`` ("Finding the needle"), the held-out checks ``heldout``, ``heldout_short_long`` and
``heldout_needle``, ``alibi_checkpoint`` (step 1's ALiBi arm saved) and ``summary`` (every arm
over the training seeds);
``stats`` (means and paired differences over seeds, with Student-t intervals); ``verdicts``
(chapter 12's per-seed loss table and the verdicts its prose claims, built on ``stats``);
``records`` (the provenance written beside every number, ``load_results``, ``load_seeds`` and
``load_model``, which rebuilds a saved model from its safetensors file);
``attention_probabilities`` (``model``) returns a model's per-head attention weights, computed on
its forward pass.
"""

from rope_tutor.lab import stats, verdicts
from rope_tutor.lab.data import load_corpus, needle_batch
from rope_tutor.lab.extend import extension_methods
from rope_tutor.lab.model import (
    ENCODINGS,
    ModelConfig,
    TinyLM,
    attention_probabilities,
    load_checkpoint,
)
from rope_tutor.lab.records import load_model, load_results, load_seeds
from rope_tutor.lab.settings import BOOK
from rope_tutor.lab.train import TrainConfig, train

__all__ = [
    "BOOK",
    "ENCODINGS",
    "ModelConfig",
    "TinyLM",
    "TrainConfig",
    "attention_probabilities",
    "extension_methods",
    "load_checkpoint",
    "load_corpus",
    "load_model",
    "load_results",
    "load_seeds",
    "needle_batch",
    "stats",
    "train",
    "verdicts",
]
