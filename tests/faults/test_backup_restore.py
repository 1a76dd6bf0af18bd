"""Backup while serving, restore, serve the restored database: nothing that had fired fires again.

A real `rackflow serve` fires interval schedules every second and a one-time schedule, with tasks running;
`rackflow db backup` copies the database meanwhile (SQLite: the online backup API; PostgreSQL: pg_dump,
restored with pg_restore into a new database). A new server on the restored copy must not fire again any
slot the backup recorded as fired (the one-time schedule stays consumed), must fire the interval schedules
on from where the backup left them, and must settle what was in flight at backup time: runs left `running`
become `interrupted` and RUNNING tasks are taken over and finish, since the instance that owned them is,
to the restored database, dead (docs/OPERATIONS.md, "Backups").
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Select, create_engine, select
from sqlalchemy.engine import make_url

from rackflow.store.db import normalise_url
from rackflow.store.tables import task_schedule, task_schedule_run, tasks
from rackflow.v1 import flow_pb2 as pb
from tests.conftest import postgres_admin_url
from tests.e2e.cluster import fresh_postgres_database, servers
from tests.e2e.fleet import create_racks, create_schedules, rfc3339, schedule_request, wait_until

pytestmark = pytest.mark.slow

ARGS = ["--dispatch-interval", "1s", "--lease-ttl", "3s"]
ENV = {"RACKFLOW_SIM_STEP_SECONDS": "0.2"}  # tasks take a few seconds: some are RUNNING at backup time
RACKS = [f"r{i}" for i in range(4)]


def query(url: str, statement: Select[Any]) -> list[Any]:
    """The rows of `statement` (Core, so UUIDs and UTC times come back typed on both databases)."""
    parsed = make_url(normalise_url(url))
    sync = parsed.set(drivername="sqlite" if parsed.get_backend_name() == "sqlite" else "postgresql+psycopg")
    engine = create_engine(sync)
    try:
        with engine.connect() as conn:
            return list(conn.execute(statement))
    finally:
        engine.dispose()


def backup_with_cli(url: str, path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "rackflow", "db", "backup", "--db", url, str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@contextmanager
def restored(url: str, backup: Path, tmp_path: Path) -> Iterator[str]:
    """A new database holding the backup: a copy of the SQLite file, or pg_restore into a new database."""
    if url.startswith("sqlite"):
        copy = tmp_path / "restored.db"
        shutil.copy(backup, copy)
        yield f"sqlite:///{copy}"
        return
    with fresh_postgres_database(postgres_admin_url()) as new:
        libpq = make_url(new).set(drivername="postgresql").render_as_string(False)
        subprocess.run(["pg_restore", "--no-owner", "--dbname", libpq, str(backup)], check=True)
        yield new


RUN = task_schedule_run.c
SLOTS = select(RUN.schedule_id, RUN.scheduled_for).where(RUN.scheduled_for.is_not(None))


def running(url: str, table: Any) -> set[Any]:
    """Ids of the rows of `table` (tasks or runs) in state or status `running`."""
    state = table.c.status if table is tasks else table.c.state
    return {row.id for row in query(url, select(table.c.id).where(state == "running"))}


def test_a_restored_backup_fires_nothing_the_backup_had_fired(own_db_url: str, tmp_path: Path) -> None:
    served, backup = own_db_url, tmp_path / "backup.bin"
    with servers(served, tmp_path, 1, args=ARGS, env=ENV) as (server,):
        stub = server.stub()
        create_racks(stub, RACKS, components_per_rack=3)
        soon = rfc3339(datetime.now(UTC) + timedelta(seconds=1))
        create_schedules(
            stub,
            [
                *(
                    schedule_request(
                        f"every-2s-{r}", [r], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="2s"
                    )
                    for r in RACKS
                ),
                schedule_request("once", RACKS[:1], spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec=soon),
            ],
        )
        wait_until(lambda: len(query(served, SLOTS)) >= 12, 60, what="a dozen firings")
        wait_until(lambda: bool(running(served, tasks)), 30, what="a RUNNING task")
        assert "written to" in backup_with_cli(served, backup)  # while the server fires and runs tasks
        backed_up = len(query(served, SLOTS))  # at least as many as the backup holds
        wait_until(  # the live database moves on: slots the backup does not know of
            lambda: len(query(served, SLOTS)) > backed_up, 30, what="a firing after the backup"
        )

    with restored(served, backup, tmp_path) as copy:
        fired_before = {tuple(row) for row in query(copy, SLOTS)}
        assert len(fired_before) >= 12
        ((once_id, once_next),) = query(
            copy,
            select(task_schedule.c.id, task_schedule.c.next_run_at).where(task_schedule.c.name == "once"),
        )
        assert once_next is None  # consumed before the backup
        tasks_in_flight, runs_in_flight = running(copy, tasks), running(copy, task_schedule_run)

        with servers(copy, tmp_path, 1, args=ARGS, env={"RACKFLOW_SIM_STEP_SECONDS": "0.01"}):
            wait_until(
                lambda: len({tuple(row) for row in query(copy, SLOTS)} - fired_before) >= 8,
                60,
                what="the restored server firing",
            )
            wait_until(
                lambda: (
                    not (running(copy, tasks) & tasks_in_flight)
                    and not (running(copy, task_schedule_run) & runs_in_flight)
                ),
                60,
                what="the work in flight at backup time settled",
            )

        runs = query(copy, select(RUN.schedule_id, RUN.scheduled_for))
        slots = [(row.schedule_id, row.scheduled_for) for row in runs if row.scheduled_for is not None]
        assert len(slots) == len(set(slots)), "a slot fired twice"
        last_before: dict[Any, datetime] = {}
        for schedule_id, slot in fired_before:
            last_before[schedule_id] = max(slot, last_before.get(schedule_id, slot))
        for schedule_id, slot in set(slots) - fired_before:
            assert schedule_id in last_before and slot > last_before[schedule_id], (
                "a backed-up slot fired again"
            )
        assert len([row for row in runs if row.schedule_id == once_id]) == 1, (
            "the one-time schedule fired again"
        )
        settled = query(
            copy, select(tasks.c.id, tasks.c.status, tasks.c.attempts).where(tasks.c.id.in_(tasks_in_flight))
        )
        for row in settled:
            assert row.status in ("completed", "failed", "terminated") and row.attempts >= 2, row
        interrupted = query(copy, select(RUN.state).where(RUN.id.in_(runs_in_flight)))
        assert all(row.state == "interrupted" for row in interrupted), interrupted


def test_backup_refuses_to_overwrite_a_file_or_to_copy_nothing(tmp_path: Path) -> None:
    taken = tmp_path / "taken.db"
    taken.write_bytes(b"keep me")
    for url, path, message in [
        (f"sqlite:///{tmp_path / 'live.db'}", taken, f"backup: {taken} exists; give a new file"),
        (f"sqlite:///{tmp_path / 'missing.db'}", tmp_path / "new.db", "backup: no SQLite database at"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "rackflow", "db", "backup", "--db", url, str(path)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1 and message in done.stderr, done.stderr
    assert taken.read_bytes() == b"keep me"
    assert not (tmp_path / "new.db").exists()
