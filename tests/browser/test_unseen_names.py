"""Names stored before names were refused characters that do not show as themselves (a zero-width space, a
right-to-left override), in a real headless Chromium against a real `rackflow serve` (SQLite: the names are
written straight into its file, as no API takes them any more): the console shows each escaped as the CLI
does (`r12\\u200b`), where it shows it (the schedule form's preview too: its racks, a domain's among them,
and the windows that close them), and sends the real name back, so the actions and an edit still act on it
(the form's preview checks an edit's name as Save does: its own passes, a new one meets the rule)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import by_testid, read, text, visible, wait
from tests.browser.test_dashboard import confirm, h1, open_page
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, schedule_request

pytestmark = pytest.mark.slow

RACK, SCHEDULE, WINDOW = "r12\u200b", "leg\u202eacy", "frz\u200d"
RACK_SHOWN, SCHEDULE_SHOWN, WINDOW_SHOWN = "r12\\u200b", "leg\\u202eacy", "frz\\u200d"


@pytest.fixture(scope="module")
def server(served_db_url: str) -> Iterator[ServerProcess]:
    database = Path(served_db_url.removeprefix("sqlite:///"))
    started = start_server(
        served_db_url, database.parent, args=["--http-listen", "127.0.0.1:0"], name="unseen"
    )
    stub = started.stub()
    racks = create_racks(stub, ["r12", "r13"])
    stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d1", rack_ids=[r.id for r in racks]))
    stub.CreateTaskSchedule(
        schedule_request("legacy", ["r12"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    )
    start = datetime.now(UTC)
    stub.CreateMaintenanceWindow(  # r12's firings are skipped by a freeze: the preview names it
        pb.CreateMaintenanceWindowRequest(
            window=pb.MaintenanceWindow(
                name="frz",
                kind=pb.WINDOW_KIND_FREEZE,
                one_off=pb.OneOffWindow(start=stamp(start), end=stamp(start + timedelta(days=30))),
                racks=[pb.WindowTarget(name="r12")],
            )
        )
    )
    with sqlite3.connect(database) as db:  # as a release before the rule stored them
        db.execute("UPDATE racks SET name = ? WHERE name = 'r12'", (RACK,))
        db.execute("UPDATE task_schedule SET name = ? WHERE name = 'legacy'", (SCHEDULE,))
        db.execute("UPDATE maintenance_windows SET name = ? WHERE name = 'frz'", (WINDOW,))
    yield started
    assert started.stop() == 0, started.output


def main_text(driver: WebDriver) -> str:
    return str(driver.find_element(By.TAG_NAME, "main").text)


def stamp(moment: datetime) -> Timestamp:
    found = Timestamp()
    found.FromDatetime(moment)
    return found


def previewed(driver: WebDriver) -> list[tuple[str, str]] | str:
    """The first previewed firing's racks, (the rack's name as sent, the line the page shows for it), once
    the preview shows them; or the form's refusal, once it shows one."""

    def shown(d: WebDriver) -> list[tuple[str, str]] | str | None:
        refusals = [e.text for e in d.find_elements(By.CSS_SELECTOR, "[data-error-for]") if e.text]
        racks = [
            (str(e.get_attribute("data-rack")), " ".join(e.text.split()))
            for e in d.find_elements(
                By.CSS_SELECTOR, '[data-testid="preview-firing"]:first-child [data-testid="preview-decision"]'
            )
        ]
        return " / ".join(refusals) or racks or None

    return wait(driver, shown, "the preview's racks, or a refusal")


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
    # The preview checks the edit's name as Save does: its own name, stored before the rule, passes.
    frozen = [(RACK, f"{RACK_SHOWN} skipped: window closed ({WINDOW_SHOWN})")]
    assert previewed(driver) == frozen
    # A rack added by the page's script is shown as the server shows it, and sent as it is.
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
    wait(driver, lambda d: previewed(d) == frozen, "the rack added, previewed")


def test_the_form_previews_a_domain_s_racks_and_the_window_that_skips_one_escaped(
    server: ServerProcess, driver: WebDriver, tmp_path: Path
) -> None:
    """A domain's racks are not the names chosen in the form: the preview shows them as the server writes
    them all the same, and the window that closes one."""
    open_page(driver, server, "/schedules/new", "New schedule")
    visible(driver, "form-name").send_keys("by-domain")
    visible(driver, "form-scope-domains").click()
    visible(driver, "scope-pick").send_keys("d1")
    wait(driver, lambda d: [o.text for o in by_testid(d, "scope-option")] == ["d1"], "d1 offered")
    driver.find_element(By.CSS_SELECTOR, '[data-testid="scope-option"]').click()
    frozen = (RACK, f"{RACK_SHOWN} skipped: window closed ({WINDOW_SHOWN})")
    wait(driver, lambda d: sorted(previewed(d)) == [frozen, ("r13", "r13 fires")], "the domain's racks")
    assert "\u200b" not in main_text(driver) and "\u200d" not in main_text(driver)
    driver.save_screenshot(str(tmp_path / "preview-of-a-domain.png"))


def test_a_rename_to_a_name_the_rule_refuses_is_refused_beside_the_name(
    server: ServerProcess, driver: WebDriver
) -> None:
    schedules = server.stub().ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
    (schedule_id,) = [s.id.id for s in schedules if s.name == SCHEDULE]
    open_page(driver, server, f"/schedules/{schedule_id}/edit", f"Edit {SCHEDULE_SHOWN}")
    wait(driver, lambda d: isinstance(previewed(d), list), "the preview under its own name")
    # A new name, put there as a paste would (ChromeDriver types no invisible character).
    driver.execute_script(
        "const input = arguments[0]; input.value = 'r12\\u200b';"
        "input.dispatchEvent(new Event('input', {bubbles: true}));",
        visible(driver, "form-name"),
    )
    wait(
        driver,
        lambda d: "U+200B ZERO WIDTH SPACE at position 4" in text(d, "error-schedule.name"),
        "the new name refused beside it",
    )
