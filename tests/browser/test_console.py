"""The operator console in a real headless Chromium against a real `rackflow serve` (SQLite: some tests
write a run's state straight into its file): every run state's badge on the run page, the run page reached
from a schedule's runs grid, a halted rollout's segmented bar, Resume and Cancel from the run page, the
pause dialog keeping what was typed on an error, a Berlin schedule's times seen from New York, and a start
gate's refusal on a task still RUNNING, then the task its takeover ended; a check's URL in the list of
checks, its query's values hidden."""

from __future__ import annotations

import re
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.domain.schedules import RunState
from rackflow.domain.tasks import Fail, TaskStatus
from rackflow.store.tables import instances, tasks
from rackflow.store.tasks import NOT_HELD, refusal_json
from rackflow.v1 import flow_pb2 as pb
from rackflow.web.views import RUN_LOOKS
from tests.browser.chromium import Browser
from tests.browser.page import by_testid, read, text, visible, wait
from tests.browser.test_dashboard import confirm, h1, open_page
from tests.checks_support import Answer, receiving
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request, wait_until
from tests.unit.test_cli_commands import stamp

pytestmark = pytest.mark.slow

INTERVAL, CRON = pb.SCHEDULE_SPEC_TYPE_INTERVAL, pb.SCHEDULE_SPEC_TYPE_CRON


@pytest.fixture(scope="module")
def database(served_db_url: str) -> Path:
    return Path(served_db_url.removeprefix("sqlite:///"))


@pytest.fixture(scope="module")
def server(database: Path) -> Iterator[ServerProcess]:
    """Racks whose one-step tasks take 3 s (a resumed rollout of three racks rolls for 9 s: long enough to
    be seen rolling on a busy machine); the first rack of each rollout fails."""
    started = start_server(
        f"sqlite:///{database}",
        database.parent,
        args=["--http-listen", "127.0.0.1:0"],
        env={"RACKFLOW_SIM_STEP_SECONDS": "3", "RACKFLOW_SIM_FAIL_IDS": "a1-c0,b1-c0"},
        name="console",
    )
    stub = started.stub()
    create_racks(stub, ["p1", "p2", "a1", "a2", "a3", "a4", "b1", "b2", "q1", "q2", "s1"])
    requests = [
        schedule_request("plain", ["p1", "p2"], spec_type=INTERVAL, spec="24h"),
        schedule_request("states", ["s1"], spec_type=INTERVAL, spec="24h"),
        schedule_request("pause-me", ["q1"], spec_type=INTERVAL, spec="24h"),
        schedule_request("doomed", ["q2"], spec_type=INTERVAL, spec="24h"),
        schedule_request("berlin", ["q2"], spec_type=CRON, spec="0 2 * * *", timezone="Europe/Berlin"),
    ]
    for name, racks in (("roll-a", ["a1", "a2", "a3", "a4"]), ("roll-b", ["b1", "b2"])):
        request = schedule_request(name, racks, spec_type=INTERVAL, spec="24h")
        request.schedule.rollout.CopyFrom(pb.RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1))
        requests.append(request)
    create_schedules(stub, requests)
    stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule_id(started, "states")))
    yield started
    assert started.stop() == 0, started.output


def schedule_id(server: ServerProcess, name: str) -> pb.UUID:
    schedules = server.stub().ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
    (found,) = [s for s in schedules if s.name == name]
    return found.id


def badge(driver: WebDriver, testid: str) -> tuple[str, str]:
    """A badge's label (its glyph left out) and its colour class."""

    def look(d: WebDriver) -> tuple[str, str]:
        element = visible(d, testid)  # looked up again when a refresh swapped it
        return str(element.text)[1:].strip(), str(element.get_attribute("class"))

    return read(driver, look)


def segments(driver: WebDriver) -> dict[str, int]:
    return read(
        driver,
        lambda d: {
            str(s.get_attribute("data-kind")): int(str(s.get_attribute("data-count")))
            for s in by_testid(d, "bar-segment")
        },
    )


def test_the_run_page_from_a_schedules_runs_grid(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/schedules/plain", "plain")
    confirm(driver, "action-trigger")
    wait(driver, lambda d: len(by_testid(d, "grid-column")) == 1, "the firing's column")
    read(driver, lambda d: by_testid(d, "grid-run-link")[0].click())
    wait(driver, lambda d: h1(d).startswith("Firing of"), "the run page")
    assert re.fullmatch(r"/runs/[0-9a-f-]{36}", driver.current_url.split(server.http_url)[1])
    racks = read(driver, lambda d: [r.get_attribute("data-rack") for r in by_testid(d, "run-rack")])
    assert racks == ["p1", "p2"]
    assert read(driver, lambda d: len(by_testid(d, "run-task-link"))) == 2
    wait(driver, lambda d: badge(d, "run-verdict")[0] == "succeeded", "both racks to succeed")
    assert segments(driver) == {"succeeded": 2}
    legend = text(driver, "bar-legend")
    assert "not started 0" in legend and "succeeded 2" in legend
    visible(driver, "run-schedule").click()
    wait(driver, lambda d: h1(d) == "plain", "back to the schedule")


@pytest.mark.parametrize("state", ["running", "completed", "interrupted", "halted", "cancelled", "skipped"])
def test_each_run_states_badge(
    server: ServerProcess, driver: WebDriver, database: Path, state: RunState
) -> None:
    """A plain firing's row given each state (rolling is a live rollout's: the test below sees it)."""
    stub = server.stub()
    plain = schedule_id(server, "plain")
    runs = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=plain)).runs
    if not runs:  # this test may run alone, or on another worker than the one that fired `plain`
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=plain))
        runs = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=plain)).runs
    run_id = runs[0].id.id
    with sqlite3.connect(database) as db:
        db.execute("UPDATE task_schedule_run SET state = ? WHERE id = ?", (state, uuid.UUID(run_id).hex))
    try:
        open_page(driver, server, f"/runs/{run_id}", "Firing of")
        label, css = badge(driver, "run-state")
        assert (label, css) == (RUN_LOOKS[state].label, f"badge {RUN_LOOKS[state].css}")
    finally:
        with sqlite3.connect(database) as db:
            db.execute(
                "UPDATE task_schedule_run SET state = 'completed' WHERE id = ?", (uuid.UUID(run_id).hex,)
            )


def test_a_halted_rollouts_bar_resume_and_cancel_on_its_page(
    server: ServerProcess, driver: WebDriver
) -> None:
    stub = server.stub()
    for name in ("roll-a", "roll-b"):
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule_id(server, name)))
    open_page(driver, server, "/schedules/roll-a", "roll-a")
    visible(driver, "rollout-link").click()
    wait(driver, lambda d: h1(d).startswith("Rollout of"), "the rollout's page")
    wait(driver, lambda d: badge(d, "run-state")[0] == "halted", "the rollout to halt on a1's failure")
    assert badge(driver, "run-verdict") == ("halted", "badge st-fail")
    # Not a full green bar: 1 failed and 3 never started, and the legend names "not started".
    assert segments(driver) == {"failed": 1, "not_started": 3}
    assert "not started 3" in text(driver, "bar-legend")
    assert text(driver, "run-reason") == "rollout halted: 1 of 4 racks failed (limit 1)"
    outcomes = read(
        driver, lambda d: sorted(str(r.get_attribute("data-outcome")) for r in by_testid(d, "run-rack"))
    )
    assert outcomes == ["not_started", "not_started", "not_started", "submitted"]

    assert confirm(driver, "action-resume-run") == "Resume this rollout?"
    wait(driver, lambda d: badge(d, "run-state")[0] == "rolling", "the resumed rollout to roll")
    assert badge(driver, "run-verdict")[0] == "rolling"  # its failure before the resume does not mark it
    wait(driver, lambda d: badge(d, "run-state")[0] == "completed", "the rollout to finish")
    assert badge(driver, "run-verdict") == ("partial", "badge st-part")  # 1 of 4 failed, not all
    assert segments(driver) == {"succeeded": 3, "failed": 1}
    assert not by_testid(driver, "action-cancel-run")

    open_page(driver, server, "/schedules/roll-b", "roll-b")
    visible(driver, "rollout-link").click()
    wait(driver, lambda d: badge(d, "run-state")[0] == "halted", "roll-b to halt")
    assert confirm(driver, "action-cancel-run") == "Cancel this rollout?"
    wait(driver, lambda d: badge(d, "run-state")[0] == "cancelled", "the rollout to be cancelled")
    assert badge(driver, "run-verdict") == ("cancelled", "badge st-stop")  # not "failed"
    assert not by_testid(driver, "action-resume-run") and not by_testid(driver, "action-cancel-run")


def test_the_pause_dialog_takes_a_duration_and_keeps_its_input_on_an_error(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules/pause-me", "pause-me")
    visible(driver, "action-pause").click()
    visible(driver, "pause-reason").send_keys("PSU swap, INC-4411")
    resume = visible(driver, "pause-resume-at")
    resume.send_keys("2 hours")
    visible(driver, "confirm-ok").click()
    error = wait(driver, lambda d: text(d, "confirm-error"), "the dialog's error")
    assert error.startswith('Resume: "2 hours" is neither a duration (for 2h, 90m, 1h30m) nor a time')
    assert visible(driver, "confirm-dialog").is_displayed()
    assert visible(driver, "pause-reason").get_attribute("value") == "PSU swap, INC-4411"
    resume.clear()
    resume.send_keys("2000-01-01 06:00")
    visible(driver, "confirm-ok").click()
    wait(driver, lambda d: "has passed" in text(d, "confirm-error"), "a time that has passed")
    resume.clear()
    resume.send_keys("for 2h\n")  # Enter confirms
    wait(driver, lambda d: text(d, "schedule-state").endswith("paused"), "the paused badge")
    assert not visible_dialog(driver)
    assert text(driver, "paused-reason") == "PSU swap, INC-4411"
    resumes = read(driver, lambda d: d.find_element(By.CSS_SELECTOR, "[data-testid=pause-resumes] time"))
    assert read(driver, lambda d: "in 2h" in str(resumes.text) or "in 1h 59m" in str(resumes.text))

    # The server refuses (the schedule was deleted meanwhile): its message, in the dialog, input kept.
    open_page(driver, server, "/schedules/doomed", "doomed")
    visible(driver, "action-pause").click()
    visible(driver, "pause-reason").send_keys("rack q2 out")
    visible(driver, "pause-resume-at").send_keys("90m")
    server.stub().DeleteTaskSchedule(pb.DeleteTaskScheduleRequest(id=schedule_id(server, "doomed")))
    visible(driver, "confirm-ok").click()
    error = wait(
        driver, lambda d: "NOT_FOUND" in text(d, "confirm-error") and text(d, "confirm-error"), "refusal"
    )
    assert error.startswith("Pause refused (NOT_FOUND): id: ") and "Available Fields" not in error
    assert visible(driver, "pause-reason").get_attribute("value") == "rack q2 out"
    assert visible(driver, "pause-resume-at").get_attribute("value") == "90m"
    visible(driver, "confirm-cancel").click()
    assert not visible_dialog(driver)


def visible_dialog(driver: WebDriver) -> bool:
    return any(d.is_displayed() for d in by_testid(driver, "confirm-dialog"))


def test_a_berlin_schedule_seen_from_new_york(server: ServerProcess) -> None:
    new_york = Browser(timezone="America/New_York")
    try:
        driver = new_york.driver
        open_page(driver, server, "/schedules/berlin", "berlin")
        first = wait(
            driver,
            lambda d: (items := d.find_elements(By.CSS_SELECTOR, "[data-testid=upcoming] li")) and items[0],
            "the upcoming firings",
        )
        own = read(driver, lambda d: str(first.find_element(By.CSS_SELECTOR, "[data-testid=zone-own]").text))
        assert re.fullmatch(r"\d{4}-\d\d-\d\d 02:00 CES?T", own), own
        beside = wait(
            driver,
            lambda d: str(first.find_element(By.CSS_SELECTOR, "[data-testid=zone-viewer]").text) or False,
            "the viewer's time beside",
        )
        assert re.match(r"\(yours: \d{4}-\d\d-\d\d 20:00 (EST|EDT|GMT-5|GMT-4)\) · in ", beside), beside
    finally:
        new_york.close()


def test_a_refused_task_says_so_while_it_is_running_and_ends_so(
    server: ServerProcess, driver: WebDriver, database: Path
) -> None:
    """The row a claim leaves when a start gate refuses its task and its instance dies before ending it:
    RUNNING, owned by that instance, the refusal recorded (`tasks.refusal`) and said in the message
    (`task_runs.record_refusals`). Written straight into the file, on a task a freeze holds (no claim here
    takes it meanwhile), for an instance whose heartbeat is ahead (live) until the test lets it lapse: then
    this server takes the task over and ends it with the refusal."""
    stub = server.stub()
    create_racks(stub, ["g1"])
    start = datetime.now(UTC)
    freeze = stub.CreateMaintenanceWindow(
        pb.CreateMaintenanceWindowRequest(
            window=pb.MaintenanceWindow(
                name="g1-frozen",
                kind=pb.WINDOW_KIND_FREEZE,
                one_off=pb.OneOffWindow(start=stamp(start), end=stamp(start + timedelta(hours=1))),
                racks=[pb.WindowTarget(name="g1")],
            )
        )
    )
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="g1")]))
    (task_id,) = stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target)).task_ids
    wait_until(
        lambda: stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[task_id])).tasks[0].held_by == "freeze",
        30,
        what="the freeze to hold the task",
    )
    reason = "pre-flight check 'drained': not drained (pre-flight check 'drained' gave up after 2h)"
    dead, now = uuid.uuid4(), datetime.now(UTC)
    engine = sqlalchemy.create_engine(f"sqlite:///{database}")
    try:
        with engine.begin() as conn:
            conn.execute(
                instances.insert().values(
                    id=dead, host="gone", pid=1, started_at=now, heartbeat_at=now + timedelta(hours=1)
                )
            )
            written = conn.execute(
                tasks.update()
                .where(tasks.c.id == uuid.UUID(task_id.id), tasks.c.held_by == "freeze")
                .values(
                    **NOT_HELD,
                    status=TaskStatus.RUNNING.value,
                    owner_id=dead,
                    attempts=tasks.c.attempts + 1,
                    started_at=now,
                    attempt_started_at=now,
                    updated_at=now,
                    refusal=refusal_json(Fail(reason)),
                    message=reason,
                )
            )
        assert written.rowcount == 1
        open_page(driver, server, f"/tasks/{task_id.id}", "Power On on g1")
        assert text(driver, "task-status").endswith("running")
        assert text(driver, "task-refusal") == f"by a start gate: {reason} (ends failed without running)"
        assert text(driver, "task-message") == reason
        with engine.begin() as conn:
            conn.execute(
                instances.update().where(instances.c.id == dead).values(heartbeat_at=now - timedelta(hours=1))
            )
        wait(driver, lambda d: text(d, "task-status").endswith("failed"), "the takeover to end the task")
        assert text(driver, "task-message") == reason
        assert text(driver, "task-refusal") == f"by a start gate: {reason} (never ran)"
    finally:
        engine.dispose()
        stub.DeleteMaintenanceWindow(pb.DeleteMaintenanceWindowRequest(id=freeze.id))


def test_a_check_s_url_shows_its_query_values_hidden(
    server: ServerProcess, driver: WebDriver, tmp_path: Path
) -> None:
    """The list of pre-flight checks showed a check's URL whole, a hook's token in its query too; it shows
    the URL with the query's values hidden (docs/CHECKS.md, "A token in a check's URL"). The check covers
    a rack of its own, so the other tests' tasks do not wait for it."""
    stub = server.stub()
    create_racks(stub, ["sec1"])
    check = pb.PreflightCheck(
        name="tokened-hook",
        racks=[pb.WindowTarget(name="sec1")],
        webhook=pb.WebhookCheck(url="http://127.0.0.1:9/drain?token=s3cret-in-the-page&dc=eu"),
    )
    stub.CreatePreflightCheck(pb.CreatePreflightCheckRequest(check=check))
    open_page(driver, server, "/windows", "Maintenance windows")
    row = wait(
        driver,
        lambda d: next(
            (r for r in by_testid(d, "check-row") if r.get_attribute("data-name") == check.name), None
        ),
        "the check's row",
    )
    driver.execute_script("arguments[0].scrollIntoView()", row)
    driver.save_screenshot(str(tmp_path / "checks.png"))
    shown = row.text
    assert "http://127.0.0.1:9/drain?token=…&dc=…" in shown, shown
    assert "s3cret" not in str(driver.page_source)


def test_a_held_task_s_page_lists_each_check_s_answer_and_follows_its_next_round(
    server: ServerProcess, driver: WebDriver, tmp_path: Path
) -> None:
    """The task page said only the first failing check's reason (its hold); it lists every check's answer
    in the task's last round, and its live refresh follows the next one. The checks cover a rack of their
    own, so the other tests' tasks do not wait for them."""
    stub = server.stub()
    create_racks(stub, ["pf1"])
    covers = [pb.WindowTarget(name="pf1")]
    with (
        receiving(Answer({"ok": False, "reason": "3 jobs still running"})) as drained,
        receiving() as other,
    ):
        made = [
            stub.CreatePreflightCheck(
                pb.CreatePreflightCheckRequest(
                    check=pb.PreflightCheck(
                        name=name, racks=covers, interval="1s", webhook=pb.WebhookCheck(url=hook.url)
                    )
                )
            )
            for name, hook in (("drained", drained), ("inventory-ok", other))
        ]
        try:
            target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="pf1")]))
            (task_id,) = stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target)).task_ids
            open_page(driver, server, f"/tasks/{task_id.id}", "on pf1")

            def answers(d: WebDriver) -> list[tuple[str, str]]:
                return [
                    (str(r.get_attribute("data-check")), str(r.get_attribute("data-passed")))
                    for r in by_testid(d, "check-row")
                ]

            wait(driver, lambda d: answers(d) == [("drained", "false"), ("inventory-ok", "true")], "a round")
            held = read(driver, lambda d: str(by_testid(d, "check-row")[0].text))
            assert "holds it" in held and "webhook: 3 jobs still running" in held, held
            driver.save_screenshot(str(tmp_path / "task-checks.png"))
            with drained.lock:  # the hook says ready from now on
                drained.script[:] = [Answer()]
            wait(
                driver,
                lambda d: answers(d) == [("drained", "true"), ("inventory-ok", "true")],
                "the next round",
            )
        finally:
            for check in made:
                stub.DeletePreflightCheck(pb.DeletePreflightCheckRequest(id=check.id))


def test_an_alertmanager_check_stored_with_no_matcher_is_flagged_in_the_list_of_checks(
    server: ServerProcess, database: Path, driver: WebDriver, tmp_path: Path
) -> None:
    """An Alertmanager check with no matcher holds every task it applies to on any alert at all; it is
    refused since, but one stored before is still asked. The list of checks marks it, and says why and what
    to do; a check with a matcher is not marked. (Written straight into the file, as no API stores one any
    more; it covers a rack of its own, so the other tests' tasks do not wait for it.)"""
    stub = server.stub()
    create_racks(stub, ["am1"])
    made = [
        stub.CreatePreflightCheck(
            pb.CreatePreflightCheckRequest(
                check=pb.PreflightCheck(
                    name=name,
                    racks=[pb.WindowTarget(name="am1")],
                    alertmanager=pb.AlertmanagerCheck(
                        url="http://127.0.0.1:9/", matchers=['rack="{rack.name}"']
                    ),
                )
            )
        )
        for name in ("every-alert", "one-rack")
    ]
    try:
        with sqlite3.connect(database) as db:  # as a release before the refusal stored it
            db.execute(
                "UPDATE preflight_checks SET settings = json_set(settings, '$.matchers', json('[]')) "
                "WHERE name = 'every-alert'"
            )
        open_page(driver, server, "/windows", "Maintenance windows")

        def row(d: WebDriver, name: str) -> str:
            return next(
                str(r.text) for r in by_testid(d, "check-row") if r.get_attribute("data-name") == name
            )

        flagged = wait(driver, lambda d: row(d, "every-alert"), "the check's row")
        assert "matches every alert" in flagged and "would be refused today" in flagged, flagged
        assert 'alertname=~".+"' in flagged, flagged
        assert "matches every alert" not in read(driver, lambda d: row(d, "one-rack"))
        assert [e.text for e in by_testid(driver, "check-every-alert")] == ["matches every alert"]
        driver.execute_script("arguments[0].scrollIntoView()", by_testid(driver, "check-every-alert")[0])
        driver.save_screenshot(str(tmp_path / "checks-every-alert.png"))
    finally:
        for check in made:
            stub.DeletePreflightCheck(pb.DeletePreflightCheckRequest(id=check.id))
