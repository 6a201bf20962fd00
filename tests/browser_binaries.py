"""Find the Chromium (or Chrome) binary and its ChromeDriver that the browser test drives.

``CHROMIUM=/path`` and ``CHROMEDRIVER=/path`` override the search; otherwise the usual names are
looked up on the PATH and in the usual install locations. Run as a script it prints the two paths,
or exits with status 1 and says exactly what to install on Debian, Ubuntu and macOS (the Makefile's
``browser`` target uses it; nothing here installs anything or asks for sudo).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
DRIVER_NAMES = ("chromedriver", "chromium.chromedriver")
BROWSER_PATHS = (
    "/Applications/Chromium.app/Contents/MacOS/Chromium",
    "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome",
    "/snap/bin/chromium",
)
DRIVER_PATHS = ("/usr/lib/chromium/chromedriver", "/usr/lib/chromium-browser/chromedriver")

INSTALL = """The browser test needs Chromium (or Chrome) and a matching ChromeDriver, none found.
  Debian:  apt-get install chromium chromium-driver          (as root; `make test` does this)
  Ubuntu:  sudo apt-get install chromium-browser chromium-chromedriver
           (on Ubuntu 20.04 and later these come as snaps: `sudo snap install chromium`,
           which provides chromium.chromedriver)
  macOS:   brew install --cask chromium && brew install --cask chromedriver
Or point at binaries you have:
  CHROMIUM=/path/to/chrome CHROMEDRIVER=/path/to/chromedriver make test"""


def _find(variable: str, names: tuple[str, ...], paths: tuple[str, ...]) -> Path | None:
    forced = os.environ.get(variable)
    if forced:
        return Path(forced) if Path(forced).is_file() else None
    for name in names:
        found = shutil.which(name)
        if found:
            return Path(found)
    for path in paths:
        if Path(path).is_file():
            return Path(path)
    return None


def find_browser() -> tuple[Path | None, Path | None]:
    """The browser and driver binaries, each ``None`` when not found."""
    return (
        _find("CHROMIUM", BROWSER_NAMES, BROWSER_PATHS),
        _find("CHROMEDRIVER", DRIVER_NAMES, DRIVER_PATHS),
    )


def main() -> int:
    browser, driver = find_browser()
    if browser is None or driver is None:
        print(INSTALL, file=sys.stderr)
        return 1
    print(browser)
    print(driver)
    return 0


if __name__ == "__main__":
    sys.exit(main())
