"""Several `rackflow serve` processes on one PostgreSQL database fire every schedule exactly once.

Real processes, the real PostgreSQL: the claim is `FOR UPDATE SKIP LOCKED`, so this is the test of it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import servers, sql, start_server
from tests.e2e.fleet import (
    clone_schedule,
    create_racks,
    create_schedules,
    rfc3339,
    schedule_request,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ONE_TIME_SCHEDULES = 1000  # a few seconds of four instances racing for claims (2,000 took twice the setup)
CRON_SCHEDULES = 40
INSTANCES = 4
CRON_MINUTES = 2


def test_four_instances_drain_a_backlog_firing_each_schedule_once(pg_db: str, tmp_path: Path) -> None:
    # Set up with a server that fires nothing. The one-time schedules are made due only once all four
    # instances run: started one after another, the first would otherwise drain a backlog this size alone
    # before the others are up (its batch doubles up to DISPATCH_BATCH_CAP), and the claims would never race.
    with servers(pg_db, tmp_path, 1, args=["--no-dispatcher"]) as (setup,):
        # One rack and its one-time schedule through the API, copied in the database to make the rest.
        stub = setup.stub()
        once = [f"once-{i:04d}" for i in range(ONE_TIME_SCHEDULES)]
        create_racks(stub, once[:1])
        later = rfc3339(datetime.now(UTC) + timedelta(hours=1))
        stub.CreateTaskSchedule(
            schedule_request(once[0], once[:1], spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec=later)
        )
        clone_schedule(pg_db, once[0], once[1:])

    # The tasks never finish a step (each executor starts its first 32 and no more): running the tasks
    # is not what this test is about.
    idle_executors = {"RACKFLOW_SIM_STEP_SECONDS": "3600"}
    # Polls every 100 ms: the backlog drains in well under a second here (0.6 s), so with the default
    # 1 s polls the first instance to look could take it all before the others look at all.
    with servers(
        pg_db,
        tmp_path,
        INSTANCES,
        args=["--dispatch-interval", "100ms", "--db-pool-size", "5"],
        env=idle_executors,
    ) as cluster:
        # Due now: every instance finds them at its next poll, within 100 ms of the others.
        sql(
            pg_db,
            "UPDATE task_schedule SET next_run_at = now() - interval '5 minutes' WHERE name LIKE 'once-%%'",
        )
        drain_s = wait_until(
            lambda: (
                sql(pg_db, "SELECT count(*) FROM tasks WHERE description LIKE 'once-%%'")[0][0]
                >= ONE_TIME_SCHEDULES
            ),
            timeout=120,
            what=f"{ONE_TIME_SCHEDULES} one-time tasks",
        )
        print(f"\n{ONE_TIME_SCHEDULES} one-time schedules drained by {INSTANCES} instances in {drain_s:.1f}s")

    # Every one-time schedule: one run, one task, consumed.
    runs = sql(
        pg_db,
        """
        SELECT s.name, count(r.id) FROM task_schedule s
        LEFT JOIN task_schedule_run r ON r.schedule_id = s.id
        WHERE s.name LIKE 'once-%%' GROUP BY s.name HAVING count(r.id) <> 1""",
    )
    assert runs == [], f"one-time schedules without exactly one run: {runs[:10]}"
    dupes = sql(
        pg_db,
        """
        SELECT schedule_id, count(*) FROM tasks WHERE description LIKE 'once-%%'
        GROUP BY schedule_id HAVING count(*) > 1""",
    )
    assert dupes == []
    assert sql(pg_db, "SELECT count(DISTINCT schedule_id) FROM tasks WHERE description LIKE 'once-%%'") == [
        (ONE_TIME_SCHEDULES,)
    ]
    assert sql(
        pg_db,
        """SELECT count(*) FROM task_schedule WHERE name LIKE 'once-%%'
                         AND (enabled OR next_run_at IS NOT NULL)""",
    ) == [(0,)]
    # The work was shared: more than one instance fired schedules. Each logs its own firings (one INFO
    # line a batch, `schedules.firing`); a run's owner is no witness, cleared once the run completes.
    firing = [server for server in cluster if "schedule(s) (dispatch)" in server.output]
    assert len(firing) >= 2, "one instance did all the firing: the claim did not spread the work"


# Mostly waiting for whole minutes, light on the machine: the other workers' tests use the time.
def test_four_instances_fire_each_cron_slot_once(pg_db: str, tmp_path: Path) -> None:
    with servers(pg_db, tmp_path, 1, args=["--no-dispatcher"]) as (setup,):
        stub = setup.stub()
        cron_racks = [f"cron-{i:02d}" for i in range(CRON_SCHEDULES)]
        create_racks(stub, cron_racks)
        create_schedules(
            stub,
            [
                schedule_request(
                    f"cron-{i:02d}", [rack], spec_type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="* * * * *"
                )
                for i, rack in enumerate(cron_racks)
            ],
        )

    with servers(
        pg_db, tmp_path, INSTANCES, args=["--dispatch-interval", "1s", "--db-pool-size", "5"]
    ) as cluster:
        # Cron every minute for CRON_MINUTES whole minutes once all four run and have caught up. The slot
        # that fell due while they started fires late and once, then the next slot after that firing (a slot
        # passed meanwhile is skipped by design), so the window starts at the next run of the schedules
        # once none is due and none is being fired.
        wait_until(lambda: _cron_caught_up(pg_db), timeout=60, what="the overdue cron slots fired")
        first_slot = sql(pg_db, "SELECT min(next_run_at) FROM task_schedule WHERE name LIKE 'cron-%%'")[0][0]
        assert isinstance(first_slot, datetime)
        last_slot = first_slot + timedelta(minutes=CRON_MINUTES - 1)
        wait_until(
            lambda: _cron_runs_ended(pg_db, first_slot, last_slot) >= CRON_SCHEDULES * CRON_MINUTES,
            timeout=(last_slot - datetime.now(UTC)).total_seconds() + 30,
            what="the window's slots fired and written back",
        )
        for server in cluster:
            assert server.proc.poll() is None, server.output

    rows = sql(
        pg_db,
        """
        SELECT s.name, r.scheduled_for FROM task_schedule_run r JOIN task_schedule s ON s.id = r.schedule_id
        WHERE s.name LIKE 'cron-%%' AND r.scheduled_for BETWEEN %s AND %s""",
        first_slot,
        last_slot,
    )
    per_schedule: dict[str, list[datetime]] = {}
    for name, slot in rows:
        per_schedule.setdefault(str(name), []).append(slot)  # type: ignore[arg-type]
    expected = [first_slot + timedelta(minutes=m) for m in range(CRON_MINUTES)]
    assert len(per_schedule) == CRON_SCHEDULES
    for name, slots in per_schedule.items():
        assert sorted(slots) == expected, (
            f"{name} fired at {sorted(slots)}, expected once at each of {expected}"
        )
    cron_tasks = sql(
        pg_db,
        """SELECT count(*) FROM tasks t JOIN task_schedule s ON s.id = t.schedule_id
                               WHERE s.name LIKE 'cron-%%' AND t.created_at >= %s AND t.created_at < %s""",
        first_slot,
        last_slot + timedelta(minutes=1),  # the slot after the window cannot have fired before it
    )[0][0]
    assert cron_tasks == CRON_SCHEDULES * CRON_MINUTES


def _cron_caught_up(db_url: str) -> bool:
    """No cron schedule is due, and none has a firing under way (its tasks not all submitted)."""
    behind = sql(
        db_url,
        """SELECT count(*) FROM task_schedule s WHERE s.name LIKE 'cron-%%'
           AND (s.next_run_at <= clock_timestamp() OR EXISTS (
               SELECT 1 FROM task_schedule_run r WHERE r.schedule_id = s.id AND r.state = 'running'))""",
    )
    return behind == [(0,)]


def _cron_runs_ended(db_url: str, first_slot: datetime, last_slot: datetime) -> int:
    """How many firings of the cron schedules' slots from `first_slot` to `last_slot` were written back."""
    ended = sql(
        db_url,
        """SELECT count(*) FROM task_schedule_run r JOIN task_schedule s ON s.id = r.schedule_id
           WHERE s.name LIKE 'cron-%%' AND r.scheduled_for BETWEEN %s AND %s AND r.state <> 'running'""",
        first_slot,
        last_slot,
    )
    return int(ended[0][0])  # type: ignore[call-overload]


def test_instance_killed_mid_drain_fires_nothing_twice(pg_db: str, tmp_path: Path) -> None:
    """SIGKILL between claim and submit: the tick is lost (at most once), never repeated, and visible."""
    count = 300
    with servers(pg_db, tmp_path, 1, args=["--no-dispatcher"]) as (setup,):
        stub = setup.stub()
        names = [f"k-{i:03d}" for i in range(count)]
        create_racks(stub, names[:1])
        past = rfc3339(datetime.now(UTC) - timedelta(minutes=1))
        stub.CreateTaskSchedule(
            schedule_request(names[0], names[:1], spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec=past)
        )
        clone_schedule(pg_db, names[0], names[1:])

    lease = {"RACKFLOW_LEASE_TTL": "3s"}
    # The victim pauses after committing its first claim (a failpoint), so the kill lands between phases.
    victim = start_server(
        pg_db,
        tmp_path,
        name="victim",
        args=["--dispatch-interval", "1s"],
        env={**lease, "RACKFLOW_FAILPOINT_PAUSE_AFTER_CLAIM": "30s"},
    )
    try:
        wait_until(
            lambda: "failpoint pause_after_claim: pausing" in victim.output, timeout=20, what="victim's claim"
        )
        victim.kill()
        with servers(pg_db, tmp_path, 1, args=["--dispatch-interval", "1s"], env=lease):
            wait_until(
                lambda: (
                    sql(pg_db, "SELECT count(*) FROM task_schedule WHERE next_run_at IS NOT NULL")[0][0] == 0
                    and sql(pg_db, "SELECT count(*) FROM task_schedule_run WHERE state = 'running'")[0][0]
                    == 0
                ),
                timeout=60,
                what="every schedule consumed and no run left running",
            )
    finally:
        victim.kill()

    per_schedule = sql(
        pg_db,
        """SELECT s.name, count(r.id) FROM task_schedule s
                                 LEFT JOIN task_schedule_run r ON r.schedule_id = s.id GROUP BY s.name""",
    )
    assert {n for _, n in per_schedule} == {1}, "a schedule fired twice or never"
    interrupted = sql(pg_db, "SELECT count(*) FROM task_schedule_run WHERE state = 'interrupted'")[0][0]
    assert interrupted >= 1, "the victim's claimed batch should show as interrupted runs"
    tasks_per_schedule = sql(
        pg_db, "SELECT max(c) FROM (SELECT count(*) c FROM tasks GROUP BY schedule_id) x"
    )
    assert tasks_per_schedule[0][0] == 1
    completed = sql(pg_db, "SELECT count(*) FROM task_schedule_run WHERE state = 'completed'")[0][0]
    assert completed + interrupted == count
