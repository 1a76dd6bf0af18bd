"""The clock jumps an hour forward between two runs of `rackflow serve`: nothing missed is replayed.

The seeds' rule: an interval schedule's next run is the dispatch time plus the interval, so a dispatcher
that finds a schedule long overdue fires it once, now, and then every interval from now, not once per
missed interval; a cron schedule fires its overdue slot once and then the next slot after now.

The jump is made on SQLite, where the process's clock decides what is due (`--clock-offset`, a hidden
flag, shifts it). On PostgreSQL the dispatcher asks the database for the time (`Database.now`), so one
instance's wrong clock changes nothing about when schedules fire: the last test shows it (and
docs/RELIABILITY.md says what a wrong clock still affects there).
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.conftest import sqlite_copy
from tests.e2e.cluster import servers, sql, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request, wait_until

pytestmark = pytest.mark.slow

INTERVAL = timedelta(seconds=3)
JUMP = timedelta(hours=1)
INTERVALS_WATCHED = 2  # the jumped process runs until the overdue firings, and this many intervals after
ARGS = ["--dispatch-interval", "200ms"]
POLL_SLACK = timedelta(seconds=1.5)  # a poll's lateness, on a busy machine


def _read(db_path: Path, query: str, *params: object) -> list[tuple[object, ...]]:
    """Read the SQLite file directly (the processes have stopped): times come back as naive UTC text."""
    with sqlite3.connect(db_path) as conn:
        return conn.execute(query, params).fetchall()


def _utc(value: object) -> datetime:
    assert isinstance(value, str), value
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def _next_run(db_path: Path, name: str) -> datetime:
    return _utc(_read(db_path, "SELECT next_run_at FROM task_schedule WHERE name = ?", name)[0][0])


def _runs(db_path: Path, name: str) -> list[tuple[datetime, datetime]]:
    """(scheduled_for, fired_at) of each dispatch firing of the schedule, in order."""
    rows = _read(
        db_path,
        """SELECT r.scheduled_for, r.fired_at FROM task_schedule_run r
           JOIN task_schedule s ON s.id = r.schedule_id
           WHERE s.name = ? AND r.trigger = 'dispatch' ORDER BY r.fired_at""",
        name,
    )
    return [(_utc(slot), _utc(fired)) for slot, fired in rows]


def test_a_forward_clock_jump_fires_each_overdue_schedule_once(sqlite_template: Path, tmp_path: Path) -> None:
    url = sqlite_copy(sqlite_template, tmp_path)
    db_path = tmp_path / "rackflow.db"

    before = start_server(url, tmp_path, name="before", args=ARGS)
    try:
        stub = before.stub()
        create_racks(stub, ["jump-a", "jump-b"])
        create_schedules(
            stub,
            [
                schedule_request(
                    "interval",
                    ["jump-a"],
                    spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL,
                    spec=f"{INTERVAL.seconds}s",
                ),
                schedule_request(
                    "minutely", ["jump-b"], spec_type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="* * * * *"
                ),
            ],
        )
        # The firing line names each firing: `firings=interval (run …): 1/0/0` (docs/OPERATIONS.md, Logs).
        wait_until(lambda: "interval (run " in before.output, timeout=15, what="a first firing")
    finally:
        assert before.stop() == 0, before.output
    interval_due, cron_due = _next_run(db_path, "interval"), _next_run(db_path, "minutely")
    interval_runs_before = len(_runs(db_path, "interval"))
    cron_runs_before = len(_runs(db_path, "minutely"))

    jumped_from = datetime.now(UTC) + JUMP
    after = start_server(
        url, tmp_path, name="after", args=[*ARGS, "--clock-offset", f"{int(JUMP.total_seconds())}s"]
    )
    listening = datetime.now(UTC) + JUMP  # its dispatcher polls at once, as it starts listening
    try:
        wait_until(
            lambda: (
                after.output.count("interval (run ") > INTERVALS_WATCHED and "minutely (run " in after.output
            ),
            timeout=60,
            what=f"the overdue firings, and {INTERVALS_WATCHED} intervals after them",
        )
    finally:
        assert after.stop() == 0, after.output
    jumped_to = datetime.now(UTC) + JUMP
    watched = jumped_to - jumped_from

    # Interval: the overdue run fires once at the jump, then every interval from there; none replayed.
    runs = _runs(db_path, "interval")[interval_runs_before:]
    assert runs, "the overdue interval schedule did not fire after the jump"
    (first_slot, first_fired), *rest = runs
    assert first_slot == interval_due
    assert jumped_from <= first_fired <= listening + POLL_SLACK
    fired = [first_fired, *(f for _, f in rest)]
    gaps = [later - earlier for earlier, later in pairwise(fired)]
    assert all(INTERVAL <= gap <= INTERVAL + POLL_SLACK for gap in gaps), gaps
    assert len(runs) <= watched / INTERVAL + 1, f"{len(runs)} firings in {watched}: missed intervals replayed"
    assert [slot for slot, _ in rest] == [f + INTERVAL for f in fired[:-1]]

    # Cron: the overdue slot fires once; the next firing, if any yet, is a whole minute after the jump.
    runs = _runs(db_path, "minutely")[cron_runs_before:]
    assert runs and runs[0][0] == cron_due, (runs, cron_due)
    later_slots = [slot for slot, _ in runs[1:]]
    assert all(slot > jumped_from and slot.second == 0 for slot in later_slots), later_slots
    assert len(runs) <= 2, f"cron replayed missed slots: {runs}"
    next_cron = _next_run(db_path, "minutely")
    assert jumped_to - POLL_SLACK < next_cron <= jumped_to + timedelta(minutes=1)
    assert next_cron.second == 0 and next_cron.microsecond == 0


@pytest.mark.postgres
def test_on_postgres_an_instance_an_hour_ahead_fires_on_the_database_clock(
    pg_db: str, tmp_path: Path
) -> None:
    """An instance whose clock is an hour ahead, alone with a schedule created by a correct one: it fires
    the schedule when the database's clock says it is due, then every interval, because due checks and
    advances use the database's time. (Its own clock would have set the next run an hour late, or stamped
    every firing an hour ahead.)"""
    with servers(pg_db, tmp_path, 1, args=["--no-dispatcher"]) as (right,):
        create_racks(right.stub(), ["skew-a"])
        (schedule,) = create_schedules(
            right.stub(),
            [
                schedule_request(
                    "interval",
                    ["skew-a"],
                    spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL,
                    spec=f"{INTERVAL.seconds}s",
                )
            ],
        )
    first_due = schedule.next_run_at.ToDatetime(tzinfo=UTC)
    with servers(pg_db, tmp_path, 1, args=[*ARGS, "--clock-offset", f"{int(JUMP.total_seconds())}s"]) as (
        ahead,
    ):
        # A next run set by its own clock would not come for an hour.
        wait_until(lambda: len(_dispatched(pg_db)) >= 2, timeout=30, what="a second firing")
    assert ahead.proc.returncode == 0, ahead.output

    rows = _dispatched(pg_db)
    fired = [_aware(f) for _, f in rows]
    assert fired[0] >= first_due, f"fired at {fired[0]}, before it was due at {first_due}"
    (now,) = sql(pg_db, "SELECT now()")[0]
    assert fired[-1] <= _aware(now), "a firing stamped by the instance's own clock, an hour ahead"
    # Each next run is the firing's time plus the interval, and it fired no sooner.
    assert [_aware(slot) for slot, _ in rows[1:]] == [f + INTERVAL for f in fired[:-1]], rows
    gaps = [later - earlier for earlier, later in pairwise(fired)]
    assert all(gap >= INTERVAL for gap in gaps), gaps
    assert len({slot for slot, _ in rows}) == len(rows), "a tick fired twice"


def _dispatched(db_url: str) -> list[tuple[object, ...]]:
    return sql(
        db_url,
        "SELECT scheduled_for, fired_at FROM task_schedule_run WHERE trigger = 'dispatch' ORDER BY fired_at",
    )


def _aware(value: object) -> datetime:
    assert isinstance(value, datetime) and value.tzinfo is not None, value
    return value
