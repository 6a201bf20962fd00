"""Command line: ``python -m rope_tutor.real all`` reproduces the saved results of chapter "A
real model past its window".

Subcommands ``loss``, ``texts`` (the other texts), ``memory`` and ``reach`` run one step each
(``all`` runs them all, ``memory`` first, for its baseline); ``--quick`` runs a tiny
configuration (about a minute, most of it loading the model) for smoke tests; ``--out`` picks
the folder (default: the package's saved results, ``rope_tutor/results/real/``). A run that
stops resumes where it stopped: finished passes are kept in the output files.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rope_tutor.real.experiments import (
    BOOK,
    OTHER_TEXTS,
    QUICK,
    run_loss,
    run_memory,
    run_reach,
    run_text_loss,
)
from rope_tutor.real.model import load
from rope_tutor.results import RESULTS_DIR

COMMANDS = ("all", "loss", "texts", "memory", "reach")
DEFAULT_OUT_DIR = RESULTS_DIR / "real"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rope_tutor.real", description=__doc__)
    parser.add_argument("command", choices=COMMANDS)
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
    out_dir = args.out if args.out is not None else DEFAULT_OUT_DIR
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    model, tokenizer = load(device=device)

    def progress(name: str):
        return lambda items: tqdm(list(items), desc=name, unit="pass", disable=args.no_progress)

    if args.command in ("all", "memory"):  # first: its baseline is the freshly loaded model
        lengths = (QUICK.window,) if args.quick else None
        kwargs = {"lengths": lengths} if lengths else {}
        run_memory(model, tokenizer, settings, out_dir / "memory.json", **kwargs)
    if args.command in ("all", "loss"):
        run_loss(model, tokenizer, settings, out_dir / "loss_vs_position.json", progress("loss"))
    if args.command in ("all", "texts"):
        for text in OTHER_TEXTS:
            out = out_dir / f"loss_{text}.json"
            run_text_loss(model, tokenizer, settings, text, out, progress(f"loss, {text}"))
    if args.command in ("all", "reach"):
        run_reach(model, tokenizer, settings, out_dir / "reach.json", progress("reach"))
    print(f"done in {time.perf_counter() - started:.0f} s; results in {out_dir}")


if __name__ == "__main__":
    main()
