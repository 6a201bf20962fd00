"""Part VI: the benchmark of chapter "Making RoPE fast".

Applying RoPE is memory-bound, so every form is timed against two anchors that move the same
bytes: ``y.copy_(x)`` into a buffer that already exists (the memory-bandwidth bound, and the
anchor of a write into a KV cache) and ``x.clone()`` (the same copy into a freshly allocated
buffer, the bound for any function that returns a new tensor). Run it from the repository root::

    python -m rope_tutor.bench --threads 1 2 --alibi --out rope_tutor/results/bench/rope_cpu.json
    python -m rope_tutor.bench --quick --no-compile   # a small configuration, a few seconds

The forms, from slowest to fastest in principle: the textbook ``x * cos + rotate_half(x) * sin``;
Hugging Face ``transformers``' ``apply_rotary_pos_emb`` (the same code, on q and k); Meta's
complex form; the Part II reference ``apply_rope``; the Part VI ``apply_rope_fast`` in both
layouts and with an ``out=`` buffer; and ``torch.compile`` of the rotation written on the two
halves, which inductor turns into one fused loop (its compile time is reported separately and its
generated kernel source is saved with the results). Besides the table, the benchmark measures
RoPE's share of one attention layer (QKV projection, RoPE on q and k, attention, output
projection) at prefill and at decode.

All forms run in one process. For each thread count (``--threads 1 2``) and dtype, every form
gets warm-up calls, then interleaved rounds: each round calls every form once, in an order that
rotates from round to round, and ratios are medians of per-round ratios. cos/sin tables are built
before timing, as a model builds them once for all its layers. Saved results carry their
provenance: command, git commit (and whether the tree had uncommitted changes), machine, versions,
thread counts, load average before and after, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

import torch

from rope_tutor.fast import apply_rope_fast
from rope_tutor.rope import RotaryEmbedding, apply_rope, rotate_half
from rope_tutor.runtime import cpu_model, get_device

__all__ = [
    "COMPILED",
    "FULL_LAYER",
    "FULL_SHAPE",
    "QUICK_LAYER",
    "QUICK_SHAPE",
    "Form",
    "alibi_memory",
    "attention_layer_share",
    "benchmark_forms",
    "check_forms",
    "compiled_rope",
    "format_table",
    "git_state",
    "goals",
    "machine_facts",
    "main",
    "make_forms",
    "run_benchmark",
    "summarize",
]

#: q of one layer of a Llama-7B-sized model: (batch, heads, seq, head_dim).
FULL_SHAPE = (1, 32, 4096, 128)
#: The ``--quick`` configuration (tests, the chapter's live cells).
QUICK_SHAPE = (1, 4, 256, 64)
#: The attention layer of the share measurement: Llama-7B's width, a 512-token prompt (prefill)
#: and one new token after 4096 cached ones (decode).
FULL_LAYER = {"hidden": 4096, "num_heads": 32, "prefill": 512, "cache": 4096}
QUICK_LAYER = {"hidden": 256, "num_heads": 4, "prefill": 64, "cache": 256}

COPY, CLONE = "copy_", "clone"
TEXTBOOK = "textbook x*cos + rotate_half(x)*sin"
TRANSFORMERS = "transformers apply_rotary_pos_emb"
COMPLEX = "complex (Meta, view_as_complex)"
REFERENCE = "apply_rope (Part II reference)"
FAST = "apply_rope_fast (half)"
FAST_INTERLEAVED = "apply_rope_fast (interleaved)"
FAST_OUT = "apply_rope_fast (half, out=)"
COMPILED = "torch.compile (one fused loop)"


@dataclass(frozen=True)
class Form:
    """One benchmarked way to compute RoPE (or an anchor) on a fixed input.

    ``run()`` computes it on the input the forms were made for and returns the result; ``layout``
    (``"half"`` or ``"interleaved"``) names the ``apply_rope`` layout it must agree with, ``None``
    for the ``copy_`` and ``clone`` anchors. ``tensors`` is how many q-sized tensors one call
    rotates (2 for ``apply_rotary_pos_emb``, which rotates q and k): times and page faults are
    divided by it, so every row is per tensor.
    """

    name: str
    run: Callable[[], torch.Tensor]
    layout: str | None
    tensors: int = 1


def rope_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the two halves, the form inductor fuses: ``x`` (..., seq, d), tables (seq, d/2).

    ``cat(x1 cos - x2 sin, x2 cos + x1 sin)``: equation (rope-elementwise) in the half layout,
    computed in the tables' dtype (float32). Each half is cast back to ``x``'s dtype before the
    ``cat``, so that inductor stores bfloat16 straight from its one loop (a cast after the ``cat``
    would make it write a float32 result first and convert it in a second loop).
    """
    x1, x2 = x.chunk(2, dim=-1)
    first, second = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return torch.cat((first.to(x.dtype), second.to(x.dtype)), dim=-1)


def compiled_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[Callable[[], torch.Tensor], float, list[str]]:
    """``torch.compile`` of ``rope_halves`` on these inputs: (run, compile seconds, kernel sources).

    Compiled in a fresh inductor cache folder, so the seconds are those of a first compilation.
    The sources are the C++ (CPU) or Triton (GPU) kernels inductor generated, as text.
    """
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(rope_halves, dynamic=False)
    with tempfile.TemporaryDirectory(prefix="rope_tutor_inductor_") as cache:
        previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            start = time.perf_counter()
            _, code = run_and_get_code(compiled, x, cos, sin)
            seconds = time.perf_counter() - start
        finally:
            if previous is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
    return (lambda: compiled(x, cos, sin)), seconds, _kernel_sources(code)


def _kernel_sources(code: Sequence[str]) -> list[str]:
    """The kernels inside inductor's generated wrapper modules (the text between r''' and ''')."""
    kernels = []
    for module in code:
        parts = module.split("r'''")
        kernels += [part.split("'''")[0].strip("\n") for part in parts[1:]]
    return kernels or list(code)


def make_forms(
    x: torch.Tensor, *, include_transformers: bool = True, compiled: Callable | None = None
) -> list[Form]:
    """Every benchmarked form for ``x`` of shape ``(..., seq, head_dim)``, positions ``0 .. seq-1``.

    The anchors ``copy_`` and ``clone``; the textbook eager form with full ``(seq, head_dim)``
    tables in ``x``'s dtype, as Hugging Face's Llama code runs it; ``transformers``'
    ``apply_rotary_pos_emb`` itself on q and k (when ``transformers`` is installed); Meta's complex
    form (upcast to float32, complex multiply, cast back); the Part II reference ``apply_rope``;
    ``apply_rope_fast`` in both layouts and into an existing buffer (``out=``); and ``compiled``
    (from ``compiled_rope``) when given. Tables come from ``RotaryEmbedding.cos_sin``.
    """
    seq, dim = x.shape[-2], x.shape[-1]
    positions = torch.arange(seq, device=x.device)
    cos, sin = RotaryEmbedding(dim).cos_sin(positions, x.dtype)  # (seq, dim/2), float32+
    target = torch.empty_like(x)
    target.copy_(x)  # touch every page once, so that copy_ measures bandwidth only
    out = torch.empty_like(x)
    out.copy_(x)  # the existing buffer of apply_rope_fast(..., out=)

    cos_full = torch.cat((cos, cos), dim=-1).to(x.dtype)  # (seq, dim) in x's dtype, like HF
    sin_full = torch.cat((sin, sin), dim=-1).to(x.dtype)
    rotation = torch.complex(cos, sin).to(torch.complex64)  # Meta's freqs_cis, (seq, dim/2)

    def textbook() -> torch.Tensor:
        return x * cos_full + rotate_half(x) * sin_full

    def complex_form() -> torch.Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * rotation).flatten(-2).type_as(x)

    forms = [
        Form(COPY, lambda: target.copy_(x), None),
        Form(CLONE, x.clone, None),
        Form(TEXTBOOK, textbook, "half"),
    ]
    if include_transformers:
        try:
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        except ImportError:  # optional: the test environment pins it
            pass
        else:
            hf_cos, hf_sin = cos_full[None], sin_full[None]  # (1, seq, dim), as HF builds them
            forms.append(
                Form(
                    TRANSFORMERS,
                    lambda: apply_rotary_pos_emb(x, x, hf_cos, hf_sin)[0],
                    "half",
                    tensors=2,
                )
            )
    forms += [
        Form(COMPLEX, complex_form, "interleaved"),
        Form(REFERENCE, lambda: apply_rope(x, positions), "half"),
        Form(FAST, lambda: apply_rope_fast(x, positions), "half"),
        Form(
            FAST_INTERLEAVED,
            lambda: apply_rope_fast(x, positions, layout="interleaved"),
            "interleaved",
        ),
        Form(FAST_OUT, lambda: apply_rope_fast(x, positions, out=out), "half"),
    ]
    if compiled is not None:
        forms.append(Form(COMPILED, compiled, "half"))
    return forms


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


def _timed(run: Callable[[], Any], synchronize: Callable[[], None]) -> float:
    synchronize()
    start = time.perf_counter()
    result = run()
    synchronize()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def _synchronizer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def benchmark_forms(
    forms: Sequence[Form],
    *,
    rounds: int,
    warmup: int,
    device: torch.device,
    progress: bool = True,
    description: str = "",
) -> dict[str, list[float]]:
    """Seconds per call and tensor of each form: ``warmup`` untimed calls each, then ``rounds``.

    In round ``r`` every form runs once, starting with form ``r mod len(forms)``, so slow drifts
    of the machine (other processes, clock changes) touch every form alike and ratios computed
    within a round stay meaningful. The output of each call is dropped before the next one.
    """
    from tqdm import tqdm

    synchronize = _synchronizer(device)
    times: dict[str, list[float]] = {form.name: [] for form in forms}
    with tqdm(
        total=len(forms) * (warmup + rounds), desc=description, disable=not progress, leave=False
    ) as bar:
        for form in forms:
            for _ in range(warmup):
                _timed(form.run, synchronize)
                bar.update()
        for r in range(rounds):
            first = r % len(forms)
            for form in [*forms[first:], *forms[:first]]:
                times[form.name].append(_timed(form.run, synchronize) / form.tensors)
                bar.update()
    return times


def _faults_per_call(form: Form) -> float | None:
    before = _page_faults()
    if before is None:
        return None
    result = form.run()
    after = _page_faults()
    del result
    return (after - before) / form.tensors


def summarize(
    times: dict[str, list[float]],
    bytes_moved: int,
    *,
    faults: dict[str, float | None] | None = None,
) -> list[dict[str, Any]]:
    """One row per form: median/min/max ms, GB/s, median per-round ratios to ``copy_``, ``clone``.

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
                "x_copy": median_ratio(seconds, times[COPY]),
                "x_clone": median_ratio(seconds, times[CLONE]),
                "page_faults": None if faults is None else faults.get(name),
            }
        )
    return rows


def median_ratio(seconds: Sequence[float], anchor: Sequence[float]) -> float:
    """The median over rounds of ``seconds[r] / anchor[r]`` (same-round ratios)."""
    return statistics.median(t / a for t, a in zip(seconds, anchor, strict=True))


def _difference(value: float | None) -> str:
    """``max |diff|`` for the table: a rounding-level difference is shown as its bound."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return "<1e-06" if value < 1e-6 else f"{value:.1e}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of ``summarize`` (plus ``max_abs_diff``) as an aligned plain-text table.

    Differences below 1e-6 (float32 rounding) are printed as the bound ``<1e-06``, so that the
    table reads the same on every CPU.
    """
    header = ("form", "ms", "GB/s", "x copy_", "x clone", "faults", "max |diff|")
    lines = [
        (
            row["form"],
            f"{row['ms_median']:.2f}",
            f"{row['gb_per_s']:.2f}",
            f"{row['x_copy']:.2f}",
            f"{row['x_clone']:.2f}",
            "-" if row.get("page_faults") is None else f"{row['page_faults']:.0f}",
            _difference(row.get("max_abs_diff")),
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


# ----------------------------------------------------------------------------------------------
# RoPE's share of one attention layer
# ----------------------------------------------------------------------------------------------


def attention_layer_share(
    hidden: int = 4096,
    num_heads: int = 32,
    prefill: int = 512,
    cache: int = 4096,
    *,
    rounds: int = 5,
    device: torch.device | str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Time the four stages of one float32 attention layer, at prefill and at decode.

    The layer is Llama's without normalisation: QKV projection (one ``(3 * hidden, hidden)``
    matrix), RoPE on q and k (``apply_rope_fast``; the textbook form timed beside it), causal
    scaled-dot-product attention, output projection. Prefill processes ``prefill`` tokens at
    positions ``0 .. prefill-1``; decode processes one token at position ``cache`` against a KV
    cache of ``cache`` earlier positions, and writes its rotated k into the cache with ``out=``.
    Each round times every stage once, in order; ``share`` is the median over rounds of RoPE's
    time over the layer's (with ``apply_rope_fast``). Returns, per phase, the median ms of each
    stage, the share, and the share the textbook form would have.
    """
    device = torch.device(device) if device is not None else get_device()
    if hidden % num_heads or (hidden // num_heads) % 2:
        raise ValueError(
            f"hidden must be num_heads times an even head_dim, got hidden={hidden}, "
            f"num_heads={num_heads}"
        )
    head_dim = hidden // num_heads
    generator = torch.Generator().manual_seed(seed)
    scale = hidden**-0.5
    w_qkv = (torch.randn(3 * hidden, hidden, generator=generator) * scale).to(device)
    w_out = (torch.randn(hidden, hidden, generator=generator) * scale).to(device)
    cos, sin = RotaryEmbedding(head_dim).cos_sin(torch.arange(cache + 1, device=device))
    cos_full, sin_full = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    k_cache = torch.randn(1, num_heads, cache + 1, head_dim, generator=generator).to(device)
    v_cache = torch.randn(1, num_heads, cache + 1, head_dim, generator=generator).to(device)
    synchronize = _synchronizer(device)
    weights = {"w_qkv": w_qkv, "w_out": w_out, "cos_full": cos_full, "sin_full": sin_full}
    cache_kv = {"k": k_cache, "v": v_cache}
    results: dict[str, Any] = {
        phase: _layer_phase(
            phase, seq, start, num_heads, weights, cache_kv, rounds, synchronize, generator
        )
        for phase, seq, start in (("prefill", prefill, 0), ("decode", 1, cache))
    }
    results["config"] = {
        "hidden": hidden,
        "num_heads": num_heads,
        "head_dim": head_dim,
        "prefill": prefill,
        "cache": cache,
        "rounds": rounds,
        "dtype": "float32",
    }
    return results


def _layer_phase(
    phase: str,
    seq: int,
    start: int,
    num_heads: int,
    weights: dict[str, torch.Tensor],
    cache_kv: dict[str, torch.Tensor],
    rounds: int,
    synchronize: Callable[[], None],
    generator: torch.Generator,
) -> dict[str, Any]:
    """One phase of ``attention_layer_share``: ``seq`` tokens at positions ``start ..``."""
    w_qkv, w_out = weights["w_qkv"], weights["w_out"]
    hidden = w_out.shape[0]
    head_dim = hidden // num_heads
    device = w_qkv.device
    positions = torch.arange(start, start + seq, device=device)
    rows = slice(start, start + seq)
    x = torch.randn(1, seq, hidden, generator=generator).to(device)
    cos, sin = weights["cos_full"][rows], weights["sin_full"][rows]
    state: dict[str, torch.Tensor] = {}

    def heads(t: torch.Tensor) -> torch.Tensor:  # (1, seq, hidden) -> (1, heads, seq, head_dim)
        return t.unflatten(-1, (num_heads, head_dim)).transpose(1, 2)

    def qkv() -> None:
        state["q"], state["k"], state["v"] = map(heads, (x @ w_qkv.T).chunk(3, dim=-1))

    def rope() -> None:
        state["q_rot"] = apply_rope_fast(state["q"], positions)
        if phase == "decode":  # the KV-cache write: rotate k straight into its cache slot
            apply_rope_fast(state["k"], positions, out=cache_kv["k"][:, :, rows])
            cache_kv["v"][:, :, rows] = state["v"]
            state["k_rot"], state["v_all"] = cache_kv["k"], cache_kv["v"]
        else:
            state["k_rot"] = apply_rope_fast(state["k"], positions)
            state["v_all"] = state["v"]

    def rope_textbook() -> None:
        for name in ("q", "k"):
            _ = state[name] * cos + rotate_half(state[name]) * sin

    def attend() -> None:
        state["a"] = torch.nn.functional.scaled_dot_product_attention(
            state["q_rot"], state["k_rot"], state["v_all"], is_causal=phase == "prefill"
        )

    def project() -> None:
        state["y"] = state["a"].transpose(1, 2).flatten(-2) @ w_out.T

    stages = {
        "QKV projection": qkv,
        "RoPE on q and k": rope,
        "attention (SDPA)": attend,
        "output projection": project,
        "RoPE on q and k, textbook form": rope_textbook,
    }
    for run in stages.values():  # warm-up
        run()
    times: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(rounds):
        for name, run in stages.items():
            times[name].append(_timed(run, synchronize))
    layer_stages = list(stages)[:4]
    layer = [sum(times[name][r] for name in layer_stages) for r in range(rounds)]
    textbook_layer = [
        layer[r] - times["RoPE on q and k"][r] + times["RoPE on q and k, textbook form"][r]
        for r in range(rounds)
    ]
    return {
        "tokens": seq,
        "positions": f"{start} .. {start + seq - 1}",
        "ms": {name: 1e3 * statistics.median(t) for name, t in times.items()},
        "layer_ms": 1e3 * statistics.median(layer),
        "rope_share": median_ratio(times["RoPE on q and k"], layer),
        "textbook_rope_share": median_ratio(
            times["RoPE on q and k, textbook form"], textbook_layer
        ),
    }


# ----------------------------------------------------------------------------------------------
# Provenance
# ----------------------------------------------------------------------------------------------


def machine_facts(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: CPU or GPU model, threads, versions, load average."""
    facts: dict[str, Any] = {
        "cpu": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
        "rope_tutor": _version("rope-tutor"),
        "transformers": _version("transformers"),
        "load_average_1_5_15_min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
    return facts


def git_state(folder: Path | None = None) -> dict[str, Any]:
    """The git commit of the checkout that holds this package, and whether it had changes.

    ``dirty`` ignores the saved results themselves (``rope_tutor/results/``), which a run writes.
    Both are ``None`` outside a git checkout (an installed package).
    """
    folder = Path(__file__).resolve().parent if folder is None else folder

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--", ".", ":(exclude,top)rope_tutor/results")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


# ----------------------------------------------------------------------------------------------
# Goals
# ----------------------------------------------------------------------------------------------

#: (dtype, form, anchor, target, higher is better): the goals of chapter "Making RoPE fast" for
#: q of shape FULL_SHAPE. "textbook / apply_rope_fast >= 4" reads: the textbook form takes at
#: least four times as long as the fast path.
GOALS = (
    ("float32", FAST, CLONE, 1.3, False),
    ("bfloat16", FAST, CLONE, 2.0, False),
    ("float32", TEXTBOOK, FAST, 4.0, True),
    ("float32", FAST_OUT, COPY, 1.5, False),
)


def goals(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each goal judged at each thread count from same-round medians of the raw times.

    ``value`` is the median per-round ratio of the form's time to the anchor's; ``met`` compares
    it with ``target``; ``missed_by`` is how far it is from the target, as a fraction of the
    target (0 when met). Goals whose dtype was not measured are left out.
    """
    judged = []
    for run in runs:
        for dtype_name, form, anchor, target, higher in GOALS:
            times = run["dtypes"].get(dtype_name, {}).get("times_ms")
            if times is None or form not in times or anchor not in times:
                continue
            value = median_ratio(times[form], times[anchor])
            met = value >= target if higher else value <= target
            judged.append(
                {
                    "goal": f"{form} {dtype_name}: time of {form} / time of {anchor}",
                    "threads": run["threads"],
                    "dtype": dtype_name,
                    "form": form,
                    "anchor": anchor,
                    "value": value,
                    "target": target,
                    "higher_is_better": higher,
                    "met": met,
                    "missed_by": 0.0 if met else abs(value - target) / target,
                }
            )
    return judged


# ----------------------------------------------------------------------------------------------
# The whole run
# ----------------------------------------------------------------------------------------------


def run_benchmark(
    shape: Sequence[int] = FULL_SHAPE,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    *,
    threads: Sequence[int] | None = None,
    rounds: int = 15,
    warmup: int = 2,
    device: torch.device | str | None = None,
    compile: bool = True,
    include_transformers: bool = True,
    layer: dict[str, int] | None = None,
    layer_rounds: int = 5,
    progress: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Benchmark every form on ``randn(shape)`` in each dtype at each thread count.

    ``shape`` is ``(..., seq, head_dim)``; ``threads`` the torch thread counts to run at (default:
    the current one; restored afterwards). ``compile`` adds the ``torch.compile`` form, compiled
    once per dtype. ``layer`` (keywords of ``attention_layer_share``, or ``None`` to skip) adds
    RoPE's share of an attention layer at each thread count. The result is JSON-serialisable:
    ``config``, ``runs`` (per thread count: per dtype ``rows`` as in ``summarize`` plus
    ``max_abs_diff``, and ``times_ms``, the raw per-round times; ``layer``), ``compiled`` (per
    dtype: compile seconds and the generated kernel sources), ``goals`` and ``provenance``.
    Raises ``ValueError`` for an unknown dtype, fewer than 1 round, a negative warm-up or a
    thread count below 1.
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    initial_threads = torch.get_num_threads()
    threads = list(threads) if threads is not None else [initial_threads]
    if not threads or any(isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in threads):
        raise ValueError(f"threads must be ints >= 1, got threads={threads!r}")
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ValueError(f"dtypes must name floating torch dtypes, got {dtype_name!r}")
    device = torch.device(device) if device is not None else get_device()
    started = datetime.now(UTC)
    clock = time.perf_counter()
    facts_before = machine_facts(device)
    git = git_state()

    inputs, forms, differences, compiled_info = {}, {}, {}, {}
    for dtype_name in dtypes:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(*shape, generator=generator).to(
            device=device, dtype=getattr(torch, dtype_name)
        )
        compiled = None
        if compile:
            cos, sin = RotaryEmbedding(x.shape[-1]).cos_sin(
                torch.arange(x.shape[-2], device=device)
            )
            compiled, seconds, sources = compiled_rope(x, cos, sin)
            compiled_info[dtype_name] = {"compile_seconds": seconds, "kernels": sources}
        inputs[dtype_name] = x
        forms[dtype_name] = make_forms(
            x, include_transformers=include_transformers, compiled=compiled
        )
        differences[dtype_name] = check_forms(forms[dtype_name], x)

    runs = []
    try:
        for count in threads:
            torch.set_num_threads(count)
            run: dict[str, Any] = {"threads": count, "dtypes": {}}
            for dtype_name in dtypes:
                x = inputs[dtype_name]
                times = benchmark_forms(
                    forms[dtype_name],
                    rounds=rounds,
                    warmup=warmup,
                    device=device,
                    progress=progress,
                    description=f"{dtype_name}, {count} thread(s)",
                )
                faults = (
                    {form.name: _faults_per_call(form) for form in forms[dtype_name]}
                    if device.type == "cpu"
                    else None
                )
                rows = summarize(times, 2 * x.numel() * x.element_size(), faults=faults)
                for row in rows:
                    row["max_abs_diff"] = differences[dtype_name][row["form"]]
                run["dtypes"][dtype_name] = {
                    "rows": rows,
                    "times_ms": {
                        name: [1e3 * t for t in seconds] for name, seconds in times.items()
                    },
                }
            if layer is not None:
                run["layer"] = attention_layer_share(**layer, rounds=layer_rounds, device=device)
            runs.append(run)
    finally:
        torch.set_num_threads(initial_threads)

    return {
        "config": {
            "shape": list(shape),
            "dtypes": list(dtypes),
            "threads": threads,
            "rounds": rounds,
            "warmup": warmup,
            "seed": seed,
            "positions": f"0 .. {shape[-2] - 1}",
            "compile": compile,
        },
        "runs": runs,
        "compiled": compiled_info,
        "goals": goals(runs),
        "provenance": {
            "started_utc": started.isoformat(timespec="seconds"),
            "git_commit": git["commit"],
            "git_dirty": git["dirty"],
            "threads": threads,
            "machine": facts_before,
            "load_average_after": machine_facts(device)["load_average_1_5_15_min"],
            "seconds": round(time.perf_counter() - clock, 1),
            "method": (
                "one process; per thread count and dtype, warm-up calls for each form, then "
                "interleaved rounds with a rotating order; medians of times and of per-round "
                "ratios; cos/sin tables built before timing; times and faults per tensor; GB/s = "
                "(input bytes + output bytes) / median time"
            ),
        },
    }


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
    provenance = results["provenance"]
    machine = provenance["machine"]
    print(
        f"{machine.get('gpu') or machine['cpu']} | {machine['logical_cpus']} logical CPUs | "
        f"torch {machine['torch']} on {machine['device']} | load average "
        f"{machine['load_average_1_5_15_min']} | commit {provenance['git_commit']}"
        f"{' (uncommitted changes)' if provenance['git_dirty'] else ''}",
        file=out,
    )
    config = results["config"]
    for dtype_name, info in results["compiled"].items():
        print(
            f"torch.compile {dtype_name}: first compilation {info['compile_seconds']:.1f} s "
            f"(not in the table), {len(info['kernels'])} generated kernel(s)",
            file=out,
        )
    for run in results["runs"]:
        for dtype_name, result in run["dtypes"].items():
            print(
                f"\nq {tuple(config['shape'])} {dtype_name}, {run['threads']} thread(s), median of "
                f"{config['rounds']} interleaved rounds, per tensor",
                file=out,
            )
            print(format_table(result["rows"]), file=out)
        if "layer" in run:
            layer = run["layer"]
            for phase in ("prefill", "decode"):
                ms = layer[phase]["ms"]
                stages = ", ".join(f"{name} {value:.2f} ms" for name, value in ms.items())
                print(
                    f"\nattention layer, {phase} ({layer[phase]['tokens']} token(s)), "
                    f"{run['threads']} thread(s): {stages}; RoPE's share "
                    f"{layer[phase]['rope_share']:.1%} (textbook form: "
                    f"{layer[phase]['textbook_rope_share']:.1%})",
                    file=out,
                )
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
        relation = ">=" if goal["higher_is_better"] else "<="
        verdict = "met" if goal["met"] else f"missed by {goal['missed_by']:.0%}"
        print(
            f"goal, {goal['threads']} thread(s), {goal['goal']}: {goal['value']:.2f} "
            f"(target {relation} {goal['target']}) {verdict}",
            file=out,
        )
    print(f"wall time {provenance['seconds']:.0f} s", file=out)


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
    parser.add_argument(
        "--threads", type=int, nargs="+", default=None, help="torch thread counts (default: keep)"
    )
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile form")
    parser.add_argument("--no-layer", action="store_true", help="skip the attention-layer share")
    parser.add_argument("--quick", action="store_true", help="small shapes, few rounds")
    parser.add_argument(
        "--alibi", action="store_true", help="also measure alibi_attention's peak memory (CPU)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)

    if args.threads is not None and any(t < 1 for t in args.threads):
        parser.error(f"--threads must be >= 1, got {args.threads}")
    shape = args.shape or (QUICK_SHAPE if args.quick else FULL_SHAPE)
    results = run_benchmark(
        shape,
        args.dtypes,
        threads=args.threads,
        rounds=args.rounds if args.rounds is not None else (3 if args.quick else 15),
        warmup=args.warmup if args.warmup is not None else (1 if args.quick else 2),
        device=args.device,
        compile=not args.no_compile,
        layer=None if args.no_layer else (QUICK_LAYER if args.quick else FULL_LAYER),
        layer_rounds=3 if args.quick else 5,
        progress=not args.no_progress,
    )
    if args.alibi:
        alibi_shape = (4, 512, 64) if args.quick else (32, 4096, 128)  # heads, seq, head_dim
        results["alibi"] = alibi_memory(*alibi_shape)
    started = datetime.fromisoformat(results["provenance"]["started_utc"])
    wall = (datetime.now(UTC) - started).total_seconds()
    results["provenance"]["seconds"] = round(wall, 1)  # the whole command, ALiBi included
    results["provenance"]["command"] = shlex.join(["python", "-m", "rope_tutor.bench", *argv])
    _print_report(results)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")
        print(f"saved {args.out}")
    return results


if __name__ == "__main__":
    main()
