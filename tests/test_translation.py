"""The Chinese edition (issue 16): every message of the chapters and prose pages is translated.

Sphinx's gettext builder (`make gettext`) extracts each page's messages (paragraphs, headings, list
items, table cells, captions, figure alt texts; not code cells or their outputs) and sphinx-intl
keeps one catalogue per page in ``locales/zh_CN/LC_MESSAGES/<docname>.po`` (`make locales`). The
Chinese site (`make book-zh`) shows the English message wherever a translation is missing or
fuzzy, so these tests fail on any such message, page by page.

NOTE (branch zh, issue 16): ``test_every_message_is_translated`` FAILS on purpose until the
translators finish: only ``book/intro`` and the glossary's term table are translated so far. Do not
weaken it; translate the pages it lists.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po
from conftest import ROOT, toc_files, toc_notebooks

LOCALE = ROOT / "locales" / "zh_CN" / "LC_MESSAGES"
#: Pages whose messages may stay English: the API reference is generated from the package's
#: docstrings (the page says so in the Chinese edition; that one sentence is translated).
EXEMPT = {"book/api"}
#: What must survive translation unchanged: glued numbers, equation and citation references, math.
KEPT = re.compile(r"\{(?:glue(?::\w+)?|eq|cite(?::\w+)?|numref|ref)\}`[^`]*`|\$\$?[^$]+\$\$?")


#: A Chinese character (CJK Unified Ideographs): a translated alt text holds some.
CHINESE = re.compile(r"[\u4e00-\u9fff]")
IMAGE_TYPES = ("image/png", "image/svg+xml", "image/jpeg", "image/gif")


def figure_alt_texts(notebook: dict) -> list[tuple[int, str]]:
    """(cell index, alt text) of every code cell whose outputs draw an image; the alt text is the
    cell's ``"mystnb": {"image": {"alt": ...}}`` metadata, "" where it has none."""
    found = []
    for index, cell in enumerate(notebook["cells"]):
        outputs = cell.get("outputs", [])
        if any(mime in out.get("data", {}) for out in outputs for mime in IMAGE_TYPES):
            alt = cell["metadata"].get("mystnb", {}).get("image", {}).get("alt", "")
            found.append((index, str(alt).strip()))
    return found


def untranslated_alt_texts(notebook: dict, cat: Catalog) -> list[str]:
    """The figures of a notebook without an alt text, or whose alt text is not a message of the
    page's catalogue, or whose translation is missing, fuzzy or holds no Chinese character."""
    report = []
    for index, alt in figure_alt_texts(notebook):
        message = cat.get(alt) if alt else None
        if not alt:
            report.append(f"cell {index}: no alt text")
        elif message is None:
            report.append(f"cell {index}: alt text not in the catalogue (run `make locales`)")
        elif message.fuzzy or not CHINESE.search(str(message.string or "")):
            report.append(f"cell {index}: alt text not translated: {alt[:60]!r}")
    return report


def docnames() -> list[str]:
    return [str(Path(name).with_suffix("")) for name in toc_files()]


def catalog(docname: str) -> Catalog:
    with open(LOCALE / f"{docname}.po", "rb") as handle:
        return read_po(handle)


def missing(cat: Catalog) -> tuple[list[str], list[str]]:
    """The untranslated and the fuzzy messages of a catalogue (the header excepted)."""
    untranslated = [str(m.id) for m in cat if m.id and not (m.string or "").strip()]
    fuzzy = [str(m.id) for m in cat if m.id and m.fuzzy and (m.string or "").strip()]
    return untranslated, fuzzy


def changed_markup(cat: Catalog) -> list[str]:
    """Translated messages whose glued values, references or math differ from the English."""
    return [
        str(m.id)
        for m in cat
        if m.id and m.string and sorted(KEPT.findall(m.id)) != sorted(KEPT.findall(m.string))
    ]


def test_every_page_has_a_catalogue() -> None:
    absent = [name for name in docnames() if not (LOCALE / f"{name}.po").exists()]
    assert not absent, f"no .po file for {absent}: run `make locales`"


def test_every_message_is_translated() -> None:
    # Fails on branch zh until the translation is finished (see the module docstring).
    report, total = [], 0
    for name in docnames():
        if name in EXEMPT:
            continue
        untranslated, fuzzy = missing(catalog(name))
        if untranslated or fuzzy:
            total += len(untranslated) + len(fuzzy)
            first = (untranslated + fuzzy)[0][:70]
            report.append(
                f"{name}: {len(untranslated)} untranslated, {len(fuzzy)} fuzzy (first: {first!r})"
            )
    assert not report, f"{total} messages left to translate:\n" + "\n".join(report)


def test_every_figure_alt_text_is_in_the_catalogue_and_translated() -> None:
    """myst-nb sets a figure's alt text from its cell's metadata after Sphinx's gettext builder
    would have seen it; book/_ext/languages.py makes it a message of the page. Each figure needs an
    alt text, in its page's .po file, translated into Chinese."""
    report, figures = [], 0
    for name in toc_notebooks():
        notebook = json.loads((ROOT / name).read_text(encoding="utf-8"))
        figures += len(figure_alt_texts(notebook))
        docname = str(Path(name).with_suffix(""))
        missing_alts = untranslated_alt_texts(notebook, catalog(docname))
        report += [f"{docname}: {line}" for line in missing_alts]
    assert figures > 0, "no figure found in the chapters: the test looks in the wrong place"
    assert not report, "figure alt texts to write or translate:\n" + "\n".join(report)


def test_translations_keep_glue_references_and_math() -> None:
    report = [
        f"{name}: {message[:80]!r}"
        for name in docnames()
        for message in changed_markup(catalog(name))
    ]
    assert not report, (
        "translations that changed a glued value, a reference or math:\n" + "\n".join(report)
    )


def test_the_checks_can_fail() -> None:
    cat = Catalog(locale="zh_CN")
    cat.add("Done.", "完成。")
    cat.add("Left to do.", "")
    cat.add("Changed since.", "改了。", flags=["fuzzy"])
    cat.add("The gap is {glue:text}`gap:.2f` at $m = 0$.", "差距在 $m = 0$ 处为 {glue:text}`gap`。")
    cat.add("See {eq}`rope` and $x$.", "见 {eq}`rope` 和 $x$。")
    assert missing(cat) == (["Left to do."], ["Changed since."])
    assert changed_markup(cat) == ["The gap is {glue:text}`gap:.2f` at $m = 0$."]
    cat.add("A red line.", "一条红线。")
    cat.add("A blue line.", "A blue line.")
    cat.add("A green line.", "一条绿线。", flags=["fuzzy"])
    png = {"outputs": [{"data": {"image/png": "", "text/plain": ""}}]}
    notebook = {
        "cells": [
            {"metadata": {"mystnb": {"image": {"alt": alt}}}, **png}
            for alt in ("A red line.", "A blue line.", "A green line.", "Not extracted.")
        ]
        + [{"metadata": {}, **png}, {"metadata": {}, "outputs": [{"data": {"text/plain": ""}}]}]
    }
    assert [index for index, _ in figure_alt_texts(notebook)] == [0, 1, 2, 3, 4]
    assert [line.split(":")[0] for line in untranslated_alt_texts(notebook, cat)] == [
        "cell 1", "cell 2", "cell 3", "cell 4"
    ]


#: The opening line of a MyST directive fence (```{admonition}, ````{dropdown}, :::{note}).
DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{[a-z-]+\}")


def tables_inside_directives(markdown: str) -> list[str]:
    """The table rows of ``markdown`` that sit inside a directive: the gettext builder extracts no
    message from them, so the Chinese edition would show them in English."""
    fences, rows = [], []
    for line in markdown.split("\n"):
        opening = DIRECTIVE.match(line)
        if opening:
            fences.append(opening.group(1))
        elif fences and line.strip() == fences[-1]:
            fences.pop()
        elif fences and line.lstrip().startswith("|"):
            rows.append(line)
    return rows


def test_no_table_sits_inside_a_directive() -> None:
    report = []
    for name in toc_files():
        path = ROOT / name
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            texts = ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]
        else:
            texts = [path.read_text(encoding="utf-8")]
        rows = [row for text in texts for row in tables_inside_directives(text)]
        report += [f"{name}: {row[:60]}" for row in rows]
    assert not report, "tables inside a directive stay English in the Chinese edition:\n" + (
        "\n".join(report)
    )
    # and the check can fail
    assert tables_inside_directives("```{dropdown} x\n| a | b |\n```\n| c |") == ["| a | b |"]


@pytest.mark.slow
def test_catalogues_hold_the_current_english_text(tmp_path: Path) -> None:
    """Every message of the English text as it is now is in its page's .po file (else the Chinese
    site would show it in English without any test noticing): `make locales` was run."""
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run(
        [
            str(jupyter_book),
            "build",
            str(ROOT),
            "--builder",
            "custom",
            "--custom-builder",
            "gettext",
            "--path-output",
            str(tmp_path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stale = []
    for name in docnames():
        with open(tmp_path / "_build" / "gettext" / f"{name}.pot", "rb") as handle:
            wanted = {m.id for m in read_po(handle) if m.id}
        have = {m.id for m in catalog(name) if m.id}
        if wanted - have:
            stale.append(f"{name}: {len(wanted - have)} new messages")
    assert not stale, "run `make locales` (then translate):\n" + "\n".join(stale)


def test_twin_links_resolve_to_the_same_page_in_the_other_edition() -> None:
    import posixpath

    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        import languages
    finally:
        sys.path.remove(str(ROOT / "book" / "_ext"))
    folders = {"en": "", "zh_CN": "zh/"}
    for docname in ["book/intro", "book/03_sinusoidal", "genindex", "a/b/c"]:
        for here, there in (("en", "zh_CN"), ("zh_CN", "en")):
            page = folders[here] + docname + ".html"
            href = languages.twin_href(docname, here, there)
            landed = posixpath.normpath(posixpath.join(posixpath.dirname(page), href))
            assert landed == folders[there] + docname + ".html", (docname, here, href)
    assert languages.edition(None) == "en" and languages.edition("zh_CN") == "zh_CN"
    with pytest.raises(ValueError, match="ROPE_TUTOR_LANGUAGE='fr'"):
        languages.edition("fr")


# --- One term for one idea: the glossary's table of English and Chinese terms is the authority ---

GLOSSARY = ROOT / "book" / "glossary.md"
FIGURE_CATALOGUES = ROOT / "rope_tutor" / "locale" / "zh_CN"
#: For a term of the glossary's table, the other renderings the Chinese edition once used for the
#: same idea, which no page may use any more (a pattern each, matched outside code and math).
VARIANTS = {
    "调整基频": [r"调整底数频率"],
    "融合内核": [r"融合算子"],
    "实验": [r"实验课"],
    "教师强制": [r"(?i)teacher[- ]forc"],
    "检查器": [r"检验器"],
    "合理性检查": [r"健全性检查"],
    "单元格": [r"代码单元(?!格)"],
    "本包": [r"本书的包", r"配套包"],
    "固定目标协议": [r"固定目标评估"],
    "扩展因子": [r"扩展倍数"],
    "即时执行模式（eager）": [r"eager ?模式"],
}
_CODE_AND_MATH = re.compile(r"`[^`]*`|\$\$?[^$]+\$\$?")


def glossary_terms() -> dict[str, str]:
    """The glossary's table "English and Chinese terms": English -> Chinese."""
    text = GLOSSARY.read_text(encoding="utf-8").split("## English and Chinese terms", 1)[1]
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    rows = [line.strip().strip("|").split("|") for line in lines]
    return {english.strip(): chinese.strip() for english, chinese, _ in rows[1:]}


def all_catalogues() -> dict[str, Catalog]:
    """Every catalogue of the Chinese edition: the pages' and the figures' words."""
    paths = sorted(LOCALE.rglob("*.po")) + sorted(FIGURE_CATALOGUES.glob("*.po"))
    return {str(path.relative_to(ROOT)): read_po(path.open("rb")) for path in paths}


def term_variants_used(catalogues: dict[str, Catalog]) -> list[str]:
    found = []
    for name, cat in catalogues.items():
        for message in cat:
            if not message.id or not message.string or message.string == message.id:
                continue  # a text kept in English (the glossary table's English column)
            text = _CODE_AND_MATH.sub(" ", message.string)
            for term, patterns in VARIANTS.items():
                for pattern in patterns:
                    if re.search(pattern, text):
                        found.append(f"{name}: {pattern!r} for {term} in {message.string[:60]!r}")
    return found


def test_every_term_with_variants_is_in_the_glossary_table() -> None:
    chinese = glossary_terms().values()
    assert [term for term in VARIANTS if not any(term in row for row in chinese)] == []


def test_every_page_and_figure_uses_the_glossary_term() -> None:
    assert term_variants_used(all_catalogues()) == []


def test_the_term_check_can_fail() -> None:
    cat = Catalog(locale="zh_CN")
    cat.add("Fused kernels", "融合算子")
    cat.add("the `eager mode` code", "代码 `eager 模式`")  # inside code: allowed
    cat.add("cell", "下一个代码单元格")
    found = term_variants_used({"test.po": cat})
    assert len(found) == 1 and "融合算子" in found[0]


# --- Emphasis that renders: CommonMark closes ``**`` only where it is "right-flanking" ----------

def literal_asterisks(markdown: str) -> list[str]:
    """The text runs with a ``*`` left over when ``markdown`` is rendered (math set aside).

    CommonMark (myst's parser) closes ``**`` after punctuation only when a space or punctuation
    follows: English writes "**Setup:** text", but Chinese "**设定：**文字" shows its asterisks.
    """
    from markdown_it import MarkdownIt

    text = re.sub(r"\$\$?[^$]+\$\$?", "M", markdown)
    tokens = MarkdownIt("commonmark").parseInline(text)
    runs = [child for token in tokens for child in (token.children or []) if child.type == "text"]
    return [run.content for run in runs if "*" in run.content]


def test_every_emphasis_of_a_translation_renders() -> None:
    found = []
    for name, cat in all_catalogues().items():
        for message in cat:
            if message.id and message.string and message.string != message.id:
                if literal_asterisks(message.string) and not literal_asterisks(message.id):
                    found.append(f"{name}: {message.string[:70]!r}")
    assert found == []


def test_the_emphasis_check_can_fail() -> None:
    assert literal_asterisks("**设定：**文字")
    assert not literal_asterisks("**设定**：文字") and not literal_asterisks("**Setup:** text")
