"""Sphinx extension of the book: each page includes each script once.

Sphinx 7.4 lists an inline script added by an extension after the builder starts (sphinx-thebe's
configuration, sphinx-togglebutton's selector) twice: once with the file name ``None`` and once
with ``""``. The second copy of sphinx-thebe's ``const THEBE_JS_URL`` is a JavaScript error on every
page, which the browser test (tests/test_browser.py) reports. This keeps the first copy of each.
"""

from __future__ import annotations

import os
from typing import Any


def _unique_scripts(
    app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    scripts = context.get("script_files")
    if not scripts:
        return
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for script in scripts:
        key = (
            os.fspath(script.filename or ""),
            script.priority,
            tuple(sorted(script.attributes.items())),
        )
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _unique_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
