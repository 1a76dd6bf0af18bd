"""The whole life of a schedule firing, in order: claim (phase 1), submit (phase 2), write back (phase 3).

Every firing takes this path, whoever starts it: the dispatcher (`Dispatcher`, for due schedules), a
manual trigger (`ScheduleService.trigger`) and the tests. No transaction is held while the task manager
opens its own:

1. `claim` (the caller's transaction, which holds the schedule rows locked): read the scopes, decide per
   scope what is not submitted (the SKIP overlap check: a scope whose last task is still active), advance
   each schedule (`advance_after_firing`, `last_run_at`) and record its run as "running". Once this
   commits, the tick is spent: whatever happens next, it is not fired again (at most once per tick). The
   database holds that too: a dispatched run is unique per (schedule, slot), so a second claim of one slot
   records nothing and fires nothing, whatever path it came by.
2. `fire` (one transaction for the batch) submits one task per scope left, each carrying its run's id. A
   scope that fails is recorded as "failed" with its reason; the other scopes still fire. If the
   connection is lost (`Unavailable`), the transaction may have committed before the client heard: the
   outcome is unknown.
3. `fire` again (a new transaction, retried for WRITEBACK_DEADLINE_SECONDS): after an unknown outcome, look
   up which of the runs' tasks exist (by run id) and record those as "submitted"; then write each scope's
   new `last_task_id` (the SKIP overlap check reads it), complete the runs with their outcomes, and prune
   run history. If it still fails, the tasks exist but the run stays "running" until the dispatcher's
   sweep marks it "interrupted".

A decision per scope made at claim time (`Firing.decided`) is recorded as that scope's outcome and never
submitted: the SKIP overlap check ("skipped_overlap"), then, for a dispatched firing, the maintenance
windows (`window_decisions`, the one function the schedule preview asks too): a closed rack is
"skipped_window" under the SKIP window policy, and under DEFER its task is submitted with the opening it
waits for as its window (`Firing.deferred`), which the executor's claim and expiry already honour.

A schedule with a rollout policy (`rackflow.rollouts`) is claimed the same way, but phase 1 records its
run as "rolling" with every scope "pending" in rollout order (rack name, canaries first; the scopes
settled above keep their outcome), and phases 2 and 3 are the rollout's steps (`RolloutService.advance`),
which start scopes as the policy allows. While a schedule's previous rollout is still rolling or halted,
its firing is recorded as "skipped" with the reason and nothing more happens (the database holds one live
rollout per schedule).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import metrics
from rackflow.clock import Clock
from rackflow.domain.inventory import RackSelection
from rackflow.domain.schedules import OverlapPolicy, Schedule, Scope, ScopeOutcome, Trigger
from rackflow.domain.tasks import Operation, QueueOptions
from rackflow.domain.windows import MaintenanceWindow, RackRef
from rackflow.errors import RackflowError, Unavailable
from rackflow.notify import events
from rackflow.retry import Retry, retrying
from rackflow.store import outbox
from rackflow.store import rollouts as rollout_store
from rackflow.store import schedules as store
from rackflow.store import windows as window_store
from rackflow.store.db import Database
from rackflow.tasks.manager import Submission, TaskManager
from rackflow.timespec import IntervalTiming, SpecType, format_rfc3339, parse_spec
from rackflow.windows.rules import Decision, decide_firing

log = logging.getLogger(__name__)

# Phase 3 is retried with doubling delays (capped) until this deadline, so a database restart of a few
# seconds does not leave the run "running"; past it the dispatcher's sweep marks the run interrupted.
WRITEBACK_DEADLINE_SECONDS = 30.0
WRITEBACK_RETRY_DELAY_SECONDS = 0.2
WRITEBACK_MAX_DELAY_SECONDS = 2.0


@dataclass(frozen=True)
class Firing:
    """One claimed firing waiting for phases 2 and 3: its schedule (as claimed), scopes and run row.

    `decided`: the scopes phase 1 settled without a task, with the outcome recorded for each
    ("skipped_overlap", "skipped_window"). `deferred`: the scopes whose task waits for an opening.
    `scheduled_for`: the slot a dispatched firing was due at (None: manual).
    `rollout_outcomes`: a rollout's every scope as phase 1 recorded it, in rollout order.
    """

    schedule: Schedule
    scopes: Sequence[Scope]
    trigger: Trigger
    fired_at: datetime
    run_id: uuid.UUID
    decided: Mapping[uuid.UUID, ScopeOutcome] = field(default_factory=dict)
    scheduled_for: datetime | None = None
    deferred: Mapping[uuid.UUID, Decision] = field(default_factory=dict)
    rollout_outcomes: tuple[ScopeOutcome, ...] = ()

    @property
    def rolls_out(self) -> bool:
        return self.schedule.rollout is not None

    @property
    def to_submit(self) -> list[Scope]:
        return [scope for scope in self.scopes if scope.id not in self.decided]


@dataclass(frozen=True)
class RunResult:
    run_id: uuid.UUID
    outcomes: tuple[ScopeOutcome, ...]

    @property
    def task_ids(self) -> list[uuid.UUID]:
        return [outcome.task_id for outcome in self.outcomes if outcome.task_id is not None]


def advance_after_firing(schedule: Schedule, fired_at: datetime) -> tuple[bool, datetime | None]:
    """(enabled, next_run_at) once the schedule has fired at `fired_at`.

    One-time: consumed (disabled, no next run). Interval: `fired_at` + duration, so missed intervals are
    not replayed. Cron: the next calendar time after `fired_at`. `enabled` is otherwise kept, so a paused
    schedule fired by hand stays paused.
    """
    if schedule.spec.type is SpecType.ONE_TIME:
        return False, None
    return schedule.enabled, parse_spec(schedule.spec).next_after(fired_at)


def planned_times(schedule: Schedule, after: datetime | None, now: datetime, count: int) -> list[datetime]:
    """The next `count` times the dispatcher fires `schedule` if it keeps up (strictly after `after`; by
    default from `now` on): its next_run_at (at once, `now`, when overdue), then each time
    `advance_after_firing` gives after a firing at the one before."""
    timing = parse_spec(schedule.spec)
    moment = schedule.next_run_at
    if moment is None:
        return []
    moment = max(moment, now)
    if after is not None and moment <= after:  # it fires before `after`: skip to the first one past it
        if isinstance(timing, IntervalTiming):
            moment += timing.step * ((after - moment) // timing.step + 1)
        else:
            moment = timing.next_after(after) if schedule.spec.type is not SpecType.ONE_TIME else None
    times: list[datetime] = []
    while moment is not None and len(times) < count:
        times.append(moment)
        moment = advance_after_firing(replace(schedule, enabled=True), moment)[1]
    return times


def task_description(schedule: Schedule, fired_at: datetime) -> str:
    """`<schedule name> — <fired_at, RFC 3339>`, so an operator can tell which firing made a task."""
    return f"{schedule.name} — {format_rfc3339(fired_at)}"


def scope_submission(
    schedule: Schedule,
    scope: Scope,
    fired_at: datetime,
    run_id: uuid.UUID,
    deferral: Decision | None = None,
) -> Submission:
    """What a firing submits for one scope (phase 2, or a rollout's step): the schedule's operation on the
    scope's rack and components, under the overlap policy's conflict strategy, carrying the run's id. A
    deferred scope's task carries the opening it waits for as its operation's window, and says so."""
    operation, message = schedule.operation, ""
    if deferral is not None:
        operation = replace(operation, window_start=deferral.opens_at, window_end=deferral.closes_at)
        message = deferral.reason
    return Submission(
        operation,
        (RackSelection(scope.rack_id, scope.filter),),
        task_description(schedule, fired_at),
        QueueOptions(schedule.overlap_policy.conflict_strategy, schedule.queue_timeout),
        schedule.id,
        run_id,
        message,
    )


# --- phase 1: claim ------------------------------------------------------------------------------


async def claim(
    db: Database,
    conn: AsyncConnection,
    schedules: Sequence[Schedule],
    *,
    trigger: Trigger,
    now: datetime,
    owner_id: uuid.UUID | None = None,
) -> list[Firing]:
    """Phase 1 for `schedules`, which the caller has locked in `conn`'s transaction; the firings to run.

    Every schedule is advanced as having fired at `now`. A dispatched firing is recorded for the slot it
    was due at (the schedule's `next_run_at`) and runs the overlap check; a manual one has no slot and
    fires every scope (the task manager's conflict rules still decide). A dispatched firing whose slot is
    recorded already is not fired again: its schedule is advanced, and it is left out of the result.
    `owner_id` (the dispatching instance) lets the sweep tell a dead owner's "running" run.
    """
    if not schedules:
        return []
    scopes = await store.scopes_by_schedule(conn, [s.id for s in schedules])
    dispatched = trigger == "dispatch"
    decided, deferred = await _decide(conn, schedules, scopes, now) if dispatched else ({}, {})
    firings = [
        Firing(
            schedule,
            scopes[schedule.id],
            trigger,
            now,
            uuid.uuid4(),
            {sc.id: decided[sc.id] for sc in scopes[schedule.id] if sc.id in decided},
            schedule.next_run_at if dispatched else None,
            {sc.id: deferred[sc.id] for sc in scopes[schedule.id] if sc.id in deferred},
        )
        for schedule in schedules
    ]
    advances = [store.Advance(s.id, *advance_after_firing(s, now), last_run_at=now) for s in schedules]
    await store.advance(conn, advances, now)
    firings, skipped = await _rollouts_in(conn, firings)
    runs = [
        store.NewRun(f.run_id, f.schedule.id, now, trigger, f.scheduled_for, owner_id if dispatched else None)
        if not f.rolls_out
        else store.NewRun(
            f.run_id,
            f.schedule.id,
            now,
            trigger,
            f.scheduled_for,
            state="skipped" if f.run_id in skipped else "rolling",
            outcomes=f.rollout_outcomes,
            rollout=f.schedule.rollout,
            reason=skipped.get(f.run_id, ""),
        )
        for f in firings
    ]
    recorded = await store.insert_runs(db, conn, runs)
    # A rollout's run is never written back by phase 3, where run history is pruned: prune it here.
    await store.prune_runs(conn, {f.schedule.id for f in firings if f.rolls_out})
    for f in firings:
        if f.run_id not in recorded:
            log.warning(
                "schedule %s: its slot %s was fired already; not firing it again",
                f.schedule.name,
                f.scheduled_for,
                extra={"schedule_id": str(f.schedule.id)},
            )
        elif f.run_id in skipped:
            log.warning(
                "schedule %s: firing skipped: %s",
                f.schedule.name,
                skipped[f.run_id],
                extra={"schedule_id": str(f.schedule.id), "run_id": str(f.run_id)},
            )
    return [f for f in firings if f.run_id in recorded and f.run_id not in skipped]


def skip_reason(live_run_id: uuid.UUID, state: str) -> str:
    """Why a rollout's firing was skipped: the schedule's live rollout."""
    return f"the schedule's previous rollout (run {live_run_id}) is still {state}"


async def _rollouts_in(
    conn: AsyncConnection, firings: Sequence[Firing]
) -> tuple[list[Firing], dict[uuid.UUID, str]]:
    """The firings with each rollout's scopes in rollout order, and the rollouts to skip (run id: why).

    Rollout order is by rack name (then scope id), stable across firings; the first `canary_racks` scopes
    that the overlap check did not settle are the canaries.
    """
    rolling = [f for f in firings if f.rolls_out]
    if not rolling:
        return list(firings), {}
    live = await rollout_store.live_rollouts(conn, [f.schedule.id for f in rolling])
    places = await rollout_store.rack_places(conn, {sc.rack_id for f in rolling for sc in f.scopes})
    skipped: dict[uuid.UUID, str] = {}
    result: list[Firing] = []
    for f in firings:
        if not f.rolls_out:
            result.append(f)
            continue
        if f.schedule.id in live:
            run_id, state = live[f.schedule.id]
            skipped[f.run_id] = skip_reason(run_id, state)
        assert f.schedule.rollout is not None
        canaries = f.schedule.rollout.canary_racks
        ordered = sorted(
            f.scopes, key=lambda sc: (places[sc.rack_id].name if sc.rack_id in places else "", str(sc.id))
        )
        outcomes = []
        for scope in ordered:
            if scope.id in f.decided:
                outcomes.append(f.decided[scope.id])
            else:
                outcomes.append(ScopeOutcome(scope.id, scope.rack_id, "pending", canary=canaries > 0))
                canaries -= 1
        result.append(replace(f, rollout_outcomes=() if f.run_id in skipped else tuple(outcomes)))
    return result, skipped


async def _decide(
    conn: AsyncConnection,
    schedules: Sequence[Schedule],
    scopes: Mapping[uuid.UUID, Sequence[Scope]],
    now: datetime,
) -> tuple[dict[uuid.UUID, ScopeOutcome], dict[uuid.UUID, Decision]]:
    """What a dispatched firing settles per scope before submitting: the scopes it records without a task
    (under overlap SKIP, those whose last task is still active; then those the windows close under window
    SKIP), and the scopes whose task is deferred to an opening."""
    candidates = [sc for s in schedules if s.overlap_policy is OverlapPolicy.SKIP for sc in scopes[s.id]]
    overlapping = await store.overlapping_scope_ids(conn, candidates)
    decided = {
        sc.id: ScopeOutcome(sc.id, sc.rack_id, "skipped_overlap")
        for s in schedules
        for sc in scopes[s.id]
        if sc.id in overlapping
    }
    windows = await window_store.all_windows(conn)
    if not windows:
        return decided, {}
    open_scopes = {s.id: [sc for sc in scopes[s.id] if sc.id not in decided] for s in schedules}
    racks = await window_store.rack_refs(conn, {sc.rack_id for left in open_scopes.values() for sc in left})
    deferred: dict[uuid.UUID, Decision] = {}
    for schedule in schedules:
        left = open_scopes[schedule.id]
        decisions = window_decisions(windows, racks, schedule, left, now)
        for scope in left:
            decision = decisions.get(scope.id)
            if decision is not None and decision.action == "defer":
                deferred[scope.id] = decision
            elif decision is not None and decision.action == "skip_window":
                decided[scope.id] = ScopeOutcome(
                    scope.id, scope.rack_id, "skipped_window", error=decision.reason
                )
    return decided, deferred


def window_decisions(
    windows: Sequence[MaintenanceWindow],
    racks: Mapping[uuid.UUID, RackRef],
    schedule: Schedule,
    scopes: Sequence[Scope],
    at: datetime,
) -> dict[uuid.UUID, Decision]:
    """What the windows make a firing of `schedule` at `at` do for each scope (`windows.rules.decide_firing`
    under the schedule's window policy): the dispatcher's decision, and the schedule preview's.

    A rack missing from `racks` (deleted) is left to the task manager, which refuses it. A deferred firmware
    upgrade that has a window of its own waits for the overlap of both, and is skipped if they do not meet.
    """
    decisions: dict[uuid.UUID, Decision] = {}
    operation = schedule.operation
    for scope in scopes:
        rack = racks.get(scope.rack_id)
        if rack is None:
            continue
        decision = decide_firing(windows, rack, operation.kind, at, schedule.window_policy)
        if decision.action == "defer":
            decision = _within_own_window(decision, operation)
        decisions[scope.id] = decision
    return decisions


def _within_own_window(decision: Decision, operation: Operation) -> Decision:
    assert decision.opens_at is not None
    opens_at = max(decision.opens_at, operation.window_start or decision.opens_at)
    ends = [end for end in (decision.closes_at, operation.window_end) if end is not None]
    closes_at = min(ends, default=None)
    if closes_at is not None and closes_at <= opens_at:
        return replace(decision, action="skip_window", opens_at=None, closes_at=None)
    return replace(decision, opens_at=opens_at, closes_at=closes_at)


# --- phases 2 and 3: submit, write back ----------------------------------------------------------


async def fire(db: Database, tasks: TaskManager, clock: Clock, firings: Sequence[Firing]) -> list[RunResult]:
    """Phases 2 and 3 for claimed firings: one submit transaction, one write-back transaction.

    A refused scope (conflict, full queue, rack gone) fails alone and the others still fire. The task
    manager locks the batch's racks in id order, so concurrent batches on other instances cannot deadlock.
    A rollout's firing is left out: its result is its scopes as phase 1 recorded them (all pending), and
    its scopes start in its rollout steps (`RolloutService.advance`).
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
    submitted, outcome_unknown = await _submit_all(db, tasks, firings)
    results = [
        RunResult(
            f.run_id,
            tuple(
                f.decided[scope.id] if scope.id in f.decided else submitted[(f.run_id, scope.id)]
                for scope in f.scopes
            ),
        )
        for f in firings
    ]
    results = await _write_back(db, firings, results, look_up_tasks=outcome_unknown)
    if outcome_unknown and any(r.task_ids for r in results):
        tasks.wake_executors()
    elapsed = (clock.now() - started).total_seconds()
    for firing, result in zip(firings, results, strict=True):
        metrics.FIRINGS.labels(firing.trigger).inc()
        for outcome in result.outcomes:
            metrics.SCOPE_OUTCOMES.labels(outcome.outcome).inc()
        _log_firing(firing, result, elapsed)
    return results


async def _submit_all(
    db: Database, tasks: TaskManager, firings: Sequence[Firing]
) -> tuple[dict[tuple[uuid.UUID, uuid.UUID], ScopeOutcome], bool]:
    """Phase 2: every eligible scope's outcome, keyed by (run id, scope id), and whether the outcome of the
    submit transaction is unknown.

    All scopes go to the task manager in one transaction: it locks and reads their racks once and decides
    each scope as a request of its own, so a refused scope (conflict, full queue, rack gone) fails alone.
    If the transaction itself fails, every scope of the batch is "failed". Any error but `Unavailable`
    means nothing was committed: the database answered, or the error was raised before COMMIT. A lost
    connection may have been lost during COMMIT, after the database committed: then the outcome is unknown,
    and phase 3 looks up which tasks exist.
    """
    jobs = [(f, scope) for f in firings for scope in f.to_submit]
    if not jobs:
        return {}, False
    submissions = [_submission(f, scope) for f, scope in jobs]
    try:
        async with db.transaction() as conn:
            results = await tasks.submit_each_in(conn, submissions)
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
        return failed, outcome_unknown
    tasks.wake_executors()
    outcomes: dict[tuple[uuid.UUID, uuid.UUID], ScopeOutcome] = {}
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
            outcomes[(firing.run_id, scope.id)] = ScopeOutcome(
                scope.id, scope.rack_id, "submitted", task_id=result[0].id
            )
    return outcomes, False


def _submission(firing: Firing, scope: Scope) -> Submission:
    return scope_submission(
        firing.schedule, scope, firing.fired_at, firing.run_id, firing.deferred.get(scope.id)
    )


async def _write_back(
    db: Database, firings: Sequence[Firing], results: Sequence[RunResult], *, look_up_tasks: bool
) -> list[RunResult]:
    """Phase 3, retried: last_task_id per submitted scope, the completed runs, and run-history retention.

    `look_up_tasks` (the submit's outcome is unknown): first, in the same transaction, each "failed" scope
    whose task exists becomes "submitted". Returns the results as recorded (as given if every attempt
    failed).
    """
    schedule_ids = {f.schedule.id for f in firings}

    async def write_back() -> list[RunResult]:
        async with db.transaction() as conn:
            recorded = await _with_tasks_found(conn, firings, results) if look_up_tasks else list(results)
            task_by_scope = {o.scope_id: o.task_id for r in recorded for o in r.outcomes if o.task_id}
            await store.set_last_task_ids(conn, task_by_scope)
            await store.complete_runs(conn, {r.run_id: r.outcomes for r in recorded})
            await outbox.record_events(conn, events.runs_with_failures(firings, recorded, db.clock.now()))
            await store.prune_runs(conn, schedule_ids)
        return recorded

    policy = Retry(
        WRITEBACK_RETRY_DELAY_SECONDS, WRITEBACK_MAX_DELAY_SECONDS, deadline=WRITEBACK_DEADLINE_SECONDS
    )
    try:
        recorded = await retrying(write_back, policy, what=f"write-back of {len(results)} run(s)")
    except Exception:
        log.exception("write-back of %d run(s) failed until its deadline; giving up", len(results))
        return list(results)
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
        return ScopeOutcome(outcome.scope_id, outcome.rack_id, "submitted", task_id=task_id)

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


def _log_firing(firing: Firing, result: RunResult, elapsed: float) -> None:
    counts = {kind: sum(o.outcome == kind for o in result.outcomes) for kind in ("submitted", "failed")}
    counts["skipped"] = sum(o.outcome.startswith("skipped") for o in result.outcomes)
    log.info(
        "schedule %s fired (%s): %d submitted, %d skipped, %d failed",
        firing.schedule.name,
        firing.trigger,
        counts["submitted"],
        counts["skipped"],
        counts["failed"],
        extra={
            "schedule_id": str(firing.schedule.id),
            "schedule_name": firing.schedule.name,
            "trigger": firing.trigger,
            "submitted": counts["submitted"],
            "skipped": counts["skipped"],
            "failed": counts["failed"],
            "duration_s": round(elapsed, 3),
            **(
                {"lag_s": round((firing.fired_at - firing.scheduled_for).total_seconds(), 3)}
                if firing.scheduled_for is not None
                else {}
            ),
        },
    )
