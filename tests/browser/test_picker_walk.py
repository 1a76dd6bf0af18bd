"""The schedule form's picker over more racks than a request of a short text looks through (SEARCH_WALK,
10,000 names, where a rare text read every name: docs/PERFORMANCE.md), in a real headless Chromium against
a real `rackflow serve`: an answer of one or two characters that found few names, or none, in the names
it looked through ends with an option that searches on, by a click or the keyboard, and adds what the next
names hold; an answer that looked through the rest offers no more."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import insert

from rackflow.config import SEARCH_WALK
from rackflow.store.db import Database
from rackflow.store.tables import racks
from tests.browser.page import SHOTS, by_testid, text, visible, wait
from tests.browser.test_dashboard import open_page
from tests.browser.test_forms import chosen, field, offered
from tests.e2e.cluster import ServerProcess, start_server

pytestmark = pytest.mark.slow

T0 = datetime(2026, 6, 1, tzinfo=UTC)
# By name: a-zq, then SEARCH_WALK fillers (the first request's walk ends at the last but one), then zq-1.
NAMES = ["a-zq", *(f"pad-{i:05d}" for i in range(SEARCH_WALK)), "zq-1"]


async def _write(url: str) -> None:
    db = Database(url)
    try:
        async with db.transaction() as conn:
            await conn.execute(
                insert(racks),
                [
                    {
                        "id": uuid.uuid4(),
                        "name": name,
                        "external_id": None,
                        "created_at": T0 + timedelta(seconds=i),
                    }
                    for i, name in enumerate(NAMES)
                ],
            )
    finally:
        await db.dispose()


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    asyncio.run(_write(served_db_url))
    started = start_server(
        served_db_url, tmp_path_factory.mktemp("picker"), args=["--http-listen", "127.0.0.1:0"], name="picker"
    )
    yield started
    assert started.stop() == 0, started.output


def more(driver: WebDriver) -> str:
    """The option that searches on, or "" when there is none."""
    found = by_testid(driver, "scope-more")
    return str(found[0].text) if found and found[0].is_displayed() else ""


def test_a_short_text_searches_on_past_the_names_it_looked_through(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "walked")
    box = visible(driver, "scope-pick")
    box.send_keys("ZQ")  # a-zq is in the first 10,000 names, zq-1 past them
    wait(driver, lambda d: offered(d) == ["a-zq"] and more(d), "a-zq and a way on")
    assert more(driver) == f"Search the next {SEARCH_WALK:,} names…"
    driver.save_screenshot(str(SHOTS / "schedule-form-picker-walk.png"))
    by_testid(driver, "scope-more")[0].click()
    wait(driver, lambda d: offered(d) == ["a-zq", "zq-1"], "zq-1 added to the names offered")
    assert more(driver) == ""  # the rest looked through: nothing more to ask for
    by_testid(driver, "scope-option")[1].click()
    wait(driver, lambda d: chosen(d) == ["zq-1"], "zq-1 added")

    box.send_keys("q-")  # only zq-1 holds it: the first names hold none
    none = "No rack's name holds “q-” among those looked through yet."
    wait(driver, lambda d: text(d, "scope-none") == none and more(d), "none yet, and a way on")
    box.send_keys(Keys.ARROW_DOWN)  # the one option: the way on, from the keyboard
    assert box.get_attribute("aria-activedescendant") == "scope-option-more"
    box.send_keys(Keys.ENTER)
    wait(driver, lambda d: offered(d) == ["zq-1"] and not by_testid(d, "scope-none"), "zq-1 found")
    assert more(driver) == "" and chosen(driver) == ["zq-1"]  # Enter asked on; it added nothing
