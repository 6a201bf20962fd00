"""Shared pytest set-up: the book's table of contents, which notebooks nbval collected, and the
built website (used by test_site.py and test_browser.py)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COLLECTED_NOTEBOOKS = pytest.StashKey[set[str]]()
#: For each collected notebook, the other files in its folder when it was collected.
NOTEBOOK_NEIGHBOURS = pytest.StashKey[dict[str, list[str]]]()
FULL_RUN = pytest.StashKey[bool]()
SITE = ROOT / "_build" / "html"
#: Development only: the path of a site already built (for example a partial build with a toc of
#: its own); the site tests then check it instead of building the book.
PREBUILT_SITE_VARIABLE = "ROPE_TUTOR_PREBUILT_SITE"


def toc_files() -> list[str]:
    """Every file named in _toc.yml (root included), in reading order, as paths relative to the
    repository root with the suffix of the file that exists (.ipynb or .md).

    The table of contents is read by ``sphinx_external_toc``, the parser Jupyter Book itself uses
    (imported here, not at the top: a GPU machine runs the unit tests without the book's tools).
    """
    from sphinx_external_toc.parsing import parse_toc_yaml

    site_map = parse_toc_yaml(str(ROOT / "_toc.yml"))
    names: list[str] = []

    def walk(docname: str) -> None:
        names.append(docname)
        for subtree in site_map[docname].subtrees:
            for item in subtree.items:
                if isinstance(item, str):  # a document (not a URL or glob)
                    walk(item)

    walk(site_map.root.docname)
    resolved = []
    for name in names:
        matches = [ROOT / f"{name}{suffix}" for suffix in (".ipynb", ".md")]
        existing = [m for m in matches if m.exists()]
        resolved.append(str((existing[0] if existing else matches[0]).relative_to(ROOT)))
    return resolved


def toc_notebooks() -> list[str]:
    return [name for name in toc_files() if name.endswith(".ipynb")]


#: Set by `make test`: this run must execute every chapter of the table of contents.
FULL_RUN_VARIABLE = "ROPE_TUTOR_FULL_RUN"
#: Set by `make test`: the folder where the wheel of this package was installed (not editable).
#: Notebooks then run from copies, each alone in an empty folder, against that installation.
READER_SITE_VARIABLE = "ROPE_TUTOR_READER_SITE"


#: The devices the package's unit tests run on: a test that takes a ``device`` argument runs once
#: on each. ``ROPE_TUTOR_TEST_DEVICES=cuda`` (as ``make gpu-check`` sets) narrows the list.
TEST_DEVICES_VARIABLE = "ROPE_TUTOR_TEST_DEVICES"
#: What the closing line reports: notebooks executed under nbval, and on which device.
NOTEBOOK_MODE = pytest.StashKey[str]()


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def test_devices() -> list[str]:
    """``cpu``, and ``cuda`` when a CUDA device is present (or the list the environment names)."""
    available = ["cpu"] + (["cuda"] if cuda_available() else [])
    named = os.environ.get(TEST_DEVICES_VARIABLE)
    if not named:
        return available
    wanted = [name.strip() for name in named.split(",") if name.strip()]
    missing = [name for name in wanted if name not in available]
    if missing:
        raise pytest.UsageError(
            f"{TEST_DEVICES_VARIABLE}={named}: {', '.join(missing)} is not available here "
            f"(available: {', '.join(available)})"
        )
    return wanted


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # One device parameter for the package's unit tests: the same test on the CPU and on CUDA.
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", test_devices())


def pytest_configure(config: pytest.Config) -> None:
    # The stored figures carry their Chinese words (rope_tutor.figures), which strict nbval
    # compares: the kernels it starts must draw them too, whoever runs pytest.
    os.environ.setdefault("ROPE_TUTOR_FIGURE_LANGUAGES", "zh_CN")
    # A plain `pytest` (the default testpaths) or `make test` must collect every notebook.
    config.stash[FULL_RUN] = (
        config.args_source == pytest.Config.ArgsSource.TESTPATHS
        or os.environ.get(FULL_RUN_VARIABLE) == "1"
    )
    config.addinivalue_line("markers", "on_device: takes the device parameter (cpu, cuda)")
    # With a CUDA device the chapters execute on it (rt.notebook_setup picks CUDA), where their
    # outputs differ from the CPU's stored ones in the last digits: nbval then runs them without
    # comparing outputs (--nbval-lax). Strict comparison is the CPU's job, in CI.
    if getattr(config.option, "nbval", False) and not config.option.nbval_lax and cuda_available():
        config.option.nbval_lax = True
        config.stash[NOTEBOOK_MODE] = "nbval-lax on cuda (outputs not compared: a GPU's digits)"
    elif getattr(config.option, "nbval_lax", False):
        config.stash[NOTEBOOK_MODE] = "nbval-lax on " + ("cuda" if cuda_available() else "cpu")
    else:
        config.stash[NOTEBOOK_MODE] = "strict nbval on cpu"


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """One closing line: what ran on which device, so that nothing is skipped silently."""
    import torch

    stats = terminalreporter.stats
    ran = [
        report
        for key in ("passed", "failed", "error")
        for report in stats.get(key, [])
        if report.when == "call"
    ]
    on_device: dict[str, int] = {}
    notebooks = 0
    for report in ran:
        if report.nodeid.split("::")[0].endswith(".ipynb"):
            notebooks += 1
        elif "[" in report.nodeid:
            for device in ("cpu", "cuda"):
                params = report.nodeid.rsplit("[", 1)[1].rstrip("]").split("-")
                if device in params:
                    on_device[device] = on_device.get(device, 0) + 1
    cpu_path = torch.backends.cpu.get_cpu_capability()
    devices = ", ".join(f"{count} on {device}" for device, count in sorted(on_device.items()))
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none present"
    terminalreporter.write_line(
        f"rope-tutor devices: unit tests with a device parameter: {devices or 'none ran'}; "
        f"CUDA: {cuda}; notebook cells: {notebooks}, "
        f"{config.stash.get(NOTEBOOK_MODE, 'strict nbval on cpu')}; "
        f"CPU code path: {cpu_path}"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # `pytest -m on_device` selects the tests that take the device parameter
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "device" in callspec.params:
            item.add_marker(pytest.mark.on_device)
    # A chapter is known by its file name, whether nbval runs it in book/ or from a reader's copy.
    notebooks = {Path(item.path) for item in items if Path(item.path).suffix == ".ipynb"}
    config.stash[COLLECTED_NOTEBOOKS] = {f"book/{path.name}" for path in notebooks}
    config.stash[NOTEBOOK_NEIGHBOURS] = {
        str(path): sorted(p.name for p in path.parent.iterdir() if p != path) for path in notebooks
    }


#: The Chinese edition's own build folder; its site is copied to SITE / "zh" (as `make book-zh`).
ZH_BUILD = ROOT / "_build" / "zh"
#: The editions: (environment for the build, extra jupyter-book arguments).
EDITIONS = {
    "en": ({}, []),
    "zh_CN": ({"ROPE_TUTOR_LANGUAGE": "zh_CN"}, ["--path-output", str(ZH_BUILD)]),
}


def _build(language: str) -> None:
    environment, extra = EDITIONS[language]
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run(
        [str(jupyter_book), "build", str(ROOT), "--builder", "html", "-W", "-n", "--keep-going"]
        + extra,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        env={**os.environ, **environment},
    )
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"the {language} book build failed:\n{log[-6000:]}"
    warnings = [line for line in log.splitlines() if ": WARNING:" in line or ": ERROR:" in line]
    assert not warnings, f"the {language} book build printed warnings:\n" + "\n".join(warnings[:30])
    assert "Executing" not in log, "the site build executed a notebook (it must use stored outputs)"


@pytest.fixture(scope="session")
def built_site() -> Path:
    """Build the book exactly as `make book` does: both editions, English in SITE and Chinese in
    SITE / "zh", from the notebooks' stored outputs, which strict nbval verifies in the same run,
    so no notebook is executed a second time."""
    prebuilt = os.environ.get(PREBUILT_SITE_VARIABLE)
    if prebuilt:
        site = Path(prebuilt).resolve()
        assert (site / "index.html").exists(), f"{PREBUILT_SITE_VARIABLE}={prebuilt}: no index.html"
        return site
    _build("en")
    _build("zh_CN")
    shutil.rmtree(SITE / "zh", ignore_errors=True)
    shutil.copytree(ZH_BUILD / "_build" / "html", SITE / "zh")
    return SITE


def chapter_flipped(notebook: str) -> set[str]:
    """The names in a chapter's ``FLIPPED = {...}`` (``notebook`` relative to the repository
    root): the held-out verdicts the chapter reports as not kept. ``FLIPPED = set()`` is the
    empty set; any other call is refused, so that the tests read a literal."""
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and "FLIPPED =" in source:
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "FLIPPED":
                    value = node.value
                    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "set":
                        assert not value.args, "FLIPPED = set(...) must be written as a literal"
                        return set()
                    return set(ast.literal_eval(value))
    raise AssertionError(f"{notebook} names no FLIPPED set")
