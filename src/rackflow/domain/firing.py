"""The planner: what a firing does, decided by pure functions over one snapshot of what it needs.

Every firing is load -> plan -> write. The caller reads a `Snapshot` in the transaction that claims the
firing (`rackflow.store.firing.load`), `plan` decides, and the caller writes the result
(`rackflow.store.firing.record`). The same `plan` decides a dispatched batch, a manual trigger and each
time the schedule preview shows, and `plan_starts` the scopes a rollout's step starts, so a preview cannot
disagree with what then happens. No I/O and no clock: the caller passes `now`, and every rule here is
tested without a database (tests/unit/test_planner.py).

For each schedule of the snapshot, `plan` decides:

1. its timing after this firing (`advance_after_firing`) and, dispatched, the slot it fires for (its
   `next_run_at`: the database records a slot once);
2. per scope, what is settled without a task. Only a dispatched firing is checked (`checks_scopes`); a
   manual one has no slot and fires every scope (the task manager's conflict rules still decide):
   - the SKIP overlap check: a scope whose last task is still active is "skipped_overlap";
   - the maintenance windows (`window_decisions`): a closed rack is "skipped_window" under the SKIP
     window policy; under DEFER its task is submitted waiting for the opening (`Firing.deferral`);
3. for a schedule with a rollout policy, its scopes in rollout order (`rollout_outcomes`: by rack name,
   then scope id; the first `canary_racks` scopes not settled above are the canaries), every one not
   settled "pending" for the rollout's steps. While its previous rollout is live (rolling or halted) the
   firing is skipped with the reason (`Firing.skipped`): a dispatched one is recorded as skipped, a
   manual one refused (`Firing.refused`).
4. for a schedule with an approval policy (`rackflow.domain.approvals`), that the run awaits approval
   (`Firing.approval`): the plan above (`planned_outcomes`: which racks, in which waves) is recorded frozen
   and nothing is submitted. A manual trigger whose caller approved it as it fired counts that approval,
   and starts at once when it is enough. While a run of the schedule awaits approval, a firing is skipped
   with the reason (`awaiting_skip_reason`), as for a live rollout: approvals never pile up. Once approved,
   `approved_firing` rebuilds the firing from the frozen plan, and it takes the same path as any firing.
5. the start deadline (`start_deadline_at`, dispatched firings only: a manual trigger is never missed):
   a firing found later than its slot + the deadline is missed (`Firing.late_by`): every scope "missed",
   nothing submitted, the schedule advanced as any firing advances it. A deferred scope whose window opens
   at or after the deadline is "missed" too, and one that opens before it must start by the deadline (its
   task's end is capped there, so it fails rather than starts late); a firing left with nothing to submit
   but missed scopes is missed as a whole, late by as much as its earliest opening. A rollout's first wave
   (`first_wave`: the scopes it starts as it fires) is bound alike, when its step starts it: each of its
   pending scopes carries the deadline (`ScopeOutcome.start_by`) for `plan_starts`. Its later waves are
   not late starts: the deadline decides whether the firing starts, not how long its rollout takes. A
   run awaiting approval keeps the deadline on the pending scopes of its frozen plan (a plain run's all,
   a rollout's first wave), so once approved their deferrals are bound by the same slot + deadline as a
   firing that needed no approval: the deadline counts from the slot, not from the approval.

6. before all of the above, the operation's own window (`Operation.window_over`: a firmware upgrade at or
   past its end_time): every task the firing made would fail unrun at its claim, as would every later
   firing's, so it is skipped whole with the reason (`window_ended_reason`); a dispatched one is recorded
   skipped and pauses its schedule (`Firing.pauses`), a manual one is refused.

`failing_streak` decides, from the tallies of a schedule's newest runs, whether its
`pause_after_failed_runs` pauses it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from rackflow.domain.approvals import Approver, RunApproval, opened
from rackflow.domain.rollouts import Phase, RackPlace, RolloutPolicy, ScopeView, decide
from rackflow.domain.schedules import (
    Outcome,
    OverlapPolicy,
    Run,
    RunState,
    Schedule,
    Scope,
    ScopeOutcome,
    Trigger,
)
from rackflow.domain.tasks import Operation, TaskStatus
from rackflow.domain.window_rules import FIRE, Decision, decide_firing
from rackflow.domain.windows import MaintenanceWindow, RackRef, WindowPolicy
from rackflow.frozen import quick_init
from rackflow.ids import id_at_time, new_id
from rackflow.timespec import IntervalTiming, SpecType, format_go_duration, format_rfc3339, parse_spec


@dataclass(frozen=True)
class LiveRollout:
    """A schedule's rolling or halted run: at most one per schedule (a unique index)."""

    run_id: uuid.UUID
    state: RunState


@dataclass(frozen=True)
class Snapshot:
    """What the planner decides from, read at once for a batch of schedules.

    `scopes`: each schedule's, in creation order. `busy`: the scopes whose last task is still active (read
    only where the overlap check runs). `windows` and `racks` (each existing rack's NVLink domain): read
    only where windows are obeyed; a rack missing from `racks` (deleted) is left to the task manager.
    `live_rollouts` (by schedule) and `places` (rack names, for rollout order): read only for rollouts.
    `awaiting`: each schedule's run awaiting approval (at most one: a unique index), read only for the
    schedules that need approval.
    """

    schedules: tuple[Schedule, ...]
    scopes: Mapping[uuid.UUID, Sequence[Scope]]
    busy: frozenset[uuid.UUID] = frozenset()
    windows: tuple[MaintenanceWindow, ...] = ()
    racks: Mapping[uuid.UUID, RackRef] = field(default_factory=dict)
    live_rollouts: Mapping[uuid.UUID, LiveRollout] = field(default_factory=dict)
    places: Mapping[uuid.UUID, RackPlace] = field(default_factory=dict)
    awaiting: Mapping[uuid.UUID, uuid.UUID] = field(default_factory=dict)


@quick_init
@dataclass(frozen=True)
class Firing:
    """One schedule's planned firing, the run that records it, and (once recorded) phases 2 and 3's input.

    `enabled`, `next_run_at`: the schedule's timing after this firing. `scheduled_for`: the slot a
    dispatched firing is due at (None: manual). `decided`: the scopes settled without a task, with their
    outcome. `windows`: what the windows make each other scope do (dispatched only). `rollout_outcomes`: a
    rollout's every scope as its run starts, in rollout order. `skipped`: why the firing does nothing (its
    schedule's previous rollout is live), or "". `late_by`: set when the firing is missed (recorded as
    such with `missed_reason`, submitting nothing).
    """

    schedule: Schedule
    scopes: Sequence[Scope]
    trigger: Trigger
    fired_at: datetime
    run_id: uuid.UUID
    enabled: bool
    next_run_at: datetime | None
    scheduled_for: datetime | None = None
    decided: Mapping[uuid.UUID, ScopeOutcome] = field(default_factory=dict)
    windows: Mapping[uuid.UUID, Decision] = field(default_factory=dict)
    rollout_outcomes: tuple[ScopeOutcome, ...] = ()
    skipped: str = ""
    approval: RunApproval | None = None
    late_by: timedelta | None = None  # set: the firing is missed (past its start deadline), this late
    missed_reason: str = ""
    start_by: datetime | None = None  # awaiting approval: the start deadline its plan's pending scopes keep
    # The windows `windows` was decided from (dispatched only: `Snapshot.windows`); should the submit find
    # them changed, it owes its tasks a window's decision (`rackflow.schedules.firing`).
    windows_read: tuple[MaintenanceWindow, ...] = ()
    # Set: its operation's own window (a firmware upgrade's end_time) ended then, so the firing is skipped
    # (`skipped` says why) and, dispatched, pauses its schedule (`pauses`).
    window_ended: datetime | None = None

    @property
    def pauses(self) -> bool:
        """The firing pauses its schedule, by rackflow, with `skipped` as the reason: a dispatched one whose
        operation's window has ended, of a schedule that would fire again (a one-time one is consumed)."""
        return self.window_ended is not None and self.trigger == "dispatch" and self.enabled

    @property
    def missed(self) -> bool:
        return self.late_by is not None

    @property
    def rolls_out(self) -> bool:
        return self.schedule.rollout is not None

    @property
    def needs_approval(self) -> bool:
        """Recorded "awaiting_approval", its plan frozen, and nothing started (not approved as it fired)."""
        return self.approval is not None and self.approval.decided_at is None

    @property
    def refused(self) -> bool:
        """A skipped manual firing is refused and records nothing; a dispatched one is recorded as skipped
        (its slot is spent all the same)."""
        return bool(self.skipped) and self.trigger == "manual"

    def deferral(self, scope_id: uuid.UUID) -> Decision | None:
        """The window opening the scope's task waits for (None: it may start at once)."""
        decision = self.windows.get(scope_id)
        return decision if decision is not None and decision.action == "defer" else None

    def bound(self, scope_id: uuid.UUID) -> Decision | None:
        """What the windows bind the scope's task to (`starts_bound`): the opening it waits for, or the end
        of the ALLOW window it fires in (None: nothing)."""
        return starts_bound(self.windows.get(scope_id))

    def submitted(self, scope_id: uuid.UUID, rack_id: uuid.UUID, task_id: uuid.UUID) -> ScopeOutcome:
        """The outcome of a scope whose task was submitted: with the firing's start deadline when the
        windows bind the task (`deadline_end`)."""
        start_by = deadline_end(self.bound(scope_id))
        return ScopeOutcome(scope_id, rack_id, "submitted", task_id=task_id, start_by=start_by)

    @property
    def to_submit(self) -> list[Scope]:
        return [scope for scope in self.scopes if scope.id not in self.decided]

    @property
    def planned_outcomes(self) -> tuple[ScopeOutcome, ...]:
        """The plan as a run awaiting approval freezes it: a rollout's scopes in rollout order (canaries
        marked), else every scope in order; settled ones with their outcome, the others "pending", each
        with the firing's start deadline (`start_by`) that binds its deferral once approved."""
        if self.rolls_out:
            return self.rollout_outcomes
        return tuple(
            self.decided.get(sc.id) or ScopeOutcome(sc.id, sc.rack_id, "pending", start_by=self.start_by)
            for sc in self.scopes
        )


def checks_scopes(trigger: Trigger) -> bool:
    """Whether a firing runs the overlap check and obeys the windows: a dispatched firing (and its
    rollout's steps) does; a manual one has no slot and obeys no ALLOW window (the freeze gate still
    holds its tasks)."""
    return trigger == "dispatch"


def overlap_checked(schedule: Schedule, trigger: Trigger) -> bool:
    """Whether a firing of `schedule` skips the scopes whose last task is still active."""
    return checks_scopes(trigger) and schedule.overlap_policy is OverlapPolicy.SKIP


def plan(
    snapshot: Snapshot,
    now: datetime,
    trigger: Trigger,
    name_run: Callable[[datetime | None], uuid.UUID] | None = None,
    approver: Approver | None = None,
    *,
    default_start_deadline: timedelta | None = None,
) -> list[Firing]:
    """Each schedule of the snapshot fired at `now` by `trigger`, decided as the module says; `name_run`
    names each firing's run from its slot (`run_id`, by default); `approver`: a manual trigger's caller who
    approves it as it fires. `default_start_deadline`: the server's, for a schedule without its own."""
    name = name_run or run_id
    return [
        _plan_one(
            snapshot,
            schedule,
            now,
            trigger,
            name(slot_of(schedule, trigger)),
            approver,
            default_start_deadline,
        )
        for schedule in snapshot.schedules
    ]


def slot_of(schedule: Schedule, trigger: Trigger) -> datetime | None:
    """The slot a firing of `schedule` is due at: its `next_run_at` when dispatched; None (no slot) when
    manual."""
    return schedule.next_run_at if trigger == "dispatch" else None


def run_id(slot: datetime | None) -> uuid.UUID:
    """The id of a firing's run: minted at its slot's millisecond (`ids.id_at_time`), so that on
    PostgreSQL, where the runs are partitioned by slot, the id alone says which partition holds the run
    (`store.run_partitions.of_runs`); a manual run's (no slot, the DEFAULT partition), and one whose slot
    is before 1970, which a version 7 id cannot hold (the DEFAULT partition too), made now (`ids.new_id`).
    Unique either way: 74 random bits a millisecond, and a slot fires once per schedule."""
    if slot is None:
        return new_id()
    try:
        return id_at_time(slot)
    except ValueError:
        return new_id()


def own_or_default(own: timedelta | None, default: timedelta | None) -> timedelta | None:
    """A schedule's start deadline: its own (`own`), else the server's default; its own zero means none,
    whatever the default."""
    deadline = own if own is not None else default
    return deadline if deadline else None


def start_deadline_at(schedule: Schedule, trigger: Trigger, default: timedelta | None) -> datetime | None:
    """The latest time a firing of `schedule` for its slot (`next_run_at`) may start (`slot_deadline`).
    None: a manual firing (which has no slot and is never missed)."""
    if trigger != "dispatch":
        return None
    return slot_deadline(schedule.next_run_at, schedule.start_deadline, default)


def slot_deadline(slot: datetime | None, own: timedelta | None, default: timedelta | None) -> datetime | None:
    """The start deadline of a dispatched firing for `slot`, under its schedule's own deadline (`own`, else
    the server's `default`): slot + deadline; None without either. It depends only on the stored slot and
    deadline, so every instance decides the same from the database's clock, and a window's change finds the
    deadline of a firing whose write-back has not yet recorded it in the run's outcomes."""
    deadline = own_or_default(own, default)
    return slot + deadline if slot is not None and deadline is not None else None


def late_text(late_by: timedelta) -> str:
    """How late a missed firing was found, for people: whole seconds (`1h10m49s`; the run keeps `late_by`
    exactly, which `-o json` and the API show)."""
    return format_go_duration(timedelta(seconds=round(late_by.total_seconds())))


def missed_reason(late_by: timedelta, deadline: timedelta) -> str:
    """Why the firing is missed, in whole seconds (the run keeps `late_by` exactly)."""
    return (
        f"found {late_text(late_by)} after its slot, past its start deadline of "
        f"{format_go_duration(deadline)}; nothing was submitted"
    )


def _missed(
    firing: Firing, late_by: timedelta, deadline: timedelta, decided: Mapping[uuid.UUID, ScopeOutcome]
) -> Firing:
    """The firing missed as a whole: every scope "missed" (keeping a deferral's words), nothing to do."""
    reason = missed_reason(late_by, deadline)
    outcomes = {
        sc.id: decided[sc.id]
        if sc.id in decided and decided[sc.id].outcome == "missed"
        else ScopeOutcome(sc.id, sc.rack_id, "missed", error=reason)
        for sc in firing.scopes
    }
    return replace(firing, decided=outcomes, late_by=late_by, missed_reason=reason)


def _by_deadline(decision: Decision, deadline_at: datetime) -> Decision:
    """A decision under a start deadline: a deferral whose opening is at or after it is "missed"; one
    before it must start by it (its end capped there), and keeps it (`Decision.deadline`). A fire inside
    an ALLOW window (an end to start by) is not capped, since it fires in time, but keeps it too: a
    window's change may yet defer its task, and then the deadline binds that wait (`redeferral`)."""
    if decision.action == "fire" and decision.closes_at is not None:
        return replace(decision, deadline=deadline_at)
    if decision.action != "defer":
        return decision
    assert decision.opens_at is not None
    if decision.opens_at >= deadline_at:
        return replace(decision, action="missed", closes_at=None)
    return _capped(decision, deadline_at)


def _capped(decision: Decision, deadline_at: datetime) -> Decision:
    """A deferral's (or a release's) end capped at the start deadline, which it keeps."""
    if decision.closes_at is None or decision.closes_at > deadline_at:
        return replace(decision, closes_at=deadline_at, by_deadline=True, deadline=deadline_at)
    return replace(decision, deadline=deadline_at)


def starts_bound(decision: Decision | None) -> Decision | None:
    """The decision a scope's task is submitted with: a deferral (its opening), or a fire (inside an ALLOW
    window, its end, by which the task must start); None for a scope the windows settled."""
    return decision if decision is not None and decision.action in ("fire", "defer") else None


def deadline_end(bound: Decision | None) -> datetime | None:
    """The start deadline of the firing of a task the windows bind (`starts_bound`: deferred, or fired
    inside an ALLOW window): what its scope's outcome keeps as `start_by`, so that a deferred task failed
    there is told so when it (not its window's end) ended the wait, and so that a window's change decides
    the task's wait or end again under it (`redeferral`)."""
    return bound.deadline if bound is not None else None


def redeferral(
    windows: Sequence[MaintenanceWindow],
    rack: RackRef,
    operation: Operation,
    now: datetime,
    deadline_at: datetime | None,
    policy: WindowPolicy,
    within_deadline: bool,
) -> Decision:
    """What a task of a dispatched firing that its windows bind becomes when a window covering its rack
    changes (a deferred task's wait, under DEFER; or the end a task fired inside an ALLOW window must start
    by, under either policy): what a firing of its scope at `now` would decide under its schedule's
    `policy` (`scope_decision`), under the start deadline its firing bound it to (`deadline_at`: its
    outcome's `start_by`). "defer": wait for the new opening; "fire": start now, by the end of the ALLOW
    window it is in; "skip_window": closed under SKIP, or no opening left (or none within its operation's
    own window); "missed": the opening comes at or after the deadline.

    A task `within_deadline` (one that waits, whose end the deadline capped; or one already due by then)
    released or rebound must start by the deadline all the same (its end capped there, as its deferral's
    was), or another gate holding it past its opening could start it after slot + deadline. Only a task
    fired inside an ALLOW window that ends after the deadline is rebound uncapped, as it fired
    (`_by_deadline`): a firing in time binds its task to the window's end alone."""
    decision = scope_decision(windows, rack, operation, now, policy)
    if deadline_at is None:
        return decision
    if within_deadline and decision.action == "fire":
        return _capped(decision, deadline_at)
    return _by_deadline(decision, deadline_at)


def _plan_one(
    snapshot: Snapshot,
    schedule: Schedule,
    now: datetime,
    trigger: Trigger,
    run_id: uuid.UUID,
    approver: Approver | None = None,
    default_start_deadline: timedelta | None = None,
) -> Firing:
    scopes = tuple(snapshot.scopes.get(schedule.id, ()))
    if schedule.operation.window_over(now):
        return _window_ended(schedule, scopes, now, trigger, run_id)
    deadline_at = start_deadline_at(schedule, trigger, default_start_deadline)
    late = deadline_at is not None and now > deadline_at
    decided: dict[uuid.UUID, ScopeOutcome] = {}
    windows: dict[uuid.UUID, Decision] = {}
    if not late and overlap_checked(schedule, trigger):
        decided = {
            sc.id: ScopeOutcome(sc.id, sc.rack_id, "skipped_overlap")
            for sc in scopes
            if sc.id in snapshot.busy
        }
    if not late and checks_scopes(trigger) and snapshot.windows:
        left = [sc for sc in scopes if sc.id not in decided]
        windows = window_decisions(snapshot.windows, snapshot.racks, schedule, left, now)
        decided |= {
            sc.id: ScopeOutcome(sc.id, sc.rack_id, "skipped_window", error=windows[sc.id].reason)
            for sc in left
            if sc.id in windows and windows[sc.id].action == "skip_window"
        }
        if deadline_at is not None:
            windows = {scope_id: _by_deadline(d, deadline_at) for scope_id, d in windows.items()}
            decided |= {
                sc.id: ScopeOutcome(sc.id, sc.rack_id, "missed", error=windows[sc.id].reason)
                for sc in left
                if sc.id in windows and windows[sc.id].action == "missed"
            }
    enabled, next_run_at = advance_after_firing(schedule, now)
    # Built once with what the scopes decided: rebuilding the frozen dataclass with `replace` was a third
    # of this function's time (docs/PERFORMANCE.md, "Issue 29"); the rarer paths below still do.
    firing = Firing(
        schedule=schedule,
        scopes=scopes,
        trigger=trigger,
        fired_at=now,
        run_id=run_id,
        enabled=enabled,
        next_run_at=next_run_at,
        scheduled_for=slot_of(schedule, trigger),
        decided=decided,
        windows=windows,
        windows_read=snapshot.windows,
    )
    if late:
        assert deadline_at is not None and schedule.next_run_at is not None
        return _missed(firing, now - schedule.next_run_at, deadline_at - schedule.next_run_at, {})
    missed_openings = [d.opens_at for d in windows.values() if d.action == "missed" and d.opens_at]
    if missed_openings and not firing.to_submit:  # nothing could start in time
        assert deadline_at is not None and schedule.next_run_at is not None
        slot = schedule.next_run_at
        return _missed(firing, min(missed_openings) - slot, deadline_at - slot, decided)
    awaiting = snapshot.awaiting.get(schedule.id) if schedule.approval is not None else None
    if awaiting is not None:
        return replace(firing, skipped=awaiting_skip_reason(awaiting))
    live = snapshot.live_rollouts.get(schedule.id) if schedule.rollout is not None else None
    if live is not None:  # skipped before any approval opens: nobody is asked to approve a skipped run
        return replace(firing, skipped=skip_reason(live))
    if schedule.approval is not None:
        # Its plan's pending scopes keep the deadline: once approved, their deferrals are bound by it as
        # they would have been had the firing started them (`plan_starts`).
        approval = opened(
            schedule.approval, now, approver, schedule.last_edited_by, schedule.operation.window_end
        )
        firing = replace(firing, approval=approval, start_by=deadline_at)
    if schedule.rollout is None:
        return firing
    return replace(firing, rollout_outcomes=rollout_outcomes(firing, snapshot.places, deadline_at))


def window_ended_reason(end: datetime) -> str:
    """Why a firing past its operation's own window is skipped, and its schedule paused."""
    return (
        f"its firmware window ended at {format_rfc3339(end)} (its upgrade's end_time): every task it "
        "fires would fail unrun, so it submits nothing; create a new schedule with a later end_time"
    )


def _window_ended(
    schedule: Schedule, scopes: tuple[Scope, ...], now: datetime, trigger: Trigger, run_id: uuid.UUID
) -> Firing:
    """A firing at or past its operation's window end (`Operation.window_over`): each of its tasks would
    fail unrun at its claim, and every later firing's too, since nothing can change the operation. So it
    is skipped whole, before the rest is decided: a dispatched one is recorded skipped (its slot spent,
    the schedule advanced as any firing advances it) and pauses its schedule (`Firing.pauses`); a manual
    one is refused (`Firing.refused`)."""
    end = schedule.operation.window_end
    assert end is not None
    enabled, next_run_at = advance_after_firing(schedule, now)
    return Firing(
        schedule=schedule,
        scopes=scopes,
        trigger=trigger,
        fired_at=now,
        run_id=run_id,
        enabled=enabled,
        next_run_at=next_run_at,
        scheduled_for=slot_of(schedule, trigger),
        skipped=window_ended_reason(end),
        window_ended=end,
    )


def awaiting_skip_reason(run_id: uuid.UUID) -> str:
    """Why a firing is skipped while the schedule's previous firing awaits approval."""
    return (
        f"the schedule's previous run (run {run_id}) is still awaiting approval (approve or reject it first)"
    )


def approved_firing(run: Run, snapshot: Snapshot, now: datetime) -> Firing:
    """The firing an approved run starts at `now`, from its frozen plan (`run.outcomes`); `snapshot` holds
    the run's schedule, the scopes of its pending outcomes still in it, and (where windows are obeyed) the
    windows and racks, as `plan_starts` needs.

    A rollout starts as any rollout does, by its own policy as fired and its steps. A plain firing submits
    its pending scopes as `plan_starts` settles them now: a scope removed from the schedule meanwhile is
    "not_started", and a dispatched run's scopes obey the windows as they stand when it starts, as a
    rollout's do when their turn comes (approval may come hours after the firing), their deferrals bound
    by the firing's start deadline (each pending outcome's `start_by`)."""
    (schedule,) = snapshot.schedules
    firing = Firing(
        schedule=replace(schedule, rollout=run.rollout),
        scopes=(),
        trigger=run.trigger,
        fired_at=now,
        run_id=run.id,
        enabled=schedule.enabled,
        next_run_at=schedule.next_run_at,
        approval=run.approval,
        windows_read=snapshot.windows,
    )
    if run.rollout is not None:
        return replace(firing, rollout_outcomes=run.outcomes)
    pending = [o.scope_id for o in run.outcomes if o.outcome == "pending"]
    starts = plan_starts(snapshot, run.outcomes, pending, run.trigger, now)
    present = {sc.id: sc for sc in snapshot.scopes.get(schedule.id, ())}
    scopes = tuple(
        present.get(o.scope_id) or Scope(o.scope_id, schedule.id, o.rack_id, None, None, run.fired_at)
        for o in run.outcomes
    )
    decided = {o.scope_id: o for o in run.outcomes if o.outcome != "pending"} | dict(starts.settled)
    windows = {sc.id: bound for sc, bound in starts.submit if bound is not None}
    return replace(firing, scopes=scopes, decided=decided, windows=windows)


SKIP_OVERLAP = Decision("skip_overlap")
MISSED = Decision("missed")
# The whole firing is skipped (`Firing.skipped` says why): nothing of it is submitted.
SKIP_RUN = Decision("skip_run")


def scope_decisions(firing: Firing) -> dict[uuid.UUID, Decision]:
    """What the firing does for each of its scopes, as the schedule preview shows it: skipped for overlap,
    missed (past the start deadline), or what the windows make it do (FIRE where none close its rack); every
    scope of a firing skipped whole (the schedule's previous rollout live, or its previous run awaiting
    approval) is SKIP_RUN, as the dispatcher records such a firing `skipped` and submits nothing."""
    if firing.skipped:
        return dict.fromkeys((sc.id for sc in firing.scopes), SKIP_RUN)
    decisions = {}
    for sc in firing.scopes:
        outcome = firing.decided[sc.id].outcome if sc.id in firing.decided else None
        window = firing.windows.get(sc.id)
        if outcome == "skipped_overlap":
            decisions[sc.id] = SKIP_OVERLAP
        elif outcome == "missed" and (window is None or window.action != "missed"):
            decisions[sc.id] = MISSED
        else:
            decisions[sc.id] = window or FIRE
    return decisions


def skip_reason(live: LiveRollout) -> str:
    """Why a rollout's firing is skipped: the schedule's live rollout, and what an operator can do about it
    (only a halted one can be resumed)."""
    then = "resume or cancel it first" if live.state == "halted" else "let it finish or cancel it first"
    return f"the schedule's previous rollout (run {live.run_id}) is still {live.state} ({then})"


def rollout_outcomes(
    firing: Firing, places: Mapping[uuid.UUID, RackPlace], start_by: datetime | None = None
) -> tuple[ScopeOutcome, ...]:
    """A rollout's scopes as its run starts: in rollout order, by rack name (a deleted rack's first), then
    scope id, stable across firings; the settled ones keep their outcome, every other one is "pending",
    and the first `canary_racks` of those are the canaries. `start_by`: the firing's start deadline, which
    the scopes of its first wave carry (`first_wave`)."""
    assert firing.schedule.rollout is not None
    canaries = firing.schedule.rollout.canary_racks
    ordered = sorted(
        firing.scopes,
        key=lambda sc: (places[sc.rack_id].name if sc.rack_id in places else "", str(sc.id)),
    )
    outcomes = []
    for scope in ordered:
        if scope.id in firing.decided:
            outcomes.append(firing.decided[scope.id])
        else:
            outcomes.append(ScopeOutcome(scope.id, scope.rack_id, "pending", canary=canaries > 0))
            canaries -= 1
    if start_by is None:
        return tuple(outcomes)
    first = first_wave(firing.schedule.rollout, outcomes, places, firing.fired_at)
    return tuple(replace(o, start_by=start_by) if o.scope_id in first else o for o in outcomes)


def first_wave(
    policy: RolloutPolicy,
    outcomes: Sequence[ScopeOutcome],
    places: Mapping[uuid.UUID, RackPlace],
    now: datetime,
) -> set[uuid.UUID]:
    """The scopes a new rollout starts as it fires (its canaries, or as many as its caps let start): what
    the rollout rule answers for its scopes as its run starts, none started yet."""
    views = [
        ScopeView(
            o.scope_id,
            o.rack_id,
            places[o.rack_id].name if o.rack_id in places else str(o.rack_id),
            places[o.rack_id].domain_id if o.rack_id in places else None,
            Phase.PENDING if o.outcome == "pending" else Phase.SKIPPED,
            o.canary,
        )
        for o in outcomes
    ]
    return set(decide(policy, views, now=now).start)


# What the windows settle a rollout's scope as, without a task, when its turn comes.
SETTLED_BY_WINDOWS: Mapping[str, Outcome] = {"skip_window": "skipped_window", "missed": "missed"}


@dataclass(frozen=True)
class Starts:
    """What a rollout's step does with the scopes its rule starts: the outcomes it settles without a task
    (`settled`: removed from the schedule, or closed by a window), and the scopes to submit, each with what
    the windows bind its task to (`starts_bound`: the opening it waits for, or the end of the ALLOW window
    it starts in; None: nothing)."""

    settled: Mapping[uuid.UUID, ScopeOutcome]
    submit: tuple[tuple[Scope, Decision | None], ...]


def plan_starts(
    snapshot: Snapshot,
    outcomes: Sequence[ScopeOutcome],
    start: Sequence[uuid.UUID],
    trigger: Trigger,
    now: datetime,
) -> Starts:
    """A rollout step's starts (`start`, from the rollout rule) for the run whose scopes stand at
    `outcomes`; `snapshot` holds its one schedule and the scopes still in it.

    A scope removed from the schedule meanwhile is "not_started". A dispatched rollout's scope obeys the
    windows when its turn comes, as a firing's scopes do when it fires: closed under SKIP it is
    "skipped_window" (neither success nor failure), under DEFER its task waits for the opening; a scope
    of the first wave (its outcome's `start_by`: the firing's start deadline) is bound by the deadline as
    a firing's deferral is, "missed" when the opening comes at or after it, else its wait ending by it."""
    (schedule,) = snapshot.schedules
    by_id = {o.scope_id: o for o in outcomes}
    present_by_id = {sc.id: sc for sc in snapshot.scopes.get(schedule.id, ())}
    settled: dict[uuid.UUID, ScopeOutcome] = {
        gone: replace(by_id[gone], outcome="not_started", error="removed from the schedule's scope")
        for gone in start
        if gone not in present_by_id
    }
    present = [present_by_id[i] for i in start if i in present_by_id]
    windows: dict[uuid.UUID, Decision] = {}
    if checks_scopes(trigger) and snapshot.windows:
        windows = window_decisions(snapshot.windows, snapshot.racks, schedule, present, now)
    for scope_id, decision in windows.items():
        deadline_at = by_id[scope_id].start_by
        if deadline_at is not None:
            decision = windows[scope_id] = _by_deadline(decision, deadline_at)
        if decision.action in SETTLED_BY_WINDOWS:
            outcome = SETTLED_BY_WINDOWS[decision.action]
            settled[scope_id] = replace(by_id[scope_id], outcome=outcome, error=decision.reason)
    submit = tuple((sc, starts_bound(windows.get(sc.id))) for sc in present if sc.id not in settled)
    return Starts(settled, submit)


def window_decisions(
    windows: Sequence[MaintenanceWindow],
    racks: Mapping[uuid.UUID, RackRef],
    schedule: Schedule,
    scopes: Collection[Scope],
    at: datetime,
) -> dict[uuid.UUID, Decision]:
    """What the windows make a firing of `schedule` at `at` do for each scope (`window_rules.decide_firing`
    under the schedule's window policy).

    A rack missing from `racks` (deleted) is left to the task manager, which refuses it."""
    decisions: dict[uuid.UUID, Decision] = {}
    for scope in scopes:
        rack = racks.get(scope.rack_id)
        if rack is not None:
            decisions[scope.id] = scope_decision(
                windows, rack, schedule.operation, at, schedule.window_policy
            )
    return decisions


def scope_decision(
    windows: Sequence[MaintenanceWindow],
    rack: RackRef,
    operation: Operation,
    at: datetime,
    policy: WindowPolicy,
) -> Decision:
    """What the windows make a firing at `at` do for one scope on `rack` (`window_rules.decide_firing`);
    a deferred firmware upgrade that has a window of its own waits for the overlap of both, and is skipped
    if they do not meet."""
    decision = decide_firing(windows, rack, operation.kind, at, policy)
    return _within_own_window(decision, operation) if decision.action == "defer" else decision


def _within_own_window(decision: Decision, operation: Operation) -> Decision:
    assert decision.opens_at is not None
    opens_at = max(decision.opens_at, operation.window_start or decision.opens_at)
    ends = [end for end in (decision.closes_at, operation.window_end) if end is not None]
    closes_at = min(ends, default=None)
    if closes_at is not None and closes_at <= opens_at:
        return replace(decision, action="skip_window", opens_at=None, closes_at=None)
    return replace(decision, opens_at=opens_at, closes_at=closes_at)


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
    times: list[datetime] = []
    try:
        if after is not None and moment <= after:  # it fires before `after`: skip to the first one past it
            if isinstance(timing, IntervalTiming):
                moment += timing.step * ((after - moment) // timing.step + 1)
            else:
                moment = timing.next_after(after) if schedule.spec.type is not SpecType.ONE_TIME else None
        while moment is not None and len(times) < count:
            times.append(moment)
            moment = advance_after_firing(replace(schedule, enabled=True), moment)[1]
    except OverflowError:  # the next one is past year 9999: the times before it
        pass
    return times


@dataclass(frozen=True)
class RunResult:
    """A firing's outcome per scope as recorded (a rollout's, as its first step left them once its run was
    read after it); a rollout's `started`: the tasks its first step started.

    `state`: the state its run was last recorded in, where it is not the one its firing leaves it in
    (`recorded_state`): "running" when its write-back did not complete it (its schedule deleted since
    with it, or the database away past the write-back's deadline); a rollout's, as its first step left it.
    `deleted`: its schedule was deleted, with its run, after its claim and before anything of it was
    submitted: a plain firing's submit submitted none of its scopes (each "failed", saying so), no task of
    a rollout's names its run; nothing of it is recorded (`schedules.firing.fire`).
    `untold`: a rollout's run deleted so before its firing's own step, on a database that cleared the run's
    id from its tasks (SQLite): whether another step started racks of it first cannot be told.
    """

    run_id: uuid.UUID
    outcomes: tuple[ScopeOutcome, ...]
    started: tuple[uuid.UUID, ...] = ()
    deleted: bool = False
    state: RunState | None = None
    untold: bool = False

    @property
    def task_ids(self) -> list[uuid.UUID]:
        return [outcome.task_id for outcome in self.outcomes if outcome.task_id is not None]


def recorded_state(firing: Firing, result: RunResult) -> RunState:
    """The state `firing`'s run was last recorded in, as `result` says: a rollout's "rolling" (its claim
    and first step leave it so) and a plain firing's "completed" (its write-back) unless said otherwise."""
    return result.state or ("rolling" if firing.rolls_out else "completed")


# Runs that neither start nor fail anything, so they neither count towards nor break a failing streak: a
# missed or skipped firing, and one no one approved (yet): waiting, rejected or expired. Approved, a run is
# "running" or "rolling" and counts from then on.
NOT_COUNTED_STATES: tuple[RunState, ...] = ("missed", "skipped", "awaiting_approval", "rejected", "expired")


@dataclass(frozen=True)
class RunTally:
    """One run as `pause_after_failed_runs` counts it: `finished` (the run is no longer running or rolling
    and each of its tasks has reached a final status) and `failed` (a rack not submitted, or a task
    ended FAILED)."""

    run_id: uuid.UUID
    fired_at: datetime
    finished: bool
    failed: bool


def tally(
    run_id: uuid.UUID,
    fired_at: datetime,
    state: RunState,
    outcomes: Sequence[ScopeOutcome],
    task_statuses: Mapping[uuid.UUID, TaskStatus],
) -> RunTally:
    """The run counted from its tasks' final statuses (a task missing from `task_statuses`, pruned, is
    taken as ended without failing). A halted rollout has stopped on its failures: finished."""
    statuses = [
        task_statuses[o.task_id] for o in outcomes if o.task_id is not None and o.task_id in task_statuses
    ]
    finished = state not in ("running", "rolling") and not any(s.is_active for s in statuses)
    failed = any(o.outcome == "failed" for o in outcomes) or TaskStatus.FAILED in statuses
    return RunTally(run_id, fired_at, finished, failed)


def extends_streak(run: RunTally) -> bool:
    """Whether the run can be part of a failing streak: finished, with a failure."""
    return run.finished and run.failed


def failing_streak(newest_first: Sequence[RunTally], limit: int) -> tuple[RunTally, ...]:
    """The `limit` newest counted runs if every one has finished with a failure (they pause the
    schedule), else (). A newer run still going decides nothing yet; a newer success breaks the streak."""
    if limit <= 0 or len(newest_first) < limit:
        return ()
    streak = tuple(newest_first[:limit])
    return streak if all(extends_streak(t) for t in streak) else ()


def streak_reason(streak: Sequence[RunTally]) -> str:
    """The pause's reason, naming the runs, oldest first."""
    runs = ", ".join(str(t.run_id) for t in reversed(streak))
    return f"paused by rackflow: {len(streak)} consecutive runs with a failed rack ({runs})"
