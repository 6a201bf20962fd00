"""The website: it builds with warnings as errors, and every page works with no network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from conftest import toc_files, toc_notebooks

REMOTE = re.compile(r"^(https?:)?//", re.IGNORECASE)
#: A Chinese character (CJK Unified Ideographs).
CHINESE = re.compile(r"[\u4e00-\u9fff]")


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "_static" not in p.parts)


@pytest.mark.slow
def test_every_chapter_has_a_page(built_site: Path) -> None:
    for edition in ("", "zh/"):  # English, and the Chinese edition under zh/
        for name in toc_files():
            page = built_site / f"{edition}{Path(name).with_suffix('.html').as_posix()}"
            assert page.exists(), f"no page built for {edition}{name}"


LOADING_TAGS = ("script", "link", "img", "iframe", "source", "video", "audio")
LOADING_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "manifest"}


def remote_loads(html: str) -> list[str]:
    """The tags of a page that would fetch something from another host (parsed by BeautifulSoup)."""
    found = []
    for tag in BeautifulSoup(html, "html.parser").find_all(LOADING_TAGS):
        url = tag.get("src") or tag.get("href")
        if not url or not REMOTE.match(url):
            continue
        if tag.name == "link" and not LOADING_RELS & {r.lower() for r in tag.get("rel", [])}:
            continue  # a plain hyperlink-like <link> (canonical, index) loads nothing
        found.append(str(tag))
    return found


def test_remote_loads_detector() -> None:
    page = (
        '<script src="https://cdn.example/x.js"></script><script src="_static/a.js"></script>'
        '<link rel="stylesheet" href="//fonts.example/f.css"><link rel="canonical" href="https://x">'
    )
    assert remote_loads(page) == [
        '<script src="https://cdn.example/x.js"></script>',
        '<link href="//fonts.example/f.css" rel="stylesheet"/>',
    ]


@pytest.mark.slow
def test_no_page_loads_anything_from_the_network(built_site: Path) -> None:
    offenders = [
        f"{page.relative_to(built_site)}: {tag}"
        for page in _pages(built_site)
        for tag in remote_loads(page.read_text(encoding="utf-8"))
    ]
    for css in built_site.rglob("*.css"):
        for url in re.findall(r"url\(\s*[\"']?([^\"')]+)", css.read_text(errors="ignore")):
            if REMOTE.match(url):
                offenders.append(f"{css.relative_to(built_site)}: url({url})")
    assert not offenders, "remote assets (the site must work offline):\n" + "\n".join(offenders)


@pytest.mark.slow
def test_mathjax_is_served_by_the_site(built_site: Path) -> None:
    page = (built_site / "book" / "03_sinusoidal.html").read_text(encoding="utf-8")
    soup = BeautifulSoup(page, "html.parser")
    scripts = [t["src"] for t in soup.find_all("script", src=True) if "mathjax" in t["src"].lower()]
    assert scripts, "no MathJax script on a chapter page with equations"
    for src in scripts:
        assert not REMOTE.match(src), f"MathJax loaded from the network: {src}"
        local = built_site / "book" / src.split("?")[0]
        assert local.resolve().exists(), f"MathJax script {src} is not in the built site"


def figure_alt_problems(html: str, chinese: bool) -> list[str]:
    """The figures a code cell drew (``<img>`` in a cell's output) whose alt text is missing, is
    the image's own file name (docutils' default), or, on a Chinese page, holds no Chinese."""
    problems = []
    for img in BeautifulSoup(html, "html.parser").select("div.cell_output img"):
        src, alt = img.get("src", ""), (img.get("alt") or "").strip()
        # An animation's frame <img> has no src until its script sets one.
        if not alt or (src and (alt == src or Path(src).name in alt)):
            problems.append(f"{Path(src).name}: no alt text ({alt[:40]!r})")
        elif chinese and not CHINESE.search(alt):
            problems.append(f"{Path(src).name}: alt text in English: {alt[:60]!r}")
    return problems


def test_figure_alt_problems_detector() -> None:
    output = '<div class="cell_output docutils container">{}</div>'
    page = "".join(
        output.format(img)
        for img in (
            '<img alt="两条曲线。" src="../_images/a.png"/>',
            '<img alt="Two curves." src="../_images/b.png"/>',
            '<img alt="../_images/c.png" src="../_images/c.png"/>',
            '<img src="../_images/d.png"/>',
            '<img alt="动画：两个箭头。" id="frame"/>',  # an animation's frame: no src yet
        )
    ) + '<img alt="logo" src="_static/logo.png"/>'  # not a figure: outside any cell output
    assert [p.split(":")[0] for p in figure_alt_problems(page, chinese=True)] == [
        "b.png", "c.png", "d.png"
    ]
    assert [p.split(":")[0] for p in figure_alt_problems(page, chinese=False)] == ["c.png", "d.png"]


@pytest.mark.slow
def test_every_figure_has_an_alt_text_in_the_language_of_its_page(built_site: Path) -> None:
    """Each figure of a chapter has an alt text in both editions, in Chinese in the Chinese one
    (its translation comes from the page's .po file, see book/_ext/languages.py)."""
    report, figures = [], 0
    for name in toc_notebooks():
        page = Path(name).with_suffix(".html").as_posix()
        for edition, chinese in (("", False), ("zh/", True)):
            html = (built_site / f"{edition}{page}").read_text(encoding="utf-8")
            figures += len(BeautifulSoup(html, "html.parser").select("div.cell_output img"))
            report += [f"{edition}{page}: {p}" for p in figure_alt_problems(html, chinese)]
    assert figures > 0, "no figure found in any chapter page: the selector is wrong"
    assert not report, "figures without a proper alt text:\n" + "\n".join(report)


#: Words of the theme and of the extensions on a chapter page, and their Chinese (from the
#: packages' own catalogues and the project's, locales/zh_CN/LC_MESSAGES/<catalog>.po).
THEME_WORDS = {
    "Contents": "目录",  # the page's table of contents (sphinx-book-theme)
    "Exercise 13.1": "练习 13.1",  # an exercise's number (sphinx-exercise)
    "Solution": "解答",
    "Search this book...": "搜索本书……",
    "Repository": "代码仓库",
    "Click to show": "点击显示",  # a hidden cell's button (sphinx-togglebutton)
    "Show code cell source": "显示代码",  # a folded code cell's buttons (myst-nb's hide-input)
    "Hide code cell source": "隐藏代码",
    "rope-tutor: how transformers encode position": "rope-tutor：Transformer 如何编码位置",  # title
}


@pytest.mark.slow
def test_the_chinese_edition_shows_the_themes_words_in_chinese(built_site: Path) -> None:
    """The theme and the extensions load their catalogues before the edition's language is set;
    book/_ext/languages.py loads them again. Chapter 12 has every kind of word (an exercise with
    its solution, a hidden cell); the English page is the control."""
    page = "book/12_lab_extending_rope.html"
    english = (built_site / page).read_text(encoding="utf-8")
    chinese = (built_site / "zh" / page).read_text(encoding="utf-8")
    for word, translation in THEME_WORDS.items():
        assert word in english, f"{word!r} is no longer on the English page: update the test"
        assert translation in chinese and word not in chinese, f"{word!r} untranslated"


#: An image a notebook's output became on a page (myst-nb names it by its content's hash).
OUTPUT_IMAGE = re.compile(r'<img[^>]+src="[^"]*_images/([0-9a-f]{64}\.png)"')


@pytest.mark.slow
def test_each_edition_shows_its_own_figures(built_site: Path) -> None:
    """Every figure a chapter draws is a different picture on its Chinese page (the one
    rope_tutor.figures stored, with Chinese words) than on its English page; so is the landing
    page's (Sphinx's <name>.zh_CN.png)."""
    shared = {}
    for name in toc_notebooks():
        page = Path(name).with_suffix(".html").as_posix()
        english = set(OUTPUT_IMAGE.findall((built_site / page).read_text(encoding="utf-8")))
        chinese = set(OUTPUT_IMAGE.findall((built_site / "zh" / page).read_text(encoding="utf-8")))
        assert len(english) == len(chinese), f"{page}: {len(english)} figures, {len(chinese)} in zh"
        if english & chinese:
            shared[page] = sorted(english & chinese)
    assert shared == {}, "figures the Chinese edition shows in English"
    landing = (built_site / "zh" / "book" / "intro.html").read_text(encoding="utf-8")
    assert "intro_rope_and_scaling.zh_CN.png" in landing
    english = (built_site / "book" / "intro.html").read_text(encoding="utf-8")
    assert "intro_rope_and_scaling.zh_CN.png" not in english
