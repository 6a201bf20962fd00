"""How the figures of chapter "A real model past its window" draw each arm.

Chapter "A real model past its window" (``13b_real_model``) and its evidence page draw the same
arms (the unscaled model, PI, static and dynamic NTK, YaRN with and without its temperature,
Llama 3) in many figures; ``style``, ``line_style`` and ``label`` give each arm one colour, one
line style and one legend name on both pages. Colours and names come from ``rope_tutor.palette``;
the chapter's own choices on top of it:

- the unscaled model is plain RoPE (the palette's ``"rope"``, black), named "unscaled (RoPE as
  trained)";
- YaRN without its temperature takes a lighter shade of YaRN's colour, ``0.45 c + 0.55`` per RGB
  channel (mixed with white), and is drawn dotted, so that the two YaRN arms part at print size;
- static NTK is named "static NTK (NTK-aware)": the chapter's name first, the papers' after it;
- the arms whose curves lie on top of each other differ in line style (``LINE_STYLES``).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from matplotlib.colors import to_rgb

from rope_tutor import palette

__all__ = ["LINE_STYLES", "label", "line_style", "style"]

#: Arm -> matplotlib line style; dynamic NTK's is a dash-dot-dot pattern (offset, on-off lengths).
LINE_STYLES: MappingProxyType[str, Any] = MappingProxyType(
    {
        "none": "-",
        "pi": "-",
        "ntk": "-",
        "yarn": "--",
        "yarn_no_temperature": ":",
        "llama3": "-.",
        "dynamic_ntk": (0, (6, 2, 1, 2, 1, 2)),
    }
)


def style(method: str) -> dict[str, Any]:
    """Colour (``"color"``: a hex string, or an RGB tuple in [0, 1] for YaRN without its
    temperature) and human name (``"label"``) of an arm, as keyword arguments of a curve.

    Raises ``ValueError`` for an arm the palette does not know.
    """
    if method == "none":
        return {**palette.style("rope"), "label": "unscaled (RoPE as trained)"}
    if method == "yarn_no_temperature":
        lighter = tuple(0.45 * c + 0.55 for c in to_rgb(palette.style("yarn")["color"]))
        return {"color": lighter, "label": "YaRN without its temperature"}
    if method == "ntk":
        return {**palette.style("ntk"), "label": "static NTK (NTK-aware)"}
    return palette.style(method)


def line_style(method: str) -> Any:
    """Line style of an arm (``LINE_STYLES``); raises ``ValueError`` naming an unknown arm."""
    if method not in LINE_STYLES:
        raise ValueError(f"no line style for method={method!r}; known: {sorted(LINE_STYLES)}")
    return LINE_STYLES[method]


def label(method: str, s: float) -> str:
    """The arm's legend name with its factor, ``"YaRN, s = 2"``; the unscaled model and dynamic
    NTK (which sets its own factor from the length) have none."""
    name = style(method)["label"]
    return name if method in ("none", "dynamic_ntk") else f"{name}, s = {s:g}"
