"""Part VI: the RoPE benchmark runs, compares equal work, and its saved results carry provenance.

No timing is asserted here (the machine is shared and timings are noisy): only that the benchmark
measures what it claims, computes its summary and its verdicts correctly, and that the saved
results are what the code produces, with their provenance.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from datetime import datetime
from pathlib import Path

import pytest
import torch

from rope_tutor import bench
from rope_tutor.bench import (
    FULL_SHAPE,
    QUICK_SHAPE,
    Form,
    alibi_memory,
    attention_layer_share,
    check_forms,
    git_state,
    goals,
    main,
    make_forms,
    rope_halves,
    run_benchmark,
    summarize,
)
from rope_tutor.results import RESULTS_DIR
from rope_tutor.rope import apply_rope

SAVED = sorted((RESULTS_DIR / "bench").glob("*.json"))
EAGER_FORMS = {
    bench.COPY,
    bench.CLONE,
    bench.TEXTBOOK,
    bench.TRANSFORMERS,
    bench.COMPLEX,
    bench.REFERENCE,
    bench.FAST,
    bench.FAST_INTERLEAVED,
    bench.FAST_OUT,
}
ALL_FORMS = EAGER_FORMS | {bench.COMPILED}


def float64_rope(x: torch.Tensor, layout: str) -> torch.Tensor:
    """RoPE written out independently: angles m * theta_i in float64, positions 0 .. seq-1."""
    seq, dim = x.shape[-2:]
    theta = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * theta  # (seq, dim/2)
    cos, sin = angles.cos(), angles.sin()
    x = x.double()
    if layout == "half":
        first, second = x[..., : dim // 2], x[..., dim // 2 :]
        return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


def test_quick_mode_prints_well_formed_tables_and_saves_json(capsys, tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    threads_before = torch.get_num_threads()
    argv = ["--quick", "--no-compile", "--threads", "1", "2", "--rounds", "2", "--no-progress"]
    results = main([*argv, "--out", str(out)])
    printed = capsys.readouterr().out
    headers = [line for line in printed.splitlines() if line.startswith("form ")]
    assert len(headers) == 4  # one table per dtype and thread count
    for header in headers:
        assert re.split(r"\s{2,}", header.strip()) == [
            "form", "ms", "GB/s", "x copy_", "x clone", "faults", "max |diff|"
        ]  # fmt: skip
    tables = printed.split("\nq (")[1:]  # each table follows its "q (shape) dtype" title
    titles = [(d, t) for t in (1, 2) for d in ("float32", "bfloat16")]
    for (dtype_name, threads), table in zip(titles, tables, strict=True):
        assert f") {dtype_name}, {threads} thread(s), median of 2" in table.splitlines()[0]
        run = next(r for r in results["runs"] if r["threads"] == threads)
        rows = run["dtypes"][dtype_name]["rows"]
        assert {row["form"] for row in rows} == EAGER_FORMS
        for row in rows:
            line = next(ln for ln in table.splitlines() if ln.startswith(row["form"] + " "))
            cells = line[len(row["form"]) :].split()
            assert len(cells) == 6  # ms, GB/s, x copy_, x clone, faults, max |diff|
            assert float(cells[0]) == pytest.approx(row["ms_median"], abs=0.006)
            assert all(
                math.isfinite(row[key]) and row[key] > 0 for key in ("ms_median", "gb_per_s")
            )
        by_form = {row["form"]: row for row in rows}
        assert by_form["copy_"]["x_copy"] == 1.0 and by_form["clone"]["x_clone"] == 1.0
    for run in results["runs"]:
        assert set(run["layer"]) == {"prefill", "decode", "config"}
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["provenance"]["command"] == shlex.join(
        ["python", "-m", "rope_tutor.bench", *argv, "--out", str(out)]
    )
    assert results["provenance"]["threads"] == [1, 2]
    assert len(results["goals"]) == 8  # four goals at each thread count
    assert "this run is smaller" in printed
    assert torch.get_num_threads() == threads_before  # restored after the run


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_form_computes_what_apply_rope_computes(dtype: torch.dtype) -> None:
    x = torch.randn(2, 3, 40, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    positions = torch.arange(40)
    cos, sin = (t.to(dtype) for t in bench.RotaryEmbedding(16).cos_sin(positions, dtype))
    forms = make_forms(x, compiled=lambda: rope_halves(x, cos, sin))  # the form inductor compiles
    assert {form.name for form in forms} == ALL_FORMS
    for form in forms:
        got = form.run()
        assert got.shape == x.shape and got.dtype == dtype, form.name
        if form.layout is None:
            torch.testing.assert_close(got, x, rtol=0, atol=0)
            continue
        expected = apply_rope(x, positions, layout=form.layout)
        # 1e-5 for float64 too: Meta's complex form computes in float32.
        torch.testing.assert_close(got.double(), expected.double(), rtol=0, atol=1e-5)
        independent = float64_rope(x, form.layout)
        torch.testing.assert_close(got.double(), independent, rtol=0, atol=2e-5)


def test_bfloat16_forms_agree_to_bfloat16_precision() -> None:
    x = torch.randn(1, 4, 64, 32, generator=torch.Generator().manual_seed(2)).bfloat16()
    pair_norm = x.double().abs().amax(dim=-1, keepdim=True) * math.sqrt(2)
    for form in make_forms(x):
        if form.layout is not None:
            error = (form.run().double() - float64_rope(x, form.layout)).abs()
            assert (error <= 4 * 2**-8 * pair_norm).all(), form.name


def test_transformers_form_rotates_q_and_k_and_counts_two_tensors() -> None:
    x = torch.randn(1, 2, 10, 8, generator=torch.Generator().manual_seed(3))
    (form,) = [f for f in make_forms(x) if f.name == bench.TRANSFORMERS]
    assert form.tensors == 2
    times = bench.benchmark_forms(
        [Form("copy_", x.clone, None), Form("clone", x.clone, None), form],
        rounds=2,
        warmup=0,
        device=torch.device("cpu"),
        progress=False,
    )
    assert len(times[bench.TRANSFORMERS]) == 2


def test_kernel_sources_are_cut_out_of_inductors_wrapper() -> None:
    kernel = 'extern "C" void kernel() {}'
    wrapper = f"import torch\nk = async_compile.cpp_pybinding([], r'''\n{kernel}\n''')\n"
    assert bench._kernel_sources([wrapper]) == [kernel]
    assert bench._kernel_sources(["no kernel here"]) == ["no kernel here"]


def test_check_forms_catches_a_wrong_form() -> None:
    x = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(4))
    positions = torch.arange(12)
    right = Form("right", lambda: apply_rope(x, positions), "half")
    off_by_one = Form("off by one", lambda: apply_rope(x, positions + 1), "half")
    wrong_layout = Form("wrong layout", lambda: apply_rope(x, positions), "interleaved")
    no_rope = Form("identity", lambda: x.clone(), "half")
    differences = check_forms([right, off_by_one, wrong_layout, no_rope], x)
    assert differences["right"] == 0.0
    for name in ("off by one", "wrong layout", "identity"):
        assert differences[name] > 0.1, name


def test_summarize_medians_bandwidth_and_same_round_ratios() -> None:
    times = {
        "copy_": [1.0, 2.0, 4.0],
        "clone": [2.0, 4.0, 4.0],
        "form": [3.0, 2.0, 12.0],
    }
    rows = {row["form"]: row for row in summarize(times, 6_000_000_000)}
    assert rows["form"]["ms_median"] == 3000.0
    assert rows["form"]["ms_min"] == 2000.0 and rows["form"]["ms_max"] == 12000.0
    assert rows["form"]["gb_per_s"] == 2.0  # 6e9 bytes in 3 s
    assert rows["form"]["x_copy"] == 3.0  # per-round ratios 3, 1, 3: not 3 / 2 (median / median)
    assert rows["form"]["x_clone"] == 1.5  # ratios 1.5, 0.5, 3
    assert rows["copy_"]["x_copy"] == 1.0


def test_goals_are_judged_from_same_round_ratios() -> None:
    ms = {
        bench.COPY: [1.0, 1.0, 1.0],
        bench.CLONE: [4.0, 4.0, 4.0],
        bench.FAST: [5.0, 6.0, 4.8],  # 1.25, 1.5, 1.2 x clone: median 1.25 <= 1.3, met
        bench.TEXTBOOK: [15.0, 30.0, 24.0],  # 3, 5, 5 x fast: median 5 >= 4, met
        bench.FAST_OUT: [2.0, 1.4, 1.6],  # x copy_: median 1.6 > 1.5, missed by 1/15
    }
    bf16 = {bench.COPY: [1.0] * 3, bench.CLONE: [2.0] * 3, bench.FAST: [5.0, 5.0, 3.0]}
    runs = [{"threads": 2, "dtypes": {"float32": {"times_ms": ms}, "bfloat16": {"times_ms": bf16}}}]
    judged = {(g["dtype"], g["form"], g["anchor"]): g for g in goals(runs)}
    assert len(judged) == 4 and all(g["threads"] == 2 for g in judged.values())
    fast = judged["float32", bench.FAST, bench.CLONE]
    assert fast["value"] == 1.25 and fast["met"] and fast["missed_by"] == 0.0
    textbook = judged["float32", bench.TEXTBOOK, bench.FAST]
    assert textbook["value"] == 5.0 and textbook["higher_is_better"] and textbook["met"]
    out = judged["float32", bench.FAST_OUT, bench.COPY]
    assert out["value"] == pytest.approx(1.6) and not out["met"]
    assert out["missed_by"] == pytest.approx(0.1 / 1.5)
    low = judged["bfloat16", bench.FAST, bench.CLONE]
    assert low["value"] == 2.5 and not low["met"] and low["missed_by"] == pytest.approx(0.25)


def test_attention_layer_share_is_a_fraction_of_the_layer() -> None:
    layer = attention_layer_share(hidden=64, num_heads=4, prefill=16, cache=32, rounds=2)
    for phase, tokens in (("prefill", 16), ("decode", 1)):
        result = layer[phase]
        assert result["tokens"] == tokens
        assert 0 < result["rope_share"] < 1 and 0 < result["textbook_rope_share"] < 1
        assert all(ms > 0 for ms in result["ms"].values())
    assert layer["decode"]["positions"] == "32 .. 32"
    with pytest.raises(ValueError, match="hidden"):
        attention_layer_share(hidden=60, num_heads=8)


def test_git_state_names_this_checkout_or_nothing(tmp_path: Path) -> None:
    state = git_state()
    if state["commit"] is not None:  # a clone: a 40-hex commit and a dirty flag
        assert re.fullmatch(r"[0-9a-f]{40}", state["commit"]) and isinstance(state["dirty"], bool)
    assert git_state(tmp_path) == {"commit": None, "dirty": None}


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="int32"):
        run_benchmark(QUICK_SHAPE, ["int32"], rounds=1, warmup=0, progress=False)
    with pytest.raises(ValueError, match="rounds"):
        run_benchmark(QUICK_SHAPE, ["float32"], rounds=0, progress=False)
    with pytest.raises(ValueError, match="threads"):
        run_benchmark(QUICK_SHAPE, ["float32"], threads=[0], progress=False)
    with pytest.raises(SystemExit):
        main(["--threads", "0"])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_alibi_attention_never_builds_the_full_bias() -> None:
    measured = alibi_memory(num_heads=4, seq=4096, head_dim=16)
    assert measured["full_bias_bytes"] == 4 * 4 * 4096**2  # 256 MiB
    # Everything the call allocates (per-block bias, scores, outputs) stays below half of it.
    assert 0 < measured["peak_growth_bytes"] < measured["full_bias_bytes"] / 2


def test_saved_results_exist() -> None:
    assert SAVED, "run the benchmark with --out rope_tutor/results/bench/<name>.json"


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.name)
def test_saved_results_are_what_the_code_produces(path: Path) -> None:
    results = json.loads(path.read_text())
    provenance = results["provenance"]
    # The command re-creates this very file, at 1 and 2 threads.
    argv = shlex.split(provenance["command"])
    assert argv[:3] == ["python", "-m", "rope_tutor.bench"]
    assert argv[argv.index("--out") + 1] == f"rope_tutor/results/bench/{path.name}"
    assert "--quick" not in argv and "--no-compile" not in argv
    datetime.fromisoformat(provenance["started_utc"])
    assert re.fullmatch(r"[0-9a-f]{40}", provenance["git_commit"])
    assert isinstance(provenance["git_dirty"], bool)
    assert provenance["seconds"] > 0 and provenance["threads"] == [1, 2]
    machine = provenance["machine"]
    for key in ("cpu", "logical_cpus", "torch", "rope_tutor", "transformers", "device"):
        assert machine[key], key
    assert len(machine["load_average_1_5_15_min"]) == 3
    assert len(provenance["load_average_after"]) == 3

    config = results["config"]
    assert tuple(config["shape"]) == FULL_SHAPE and config["rounds"] >= 11
    assert config["threads"] == [1, 2] and config["compile"]
    assert [run["threads"] for run in results["runs"]] == [1, 2]
    for run in results["runs"]:
        for dtype_name, result in run["dtypes"].items():
            rows = {row["form"]: row for row in result["rows"]}
            assert set(rows) == ALL_FORMS == set(result["times_ms"])
            # The table is what summarize computes from the raw per-round times in the file.
            element_size = torch.empty(0, dtype=getattr(torch, dtype_name)).element_size()
            recomputed = summarize(
                {name: [t / 1e3 for t in ms] for name, ms in result["times_ms"].items()},
                2 * math.prod(FULL_SHAPE) * element_size,
            )
            for row in recomputed:
                saved = rows[row["form"]]
                assert len(result["times_ms"][row["form"]]) == config["rounds"]
                for key in ("ms_median", "gb_per_s", "x_copy", "x_clone"):
                    assert saved[key] == pytest.approx(row[key], rel=1e-9), (row["form"], key)
            # Equal work: every form, the compiled kernel included, agrees with apply_rope (in
            # bfloat16: to a unit of bfloat16 at |x| ~ 5, or the textbook's own roundings).
            for name, row in rows.items():
                assert row["max_abs_diff"] <= (1e-5 if dtype_name == "float32" else 0.05), name
        for phase in ("prefill", "decode"):
            share = run["layer"][phase]
            assert 0 < share["rope_share"] < 1 and 0 < share["textbook_rope_share"] < 1
    # The verdicts are the ones goals() reaches from the raw times.
    assert results["goals"] == goals(results["runs"])
    assert len(results["goals"]) == 8
    for dtype_name, compiled in results["compiled"].items():
        assert compiled["compile_seconds"] > 0, dtype_name
        assert compiled["kernels"] and all("kernel" in k for k in compiled["kernels"])


def test_table_prints_rounding_level_differences_as_a_bound() -> None:
    assert [bench._difference(v) for v in (None, 0.0, 4.8e-7, 3.1e-2)] == [
        "-", "0", "<1e-06", "3.1e-02"
    ]  # fmt: skip
