"""The book's table of contents and the notebooks nbval runs are the same set."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import COLLECTED_NOTEBOOKS, FULL_RUN, ROOT, toc_files, toc_notebooks

import rope_tutor


def test_every_toc_entry_exists() -> None:
    missing = [name for name in toc_files() if not (ROOT / name).exists()]
    assert not missing, f"_toc.yml names files that do not exist: {missing}"


def test_nbval_runs_exactly_the_notebooks_of_the_toc(request: pytest.FixtureRequest) -> None:
    if not request.config.stash.get(FULL_RUN, False):
        pytest.skip("only a full `pytest` run (as `make test` does) collects every notebook")
    if not request.config.getoption("--nbval", default=False):
        pytest.fail("make test must run with --nbval (see pyproject.toml addopts)")
    collected = request.config.stash.get(COLLECTED_NOTEBOOKS, set())
    in_toc = set(toc_notebooks())
    assert collected == in_toc, (
        f"notebooks in _toc.yml but not run by nbval: {sorted(in_toc - collected)}; "
        f"run by nbval but not in _toc.yml: {sorted(collected - in_toc)}"
    )
    assert len(in_toc) >= 1


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_notebook_is_committed_with_outputs_and_no_errors(notebook: str) -> None:
    """Readers see the committed outputs on the code host and in Colab: they must be there."""
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert code, f"{notebook} has no code cells"
    not_run = [
        i
        for i, c in enumerate(code)
        if c.get("execution_count") is None
        and "skip-execution" not in c.get("metadata", {}).get("tags", [])
    ]
    assert not not_run, f"{notebook}: code cells {not_run} were never executed (no stored output)"
    # (cells tagged raises-exception demonstrate an error on purpose)
    errors = [
        o.get("ename")
        for c in code
        if "raises-exception" not in c.get("metadata", {}).get("tags", [])
        for o in c.get("outputs", [])
        if o["output_type"] == "error"
    ]
    assert not errors, f"{notebook} has stored error outputs: {errors}"


# --- stable addresses ---------------------------------------------------------------------------

PUBLISHED = ROOT / "book" / "published_pages.txt"


def published_pages() -> list[str]:
    lines = PUBLISHED.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def redirects() -> dict[str, str]:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return config["sphinx"]["config"].get("rope_tutor_redirects") or {}


def test_every_page_is_recorded_as_published() -> None:
    """A new page's address is recorded, so that a later rename cannot silently break it."""
    pages = [name.rsplit(".", 1)[0] for name in toc_files()]
    unrecorded = sorted(set(pages) - set(published_pages()))
    assert not unrecorded, f"add these addresses to {PUBLISHED.relative_to(ROOT)}: {unrecorded}"


def test_every_published_address_still_opens() -> None:
    """Readers bookmark chapter addresses: each stays a page, or redirects to one."""
    pages = {name.rsplit(".", 1)[0] for name in toc_files()}
    moved = redirects()
    broken = [
        name for name in published_pages() if name not in pages and moved.get(name) not in pages
    ]
    assert not broken, (
        f"published addresses that are no longer pages: {broken}; keep the file name, or add "
        "`old: new` to rope_tutor_redirects in _config.yml"
    )


@pytest.mark.slow
def test_every_published_address_has_a_page_in_the_site(built_site: Path) -> None:
    missing = [name for name in published_pages() if not (built_site / f"{name}.html").exists()]
    assert not missing, f"no page at these published addresses: {missing}"


# --- the release the chapters install -----------------------------------------------------------

INSTALL = re.compile(
    r"%pip install -q \"rope-tutor(?:\[\w+\])? @ git\+https://github\.com/rope-tutor/rope-tutor@v([^\"]+)\""
)


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_install_cell_names_this_release(notebook: str) -> None:
    """On Colab a chapter installs a tagged release, the one whose code produced its outputs."""
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    installs = [m.group(1) for s in sources for m in INSTALL.finditer(s)]
    assert installs == [rope_tutor.__version__], (
        f"{notebook}: the install cell must name v{rope_tutor.__version__}, found {installs}"
    )


def test_colab_opens_the_release_the_install_cells_pin() -> None:
    """The Colab button opens blob/<branch>/ of the repository: that branch is the tag the install
    cells pin, so a chapter opened on Colab and the package it installs come from one release; the
    preface's example address names the same tag."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    tag = f"v{rope_tutor.__version__}"
    assert config["repository"]["branch"] == tag
    cells = json.loads((ROOT / "book" / "00_preface.ipynb").read_text(encoding="utf-8"))["cells"]
    text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    colab = r"colab\.research\.google\.com/github/rope-tutor/rope-tutor/blob/([^/]+)/"
    addresses = re.findall(colab, text)
    assert addresses == [tag], addresses
    assert f"the release `{tag}`" in text
