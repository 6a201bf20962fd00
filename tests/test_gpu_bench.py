"""The GPU benchmark's pure-Python parts, on the CPU (``rope_tutor.gpu_bench``).

The timings themselves need a CUDA device; here: it skips cleanly without one, it refuses a CPU
device, its buffers exceed the L2 cache, its goals are judged right, its results have the layout
the chapter reads (a tiny run on the CPU, whose forms are checked against ``apply_rope``), and it
records the commit of the code it measured, even where that code was copied without git.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

from rope_tutor import gpu_bench
from rope_tutor.gpu_bench import COPY, HF, KERNEL

TINY = {"prefill": (2, 4, 2, 5, 16), "decode": (3, 4, 1, 1, 16)}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the run without a CUDA device")
def test_without_cuda_it_skips_in_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bench.json"
    assert gpu_bench.main(["--device", "cuda", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "skipped" in printed[0] and "no CUDA device" in printed[0]
    assert not out.exists()


def test_it_refuses_other_devices_and_bad_settings(capsys) -> None:
    for argv in (["--device", "cpu"], ["--rounds", "0"], ["--dtypes", "float64"]):
        with pytest.raises(SystemExit) as exit_:
            gpu_bench.main(argv)
        assert exit_.value.code == 2
    assert "--device must be cuda" in capsys.readouterr().err


def test_buffers_exceed_the_l2_cache() -> None:
    assert gpu_bench.ROTATION_BYTES >= 4 * 50 * 10**6  # four times an H100's L2
    for per_buffer in (655_360, 20 * 2**20, 41_943_040, 1_342_177_280):  # decode .. prefill
        count = gpu_bench.buffer_count(per_buffer)
        assert count >= 2 and count * per_buffer > gpu_bench.ROTATION_BYTES
        assert (count - 1) * per_buffer <= gpu_bench.ROTATION_BYTES or count == 2  # no more
    with pytest.raises(ValueError, match="bytes_per_input must be > 0"):
        gpu_bench.buffer_count(0)
    buffers = gpu_bench.make_buffers((3, 4, 1, 1, 16), torch.bfloat16, torch.device("cpu"))
    assert len(buffers) == gpu_bench.buffer_count((3 * 4 + 3 * 1) * 16 * 2)
    assert not torch.equal(buffers[0][0], buffers[1][0])  # distinct contents
    positions = buffers[0][2]
    assert positions.shape == (3, 1) and len(set(positions.flatten().tolist())) == 3


@pytest.fixture(scope="module")
def tiny_run() -> dict:
    return gpu_bench.run_benchmark(
        TINY, device="cpu", rounds=3, warmup=1, compile=False, total=10_000
    )


def test_a_tiny_run_has_the_saved_layout(tiny_run: dict) -> None:
    results = json.loads(json.dumps(tiny_run))  # what the JSON file holds
    assert gpu_bench.validate(results) is results
    assert [(r["shape"], r["dtype"]) for r in results["runs"]] == [
        (shape, dtype) for shape in TINY for dtype in ("float32", "bfloat16")
    ]
    for run in results["runs"]:
        assert {COPY, HF, KERNEL} <= set(run["forms"])
        assert run["forms"][COPY]["fraction_of_copy"] == 1.0
        assert run["skipped"][gpu_bench.COMPILED] == "--no-compile"
        assert len(run["forms"][KERNEL]["seconds"]) == 3
        assert run["buffers"] >= 2 and run["buffers"] * run["bytes_per_call"] / 2 > 10_000
        # every form computes RoPE, checked against apply_rope: ours to float32 rounding, Hugging
        # Face's to 1e-3 (it forms theta_i in float32, which at decode positions up to 8191
        # moves an angle by ~1e-4), both plus one bfloat16 unit (|x| < 6) in bfloat16
        low = 0.07 if run["dtype"] == "bfloat16" else 0.0
        assert run["forms"][KERNEL]["max_abs_error"] < 1e-5 + low
        assert run["forms"][HF]["max_abs_error"] < 1e-3 + low
    facts = results["provenance"]
    assert facts["torch"] == torch.__version__ and facts["code"]["source"] in ("git", "unknown")


def test_validate_names_what_is_missing(tiny_run: dict) -> None:
    broken = json.loads(json.dumps(tiny_run))
    del broken["provenance"]["driver"]
    with pytest.raises(ValueError, match=r"provenance lacks \['driver'\]"):
        gpu_bench.validate(broken)
    broken = json.loads(json.dumps(tiny_run))
    del broken["runs"][0]["forms"][COPY]
    with pytest.raises(ValueError, match="lacks the anchor"):
        gpu_bench.validate(broken)


def fake_run(shape: str, dtype: str, seconds: dict[str, float]) -> dict:
    copy = seconds[COPY]
    return {
        "shape": shape,
        "dtype": dtype,
        "forms": {
            name: {"median_s": s, "fraction_of_copy": copy / s, "times_copy": s / copy}
            for name, s in seconds.items()
        },
    }


def test_goals_are_judged_as_the_issue_states_them() -> None:
    prefill, decode = "prefill (8, 32, 8192, 128)", "decode (64, 32, 1, 128)"
    runs = [
        fake_run(prefill, "bfloat16", {COPY: 0.93, KERNEL: 1.0, HF: 5.0}),  # 93 %: met
        fake_run(prefill, "float32", {COPY: 0.91, KERNEL: 1.0, HF: 0.99}),  # 91 %, and slower
        fake_run(decode, "bfloat16", {COPY: 30e-6, KERNEL: 46e-6, HF: 140e-6}),  # 1.53 x: missed
    ]
    judged = {(g["shape"], g["dtype"], "faster" in g["goal"]): g for g in gpu_bench.goals(runs)}
    assert judged[(prefill, "bfloat16", False)]["met"]
    assert not judged[(prefill, "float32", False)]["met"]
    assert not judged[(prefill, "float32", True)]["met"]  # HF eager was faster there
    assert judged[(prefill, "bfloat16", True)]["met"]
    assert not judged[(decode, "bfloat16", False)]["met"]
    assert judged[(decode, "bfloat16", False)]["value"] == pytest.approx(46 / 30)
    assert len(judged) == 6  # goals of shapes and dtypes not measured are left out


def git(folder: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(folder), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_commit_comes_from_git_or_from_the_commit_file(tmp_path: Path, monkeypatch) -> None:
    own = gpu_bench.code_commit()
    if own["source"] == "git":  # this checkout
        assert own["commit"] == git(Path(gpu_bench.__file__).parent, "rev-parse", "HEAD")
    # A copy of the package inside some other repository (as on the GPU machine, 2026-11-26):
    # git answers for the wrong repository, so its commit must not be taken.
    outer = tmp_path / "outer"
    package = outer / "copy" / "rope_tutor"
    (package / "results" / "gpu").mkdir(parents=True)
    git(outer, "init", "-q")
    assert gpu_bench.code_commit(package) == {"commit": None, "dirty": None, "source": "unknown"}
    (package / "results" / "gpu" / "COMMIT").write_text("c21b63b\n")
    assert gpu_bench.code_commit(package) == {
        "commit": "c21b63b",
        "dirty": None,
        "source": "COMMIT file",
    }
    # make gpu-check names the commit it was bundled from, which wins over any git history
    monkeypatch.setenv(gpu_bench.COMMIT_VARIABLE, "2bce3a3 (from .gpu/COMMIT)")
    assert gpu_bench.code_commit(package)["commit"] == "2bce3a3 (from .gpu/COMMIT)"


def test_the_saved_h100_run_is_what_the_benchmark_computes_from_its_times() -> None:
    # Chapter "Making RoPE fast" quotes this run (2026-11-26, an H100, the code at c21b63b, before
    # the Triton kernel): its tables and verdicts must follow from its own raw times.
    import math

    from rope_tutor import bench, results

    saved = results.load("gpu/bench_cuda_h100_2026-11-26.json")
    machine = saved["provenance"]["machine"]
    assert machine["gpu"] == "NVIDIA H100 80GB HBM3" and machine["device"] == "cuda"
    assert saved["provenance"]["started_utc"].startswith("2026-11-26")
    shape = tuple(saved["config"]["shape"])
    assert shape == bench.FULL_SHAPE
    (run,) = saved["runs"]
    for dtype_name, result in run["dtypes"].items():
        element_size = torch.empty(0, dtype=getattr(torch, dtype_name)).element_size()
        recomputed = bench.summarize(
            {name: [t / 1e3 for t in ms] for name, ms in result["times_ms"].items()},
            2 * math.prod(shape) * element_size,
        )
        rows = {row["form"]: row for row in result["rows"]}
        assert set(rows) == {row["form"] for row in recomputed}
        for row in recomputed:
            for key in ("ms_median", "x_copy", "x_clone"):
                assert rows[row["form"]][key] == pytest.approx(row[key], rel=1e-9)
    for phase in ("prefill", "decode"):  # medians of per-round shares (bench.attention_layer_share)
        layer = run["layer"][phase]
        assert 0 < layer["textbook_rope_share"] < layer["rope_share"] < 1
    assert saved["goals"] == bench.goals(saved["runs"])


def test_a_form_of_another_project_that_fails_is_left_out_with_its_error() -> None:
    sample = gpu_bench.make_buffers((1, 2, 1, 3, 8), torch.float32, torch.device("cpu"), total=1)
    forms, skipped = [], {}

    def broken(buffer):
        raise RuntimeError("inductor needs a C++ compiler")

    gpu_bench._add_if_it_runs(forms, skipped, gpu_bench.Form(gpu_bench.COMPILED, broken), sample[0])
    assert forms == []
    assert skipped == {gpu_bench.COMPILED: "failed: RuntimeError: inductor needs a C++ compiler"}
    working = gpu_bench.Form(COPY, lambda buffer: (buffer[3].copy_(buffer[0]), None))
    sample[0][3].fill_(float("nan"))
    gpu_bench._add_if_it_runs(forms, skipped, working, sample[0])
    assert forms == [working] and sample[0][3].isnan().all()  # it ran on copies


def test_the_back_to_back_timer_issues_every_call_and_divides_by_their_number() -> None:
    # Each batch issues `calls` calls on successive buffers and reports the batch's time / calls.
    seen: list[int] = []

    def run(buffer):
        seen.append(buffer[0])
        time.sleep(0.002)
        return buffer

    forms = [gpu_bench.Form("a", run), gpu_bench.Form("b", run)]
    buffers = [(i,) for i in range(3)]
    times = gpu_bench.time_back_to_back(
        forms, buffers, rounds=2, calls=4, device=torch.device("cpu")
    )
    assert len(seen) == 2 * 2 * 4 and set(seen) == {0, 1, 2}  # every call, every buffer
    assert [len(t) for t in times.values()] == [2, 2]
    assert all(0.002 <= t < 0.02 for ts in times.values() for t in ts)  # per call, not per batch


def test_goals_are_judged_on_the_timer_asked_for() -> None:
    def form(per_call: float, queued: float) -> dict:
        return {"median_s": per_call, "fraction_of_copy": 1.0 / per_call, "times_copy": per_call,
                "back_to_back": {"median_s": queued, "fraction_of_copy": 1.0 / queued,
                                 "times_copy": queued}}  # fmt: skip

    run = {"shape": "decode (64, 32, 1, 128)", "dtype": "float32",
           "forms": {COPY: form(1.0, 1.0), KERNEL: form(3.0, 1.2), HF: form(4.0, 1.1)}}  # fmt: skip
    per_call = {g["goal"]: g for g in gpu_bench.goals([run])}
    queued = {g["goal"]: g for g in gpu_bench.goals([run], timer="back_to_back")}
    decode = next(name for name in per_call if "form time / copy_ time" in name)
    assert not per_call[decode]["met"] and queued[decode]["met"]  # 3.0 > 1.5, 1.2 <= 1.5
    faster = next(name for name in per_call if "faster than" in name)
    assert per_call[faster]["met"] and not queued[faster]["met"]  # 3 < 4, but 1.2 > 1.1
    assert queued[faster]["next_fastest"] == HF
    with pytest.raises(ValueError, match="timer must be"):
        gpu_bench.goals([run], timer="wall")
