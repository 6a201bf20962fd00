"""Result files of the lab: the one provenance record, writing results and reading them back.

Part V. Every JSON file the lab writes carries ``provenance(...)``: what produced its numbers
(versions, threads, settings, seeds, steps, corpus checksums) and the subcommand that re-creates
it. ``load_results`` reads a file back, from the package's saved results or from a run's folder.
"""

from __future__ import annotations

import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch

from rope_tutor import __version__
from rope_tutor.lab.data import Corpus
from rope_tutor.lab.model import TinyLM, load_checkpoint
from rope_tutor.lab.settings import LabSettings
from rope_tutor.results import RESULTS_DIR
from rope_tutor.results import load as load_saved

__all__ = [
    "CHECKPOINTS",
    "load_model",
    "load_results",
    "load_seeds",
    "provenance",
    "rounded",
    "seed_folder",
    "write_result",
]

#: The lab's saved models, ``seed_<n>/<name>.safetensors``, and the encoding each must have:
#: step 1's RoPE arm (``train-short-test-long``), its ALiBi arm (``alibi-checkpoint``) and the
#: RoPE retrieval model of chapter "Finding the needle" (``heldout-needle``).
CHECKPOINTS: dict[str, str] = {"rope": "rope", "alibi": "alibi", "needle_rope": "rope"}


def provenance(
    settings: LabSettings, corpus: Corpus | None, command: str, **extra: Any
) -> dict[str, Any]:
    """What produced a number: versions, threads, seeds, steps, the corpus checksums, and the
    subcommand that re-creates the file (``all`` runs every subcommand).

    ``command`` is the subcommand with its options (``"extend"``, ``"arm --encoding rope"``);
    ``corpus`` is ``None`` for the synthetic needle task; ``extra`` adds step-specific entries
    (seed, steps, the ``TrainConfig`` as a dict, ...). ``threads`` is the torch thread count at
    the time of the call, that is, the one the step ran with.
    """
    record = {
        "rope_tutor": __version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "settings": settings.name,
        "run_seed": settings.run_seed,
        "command": f"python -m rope_tutor.lab {command}",
    }
    if corpus is not None:
        record.update(corpus.provenance())
    record.update(extra)
    return record


def rounded(value: float | None, digits: int = 5) -> float | None:
    """``value`` rounded to ``digits`` decimals for the JSON files (``None`` stays ``None``)."""
    return None if value is None else round(float(value), digits)


def write_result(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON to ``path``, creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def load_results(name: str, data_dir: Path | None = None) -> dict[str, Any]:
    """A result file of the lab, e.g. ``load_results("summary.json")``, as a dict.

    Without ``data_dir`` it reads the results saved with the package
    (``rope_tutor.results.load("lab/" + name)``), so it works from any installation; with
    ``data_dir`` it reads ``data_dir / name`` (the ``--out`` folder of a run of your own). Raises
    ``FileNotFoundError`` naming the missing file.
    """
    if data_dir is None:
        return load_saved(f"lab/{name}")
    path = Path(data_dir) / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: write it with `python -m rope_tutor.lab all --out {data_dir}`"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def seed_folder(run_seed: int) -> str:
    """The sub-folder of a run's output that holds training seed ``run_seed``: ``seed_<n>``."""
    return f"seed_{run_seed}"


def load_seeds(name: str, data_dir: Path | None = None) -> dict[int, dict[str, Any]]:
    """The result file ``name`` of every training seed, ``{seed: dict}`` in seed order.

    Reads ``seed_<n>/<name>`` of the package's saved results (``data_dir=None``) or of a run's
    folder, for every ``n`` present. Raises ``FileNotFoundError`` when no seed has the file.
    """
    if data_dir is None:
        folder = RESULTS_DIR / "lab"
    else:
        folder = Path(data_dir)
    seeds = sorted(
        int(p.parent.name.removeprefix("seed_"))
        for p in folder.glob(f"seed_*/{name}")
        if p.parent.name.removeprefix("seed_").isdigit()
    )
    if not seeds:
        raise FileNotFoundError(
            f"no seed_<n>/{name} in {folder}: write it with "
            f"`python -m rope_tutor.lab all --out {folder}`"
        )
    return {seed: load_results(f"{seed_folder(seed)}/{name}", data_dir) for seed in seeds}


def load_model(name: str, seed: int, data_dir: Path | None = None) -> TinyLM:
    """A trained lab model, rebuilt from ``seed_<seed>/<name>.safetensors``, in eval mode.

    ``name`` is one of ``CHECKPOINTS``: ``"rope"`` and ``"alibi"`` (the arms of chapter "Train
    short, test long", trained at T = 128 on text) or ``"needle_rope"`` (the retrieval model of
    chapter "Finding the needle"). Without ``data_dir`` it reads the package's saved files,
    otherwise the ``--out`` folder of a run. The file is safetensors (no code runs on loading);
    ``model.load_checkpoint`` checks every tensor's name and shape against the ``ModelConfig`` in
    the file's metadata, and this function checks that config's encoding is ``name``'s.
    Returns a ``TinyLM`` whose forward maps int64 ``(batch, seq)`` bytes to float32 ``(batch, seq,
    256)`` logits. Raises ``ValueError`` naming a bad ``name``, ``seed`` or a file of the wrong
    encoding, ``FileNotFoundError`` naming a missing file.
    """
    if name not in CHECKPOINTS:
        raise ValueError(f"name must be one of {sorted(CHECKPOINTS)}, got name={name!r}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got seed={seed!r}")
    folder = RESULTS_DIR / "lab" if data_dir is None else Path(data_dir)
    path = folder / seed_folder(seed) / f"{name}.safetensors"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: write it with `python -m rope_tutor.lab all --out {folder}`"
        )
    model = load_checkpoint(path)
    if model.config.encoding != CHECKPOINTS[name]:
        raise ValueError(
            f"{path} holds a model with encoding={model.config.encoding!r}, expected "
            f"{CHECKPOINTS[name]!r} for name={name!r}"
        )
    return model
