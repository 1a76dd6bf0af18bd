"""Manual triggers and the shared firing phases, on both databases: advance, submit, write back, record."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.clock import FakeClock, SystemClock
from rackflow.domain.firing import RunResult
from rackflow.domain.inventory import Rack, RackSelection
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import (
    MAX_WAITING_PER_RACK,
    ConflictStrategy,
    Operation,
    OperationKind,
    QueueOptions,
    TaskStatus,
)
from rackflow.errors import FailedPrecondition, NotFound, Unavailable
from rackflow.schedules import firing
from rackflow.services import Services
from rackflow.store import runs as run_history
from rackflow.store import schedules as store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.tasks.scheduled import task_description
from rackflow.timespec import ScheduleSpec, SpecType
from tests.conftest import table_counts
from tests.store.schedules_support import POWER_OFF, START, Env, make_env


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def test_trigger_submits_one_task_per_scope_and_records_the_firing(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule("nightly", racks=[r1, r2])
    env.clock.advance(timedelta(minutes=5))
    fired_at = env.clock.now()

    task_ids = await env.services.schedules.trigger(schedule.id)

    tasks = await env.services.tasks.get_tasks(task_ids)
    assert {t.rack_id for t in tasks} == {r1.id, r2.id}
    assert all(t.schedule_id == schedule.id for t in tasks)
    assert all(t.operation == POWER_OFF for t in tasks)
    assert {t.description for t in tasks} == {"nightly — 2026-03-02T12:05:00Z"}
    after = await env.services.schedules.get(schedule.id)
    assert after.last_run_at == fired_at
    assert after.next_run_at == fired_at + timedelta(hours=1)
    assert after.enabled
    scopes = await env.services.schedules.list_scopes(schedule.id)
    assert {s.rack_id: s.last_task_id for s in scopes} == {t.rack_id: t.id for t in tasks}
    runs, total = await env.services.schedules.list_runs(schedule.id)
    assert total == 1
    (run,) = runs
    assert (run.trigger, run.state, run.fired_at) == ("manual", "completed", fired_at)
    assert {(o.rack_id, o.outcome, o.task_id, o.error) for o in run.outcomes} == {
        (t.rack_id, "submitted", t.id, "") for t in tasks
    }


async def test_trigger_advances_cron_to_the_next_calendar_time(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "0 */6 * * *"))
    env.clock.advance(timedelta(hours=7))  # 19:00
    await env.services.schedules.trigger(schedule.id)
    assert (await env.services.schedules.get(schedule.id)).next_run_at == datetime(
        2026, 3, 3, 0, 0, tzinfo=UTC
    )


@pytest.mark.postgres
async def test_a_host_clock_ahead_of_the_database_moves_no_schedule_past_a_slot(pg_db: str) -> None:
    """What is due is the database's clock on PostgreSQL (SPEC, "Draining"), for every time the service
    counts a schedule's next run from, as for a dispatched firing: a host 30 minutes fast that counted a
    */15 schedule's next run from its own clock would skip its next two slots. Create, trigger, retry,
    resume and a new spec each count it. (On SQLite the process's clock is the database's.)"""
    db = Database(pg_db)
    try:
        await _count_on_a_fast_host(db)
    finally:
        await db.dispose()


async def _count_on_a_fast_host(db: Database) -> None:
    env = Env(db, FakeClock(START), Services.build(db, SystemClock(timedelta(minutes=30))))
    quarterly = ScheduleSpec(SpecType.CRON, "*/15 * * * *")
    service = env.services.schedules

    async def next_slot_is_the_databases(schedule_id: uuid.UUID) -> datetime:
        async with db.read() as conn:
            database_now = await db.now(conn)
        slot = (await service.get(schedule_id)).next_run_at
        assert slot is not None and database_now - timedelta(minutes=1) < slot <= database_now + timedelta(
            minutes=15
        )
        return database_now

    schedule = await env.schedule(racks=[await env.rack("r1")], spec=quarterly)
    await next_slot_is_the_databases(schedule.id)
    (task_id,) = await service.trigger(schedule.id)
    database_now = await next_slot_is_the_databases(schedule.id)
    (run,), _ = await service.list_runs(schedule.id)
    async with db.transaction() as conn:
        await task_store.set_status(conn, [task_id], TaskStatus.FAILED, now=database_now)
    retried = await service.retry_run(run.id)
    assert retried.run.fired_at < database_now + timedelta(minutes=1)
    await next_slot_is_the_databases(schedule.id)
    await service.pause(schedule.id)
    await service.resume(schedule.id)
    await next_slot_is_the_databases(schedule.id)
    await service.update(schedule.id, ["schedule.spec"], spec_type=SpecType.CRON, spec="*/15 * * * *")
    await next_slot_is_the_databases(schedule.id)


async def test_one_time_is_consumed_by_a_trigger_and_cannot_fire_again(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T04:00:00Z"))
    assert len(await env.services.schedules.trigger(schedule.id)) == 1
    consumed = await env.services.schedules.get(schedule.id)
    assert (consumed.enabled, consumed.next_run_at, consumed.last_run_at) == (False, None, START)
    before = await table_counts(env.db)
    with pytest.raises(FailedPrecondition, match="already fired"):
        await env.services.schedules.trigger(schedule.id)
    assert await table_counts(env.db) == before


async def test_trigger_ignores_enabled_and_a_paused_schedule_stays_paused(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    await env.services.schedules.pause(schedule.id)
    env.clock.advance(timedelta(minutes=20))
    assert len(await env.services.schedules.trigger(schedule.id)) == 1
    after = await env.services.schedules.get(schedule.id)
    assert not after.enabled
    assert after.last_run_at == env.clock.now()
    assert after.next_run_at == env.clock.now() + timedelta(hours=1)


async def test_trigger_ignores_the_overlap_policy_queue(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], policy=OverlapPolicy.QUEUE)
    (first,) = await env.services.schedules.trigger(schedule.id)
    (second,) = await env.services.schedules.trigger(schedule.id)
    statuses = {t.id: t.status for t in await env.services.tasks.get_tasks([first, second])}
    assert statuses == {first: TaskStatus.PENDING, second: TaskStatus.WAITING}


async def test_trigger_ignores_the_overlap_policy_skip_and_the_task_manager_decides(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], policy=OverlapPolicy.SKIP)
    await env.services.schedules.trigger(schedule.id)
    env.clock.advance(timedelta(seconds=1))
    with pytest.raises(FailedPrecondition, match="conflicts with task"):
        await env.services.schedules.trigger(schedule.id)
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    (outcome,) = runs[0].outcomes
    assert outcome.outcome == "failed"  # rejected by the conflict rules, not skipped for overlap
    assert outcome.error


async def _fill_queue(env: Env, rack: Rack) -> None:
    """One pending task on the rack and MAX_WAITING_PER_RACK waiting behind it."""
    selections = [RackSelection(rack.id)]
    await env.services.tasks.submit(POWER_OFF, selections, description="busy", queue=QueueOptions())
    for _ in range(MAX_WAITING_PER_RACK):
        queued = QueueOptions(ConflictStrategy.QUEUE)
        await env.services.tasks.submit(POWER_OFF, selections, description="queued", queue=queued)


async def test_a_trigger_that_submits_nothing_is_failed_precondition_naming_each_rack_and_why(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    full, gone = await env.rack("full"), await env.rack("gone")
    await _fill_queue(env, full)
    schedule = await env.schedule("nightly", racks=[full, gone], policy=OverlapPolicy.QUEUE)
    real_fire = firing.fire

    async def rack_deleted_after_phase_one(*args: Any, **kwargs: Any) -> list[RunResult]:
        await env.services.inventory.delete_rack(gone.id)
        return await real_fire(*args, **kwargs)

    monkeypatch.setattr(firing, "fire", rack_deleted_after_phase_one)
    env.clock.advance(timedelta(minutes=5))
    with pytest.raises(FailedPrecondition) as refused:
        await env.services.schedules.trigger(schedule.id)

    message = str(refused.value)
    assert message.startswith(f"id: schedule 'nightly' ({schedule.id}) fired but submitted no task")
    assert f"rack 'full' ({full.id}): waiting queue full" in message
    assert f"rack '?' ({gone.id}): rack_id: rack {gone.id} not found" in message
    # The firing happened all the same: recorded, with each scope's outcome, and the schedule advanced.
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert str(run.id) in message
    assert (run.trigger, run.state) == ("manual", "completed")
    assert {o.rack_id: o.outcome for o in run.outcomes} == {full.id: "failed", gone.id: "failed"}
    after = await env.services.schedules.get(schedule.id)
    assert after.last_run_at == env.clock.now()
    assert after.next_run_at == env.clock.now() + timedelta(hours=1)


async def test_a_one_time_schedule_is_consumed_by_a_trigger_that_submits_nothing(env: Env) -> None:
    busy = await env.rack("busy")
    await env.services.tasks.submit(
        Operation(OperationKind.BRING_UP), [RackSelection(busy.id)], description="", queue=QueueOptions()
    )
    once = ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T04:00:00Z")
    schedule = await env.schedule(
        "once", racks=[busy], spec=once, operation=Operation(OperationKind.POWER_ON)
    )
    with pytest.raises(
        FailedPrecondition, match=f"rack 'busy' \\({busy.id}\\): power_on conflicts with task"
    ):
        await env.services.schedules.trigger(schedule.id)
    consumed = await env.services.schedules.get(schedule.id)
    assert (consumed.enabled, consumed.next_run_at, consumed.last_run_at) == (False, None, START)
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert [o.outcome for o in run.outcomes] == ["failed"]
    with pytest.raises(FailedPrecondition, match="already fired"):
        await env.services.schedules.trigger(schedule.id)


async def test_a_trigger_of_a_schedule_without_scopes_is_ok_with_no_task(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    await env.services.inventory.delete_rack(r1.id)  # takes the schedule's only scope entry with it
    assert await env.services.schedules.trigger(schedule.id) == []
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert run.outcomes == ()


async def test_a_failing_scope_does_not_stop_the_others(env: Env) -> None:
    busy, free = await env.rack("busy"), await env.rack("free")
    await env.services.tasks.submit(
        POWER_OFF, [RackSelection(busy.id)], description="manual", queue=QueueOptions()
    )
    schedule = await env.schedule(racks=[busy, free])
    task_ids = await env.services.schedules.trigger(schedule.id)
    (task,) = await env.services.tasks.get_tasks(task_ids)
    assert task.rack_id == free.id
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    outcomes = {o.rack_id: o for o in runs[0].outcomes}
    assert outcomes[busy.id].outcome == "failed" and outcomes[busy.id].task_id is None
    assert outcomes[busy.id].error
    assert outcomes[free.id].outcome == "submitted"
    scopes = {s.rack_id: s.last_task_id for s in await env.services.schedules.list_scopes(schedule.id)}
    assert scopes == {busy.id: None, free.id: task.id}


async def test_a_pruned_last_task_keeps_its_id_and_overlaps_nothing(env: Env) -> None:
    """`last_task_id` has no foreign key (migration 0034): a task pruned by `--task-retention` leaves its
    id in the scope (still the task the newest firing submitted), and the SKIP check, finding no such
    task, lets the next firing submit, as it did when the key set the id NULL."""
    rack = await env.rack("r1")
    schedule = await env.schedule(racks=[rack])
    (first,) = await env.services.schedules.trigger(schedule.id)
    await env.services.tasks.cancel(first)  # ended, so retention may prune it
    async with env.db.transaction() as conn:
        await conn.execute(delete(tasks).where(tasks.c.id == first))  # what the task prune deletes
    (scope,) = await env.services.schedules.list_scopes(schedule.id)
    assert scope.last_task_id == first
    async with env.db.read() as conn:
        assert await store.overlapping_scope_ids(conn, [scope]) == set()

    env.clock.advance(timedelta(hours=1))
    result = await _fire_by_hand(env, schedule)
    assert [o.outcome for o in result.outcomes] == ["submitted"]
    (scope,) = await env.services.schedules.list_scopes(schedule.id)
    assert scope.last_task_id == result.task_ids[0]


async def test_only_the_scopes_own_last_task_makes_it_overlap_not_other_live_work_on_its_rack(
    env: Env,
) -> None:
    """The SKIP check reads the live tasks of the scopes' racks: another task live on the rack (here one
    submitted by hand) is not the scope's last task, and the scope's own active last task still is."""
    rack = await env.rack("r1")
    schedule = await env.schedule(racks=[rack])
    (first,) = await env.services.schedules.trigger(schedule.id)
    await env.services.tasks.cancel(first)
    (by_hand,) = await env.services.tasks.submit(
        POWER_OFF, [RackSelection(rack.id)], description="by hand", queue=QueueOptions()
    )
    (scope,) = await env.services.schedules.list_scopes(schedule.id)
    assert scope.last_task_id == first
    async with env.db.read() as conn:
        assert await store.overlapping_scope_ids(conn, [scope]) == set()

    await env.services.tasks.cancel(by_hand.id)
    env.clock.advance(timedelta(seconds=1))
    (second,) = await env.services.schedules.trigger(schedule.id)
    (scope,) = await env.services.schedules.list_scopes(schedule.id)
    assert scope.last_task_id == second
    async with env.db.read() as conn:
        assert await store.overlapping_scope_ids(conn, [scope]) == {scope.id}


async def test_trigger_unknown_is_not_found(env: Env) -> None:
    with pytest.raises(NotFound):
        await env.services.schedules.trigger(uuid.uuid4())


async def test_fire_records_skipped_scopes_and_keeps_their_last_task(env: Env) -> None:
    """The dispatcher's path: `firing.claim` leaves out the scope whose last task is still active."""
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1, r2])
    first_ids = await env.services.schedules.trigger(schedule.id)
    scopes = await env.services.schedules.list_scopes(schedule.id)
    async with env.db.read() as conn:
        overlapping = await store.overlapping_scope_ids(conn, scopes)
    assert overlapping == {s.id for s in scopes}

    await env.services.tasks.cancel(next(s.last_task_id for s in scopes if s.rack_id == r2.id))  # type: ignore[arg-type]
    async with env.db.read() as conn:
        overlapping = await store.overlapping_scope_ids(conn, scopes)
    (skipped,) = [s for s in scopes if s.rack_id == r1.id]
    assert overlapping == {skipped.id}

    env.clock.advance(timedelta(hours=1))
    result = await _fire_by_hand(env, schedule)
    (new_task,) = result.task_ids
    outcomes = {o.rack_id: o.outcome for o in result.outcomes}
    assert outcomes == {r1.id: "skipped_overlap", r2.id: "submitted"}
    after = {s.rack_id: s.last_task_id for s in await env.services.schedules.list_scopes(schedule.id)}
    assert after[r1.id] in first_ids and after[r2.id] == new_task
    runs, total = await env.services.schedules.list_runs(schedule.id)
    assert total == 2 and runs[0].id == result.run_id and runs[0].trigger == "dispatch"


async def test_runs_are_listed_newest_first_with_paging(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], policy=OverlapPolicy.QUEUE)
    for _ in range(3):
        await env.services.schedules.trigger(schedule.id)
        env.clock.advance(timedelta(minutes=1))
    runs, total = await env.services.schedules.list_runs(schedule.id, offset=1, limit=1)
    assert total == 3
    assert [r.fired_at for r in runs] == [START + timedelta(minutes=1)]
    with pytest.raises(NotFound, match="schedule_id"):
        await env.services.schedules.list_runs(uuid.uuid4())


async def test_run_history_keeps_the_newest_hundred(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    async with env.db.transaction() as conn:
        await run_history.insert_runs(
            env.db,
            conn,
            [
                # Written back ("completed"): a run still running is kept past the cap until it is.
                run_history.NewRun(
                    uuid.uuid4(),
                    schedule.id,
                    START + timedelta(minutes=minute),
                    "dispatch",
                    state="completed",
                )
                for minute in range(102)
            ],
        )
        await run_history.prune_runs(conn, [schedule.id])
    runs, total = await env.services.schedules.list_runs(schedule.id)
    assert total == 100
    assert runs[0].fired_at == START + timedelta(minutes=101)
    assert runs[-1].fired_at == START + timedelta(minutes=2)


def test_task_description_is_name_and_rfc3339_time() -> None:
    class Named:
        name = "backup"

    moment = datetime(2026, 6, 1, 4, 0, 0, 250000, tzinfo=UTC)
    assert task_description(Named(), moment) == "backup — 2026-06-01T04:00:00.250000Z"  # type: ignore[arg-type]


async def test_write_back_is_retried_after_a_failure(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    real_complete_runs = run_history.complete_runs
    attempts: list[int] = []

    async def flaky_complete_run(*args: object, **kwargs: object) -> set[uuid.UUID]:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("database went away")
        return await real_complete_runs(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(firing, "WRITEBACK_RETRY_DELAY_SECONDS", 0)
    monkeypatch.setattr(run_history, "complete_runs", flaky_complete_run)
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    assert len(attempts) == 2
    (scope,) = await env.services.schedules.list_scopes(schedule.id)
    assert scope.last_task_id == task_id
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    assert runs[0].state == "completed"


async def test_write_back_gives_up_at_its_deadline_and_keeps_the_tasks(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])

    async def broken_complete_run(*args: object, **kwargs: object) -> None:
        raise ConnectionError("database went away")

    monkeypatch.setattr(firing, "WRITEBACK_RETRY_DELAY_SECONDS", 0.01)
    monkeypatch.setattr(firing, "WRITEBACK_DEADLINE_SECONDS", 0.2)
    monkeypatch.setattr(run_history, "complete_runs", broken_complete_run)
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    assert len(await env.services.tasks.get_tasks([task_id])) == 1
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    assert runs[0].state == "running"  # left for the dispatcher's sweep to mark interrupted
    (scope,) = await env.services.schedules.list_scopes(schedule.id)
    assert scope.last_task_id is None


async def _fire_by_hand(env: Env, schedule: Schedule) -> RunResult:
    """The dispatcher's firing of one schedule, due or not: its row locked, `firing.claim` (the overlap
    check, the advance, a "running" run for its slot), then `firing.fire` (submit, write back)."""
    async with env.db.transaction() as conn:
        locked = await store.get_schedule(conn, schedule.id, lock=env.db.for_update)
        assert locked is not None
        claimed = await firing.claim(env.db, conn, [locked], trigger="dispatch", now=env.clock.now())
    (result,) = await firing.fire(env.db, env.services.tasks, env.clock, claimed)
    return result


def _lose_the_connection_after_the_submit_commits(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """The transaction that submits tasks commits, then raises `Unavailable`, as when the connection dies
    during COMMIT after the database committed."""
    real_transaction, real_submit_each_in = env.db.transaction, env.services.tasks.submit_each_in
    submits: list[int] = []

    async def counted_submit_each_in(*args: Any, **kwargs: Any) -> Any:
        submits.append(1)
        return await real_submit_each_in(*args, **kwargs)

    @asynccontextmanager
    async def transaction() -> AsyncIterator[AsyncConnection]:
        submits_before = len(submits)
        async with real_transaction() as conn:
            yield conn
        if len(submits) > submits_before:
            raise Unavailable("database unavailable: server closed the connection unexpectedly")

    monkeypatch.setattr(env.services.tasks, "submit_each_in", counted_submit_each_in)
    monkeypatch.setattr(env.db, "transaction", transaction)


async def test_a_submit_committed_but_reported_unavailable_records_the_tasks_it_made(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy, r1, r2 = await env.rack("busy"), await env.rack("r1"), await env.rack("r2")
    await env.services.tasks.submit(
        POWER_OFF, [RackSelection(busy.id)], description="manual", queue=QueueOptions()
    )
    schedule = await env.schedule(racks=[busy, r1, r2])
    _lose_the_connection_after_the_submit_commits(env, monkeypatch)

    result = await _fire_by_hand(env, schedule)

    made, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    assert {t.rack_id for t in made} == {r1.id, r2.id}  # the busy rack's scope was refused
    task_by_rack = {t.rack_id: t.id for t in made}
    (run,) = [r for r in (await env.services.schedules.list_runs(schedule.id))[0] if r.id == result.run_id]
    assert run.state == "completed"
    for outcomes in (run.outcomes, result.outcomes):
        by_rack = {o.rack_id: o for o in outcomes}
        assert {rack: (o.outcome, o.task_id) for rack, o in by_rack.items()} == {
            busy.id: ("failed", None),
            r1.id: ("submitted", task_by_rack[r1.id]),
            r2.id: ("submitted", task_by_rack[r2.id]),
        }
        assert by_rack[busy.id].error.startswith("not submitted: database unavailable")
    scopes = {s.rack_id: s.last_task_id for s in await env.services.schedules.list_scopes(schedule.id)}
    assert scopes == {busy.id: None, **task_by_rack}


@pytest.mark.parametrize(
    "error",
    [Unavailable("database unavailable: connection refused"), RuntimeError("a bug")],
    ids=["connection-lost-before-commit", "bug"],
)
async def test_a_submit_that_fails_before_commit_records_every_scope_failed(
    env: Env, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1, r2])
    real_submit_each_in = env.services.tasks.submit_each_in

    async def submit_then_fail(*args: Any, **kwargs: Any) -> Any:
        await real_submit_each_in(*args, **kwargs)  # rows inserted, then rolled back
        raise error

    monkeypatch.setattr(env.services.tasks, "submit_each_in", submit_then_fail)

    result = await _fire_by_hand(env, schedule)

    assert (await env.services.tasks.list_tasks(schedule_id=schedule.id))[1] == 0
    (run,) = (await env.services.schedules.list_runs(schedule.id))[0]
    for outcomes in (run.outcomes, result.outcomes):
        assert {(o.rack_id, o.outcome, o.task_id, o.error) for o in outcomes} == {
            (rack.id, "failed", None, f"not submitted: {error}") for rack in (r1, r2)
        }
    assert {s.last_task_id for s in await env.services.schedules.list_scopes(schedule.id)} == {None}


async def test_a_refused_scope_is_recorded_with_its_reason_and_nothing_is_looked_up(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy, free = await env.rack("busy"), await env.rack("free")
    await env.services.tasks.submit(
        POWER_OFF, [RackSelection(busy.id)], description="manual", queue=QueueOptions()
    )
    schedule = await env.schedule(racks=[busy, free])

    async def no_lookup(*args: object) -> None:
        raise AssertionError("a submit with a known outcome needs no lookup")

    monkeypatch.setattr(store, "tasks_of_firings", no_lookup)

    result = await _fire_by_hand(env, schedule)

    outcomes = {o.rack_id: o for o in result.outcomes}
    assert outcomes[busy.id].outcome == "failed" and outcomes[busy.id].task_id is None
    assert "not submitted" not in outcomes[busy.id].error and "busy" in outcomes[busy.id].error
    assert outcomes[free.id].outcome == "submitted"
    (run,) = (await env.services.schedules.list_runs(schedule.id))[0]
    assert run.outcomes == result.outcomes


async def test_tasks_of_firings_finds_each_firings_tasks_by_run_and_rack(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1, r2], policy=OverlapPolicy.QUEUE)
    first = await env.services.schedules.trigger(schedule.id)
    env.clock.advance(timedelta(minutes=1))
    second = await env.services.schedules.trigger(schedule.id)
    tasks = {t.id: t for t in await env.services.tasks.get_tasks(first + second)}
    (second_run, first_run), _ = await env.services.schedules.list_runs(schedule.id)
    assert {tasks[i].run_id for i in first} == {first_run.id}  # every task carries its firing
    async with env.db.read() as conn:
        found = await store.tasks_of_firings(conn, [first_run.id, uuid.uuid4()])
        both = await store.tasks_of_firings(conn, [first_run.id, second_run.id])
    assert found == {(first_run.id, tasks[i].rack_id): i for i in first}
    assert both == {(tasks[i].run_id, tasks[i].rack_id): i for i in first + second}


async def test_a_batch_is_logged_in_lines_of_up_to_fifty_firings_each_named_with_its_run(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    rack = await env.rack("r1")
    made = [await env.schedule(f"s{i:02d}", racks=[rack]) for i in range(firing.FIRINGS_PER_LOG_LINE + 1)]
    async with env.db.transaction() as conn:
        locked = [await store.get_schedule(conn, s.id, lock=env.db.for_update) for s in made]
        claimed = await firing.claim(
            env.db, conn, [s for s in locked if s is not None], trigger="dispatch", now=env.clock.now()
        )
    with caplog.at_level(logging.INFO, logger="rackflow.schedules.firing"):
        results = await firing.fire(env.db, env.services.tasks, env.clock, claimed)

    lines = [r for r in caplog.records if r.getMessage().startswith("fired ")]
    assert [len(r.__dict__["firings"]) for r in lines] == [firing.FIRINGS_PER_LOG_LINE, 1]
    assert lines[0].getMessage() == "fired 50 schedule(s) (dispatch): 1 submitted, 0 skipped, 49 failed"
    named = [name for r in lines for name in r.__dict__["firings"]]
    outcomes = {r.run_id: r.outcomes[0].outcome for r in results}
    expected = [
        f"{f.schedule.name} (run {f.run_id}): {'1/0/0' if outcomes[f.run_id] == 'submitted' else '0/0/1'}"
        for f in claimed
    ]
    assert named == expected


async def test_a_batch_s_firing_whose_schedule_is_deleted_before_its_submit_submits_nothing_alone(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """DeleteSchedule commits between a dispatched batch's claim and its submit, for one of its firings: that
    firing submits nothing, its scope is reported not submitted because the schedule was deleted (in its
    result and the log), and the batch's other firing fires. Before, the submit held nothing of the
    firings: on PostgreSQL the deleted schedule's task was submitted, and ran, after the operator deleted
    it; on SQLite its run's foreign key failed the batch's whole submit."""
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    kept, deleted = await env.schedule("kept", racks=[r1]), await env.schedule("gone", racks=[r2])
    async with env.db.transaction() as conn:
        locked = [await store.get_schedule(conn, s.id, lock=env.db.for_update) for s in (kept, deleted)]
        claimed = await firing.claim(
            env.db, conn, [s for s in locked if s is not None], trigger="dispatch", now=env.clock.now()
        )
    await env.services.schedules.delete(deleted.id)
    with caplog.at_level(logging.INFO, logger="rackflow.schedules.firing"):
        fired, gone = await firing.fire(env.db, env.services.tasks, env.clock, claimed)

    (task,), _ = await env.services.tasks.list_tasks()
    assert (task.rack_id, task.schedule_id) == (r1.id, kept.id)
    assert [(o.outcome, o.task_id) for o in fired.outcomes] == [("submitted", task.id)]
    assert gone.deleted and not fired.deleted
    assert [(o.rack_id, o.outcome, o.task_id) for o in gone.outcomes] == [(r2.id, "failed", None)]
    assert gone.outcomes[0].error == "not submitted: its schedule was deleted since it fired"
    (run,), _ = await env.services.schedules.list_runs(kept.id)
    assert (run.id, run.state, run.outcomes) == (fired.run_id, "completed", fired.outcomes)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        f"schedule gone ({deleted.id}): deleted, with run {gone.run_id}, since it fired; "
        "its 1 scope(s) not submitted"
    )


async def test_a_trigger_whose_schedule_is_deleted_before_its_submit_is_not_found_and_submits_nothing(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteSchedule commits between a trigger's claim and its submit: the trigger answers NotFound saying
    so, having submitted nothing (the deletion came first). Before, it submitted the tasks of a schedule
    deleted before them (PostgreSQL), and answered with them."""
    rack = await env.rack("r1")
    schedule = await env.schedule("nightly", racks=[rack])
    schedules = env.services.schedules
    env.delete_before_its_submit(monkeypatch, schedule)
    with pytest.raises(NotFound) as gone:
        await schedules.trigger(schedule.id)
    assert gone.match(
        rf"^id: schedule 'nightly' \({schedule.id}\) was deleted, with run .* that fired before it; nothing "
        "was submitted$"
    )
    assert (await env.services.tasks.list_tasks())[1] == 0
