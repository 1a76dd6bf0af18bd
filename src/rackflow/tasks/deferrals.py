"""The tasks a dispatched firing bound to its windows, decided again when a maintenance window changes.

A dispatched firing under the DEFER window policy submits a closed rack's task held until the opening the
windows had then (`held_by` "window": `domain.firing.window_decisions`); under either policy, a task fired
while an ALLOW window holds its rack must start by that window's end (`not_after`). When an operator creates,
edits or deletes a window, those tasks that have not started are decided again, in the same transaction, by
the rule a firing at that moment follows under their schedule's window policy (`domain.firing.redeferral`),
under the start deadline their firing bound them to (their outcome's `start_by`; for a task its plain
firing's write-back has not recorded yet, its run's slot plus its schedule's deadline, as the planner
found it: `domain.firing.slot_deadline`):

* "defer": they wait for the new opening (`not_before`, `not_after` and their reason rewritten: moved);
* "fire": no window closes the rack now: released (`not_before` cleared, or their operation's own window's
  start), to start by the end of the ALLOW window they are in, as a firing's task must, and by the start
  deadline, which capped their wait (so another gate holding them cannot start them after it: `_within`);
  a task that waited for nothing is "rebound" to that end (or to none), and by the deadline too if its
  end was already within it;
* "skip_window" (closed under SKIP, or no opening left) or "missed" (the opening comes at or after the
  start deadline): ended,
  TERMINATED with the reason, and their scope's outcome in the run says what the windows settled, as the
  firing would have recorded it (a rollout counts the rack skipped, not failed).

A task of a rollout that halted or was cancelled is not let go to start: its window held it when the halt
held the run's other tasks (`store.rollouts.hold_unstarted` leaves a held task's hold), so it would come
before the rollout's start gate when its opening came; released or rebound (held by nothing), the next
claim would start it without asking that gate, which looks only at tasks something held. So those of a
halted or cancelled rollout are held by the rollout's gate in the same transaction, under their runs'
locks (`rollouts.gate.hold_stopped`, what the halt does: a resume releases them, and a cancelled run's
gate ends them at the next claim, their racks "not_started"); the audit notes them released, `held_by`
"rollout". Locking the run orders the change with a halt or a cancel beside it: a halt or cancel that
came first is seen, and one that comes after waits for the run's row (a step skips it until it is free),
then finds the task as the change left it, rather than skip it as a task a claim holds.

Only the tasks on racks the window covered, before or after the change, for their operation are decided
again: no other task's opening changed. A task whose wait is over is left to the executor, which fails it
(`Task.too_late`), and one a claim holds to that claim (its opening came: it starts). What changed is
noted on the call's audit event (`audit.changes.note_deferral_changes`).

Lock order (the design note atop `rackflow.tasks.executor`). The change's transaction takes, in this
order: its turn (`store.windows.edits_in_turn`, which only window changes take); the rows of the runs of
every task it decides again (in id order: it decides from the windows as written, so before the write it
cannot tell which it will end or let go); the rows of their racks and of the racks the window names (in
id order, at once, `FOR NO KEY UPDATE`: `store.tasks.lock_racks`), before it writes the window (`write`),
whose links check their racks' keys (`FOR KEY SHARE`) on racks it holds already; and task rows last,
skipping those another transaction holds (`store.tasks.lock_deferred`, `rewait`,
`store.rollouts.hold_unstarted`; the freeze holds the caller lets go, `store.task_runs.release_unclaimed`).
It waits for a task's row only to promote a rack's queue under that rack's lock, as every promotion does
(never a task a claim holds: a claim takes PENDING tasks, a promotion WAITING ones); a task row it writes
twice checks its rack's key again, on a rack it holds. That is a rollout cancel's order (a run's row, then
its racks', then task rows, skipping those held), after the turn and with the window's write between the
racks and the tasks. An executor's round, which may hold racks this change waits for (those of the
tasks it ends), waits for no run's row (its rollout gate skips a held run) and no rack's `FOR NO KEY
UPDATE` (the key checks of its writes do not conflict with it); CancelTask, which
waits for its task's row while it holds its rack's, holds no run; DeleteRack, which locks its rack whole
(`FOR UPDATE`) and writes the rows of its tasks' runs, locks those runs before the rack
(`InventoryService.delete_rack`); and a claim's task row this change would need is skipped, not waited
for.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, literal
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit.changes import note_deferral_changes
from rackflow.domain.firing import SETTLED_BY_WINDOWS, checks_scopes, redeferral
from rackflow.domain.schedules import Outcome
from rackflow.domain.tasks import WINDOW_HOLD, DeferralChange, Task
from rackflow.domain.windows import MaintenanceWindow, RackRef, WindowPolicy
from rackflow.store import rollouts as run_store
from rackflow.store import schedules as schedule_store
from rackflow.store import tasks as store
from rackflow.store import windows as window_store
from rackflow.store.tables import tasks
from rackflow.store.types import UTCDateTime
from rackflow.tasks.manager import TaskManager, window_wait

# What holds again, in the caller's transaction, the tasks that nothing holds and that have not begun of
# the runs given (locked, with their state) that are halted or cancelled rollouts: `rollouts.gate`'s
# `hold_stopped` (above this layer); which tasks it held, and by whom.
HoldStopped = Callable[
    [AsyncConnection, Mapping[uuid.UUID, run_store.LockedRun], datetime], Awaitable[Mapping[uuid.UUID, str]]
]


class Deferrals:
    """Decides again the waits of the tasks a window deferred (the module's docstring)."""

    def __init__(
        self, tasks: TaskManager, default_start_deadline: timedelta | None, hold_stopped: HoldStopped
    ) -> None:
        """`default_start_deadline`: the server's, for a schedule without its own (as the planner's);
        `hold_stopped`: the rollouts' (`rollouts.gate.hold_stopped`)."""
        self.tasks = tasks
        self.default_start_deadline = default_start_deadline
        self.hold_stopped = hold_stopped

    async def redecide_in(
        self,
        conn: AsyncConnection,
        changed: Sequence[MaintenanceWindow],
        now: datetime,
        write: Callable[[], Awaitable[object]],
    ) -> Callable[[], None]:
        """Decide again, in the caller's transaction, the waits and ends of the tasks their windows bind on
        racks `changed` (the window as it was unless created, and as it is unless deleted) covers, once
        their runs and racks are locked and the change written (`write`, the caller's: the window created,
        updated or deleted), in the module's lock order; returns what to do once the transaction committed
        (count the ended tasks, wake the executors, note the audit)."""
        waiting, policies, racks = await self._waiting(conn, changed, now)
        runs = await run_store.lock_runs(conn, {task.run_id for task in waiting if task.run_id})
        named = {rack_id for window in changed for rack_id, _ in window.racks}
        await store.lock_racks(self.tasks.db, conn, named | {task.rack_id for task in waiting})
        await write()
        if not waiting:
            return lambda: None
        windows = await window_store.all_windows(conn)
        deadlines = await schedule_store.start_deadlines(conn, {t.run_id for t in waiting if t.run_id})
        moves: dict[tuple[Any, ...], list[Task]] = {}
        ending: list[tuple[Task, str, Outcome]] = []
        for task in waiting:
            assert task.run_id is not None
            rack = racks[task.rack_id]
            deadline = deadlines.of(task.id, task.run_id, self.default_start_deadline)
            decision = redeferral(
                windows, rack, task.operation, now, deadline, policies[task.id], _within(task, deadline)
            )
            if decision.action in SETTLED_BY_WINDOWS:
                ending.append((task, decision.reason, SETTLED_BY_WINDOWS[decision.action]))
                continue
            wait = window_wait(task.operation, decision.reason, decision.opens_at, decision.closes_at, now)
            now_bound = (task.not_before, task.not_after, _waits(task))
            if (wait.not_before, wait.not_after, wait.waits) != now_bound:
                moves.setdefault(tuple(wait), []).append(task)  # (its words alone, a rename, are kept)
        changes: list[DeferralChange] = []
        ended = await self.tasks.end_deferred_in(conn, [(task, reason) for task, reason, _ in ending])
        if ended.task_ids:
            gone = set(ended.task_ids)
            settled: dict[uuid.UUID, dict[uuid.UUID, tuple[Outcome, str]]] = {}
            for task, reason, outcome in ending:
                if task.id in gone and task.run_id is not None:
                    settled.setdefault(task.run_id, {})[task.id] = (outcome, reason)
                    changes.append(_change(task, "ended", outcome=outcome))
            await run_store.settle_scopes(conn, settled)
        written: list[tuple[Task, str, datetime | None, datetime | None]] = []
        for (not_before, not_after, message, waits), moved in moves.items():
            ids = set(
                await store.rewait(
                    conn, [t.id for t in moved], _wait_values(not_before, not_after, message, waits, now)
                )
            )
            written += [(t, _what_changed(t, waits), not_before, not_after) for t in moved if t.id in ids]
        # Those it let go (released or rebound: held by nothing now) may be of a rollout that halted or was
        # cancelled: the rollout's gate holds them instead, as the run was when its row was locked.
        let_go = {t.run_id for t, change, _, _ in written if change != "moved" and t.run_id is not None}
        held = await self.hold_stopped(conn, {i: run for i, run in runs.items() if i in let_go}, now)
        changes += [
            _change(t, change, not_before, not_after, held_by=held.get(t.id, ""))
            for t, change, not_before, not_after in written
        ]

        def once_committed() -> None:
            self.tasks.after_ended(ended)
            if any(change.change == "released" for change in changes):
                self.tasks.wake_executors()
            note_deferral_changes(changes)

        return once_committed

    @staticmethod
    async def _waiting(
        conn: AsyncConnection, changed: Sequence[MaintenanceWindow], now: datetime
    ) -> tuple[list[Task], dict[uuid.UUID, WindowPolicy], dict[uuid.UUID, RackRef]]:
        """The tasks of dispatched firings (a manual one obeys no ALLOW window) that their windows bind,
        on racks `changed` covers for their operation, whose wait is not over: those waiting for an
        opening under DEFER (under SKIP a task waits only for its own window), and those held by nothing
        that must start by an end (fired inside an ALLOW window, or within their own); their schedules'
        window policies, by task id; and their racks."""
        named = None  # the racks the windows name, when that is all they cover
        if not any(w.all_racks or w.domains for w in changed):
            named = {rack_id for w in changed for rack_id, _ in w.racks}
        found = [
            d
            for d in await store.deferred_tasks(conn, named)
            if checks_scopes(d.trigger)
            and (d.window_policy is WindowPolicy.DEFER or not _waits(d.task))
            and not d.task.too_late(now)
        ]
        racks = await window_store.rack_refs(conn, {d.task.rack_id for d in found})
        covered = [
            d
            for d in found
            if d.task.rack_id in racks
            and any(w.covers(racks[d.task.rack_id], d.task.operation.kind) for w in changed)
        ]
        return [d.task for d in covered], {d.task.id: d.window_policy for d in covered}, racks


def _waits(task: Task) -> bool:
    return task.held_by == WINDOW_HOLD


def _within(task: Task, deadline: datetime | None) -> bool:
    """Whether the task is bound by its start deadline (`redeferral`'s `within_deadline`): it waits (its
    wait capped at the deadline), or its end is at or before it (a task released before, whose end the
    deadline capped, keeps that cap at the next change)."""
    if _waits(task):
        return True
    return deadline is not None and task.not_after is not None and task.not_after <= deadline


def _what_changed(task: Task, waits: bool) -> str:
    """How the audit names a task's new wait: "moved" (it waits for an opening), "released" (it waited,
    and may start now), "rebound" (it waited for nothing, and must start by another end, or by none)."""
    if waits:
        return "moved"
    return "released" if _waits(task) else "rebound"


def _wait_values(
    not_before: datetime | None, not_after: datetime | None, message: str, waits: bool, now: datetime
) -> dict[str, Any]:
    """The columns of a task's new wait: held by "window" since its hold began while it still waits, else
    not held (as a firing's task that need not wait)."""
    held = {
        "held_by": WINDOW_HOLD,
        "held_reason": message,
        "held_since": func.coalesce(tasks.c.held_since, literal(now, UTCDateTime())),
    }
    none = {"held_by": None, "held_reason": None, "held_since": None}
    return {
        "not_before": not_before,
        "not_after": not_after,
        "message": message,
        "updated_at": now,
        **(held if waits else none),
    }


def _change(
    task: Task,
    change: str,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    outcome: str = "",
    held_by: str = "",
) -> DeferralChange:
    assert task.run_id is not None
    return DeferralChange(task.id, task.run_id, task.rack_id, change, not_before, not_after, outcome, held_by)
