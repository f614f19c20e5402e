"""A real headless browser for report tests: Chromium or Chrome run as a command (no driver library).

env.sh installs Debian's ``chromium`` with apt-get when it runs as root with the test extra and none is on PATH;
``CHROME=/path/to/binary`` picks another one. There is deliberately no skip: a machine without a browser fails
the report test with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def find_browser() -> str:
    """Path of a Chromium-family browser: $CHROME, else the first of the usual names on PATH."""
    if os.environ.get("CHROME"):
        return os.environ["CHROME"]
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError(
        "no headless browser: install Debian's chromium (`apt-get install chromium`, which `bash env.sh` does "
        "as root with the test extra) or any Chrome/Chromium, or set CHROME=/path/to/binary"
    )


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    base = [find_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--hide-scrollbars", "--allow-file-access-from-files"]
    return subprocess.run(base + args, capture_output=True, text=True, timeout=timeout)


def render_dom(page: Path, timeout: float = 120) -> str:
    """The document as the browser built it (after parsing and layout), serialized."""
    result = _run(["--dump-dom", page.resolve().as_uri()], timeout)
    assert result.returncode == 0 and "<html" in result.stdout, result.stderr[-2000:]
    return result.stdout


def screenshot(page: Path, png: Path, width: int = 1280, height: int = 4000, timeout: float = 120) -> Path:
    """A PNG of the page as the browser draws it."""
    result = _run([f"--window-size={width},{height}", f"--screenshot={png.resolve()}", page.resolve().as_uri()], timeout)
    assert result.returncode == 0 and png.is_file(), result.stderr[-2000:]
    return png
