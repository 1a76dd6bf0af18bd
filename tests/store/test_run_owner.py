"""A schedule run records an owner, the instance firing it, only while it is "running" (`store.runs.owned`),
on both databases: every write that moves a run out of "running" clears the owner in the same statement,
so a run that ended names no instance. Each path is driven here: a firing's write-back (a manual trigger,
a dispatched firing, a retry, an approved run; the write-back's second pass over a run whose scope was
settled meanwhile), the stuck-run sweep (its owner's heartbeat lapsed, or too long running), and a
rollout's `save_run` (a halt, a resume, a cancel, a completion) of a rollout an older release recorded with
an owner. A write that leaves a run "running" (a settled scope's) keeps its owner, which the sweep reads.
And the owner is indexed only where a run is "running", so clearing it costs a run's completion (never a
HOT update: its state is in the partial indexes' predicates) no index entry.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import Run, RunState, Schedule, ScopeOutcome
from rackflow.domain.tasks import TaskStatus
from rackflow.schedules import firing
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store import dispatch, instances, rollouts
from rackflow.store import runs as run_history
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule_run
from tests.store.schedules_support import Env, make_env
from tests.store.test_run_sweep import LEASE, Sweep, _schedule, other_instance  # noqa: F401 (the other instance's sweep)

pytestmark = pytest.mark.asyncio


_run = task_schedule_run.c


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _instance(env: Env) -> tuple[uuid.UUID, Services]:
    """An instance that registered its heartbeat now, and its services."""
    instance_id = uuid.uuid4()
    await instances.register(env.db, instance_id, host="a", pid=1)
    return instance_id, Services.build(env.db, env.clock, instance_id=instance_id)


async def _owners(env: Env, schedule_id: uuid.UUID) -> dict[uuid.UUID, tuple[str, uuid.UUID | None]]:
    """Each run of the schedule: its state and the owner its row holds."""
    async with env.db.read() as conn:
        stmt = select(_run.id, _run.state, _run.owner_id).where(_run.schedule_id == schedule_id)
        return {row.id: (row.state, row.owner_id) for row in await conn.execute(stmt)}


def _seen_before_the_write_back(
    env: Env,
    schedule_id: uuid.UUID,
    monkeypatch: pytest.MonkeyPatch,
    then: Callable[[], Awaitable[None]] | None = None,
) -> list[dict[uuid.UUID, tuple[str, uuid.UUID | None]]]:
    """The schedule's runs' states and owners once the firing has submitted its tasks, before it writes its
    run back (after `then`, if given): the firing's run is "running" and owned there."""
    seen: list[dict[uuid.UUID, tuple[str, uuid.UUID | None]]] = []
    write_back = firing._write_back

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        if then is not None:
            await then()
        seen.append(await _owners(env, schedule_id))
        return await write_back(*args, **kwargs)

    monkeypatch.setattr(firing, "_write_back", wrapped)
    return seen


# --- the write-back ---------------------------------------------------------------------------------


async def test_a_triggered_run_has_no_owner_once_written_back(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = await _schedule(env)
    owner, a = await _instance(env)
    seen = _seen_before_the_write_back(env, schedule.id, monkeypatch)

    await a.schedules.trigger(schedule.id)

    ((run_id, running),) = seen[0].items()
    assert running == ("running", owner)
    assert await _owners(env, schedule.id) == {run_id: ("completed", None)}


async def test_a_dispatched_run_has_no_owner_once_written_back(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = await _schedule(env)
    owner, a = await _instance(env)
    seen = _seen_before_the_write_back(env, schedule.id, monkeypatch)
    env.clock.advance(timedelta(hours=2))  # due

    assert await Dispatcher(a.schedules, a.audit).poll_once() == 1

    ((run_id, running),) = seen[0].items()
    assert running == ("running", owner)
    assert await _owners(env, schedule.id) == {run_id: ("completed", None)}


async def test_a_retried_run_has_no_owner_once_written_back(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = await _schedule(env)
    owner, a = await _instance(env)
    await a.schedules.trigger(schedule.id)
    (first,), _ = await env.services.schedules.list_runs(schedule.id)
    tasks, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [t.id for t in tasks], TaskStatus.FAILED, now=env.clock.now())
    seen = _seen_before_the_write_back(env, schedule.id, monkeypatch)

    retried = await a.schedules.retry_run(first.id)

    assert seen[0][retried.run.id] == ("running", owner)
    assert await _owners(env, schedule.id) == {
        first.id: ("completed", None),
        retried.run.id: ("completed", None),
    }


async def test_an_approved_run_has_no_owner_once_written_back(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approving instance owns the run while it runs (`decide_awaiting`), not after."""
    schedule = await _schedule(env, approval=ApprovalPolicy(timedelta(hours=4), 1))
    owner, b = await _instance(env)
    assert await env.services.schedules.trigger(schedule.id) == []
    ((waiting_id, waiting),) = (await _owners(env, schedule.id)).items()
    assert waiting == ("awaiting_approval", None)
    seen = _seen_before_the_write_back(env, schedule.id, monkeypatch)

    report = await b.approvals.approve(waiting_id)

    assert seen == [{waiting_id: ("running", owner)}]
    assert report.run.state == "completed"
    assert await _owners(env, schedule.id) == {waiting_id: ("completed", None)}


@pytest.mark.parametrize("decision", ["rejected", "expired"])
async def test_a_run_rejected_or_expired_has_no_owner(env: Env, decision: str) -> None:
    schedule = await _schedule(env, approval=ApprovalPolicy(timedelta(hours=4), 1))
    _, b = await _instance(env)
    assert await b.schedules.trigger(schedule.id) == []
    ((waiting_id, _),) = (await _owners(env, schedule.id)).items()

    if decision == "rejected":
        await b.approvals.reject(waiting_id, "not tonight")
    else:
        env.clock.advance(timedelta(hours=5))
        assert [e.run.id for e in await b.approvals.expire_overdue()] == [waiting_id]

    assert await _owners(env, schedule.id) == {waiting_id: (decision, None)}


async def _running_run(
    env: Env, schedule: Schedule, owner: uuid.UUID, outcomes: tuple[ScopeOutcome, ...]
) -> Run:
    """A plain firing's run as phase 1 records it, "running" and `owner`'s, with `outcomes`."""
    run_id = uuid.uuid4()
    async with env.db.transaction() as conn:
        new = run_history.NewRun(
            run_id, schedule.id, env.clock.now(), "manual", owner_id=owner, outcomes=outcomes
        )
        assert await run_history.insert_runs(env.db, conn, [new]) == {run_id}
    async with env.db.read() as conn:
        run = await rollouts.get_run(env.db, conn, run_id)
    assert run is not None
    return run


@pytest.mark.parametrize("settled", [False, True], ids=["first_pass", "settled_scope"])
async def test_the_write_back_clears_the_owner_in_either_pass(env: Env, settled: bool) -> None:
    """`complete_runs`' statement, and its second pass over a run whose outcomes name a task already (a
    scope a window's change or the rollout gate settled after the submit, `rollouts.settle_scopes`)."""
    schedule = await _schedule(env)
    owner, _ = await _instance(env)
    submitted = ScopeOutcome(uuid.uuid4(), uuid.uuid4(), "submitted", task_id=uuid.uuid4())
    run = await _running_run(env, schedule, owner, ())
    if settled:
        async with env.db.transaction() as conn:
            await rollouts.lock_runs(conn, [run.id])
            await rollouts.save_run(
                conn, replace(run, outcomes=(replace(submitted, outcome="failed", error="x"),))
            )
        # A write that leaves the run running keeps its owner, which the sweep reads.
        assert await _owners(env, schedule.id) == {run.id: ("running", owner)}

    async with env.db.transaction() as conn:
        await run_history.complete_runs(conn, {run.id: (submitted,)})

    assert await _owners(env, schedule.id) == {run.id: ("completed", None)}
    async with env.db.read() as conn:
        written = await rollouts.get_run(env.db, conn, run.id)
    assert written is not None
    assert [o.outcome for o in written.outcomes] == ["failed" if settled else "submitted"]


# --- the sweep ----------------------------------------------------------------------------------------


async def test_a_run_the_sweep_interrupts_has_no_owner_nor_once_its_write_back_completes_it(
    env: Env,
    other_instance: Sweep,  # noqa: F811 (the fixture imported)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The firing instance's heartbeat lapses between its submit and its write-back: the sweep interrupts
    the run (no owner from then on), and the write-back that comes after completes it (none either)."""
    schedule = await _schedule(env)
    owner, a = await _instance(env)
    marked: list[int] = []

    async def lapsed_then_swept() -> None:
        assert list((await _owners(env, schedule.id)).values()) == [("running", owner)]
        env.clock.advance(LEASE * 2)
        marked.append(await other_instance())

    seen = _seen_before_the_write_back(env, schedule.id, monkeypatch, lapsed_then_swept)

    await a.schedules.trigger(schedule.id)

    assert marked == [1]
    ((run_id, interrupted),) = seen[0].items()
    assert interrupted == ("interrupted", None)
    assert await _owners(env, schedule.id) == {run_id: ("completed", None)}


@pytest.mark.parametrize("why", ["heartbeat_lapsed", "stuck"])
async def test_the_sweep_clears_the_owner(env: Env, other_instance: Sweep, why: str) -> None:  # noqa: F811 (the fixture imported)
    schedule = await _schedule(env)
    owner, _ = await _instance(env)
    run = await _running_run(env, schedule, owner, ())
    if why == "stuck":  # its owner heartbeats on, but the run has been running too long
        env.clock.advance(dispatch.STUCK_RUN_AGE + timedelta(minutes=1))
        await instances.register(env.db, owner, host="a", pid=1)
    else:
        env.clock.advance(LEASE * 2)

    assert await other_instance() == 1

    assert await _owners(env, schedule.id) == {run.id: ("interrupted", None)}


# --- a rollout's save_run -------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["halted", "rolling", "cancelled", "completed"])
async def test_a_rollout_saved_in_any_state_has_no_owner(env: Env, state: RunState) -> None:
    """A rolling run has no owner (`owned`), but one an older release approved did record its approver,
    and keeps it until a write clears it: a rollout's step, halt, resume or cancel (`save_run`) does."""
    schedule = await _schedule(env, rollout=RolloutPolicy(max_concurrent_racks=1))
    owner, a = await _instance(env)
    env.clock.advance(timedelta(hours=2))  # due
    assert await Dispatcher(a.schedules, a.audit).poll_once() == 1
    ((run_id, rolling),) = (await _owners(env, schedule.id)).items()
    assert rolling == ("rolling", None)
    async with env.db.transaction() as conn:  # as the release before `owned` left an approved rollout
        await conn.execute(update(task_schedule_run).where(_run.id == run_id).values(owner_id=owner))
        run = await rollouts.get_run(env.db, conn, run_id, lock=True)
        assert run is not None
        await rollouts.save_run(conn, replace(run, state=state, reason="why"))

    assert await _owners(env, schedule.id) == {run_id: (state, None)}


# --- the owner's only index -----------------------------------------------------------------------------


async def test_the_owner_is_indexed_only_while_a_run_is_running(db: Database) -> None:
    """Clearing the owner as a run ends adds no index entry to its completion (the write-back's statement):
    the one index of the column holds only running runs, which the completion leaves anyway. On PostgreSQL
    every partition's index of it is that partitioned index's."""
    async with db.read() as conn:
        if db.is_postgres:
            stmt = text(
                "SELECT indexname, indexdef FROM pg_indexes "
                "WHERE tablename LIKE 'task_schedule_run%' AND indexdef LIKE '%owner_id%'"
            )
        else:
            stmt = text(
                "SELECT name, sql FROM sqlite_master "
                "WHERE type = 'index' AND tbl_name = 'task_schedule_run' AND sql LIKE '%owner_id%'"
            )
        found = (await conn.execute(stmt)).all()
    running = "WHERE ((state)::text = 'running'::text)" if db.is_postgres else "WHERE state = 'running'"
    assert found
    for _name, definition in found:
        assert "(owner_id)" in definition
        assert definition.endswith(running), definition
