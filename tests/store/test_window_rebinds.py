"""A window's change binds again every task a firing bound to an ALLOW window's end that has not started,
whatever holds it, on both databases (`rackflow.tasks.deferrals`): one another start gate holds (an
operation budget here; pre-flight checks, a freeze, a rollout alike), one waiting in its rack's queue, and
a retry's next attempt. Shortened, the window binds them to its new end, so that none starts on its rack
after it (the executor fails it instead); closed now, they are decided as a firing now would decide them
(ended, or waiting for the next opening), and a retry's next attempt, which is never deferred, fails at
its next claim. A task a claim held while the change was written is decided again once that claim
committed (PostgreSQL: SQLite's single writer runs them one after the other).

`fired_inside` (tests/store/test_window_deferrals.py): r1 under the ALLOW window "nightly", open from an
hour before FIRED_AT (2026-03-02 13:00 UTC) to two hours after; a schedule on r1 fired at FIRED_AT, its
task bound to 15:00.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import pytest

from rackflow.audit.changes import Changes, noting
from rackflow.budgets.service import BudgetInput
from rackflow.domain.audit import REDECIDE_WINDOW_TASK, SYSTEM_PRINCIPAL, EventFilter
from rackflow.domain.inventory import Rack, RackSelection
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import (
    Operation,
    OperationKind,
    QueueOptions,
    RetryPolicy,
    Task,
    TaskStatus,
)
from rackflow.domain.windows import OneOff, WindowKind, WindowPolicy
from rackflow.errors import Unavailable
from rackflow.schedules import firing
from rackflow.store import task_runs
from rackflow.store import windows as window_store
from rackflow.store.db import Database
from rackflow.tasks.executor import Executor
from rackflow.tasks.gates import consult
from rackflow.timespec import format_rfc3339
from rackflow.windows.service import Ref, WindowInput
from tests.store.schedules_support import Env, make_env
from tests.store.test_executor import finished
from tests.store.test_rollout_halt_gate import OWNER, Recording
from tests.store.test_rollout_lock_order import done_or_waiting_on_a_lock
from tests.store.test_window_deferrals import FIRED_AT, edit_when, get, outcome_of
from tests.store.test_windows_firing import TOMORROW_2AM, dispatch_at, with_policy

WINDOW_END = FIRED_AT + timedelta(hours=2)
NEW_END = FIRED_AT + timedelta(minutes=30)
SHORTENED = OneOff(FIRED_AT - timedelta(hours=1), NEW_END)
# 13:45: after the new end, before the old one (and before a queued task's hour in its queue is over).
AFTER_THE_NEW_END = timedelta(minutes=45)
# The window moved to tomorrow night: r1 is closed now, and opens at 02:00.
MOVED_AWAY = OneOff(TOMORROW_2AM, TOMORROW_2AM + timedelta(hours=2))
POWER_OFF = Operation(OperationKind.POWER_OFF)
RETRY = RetryPolicy(3, timedelta(minutes=10), 2.0, timedelta(hours=1))


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def fired_inside(
    env: Env,
    policy: WindowPolicy = WindowPolicy.SKIP,
    overlap: OverlapPolicy = OverlapPolicy.SKIP,
    retry: RetryPolicy | None = None,
    r1: Rack | None = None,
) -> tuple[Schedule, Task]:
    """`fired_inside` of test_window_deferrals, with the schedule's overlap policy and retries (on `r1`,
    made here unless given)."""
    r1 = r1 or await env.rack("r1")
    when = OneOff(FIRED_AT - timedelta(hours=1), WINDOW_END)
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=when, racks=(Ref(r1.id),))
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1], policy=overlap), policy)
    if retry is not None:
        schedule = await env.services.schedules.update(schedule.id, ["schedule.retry"], retry=retry)
    env.clock.advance(FIRED_AT - env.clock.now())
    ((outcome,),) = [result.outcomes for result in await dispatch_at(env, FIRED_AT)]
    assert outcome.task_id is not None
    return schedule, await get(env, outcome.task_id)


async def claim(env: Env, running: tuple[uuid.UUID, ...] = ()) -> list[uuid.UUID]:
    """One executor claim with the start gates, the tasks `running` left alone: the tasks that start."""
    async with env.db.transaction() as conn:
        claimed = await task_runs.claim(
            env.db, conn, owner_id=OWNER, lease_ttl=timedelta(seconds=30), running_here=running,
            now=env.clock.now(), limit=10,
        )  # fmt: skip
        gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
    return [task.id for task, _ in gated.claimed]


async def a_full_budget(env: Env) -> tuple[uuid.UUID, uuid.UUID]:
    """A budget of one power-off, taken by a task by hand on r0, running: r1's task waits for it. The
    budget's id, and that task's (which a claim is to leave alone: its instance runs it)."""
    budget = await env.services.budgets.create(BudgetInput("power", (OperationKind.POWER_OFF,), 1))
    r0 = await env.rack("r0")
    [by_hand] = await env.services.tasks.submit(
        POWER_OFF, [RackSelection(r0.id)], description="by hand", queue=QueueOptions()
    )
    assert await claim(env) == [by_hand.id]
    return budget.id, by_hand.id


async def held_by_the_budget(
    env: Env, policy: WindowPolicy = WindowPolicy.SKIP
) -> tuple[Schedule, Task, uuid.UUID]:
    """`fired_inside`, its task then held by a full budget at its first claim; and the budget's id."""
    budget_id, running = await a_full_budget(env)
    schedule, task = await fired_inside(env, policy)
    assert await claim(env, (running,)) == []
    held = await get(env, task.id)
    assert (held.status, held.held_by, held.not_after) == (TaskStatus.PENDING, "budget", WINDOW_END)
    assert held.not_before is not None
    return schedule, held, budget_id


async def run_until_finished(env: Env, task: Task) -> tuple[Task, Recording]:
    """Run an executor with the services' start gates until `task` has finished; what its backend ran."""
    backend = Recording()
    executor = Executor(
        env.db, env.clock, backend, poll_interval=0.05, lease_ttl=1.0, instance_id=uuid.uuid4(),
        gates=env.services.gates,
    )  # fmt: skip
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    try:
        return await finished(env.db, task), backend
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)


def assert_failed_unstarted(task: Task, backend: Recording, what: str = "the task") -> None:
    """Failed at its claim without a step run on r1: the window ended at its new end before it could."""
    assert task.status is TaskStatus.FAILED
    assert task.not_after is not None
    assert f"the maintenance window ended at {format_rfc3339(task.not_after)} before {what} could run" in (
        task.message
    )
    on_r1 = [step for step in backend.steps if step.startswith("r1-")]
    assert on_r1 == [], "the task ran on its rack after its maintenance window closed"


async def test_a_task_held_by_a_budget_is_bound_to_its_allow_window_s_new_end(env: Env) -> None:
    """The window is shortened to end at 13:30 while a budget holds r1's task: the task is bound to 13:30,
    its hold kept, so that once the budget lets it go at 13:45 the executor fails it rather than start it
    after the window the operator now allows."""
    schedule, held, budget_id = await held_by_the_budget(env)

    changes = await edit_when(env, SHORTENED)

    rebound = await get(env, held.id)
    assert (rebound.status, rebound.held_by, rebound.not_before, rebound.not_after) == (
        TaskStatus.PENDING,
        "budget",
        held.not_before,
        NEW_END,
    )
    assert (rebound.held_reason, rebound.held_since, rebound.message) == (
        held.held_reason,
        held.held_since,
        held.message,
    )
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("rebound", "2026-03-02T13:30:00Z")
    ]
    await env.services.budgets.delete(budget_id)  # its next claim is not held by the budget
    env.clock.advance(AFTER_THE_NEW_END)
    ended, backend = await run_until_finished(env, held)
    assert_failed_unstarted(ended, backend)
    assert ended.not_after == NEW_END
    assert await outcome_of(env, schedule, held) == ("submitted", "")


async def test_a_task_waiting_in_its_rack_s_queue_is_bound_to_its_allow_window_s_new_end(env: Env) -> None:
    """r1's task waits behind a task submitted by hand on r1 (its schedule queues): the shortened window
    binds it to 13:30, and once the rack's queue lets it go at 13:45 it fails rather than starts."""
    r1 = await env.rack("r1")
    [by_hand] = await env.services.tasks.submit(
        Operation(OperationKind.POWER_ON), [RackSelection(r1.id)], description="by hand", queue=QueueOptions()
    )
    _, task = await fired_inside(env, overlap=OverlapPolicy.QUEUE, r1=r1)
    assert (task.status, task.not_after) == (TaskStatus.WAITING, WINDOW_END)

    changes = await edit_when(env, SHORTENED)

    waiting = await get(env, task.id)
    assert (waiting.status, waiting.held_by, waiting.not_after) == (TaskStatus.WAITING, None, NEW_END)
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("rebound", "2026-03-02T13:30:00Z")
    ]
    env.clock.advance(AFTER_THE_NEW_END)
    await env.services.tasks.cancel(by_hand.id)  # its queue moves on: r1's task is promoted
    assert (await get(env, task.id)).status is TaskStatus.PENDING
    ended, backend = await run_until_finished(env, task)
    assert_failed_unstarted(ended, backend)


async def a_retry_waiting(env: Env) -> tuple[Schedule, Task]:
    """`fired_inside` with retries: its first attempt ran and failed retryably at FIRED_AT; its second
    waits out a 10 minutes' back-off, held by "retry", bound to 15:00 still."""
    schedule, task = await fired_inside(env, retry=RETRY)
    assert await claim(env) == [task.id]
    async with env.db.transaction() as conn:
        retry_at = env.clock.now() + timedelta(minutes=10)
        sent = await task_runs.retry_later(
            conn, {task.id: (retry_at, "retrying")}, owner_id=OWNER, now=env.clock.now()
        )
    assert sent == {task.id}
    waiting = await get(env, task.id)
    assert (waiting.status, waiting.attempt, waiting.held_by, waiting.not_after) == (
        TaskStatus.PENDING,
        2,
        "retry",
        WINDOW_END,
    )
    return schedule, waiting


async def test_a_retry_s_next_attempt_is_bound_to_its_allow_window_s_new_end(env: Env) -> None:
    schedule, waiting = await a_retry_waiting(env)

    changes = await edit_when(env, SHORTENED)

    rebound = await get(env, waiting.id)
    assert (rebound.held_by, rebound.not_before, rebound.not_after) == ("retry", waiting.not_before, NEW_END)
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("rebound", "2026-03-02T13:30:00Z")
    ]
    env.clock.advance(AFTER_THE_NEW_END)
    ended, backend = await run_until_finished(env, waiting)
    assert_failed_unstarted(ended, backend, "attempt 2")
    assert await outcome_of(env, schedule, waiting) == ("submitted", "")


async def test_a_retry_s_next_attempt_its_window_closed_fails_at_its_next_claim(env: Env) -> None:
    """The window moved to tomorrow night: a retry's next attempt waits for no opening (the task ran), it
    is bound to the change's time and fails at once at the next claim, its back-off notwithstanding."""
    schedule, waiting = await a_retry_waiting(env)
    now = env.clock.now()

    changes = await edit_when(env, MOVED_AWAY)

    closed = await get(env, waiting.id)
    assert (closed.status, closed.held_by, closed.not_before, closed.not_after) == (
        TaskStatus.PENDING,
        "retry",
        now,
        now,
    )
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("rebound", "2026-03-02T13:00:00Z")
    ]
    ended, backend = await run_until_finished(env, waiting)
    assert_failed_unstarted(ended, backend, "attempt 2")
    assert await outcome_of(env, schedule, waiting) == ("submitted", "")


async def test_a_skipping_task_held_by_a_budget_its_window_closed_is_ended_skipped(env: Env) -> None:
    schedule, held, _ = await held_by_the_budget(env, WindowPolicy.SKIP)

    changes = await edit_when(env, MOVED_AWAY)

    ended = await get(env, held.id)
    assert (ended.status, ended.started_at) == (TaskStatus.TERMINATED, None)
    assert await outcome_of(env, schedule, held) == ("skipped_window", ended.message)
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "skipped_window")]


async def test_a_deferring_task_held_by_a_budget_its_window_moved_waits_for_the_opening(env: Env) -> None:
    """Under DEFER the task waits for the window's next opening, held by it instead of the budget (which
    its claim then asks again)."""
    schedule, held, _ = await held_by_the_budget(env, WindowPolicy.DEFER)
    now = env.clock.now()

    changes = await edit_when(env, MOVED_AWAY)

    moved = await get(env, held.id)
    assert (moved.status, moved.held_by, moved.not_before, moved.not_after, moved.held_since) == (
        TaskStatus.PENDING,
        "window",
        TOMORROW_2AM,
        TOMORROW_2AM + timedelta(hours=2),
        now,
    )
    assert await outcome_of(env, schedule, held) == ("submitted", "")
    assert [c["deferred_task"] for c in changes.recorded] == ["moved"]


async def test_a_deleted_allow_window_binds_a_held_task_no_more(env: Env) -> None:
    _, held, _ = await held_by_the_budget(env)
    window_id = await env.services.windows.id_by_name("nightly")

    await env.services.windows.delete(window_id)

    unbound = await get(env, held.id)
    assert (unbound.held_by, unbound.not_before, unbound.not_after) == ("budget", held.not_before, None)


@pytest.mark.postgres
async def test_a_task_a_claim_held_back_while_the_window_was_shortened_is_bound_once_it_committed(
    pg_db: str,
) -> None:
    """A claim takes r1's task as the window is shortened, and its budget gate hands it back: the change
    skips the row the claim holds (it waits for no task's row), and binds it to the new end once the claim
    committed, so the budget's release does not start it after the window."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        budget_id, running = await a_full_budget(env)
        _, task = await fired_inside(env)
        async with env.db.transaction() as conn:
            claimed = await task_runs.claim(
                env.db, conn, owner_id=OWNER, lease_ttl=timedelta(seconds=30), running_here=(running,),
                now=env.clock.now(), limit=10,
            )  # fmt: skip
            assert [t.id for t, _ in claimed] == [task.id]
            edit = asyncio.ensure_future(edit_when(env, SHORTENED))
            await done_or_waiting_on_a_lock(env, edit)
            gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
            assert gated.claimed == []  # the budget holds it
        changes = await asyncio.wait_for(edit, 60)
        assert await env.services.deferrals.look_again() == 0  # the change's instance owes it no more

        rebound = await get(env, task.id)
        assert (rebound.status, rebound.held_by, rebound.not_after) == (TaskStatus.PENDING, "budget", NEW_END)
        assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
            ("rebound", "2026-03-02T13:30:00Z")
        ]
        await env.services.budgets.delete(budget_id)
        env.clock.advance(AFTER_THE_NEW_END)
        ended, backend = await run_until_finished(env, task)
        assert_failed_unstarted(ended, backend)
    finally:
        await db.dispose()


async def released(env: Env, policy: WindowPolicy) -> tuple[Schedule, Task]:
    """`fired_inside` under `policy`, its window then deleted: the task is bound no more (no window covers
    r1, which is open), and has not started."""
    schedule, task = await fired_inside(env, policy)
    await env.services.windows.delete(await env.services.windows.id_by_name("nightly"))
    unbound = await get(env, task.id)
    assert (unbound.status, unbound.held_by, unbound.not_before, unbound.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        None,
    )
    return schedule, unbound


async def create_allow(env: Env, when: OneOff, rack_id: uuid.UUID) -> Changes:
    """Create the ALLOW window "later" on one rack, as an audited call: what its event notes."""
    changes = Changes()
    with noting(changes):
        await env.services.windows.create(
            WindowInput(name="later", kind=WindowKind.ALLOW, when=when, racks=(Ref(rack_id),))
        )
    return changes


async def test_a_task_a_deleted_window_released_is_bound_by_a_new_allow_window_it_is_in(env: Env) -> None:
    """Released by its window's deletion, r1's task is bound again by a new ALLOW window open now until
    13:30, as a firing now would bind it: at 13:45 the executor fails it rather than start it after the
    window the operator now allows."""
    schedule, task = await released(env, WindowPolicy.SKIP)

    changes = await create_allow(env, SHORTENED, task.rack_id)

    rebound = await get(env, task.id)
    assert (rebound.status, rebound.held_by, rebound.not_before, rebound.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        NEW_END,
    )
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("rebound", "2026-03-02T13:30:00Z")
    ]
    env.clock.advance(AFTER_THE_NEW_END)
    ended, backend = await run_until_finished(env, rebound)
    assert_failed_unstarted(ended, backend)
    assert await outcome_of(env, schedule, task) == ("submitted", "")


async def test_a_skipping_task_a_deleted_window_released_is_ended_by_a_new_allow_window_closed_now(
    env: Env,
) -> None:
    """Under SKIP, a new ALLOW window that opens r1 tomorrow night closes it now: a firing now would skip
    it, and so the released task is ended, its scope skipped."""
    schedule, task = await released(env, WindowPolicy.SKIP)

    changes = await create_allow(env, MOVED_AWAY, task.rack_id)

    ended = await get(env, task.id)
    assert (ended.status, ended.started_at) == (TaskStatus.TERMINATED, None)
    assert await outcome_of(env, schedule, task) == ("skipped_window", ended.message)
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "skipped_window")]


async def test_a_deferring_task_a_deleted_window_released_waits_for_a_new_allow_window_s_opening(
    env: Env,
) -> None:
    schedule, task = await released(env, WindowPolicy.DEFER)

    changes = await create_allow(env, MOVED_AWAY, task.rack_id)

    moved = await get(env, task.id)
    assert (moved.status, moved.held_by, moved.not_before, moved.not_after) == (
        TaskStatus.PENDING,
        "window",
        TOMORROW_2AM,
        TOMORROW_2AM + timedelta(hours=2),
    )
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert [c["deferred_task"] for c in changes.recorded] == ["moved"]


async def fired_unbound(env: Env) -> tuple[Schedule, Task]:
    """A schedule on r1 under SKIP fired at FIRED_AT, no window covering r1: its task is bound by none."""
    r1 = await env.rack("r1")
    schedule = await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.SKIP)
    env.clock.advance(FIRED_AT - env.clock.now())
    ((outcome,),) = [result.outcomes for result in await dispatch_at(env, FIRED_AT)]
    task = await get(env, outcome.task_id)
    assert (task.status, task.held_by, task.not_after) == (TaskStatus.PENDING, None, None)
    return schedule, task


async def test_a_task_no_window_bound_is_bound_by_a_new_allow_window_it_is_in(env: Env) -> None:
    """Fired where no window covered r1, the task is bound by an ALLOW window created over r1 until 13:30,
    as a firing now would be: at 13:45 the executor fails it rather than start it."""
    _, task = await fired_unbound(env)

    changes = await create_allow(env, SHORTENED, task.rack_id)

    assert (await get(env, task.id)).not_after == NEW_END
    assert [c["deferred_task"] for c in changes.recorded] == ["rebound"]
    env.clock.advance(AFTER_THE_NEW_END)
    ended, backend = await run_until_finished(env, task)
    assert_failed_unstarted(ended, backend)


async def test_a_skipping_task_no_window_bound_is_ended_by_a_new_freeze_over_it(env: Env) -> None:
    """Fired where no window covered r1, under SKIP, the task is ended by a freeze created over r1 now, its
    scope skipped, as a firing now would skip it (under DEFER it would wait for the freeze's end)."""
    schedule, task = await fired_unbound(env)
    changes = Changes()
    with noting(changes):
        await env.services.windows.create(
            WindowInput(name="freeze", kind=WindowKind.FREEZE, when=SHORTENED, racks=(Ref(task.rack_id),))
        )

    ended = await get(env, task.id)
    assert (ended.status, ended.started_at) == (TaskStatus.TERMINATED, None)
    assert await outcome_of(env, schedule, task) == ("skipped_window", ended.message)
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "skipped_window")]


# --- a window changed between a firing's claim (phase 1) and its submit (phase 2) ------------------------


async def planned_inside(env: Env, monkeypatch: pytest.MonkeyPatch, when: OneOff) -> tuple[Schedule, Task]:
    """r1 under "nightly" (13:00-15:00 around FIRED_AT), a schedule on r1 under SKIP dispatched at
    FIRED_AT: planned (phase 1) while "nightly" held r1 until 15:00, "nightly" moved to `when` once that
    claim committed, and its task submitted (phase 2) after that; the schedule and the task."""
    r1 = await env.rack("r1")
    when_planned = OneOff(FIRED_AT - timedelta(hours=1), WINDOW_END)
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=when_planned, racks=(Ref(r1.id),))
    )
    schedule = await env.schedule(racks=[r1])
    env.clock.advance(FIRED_AT - env.clock.now())
    submit_all = firing._submit_all

    async def edited_first(*args: Any, **kwargs: Any) -> Any:
        await edit_when(env, when)
        return await submit_all(*args, **kwargs)

    monkeypatch.setattr(firing, "_submit_all", edited_first)
    ((outcome,),) = [result.outcomes for result in await dispatch_at(env, FIRED_AT)]
    assert outcome.task_id is not None
    return schedule, await get(env, outcome.task_id)


async def test_a_task_planned_before_its_window_was_shortened_and_submitted_after_is_bound_to_its_new_end(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window is shortened to end at 13:30 between the firing's claim and its submit: the task is not
    left bound to 15:00, which the planner read, and at 13:45 the executor fails it rather than start it
    after the window the operator now allows."""
    schedule, task = await planned_inside(env, monkeypatch, SHORTENED)

    assert (task.status, task.held_by, task.not_after) == (TaskStatus.PENDING, None, NEW_END)
    assert await env.services.deferrals.look_again() == 0  # decided once the submit committed
    env.clock.advance(AFTER_THE_NEW_END)
    ended, backend = await run_until_finished(env, task)
    assert_failed_unstarted(ended, backend)
    assert ended.not_after == NEW_END
    assert await outcome_of(env, schedule, task) == ("submitted", "")


async def test_a_skipping_task_planned_before_its_window_moved_away_and_submitted_after_is_ended_skipped(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window moves to tomorrow night between the firing's claim and its submit: under SKIP a firing
    now skips r1, and so the task is ended, never started, its scope skipped; the firing's instance, which
    decided it once the submit committed, outside any audited call, says so in the audit trail, and what
    owed the decision: the windows its claim read at FIRED_AT differed at its submit, "nightly" changed
    (whose history the row joins, beside the edit's own event)."""
    schedule, task = await planned_inside(env, monkeypatch, MOVED_AWAY)
    window_id = await env.services.windows.id_by_name("nightly")

    ended, backend = await run_until_finished(env, task)
    assert (ended.status, ended.started_at) == (TaskStatus.TERMINATED, None)
    assert [step for step in backend.steps if step.startswith("r1-")] == []
    assert await outcome_of(env, schedule, task) == ("skipped_window", ended.message)
    [event], _ = await env.services.audit.list_events(EventFilter(target=task.id))
    assert (event.principal, event.method, event.request["decided_by"]) == (
        SYSTEM_PRINCIPAL,
        REDECIDE_WINDOW_TASK,
        "submit",
    )
    assert [(c["deferred_task"], c["outcome"]) for c in event.changes or []] == [("ended", "skipped_window")]
    assert event.request["owed_by"] == {
        "change": "windows_changed_before_submit",
        "planned_at": format_rfc3339(FIRED_AT),
        "window_ids": [str(window_id)],
        "owed_since": format_rfc3339(FIRED_AT),
    }
    assert str(window_id) in event.target_ids


async def inside_nightly(env: Env) -> Schedule:
    """r1 under "nightly" (13:00-15:00 around FIRED_AT), and a schedule on r1 under SKIP due at FIRED_AT."""
    r1 = await env.rack("r1")
    when = OneOff(FIRED_AT - timedelta(hours=1), WINDOW_END)
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=when, racks=(Ref(r1.id),))
    )
    schedule = await env.schedule(racks=[r1])
    env.clock.advance(FIRED_AT - env.clock.now())
    return schedule


async def bound_to_the_new_end_and_failed(env: Env, task_id: object) -> None:
    task = await get(env, task_id)
    assert (task.status, task.not_after) == (TaskStatus.PENDING, NEW_END)
    env.clock.advance(AFTER_THE_NEW_END)
    ended, backend = await run_until_finished(env, task)
    assert_failed_unstarted(ended, backend)


@pytest.mark.postgres
async def test_a_window_edit_beside_a_firing_s_submit_waits_for_it_and_binds_its_task(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The submit has inserted r1's task (planned while "nightly" ran to 15:00) and not committed when the
    window is shortened: the edit waits for the submit (which holds the edits' turn in its shared form),
    then finds the task and binds it to 13:30. Without that wait, it would decide before the task existed,
    and the task would keep 15:00."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        await inside_nightly(env)
        submit_each_in = env.services.tasks.submit_each_in
        inserted, go_on = asyncio.Event(), asyncio.Event()

        async def paused(*args: Any, **kwargs: Any) -> Any:
            results = await submit_each_in(*args, **kwargs)
            inserted.set()
            await go_on.wait()
            return results

        monkeypatch.setattr(env.services.tasks, "submit_each_in", paused)
        dispatching = asyncio.ensure_future(dispatch_at(env, FIRED_AT))
        await asyncio.wait_for(inserted.wait(), 60)
        edit = asyncio.ensure_future(edit_when(env, SHORTENED))
        await done_or_waiting_on_a_lock(env, edit)
        go_on.set()
        ((outcome,),) = [result.outcomes for result in await asyncio.wait_for(dispatching, 60)]
        changes = await asyncio.wait_for(edit, 60)

        assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
            ("rebound", "2026-03-02T13:30:00Z")
        ]
        await bound_to_the_new_end_and_failed(env, outcome.task_id)
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_a_firing_s_submit_beside_a_window_edit_waits_for_it_and_its_task_is_decided_again(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window's edit has written "nightly" shortened and not committed when a firing plans (reading it
    as it was, to 15:00) and submits: the submit waits for the edit, reads the windows changed, and its
    task is decided again as they now are, bound to 13:30. Without that, it would wait only for r1's lock
    and insert the task bound to 15:00 after the edit had decided."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        await inside_nightly(env)
        save_window = window_store.save_window
        saved, go_on = asyncio.Event(), asyncio.Event()

        async def paused(*args: Any, **kwargs: Any) -> None:
            await save_window(*args, **kwargs)
            saved.set()
            await go_on.wait()

        monkeypatch.setattr(window_store, "save_window", paused)
        edit = asyncio.ensure_future(edit_when(env, SHORTENED))
        await asyncio.wait_for(saved.wait(), 60)
        dispatching = asyncio.ensure_future(dispatch_at(env, FIRED_AT))
        await done_or_waiting_on_a_lock(env, dispatching)
        go_on.set()
        changes = await asyncio.wait_for(edit, 60)
        ((outcome,),) = [result.outcomes for result in await asyncio.wait_for(dispatching, 60)]

        assert changes.recorded == []  # no task existed when it decided
        await bound_to_the_new_end_and_failed(env, outcome.task_id)
    finally:
        await db.dispose()


async def test_a_task_its_submit_failed_to_decide_is_not_claimed_until_the_look_again_decides_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision the submit owes its task once it committed fails (the database lost): the firing
    still answers, the task keeps the end it was planned with but no claim takes it, and the executors'
    look again binds it to 13:30."""
    deferrals = env.services.deferrals
    decide = deferrals._decide_owed

    async def lost(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("the database was lost")

    monkeypatch.setattr(deferrals, "_decide_owed", lost)
    _, task = await planned_inside(env, monkeypatch, SHORTENED)

    assert (task.status, task.not_after) == (TaskStatus.PENDING, WINDOW_END)
    assert await claim(env) == []
    monkeypatch.setattr(deferrals, "_decide_owed", decide)
    assert await deferrals.look_again() == 1
    assert (await get(env, task.id)).not_after == NEW_END
