"""Sphinx extension of the book: pages that moved keep their old addresses.

Chapter file names are addresses that readers bookmark and that Colab opens. When a page is
renamed or split, its old name goes into ``rope_tutor_redirects`` (in ``_config.yml``, under
``sphinx: config:``) as ``old docname: new docname``; this writes a small HTML page at the old
address that sends the reader on, with no script and no network (a ``meta refresh`` and a link).
``book/published_pages.txt`` lists every address ever published; a test checks each still opens.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Moved: {title}</title>
<meta http-equiv="refresh" content="0; url={target}">
<link rel="canonical" href="{target}">
</head>
<body>
<p>This page has moved to <a href="{target}">{title}</a>.</p>
</body>
</html>
"""


def _write_redirects(app: Any, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    for old, new in (app.config.rope_tutor_redirects or {}).items():
        if old in app.env.found_docs:
            raise ValueError(f"rope_tutor_redirects: {old!r} is still a page of the book")
        if new not in app.env.found_docs:
            raise ValueError(f"rope_tutor_redirects: {old!r} points to {new!r}, not a page")
        page = outdir / f"{old}.html"
        target = os.path.relpath(outdir / f"{new}.html", page.parent)
        title = html.escape(app.env.titles[new].astext()) if new in app.env.titles else new
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(PAGE.format(title=title, target=html.escape(target)), encoding="utf-8")


def setup(app: Any) -> dict[str, Any]:
    app.add_config_value("rope_tutor_redirects", {}, "html")
    app.connect("build-finished", _write_redirects)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
