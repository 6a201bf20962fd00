"""Stored notebook outputs that nbval compares must not depend on the CPU.

A floating-point residual (the difference between two computations that agree in exact arithmetic,
such as ``5.6e-16``) changes with the CPU's vector width, the thread count and the BLAS, so a
notebook that prints one passes strict nbval on one machine and fails on another. Cells print the
bound they asserted instead (``max gap < 1e-12``). This test scans every stored output.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess

import pytest
from conftest import ROOT, toc_notebooks

#: A number written in scientific notation whose magnitude is below 1e-6 (``8.9e-16``, ``3E-08``,
#: ``1.2e-7``). An asserted bound is allowed: the number follows ``<``, ``≤``, ``<=`` or ``below``.
TINY = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[eE]-0*(\d+)\b")
BOUND_BEFORE = re.compile(r"(<|≤|<=|below|under|tol(erance)?[ =:]*)\s*$", re.IGNORECASE)


def residuals(text: str) -> list[str]:
    """The residual-like numbers printed in ``text`` (numbers below 1e-6 that are not bounds)."""
    found = []
    for match in TINY.finditer(text):
        mantissa, exponent = float(match.group(1)), int(match.group(2))
        if mantissa == 0 or mantissa * 10.0 ** (-exponent) >= 1e-6:
            continue
        if BOUND_BEFORE.search(text[max(0, match.start() - 12) : match.start()]):
            continue
        found.append(match.group(0))
    return found


def test_residual_detector() -> None:
    assert residuals("max gap 5.6e-16") == ["5.6e-16"]
    assert residuals("error 3E-08, ratio 1.5e-3") == ["3E-08"]
    assert residuals("max gap < 1e-12") == []
    assert residuals("agree (max error ≤ 1e-6)") == []
    assert residuals("learning rate 3e-4, tolerance 1e-9") == []
    assert residuals("weight decay 1e-2") == []


#: A decimal number with 8 or more significant digits (``0.9452835321426392``, ``54410.142261``):
#: the full-precision repr of a computed float, whose last digits differ between CPUs. Numbers the
#: book rounds (``0.95``, ``1.98551``) and integers (``786432``) have fewer.
LONG_FLOAT = re.compile(r"(?<![\w.])-?(\d+)\.(\d+)(?:[eE][-+]?\d+)?(?![\w.])")
FULL_PRECISION_DIGITS = 8


def full_precision_floats(text: str) -> list[str]:
    """The numbers in ``text`` printed at full precision (8 or more significant digits)."""
    return [
        match.group(0)
        for match in LONG_FLOAT.finditer(text)
        if len((match.group(1) + match.group(2)).lstrip("0")) >= FULL_PRECISION_DIGITS
    ]


def test_full_precision_detector() -> None:
    assert full_precision_floats("0.9452835321426392") == ["0.9452835321426392"]
    assert full_precision_floats("-0.283181090816 and 54410.14313077675") == [
        "-0.283181090816",
        "54410.14313077675",
    ]
    assert full_precision_floats("0.12890625") == ["0.12890625"]
    assert full_precision_floats("0.95, 1.98551, 786432, 54,410, v0.2.0, 3e-4") == []
    assert full_precision_floats("1.2345678") == ["1.2345678"]  # 8 significant digits
    assert full_precision_floats("0.0012345678") == ["0.0012345678"]
    assert full_precision_floats("0.001234567") == []  # 7 significant digits


#: Where strict nbval finds text to compare: printed streams, plain-text results, and the records
#: that myst-nb's glue stores for the prose (``application/papermill.record/text/plain``).
PLAIN_TEXT_KEYS = ("text/plain", "application/papermill.record/text/plain")


def _text_outputs(cell: dict) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            texts.append("".join(output["text"]))
        for key in PLAIN_TEXT_KEYS:
            plain = output.get("data", {}).get(key)
            if plain:
                texts.append("".join(plain))
    return texts


def compared_outputs(notebook: str) -> list[tuple[int, str]]:
    """``(cell index, text)`` for every stored output that strict nbval compares."""
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    found = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if "NBVAL_IGNORE_OUTPUT" in source or "NBVAL_SKIP" in source:
            continue  # nbval does not compare this cell
        found += [(index, text) for text in _text_outputs(cell)]
    return found


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_no_stored_output_prints_a_floating_point_residual(notebook: str) -> None:
    offenders = [
        f"cell {index}: {number}"
        for index, text in compared_outputs(notebook)
        for number in residuals(text)
    ]
    assert not offenders, (
        f"{notebook} prints floating-point residuals, which differ between CPUs; print the "
        f"asserted bound instead (e.g. 'max gap < 1e-12'): {offenders}"
    )


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_no_stored_output_or_glue_holds_a_full_precision_float(notebook: str) -> None:
    """A full-precision float in a stored output, a glued value included, is compared digit by
    digit by strict nbval, and its last digits change with the CPU (issue 22: the glued
    ``0.9452835321426392`` of chapter 2 came out ``0.9452831745147705`` on an AMD EPYC)."""
    offenders = [
        f"cell {index}: {number}"
        for index, text in compared_outputs(notebook)
        for number in full_precision_floats(text)
    ]
    assert not offenders, (
        f"{notebook} stores full-precision floats, which differ between CPUs; glue or print the "
        f"number rounded to the digits the text shows (glue(name, round(value, 2), ...)): "
        f"{offenders}"
    )


#: The repr of an array-library scalar or tensor: glued, it would print in the prose as is.
LIBRARY_REPR = re.compile(r"^(np\.\w+\(|numpy\.\w+\(|tensor\()")


def test_library_repr_detector() -> None:
    assert LIBRARY_REPR.match("np.float64(0.86)") and LIBRARY_REPR.match("tensor(3.)")
    assert not LIBRARY_REPR.match("0.86") and not LIBRARY_REPR.match("'[0.72, 1.00]'")


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_no_glued_value_is_a_numpy_or_torch_scalar(notebook: str) -> None:
    """A glued numpy or torch scalar renders in the prose as its repr ("np.float64(0.86)"); glue
    a Python number or a formatted string (chapter 13b's Wilson bound did this once)."""
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    offenders = [
        f"{output['metadata']['scrapbook']['name']}: {plain}"
        for cell in cells
        for output in cell.get("outputs", [])
        if (plain := "".join(output.get("data", {}).get(PLAIN_TEXT_KEYS[1], "")))
        and LIBRARY_REPR.match(plain)
    ]
    assert not offenders, f"{notebook} glues array-library scalars: {offenders}"


# -- the dynamic check: outputs stored on one vector code path, compared on another ---------------

X86 = platform.machine().lower() in ("x86_64", "amd64")
AVX2_PINS = ("ATEN_CPU_CAPABILITY=avx2", "MKL_ENABLE_INSTRUCTIONS=AVX2", "ONEDNN_MAX_CPU_ISA=AVX2")


def _dry_run(*target: str) -> str:
    result = subprocess.run(
        ["make", "-n", *target], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.replace("\\\n", " ")  # one line per command


@pytest.mark.skipif(not X86 or shutil.which("make") is None, reason="AVX2 pins are x86-64 only")
def test_make_test_compares_on_avx2_what_make_execute_stored_unpinned() -> None:
    pytest_line = next(line for line in _dry_run("test").splitlines() if "-m pytest" in line)
    assert all(pin in pytest_line for pin in AVX2_PINS), pytest_line
    execute = "\n".join(
        line for line in _dry_run("execute", "NB=book/00_preface.ipynb").splitlines()
        if "nbconvert" in line
    )
    for variable in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"):
        assert f"-u {variable}" in execute, execute


@pytest.mark.skipif(os.environ.get("ROPE_TUTOR_FULL_RUN") != "1" or not X86, reason="make test")
def test_this_run_of_make_test_is_on_the_avx2_code_path() -> None:
    import torch

    assert os.environ.get("ATEN_CPU_CAPABILITY") == "avx2"
    # AVX2, or less on a CPU without it (then the stored outputs' path was no wider either)
    assert torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT", "NO AVX")
