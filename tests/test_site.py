"""The website: it builds with warnings as errors, and every page works with no network."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import toc_files

REMOTE = re.compile(r"^(https?:)?//", re.IGNORECASE)


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "_static" not in p.parts)


@pytest.mark.slow
def test_every_chapter_has_a_page(built_site: Path) -> None:
    for name in toc_files():
        page = built_site / Path(name).with_suffix(".html")
        assert page.exists(), f"no page built for {name}"


LOADING_TAGS = re.compile(r"<(script|link|img|iframe|source|video|audio)\b[^>]*>", re.IGNORECASE)
LOADING_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "manifest"}


def remote_loads(html: str) -> list[str]:
    """The tags of a page that would fetch something from another host."""
    found = []
    for match in LOADING_TAGS.finditer(html):
        tag = match.group(0)
        url = re.search(r"\b(?:src|href)=[\"']([^\"']+)", tag)
        if not url or not REMOTE.match(url.group(1)):
            continue
        if match.group(1).lower() == "link":
            rel = re.search(r"\brel=[\"']([^\"']+)", tag)
            if not rel or not LOADING_RELS & set(rel.group(1).lower().split()):
                continue  # a plain hyperlink-like <link> (canonical, index) loads nothing
        found.append(tag)
    return found


def test_remote_loads_detector() -> None:
    page = (
        '<script src="https://cdn.example/x.js"></script><script src="_static/a.js"></script>'
        '<link rel="stylesheet" href="//fonts.example/f.css"><link rel="canonical" href="https://x">'
    )
    assert remote_loads(page) == [
        '<script src="https://cdn.example/x.js">',
        '<link rel="stylesheet" href="//fonts.example/f.css">',
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
    scripts = re.findall(r"<script[^>]*\bsrc=[\"']([^\"']*mathjax[^\"']*)", page, re.IGNORECASE)
    assert scripts, "no MathJax script on a chapter page with equations"
    for src in scripts:
        assert not REMOTE.match(src), f"MathJax loaded from the network: {src}"
        local = built_site / "book" / src.split("?")[0]
        assert local.resolve().exists(), f"MathJax script {src} is not in the built site"
