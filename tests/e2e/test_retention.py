"""`rackflow serve --run-retention --task-retention`: instances sharing one database prune the old runs and
the long-ended tasks at start-up, each once, and keep recent runs, running runs and active tasks."""

from __future__ import annotations

from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import servers, sql
from tests.e2e.fleet import create_racks, create_schedules, schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

OLD = 300


def _add_history(db_url: str, schedule_id: str, rack_id: str) -> None:
    """OLD runs and OLD ended tasks three days old; one old running run, one old running task; and one
    recent run and one recently ended task."""
    run = (
        "INSERT INTO task_schedule_run (id, schedule_id, fired_at, trigger, state, outcomes)"
        " SELECT gen_random_uuid(), %s, now() - %s::interval - make_interval(secs => g), 'manual', %s, '[]'"
        " FROM generate_series(1, %s) g"
    )
    sql(db_url, run, schedule_id, "3 days", "completed", OLD)
    sql(db_url, run, schedule_id, "3 days", "running", 1)
    sql(db_url, run, schedule_id, "1 hour", "completed", 1)
    _add_tasks(db_url, rack_id, "failed", "3 days", "3 days", OLD)
    _add_tasks(db_url, rack_id, "waiting", "3 days", None, 1)
    _add_tasks(db_url, rack_id, "completed", "3 days", "1 hour", 1)  # created long ago, ended recently


def _add_tasks(db_url: str, rack_id: str, status: str, created: str, ended: str | None, count: int) -> None:
    sql(
        db_url,
        "INSERT INTO tasks (id, operation, parameters, rack_id, component_ids, status, created_at,"
        " updated_at, finished_at) SELECT gen_random_uuid(), 'power_on', '{\"kind\": \"power_on\"}', %s,"
        " '[]', %s, now() - %s::interval - make_interval(secs => g), now(), now() - %s::interval"
        " FROM generate_series(1, %s) g",
        rack_id,
        status,
        created,
        ended,
        count,
    )


def test_instances_prune_old_runs_and_ended_tasks_at_start_up(pg_db: str, tmp_path: Path) -> None:
    with servers(pg_db, tmp_path, 1, args=["--no-dispatcher"]) as (server,):
        (rack,) = create_racks(server.stub(), ["r1"])
        spec = pb.SCHEDULE_SPEC_TYPE_INTERVAL
        (schedule,) = create_schedules(
            server.stub(), [schedule_request("hourly", ["r1"], spec_type=spec, spec="1h")]
        )
    _add_history(pg_db, schedule.id.id, rack.id.id)
    args = ["--no-dispatcher", "--run-retention", "48h", "--task-retention", "48h"]
    with servers(pg_db, tmp_path, 2, args=args) as started:
        wait_until(
            lambda: (
                sql(pg_db, "SELECT count(*) FROM task_schedule_run")[0][0] == 2
                and sql(pg_db, "SELECT count(*) FROM tasks")[0][0] == 2
            ),
            timeout=30,
            what="the old runs and tasks pruned",
        )
        wait_until(lambda: all("task retention: pruned" in s.output for s in started), timeout=10)
    assert sorted(r[0] for r in sql(pg_db, "SELECT state FROM task_schedule_run")) == ["completed", "running"]
    # The waiting task stayed (then ran: nothing blocked it); the long-failed ones went.
    assert sql(pg_db, "SELECT count(*) FROM tasks WHERE status = 'failed'") == [(0,)]
    runs = [int(s.output.split("run retention: pruned ")[1].split()[0]) for s in started]
    ended = [int(s.output.split("task retention: pruned ")[1].split()[0]) for s in started]
    assert (sum(runs), sum(ended)) == (OLD, OLD), (runs, ended)
