"""The figures of the Chinese edition (rope_tutor.figures): drawn from the translation, no English
word left but names, no glyph missing, and each edition shown its own picture."""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import re
import sys
from collections import Counter
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.ft2font import FT2Font  # noqa: E402

from rope_tutor import figures  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
LANGUAGE = "zh_CN"
_MATH = re.compile(r"(?<!\\)\$.*?(?<!\\)\$")


def _languages_extension():
    spec = importlib.util.spec_from_file_location("languages", BOOK / "_ext" / "languages.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("languages", module)
    spec.loader.exec_module(module)
    return module


def _figure_outputs(notebook: dict) -> list[dict]:
    return [
        output
        for cell in notebook["cells"]
        if cell["cell_type"] == "code"
        for output in cell.get("outputs", [])
        if "image/png" in output.get("data", {}) or figures.FIGURE_MIME in output.get("data", {})
    ]


def _font_charmap() -> set[int]:
    """The characters the translated figures can draw: the language's font, then DejaVu Sans."""
    family = figures._font_family(LANGUAGE)
    entry = next(e for e in font_manager.fontManager.ttflist if e.name == family)
    characters = set(FT2Font(entry.fname, face_index=getattr(entry, "index", 0)).get_charmap())
    fallback = font_manager.findfont("DejaVu Sans", fallback_to_default=False)
    return characters | set(FT2Font(fallback).get_charmap())


# --- the words: what counts as English, and the catalogue ---------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("dynamic NTK, $s_d$ = 2", ["dynamic"]),
        ("YaRN, paper's β (32, 1)", ["paper's"]),
        (r"slow-down $s_i = \theta_i / \theta'_i$ (times)", ["slow-down", "times"]),
        ("RoPE", []),
        ("2L", []),
        ("$d_h$ = 128, L1 error", ["error"]),
        ("位置（词元）", []),
        ("位置（token）", ["token"]),
        ("动态 NTK，$s_d$ = 2", []),
        ("in", ["in"]),
        ("copy_ and torch.compile, 3.6e-04 s", ["and"]),
        ("β_fast = 32 (turns)", ["turns"]),
    ],
)
def test_english_words(text: str, words: list[str]) -> None:
    assert figures.english_words(text) == words


def test_an_unknown_language_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(figures.LANGUAGES_VARIABLE, "zh_CN,fr")
    with pytest.raises(ValueError, match="ROPE_TUTOR_FIGURE_LANGUAGES='zh_CN,fr'.*'fr'"):
        figures.requested_languages()
    monkeypatch.setenv(figures.LANGUAGES_VARIABLE, "")
    assert figures.requested_languages() == ()


def test_the_catalogue_files_agree_and_each_text_is_used() -> None:
    from babel.messages.pofile import read_po

    seen: Counter[str] = Counter()
    for path in figures.catalogue_files(LANGUAGE):
        with path.open("rb") as handle:
            seen.update(m.id for m in read_po(handle) if m.id)
    assert not [text for text, n in seen.items() if n > 1], "a text in two catalogue files"
    shown = {
        english
        for chapter in CHAPTERS
        for english, _ in figures.stored_words(json.loads(chapter.read_text()), LANGUAGE)
    }
    shown |= set(_intro_figure_words())
    assert sorted(set(seen) - shown) == [], "catalogue texts no figure shows any more"


# --- drawing ------------------------------------------------------------------------------------


def _figure():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4], label="dynamic NTK, $s_d$ = 2")
    ax.set_xticks([1, 2], labels=["short", "long"])
    ax.set_xlabel("position (tokens)")
    ax.set_title("How far it turns")
    ax.legend()
    return fig


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def test_a_figure_is_drawn_with_its_words_translated_and_left_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    words = {
        "dynamic NTK, $s_d$ = 2": "动态 NTK，$s_d$ = 2",
        "short": "短",
        "position (tokens)": "位置（词元）",
        "How far it turns": "转过多远",
    }
    monkeypatch.setattr(figures, "catalogue", lambda language: words)
    fig = _figure()
    before = _png(fig)
    picture, pairs = figures.translate_figure(fig, LANGUAGE)
    assert _png(fig) == before  # the English figure is untouched
    assert pairs == sorted([[en, words.get(en)] for en in [*words, "long"]])  # "long": untranslated
    assert base64.b64decode(picture).startswith(b"\x89PNG")
    assert fig.axes[0].get_xticklabels()[0].get_text() == "short"
    plt.close(fig)


def test_a_glyph_missing_from_the_font_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(figures, "catalogue", lambda language: {"How far it turns": "\U00013000"})
    fig = _figure()
    with pytest.raises(RuntimeError, match="missing from font"):
        figures.translate_figure(fig, LANGUAGE)
    plt.close(fig)


def test_a_shown_figure_carries_its_translation_in_ipython(monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    monkeypatch.setattr(figures, "catalogue", lambda language: {"How far it turns": "转过多远"})
    assert figures.register_translations((LANGUAGE,))
    fig = _figure()
    data, metadata = shell.display_formatter.format(fig)
    assert ["How far it turns", "转过多远"] in data[figures.FIGURE_MIME][LANGUAGE]
    picture = base64.b64decode(metadata[figures.FIGURE_MIME][LANGUAGE]["image/png"])
    assert picture.startswith(b"\x89PNG") and picture != _png(fig)
    plt.close(fig)
    del shell.display_formatter.formatters[figures.FIGURE_MIME]


# --- the stored figures of every chapter --------------------------------------------------------


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.stem for c in CHAPTERS])
def test_every_figure_of_the_chapter_has_its_chinese_picture_and_words(chapter: Path) -> None:
    """Every label of every Chinese figure comes from the translation: no text left untranslated,
    no English word in a translation but names, the same math, and every glyph in the font."""
    notebook = json.loads(chapter.read_text(encoding="utf-8"))
    outputs = _figure_outputs(notebook)
    charmap = _font_charmap()
    problems = []
    for number, output in enumerate(outputs, 1):
        entry = output["data"].get(figures.FIGURE_MIME, {}).get(LANGUAGE)
        picture = output.get("metadata", {}).get(figures.FIGURE_MIME, {}).get(LANGUAGE, {})
        mime = "image/png" if "image/png" in output["data"] else "text/html"  # or an animation
        if entry is None or mime not in picture:
            problems.append(f"figure {number}: no {LANGUAGE} picture (make execute NB={chapter})")
            continue
        if picture[mime] == output["data"][mime]:
            problems.append(f"figure {number}: the {LANGUAGE} picture is the English one")
        for english, translation in entry:
            if translation is None:
                problems.append(f"figure {number}: untranslated {english!r}")
                continue
            if figures.english_words(translation):
                problems.append(f"figure {number}: English words left in {translation!r}")
            if sorted(_MATH.findall(english)) != sorted(_MATH.findall(translation)):
                problems.append(f"figure {number}: the math differs in {translation!r}")
            text = _MATH.sub("", translation)
            absent = sorted({c for c in text if ord(c) > 127 and ord(c) not in charmap})
            if absent:
                problems.append(f"figure {number}: no glyph for {absent} in {translation!r}")
    assert not problems, "\n".join(problems)


def test_each_edition_is_shown_its_own_figure() -> None:
    languages = _languages_extension()
    notebook = json.loads((BOOK / "09_ntk_aware.ipynb").read_text(encoding="utf-8"))
    english = [o for o in _figure_outputs(notebook) if "image/png" in o["data"]]
    originals = [o["data"]["image/png"] for o in english]
    pictures = [o["metadata"][figures.FIGURE_MIME][LANGUAGE]["image/png"] for o in english]
    chinese = json.loads(json.dumps(notebook))
    assert languages.figures_of_edition(chinese, LANGUAGE) == len(originals)
    assert [o["data"]["image/png"] for o in _figure_outputs(chinese)] == pictures
    assert languages.figures_of_edition(notebook, "en") == 0
    assert [o["data"]["image/png"] for o in _figure_outputs(notebook)] == originals
    for edition in (notebook, chinese):  # no page is left the entry itself
        for output in _figure_outputs(edition):
            assert figures.FIGURE_MIME not in output["data"]
            assert figures.FIGURE_MIME not in output.get("metadata", {})


# --- the landing page's figure ------------------------------------------------------------------


def _intro_module():
    spec = importlib.util.spec_from_file_location("intro", BOOK / "images" / "make_intro_figure.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _intro_figure_words() -> list[str]:
    fig = _intro_module().draw()
    _, pairs = figures.translate_figure(fig, LANGUAGE, dpi=20, bbox_inches=None)
    plt.close(fig)
    return [english for english, _ in pairs]


def test_the_landing_figure_has_a_chinese_twin() -> None:
    module = _intro_module()
    assert module.TWIN.is_file() and module.TWIN.read_bytes() != module.OUT.read_bytes()
    assert module.TWIN.name == f"intro_rope_and_scaling.{LANGUAGE}.png"  # figure_language_filename
    words = figures.catalogue(LANGUAGE)
    assert not [w for w in _intro_figure_words() if w not in words]


def test_an_animation_carries_its_translated_player(monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    from matplotlib.animation import FuncAnimation

    import rope_tutor as rt

    InteractiveShell.instance()
    monkeypatch.setattr(figures, "catalogue", lambda language: {"feature one": "特征一"})
    monkeypatch.setenv(figures.LANGUAGES_VARIABLE, LANGUAGE)
    fig, ax = plt.subplots(figsize=(2, 2), dpi=30)
    ax.set_xlabel("feature one")
    (line,) = ax.plot([], [])
    animation = FuncAnimation(fig, lambda t: line.set_data([0, t], [0, t]), frames=2)
    with capture_output() as captured:
        rt.show_animation(animation, "a line grows", fig=fig)
    (output,) = captured.outputs
    assert output.data[figures.FIGURE_MIME] == {LANGUAGE: [["feature one", "特征一"]]}
    player = output.metadata[figures.FIGURE_MIME][LANGUAGE]["text/html"]
    assert 'alt="a line grows"' in player and player != output.data["text/html"]
    assert ax.get_xlabel() == "feature one"
    with pytest.raises(TypeError, match="fig="):
        rt.show_animation(animation, "a line grows", fig=ax)
    plt.close(fig)


def test_new_figure_texts_go_to_their_chapter_or_to_common(tmp_path: Path) -> None:
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po, write_po

    def notebook(name: str, pairs: list[list[str | None]]) -> Path:
        output = {"output_type": "display_data", "metadata": {}, "data": {
            "image/png": "", figures.FIGURE_MIME: {LANGUAGE: pairs}}}
        path = tmp_path / f"{name}.ipynb"
        path.write_text(json.dumps({"cells": [{"cell_type": "code", "outputs": [output]}]}))
        return path

    folder = tmp_path / "locale"
    folder.mkdir()
    known = Catalog(locale=LANGUAGE)
    known.add("key position", "键的位置")
    known.add("gone", "已删除")
    with (folder / "common.po").open("wb") as handle:
        write_po(handle, known)
    first = notebook("01_a", [["key position", "键的位置"], ["shared", None], ["only a", None]])
    second = notebook("02_b", [["shared", None], ["only b", None]])
    report = figures.update_catalogues([first, second], LANGUAGE, folder)
    expected = {"01_a": ["only a"], "common": ["shared"], "02_b": ["only b"], "unused": ["gone"]}
    assert report == expected
    common = read_po((folder / "common.po").open("rb"))
    assert common["key position"].string == "键的位置" and common["shared"].string == ""
    assert [m.id for m in read_po((folder / "01_a.po").open("rb")) if m.id] == ["only a"]
