"""Part VI: the GPU benchmark of chapter "Making RoPE fast": q and k of Llama-3-8B on CUDA.

RoPE on a GPU is bound by memory bandwidth (large tensors) or by the cost of each call (a decode
step: launches, host work, synchronisations). So every form is timed against the ``copy_`` of q
and k into existing buffers, which moves the same bytes with the fewest launches PyTorch offers
(two), and each figure is a ratio to it in the same run. Run it on a machine with a CUDA GPU::

    python -m rope_tutor.gpu_bench --device cuda --out rope_tutor/results/gpu/rope_cuda.json

Without a CUDA device it prints one line saying so and exits with status 0 (``make gpu-check``
calls it as one of its stages).

Shapes: q ``(batch, 32, seq, 128)`` and k ``(batch, 8, seq, 128)``, the attention heads of
Llama-3-8B (grouped-query attention, RoPE base 500000), at two prefills, ``(8, ·, 8192, ·)`` and
``(1, ·, 4096, ·)``, and a decode step ``(64, ·, 1, ·)`` with each sequence at its own position.
Forms, each through its public entry point, so that argument checks, cos/sin and autograd
wrappers count:

* ``copy_`` of q and k (the anchor);
* Hugging Face ``transformers``' ``apply_rotary_pos_emb``, eager, with the cos and sin of its
  ``LlamaRotaryEmbedding`` made before timing (a model makes them once per step for all layers);
* ``torch.compile`` of ``apply_rotary_pos_emb`` (inductor; compiled before timing);
* Liger's ``liger_rotary_pos_emb`` (package ``liger-kernel``; the same cos and sin), when it is
  installed;
* this package's ``apply_rope_qk`` (``rope_tutor.triton_rope``), one launch for q and k, which
  forms its angles from ``position_ids`` in every call (that work is in its time).

Timing: two timers, the same for every form, no CUDA graphs. The first (``time_forms``) puts CUDA
events around each call, the GPU idle before it (a synchronisation): a call costs its host work
(Python, checks, launches) plus its GPU work, as a lone call does. The second
(``time_back_to_back``) times ``--back-to-back`` calls issued one after another between two
events: the host queues each call while the GPU runs the last, as in a model's forward pass, so a
call costs the larger of the two. Each call takes the next of several input buffers whose total
exceeds the GPU's L2 cache (``ROTATION_BYTES``, against 50 MB on an H100), so that the bytes come
from HBM, as a model's activations do. Every form gets ``warmup`` calls, then ``rounds`` rounds
that call each form once (or one batch, for the second timer), in an order that rotates from
round to round; each figure is a median.
The saved JSON carries its provenance: git commit (or ``results/gpu/COMMIT`` where the code was
copied without git), GPU, driver, CUDA, torch, triton, transformers and liger-kernel versions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from rope_tutor.bench import git_state
from rope_tutor.results import RESULTS_DIR
from rope_tutor.rope import apply_rope
from rope_tutor.triton_rope import apply_rope_qk, device_parameters, kernel_applies

__all__ = [
    "BASE",
    "COPY",
    "DIAGNOSTIC",
    "FORMS",
    "GOALS",
    "ROTATION_BYTES",
    "SHAPES",
    "buffer_count",
    "code_commit",
    "diagnostic_forms",
    "errors",
    "make_forms",
    "time_back_to_back",
    "time_forms",
    "goals",
    "main",
    "provenance",
    "run_benchmark",
    "validate",
]

#: The environment variable that names the measured commit (``code_commit``).
COMMIT_VARIABLE = "ROPE_TUTOR_CODE_COMMIT"
#: RoPE base of Llama 3 (``rope_theta``); no context-extension scaling (Llama-3-8B has none).
BASE = 500000.0
#: name -> (batch, q_heads, k_heads, seq, head_dim): Llama-3-8B's attention heads.
SHAPES: dict[str, tuple[int, int, int, int, int]] = {
    "prefill (8, 32, 8192, 128)": (8, 32, 8, 8192, 128),
    "prefill (1, 32, 4096, 128)": (1, 32, 8, 4096, 128),
    "decode (64, 32, 1, 128)": (64, 32, 8, 1, 128),
}
#: The inputs of successive calls rotate among buffers of at least this many bytes in all: four
#: times an H100's 50 MB L2 cache, so that a call finds none of its input in the cache.
ROTATION_BYTES = 200 * 10**6

COPY = "copy_ of q and k"
HF = "transformers (eager)"
COMPILED = "torch.compile of transformers"
LIGER = "Liger liger_rotary_pos_emb"
KERNEL = "rope_tutor apply_rope_qk"
#: The forms, in the order of the tables.
FORMS = (COPY, HF, COMPILED, LIGER, KERNEL)
#: The names of ``--explore``'s measurements start with this: the kernel launched directly (no
#: wrapper), without its position check, reading a cos/sin table, and at other tile shapes. They
#: explain the kernel's time and choose its settings; the goals never count them.
DIAGNOSTIC = "diag: "
#: ``--explore``'s tiles at prefill: ``(BLOCK_H, BLOCK_S, num_warps)``.
TILES = ((2, 16, 4), (4, 8, 4), (8, 4, 4), (8, 8, 4), (8, 8, 8), (4, 16, 8), (16, 4, 8))

#: (shape, dtype, form, kind, target): the goals of issue 23. "bandwidth" is time of copy_ /
#: time of the form (>= target); "time" is time of the form / time of copy_ (<= target).
GOALS: tuple[tuple[str, str, str, str, float], ...] = (
    ("prefill (8, 32, 8192, 128)", "float32", KERNEL, "bandwidth", 0.92),
    ("prefill (8, 32, 8192, 128)", "bfloat16", KERNEL, "bandwidth", 0.92),
    ("prefill (1, 32, 4096, 128)", "float32", KERNEL, "bandwidth", 0.85),
    ("prefill (1, 32, 4096, 128)", "bfloat16", KERNEL, "bandwidth", 0.80),
    ("decode (64, 32, 1, 128)", "float32", KERNEL, "time", 1.5),
    ("decode (64, 32, 1, 128)", "bfloat16", KERNEL, "time", 1.5),
)


#: One input buffer: q, k, position_ids (batch, seq), the destinations of copy_, and Hugging
#: Face's cos and sin for these positions (None without transformers).
Buffer = tuple[torch.Tensor, ...]


@dataclass
class Form:
    """One way to apply RoPE to q and k: ``run(buffer)`` returns the rotated q and k."""

    name: str
    run: Callable[[Buffer], tuple[torch.Tensor, torch.Tensor]]


def buffer_count(bytes_per_input: int, total: int = ROTATION_BYTES) -> int:
    """How many input buffers (each ``bytes_per_input``) to rotate among: at least 2, and enough
    that together they exceed ``total`` bytes."""
    if bytes_per_input <= 0:
        raise ValueError(f"bytes_per_input must be > 0, got {bytes_per_input}")
    return max(2, math.floor(total / bytes_per_input) + 1)


# ----------------------------------------------------------------------------------------------
# Provenance
# ----------------------------------------------------------------------------------------------


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _driver() -> str | None:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def code_commit(package: Path | None = None) -> dict[str, Any]:
    """The commit of the code measured: from ``$ROPE_TUTOR_CODE_COMMIT`` when set
    (``make gpu-check`` sets it from ``.gpu/COMMIT``, since a copied tree may
    carry a stale git history), else from
    git when this package lies in the project's own checkout, else from ``results/gpu/COMMIT``
    (written where the code was copied without its history), else unknown. ``source`` says
    which."""
    package = Path(__file__).resolve().parent if package is None else package
    named = os.environ.get(COMMIT_VARIABLE, "").strip()
    if named:  # set by `make gpu-check` from .gpu/COMMIT: the commit the tree was copied from
        return {"commit": named, "dirty": None, "source": COMMIT_VARIABLE}
    try:
        top = subprocess.run(
            ["git", "-C", str(package), "rev-parse", "--show-toplevel"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        own = top.returncode == 0 and Path(top.stdout.strip()).resolve() == package.parent
    except (OSError, subprocess.SubprocessError):
        own = False
    if own:  # a git repository, and the project's (not a folder around a copy of it)
        state = git_state(package)
        if state["commit"] is not None:
            return {**state, "source": "git"}
    commit_file = package / "results" / "gpu" / "COMMIT"
    if commit_file.is_file():
        return {"commit": commit_file.read_text().strip(), "dirty": None, "source": "COMMIT file"}
    return {"commit": None, "dirty": None, "source": "unknown"}


def provenance(device: torch.device) -> dict[str, Any]:
    """What the numbers depend on: code, GPU, driver and software versions, date."""
    facts: dict[str, Any] = {
        "code": code_commit(),
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "driver": _driver() if device.type == "cuda" else None,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    for name in ("torch", "triton", "transformers", "liger-kernel", "rope-tutor"):
        facts[name] = _version(name)
    facts["torch"] = torch.__version__
    return facts


# ----------------------------------------------------------------------------------------------
# The forms
# ----------------------------------------------------------------------------------------------


def _hf_pieces(head_dim: int, q_heads: int, k_heads: int) -> tuple[Any, Callable] | None:
    """Hugging Face's ``LlamaRotaryEmbedding`` (Llama 3's base) and ``apply_rotary_pos_emb``."""
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import (
            LlamaRotaryEmbedding,
            apply_rotary_pos_emb,
        )
    except ImportError:
        return None
    config = LlamaConfig(
        hidden_size=q_heads * head_dim,
        num_attention_heads=q_heads,
        num_key_value_heads=k_heads,
        head_dim=head_dim,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": BASE},
    )
    return LlamaRotaryEmbedding(config=config), apply_rotary_pos_emb


def make_forms(
    sample: Buffer, apply_rotary_pos_emb: Callable | None, *, compile: bool = True
) -> tuple[list[Form], dict[str, str]]:
    """The forms that can run on ``sample``'s device, and for each one left out, why.

    Hugging Face's forms and Liger's take the buffer's cos and sin, made before timing: a model
    makes them once per step for all its layers (``LlamaModel`` calls its rotary embedding once),
    so a layer's RoPE costs only the rotation. The package's kernel forms its angles itself, in
    every call, and so is timed with that work.
    """
    device = sample[0].device
    skipped: dict[str, str] = {}

    def copy(buffer: Buffer) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, _, out_q, out_k = buffer[:5]
        return out_q.copy_(q), out_k.copy_(k)

    forms = [Form(COPY, copy)]
    if apply_rotary_pos_emb is None:
        skipped[HF] = skipped[COMPILED] = skipped[LIGER] = "transformers is not installed"
    else:
        forms.append(Form(HF, lambda b: apply_rotary_pos_emb(b[0], b[1], b[5], b[6])))
        if compile:
            compiled = torch.compile(apply_rotary_pos_emb, dynamic=False)
            _add_if_it_runs(
                forms, skipped, Form(COMPILED, lambda b: compiled(b[0], b[1], b[5], b[6])), sample
            )
        else:
            skipped[COMPILED] = "--no-compile"
        try:
            from liger_kernel.transformers.rope import liger_rotary_pos_emb
        except ImportError:
            skipped[LIGER] = "liger-kernel is not installed"
        else:
            if device.type != "cuda":
                skipped[LIGER] = "Liger's kernel runs on CUDA only"
            else:
                liger = Form(LIGER, lambda b: liger_rotary_pos_emb(b[0], b[1], b[5], b[6]))
                _add_if_it_runs(forms, skipped, liger, sample)
    forms.append(Form(KERNEL, lambda b: apply_rope_qk(b[0], b[1], b[2], base=BASE)))
    return forms, skipped


def _add_if_it_runs(forms: list[Form], skipped: dict[str, str], form: Form, sample: Buffer) -> None:
    """Add another project's form after one call on copies of ``sample`` (which also compiles
    it); a form that fails is left out, with its error, so that one run still measures the rest."""
    try:
        form.run(tuple(None if t is None else t.clone() for t in sample))
    except Exception as error:  # any failure of another project's code
        skipped[form.name] = f"failed: {type(error).__name__}: {str(error)[:200]}"
    else:
        forms.append(form)


def diagnostic_forms(sample: Buffer, head_dim: int) -> list[Form]:
    """``--explore``: the package's kernel taken apart, on ``sample``'s device (CUDA, or the CPU
    under Triton's interpreter; none elsewhere). Each writes into the buffer's ``copy_``
    destinations:

    * ``rope_kernel.launch`` alone, with the frequencies made before timing (the wrapper's cost is
      the public form's time minus this), with and without its device-side position check;
    * the same launch reading ``f cos`` and ``f sin`` from float32 tables of 8192 positions, made
      before timing, instead of computing them (the issue's "measure both");
    * ``apply_rope_qk`` into ``out_q``/``out_k`` (no allocation);
    * at a prefill, the launch at each tile of ``TILES``.
    """
    from rope_tutor import rope_kernel  # imports triton

    q = sample[0]
    if not kernel_applies(q):
        return []
    inv_freq, factor = device_parameters(head_dim, BASE, None, q.device)
    angles = torch.arange(8192, device=q.device, dtype=torch.float32)[:, None] * inv_freq
    table = (angles.cos() * factor).contiguous(), (angles.sin() * factor).contiguous()

    def launch(**options: Any) -> Callable[[Buffer], tuple[torch.Tensor, torch.Tensor]]:
        def run(b: Buffer) -> tuple[torch.Tensor, torch.Tensor]:
            rope_kernel.launch(
                b[0], b[1], b[3], b[4], b[2], inv_freq, factor, interleaved=False, **options
            )
            return b[3], b[4]

        return run

    forms = [
        Form(DIAGNOSTIC + "kernel launch alone", launch()),
        Form(DIAGNOSTIC + "kernel launch, no position check", launch(check_positions=False)),
        Form(DIAGNOSTIC + "kernel launch, cos/sin table", launch(table=table)),
        Form(
            DIAGNOSTIC + "apply_rope_qk into out_q, out_k",
            lambda b: apply_rope_qk(b[0], b[1], b[2], base=BASE, out_q=b[3], out_k=b[4]),
        ),
    ]
    if q.shape[-2] > 1:
        for block_h, block_s, warps in TILES:
            forms.append(
                Form(
                    f"{DIAGNOSTIC}tile {block_h} heads x {block_s} rows, {warps} warps",
                    launch(tile=(block_h, block_s), num_warps=warps),
                )
            )
    return forms


def errors(forms: Sequence[Form], buffer: Buffer) -> dict[str, float]:
    """Largest |form - apply_rope| over q and k of ``buffer`` (each form on fresh copies, since
    Liger may rotate in place); position_ids row by row, as ``apply_rope`` takes ``(seq,)``."""
    q, k, position_ids = buffer[:3]
    expected = [
        torch.stack([apply_rope(x[b], position_ids[b], base=BASE) for b in range(x.shape[0])])
        for x in (q, k)
    ]
    found = {}
    for form in forms:
        if form.name == COPY:
            continue
        got = form.run(tuple(None if t is None else t.clone() for t in buffer))
        found[form.name] = max(
            (g.double() - e.double()).abs().max().item() for g, e in zip(got, expected, strict=True)
        )
    return found


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------


def _cuda_timer() -> Callable[[Callable[[], Any]], float]:
    def timed(call: Callable[[], Any]) -> float:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = call()
        end.record()
        end.synchronize()
        del result
        return start.elapsed_time(end) * 1e-3  # seconds

    return timed


def _cpu_timer(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    result = call()
    elapsed = time.perf_counter() - start
    del result
    return elapsed


def time_forms(
    forms: Sequence[Form],
    buffers: Sequence[Buffer],
    *,
    rounds: int,
    warmup: int,
    timer: Callable[[Callable[[], Any]], float],
) -> dict[str, list[float]]:
    """Seconds of each call of each form: ``warmup`` untimed calls each, then ``rounds`` rounds.

    Round ``r`` calls every form once, starting with form ``r mod len(forms)``; successive calls
    (of any form) take successive buffers of ``buffers``, in turn.
    """
    counter = 0

    def next_buffer() -> int:
        nonlocal counter
        counter += 1
        return counter % len(buffers)

    for form in forms:
        for _ in range(warmup):
            i = next_buffer()
            timer(lambda form=form, i=i: form.run(buffers[i]))
    times: dict[str, list[float]] = {form.name: [] for form in forms}
    for r in range(rounds):
        first = r % len(forms)
        for form in [*forms[first:], *forms[:first]]:
            i = next_buffer()
            times[form.name].append(timer(lambda form=form, i=i: form.run(buffers[i])))
    return times


def time_back_to_back(
    forms: Sequence[Form],
    buffers: Sequence[Buffer],
    *,
    rounds: int,
    calls: int,
    device: torch.device,
) -> dict[str, list[float]]:
    """Seconds per call of each form, ``calls`` calls issued back to back: ``rounds`` values each.

    The second timer. Round ``r`` times every form once (in an order that rotates, as
    ``time_forms``): the GPU is synchronised, then ``calls`` calls of the form are issued one after
    the other, on successive buffers, between two CUDA events (the wall clock on a CPU), and the
    time between the events is divided by ``calls``. The host queues the next call while the GPU
    runs the last one, as it does in a model's forward pass, so a call costs the larger of its GPU
    time and its host time (launches, Python, checks), not their sum.
    """
    counter = 0
    times: dict[str, list[float]] = {form.name: [] for form in forms}
    for r in range(rounds):
        first = r % len(forms)
        for form in [*forms[first:], *forms[:first]]:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                began = time.perf_counter()
            for _ in range(calls):
                counter += 1
                form.run(buffers[counter % len(buffers)])
            if device.type == "cuda":
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) * 1e-3
            else:
                elapsed = time.perf_counter() - began
            times[form.name].append(elapsed / calls)
    return times


# ----------------------------------------------------------------------------------------------
# The whole run
# ----------------------------------------------------------------------------------------------


def make_buffers(
    sizes: tuple[int, int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    *,
    total: int = ROTATION_BYTES,
    seed: int = 0,
    rotary: Callable | None = None,
) -> list[Buffer]:
    """Input buffers for ``sizes`` (batch, q_heads, k_heads, seq, head_dim), enough that the q
    and k of all of them exceed ``total`` bytes (``buffer_count``). Positions: ``0 .. seq - 1``
    at prefill; at a decode step (seq 1) each sequence at its own position below 8192. With
    ``rotary`` (Hugging Face's rotary embedding), each buffer also holds its cos and sin."""
    batch, q_heads, k_heads, seq, head_dim = sizes
    generator = torch.Generator(device=device).manual_seed(seed)  # drawn where the data lives
    q_shape, k_shape = (batch, q_heads, seq, head_dim), (batch, k_heads, seq, head_dim)
    per_buffer = (math.prod(q_shape) + math.prod(k_shape)) * torch.empty((), dtype=dtype).itemsize
    if seq == 1:  # a batch of sequences at different lengths
        positions = torch.randint(0, 8192, (batch, 1), generator=generator, device=device)
    else:
        positions = torch.arange(seq, device=device).expand(batch, seq)
    buffers = []
    sample_q = torch.randn(q_shape, generator=generator, device=device).to(dtype)
    sample_k = torch.randn(k_shape, generator=generator, device=device).to(dtype)
    for i in range(buffer_count(per_buffer, total)):
        q = sample_q.roll(i, dims=-1)  # distinct contents, no further host-to-device copies
        k = sample_k.roll(i, dims=-1)
        cos, sin = rotary(q, positions) if rotary is not None else (None, None)
        buffers.append((q, k, positions, torch.empty_like(q), torch.empty_like(k), cos, sin))
    return buffers


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype must be float32 or bfloat16, got {name!r}")
    return dtype


def run_benchmark(
    shapes: dict[str, tuple[int, int, int, int, int]] | None = None,
    dtypes: Sequence[str] = ("float32", "bfloat16"),
    *,
    device: torch.device | str = "cuda",
    rounds: int = 25,
    warmup: int = 4,
    compile: bool = True,
    total: int = ROTATION_BYTES,
    explore: bool = False,
    back_to_back: int = 10,
) -> dict[str, Any]:
    """Time every form at every shape and dtype; returns the results (``validate`` checks them).

    On CUDA the timer is CUDA events around each call; on a CPU (the tests' tiny runs) it is the
    wall clock. Each run lists, per form, the seconds of each timed call, the median, the ratio
    of the ``copy_`` median to the form's (``fraction_of_copy``, the share of the copy's bandwidth)
    and the form's time in copies (``times_copy``), and the largest difference from
    ``apply_rope`` (``max_abs_error``).
    """
    device = torch.device(device)
    shapes = SHAPES if shapes is None else shapes
    timer = _cuda_timer() if device.type == "cuda" else _cpu_timer
    results: dict[str, Any] = {
        "provenance": provenance(device),
        "settings": {
            "base": BASE,
            "rounds": rounds,
            "warmup": warmup,
            "rotation_bytes": total,
            "explore": explore,
            "back_to_back_calls": back_to_back,
            "back_to_back_rounds": rounds,
            "timer": "CUDA events" if device.type == "cuda" else "time.perf_counter",
        },
        "runs": [],
    }
    started = time.perf_counter()
    for shape_name, sizes in shapes.items():
        for dtype_name in dtypes:
            dtype = _dtype(dtype_name)
            hf = _hf_pieces(sizes[4], sizes[1], sizes[2])
            rotary = None if hf is None else hf[0].to(device)
            buffers = make_buffers(sizes, dtype, device, total=total, rotary=rotary)
            forms, skipped = make_forms(buffers[0], None if hf is None else hf[1], compile=compile)
            if explore:
                forms += diagnostic_forms(buffers[0], sizes[4])
            compile_started = time.perf_counter()
            max_errors = errors(forms, buffers[0])  # also compiles torch.compile's form
            first_calls = time.perf_counter() - compile_started
            times = time_forms(forms, buffers, rounds=rounds, warmup=warmup, timer=timer)
            copy_median = statistics.median(times[COPY])
            queued = (
                time_back_to_back(forms, buffers, rounds=rounds, calls=back_to_back, device=device)
                if back_to_back
                else {}
            )
            queued_copy = statistics.median(queued[COPY]) if queued else None
            run_forms = {}
            for form in forms:
                median = statistics.median(times[form.name])
                run_forms[form.name] = {
                    "median_s": median,
                    "fraction_of_copy": copy_median / median,
                    "times_copy": median / copy_median,
                    "max_abs_error": max_errors.get(form.name, 0.0),
                    "seconds": times[form.name],
                }
                if queued:
                    median_queued = statistics.median(queued[form.name])
                    run_forms[form.name]["back_to_back"] = {
                        "median_s": median_queued,
                        "fraction_of_copy": queued_copy / median_queued,
                        "times_copy": median_queued / queued_copy,
                        "seconds": queued[form.name],
                    }
            batch, q_heads, k_heads, seq, head_dim = sizes
            results["runs"].append(
                {
                    "shape": shape_name,
                    "q_shape": [batch, q_heads, seq, head_dim],
                    "k_shape": [batch, k_heads, seq, head_dim],
                    "dtype": dtype_name,
                    "buffers": len(buffers),
                    "bytes_per_call": 2 * sum(t.numel() * t.element_size() for t in buffers[0][:2]),
                    "kernel_ran": kernel_applies(buffers[0][0]),
                    "first_calls_s": first_calls,
                    "forms": run_forms,
                    "skipped": skipped,
                }
            )
            del buffers, forms
            if device.type == "cuda":
                torch.cuda.empty_cache()
    results["goals"] = goals(results["runs"])
    if back_to_back:
        results["goals_back_to_back"] = goals(results["runs"], timer="back_to_back")
    results["provenance"]["seconds"] = round(time.perf_counter() - started, 1)
    return results


def goals(runs: Sequence[dict[str, Any]], timer: str = "per_call") -> list[dict[str, Any]]:
    """Each goal of ``GOALS`` judged on the runs that measured it, and "the kernel is faster than
    every other RoPE form" at each shape and dtype. Goals not measured are left out.

    ``timer`` ``"per_call"`` judges the times of ``time_forms`` (each call alone, the GPU idle
    before it), ``"back_to_back"`` those of ``time_back_to_back`` (calls queued one after another).
    """
    if timer not in ("per_call", "back_to_back"):
        raise ValueError(f"timer must be 'per_call' or 'back_to_back', got timer={timer!r}")

    def timed(form: dict[str, Any]) -> dict[str, Any]:
        return form if timer == "per_call" else form["back_to_back"]

    judged = []
    by_key = {(run["shape"], run["dtype"]): run for run in runs}
    for shape, dtype, form, kind, target in GOALS:
        run = by_key.get((shape, dtype))
        if run is None or form not in run["forms"]:
            continue
        if timer == "back_to_back" and "back_to_back" not in run["forms"][form]:
            continue
        entry = timed(run["forms"][form])
        value = entry["fraction_of_copy"] if kind == "bandwidth" else entry["times_copy"]
        met = value >= target if kind == "bandwidth" else value <= target
        relation = ">=" if kind == "bandwidth" else "<="
        measure = "copy_ time / form time" if kind == "bandwidth" else "form time / copy_ time"
        judged.append(
            {
                "goal": f"{form}, {shape}, {dtype}: {measure} {relation} {target}",
                "shape": shape,
                "dtype": dtype,
                "value": value,
                "target": target,
                "met": met,
            }
        )
    for run in runs:
        if KERNEL not in run["forms"]:
            continue
        if timer == "back_to_back" and "back_to_back" not in run["forms"][KERNEL]:
            continue
        kernel = timed(run["forms"][KERNEL])["median_s"]
        others = {
            n: timed(f)["median_s"]
            for n, f in run["forms"].items()
            if n not in (KERNEL, COPY) and not n.startswith(DIAGNOSTIC)
        }
        if not others:
            continue
        fastest = min(others, key=others.get)
        judged.append(
            {
                "goal": f"{KERNEL} faster than {', '.join(sorted(others))}, {run['shape']}, "
                f"{run['dtype']}",
                "shape": run["shape"],
                "dtype": run["dtype"],
                "value": others[fastest] / kernel,
                "target": 1.0,
                "met": kernel < others[fastest],
                "next_fastest": fastest,
            }
        )
    return judged


#: The keys a saved run must have (``validate``).
RUN_KEYS = {"shape", "q_shape", "k_shape", "dtype", "buffers", "bytes_per_call", "kernel_ran",
            "first_calls_s", "forms", "skipped"}  # fmt: skip
FORM_KEYS = {"median_s", "fraction_of_copy", "times_copy", "max_abs_error", "seconds"}
PROVENANCE_KEYS = {"code", "started_utc", "device", "gpu", "driver", "cuda", "torch", "triton",
                   "transformers", "liger-kernel", "python", "platform", "seconds"}  # fmt: skip


def validate(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` if it has the layout ``run_benchmark`` writes; else ``ValueError`` saying
    which key is missing or wrong. What the chapter and ``make gpu-check`` rely on."""

    def need(mapping: Any, keys: set[str], where: str) -> None:
        if not isinstance(mapping, dict):
            raise ValueError(f"{where} must be a dict, got {type(mapping).__name__}")
        missing = sorted(keys - set(mapping))
        if missing:
            raise ValueError(f"{where} lacks {missing}")

    need(results, {"provenance", "settings", "runs", "goals"}, "results")
    need(results["provenance"], PROVENANCE_KEYS, "provenance")
    need(results["provenance"]["code"], {"commit", "dirty", "source"}, "provenance.code")
    if not results["runs"]:
        raise ValueError("results has no runs")
    for run in results["runs"]:
        need(run, RUN_KEYS, f"run {run.get('shape')!r}")
        if COPY not in run["forms"]:
            raise ValueError(f"run {run['shape']!r} lacks the anchor {COPY!r}")
        for name, form in run["forms"].items():
            need(form, FORM_KEYS, f"form {name!r} of run {run['shape']!r}")
            if not form["seconds"] or min(form["seconds"]) <= 0:
                raise ValueError(f"form {name!r} of run {run['shape']!r}: times must be > 0")
    return results


def report(results: dict[str, Any]) -> str:
    """The results as a table: per shape and dtype, each form's median and share of copy_."""
    lines = []
    facts = results["provenance"]
    lines.append(
        f"{facts['gpu'] or facts['device']}, driver {facts['driver']}, torch {facts['torch']}, "
        f"triton {facts['triton']}, code {facts['code']['commit']} ({facts['code']['source']})"
    )
    for run in results["runs"]:
        lines.append(f"\n{run['shape']}, {run['dtype']} (k: {run['k_shape'][1]} heads)")
        for name, form in run["forms"].items():
            queued = form.get("back_to_back")
            lines.append(
                f"  {name:<44} {form['median_s'] * 1e6:>10.1f} us   "
                f"{form['fraction_of_copy']:>6.0%} of copy_   {form['times_copy']:>6.2f} x copy_"
                + (
                    f"   | back to back {queued['median_s'] * 1e6:>9.1f} us "
                    f"{queued['fraction_of_copy']:>6.0%}"
                    if queued
                    else ""
                )
            )
        for name, why in run["skipped"].items():
            lines.append(f"  {name:<44} skipped: {why}")
    for key, timer in (("goals", "each call alone"), ("goals_back_to_back", "back to back")):
        for goal in results.get(key, []):
            verdict = "met" if goal["met"] else "MISSED"
            lines.append(f"goal {verdict} ({timer}): {goal['goal']} ({goal['value']:.2f})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: ``python -m rope_tutor.gpu_bench --help``. Returns the status."""
    parser = argparse.ArgumentParser(
        prog="python -m rope_tutor.gpu_bench",
        description="Time RoPE on q and k on a CUDA GPU against the copy_ of q and k.",
    )
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (the default: cuda)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    parser.add_argument(
        "--back-to-back",
        type=int,
        default=10,
        help="calls per batch of the second timer, calls queued back to back (0: leave it out)",
    )
    parser.add_argument(
        "--explore",
        action="store_true",
        help="also time the kernel taken apart: launch alone, no position check, a cos/sin "
        "table, other tiles (forms named 'diag: ...'; the goals never count them)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / "gpu" / "rope_cuda.json",
        help="where to write the results (default: rope_tutor/results/gpu/rope_cuda.json)",
    )
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if not args.device.startswith("cuda"):
        parser.error(f"--device must be cuda (this benchmark measures GPUs), got {args.device!r}")
    if args.back_to_back < 0:
        parser.error(f"--back-to-back must be >= 0, got {args.back_to_back}")
    if args.rounds < 1 or args.warmup < 0:
        parser.error(f"--rounds must be >= 1 and --warmup >= 0, got {args.rounds}, {args.warmup}")
    for name in args.dtypes:
        try:
            _dtype(name)
        except ValueError as error:
            parser.error(str(error))
    if not torch.cuda.is_available():
        print("rope_tutor.gpu_bench: skipped, no CUDA device (torch.cuda.is_available() is False)")
        return 0
    results = run_benchmark(
        dtypes=args.dtypes,
        device=args.device,
        rounds=args.rounds,
        warmup=args.warmup,
        compile=not args.no_compile,
        explore=args.explore,
        back_to_back=args.back_to_back,
    )
    results["provenance"]["command"] = shlex.join(["python", "-m", "rope_tutor.gpu_bench", *argv])
    validate(results)
    print(report(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
