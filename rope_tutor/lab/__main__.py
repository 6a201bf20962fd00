"""Command line of the lab: ``python -m rope_tutor.lab all`` reproduces chapters 11-13.

Subcommands ``train-short-test-long``, ``extend``, ``yarn-beta`` and ``passkey`` run one step
each (modules ``short_long``, ``extend``, ``yarn_beta``, ``passkey``; every run ends with
``summary``; ``extend`` and ``yarn-beta`` reuse the RoPE checkpoint of ``train-short-test-long``
when it is present; ``yarn-beta`` is inference only, minutes on two cores);
``arm --encoding rope`` re-trains and evaluates one arm of ``train-short-test-long`` into
``<out>/arm_<encoding>.json`` (what ``tests/test_lab.py`` compares with the saved numbers);
``needle-arm --encoding alibi`` trains one encoding on the needle task into
``<out>/needle_<encoding>.json`` (``passkey`` runs it for every encoding of
``passkey.OTHER_ENCODINGS`` after writing ``needle.json``);
``--quick`` runs a tiny configuration (seconds) for smoke tests; ``--out`` picks the folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from rope_tutor.lab.extend import extend_rope
from rope_tutor.lab.model import ENCODINGS
from rope_tutor.lab.passkey import OTHER_ENCODINGS, find_the_needle, needle_arm
from rope_tutor.lab.settings import BOOK, DEFAULT_OUT_DIR, QUICK, load_corpus_for
from rope_tutor.lab.short_long import run_arm, train_short_test_long
from rope_tutor.lab.summary import write_summary
from rope_tutor.lab.yarn_beta import yarn_beta
from rope_tutor.runtime import DEFAULT_THREADS, seed_everything

COMMANDS = ("all", "train-short-test-long", "extend", "yarn-beta", "passkey", "arm", "needle-arm")


def _restart_with_passive_waiting() -> None:
    """Re-run this command with ``OMP_WAIT_POLICY=PASSIVE`` unless it is set already.

    OpenMP reads the variable once, when torch is imported. Passive waiting changes no number
    (the thread count, hence every reduction order, is the same); it only stops idle threads
    from spinning, which makes a 2-thread run many times faster on a CPU shared with other jobs.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "rope_tutor.lab", *sys.argv[1:]])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m rope_tutor.lab", description=__doc__)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--quick", action="store_true", help="tiny configuration, for tests")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder ({DEFAULT_OUT_DIR})")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument(
        "--encoding", choices=ENCODINGS, default="rope", help="for 'arm' and 'needle-arm'"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="torch threads (default %(default)s); reductions depend on it, so results are "
        "bit-identical only at the thread count recorded in a file's provenance",
    )
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else BOOK
    out_dir = args.out if args.out is not None else DEFAULT_OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    seed_everything(0, threads=args.threads)  # pins the thread count before any computation

    timings = {}
    start = time.perf_counter()
    corpus = None
    if args.command in ("all", "train-short-test-long", "extend", "yarn-beta", "arm"):
        corpus = load_corpus_for(settings)
    if args.command == "arm":
        run_arm(args.encoding, settings, corpus, out_dir, progress=progress)
        print("wrote", out_dir / f"arm_{args.encoding}.json")
        return {"total": time.perf_counter() - start}
    if args.command == "needle-arm":
        needle_arm(args.encoding, settings, out_dir, progress=progress)
        print("wrote", out_dir / f"needle_{args.encoding}.json")
        return {"total": time.perf_counter() - start}
    if args.command in ("all", "train-short-test-long"):
        train_short_test_long(settings, corpus, out_dir, progress=progress)
        timings["train_short_test_long"] = time.perf_counter() - start
    if args.command in ("all", "extend"):
        t = time.perf_counter()
        extend_rope(settings, corpus, out_dir, progress=progress)
        timings["extend"] = time.perf_counter() - t
    if args.command in ("all", "yarn-beta"):
        t = time.perf_counter()
        yarn_beta(settings, corpus, out_dir, progress=progress)
        timings["yarn_beta"] = time.perf_counter() - t
    if args.command in ("all", "passkey"):
        t = time.perf_counter()
        find_the_needle(settings, out_dir, progress=progress)
        for encoding in OTHER_ENCODINGS:
            needle_arm(encoding, settings, out_dir, progress=progress)
        timings["passkey"] = time.perf_counter() - t
    write_summary(out_dir)
    timings["total"] = time.perf_counter() - start

    # Wall time of each experiment on this machine (it varies: a budget record, not a result).
    timings_file = out_dir / "timings.json"
    record = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    record.update({f"{k}_seconds": round(v, 1) for k, v in timings.items() if k != "total"})
    if args.command == "all":
        record["all_seconds"] = round(timings["total"], 1)
    timings_file.write_text(json.dumps(record, indent=1) + "\n")
    print("wrote", out_dir, {k: f"{v:.0f} s" for k, v in timings.items()})
    return timings


if __name__ == "__main__":
    _restart_with_passive_waiting()
    main()
