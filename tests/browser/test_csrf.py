"""Cross-site request forgery, in a real Chromium against `make run`'s set-up (no tokens: every local caller
is an operator). A page on another site POSTs an HTML form to `…:trigger` and a `fetch` in `no-cors`
mode with `text/plain` to `…:pause`: both are refused, nothing changes and the audit trail records no
action. The dashboard's own Pause, Resume and Trigger buttons, in the same browser, still work."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from rackflow.v1 import flow_pb2 as pb
from tests.browser.page import by_testid, text, visible, wait
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request

pytestmark = pytest.mark.slow

NAME = "csrf-target"

# The attacker's page: the fetch runs as it loads (its answer is opaque to the page whatever it is), the
# form is submitted by the test afterwards (it navigates the tab to the server's answer). The form has no
# fields, so its body is empty: only the guard tells it from a legitimate POST.
ATTACKER_PAGE = """<!doctype html>
<html><head><title>loading</title></head><body>
<form id="forged" method="POST" action="{target}/api/v1/schedules/{name}:trigger"></form>
<script>
fetch("{target}/api/v1/schedules/{name}:pause", {{
  method: "POST", mode: "no-cors", headers: {{"Content-Type": "text/plain"}},
  body: JSON.stringify({{reason: "forged"}}),
}}).then(() => {{ document.title = "sent"; }}, (e) => {{ document.title = "not sent: " + e; }});
</script>
</body></html>
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("csrf")
    started = start_server(
        f"sqlite:///{directory}/rackflow.db",
        directory,
        args=["--migrate", "--http-listen", "127.0.0.1:0"],
        name="csrf",
    )
    stub = started.stub()
    create_racks(stub, ["r1", "r2"])
    create_schedules(
        stub, [schedule_request(NAME, ["r1", "r2"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")]
    )
    yield started
    assert started.stop() == 0, started.output


@pytest.fixture(scope="module")
def attacker(server: ServerProcess) -> Iterator[str]:
    """Another site: `localhost` on another port (the dashboard is on 127.0.0.1), serving the page."""
    page = ATTACKER_PAGE.format(target=server.http_url, name=NAME).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://localhost:{httpd.server_address[1]}/"
    httpd.shutdown()
    thread.join()
    httpd.server_close()


def schedule_of(server: ServerProcess) -> pb.TaskSchedule:
    stub = server.stub()
    (found,) = [
        s for s in stub.ListTaskSchedules(pb.ListTaskSchedulesRequest()).task_schedules if s.name == NAME
    ]
    return found


def audited(server: ServerProcess) -> list[tuple[str, str]]:
    events = server.stub().ListAuditEvents(pb.ListAuditEventsRequest()).events
    return [(e.method, e.outcome) for e in events]


def confirm(driver: WebDriver, action: str) -> None:
    visible(driver, action).click()
    visible(driver, "confirm-ok").click()


def test_a_cross_site_form_and_fetch_are_refused_while_the_dashboard_buttons_work(
    server: ServerProcess, attacker: str, driver: WebDriver
) -> None:
    setup = audited(server)  # the racks and the schedule made by the fixture
    driver.get(attacker)
    assert wait(driver, lambda d: d.title if d.title != "loading" else None, "the forged fetch") == "sent"
    driver.execute_script("document.getElementById('forged').submit()")
    wait(driver, lambda d: d.current_url.startswith(server.http_url), "the forged form's answer")
    answer = driver.find_element(By.TAG_NAME, "body").text
    assert "PERMISSION_DENIED" in answer and "cross-origin request refused" in answer, answer

    schedule = schedule_of(server)
    assert schedule.enabled and not schedule.pause_reason
    runs = server.stub().ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
    assert runs.total == 0
    assert audited(server) == setup  # nothing ran: no action, not even a refused one
    log = server.output
    for verb in ("pause", "trigger"):
        assert f"refused POST /api/v1/schedules/{NAME}:{verb} from 127.0.0.1:" in log, log

    # The dashboard, in the same browser: its buttons send JSON from its own origin.
    driver.get(f"{server.http_url}/schedules/{NAME}")
    wait(driver, lambda d: NAME in d.find_element(By.CSS_SELECTOR, "main h1").text, "the schedule page")
    confirm(driver, "action-pause")
    wait(driver, lambda d: text(d, "schedule-state").endswith("paused"), "the paused badge")
    confirm(driver, "action-resume")
    wait(driver, lambda d: text(d, "schedule-state").endswith("enabled"), "the enabled badge")
    confirm(driver, "action-trigger")
    wait(driver, lambda d: len(by_testid(d, "grid-column")) == 1, "the triggered run's column")
    assert audited(server) == [
        ("TriggerTaskSchedule", "OK"),
        ("ResumeTaskSchedule", "OK"),
        ("PauseTaskSchedule", "OK"),
        *setup,
    ]
