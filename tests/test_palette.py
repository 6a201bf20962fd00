"""The book's palette: every arm of the saved lab results has one colour and one human name.

Checked against the saved results themselves (the keys the lab wrote), not against a list copied
from the palette, and against matplotlib's own colour parser.
"""

from __future__ import annotations

import re

import matplotlib.colors as mcolors
import pytest

from rope_tutor import lab
from rope_tutor.palette import ARMS, VERDICTS, style

LAB_FILES = ("train_short_test_long.json", "extend_rope.json", "needle.json")


def _arm_groups() -> dict[str, list[str]]:
    """Each set of arms the saved results hold side by side (one set per table or figure)."""
    groups: dict[str, list[str]] = {}
    for name in LAB_FILES:
        results = lab.load_results(f"seed_0/{name}")
        if "arms" in results:
            groups[name] = list(results["arms"])
        else:  # extend_rope.json: inference arms, then the fine-tuned ones beside plain RoPE
            groups[f"{name}:inference"] = list(results["inference"])
            groups[f"{name}:finetuned"] = ["rope", *results["finetuned"]]
    return groups


GROUPS = _arm_groups()


def test_every_saved_arm_has_a_style() -> None:
    keys = [key for group in GROUPS.values() for key in group]
    assert len(keys) >= 25  # the three files were read, not an empty list
    for key in keys:
        entry = style(key)
        assert set(entry) == {"color", "label"}
        assert mcolors.is_color_like(entry["color"])
        # a human name, never the code name: no underscores, no "rope+" prefix
        assert "_" not in entry["label"] and "+" not in entry["label"], (key, entry)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_colours_distinct_within_each_group(group: str) -> None:
    keys = GROUPS[group]
    colours = [mcolors.to_hex(style(k)["color"]) for k in keys]
    labels = [style(k)["label"] for k in keys]
    assert len(set(colours)) == len(keys), dict(zip(keys, colours, strict=True))
    assert len(set(labels)) == len(keys), dict(zip(keys, labels, strict=True))


def test_chapter_10_methods_distinct() -> None:
    keys = ["linear", "ntk", "dynamic", "yarn", "llama3", "longrope"]
    assert len({style(k)["color"] for k in keys}) == len(keys)


def test_aliases_share_the_arm() -> None:
    assert style("rope+pi") == style("pi") == style("linear")
    assert style("rope+dynamic_ntk") == style("dynamic")
    assert style("rope+pi_finetuned") == style("finetune_pi")
    assert style("yarn")["color"] == style("yarn_paper_beta")["color"]


def test_only_yarn_variants_share_a_colour() -> None:
    by_colour: dict[str, list[str]] = {}
    for key, (_, colour) in ARMS.items():
        by_colour.setdefault(colour.upper(), []).append(key)
    shared = [keys for keys in by_colour.values() if len(keys) > 1]
    assert shared == [["yarn", "yarn_paper_beta"]]


@pytest.mark.parametrize("bad", ["yarn_paper", "RoPE", "", 3, None])
def test_unknown_key_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
        style(bad)  # type: ignore[arg-type]


def test_verdict_colours_distinct_and_not_an_arm() -> None:
    assert set(VERDICTS) == {"better", "tie", "worse"}  # the verdicts lab.stats.verdict returns
    colours = [mcolors.to_hex(c).upper() for c in VERDICTS.values()]
    assert len(set(colours)) == 3
    arm_colours = {colour.upper() for _, colour in ARMS.values()}
    assert not arm_colours & set(colours)
    for colour in colours:  # black text on it reaches WCAG AAA contrast, 7:1: luminance above 0.3
        r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
                   for c in mcolors.to_rgb(colour))
        assert 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.3, colour
