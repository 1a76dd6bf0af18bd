"""The dispatcher's queries on both databases: what a claim takes, what a claim in doubt committed, and which
runs the sweep interrupts."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from sqlalchemy import insert, select, update

from rackflow.store import dispatch
from rackflow.store import runs as run_history
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.tables import instances, task_schedule
from tests.store.schedules_support import START, Env, make_env

LEASE = timedelta(seconds=15)


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _set(env: Env, schedule_id: uuid.UUID, **values: object) -> None:
    async with env.db.transaction() as conn:
        await conn.execute(update(task_schedule).where(task_schedule.c.id == schedule_id).values(**values))


async def test_claim_takes_due_enabled_rows_oldest_first_up_to_the_batch(env: Env) -> None:
    rack = await env.rack("r1")
    made = [await env.schedule(f"s{i}", racks=[rack]) for i in range(5)]
    now = START + timedelta(hours=2)
    for minutes, schedule in zip([30, 10, 20, 0, 0], made, strict=True):
        await _set(env, schedule.id, next_run_at=START + timedelta(minutes=minutes))
    await _set(env, made[3].id, enabled=False)  # paused: never claimed
    await _set(env, made[4].id, next_run_at=now + timedelta(seconds=1))  # not yet due
    async with env.db.transaction() as conn:
        claimed = await dispatch.claim_due(env.db, conn, now, batch=2)
        assert await dispatch.count_due(conn, now) == 3
    assert [s.name for s in claimed] == ["s1", "s2"]


async def test_the_backlog_is_counted_up_to_its_cap(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    rack = await env.rack("r1")
    for i in range(3):
        await _set(env, (await env.schedule(f"s{i}", racks=[rack])).id, next_run_at=START)
    monkeypatch.setattr(dispatch, "DUE_COUNT_CAP", 2)
    async with env.db.read() as conn:
        assert await dispatch.count_due(conn, START + timedelta(hours=1)) == 2  # "at least 2"


async def _run(env: Env, *, owner: uuid.UUID | None, age: timedelta) -> uuid.UUID:
    run_id = uuid.uuid4()
    schedule = await env.schedule(f"sched-{run_id.hex[:8]}", racks=[await env.rack(f"rack-{run_id.hex[:8]}")])
    async with env.db.transaction() as conn:
        await run_history.insert_runs(
            env.db, conn, [run_history.NewRun(run_id, schedule.id, START - age, "dispatch", None, owner)]
        )
    return schedule.id


async def _instance(env: Env, heartbeat_age: timedelta) -> uuid.UUID:
    instance_id = uuid.uuid4()
    beat = START - heartbeat_age
    async with env.db.transaction() as conn:
        await conn.execute(
            insert(instances).values(id=instance_id, host="h", pid=1, started_at=beat, heartbeat_at=beat)
        )
    return instance_id


@pytest.mark.postgres
async def test_a_claim_in_doubt_is_answered_for_only_once_it_is_over(pg_db: str) -> None:
    """A claim whose COMMIT was lost in the network may still be open on the server, holding its schedules:
    the look-up refuses to answer then (it would say "not committed" of a claim that may yet commit).
    (PostgreSQL only: SQLite's single writer opens no claim beside the look-up's transaction.)"""
    db = Database(pg_db)
    try:
        await _look_up_beside_an_open_claim(make_env(db))
    finally:
        await db.dispose()


async def _look_up_beside_an_open_claim(env: Env) -> None:
    schedule = await env.schedule(racks=[await env.rack("r1")])
    run_id = uuid.uuid4()
    async with env.db.transaction() as claim:
        await claim.execute(
            env.db.for_update(select(task_schedule.c.id).where(task_schedule.c.id == schedule.id))
        )
        await run_history.insert_runs(
            env.db, claim, [run_history.NewRun(run_id, schedule.id, START, "dispatch", None, None)]
        )
        with pytest.raises(Exception, match="could not obtain lock"):
            async with env.db.transaction() as conn:
                await dispatch.claimed_runs(env.db, conn, [schedule.id], [run_id])
    async with env.db.transaction() as conn:
        assert await dispatch.claimed_runs(env.db, conn, [schedule.id], [run_id]) == {run_id}
        assert await dispatch.claimed_runs(env.db, conn, [schedule.id], [uuid.uuid4()]) == set()


async def test_sweep_interrupts_runs_of_dead_owners_and_stuck_runs_only(env: Env) -> None:
    live, dead = await _instance(env, timedelta(seconds=1)), await _instance(env, timedelta(minutes=1))
    fresh_live = await _run(env, owner=live, age=timedelta(seconds=5))
    fresh_manual = await _run(env, owner=None, age=timedelta(seconds=5))
    of_dead = await _run(env, owner=dead, age=timedelta(seconds=5))
    of_unknown = await _run(env, owner=uuid.uuid4(), age=timedelta(seconds=5))
    stuck_live = await _run(env, owner=live, age=dispatch.STUCK_RUN_AGE + timedelta(seconds=1))
    stuck_manual = await _run(env, owner=None, age=dispatch.STUCK_RUN_AGE + timedelta(seconds=1))
    async with env.db.transaction() as conn:
        marked = await dispatch.mark_abandoned_runs(conn, START, LEASE)
    states = {}
    for schedule_id in (fresh_live, fresh_manual, of_dead, of_unknown, stuck_live, stuck_manual):
        (run,), _ = await env.services.schedules.list_runs(schedule_id)
        states[schedule_id] = run.state
    assert marked == 4
    assert states == {
        fresh_live: "running",
        fresh_manual: "running",
        of_dead: "interrupted",
        of_unknown: "interrupted",
        stuck_live: "interrupted",
        stuck_manual: "interrupted",
    }


async def test_a_repeated_key_reads_its_rows_once(env: Env) -> None:
    schedule = await env.schedule("s0", racks=[await env.rack("r1")])
    async with env.db.read() as conn:
        found = await store.scopes_by_schedule(conn, [schedule.id, schedule.id])
    assert len(found[schedule.id]) == 1  # as `IN (a, a)` would: by_keys looks each key up once
