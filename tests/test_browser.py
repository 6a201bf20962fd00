"""The website in a real browser, offline: every page of the book opened in headless Chromium.

The built site is served on 127.0.0.1 (an ephemeral port) and opened in the system's Chromium or
Chrome, driven by its ChromeDriver through selenium (found by ``browser_binaries``: nothing is
downloaded). Chromium cannot resolve any host but 127.0.0.1, and every request it makes is
recorded from the DevTools network events. For each page of the table of contents the test
checks that

* nothing is logged as an error on the console, and no request fails or leaves the site;
* every image loads and has alt text, and every figure is opaque (legible on the dark theme);
* MathJax typeset every formula (``mjx-container`` present, no raw ``$$`` or ``\\(`` left), and
  no display equation is wider than the text column (it would be cut off);
* notebook pages carry the Colab and download buttons, code blocks carry copy buttons, and chapter
  pages open with their prerequisites and reading time.

Each page is opened twice: in the English edition and in the Chinese one (``zh/``, issue 16). Both
must link to the page's twin in the other edition, and every Chinese character on a page (the
whole Chinese edition; the language link and the glossary's term table in the English one) must be
drawn with a font that has it, not as the empty boxes ("tofu") of a missing glyph: each is drawn on
a canvas in its element's font and compared with the box drawn for a code point that no font has.
Debian ships the fonts as ``fonts-noto-cjk``.

A screenshot of each page (light theme, and dark theme where the page has figures) is kept under
``_build/screenshots/`` for a person to look at. `make test` installs the browser (see Makefile).
"""

from __future__ import annotations

import base64
import functools
import http.server
import json
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser_binaries import INSTALL, find_browser
from conftest import ROOT, toc_files

import rope_tutor

SCREENSHOTS = ROOT / "_build" / "screenshots"
REPOSITORY = "https://github.com/rope-tutor/rope-tutor"
COLAB = f"https://colab.research.google.com/github/rope-tutor/rope-tutor/blob/v{rope_tutor.__version__}/"
CHAPTER = re.compile(r"^book/(0[1-9]|1[0-9])_")  # numbered chapters; 00 is the preface
MAX_SCREENSHOT_HEIGHT = 16000  # Chromium's limit for one capture is 16384 pixels
#: The words each chapter's first box must contain, per edition (translators: keep these three).
CHAPTER_HEAD = {
    "en": ("Before you start", "Prerequisites", "Reading time"),
    "zh": ("开始之前", "预备知识", "阅读时间"),
}
#: Each edition's folder in the site, and its <html lang>.
EDITION_FOLDER = {"en": "", "zh": "zh/"}
EDITION_LANG = {"en": "en", "zh": "zh-CN"}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    """The built site served over HTTP on 127.0.0.1 (fonts and scripts behave as when hosted)."""
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def start_chromium(profile: str) -> Any:
    """Headless Chromium that can reach 127.0.0.1 only, with console and network logging on."""
    chromium, chromedriver = find_browser()
    assert chromium is not None and chromedriver is not None, INSTALL
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-default-apps",
        "--hide-scrollbars",
        # No name resolves except 127.0.0.1: nothing can leave the machine even if a page asks.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--window-size=1280,900",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # The driver's path is given, so selenium never runs selenium-manager (which downloads).
    driver = webdriver.Chrome(service=Service(executable_path=str(chromedriver)), options=options)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser(site_url: str) -> Iterator[Any]:
    profile = tempfile.mkdtemp(prefix="rope-tutor-chromium-")
    driver = start_chromium(profile)
    try:
        # A fresh profile's first navigation also logs the browser's own start-up requests (from
        # its new-tab page); open the site once so that each page's log holds only its own.
        driver.get(f"{site_url}/index.html")
        _drain(driver, "browser")
        _drain(driver, "performance")
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class PageVisit:
    """What one page did in the browser."""

    url: str
    console_errors: list[str]
    requests: list[str]
    failures: list[str]
    facts: dict[str, Any]


# Runs in the page once it has loaded: waits for MathJax and the fonts, then reports what it sees.
INSPECT_PAGE = """
const done = arguments[arguments.length - 1];
(async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await document.fonts.ready;
  const article = document.querySelector("article") || document.body;
  const clone = article.cloneNode(true);
  clone.querySelectorAll("pre, code, script, style, mjx-container, mjx-assistive-mml")
    .forEach((node) => node.remove());
  const images = [...document.images].map((img) => ({
    src: img.currentSrc || img.src,
    alt: (img.getAttribute("alt") || "").trim(),
    loaded: img.complete && img.naturalWidth > 0,
    inArticle: article.contains(img),
  }));
  const math = [...article.querySelectorAll(".math")];
  done({
    title: document.title,
    text: clone.innerText,
    images: images,
    mathCount: math.length,
    mathUntypeset: math.filter((m) => !m.querySelector("mjx-container")).length,
    mjxCount: article.querySelectorAll("mjx-container").length,
    mathjaxErrors: article.querySelectorAll("mjx-merror, .MathJax_Error").length,
    // display equations wider than the text column are cut off (their box hides overflow)
    wideMath: [...article.querySelectorAll("mjx-container[display='true']")]
      .filter((m) => m.querySelector("mjx-math").getBoundingClientRect().width
        > m.parentElement.clientWidth + 1)
      .map((m) => m.querySelector("mjx-assistive-mml, math")?.textContent.slice(0, 60) || "?"),
    links: [...document.querySelectorAll("a[href]")].map((a) => a.href),
    codeBlocks: article.querySelectorAll("div.highlight pre").length,
    copyButtons: article.querySelectorAll("button.copybtn").length,
    firstAdmonition: (article.querySelector(".admonition") || {innerText: ""}).innerText,
    lang: document.documentElement.lang,
    twins: [...document.querySelectorAll("a.rope-tutor-language")].map((a) => a.href),
  });
})().catch((error) => done({error: String(error)}));
"""

# Every distinct CJK character on the page drawn on a canvas in the font of the element that shows
# it, compared with the box drawn for U+10FFFD (a private-use code point no font has): equal, or
# blank, means the reader sees a box. The control proves boxes are detectable: two code points that
# no font has must draw the same image.
CJK_GLYPHS = """
const done = arguments[arguments.length - 1];
(async () => {
  await document.fonts.ready;
  const draw = (font, text) => {
    const canvas = document.createElement("canvas");
    canvas.width = 56;
    canvas.height = 56;
    const context = canvas.getContext("2d");
    context.font = font;
    context.fillStyle = "#000";
    context.textBaseline = "top";
    context.fillText(text, 4, 4);
    return canvas.toDataURL();
  };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const byFont = new Map();
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const found = node.textContent.match(/[\\u3400-\\u9fff]/g);
    if (!found || !node.parentElement) continue;
    const style = getComputedStyle(node.parentElement);
    const font = `${style.fontStyle} ${style.fontWeight} 40px ${style.fontFamily}`;
    if (!byFont.has(font)) byFont.set(font, new Set());
    found.forEach((c) => byFont.get(font).add(c));
  }
  const boxes = [];
  let checked = 0;
  let control = true;
  for (const [font, chars] of byFont) {
    const box = draw(font, "\\u{10FFFD}");
    const blank = draw(font, "");
    control = control && draw(font, "\\u{10FFFC}") === box;
    for (const c of [...chars].slice(0, 200)) {
      checked += 1;
      const image = draw(font, c);
      if (image === box || image === blank) boxes.push(`${c} (${font})`);
    }
  }
  done({checked: checked, boxes: boxes.slice(0, 20), control: control});
})().catch((error) => done({error: String(error)}));
"""

# The fraction of transparent pixels in each figure image (drawn on a canvas: same origin).
FIGURE_TRANSPARENCY = """
const done = arguments[arguments.length - 1];
const article = document.querySelector("article") || document.body;
const loaded = [...article.querySelectorAll("img")].filter((img) => img.naturalWidth > 0);
const result = loaded.map((img) => {
  const canvas = document.createElement("canvas");
  canvas.width = img.naturalWidth;
  canvas.height = img.naturalHeight;
  const context = canvas.getContext("2d");
  context.drawImage(img, 0, 0);
  const pixels = context.getImageData(0, 0, canvas.width, canvas.height).data;
  let transparent = 0;
  for (let i = 3; i < pixels.length; i += 4) if (pixels[i] < 250) transparent += 1;
  return {src: img.src, transparent: transparent / (pixels.length / 4)};
});
done(result);
"""


def _drain(driver: Any, kind: str) -> list[dict[str, Any]]:
    return driver.get_log(kind)


def _network(entries: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Requested URLs, and failures (failed loads, HTTP errors), from the performance log."""
    requests, failures = [], []
    ids: dict[str, str] = {}
    for entry in entries:
        message = json.loads(entry["message"])["message"]
        method, params = message.get("method", ""), message.get("params", {})
        if method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            ids[params["requestId"]] = url
            requests.append(url)
        elif method == "Network.responseReceived":
            status = params["response"]["status"]
            if status >= 400:
                failures.append(f"HTTP {status}: {params['response']['url']}")
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            url = ids.get(params["requestId"], params["requestId"])
            failures.append(f"{params.get('errorText')}: {url}")
    return requests, failures


def _screenshot(driver: Any, path: Path) -> None:
    """A full-page PNG (up to MAX_SCREENSHOT_HEIGHT pixels tall) through DevTools: the viewport is
    made as tall as the page for the capture, then restored."""
    width, height = driver.execute_script(
        "return [window.innerWidth, document.documentElement.scrollHeight];"
    )
    height = min(height, MAX_SCREENSHOT_HEIGHT)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    try:
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png"})
    finally:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def _visit(driver: Any, url: str) -> PageVisit:
    _drain(driver, "browser")
    _drain(driver, "performance")
    driver.get(url)
    facts = driver.execute_async_script(INSPECT_PAGE)
    assert "error" not in facts, f"{url}: inspecting the page failed: {facts['error']}"
    console = [
        entry["message"] for entry in _drain(driver, "browser") if entry["level"] == "SEVERE"
    ]
    requests, failures = _network(_drain(driver, "performance"))
    return PageVisit(url, console, requests, failures, facts)


def _off_site(requests: list[str], site_url: str) -> list[str]:
    """The requests that went (or tried to go) anywhere but the served site.

    ``chrome://`` and ``chrome-extension://`` URLs are the browser's own resources, on disk.
    """
    local = (site_url + "/", "data:", "blob:", "about:", "chrome://", "chrome-extension://")
    return [url for url in requests if not url.startswith(local)]


def http_status(driver: Any, url: str) -> int | str:
    """The HTTP status of ``url`` fetched from the open page (or the error, if the fetch fails)."""
    return driver.execute_async_script(
        "const done = arguments[1];"
        "fetch(arguments[0]).then(r => done(r.status), e => done(String(e)));",
        url,
    )


def _set_theme(driver: Any, theme: str) -> None:
    driver.execute_script(
        "document.documentElement.dataset.theme = arguments[0];"
        "document.documentElement.dataset.mode = arguments[0];",
        theme,
    )


@pytest.mark.slow
@pytest.mark.parametrize("edition", ["en", "zh"])
@pytest.mark.parametrize("source", toc_files())
def test_page_in_the_browser(browser: Any, site_url: str, source: str, edition: str) -> None:
    page = EDITION_FOLDER[edition] + Path(source).with_suffix(".html").as_posix()
    visit = _visit(browser, f"{site_url}/{page}")
    facts = visit.facts
    problems: list[str] = []

    problems += [f"console error: {message}" for message in visit.console_errors]
    problems += [f"request left the site: {url}" for url in _off_site(visit.requests, site_url)]
    problems += [f"failed request: {failure}" for failure in visit.failures]

    for image in facts["images"]:
        if not image["loaded"]:
            problems.append(f"image did not load: {image['src']}")
        if not image["alt"]:
            problems.append(f"image without alt text: {image['src']}")

    if facts["mathCount"]:
        if facts["mathUntypeset"] or not facts["mjxCount"]:
            problems.append(f"{facts['mathUntypeset']} of {facts['mathCount']} formulas untypeset")
        if facts["mathjaxErrors"]:
            problems.append(f"{facts['mathjaxErrors']} MathJax errors")
        for formula in facts["wideMath"]:
            problems.append(
                f"display equation wider than the page, cut off at 1280 px: {formula!r} "
                "(split it with an aligned environment)"
            )
    for raw in ("$$", "\\(", "\\[", "\\begin{"):
        if raw in facts["text"]:
            at = facts["text"].index(raw)
            problems.append(
                f"raw math {raw!r} in the text: ...{facts['text'][at - 40 : at + 40]!r}"
            )

    if facts["codeBlocks"] and facts["copyButtons"] < facts["codeBlocks"]:
        problems.append(
            f"{facts['codeBlocks']} code blocks but {facts['copyButtons']} copy buttons"
        )

    if source.endswith(".ipynb"):
        if COLAB + source not in facts["links"]:
            problems.append(f"no Colab button opening {COLAB + source}")
        downloads = [
            link
            for link in facts["links"]
            if link.startswith(site_url) and link.endswith(Path(source).name)
        ]
        if not downloads:
            problems.append("no download button for the notebook")
        for link in downloads:
            status = http_status(browser, link)
            if status != 200:
                problems.append(f"download link {link} answers HTTP {status}")
    if REPOSITORY not in facts["links"]:
        problems.append("no link to the repository")

    if facts["lang"] != EDITION_LANG[edition]:
        problems.append(f"<html lang={facts['lang']!r}>, expected {EDITION_LANG[edition]!r}")
    if not facts["twins"]:
        problems.append("no link to the same page in the other edition")
    for link in facts["twins"]:
        status = http_status(browser, link)
        if status != 200:
            problems.append(f"the link to the other edition, {link}, answers HTTP {status}")
    glyphs = browser.execute_async_script(CJK_GLYPHS)
    assert "error" not in glyphs, f"{page}: the glyph check failed: {glyphs['error']}"
    if glyphs["checked"]:
        if not glyphs["control"]:
            problems.append("the glyph check cannot tell a missing glyph (control failed)")
        problems += [f"Chinese character drawn as a box (no font): {b}" for b in glyphs["boxes"]]
    if edition == "zh" and not glyphs["checked"]:
        problems.append("no Chinese text on a page of the Chinese edition")

    if CHAPTER.match(source):
        head = facts["firstAdmonition"]
        for needed in CHAPTER_HEAD[edition]:
            if needed.lower() not in head.lower():
                problems.append(f"the chapter's first box lacks {needed!r}")

    name = Path(source).stem + ("" if edition == "en" else f"-{edition}")
    _screenshot(browser, SCREENSHOTS / f"{name}.png")
    figures = [image for image in facts["images"] if image["inArticle"]]
    if figures:
        _set_theme(browser, "dark")
        _screenshot(browser, SCREENSHOTS / f"{name}-dark.png")
        _set_theme(browser, "light")
        for figure in browser.execute_async_script(FIGURE_TRANSPARENCY):
            if figure["transparent"] > 0.01:
                problems.append(
                    f"figure {figure['src']} is {figure['transparent']:.0%} transparent: "
                    "illegible on the dark theme (use the book style's white background)"
                )

    assert not problems, f"{page}:\n" + "\n".join(f"  - {p}" for p in problems)


def test_off_site_detector() -> None:
    site = "http://127.0.0.1:8000"
    requests = [
        f"{site}/book/intro.html",
        "data:image/png;base64,AAAA",
        "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-chtml.js",
        "http://127.0.0.1:8001/other-server.js",
        "chrome://resources/js/static_types.js",
    ]
    assert _off_site(requests, site) == requests[2:4]


def test_network_log_parser() -> None:
    def entry(method: str, **params: Any) -> dict[str, Any]:
        return {"message": json.dumps({"message": {"method": method, "params": params}})}

    entries = [
        entry("Network.requestWillBeSent", requestId="1", request={"url": "http://a/x.js"}),
        entry(
            "Network.responseReceived",
            requestId="1",
            response={"url": "http://a/x.js", "status": 404},
        ),
        entry("Network.requestWillBeSent", requestId="2", request={"url": "https://b/y.css"}),
        entry("Network.loadingFailed", requestId="2", errorText="net::ERR_NAME_NOT_RESOLVED"),
        entry("Network.requestWillBeSent", requestId="3", request={"url": "http://a/z.png"}),
        entry("Network.loadingFailed", requestId="3", errorText="net::ERR_ABORTED", canceled=True),
    ]
    requests, failures = _network(entries)
    assert requests == ["http://a/x.js", "https://b/y.css", "http://a/z.png"]
    assert failures == ["HTTP 404: http://a/x.js", "net::ERR_NAME_NOT_RESOLVED: https://b/y.css"]
