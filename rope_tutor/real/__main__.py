"""Command line: ``python -m rope_tutor.real all`` reproduces the saved results of chapter "A
real model past its window".

Subcommands ``loss``, ``texts`` (the other texts), ``memory``, ``reach``, ``trials`` (ten
prompts per reach cell) and ``sliding`` (sliding-window perplexity) run one step each (``all``
runs them all, ``memory`` first, for its baseline); ``long`` runs the measurements at 4 L, sized
for a GPU, and is not part of ``all``. ``--quick`` runs a tiny
configuration (about a minute, most of it loading the model) for smoke tests; ``--out`` picks
the folder (default: the package's saved results, ``rope_tutor/results/real/``). A run that
stops resumes where it stopped: finished passes are kept in the output files.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rope_tutor.real.experiments import (
    BOOK,
    BOOK_TRIALS,
    GPU_TEXTS,
    LONG,
    OTHER_TEXTS,
    QUICK,
    QUICK_LONG,
    QUICK_TRIALS,
    TEXT_SLIDING,
    RealSettings,
    TrialSettings,
    run_long,
    run_loss,
    run_memory,
    run_reach,
    run_sliding,
    run_text_loss,
    run_trials,
    text_settings,
)
from rope_tutor.real.model import load, repeated_kv_attention
from rope_tutor.results import RESULTS_DIR

COMMANDS = ("all", "loss", "texts", "memory", "reach", "trials", "sliding", "long")
DEFAULT_OUT_DIR = RESULTS_DIR / "real"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rope_tutor.real", description=__doc__)
    parser.add_argument(
        "commands",
        nargs="+",
        choices=COMMANDS,
        metavar="command",
        help=f"one or more of {', '.join(COMMANDS)}",
    )
    parser.add_argument("--quick", action="store_true", help="tiny configuration, for tests")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder ({DEFAULT_OUT_DIR})")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch threads (default %(default)s)"
    )
    args = parser.parse_args(argv)
    if "OMP_WAIT_POLICY" not in os.environ:  # idle threads sleep: no number changes
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "rope_tutor.real", *sys.argv[1:]])
    torch.set_num_threads(args.threads)
    settings = QUICK if args.quick else BOOK
    trials = QUICK_TRIALS if args.quick else BOOK_TRIALS
    out_dir = args.out if args.out is not None else DEFAULT_OUT_DIR
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    model, tokenizer = load(device=device)

    def progress(name: str):
        return lambda items: tqdm(list(items), desc=name, unit="pass", disable=args.no_progress)

    # on a GPU, float32 attention over grouped-query heads would take PyTorch's reference kernel
    # and its (heads, n, n) weights: repeat the key-value heads so that a fused kernel takes it
    with repeated_kv_attention() if device == "cuda" else contextlib.nullcontext():
        run(args, model, tokenizer, settings, trials, out_dir, progress)
    print(f"done in {time.perf_counter() - started:.0f} s; results in {out_dir}")


def run(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    settings: RealSettings,
    trials: TrialSettings,
    out_dir: Path,
    progress: Callable[[str], Callable[[Iterable[Any]], Iterable[Any]]],
) -> None:
    """The steps named in ``args.commands``, in the order of ``COMMANDS`` (``memory`` first)."""
    if {"all", "memory"} & set(args.commands):  # first: its baseline is the freshly loaded model
        lengths = (QUICK.window,) if args.quick else None
        kwargs = {"lengths": lengths} if lengths else {}
        run_memory(model, tokenizer, settings, out_dir / "memory.json", **kwargs)
    if {"all", "loss"} & set(args.commands):
        run_loss(model, tokenizer, settings, out_dir / "loss_vs_position.json", progress("loss"))
    if {"all", "texts"} & set(args.commands):
        for text in OTHER_TEXTS:
            out = out_dir / f"loss_{text}.json"
            run_text_loss(model, tokenizer, settings, text, out, progress(f"loss, {text}"))
    if {"all", "reach"} & set(args.commands):
        run_reach(model, tokenizer, settings, out_dir / "reach.json", progress("reach"))
    if {"all", "trials"} & set(args.commands):
        out = out_dir / "trials.json"
        run_trials(model, tokenizer, settings, trials, out, progress("trials"))
    if {"all", "sliding"} & set(args.commands):
        out = out_dir / "sliding.json"
        run_sliding(model, tokenizer, settings, trials, out, progress("sliding"))
        text_trials = QUICK_TRIALS if args.quick else TEXT_SLIDING
        for text in GPU_TEXTS:
            out = out_dir / f"sliding_{text}.json"
            name = f"sliding, {text}"
            run_sliding(
                model, tokenizer, text_settings(settings, text), text_trials, out, progress(name)
            )
    if "long" in args.commands:
        long = QUICK_LONG if args.quick else LONG
        text_trials = QUICK_TRIALS if args.quick else TEXT_SLIDING
        run_long(model, tokenizer, out_dir, long, trials, progress, text_trials)


if __name__ == "__main__":
    main()
