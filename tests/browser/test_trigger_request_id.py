"""The dashboard's Trigger now in a real headless Chromium, its answer lost on the way back: clicked again, it
sends the same request id, and the server answers the run the first click fired instead of firing a second
(`static/app.js`: an idempotent action keeps its id until an answer is heard; docs/SCHEDULES.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import by_testid, text, visible, wait
from tests.browser.test_dashboard import confirm, open_page
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("browser")]  # one worker: one server, one browser

# The page's next answer from a trigger is lost after the server sent it, as a dropped connection loses
# it: the call went through, the browser hears nothing.
LOSE_THE_NEXT_TRIGGER_ANSWER = """
const original = window.fetch;
let lose = true;
window.fetch = async (url, init) => {
  const response = await original(url, init);
  if (lose && String(url).endsWith(":trigger")) {
    lose = false;
    throw new TypeError("the connection was lost");
  }
  return response;
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
    create_racks(stub, ["q1", "q2"], components_per_rack=2)
    create_schedules(
        stub,
        [schedule_request("lost-answer", ["q1", "q2"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")],
    )
    yield started
    assert started.stop() == 0, started.output


def test_a_trigger_whose_answer_was_lost_clicked_again_fires_once(
    server: ServerProcess, driver: WebDriver, tmp_path: Path
) -> None:
    open_page(driver, server, "/schedules/lost-answer", "lost-answer")
    driver.execute_script(LOSE_THE_NEXT_TRIGGER_ANSWER)

    confirm(driver, "action-trigger")
    error = wait(
        driver, lambda d: "cannot be reached" in text(d, "action-error") and text(d, "action-error"), ""
    )
    assert "the same request, which fires at most once" in error
    wait(
        driver, lambda d: len(by_testid(d, "grid-column")) == 1, "the first click's run (the page refreshes)"
    )

    confirm(driver, "action-trigger")
    assert "Triggered lost-answer" in text(driver, "flash")
    driver.save_screenshot(str(tmp_path / "after-the-second-click.png"))

    stub = server.stub()
    (schedule,) = [
        s
        for s in stub.ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules
        if s.name == "lost-answer"
    ]
    runs = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs
    assert len(runs) == 1  # the second click fired nothing
    calls = [
        json.loads(event.request_json)
        for event in stub.ListAuditEvents(pb.ListAuditEventsRequest(method="TriggerTaskSchedule")).events
        if schedule.id.id in [target.id for target in event.target_ids]
    ]
    assert len(calls) == 2 and calls[0]["request_id"] == calls[1]["request_id"]
    assert calls[0]["request_id"].startswith("web-")
    assert visible(driver, "grid-column") and len(by_testid(driver, "grid-column")) == 1
