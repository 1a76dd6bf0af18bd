"""An executor's round beside CancelTask, a window's change and a rollout's cancel does not deadlock
(PostgreSQL: SQLite's single writer runs them one after the other).

The round claims its tasks (their rows locked by the claim's pick, then written by its UPDATE, with their
first progress message), then may write the same rows again in its transaction: a start gate's hold, a
hold cleared, a refusal. PostgreSQL
checks a foreign key again at an UPDATE of a row the same transaction wrote already, whether or not the
key changed: each such write takes `FOR KEY SHARE` on the task's rack. The lock that orders a rack's tasks
(`store.tasks.lock_racks`: CancelTask, a submit, a promotion, a window's change, a rollout's cancel) is
`FOR NO KEY UPDATE`, which that key check never waits for; had it been `FOR UPDATE`, CancelTask, holding
the rack and waiting for the claimed task's row, and the claim, holding the row and checking the rack's
key, would each wait for the other. A round that ends tasks holds their racks before it claims; its
rollout gate then takes the rows of its tasks' runs without waiting (`FOR UPDATE SKIP LOCKED`), holding
back briefly the tasks of a run another transaction holds, which may be waiting for one of those racks
(a window's change, a rollout's step or cancel: a run's row before its racks').

Each test runs a real executor (its journal round: endings, claim, gates, progress, one transaction) and
pauses the round where it holds what the other transaction will wait for, runs that transaction until it
is done or waits on a lock, then lets the round go on: both must end, neither aborted as a deadlock.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy import update

from rackflow.config import ROLLOUT_BUSY_WAIT
from rackflow.domain.inventory import Component, RackSelection
from rackflow.domain.tasks import (
    ComponentChange,
    Ending,
    Hold,
    Operation,
    OperationKind,
    QueueOptions,
    Task,
    TaskStatus,
)
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.rollouts.gate import BUSY_REASON
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.store.tasks import hold_values
from rackflow.tasks.backends.base import Backend, StepState
from rackflow.tasks.executor import Executor
from rackflow.tasks.manager import CANCELLED_MESSAGE, LetGo
from rackflow.timespec import format_rfc3339
from rackflow.windows.service import RACKS_PATH, Ref, WindowInput
from tests.store.schedules_support import Env, make_env
from tests.store.test_executor import eventually
from tests.store.test_rollout_lock_order import done_or_waiting_on_a_lock
from tests.store.test_rollouts import _run as rollout_run
from tests.store.test_window_deferrals import deferred_in_a_rollout, get

pytestmark = pytest.mark.postgres

T = TypeVar("T")
POWER_ON = Operation(OperationKind.POWER_ON)


class Steps(Backend):
    """Records the steps asked of it (component names); a task in `blocked` waits at each step until
    `go` is set."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.blocked: set[uuid.UUID] = set()
        self.go = asyncio.Event()

    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
        if task.id in self.blocked:
            await self.go.wait()
        self.steps.append(component.name)
        return None


@asynccontextmanager
async def executing(env: Env, backend: Backend, caplog: pytest.LogCaptureFixture) -> AsyncIterator[Executor]:
    """An executor as `rackflow serve` runs one (the services' manager and start gates) on `env`'s clock;
    on leaving, no round of it failed (a round aborted as a deadlock is logged and tried again)."""
    executor = Executor(
        env.db,
        env.clock,
        backend,
        instance_id=uuid.uuid4(),
        manager=env.services.tasks,
        gates=env.services.gates,
        poll_interval=0.05,
    )
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    try:
        with caplog.at_level(logging.ERROR, logger="rackflow.tasks.executor"):
            yield executor
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)
    failed = [r.getMessage() for r in caplog.records if r.name == "rackflow.tasks.executor"]
    assert failed == [], [r.exc_text for r in caplog.records]


class Beside:
    """Once the round's `step` (a store function the round calls, patched) returns what `when` asks for,
    run `other` until it is done or waits on a lock, then let the round go on."""

    def __init__(
        self,
        env: Env,
        monkeypatch: pytest.MonkeyPatch,
        owner: Any,
        step: str,
        when: Callable[[Any, Sequence[Any]], bool],
        other: Callable[[], Awaitable[Any]],
    ) -> None:
        self.started: asyncio.Future[Any] | None = None
        original = getattr(owner, step)

        async def pausing(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            if self.started is None and when(result, args):
                self.started = asyncio.ensure_future(other())
                await done_or_waiting_on_a_lock(env, self.started)
            return result

        monkeypatch.setattr(owner, step, pausing)

    async def result(self) -> Any:
        """What `other` returned (it raises what it raised: a deadlock's abort, say)."""

        async def begun() -> bool:
            return self.started is not None

        await eventually(begun)
        assert self.started is not None
        return await asyncio.wait_for(self.started, 60)


def claimed(task_id: uuid.UUID) -> Callable[[Any, Sequence[Any]], bool]:
    """The claim took the task (`task_runs.start`, the UPDATE after its pick)."""
    return lambda result, _: any(task.id == task_id for task, _ in result)


async def test_cancel_task_beside_the_round_that_claims_the_task(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CancelTask locks the task's rack, then waits for the task's row, which the round's claim holds (and
    has written, RUNNING with its first progress message). CancelTask goes on once the round committed, and
    ends the task it started."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        [task] = await env.services.tasks.submit(
            POWER_ON, [RackSelection((await env.rack("r1")).id)], description="", queue=QueueOptions()
        )
        cancel = Beside(
            env, monkeypatch, task_runs, "start", claimed(task.id), lambda: env.services.tasks.cancel(task.id)
        )
        backend = Steps()
        async with executing(env, backend, caplog):
            cancelled = await cancel.result()
            assert (cancelled.status, cancelled.message) == (TaskStatus.TERMINATED, CANCELLED_MESSAGE)

            async def stepped() -> bool:
                return bool(backend.steps)

            # The round that claimed it committed, and its first step runs: the first batch's progress was
            # written with the claim, so no cancellation is noticed before it (`Executor._execute`). It
            # runs after that commit, beside the cancel's end, so it may come after `cancel.result()`.
            await eventually(stepped)
    finally:
        await db.dispose()


async def rollout_with_a_freeze_held_rack(env: Env) -> tuple[uuid.UUID, Task]:
    """`deferred_in_a_rollout` (r1's task waits for "nightly", which names r1), r0's task held by the freeze
    "short" until its end, ten seconds from now, as the freeze gate holds it (its rollout gate will lock
    the run at the claim that takes it): r0's task, and r1's."""
    schedule, _, deferred = await deferred_in_a_rollout(env)
    [(r0_task, r0)] = [
        (o.task_id, o.rack_id)
        for o in (await rollout_run(env, schedule)).run.outcomes
        if o.task_id is not None and o.task_id != deferred.id
    ]
    ends = env.clock.now() + timedelta(seconds=10)
    short = OneOff(env.clock.now() - timedelta(hours=1), ends)
    await env.services.windows.create(
        WindowInput(name="short", kind=WindowKind.FREEZE, when=short, racks=(Ref(r0),))
    )
    async with env.db.transaction() as conn:
        hold = Hold(ends, f"waits for freeze 'short' to end at {format_rfc3339(ends)}")
        held = update(tasks).where(tasks.c.id == r0_task)
        await conn.execute(held.values(hold_values("freeze", hold, env.clock.now())))
    return r0_task, deferred


def nightly_also_on(env: Env, deferred: Task, rack_id: uuid.UUID) -> Callable[[], Awaitable[Any]]:
    """ "nightly" edited to name `rack_id` too: the edit locks its deferred task's run, then the rows of
    r1 and of `rack_id` (`tasks.deferrals`)."""

    async def edit() -> Any:
        window_id = await env.services.windows.id_by_name("nightly")
        racks = (Ref(deferred.rack_id), Ref(rack_id))
        return await env.services.windows.update(window_id, [RACKS_PATH], WindowInput(racks=racks))

    return edit


async def test_a_window_edit_beside_a_claim_whose_freeze_gate_held_a_task_on_a_rack_it_names(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The round claims r0's task of a rollout (a freeze held it: its rollout gate locks the run) and r9's,
    which the freeze "cold" holds: writing that hold on the claimed row checks r9's key. "nightly" is
    edited meanwhile to name r9: the edit locks the run, then r9's row. Had the edit's lock of r9 waited
    for that key check, the edit and the claim's rollout gate would each wait for the other."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r0_task, deferred = await rollout_with_a_freeze_held_rack(env)
        env.clock.advance(timedelta(seconds=11))  # the freeze that held r0's task is over
        r9 = await env.rack("r9")
        now = env.clock.now()
        cold = OneOff(now - timedelta(hours=1), now + timedelta(days=1))
        await env.services.windows.create(
            WindowInput(name="cold", kind=WindowKind.FREEZE, when=cold, racks=(Ref(r9.id),))
        )
        [frozen] = await env.services.tasks.submit(
            POWER_ON, [RackSelection(r9.id)], description="", queue=QueueOptions()
        )
        edit = Beside(
            env,
            monkeypatch,
            task_runs,
            "hold_back",
            lambda _, args: args[1] == "freeze",  # hold_back(conn, gate, holds, …)
            nightly_also_on(env, deferred, r9.id),
        )
        backend = Steps()
        async with executing(env, backend, caplog):
            await edit.result()

            async def r0_started() -> bool:
                return (await get(env, r0_task)).status is TaskStatus.COMPLETED

            await eventually(r0_started)  # its rollout gate let it start once the edit committed
        still = await get(env, frozen.id)
        assert (still.status, still.held_by) == (TaskStatus.PENDING, "freeze")
    finally:
        await db.dispose()


async def test_a_window_edit_beside_a_round_that_ends_a_task_on_a_rack_it_names(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The round ends r9's task (it locks r9's row, to promote r9's queue) and claims r0's task of a
    rollout, which a freeze held: its rollout gate takes the run's row. "nightly" is edited meanwhile to
    name r9: the edit locks the run, then waits for r9's row, which the round holds. The gate does not
    wait for the run: it holds r0's task until the next claim, the round commits, the edit goes on, and the
    claim after the hold starts r0's task."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r0_task, deferred = await rollout_with_a_freeze_held_rack(env)
        r9 = await env.rack("r9")
        [ending] = await env.services.tasks.submit(
            POWER_ON, [RackSelection(r9.id)], description="", queue=QueueOptions()
        )
        backend = Steps()
        backend.blocked.add(ending.id)
        manager = env.services.tasks
        let_go_in = manager.let_go_in

        async def then_r0_due(conn: Any, owner_id: uuid.UUID, endings: Sequence[Ending]) -> LetGo:
            """The round that ends r9's task finds r0's freeze over at its claim."""
            let_go = await let_go_in(conn, owner_id, endings)
            if any(e.task_id == ending.id for e in endings):
                env.clock.advance(timedelta(seconds=11))
            return let_go

        monkeypatch.setattr(manager, "let_go_in", then_r0_due)
        edit = Beside(
            env, monkeypatch, task_runs, "start", claimed(r0_task), nightly_also_on(env, deferred, r9.id)
        )
        async with executing(env, backend, caplog):

            async def running() -> bool:
                return (await get(env, ending.id)).status is TaskStatus.RUNNING

            await eventually(running)
            backend.go.set()
            await edit.result()
            held = await get(env, r0_task)
            assert (held.status, held.held_by, held.held_reason, held.not_before) == (
                TaskStatus.PENDING,
                "rollout",
                BUSY_REASON,
                env.clock.now() + ROLLOUT_BUSY_WAIT,
            )
            assert (await get(env, ending.id)).status is TaskStatus.COMPLETED
            env.clock.advance(ROLLOUT_BUSY_WAIT)

            async def r0_started() -> bool:
                return (await get(env, r0_task)).status is TaskStatus.COMPLETED

            await eventually(r0_started)
    finally:
        await db.dispose()
