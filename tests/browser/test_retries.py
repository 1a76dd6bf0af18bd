"""Retries in a real headless Chromium against a real `rackflow serve`, on SQLite and PostgreSQL: a task
whose steps fail retryably shows each attempt on its page; the run page's "Retry failed racks" re-runs
the failed rack as a new run, and the two runs link to each other; the schedule form sets a retry policy
(a bad value named beside its field) and the schedule's page shows it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.v1 import flow_pb2 as pb
from rackflow.web.pages import short_id
from tests.browser.page import SHOTS, by_testid, text, visible, wait
from tests.browser.test_dashboard import confirm, h1, open_page
from tests.browser.test_forms import add_rack, field, tick
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, schedule_request, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two racks; every step on the second fails retryably (as a BMC timeout would); the schedule gives
    each task two attempts, a second apart."""
    started = start_server(
        served_db_url,
        tmp_path_factory.mktemp("browser-retries"),
        args=["--http-listen", "127.0.0.1:0"],
        env={"RACKFLOW_SIM_STEP_SECONDS": "0.1", "RACKFLOW_SIM_TRANSIENT_IDS": "rt-2-c0"},
        name="retries",
    )
    stub = started.stub()
    create_racks(stub, ["rt-1", "rt-2"])
    request = schedule_request(
        "fw-retry", ["rt-1", "rt-2"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h"
    )
    request.schedule.retry.CopyFrom(pb.RetryPolicy(max_attempts=2, initial_backoff="1s", max_backoff="1s"))
    schedule = stub.CreateTaskSchedule(request)
    stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))

    def ended() -> bool:
        found = stub.ListTasks(pb.ListTasksRequest(schedule_id=schedule.id)).tasks
        return len(found) == 2 and all(
            t.status in (pb.TASK_STATUS_COMPLETED, pb.TASK_STATUS_FAILED) for t in found
        )

    wait_until(ended, 60, what="both tasks to end, the second after its two attempts")
    yield started
    assert started.stop() == 0, started.output


def _runs(server: ServerProcess) -> list[pb.TaskScheduleRun]:
    stub = server.stub()
    (schedule,) = stub.ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
    return list(stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs)


def _first_run_id(server: ServerProcess) -> str:
    return str(_runs(server)[-1].id.id)  # newest first: the last is the first run


def test_a_task_shows_each_attempt_and_the_run_retries_its_failed_rack(
    server: ServerProcess, driver: WebDriver
) -> None:
    run_id = _first_run_id(server)
    open_page(driver, server, f"/runs/{run_id}", "Firing of")
    failed = driver.find_element(By.CSS_SELECTOR, '[data-testid="run-rack"][data-rack="rt-2"]')
    assert failed.get_attribute("data-status") == "failed"
    failed.find_element(By.CSS_SELECTOR, '[data-testid="run-task-link"]').click()
    wait(driver, lambda d: "on rt-2" in d.find_element(By.CSS_SELECTOR, "main h1").text, "the task page")
    assert text(driver, "task-attempt").startswith("2 of 2")
    rows = by_testid(driver, "attempt-row")
    assert [(r.get_attribute("data-attempt"), r.get_attribute("data-status")) for r in rows] == [
        ("1", "failed"),
        ("2", "failed"),
    ]
    assert "retryable" in rows[0].text

    open_page(driver, server, f"/runs/{run_id}", "Firing of")
    assert confirm(driver, "action-retry-run") == "Retry the failed racks?"
    # The operator is taken to the run the retry fired, told so, and it links back.
    wait(driver, lambda d: by_testid(d, "run-retry-of"), "the new run's page, at once")
    retry_id = driver.current_url.rsplit("/", 1)[-1]
    assert retry_id != run_id and retry_id in [r.id.id for r in _runs(server)]
    assert "Retried the failed racks: this page is the run it fired" in visible(driver, "flash").text
    driver.save_screenshot(str(SHOTS / "retried-run.png"))
    racks = [r.get_attribute("data-rack") for r in by_testid(driver, "run-rack")]
    assert racks == ["rt-2"]
    visible(driver, "run-retry-of").click()
    wait(driver, lambda d: run_id in d.current_url, "back on the run that was retried")
    assert [link.get_attribute("href") for link in by_testid(driver, "run-retried-by-link")] == [
        f"{server.http_url}/runs/{retry_id}"
    ]
    # Retried already, it may be retried again (docs/SAFETY.md: `retried_by` lists every retry), and the
    # confirmation says so, naming the retry, so a second run is fired knowingly.
    visible(driver, "action-retry-run").click()
    asked = visible(driver, "confirm-dialog").text
    assert f"already retried, by run {short_id(retry_id)}:" in asked, asked
    driver.save_screenshot(str(SHOTS / "retried-again-confirm.png"))
    visible(driver, "confirm-cancel").click()


def test_a_retry_policy_is_set_in_the_form_named_when_bad_and_shown_on_the_schedule(
    server: ServerProcess, driver: WebDriver
) -> None:
    open_page(driver, server, "/schedules/fw-retry", "fw-retry")
    assert text(driver, "schedule-retry") == "2 attempts, back-off 1s x2 up to 1s"
    open_page(driver, server, "/schedules/new", "New schedule")
    field(driver, "form-name", "retried-here")
    add_rack(driver, "rt-1")
    tick(driver, "form-retry-on")
    field(driver, "form-retry-max_attempts", "20")
    # The preview runs as you type, so the field's cleared and half-typed values are judged too:
    # wait for the verdict on the whole value.
    wait(
        driver,
        lambda d: "must be 2..10, got 20" in text(d, "error-schedule.retry.max_attempts"),
        "the preview's error on 20",
    )
    field(driver, "form-retry-max_attempts", "4")
    field(driver, "form-retry-initial_backoff", "2m")
    visible(driver, "form-save").click()
    wait(driver, lambda d: h1(d) == "retried-here", "the new schedule's page")
    assert text(driver, "schedule-retry") == "4 attempts, back-off 2m x2 up to 10m"
