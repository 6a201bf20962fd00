"""The GitHub Actions workflow, validated offline by actionlint (its binary ships in a wheel of
requirements.txt), and held to what the README says it does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import ROOT

WORKFLOWS = ROOT / ".github" / "workflows"


def actionlint() -> str:
    found = Path(sys.executable).parent / "actionlint"
    return str(found) if found.exists() else shutil.which("actionlint") or "actionlint"


def test_every_workflow_passes_actionlint() -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert files, "no workflow"
    done = subprocess.run(
        [actionlint(), "-no-color", *map(str, files)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path: Path) -> None:
    """The check above can fail: a job with an unknown runner label and a bad expression."""
    broken = tmp_path / "broken.yml"
    broken.write_text(
        "on: push\njobs:\n  x:\n    runs-on: ubuntu-latst\n"
        "    steps:\n      - run: echo ${{ github.nope.x }}\n"
    )
    done = subprocess.run([actionlint(), "-no-color", str(broken)], capture_output=True, text=True)
    assert done.returncode == 1 and "runner-label" in done.stdout


def test_the_workflow_tests_every_push_publishes_tags_and_has_a_gpu_route() -> None:
    workflow = yaml.safe_load((WORKFLOWS / "book.yml").read_text())
    triggers = workflow[True]  # YAML reads the key `on` as True
    assert {"push", "pull_request"} <= set(triggers)
    jobs = workflow["jobs"]
    assert any("bash .ci/run" in step.get("run", "") for step in jobs["test"]["steps"])
    pages = jobs["pages"]
    assert pages["if"] == "startsWith(github.ref, 'refs/tags/v')" and pages["needs"] == "test"
    assert any(step.get("uses", "").startswith("actions/deploy-pages") for step in pages["steps"])
    assert jobs["gpu"]["runs-on"] == ["self-hosted", "gpu"]
    assert any("make gpu-check" in step.get("run", "") for step in jobs["gpu"]["steps"])
