"""Chapters run where readers run them: from the installed wheel, each alone in an empty folder.

`make test` builds the wheel, installs it (not editable) into ``_build/reader/site`` and copies each
chapter into an empty folder of its own; strict nbval then executes those copies with only the
installed package on the path, as on Colab. These tests check that set-up itself, so a notebook
cannot pass by reading something from the repository.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import (
    COLLECTED_NOTEBOOKS,
    FULL_RUN,
    NOTEBOOK_NEIGHBOURS,
    READER_SITE_VARIABLE,
    ROOT,
    toc_notebooks,
)

from rope_tutor.results import available

READER_SITE = os.environ.get(READER_SITE_VARIABLE)
needs_reader = pytest.mark.skipif(
    not READER_SITE, reason=f"`make test` sets {READER_SITE_VARIABLE} (the installed wheel)"
)


@needs_reader
def test_an_empty_folder_imports_the_installed_wheel(tmp_path: Path) -> None:
    """What a notebook kernel sees: started in an empty folder, it imports the wheel's package,
    and every saved result the chapters load is inside that installation."""
    probe = (
        "import json, rope_tutor; from rope_tutor import results; "
        "print(json.dumps([rope_tutor.__file__, results.available()]))"
    )
    env = {**os.environ, "PYTHONPATH": READER_SITE}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    location, shipped = json.loads(out.stdout)
    assert Path(location).resolve().is_relative_to(Path(READER_SITE).resolve()), location
    assert shipped == available() and shipped, "the wheel lacks saved results the repository has"


@needs_reader
def test_the_wheel_is_not_an_editable_install() -> None:
    wheels = sorted((Path(READER_SITE).parent / "dist").glob("rope_tutor-*.whl"))
    assert len(wheels) == 1, wheels
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "rope_tutor/rope.py" in names
    assert not any(name.endswith(".pth") for name in names), "an editable wheel"
    for result in available():
        assert f"rope_tutor/results/{result}" in names, f"{result} is not in the wheel"


@needs_reader
def test_every_chapter_ran_alone_in_an_empty_folder(request: pytest.FixtureRequest) -> None:
    neighbours = request.config.stash.get(NOTEBOOK_NEIGHBOURS, {})
    collected = request.config.stash.get(COLLECTED_NOTEBOOKS, set())
    if request.config.stash.get(FULL_RUN, False):
        assert collected == set(toc_notebooks()), "make test must run every chapter"
    in_repository = [p for p in neighbours if Path(p).resolve().is_relative_to(ROOT / "book")]
    assert not in_repository, f"chapters executed inside the repository: {in_repository}"
    crowded = {path: files for path, files in neighbours.items() if files}
    assert not crowded, f"chapters that did not run alone in an empty folder: {crowded}"
