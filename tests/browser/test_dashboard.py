"""The dashboard in a real headless Chromium against a real `rackflow serve`, on SQLite and PostgreSQL:
every page loads, a schedule is followed from the list to its runs grid, paused (with its badge), triggered
(its new column appears) and a task cancelled, all through the page as an operator would."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy import create_engine, insert

from rackflow.ids import new_id
from rackflow.store.tables import audit_events
from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import by_testid, read, text, visible, wait
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request

pytestmark = pytest.mark.slow

CRON, INTERVAL = pb.SCHEDULE_SPEC_TYPE_CRON, pb.SCHEDULE_SPEC_TYPE_INTERVAL


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A fleet whose tasks take a while (3 steps of 4 s), so a running task can be watched and cancelled.
    No schedule comes due while the tests run: only the page's own actions fire them."""
    started = start_server(
        served_db_url,
        tmp_path_factory.mktemp("browser"),
        args=["--http-listen", "127.0.0.1:0"],
        env={"RACKFLOW_SIM_STEP_SECONDS": "4"},
        name="dashboard",
    )
    stub = started.stub()
    create_racks(stub, [f"r{i}" for i in range(1, 7)], components_per_rack=3)
    create_schedules(
        stub,
        [
            schedule_request(
                "nightly-reset",
                ["r1", "r2"],
                spec_type=CRON,
                spec="0 2 * * *",
                timezone="Europe/Berlin",
                operation="power_reset",
            ),
            schedule_request("pause-me", ["r3"], spec_type=INTERVAL, spec="24h"),
            schedule_request("trigger-me", ["r4", "r5"], spec_type=CRON, spec="0 3 * * *"),
            schedule_request("cancel-me", ["r6"], spec_type=INTERVAL, spec="24h"),
        ],
    )
    (nightly,) = [
        s
        for s in stub.ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
        if s.name == "nightly-reset"
    ]
    stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=nightly.id))
    yield started
    assert started.stop() == 0, started.output


def h1(driver: WebDriver) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, "main h1").text)


def open_page(driver: WebDriver, server: ServerProcess, path: str, title: str) -> None:
    driver.get(server.http_url + path)
    wait(driver, lambda d: title in h1(d), f"{path} to show {title!r}")


def confirm(driver: WebDriver, action: str) -> str:
    """Click the action button, then Confirm in its dialog; returns the dialog's title."""
    visible(driver, action).click()
    dialog = visible(driver, "confirm-dialog")
    title = str(dialog.find_element(By.TAG_NAME, "h2").text)
    visible(driver, "confirm-ok").click()
    return title


@pytest.mark.parametrize(
    ("path", "title"),
    [
        ("/", "Overview"),
        ("/schedules", "Schedules"),
        ("/tasks", "Tasks"),
        ("/racks", "Racks"),
        ("/windows", "Maintenance windows"),
        ("/audit", "Audit trail"),
        ("/notifications", "Notifications"),
        ("/racks/r1", "r1"),
        ("/schedules/nightly-reset", "nightly-reset"),
    ],
)
def test_every_page_loads(server: ServerProcess, driver: WebDriver, path: str, title: str) -> None:
    open_page(driver, server, path, title)
    assert driver.find_element(By.CSS_SELECTOR, "nav a[aria-current=page]")


def test_times_are_in_the_schedules_zone_with_utc_on_hover(server: ServerProcess, driver: WebDriver) -> None:
    """A Berlin schedule in a Berlin browser: its own zone's time, and only how far away beside it (the
    viewer's zone is the same); UTC on hover. tests/browser/test_console.py views it from New York."""
    open_page(driver, server, "/schedules/nightly-reset", "nightly-reset")

    def first_upcoming(d: WebDriver) -> tuple[str, str, str]:
        (first,) = d.find_elements(By.CSS_SELECTOR, "[data-testid=upcoming] li")[:1]
        beside = first.find_element(By.CSS_SELECTOR, "[data-testid=zone-viewer]")
        own = first.find_element(By.CSS_SELECTOR, "[data-testid=zone-own]")
        return str(own.text), str(beside.text), str(beside.get_attribute("title") or "")

    own, beside, title = wait(
        driver, lambda d: (t := first_upcoming(d))[2].endswith("(UTC)") and t, "the title"
    )
    # 02:00 in Berlin is shown as 02:00 CET (the schedule's zone) and as 01:00Z (winter) on hover.
    assert re.match(r"\d{4}-\d\d-\d\d 02:00 (CET|CEST)$", own), own
    assert re.match(r"^· in ", beside) and "yours" not in beside, beside
    assert re.search(r"T0[01]:00:00Z \(UTC\)$", title), title


def test_follow_a_schedule_from_the_list_to_its_runs_grid(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/schedules", "Schedules")
    wait(driver, lambda d: len(by_testid(d, "schedule-row")) == 4, "four schedules")
    driver.find_element(By.TAG_NAME, "body").send_keys("/")  # the keyboard way to the filter
    search = visible(driver, "filter-search")
    assert driver.switch_to.active_element == search
    search.send_keys("nightly")
    wait(driver, lambda d: len(by_testid(d, "schedule-row")) == 1, "the filter to leave one row")
    assert "search=nightly" in driver.current_url

    # A refresh swaps the table but keeps what was typed, and where the keyboard was.
    before = text(driver, "live-status")
    wait(driver, lambda d: text(d, "live-status") != before, "a refresh")
    assert search.get_attribute("value") == "nightly" and driver.switch_to.active_element == search

    row_text = read(driver, lambda d: str(by_testid(d, "schedule-row")[0].text))
    assert "every day at 02:00 Europe/Berlin" in row_text and "Power Reset" in row_text
    strip = read(
        driver,
        lambda d: by_testid(by_testid(d, "schedule-row")[0], "run-strip")[0].get_attribute("data-runs"),
    )
    assert strip == "1"
    read(driver, lambda d: by_testid(d, "schedule-link")[0].click())
    wait(driver, lambda d: h1(d) == "nightly-reset", "the schedule page")
    assert len(by_testid(driver, "grid-column")) == 1
    assert read(driver, lambda d: [r.get_attribute("data-rack") for r in by_testid(d, "grid-row")]) == [
        "r1",
        "r2",
    ]
    status = read(driver, lambda d: by_testid(d, "grid-cell")[0].get_attribute("data-status"))
    assert status in ("pending", "running", "completed")
    read(driver, lambda d: by_testid(d, "grid-cell")[0].click())
    wait(driver, lambda d: re.fullmatch(r"Power Reset on r[12]", h1(d)) is not None, "the task page")


def test_a_two_character_search_says_when_it_has_looked_through_every_schedule(
    server: ServerProcess, driver: WebDriver
) -> None:
    """A search of one or two characters looks through a bounded part of the list a page (10,000 schedules;
    tests/web checks the pages that search on): over four schedules its first page reaches the end, and
    says so where a longer search shows its pager, also after a refresh."""
    open_page(driver, server, "/schedules", "Schedules")
    search = visible(driver, "filter-search")
    search.send_keys("me")
    wait(driver, lambda d: "search=me" in d.current_url, "the search in the address")
    wait(driver, lambda d: len(by_testid(d, "schedule-row")) == 3, "the three names holding 'me'")
    assert "looked through every schedule" in text(driver, "search-done")
    assert not by_testid(driver, "pager") and not by_testid(driver, "search-on")
    before = text(driver, "live-status")
    wait(driver, lambda d: text(d, "live-status") != before, "a refresh")
    assert "looked through every schedule" in text(driver, "search-done")
    search.send_keys("-")  # "me-": three characters, an index answers it: the pager again
    wait(driver, lambda d: bool(by_testid(d, "pager")), "the pager of a longer search")


def test_pause_with_a_confirmation_and_see_the_badge(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/schedules/pause-me", "pause-me")
    assert text(driver, "schedule-state").endswith("enabled")
    visible(driver, "action-pause").click()
    visible(driver, "confirm-cancel").click()  # changed our mind: nothing happens
    assert text(driver, "schedule-state").endswith("enabled")

    visible(driver, "action-pause").click()  # this time with a reason and an end
    dialog = visible(driver, "confirm-dialog")
    assert dialog.find_element(By.TAG_NAME, "h2").text == "Pause pause-me?"
    visible(driver, "pause-reason").send_keys("PSU swap, INC-4411")
    visible(driver, "pause-resume-at").send_keys("2099-01-01T06:00:00Z")
    visible(driver, "confirm-ok").click()
    wait(driver, lambda d: text(d, "schedule-state").endswith("paused"), "the paused badge")
    assert text(driver, "flash") == "Paused pause-me"
    assert visible(driver, "paused-note") and not by_testid(driver, "action-pause")
    assert text(driver, "paused-reason") == "PSU swap, INC-4411"
    assert "2099-01-01" in text(driver, "pause-resumes")

    open_page(driver, server, "/audit", "Audit trail")
    newest = read(driver, lambda d: by_testid(d, "audit-row")[0].get_attribute("data-method"))
    assert newest == "PauseTaskSchedule"
    open_page(driver, server, "/schedules/pause-me", "pause-me")
    confirm(driver, "action-resume")
    wait(driver, lambda d: text(d, "schedule-state").endswith("enabled"), "the enabled badge")


def test_trigger_and_watch_the_new_column_appear(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/schedules/trigger-me", "trigger-me")
    assert by_testid(driver, "no-runs")
    assert confirm(driver, "action-trigger") == "Run trigger-me now?"
    wait(driver, lambda d: len(by_testid(d, "grid-column")) == 1, "the first column")
    statuses = read(driver, lambda d: [c.get_attribute("data-status") for c in by_testid(d, "grid-cell")])
    assert len(statuses) == 2 and set(statuses) <= {"pending", "running"}
    assert read(driver, lambda d: by_testid(d, "grid-column")[0].get_attribute("data-trigger")) == "manual"
    wait(
        driver,
        lambda d: {c.get_attribute("data-status") for c in by_testid(d, "grid-cell")} == {"running"},
        "both racks' tasks to run (the page refreshes itself)",
    )
    # Again, while those tasks still run: both racks refuse the operation (conflict), so the trigger is
    # refused and says why on the page, but the firing happened: a second column, every cell failed.
    confirm(driver, "action-trigger")
    error = wait(
        driver,
        lambda d: "FAILED_PRECONDITION" in text(d, "action-error") and text(d, "action-error"),
        "the refusal",
    )
    assert error.startswith("Trigger now refused (FAILED_PRECONDITION)") and "r4" in error and "r5" in error
    wait(driver, lambda d: len(by_testid(d, "grid-column")) == 2, "the second column")
    cells = read(driver, lambda d: [c.get_attribute("data-status") for c in by_testid(d, "grid-cell")])
    assert sorted(cells)[:2] == ["failed", "failed"]


def test_cancel_a_task(server: ServerProcess, driver: WebDriver) -> None:
    stub = server.stub()
    (schedule,) = [
        s
        for s in stub.ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
        if s.name == "cancel-me"
    ]
    (task_id,) = stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id)).task_ids
    open_page(driver, server, "/tasks?schedule=cancel-me", "Tasks")
    assert read(driver, lambda d: [r.get_attribute("data-task") for r in by_testid(d, "task-row")]) == [
        task_id.id
    ]
    # The confirmation names the task and its rack: rows of one operation look alike.
    assert confirm(driver, "action-cancel") == f"Cancel the power on task {task_id.id[-8:]} on r6?"
    wait(
        driver,
        lambda d: [r.get_attribute("data-status") for r in by_testid(d, "task-row")] == ["terminated"],
        "the task to be terminated",
    )
    assert text(driver, "flash").startswith("Cancelled task ")
    assert not by_testid(driver, "action-cancel")
    open_page(driver, server, f"/tasks/{task_id.id}", "Power On on r6")
    assert text(driver, "task-status").endswith("terminated")
    assert "cancelled by user" in text(driver, "task-message")
    # Its firing is still recorded: linked (a pruned one is said instead, tests/web/test_console_pages.py).
    (firing,) = by_testid(driver, "task-run-link")
    assert firing.is_displayed() and "/runs/" in (firing.get_attribute("href") or "")
    assert not by_testid(driver, "task-run-pruned")


def test_a_refresh_keeps_the_focus_on_the_same_tasks_cancel(server: ServerProcess, driver: WebDriver) -> None:
    """The page refreshes itself. A task arriving at the top (newest first) moves the rows down; the Cancel
    button that had the keyboard's focus must still be the same task's after the refresh, not the one now
    in its place, which an Enter would cancel instead."""
    stub = server.stub()
    create_racks(stub, ["f1", "f2", "f3"], components_per_rack=6)  # 6 steps of 4 s: live through the test

    def power_on(rack: str) -> str:
        target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=rack)]))
        (task_id,) = stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target)).task_ids
        return str(task_id.id)

    older, newer = power_on("f1"), power_on("f2")
    open_page(driver, server, "/tasks", "Tasks")
    cancel_older = f"/api/v1/tasks/{older}:cancel"

    def focus() -> str:
        return str(driver.execute_script("return document.activeElement.getAttribute('data-post') || ''"))

    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, f'[data-post="{cancel_older}"]'), "its Cancel")
    read(
        driver,
        lambda d: d.execute_script(
            "arguments[0].focus()", d.find_element(By.CSS_SELECTOR, f'[data-post="{cancel_older}"]')
        ),
    )
    assert focus() == cancel_older
    arrived = power_on("f3")
    wait(
        driver,
        lambda d: arrived in [r.get_attribute("data-task") for r in by_testid(d, "task-row")],
        "the new task's row (a refresh)",
    )
    assert focus() == cancel_older, f"the focus moved to another task's button (newer: {newer})"
    for task_id in (older, newer, arrived):
        stub.CancelTask(pb.CancelTaskRequest(task_id=pb.UUID(id=task_id)))


def test_a_refused_filter_is_said_on_the_page_and_the_form_stays(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/tasks", "Tasks")
    rack = visible(driver, "filter-rack")
    rack.send_keys("nowhere\n")
    wait(driver, lambda d: "no rack named 'nowhere'" in text(d, "action-error"), "the refusal")
    assert (
        "rack=nowhere" in driver.current_url
        and visible(driver, "filter-rack").get_attribute("value") == "nowhere"
    )
    rack.clear()
    rack.send_keys("r6\n")
    wait(driver, lambda d: all(r.get_attribute("data-task") for r in by_testid(d, "task-row")), "r6's tasks")
    assert not [e for e in by_testid(driver, "action-error") if e.is_displayed()]


def test_windows_page_lists_a_window_and_a_budget_and_a_schedule_shows_its_policy(
    server: ServerProcess, driver: WebDriver
) -> None:
    """An ALLOW window (it binds dispatched firings only, and nothing comes due here) on the page."""
    stub = server.stub()
    stub.CreateMaintenanceWindow(
        pb.CreateMaintenanceWindowRequest(
            window=pb.MaintenanceWindow(
                name="sat-night",
                kind=pb.WINDOW_KIND_ALLOW,
                recurring=pb.RecurringWindow(cron="0 22 * * 6", duration="6h", timezone="Europe/Berlin"),
                racks=[pb.WindowTarget(name="r3")],
                reason="agreed with the tenants",
            )
        )
    )
    open_page(driver, server, "/windows", "Maintenance windows")
    wait(driver, lambda d: len(by_testid(d, "window-row")) == 1, "the window's row")
    row = read(driver, lambda d: str(by_testid(d, "window-row")[0].text))
    assert "sat-night" in row and 'cron "0 22 * * 6" Europe/Berlin for 6h' in row and "r3" in row
    assert read(driver, lambda d: text(d, "window-kind")) == "allow"
    stub.CreateOperationBudget(
        pb.CreateOperationBudgetRequest(
            budget=pb.OperationBudget(
                name="fw", operations=["upgrade_firmware"], max_running=8, max_running_per_domain=2
            )
        )
    )
    try:  # the page refreshes its live regions: the new budget appears without a reload
        wait(driver, lambda d: len(by_testid(d, "budget-row")) == 1, "the budget's row")
        budget = read(driver, lambda d: str(by_testid(d, "budget-row")[0].text))
        assert "fw" in budget and "upgrade_firmware" in budget
        assert read(driver, lambda d: text(d, "budget-running")) == "0 of 8"
        assert (
            read(driver, lambda d: " ".join(text(d, "budget-per-domain").split())) == "0 of 2 in the fullest"
        )
    finally:
        (created,) = stub.ListOperationBudgets(pb.ListOperationBudgetsRequest()).budgets
        stub.DeleteOperationBudget(pb.DeleteOperationBudgetRequest(id=created.id))
    open_page(driver, server, "/schedules/pause-me", "pause-me")
    assert text(driver, "schedule-window-policy").startswith("skip")


def test_the_runs_grid_of_more_racks_than_a_page_pages_them(server: ServerProcess, driver: WebDriver) -> None:
    """101 racks: the grid shows the first 100 by name, Next shows the last, and the page's refresh keeps
    that page. Last in this module: its racks and schedule would change the lists the others count."""
    stub = server.stub()
    names = [f"g{i:03d}" for i in range(101)]
    create_racks(stub, names)
    create_schedules(stub, [schedule_request("wide-grid", names, spec_type=INTERVAL, spec="24h")])
    (wide,) = [
        s
        for s in stub.ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
        if s.name == "wide-grid"
    ]
    stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=wide.id))

    def racks(d: WebDriver) -> list[str]:
        return [str(r.get_attribute("data-rack")) for r in by_testid(d, "grid-row")]

    open_page(driver, server, "/schedules/wide-grid", "wide-grid")
    assert read(driver, racks) == names[:100]
    assert "1–100 of 101" in text(driver, "pager")
    visible(driver, "pager-next").click()
    wait(driver, lambda d: racks(d) == ["g100"], "the second page of racks")
    assert "page=2" in driver.current_url and len(by_testid(driver, "grid-cell")) == 1
    before = text(driver, "live-status")
    wait(driver, lambda d: text(d, "live-status") != before, "a refresh")
    assert read(driver, racks) == ["g100"] and "101–101 of 101" in text(driver, "pager")


def test_the_audit_page_shows_the_schedules_a_rack_deletion_changed(
    server: ServerProcess, driver: WebDriver
) -> None:
    """DeleteRack takes its rack out of schedules' scopes: its row names each schedule it changed, and its
    JSON says what became of each scope entry."""
    stub = server.stub()
    (rack,) = create_racks(stub, ["leaves-scope"])
    create_schedules(
        stub, [schedule_request("loses-a-rack", ["leaves-scope"], spec_type=INTERVAL, spec="24h")]
    )
    stub.DeleteRack(pb.DeleteRackRequest(id=rack.id))

    open_page(driver, server, "/audit", "Audit trail")
    row = by_testid(driver, "audit-row")[0]
    assert row.get_attribute("data-method") == "DeleteRack"
    kinds = {
        t.get_attribute("data-kind"): t.text
        for t in row.find_elements(By.CSS_SELECTOR, "[data-testid=audit-target]")
    }
    assert "loses-a-rack" in kinds["schedule"]
    row.find_element(By.TAG_NAME, "summary").click()
    changes = visible(driver, "audit-changes").text
    assert '"scope_entry": "removed"' in changes and '"schedule_name": "loses-a-rack"' in changes

    # The schedule's history: the filter by target, typed as the schedule's name; a name nothing has is
    # refused on the page, naming the field, and the form stays.
    target = visible(driver, "filter-target")
    target.send_keys("no-such-thing\n")
    wait(driver, lambda d: "target: no rack, schedule" in text(d, "action-error"), "the refusal")
    target.clear()
    target.send_keys("loses-a-rack\n")

    def history(d: WebDriver) -> list[str]:
        return [str(r.get_attribute("data-method")) for r in by_testid(d, "audit-row")]

    wait(driver, lambda d: history(d) == ["DeleteRack", "CreateTaskSchedule"], "the schedule's history")
    assert "target=" in driver.current_url and text(driver, "target-done")
    assert not [e for e in by_testid(driver, "action-error") if e.is_displayed()]


def test_the_audit_page_goes_on_by_token_past_rows_kept_whole(
    server: ServerProcess, driver: WebDriver, served_db_url: str
) -> None:
    """Rows a release before the audit's byte bounds stored whole (a megabyte each) fill a page's bytes
    before its 50 events: the page ends early and its "Next" goes on by token, every row shown once."""
    methods = ["CreateRack", "DeleteRack", "PauseTaskSchedule", "ResumeTaskSchedule", "DeleteTaskSchedule"]
    at = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
    engine = create_engine(served_db_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(audit_events),
                [
                    {
                        "id": new_id(),
                        "at": at - timedelta(seconds=i),
                        "principal": "kept-whole",
                        "method": method,
                        "target_ids": [],
                        "outcome": "INVALID_ARGUMENT",
                        "error": "too long",
                        "request": {"description": "y" * (1024 * 1024)},
                    }
                    for i, method in enumerate(methods)
                ],
            )
    finally:
        engine.dispose()

    open_page(driver, server, "/audit?principal=kept-whole", "Audit trail")
    shown: list[str] = []
    while True:
        rows = wait(driver, lambda d: by_testid(d, "audit-row"), "a page of rows")
        found = [str(r.get_attribute("data-method")) for r in rows]
        assert 0 < len(found) < len(methods) or shown, "the first page ends early"
        shown += found
        following = by_testid(driver, "target-next")
        if not following:
            break
        assert not by_testid(driver, "pager")  # page numbers would skip what lies between
        following[0].click()

        def turned(d: WebDriver, before: str = found[0]) -> bool:
            return str(by_testid(d, "audit-row")[0].get_attribute("data-method")) != before

        wait(driver, turned, "the next page")
    assert shown == methods
    assert text(driver, "target-done")


# Each link of the top bar, and the refresh status beside them: whether all of it is inside the window.
TOP_BAR_SHOWN = """
return Array.from(document.querySelectorAll('.top nav a, #live')).map((e) => {
  const box = e.getBoundingClientRect();
  return [e.textContent.trim(), box.left >= 0 && box.right <= window.innerWidth];
});
"""


@pytest.mark.parametrize("width", [500, 720])
def test_in_a_narrow_window_every_page_link_and_the_refresh_status_are_in_view(
    server: ServerProcess, driver: WebDriver, width: int
) -> None:
    """A window beside a terminal, or a phone: the top bar's links wrap rather than run off its edge, where
    Notifications, Audit and whether the page is live could not be seen."""
    size = driver.get_window_size()
    driver.set_window_size(width, 900)
    try:
        open_page(driver, server, "/schedules", "Schedules")
        shown = driver.execute_script(TOP_BAR_SHOWN)
        assert [name for name, inside in shown if not inside] == [], shown
        assert len(shown) == 8
    finally:
        driver.set_window_size(size["width"], size["height"])


def test_a_page_past_the_end_says_so_and_links_the_last(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/tasks?page=9", "Tasks")
    assert text(driver, "pager-past").startswith("page 9 is past the end: ")
    visible(driver, "pager-last").click()
    wait(driver, lambda d: by_testid(d, "task-row"), "the last page's tasks")
    # The last page: which it is depends on the tasks the module's earlier tests made (xdist's order).
    last = re.search(r"/tasks\?page=(\d+)$", driver.current_url)
    assert last is not None and 1 <= int(last.group(1)) < 9 and not by_testid(driver, "pager-past")
