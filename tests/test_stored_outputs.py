"""Stored notebook outputs that nbval compares must not depend on the CPU.

A floating-point residual (the difference between two computations that agree in exact arithmetic,
such as ``5.6e-16``) changes with the CPU's vector width, the thread count and the BLAS, so a
notebook that prints one passes strict nbval on one machine and fails on another. Cells print the
bound they asserted instead (``max gap < 1e-12``). This test scans every stored output.
"""

from __future__ import annotations

import json
import re

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


def _text_outputs(cell: dict) -> list[str]:
    texts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            texts.append("".join(output["text"]))
        plain = output.get("data", {}).get("text/plain")
        if plain:
            texts.append("".join(plain))
    return texts


@pytest.mark.parametrize("notebook", toc_notebooks())
def test_no_stored_output_prints_a_floating_point_residual(notebook: str) -> None:
    cells = json.loads((ROOT / notebook).read_text(encoding="utf-8"))["cells"]
    offenders = []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if "NBVAL_IGNORE_OUTPUT" in source or "NBVAL_SKIP" in source:
            continue  # nbval does not compare this cell
        for text in _text_outputs(cell):
            offenders += [f"cell {index}: {number}" for number in residuals(text)]
    assert not offenders, (
        f"{notebook} prints floating-point residuals, which differ between CPUs; print the "
        f"asserted bound instead (e.g. 'max gap < 1e-12'): {offenders}"
    )
