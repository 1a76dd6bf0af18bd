"""The seam that applies the rollout rule (`rackflow.domain.rollouts.decide`) to runs in the database.

`RolloutService.advance` is the one entry point that moves a rollout: the rollout driver's loop and a
firing's first step (`ScheduleService.fire`) both call it. A step is one transaction: lock
rolling runs (`FOR UPDATE SKIP LOCKED`, so every instance may step runs and none waits for another), read
their tasks' states, decide per run, submit the scopes the rule starts as the planner settles them
(`domain.firing.plan_starts`: a scope removed meanwhile, the windows), each task carrying its run (UNIQUE
(run_id, rack_id) refuses a second task for a scope whatever path tries), and write the run back: its
outcomes, and its state when it completed or halted (pausing its schedule unless `pause_on_halt` is off), or
was cancelled by rackflow at its firmware window's end (`domain.rollouts.window_ended_cancel`: as a halt,
but its tasks not begun ended as a cancel ends them, since nothing could resume it).
Nothing is kept in memory between steps, so a rollout goes on from where it is when the instance that
stepped it dies or restarts: another instance's next step takes the run, and if the dead one's
transaction had not committed, nothing of it happened.

A window created, edited or deleted between a step's read of the windows and its commit would not find
the tasks the step inserts (it decides again only the tasks that exist, `rackflow.tasks.deferrals`), and
they would keep what the step planned from the windows as they were (bound to an ALLOW window's end the
operator has since shortened, or submitted on a rack a new freeze closes). So a step takes the window
edits' turn in its shared form (`store.windows.beside_edits`), first in its transaction, as a firing's
submit does (`rackflow.schedules.firing`): an edit under way commits before the step reads the windows,
and one that comes after waits for the step to commit, then finds its tasks and decides them as any
others. Steps do not wait for one another there (the shared form).

Lock order (the executor's design note, `rackflow.tasks.executor`): the window edits' turn (a step takes its
shared form), then a run's row, then racks', then tasks'. The turn comes before the run's row because a
window's change takes its exclusive form first and then waits for the rows of the runs of the tasks it decides
(`store.rollouts.lock_runs`, not SKIP LOCKED) and for their racks: a step that held a run's row (or a rack)
while it waited for the turn would wait for a change that waits for that row, and PostgreSQL would abort one
of the two as a deadlock. Taken first, a step waiting for the turn holds nothing; and a change waiting for it
waits for steps that hold it and wait only for rows (racks, a schedule's) that no transaction waiting for the
turn holds, since every one that takes it (a window's change and the decisions it owes, in the exclusive form;
a firing's submit and a step, in the shared form) takes it before any row. (SQLite's single writer runs them
one after another: nothing to take there.) A step, a resume and a cancel lock the run's row first, then (a
step's submission, a cancel's ending) the racks', and never wait for one of its tasks' rows: the tasks an
executor's claim holds meanwhile are skipped (a halt's hold, a resume's release, a cancel's ending), and that
claim's rollout gate, which never waits for the run's row, decides them from the run as they left it (at that
claim, or at the next one when the run was still held: `rollouts.gate`). The schedule's row comes after the
run's (a halt pauses it; `save_run`'s failing-streak mark checks its key), and scope rows after the schedule's
(a step writes its scopes' last tasks last), as the scope RPCs take them. A step of several runs pauses the
schedules of those it halts or cancels (`FOR NO KEY UPDATE`, `store.schedules.key_kept`) before it starts any
run's wave or ends a cancelled one's tasks: a schedule's row before racks', as the scope RPCs and DeleteRack's
stamp take them (tests/store/test_schedule_lock_order.py).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import metrics
from rackflow.audit.trail import AuditTrail
from rackflow.clock import Clock
from rackflow.config import ROLLOUT_STEP_BATCH
from rackflow.domain.audit import SYSTEM_PRINCIPAL
from rackflow.domain.firing import deadline_end, plan_starts, window_ended_reason
from rackflow.domain.rollouts import (
    ENDED,
    Decision,
    Phase,
    ScopeView,
    decide,
    failures_counted,
)
from rackflow.domain.schedules import (
    ROLLOUT_LIVE_STATES,
    Outcome,
    Run,
    ScopeOutcome,
    settled_scopes,
)
from rackflow.domain.tasks import TaskStatus
from rackflow.errors import FailedPrecondition, NotFound, RackflowError
from rackflow.notify import events
from rackflow.rollouts.gate import GATE_NAME as ROLLOUT_GATE
from rackflow.rollouts.gate import hold_stopped, scope_views
from rackflow.security import ANONYMOUS, caller_name
from rackflow.store import firing as firing_store
from rackflow.store import outbox, task_runs
from rackflow.store import rollouts as store
from rackflow.store import runs as run_history
from rackflow.store import schedules as schedule_store
from rackflow.store import windows as window_store
from rackflow.store.db import Database, in_id_order
from rackflow.tasks.manager import Ended, TaskManager
from rackflow.tasks.scheduled import scope_submission

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    """A rollout's counters by scope, its wave ("canary", "bake", "rest"; "" without canaries), when the
    rest start while baking, and the failures counted against its halt limits (since the last resume)."""

    total: int
    pending: int
    active: int
    succeeded: int
    failed: int
    not_started: int
    skipped: int
    wave: str
    bake_until: datetime | None
    failures_counted: int


@dataclass(frozen=True)
class RunReport:
    """A run as an operator sees it: the run, each of its tasks' current status, what holds each of its
    waiting tasks and why (task id -> (held_by, held_reason), only the held ones), and (a rollout) its
    progress."""

    run: Run
    task_statuses: Mapping[uuid.UUID, TaskStatus]
    progress: Progress | None
    retried_by: tuple[uuid.UUID, ...] = ()  # the runs RetryTaskScheduleRun made from this one
    holds: Mapping[uuid.UUID, tuple[str, str]] = field(default_factory=dict)
    # A part of a run (`RunPart`): the position of `run.outcomes[0]` among its outcomes, and how many it has.
    first_outcome: int = 0
    outcome_count: int | None = None  # None: the run whole, len(run.outcomes)
    # Only RetryTaskScheduleRun's answer sets it (`ScheduleService.retry_run`): the run an earlier retry with
    # the same request id made, answered again; None in every other report (no answer of a retry).
    replayed: bool | None = None


@dataclass(frozen=True)
class FirstSteps:
    """Rollouts' runs once no step holds them (`RolloutService.first_steps`): those found, as their steps
    left them; and, by run, the tasks that still name each run deleted since with its schedule (what its
    steps started before the deletion), or None where the deletion cleared that name (SQLite)."""

    runs: Mapping[uuid.UUID, Run]
    gone: Mapping[uuid.UUID, tuple[uuid.UUID, ...]] | None


@dataclass(frozen=True)
class RunPart:
    """Outcomes `start` up to `stop` (excluded) of a run of `count`, read without its outcomes: what one page
    of ListTaskScheduleRuns' FULL view carries of it (the run whole when that is 0 to `count`)."""

    run: Run
    start: int
    stop: int
    count: int

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.stop >= self.count


@dataclass(frozen=True)
class RunSummary:
    """A run as its page shows a plain firing, counted in the database instead of read whole: the run
    without its outcomes, its racks by (outcome, has a task), its tasks by status, and the runs that
    re-ran it. A firing of 10,000 racks is 10,000 outcomes and tasks (docs/PERFORMANCE.md, issue 29)."""

    run: Run
    tally: schedule_store.Tally
    task_counts: Mapping[TaskStatus, int]
    retried_by: tuple[uuid.UUID, ...]


@dataclass(frozen=True)
class Step:
    """What one `advance` did: how many rolling runs it stepped, the tasks it submitted, by run, and each
    run it stepped as it left it (`stepped`); and whether any run was rolling (False only when it found
    none anywhere: the driver may then sleep)."""

    runs: int
    started: Mapping[uuid.UUID, tuple[uuid.UUID, ...]] = field(default_factory=dict)
    rolling: bool = True
    stepped: Mapping[uuid.UUID, Run] = field(default_factory=dict)

    @property
    def task_ids(self) -> tuple[uuid.UUID, ...]:
        return tuple(task_id for tasks in self.started.values() for task_id in tasks)


def _progress(run: Run, views: Sequence[ScopeView], now: datetime) -> Progress:
    assert run.rollout is not None
    counts = Counter(v.phase for v in views)
    canaries = [v for v in views if v.canary]
    wave = ""
    bake_until = None
    if canaries:
        if not run.resumed and any(v.phase not in ENDED for v in canaries):
            wave = "canary"
        else:
            ends = [v.finished_at for v in canaries if v.finished_at is not None]
            baking = run.rollout.bake_time and ends and not run.resumed and counts[Phase.PENDING]
            bake_until = max(ends) + run.rollout.bake_time if baking else None
            wave = "bake" if bake_until is not None and now < bake_until else "rest"
    return Progress(
        total=len(views),
        pending=counts[Phase.PENDING],
        active=counts[Phase.ACTIVE] + counts[Phase.HELD],
        succeeded=counts[Phase.SUCCEEDED],
        failed=counts[Phase.FAILED],
        not_started=counts[Phase.NOT_STARTED],
        skipped=counts[Phase.SKIPPED],
        wave=wave,
        bake_until=bake_until if wave == "bake" else None,
        failures_counted=failures_counted(views, run.failures_excused),
    )


def _decide(run: Run, views: Sequence[ScopeView], now: datetime, window_end: datetime | None) -> Decision:
    """The rule's decision for one run's step; `window_end`: its operation's own (None: none)."""
    assert run.rollout is not None
    return decide(
        run.rollout,
        views,
        now=now,
        failures_excused=run.failures_excused,
        resumed=run.resumed,
        window_end=window_end,
    )


def _with_outcomes(run: Run, changed: Mapping[uuid.UUID, ScopeOutcome]) -> tuple[ScopeOutcome, ...]:
    return tuple(changed.get(o.scope_id, o) for o in run.outcomes)


def _marked(run: Run, was: Outcome, becomes: Outcome) -> tuple[ScopeOutcome, ...]:
    """The run's outcomes with every `was` scope marked `becomes` (pending ones "not_started", or back)."""
    return tuple(replace(o, outcome=becomes) if o.outcome == was else o for o in run.outcomes)


class RolloutService:
    def __init__(self, db: Database, clock: Clock, tasks: TaskManager, audit: AuditTrail) -> None:
        self.db = db
        self.clock = clock
        self.tasks = tasks
        self.audit = audit
        # Told when a step of given runs begins (a firing's first, a resume): runs roll, so a driver of
        # this process that slept while none did looks again (`rollouts.driver`).
        self.on_rolling: list[Callable[[], None]] = []

    # --- stepping ----------------------------------------------------------------------------------

    async def advance(
        self, run_ids: Collection[uuid.UUID] | None = None, limit: int = ROLLOUT_STEP_BATCH
    ) -> Step:
        """One step of up to `limit` rolling runs (of `run_ids`, if given) that no other instance is
        stepping; see the module's docstring. With no run rolling anywhere (the usual case) it is one read,
        not a write transaction (which on SQLite would take the database's single write lock every step).
        The step's transaction first takes the window edits' turn in its shared form, before it locks any
        run (the module's docstring): on PostgreSQL one more statement per step, which waits only while a
        window's change is under way; nothing on SQLite, whose single writer runs them one after another."""
        if run_ids is None:
            async with self.db.read() as conn:
                if not await store.any_rolling(conn):
                    return Step(0, rolling=False)
        else:
            for wake in self.on_rolling:
                wake()
        async with self.db.transaction() as conn:
            await window_store.beside_edits(conn)  # before the runs' rows: the lock order above
            runs = await store.claim_rolling(self.db, conn, limit, run_ids)
            if not runs:
                return Step(0)
            now = self.clock.now()
            tasks = await store.task_states(conn, [r.id for r in runs])
            # The rule needs the domains of racks still to start or active, and the canaries' names.
            live = {Phase.PENDING, Phase.ACTIVE, Phase.HELD}
            needed = {
                v.rack_id for r in runs for v in scope_views(r, tasks, {}) if v.phase in live or v.canary
            }
            places = await store.rack_places(conn, needed)
            window_ends = await store.window_ends(conn, {r.schedule_id for r in runs})
            started: dict[uuid.UUID, tuple[uuid.UUID, ...]] = {}
            stepped: dict[uuid.UUID, Run] = {}
            paused: list[tuple[Run, str]] = []
            decided = []
            for run in runs:
                views = scope_views(run, tasks, places)
                decided.append((run, views, _decide(run, views, now, window_ends.get(run.schedule_id))))
            # Pauses first (a cancel's at its window's end, a halt's, a run's done over its limit): the
            # schedule a step pauses comes before the racks of a cancel's endings or another run's wave (the
            # lock order atop `rackflow.tasks.executor`).
            cancels: list[tuple[Run, str, bool]] = []
            for run, _, decision in decided:
                if decision.cancel is not None:
                    pauses = await self._pause_for(conn, run, decision.cancel, now, paused)
                    cancels.append((run, decision.cancel, pauses))
            for run, views, decision in sorted(decided, key=lambda d: d[2].pause_reason is None):
                if decision.cancel is None:
                    stepped[run.id], begun = await self._step(conn, run, views, decision, now, paused)
                    started[run.id] = tuple(begun)
            ended: list[tuple[Run, Ended]] = []
            for run, why, pauses in cancels:
                stepped[run.id], endings = await self._cancel_at_window_end(conn, run, why, pauses, now)
                started[run.id] = ()
                ended.append((stepped[run.id], endings))
        step = Step(len(runs), started, stepped=stepped)
        if step.task_ids:
            self.tasks.wake_executors()
            metrics.ROLLOUT_RACKS_STARTED.inc(len(step.task_ids))
        for cancelled, endings in ended:
            self.tasks.after_ended(endings)
            await self.audit.record_rackflow_run_end(
                "CancelTaskScheduleRun", cancelled.id, cancelled.schedule_id, cancelled.reason
            )
        for run, reason in paused:
            await self.audit.record_rackflow_pause(run.schedule_id, reason, run_id=run.id)
        return step

    async def _step(
        self,
        conn: AsyncConnection,
        run: Run,
        views: Sequence[ScopeView],
        decision: Decision,
        now: datetime,
        paused: list[tuple[Run, str]],
    ) -> tuple[Run, list[uuid.UUID]]:
        """One run's step, as decided (not a cancel at its window's end: `_cancel_at_window_end`): the run as
        it left it, and the tasks it started; a halt, or a run done over its failure limit, that pauses the
        schedule is added to `paused` (audited after commit)."""
        assert run.rollout is not None
        if decision.halt is not None:
            metrics.ROLLOUT_HALTS.inc()
            halted = replace(
                run, state="halted", outcomes=_marked(run, "pending", "not_started"), reason=decision.halt
            )
            await store.save_run(conn, halted)
            # Its racks submitted and not begun start no more either: the rollout gate holds them.
            await hold_stopped(conn, {run.id: store.LockedRun("halted", decision.halt)}, now)
            pauses = await self._pause_for(conn, run, decision.halt, now, paused)
            await outbox.record_events(conn, events.rollout_halted(run, decision.halt, pauses, now))
            return halted, []
        if decision.done:
            completed = replace(run, state="completed")
            await store.save_run(conn, completed)
            await outbox.record_events(conn, events.rollout_finished(run, views, now))
            if decision.over_limit is None:
                log.info("run %s: rollout completed", run.id, extra={"run_id": str(run.id)})
            elif await self._pause_for(conn, run, decision.over_limit, now, paused):
                await outbox.record_events(conn, events.paused_over_limit(run, decision.over_limit, now))
            return completed, []
        if not decision.start:
            return run, []
        return await self._start(conn, run, decision.start, now)

    async def _cancel_at_window_end(
        self, conn: AsyncConnection, run: Run, why: str, paused: bool, now: datetime
    ) -> tuple[Run, Ended]:
        """Cancel, as rackflow, a rollout that still had racks to start at its operation's window end
        (`domain.rollouts.window_ended_cancel`: `why`), its schedule already paused for it (`paused`) as a
        halt would have: its racks waiting and its tasks not begun end as `cancel_in` ends them, and one
        `run.cancelled` event tells what a halt would have left for an operator to cancel by hand, since no
        resume could move the end. The run as cancelled, and the tasks ended (`after_ended` once this
        committed)."""
        cancelled, ended = await self.cancel_in(conn, run, why, by=SYSTEM_PRINCIPAL)
        await outbox.record_events(conn, events.rollout_cancelled(cancelled, why, paused, now))
        return cancelled, ended

    async def _start(
        self, conn: AsyncConnection, run: Run, scope_ids: Sequence[uuid.UUID], now: datetime
    ) -> tuple[Run, list[uuid.UUID]]:
        """Start the scopes in this transaction as the planner settles them (`plan_starts`: removed from
        the schedule meanwhile, closed by a window, or a first wave's deferral bound by the start
        deadline); a refused one (conflict, full queue) is "failed" and counts against the failure
        budget. Returns the run as saved, and the tasks started."""
        snapshot = await firing_store.load_starts(conn, run.schedule_id, scope_ids, run.trigger)
        starts = plan_starts(snapshot, run.outcomes, scope_ids, run.trigger, now)
        (schedule,) = snapshot.schedules
        outcomes = {o.scope_id: o for o in run.outcomes}
        changed = dict(starts.settled)
        results = await self.tasks.submit_each_in(
            conn, [scope_submission(schedule, sc, run.fired_at, run.id, bound) for sc, bound in starts.submit]
        )
        started: dict[uuid.UUID, uuid.UUID] = {}
        for (scope, bound), result in zip(starts.submit, results, strict=True):
            if isinstance(result, RackflowError):
                changed[scope.id] = replace(outcomes[scope.id], outcome="failed", error=str(result))
            else:
                started[scope.id] = result[0].id
                start_by = deadline_end(bound)
                changed[scope.id] = replace(
                    outcomes[scope.id], outcome="submitted", task_id=result[0].id, start_by=start_by
                )
        saved = replace(run, outcomes=_with_outcomes(run, changed))
        await store.save_run(conn, saved)
        # Scope rows after the schedule's mark (`save_run`), as the scope RPCs take them after the schedule.
        await schedule_store.set_last_task_ids(conn, started)
        return saved, list(started.values())

    async def _pause_for(
        self, conn: AsyncConnection, run: Run, reason: str, now: datetime, paused: list[tuple[Run, str]]
    ) -> bool:
        """A halt's, or a run's done over its limit: pause its schedule for `reason` as its policy's
        `pause_on_halt` lets it, added to `paused` (audited after commit), and log it. Whether it paused."""
        assert run.rollout is not None
        pauses = run.rollout.pause_on_halt and await self._pause(conn, run.schedule_id, reason, now)
        if pauses:
            paused.append((run, reason))
        log.warning(
            "run %s: %s%s",
            run.id,
            reason,
            "; schedule paused" if pauses else "",
            extra={"run_id": str(run.id), "schedule_id": str(run.schedule_id)},
        )
        return pauses

    async def _pause(self, conn: AsyncConnection, schedule_id: uuid.UUID, reason: str, now: datetime) -> bool:
        """Pause the schedule of a halted rollout (or one done over its failure limit), with why as its
        reason, by rackflow itself (`schedule_store.pause_by_rackflow`); False when there is nothing to
        pause (already paused, or a fired one-time schedule)."""
        return await schedule_store.pause_by_rackflow(self.db, conn, schedule_id, reason, now)

    # --- one run: read, resume, cancel -------------------------------------------------------------

    async def _load(self, conn: AsyncConnection, run_id: uuid.UUID, action: str) -> Run:
        run = await store.get_run(self.db, conn, run_id, lock=True)
        if run is None:
            raise NotFound(f"id: no task schedule run {run_id}")
        if run.rollout is None:
            raise FailedPrecondition(
                f"id: run {run_id} is not a rollout (its schedule has no rollout policy); cannot {action} it"
            )
        return run

    async def first_steps(self, run_ids: Collection[uuid.UUID]) -> FirstSteps:
        """These runs once no step holds them (each row locked, waiting for a step under way to commit): what
        a rollout's first step made of its run, whichever instance took it. The firing's own step (`advance`
        of its runs) may find a run another instance's rollout driver is stepping, or has just stepped, and
        start nothing itself; the answer to a trigger, an approval or a retry names the wave all the same.
        A run gone, deleted with its schedule since (perhaps after such a step), is told by the tasks that
        still name it (`store.rollouts.tasks_of_deleted_runs`; on SQLite, which clears that name, it cannot
        be told: `FirstSteps.gone` is None)."""
        found: dict[uuid.UUID, Run] = {}
        async with self.db.transaction() as conn:
            for run_id in in_id_order(run_ids):
                run = await store.get_run(self.db, conn, run_id, lock=True)
                if run is not None:
                    found[run_id] = run
            missing = [run_id for run_id in run_ids if run_id not in found]
            tasks = await store.tasks_of_deleted_runs(conn, missing) if missing else {}
        if tasks is None:
            return FirstSteps(found, None)
        gone: dict[uuid.UUID, list[uuid.UUID]] = {run_id: [] for run_id in missing}
        for (run_id, _), task in tasks.items():
            gone[run_id].append(task.task_id)
        return FirstSteps(found, {run_id: tuple(task_ids) for run_id, task_ids in gone.items()})

    async def get(self, run_id: uuid.UUID) -> RunReport:
        async with self.db.read() as conn:
            run = await store.get_run(self.db, conn, run_id)
            if run is None:
                raise NotFound(f"id: no task schedule run {run_id}")
            (report,) = await self._reports(conn, [run])
        return report

    async def as_fired(self, run: Run, task_ids: Collection[uuid.UUID]) -> RunReport:
        """The report of `run` as it was last recorded, with `task_ids`, the tasks its firing submitted (a
        rollout's: its first step started), the run itself deleted since with its schedule (a retry's or an
        approval's, whose tasks were submitted before the deletion: `ScheduleService.fired_report`). The
        tasks are read by their ids, as they outlive their run; a scope without a task whose rack one of
        them is on reads "submitted" (a rollout's, known by the tasks that still name its run alone)."""
        async with self.db.read() as conn:
            tasks = await store.tasks_by_id(conn, run.id, task_ids)
        on_rack = {rack_id: task for (_, rack_id), task in tasks.items()}
        started = [
            replace(o, outcome="submitted", task_id=on_rack[o.rack_id].task_id)
            if o.task_id is None and o.rack_id in on_rack
            else o
            for o in run.outcomes
        ]
        run = replace(run, outcomes=tuple(started))
        statuses = {task.task_id: task.status for task in tasks.values()}
        holds = {t.task_id: (t.held_by, t.held_reason or "") for t in tasks.values() if t.held_by is not None}
        progress = (
            None if run.rollout is None else _progress(run, scope_views(run, tasks, {}), self.clock.now())
        )
        return RunReport(run, statuses, progress, (), holds)

    async def summary(self, run_id: uuid.UUID) -> RunSummary:
        async with self.db.read() as conn:
            run = await run_history.run_head(conn, run_id)
            if run is None:
                raise NotFound(f"id: no task schedule run {run_id}")
            (summary,) = await self._summaries(conn, [run])
        return summary

    async def summaries(self, runs: Sequence[Run]) -> list[RunSummary]:
        """The runs (read without their outcomes) with their racks and tasks counted in the database:
        ListTaskScheduleRuns' BASIC view."""
        async with self.db.read() as conn:
            return await self._summaries(conn, runs)

    async def _summaries(self, conn: AsyncConnection, runs: Sequence[Run]) -> list[RunSummary]:
        """Each run's racks by outcome (its `outcome_counts` column) and tasks by status (the
        `(run_id, status)` index): a few small reads per run, whatever its racks."""
        run_ids = [run.id for run in runs]
        tallies = await run_history.run_tallies(conn, run_ids)
        counts = await store.task_status_counts(conn, run_ids)
        retries = await store.retried_by(conn, run_ids)
        return [
            RunSummary(run, tallies[run.id], counts[run.id], tuple(retries.get(run.id, ()))) for run in runs
        ]

    async def resume(self, run_id: uuid.UUID) -> RunReport:
        """Continue a halted rollout: its not-started scopes are pending again, the tasks the halt held go
        on (`rollouts.gate`), the failures so far are excused (the budget counts from zero), and the canary
        gate is passed. Its schedule stays paused (ResumeTaskSchedule resumes firing). Refused once its
        operation's own window has ended (a firmware upgrade's end_time): its next step could only cancel it
        (`domain.rollouts.decide`), and nothing can move the end. (A rollout still rolling at that end is
        cancelled by that step; one halted before it, by its failures, waits for an operator's look.)"""
        async with self.db.transaction() as conn:
            run = await self._load(conn, run_id, "resume")
            if run.state != "halted":
                raise FailedPrecondition(
                    f"id: run {run_id} is {run.state}; only a halted rollout can be resumed"
                )
            end = (await store.window_ends(conn, [run.schedule_id])).get(run.schedule_id)
            if end is not None and self.clock.now() >= end:
                raise FailedPrecondition(
                    f"id: run {run_id} cannot be resumed: {window_ended_reason(end)}; cancel it"
                )
            tasks = await store.task_states(conn, [run.id])
            failures = failures_counted(scope_views(run, tasks, {}), 0)
            await store.save_run(
                conn,
                replace(
                    run,
                    state="rolling",
                    outcomes=_marked(run, "not_started", "pending"),
                    reason="",
                    failures_excused=failures,
                    resumed=True,
                ),
            )
            await task_runs.release_held(conn, ROLLOUT_GATE, run_id=run.id)  # they go on, under its caps
            await outbox.record_events(conn, events.halt_cleared(run, "resumed", self.clock.now()))
        await self.advance([run_id])
        return await self.get(run_id)

    async def cancel(self, run_id: uuid.UUID) -> RunReport:
        """End a rolling or halted rollout: nothing more of it starts. Its pending scopes become
        not_started, and so do those whose task has not begun, which is ended (TERMINATED); tasks already
        started go on (CancelTask stops them, one by one)."""
        async with self.db.transaction() as conn:
            run = await self._load(conn, run_id, "cancel")
            if run.state not in ROLLOUT_LIVE_STATES:
                raise FailedPrecondition(
                    f"id: run {run_id} is {run.state}; only a rolling or halted rollout can be cancelled"
                )
            _, ended = await self.cancel_in(conn, run)
        self.tasks.after_ended(ended)
        return await self.get(run_id)

    async def cancel_in(
        self, conn: AsyncConnection, run: Run, why: str = "", *, by: str | None = None
    ) -> tuple[Run, Ended]:
        """Cancel a live rollout `run` (locked by the caller) in the caller's transaction: its pending
        scopes become not_started; its tasks that have not begun acting (held by its halt or another gate,
        waiting for their window or their rack's queue, or not claimed yet) are ended as CancelTask ends
        them, with the cancel as their reason, and their scopes become not_started too; its halt alert
        resolves. `why` comes first in its reason; `by`: who cancels it (None: the caller, as for a
        request; rackflow itself at its window's end). The caller calls `TaskManager.after_ended` with what
        was ended once it committed. A task that began (a retry's next attempt included) goes on; one a
        claim holds meanwhile is left to that claim's start gates: it runs if that claim starts it, and
        the rollout's gate ends it otherwise, at that claim or, handed back there by another gate, once
        that hold ends (`rollouts.gate`). The reason and the halt's clearing count what the cancel
        decided, which is all it can know: the tasks it ended, and those it left to a claim's gate (how
        many, not yet how each ends; the gate marks the scopes of those it ends "not_started", so the
        run's progress tells)."""
        principal = by or caller_name() or ANONYMOUS
        message = f"its rollout was cancelled by {principal}" + (f" ({why})" if why else "")
        ended = await self.tasks.cancel_not_begun_in(conn, run.id, message)
        unstarted = set(ended.task_ids)
        outcomes = settled_scopes(
            _marked(run, "pending", "not_started"), dict.fromkeys(unstarted, ("not_started", message))
        )
        not_started = sum(o.outcome == "not_started" for o in outcomes)
        counted = (
            f"cancelled with {not_started} scope(s) not started, {len(unstarted)} of them by ending a task "
            "that had not begun",
            f"{ended.left} task(s) an executor was claiming left to its start gate" if ended.left else "",
            "tasks already started were not cancelled",
        )
        reason = "; ".join(part for part in (run.reason, why, *counted) if part)
        cancelled = replace(run, state="cancelled", outcomes=outcomes, reason=reason)
        await store.save_run(conn, cancelled)
        await outbox.record_events(
            conn,
            events.halt_cleared(run, "cancelled", self.clock.now(), ended=len(unstarted), left=ended.left),
        )
        return cancelled, ended

    async def halted(self, limit: int) -> list[Run]:
        """Halted rollouts, newest first: each waits for someone to resume or cancel it."""
        async with self.db.read() as conn:
            return await store.halted_runs(conn, limit)

    async def live(self, schedule_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The state ("rolling" or "halted") of each of these schedules' live rollout, if it has one."""
        async with self.db.read() as conn:
            found = await store.live_rollouts(conn, schedule_ids)
        return {schedule_id: rollout.state for schedule_id, rollout in found.items()}

    async def reports(self, runs: Sequence[Run]) -> list[RunReport]:
        """The runs with their tasks' statuses and (rollouts) progress."""
        async with self.db.read() as conn:
            return await self._reports(conn, runs)

    async def part_reports(self, conn: AsyncConnection, parts: Sequence[RunPart]) -> list[RunReport]:
        """The runs' parts with their outcomes and those outcomes' tasks' statuses and holds, and (rollouts)
        progress: a part's outcomes are cut in the database and read with their tasks in one statement
        (`outcomes_with_tasks`), so a page costs its outcomes, not its runs' racks. A rollout's progress is
        the whole run's, read whole as GetTaskScheduleRun reads it."""
        found = await run_history.outcomes_with_tasks(conn, [p.run.id for p in parts if p.whole])
        for part in parts:
            if not part.whole:
                found |= await run_history.outcomes_with_tasks(conn, [part.run.id], part.start, part.stop)
        retries = await store.retried_by(conn, [p.run.id for p in parts])
        runs = [replace(p.run, outcomes=tuple(row.outcome for row in found[p.run.id])) for p in parts]
        rollouts = []
        for part, run in zip(parts, runs, strict=True):
            if run.rollout is not None:
                whole = run if part.whole else await store.get_run(self.db, conn, run.id)
                rollouts.append(whole or run)
        progress_of = {report.run.id: report.progress for report in await self._reports(conn, rollouts)}
        reports = []
        for part, run in zip(parts, runs, strict=True):
            rows = found[run.id]
            progress = progress_of.get(run.id)
            with_task = [(row.outcome.task_id, row) for row in rows if row.status is not None]
            reports.append(
                RunReport(
                    run,
                    {task_id: row.status for task_id, row in with_task if task_id and row.status},
                    progress,
                    tuple(retries.get(run.id, ())),
                    {
                        task_id: (row.held_by, row.held_reason or "")
                        for task_id, row in with_task
                        if task_id and row.held_by is not None
                    },
                    part.start,
                    part.count if not part.whole else len(run.outcomes),
                )
            )
        return reports

    async def _reports(self, conn: AsyncConnection, runs: Sequence[Run]) -> list[RunReport]:
        tasks = await store.task_states(conn, [r.id for r in runs])
        retries = await store.retried_by(conn, [r.id for r in runs])
        by_run: dict[uuid.UUID, dict[uuid.UUID, TaskStatus]] = {r.id: {} for r in runs}
        holds: dict[uuid.UUID, dict[uuid.UUID, tuple[str, str]]] = {r.id: {} for r in runs}
        for (run_id, _), task in tasks.items():
            by_run[run_id][task.task_id] = task.status
            if task.held_by is not None:
                holds[run_id][task.task_id] = (task.held_by, task.held_reason or "")
        now = self.clock.now()
        reports = []
        for run in runs:
            statuses = by_run[run.id]
            progress = _progress(run, scope_views(run, tasks, {}), now) if run.rollout is not None else None
            reports.append(RunReport(run, statuses, progress, tuple(retries.get(run.id, ())), holds[run.id]))
        return reports
