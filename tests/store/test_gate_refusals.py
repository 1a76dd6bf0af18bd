"""A start gate's refusal outlives the claim that made it (`Task.refusal`, migration 0045).

A gate that refuses a task (`Fail`) leaves it RUNNING for the executor that claimed it to end once the
claim committed. Should that instance die first, another executor takes the task over, and no gate looks at
a takeover (it began): the refusal recorded on the task in the claim's transaction is what ends it there,
instead of running it. A hold needs no record: the claim hands a held task back (PENDING) itself.

Here the claim that refuses or holds is made as the executor makes it (`claim`), by an instance that never
registered, so its tasks are free to take over at once; on PostgreSQL a real second executor takes them
over (the rollout gate's refusal: tests/store/test_rollout_halt_gate.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import update

from rackflow.checks.service import CheckInput
from rackflow.domain.checks import RackIdleSettings
from rackflow.domain.inventory import Rack, RackSelection
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.store.tasks import set_status
from rackflow.tasks.executor import Executor
from rackflow.tasks.gates import Gated, consult
from rackflow.windows.service import Ref, WindowInput
from tests.store.query_plans import statements_sent
from tests.store.schedules_support import Env, make_env
from tests.store.test_executor import eventually
from tests.store.test_rollout_halt_gate import Recording, get

DEAD = uuid.uuid4()  # the instance whose claims these are: never registered, so never live
POWER_ON = Operation(OperationKind.POWER_ON)
GAVE_UP = "(pre-flight check 'not-flapping' gave up after 10m)"


async def claim(env: Env, first: str | None = None) -> tuple[list[tuple[Task, int]], Gated]:
    """One executor claim with the start gates, committed: what it took (task, claim number) and what the
    gates made of it. `first`: the first progress message the claim writes on each task it takes, before
    the gates are asked, as the executor's does (`task_runs.start`)."""
    async with env.db.transaction() as conn:
        now = env.clock.now()
        picked = await task_runs.pick(
            env.db, conn, owner_id=DEAD, lease_ttl=timedelta(seconds=30), running_here=(), now=now, limit=10
        )
        messages = {task.id: first for task, _ in picked} if first is not None else {}
        claimed = await task_runs.start(conn, picked, owner_id=DEAD, now=now, messages=messages)
        gated = await consult(env.services.gates, conn, claimed, owner_id=DEAD, now=now)
    return claimed, gated


async def submit(env: Env, rack: Rack) -> Task:
    [task] = await env.services.tasks.submit(
        POWER_ON, [RackSelection(rack.id)], description="", queue=QueueOptions()
    )
    return task


async def refused_by_the_checks(env: Env, first: str | None = None) -> Task:
    """A power-on the pre-flight gate refuses, at its second claim, past its check's maximum wait: the
    rack's last power-on failed within the hour (`rack_idle`, which the claim asks itself). That claim
    (which writes `first` as the task's progress message: `claim`) committed and its instance died: the
    task is RUNNING, owned by no live instance. The task as submitted, with the refusal the gate
    answered."""
    rack = await env.rack("r1")
    earlier = await submit(env, rack)
    async with env.db.transaction() as conn:
        await set_status(conn, [earlier.id], TaskStatus.FAILED, now=env.clock.now(), message="PSU fault")
    settings = RackIdleSettings(frozenset({OperationKind.POWER_RESET}), "1h")
    await env.services.checks.create(
        CheckInput(name="not-flapping", settings=settings, interval="1m", max_wait="10m")
    )
    task = await submit(env, rack)
    _, gated = await claim(env)
    assert (gated.claimed, gated.failed) == ([], {})  # held: waits for the rack to stop flapping
    env.clock.advance(timedelta(minutes=11))
    _, gated = await claim(env, first)
    [fail] = gated.failed.values()
    assert gated.failed == {task.id: fail} and fail.reason.endswith(GAVE_UP)
    return replace(task, refusal=fail)


async def test_a_takeover_of_a_task_a_gate_refused_is_refused_as_the_claim_recorded(db: Database) -> None:
    """The claim that refused records it on the task; the claim that takes the task over (its second in
    the attempt), which no gate looks at, hands it back failed with that refusal, and starts nothing."""
    env = make_env(db)
    refused = await refused_by_the_checks(env)
    recorded = await get(env, refused.id)
    assert (recorded.status, recorded.refusal) == (TaskStatus.RUNNING, refused.refusal)
    env.clock.advance(timedelta(minutes=1))
    [(taken, number)], gated = await claim(env)
    assert (taken.id, number) == (refused.id, 2)
    assert gated.failed == {refused.id: refused.refusal}


async def test_a_task_a_gate_refused_says_why_not_which_step_it_is_on(db: Database) -> None:
    """The executor's claim writes each task's first progress message in its UPDATE, before the gates are
    asked: a task a gate refuses never runs, so the refusal's record writes the reason over it, as its
    end will (the same statement: no version of the row more)."""
    env = make_env(db)
    refused = await refused_by_the_checks(env, first="powering on 1/1: compute-0")
    recorded = await get(env, refused.id)
    assert refused.refusal is not None
    assert (recorded.status, recorded.message) == (TaskStatus.RUNNING, refused.refusal.reason)


async def test_a_claim_no_gate_refuses_in_sends_no_statement_more(db: Database) -> None:
    """The executor's hot path: a claim of fresh tasks and of a takeover that no gate refused reads the
    refusals with the claim's own statement (its pick's SELECT) and writes none."""
    env = make_env(db)
    taken_over = await submit(env, await env.rack("r0"))
    await claim(env)  # started, and its instance died
    fresh = [await submit(env, await env.rack(f"r{i}")) for i in (1, 2)]
    with statements_sent(db) as sent:
        claimed, gated = await claim(env)
    assert sorted(number for _, number in claimed) == [1, 1, 2]
    assert {task.id for task, _ in gated.claimed} == {taken_over.id, *(task.id for task in fresh)}
    assert gated.failed == {}
    [claim_statement] = [statement for statement, _ in sent if "refusal" in statement]
    assert claim_statement.lstrip().upper().startswith("SELECT TASKS.ID")


@pytest.mark.postgres
async def test_an_executor_taking_over_a_task_the_checks_refused_ends_it_unrun(
    pg_db: str,
) -> None:
    db = Database(pg_db)
    try:
        env = make_env(db)
        refused = await refused_by_the_checks(env)

        async def ended() -> bool:
            return (await get(env, refused.id)).status.is_final

        backend = await second_executor(env, ended)
        task = await get(env, refused.id)
        assert refused.refusal is not None
        assert (task.status, task.message) == (TaskStatus.FAILED, refused.refusal.reason)
        assert backend.steps == []
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_an_executor_taking_over_never_runs_a_task_a_freeze_held(pg_db: str) -> None:
    """A freeze's hold is written by the claim itself (PENDING again, held by "freeze"): nothing is left
    RUNNING to take over, and the next claims hold it again while the freeze lasts."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        rack = await env.rack("r1")
        start = env.clock.now()
        freeze = OneOff(start - timedelta(minutes=1), start + timedelta(hours=1))
        await env.services.windows.create(
            WindowInput(name="change-freeze", kind=WindowKind.FREEZE, when=freeze, racks=(Ref(id=rack.id),))
        )
        task = await submit(env, rack)
        _, gated = await claim(env)
        assert (gated.claimed, gated.failed) == ([], {})
        env.clock.advance(timedelta(minutes=5))

        with statements_sent(db) as sent:

            async def polled_a_while() -> bool:  # many polls, each a claim (its pick) that finds it held
                claims = [
                    s for s, _ in sent if s.startswith("SELECT tasks.id, tasks.operation") and "SKIP" in s
                ]
                return len(claims) >= 5

            backend = await second_executor(env, polled_a_while)
        held = await get(env, task.id)
        assert (held.status, held.held_by, held.refusal, held.started_at) == (
            TaskStatus.PENDING,
            "freeze",
            None,
            None,
        )
        assert backend.steps == []
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_an_executor_taking_over_a_task_past_its_window_ends_it_unrun(pg_db: str) -> None:
    """A task past its window's end (`not_after`) is refused by the executor itself at every claim, a
    takeover's included (its start gates never see it): nothing to record, the takeover fails it too. Its
    message names the attempt, as for any takeover (docs/WINDOWS.md)."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        task = await submit(env, await env.rack("r1"))
        async with env.db.transaction() as conn:
            await conn.execute(update(tasks).where(tasks.c.id == task.id).values(not_after=env.clock.now()))
        [(claimed, _)], gated = await claim(env)  # its executor would fail it once this commits; it died
        assert (claimed.id, gated.failed) == (task.id, {})

        async def ended() -> bool:
            return (await get(env, task.id)).status.is_final

        backend = await second_executor(env, ended)
        done = await get(env, task.id)
        assert done.status is TaskStatus.FAILED
        assert done.message.startswith("the maintenance window ended at ")
        assert done.message.endswith("before attempt 1 could run")
        assert backend.steps == []
    finally:
        await db.dispose()


async def second_executor(env: Env, until: Callable[[], Awaitable[bool]]) -> Recording:
    """Run another executor, with the start gates, `until` it holds; its backend, which records the steps
    asked of it."""
    backend = Recording()
    executor = Executor(
        env.db, env.clock, backend, instance_id=uuid.uuid4(), gates=env.services.gates, poll_interval=0.05
    )
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    try:
        await eventually(until)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
    return backend
