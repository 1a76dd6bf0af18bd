"""The tasks a dispatched firing bound to its windows, decided again when a maintenance window changes.

A dispatched firing under the DEFER window policy submits a closed rack's task held until the opening the
windows had then (`held_by` "window": `domain.firing.window_decisions`); under either policy, a task fired
while an ALLOW window holds its rack must start by that window's end (`not_after`). When an operator creates,
edits or deletes a window, the tasks of dispatched firings that have not started are decided again, in the
same transaction, by the rule a firing at that moment follows under their schedule's window policy
(`domain.firing.redeferral`): those bound so, and those no window binds (fired where none covered their
rack, or released by a change before: a deleted window), which a new or widened ALLOW window binds again,
and a new freeze ends under SKIP or defers under DEFER, as it would a firing now (so a task released by
a deletion is not left to start whenever once an ALLOW window covers its rack again);
under the start deadline their firing bound them to (their outcome's `start_by`; for a task its plain
firing's write-back has not recorded yet, its run's slot plus its schedule's deadline, as the planner
found it: `domain.firing.slot_deadline`). "Not started" is whatever else holds them: PENDING and held by
nothing, by their window, or by another start gate (a freeze, a budget, pre-flight checks, a rollout);
WAITING in their rack's queue; or a retry's next attempt waiting out its back-off
(`store.tasks._not_started`).
Were one of them left bound to the end it had, a shortened window would let it start on its rack after
the window the operator now allows (once the gate, the queue or the back-off let it go):

* "defer": they wait for the new opening (`not_before`, `not_after` and their reason rewritten: moved; the
  window's hold replaces another gate's, which the claim at the opening asks again);
* "fire": no window closes the rack now: released (`not_before` cleared, or their operation's own window's
  start), to start by the end of the ALLOW window they are in, as a firing's task must, and by the start
  deadline, which capped their wait (so another gate holding them cannot start them after it: `_within`);
  a task that waited for nothing is "rebound" to that end (or to none), and by the deadline too if its
  end was already within it; so is one another gate holds, its hold kept (only `not_after` is written);
* "skip_window" (closed under SKIP, or no opening left) or "missed" (the opening comes at or after the
  start deadline): ended,
  TERMINATED with the reason, and their scope's outcome in the run says what the windows settled, as the
  firing would have recorded it (a rollout counts the rack skipped, not failed).

A retry's next attempt is neither moved nor ended (its task ran, and its scope was submitted; the executor
never defers an attempt to a later opening either): "fire" rebinds it, its back-off kept; otherwise the
windows close its rack now, and it is bound to now and due at once, so that its next claim fails it as a
too-late attempt ("the maintenance window ended at … before attempt N could run", `Task.too_late`).

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
(`Task.too_late`). What changed is noted on the call's audit event (`audit.changes.note_deferral_changes`);
what a decision made outside any call changed (an executor's look again, a firing's submit deciding what
it owes) is written in its own transaction, an event per task (`audit.decisions`).

A firing decides its tasks' waits and ends in its claim (phase 1, `rackflow.schedules.firing`), from the
windows as read then, and inserts them in its submit (phase 2, another transaction): a change committed
between the two would not find them. So the submit takes the edits' turn in its shared form, first in its
transaction (`store.windows.beside_edits`), and reads the windows again: a change under way commits before
that read, one after it waits for the submit to commit and decides its tasks as any others; and if the
windows it reads are not those its plan was made from, it records its tasks owed a decision in its
transaction (`store.decisions_owed`: no claim takes them meanwhile), which its instance makes once it
committed (`decide_submitted`, as `_again`; should it fail or die, the executors' look again). A rollout's
step reads the windows and inserts its wave's tasks in one transaction, and takes the same shared turn
first in it (`rackflow.rollouts.service`): it reads the windows as the change before it left them, and a
change after it waits for it and decides its tasks; nothing is owed.

A task whose row another transaction holds is skipped (below), and decided again once the change
committed (`Deferrals._again`). The claim checks only the `not_after` stored on the row it takes
(`Executor._prepare`, `Task.too_late`), not the windows: so a claim that held the row while the change
was written starts the task with the end it read (it came first: the task began inside the window as it
was), or its gates hand it back held, bound to that end, and the decision after the claim committed binds
it to the new one before it can be claimed again. That decision is owed: the change records the tasks
it skipped in its transaction (`store.decisions_owed`), and the transaction that decides one deletes its
record. The instance that made the change decides them once it committed (`_again`, which alone waits
for the claim to let go of the row); should it die first, or that decision fail (the database lost:
logged, never raised, for the call succeeded once the change committed), every executor decides those
still owed (`look_again`): when it starts, before its first claim, and at its dead-hold cadence (every
lease period), skipping a task a claim holds again until its next look. The backstop costs one read of
the table's primary key per look when nothing is owed (about four statements a minute per executor at
the default 15 s lease), and writes nothing then. Until it is decided, no claim takes a task owed a
decision (`store.task_runs.pick`), even once the hold its gate gave it has ended: it waits, at most about
a lease period after a crash, rather than start by the old end.
A record names the task, not the windows to decide it by: its decision reads the windows as they are (the
change's window as it was may be gone), and the change found it covered, so it is decided again whatever
covers it now. It also keeps what made it owed, for the audit alone (the change's window, kind and call,
`audit.decisions.owed_by_change`; a submit's, `owed_by_submit`): the decision's own event names it, so
that an operator finds the edit that caused it. The table has no foreign key, whose check would lock the
task's row, which the claim holds at that very moment.

Lock order (the design note atop `rackflow.tasks.executor`). The change's transaction takes, in this
order: its turn (`store.windows.edits_in_turn`, which only window changes take, and a firing's submit and
a rollout's step in its shared form, each first in its transaction: a step before its runs' rows); the rows
of the runs of
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
for. The skipped rows are decided again after the change committed, each waited for first in a
transaction that holds nothing else (`store.tasks.wait_for_row`), then in a transaction of their own taken
in this order (the turn, their runs, their racks, their rows, skipping any held again), which deletes
their records (no row lock); an executor's look again decides them in such a transaction, without
waiting for their rows.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import case, func, literal
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit import decisions as audit
from rackflow.audit.changes import note_deferral_changes
from rackflow.domain.firing import SETTLED_BY_WINDOWS, checks_scopes, redeferral
from rackflow.domain.schedules import Outcome
from rackflow.domain.tasks import WINDOW_HOLD, DeferralChange, Task
from rackflow.domain.window_rules import Decision
from rackflow.domain.windows import MaintenanceWindow, RackRef, WindowPolicy
from rackflow.store import decisions_owed as owed_store
from rackflow.store import rollouts as run_store
from rackflow.store import schedules as schedule_store
from rackflow.store import tasks as store
from rackflow.store import windows as window_store
from rackflow.store.db import in_id_order
from rackflow.store.tables import tasks
from rackflow.store.types import UTCDateTime
from rackflow.tasks.manager import Ended, Promotion, TaskManager, window_wait

log = logging.getLogger(__name__)

# How many owed tasks an executor's look again decides at once (`Deferrals.look_again`): a change skips
# only the tasks claims held at that instant, so one look normally finds none, and seldom more than this.
OWED_BATCH = 100

# What holds again, in the caller's transaction, the tasks that nothing holds and that have not begun of
# the runs given (locked, with their state) that are halted or cancelled rollouts: `rollouts.gate`'s
# `hold_stopped` (above this layer); which tasks it held, and by whom.
HoldStopped = Callable[
    [AsyncConnection, Mapping[uuid.UUID, run_store.LockedRun], datetime], Awaitable[Mapping[uuid.UUID, str]]
]


class _Rewrite(NamedTuple):
    """What a window's change writes on a task it does not end, and how the audit names it (`change`):
    its wait for its window, written whole (`_wait_values`); or, for a task something else holds (another
    start gate, its retry's back-off) that it neither moves nor releases, only its end (`keeps_hold`: that
    hold stays), and its hold's end too when given (`not_before`: a retry's next attempt due at once)."""

    change: str
    not_before: datetime | None
    not_after: datetime | None
    message: str
    waits: bool
    keeps_hold: bool

    def unchanged(self, task: Task) -> bool:
        if self.keeps_hold:
            return self.not_after == task.not_after and self.not_before in (None, task.not_before)
        # (its words alone, a rename, are kept)
        return (self.not_before, self.not_after, self.waits) == (
            task.not_before,
            task.not_after,
            _waits(task),
        )

    @property
    def due_now(self) -> bool:
        """Whether an executor should look at once: the task may start (released), or a retry's next
        attempt the windows close now is due to fail."""
        return self.change == "released" or (self.keeps_hold and self.not_before is not None)

    def values(self, now: datetime) -> dict[str, Any]:
        if not self.keeps_hold:
            return _wait_values(self.not_before, self.not_after, self.message, self.waits, now)
        values: dict[str, Any] = {"not_after": self.not_after, "updated_at": now}
        if self.not_before is not None:
            values["not_before"] = self.not_before
        return values


@dataclass(frozen=True)
class _Decided:
    """What one transaction's decisions did: the tasks it ended (with their racks' promotions), what the
    audit notes, whether an executor should look now, and the tasks it decided but skipped (another
    transaction held their rows: `unclaimed`), to be decided again once that transaction ended."""

    ended: Ended
    changes: list[DeferralChange]
    wake: bool
    skipped: frozenset[uuid.UUID]


_NOTHING_DECIDED = _Decided(Ended((), Promotion([], 0)), [], False, frozenset())


async def _nothing_to_write() -> None:
    """The change's write, already committed when its skipped tasks are decided again."""


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
        tasks.decide_owed = self.decide_submitted

    async def decide_submitted(self, task_ids: Collection[uuid.UUID]) -> None:
        """Decide the tasks a firing's submit recorded as owed a decision, once it committed: the windows
        changed between its plan and its submit (`rackflow.schedules.firing`): in one transaction, as
        `_decide_owed` decides them (no claim takes a task owed a decision, so none is normally held), then
        any held as `_again` decides those a change skipped; should it fail, they stay owed, for the
        executors' look again (logged, never raised: the firing submitted them)."""
        try:
            _, skipped = await self._decide_owed(frozenset(task_ids), audit.SUBMIT)
            await self._again(skipped, audit.SUBMIT)
        except Exception:
            log.warning(
                "deciding the task(s) %s a firing submitted after a window changed failed; they stay owed, "
                "for the executors' look again",
                ", ".join(str(task_id) for task_id in in_id_order(task_ids)),
                exc_info=True,
            )

    async def redecide_in(
        self,
        conn: AsyncConnection,
        changed: Sequence[MaintenanceWindow],
        now: datetime,
        write: Callable[[], Awaitable[object]],
        change: str,
    ) -> Callable[[], Awaitable[None]]:
        """Decide again, in the caller's transaction, the waits and ends of the tasks their windows bind on
        racks `changed` (the window as it was unless created, and as it is unless deleted) covers, once
        their runs and racks are locked and the change written (`write`, the caller's: the window created,
        updated or deleted, which `change` names: `domain.audit.WINDOW_CREATED`, …), in the module's lock
        order; returns what to do once the transaction committed (count the ended tasks, wake the
        executors, note the audit, and decide again the tasks it skipped, once their rows are free:
        `_again`). The tasks it skipped are recorded owed, with the change as their cause (made only then)."""
        named = {rack_id for window in changed for rack_id, _ in window.racks}
        decided = await self._decide(conn, changed, now, named, write)
        if decided.skipped:
            cause = audit.owed_by_change(change, changed[-1])
            await owed_store.owe(conn, dict.fromkeys(decided.skipped, cause), now)

        async def once_committed() -> None:
            # The change committed: whatever fails now is the backstop's to finish, not the caller's error.
            try:
                self._after(decided)
                await self._again(decided.skipped, audit.CHANGE)
            except Exception:
                log.warning(
                    "window %s changed, but deciding again the task(s) %s it skipped failed; they stay owed, "
                    "for the executors' look again",
                    ", ".join(dict.fromkeys(str(window.id) for window in changed)),  # (as it was and is)
                    ", ".join(str(task_id) for task_id in in_id_order(decided.skipped)),
                    exc_info=True,
                )

        return once_committed

    async def look_again(self) -> int:
        """Decide the tasks owed a decision (`store.decisions_owed`: a change skipped them, and its
        instance did not live, or failed, to decide them once it committed), up to `OWED_BATCH` of them;
        how many it decided. Every executor runs it at its dead-hold cadence, from its start
        (`Executor._look_again`); with nothing owed it costs one read of an empty primary key, and writes
        nothing. A task a claim holds again is skipped, and stays owed for the next look: it does not wait
        for the row (the executor's own claims may be the ones holding it)."""
        async with self.tasks.db.read() as conn:
            owed = frozenset(await owed_store.owed(conn, OWED_BATCH))
        if not owed:
            return 0
        decided, left = await self._decide_owed(owed, audit.LOOK_AGAIN)
        if left:
            log.info(
                "%d task(s) owed a decision by a window's change are held by a claim: next look", len(left)
            )
        return decided

    async def _again(self, skipped: frozenset[uuid.UUID], decided_by: str) -> None:
        """Decide again the tasks a committed change skipped, because another transaction held their rows
        (a claim's, whose start gates may hand them back held, bound to the end they had; a gate's write):
        once each row is free (`store.tasks.wait_for_row`, a transaction that holds nothing else), in a
        transaction of its own (`_decide_owed`), and so on until none is skipped again. A task that started
        meanwhile is no longer bound, and is left as it is."""
        while skipped:
            for task_id in in_id_order(skipped):
                await store.wait_for_row(self.tasks.db, task_id)
            _, skipped = await self._decide_owed(skipped, decided_by)

    async def _decide_owed(
        self, owed: frozenset[uuid.UUID], decided_by: str
    ) -> tuple[int, frozenset[uuid.UUID]]:
        """Decide these tasks, owed a decision when the caller read them, in a transaction of their own in
        the change's lock order (its turn, the runs, the racks, then the rows, skipping those held again):
        those still owed once it has the turn (`store.decisions_owed.recorded`: another transaction may have
        decided one first, and a task decided is not decided twice), which it records owed no more
        (`settle`) but those it skipped, and, made outside any audited call (`decided_by` an executor's
        look again, say), what it decided in the audit trail, each with what made it owed, as its record
        kept it (`audit.decisions`: no call's event would name them); returns how many it settled, and
        those it skipped."""
        async with self.tasks.db.transaction() as conn:
            await window_store.edits_in_turn(conn)
            records = await owed_store.recorded(conn, owed)
            if not records:
                return 0, frozenset()
            now = self.tasks.clock.now()
            decided = await self._decide(conn, (), now, set(), _nothing_to_write, only=frozenset(records))
            settled = records.keys() - decided.skipped
            await owed_store.settle(conn, settled)
            await audit.record_deferral_decisions(conn, decided.changes, now, decided_by, records)
        self._after(decided)
        return len(settled), decided.skipped

    def _after(self, decided: _Decided) -> None:
        """Once the decisions committed: count the ended tasks, wake the executors for the tasks that may
        start (or fail) now, note the audit."""
        self.tasks.after_ended(decided.ended)
        if decided.wake:
            self.tasks.wake_executors()
        note_deferral_changes(decided.changes)

    async def _decide(
        self,
        conn: AsyncConnection,
        changed: Sequence[MaintenanceWindow],
        now: datetime,
        named: set[uuid.UUID],
        write: Callable[[], Awaitable[object]],
        only: frozenset[uuid.UUID] | None = None,
    ) -> _Decided:
        """`redecide_in`'s decisions, in the caller's transaction: lock the runs of the tasks bound on racks
        `changed` covers (or of `only`, when given: tasks owed a decision), then their racks and `named`
        (the racks the window's write checks), `write`, then decide and write each task, skipping the rows
        another transaction holds."""
        waiting, policies, racks = await self._waiting(conn, changed, now, only)
        runs = await run_store.lock_runs(conn, {task.run_id for task in waiting if task.run_id})
        await store.lock_racks(self.tasks.db, conn, named | {task.rack_id for task in waiting})
        await write()
        if not waiting:
            return _NOTHING_DECIDED
        windows = await window_store.all_windows(conn)
        deadlines = await schedule_store.start_deadlines(conn, {t.run_id for t in waiting if t.run_id})
        rewrites: dict[_Rewrite, list[Task]] = {}
        ending: list[tuple[Task, str, Outcome]] = []
        decisions: dict[uuid.UUID, Decision] = {}
        for task in waiting:
            assert task.run_id is not None
            rack = racks[task.rack_id]
            deadline = deadlines.of(task.id, task.run_id, self.default_start_deadline)
            decision = decisions[task.id] = redeferral(
                windows, rack, task.operation, now, deadline, policies[task.id], _within(task, deadline)
            )
            if task.attempt == 1 and decision.action in SETTLED_BY_WINDOWS:
                ending.append((task, decision.reason, SETTLED_BY_WINDOWS[decision.action]))
                continue
            rewrite = _rewrite(task, decision, now)
            if not rewrite.unchanged(task):
                rewrites.setdefault(rewrite, []).append(task)
        changes: list[DeferralChange] = []
        ended = await self.tasks.end_deferred_in(conn, [(task, reason) for task, reason, _ in ending])
        gone = set(ended.task_ids)
        if gone:
            settled: dict[uuid.UUID, dict[uuid.UUID, tuple[Outcome, str]]] = {}
            for task, reason, outcome in ending:
                if task.id in gone and task.run_id is not None:
                    settled.setdefault(task.run_id, {})[task.id] = (outcome, reason)
                    changes.append(_change(task, "ended", decisions[task.id], outcome=outcome))
            await run_store.settle_scopes(conn, settled)
        written: list[tuple[Task, _Rewrite]] = []
        for rewrite, tasks_of in rewrites.items():
            ids = set(await store.rewait(conn, [t.id for t in tasks_of], rewrite.values(now)))
            written += [(t, rewrite) for t in tasks_of if t.id in ids]
        # Those it let go (released or rebound: held by nothing now) may be of a rollout that halted or was
        # cancelled: the rollout's gate holds them instead, as the run was when its row was locked.
        let_go = {t.run_id for t, r in written if r.change != "moved" and not r.keeps_hold and t.run_id}
        held = await self.hold_stopped(conn, {i: run for i, run in runs.items() if i in let_go}, now)
        changes += [
            _change(t, r.change, decisions[t.id], r.not_before, r.not_after, held_by=held.get(t.id, ""))
            for t, r in written
        ]
        decided = {t.id for t, _, _ in ending} | {t.id for tasks_of in rewrites.values() for t in tasks_of}
        wake = any(r.due_now for _, r in written)
        return _Decided(ended, changes, wake, frozenset(decided - gone - {t.id for t, _ in written}))

    @staticmethod
    async def _waiting(
        conn: AsyncConnection,
        changed: Sequence[MaintenanceWindow],
        now: datetime,
        only: frozenset[uuid.UUID] | None,
    ) -> tuple[list[Task], dict[uuid.UUID, WindowPolicy], dict[uuid.UUID, RackRef]]:
        """The tasks of dispatched firings (a manual one obeys no ALLOW window) that have not started,
        whatever holds them, on racks `changed` covers for their operation, whose wait is not over (of
        `only`, when given): those waiting for an opening under DEFER (under SKIP a task waits only for
        its own window), those bound to start by an end (fired inside an ALLOW window, or within their
        own), and those no window binds (a firing now may bind them: the module's docstring); read by
        their racks' live tasks (`ix_tasks_rack_id_status`), or, for a window over domains or every rack,
        the fleet's live tasks, never its history; their schedules' window policies, by task id; and their
        racks. Of `only`, when given, whatever covers them now: tasks a change skipped, when `changed`
        covered them (its window as it was may be gone), to be decided as the windows now are."""
        named = None  # the racks the windows name, when that is all they cover
        if not any(w.all_racks or w.domains for w in changed):
            named = {rack_id for w in changed for rack_id, _ in w.racks}
        found = [
            d
            for d in await store.deferred_tasks(conn, named, only)
            if checks_scopes(d.trigger)
            and (d.window_policy is WindowPolicy.DEFER or not _waits(d.task))
            and not d.task.too_late(now)
        ]
        racks = await window_store.rack_refs(conn, {d.task.rack_id for d in found})
        covered = [
            d
            for d in found
            if d.task.rack_id in racks
            and (
                only is not None
                or any(w.covers(racks[d.task.rack_id], d.task.operation.kind) for w in changed)
            )
        ]
        return [d.task for d in covered], {d.task.id: d.window_policy for d in covered}, racks


def _rewrite(task: Task, decision: Decision, now: datetime) -> _Rewrite:
    """What becomes of a task the windows do not end (`redeferral`'s `decision` for it):

    * a retry's next attempt (the task ran; as the executor, a change never defers one to a later
      opening, nor settles its scope): bound to the end of the ALLOW window it is in now ("fire"), or,
      closed now, to now, and due at once, so that its next claim fails it ("… before attempt N could
      run") rather than its back-off keep its rack;
    * one another start gate holds that may start now: bound to the new end, that gate's hold kept;
    * else its wait for its window, as a firing now would give it: moved (which replaces another gate's
      hold: the claim at its opening asks every gate again), released, or rebound."""
    retry = task.attempt > 1
    if retry and decision.action != "fire":
        return _Rewrite("rebound", now, now, "", False, keeps_hold=True)
    wait = window_wait(task.operation, decision.reason, decision.opens_at, decision.closes_at, now)
    if retry or (task.held_by not in (None, WINDOW_HOLD) and not wait.waits):
        return _Rewrite("rebound", None, wait.not_after, "", False, keeps_hold=True)
    change = _what_changed(task, wait.waits)
    return _Rewrite(change, wait.not_before, wait.not_after, wait.message, wait.waits, keeps_hold=False)


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
    """The columns of a task's new wait: held by "window" since its hold for its window began while it
    still waits (since now, for one another gate held), else not held (as a firing's task that need not
    wait)."""
    since = literal(now, UTCDateTime())
    held = {
        "held_by": WINDOW_HOLD,
        "held_reason": message,
        "held_since": case(
            (tasks.c.held_by == WINDOW_HOLD, func.coalesce(tasks.c.held_since, since)), else_=since
        ),
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
    decision: Decision,
    not_before: datetime | None = None,
    not_after: datetime | None = None,
    outcome: str = "",
    held_by: str = "",
) -> DeferralChange:
    """What the audit says became of `task` (`decision`, the windows' for it, names the window that closes
    its rack now, if one does)."""
    assert task.run_id is not None
    closed = decision.closed
    return DeferralChange(
        task.id,
        task.run_id,
        task.rack_id,
        change,
        not_before,
        not_after,
        outcome,
        held_by,
        window_id=closed.window.id if closed is not None else None,
        reason=decision.reason,
    )
