"""Shared pytest set-up: the book's table of contents, which notebooks nbval collected, and the
built website (used by test_site.py and test_browser.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COLLECTED_NOTEBOOKS = pytest.StashKey[set[str]]()
FULL_RUN = pytest.StashKey[bool]()
SITE = ROOT / "_build" / "html"
#: Development only: the path of a site already built (for example a partial build with a toc of
#: its own); the site tests then check it instead of building the book.
PREBUILT_SITE_VARIABLE = "ROPE_TUTOR_PREBUILT_SITE"


def toc_files() -> list[str]:
    """Every file named in _toc.yml (root included), as paths relative to the repository root,
    with the suffix of the file that exists (.ipynb or .md)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    names = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                names.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(toc.get("parts", toc.get("chapters", [])))
    resolved = []
    for name in names:
        matches = [ROOT / f"{name}{suffix}" for suffix in (".ipynb", ".md")]
        existing = [m for m in matches if m.exists()]
        resolved.append(str((existing[0] if existing else matches[0]).relative_to(ROOT)))
    return resolved


def toc_notebooks() -> list[str]:
    return [name for name in toc_files() if name.endswith(".ipynb")]


def pytest_configure(config: pytest.Config) -> None:
    # `make test` runs plain `pytest`: the default testpaths, so every notebook must be collected.
    config.stash[FULL_RUN] = config.args_source == pytest.Config.ArgsSource.TESTPATHS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash[COLLECTED_NOTEBOOKS] = {
        str(Path(item.path).resolve().relative_to(ROOT))
        for item in items
        if Path(item.path).suffix == ".ipynb"
    }


@pytest.fixture(scope="session")
def built_site() -> Path:
    """Build the book exactly as `make book` does (notebooks executed, cached by their code)."""
    prebuilt = os.environ.get(PREBUILT_SITE_VARIABLE)
    if prebuilt:
        site = Path(prebuilt).resolve()
        assert (site / "index.html").exists(), f"{PREBUILT_SITE_VARIABLE}={prebuilt}: no index.html"
        return site
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run(
        [str(jupyter_book), "build", str(ROOT), "--builder", "html", "-W", "-n", "--keep-going"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"the book build failed:\n{log[-6000:]}"
    warnings = [line for line in log.splitlines() if ": WARNING:" in line or ": ERROR:" in line]
    assert not warnings, "the book build printed warnings:\n" + "\n".join(warnings[:30])
    return SITE
