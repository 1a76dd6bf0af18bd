"""A rollout in a real headless Chromium against a real `rackflow serve`, on SQLite and PostgreSQL: the
operator triggers it from the schedule's page, watches its progress refresh itself, sees it halt on an
injected failure with the reason, resumes it from the page and sees it finish; and a run's page says
what holds a rack's task and why (a pre-flight check)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import text, visible, wait
from tests.browser.test_dashboard import confirm, open_page
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, schedule_request

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Four racks whose one-step tasks take a second; the second rack by name fails."""
    started = start_server(
        served_db_url,
        tmp_path_factory.mktemp("browser-rollouts"),
        args=["--http-listen", "127.0.0.1:0"],
        env={"RACKFLOW_SIM_STEP_SECONDS": "1", "RACKFLOW_SIM_FAIL_IDS": "ro-2-c0"},
        name="rollouts",
    )
    stub = started.stub()
    names = [f"ro-{i}" for i in range(1, 5)]
    create_racks(stub, names)
    request = schedule_request("fw-rollout", names, spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    request.schedule.rollout.CopyFrom(pb.RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1))
    stub.CreateTaskSchedule(request)
    # A rack whose power-ons a pre-flight check holds: it asks an Alertmanager that is not there, and fails
    # closed.
    create_racks(stub, ["held-1"])
    unreachable = pb.AlertmanagerCheck(url="http://127.0.0.1:9", matchers=['rack="{rack.name}"'])
    check = pb.PreflightCheck(
        name="no-alerts", racks=[pb.WindowTarget(name="held-1")], alertmanager=unreachable, interval="1s"
    )
    stub.CreatePreflightCheck(pb.CreatePreflightCheckRequest(check=check))
    stub.CreateTaskSchedule(
        schedule_request("held-fw", ["held-1"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    )
    yield started
    assert started.stop() == 0, started.output


def test_trigger_watch_it_halt_resume_and_finish(server: ServerProcess, driver: WebDriver) -> None:
    open_page(driver, server, "/schedules/fw-rollout", "fw-rollout")
    assert text(driver, "schedule-rollout") == "max 1, halt after 1, pause on halt"
    assert confirm(driver, "action-trigger") == "Run fw-rollout now?"
    visible(driver, "rollout-panel")
    # The first wave shows racks waiting their turn, unless a slow page first renders after the halt
    # (racks take a second each); either way the halt below appears without a reload.
    wait(
        driver,
        lambda d: "waiting their turn" in text(d, "rollout-counts") or "halted" in text(d, "rollout-state"),
        "the rollout's first wave",
    )
    reason = wait(
        driver,
        lambda d: "rollout halted" in text(d, "rollout-reason") and text(d, "rollout-reason"),
        "the rollout to halt on the injected failure (the page refreshes itself)",
    )
    assert reason == "rollout halted: 1 of 4 racks failed (limit 1)"
    assert text(driver, "rollout-state").endswith("halted")
    # The halt pauses the schedule in the same transaction, but the page reads the schedule before the run
    # (each in its own snapshot on PostgreSQL): a refresh between the two shows the pause one refresh late.
    wait(driver, lambda d: text(d, "schedule-state").endswith("paused"), "the schedule paused by the halt")
    assert text(driver, "rollout-counts") == "1 of 4 succeeded, 1 failed, 2 not started"

    assert confirm(driver, "action-resume-run") == "Resume this rollout?"
    wait(
        driver,
        lambda d: text(d, "rollout-counts") == "3 of 4 succeeded, 1 failed",
        "the resumed rollout to finish",
    )
    # Its last task may end before the rollout's next step records the run finished: wait for that step.
    wait(driver, lambda d: text(d, "rollout-state").endswith("partial"), "the rollout to finish, partial")
    assert not driver.find_elements("css selector", '[data-testid="action-cancel-run"]')


def test_a_runs_page_says_what_holds_a_racks_task(server: ServerProcess, driver: WebDriver) -> None:
    stub = server.stub()
    listed = stub.ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
    [schedule] = [s for s in listed if s.name == "held-fw"]
    stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))

    def held_outcome() -> pb.ScopeOutcome | None:
        runs = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs
        found = [o for run in runs for o in run.outcomes if "cannot" in o.held_reason]
        return found[0] if found else None

    outcome = wait(
        driver, lambda _: held_outcome(), "the check to hold the rack's task, in the run's outcome"
    )
    assert outcome.held_by == "preflight" and outcome.task_status == pb.TASK_STATUS_PENDING
    assert outcome.held_reason.startswith("pre-flight check 'no-alerts': alertmanager:")
    [run] = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs
    open_page(driver, server, f"/runs/{run.id.id}", "Firing of")
    assert text(driver, "run-held") == "held by preflight"
    assert text(driver, "run-held-reason") == outcome.held_reason
