"""Data for the lab: a byte corpus identical on every machine, and a synthetic needle task.

Part V. Nothing is downloaded and no third-party text is stored in the repository:

- ``load_corpus`` reads the Python sources of one pinned pure-Python package of
  ``requirements.txt``, ``CORPUS_PACKAGE`` (sympy 1.14.0; ``pip install "rope-tutor[lab]"``):
  its ``*.py`` files outside ``tests`` folders, sorted by relative path, concatenated up to a
  fixed budget. Files are split into training and validation by a hash of their path (not by
  offset), so the two never share a file. The bytes are the same wherever that version is
  installed, whatever the Python version or operating system; the SHA-256 of both splits is
  recorded in every result file, and a different installed version is refused.
- ``needle_batch`` builds the passkey-style retrieval task of chapter "Finding the needle" from a
  seeded generator (a documented deterministic generator, no text at all).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from rope_tutor.runtime import pinned_package

__all__ = [
    "CORPUS_PACKAGE",
    "Corpus",
    "corpus_files",
    "corpus_root",
    "load_corpus",
    "training_batches",
    "fixed_target_starts",
    "fixed_target_windows",
    "heldout_windows",
    "NEEDLE_MARKER",
    "needle_batch",
]

#: Every 10th file (by CRC-32 of its relative path) goes to validation.
VALIDATION_EVERY = 10

#: The distribution whose sources are the corpus, and its pinned version (``requirements.txt``).
CORPUS_PACKAGE: tuple[str, str] = ("sympy", "1.14.0")


@dataclass(frozen=True)
class Corpus:
    """Training and validation bytes as uint8 tensors, with their provenance."""

    train: torch.Tensor
    validation: torch.Tensor
    train_sha256: str
    validation_sha256: str
    source: str
    num_files: int

    def provenance(self) -> dict[str, object]:
        return {
            "corpus": self.source,
            "corpus_files": self.num_files,
            "train_bytes": int(self.train.numel()),
            "validation_bytes": int(self.validation.numel()),
            "train_sha256": self.train_sha256,
            "validation_sha256": self.validation_sha256,
        }


def corpus_files(root: str | Path) -> list[tuple[Path, str]]:
    """The ``*.py`` files under ``root`` in the order :func:`load_corpus` reads them, each with its
    split: ``"validation"`` when the CRC-32 of its relative path is divisible by
    ``VALIDATION_EVERY``, else ``"train"``. Files inside any ``tests`` folder are left out."""
    root = Path(root)
    files = [p for p in root.rglob("*.py") if "tests" not in p.relative_to(root).parts]
    ordered = sorted(files, key=lambda p: p.relative_to(root).as_posix())
    return [
        (
            p,
            "validation"
            if zlib.crc32(p.relative_to(root).as_posix().encode()) % VALIDATION_EVERY == 0
            else "train",
        )
        for p in ordered
    ]


def corpus_root() -> Path:
    """The installed ``CORPUS_PACKAGE``'s folder. Raises ``ModuleNotFoundError`` when it is not
    installed and ``RuntimeError`` when another version is (its bytes would differ)."""
    package, version = CORPUS_PACKAGE
    return pinned_package(package, version, 'the lab\'s corpus (pip install "rope-tutor[lab]")')


def load_corpus(
    train_bytes: int = 4_000_000, validation_bytes: int = 400_000, root: str | Path | None = None
) -> Corpus:
    """Read the corpus sources into ``train_bytes`` + ``validation_bytes`` bytes.

    ``root`` defaults to ``corpus_root()`` (the pinned sympy); another folder of ``*.py`` files
    is read the same way (the tests use one). Files are taken in sorted order of their relative
    path; a file goes to validation when the CRC-32 of its path is divisible by 10; each split
    stops when its budget is full (the last file is truncated). Raises ``ValueError`` for a
    non-positive budget and ``RuntimeError`` when the sources are too small to fill it.
    """
    if train_bytes < 1 or validation_bytes < 1:
        raise ValueError(
            f"budgets must be positive, got train_bytes={train_bytes}, "
            f"validation_bytes={validation_bytes}"
        )
    if root is None:
        root = corpus_root()
        package, version = CORPUS_PACKAGE
        source = f"{package}=={version} *.py sources outside tests/, sorted by path"
    else:
        root = Path(root)
        source = f"*.py sources under {root.name}/ outside tests/, sorted by path"
    budgets = {"train": train_bytes, "validation": validation_bytes}
    parts: dict[str, list[bytes]] = {"train": [], "validation": []}
    filled = {"train": 0, "validation": 0}
    num_files = 0
    for path, split in corpus_files(root):
        room = budgets[split] - filled[split]
        if room <= 0:
            if all(filled[s] >= budgets[s] for s in budgets):
                break
            continue
        data = path.read_bytes()[:room]
        parts[split].append(data)
        filled[split] += len(data)
        num_files += 1
    if any(filled[s] < budgets[s] for s in budgets):
        raise RuntimeError(f"{root} holds too little Python source for the budgets {budgets}")
    joined = {s: b"".join(parts[s]) for s in parts}
    return Corpus(
        train=torch.frombuffer(bytearray(joined["train"]), dtype=torch.uint8),
        validation=torch.frombuffer(bytearray(joined["validation"]), dtype=torch.uint8),
        train_sha256=hashlib.sha256(joined["train"]).hexdigest(),
        validation_sha256=hashlib.sha256(joined["validation"]).hexdigest(),
        source=source,
        num_files=num_files,
    )


def training_batches(
    data: torch.Tensor, batch_size: int, context: int, num_steps: int, seed: int
) -> torch.Tensor:
    """Start offsets of every training batch, drawn up front: ``(num_steps, batch_size)`` int64.

    Drawing them from one seeded generator before training makes the data order identical
    across arms (it depends only on ``seed``, the corpus length and ``context + 1``).
    """
    generator = torch.Generator().manual_seed(seed)
    high = data.numel() - context - 1
    if high < 1:
        raise ValueError(f"data of {data.numel()} bytes is too short for context={context}")
    return torch.randint(0, high, (num_steps, batch_size), generator=generator)


def slice_windows(data: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """Windows ``data[s : s + length]`` for each start, as int64 ``(len(starts), length)``."""
    index = starts[:, None] + torch.arange(length)[None, :]
    return data[index].long()


def fixed_target_windows(
    data: torch.Tensor, num_windows: int, length: int, seed: int
) -> torch.Tensor:
    """``num_windows`` validation windows of ``length + 1`` bytes at seeded random offsets.

    The evaluation generator is separate from the training one, so the evaluation data do not
    depend on how long a model was trained. Returns int64 ``(num_windows, length + 1)``.
    """
    return slice_windows(data, fixed_target_starts(data, num_windows, length, seed), length + 1)


def fixed_target_starts(
    data: torch.Tensor, num_windows: int, length: int, seed: int
) -> torch.Tensor:
    """The start offsets of ``fixed_target_windows``'s windows: int64 ``(num_windows,)``."""
    generator = torch.Generator().manual_seed(seed)
    high = data.numel() - length - 1
    if high < 1:
        raise ValueError(f"validation data of {data.numel()} bytes is shorter than {length + 1}")
    return torch.randint(0, high, (num_windows,), generator=generator)


def heldout_windows(
    data: torch.Tensor, num_windows: int, length: int, seed: int, avoid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_windows`` windows of ``length + 1`` bytes that share no byte with ``avoid``.

    ``avoid`` is int64 ``(k,)``: the start offsets of windows of ``length + 1`` bytes already
    used (the book's sample, ``fixed_target_windows``). Candidate starts are drawn from a
    generator seeded with ``seed``, in batches, and kept in the order drawn when their window
    misses every avoided byte; the held-out windows may overlap one another, as the book's may.
    Returns ``(windows, starts)``: int64 ``(num_windows, length + 1)`` and ``(num_windows,)``.
    Raises ``ValueError`` when ``data`` has too little free room to hold such windows.
    """
    span = length + 1
    high = data.numel() - span
    if high < 1:
        raise ValueError(f"validation data of {data.numel()} bytes is shorter than {span}")
    used = torch.zeros(data.numel() + 1, dtype=torch.long)
    for start in avoid.tolist():
        used[start : start + span] = 1
    before = torch.cat([torch.zeros(1, dtype=torch.long), used.cumsum(0)])  # used bytes < i
    generator = torch.Generator().manual_seed(seed)
    kept: list[int] = []
    for _ in range(1000):
        starts = torch.randint(0, high, (4 * num_windows,), generator=generator)
        free = (before[starts + span] - before[starts]) == 0
        kept.extend(starts[free].tolist())
        if len(kept) >= num_windows:
            starts = torch.tensor(kept[:num_windows], dtype=torch.long)
            return slice_windows(data, starts, span), starts
    raise ValueError(
        f"data of {data.numel()} bytes has too little room outside the avoided windows for "
        f"num_windows={num_windows} windows of {span} bytes"
    )


#: The byte that announces the key, once in the haystack and once in the question.
NEEDLE_MARKER = ord("=")
_FILLER = torch.tensor(list(b"abcdefghijklmnopqrstuvwxyz     "), dtype=torch.long)
_KEY_LETTERS = torch.tensor(list(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"), dtype=torch.long)


def needle_batch(
    batch_size: int, length: int, key_length: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of the synthetic needle-in-a-haystack task and the depth of each needle.

    Each sequence of exactly ``length`` bytes is random lowercase filler (letters and spaces,
    i.i.d., so no period to exploit) with the needle ``=KEY`` hidden at a uniformly random depth,
    ending with the question ``=`` followed by the key again: ``... =QHZTW ... =QHZTW``. The key
    is ``key_length`` distinct capital letters. The model is scored on the final key bytes (all,
    or all but a first "cue" letter), which it can only predict by finding the needle. Returns
    ``(tokens, depth)``: int64 ``(batch_size, length)`` and the needle's start position, int64
    ``(batch_size,)``.
    """
    needle = 1 + key_length
    room = length - 2 * needle
    if room < 0:
        raise ValueError(f"length={length} is too short for two copies of a {needle}-byte needle")
    filler = _FILLER[torch.randint(0, len(_FILLER), (batch_size, length), generator=generator)]
    keys = torch.stack(
        [
            _KEY_LETTERS[torch.randperm(len(_KEY_LETTERS), generator=generator)[:key_length]]
            for _ in range(batch_size)
        ]
    )  # (batch, key_length)
    depth = torch.randint(0, room + 1, (batch_size,), generator=generator)
    tokens = filler.clone()
    marker = torch.full((batch_size, 1), NEEDLE_MARKER, dtype=torch.long)
    needle_bytes = torch.cat([marker, keys], dim=1)  # (batch, needle)
    rows = torch.arange(batch_size)[:, None]
    tokens[rows, depth[:, None] + torch.arange(needle)[None, :]] = needle_bytes
    tokens[:, length - needle :] = needle_bytes
    return tokens, depth
