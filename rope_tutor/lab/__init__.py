"""Part V, the lab: tiny byte-level language models trained short and tested long.

``python -m rope_tutor.lab all`` reproduces every number of chapters "Train short, test long",
"Extending a trained RoPE model" and "Finding the needle" into the package's saved results
(``rope_tutor/results/lab/``, read back with ``load_results``).
Readers import it as ``from rope_tutor import lab``.

Modules: ``settings`` (every knob: ``BOOK``, ``QUICK``); ``data``, ``model``, ``train`` (the
loop, and ``fit``, the one seed-build-time-train routine every step uses) and ``evaluate``; the
steps ``short_long`` ("Train short, test long"), ``extend`` ("Extending a trained RoPE model"),
``passkey`` ("Finding the needle") and ``summary``; ``records`` (the provenance written beside
every number, and ``load_results``).
"""

from rope_tutor.lab.data import load_corpus, needle_batch
from rope_tutor.lab.extend import extension_methods
from rope_tutor.lab.model import ENCODINGS, ModelConfig, TinyLM, load_checkpoint
from rope_tutor.lab.records import load_results
from rope_tutor.lab.settings import BOOK
from rope_tutor.lab.train import TrainConfig, train

__all__ = [
    "BOOK",
    "ENCODINGS",
    "ModelConfig",
    "TinyLM",
    "TrainConfig",
    "extension_methods",
    "load_checkpoint",
    "load_corpus",
    "load_results",
    "needle_batch",
    "train",
]
