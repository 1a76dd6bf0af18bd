"""`make screenshots`: pictures of the main pages of a demo fleet (`tests.browser.demo`) for the README.

python -m tests.browser.screenshots docs/img
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from rackflow.client import RackflowClient
from tests.browser.chromium import Browser, missing
from tests.browser.demo import ROLLOUT, start_demo

PAGES = (
    ("overview", "/"),
    ("schedules", "/schedules"),
    ("schedule", "/schedules/weekly-firmware"),
    ("tasks", "/tasks"),
    ("rack", "/racks/rack-07"),
    ("windows", "/windows"),
    ("audit", "/audit"),
    # The edit form, once its preview shows the next firings and each rack's decision.
    ("schedule-form", "/schedules/weekly-firmware/edit"),
)
# What a page shows once it is ready (default: its heading).
READY = {"schedule-form": '[data-testid="preview-decision"]'}
# What is typed into a page's input once it is ready, and what the page then shows: the schedule form's
# picker offering the racks whose name holds it.
TYPED = {"schedule-form": ('[data-testid="scope-pick"]', "rack-1", '[data-testid="scope-option"]')}


def main(out: Path) -> None:
    reason = missing()
    if reason:
        raise SystemExit(f"screenshots: {reason}")
    out.mkdir(parents=True, exist_ok=True)
    server = start_demo(Path(tempfile.mkdtemp(prefix="rackflow-shots-")))
    with RackflowClient(server.address) as client:
        rollout = client.list_runs(ROLLOUT, limit=1).runs[0].id.id
    browser = Browser(width=1440, height=960)
    try:
        driver = browser.driver
        for name, path in (*PAGES, ("run", f"/runs/{rollout}")):
            driver.get(server.http_url + path)
            ready = READY.get(name, "main h1")
            WebDriverWait(driver, 20).until(lambda d, ready=ready: d.find_element(By.CSS_SELECTOR, ready))
            if name in TYPED:
                field, typed, shown = TYPED[name]
                driver.find_element(By.CSS_SELECTOR, field).send_keys(typed)
                WebDriverWait(driver, 20).until(lambda d, shown=shown: d.find_element(By.CSS_SELECTOR, shown))
            driver.execute_script("window.scrollTo(0, 0)")
            target = out / f"{name}.png"
            driver.save_screenshot(str(target))
            print(f"wrote {target}")
    finally:
        browser.close()
        server.stop()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/img"))
