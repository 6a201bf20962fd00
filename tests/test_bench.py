"""Part VI: the RoPE benchmark runs, compares equal work, and its saved results carry provenance.

No timing is asserted here (the machine is shared and timings are noisy): only that the benchmark
measures what it claims, computes its summary correctly, and that saved results are well formed.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from pathlib import Path

import pytest
import torch

from rope_tutor.bench import (
    FULL_SHAPE,
    QUICK_SHAPE,
    Form,
    alibi_memory,
    check_forms,
    main,
    make_forms,
    run_benchmark,
    summarize,
)
from rope_tutor.results import RESULTS_DIR
from rope_tutor.rope import apply_rope, rope_matrix

SAVED = sorted((RESULTS_DIR / "bench").glob("*.json"))
ANCHORS = {"copy_", "clone"}
FORM_NAMES = {
    "copy_",
    "clone",
    "dense R_m x",
    "textbook x*cos + rotate_half(x)*sin",
    "complex (Meta, view_as_complex)",
    "apply_rope (half)",
    "apply_rope (interleaved)",
    "lucidrains rotary-embedding-torch",
}


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


def test_quick_mode_prints_a_well_formed_table_and_saves_json(capsys, tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    results = main(["--quick", "--rounds", "2", "--no-progress", "--out", str(out)])
    printed = capsys.readouterr().out
    headers = [line for line in printed.splitlines() if line.startswith("form ")]
    assert len(headers) == 2  # one table per dtype
    for header in headers:
        assert re.split(r"\s{2,}", header.strip()) == [
            "form", "ms", "GB/s", "x copy_", "x clone", "faults", "max |diff|"
        ]  # fmt: skip
    tables = printed.split("\nq (")[1:]  # each table follows its "q (shape) dtype" title
    for dtype_name, table in zip(("float32", "bfloat16"), tables, strict=True):
        assert f") {dtype_name}, median of 2" in table.splitlines()[0]
        rows = results["dtypes"][dtype_name]["rows"]
        assert {row["form"] for row in rows} == FORM_NAMES
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
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["provenance"]["command"] == (
        f"python -m rope_tutor.bench --quick --rounds 2 --no-progress --out {out}"
    )
    assert "this run is smaller" in printed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_form_computes_what_apply_rope_computes(dtype: torch.dtype) -> None:
    x = torch.randn(2, 3, 40, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    forms = make_forms(x)
    assert {form.name for form in forms} == FORM_NAMES
    for form in forms:
        got = form.run()
        assert got.shape == x.shape, form.name
        if form.layout is None:
            torch.testing.assert_close(got, x, rtol=0, atol=0)
            continue
        expected = apply_rope(x, torch.arange(40), layout=form.layout)
        # 1e-5 for float64 too: Meta's complex form and lucidrains compute in float32.
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


def test_dense_matrices_are_rope_matrix() -> None:
    x = torch.randn(1, 1, 6, 8, generator=torch.Generator().manual_seed(3))
    (dense,) = [form for form in make_forms(x) if form.name == "dense R_m x"]
    got = dense.run()
    for m in range(6):
        expected = rope_matrix(m, 8) @ x[0, 0, m].double()  # the chapter 4 matrix, float64
        torch.testing.assert_close(got[0, 0, m].double(), expected, rtol=0, atol=1e-6)


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


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="int32"):
        run_benchmark(QUICK_SHAPE, ["int32"], rounds=1, warmup=0, progress=False)
    with pytest.raises(ValueError, match="rounds"):
        run_benchmark(QUICK_SHAPE, ["float32"], rounds=0, progress=False)
    with pytest.raises(SystemExit):
        main(["--threads", "0"])


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_alibi_attention_never_builds_the_full_bias() -> None:
    measured = alibi_memory(num_heads=4, seq=4096, head_dim=16)
    assert measured["full_bias_bytes"] == 4 * 4 * 4096**2  # 256 MiB
    # Everything the call allocates (per-block bias, scores, outputs) stays below half of it.
    assert 0 < measured["peak_growth_bytes"] < measured["full_bias_bytes"] / 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_runs_on_cuda() -> None:
    results = run_benchmark(QUICK_SHAPE, ["float32"], rounds=1, warmup=1, device="cuda")
    assert results["provenance"]["machine"]["gpu"]
    assert all(row["max_abs_diff"] < 1e-5 for row in results["dtypes"]["float32"]["rows"])


def test_saved_results_exist() -> None:
    assert SAVED, "run the benchmark with --out rope_tutor/results/bench/<name>.json"


@pytest.mark.parametrize("path", SAVED, ids=lambda p: p.name)
def test_saved_results_are_well_formed_with_provenance(path: Path) -> None:
    results = json.loads(path.read_text())
    provenance = results["provenance"]
    assert provenance["command"].startswith("python -m rope_tutor.bench")
    datetime.fromisoformat(provenance["started_utc"])
    machine = provenance["machine"]
    for key in ("cpu", "logical_cpus", "torch_threads", "torch", "rope_tutor", "device"):
        assert machine[key], key
    assert len(machine["load_average_1_5_15_min"]) == 3
    assert len(provenance["load_average_after"]) == 3
    config = results["config"]
    assert tuple(config["shape"]) == FULL_SHAPE and config["rounds"] >= 11
    for dtype_name, result in results["dtypes"].items():
        rows = {row["form"]: row for row in result["rows"]}
        assert set(rows) == FORM_NAMES == set(result["times_ms"])
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
        # Equal work: every form agrees with apply_rope. lucidrains forms its own float32
        # frequencies (rounded differently, so up to ~1e-3 apart at position 4095) and, in
        # bfloat16, rounds the positions themselves to bfloat16: that row is reported, not checked.
        for name, row in rows.items():
            if name == "lucidrains rotary-embedding-torch":
                assert dtype_name != "float32" or row["max_abs_diff"] <= 2e-3
            else:
                assert row["max_abs_diff"] <= (1e-5 if dtype_name == "float32" else 0.05), name
    for goal in results["goals"]:
        higher_is_better = goal["goal"].startswith("textbook")
        met = (
            goal["value"] >= goal["target"] if higher_is_better else goal["value"] <= goal["target"]
        )
        assert goal["met"] == met
