"""Names stored before names were refused characters that do not show as themselves (a zero-width space, a
right-to-left override), in a real headless Chromium against a real `rackflow serve` (SQLite: the names are
written straight into its file, as no API takes them any more): the console shows each escaped as the CLI
does (`r12\\u200b`), where it shows it, and sends the real name back, so the actions still act on it."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import by_testid, read, text, visible, wait
from tests.browser.test_dashboard import confirm, h1, open_page
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, schedule_request

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]

RACK, SCHEDULE = "r12\u200b", "leg\u202eacy"
RACK_SHOWN, SCHEDULE_SHOWN = "r12\\u200b", "leg\\u202eacy"


@pytest.fixture(scope="module")
def server(served_db_url: str) -> Iterator[ServerProcess]:
    database = Path(served_db_url.removeprefix("sqlite:///"))
    started = start_server(
        served_db_url, database.parent, args=["--http-listen", "127.0.0.1:0"], name="unseen"
    )
    stub = started.stub()
    create_racks(stub, ["r12", "r13"])
    stub.CreateTaskSchedule(
        schedule_request("legacy", ["r12"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    )
    with sqlite3.connect(database) as db:  # as a release before the rule stored them
        db.execute("UPDATE racks SET name = ? WHERE name = 'r12'", (RACK,))
        db.execute("UPDATE task_schedule SET name = ? WHERE name = 'legacy'", (SCHEDULE,))
    yield started
    assert started.stop() == 0, started.output


def main_text(driver: WebDriver) -> str:
    return str(driver.find_element(By.TAG_NAME, "main").text)


def test_the_racks_list_and_a_racks_page_show_its_name_escaped(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/racks", "Racks")
    rows = read(
        driver, lambda d: {r.get_attribute("data-name"): r.text.split()[0] for r in by_testid(d, "rack-row")}
    )
    assert rows == {RACK: RACK_SHOWN, "r13": "r13"}
    assert "\u200b" not in main_text(driver)

    row = next(r for r in by_testid(driver, "rack-row") if r.get_attribute("data-name") == RACK)
    row.find_element(By.CSS_SELECTOR, '[data-testid="rack-link"]').click()
    wait(driver, lambda d: h1(d) == RACK_SHOWN, "the rack's page, its name escaped")
    assert "\u200b" not in main_text(driver)
    assert SCHEDULE_SHOWN in main_text(driver) and "\u202e" not in main_text(driver)


def test_a_schedules_page_shows_its_name_escaped_and_its_actions_act_on_it(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules", "Schedules")
    link = read(driver, lambda d: visible(d, "schedule-link").text)
    assert link == SCHEDULE_SHOWN
    visible(driver, "schedule-link").click()
    wait(driver, lambda d: h1(d) == SCHEDULE_SHOWN, "the schedule's page, its name escaped")
    assert "\u202e" not in main_text(driver) and RACK_SHOWN in main_text(driver)

    assert confirm(driver, "action-pause") == f"Pause {SCHEDULE_SHOWN}?"
    wait(driver, lambda d: text(d, "schedule-state").endswith("paused"), "the paused badge")
    assert text(driver, "flash") == f"Paused {SCHEDULE_SHOWN}"
    confirm(driver, "action-resume")
    wait(driver, lambda d: text(d, "schedule-state").endswith("enabled"), "the enabled badge")


def test_the_edit_form_shows_names_escaped_and_keeps_the_real_ones_as_its_values(
    server: ServerProcess, driver: WebDriver
) -> None:
    schedules = server.stub().ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
    (schedule_id,) = [s.id.id for s in schedules if s.name == SCHEDULE]
    open_page(driver, server, f"/schedules/{schedule_id}/edit", f"Edit {SCHEDULE_SHOWN}")
    assert visible(driver, "form-name").get_attribute("value") == SCHEDULE  # what Save sends back

    chosen = read(
        driver,
        lambda d: [
            (li.get_attribute("data-name"), li.text) for li in d.find_elements(By.CSS_SELECTOR, ".chosen li")
        ],
    )
    assert chosen == [(RACK, f"{RACK_SHOWN} ×")]
    # A rack added by the page's script is shown as the server shows it, and sent as it is. (The preview
    # checks a draft's name as create does, so it is asked under a name of today's rule.)
    visible(driver, "form-name").clear()
    visible(driver, "form-name").send_keys("legacy")
    driver.find_element(By.CSS_SELECTOR, ".chosen li [data-remove]").click()
    visible(driver, "scope-pick").send_keys("r1")  # the picker offers names as the server shows them
    offered = wait(
        driver,
        lambda d: [(o.get_attribute("data-name"), o.text) for o in by_testid(d, "scope-option")] or None,
        "the names offered",
    )
    assert offered == [(RACK, RACK_SHOWN), ("r13", "r13")]
    driver.find_element(By.CSS_SELECTOR, '[data-testid="scope-option"]').click()
    added = wait(
        driver,
        lambda d: (
            [
                (li.get_attribute("data-name"), li.text)
                for li in d.find_elements(By.CSS_SELECTOR, ".chosen li")
            ]
            or None
        ),
        "the rack added",
    )
    assert added == [(RACK, f"{RACK_SHOWN} ×")]
    badges = wait(driver, lambda d: [b.text for b in by_testid(d, "preview-decision")], "the preview's racks")
    assert all("\u200b" not in b for b in badges) and any(RACK_SHOWN in b for b in badges)
