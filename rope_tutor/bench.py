"""Part VI: the benchmark of chapter "Making RoPE fast".

Applying RoPE is memory-bound, so every implementation is timed against two anchors that move the
same bytes: ``y.copy_(x)`` into a buffer that already exists (the memory-bandwidth bound) and
``x.clone()`` (the same copy into a freshly allocated buffer, the bound for any function that
returns a new tensor). Run it from the repository root::

    python -m rope_tutor.bench          # q of shape (1, 32, 4096, 128), float32 and bfloat16
    python -m rope_tutor.bench --quick  # a small configuration, a few seconds
    python -m rope_tutor.bench --alibi --threads 1 \\
        --out rope_tutor/results/bench/rope_cpu_1thread.json

It prints the machine, a progress bar and one table per dtype: median time, effective bandwidth
(bytes of the input read plus bytes of the output written, divided by the time), the ratios to
``copy_`` and to ``clone`` (medians of the per-round ratios), minor page faults per call (Linux)
and the largest difference from ``apply_rope``, which shows that every row does the same work.
All forms run in one process, in interleaved rounds (each round calls every form once, in an
order that rotates from round to round), after warm-up calls. cos/sin tables are built before
timing, as a model builds them once for all its layers. On a CUDA machine the same benchmark runs
on the GPU (``--device cuda``, the default when one is present). Saved results carry their
provenance (command, time, machine, versions, load average).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import torch

from rope_tutor.rope import RotaryEmbedding, apply_rope, rotate_half
from rope_tutor.runtime import get_device

__all__ = [
    "FULL_SHAPE",
    "QUICK_SHAPE",
    "Form",
    "alibi_memory",
    "benchmark_forms",
    "check_forms",
    "format_table",
    "machine_facts",
    "main",
    "run_benchmark",
]

#: q of one layer of a Llama-7B-sized model: (batch, heads, seq, head_dim).
FULL_SHAPE = (1, 32, 4096, 128)
#: The ``--quick`` configuration (tests, the chapter's live cells).
QUICK_SHAPE = (1, 4, 256, 64)
#: The dense form is skipped when its (seq, head_dim, head_dim) matrices would exceed this.
DENSE_LIMIT_BYTES = 2**30


@dataclass(frozen=True)
class Form:
    """One benchmarked way to compute RoPE (or an anchor) on a fixed input.

    ``run()`` computes it on the input the forms were made for and returns the result; ``layout``
    (``"half"`` or ``"interleaved"``) names the ``apply_rope`` layout it must agree with, ``None``
    for the ``copy_`` and ``clone`` anchors.
    """

    name: str
    run: Callable[[], torch.Tensor]
    layout: str | None


def make_forms(x: torch.Tensor, *, include_dense: bool = True) -> list[Form]:
    """Every benchmarked form for ``x`` of shape ``(..., seq, head_dim)``, positions ``0 .. seq-1``.

    The anchors ``copy_`` and ``clone``; the dense block-diagonal matrix ``R_m x`` (equation
    (rope-matrix), interleaved pairs, skipped above ``DENSE_LIMIT_BYTES``); the textbook eager
    form ``x * cos + rotate_half(x) * sin`` with full ``(seq, head_dim)`` tables in ``x``'s dtype,
    as Hugging Face's Llama code runs it; the complex form of Meta's Llama code (upcast to
    float32, complex multiply, cast back); the package's ``apply_rope`` in both layouts; and
    lucidrains' ``rotary-embedding-torch`` when it is installed (interleaved pairs). Tables come
    from ``RotaryEmbedding.cos_sin``, the values ``apply_rope`` uses.
    """
    seq, dim = x.shape[-2], x.shape[-1]
    positions = torch.arange(seq, device=x.device)
    cos, sin = RotaryEmbedding(dim).cos_sin(positions, x.dtype)  # (seq, dim/2), float32+
    target = torch.empty_like(x)
    target.copy_(x)  # touch every page once, so that copy_ measures bandwidth only

    cos_full = torch.cat((cos, cos), dim=-1).to(x.dtype)  # (seq, dim) in x's dtype, like HF
    sin_full = torch.cat((sin, sin), dim=-1).to(x.dtype)
    rotation = torch.complex(cos, sin).to(torch.complex64)  # Meta's freqs_cis, (seq, dim/2)

    def textbook() -> torch.Tensor:
        return x * cos_full + rotate_half(x) * sin_full

    def complex_form() -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)

    forms = [
        Form("copy_", lambda: target.copy_(x), None),
        Form("clone", x.clone, None),
    ]
    if include_dense and seq * dim * dim * x.element_size() <= DENSE_LIMIT_BYTES:
        matrices = _dense_matrices(cos, sin).to(x.dtype)  # (seq, dim, dim)
        forms.append(
            Form(
                "dense R_m x",
                lambda: torch.einsum("...sd,sed->...se", x, matrices),
                "interleaved",
            )
        )
    forms += [
        Form("textbook x*cos + rotate_half(x)*sin", textbook, "half"),
        Form("complex (Meta, view_as_complex)", complex_form, "interleaved"),
        Form("apply_rope (half)", lambda: apply_rope(x, positions), "half"),
        Form(
            "apply_rope (interleaved)",
            lambda: apply_rope(x, positions, layout="interleaved"),
            "interleaved",
        ),
    ]
    try:
        from rotary_embedding_torch import RotaryEmbedding as LucidrainsRotaryEmbedding
    except ImportError:  # optional: only the test environment pins it
        return forms
    lucidrains = LucidrainsRotaryEmbedding(dim=dim).to(x.device)
    forms.append(
        Form(
            "lucidrains rotary-embedding-torch",
            lambda: lucidrains.rotate_queries_or_keys(x),
            "interleaved",
        )
    )
    return forms


def _dense_matrices(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """R_m for every position m: ``(seq, dim, dim)``, 2x2 rotations on interleaved pairs.

    Block ``i`` of ``R_m`` is ``[[cos, -sin], [sin, cos]]`` of ``m * theta_i``, as ``rope_matrix``
    builds it one position at a time (in float64); here from the given tables, all at once.
    """
    seq, half = cos.shape
    even = torch.arange(0, 2 * half, 2, device=cos.device)
    matrices = torch.zeros(seq, 2 * half, 2 * half, dtype=cos.dtype, device=cos.device)
    matrices[:, even, even] = cos
    matrices[:, even, even + 1] = -sin
    matrices[:, even + 1, even] = sin
    matrices[:, even + 1, even + 1] = cos
    return matrices


def check_forms(forms: Sequence[Form], x: torch.Tensor) -> dict[str, float | None]:
    """Largest absolute difference of each form from ``apply_rope`` on ``x`` in its layout.

    ``copy_`` and ``clone`` are compared with ``x`` itself. The differences are computed in
    float64; ``None`` marks a form whose output has the wrong shape.
    """
    positions = torch.arange(x.shape[-2], device=x.device)
    expected = {
        layout: apply_rope(x, positions, layout=layout).double()
        for layout in ("half", "interleaved")
    }
    differences: dict[str, float | None] = {}
    for form in forms:
        got = form.run()
        reference = x.double() if form.layout is None else expected[form.layout]
        if got.shape != x.shape:
            differences[form.name] = None
        else:
            differences[form.name] = float((got.double() - reference).abs().max())
    return differences


def _page_faults() -> int | None:
    """Minor page faults of this process so far (Linux and macOS), else None."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed(form: Form, synchronize: Callable[[], None]) -> float:
    synchronize()
    start = time.perf_counter()
    result = form.run()
    synchronize()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def benchmark_forms(
    forms: Sequence[Form],
    *,
    rounds: int,
    warmup: int,
    device: torch.device,
    progress: bool = True,
    description: str = "",
) -> dict[str, list[float]]:
    """Seconds per call of every form: ``warmup`` untimed calls each, then ``rounds`` rounds.

    In round ``r`` every form runs once, starting with form ``r mod len(forms)``, so slow drifts
    of the machine (other processes, clock changes) touch every form alike and ratios computed
    within a round stay meaningful. The output of each call is dropped before the next one.
    """
    from tqdm import tqdm

    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {form.name: [] for form in forms}
    with tqdm(
        total=len(forms) * (warmup + rounds), desc=description, disable=not progress, leave=False
    ) as bar:
        for form in forms:
            for _ in range(warmup):
                _timed(form, synchronize)
                bar.update()
        for r in range(rounds):
            first = r % len(forms)
            for form in [*forms[first:], *forms[:first]]:
                times[form.name].append(_timed(form, synchronize))
                bar.update()
    return times


def _faults_per_call(form: Form) -> int | None:
    before = _page_faults()
    if before is None:
        return None
    result = form.run()
    after = _page_faults()
    del result
    return after - before


def summarize(
    times: dict[str, list[float]], bytes_moved: int, *, faults: dict[str, int | None] | None = None
) -> list[dict[str, Any]]:
    """One row per form: median/min/max ms, GB/s, and median per-round ratios to copy_ and clone.

    ``bytes_moved`` is the input read plus the output written (``2 * x.numel() *
    x.element_size()``); GB/s is that divided by the median time (1 GB = 1e9 bytes).
    """
    rows = []
    for name, seconds in times.items():
        median = statistics.median(seconds)
        rows.append(
            {
                "form": name,
                "ms_median": 1e3 * median,
                "ms_min": 1e3 * min(seconds),
                "ms_max": 1e3 * max(seconds),
                "gb_per_s": bytes_moved / median / 1e9,
                "x_copy": _median_ratio(seconds, times["copy_"]),
                "x_clone": _median_ratio(seconds, times["clone"]),
                "page_faults": None if faults is None else faults.get(name),
            }
        )
    return rows


def _median_ratio(seconds: Sequence[float], anchor: Sequence[float]) -> float:
    return statistics.median(t / a for t, a in zip(seconds, anchor, strict=True))


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of ``summarize`` (plus ``max_abs_diff``) as an aligned plain-text table."""
    header = ("form", "ms", "GB/s", "x copy_", "x clone", "faults", "max |diff|")
    lines = [
        (
            row["form"],
            f"{row['ms_median']:.2f}",
            f"{row['gb_per_s']:.2f}",
            f"{row['x_copy']:.2f}",
            f"{row['x_clone']:.2f}",
            "-" if row.get("page_faults") is None else str(row["page_faults"]),
            "-" if row.get("max_abs_diff") is None else f"{row['max_abs_diff']:.1e}",
        )
        for row in rows
    ]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines, strict=True)]
    out = []
    for i, line in enumerate([header, *lines]):
        cells = [line[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(line[1:], widths[1:], strict=True)]
        out.append("  ".join(cells))
        if i == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)


def machine_facts(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: CPU or GPU model, threads, versions, load average."""
    facts: dict[str, Any] = {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "rope_tutor": _version("rope-tutor"),
        "rotary_embedding_torch": _version("rotary-embedding-torch"),
        "load_average_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
    return facts


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The chapter's targets, judged from same-round medians (meaningful at the full size)."""
    goals = []
    per_dtype = results["dtypes"]
    if "float32" in per_dtype:
        times = per_dtype["float32"]["times_ms"]
        rope = times["apply_rope (half)"]
        goals.append(
            _goal("apply_rope float32 time / clone time", _median_ratio(rope, times["clone"]), 1.3)
        )
        speedup = _median_ratio(times["textbook x*cos + rotate_half(x)*sin"], rope)
        goals.append(
            {"goal": "textbook time / apply_rope float32 time", "value": speedup, "target": 4.0}
            | {"met": speedup >= 4.0}
        )
    if "bfloat16" in per_dtype:
        times = per_dtype["bfloat16"]["times_ms"]
        ratio = _median_ratio(times["apply_rope (half)"], times["clone"])
        goals.append(_goal("apply_rope bfloat16 time / clone time", ratio, 2.0))
    return goals


def _goal(goal: str, value: float, target: float) -> dict[str, Any]:
    return {"goal": goal, "value": value, "target": target, "met": value <= target}


def run_benchmark(
    shape: Sequence[int] = FULL_SHAPE,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    *,
    rounds: int = 15,
    warmup: int = 2,
    device: torch.device | str | None = None,
    include_dense: bool = True,
    progress: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Benchmark every form on ``randn(shape)`` in each dtype; returns rows, raw times, goals.

    ``shape`` is ``(..., seq, head_dim)``. The result is JSON-serialisable: ``provenance``
    (machine facts before and after, with the load average), ``config``, ``dtypes`` (per dtype:
    ``rows`` as in ``summarize`` plus ``max_abs_diff``, and ``times_ms``, the raw per-round
    times) and ``goals``. Raises ``ValueError`` for an unknown dtype, fewer than 1 round, a
    negative warm-up or a shape that ``apply_rope`` rejects.
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    device = torch.device(device) if device is not None else get_device()
    started = datetime.now(UTC)
    facts_before = machine_facts(device)
    results: dict[str, Any] = {"dtypes": {}}
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtypes must name floating torch dtypes, got {dtype_name!r}")
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)
        forms = make_forms(x, include_dense=include_dense)
        differences = check_forms(forms, x)
        times = benchmark_forms(
            forms,
            rounds=rounds,
            warmup=warmup,
            device=device,
            progress=progress,
            description=dtype_name,
        )
        faults = (
            {form.name: _faults_per_call(form) for form in forms} if device.type == "cpu" else None
        )
        rows = summarize(times, 2 * x.numel() * x.element_size(), faults=faults)
        for row in rows:
            row["max_abs_diff"] = differences[row["form"]]
        results["dtypes"][dtype_name] = {
            "rows": rows,
            "times_ms": {name: [1e3 * t for t in seconds] for name, seconds in times.items()},
        }
        del forms, x
    results["goals"] = _goals(results)
    results["config"] = {
        "shape": list(shape),
        "dtypes": list(dtypes),
        "rounds": rounds,
        "warmup": warmup,
        "seed": seed,
        "positions": f"0 .. {shape[-2] - 1}",
    }
    results["provenance"] = {
        "started_utc": started.isoformat(timespec="seconds"),
        "seconds": round((datetime.now(UTC) - started).total_seconds(), 1),
        "machine": facts_before,
        "load_average_after": machine_facts(device)["load_average_1_5_15_min"],
        "method": (
            "one process; per form warm-up calls, then interleaved rounds with a rotating order; "
            "medians of times and of per-round ratios; cos/sin tables built before timing; GB/s = "
            "(input bytes + output bytes) / median time"
        ),
    }
    return results


def alibi_memory(
    num_heads: int = 32, seq: int = 4096, head_dim: int = 128, *, seed: int = 0
) -> dict[str, Any]:
    """Peak memory of ``alibi_attention`` (causal, float32, CPU) against the full ALiBi bias.

    The full ``(num_heads, seq, seq)`` float32 bias takes ``4 * num_heads * seq**2`` bytes (2 GiB
    at 32 heads and 4096 positions); ``alibi_attention`` builds it one block of queries at a time.
    Measured as the growth of the process's peak resident memory (Linux ``VmHWM``, reset through
    ``/proc/self/clear_refs``) during one call, so it counts every buffer the call creates.
    Returns seconds, the peak growth in bytes, the full bias size and the shape; the peak is
    ``None`` where ``/proc`` is not available.
    """
    from rope_tutor.alibi import alibi_attention

    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, num_heads, seq, head_dim, generator=generator) for _ in range(3))
    status = Path("/proc/self/status")

    def memory(field: str) -> int | None:
        if not status.exists():
            return None
        line = next(ln for ln in status.read_text().splitlines() if ln.startswith(field))
        return int(line.split()[1]) * 1024  # kB

    try:
        Path("/proc/self/clear_refs").write_text("5")  # peak := current resident memory
    except OSError:
        pass
    resident = memory("VmRSS")
    start = time.perf_counter()
    out = alibi_attention(q, k, v)
    seconds = time.perf_counter() - start
    peak = memory("VmHWM")
    del out
    return {
        "shape": [1, num_heads, seq, head_dim],
        "seconds": seconds,
        "peak_growth_bytes": None if peak is None or resident is None else peak - resident,
        "full_bias_bytes": 4 * num_heads * seq * seq,
    }


def _print_report(results: dict[str, Any], out: TextIO | None = None) -> None:
    out = sys.stdout if out is None else out
    machine = results["provenance"]["machine"]
    print(
        f"{machine.get('gpu') or machine['cpu']} | {machine['logical_cpus']} logical CPUs | "
        f"torch {machine['torch']} ({machine['torch_threads']} threads) on {machine['device']} | "
        f"load average {machine['load_average_1_5_15_min']}",
        file=out,
    )
    config = results["config"]
    for dtype_name, result in results["dtypes"].items():
        print(
            f"\nq {tuple(config['shape'])} {dtype_name}, median of {config['rounds']} "
            "interleaved rounds",
            file=out,
        )
        print(format_table(result["rows"]), file=out)
    if tuple(config["shape"]) != FULL_SHAPE:
        print(f"\n(the goals are set for q of shape {FULL_SHAPE}; this run is smaller)", file=out)
    if "alibi" in results:
        alibi = results["alibi"]
        growth = alibi["peak_growth_bytes"]
        print(
            f"\nalibi_attention on q, k, v of shape {tuple(alibi['shape'])}: "
            f"{alibi['seconds']:.2f} s, peak memory growth "
            f"{'-' if growth is None else f'{growth / 2**20:.0f} MiB'} "
            f"(the full bias alone would be {alibi['full_bias_bytes'] / 2**20:.0f} MiB)",
            file=out,
        )
    for goal in results["goals"]:
        verdict = "met" if goal["met"] else "MISSED"
        print(
            f"goal {goal['goal']}: {goal['value']:.2f} (target {goal['target']}) {verdict}",
            file=out,
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Command-line entry point: ``python -m rope_tutor.bench --help``."""
    parser = argparse.ArgumentParser(
        prog="python -m rope_tutor.bench",
        description="Time RoPE implementations against the copy_ and clone bounds.",
    )
    parser.add_argument(
        "--shape",
        type=int,
        nargs="+",
        default=None,
        help=f"q shape (..., seq, head_dim); default {FULL_SHAPE}, {QUICK_SHAPE} with --quick",
    )
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=None, help="default 15 (3 with --quick)")
    parser.add_argument("--warmup", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: keep)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense matrix form")
    parser.add_argument("--quick", action="store_true", help="small shape, few rounds")
    parser.add_argument(
        "--alibi", action="store_true", help="also measure alibi_attention's peak memory (CPU)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)

    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    shape = args.shape or (QUICK_SHAPE if args.quick else FULL_SHAPE)
    results = run_benchmark(
        shape,
        args.dtypes,
        rounds=args.rounds if args.rounds is not None else (3 if args.quick else 15),
        warmup=args.warmup if args.warmup is not None else (1 if args.quick else 2),
        device=args.device,
        include_dense=not args.no_dense,
        progress=not args.no_progress,
    )
    if args.alibi:
        alibi_shape = (4, 512, 64) if args.quick else (32, 4096, 128)  # heads, seq, head_dim
        results["alibi"] = alibi_memory(*alibi_shape)
    results["provenance"]["command"] = shlex.join(["python", "-m", "rope_tutor.bench", *argv])
    _print_report(results)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"saved {args.out}")
    return results


if __name__ == "__main__":
    main()
