"""Creating, editing or deleting a maintenance window decides again the waits of the tasks a DEFER firing
deferred (`rackflow.tasks.deferrals`), on both databases, as a firing at that moment would: moved to the new
opening, released when no window closes the rack any more, ended with their scope "missed" when the new
opening comes at or after the start deadline (or "skipped_window" with no opening left), in the edit's
transaction; the audit event names each task and says what became of it. A task of a rollout that halted
or was cancelled is held by the rollout instead of released (its gate decides it), never started.

The schedule fires at START + 1 h (2026-03-02 13:00 UTC) under DEFER; r1's ALLOW window opens 02:00-04:00
UTC, so its task waits for 2026-03-03 02:00.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit.changes import Changes, noting
from rackflow.clock import FakeClock
from rackflow.config import ROLLOUT_HALT_WAIT
from rackflow.domain.inventory import Rack
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import Schedule
from rackflow.domain.tasks import Task, TaskStatus
from rackflow.domain.windows import MaintenanceWindow, OneOff, Recurring, WindowKind, WindowPolicy
from rackflow.rollouts.gate import CANCELLED_REASON
from rackflow.schedules import firing
from rackflow.services import Services
from rackflow.store import task_runs
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.timespec import format_rfc3339
from rackflow.windows.service import WHEN_PATH, Redeciding, Ref, WindowInput
from tests.store.lock_waits import waiting_for
from tests.store.schedules_support import START, Env, make_env
from tests.store.test_approvals import caller
from tests.store.test_rollout_cancel_gate import ENDED_BY_THE_GATE
from tests.store.test_rollout_cancel_gate import claim as claim_gated
from tests.store.test_rollout_halt_gate import claim as rollout_claim
from tests.store.test_rollout_halt_gate import fail_and_step
from tests.store.test_rollout_lock_order import done_or_waiting_on_a_lock
from tests.store.test_rollouts import _run as rollout_run
from tests.store.test_rollouts_windows import _rollout as rollout_firing
from tests.store.test_windows_firing import NIGHTLY, TOMORROW_2AM, dispatch_at, with_policy

FIRED_AT = START + timedelta(hours=1)


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def deferred(env: Env, *others: Rack, deadline: timedelta | None = None) -> tuple[Schedule, Task]:
    """r1 under the ALLOW window "nightly", a DEFER schedule on r1 (and `others`) fired at FIRED_AT; its
    task on r1, waiting for 02:00. The clock is then at FIRED_AT."""
    r1 = await env.rack("r1")
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=NIGHTLY, racks=(Ref(r1.id),))
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1, *others]), WindowPolicy.DEFER)
    if deadline is not None:
        schedule = await env.services.schedules.update(
            schedule.id, ["schedule.start_deadline"], start_deadline=deadline
        )
    (result,) = await dispatch_at(env, FIRED_AT)
    env.clock.advance(FIRED_AT - env.clock.now())
    [task_id] = [o.task_id for o in result.outcomes if o.rack_id == r1.id]
    assert task_id is not None
    task = await get(env, task_id)
    assert (task.held_by, task.not_before) == ("window", TOMORROW_2AM)
    return schedule, task


async def get(env: Env, task_id: object) -> Task:
    [task] = await env.services.tasks.get_tasks([task_id])  # type: ignore[list-item]
    return task


async def outcome_of(env: Env, schedule: Schedule, task: Task) -> tuple[str, str]:
    """The outcome, and its error, the task's scope has in the schedule's one run."""
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    (outcome,) = [o for o in run.outcomes if o.task_id == task.id]
    return outcome.outcome, outcome.error


async def edit_when(env: Env, when: Recurring | OneOff) -> Changes:
    """Move "nightly" to `when`, as an audited call: what its event notes."""
    window_id = await env.services.windows.id_by_name("nightly")
    changes = Changes()
    with noting(changes):
        await env.services.windows.update(window_id, [WHEN_PATH], WindowInput(when=when))
    return changes


async def test_an_edited_window_moves_its_deferred_task_to_the_new_opening(env: Env) -> None:
    schedule, task = await deferred(env)

    changes = await edit_when(env, Recurring("0 5 * * *", "1h"))  # 05:00-06:00

    moved = await get(env, task.id)
    opens, closes = TOMORROW_2AM + timedelta(hours=3), TOMORROW_2AM + timedelta(hours=4)
    assert (moved.status, moved.held_by, moved.not_before, moved.not_after) == (
        TaskStatus.PENDING,
        "window",
        opens,
        closes,
    )
    assert f"waits for the opening at {format_rfc3339(opens)} until {format_rfc3339(closes)}" in (
        moved.held_reason or ""
    )
    assert moved.message == moved.held_reason
    assert moved.held_since == task.held_since  # the same wait, for a new opening
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert changes.target_ids == [str(task.id)]
    assert changes.recorded == [
        {
            "deferred_task": "moved",
            "task_id": str(task.id),
            "run_id": str(task.run_id),
            "rack_id": str(task.rack_id),
            "not_before": "2026-03-03T05:00:00Z",
            "not_after": "2026-03-03T06:00:00Z",
        }
    ]


async def test_a_deleted_window_releases_its_deferred_task(env: Env) -> None:
    schedule, task = await deferred(env)
    window_id = await env.services.windows.id_by_name("nightly")

    changes = Changes()
    with noting(changes):
        await env.services.windows.delete(window_id)

    released = await get(env, task.id)
    assert (released.status, released.held_by, released.not_before, released.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        None,
    )
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert changes.recorded == [
        {
            "deferred_task": "released",
            "task_id": str(task.id),
            "run_id": str(task.run_id),
            "rack_id": str(task.rack_id),
        }
    ]


async def test_a_deleted_window_releases_its_deferred_task_bound_by_its_start_deadline(env: Env) -> None:
    """With a deadline of 15 h (04:00), the released task, in no ALLOW window now, must start by 04:00."""
    schedule, task = await deferred(env, deadline=timedelta(hours=15))
    window_id = await env.services.windows.id_by_name("nightly")

    changes = Changes()
    with noting(changes):
        await env.services.windows.delete(window_id)

    released = await get(env, task.id)
    assert (released.status, released.held_by, released.not_before, released.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        TOMORROW_2AM + timedelta(hours=2),
    )
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("released", "2026-03-03T04:00:00Z")
    ]


async def test_an_edit_that_opens_the_rack_now_releases_it_bound_to_the_window_s_end(env: Env) -> None:
    _, task = await deferred(env)
    now = env.clock.now()

    await edit_when(env, OneOff(now - timedelta(hours=1), now + timedelta(hours=2)))

    released = await get(env, task.id)
    assert (released.held_by, released.not_before, released.not_after) == (
        None,
        None,
        now + timedelta(hours=2),
    )


async def test_an_opening_moved_past_the_start_deadline_ends_the_task_and_its_scope_is_missed(
    env: Env,
) -> None:
    """The slot is START + 1 h and the deadline 14 h: 03:00 (within the first opening, which it capped)."""
    schedule, task = await deferred(env, deadline=timedelta(hours=14))
    assert task.not_after == TOMORROW_2AM + timedelta(hours=1)

    changes = await edit_when(env, Recurring("0 5 * * *", "1h"))

    ended = await get(env, task.id)
    assert ended.status is TaskStatus.TERMINATED and ended.started_at is None
    # An ended task waits for nothing (its hold is cleared with its end, docs/CHECKS.md); its bound stays.
    assert (ended.held_by, ended.not_before, ended.not_after) == (None, None, task.not_after)
    assert "comes after the start deadline" in ended.message
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    (outcome,) = run.outcomes
    assert (outcome.outcome, outcome.task_id, outcome.error) == ("missed", task.id, ended.message)
    tally = (await env.services.rollouts.summary(run.id)).tally
    assert tally == {("missed", True): 1}
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "missed")]


async def test_an_opening_moved_before_the_start_deadline_keeps_it_as_the_end(env: Env) -> None:
    """A deadline of 15 h (04:00) that the first opening's end did not reach is kept all the same: an
    opening moved to 03:00-05:00 must start by it."""
    _, task = await deferred(env, deadline=timedelta(hours=15))
    assert task.not_after == TOMORROW_2AM + timedelta(hours=2)

    await edit_when(env, Recurring("0 3 * * *", "2h"))

    moved = await get(env, task.id)
    assert (moved.not_before, moved.not_after) == (
        TOMORROW_2AM + timedelta(hours=1),
        TOMORROW_2AM + timedelta(hours=2),
    )
    assert "its start deadline" in moved.message


async def test_an_allow_window_with_no_opening_left_ends_the_task_skipped(env: Env) -> None:
    schedule, task = await deferred(env)
    now = env.clock.now()

    changes = await edit_when(env, OneOff(now - timedelta(hours=3), now - timedelta(hours=2)))  # none left

    ended = await get(env, task.id)
    assert ended.status is TaskStatus.TERMINATED
    assert (ended.held_by, ended.not_before, ended.not_after) == (None, None, task.not_after)
    assert await outcome_of(env, schedule, task) == ("skipped_window", ended.message)
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "skipped_window")]


async def test_tasks_on_racks_the_window_does_not_cover_are_left_as_they_are(env: Env) -> None:
    r2 = await env.rack("r2")
    await env.services.windows.create(
        WindowInput(name="r2 nights", kind=WindowKind.ALLOW, when=NIGHTLY, racks=(Ref(r2.id),))
    )
    schedule, task = await deferred(env, r2)
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    [other_id] = [o.task_id for o in run.outcomes if o.rack_id == r2.id]
    before = await get(env, other_id)

    changes = await edit_when(env, Recurring("0 5 * * *", "1h"))

    assert await get(env, other_id) == before
    assert changes.target_ids == [str(task.id)]


async def test_a_window_s_rename_moves_nothing(env: Env) -> None:
    _, task = await deferred(env)
    window_id = await env.services.windows.id_by_name("nightly")
    changes = Changes()
    with noting(changes):
        await env.services.windows.update(window_id, ["window.name"], WindowInput(name="nights"))
    assert await get(env, task.id) == task
    assert changes.recorded == []


async def test_a_task_ended_between_its_submit_and_its_write_back_keeps_its_outcome(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The window's edit ends the task after the firing submitted it and before its write-back: the
    write-back, which knows only that it was submitted, keeps the outcome the edit settled."""
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=NIGHTLY, racks=(Ref(r1.id),))
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1, r2]), WindowPolicy.DEFER)
    env.clock.advance(FIRED_AT - env.clock.now())
    write_back = firing._write_back

    async def edited_first(*args: Any, **kwargs: Any) -> Any:
        await edit_when(env, OneOff(FIRED_AT - timedelta(hours=3), FIRED_AT - timedelta(hours=2)))
        return await write_back(*args, **kwargs)

    monkeypatch.setattr(firing, "_write_back", edited_first)
    await dispatch_at(env, FIRED_AT)

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert run.state == "completed"
    outcomes = {o.rack_id: o for o in run.outcomes}
    ended = await get(env, outcomes[r1.id].task_id)
    assert ended.status is TaskStatus.TERMINATED
    assert (outcomes[r1.id].outcome, outcomes[r1.id].error) == ("skipped_window", ended.message)
    assert outcomes[r2.id].outcome == "submitted"
    tally = (await env.services.rollouts.summary(run.id)).tally
    assert tally == {("skipped_window", True): 1, ("submitted", True): 1}


async def test_a_task_ended_after_its_scope_was_removed_before_its_write_back_keeps_its_outcome(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r1 leaves the schedule's scope after the firing submitted its task, and then the window's edit ends
    the task, both before the write-back: the run says what the edit did to it, not "submitted"."""
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=NIGHTLY, racks=(Ref(r1.id),))
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1, r2]), WindowPolicy.DEFER)
    [r1_scope] = [s for s in await env.services.schedules.list_scopes(schedule.id) if s.rack_id == r1.id]
    env.clock.advance(FIRED_AT - env.clock.now())
    write_back = firing._write_back

    async def edited_first(*args: Any, **kwargs: Any) -> Any:
        await env.services.schedules.remove_scope(r1_scope.id)
        await edit_when(env, OneOff(FIRED_AT - timedelta(hours=3), FIRED_AT - timedelta(hours=2)))
        return await write_back(*args, **kwargs)

    monkeypatch.setattr(firing, "_write_back", edited_first)
    await dispatch_at(env, FIRED_AT)

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    outcomes = {o.rack_id: o for o in run.outcomes}
    ended = await get(env, outcomes[r1.id].task_id)
    assert ended.status is TaskStatus.TERMINATED
    assert (outcomes[r1.id].outcome, outcomes[r1.id].error) == ("skipped_window", ended.message)
    assert outcomes[r1.id].scope_id == r1_scope.id  # as the firing recorded it
    assert outcomes[r2.id].outcome == "submitted"


class PausedOnce:
    """The deferrals of the first edit through it pause, its transaction open (`conn`), until `go` is
    set."""

    def __init__(self, deferrals: Redeciding) -> None:
        self.deferrals = deferrals
        self.paused = asyncio.Event()
        self.go = asyncio.Event()
        self.conn: AsyncConnection | None = None

    async def redecide_in(
        self,
        conn: AsyncConnection,
        changed: Sequence[MaintenanceWindow],
        now: datetime,
        write: Callable[[], Awaitable[object]],
        change: str,
    ) -> Callable[[], Awaitable[None]]:
        once_committed = await self.deferrals.redecide_in(conn, changed, now, write, change)
        if not self.paused.is_set():
            self.conn = conn
            self.paused.set()
            await self.go.wait()
        return once_committed


@pytest.mark.postgres
async def test_two_window_edits_at_once_take_turns(pg_db: str) -> None:
    """One edit moves "nightly" to 05:00-06:00 and, before it commits, another moves the freeze "late" over
    that opening: the second decides after the first committed, from both changes, and moves the task to
    the next day's opening, as the two edits one after the other would."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        _, task = await deferred(env)
        far = OneOff(START + timedelta(days=30), START + timedelta(days=31))
        await env.services.windows.create(
            WindowInput(name="late", kind=WindowKind.FREEZE, when=far, racks=(Ref(task.rack_id),))
        )
        windows = env.services.windows
        paused = PausedOnce(windows.deferrals)
        windows.deferrals = paused
        first = asyncio.ensure_future(edit_when(env, Recurring("0 5 * * *", "1h")))
        async with asyncio.timeout(60):
            await paused.paused.wait()
        freeze = OneOff(TOMORROW_2AM + timedelta(hours=2, minutes=30), TOMORROW_2AM + timedelta(hours=5))
        late_id = await windows.id_by_name("late")
        second = asyncio.ensure_future(windows.update(late_id, [WHEN_PATH], WindowInput(when=freeze)))
        await done_or_waiting_on_a_lock(env, second)
        paused.go.set()
        await asyncio.wait_for(first, 60)
        await asyncio.wait_for(second, 60)

        moved = await get(env, task.id)
        next_day = TOMORROW_2AM + timedelta(days=1, hours=3)
        assert (moved.status, moved.not_before, moved.not_after) == (
            TaskStatus.PENDING,
            next_day,
            next_day + timedelta(hours=1),
        )
    finally:
        await db.dispose()


async def fired_inside(env: Env, policy: WindowPolicy) -> tuple[Schedule, Task]:
    """r1 under the ALLOW window "nightly", open from an hour before FIRED_AT to two after, and a schedule
    on r1 under `policy` fired at FIRED_AT: its task may start at once, by the window's end."""
    r1 = await env.rack("r1")
    when = OneOff(FIRED_AT - timedelta(hours=1), FIRED_AT + timedelta(hours=2))
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=when, racks=(Ref(r1.id),))
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1]), policy)
    ((outcome,),) = [result.outcomes for result in await dispatch_at(env, FIRED_AT)]
    env.clock.advance(FIRED_AT - env.clock.now())
    task = await get(env, outcome.task_id)
    assert (task.held_by, task.not_before, task.not_after) == (None, None, FIRED_AT + timedelta(hours=2))
    return schedule, task


@pytest.mark.parametrize("policy", [WindowPolicy.SKIP, WindowPolicy.DEFER])
async def test_a_task_fired_inside_an_allow_window_is_bound_to_its_new_end(
    env: Env, policy: WindowPolicy
) -> None:
    schedule, task = await fired_inside(env, policy)

    changes = await edit_when(env, OneOff(FIRED_AT - timedelta(hours=1), FIRED_AT + timedelta(hours=5)))

    rebound = await get(env, task.id)
    assert (rebound.status, rebound.held_by, rebound.not_before, rebound.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        FIRED_AT + timedelta(hours=5),
    )
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert changes.target_ids == [str(task.id)]
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("rebound", "2026-03-02T18:00:00Z")
    ]


async def test_a_task_fired_inside_a_deleted_allow_window_is_bound_no_more(env: Env) -> None:
    schedule, task = await fired_inside(env, WindowPolicy.SKIP)
    window_id = await env.services.windows.id_by_name("nightly")

    changes = Changes()
    with noting(changes):
        await env.services.windows.delete(window_id)

    unbound = await get(env, task.id)
    assert (unbound.status, unbound.held_by, unbound.not_before, unbound.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        None,
    )
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [("rebound", None)]


async def test_a_skipping_task_fired_inside_an_allow_window_moved_away_is_ended_skipped(env: Env) -> None:
    """The window now opens tomorrow: under SKIP a firing now skips the rack."""
    skipping, skipped = await fired_inside(env, WindowPolicy.SKIP)
    changes = await edit_when(env, OneOff(TOMORROW_2AM, TOMORROW_2AM + timedelta(hours=2)))

    ended = await get(env, skipped.id)
    assert ended.status is TaskStatus.TERMINATED
    assert (ended.not_before, ended.not_after) == (skipped.not_before, skipped.not_after)
    (run,), _ = await env.services.schedules.list_runs(skipping.id)
    assert [(o.outcome, o.error) for o in run.outcomes] == [("skipped_window", ended.message)]
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "skipped_window")]


async def test_a_deferring_task_fired_inside_an_allow_window_moved_away_waits_for_it(env: Env) -> None:
    schedule, task = await fired_inside(env, WindowPolicy.DEFER)

    changes = await edit_when(env, OneOff(TOMORROW_2AM, TOMORROW_2AM + timedelta(hours=2)))

    moved = await get(env, task.id)
    assert (moved.status, moved.held_by, moved.not_before, moved.not_after) == (
        TaskStatus.PENDING,
        "window",
        TOMORROW_2AM,
        TOMORROW_2AM + timedelta(hours=2),
    )
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert [c["deferred_task"] for c in changes.recorded] == ["moved"]


async def create_window(env: Env, name: str, kind: WindowKind, when: OneOff, rack_id: object) -> Changes:
    """Create the window `name` on one rack, as an audited call: what its event notes."""
    changes = Changes()
    with noting(changes):
        await env.services.windows.create(
            WindowInput(name=name, kind=kind, when=when, racks=(Ref(rack_id),))  # type: ignore[arg-type]
        )
    return changes


async def test_a_new_freeze_over_a_deferred_task_s_opening_moves_it(env: Env) -> None:
    """A freeze created over the first hour of the opening (02:00-03:00) moves the task to 03:00-04:00."""
    schedule, task = await deferred(env)

    freeze = OneOff(TOMORROW_2AM, TOMORROW_2AM + timedelta(hours=1))
    changes = await create_window(env, "change freeze", WindowKind.FREEZE, freeze, task.rack_id)

    moved = await get(env, task.id)
    assert (moved.status, moved.held_by, moved.not_before, moved.not_after) == (
        TaskStatus.PENDING,
        "window",
        TOMORROW_2AM + timedelta(hours=1),
        TOMORROW_2AM + timedelta(hours=2),
    )
    assert moved.held_since == task.held_since
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert changes.target_ids == [str(task.id)]
    assert [(c["deferred_task"], c.get("not_before")) for c in changes.recorded] == [
        ("moved", "2026-03-03T03:00:00Z")
    ]


async def test_a_new_allow_window_open_now_releases_a_deferred_task_bound_to_its_end(env: Env) -> None:
    _, task = await deferred(env)
    now = env.clock.now()

    open_now = OneOff(now - timedelta(hours=1), now + timedelta(hours=2))
    changes = await create_window(env, "today", WindowKind.ALLOW, open_now, task.rack_id)

    released = await get(env, task.id)
    assert (released.status, released.held_by, released.not_before, released.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        now + timedelta(hours=2),
    )
    assert [c["deferred_task"] for c in changes.recorded] == ["released"]


async def test_a_released_task_stays_bound_by_its_start_deadline(env: Env) -> None:
    """Deferred with a deadline of 15 h (04:00, the opening's end), the task is released by a new ALLOW
    window open from now to 09:00 tomorrow: it must still start by 04:00 (held by another gate until
    then, it fails rather than starts late), and keeps that cap when the window is edited again."""
    schedule, task = await deferred(env, deadline=timedelta(hours=15))
    deadline = TOMORROW_2AM + timedelta(hours=2)
    assert task.not_after == deadline
    now = env.clock.now()

    open_now = OneOff(now - timedelta(hours=1), now + timedelta(hours=20))
    changes = await create_window(env, "today", WindowKind.ALLOW, open_now, task.rack_id)

    released = await get(env, task.id)
    assert (released.status, released.held_by, released.not_before, released.not_after) == (
        TaskStatus.PENDING,
        None,
        None,
        deadline,
    )
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert [(c["deferred_task"], c.get("not_after")) for c in changes.recorded] == [
        ("released", "2026-03-03T04:00:00Z")
    ]

    window_id = await env.services.windows.id_by_name("today")
    longer = OneOff(now - timedelta(hours=1), now + timedelta(hours=30))
    await env.services.windows.update(window_id, [WHEN_PATH], WindowInput(when=longer))
    assert (await get(env, task.id)).not_after == deadline


async def test_a_new_freeze_over_a_skipping_task_fired_inside_an_allow_window_ends_it_skipped(
    env: Env,
) -> None:
    schedule, task = await fired_inside(env, WindowPolicy.SKIP)

    freeze = OneOff(FIRED_AT - timedelta(minutes=30), FIRED_AT + timedelta(hours=3))
    changes = await create_window(env, "change freeze", WindowKind.FREEZE, freeze, task.rack_id)

    ended = await get(env, task.id)
    assert ended.status is TaskStatus.TERMINATED and ended.started_at is None
    assert (ended.not_before, ended.not_after) == (task.not_before, task.not_after)
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert [(o.outcome, o.error) for o in run.outcomes] == [("skipped_window", ended.message)]
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "skipped_window")]


async def test_a_running_task_is_left_as_it_is_by_a_window_created_edited_or_deleted(env: Env) -> None:
    """A task fired inside its ALLOW window that an executor has started: a freeze created over it, its
    window's end moved before now, the window deleted: it runs on, its run's outcome and its wait as
    they were, and no audit event names it (a freeze does not interrupt a running task)."""
    schedule, task = await fired_inside(env, WindowPolicy.SKIP)
    async with env.db.transaction() as conn:
        claimed = await task_runs.claim(
            env.db, conn, owner_id=uuid.uuid4(), lease_ttl=timedelta(minutes=15), running_here=(),
            now=env.clock.now(), limit=10,
        )  # fmt: skip
    assert [t.id for t, _ in claimed] == [task.id]
    running = await get(env, task.id)
    assert running.status is TaskStatus.RUNNING
    window_id = await env.services.windows.id_by_name("nightly")

    freeze = OneOff(FIRED_AT - timedelta(minutes=30), FIRED_AT + timedelta(hours=3))
    created = await create_window(env, "change freeze", WindowKind.FREEZE, freeze, task.rack_id)
    edited = await edit_when(env, OneOff(FIRED_AT - timedelta(hours=2), FIRED_AT - timedelta(hours=1)))
    deleted = Changes()
    with noting(deleted):
        await env.services.windows.delete(window_id)

    assert await get(env, task.id) == running
    assert (running.not_before, running.not_after) == (None, FIRED_AT + timedelta(hours=2))
    assert await outcome_of(env, schedule, task) == ("submitted", "")
    assert [created.recorded, edited.recorded, deleted.recorded] == [[], [], []]


async def test_an_edit_reads_its_clock_once_its_turn_came(env: Env) -> None:
    """An edit that waited an hour for the one before it decides, and stamps the window, at the time its
    turn came."""
    _, task = await deferred(env)
    freeze = OneOff(START + timedelta(days=30), START + timedelta(days=31))
    await env.services.windows.create(
        WindowInput(name="late", kind=WindowKind.FREEZE, when=freeze, racks=(Ref(task.rack_id),))
    )
    windows = env.services.windows
    paused = PausedOnce(windows.deferrals)
    windows.deferrals = paused
    first = asyncio.ensure_future(edit_when(env, Recurring("0 5 * * *", "1h")))
    async with asyncio.timeout(60):
        await paused.paused.wait()
    late_id = await windows.id_by_name("late")
    second = asyncio.ensure_future(windows.update(late_id, ["window.reason"], WindowInput(reason="later")))
    assert paused.conn is not None
    await waiting_for(env.db, paused.conn, second)  # SQLite's one writer, PostgreSQL's advisory lock
    env.clock.advance(timedelta(hours=1))
    turn_came = env.clock.now()
    paused.go.set()
    await asyncio.wait_for(first, 60)
    updated = await asyncio.wait_for(second, 60)

    assert updated.updated_at == turn_came


@pytest.mark.postgres
async def test_a_new_window_takes_its_turn_after_an_edit(pg_db: str) -> None:
    """A freeze created over the opening an edit is moving its task to (05:00-06:00), before that edit
    commits, decides after it, from both: the task waits for the next day's opening."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        _, task = await deferred(env)
        windows = env.services.windows
        paused = PausedOnce(windows.deferrals)
        windows.deferrals = paused
        first = asyncio.ensure_future(edit_when(env, Recurring("0 5 * * *", "1h")))
        async with asyncio.timeout(60):
            await paused.paused.wait()
        freeze = OneOff(TOMORROW_2AM + timedelta(hours=2, minutes=30), TOMORROW_2AM + timedelta(hours=5))
        second = asyncio.ensure_future(create_window(env, "late", WindowKind.FREEZE, freeze, task.rack_id))
        await done_or_waiting_on_a_lock(env, second)
        paused.go.set()
        await asyncio.wait_for(first, 60)
        await asyncio.wait_for(second, 60)

        moved = await get(env, task.id)
        next_day = TOMORROW_2AM + timedelta(days=1, hours=3)
        assert (moved.status, moved.not_before, moved.not_after) == (
            TaskStatus.PENDING,
            next_day,
            next_day + timedelta(hours=1),
        )
    finally:
        await db.dispose()


async def fired_inside_by(env: Env, deadline: timedelta) -> tuple[Schedule, Task]:
    """`fired_inside` under DEFER with a start deadline: the firing's outcome keeps it."""
    r1 = await env.rack("r1")
    when = OneOff(FIRED_AT - timedelta(hours=1), FIRED_AT + timedelta(hours=2))
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=when, racks=(Ref(r1.id),))
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.DEFER)
    schedule = await env.services.schedules.update(
        schedule.id, ["schedule.start_deadline"], start_deadline=deadline
    )
    ((outcome,),) = [result.outcomes for result in await dispatch_at(env, FIRED_AT)]
    env.clock.advance(FIRED_AT - env.clock.now())
    assert outcome.start_by == FIRED_AT + deadline
    task = await get(env, outcome.task_id)
    assert (task.held_by, task.not_before, task.not_after) == (None, None, FIRED_AT + timedelta(hours=2))
    return schedule, task


async def test_a_task_fired_inside_an_allow_window_moved_past_its_start_deadline_is_missed(env: Env) -> None:
    """The window now opens tomorrow, after the deadline (slot + 3 h): a firing now would miss the rack."""
    schedule, task = await fired_inside_by(env, timedelta(hours=3))

    changes = await edit_when(env, OneOff(TOMORROW_2AM, TOMORROW_2AM + timedelta(hours=2)))

    ended = await get(env, task.id)
    assert ended.status is TaskStatus.TERMINATED and ended.started_at is None
    assert "comes after the start deadline" in ended.message
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert [(o.outcome, o.error) for o in run.outcomes] == [("missed", ended.message)]
    assert [(c["deferred_task"], c.get("outcome")) for c in changes.recorded] == [("ended", "missed")]


async def test_a_task_fired_inside_an_allow_window_moved_later_waits_by_its_start_deadline(env: Env) -> None:
    """The window now opens in an hour, until 5 h after the slot: the task waits for it, by the deadline."""
    _, task = await fired_inside_by(env, timedelta(hours=3))

    await edit_when(env, OneOff(FIRED_AT + timedelta(hours=1), FIRED_AT + timedelta(hours=5)))

    moved = await get(env, task.id)
    assert (moved.status, moved.held_by, moved.not_before, moved.not_after) == (
        TaskStatus.PENDING,
        "window",
        FIRED_AT + timedelta(hours=1),
        FIRED_AT + timedelta(hours=3),
    )
    assert "its start deadline" in moved.message


@pytest.mark.parametrize("whose", ["the schedule's", "the server's"])
async def test_an_edit_between_a_submit_and_its_write_back_keeps_the_start_deadline(
    db: Database, monkeypatch: pytest.MonkeyPatch, whose: str
) -> None:
    """The window's edit moves the opening past the deadline (slot + 14 h: 03:00) after the firing submitted
    the deferred task and before its write-back recorded the outcome keeping the deadline: the edit finds
    the deadline from the run's slot and the schedule's (or the server's) deadline, and misses the rack."""
    deadline = timedelta(hours=14)
    server_s = deadline if whose == "the server's" else None
    clock = FakeClock(START)
    env = Env(db, clock, Services.build(db, clock, default_start_deadline=server_s))
    r1 = await env.rack("r1")
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=NIGHTLY, racks=(Ref(r1.id),))
    )
    schedule = await with_policy(env, await env.schedule(racks=[r1]), WindowPolicy.DEFER)
    if server_s is None:
        await env.services.schedules.update(schedule.id, ["schedule.start_deadline"], start_deadline=deadline)
    env.clock.advance(FIRED_AT - env.clock.now())
    write_back = firing._write_back

    async def edited_first(*args: Any, **kwargs: Any) -> Any:
        await edit_when(env, Recurring("0 5 * * *", "1h"))
        return await write_back(*args, **kwargs)

    monkeypatch.setattr(firing, "_write_back", edited_first)
    await dispatch_at(env, FIRED_AT)

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    (outcome,) = run.outcomes
    ended = await get(env, outcome.task_id)
    assert ended.status is TaskStatus.TERMINATED and ended.started_at is None
    assert "comes after the start deadline" in ended.message
    assert (outcome.outcome, outcome.error) == ("missed", ended.message)


# --- a deferred rack of a rollout that halted or was cancelled (docs/ROLLOUTS.md, "A halt starts nothing
# more") -----------------------------------------------------------------------------------------------

HALT_AT_ONE = RolloutPolicy(max_concurrent_racks=2, halt_after_failures=1)
# How each window change below opens r1 now (r1's "nightly" opens at 02:00 tomorrow).
OPENING_CHANGES = ["create", "edit", "delete"]


async def deferred_in_a_rollout(env: Env) -> tuple[Schedule, uuid.UUID, Task]:
    """A dispatched DEFER rollout of r0, r1 and r2 (two at once, halting at the first failure) fired now,
    r1 under "nightly": its first wave submits r0's task, and r1's deferred to 02:00 (its run, and that
    task); r2 waits its turn."""
    r0, r1, r2 = [await env.rack(f"r{i}") for i in range(3)]
    await env.services.windows.create(
        WindowInput(name="nightly", kind=WindowKind.ALLOW, when=NIGHTLY, racks=(Ref(r1.id),))
    )
    schedule = await rollout_firing(env, [r0, r1, r2], WindowPolicy.DEFER, rollout=HALT_AT_ONE)
    report = await rollout_run(env, schedule)
    [task_id] = [o.task_id for o in report.run.outcomes if o.rack_id == r1.id]
    task = await get(env, task_id)
    assert (task.status, task.held_by, task.not_before) == (TaskStatus.PENDING, "window", TOMORROW_2AM)
    return schedule, report.run.id, task


async def halted_with_a_deferred_rack(env: Env) -> tuple[Schedule, uuid.UUID, Task]:
    """`deferred_in_a_rollout`, r0 started and failed: the rollout halts (r2 not started), and r1's task
    still waits for its opening (a halt leaves a hold another gate, or its window, has: the task comes
    before the rollout's gate when that hold ends)."""
    schedule, run_id, task = await deferred_in_a_rollout(env)
    [r0_task] = await rollout_claim(env)
    await fail_and_step(env, r0_task)
    assert (await rollout_run(env, schedule)).run.state == "halted"
    assert await get(env, task.id) == task
    return schedule, run_id, task


async def open_now(env: Env, change: str, rack_id: uuid.UUID) -> Changes:
    """Open r1 now, by `change`: a new ALLOW window open from an hour ago to two hours from now, "nightly"
    moved to that, or "nightly" deleted; as an audited call: what its event notes."""
    now = env.clock.now()
    when = OneOff(now - timedelta(hours=1), now + timedelta(hours=2))
    if change == "create":
        return await create_window(env, "open now", WindowKind.ALLOW, when, rack_id)
    if change == "edit":
        return await edit_when(env, when)
    changes = Changes()
    with noting(changes):
        await env.services.windows.delete(await env.services.windows.id_by_name("nightly"))
    return changes


def assert_held_by_the_halt(env: Env, task: Task, change: str) -> None:
    """Held by the halt as the halt holds a task nothing held, bound as the window's release binds it."""
    assert (task.status, task.held_by, task.started_at) == (TaskStatus.PENDING, "rollout", None)
    halt = "rollout halted: 1 of 3 racks failed (limit 1)"
    assert task.held_reason == f"waits for its rollout to be resumed: {halt}"
    assert task.message == task.held_reason
    ends = None if change == "delete" else env.clock.now() + timedelta(hours=2)
    assert (task.not_before, task.not_after) == (env.clock.now() + ROLLOUT_HALT_WAIT, ends)


@pytest.mark.parametrize("change", OPENING_CHANGES)
async def test_a_window_that_opens_a_halted_rollout_s_deferred_rack_leaves_it_held_by_the_halt(
    env: Env, change: str
) -> None:
    """Its window lets it go, but its rollout is halted: the halt holds it, as it holds every task of the
    run that has not begun and nothing else holds, until a resume (which lets it start at once)."""
    schedule, run_id, task = await halted_with_a_deferred_rack(env)

    changes = await open_now(env, change, task.rack_id)

    assert_held_by_the_halt(env, await get(env, task.id), change)
    ends = {} if change == "delete" else {"not_after": format_rfc3339(env.clock.now() + timedelta(hours=2))}
    assert changes.recorded == [
        {
            "deferred_task": "released",
            "task_id": str(task.id),
            "run_id": str(run_id),
            "rack_id": str(task.rack_id),
            **ends,
            "held_by": "rollout",
        }
    ]
    assert await rollout_claim(env) == [], "a rack of the halted rollout started"
    env.clock.advance(timedelta(minutes=10))  # the halt's hold is due for a look: its gate holds it again
    assert await rollout_claim(env) == [], "a rack of the halted rollout started"
    assert (await get(env, task.id)).held_by == "rollout"
    assert await outcome_of(env, schedule, task) == ("submitted", "")

    await env.services.rollouts.resume(run_id)  # r1 goes on at once, and r2's turn comes again
    started = await rollout_claim(env)
    assert task.id in started and len(started) == 2


@pytest.mark.parametrize("change", OPENING_CHANGES)
async def test_a_window_that_opens_a_cancelled_rollout_s_deferred_rack_starts_nothing(
    env: Env, change: str
) -> None:
    """The cancel ended the task waiting for its window (it had not begun): the window's change finds
    nothing to decide, and nothing starts."""
    schedule, run_id, task = await halted_with_a_deferred_rack(env)
    with caller("oncall"):
        await env.services.rollouts.cancel(run_id)

    changes = await open_now(env, change, task.rack_id)

    assert changes.recorded == []
    ended = await get(env, task.id)
    assert (ended.status, ended.message) == (TaskStatus.TERMINATED, "its rollout was cancelled by oncall")
    assert await rollout_claim(env) == [], "a rack of the cancelled rollout started"
    assert await outcome_of(env, schedule, task) == ("not_started", "its rollout was cancelled by oncall")


@pytest.mark.postgres
async def test_a_halt_beside_a_window_change_releasing_its_deferred_rack_holds_it(pg_db: str) -> None:
    """The window's deletion releases r1's task, and before it commits a rollout step finds r0 failed:
    the halt and the release decide one after the other (the deletion holds the run's row, which the
    step skips until it is free), so the task ends held by the halt whichever goes first, never left
    unheld for a claim to start. (PostgreSQL only: SQLite's single writer runs them one after the other.)"""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, _, task = await deferred_in_a_rollout(env)
        [r0_task] = await rollout_claim(env)
        async with env.db.transaction() as conn:
            await task_store.set_status(conn, [r0_task], TaskStatus.FAILED, now=env.clock.now())
        windows = env.services.windows
        paused = PausedOnce(windows.deferrals)
        windows.deferrals = paused
        deletion = asyncio.ensure_future(open_now(env, "delete", task.rack_id))
        async with asyncio.timeout(60):
            await paused.paused.wait()
        step = asyncio.ensure_future(env.services.rollouts.advance())
        await done_or_waiting_on_a_lock(env, step)
        paused.go.set()
        await asyncio.wait_for(deletion, 60)
        await asyncio.wait_for(step, 60)
        await env.services.rollouts.advance()

        assert (await rollout_run(env, schedule)).run.state == "halted"
        assert_held_by_the_halt(env, await get(env, task.id), "delete")
        env.clock.advance(timedelta(minutes=10))
        assert await rollout_claim(env) == [], "a rack of the halted rollout started"
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_a_cancel_beside_a_window_change_releasing_its_deferred_rack_ends_it(pg_db: str) -> None:
    """The window's deletion releases r1's task, and before it commits the rollout is cancelled: the
    cancel waits for the run's row, which the deletion holds, and then ends the task it released, its
    rack not started, rather than skip it as a task a claim holds and leave it unheld for a claim to
    start after the cancel."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, run_id, task = await deferred_in_a_rollout(env)
        windows = env.services.windows
        paused = PausedOnce(windows.deferrals)
        windows.deferrals = paused
        deletion = asyncio.ensure_future(open_now(env, "delete", task.rack_id))
        async with asyncio.timeout(60):
            await paused.paused.wait()
        with caller("oncall"):
            cancel = asyncio.ensure_future(env.services.rollouts.cancel(run_id))
        await done_or_waiting_on_a_lock(env, cancel)
        paused.go.set()
        await asyncio.wait_for(deletion, 60)
        report = await asyncio.wait_for(cancel, 60)

        assert report.run.state == "cancelled"
        ended = await get(env, task.id)
        assert (ended.status, ended.message) == (TaskStatus.TERMINATED, "its rollout was cancelled by oncall")
        env.clock.advance(timedelta(minutes=10))
        assert await rollout_claim(env) == [], "a rack of the cancelled rollout started"
        assert await outcome_of(env, schedule, task) == ("not_started", "its rollout was cancelled by oncall")
    finally:
        await db.dispose()


class _ClaimLost(Exception):
    """The claim's instance lost its connection: its transaction rolls back."""


@pytest.mark.postgres
async def test_a_window_change_letting_go_of_a_task_its_rollout_s_cancel_skipped_ends_it(pg_db: str) -> None:
    """A claim took r1's task in its window's opening as the rollout was cancelled: the cancel skipped it
    (it waits on no claim), and that claim never committed (its instance lost its connection), so the
    task is still PENDING, held by its window, of a cancelled rollout; its next claim's rollout gate would
    end it. The window's deletion lets it go: its rollout's gate holds it instead, and ends it at the next
    claim, its rack not started, rather than that claim start it after the cancel."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, run_id, task = await deferred_in_a_rollout(env)
        env.clock.advance(TOMORROW_2AM + timedelta(minutes=30) - env.clock.now())  # in its opening
        with pytest.raises(_ClaimLost):
            async with env.db.transaction() as claiming:
                await claiming.execute(select(tasks.c.id).where(tasks.c.id == task.id).with_for_update())
                with caller("oncall"):
                    report = await env.services.rollouts.cancel(run_id)
                raise _ClaimLost
        assert "1 task(s) an executor was claiming left to its start gate" in report.run.reason
        assert await get(env, task.id) == task

        changes = await open_now(env, "delete", task.rack_id)

        held = await get(env, task.id)
        assert (held.status, held.held_by, held.held_reason, held.not_before) == (
            TaskStatus.PENDING,
            "rollout",
            CANCELLED_REASON,
            env.clock.now(),
        )
        assert [(c["deferred_task"], c.get("held_by")) for c in changes.recorded] == [("released", "rollout")]
        gated = await claim_gated(env)
        assert gated.failed == {task.id: ENDED_BY_THE_GATE}
        assert await outcome_of(env, schedule, task) == ("not_started", CANCELLED_REASON)
    finally:
        await db.dispose()
