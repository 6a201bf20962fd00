"""Saved results that the chapters load, shipped inside the package.

The long runs of the book (the lab of Part V, the benchmark of Part VI) write their results here,
with the provenance of each number beside it, and the chapters read them back with :func:`load`.
Because they are package data, a chapter runs the same from a clone, from ``pip install
rope-tutor`` in an empty folder, or on Colab::

    from rope_tutor import results
    summary = results.load("lab/summary.json")        # a dict, provenance included
    checkpoint = results.path("lab/seed_0/rope.safetensors")  # a file to open yourself

Names are paths relative to this folder, written with ``/``: ``lab/…`` (``python -m
rope_tutor.lab``), ``bench/…`` (``python -m rope_tutor.bench``) and ``gpu/…`` (``python -m
rope_tutor.gpu_bench``, on a CUDA GPU).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_DIR", "available", "load", "path"]

#: The folder that holds the saved results: the default output folder of ``python -m
#: rope_tutor.lab`` and ``python -m rope_tutor.bench``.
RESULTS_DIR = Path(str(resources.files(__name__)))


def available(prefix: str = "") -> list[str]:
    """The names of every saved result file, sorted, optionally only those under ``prefix``.

    ``available("lab/")`` lists the lab's files.
    """
    names = (
        p.relative_to(RESULTS_DIR).as_posix()
        for p in RESULTS_DIR.rglob("*")
        if p.is_file() and p.suffix in {".json", ".safetensors"}
    )
    return sorted(n for n in names if n.startswith(prefix))


def path(name: str) -> Path:
    """The path of the saved result ``name`` (for example ``"lab/seed_0/rope.safetensors"``).

    Raises ``ValueError`` for a name that is not a relative path inside the results folder and
    ``FileNotFoundError``, listing what is there, for a name that is not saved.
    """
    if not isinstance(name, str) or not name or name.startswith("/") or ".." in name.split("/"):
        raise ValueError(f"name must be a relative path such as 'lab/summary.json', got {name!r}")
    found = RESULTS_DIR / name
    if not found.is_file():
        raise FileNotFoundError(
            f"no saved result named {name!r} in {RESULTS_DIR}; saved results: {available()}"
        )
    return found


def load(name: str) -> dict[str, Any]:
    """The saved JSON result ``name`` (for example ``"bench/rope_cpu_1thread.json"``) as a dict.

    Raises ``ValueError`` for a name that is not a ``.json`` file, and ``FileNotFoundError`` as
    :func:`path` does.
    """
    if not isinstance(name, str) or not name.endswith(".json"):
        raise ValueError(f"name must name a .json result such as 'lab/summary.json', got {name!r}")
    return json.loads(path(name).read_text(encoding="utf-8"))
