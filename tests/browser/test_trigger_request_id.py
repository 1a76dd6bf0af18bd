"""The dashboard's Trigger now (and a run's Retry failed racks) in a real headless Chromium, its answer lost
on the way back: clicked again, it sends the same request id, and the server answers the run the first click
fired instead of firing a second (`static/app.js`: an idempotent action keeps its id until an answer is
heard; docs/SCHEDULES.md). The id is kept in the tab's sessionStorage, so a reload between the two clicks
keeps it too, for a day at most; with no storage (a private window that refuses it) the page keeps it in
memory, as before."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import by_testid, text, visible, wait
from tests.browser.test_dashboard import confirm, h1, open_page
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request

pytestmark = pytest.mark.slow

# The page's next answer from an action whose URL ends with arguments[0] (":trigger") is lost after the
# server sent it, as a dropped connection loses it: the call went through, the browser hears nothing.
LOSE_THE_NEXT_ANSWER = """
const original = window.fetch;
const action = arguments[0];
let lose = true;
window.fetch = async (url, init) => {
  const response = await original(url, init);
  if (lose && String(url).endsWith(action)) {
    lose = false;
    throw new TypeError("the connection was lost");
  }
  return response;
};
"""

# Each test's schedule, on racks of its own, so that each counts its own runs.
SCHEDULES = {
    "lost-answer": "q1",
    "reloaded": "q2",
    "a-day-later": "q3",
    "no-storage": "q4",
    "retried": "q5",
    "never-sent": "q6",
    "submits-nothing": "q7",
}

# The page's next request to an action whose URL ends with arguments[0] is lost before it reaches the
# server (the connection dropped on the way there): nothing fired, the browser hears nothing.
LOSE_THE_NEXT_REQUEST = """
const original = window.fetch;
const action = arguments[0];
let lose = true;
window.fetch = async (url, init) => {
  if (lose && String(url).endsWith(action)) {
    lose = false;
    throw new TypeError("the connection was lost");
  }
  return original(url, init);
};
"""


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    started = start_server(
        served_db_url,
        tmp_path_factory.mktemp("browser"),
        args=["--http-listen", "127.0.0.1:0"],
        env={"RACKFLOW_SIM_STEP_SECONDS": "4"},
        name="request-id",
    )
    stub = started.stub()
    create_racks(stub, list(SCHEDULES.values()), components_per_rack=2)
    create_schedules(
        stub,
        [
            schedule_request(name, [rack], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
            for name, rack in SCHEDULES.items()
        ],
    )
    yield started
    assert started.stop() == 0, started.output


def schedule_named(server: ServerProcess, name: str) -> pb.TaskSchedule:
    found = server.stub().ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
    (schedule,) = [s for s in found if s.name == name]
    return schedule


def runs_of(server: ServerProcess, name: str) -> list[pb.TaskScheduleRun]:
    stub = server.stub()
    schedule = schedule_named(server, name)
    return list(stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs)


def trigger_calls(server: ServerProcess, name: str) -> list[tuple[dict[str, Any], set[str]]]:
    """Each audited trigger of the schedule, oldest first: what the page sent, and the ids it answered
    with (the schedule's and its run's tasks')."""
    stub = server.stub()
    schedule = schedule_named(server, name)
    events = stub.ListAuditEvents(pb.ListAuditEventsRequest(method="TriggerTaskSchedule")).events
    ours = [event for event in events if schedule.id.id in [target.id for target in event.target_ids]]
    ours.sort(key=lambda event: event.at.ToDatetime())
    return [(json.loads(event.request_json), {target.id for target in event.target_ids}) for event in ours]


def lose_the_first_answer(driver: WebDriver, server: ServerProcess, name: str) -> None:
    """Triggers `name` from its page, the answer lost; returns once the page shows the run it fired."""
    open_page(driver, server, f"/schedules/{name}", name)
    driver.execute_script(LOSE_THE_NEXT_ANSWER, ":trigger")
    confirm(driver, "action-trigger")
    error = wait(
        driver, lambda d: "cannot be reached" in text(d, "action-error") and text(d, "action-error"), ""
    )
    assert "the same request, which fires at most once" in error
    wait(
        driver, lambda d: len(by_testid(d, "grid-column")) == 1, "the first click's run (the page refreshes)"
    )


# What the page said of an action: its flash, or its error (a second firing of a rack whose first task is
# still running submits nothing, and is refused).
SAID = """
const shown = Array.from(document.querySelectorAll('[data-testid=flash], [data-testid=action-error]'))
  .find((e) => e.checkVisibility());
return shown ? shown.textContent : "";
"""


def said(driver: WebDriver) -> str:
    found: str = wait(driver, lambda d: d.execute_script(SAID), "the action's flash or error")
    return found


def unscript(driver: WebDriver, added: dict[str, Any]) -> None:
    """Takes away a script `Page.addScriptToEvaluateOnNewDocument` added: later pages load without it."""
    driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": added["identifier"]})


def reload(driver: WebDriver, name: str) -> None:
    driver.refresh()
    wait(driver, lambda d: name in h1(d) and not by_testid(d, "action-error")[0].is_displayed(), "the reload")


def test_a_trigger_whose_answer_was_lost_clicked_again_fires_once(
    server: ServerProcess, driver: WebDriver, tmp_path: Path
) -> None:
    lose_the_first_answer(driver, server, "lost-answer")

    confirm(driver, "action-trigger")
    assert "Triggered lost-answer" in text(driver, "flash")
    driver.save_screenshot(str(tmp_path / "after-the-second-click.png"))

    assert len(runs_of(server, "lost-answer")) == 1  # the second click fired nothing
    calls = trigger_calls(server, "lost-answer")
    assert len(calls) == 2 and calls[0][0]["request_id"] == calls[1][0]["request_id"]
    assert calls[0][0]["request_id"].startswith("web-")
    assert visible(driver, "grid-column") and len(by_testid(driver, "grid-column")) == 1


def test_a_trigger_whose_answer_was_lost_clicked_again_after_a_reload_fires_once(
    server: ServerProcess, driver: WebDriver, tmp_path: Path
) -> None:
    """The operator who heard nothing reloads the page, then clicks again: the tab kept the id."""
    lose_the_first_answer(driver, server, "reloaded")
    reload(driver, "reloaded")

    visible(driver, "action-trigger").click()
    asked = text(driver, "confirm-dialog")
    driver.save_screenshot(str(tmp_path / "the-confirmation-after-a-reload.png"))
    visible(driver, "confirm-ok").click()
    done = said(driver)
    driver.save_screenshot(str(tmp_path / "after-a-reload-and-a-second-click.png"))

    assert len(runs_of(server, "reloaded")) == 1  # the second click fired nothing
    (first, first_answer), (second, second_answer) = trigger_calls(server, "reloaded")
    assert first["request_id"] == second["request_id"]
    assert second_answer == first_answer  # the second click was answered with the first run's tasks
    assert len(by_testid(driver, "grid-column")) == 1
    # The confirmation said, before anything was sent, that this sends the unanswered request again; the
    # answer, plainly, that the earlier request had fired the run and nothing new fired (`replayed`).
    assert "went unanswered" in asked, asked
    (run,) = runs_of(server, "reloaded")
    assert done.startswith("Triggered reloaded. Your earlier request of "), done
    assert f"had already fired run {run.id.id} at " in done and "nothing new was fired" in done, done
    assert "if that one had reached" not in done, done

    # Answered, the id is forgotten: the next click is a new request, and fires.
    reload(driver, "reloaded")
    visible(driver, "action-trigger").click()
    assert "went unanswered" not in text(driver, "confirm-dialog")
    visible(driver, "confirm-ok").click()
    assert "earlier request" not in said(driver)
    wait(driver, lambda d: len(runs_of(server, "reloaded")) == 2, "the third click's run")
    third, _ = trigger_calls(server, "reloaded")[2]
    assert third["request_id"] != first["request_id"]


# A day and a minute later, for the page's clock.
A_DAY_LATER = "{ const now = Date.now; Date.now = () => now() + (24 * 60 + 1) * 60 * 1000; }"


def test_an_unanswered_trigger_is_forgotten_after_a_day(server: ServerProcess, driver: WebDriver) -> None:
    """An id kept longer than a day is not sent again: an operator who clicks then means a new firing, and
    the earlier request's run (kept as long as the server keeps runs) must not answer it silently."""
    lose_the_first_answer(driver, server, "a-day-later")
    later = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": A_DAY_LATER})
    try:
        reload(driver, "a-day-later")
        visible(driver, "action-trigger").click()
        assert "went unanswered" not in text(driver, "confirm-dialog")
        visible(driver, "confirm-ok").click()
        assert "earlier request" not in said(driver)
    finally:
        unscript(driver, later)
    wait(driver, lambda d: len(runs_of(server, "a-day-later")) == 2, "the second click's run")
    (first, _), (second, _) = trigger_calls(server, "a-day-later")
    assert first["request_id"] != second["request_id"]


# Storage refused, as a private window or a browser blocking site data refuses it: reading either
# property throws.
NO_STORAGE = """
for (const name of ["sessionStorage", "localStorage"]) {
  Object.defineProperty(window, name, {
    configurable: true,
    get() { throw new DOMException(`${name} is refused`, "SecurityError"); },
  });
}
"""


def test_without_storage_the_page_keeps_the_id_in_memory(server: ServerProcess, driver: WebDriver) -> None:
    """The page works with storage refused (the fixture fails on a script error): the id is kept for the
    page's life, so a click again without a reload still fires once."""
    refused = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NO_STORAGE})
    try:
        lose_the_first_answer(driver, server, "no-storage")
        assert driver.execute_script("try { window.sessionStorage; return false } catch (e) { return true }")
        confirm(driver, "action-trigger")
        done = text(driver, "flash")
        assert done.startswith("Triggered no-storage") and "earlier request" in done, done
    finally:
        unscript(driver, refused)
    assert len(runs_of(server, "no-storage")) == 1
    (first, first_answer), (second, second_answer) = trigger_calls(server, "no-storage")
    assert first["request_id"] == second["request_id"] and first_answer == second_answer


def test_a_retry_whose_answer_was_lost_clicked_again_after_a_reload_fires_once(
    server: ServerProcess, driver: WebDriver
) -> None:
    """Retry failed racks keeps its id alike (the same code, by the run's retry URL)."""
    stub = server.stub()
    schedule = schedule_named(server, "retried")
    stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    # Fired again while the first task runs, the rack is not submitted: a run with a failed rack.
    with pytest.raises(grpc.RpcError) as refused:
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION, refused.value.details()
    failed = runs_of(server, "retried")[0].id.id  # newest first

    open_page(driver, server, f"/runs/{failed}", "Firing of")
    driver.execute_script(LOSE_THE_NEXT_ANSWER, ":retry")
    confirm(driver, "action-retry-run")
    wait(driver, lambda d: "cannot be reached" in text(d, "action-error"), "the lost answer's error")
    driver.refresh()
    wait(driver, lambda d: "Firing of" in h1(d), "the reload")

    visible(driver, "action-retry-run").click()
    asked = text(driver, "confirm-dialog")
    visible(driver, "confirm-ok").click()
    # The retry submits the rack, or is refused as the first was while the first task still runs: either
    # way the answer is the earlier request's.
    done = said(driver)

    retries = [run for run in runs_of(server, "retried") if run.retry_of.id == failed]
    assert len(retries) == 1  # the second click fired nothing
    events = stub.ListAuditEvents(pb.ListAuditEventsRequest(method="RetryTaskScheduleRun")).events
    calls = [json.loads(event.request_json) for event in events if event.target_ids[0].id == failed]
    assert len(calls) == 2 and calls[0]["request_id"] == calls[1]["request_id"]
    assert "went unanswered" in asked, asked
    assert "earlier request" in done, done


def test_a_trigger_that_never_reached_the_server_clicked_again_says_it_fired_now(
    server: ServerProcess, driver: WebDriver
) -> None:
    """The request lost on its way to the server fired nothing: clicked again, the same id fires now, and
    the page says so (the answer is not `replayed`), not that it may be the earlier request's run."""
    open_page(driver, server, "/schedules/never-sent", "never-sent")
    driver.execute_script(LOSE_THE_NEXT_REQUEST, ":trigger")
    confirm(driver, "action-trigger")
    wait(driver, lambda d: "cannot be reached" in text(d, "action-error"), "the lost request's error")
    assert runs_of(server, "never-sent") == []

    confirm(driver, "action-trigger")

    def flashed(d: WebDriver) -> str:  # the first click's error stays until the answer's flash replaces it
        shown = str(d.execute_script(SAID))
        return shown if shown.startswith("Triggered") else ""

    done = wait(driver, flashed, "the second click's flash")

    (run,) = runs_of(server, "never-sent")
    ((sent, _),) = trigger_calls(server, "never-sent")  # the first never reached the server
    assert sent["request_id"].startswith("web-")
    assert done.startswith("Triggered never-sent. Your earlier request of "), done
    assert f"never reached the server: this click fired it now, as run {run.id.id} at " in done, done
    assert "had already fired" not in done and "if that one had reached" not in done, done


def test_a_refused_trigger_clicked_again_says_its_earlier_request_had_fired(
    server: ServerProcess, driver: WebDriver, tmp_path: Path
) -> None:
    """Every scope of the firing fails (its rack held by a firmware upgrade waiting for its window), so the
    trigger fires a run that submits no task and is refused. Its answer lost, clicked again, the refusal is
    the earlier request's, and says so (`replayed`, with its run): the page tells the operator that the
    earlier request had fired that run, which submitted no task, and that nothing new was fired."""
    start = Timestamp()
    start.FromDatetime(datetime(2999, 1, 1, tzinfo=UTC))
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="q7")]))
    upgrade = pb.UpgradeFirmwareRequest(target_spec=target, target_version="9.9.9", start_time=start)
    server.stub().UpgradeFirmware(upgrade)
    lose_the_first_answer(driver, server, "submits-nothing")

    confirm(driver, "action-trigger")
    refused = wait(
        driver, lambda d: "refused (" in text(d, "action-error") and text(d, "action-error"), "the refusal"
    )
    driver.save_screenshot(str(tmp_path / "a-refusal-sent-again.png"))

    (run,) = runs_of(server, "submits-nothing")  # the second click fired nothing
    assert [o.outcome for o in run.outcomes] == ["failed"]
    (first, _), (second, _) = trigger_calls(server, "submits-nothing")
    assert first["request_id"] == second["request_id"]
    assert refused.startswith("Trigger now refused (FAILED_PRECONDITION): "), refused
    assert "submitted no task" in refused, refused
    said_plainly = f"Your earlier request of {refused.split('Your earlier request of ')[-1]}"
    assert f"had already fired run {run.id.id} at " in said_plainly, refused
    assert said_plainly.endswith(": it submitted no task; nothing new was fired."), refused
    assert "if that one had reached" not in refused, refused
