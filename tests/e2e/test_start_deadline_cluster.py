"""After an outage, several `rackflow serve` processes on one PostgreSQL database decide every start
deadline identically: each overdue slot is recorded once, as "missed" (nothing submitted) when it is later
than its deadline and fired when it is not, whichever instance claims it and whatever its own clock says.
And a schedule's failing streak pauses it once, whichever instances see it.

Real processes, the real PostgreSQL: the deadline is decided from the slot and the database's clock (one
instance runs with its clock 30 minutes fast, which must change nothing).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import servers, sql
from tests.e2e.fleet import create_racks, create_schedules, schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

PER_KIND = 60
INSTANCES = 3
OUTAGE = "1 hour"


def _request(name: str, rack: str, deadline: str) -> pb.CreateTaskScheduleRequest:
    request = schedule_request(name, [rack], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    request.schedule.start_deadline = deadline
    return request


def test_instances_after_an_outage_miss_each_late_slot_once_and_fire_the_others(
    pg_db: str, tmp_path: Path
) -> None:
    # "own": a 15m deadline of their own; "default": none of their own, the servers' 20m default; "long":
    # 1h20m of their own, longer than the outage, so they fire (but not by the fast instance's clock, an
    # hour and a half after the slot); "none": "0s", no deadline whatever the default.
    kinds = {"own": "15m", "default": "", "long": "1h20m", "none": "0s"}
    with servers(pg_db, tmp_path, 1, args=["--no-dispatcher"]) as (setup,):
        stub = setup.stub()
        names = [f"{kind}-{i:03d}" for kind in kinds for i in range(PER_KIND)]
        create_racks(stub, names)
        create_schedules(stub, [_request(name, name, kinds[name.split("-")[0]]) for name in names])

    args = ["--dispatch-interval", "1s", "--db-pool-size", "4", "--default-start-deadline", "20m"]
    fast_args = [*args, "--clock-offset", "30m"]
    with (
        servers(pg_db, tmp_path, INSTANCES - 1, args=args) as cluster,
        servers(pg_db, tmp_path, 1, args=fast_args) as (fast,),
    ):
        # The outage: every slot passed an hour ago while no instance ran.
        slots = sql(
            pg_db,
            f"UPDATE task_schedule SET next_run_at = date_trunc('second', now()) - interval '{OUTAGE}' "
            "RETURNING name, next_run_at",
        )
        wait_until(
            lambda: sql(pg_db, "SELECT count(*) FROM task_schedule_run")[0][0] >= len(names),
            timeout=120,
            what=f"a run for each of {len(names)} schedules",
        )
        wait_until(
            lambda: sql(pg_db, "SELECT count(*) FROM task_schedule_run WHERE state = 'running'")[0][0] == 0,
            timeout=60,
            what="every firing written back",
        )
        for server in [*cluster, fast]:
            assert server.proc.poll() is None, server.output

    slot_of = {str(name): slot for name, slot in slots}
    runs = sql(
        pg_db,
        """
        SELECT s.name, r.state, r.scheduled_for, r.late_by_us, r.owner_id,
               (SELECT count(*) FROM tasks t WHERE t.run_id = r.id)
        FROM task_schedule_run r JOIN task_schedule s ON s.id = r.schedule_id""",
    )
    assert len(runs) == len(names)  # one run per slot, whichever instance claimed it
    by_name = {str(name): (state, slot, late_us, tasks) for name, state, slot, late_us, _, tasks in runs}
    assert set(by_name) == set(names)
    for name, (state, slot, late_us, tasks) in by_name.items():
        kind = name.split("-")[0]
        assert slot == slot_of[name]
        if kind in ("own", "default"):
            assert (state, tasks) == ("missed", 0), name
            assert isinstance(late_us, int) and timedelta(microseconds=late_us) >= timedelta(hours=1), name
        else:
            assert (state, tasks, late_us) == ("completed", 1, None), name
    # Each schedule advanced past the outage as any firing advances it: no slot is replayed.
    replayed = sql(
        pg_db, "SELECT count(*) FROM task_schedule WHERE next_run_at IS NULL OR next_run_at < now()"
    )
    assert replayed == [(0,)]
    missed_events = sql(pg_db, "SELECT count(*) FROM notification_event WHERE type = 'run.missed'")
    assert missed_events == [(2 * PER_KIND,)]
    assert datetime.now(UTC) - min(slot_of.values()) >= timedelta(hours=1)  # type: ignore[operator]


def test_two_instances_pause_a_failing_schedule_once(pg_db: str, tmp_path: Path) -> None:
    env = {"RACKFLOW_SIM_FAIL_IDS": "flaky-c0"}
    with servers(pg_db, tmp_path, 2, args=["--dispatch-interval", "1s"], env=env) as (first, second):
        create_racks(first.stub(), ["flaky"])
        request = schedule_request("flaky", ["flaky"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
        request.schedule.pause_after_failed_runs = 2
        schedule = first.stub().CreateTaskSchedule(request)
        for failed, server in enumerate((first, second), start=1):  # two failing runs, one on each
            server.stub().TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
            wait_until(lambda n=failed: _failed_tasks(pg_db) == n, timeout=30, what="the run's task failed")
        wait_until(
            lambda: sql(pg_db, "SELECT enabled FROM task_schedule WHERE name = 'flaky'") == [(False,)],
            timeout=30,
            what="the schedule paused",
        )
        paused_at = sql(pg_db, "SELECT now()")[0][0]
        # Both instances keep polling (every second): neither pauses it again.
        wait_until(
            lambda: sql(pg_db, "SELECT now() - %s > interval '3 seconds'", paused_at) == [(True,)],
            timeout=10,
        )
    runs = [str(r[0]) for r in sql(pg_db, "SELECT id FROM task_schedule_run ORDER BY fired_at")]
    ((reason, by),) = sql(pg_db, "SELECT pause_reason, paused_by FROM task_schedule WHERE name = 'flaky'")
    assert by == "rackflow" and f"({runs[0]}, {runs[1]})" in str(reason)
    audited = sql(pg_db, "SELECT principal FROM audit_events WHERE method = 'PauseTaskSchedule'")
    assert audited == [("rackflow",)]
    paused = sql(pg_db, "SELECT count(*) FROM notification_event WHERE type = 'schedule.paused'")
    assert paused == [(1,)]


def _failed_tasks(db_url: str) -> int:
    return int(sql(db_url, "SELECT count(*) FROM tasks WHERE status = 'failed'")[0][0])  # type: ignore[call-overload]
