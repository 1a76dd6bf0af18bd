"""A window created or edited beside a rollout's step, on both databases: the step reads the windows and
inserts its wave's tasks in one transaction, and takes the window edits' turn in its shared form first,
before the run's row (`RolloutService.advance`, `store.windows.beside_edits`), so an edit under way commits
before that read, and one that comes after waits for the step to commit, and decides its tasks as any
others (`rackflow.tasks.deferrals`).

Each test pauses one of the two inside its transaction, its rows written, and runs the other until it waits
for a lock the first holds (`tests.store.lock_waits`): on SQLite its single writer is what they wait for; on
PostgreSQL (READ COMMITTED), without the step's turn, each would wait only for r1's rack lock, the edit having
read the tasks to decide before the step's were committed, or the step having read the windows before the
edit's were, and r1's task would keep what the step planned from the windows as they were.

`_r1_s_turn_next`: a SKIP rollout over r0 then r1 (one at a time) fired at START (2026-03-02 12:00 UTC), r1
under the ALLOW window "nightly" (11:00-14:00), r0's task ended: the next step starts r1, bound to 14:00.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit.changes import Changes, noting
from rackflow.domain.inventory import Rack
from rackflow.domain.schedules import Schedule
from rackflow.domain.tasks import Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind, WindowPolicy
from rackflow.store import tasks as task_store
from rackflow.store import windows as window_store
from rackflow.store.db import Database
from rackflow.windows.service import WindowInput
from tests.store.lock_waits import waiting_for
from tests.store.schedules_support import START, Env, make_env
from tests.store.test_rollouts_windows import _rollout, _tasks, _window
from tests.store.test_window_rebinds import assert_failed_unstarted, run_until_finished

# "nightly" holds r1 from an hour before START to two hours after; shortened, it ends half an hour after.
NIGHTLY = OneOff(START - timedelta(hours=1), START + timedelta(hours=2))
NEW_END = START + timedelta(minutes=30)
SHORTENED = OneOff(NIGHTLY.start, NEW_END)
FROZEN = OneOff(START - timedelta(hours=1), START + timedelta(days=1))
# A freeze that ends inside "nightly": a task deferred past it waits until 13:00, bound to 14:00.
BRIEF = OneOff(START - timedelta(hours=1), START + timedelta(hours=1))


async def _r1_s_turn_next(env: Env, policy: WindowPolicy = WindowPolicy.SKIP) -> tuple[Schedule, Rack]:
    """A rollout over r0 then r1 (SKIP unless `policy`), one at a time, r1 under the ALLOW window "nightly"
    (r0 under none): r0's task submitted by its first step, and ended; r1's turn comes at the next step.
    The schedule and r1."""
    r0, r1 = await env.rack("r0"), await env.rack("r1")
    schedule = await _rollout(env, [r0, r1], policy)
    await _window(env, "nightly", WindowKind.ALLOW, NIGHTLY, r1)
    active = [t.id for t in await _tasks(env, schedule) if t.status.is_active]
    assert len(active) == 1
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, active, TaskStatus.COMPLETED, now=env.clock.now())
    return schedule, r1


async def _shorten(env: Env) -> Changes:
    """ "nightly" shortened to end at NEW_END, as an audited call: what its event notes."""
    window_id = await env.services.windows.id_by_name("nightly")
    changes = Changes()
    with noting(changes):
        await env.services.windows.update(window_id, ["window.when"], WindowInput(when=SHORTENED))
    return changes


async def _freeze(env: Env, rack: Rack, when: OneOff = FROZEN) -> Changes:
    """A FREEZE over `rack` (from before now until tomorrow unless `when`), created as an audited call."""
    changes = Changes()
    with noting(changes):
        await _window(env, "launch", WindowKind.FREEZE, when, rack)
    return changes


class _Paused:
    """Wraps an async callable whose first argument is a connection, so that once it returned (its rows
    written) its transaction waits until `go_on` is set; `conn` is that connection (the holder
    `waiting_for` watches)."""

    def __init__(self, wrapped: Callable[..., Awaitable[Any]]) -> None:
        self.wrapped = wrapped
        self.done, self.go_on = asyncio.Event(), asyncio.Event()
        self.conn: AsyncConnection | None = None

    async def __call__(self, conn: AsyncConnection, *args: Any, **kwargs: Any) -> Any:
        result = await self.wrapped(conn, *args, **kwargs)
        self.conn = conn
        self.done.set()
        await self.go_on.wait()
        return result

    async def beside(self, db: Database, first: Awaitable[Any], then: Callable[[], Awaitable[Any]]) -> Any:
        """Run `first` until it is paused here, then `then` until it waits for a lock `first` holds; let
        `first` go on, and return both results (neither may fail: a deadlock would)."""
        first_running = asyncio.ensure_future(first)
        await asyncio.wait_for(self.done.wait(), 60)
        assert self.conn is not None
        then_running = asyncio.ensure_future(then())
        try:
            await waiting_for(db, self.conn, then_running)
        finally:
            self.go_on.set()
        return await asyncio.wait_for(first_running, 60), await asyncio.wait_for(then_running, 60)


async def _r1_s_task(env: Env, schedule: Schedule, r1: Rack) -> tuple[Task | None, str, str]:
    """r1's task (None: none), and the outcome and error of its scope in the rollout's run."""
    (task,) = [t for t in await _tasks(env, schedule) if t.rack_id == r1.id] or [None]
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    (outcome,) = [o for o in (await env.services.rollouts.get(runs[0].id)).run.outcomes if o.rack_id == r1.id]
    return task, outcome.outcome, outcome.error


async def _bound_to_the_new_end_and_failed(env: Env, task: Task | None) -> None:
    """r1's task bound to NEW_END; at 12:45 the executor fails it rather than start it on r1."""
    assert task is not None
    assert (task.status, task.not_after) == (TaskStatus.PENDING, NEW_END)
    env.clock.advance(timedelta(minutes=45))
    ended, backend = await run_until_finished(env, task)
    assert_failed_unstarted(ended, backend)


async def test_a_window_edit_beside_a_rollout_step_waits_for_it_and_binds_its_rack_s_task(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step has inserted r1's task (planned while "nightly" ran to 14:00) and not committed when the
    window is shortened: the edit waits for the step, then finds the task and binds it to 12:30. Without
    that wait (PostgreSQL), it would read the tasks to decide before the step's existed, wait only for
    r1's rack, and the task would keep 14:00."""
    env = make_env(db)
    schedule, r1 = await _r1_s_turn_next(env)
    paused = _Paused(env.services.rollouts.tasks.submit_each_in)
    monkeypatch.setattr(env.services.rollouts.tasks, "submit_each_in", paused)

    step, changes = await paused.beside(db, env.services.rollouts.advance(), lambda: _shorten(env))

    task, outcome, _ = await _r1_s_task(env, schedule, r1)
    assert task is not None and step.task_ids == (task.id,)
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("rebound", "2026-03-02T12:30:00Z")
    ]
    assert outcome == "submitted"
    await _bound_to_the_new_end_and_failed(env, task)


async def test_a_rollout_step_beside_a_window_edit_waits_for_it_and_reads_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The edit has written "nightly" shortened and not committed when the step starts r1: the step
    waits for the edit and reads the window as it left it, and binds r1's task to 12:30. Without that
    wait (PostgreSQL), it would read the window as it was (to 14:00), wait only for r1's rack, and insert
    the task bound to 14:00 after the edit had decided (finding no task)."""
    env = make_env(db)
    schedule, r1 = await _r1_s_turn_next(env)
    paused = _Paused(window_store.save_window)
    monkeypatch.setattr(window_store, "save_window", paused)

    changes, step = await paused.beside(db, _shorten(env), env.services.rollouts.advance)

    assert changes.recorded == []  # no task of r1 existed when it decided
    task, outcome, _ = await _r1_s_task(env, schedule, r1)
    assert task is not None and step.task_ids == (task.id,)
    assert outcome == "submitted"
    await _bound_to_the_new_end_and_failed(env, task)


async def test_a_freeze_created_beside_a_rollout_step_ends_its_rack_s_task_skipped(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A freeze over r1 is created while the step that started r1 (inside "nightly") has not committed:
    the creation waits for the step, then ends r1's task unstarted and its scope is "skipped_window", as
    the step would have settled it had the freeze come first (the SKIP policy). Without that wait
    (PostgreSQL), the task would be left to start once the freeze ends, after "nightly" had closed."""
    env = make_env(db)
    schedule, r1 = await _r1_s_turn_next(env)
    paused = _Paused(env.services.rollouts.tasks.submit_each_in)
    monkeypatch.setattr(env.services.rollouts.tasks, "submit_each_in", paused)

    _, changes = await paused.beside(db, env.services.rollouts.advance(), lambda: _freeze(env, r1))

    task, outcome, error = await _r1_s_task(env, schedule, r1)
    assert task is not None
    assert (task.status, task.started_at) == (TaskStatus.TERMINATED, None)
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "skipped_window")]
    assert (outcome, error) == ("skipped_window", task.message)
    assert "freeze 'launch'" in task.message


async def test_a_rollout_step_beside_a_freeze_s_creation_waits_for_it_and_skips_the_rack(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freeze over r1 is written and not committed when r1's turn comes: the step waits for it,
    reads it, and settles r1 "skipped_window" without a task, as at any turn inside a freeze."""
    env = make_env(db)
    schedule, r1 = await _r1_s_turn_next(env)
    paused = _Paused(window_store.insert_window)
    monkeypatch.setattr(window_store, "insert_window", paused)

    changes, step = await paused.beside(db, _freeze(env, r1), env.services.rollouts.advance)

    assert changes.recorded == [] and step.task_ids == ()
    task, outcome, error = await _r1_s_task(env, schedule, r1)
    assert task is None
    assert outcome == "skipped_window" and "freeze 'launch'" in error


async def test_under_defer_a_freeze_created_beside_a_rollout_step_moves_its_rack_s_task_past_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DEFER policy's side of the freeze created beside the step that started r1: the creation waits
    for the step, then finds r1's task and moves it to wait for the freeze's end inside "nightly" (13:00,
    by 14:00), where under SKIP it ends it. Without that wait (PostgreSQL), the task would be left free to
    start inside the freeze."""
    env = make_env(db)
    schedule, r1 = await _r1_s_turn_next(env, WindowPolicy.DEFER)
    paused = _Paused(env.services.rollouts.tasks.submit_each_in)
    monkeypatch.setattr(env.services.rollouts.tasks, "submit_each_in", paused)

    _, changes = await paused.beside(db, env.services.rollouts.advance(), lambda: _freeze(env, r1, BRIEF))

    task, outcome, _ = await _r1_s_task(env, schedule, r1)
    assert task is not None
    assert [(c["deferred_task"], c.get("not_before"), c.get("not_after")) for c in changes.recorded] == [
        ("moved", "2026-03-02T13:00:00Z", "2026-03-02T14:00:00Z")
    ]
    assert changes.recorded[0]["task_id"] == str(task.id)
    assert (task.status, task.started_at) == (TaskStatus.PENDING, None)
    assert (task.not_before, task.not_after) == (BRIEF.end, NIGHTLY.end)
    assert outcome == "submitted"


async def test_under_defer_a_rollout_step_beside_a_freeze_s_creation_waits_for_it_and_defers_the_rack(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The freeze over r1 is written and not committed when r1's turn comes under DEFER: the step waits
    for it, reads it, and submits r1's task waiting until the freeze ends inside "nightly". Without that
    wait (PostgreSQL) the step would read the windows without the freeze and submit a task free to start
    inside it, which the freeze's creation, having found no task of r1, would not decide."""
    env = make_env(db)
    schedule, r1 = await _r1_s_turn_next(env, WindowPolicy.DEFER)
    paused = _Paused(window_store.insert_window)
    monkeypatch.setattr(window_store, "insert_window", paused)

    changes, step = await paused.beside(db, _freeze(env, r1, BRIEF), env.services.rollouts.advance)

    assert changes.recorded == []  # no task of r1 existed when it decided
    task, outcome, _ = await _r1_s_task(env, schedule, r1)
    assert task is not None and step.task_ids == (task.id,)
    assert (task.status, task.started_at) == (TaskStatus.PENDING, None)
    assert (task.not_before, task.not_after) == (BRIEF.end, NIGHTLY.end)
    assert outcome == "submitted"
