"""The chapter's measurements on SmolLM2-135M: loss against position, and how far back it looks.

Chapter "A real model past its window"; run with ``python -m rope_tutor.real``. Two steps, each
written to one JSON file that carries its provenance (model file and text SHA-256, device,
threads, versions, wall times) and resumable: a run that stops keeps every finished pass, and
the next call with the same settings skips them.

* ``loss``: the per-token loss (nats/token) of a long text, averaged in 512-token bins, for the
  unscaled model and every method (PI, static NTK, dynamic NTK, YaRN with the paper's beta,
  Llama 3 bands), with the factor matched to the length (s = 1.5 at 1.5 L, s = 2 at 2 L). The
  model is causal, so a pass over 2 L tokens at s = 2 also gives that fixed factor's loss on
  every shorter text: its cost inside the window shows in the same curve. One more pass, YaRN
  at s = 2 without its attention temperature (``yarn_no_temperature``: the same frequencies,
  attention factor 1), shows what the temperature alone buys. Dynamic NTK (factor
  1: the scale is exactly l / L) is evaluated in 2,048-token pieces: the loss at positions
  (l - 2048, l] comes from a pass over l tokens, as a reader who re-runs the model on a growing
  text would get it.
* ``texts``: the same measurement on the other texts of ``texts.TEXTS`` (one file each,
  ``loss_<text>.json``), for fewer settings: the unscaled model and the methods that rank best
  on the first text (static NTK, YaRN, Llama 3), plus YaRN without its temperature, each in one
  pass over 2 L tokens at s = 2 (its bins below L are the cost of a fixed s = 2 inside the
  window, those past L what it buys up to 2 L).
* ``memory``: the process's resident memory (RSS) before, and its peak during, one unscaled
  pass over each of ``MEMORY_LENGTHS`` tokens, to say whether a longer pass is limited by memory
  or by time (the passes of ``loss`` and ``texts`` record their peaks too).
* ``reach``: the passkey and copy probes (``probes``) at several depths, inside the window for
  the unscaled model, and at 2 L for the unscaled model and the methods that ``loss`` ranks best.
* ``trials``: the cells of ``reach`` with ``TrialSettings.trials`` prompts each (different
  filler, key and span; trial 0 is the reach step's prompt), so that "retrieved" becomes a rate
  with an interval, as the PI and YaRN papers score passkey retrieval over many trials.
* ``sliding``: sliding-window perplexity, the protocol of the PI and YaRN papers (Press et al.'s
  sliding window, as in YaRN's ``eval/perplexity.py``): windows of W tokens step through the text
  by ``stride`` tokens, and each window scores only the tokens the previous one did not (the first
  scores all), so that every token of the text is scored once, most with W - stride or more
  tokens of context. For W = L, 1.5 L and 2 L, each method at factor W / L; then, on each of
  the ``GPU_TEXTS`` (``sliding_<text>.json``), W = L and 2 L for the methods of ``TEXT_SLIDING``.
* ``long``: the same measurements at 4 L (``LONG``), sized for a GPU: the loss step and the texts
  step at s = 4, the trials at 4 L, and sliding-window perplexity with W = 4 L (on each of the
  ``GPU_TEXTS`` too, ``sliding_long_<text>.json``, for the methods of ``TEXT_SLIDING``).
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from rope_tutor import __version__, _checks
from rope_tutor.real.model import (
    gguf_path,
    kv_heads_repeated,
    sha256,
    token_nll,
    use_rope,
    window,
)
from rope_tutor.real.probes import build_prompt, score_prompt
from rope_tutor.real.texts import read_text
from rope_tutor.runtime import cpu_model

__all__ = [
    "BOOK",
    "BOOK_TRIALS",
    "LONG",
    "QUICK",
    "QUICK_LONG",
    "QUICK_TRIALS",
    "GPU_TEXTS",
    "OTHER_TEXTS",
    "TEXT_SLIDING",
    "RealSettings",
    "TrialSettings",
    "run_long",
    "run_sliding",
    "run_trials",
    "sliding_windows",
    "trial_seed",
    "scaling_for",
    "run_loss",
    "run_memory",
    "peak_rss_mib",
    "run_reach",
    "run_text_loss",
    "text_settings",
]

#: The methods of the chapter, keyed like the package's palette.
METHODS = ("none", "pi", "ntk", "dynamic_ntk", "yarn", "llama3", "yarn_no_temperature")


@dataclass(frozen=True)
class RealSettings:
    """Sizes of one configuration. ``window`` overrides the model's L (``None``: its own 8,192;
    the quick configuration pretends L = 256 so that a smoke test takes seconds)."""

    name: str
    window: int | None = None
    text: str = "code"
    multiples: tuple[float, ...] = (1.5, 2.0)
    bin_size: int = 512
    dynamic_piece: int = 2048
    reach_in_window: tuple[int, ...] = (4096, 8192)
    reach_multiple: float = 2.0
    reach_depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    reach_methods: tuple[str, ...] = ("none", "ntk", "yarn", "llama3")
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


BOOK = RealSettings("book")
#: The texts of the ``texts`` step (``BOOK.text`` is the first), and the methods run on them.
OTHER_TEXTS = ("technical", "literary")
#: The other texts of the ``sliding`` and ``long`` steps, sized for a GPU.
GPU_TEXTS = ("technical", "literary")
TEXT_METHODS = ("none", "yarn", "yarn_no_temperature", "ntk", "llama3")

#: Lengths of the ``memory`` step, in tokens (the ``texts`` step records the peak at 2 L); the
#: last, 4 L, says whether a CPU pass over 4 L would be limited by memory or by time.
MEMORY_LENGTHS = (1024, 2048, 4096, 32768)

QUICK = RealSettings(
    "quick",
    window=256,
    multiples=(1.5, 2.0),
    bin_size=64,
    dynamic_piece=128,
    reach_in_window=(192,),
    reach_depths=(0.1, 0.9),
    reach_methods=("none", "yarn"),
)


@dataclass(frozen=True)
class TrialSettings:
    """Sizes of the ``trials``, ``sliding`` and ``long`` steps, kept apart from ``RealSettings`` so
    that the saved results of the other steps keep their provenance. ``trials``: prompts per
    reach cell; ``stride``: tokens between sliding windows; ``sliding_multiples``: the window
    sizes W / L of the ``sliding`` step; ``sliding_methods``: the methods it runs (each at factor
    W / L; at W = L every method is the unscaled model, so only ``none`` runs there);
    ``sliding_tokens``: the tokens of the text the sliding windows cover (``None``: all)."""

    name: str
    trials: int = 10
    stride: int = 2048
    sliding_tokens: int | None = None
    sliding_multiples: tuple[float, ...] = (1.0, 1.5, 2.0)
    sliding_methods: tuple[str, ...] = (
        "none",
        "pi",
        "ntk",
        "yarn",
        "yarn_no_temperature",
        "llama3",
    )


BOOK_TRIALS = TrialSettings("book")
QUICK_TRIALS = TrialSettings(
    "quick",
    trials=2,
    stride=64,
    sliding_tokens=1024,
    sliding_multiples=(1.0, 2.0),
    sliding_methods=("none", "yarn"),
)
#: The ``sliding`` step's sizes on the other texts (``OTHER_TEXTS``): the unscaled model at L
#: and 2 L, and at 2 L the methods that rank best on the first text, plus YaRN without its
#: temperature.
TEXT_SLIDING = replace(
    BOOK_TRIALS,
    name="book-texts",
    sliding_multiples=(1.0, 2.0),
    sliding_methods=("none", "ntk", "yarn", "yarn_no_temperature", "llama3"),
)
#: The ``long`` step's sizes: 4 L for the loss, the texts, the trials and the sliding windows.
LONG = replace(BOOK, name="book-long", multiples=(4.0,), reach_multiple=4.0, reach_in_window=())
QUICK_LONG = replace(
    QUICK, name="quick-long", multiples=(4.0,), reach_multiple=4.0, reach_in_window=()
)


def scaling_for(method: str, factor: float, window: int) -> dict[str, Any] | None:
    """The scaling dict (Part IV's registry) of a chapter method at ``factor`` for window L.

    ``none`` is ``None``; ``pi`` is ``linear``; ``dynamic_ntk`` uses factor 1 (the scale at
    length l is l / L; the registry's ``factor`` is a slope, see ``transformers_rope_parameters``);
    ``yarn`` has the paper's beta_fast = 32, beta_slow = 1; ``yarn_no_temperature`` is the same
    with ``attention_factor`` 1 (YaRN's frequencies without the logit scale (0.1 ln s + 1)^2 of
    YaRN's Eq. 22); ``llama3`` Meta's low 1, high 4.
    Raises ``ValueError`` for an unknown method.
    """
    windowed = {"original_max_position_embeddings": window}
    table: dict[str, dict[str, Any] | None] = {
        "none": None,
        "pi": {"rope_type": "linear", "factor": factor},
        "ntk": {"rope_type": "ntk", "factor": factor},
        "dynamic_ntk": {"rope_type": "dynamic", "factor": 1.0, **windowed},
        "yarn": {
            "rope_type": "yarn",
            "factor": factor,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            **windowed,
        },
        "yarn_no_temperature": {
            "rope_type": "yarn",
            "factor": factor,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "attention_factor": 1.0,
            **windowed,
        },
        "llama3": {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            **windowed,
        },
    }
    if method not in table:
        raise ValueError(f"unknown method={method!r}; expected one of {list(table)}")
    return table[method]


def provenance(settings: RealSettings, command: str, **extra: Any) -> dict[str, Any]:
    """What produced the numbers: model file, settings, versions, device, threads, command."""
    import transformers

    path = gguf_path()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return {
        "rope_tutor": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
        "device": torch.cuda.get_device_name() if device == "cuda" else cpu_model(),
        "threads": torch.get_num_threads(),
        "kv_heads_repeated": kv_heads_repeated(),
        "model_file": path.name,
        "model_sha256": sha256(path),
        "settings": {k: v for k, v in asdict(settings).items() if k != "extra"},
        "command": f"python -m rope_tutor.real {command}",
        **extra,
    }


def _read(path: Path, same: dict[str, Any]) -> dict[str, Any]:
    """The partial results in ``path`` when they were made with the same settings, else empty."""
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        kept = {k: saved["provenance"].get(k) for k in same}
        if kept == json.loads(json.dumps(same)):  # as JSON stores it: tuples become lists
            return saved
    return {}


def _keep(out: Path, result: dict[str, Any], table: str, key: str, entry: dict[str, Any]) -> None:
    """Add ``entry`` to ``result[table]``, total the wall times in the provenance, and save."""
    result[table][key] = entry
    total = sum(e["wall_s"] for e in result[table].values())
    result["provenance"]["wall_s"] = round(total, 1)
    _write(out, result)


def _write(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)  # never a half-written file


def _bins(nll: torch.Tensor, bin_size: int) -> list[float]:
    """Mean loss per bin of ``bin_size`` target positions (target t = entry t - 1)."""
    targets = torch.arange(1, nll.numel() + 1)
    out = []
    for lo in range(0, nll.numel() + 1, bin_size):
        mask = (targets >= lo) & (targets < lo + bin_size)
        if mask.any():
            out.append(round(float(nll[mask].mean()), 5))
    return out


def _loss_passes(settings: RealSettings, L: int) -> list[tuple[str, float, int]]:
    """(method, factor, length) of every pass of the loss step, longest first."""
    longest = round(max(settings.multiples) * L)
    passes = [("none", 1.0, longest)]
    for method in ("pi", "ntk", "yarn", "llama3"):
        for m in sorted(settings.multiples, reverse=True):
            passes.append((method, float(m), round(m * L)))
    for length in range(L + settings.dynamic_piece, longest + 1, settings.dynamic_piece):
        passes.append(("dynamic_ntk", length / L, length))
    passes.append(("yarn_no_temperature", float(max(settings.multiples)), longest))
    return passes


def _text_passes(settings: RealSettings, L: int) -> list[tuple[str, float, int]]:
    """(method, factor, length) of every pass of the ``texts`` step: one pass over the longest
    length for each of ``TEXT_METHODS``, at the largest factor (the unscaled model at 1)."""
    top = float(max(settings.multiples))
    longest = round(top * L)
    return [(m, 1.0 if m == "none" else top, longest) for m in TEXT_METHODS]


def text_settings(settings: RealSettings, text: str) -> RealSettings:
    """``settings`` for another text: the same sizes, named ``<name>-<text>``."""
    return replace(settings, name=f"{settings.name}-{text}", text=text)


def _key(method: str, factor: float, length: int) -> str:
    return f"{method} s={factor:g} n={length}"


def run_loss(
    model: Any,
    tokenizer: Any,
    settings: RealSettings,
    out: Path,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x,
    plan: Callable[[RealSettings, int], list[tuple[str, float, int]]] = _loss_passes,
    command: str = "loss",
) -> dict[str, Any]:
    """The loss step: every pass of ``plan`` (default ``_loss_passes``), written to ``out``
    after each one."""
    L = settings.window or window(model)
    text, text_record = read_text(settings.text)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    record = provenance(settings, command, text=text_record, text_tokens=int(ids.numel()))
    same = {k: record[k] for k in ("model_sha256", "settings", "text")}
    result = _read(out, same) or {
        "description": "mean loss (nats/token) of the text in bins of bin_size target positions, "
        "per pass (method, factor s, length n); dynamic_ntk passes keep only their last piece",
        "provenance": record,
        "window": L,
        "passes": {},
    }
    for method, factor, length in progress(plan(settings, L)):
        key = _key(method, factor, length)
        if key in result["passes"]:
            continue
        if length > ids.numel():
            raise ValueError(f"the text has {ids.numel()} tokens, fewer than length={length}")
        start = time.perf_counter()
        before = peak_rss_mib(reset=True)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        use_rope(model, scaling_for(method, factor, L))
        nll = token_nll(model, ids[:length])
        peak = peak_rss_mib()
        entry = {
            "method": method,
            "factor": factor,
            "length": length,
            "bins": _bins(nll, settings.bin_size),
        }
        if method == "dynamic_ntk":  # keep the last piece: the positions this length adds
            entry["first_bin"] = (length - settings.dynamic_piece) // settings.bin_size
            entry["bins"] = entry["bins"][entry["first_bin"] :]
        entry["wall_s"] = round(time.perf_counter() - start, 1)
        entry["threads"] = torch.get_num_threads()
        entry["rss_before_mib"], entry["peak_rss_mib"] = round(before, 1), round(peak, 1)
        if torch.cuda.is_available():
            entry["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        _keep(out, result, "passes", key, entry)
    return result


def run_text_loss(
    model: Any,
    tokenizer: Any,
    settings: RealSettings,
    text: str,
    out: Path,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x,
) -> dict[str, Any]:
    """The ``texts`` step for one text: ``run_loss`` on ``text`` with the passes of
    ``_text_passes``, written to ``out`` after each one."""
    return run_loss(
        model,
        tokenizer,
        text_settings(settings, text),
        out,
        progress,
        plan=_text_passes,
        command="texts",
    )


def _status_mib(field: str) -> float | None:
    """A memory line of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in MiB; ``None`` off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return None


def rss_mib() -> float:
    """This process's resident memory now, in MiB (its peak so far where the kernel does not
    say: ``ru_maxrss``)."""
    now = _status_mib("VmRSS")
    return now if now is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_rss_mib(reset: bool = False) -> float:
    """This process's peak resident memory, in MiB, since the last ``reset`` (Linux: ``VmHWM``,
    which writing 5 to ``/proc/self/clear_refs`` resets to the current RSS); elsewhere the peak
    since the start (``ru_maxrss``). With ``reset``, resets it and returns the current RSS."""
    if reset:
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
    peak = _status_mib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_memory(
    model: Any,
    tokenizer: Any,
    settings: RealSettings,
    out: Path,
    lengths: tuple[int, ...] = MEMORY_LENGTHS,
) -> dict[str, Any]:
    """The memory step: the resident memory (MiB) before, and its peak during, an unscaled
    ``token_nll`` pass over the first ``n`` tokens of ``settings.text``, for each ``n`` of
    ``lengths``. Written to ``out`` once, at the end, and kept: a saved file with the same
    model, settings, text and lengths is returned as it is. Raises ``ValueError`` for a length
    the text does not have."""
    text, text_record = read_text(settings.text)
    attention = getattr(model.config, "_attn_implementation", None)
    record = provenance(
        settings, "memory", text=text_record, attention=attention, lengths=sorted(lengths)
    )
    saved = _read(out, {k: record[k] for k in ("model_sha256", "settings", "text", "lengths")})
    if saved:
        return saved
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    use_rope(model, scaling_for("none", 1.0, settings.window or window(model)))
    passes = {}
    for length in sorted(lengths):
        if length > ids.numel():
            raise ValueError(f"the text has {ids.numel()} tokens, fewer than length={length}")
        start = time.perf_counter()
        before = peak_rss_mib(reset=True)
        token_nll(model, ids[:length])
        passes[str(length)] = {
            "length": length,
            "rss_before_mib": round(before, 1),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "wall_s": round(time.perf_counter() - start, 1),
        }
    record["wall_s"] = round(sum(p["wall_s"] for p in passes.values()), 1)
    result = {
        "description": "resident memory (MiB) of the process before an unscaled pass over "
        "length tokens (rss_before_mib) and its peak during the pass (peak_rss_mib)",
        "provenance": record,
        "passes": passes,
    }
    _write(out, result)
    return result


def trial_seed(settings: RealSettings, depth: float, trial: int) -> int:
    """The seed of trial ``trial`` of a reach cell at ``depth``: trial 0 is the reach step's
    prompt (``settings.seed * 1000 + round(100 * depth)``), trial t adds 100,000 t. Every method
    and length sees the same prompts, so methods are compared prompt by prompt."""
    trial = _checks.integer("trial", trial, minimum=0)
    return settings.seed * 1000 + round(depth * 100) + 100_000 * trial


def _probe(
    model: Any, tokenizer: Any, cell: tuple[str, float, int, float], seed: int, L: int
) -> dict[str, Any]:
    """One reach cell (method, factor, length, depth) with the prompt of ``seed``: the prompt's
    key and distance, ``score_prompt``'s scores and the wall time."""
    method, factor, length, depth = cell
    start = time.perf_counter()
    prompt = build_prompt(tokenizer, length, depth, seed=seed)
    use_rope(model, scaling_for(method, factor, L))
    return {
        "method": method,
        "factor": factor,
        "length": length,
        "depth": depth,
        "distance": prompt.distance,
        "key": prompt.key,
        **score_prompt(model, prompt),
        "wall_s": round(time.perf_counter() - start, 1),
    }


def _reach_cells(settings: RealSettings, L: int) -> list[tuple[str, float, int, float]]:
    """(method, factor, length, depth) of every cell of the reach step."""
    cells = [("none", 1.0, n, d) for n in settings.reach_in_window for d in settings.reach_depths]
    long = round(settings.reach_multiple * L)
    for method in settings.reach_methods:
        factor = 1.0 if method == "none" else settings.reach_multiple
        cells += [(method, factor, long, d) for d in settings.reach_depths]
    return cells


def run_reach(
    model: Any,
    tokenizer: Any,
    settings: RealSettings,
    out: Path,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x,
) -> dict[str, Any]:
    """The reach step: every cell of ``_reach_cells``, written to ``out`` after each one."""
    L = settings.window or window(model)
    record = provenance(settings, "reach")
    same = {k: record[k] for k in ("model_sha256", "settings")}
    result = _read(out, same) or {
        "description": "passkey (teacher-forced: key_nll in nats, retrieved = every key token is "
        "the top prediction) and copy probe (copy_nll, nats/token on the second copy of a random "
        "span; first_copy_nll is the no-memory baseline) per cell (method, factor s, length n, "
        "depth of the key); distance = tokens from the key sentence to the answer",
        "provenance": record,
        "window": L,
        "cells": {},
    }
    for method, factor, length, depth in progress(_reach_cells(settings, L)):
        key = f"{_key(method, factor, length)} depth={depth:g}"
        if key in result["cells"]:
            continue
        seed = trial_seed(settings, depth, 0)  # the same prompt for every method
        entry = _probe(model, tokenizer, (method, factor, length, depth), seed, L)
        _keep(out, result, "cells", key, entry)
    return result


def _trial_cells(
    settings: RealSettings, trials: TrialSettings, L: int
) -> list[tuple[str, float, int, float, int]]:
    """(method, factor, length, depth, trial) of every cell of the trials step, trial by trial
    (a run cut short has as many trials of every cell, give or take one)."""
    cells = _reach_cells(settings, L)
    return [(*cell, t) for t in range(trials.trials) for cell in cells]


def run_trials(
    model: Any,
    tokenizer: Any,
    settings: RealSettings,
    trials: TrialSettings,
    out: Path,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x,
    command: str = "trials",
) -> dict[str, Any]:
    """The trials step: every cell of ``_trial_cells``, written to ``out`` after each one."""
    L = settings.window or window(model)
    record = provenance(settings, command, trial_settings=asdict(trials))
    same = {k: record[k] for k in ("model_sha256", "settings", "trial_settings")}
    result = _read(out, same) or {
        "description": "the reach step's passkey and copy probes (see reach.json), "
        "trial_settings.trials prompts per cell (method, factor s, length n, depth); trial t "
        "uses seed trial_seed(settings, depth, t), the same for every method",
        "provenance": record,
        "window": L,
        "cells": {},
    }
    for method, factor, length, depth, trial in progress(_trial_cells(settings, trials, L)):
        key = f"{_key(method, factor, length)} depth={depth:g} trial={trial}"
        if key in result["cells"]:
            continue
        seed = trial_seed(settings, depth, trial)
        entry = _probe(model, tokenizer, (method, factor, length, depth), seed, L)
        _keep(out, result, "cells", key, {**entry, "trial": trial, "seed": seed})
    return result


def sliding_windows(n_tokens: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """The windows of sliding-window perplexity over a text of ``n_tokens`` tokens.

    Returns ``(begin, end, scored)`` per window: the window holds tokens ``begin .. end - 1``
    (always ``window`` of them) and scores its last ``scored`` tokens, those the windows before
    it did not (the first window scores tokens 1 .. window - 1: token 0 has no prediction).
    Windows start every ``stride`` tokens, as in Press et al.'s protocol and YaRN's
    ``eval/perplexity.py``; the last one ends at the text's end (there, unlike YaRN's code, it
    starts at ``n_tokens - window``, so that it too is ``window`` tokens long). Every token
    1 .. n_tokens - 1 is scored exactly once. Raises ``ValueError`` unless
    ``1 <= stride < window <= n_tokens``.
    """
    window = _checks.integer("window", window, minimum=2)
    stride = _checks.integer("stride", stride)
    n_tokens = _checks.integer("n_tokens", n_tokens)
    if stride >= window:
        raise ValueError(f"stride={stride} must be smaller than window={window}")
    if window > n_tokens:
        raise ValueError(f"window={window} is longer than the text (n_tokens={n_tokens})")
    out, scored_to = [], 1  # tokens 1 .. scored_to - 1 are scored
    for begin in range(0, n_tokens, stride):
        end = begin + window
        if end >= n_tokens:
            begin, end = n_tokens - window, n_tokens
        out.append((begin, end, end - scored_to))
        scored_to = end
        if end == n_tokens:
            break
    return out


def _sliding_runs(
    settings: RealSettings, trials: TrialSettings, L: int, multiples: tuple[float, ...]
) -> list[tuple[str, float, int]]:
    """(method, factor, window) of every sweep of the sliding step."""
    runs = []
    for m in multiples:
        for method in trials.sliding_methods:
            if method == "none" or m != 1.0:
                runs.append((method, 1.0 if method == "none" else float(m), round(m * L)))
    return runs


def run_sliding(
    model: Any,
    tokenizer: Any,
    settings: RealSettings,
    trials: TrialSettings,
    out: Path,
    progress: Callable[[Iterable[Any]], Iterable[Any]] = lambda x: x,
    multiples: tuple[float, ...] | None = None,
    command: str = "sliding",
) -> dict[str, Any]:
    """The sliding step on ``settings.text``: for each window size W = m L (m in ``multiples``,
    default ``trials.sliding_multiples``) and method, the windows of ``sliding_windows`` with
    ``trials.stride``; each window's summed loss is saved as soon as it is computed, so that a
    stopped sweep resumes at its next window. A finished sweep also records its token-weighted
    mean loss (nats/token), perplexity exp(mean), and the mean of its windows' means (the
    average YaRN's ``eval/perplexity.py`` reports)."""
    L = settings.window or window(model)
    multiples = tuple(trials.sliding_multiples if multiples is None else multiples)
    text, text_record = read_text(settings.text)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.int64)
    ids = ids[: trials.sliding_tokens]
    record = provenance(
        settings,
        command,
        text=text_record,
        text_tokens=int(ids.numel()),
        trial_settings=asdict(trials),
        multiples=list(multiples),
    )
    same = {k: record[k] for k in ("model_sha256", "settings", "text", "trial_settings")}
    same["multiples"] = record["multiples"]
    result = _read(out, same) or {
        "description": "sliding-window perplexity: per sweep (method, factor s, window W), the "
        "windows [begin, end, scored, summed nats of the scored tokens]; mean_nll = total "
        "nats / total scored tokens, perplexity = exp(mean_nll)",
        "provenance": record,
        "window": L,
        "sweeps": {},
    }
    for method, factor, size in progress(_sliding_runs(settings, trials, L, multiples)):
        key = f"{method} s={factor:g} W={size}"
        plan = sliding_windows(int(ids.numel()), size, trials.stride)
        entry = result["sweeps"].get(key) or {
            "method": method,
            "factor": factor,
            "window_tokens": size,
            "stride": trials.stride,
            "windows": [],
            "wall_s": 0.0,
        }
        if len(entry["windows"]) == len(plan):
            continue
        use_rope(model, scaling_for(method, factor, L))
        for begin, end, scored in plan[len(entry["windows"]) :]:
            start = time.perf_counter()
            nll = token_nll(model, ids[begin:end], targets=slice(end - begin - 1 - scored, None))
            entry["windows"].append([begin, end, scored, round(float(nll.double().sum()), 4)])
            entry["wall_s"] = round(entry["wall_s"] + time.perf_counter() - start, 1)
            if len(entry["windows"]) == len(plan):
                total = sum(w[3] for w in entry["windows"])
                tokens = sum(w[2] for w in entry["windows"])
                means = [w[3] / w[2] for w in entry["windows"]]
                entry["tokens"] = tokens
                entry["mean_nll"] = round(total / tokens, 5)
                entry["perplexity"] = round(math.exp(total / tokens), 4)
                entry["mean_of_window_means"] = round(sum(means) / len(means), 5)
            _keep(out, result, "sweeps", key, entry)
    return result


def run_long(
    model: Any,
    tokenizer: Any,
    out_dir: Path,
    settings: RealSettings = LONG,
    trials: TrialSettings = BOOK_TRIALS,
    progress: Callable[[str], Callable[[Iterable[Any]], Iterable[Any]]] = lambda name: lambda x: x,
    text_trials: TrialSettings = TEXT_SLIDING,
) -> None:
    """The long step, at ``settings.multiples`` (4 L): the loss step (``loss_long.json``) and the
    texts step (``loss_long_<text>.json``) at s = 4, sliding-window perplexity with W = 4 L
    (``sliding_long.json``), then the trials at 4 L (``trials_long.json``), the longest, and
    last sliding-window perplexity with W = 4 L on the other texts (``sliding_long_<text>.json``,
    the methods of ``text_trials``)."""
    run_loss(
        model, tokenizer, settings, out_dir / "loss_long.json", progress("loss, 4L"), command="long"
    )
    for text in GPU_TEXTS:
        run_loss(
            model,
            tokenizer,
            text_settings(settings, text),
            out_dir / f"loss_long_{text}.json",
            progress(f"loss, {text}, 4L"),
            plan=_text_passes,
            command="long",
        )
    run_sliding(
        model,
        tokenizer,
        settings,
        trials,
        out_dir / "sliding_long.json",
        progress("sliding, 4L"),
        multiples=settings.multiples,
        command="long",
    )
    run_trials(
        model,
        tokenizer,
        settings,
        trials,
        out_dir / "trials_long.json",
        progress("trials, 4L"),
        command="long",
    )
    for text in GPU_TEXTS:
        run_sliding(
            model,
            tokenizer,
            text_settings(settings, text),
            text_trials,
            out_dir / f"sliding_long_{text}.json",
            progress(f"sliding, {text}, 4L"),
            multiples=settings.multiples,
            command="long",
        )
