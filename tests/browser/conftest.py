"""Browser tests: a real `rackflow serve --http-listen` per module on SQLite, and one headless Chromium for
all the modules a worker runs (the browser group: all of them). Without Chromium these tests skip, except
under CI=true, where they fail.

One database: what a browser adds to tests/web (the pages, forms and JSON API in process, on SQLite and on
PostgreSQL alike) is the pages' scripts, which do not depend on the database, and every Chromium test costs
the suite a browser's CPU (about 0.2 s a page load)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.browser.chromium import Browser, missing
from tests.conftest import served_sqlite_copy


@pytest.fixture(scope="module")
def served_db_url(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The module's servers' database, on SQLite only (above)."""
    return served_sqlite_copy(sqlite_template, tmp_path_factory)


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    """One Chromium for the session: a start is about a second of Chromium's CPU, and nothing a module
    leaves in it reaches the next. Each module's server has a port of its own, so an origin of its own
    (local and session storage; the dashboard sets no cookie), and `driver` clears the storage and the
    log after each test."""
    reason = missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"browser tests cannot run under CI: {reason}", pytrace=False)
        pytest.skip(reason)
    started = Browser()
    yield started
    started.close()


@pytest.fixture
def driver(browser: Browser) -> Iterator[WebDriver]:
    """The module's browser, with a clean local and session storage after each test and no script errors."""
    browser.driver.get_log("browser")  # drop what earlier tests logged
    yield browser.driver
    # Script errors fail the test; a refused request (401, 403, 412 …) is logged by the browser as a
    # network error and is part of what the tests provoke.
    log = browser.driver.get_log("browser")
    errors = [e for e in log if e["level"] == "SEVERE" and e.get("source") != "network"]
    # Either may be refused (a test that takes storage away): then there is nothing to clear.
    browser.driver.execute_script(
        "for (const name of ['localStorage', 'sessionStorage']) { try { window[name].clear() } catch (e) {} }"
    )
    assert errors == [], errors
