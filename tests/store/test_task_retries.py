"""Retries on both databases, through the real executor: a retryable failure (as the backend classes it)
is tried again after its back-off, as the same task, until an attempt succeeds or the last one fails; a
refusal is never retried; every ended attempt is recorded; "task failed" is notified only for the last
attempt; a waiting retry is held by "retry" until its back-off ends; pre-flight checks are asked again for
each attempt."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from sqlalchemy import select

from rackflow.checks.service import CheckInput
from rackflow.domain.checks import RackIdleSettings, WebhookSettings
from rackflow.domain.inventory import Rack, RackSelection
from rackflow.domain.notifications import EventType
from rackflow.domain.tasks import (
    RETRY_HOLD,
    Operation,
    OperationKind,
    QueueOptions,
    RetryPolicy,
    Task,
    TaskStatus,
)
from rackflow.services import Services
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.tables import preflight_results
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from rackflow.tasks.manager import Submission, TaskManager
from tests.checks_support import Answer, checking, receiving
from tests.store.test_executor import CLOCK, eventually, executing, finished, get, make_rack

pytestmark = pytest.mark.asyncio

QUICK = RetryPolicy(3, timedelta(milliseconds=10), 2.0, timedelta(milliseconds=40))
POWER_ON = Operation(OperationKind.POWER_ON)


async def submit(db: Database, rack: Rack, retry: RetryPolicy | None) -> Task:
    manager = TaskManager(db, CLOCK)
    submission = Submission(POWER_ON, (RackSelection(rack.id),), "", QueueOptions(), retry=retry)
    async with db.transaction() as conn:
        (made,) = await manager.submit_each_in(conn, [submission])
    assert isinstance(made, list)
    return made[0]


def backend(**faults: object) -> SimulatorBackend:
    return SimulatorBackend(SimulatorConfig(step_seconds=0.005, **faults))  # type: ignore[arg-type]


async def failed_events(db: Database, task: Task) -> int:
    async with db.read() as conn:
        found = await outbox.list_events(conn, 100)
    return sum(e.type is EventType.TASK_FAILED and e.task_id == task.id for e in found)


async def test_a_retryable_failure_is_retried_until_an_attempt_succeeds(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, QUICK)
    async with executing(db, backend(transient_external_ids={"gpu-0": 2})):
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED
    assert (done.id, done.attempt, done.max_attempts) == (task.id, 3, 3)
    assert done.held_by is None and done.not_before is None
    attempts = (await TaskManager(db, CLOCK).attempts([task.id]))[task.id]
    assert [(a.attempt, a.status, a.retryable) for a in attempts] == [
        (1, TaskStatus.FAILED, True),
        (2, TaskStatus.FAILED, True),
        (3, TaskStatus.COMPLETED, False),
    ]
    assert "simulated retryable failure" in attempts[0].message
    for earlier, later in itertools.pairwise(attempts):
        assert later.started_at is not None and earlier.started_at is not None
        # The next attempt started after the one before ended, and at least its back-off later.
        assert later.started_at >= earlier.finished_at + timedelta(milliseconds=10)
    assert done.started_at == attempts[0].started_at  # the task's start is its first attempt's
    assert await failed_events(db, task) == 0


async def test_the_last_attempt_fails_the_task_and_only_it_is_notified(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, QUICK)
    async with executing(db, backend(transient_external_ids={"gpu-1": None})):
        done = await finished(db, task)
    assert done.status is TaskStatus.FAILED
    assert done.attempt == 3
    assert done.message.startswith("attempt 3 of 3: power_on failed on ")  # the notification's reason too
    assert "simulated retryable failure" in done.message
    attempts = (await TaskManager(db, CLOCK).attempts([task.id]))[task.id]
    assert [(a.attempt, a.status) for a in attempts] == [(n, TaskStatus.FAILED) for n in (1, 2, 3)]
    assert await failed_events(db, task) == 1


async def test_a_refusal_is_not_retried(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, QUICK)
    async with executing(db, backend(fail_external_ids=frozenset({"gpu-0"}))):
        done = await finished(db, task)
    assert (done.status, done.attempt) == (TaskStatus.FAILED, 1)
    attempts = (await TaskManager(db, CLOCK).attempts([task.id]))[task.id]
    assert [(a.attempt, a.status, a.retryable) for a in attempts] == [(1, TaskStatus.FAILED, False)]
    assert await failed_events(db, task) == 1


async def test_without_a_policy_a_retryable_failure_fails_at_once(db: Database) -> None:
    rack = await make_rack(db)
    task = await submit(db, rack, None)
    async with executing(db, backend(transient_external_ids={"gpu-0": 1})):
        done = await finished(db, task)
    assert (done.status, done.attempt, done.max_attempts) == (TaskStatus.FAILED, 1, 1)
    assert await TaskManager(db, CLOCK).attempts([task.id]) == {}
    assert await failed_events(db, task) == 1


async def test_the_next_attempt_waits_out_its_backoff_held_by_retry(db: Database) -> None:
    rack = await make_rack(db)
    slow = RetryPolicy(2, timedelta(hours=1), 2.0, timedelta(hours=2))
    task = await submit(db, rack, slow)
    async with executing(db, backend(transient_external_ids={"gpu-0": None})):

        async def sent_back() -> bool:
            return (await get(db, task)).attempt == 2

        await eventually(sent_back)
        waiting = await get(db, task)
    assert waiting.status is TaskStatus.PENDING
    assert waiting.held_by == RETRY_HOLD
    (failed,) = (await TaskManager(db, CLOCK).attempts([task.id]))[task.id]
    assert waiting.not_before is not None and waiting.held_since is not None
    assert waiting.not_before - failed.finished_at == timedelta(hours=1)  # the first back-off
    assert waiting.message.startswith("attempt 2 of 2 at ")
    assert "attempt 1 failed: " in (waiting.held_reason or "")
    assert waiting.attempt_started_at is None and waiting.started_at is not None
    assert await failed_events(db, task) == 0


async def test_pre_flight_checks_run_again_for_every_attempt(db: Database) -> None:
    """A check whose answer stays fresh for a minute is still asked once per attempt: the round that let
    an attempt start never starts the next one."""
    rack = await make_rack(db, computes=1)
    with receiving(Answer({"ok": True})) as hook:
        services = Services.build(db, CLOCK)
        await services.checks.create(
            CheckInput(name="ready", settings=WebhookSettings(hook.url, "", "2s"), interval="1m")
        )
        task = await submit(db, rack, QUICK)
        async with checking(db, backend=backend(transient_external_ids={"gpu-0": None})):
            done = await finished(db, task)
        payloads = hook.payloads()
    assert (done.status, done.attempt) == (TaskStatus.FAILED, 3)
    assert [p["attempt"] for p in payloads] == [1, 2, 3]  # one round of checks per attempt


@pytest.mark.parametrize("overridden", [(), ("drained",)], ids=["all-checks", "one-check"])
async def test_an_override_lets_the_attempt_start_not_its_retries(
    db: Database, overridden: tuple[str, ...]
) -> None:
    """An operator's override is a judgment of the rack as it is then ("INC-1: the hook is wrong"): it let
    every later attempt start unchecked too, though an attempt that failed may have left the rack draining
    or alerting, and checks run again for every attempt (SAFETY.md, "Retries"). The next attempt is held."""
    rack = await make_rack(db, computes=1)
    with receiving(Answer({"ok": False, "reason": "draining 3 jobs"})) as hook:
        services = Services.build(db, CLOCK)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="1m")
        )
        task = await submit(db, rack, QUICK)
        await services.checks.override(task.id, "INC-1: the hook is wrong about this rack", overridden)
        async with checking(db, backend=backend(transient_external_ids={"gpu-0": None})):

            async def retry_held() -> bool:
                found = await get(db, task)
                held_again = found.attempt == 2 and "draining" in (found.held_reason or "")
                return found.status.is_final or held_again

            await eventually(retry_held)
        held = await get(db, task)
    assert (held.status, held.attempt, held.held_by) == (TaskStatus.PENDING, 2, "preflight")
    assert held.held_reason == "pre-flight check 'drained': webhook: draining 3 jobs"
    attempts = (await TaskManager(db, CLOCK).attempts([task.id]))[task.id]
    assert [a.attempt for a in attempts] == [1]  # the overridden attempt ran; its retry did not


async def test_a_rack_idle_check_is_asked_anew_in_the_claim_of_every_attempt(db: Database) -> None:
    """A check that only reads the database is asked by the claim that starts each attempt (its round
    made at that attempt's start), never carried over from the attempt before, though it stays fresh."""
    rack = await make_rack(db, computes=1)
    services = Services.build(db, CLOCK)
    idle = RackIdleSettings(frozenset({OperationKind.POWER_RESET}), "")
    await services.checks.create(CheckInput(name="idle", settings=idle, interval="1m"))
    task = await submit(db, rack, QUICK)
    async with checking(db, backend=backend(transient_external_ids={"gpu-0": None})):
        done = await finished(db, task)
    assert (done.status, done.attempt) == (TaskStatus.FAILED, 3)
    attempts = (await TaskManager(db, CLOCK).attempts([task.id]))[task.id]
    async with db.read() as conn:
        found = select(
            preflight_results.c.attempt, preflight_results.c.passed, preflight_results.c.checked_at
        )
        rounds = sorted((await conn.execute(found.where(preflight_results.c.task_id == task.id))).all())
    assert [(r.attempt, r.passed) for r in rounds] == [(1, True), (2, True), (3, True)]
    assert [r.checked_at for r in rounds] == [a.started_at for a in attempts]
