"""A rackflow instance SIGKILLed while it runs scheduled tasks: another instance takes them over.

With a short lease (3 s), the survivor must notice the dead owner within a lease and a few polls, run
every task to its end (steps are idempotent, so repeating the ones the dead instance may have done is
safe), and leave a visible trace: a second attempt on each task. Killing an instance during *dispatch*
(between claim and submission) is tests/e2e/test_dispatch_cluster.py::test_instance_killed_mid_drain_
fires_nothing_twice; a takeover with the default 15 s lease is tests/e2e/test_two_instances.py.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, sql, start_server
from tests.e2e.fleet import create_racks, create_schedules, rfc3339, schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

LEASE_S = 3.0
RACKS = 4
COMPONENTS = 8
# A task takes COMPONENTS × STEP_S = 20 s: long enough that it is still running when the survivor has
# started (which takes several seconds on a loaded machine) and the doomed instance is killed mid-way.
STEP_S = 2.5
SLOW_STEPS = {"RACKFLOW_SIM_STEP_SECONDS": f"{STEP_S:g}"}
ARGS = ["--dispatch-interval", "500ms", "--lease-ttl", f"{LEASE_S:g}s"]


def _running_on(db_url: str, server: ServerProcess) -> int:
    """How many tasks are RUNNING under the instance of this process."""
    rows = sql(
        db_url,
        "SELECT count(*) FROM tasks t JOIN instances i ON i.id = t.owner_id"
        " WHERE t.status = 'running' AND i.pid = %s",
        server.proc.pid,
    )
    return int(rows[0][0])  # type: ignore[call-overload]


def test_tasks_of_a_killed_instance_are_taken_over_and_finished(pg_db: str, tmp_path: Path) -> None:
    doomed = start_server(pg_db, tmp_path, name="doomed", args=ARGS, env=SLOW_STEPS)
    survivor: ServerProcess | None = None
    try:
        stub = doomed.stub()
        racks = [f"crash-{i}" for i in range(RACKS)]
        create_racks(stub, racks, components_per_rack=COMPONENTS)
        due = rfc3339(datetime.now(UTC) - timedelta(seconds=1))
        create_schedules(
            stub, [schedule_request("crash", racks, spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec=due)]
        )
        wait_until(
            lambda: _running_on(pg_db, doomed) == RACKS,
            timeout=20,
            what="every scheduled task running on the doomed instance",
        )
        survivor = start_server(pg_db, tmp_path, name="survivor", args=ARGS)
        assert _running_on(pg_db, doomed) == RACKS, "the tasks ended before the kill: make them longer"
        doomed.kill()

        taken_over_s = wait_until(
            lambda: _running_on(pg_db, survivor) == RACKS or _all_done(pg_db),
            timeout=LEASE_S + 15,
            interval=0.1,
            what="the survivor to take every task over",
        )
        wait_until(lambda: _all_done(pg_db), timeout=COMPONENTS * STEP_S + 20, what="every task to finish")
        assert survivor.proc.poll() is None, survivor.output[-5000:]
    finally:
        doomed.kill()
        if survivor is not None:
            survivor.stop()

    assert taken_over_s <= LEASE_S + 3, f"takeover took {taken_over_s:.1f}s with a {LEASE_S}s lease"
    rows = sql(pg_db, "SELECT status, attempts, owner_id, message FROM tasks")
    assert len(rows) == RACKS
    for status, attempts, owner, message in rows:
        assert (status, attempts, owner) == ("completed", 2, None), (status, attempts, owner, message)
    states = sql(pg_db, "SELECT DISTINCT power_state FROM components")
    assert states == [("on",)]
    (run,) = sql(pg_db, "SELECT state, outcomes FROM task_schedule_run")
    assert run[0] == "completed", "the firing itself had finished before the kill"
    assert "taking over" in survivor.output


def _all_done(db_url: str) -> bool:
    rows = sql(db_url, "SELECT count(*) FROM tasks WHERE status NOT IN ('completed', 'failed', 'terminated')")
    return rows[0][0] == 0
