"""`make gpu-check` (.ci/gpu_check.py), checked here on the CPU: it refuses to pretend without CUDA,
and its provenance stage records what a copy of the tree without git history needs (the commit
read from .gpu/COMMIT), the software and the stage summary. The GPU stages themselves run on a GPU
machine; their results are committed under rope_tutor/results/gpu/ when one was at hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT

SCRIPT = ROOT / ".ci" / "gpu_check.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_without_cuda_it_says_so_and_checks_nothing(tmp_path: Path) -> None:
    done = run("--stages", "provenance,unit", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "no CUDA device here" in done.stdout
    assert not (tmp_path / "provenance.json").exists()


def test_provenance_stage_writes_its_record_and_the_summary(tmp_path: Path) -> None:
    done = run("--allow-cpu", "--stages", "provenance", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "provenance.json").read_text())
    assert record["torch"] == torch.__version__
    assert record["cuda_available"] == torch.cuda.is_available()
    assert len(record["commit"].split()[0]) == 40  # from git here, from .gpu/COMMIT on a copy
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [stage["stage"] for stage in summary["stages"]] == ["provenance"]
    assert summary["stages"][0]["status"] == "ok"
    assert "gpu-check: 1 stages" in done.stdout
