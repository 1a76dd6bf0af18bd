"""Schedule values: the schedule, its scope entries, and the record of each firing."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple

from rackflow.domain.approvals import ApprovalPolicy, RunApproval
from rackflow.domain.audit import SYSTEM_PRINCIPAL
from rackflow.domain.inventory import ComponentFilter
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import ConflictStrategy, Operation, RetryPolicy, TaskStatus
from rackflow.domain.windows import WindowPolicy
from rackflow.frozen import quick_init
from rackflow.timespec import ScheduleSpec, SpecType, format_rfc3339, parse_spec


class OverlapPolicy(enum.StrEnum):
    """What a firing does for a scope whose previous task is still active. The value is the stored form."""

    SKIP = "skip"
    QUEUE = "queue"

    @property
    def conflict_strategy(self) -> ConflictStrategy:
        """SKIP submits with REJECT (a conflict is refused), QUEUE with QUEUE (it waits its turn)."""
        return ConflictStrategy.QUEUE if self is OverlapPolicy.QUEUE else ConflictStrategy.REJECT


Trigger = Literal["dispatch", "manual"]
# A rollout's run is "rolling", then "completed", "halted" or "cancelled"; "skipped" when the schedule's
# previous rollout was still rolling or halted (rackflow.rollouts). A firing of a schedule that needs
# approval is "awaiting_approval" (its plan frozen, nothing submitted) until it is approved (then "running"
# or "rolling"), "rejected", or "expired" (rackflow.domain.approvals). "missed": a dispatched firing found
# past its start deadline, recorded with its slot and how late, submitting nothing (docs/SAFETY.md).
RunState = Literal[
    "running",
    "completed",
    "interrupted",
    "rolling",
    "halted",
    "cancelled",
    "skipped",
    "awaiting_approval",
    "expired",
    "rejected",
    "missed",
]
ROLLOUT_LIVE_STATES: tuple[RunState, ...] = ("rolling", "halted")  # at most one such run per schedule
# "pending" (waiting its turn) and "not_started" (halted or cancelled first) are a rollout's. "missed": the
# scope could not start by its firing's start deadline (the whole firing was late, or its window's opening
# comes after the deadline).
Outcome = Literal[
    "submitted", "skipped_overlap", "skipped_window", "failed", "pending", "not_started", "missed"
]
# The runs RetryTaskScheduleRun re-runs: those that are over (a halted one is cancelled first), including
# one that never started: missed past its deadline, or expired or rejected unapproved (the new run is a
# manual firing: it awaits approval again where the schedule needs it).
RETRIABLE_RUN_STATES: tuple[RunState, ...] = (
    "completed",
    "interrupted",
    "halted",
    "cancelled",
    "missed",
    "expired",
    "rejected",
)


@dataclass(frozen=True)
class Pause:
    """Why and until when a schedule is paused, and who paused it (`by`: the principal, or empty)."""

    reason: str
    by: str
    at: datetime
    resume_at: datetime | None = None


def pause_to_json(pause: Pause) -> dict[str, str | None]:
    """The pause as the audit trail records it."""
    return {
        "reason": pause.reason,
        "by": pause.by,
        "at": pause.at.isoformat(),
        "resume_at": pause.resume_at.isoformat() if pause.resume_at else None,
    }


@quick_init
@dataclass(frozen=True)
class Schedule:
    id: uuid.UUID
    name: str
    spec: ScheduleSpec
    overlap_policy: OverlapPolicy
    enabled: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    operation: Operation
    queue_timeout: timedelta
    description: str
    pause: Pause | None = None  # set only while paused by PauseTaskSchedule (enabled is False)
    window_policy: WindowPolicy = WindowPolicy.SKIP
    rollout: RolloutPolicy | None = None  # None: a firing starts every scope at once
    approval: ApprovalPolicy | None = None  # None: a firing starts at once
    last_edited_by: str = ""  # who last created, updated or re-scoped it (the two-person rule)
    # How late a dispatched firing may start (None: the server's --default-start-deadline, and with none
    # either, however late, as the seeds do).
    start_deadline: timedelta | None = None
    # Pause after this many consecutive finished runs with a failed rack (0: never).
    pause_after_failed_runs: int = 0
    # Runs fired at or before this do not count towards pause_after_failed_runs: the newest run of the
    # streak that last paused the schedule (a resume starts the count afresh).
    failures_counted_until: datetime | None = None
    retry: RetryPolicy | None = None  # None: each task gets one attempt
    # How many runs it has, as the run cap counts them (`store.runs.cap_runs`; None: not known yet).
    # The store's bookkeeping, read with the row so that a firing's claim knows whether to look past the cap.
    run_count: int | None = 0
    # No later than the slot of any of its runs that has one (`store.runs.prune_runs`; None: not known).
    runs_since: datetime | None = None

    @property
    def is_consumed(self) -> bool:
        """A one-time schedule that has fired: it has no next run and can never be re-armed."""
        return self.spec.type is SpecType.ONE_TIME and self.next_run_at is None

    @property
    def fires_after_its_window(self) -> bool:
        """Its next firing is at or past its operation's own window end (a firmware upgrade's end_time), and
        so is every later one: each could only be skipped (`domain.firing.window_ended_reason`)."""
        return self.next_run_at is not None and self.operation.window_over(self.next_run_at)


# --- a schedule's pause and resume, and its firmware window's end: pure rules ----------------------------
# The schedule service applies them (`schedules.service.ScheduleService`: pause, resume, the pauses that
# end); they need no database and no clock (tests/unit/test_schedule_resume.py).


def resumed(schedule: Schedule, now: datetime) -> Schedule:
    """The schedule resumed at `now`: enabled, its pause forgotten, interval and cron restarting from now
    (a run missed while paused is not fired at once), an unfired one-time schedule keeping its time. A
    one-time schedule consumed while paused (by a trigger) only forgets its pause: it cannot fire again."""
    if schedule.is_consumed:
        return replace(schedule, pause=None, updated_at=now)
    next_run_at = schedule.next_run_at
    if schedule.spec.type is not SpecType.ONE_TIME:
        next_run_at = parse_spec(schedule.spec).first_run(now)
    return replace(schedule, enabled=True, pause=None, next_run_at=next_run_at, updated_at=now)


# What a firing at or past its operation's window end would do (`domain.firing.window_ended_reason`).
SKIPPED_ALL = "so every firing's upgrade would be too late to start and be skipped"


def after_its_window(schedule: Schedule, field: str, next_firing: str) -> str:
    """Why a schedule whose `next_firing` (its first, or its next once changed or resumed) is at or past
    its operation's window end is refused (`Schedule.fires_after_its_window`)."""
    end, at = schedule.operation.window_end, schedule.next_run_at
    assert end is not None and at is not None
    return (
        f"{field}: {next_firing} at {format_rfc3339(at)} is not before its operation's end_time "
        f"{format_rfc3339(end)}, {SKIPPED_ALL}; give a later end_time, or none"
    )


def too_late_to_resume(schedule: Schedule, at: datetime) -> str | None:
    """Why `schedule`, resumed at `at`, could only skip its firings (`domain.firing.window_ended_reason`:
    their tasks would fail unrun): its operation's window (a firmware upgrade's end_time) ends by then, or
    its next firing once resumed then would come at or past that end; None when it may resume then. A
    pause's `resume_at` is refused by it (`schedules.service.ScheduleService.pause`), and a pause whose
    end it refuses all the same (one made before that) ends without resuming (`ScheduleService.
    resume_ended_pauses`). A consumed one-time schedule never fires again, so nothing of it would be
    skipped: None."""
    end = schedule.operation.window_end
    if end is None or schedule.is_consumed:
        return None
    window = f"its firmware window's end at {format_rfc3339(end)} (its upgrade's end_time)"
    if schedule.operation.window_over(at):
        return f"{window} is not after {format_rfc3339(at)}"
    after = resumed(schedule, at)
    if after.fires_after_its_window:
        assert after.next_run_at is not None
        return (
            f"its next firing once resumed at {format_rfc3339(at)} would be at "
            f"{format_rfc3339(after.next_run_at)}, not before {window}"
        )
    return None


def kept_paused(schedule: Schedule, now: datetime) -> Schedule | None:
    """The schedule whose pause ended at `now`, kept paused by rackflow with why as its reason, its end
    dropped, when resuming it then could only skip its firings (`too_late_to_resume`): resumed, its next
    firing would skip and pause it again, a second notification for nothing. None: it resumes."""
    why = too_late_to_resume(schedule, now)
    if why is None:
        return None
    assert schedule.pause is not None  # only a paused schedule's pause ends
    reason = (
        f"its pause ended at {format_rfc3339(now)}: {why}, {SKIPPED_ALL}; it stays paused: create a new "
        "schedule with a later end_time"
    )
    kept = Pause(reason=reason, by=SYSTEM_PRINCIPAL, at=schedule.pause.at)
    return replace(schedule, enabled=False, pause=kept, updated_at=now)


SCHEDULE_ORDER_FIELDS = ("created_at", "name", "next_run_at", "last_run_at")


@dataclass(frozen=True)
class ScheduleOrder:
    """How a schedule list is sorted: one of SCHEDULE_ORDER_FIELDS, ascending unless `descending`."""

    field: str = "created_at"
    descending: bool = False

    def key_of(self, schedule: Schedule) -> tuple[Any, ...]:
        """The schedule's place in a list in this order (a page token holds it): the order's field, then
        the creation time and id that break ties."""
        return (getattr(schedule, self.field), schedule.created_at, schedule.id)

    @property
    def name(self) -> str:
        """As ListTaskSchedules' order_by spells it."""
        return f"{self.field} desc" if self.descending else self.field


CREATION_ORDER = ScheduleOrder()  # ListTaskSchedules' order when none is asked for


@quick_init
@dataclass(frozen=True)
class Scope:
    """One rack a schedule targets; `filter=None` means all of the rack's components."""

    id: uuid.UUID
    schedule_id: uuid.UUID
    rack_id: uuid.UUID
    filter: ComponentFilter | None
    last_task_id: uuid.UUID | None
    created_at: datetime


@dataclass(frozen=True)
class ScopeChange:
    """What deleting a rack or removing a component did to one schedule scope entry, as its transaction
    did it: removed the entry, or narrowed its component filter to `components_left`. The call's log line
    and its audit event say it (`rackflow.audit.changes`)."""

    scope_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_name: str
    rack_id: uuid.UUID
    components_left: frozenset[uuid.UUID] | None = None  # None: the entry was removed

    @property
    def removed(self) -> bool:
        return self.components_left is None

    def describe(self) -> str:
        what = "removed" if self.removed else "narrowed"
        return f"{what} scope {self.scope_id} of schedule {self.schedule_name!r}"


class ListedScope(NamedTuple):
    """A scope entry as ListTaskScheduleScopes answers it: its ids as the text they are sent as (read so
    from the database) and its rack's name; its schedule is the one asked for. A schedule's whole scope
    list made `uuid.UUID`s of 40,000 ids and `Scope`s of 10,000 entries only to turn them into text: half
    its time (docs/PERFORMANCE.md, "The unpaged scopes as text"). A named tuple, the cheapest to make."""

    id: str
    rack_id: str
    rack_name: str
    filter: ComponentFilter | None
    last_task_id: str | None
    created_at_us: int  # microseconds since the Unix epoch, UTC, as read (`store.dialect.epoch_micros`)


@quick_init
@dataclass(frozen=True)
class ScopeOutcome:
    """What one firing did for one scope: `task_id` when submitted, `error` when failed. `canary`: one of
    a rollout's first scopes. `start_by`: the start deadline of the firing of a task the windows bind
    (deferred, or fired inside an ALLOW window), a deferred task's `not_after` when the deadline comes
    before its opening's end, kept so that the task failed there is told the deadline, not the window,
    ended it, and so that a window's change decides its wait (or end) again under it; on a pending scope
    of a rollout's first wave, the deadline its step is to cap a deferral at."""

    scope_id: uuid.UUID
    rack_id: uuid.UUID
    outcome: Outcome
    task_id: uuid.UUID | None = None
    error: str = ""
    canary: bool = False
    start_by: datetime | None = None


# The scope id of a run's outcome for a settled task whose scope was removed before its firing's write-back
# named it (`settled_scopes`): that write-back writes the scope the firing had, the settled outcome kept
# (`kept_settled`).
REMOVED_SCOPE = uuid.UUID(int=0)


def settled_scopes(
    outcomes: Sequence[ScopeOutcome],
    settled: Mapping[uuid.UUID, tuple[Outcome, str]],
    unnamed: Mapping[uuid.UUID, tuple[uuid.UUID | None, uuid.UUID]] | None = None,
) -> tuple[ScopeOutcome, ...]:
    """The outcomes with each scope whose task is in `settled` given its (outcome, error), its task kept:
    a cancelled rollout's scope whose task it ended before the task began is "not_started"
    (`RolloutService.cancel_in`, or the rollout gate for a task a claim held meanwhile); a deferred task
    that a window's change ended says what the windows settled (`tasks.deferrals`).

    A settled task the outcomes do not name yet (its plain firing submitted it, and its write-back has not
    recorded it: the run is "running", its outcomes empty or an approved run's "pending" plan) is recorded
    all the same, from `unnamed` (task id -> its scope id and rack id), in place of its rack's entry without
    a task or else added (a task whose scope was removed since, its scope id None, as `REMOVED_SCOPE`):
    the write-back then keeps what was settled (`kept_settled`), rather than write it "submitted"."""
    named = {o.task_id for o in outcomes if o.task_id is not None}
    kept = [
        replace(o, outcome=found[0], error=found[1])
        if o.task_id is not None and (found := settled.get(o.task_id)) is not None
        else o
        for o in outcomes
    ]
    for task_id, (scope_id, rack_id) in (unnamed or {}).items():
        if task_id in named or task_id not in settled:
            continue
        outcome, error = settled[task_id]
        entry = ScopeOutcome(scope_id or REMOVED_SCOPE, rack_id, outcome, task_id=task_id, error=error)
        at = next((i for i, o in enumerate(kept) if o.rack_id == rack_id and o.task_id is None), None)
        if at is None:
            kept.append(entry)
        else:
            kept[at] = replace(entry, scope_id=kept[at].scope_id, canary=kept[at].canary)
    return tuple(kept)


def kept_settled(written: Sequence[ScopeOutcome], stored: Sequence[ScopeOutcome]) -> tuple[ScopeOutcome, ...]:
    """A plain firing's write-back (`written`) over the outcomes its run holds (`stored`): a scope whose
    task `stored` names already keeps that outcome and error, which a window's change or the rollout gate
    settled (`settled_scopes`) after the submit, where the write-back knows only that it was submitted."""
    settled = {o.task_id: o for o in stored if o.task_id is not None}
    return tuple(
        replace(o, outcome=found.outcome, error=found.error)
        if o.task_id is not None and (found := settled.get(o.task_id)) is not None
        else o
        for o in written
    )


def racks_to_retry(
    run: Run, task_statuses: Mapping[uuid.UUID, TaskStatus], *, only_failed: bool
) -> list[ScopeOutcome]:
    """The scopes of `run` that RetryTaskScheduleRun fires again: with `only_failed`, those whose task
    failed or was terminated, whose submission failed, or that never started (a halted or cancelled
    rollout's, an unapproved run's, a missed run's); else every scope of the run. `task_statuses`: the
    run's tasks' statuses, by task id."""
    if not only_failed:
        return list(run.outcomes)
    return [
        o
        for o in run.outcomes
        if o.outcome in RETRIED_OUTCOMES
        or (o.task_id is not None and task_statuses.get(o.task_id) in RETRIED_STATUSES)
    ]


# What RetryTaskScheduleRun re-runs of a run, failed racks only (`racks_to_retry`): racks with these
# outcomes, and racks whose task ended in these statuses.
RETRIED_OUTCOMES: tuple[Outcome, ...] = ("failed", "not_started", "pending", "missed")
RETRIED_STATUSES = (TaskStatus.FAILED, TaskStatus.TERMINATED)


@quick_init
@dataclass(frozen=True)
class Run:
    """One firing of a schedule, as run history shows it.

    A rollout's run also keeps its policy (as it was when it fired), why it halted or was skipped, and
    what a resume excused: the failures before it, and the canary gate (`resumed`).
    """

    id: uuid.UUID
    schedule_id: uuid.UUID
    fired_at: datetime
    trigger: Trigger
    state: RunState
    outcomes: tuple[ScopeOutcome, ...]
    rollout: RolloutPolicy | None = None
    reason: str = ""
    failures_excused: int = 0
    resumed: bool = False
    approval: RunApproval | None = None  # a run of a schedule that needs approval
    scheduled_for: datetime | None = None  # a dispatched run's slot (None: manual)
    late_by: timedelta | None = None  # a missed run: how long after its slot it was found
    retry_of: uuid.UUID | None = None  # the run RetryTaskScheduleRun re-ran to make this one


def outcome_parts(sizes: Sequence[int], start: int, limit: int, budget: int) -> list[tuple[int, int, int]]:
    """What one page of runs carries of their outcomes when a page may hold at most `limit` runs and
    `budget` outcomes: of runs with `sizes` outcomes each (in the list's order, the first begun at `start`
    by an earlier page when `start` > 0), the (index, start, stop) of each run it carries, stop excluded.
    Whole runs while they fit; a run of more than `budget`, or the rest of one begun earlier, comes alone,
    `budget` of its outcomes at a time, so that no page costs more than `budget` outcomes whatever a run
    holds (ListTaskScheduleRuns' FULL view: docs/PERFORMANCE.md, issue 29)."""
    if not sizes or limit <= 0:
        return []
    if start > 0 or sizes[0] > budget:
        return [(0, start, min(sizes[0], start + budget))]
    parts: list[tuple[int, int, int]] = []
    used = 0
    for index, size in enumerate(sizes[:limit]):
        if used + size > budget:
            break
        parts.append((index, 0, size))
        used += size
    return parts
