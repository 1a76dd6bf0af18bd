"""What an operator's monitoring sees: Prometheus metrics and structured log lines naming each firing."""

from __future__ import annotations

import json
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.conftest import sqlite_copy
from tests.e2e.cluster import servers
from tests.e2e.fleet import create_racks, rfc3339, schedule_request, wait_until

pytestmark = pytest.mark.slow


def test_metrics_and_json_firing_log(sqlite_template: Path, tmp_path: Path) -> None:
    url = sqlite_copy(sqlite_template, tmp_path)
    args = ["--dispatch-interval", "200ms", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"]
    with servers(url, tmp_path, 1, args=args) as (server,):
        # Port 0: the server picks a free port and names the endpoint it serves.
        (metrics_url,) = [
            message.removeprefix("metrics on ")
            for message in (
                json.loads(line)["message"] for line in server.output.splitlines() if line[:1] == "{"
            )
            if message.startswith("metrics on http://127.0.0.1:")
        ]
        stub = server.stub()
        create_racks(stub, ["m1", "m2"])
        past = rfc3339(datetime.now(UTC) - timedelta(seconds=5))
        schedule = stub.CreateTaskSchedule(
            schedule_request("observed", ["m1", "m2"], spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec=past)
        )

        def metrics() -> str:
            with urllib.request.urlopen(metrics_url, timeout=5) as response:
                return str(response.read().decode())

        wait_until(
            lambda: 'rackflow_schedule_firings_total{trigger="dispatch"} 1.0' in metrics(),
            timeout=15,
            what="the firing to be counted",
        )
        text = metrics()
        assert 'rackflow_schedule_scope_outcomes_total{outcome="submitted"} 2.0' in text
        assert "rackflow_dispatch_lag_seconds_count 1.0" in text
        assert "rackflow_dispatch_poll_seconds_count" in text
        assert "rackflow_dispatch_due_backlog 0.0" in text
        # The outbox gauges, read from the database by the server's event loop for the scrape's thread.
        assert "rackflow_notification_outbox_age_seconds 0.0" in text
        assert "rackflow_notification_dead_deliveries 0.0" in text
        assert "reading gauges for a scrape failed" not in server.output

        lines = [json.loads(line) for line in server.output.splitlines() if line.startswith("{")]
        (fired,) = [line for line in lines if any(f.startswith("observed ") for f in line.get("firings", ()))]
        assert fired["trigger"] == "dispatch"
        assert (fired["submitted"], fired["skipped"], fired["failed"]) == (2, 0, 0)
        (named,) = fired["firings"]
        (run,) = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs
        assert named == f"observed (run {run.id.id}): 2/0/0"
