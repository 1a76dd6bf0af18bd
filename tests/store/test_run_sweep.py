"""The stuck-run sweep of another instance against a firing's write-back, on both databases: an approved
run is swept by its time running since its approval, not since it fired (hours earlier, perhaps), so the
sweep leaves it be while its approver's instance writes it back; and a write-back that succeeds after the
sweep did interrupt a run meanwhile records what the firing did: "completed", with its outcomes. An
approved run is the approving instance's, so the sweep asks after that instance's heartbeat, not the one
of the instance that fired it. A run a manual trigger or a retry fires is its firing instance's alike, so
it is interrupted once that instance's heartbeat lapses, not only 10 minutes after it started. A rolling
run, dispatched or approved, has no owner: every instance's rollout driver steps it.

The other instance is a second `Database` on the same database, sweeping between the firing's submit and
its write-back (`firing._write_back`, wrapped).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import QueueOptions, TaskStatus
from rackflow.schedules import firing
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store import dispatch, instances
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule_run
from tests.store.schedules_support import HOURLY, POWER_OFF, Env, make_env, rack_target

pytestmark = pytest.mark.asyncio

LEASE = timedelta(seconds=15)

Sweep = Callable[[], Awaitable[int]]


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


@pytest.fixture
async def other_instance(env: Env, db_url: str) -> AsyncIterator[Sweep]:
    """The sweep of another instance (its own connections, the test's clock): how many runs it marked."""
    other = Database(db_url, clock=env.clock)

    async def sweep() -> int:
        async with other.transaction() as conn:
            return await dispatch.mark_abandoned_runs(conn, await other.now(conn), LEASE)

    try:
        yield sweep
    finally:
        await other.dispose()


def _before_the_write_back(monkeypatch: pytest.MonkeyPatch, then: Callable[[], Awaitable[None]]) -> None:
    """Run `then` once the firing has submitted its tasks, before it writes its run back."""
    write_back = firing._write_back

    async def wrapped(*args: Any, **kwargs: Any) -> Any:
        await then()
        return await write_back(*args, **kwargs)

    monkeypatch.setattr(firing, "_write_back", wrapped)


async def _schedule(
    env: Env, *, approval: ApprovalPolicy | None = None, rollout: RolloutPolicy | None = None
) -> Schedule:
    return await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(await env.rack("r1")),
        approval=approval,
        rollout=rollout,
    )


async def _run_state(env: Env, run_id: uuid.UUID) -> str:
    return (await env.services.rollouts.get(run_id)).run.state


async def test_a_run_approved_long_after_it_fired_is_not_swept_during_its_write_back(
    env: Env, other_instance: Sweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = await _schedule(env, approval=ApprovalPolicy(timedelta(hours=4), 1))
    assert await env.services.schedules.trigger(schedule.id) == []
    (waiting,), _ = await env.services.schedules.list_runs(schedule.id)
    env.clock.advance(dispatch.STUCK_RUN_AGE + timedelta(minutes=1))  # approved 11 minutes after it fired
    seen: list[tuple[int, str]] = []

    async def sweep() -> None:
        seen.append((await other_instance(), await _run_state(env, waiting.id)))

    _before_the_write_back(monkeypatch, sweep)
    report = await env.services.approvals.approve(waiting.id)

    assert seen == [(0, "running")]
    assert report.run.state == "completed"


async def test_a_run_the_sweep_interrupts_during_its_write_back_is_completed_by_it(
    env: Env, other_instance: Sweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its time running counts from its approval, and past STUCK_RUN_AGE of it the sweep interrupts it (as
    it would a run whose owner's heartbeat lapsed); the write-back that comes after records what the firing
    did: completed, naming the task it submitted."""
    schedule = await _schedule(env, approval=ApprovalPolicy(timedelta(hours=4), 1))
    assert await env.services.schedules.trigger(schedule.id) == []
    (waiting,), _ = await env.services.schedules.list_runs(schedule.id)
    env.clock.advance(timedelta(minutes=1))
    marked: list[int] = []

    async def stuck_then_swept() -> None:
        env.clock.advance(dispatch.STUCK_RUN_AGE + timedelta(seconds=1))
        marked.append(await other_instance())

    _before_the_write_back(monkeypatch, stuck_then_swept)
    await env.services.approvals.approve(waiting.id)

    assert marked == [1]
    tasks, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    assert [t.run_id for t in tasks] == [waiting.id]
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert run.state == "completed"
    assert [o.task_id for o in run.outcomes] == [tasks[0].id]


async def test_a_run_approved_through_another_instance_is_its_approvers_for_the_sweep(
    env: Env, other_instance: Sweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Instance A fires the run (dispatched: its owner) and then dies (its heartbeat lapses); instance B
    approves it and fires it: the sweep's heartbeat check concerns B, which is doing the work, so the run is
    not interrupted while B writes it back."""
    schedule = await _schedule(env, approval=ApprovalPolicy(timedelta(hours=4), 1))
    fired_by, approved_by = uuid.uuid4(), uuid.uuid4()
    await instances.register(env.db, fired_by, host="a", pid=1)
    env.clock.advance(timedelta(hours=2))  # due
    a = Services.build(env.db, env.clock, instance_id=fired_by)
    dispatcher = Dispatcher(a.schedules, a.audit)
    assert await dispatcher.poll_once() == 1
    (waiting,), _ = await env.services.schedules.list_runs(schedule.id)
    assert waiting.state == "awaiting_approval"
    env.clock.advance(LEASE * 2)  # A's heartbeat lapses; B's is fresh
    await instances.register(env.db, approved_by, host="b", pid=2)
    b = Services.build(env.db, env.clock, instance_id=approved_by)
    seen: list[tuple[int, str]] = []

    async def sweep() -> None:
        seen.append((await other_instance(), await _run_state(env, waiting.id)))

    _before_the_write_back(monkeypatch, sweep)
    report = await b.approvals.approve(waiting.id)

    assert seen == [(0, "running")]
    assert report.run.state == "completed"


def _dies_after_its_claim(
    env: Env, schedule: Schedule, monkeypatch: pytest.MonkeyPatch, sweep: Sweep
) -> list[tuple[int, str]]:
    """Between the firing's claim and its write-back, its instance's heartbeat lapses (well within
    STUCK_RUN_AGE of the firing) and the other instance sweeps: what it marked, and the newest run's state
    then."""
    seen: list[tuple[int, str]] = []

    async def lapsed_then_swept() -> None:
        env.clock.advance(LEASE * 2)
        marked = await sweep()
        (newest, *_), _ = await env.services.schedules.list_runs(schedule.id)
        seen.append((marked, newest.state))

    _before_the_write_back(monkeypatch, lapsed_then_swept)
    return seen


async def _instance(env: Env) -> Services:
    """The services of an instance that registered its heartbeat now."""
    instance_id = uuid.uuid4()
    await instances.register(env.db, instance_id, host="a", pid=1)
    return Services.build(env.db, env.clock, instance_id=instance_id)


async def test_a_triggered_run_whose_instance_died_is_swept_once_its_heartbeat_lapses(
    env: Env, other_instance: Sweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = await _schedule(env)
    a = await _instance(env)
    seen = _dies_after_its_claim(env, schedule, monkeypatch, other_instance)

    await a.schedules.trigger(schedule.id)

    assert seen == [(1, "interrupted")]


async def test_a_retried_run_whose_instance_died_is_swept_once_its_heartbeat_lapses(
    env: Env, other_instance: Sweep, monkeypatch: pytest.MonkeyPatch
) -> None:
    schedule = await _schedule(env)
    await env.services.schedules.trigger(schedule.id)
    (first,), _ = await env.services.schedules.list_runs(schedule.id)
    tasks, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [t.id for t in tasks], TaskStatus.FAILED, now=env.clock.now())
    a = await _instance(env)
    seen = _dies_after_its_claim(env, schedule, monkeypatch, other_instance)

    retried = await a.schedules.retry_run(first.id)

    assert seen == [(1, "interrupted")]
    assert retried.run.retry_of == first.id


async def _owner(env: Env, run_id: uuid.UUID) -> uuid.UUID | None:
    async with env.db.read() as conn:
        owner: uuid.UUID | None = await conn.scalar(
            select(task_schedule_run.c.owner_id).where(task_schedule_run.c.id == run_id)
        )
        return owner


@pytest.mark.parametrize("start", ["dispatched", "approved"])
async def test_a_rolling_run_has_no_owner_whether_dispatched_or_approved(env: Env, start: str) -> None:
    """Every instance's rollout driver steps a rollout, so no one instance's heartbeat vouches for it: the
    sweep leaves rolling runs be, and neither a dispatched one nor an approved one records an owner."""
    a = await _instance(env)
    approval = ApprovalPolicy(timedelta(hours=4), 1) if start == "approved" else None
    schedule = await _schedule(env, rollout=RolloutPolicy(max_concurrent_racks=1), approval=approval)
    env.clock.advance(timedelta(hours=2))  # due
    assert await Dispatcher(a.schedules, a.audit).poll_once() == 1
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    if start == "approved":
        run = (await a.approvals.approve(run.id)).run

    assert run.state == "rolling"
    assert await _owner(env, run.id) is None
