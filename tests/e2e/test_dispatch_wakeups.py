"""A dispatching `rackflow serve` learns through PostgreSQL's NOTIFY of a schedule another process created
or moved sooner, and fires it without waiting for its poll interval (an hour here, so only the
notification can explain a firing within the test)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from rackflow.store.wakeups import CHANNEL
from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import sql, start_server
from tests.e2e.fleet import create_racks, rfc3339, schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ONE_TIME = pb.SCHEDULE_SPEC_TYPE_ONE_TIME
FIRING_TIMEOUT_S = 60.0  # generous for a loaded machine, and a minute short of the poll interval


def _listening(db_url: str) -> bool:
    query = (
        f"SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query = 'LISTEN {CHANNEL}'"
    )
    return bool(sql(db_url, query))


def _has_task(db_url: str, schedule_id: str) -> bool:
    return bool(sql(db_url, "SELECT 1 FROM tasks WHERE schedule_id = %s", schedule_id))


def test_a_schedule_created_or_moved_sooner_in_another_process_fires_on_notify(
    pg_db: str, tmp_path: Path
) -> None:
    dispatching = start_server(pg_db, tmp_path, args=["--dispatch-interval", "1h"], name="dispatching")
    api_only = start_server(pg_db, tmp_path, args=["--no-dispatcher"], name="api")
    try:
        wait_until(lambda: _listening(pg_db), timeout=30, what="the dispatching instance to LISTEN")
        stub = api_only.stub()
        create_racks(stub, ["notified-a", "notified-b"])
        soon = rfc3339(datetime.now(UTC) + timedelta(seconds=1))
        created = stub.CreateTaskSchedule(
            schedule_request("created-soon", ["notified-a"], spec_type=ONE_TIME, spec=soon)
        )
        wait_until(
            lambda: _has_task(pg_db, created.id.id), FIRING_TIMEOUT_S, what="the created schedule to fire"
        )

        later = rfc3339(datetime.now(UTC) + timedelta(days=1))
        moved = stub.CreateTaskSchedule(
            schedule_request("moved-sooner", ["notified-b"], spec_type=ONE_TIME, spec=later)
        )
        stub.UpdateTaskSchedule(
            pb.UpdateTaskScheduleRequest(
                id=moved.id,
                schedule=pb.ScheduleConfig(
                    spec=pb.ScheduleSpec(type=ONE_TIME, spec=rfc3339(datetime.now(UTC)))
                ),
                update_mask=FieldMask(paths=["schedule.spec"]),
            )
        )
        wait_until(lambda: _has_task(pg_db, moved.id.id), FIRING_TIMEOUT_S, what="the moved schedule to fire")
    finally:
        api_only.stop()
        assert dispatching.stop() == 0, dispatching.output
