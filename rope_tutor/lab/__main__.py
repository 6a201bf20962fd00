"""Command line of the lab: ``python -m rope_tutor.lab all`` reproduces chapters 11-13.

``all`` runs, for each training seed (``--seeds``, default ``LabSettings.seeds``) into
``<out>/seed_<n>/``, the steps ``train-short-test-long``, ``extend``, ``yarn-beta``, ``heldout``,
``more-methods``, ``heldout-short-long``, ``base-sweep``, ``alibi-checkpoint``, ``passkey`` and
``heldout-needle`` (modules ``short_long``, ``extend``, ``yarn_beta``, ``heldout``,
``more_methods``, ``heldout_short_long``, ``base_sweep``, ``alibi_checkpoint``, ``passkey``,
``heldout_needle``; ``passkey``
also trains the encodings of ``passkey.OTHER_ENCODINGS`` at the seeds of
``other_needle_seeds``), then writes
``<out>/summary.json`` (module ``summary``). Each step shows progress bars and is skipped when its
files are already there with the same settings, seed and corpus: an interrupted run resumes where
it stopped. A step named alone runs for every seed of ``--seeds``; ``extend``, ``yarn-beta``,
``heldout`` and ``more-methods`` reuse the seed's RoPE checkpoint of
``train-short-test-long`` when present. ``arm --encoding rope`` re-trains and evaluates one arm
of ``train-short-test-long`` into ``<out>/seed_<n>/arm_<encoding>.json`` (what
``tests/test_lab.py`` compares with the saved numbers); ``needle-arm --encoding alibi`` trains
one encoding on the needle task into ``<out>/seed_<n>/needle_<encoding>.json``, and
``heldout-needle-arm --encoding alibi`` trains it again and scores it on the held-out needles of
``heldout-needle`` into ``<out>/seed_<n>/heldout_needle_<encoding>.json`` (resumable like a step;
``heldout-needle``, hence ``all``, runs it at the seeds of ``other_needle_seeds``). ``--quick`` runs
a tiny configuration (seconds) for smoke tests; ``--out`` picks the folder; wall times go to
``<out>/timings.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rope_tutor.lab.alibi_checkpoint import alibi_checkpoint
from rope_tutor.lab.base_sweep import base_sweep
from rope_tutor.lab.data import Corpus
from rope_tutor.lab.extend import extend_rope
from rope_tutor.lab.heldout import heldout
from rope_tutor.lab.heldout_needle import heldout_needle, heldout_needle_arm
from rope_tutor.lab.heldout_short_long import heldout_short_long
from rope_tutor.lab.model import ENCODINGS
from rope_tutor.lab.more_methods import more_methods
from rope_tutor.lab.passkey import OTHER_ENCODINGS, find_the_needle, needle_arm
from rope_tutor.lab.records import seed_folder
from rope_tutor.lab.settings import BOOK, DEFAULT_OUT_DIR, QUICK, LabSettings, load_corpus_for
from rope_tutor.lab.short_long import run_arm, train_short_test_long
from rope_tutor.lab.summary import write_summary
from rope_tutor.lab.yarn_beta import yarn_beta
from rope_tutor.runtime import DEFAULT_THREADS, cpu_model, seed_everything

COMMANDS = (
    "all",
    "train-short-test-long",
    "extend",
    "yarn-beta",
    "heldout",
    "more-methods",
    "heldout-short-long",
    "base-sweep",
    "alibi-checkpoint",
    "passkey",
    "heldout-needle",
    "arm",
    "needle-arm",
    "heldout-needle-arm",
)

#: The steps of ``all`` in order, each with the files it writes into a seed's folder.
STEPS: dict[str, tuple[str, ...]] = {
    "train-short-test-long": ("train_short_test_long.json", "rope.safetensors"),
    "extend": ("extend_rope.json",),
    "yarn-beta": ("yarn_beta.json",),
    "heldout": ("heldout.json",),
    "more-methods": ("more_methods.json",),
    "heldout-short-long": ("heldout_short_long.json",),
    "base-sweep": ("base_sweep.json",),
    "alibi-checkpoint": ("alibi_checkpoint.json", "alibi.safetensors"),
    "passkey": ("needle.json",),
    "heldout-needle": ("heldout_needle.json", "needle_rope.safetensors"),
}


def _done(folder: Path, files: tuple[str, ...], expected: dict[str, Any]) -> bool:
    """Whether every file of a step is in ``folder`` and its JSON's provenance has the
    ``expected`` entries (``_expected``): a step interrupted, or run with other settings or
    another thread count, is run again."""
    for name in files:
        path = folder / name
        if not path.is_file():
            return False
        if name.endswith(".json"):
            record = json.loads(path.read_text(encoding="utf-8"))["provenance"]
            if any(record.get(key) != value for key, value in expected.items()):
                return False
    return True


def _expected(
    step: str, settings: LabSettings, corpus: Corpus | None, threads: int
) -> dict[str, Any]:
    """The provenance entries a finished step's files must carry to be kept: settings, seed,
    steps, thread count (reductions, hence the numbers, depend on it) and corpus checksum."""
    if step in ("passkey", "needle-arm", "heldout-needle", "heldout-needle-arm"):
        return {
            "settings": settings.name,
            "seed": settings.needle_train.seed,
            "steps": settings.needle_train.steps,
            "threads": threads,
        }
    assert corpus is not None
    return {
        "settings": settings.name,
        "seed": settings.pretrain.seed,
        "steps": settings.pretrain.steps,
        "threads": threads,
        "train_sha256": corpus.train_sha256,
    }


def _run_step(
    step: str, settings: LabSettings, corpus: Corpus | None, folder: Path, progress: bool
) -> None:
    if step == "train-short-test-long":
        train_short_test_long(settings, corpus, folder, progress=progress)
    elif step == "extend":
        extend_rope(settings, corpus, folder, progress=progress)
    elif step == "yarn-beta":
        yarn_beta(settings, corpus, folder, progress=progress)
    elif step == "heldout":
        heldout(settings, corpus, folder, progress=progress)
    elif step == "more-methods":
        more_methods(settings, corpus, folder, progress=progress)
    elif step == "heldout-short-long":
        heldout_short_long(settings, corpus, folder, progress=progress)
    elif step == "base-sweep":
        base_sweep(settings, corpus, folder, progress=progress)
    elif step == "alibi-checkpoint":
        alibi_checkpoint(settings, corpus, folder, progress=progress)
    elif step == "passkey":
        find_the_needle(settings, folder, progress=progress)
    elif step == "heldout-needle":
        heldout_needle(settings, folder, progress=progress)
    elif step.startswith("heldout-needle-arm:"):
        heldout_needle_arm(step.split(":", 1)[1], settings, folder, progress=progress)
    else:  # "needle-arm:<encoding>"
        needle_arm(step.split(":", 1)[1], settings, folder, progress=progress)


def _restart_with_passive_waiting() -> None:
    """Re-run this command with ``OMP_WAIT_POLICY=PASSIVE`` unless it is set already.

    OpenMP reads the variable once, when torch is imported. Passive waiting changes no number
    (the thread count, hence every reduction order, is the same); it only stops idle threads
    from spinning, which makes a 2-thread run many times faster on a CPU shared with other jobs.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.execv(sys.executable, [sys.executable, "-m", "rope_tutor.lab", *sys.argv[1:]])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m rope_tutor.lab", description=__doc__)
    parser.add_argument("command", choices=COMMANDS)
    parser.add_argument("--quick", action="store_true", help="tiny configuration, for tests")
    parser.add_argument("--out", type=Path, default=None, help=f"output folder ({DEFAULT_OUT_DIR})")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="training seeds to run (default: the settings' seeds, 0 1 2; --quick: 0 1)",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    parser.add_argument(
        "--encoding",
        choices=ENCODINGS,
        default="rope",
        help="for 'arm', 'needle-arm' and 'heldout-needle-arm' (not rope)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=DEFAULT_THREADS,
        help="torch threads (default %(default)s); reductions depend on it, so results are "
        "bit-identical only at the thread count recorded in a file's provenance",
    )
    args = parser.parse_args(argv)
    if args.command == "heldout-needle-arm" and args.encoding == "rope":
        parser.error("heldout-needle-arm needs --encoding other than rope (rope: heldout-needle)")
    settings = QUICK if args.quick else BOOK
    seeds = tuple(args.seeds) if args.seeds is not None else settings.seeds
    if any(seed < 0 for seed in seeds) or len(set(seeds)) != len(seeds):
        parser.error(f"--seeds must be distinct non-negative integers, got {list(seeds)}")
    out_dir = args.out if args.out is not None else DEFAULT_OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = not args.no_progress
    seed_everything(0, threads=args.threads)  # pins the thread count before any computation

    start = time.perf_counter()
    if args.command in ("arm", "needle-arm"):
        for seed in seeds:
            folder = out_dir / seed_folder(seed)
            folder.mkdir(parents=True, exist_ok=True)
            if args.command == "arm":
                run_arm(
                    args.encoding,
                    settings.for_seed(seed),
                    load_corpus_for(settings),
                    folder,
                    progress=progress,
                )
                print("wrote", folder / f"arm_{args.encoding}.json")
            else:
                needle_arm(args.encoding, settings.for_seed(seed), folder, progress=progress)
                print("wrote", folder / f"needle_{args.encoding}.json")
        return {"total": time.perf_counter() - start}

    steps = list(STEPS) if args.command == "all" else [args.command]
    jobs: list[tuple[int, str, tuple[str, ...]]] = []
    for seed in seeds:
        if args.command == "heldout-needle-arm":
            held = f"heldout-needle-arm:{args.encoding}"
            jobs.append((seed, held, (f"heldout_needle_{args.encoding}.json",)))
            continue
        for step in steps:
            jobs.append((seed, step, STEPS[step]))
            if step == "passkey" and seed in settings.other_needle_seeds:
                for encoding in OTHER_ENCODINGS:
                    jobs.append((seed, f"needle-arm:{encoding}", (f"needle_{encoding}.json",)))
            if step == "heldout-needle" and seed in settings.other_needle_seeds:
                for encoding in OTHER_ENCODINGS:
                    held = f"heldout-needle-arm:{encoding}"
                    jobs.append((seed, held, (f"heldout_needle_{encoding}.json",)))
    corpus = None
    if any(not step.startswith(("passkey", "needle", "heldout-needle")) for _, step, _ in jobs):
        corpus = load_corpus_for(settings)

    timings_file = out_dir / "timings.json"
    timings = json.loads(timings_file.read_text()) if timings_file.exists() else {}
    for number, (seed, step, files) in enumerate(jobs, start=1):
        run_settings = settings.for_seed(seed)
        folder = out_dir / seed_folder(seed)
        expected = _expected(step.split(":")[0], run_settings, corpus, args.threads)
        label = f"[{number}/{len(jobs)}] seed {seed}, {step}"
        if _done(folder, files, expected):
            print(f"{label}: done already, kept (delete {folder} to recompute)", flush=True)
            continue
        print(f"{label} ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        _run_step(step, run_settings, corpus, folder, progress)
        seconds = round(time.perf_counter() - t, 1)
        # Wall time of each step on this machine: a budget record, not a result.
        record = timings.setdefault(seed_folder(seed), {})
        record[f"{step}_seconds"] = seconds
        if timings.setdefault("device", cpu_model()) != cpu_model():  # a step run elsewhere
            record[f"{step}_device"] = cpu_model()
        if timings.setdefault("threads", args.threads) != args.threads:
            record[f"{step}_threads"] = args.threads
        timings_file.write_text(json.dumps(timings, indent=1) + "\n")
        print(f"{label}: {seconds:.0f} s", flush=True)
    write_summary(out_dir)
    total = time.perf_counter() - start
    print("wrote", out_dir / "summary.json", f"({total:.0f} s)")
    return {"total": total}


if __name__ == "__main__":
    _restart_with_passive_waiting()
    main()
