"""Debian's Chromium under Selenium, headless, for the browser tests and `make screenshots`.

The browser and its driver are the system's (`make browser` installs Debian's `chromium` and
`chromium-driver` when missing); nothing here downloads one. Each browser gets a fresh profile directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM = Path(os.environ.get("RACKFLOW_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("RACKFLOW_CHROMEDRIVER", "/usr/bin/chromedriver"))
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--lang=en-US",
)


def missing() -> str | None:
    """Why no browser can be started here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (path.exists() and os.access(path, os.X_OK)):
            return f"{path} is not installed (make browser installs Debian's chromium and chromium-driver)"
    return None


class Browser:
    """A headless Chromium and its WebDriver; `close()` ends both and removes the profile."""

    def __init__(self, width: int = 1400, height: int = 900, timezone: str = "Europe/Berlin") -> None:
        self.profile = tempfile.mkdtemp(prefix="rackflow-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        # The browser's zone differs from UTC, so the tests see times localised.
        service = Service(str(CHROMEDRIVER), env={**os.environ, "TZ": timezone})
        self.driver = webdriver.Chrome(service=service, options=options)
        self.driver.set_page_load_timeout(60)

    def close(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)
