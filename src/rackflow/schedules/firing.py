"""The whole life of a schedule firing, in order: claim (phase 1), submit (phase 2), write back (phase 3).

Every firing takes this path, whoever starts it: the dispatcher (`Dispatcher`, for due schedules), a
manual trigger (`ScheduleService.trigger`) and the tests. No transaction is held while the task manager
opens its own:

1. `claim` (the caller's transaction, which holds the schedule rows locked) is load -> plan -> write:
   `store.firing.load` reads the batch's snapshot (set-based: a query per chunk of the batch, never one per
   schedule), the pure planner (`rackflow.domain.firing.plan`) decides every scope (overlap, windows,
   rollout order, a live rollout) and each schedule's next time, and `store.firing.record` advances the
   schedules and records one run per firing. Once this commits, the tick is spent: whatever happens next,
   it is not fired again (at most once per tick). The database holds that too: a dispatched run is unique
   per (schedule, slot), so a second claim of one slot records nothing and fires nothing, whatever path it
   came by.
2. `fire` (one transaction for the batch) submits one task per scope left (`tasks.scheduled`), each
   carrying its run's id; a deferred scope's task is held (the task's typed hold) until its window opens,
   which the executor's claim and expiry honour. A scope that fails is recorded as "failed" with its
   reason; the other scopes still fire. It holds the batch's schedules undeleted until it commits, so a
   DeleteSchedule comes wholly before or after it: a firing whose schedule (and run) went since its claim
   submits nothing (`fire`). If the connection is lost (`Unavailable`), the transaction may
   have committed before the client heard: the outcome is unknown.
3. `fire` again (a new transaction, retried for WRITEBACK_DEADLINE_SECONDS): after an unknown outcome, look
   up which of the runs' tasks exist (by run id) and record those as "submitted"; then complete the runs
   with their outcomes, prune run history, and write each scope's new `last_task_id` (the SKIP overlap
   check reads it), in the lock order (`_write_back`). If it still fails, the tasks exist but the run stays
   "running" until the dispatcher's sweep marks it "interrupted".

A claim whose COMMIT goes unanswered (the connection lost, `Unavailable`) may have committed: its runs are
then "running", and no one but its caller would fire them. Its caller, the dispatcher or a manual trigger
alike, asks `committed` on a new connection which of its firings the database recorded, and takes phases 2
and 3 for those; a claim that did not commit recorded nothing.

A scope the plan settled (`Firing.decided`: "skipped_overlap", "skipped_window") is recorded with that
outcome and never submitted. A rollout's firing is recorded "rolling" in phase 1 with its scopes in rollout
order, and its scopes start in the rollout's steps (`RolloutService.advance`, the one entry point that
advances a rollout) instead of phases 2 and 3: `ScheduleService.fire`, which the dispatcher and a manual
trigger both call after claiming, takes its first step at once. While a schedule's previous rollout is
still rolling or halted, a dispatched firing is recorded as "skipped" with the reason and nothing more
happens, and a manual one is refused (the database holds one live rollout per schedule).

A firing of a schedule that needs approval is recorded "awaiting_approval" in phase 1 with its plan frozen
in its outcomes, and goes no further: `ScheduleService.fire` leaves it out. Once approved
(`schedules.approvals`), the firing the planner rebuilds from the frozen plan (`approved_firing`) takes
phases 2 and 3, or its rollout's steps, like any other.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import metrics
from rackflow.audit.decisions import owed_by_submit
from rackflow.clock import Clock
from rackflow.domain.approvals import Approver
from rackflow.domain.firing import Firing, RunResult, checks_scopes, plan
from rackflow.domain.schedules import Schedule, Scope, ScopeOutcome, Trigger
from rackflow.domain.tasks import Task
from rackflow.domain.windows import MaintenanceWindow
from rackflow.errors import FailedPrecondition, NotFound, RackflowError, Unavailable
from rackflow.notify import events
from rackflow.retry import Retry, retrying
from rackflow.store import decisions_owed as owed_store
from rackflow.store import dispatch, outbox
from rackflow.store import firing as firing_store
from rackflow.store import runs as run_history
from rackflow.store import schedules as store
from rackflow.store import windows as window_store
from rackflow.store.db import Database
from rackflow.tasks.manager import Submission, TaskManager
from rackflow.tasks.scheduled import scope_submission

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Phase 3 is retried with doubling delays (capped) until this deadline, so a database restart of a few
# seconds does not leave the run "running"; past it the dispatcher's sweep marks the run interrupted.
WRITEBACK_DEADLINE_SECONDS = 30.0
WRITEBACK_RETRY_DELAY_SECONDS = 0.2
WRITEBACK_MAX_DELAY_SECONDS = 2.0

# How long a claim or an approval in doubt is looked up (`look_up_in_doubt`) before its caller gives up: as
# long as a firing's write-back is retried, so a database restart of a few seconds loses nothing.
CLAIM_LOOKUP_RETRY = Retry(first_delay=0.2, max_delay=2.0, deadline=30.0)

# Fired firings are logged in INFO lines of up to this many, each firing named with its run and counts:
# one line per firing was a tenth of a draining dispatcher's CPU (docs/PERFORMANCE.md, issue 29), and at
# ~100 bytes a firing, a line stays under what log shippers keep whole (Docker splits lines past 16 KiB).
FIRINGS_PER_LOG_LINE = 50


# --- phase 1: claim ------------------------------------------------------------------------------


async def claim(
    db: Database,
    conn: AsyncConnection,
    schedules: Sequence[Schedule],
    *,
    trigger: Trigger,
    now: datetime,
    owner_id: uuid.UUID | None = None,
    approver: Approver | None = None,
    default_start_deadline: timedelta | None = None,
    scopes: Mapping[uuid.UUID, Sequence[Scope]] | None = None,
    request_id: str | None = None,
    paused: list[Firing] | None = None,
) -> list[Firing]:
    """Phase 1 for `schedules`, which the caller has locked in `conn`'s transaction; the firings to run.

    Every schedule is advanced as having fired at `now`. A dispatched firing is recorded for the slot it
    was due at (the schedule's `next_run_at`) and runs the overlap check and the windows; a manual one has
    no slot and fires every scope (the task manager's conflict rules still decide). A dispatched firing
    whose slot is recorded already, or that is skipped for a live rollout, is left out of the result. A
    manual firing of a schedule whose rollout is live is refused (FailedPrecondition naming the run) and
    records nothing. `owner_id` (the instance that fires it: dispatcher, trigger or retry) lets the sweep
    tell a dead owner's "running" run.
    A firing that needs approval is recorded awaiting it and returned (`Firing.needs_approval`: the caller
    fires none of those); `approver`: a manual trigger's caller who approves it as it fires.
    A dispatched firing past its start deadline (`default_start_deadline`: the server's, for a schedule
    without its own) is recorded "missed" (counted, and reported in the same transaction) and left out.
    `scopes` (by schedule) fires only those of the schedules' scopes (RetryTaskScheduleRun's racks).
    `request_id`: a manual firing's caller's, recorded with its run; a firing whose schedule has a run
    with it already is left out (the unique index of the two, `ScheduleService.trigger`).
    A dispatched firing past its operation's window (`Firing.pauses`) is recorded "skipped", left out, and
    pauses its schedule by rackflow in this transaction (`store.pause_by_rackflow`, the rollouts' pause),
    with one `schedule.paused` event; those that paused it are added to `paused`, for the caller to audit
    once this commits (`AuditTrail.record_rackflow_pause`).
    """
    if not schedules:
        return []
    snapshot = await firing_store.load(conn, schedules, trigger, scopes)
    planned = plan(snapshot, now, trigger, approver=approver, default_start_deadline=default_start_deadline)
    refused = next((f for f in planned if f.refused), None)
    if refused is not None:
        raise FailedPrecondition(
            f"id: schedule {refused.schedule.name!r} ({refused.schedule.id}) not fired: {refused.skipped}"
        )
    recorded = await firing_store.record(db, conn, planned, owner_id, request_id)
    awaiting = [f for f in planned if f.run_id in recorded and f.needs_approval]
    await outbox.record_events(conn, events.runs_awaiting_approval(awaiting, now))
    pausing = [f for f in planned if f.run_id in recorded and f.pauses]
    pausing = [f for f in pausing if await store.pause_by_rackflow(db, conn, f.schedule.id, f.skipped, now)]
    await outbox.record_events(conn, events.paused_window_ended(pausing, now))
    if paused is not None:
        paused.extend(pausing)
    paused_runs = {f.run_id for f in pausing}
    for f in planned:
        if f.run_id not in recorded:
            log.warning(
                "schedule %s: its %s was fired already; not firing it again",
                f.schedule.name,
                f"slot {f.scheduled_for}" if f.scheduled_for else f"request id {request_id}",
                extra={"schedule_id": str(f.schedule.id)},
            )
        elif f.missed:
            metrics.SCHEDULE_MISSED.inc()
            log.warning(
                "schedule %s: slot %s missed: %s",
                f.schedule.name,
                f.scheduled_for,
                f.missed_reason,
                extra={"schedule_id": str(f.schedule.id), "run_id": str(f.run_id)},
            )
        elif f.skipped:
            log.warning(
                "schedule %s: firing skipped%s: %s",
                f.schedule.name,
                " and schedule paused" if f.run_id in paused_runs else "",
                f.skipped,
                extra={"schedule_id": str(f.schedule.id), "run_id": str(f.run_id)},
            )
    missed = [f for f in planned if f.run_id in recorded and f.missed]
    await outbox.record_events(conn, events.runs_missed(missed, now))
    return [f for f in planned if f.run_id in recorded and not f.skipped and not f.missed]


async def committed(db: Database, claimed: Sequence[Firing]) -> list[Firing]:
    """The firings of a claim whose COMMIT went unanswered that the database recorded (all or none), asked
    once the claim's transaction is over (`dispatch.claimed_runs`, through `look_up_in_doubt`)."""
    schedule_ids = [f.schedule.id for f in claimed]
    run_ids = [f.run_id for f in claimed]
    recorded = await look_up_in_doubt(
        db, lambda conn: dispatch.claimed_runs(db, conn, schedule_ids, run_ids), "a claim"
    )
    return [f for f in claimed if f.run_id in recorded]


async def look_up_in_doubt(db: Database, read: Callable[[AsyncConnection], Awaitable[_T]], what: str) -> _T:
    """What a transaction whose COMMIT went unanswered (`what`: a claim, an approval) left: `read` on a new
    connection, in a transaction of its own, retried until CLAIM_LOOKUP_RETRY's deadline; past it, raises
    the last error (still in doubt). `read` first locks NOWAIT the rows that transaction held, so it answers
    only once that transaction is over, whatever the server made of the lost connection
    (`dispatch.claimed_runs` says how)."""

    async def look_up() -> _T:
        async with db.transaction() as conn:
            return await read(conn)

    return await retrying(look_up, CLAIM_LOOKUP_RETRY, what=f"look-up of {what} in doubt")


async def settle_in_doubt(lost: Unavailable, done: Awaitable[bool], *, not_done: str, unknown: str) -> None:
    """Return if a request whose COMMIT went unanswered (`lost`) committed, as its look-up (`done`) says,
    for its caller to go on as if the COMMIT had been answered: left alone, what it committed would wait
    for the sweep, and the client, told UNAVAILABLE, would try again what is done. Else raise Unavailable
    saying `not_done` (it did not commit) or, if the look-up cannot tell, `unknown` (which record to look
    at before trying again)."""
    try:
        recorded = await done
    except Exception as exc:
        raise Unavailable(f"{lost}; {unknown}") from exc
    if not recorded:
        raise Unavailable(f"{lost}; {not_done}") from lost


# --- phases 2 and 3: submit, write back ----------------------------------------------------------


class RunGone(NotFound):
    """A trigger's, a retry's or an approval's firing whose schedule was deleted, with its run, after its
    claim committed and before anything of it was submitted (`RunResult.deleted`), or, a rollout's, before
    its own first step where what another step started first cannot be told (`RunResult.untold`)."""

    @classmethod
    def of(cls, firing: Firing) -> RunGone:
        return cls(
            f"id: schedule {firing.schedule.name!r} ({firing.schedule.id}) was deleted, with run "
            f"{firing.run_id} that fired before it; nothing was submitted"
        )

    @classmethod
    def untold(cls, firing: Firing) -> RunGone:
        """Not "nothing was submitted": a rollout driver's step (this instance's or another's) may have
        taken the run's first step before the deletion, and its tasks go on, listed by their schedule."""
        schedule = firing.schedule
        return cls(
            f"id: schedule {schedule.name!r} ({schedule.id}) was deleted, with run {firing.run_id}, before "
            "this call's step of its rollout: a rollout driver's step may have started racks of it first; "
            f"their tasks go on (rackflow task list --schedule {schedule.id})"
        )


# A scope's outcome when its firing's schedule was deleted between the claim and the submit (`_submit_all`).
DELETED_SINCE_FIRED = "not submitted: its schedule was deleted since it fired"


async def fire(db: Database, tasks: TaskManager, clock: Clock, firings: Sequence[Firing]) -> list[RunResult]:
    """Phases 2 and 3 for claimed firings: one submit transaction, one write-back transaction.

    A refused scope (conflict, full queue, rack gone) fails alone and the others still fire. The task
    manager locks the batch's racks in id order, so concurrent batches on other instances cannot deadlock.
    A rollout's firing is left out: its result is its scopes as phase 1 recorded them, and its scopes
    start in its rollout steps (`RolloutService.advance`, which holds its run).

    Beside DeleteSchedule, a firing's submit comes wholly before or after it: the submit holds the
    schedules of the firings it submits undeleted until it commits (`_submit_all`). A firing whose
    schedule was deleted first (its run with it) submits nothing, alone: its result is `deleted`, its
    scopes "failed" saying so (DELETED_SINCE_FIRED), nothing of it is written back, and it is logged; the
    batch's other firings fire. A trigger, a retry or an approval answers it with RunGone
    (`ScheduleService.fire_one`).
    """
    by_run = {f.run_id: RunResult(f.run_id, f.rollout_outcomes) for f in firings if f.rolls_out}
    for f in firings:
        if f.rolls_out:
            metrics.FIRINGS.labels(f.trigger).inc()
    plain = await _fire_plain(db, tasks, clock, [f for f in firings if not f.rolls_out])
    by_run.update((r.run_id, r) for r in plain)
    return [by_run[f.run_id] for f in firings]


async def _fire_plain(
    db: Database, tasks: TaskManager, clock: Clock, firings: Sequence[Firing]
) -> list[RunResult]:
    if not firings:
        return []
    started = clock.now()
    submitted, outcome_unknown, owed, deleted = await _submit_all(db, tasks, firings)
    results = [
        RunResult(
            f.run_id,
            tuple(
                f.decided[scope.id] if scope.id in f.decided else submitted[(f.run_id, scope.id)]
                for scope in f.scopes
            ),
            deleted=f.run_id in deleted,
        )
        for f in firings
    ]
    if deleted:  # nothing of those to write back: their runs went with their schedules
        _log_deleted([f for f in firings if f.run_id in deleted])
    written = iter(
        await _write_back(
            db,
            [f for f in firings if f.run_id not in deleted],
            [r for r in results if not r.deleted],
            look_up_tasks=outcome_unknown,
        )
    )
    results = [r if r.deleted else next(written) for r in results]
    if outcome_unknown and any(r.task_ids for r in results):
        tasks.wake_executors()
    if owed and tasks.decide_owed is not None:
        await tasks.decide_owed(owed)
    elapsed = (clock.now() - started).total_seconds()
    # Counted per label value, not per firing: a `labels(…).inc()` took 11 µs at load 10 (issue 29).
    for trigger, count in Counter(f.trigger for f in firings).items():
        metrics.FIRINGS.labels(trigger).inc(count)
    for outcome, count in Counter(o.outcome for r in results for o in r.outcomes).items():
        metrics.SCOPE_OUTCOMES.labels(outcome).inc(count)
    for start in range(0, len(firings), FIRINGS_PER_LOG_LINE):
        end = start + FIRINGS_PER_LOG_LINE
        _log_firings(firings[start:end], results[start:end], elapsed)
    return results


async def _submit_all(
    db: Database, tasks: TaskManager, firings: Sequence[Firing]
) -> tuple[dict[tuple[uuid.UUID, uuid.UUID], ScopeOutcome], bool, list[uuid.UUID], set[uuid.UUID]]:
    """Phase 2: every eligible scope's outcome, keyed by (run id, scope id), whether the outcome of the
    submit transaction is unknown, the tasks it recorded as owed a window's decision (`_owed`), and the
    runs of the firings whose schedule was deleted since their claim (`_deleted`: none of their scopes
    submitted).

    All scopes go to the task manager in one transaction: it locks and reads their racks once and decides
    each scope as a request of its own, so a refused scope (conflict, full queue, rack gone) fails alone.
    If the transaction itself fails, every scope of the batch is "failed". Any error but `Unavailable`
    means nothing was committed: the database answered, or the error was raised before COMMIT. A lost
    connection may have been lost during COMMIT, after the database committed: then the outcome is unknown,
    and phase 3 looks up which tasks exist.

    The transaction holds the schedules of the firings it submits from before it submits until it
    commits (`_deleted`), after the windows' turn (taken first) and before the racks, as the lock order
    atop `rackflow.tasks.executor` has it.
    """
    jobs = [(f, scope) for f in firings for scope in f.to_submit]
    if not jobs:
        return {}, False, [], set()
    owed: list[uuid.UUID] = []
    deleted: set[uuid.UUID] = set()
    try:
        async with db.transaction() as conn:
            moved = await _windows_moved(conn, firings)
            deleted = await _deleted(conn, {f.run_id: f for f, _ in jobs}.values())  # each firing once
            if deleted:
                jobs = [(f, scope) for f, scope in jobs if f.run_id not in deleted]
            results = await tasks.submit_each_in(conn, [_submission(f, scope) for f, scope in jobs])
            causes = _owed(jobs, results, moved)
            await owed_store.owe(conn, causes, db.clock.now())
            owed = list(causes)
    except Exception as exc:
        outcome_unknown = isinstance(exc, Unavailable)
        if outcome_unknown:
            log.warning(
                "firing batch of %d scope(s): submit outcome unknown (%s); the write-back will look up "
                "which of its tasks were committed",
                len(jobs),
                exc,
            )
        else:
            log.warning("firing batch of %d scope(s) not submitted: %s", len(jobs), exc)
        error = f"not submitted: {exc}" if str(exc) else f"not submitted: {type(exc).__name__}"
        failed = {(f.run_id, sc.id): ScopeOutcome(sc.id, sc.rack_id, "failed", error=error) for f, sc in jobs}
        return failed | _not_submitted(firings, deleted), outcome_unknown, [], deleted
    tasks.wake_executors()
    outcomes = _not_submitted(firings, deleted)
    for (firing, scope), result in zip(jobs, results, strict=True):
        if isinstance(result, RackflowError):
            log.warning(
                "schedule %s: scope %s (rack %s) not submitted: %s",
                firing.schedule.id,
                scope.id,
                scope.rack_id,
                result,
            )
            outcomes[(firing.run_id, scope.id)] = ScopeOutcome(
                scope.id, scope.rack_id, "failed", error=str(result)
            )
        else:
            outcomes[(firing.run_id, scope.id)] = firing.submitted(scope.id, scope.rack_id, result[0].id)
    return outcomes, False, owed, deleted


async def _windows_moved(
    conn: AsyncConnection, firings: Sequence[Firing]
) -> dict[uuid.UUID, frozenset[uuid.UUID]]:
    """The runs of the dispatched firings (those that obey the windows) whose windows changed since their
    claim read them (`Firing.windows_read`), as the submit's transaction reads them, each with the ids of
    the windows that differ (created, changed or deleted since: what the audit names, `_owed`).

    A window's creation, edit or deletion decides again the tasks that exist (`tasks.deferrals`); one
    committed between the plan and the submit's insert would not find the firing's tasks, which would carry
    the decision made from the windows as they were (bound to a window's end the operator has since
    shortened). So the submit first takes the edits' turn in its shared form (`store.windows.beside_edits`,
    before any row lock, as an edit takes it): an edit under way commits before this read, and one that
    comes after waits for the submit to commit, and finds its tasks. Its cost when no window changed: that
    lock and one read of the windows per submit transaction (a batch), not per firing."""
    checked = [f for f in firings if checks_scopes(f.trigger)]
    if not checked:
        return {}
    await window_store.beside_edits(conn)
    windows = tuple(await window_store.all_windows(conn))
    # Compared once per set of windows a claim read (its firings share it), not once per firing.
    read = {id(f.windows_read): f.windows_read for f in checked}
    moved = {key: _differing(seen, windows) for key, seen in read.items() if seen != windows}
    return {f.run_id: moved[id(f.windows_read)] for f in checked if id(f.windows_read) in moved}


def _differing(
    before: Sequence[MaintenanceWindow], after: Sequence[MaintenanceWindow]
) -> frozenset[uuid.UUID]:
    """The ids of the windows in one of `before` and `after` and not the same in the other."""
    was, now = {w.id: w for w in before}, {w.id: w for w in after}
    return frozenset(i for i in was.keys() | now.keys() if was.get(i) != now.get(i))


async def _deleted(conn: AsyncConnection, firings: Collection[Firing]) -> set[uuid.UUID]:
    """Hold the firings' schedules undeleted until commit (`store.schedules.hold_schedules`: one statement
    a batch, not one a firing); the runs of the firings whose schedule is gone, deleted since their claim
    committed, with those runs.

    DeleteSchedule locks the schedule (`FOR UPDATE`) before it deletes it with its runs
    (`ScheduleService.delete`): it waits for this hold, and the firing's tasks are then a schedule's
    deleted after them, which go on as every such task does; or the hold waits for the deletion, and finds
    the schedule gone. The schedule alone is held, not the runs: a task names its run without a key on
    PostgreSQL (migration 0036), a run goes otherwise only by the run cap, which spares an open one
    (`store.runs.prune_runs`), or by the retention, which takes old ones; and holding the runs too (a
    statement more, reading the runs' partitions) cost three times as much a batch (docs/PERFORMANCE.md,
    "A firing's submit beside DeleteSchedule"). On SQLite, whose writers take turns, the read alone
    answers it.
    """
    held = await store.hold_schedules(conn, {f.schedule.id for f in firings})
    return {f.run_id for f in firings if f.schedule.id not in held}


def _not_submitted(
    firings: Sequence[Firing], deleted: Collection[uuid.UUID]
) -> dict[tuple[uuid.UUID, uuid.UUID], ScopeOutcome]:
    """The outcomes of the scopes of the firings whose schedule was deleted since their claim (`_deleted`)."""
    return {
        (f.run_id, sc.id): ScopeOutcome(sc.id, sc.rack_id, "failed", error=DELETED_SINCE_FIRED)
        for f in firings
        if f.run_id in deleted
        for sc in f.to_submit
    }


def _log_deleted(firings: Sequence[Firing]) -> None:
    for f in firings:
        log.warning(
            "schedule %s (%s): deleted, with run %s, since it fired; its %d scope(s) not submitted",
            f.schedule.name,
            f.schedule.id,
            f.run_id,
            len(f.to_submit),
            extra={"schedule_id": str(f.schedule.id), "run_id": str(f.run_id)},
        )


def _owed(
    jobs: Sequence[tuple[Firing, Scope]],
    results: Sequence[list[Task] | RackflowError],
    moved: Mapping[uuid.UUID, Collection[uuid.UUID]],
) -> dict[uuid.UUID, dict[str, Any]]:
    """The tasks submitted for firings whose windows changed since their plan (`_windows_moved`: by run,
    the windows that differ): owed a window's decision, recorded in the submit's transaction
    (`store.decisions_owed`), so that no claim takes one until it is decided as the windows now are
    (`TaskManager.decide_owed` once the submit committed; else the executors' look again); each with its
    cause, for the decision's audit event (`audit.decisions.owed_by_submit`)."""
    if not moved:
        return {}
    causes = {f.run_id: owed_by_submit(f.fired_at, moved[f.run_id]) for f, _ in jobs if f.run_id in moved}
    return {
        result[0].id: causes[firing.run_id]
        for (firing, _), result in zip(jobs, results, strict=True)
        if firing.run_id in moved and not isinstance(result, RackflowError)
    }


def _submission(firing: Firing, scope: Scope) -> Submission:
    return scope_submission(firing.schedule, scope, firing.fired_at, firing.run_id, firing.bound(scope.id))


async def _write_back(
    db: Database, firings: Sequence[Firing], results: Sequence[RunResult], *, look_up_tasks: bool
) -> list[RunResult]:
    """Phase 3, retried: the completed runs, run-history retention, and last_task_id per submitted scope.

    In the lock order atop `rackflow.tasks.executor`: the runs' rows (completed), then their schedules'
    (a failing streak's mark checks the schedule's key, the cap's look lowers its count), then scope rows
    last (in id order), as the scope RPCs and DeleteSchedule take them after the schedule's. Scope rows
    first, a DeleteSchedule or a scope RPC holding the schedule and waiting for one of them would wait for
    a write-back waiting for that schedule (tests/store/test_schedule_lock_order.py).

    `look_up_tasks` (the submit's outcome is unknown): first, in the same transaction, each "failed" scope
    whose task exists becomes "submitted". Returns the results as recorded (as given if every attempt
    failed, each then "running", as its run stays: `RunResult.state`; so too a run deleted since its submit,
    which is not completed).
    """

    async def write_back() -> list[RunResult]:
        async with db.transaction() as conn:
            recorded = await _with_tasks_found(conn, firings, results) if look_up_tasks else list(results)
            completed = await run_history.complete_runs(conn, {r.run_id: r.outcomes for r in recorded})
            await outbox.record_events(conn, events.runs_with_failures(firings, recorded, db.clock.now()))
            await run_history.cap_runs(
                conn, [f.schedule for f in firings], spare={r.run_id for r in recorded}
            )
            task_by_scope = {o.scope_id: o.task_id for r in recorded for o in r.outcomes if o.task_id}
            await store.set_last_task_ids(conn, task_by_scope)
        # A run deleted since its submit (with its schedule) was not completed: it was last "running".
        return [r if r.run_id in completed else replace(r, state="running") for r in recorded]

    policy = Retry(
        WRITEBACK_RETRY_DELAY_SECONDS, WRITEBACK_MAX_DELAY_SECONDS, deadline=WRITEBACK_DEADLINE_SECONDS
    )
    try:
        recorded = await retrying(write_back, policy, what=f"write-back of {len(results)} run(s)")
    except Exception:
        log.exception("write-back of %d run(s) failed until its deadline; giving up", len(results))
        return [replace(r, state="running") for r in results]
    if look_up_tasks:
        _log_tasks_found(results, recorded)
    return recorded


async def _with_tasks_found(
    conn: AsyncConnection, firings: Sequence[Firing], results: Sequence[RunResult]
) -> list[RunResult]:
    """The results with every "failed" scope whose task exists recorded as "submitted" with that task."""
    found = await store.tasks_of_firings(conn, [f.run_id for f in firings])

    def resolved(firing: Firing, outcome: ScopeOutcome) -> ScopeOutcome:
        task_id = found.get((firing.run_id, outcome.rack_id))
        if outcome.outcome != "failed" or task_id is None:
            return outcome
        return firing.submitted(outcome.scope_id, outcome.rack_id, task_id)

    return [
        RunResult(r.run_id, tuple(resolved(f, o) for o in r.outcomes))
        for f, r in zip(firings, results, strict=True)
    ]


def _log_tasks_found(unknown: Sequence[RunResult], recorded: Sequence[RunResult]) -> None:
    in_doubt = sum(o.outcome == "failed" for r in unknown for o in r.outcomes)
    found = sum(len(r.task_ids) for r in recorded)
    log.warning(
        "firing batch with an unknown submit outcome: %d of %d task(s) were committed after all and are "
        "recorded as submitted; the other %d were not submitted",
        found,
        in_doubt,
        in_doubt - found,
        extra={"tasks_found": found, "tasks_in_doubt": in_doubt},
    )


def _log_firings(firings: Sequence[Firing], results: Sequence[RunResult], elapsed: float) -> None:
    """One INFO line for these firings (all of one trigger: a dispatched batch or one manual trigger),
    naming each with its run and counts, so a firing is found by its schedule's name or its run id."""
    total = {"submitted": 0, "skipped": 0, "failed": 0}
    named = []
    lag = 0.0
    for firing, result in zip(firings, results, strict=True):
        submitted = skipped = failed = 0
        for o in result.outcomes:
            if o.outcome == "submitted":
                submitted += 1
            elif o.outcome == "failed":
                failed += 1
            elif o.outcome.startswith("skipped"):
                skipped += 1
        total["submitted"] += submitted
        total["skipped"] += skipped
        total["failed"] += failed
        named.append(f"{firing.schedule.name} (run {firing.run_id}): {submitted}/{skipped}/{failed}")
        if firing.scheduled_for is not None:
            lag = max(lag, (firing.fired_at - firing.scheduled_for).total_seconds())
    trigger = firings[0].trigger
    log.info(
        "fired %d schedule(s) (%s): %d submitted, %d skipped, %d failed",
        len(firings),
        trigger,
        total["submitted"],
        total["skipped"],
        total["failed"],
        extra={
            "trigger": trigger,
            **total,
            "duration_s": round(elapsed, 3),
            **({"lag_s": round(lag, 3)} if trigger == "dispatch" else {}),
            "firings": named,
        },
    )
