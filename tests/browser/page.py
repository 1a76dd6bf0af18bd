"""Finding things on a page by their `data-testid`, and waiting for them (the pages refresh themselves)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

# Where tests leave screenshots of the pages they change, to be looked at (RACKFLOW_SCREENSHOTS).
SHOTS = Path(os.environ.get("RACKFLOW_SCREENSHOTS", "/tmp"))
WAIT_S = 30.0  # generous: the machine may be busy with other test workers
_T = TypeVar("_T")


# ChromeDriver reports an element that a refresh or a navigation detached from the page as a stale
# element reference, or as an error carrying this message (a JavaScript error from the script behind
# `is_displayed`, an "unhandled inspector error" from reading `.text`).
_DETACHED = "does not belong to the document"


def _swapped(exc: WebDriverException) -> bool:
    return isinstance(exc, StaleElementReferenceException) or _DETACHED in str(exc.msg)


def wait(driver: WebDriver, condition: Callable[[WebDriver], _T], what: str) -> _T:
    """`condition`'s first truthy result; an element swapped out by a refresh meanwhile is looked up again."""

    def fresh(d: WebDriver) -> _T | bool:
        try:
            return condition(d)
        except WebDriverException as exc:
            if _swapped(exc):
                return False
            raise

    found: _T = WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(fresh, message=f"waiting for {what}")
    return found


def read(driver: WebDriver, look: Callable[[WebDriver], _T]) -> _T:
    """`look(driver)`, again if a refresh swapped the element it read between finding and reading it."""
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            return look(driver)
        except WebDriverException as exc:
            if not _swapped(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def text(driver: WebDriver, name: str) -> str:
    """The text of the first displayed element with data-testid `name`."""
    return read(driver, lambda d: str(visible(d, name).text))


def by_testid(driver: WebDriver | WebElement, name: str) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, f'[data-testid="{name}"]')


# The first displayed element of a selector, in one script: Selenium's `is_displayed` runs a large
# script of its own per element, and a wait polls ten times a second, so asking element by element cost
# Chromium about three times the CPU (26 against 8 ms a poll, measured), most of the browser tests' time.
# `checkVisibility` with these options is false under `display: none` (the `hidden` attribute, a closed
# dialog), `visibility: hidden` and `opacity: 0`, as `is_displayed` is.
_FIRST_SHOWN = """
return Array.from(document.querySelectorAll(arguments[0]))
  .find((e) => e.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) || false;
"""


def visible(driver: WebDriver, name: str) -> WebElement:
    """The first element with data-testid `name` once it is displayed."""

    def shown(d: WebDriver) -> Any:
        return d.execute_script(_FIRST_SHOWN, f'[data-testid="{name}"]')

    return wait(driver, shown, f"{name} to show")
