"""rope_tutor.real.arms: one colour, line style and name per arm on chapter 13b's two pages."""

from __future__ import annotations

import pytest

from rope_tutor import palette
from rope_tutor.real import arms


def test_the_chapter_names_and_colours() -> None:
    assert arms.style("none") == {
        "color": palette.style("rope")["color"],
        "label": "unscaled (RoPE as trained)",
    }
    assert arms.style("ntk") == {
        "color": palette.style("ntk")["color"],
        "label": "static NTK (NTK-aware)",
    }
    assert arms.style("yarn") == palette.style("yarn")  # the others are the palette's
    # YaRN without its temperature: YaRN's colour mixed with white, 0.45 c + 0.55 per channel
    hex_colour = palette.style("yarn")["color"].lstrip("#")
    rgb = [int(hex_colour[i : i + 2], 16) / 255 for i in (0, 2, 4)]
    lighter = arms.style("yarn_no_temperature")["color"]
    assert lighter == pytest.approx([0.45 * c + 0.55 for c in rgb])
    assert all(x > c for x, c in zip(lighter, rgb, strict=True))  # lighter on every channel


def test_labels_and_line_styles() -> None:
    assert arms.label("yarn", 2.0) == "YaRN, s = 2"
    assert arms.label("ntk", 1.5) == "static NTK (NTK-aware), s = 1.5"
    assert arms.label("none", 4.0) == "unscaled (RoPE as trained)"  # no factor
    assert arms.label("dynamic_ntk", 1.0) == palette.style("dynamic_ntk")["label"]
    # the two YaRN arms and the arms drawn on top of one another differ in line style
    assert arms.line_style("yarn") != arms.line_style("yarn_no_temperature")
    assert len({str(arms.line_style(m)) for m in ("ntk", "yarn", "llama3", "dynamic_ntk")}) == 4
    with pytest.raises(ValueError, match="method='alibi'"):
        arms.line_style("alibi")
    with pytest.raises(ValueError, match="bogus"):
        arms.style("bogus")
