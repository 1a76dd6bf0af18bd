"""Schedule use cases. Each request is one transaction, so a refused request writes nothing.

Specs are validated by `rackflow.timespec.parse_spec` on every path that accepts one (create, update,
preview), and its `InvalidSpec` becomes `InvalidArgument` here, prefixed with the request's field path.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit.changes import note_schedule_of_run
from rackflow.clock import Clock
from rackflow.config import FAILING_STREAK_LOOK_BATCH, MAX_PAUSE, RUN_OUTCOMES_PER_PAGE
from rackflow.domain.approvals import (
    UNCOUNTED,
    ApprovalPolicy,
    Approver,
    Approvers,
    check_approvable,
    check_approver,
    check_may_weaken,
    opened,
    unapprovable,
)
from rackflow.domain.audit import SYSTEM_PRINCIPAL
from rackflow.domain.firing import (
    Firing,
    RunResult,
    RunTally,
    Snapshot,
    extends_streak,
    failing_streak,
    plan,
    planned_times,
    recorded_state,
    scope_decisions,
    streak_reason,
    tally,
)
from rackflow.domain.inventory import ComponentsFilter, RackSelection, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import (
    CREATION_ORDER,
    RETRIABLE_RUN_STATES,
    SCHEDULE_ORDER_FIELDS,
    SKIPPED_ALL,
    ListedScope,
    OverlapPolicy,
    Pause,
    Run,
    Schedule,
    ScheduleOrder,
    Scope,
    ScopeOutcome,
    after_its_window,
    kept_paused,
    outcome_parts,
    racks_to_retry,
    resumed,
    too_late_to_resume,
)
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, RetryPolicy, TaskStatus
from rackflow.domain.window_rules import Decision
from rackflow.domain.windows import WindowPolicy
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound, SubmittedNothing, Unavailable
from rackflow.ids import new_id
from rackflow.inventory.targets import FIELD, resolve_targets
from rackflow.notify import events
from rackflow.retry import Retry, retrying
from rackflow.rollouts.service import FirstSteps, RolloutService, RunPart, RunReport
from rackflow.schedules import firing
from rackflow.schedules.scope import ScopeChanges, merge, reconcile
from rackflow.security import ANONYMOUS, caller_identified, caller_name, current_principal
from rackflow.store import firing as firing_store
from rackflow.store import inventory as inventory_store
from rackflow.store import kept_counts, outbox, scope_removals, streak_checks, wakeups
from rackflow.store import rollouts as rollout_store
from rackflow.store import runs as run_history
from rackflow.store import schedules as store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.dispatch import count_due
from rackflow.store.paging import Listed
from rackflow.tasks.conflicts import could_conflict
from rackflow.tasks.manager import Ended, TaskManager, rack_label
from rackflow.timespec import InvalidSpec, ScheduleSpec, SpecType, Timing, format_rfc3339, parse_spec
from rackflow.validation import (
    check_description,
    check_mask,
    check_name,
    check_operation,
    check_pause_after_failed_runs,
    check_queue,
    check_rename,
    check_retry,
    check_rollout,
    check_text,
    check_window_not_over,
    preview_count,
)
from rackflow.words import counted

log = logging.getLogger(__name__)

NAME_PATH = "schedule.name"
OVERLAP_POLICY_PATH = "schedule.overlap_policy"
SPEC_PATH = "schedule.spec"
TIMEZONE_PATH = "schedule.spec.timezone"
WINDOW_POLICY_PATH = "schedule.window_policy"
ROLLOUT_PATH = "schedule.rollout"
APPROVAL_PATH = "schedule.approval"
MIN_APPROVERS_PATH = f"{APPROVAL_PATH}.min_approvers"
START_DEADLINE_PATH = "schedule.start_deadline"
PAUSE_AFTER_FAILED_RUNS_PATH = "schedule.pause_after_failed_runs"
RETRY_PATH = "schedule.retry"
UPDATE_PATHS = (
    NAME_PATH,
    OVERLAP_POLICY_PATH,
    SPEC_PATH,
    TIMEZONE_PATH,
    WINDOW_POLICY_PATH,
    ROLLOUT_PATH,
    APPROVAL_PATH,
    START_DEADLINE_PATH,
    PAUSE_AFTER_FAILED_RUNS_PATH,
    RETRY_PATH,
)

DEFAULT_TIMEZONE = "UTC"
PAUSES_ENDED_PER_POLL = 100  # resumed per dispatcher poll; more wait for the next poll
# DeleteSchedule tried again after the schedule fired meanwhile (`_FiredMeanwhile`): at once, a few times.
_FIRED_MEANWHILE_RETRY = Retry.every(0.0, attempts=3)


class _FiredAlready(Exception):
    """A manual firing whose run was not recorded: a run of its schedule carries its request id already
    (the unique index of the two), committed by a call with the same id since this one looked. Raised in
    the claim's transaction, to roll back its schedule's advance; its caller answers that run."""

    def __init__(self, schedule_id: uuid.UUID) -> None:
        super().__init__(schedule_id)
        self.schedule_id = schedule_id


class _FiredMeanwhile(Unavailable):
    """The schedule fired (a run recorded) between DeleteSchedule's lock of its runs and its lock of the
    schedule, so that run is not locked yet (`ScheduleService.delete`)."""


@dataclass(frozen=True)
class Triggered:
    """A manual trigger's answer (`ScheduleService.trigger_run`): the tasks it submitted, the run that
    records it and when it fired. `replayed`: the answer is that of an earlier trigger (or retry) with the
    same request id, which fired `run_id` at `fired_at`; this call fired nothing. The client tells its
    operator so, rather than leave them to guess which of the two calls fired."""

    task_ids: list[uuid.UUID]
    run_id: uuid.UUID
    fired_at: datetime
    replayed: bool = False


@dataclass(frozen=True)
class PausesEnded:
    """What `ScheduleService.resume_ended_pauses` did, each schedule with the pause that ended, for the
    audit trail: `resumed`, or `kept` paused by rackflow (`kept_paused`: resumed, it could only skip)."""

    resumed: list[tuple[Schedule, Pause]] = field(default_factory=list)
    kept: list[tuple[Schedule, Pause]] = field(default_factory=list)


@dataclass(frozen=True)
class PlannedScope:
    """One scope of a previewed firing: what the planner makes it do (None: the schedule is paused)."""

    scope: Scope
    rack_name: str
    decision: Decision | None
    skipped: str = ""  # the firing is skipped whole ("skip_run"), and why

    @property
    def reason(self) -> str:
        """The words the run (a skipped firing's) or the scope's outcome or task would carry."""
        return self.skipped or (self.decision.reason if self.decision is not None else "")


@dataclass(frozen=True)
class PlannedFiring:
    """A previewed firing; `resume_at`: when a paused schedule resumes by itself (None: by hand);
    `needs_approval`: it would await approval before anything starts; `would_be_missed`: found past its
    start deadline, it would be recorded missed and submit nothing."""

    at: datetime
    scopes: tuple[PlannedScope, ...]
    resume_at: datetime | None = None
    needs_approval: bool = False
    would_be_missed: bool = False


@dataclass(frozen=True)
class Draft:
    """A schedule as CreateTaskSchedule gives it, not saved: what create saves, and what a form previews."""

    name: str
    spec: ScheduleSpec
    overlap_policy: OverlapPolicy
    operation: Operation
    queue: QueueOptions
    description: str
    target: TargetSpec
    window_policy: WindowPolicy = WindowPolicy.SKIP
    rollout: RolloutPolicy | None = None
    approval: ApprovalPolicy | None = None
    start_deadline: timedelta | None = None  # None: the server's default (checked at the door)
    pause_after_failed_runs: int = 0
    retry: RetryPolicy | None = None

    def checked(
        self, schedule_id: uuid.UUID, now: datetime, *, named: bool = True, was: str | None = None
    ) -> Schedule:
        """The schedule it makes at `now`, every field checked as create checks it (the name only when
        `named`: a preview's draft may have none yet); the scope is left to the caller to resolve. `was`:
        the name of the schedule the draft edits, whose name is checked as UpdateTaskSchedule checks it
        (`check_rename`): kept as it is, even one stored before today's rules, so that such a schedule can
        be previewed and edited; a new one as on create."""
        if named or self.name:
            if was is None:
                check_name(self.name, NAME_PATH)
            else:
                check_rename(self.name, NAME_PATH, was)
        if self.rollout is not None:
            check_rollout(self.rollout, ROLLOUT_PATH)
        check_pause_after_failed_runs(self.pause_after_failed_runs, PAUSE_AFTER_FAILED_RUNS_PATH)
        if self.retry is not None:
            check_retry(self.retry, RETRY_PATH)
        queue = _check_operation(self.operation, self.queue, self.description)
        if queue.ignore_windows:
            raise InvalidArgument(
                f"operation.{self.operation.kind.value}.queue_options.ignore_windows: a schedule's firings "
                "obey maintenance windows "
                "(see schedule.window_policy); only a direct submission may ignore them"
            )
        spec = replace(self.spec, timezone=self.spec.timezone or DEFAULT_TIMEZONE)
        return Schedule(
            id=schedule_id,
            name=self.name,
            spec=spec,
            overlap_policy=self.overlap_policy,
            enabled=True,
            next_run_at=timing_of(spec).first_run(now),
            last_run_at=None,
            created_at=now,
            updated_at=now,
            operation=self.operation,
            queue_timeout=queue.timeout,
            description=self.description,
            window_policy=self.window_policy,
            rollout=self.rollout,
            approval=self.approval,
            last_edited_by=caller_name(),
            start_deadline=self.start_deadline,
            pause_after_failed_runs=self.pause_after_failed_runs,
            retry=self.retry,
        )


def timing_of(spec: ScheduleSpec, field_prefix: str = "schedule.") -> Timing:
    """The spec's timing, or InvalidArgument naming the field (`schedule.spec.timezone: …`)."""
    try:
        return parse_spec(spec)
    except InvalidSpec as exc:
        raise InvalidArgument(f"{field_prefix}{exc}") from None


def _check_operation(operation: Operation, queue: QueueOptions, description: str) -> QueueOptions:
    """Refuse at create what the task manager would refuse at every firing; returns the normalised queue."""
    check_operation(operation)
    check_description(description)
    return check_queue(queue)


def parse_order(text: str, field: str = "order_by") -> ScheduleOrder:
    """`name`, `next_run_at desc`, …: a field of SCHEDULE_ORDER_FIELDS, optionally `asc` or `desc`."""
    words = text.split()
    if not words:
        return CREATION_ORDER
    name, direction = words[0], words[1].lower() if len(words) > 1 else "asc"
    if name not in SCHEDULE_ORDER_FIELDS or direction not in ("asc", "desc") or len(words) > 2:
        raise InvalidArgument(
            f"{field}: {text!r} is not one of {', '.join(SCHEDULE_ORDER_FIELDS)}, "
            "optionally followed by asc or desc"
        )
    return ScheduleOrder(name, descending=direction == "desc")


def _consumed(schedule: Schedule, action: str) -> FailedPrecondition:
    return FailedPrecondition(
        f"id: schedule {schedule.name!r} ({schedule.id}) is a one-time schedule that has already fired; "
        f"cannot {action} it (create a new schedule instead)"
    )


def _past_its_window(schedule: Schedule, now: datetime, refused: str, firings: str) -> FailedPrecondition:
    """A request (`refused`: the field, and what is refused) that would give a schedule whose operation's
    window has ended `firings` that could only be skipped (`domain.firing.window_ended_reason`: their
    tasks would fail unrun); an update cannot change the operation."""
    end = schedule.operation.window_end
    assert end is not None
    return FailedPrecondition(
        f"{refused}: its operation's end_time {format_rfc3339(end)} has passed "
        f"(now {format_rfc3339(now)}), so {firings} would be too late to start; create a new schedule "
        "with a later end_time (an update cannot change its operation)"
    )


class ScheduleService:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        tasks: TaskManager,
        rollouts: RolloutService,
        default_start_deadline: timedelta | None = None,
        instance_id: uuid.UUID | None = None,
        approvers: Approvers = UNCOUNTED,
    ) -> None:
        self.db = db
        self.clock = clock
        self.tasks = tasks
        self.rollouts = rollouts
        # The start deadline of a schedule without its own (`--default-start-deadline`; None: none).
        self.default_start_deadline = default_start_deadline
        # The instance whose runs this process fires (None: a process that registers none): a run is its
        # firing instance's for the sweep's heartbeat check, as that instance submits its tasks and writes
        # it back, so a run left "running" as it dies is interrupted once its heartbeat lapses. The one
        # place the services hold it: the dispatcher, a trigger, a retry and an approval record it here.
        self.instance_id = instance_id
        # Who this server lets approve (its approver tokens': `server.approvers_of`): an edit after which a
        # schedule's runs could never be approved is refused (`check_approvable`), and the schedules a change
        # of the tokens left so are named at start-up (`name_unapprovable`).
        self.approvers = approvers

    async def _load(
        self,
        conn: AsyncConnection,
        schedule_id: uuid.UUID,
        field: str = "id",
        *,
        lock: bool = False,
        deleting: bool = False,
    ) -> Schedule:
        """The schedule, or NotFound naming `field`. `lock`: its row held until commit by a writer that keeps
        its key (`store.key_kept`: a streak's mark never waits for it); `deleting`: by DeleteSchedule,
        `FOR UPDATE`."""
        held = self.db.for_update if deleting else store.key_kept(self.db) if lock else None
        schedule = await store.get_schedule(conn, schedule_id, lock=held)
        if schedule is None:
            raise NotFound(f"{field}: no task schedule {schedule_id}")
        return schedule

    async def _announce(self, conn: AsyncConnection, schedule: Schedule) -> None:
        """Wake the dispatchers that plan to look later than this schedule is now due (`store.wakeups`).

        Create, update and resume (by request or at a pause's end) call this; a manual trigger does not,
        as advancing a schedule after a firing only moves its next run later.
        """
        if schedule.enabled and schedule.next_run_at is not None:
            await wakeups.announce(self.db, conn, schedule.next_run_at)

    # --- lifecycle -------------------------------------------------------------------------------

    async def create(
        self,
        *,
        name: str,
        spec: ScheduleSpec,
        overlap_policy: OverlapPolicy,
        operation: Operation,
        queue: QueueOptions,
        description: str,
        target: TargetSpec,
        window_policy: WindowPolicy = WindowPolicy.SKIP,
        rollout: RolloutPolicy | None = None,
        approval: ApprovalPolicy | None = None,
        start_deadline: timedelta | None = None,
        pause_after_failed_runs: int = 0,
        retry: RetryPolicy | None = None,
    ) -> Schedule:
        """A schedule and its initial scope (the target's racks). The overlap policy, not `queue`,
        decides the conflict strategy at fire time; `queue` contributes its timeout. Its firings obey
        maintenance windows (`window_policy`), so `queue.ignore_windows` is refused. `rollout`: fire as
        a controlled rollout (None: every scope at once). `approval`: each firing awaits approval. The
        caller is recorded as its last editor (the two-person rule). `start_deadline` (None: the server's
        default) and `pause_after_failed_runs` (0: never): docs/SAFETY.md. `retry`: how its tasks retry
        retryable failures (None: one attempt)."""
        draft = Draft(
            name,
            spec,
            overlap_policy,
            operation,
            queue,
            description,
            target,
            window_policy,
            rollout,
            approval,
            start_deadline,
            pause_after_failed_runs,
            retry,
        )
        schedule = draft.checked(new_id(), self.clock.now())  # refused before the database is touched
        check_approvable(schedule.approval, self.approvers, schedule.last_edited_by, MIN_APPROVERS_PATH)
        check_window_not_over(
            operation,
            self.clock.now(),
            f"operation.{operation.kind.value}",
            "every firing's upgrade would be too late to start (give a later end_time, or none)",
        )
        if schedule.fires_after_its_window:  # a one-time upgrade set after its window, say
            field = f"operation.{operation.kind.value}.end_time"
            raise InvalidArgument(after_its_window(schedule, field, "the schedule's first firing"))
        self.tasks.check_runnable(operation, f"operation.{operation.kind.value}")
        async with self.db.transaction() as conn:
            now = await self.db.now(conn)  # its first run counted from the clock that decides what is due
            schedule = draft.checked(schedule.id, now)
            if await store.name_taken(conn, name):
                raise store.name_taken_error(name)
            selections = await self._resolve_locked(conn, target)
            await store.insert_schedule(conn, schedule)
            await store.insert_scopes(conn, schedule.id, selections, now)
            await self._announce(conn, schedule)
        return schedule

    async def get(self, schedule_id: uuid.UUID) -> Schedule:
        schedule = await store.fetch_schedule(self.db, schedule_id)
        if schedule is None:
            raise NotFound(f"id: no task schedule {schedule_id}")
        return schedule

    async def list_schedules(self, **query: Any) -> tuple[list[Schedule], int]:
        """Schedules in `order` (by default creation time, then id), and the total before paging; `query`
        is `each_schedule_chunk`'s."""
        found: list[Schedule] = []
        listed = await self.each_schedule_chunk(found.extend, **query)
        return found, listed.total

    async def each_schedule_chunk(
        self,
        consume: Callable[[list[Schedule]], None],
        *,
        rack_id: uuid.UUID | None = None,
        enabled_only: bool = False,
        paused_only: bool = False,
        name_contains: str = "",
        operation: OperationKind | None = None,
        order: ScheduleOrder = CREATION_ORDER,
        offset: int = 0,
        limit: int | None = None,
        after: Sequence[Any] | None = None,
    ) -> Listed:
        """Pass the schedules to `consume` a chunk at a time (`store.each_schedule_chunk`), so a caller
        that converts each chunk as it comes (ListTaskSchedules) never holds every schedule at once;
        returns the total before paging, and where a short search's walk stopped."""
        if enabled_only and paused_only:
            raise InvalidArgument("paused_only: cannot be combined with enabled_only")
        check_text(name_contains, "name_contains")  # no name holds control characters (nor NUL)
        async with self.db.read(in_transaction=True) as conn:
            return await store.each_schedule_chunk(
                conn,
                consume,
                rack_id=rack_id,
                enabled_only=enabled_only,
                paused_only=paused_only,
                name_contains=name_contains,
                operation=operation,
                order=order,
                offset=offset,
                limit=limit,
                after=after,
            )

    async def update(
        self,
        schedule_id: uuid.UUID,
        paths: Collection[str],
        *,
        name: str = "",
        overlap_policy: OverlapPolicy | None = None,
        spec_type: SpecType | None = None,
        spec: str = "",
        timezone: str | None = None,
        window_policy: WindowPolicy | None = None,
        rollout: RolloutPolicy | None = None,
        approval: ApprovalPolicy | None = None,
        start_deadline: timedelta | None = None,
        pause_after_failed_runs: int = 0,
        retry: RetryPolicy | None = None,
    ) -> Schedule:
        """Apply the masked fields. The operation and scope never change here. The caller becomes the
        schedule's last editor (the two-person rule).

        `schedule.start_deadline` replaces the schedule's own deadline (None: the server's default
        applies); `schedule.pause_after_failed_runs` the streak that pauses it (0: never).

        `schedule.rollout` replaces the rollout policy (None removes it); a run already rolling keeps the
        policy it fired with. `schedule.approval` replaces the approval policy (None removes it); a run
        already awaiting approval keeps the approval it fired with; removing it or lowering its
        min_approvers needs the approver role (`check_may_weaken`). `schedule.retry` replaces the retry
        policy (None removes it); tasks already submitted keep the policy they were submitted with.

        `schedule.spec` replaces type and text and recomputes next_run_at from now. `schedule.spec.timezone`
        replaces the zone (None: the request carried no spec message, which is refused; "" means UTC); only
        cron reads the zone, so only a cron schedule's next_run_at is recomputed: an interval's or one-time's
        stays where it was.
        """
        mask = check_mask(paths, UPDATE_PATHS)
        if NAME_PATH in mask:
            check_text(name, NAME_PATH, required=True)  # a new one is checked as on create, below
        if ROLLOUT_PATH in mask and rollout is not None:
            check_rollout(rollout, ROLLOUT_PATH)
        if PAUSE_AFTER_FAILED_RUNS_PATH in mask:
            check_pause_after_failed_runs(pause_after_failed_runs, PAUSE_AFTER_FAILED_RUNS_PATH)
        if RETRY_PATH in mask and retry is not None:
            check_retry(retry, RETRY_PATH)
        if OVERLAP_POLICY_PATH in mask and overlap_policy is None:
            raise InvalidArgument(f"{OVERLAP_POLICY_PATH}: a policy is required (SKIP or QUEUE)")
        if WINDOW_POLICY_PATH in mask and window_policy is None:
            raise InvalidArgument(f"{WINDOW_POLICY_PATH}: a policy is required (SKIP or DEFER)")
        if SPEC_PATH in mask and spec_type is None:
            raise InvalidArgument(
                f"{SPEC_PATH}.type: a schedule type is required (INTERVAL, CRON or ONE_TIME)"
            )
        if TIMEZONE_PATH in mask and timezone is None:
            raise InvalidArgument(
                f"{SPEC_PATH}: the update_mask names {TIMEZONE_PATH} but the request has no {SPEC_PATH} "
                "(send spec { timezone: ... }; an empty timezone means UTC)"
            )
        async with self.db.transaction() as conn:
            current = await self._load(conn, schedule_id, lock=True)
            now = await self.db.now(
                conn
            )  # a new first run is counted from the clock that decides what is due
            updated = replace(current, updated_at=now, last_edited_by=caller_name())
            if APPROVAL_PATH in mask:
                updated = replace(updated, approval=approval)
            if NAME_PATH in mask:
                check_rename(name, NAME_PATH, current.name)
                if await store.name_taken(conn, name, other_than=schedule_id):
                    raise store.name_taken_error(name)
                updated = replace(updated, name=name)
            if ROLLOUT_PATH in mask:
                updated = replace(updated, rollout=rollout)
            if START_DEADLINE_PATH in mask:
                updated = replace(updated, start_deadline=start_deadline)
            if PAUSE_AFTER_FAILED_RUNS_PATH in mask:
                updated = replace(updated, pause_after_failed_runs=pause_after_failed_runs)
            if RETRY_PATH in mask:
                updated = replace(updated, retry=retry)
            if overlap_policy is not None and OVERLAP_POLICY_PATH in mask:
                updated = replace(updated, overlap_policy=overlap_policy)
            if window_policy is not None and WINDOW_POLICY_PATH in mask:
                updated = replace(updated, window_policy=window_policy)
            if spec_type is not None and SPEC_PATH in mask:
                updated = replace(updated, spec=replace(updated.spec, type=spec_type, spec=spec))
            if TIMEZONE_PATH in mask:
                updated = replace(updated, spec=replace(updated.spec, timezone=timezone or DEFAULT_TIMEZONE))
            if mask & {SPEC_PATH, TIMEZONE_PATH}:
                timing = timing_of(updated.spec)  # the zone is validated for every spec type
                if current.is_consumed:
                    raise _consumed(current, "re-arm" if SPEC_PATH in mask else "change the timezone of")
                if SPEC_PATH in mask and current.operation.window_over(now):
                    firings = f"every firing a new spec gives schedule {current.name!r}"
                    raise _past_its_window(current, now, SPEC_PATH, firings)
                if SPEC_PATH in mask or updated.spec.type is SpecType.CRON:
                    updated = replace(updated, next_run_at=timing.first_run(now))
                if updated.fires_after_its_window:
                    field = SPEC_PATH if SPEC_PATH in mask else TIMEZONE_PATH
                    raise FailedPrecondition(after_its_window(updated, field, "its next firing"))
            check_may_weaken(
                current.approval,
                updated.approval,
                current_principal.get(),
                schedule=current.name,
                field=APPROVAL_PATH,
            )
            check_approvable(updated.approval, self.approvers, updated.last_edited_by, MIN_APPROVERS_PATH)
            await store.save_schedule(conn, updated)
            if updated.next_run_at != current.next_run_at:
                await self._announce(conn, updated)
        return updated

    async def pause(
        self,
        schedule_id: uuid.UUID,
        *,
        reason: str = "",
        resume_at: datetime | None = None,
        by: str = "",
    ) -> Schedule:
        """Stop firing, saying why and, with `resume_at`, until when (the dispatcher then resumes it).

        Pausing a paused schedule with a reason or an end replaces them (it stays paused since its first
        pause); without either it is a no-op. A fired one-time schedule has nothing to pause.
        """
        check_description(reason, "reason")
        now = self.clock.now()
        if resume_at is not None and resume_at <= now:
            raise InvalidArgument(f"resume_at: must be in the future, got {format_rfc3339(resume_at)}")
        if resume_at is not None and resume_at > now + MAX_PAUSE:
            # Past it a resume computes no next run before year 10000, and previews failed from then on.
            raise InvalidArgument(f"resume_at: at most 100 years ahead, got {format_rfc3339(resume_at)}")
        async with self.db.transaction() as conn:
            schedule = await self._load(conn, schedule_id, lock=True)
            if schedule.is_consumed:
                raise _consumed(schedule, "pause")
            if resume_at is not None and (why := too_late_to_resume(schedule, resume_at)) is not None:
                raise FailedPrecondition(
                    f"resume_at: {why}, {SKIPPED_ALL}; give an earlier resume_at, or none"
                )
            if not schedule.enabled and not (reason or resume_at):
                return schedule
            since = schedule.pause.at if schedule.pause is not None and not schedule.enabled else now
            pause = Pause(reason=reason, by=by, at=since, resume_at=resume_at)
            schedule = replace(schedule, enabled=False, pause=pause, updated_at=now)
            await store.save_schedule(conn, schedule)
            if resume_at is not None:  # the dispatchers resume it then
                await wakeups.announce(self.db, conn, resume_at)
        return schedule

    async def resume(self, schedule_id: uuid.UUID) -> Schedule:
        """Fire again (see `resumed`). A no-op when already enabled. Refused for a schedule whose
        operation's window has ended: its next firing would only be skipped, and pause it again."""
        async with self.db.transaction() as conn:
            schedule = await self._load(conn, schedule_id, lock=True)
            if schedule.is_consumed:
                raise _consumed(schedule, "resume")
            if schedule.enabled:
                return schedule
            now = await self.db.now(conn)
            if schedule.operation.window_over(now):
                raise _past_its_window(
                    schedule, now, f"id: schedule {schedule.name!r} cannot be resumed", "every firing"
                )
            schedule = resumed(schedule, now)
            if schedule.fires_after_its_window:
                refused = f"id: schedule {schedule.name!r} cannot be resumed"
                raise FailedPrecondition(after_its_window(schedule, refused, "its next firing"))
            await store.save_schedule(conn, schedule)
            await self._announce(conn, schedule)
        return schedule

    async def resume_ended_pauses(self) -> PausesEnded:
        """Resume every paused schedule whose `resume_at` has come (up to PAUSES_ENDED_PER_POLL), as
        ResumeTaskSchedule would, on the database's clock; returns each with the pause that ended, for the
        audit trail. Called by the dispatcher of every instance; SKIP LOCKED shares the rows out.

        One that resumed then could only skip its firings (its firmware window: `kept_paused`), as a resume
        by hand is refused, is kept paused by rackflow instead, saying why, with one `schedule.paused`
        event (`PausesEnded.kept`)."""
        ended = PausesEnded()
        async with self.db.transaction() as conn:
            now = await self.db.now(conn)
            for schedule in await store.claim_pauses_ended(self.db, conn, now, PAUSES_ENDED_PER_POLL):
                assert schedule.pause is not None  # only paused schedules have a resume_at
                kept = kept_paused(schedule, now)
                if kept is not None:
                    ended.kept.append((kept, schedule.pause))
                    await store.save_schedule(conn, kept)
                    continue
                ended.resumed.append((resumed(schedule, now), schedule.pause))
                await store.save_schedule(conn, ended.resumed[-1][0])
                await self._announce(conn, ended.resumed[-1][0])
            await outbox.record_events(conn, events.pauses_ended(ended.resumed, now))
            await outbox.record_events(conn, events.kept_paused(ended.kept, now))
        return ended

    async def pause_failing(
        self, *, everything: bool = False, batch: int = FAILING_STREAK_LOOK_BATCH
    ) -> list[tuple[Schedule, tuple[RunTally, ...]]]:
        """Pause every enabled schedule whose newest `pause_after_failed_runs` counted runs have all
        finished with a failed rack (`domain.firing.failing_streak`, counted from the tasks' final
        statuses), by rackflow, with the reason naming the runs; returns each with its streak, for the
        audit trail.

        Looks only at the schedules marked since the last look (`store.streak_checks`: a task of a run
        ended, a run was recorded or changed state, the schedule was saved), at most `batch` of them (the
        others stay marked for the next look); `everything` first marks every enabled schedule that pauses
        after failures. Called by the dispatcher of every instance after each poll, so a streak is seen
        within a poll interval of its last task ending (a few more when more than a batch is marked),
        whichever path ended it; a poll in which nothing changed reads one empty index. The pause is a
        conditional UPDATE (`store.pause_after_failures`): however many instances decide the same streak,
        one pauses and reports it; its runs are not counted again (a resume starts the count afresh).
        """
        if everything:
            async with self.db.transaction() as conn:
                await streak_checks.mark_every_schedule(conn)
        async with self.db.read() as conn:  # an idle poll writes nothing
            if not await streak_checks.any_marked(conn):
                return []
        async with self.db.transaction() as conn:  # committed before the look reads (store.streak_checks)
            marked = await streak_checks.take_marked(self.db, conn, batch)
        if not marked:
            return []
        try:
            return await self._pause_failing(marked)
        except BaseException:
            async with self.db.transaction() as conn:  # looked at by the next poll instead
                await streak_checks.mark_schedules(conn, marked)
            raise

    async def _pause_failing(
        self, schedule_ids: list[uuid.UUID]
    ) -> list[tuple[Schedule, tuple[RunTally, ...]]]:
        """`pause_failing` over these schedules."""
        streaks: list[tuple[Schedule, tuple[RunTally, ...]]] = []
        async with self.db.read() as conn:  # a look with no streak to pause writes nothing
            candidates = await store.pausing_after_failures(conn, schedule_ids)
            if not candidates:
                return []
            runs = await run_history.counted_runs(conn, candidates)
            # A round per run, newest first: a run that is not over, or did not fail, ends its schedule's
            # streak, so the older runs' tasks are not read (a schedule of 10,000 racks whose newest run is
            # going reads that run's tasks only).
            tallies: dict[uuid.UUID, list[RunTally]] = {s.id: [] for s in candidates}
            going = [s for s in candidates if len(runs[s.id]) >= s.pause_after_failed_runs]
            while going:
                newest = [(s, runs[s.id][len(tallies[s.id])]) for s in going]
                task_ids = {o.task_id for _, r in newest for o in r.outcomes if o.task_id}
                statuses = await task_store.statuses(conn, task_ids)
                for s, r in newest:
                    tallies[s.id].append(tally(r.id, r.fired_at, r.state, r.outcomes, statuses))
                going = [
                    s
                    for s in going
                    if len(tallies[s.id]) < s.pause_after_failed_runs and extends_streak(tallies[s.id][-1])
                ]
        for schedule in candidates:
            streak = failing_streak(tallies[schedule.id], schedule.pause_after_failed_runs)
            if streak:
                streaks.append((schedule, streak))
        if not streaks:
            return []
        paused: list[tuple[Schedule, tuple[RunTally, ...]]] = []
        async with self.db.transaction() as conn:
            now = await self.db.now(conn)
            for schedule, streak in streaks:
                pause = Pause(streak_reason(streak), SYSTEM_PRINCIPAL, now)
                if not await store.pause_after_failures(conn, schedule.id, pause, streak[0].fired_at):
                    continue  # paused, turned off or counted meanwhile (by another instance)
                paused.append((replace(schedule, enabled=False, pause=pause, updated_at=now), streak))
                found = events.paused_after_failures(schedule, pause.reason, streak[0].run_id, now)
                await outbox.record_events(conn, found)
        return paused

    async def delete(self, schedule_id: uuid.UUID) -> None:
        """Delete the schedule with its scope and runs; tasks it submitted keep running. One whose approval
        policy holds its firings is the approver role's to delete (`check_may_weaken`).

        Lock order (atop `rackflow.tasks.executor`): its runs' rows (in id order), then the schedule's, which
        the delete's cascade to the runs would otherwise take first. A retry of a run, a rollout's halt and a
        firing's write-back hold a run, then ask for its schedule: had DeleteSchedule held the schedule while
        its cascade waited for that run, PostgreSQL would end one of the two as a deadlock
        (tests/store/test_schedule_lock_order.py). A run fired between the runs' lock and the schedule's
        (the schedule's lock holds off any more) is not locked yet: rather than wait for that row while it
        holds the schedule, the transaction is rolled back and tried again (`_FiredMeanwhile`)."""
        await retrying(
            lambda: self._delete(schedule_id),
            _FIRED_MEANWHILE_RETRY,
            what=f"deleting schedule {schedule_id}",
            retry_if=lambda exc: isinstance(exc, _FiredMeanwhile),
        )

    async def _delete(self, schedule_id: uuid.UUID) -> None:
        async with self.db.transaction() as conn:
            runs = await run_history.runs_of_schedule(conn, schedule_id, lock=True)
            schedule = await self._load(conn, schedule_id, deleting=True)
            check_may_weaken(
                schedule.approval,
                None,
                current_principal.get(),
                schedule=schedule.name,
                field="id",
                deleting=True,
            )
            if not await run_history.runs_of_schedule(conn, schedule_id) <= runs:
                raise _FiredMeanwhile(
                    f"id: schedule {schedule_id} fired while it was being deleted; try again"
                )
            await store.delete_schedule(conn, schedule_id)

    async def retry_run(
        self, run_id: uuid.UUID, *, only_failed: bool = True, request_id: str | None = None
    ) -> RunReport:
        """RetryTaskScheduleRun: fire the failed and not-started racks of a run that is over (with
        `only_failed` false, all its racks) as a new manual run of its schedule, linked by `retry_of`, with
        the run's own rollout policy (None: every rack at once), whatever the schedule's is now.

        Refused (FailedPrecondition naming the state) for a run still running or rolling, or with tasks
        still active; and when none of its racks is left to retry. A halted run is cancelled in the same
        transaction, first (`RolloutService.cancel_in`: its tasks that had not begun are ended, so only
        its started ones count as active), and its not-started racks go to the new run, so the schedule
        keeps one live rollout and no rack has two tasks waiting. The new run's firing is the manual
        trigger's path (`firing.claim` over those scopes, then `fire`).

        `request_id` (the client's): a retry with the id of a run of the same schedule answers that run
        and fires nothing, as a trigger does (`_fired_before`); two at once queue on the retried run's
        lock, and the second finds the first's run. The answer then says it is `replayed`.

        Beside DeleteSchedule of its schedule, a retry comes wholly before or after it, as every firing does:
        its submit holds the schedule undeleted from before it submits until it commits (`firing.fire`).
        The deletion first, the retry answers NotFound having submitted nothing (its new run went with the
        schedule, `firing.RunGone`); the submit first, it answers with its run as it stands or, deleted
        meanwhile, as it was last recorded (`fired_report`: "running" when the deletion came before its
        write-back), and its tasks go on as every task of a deleted schedule does. A rollout's run starts
        its racks in its steps, which hold the run (`RolloutService.advance`): a first step before the
        deletion, this call's or another instance's, is answered with the run as that step left it, or by
        the tasks that still name the run (PostgreSQL); none after it starts anything (NotFound). On SQLite,
        whose deletion clears a run's id from its tasks, a run gone before this call's own step is NotFound
        saying a rollout driver's step may have started racks of it first (`firing.RunGone.untold`).
        """
        claimed: Firing | None = None
        ended: Ended | None = None
        fired: Run | None = None
        try:
            async with self.db.transaction() as conn:
                run = await rollout_store.get_run(self.db, conn, run_id, lock=True)
                if run is None:
                    raise NotFound(f"id: no task schedule run {run_id}")
                note_schedule_of_run(run.schedule_id)  # a refusal's event too names the schedule
                fired = await self._fired_before(conn, run.schedule_id, request_id)
                if fired is None:
                    claimed, ended = await self._claim_retry(conn, run, only_failed, request_id)
        except Unavailable as exc:
            claimed = await self._in_doubt(claimed, exc)
        except _FiredAlready as exc:
            fired = await self._fired_meanwhile(exc.schedule_id, request_id)
        if fired is not None:
            self._check_same_request(fired, request_id, retry_of=run_id)
            self._check_fired(fired, request_id)
            return replace(await self.rollouts.get(fired.id), replayed=True)
        assert claimed is not None
        if ended is not None:
            self.tasks.after_ended(ended)
        results = await self.fire_one(claimed)
        fired = Run(
            claimed.run_id,
            claimed.schedule.id,
            claimed.fired_at,
            claimed.trigger,
            "rolling" if claimed.rolls_out else "running",
            (),
            rollout=claimed.schedule.rollout,
            retry_of=run_id,
        )
        return replace(await self.fired_report(claimed, fired, results), replayed=False)

    async def _claim_retry(
        self, conn: AsyncConnection, run: Run, only_failed: bool, request_id: str | None
    ) -> tuple[Firing, Ended | None]:
        """Phase 1 of `retry_run` for `run`, locked in `conn`'s transaction: its firing, and the tasks the
        cancel of a halted run ended."""
        ended: Ended | None = None
        if run.state not in RETRIABLE_RUN_STATES:
            raise FailedPrecondition(
                f"id: run {run.id} is {run.state}; only a finished or halted run can be retried "
                f"({', '.join(RETRIABLE_RUN_STATES)})"
            )
        schedule = await self._load(conn, run.schedule_id, lock=True)
        if run.state == "halted":
            # First, so that its tasks that had not begun are ended (their racks not started, retried)
            # rather than left to start beside the new run's; a refusal below rolls it back.
            run, ended = await self.rollouts.cancel_in(conn, run, "retried by RetryTaskScheduleRun")
        tasks = await rollout_store.task_states(conn, [run.id])
        active = [t for t in tasks.values() if t.status.is_active]
        if active:
            raise FailedPrecondition(
                f"id: run {run.id} still has {len(active)} active task(s) "
                f"(e.g. {active[0].task_id}); retry it once they have ended"
            )
        statuses = {t.task_id: t.status for t in tasks.values()}
        chosen = racks_to_retry(run, statuses, only_failed=only_failed)
        present = await store.scopes_by_ids(conn, [o.scope_id for o in chosen])
        if not present:
            which = "failed or not-started racks" if only_failed else "racks"
            raise FailedPrecondition(f"id: run {run.id} has no {which} left in its schedule to retry")
        as_fired = replace(schedule, rollout=run.rollout)
        claimed = await firing.claim(
            self.db,
            conn,
            [as_fired],
            trigger="manual",
            now=await self.db.now(conn),
            owner_id=self.instance_id,
            scopes={schedule.id: present},
            request_id=request_id,
        )
        if not claimed:
            raise _FiredAlready(schedule.id)
        await rollout_store.link_retry(conn, claimed[0].run_id, run.id)
        return claimed[0], ended

    async def trigger(
        self, schedule_id: uuid.UUID, *, approve: bool = False, request_id: str | None = None
    ) -> list[uuid.UUID]:
        """`trigger_run`'s tasks: what most callers need of a trigger."""
        answer = await self.trigger_run(schedule_id, approve=approve, request_id=request_id)
        return answer.task_ids

    async def trigger_run(
        self, schedule_id: uuid.UUID, *, approve: bool = False, request_id: str | None = None
    ) -> Triggered:
        """TriggerTaskSchedule: fire now, whatever `enabled` and `next_run_at` say, on every scope (no
        overlap check).

        Returns the ids of the tasks submitted, and their run; scopes whose submission failed are in the
        run history.
        When there were scopes and every one failed, raises FailedPrecondition naming each rack and its
        reason rather than answer a misleading success with no task. That is the one refusal that changes
        something: the firing has happened (phase 1 committed), so its run is recorded and a one-time
        schedule is consumed, as a dispatched firing would be.

        A rollout's firing returns the tasks of its first wave (the rest start in later steps). While the
        schedule's previous rollout is rolling or halted, a trigger is refused and records nothing (a
        dispatched firing is recorded as skipped instead).

        A schedule that needs approval records the firing "awaiting_approval" and returns no task, unless
        `approve` (the caller holds the approver role: the front end checks it): then the caller's approval
        counts, under the two-person rule, and it starts at once when that is enough. While a run of the
        schedule awaits approval, a trigger is refused.

        Beside DeleteSchedule, a trigger comes wholly before or after it: its submit holds the schedule
        undeleted (`firing.fire`). The deletion first, it answers NotFound having submitted nothing (its run
        went with the schedule, `firing.RunGone`). A rollout's, whose first step comes after its claim, is
        answered as a retry's is (`retry_run`): the first wave's tasks, whichever step started them before
        the deletion; NotFound when none did, or, on SQLite, when that cannot be told.

        `request_id` (the client's, so that it may send the trigger again when it did not hear the answer):
        the run records it, and a trigger with the id of a run of this schedule fires nothing and answers
        as that run's trigger did (`_fired_before`, `_answer_again`). A refusal recorded no run, so it
        remembers nothing: the same id fires once the refusal no longer holds. Two at once with one id
        queue on the schedule's lock, and the second finds the first's run; the unique index of the runs'
        (schedule, request id) holds it whatever the code (`_FiredAlready`). The answer names the run and
        when it fired, and says whether it is such an earlier call's (`Triggered.replayed`).
        """
        claimed: Firing | None = None
        fired: Run | None = None
        try:
            async with self.db.transaction() as conn:
                schedule = await self._load(conn, schedule_id, lock=True)
                fired = await self._fired_before(conn, schedule_id, request_id)
                if fired is None:
                    claimed = await self._claim_trigger(conn, schedule, approve, request_id)
        except Unavailable as exc:
            claimed = await self._in_doubt(claimed, exc)
        except _FiredAlready:
            fired = await self._fired_meanwhile(schedule_id, request_id)
        if fired is not None:
            return await self._answer_again(fired, request_id)
        assert claimed is not None
        if claimed.needs_approval:
            return Triggered([], claimed.run_id, claimed.fired_at)
        (result,) = await self.fire_one(claimed)
        if claimed.rolls_out:
            return Triggered(list(result.started), claimed.run_id, claimed.fired_at)
        if claimed.scopes and not result.task_ids:
            raise await self._nothing_submitted(claimed.schedule, result, claimed.fired_at)
        return Triggered(result.task_ids, claimed.run_id, claimed.fired_at)

    async def _claim_trigger(
        self, conn: AsyncConnection, schedule: Schedule, approve: bool, request_id: str | None
    ) -> Firing:
        """Phase 1 of `trigger` for `schedule`, locked in `conn`'s transaction."""
        now = await self.db.now(conn)  # after the lock: the time the firing holds the schedule
        if schedule.is_consumed:
            raise _consumed(schedule, "trigger")
        approver = None
        if approve and schedule.approval is not None:
            approver = Approver(caller_name() or ANONYMOUS, now)
            check_approver(
                opened(schedule.approval, now, None, schedule.last_edited_by, schedule.operation.window_end),
                approver.principal,
                schedule.last_edited_by,
                identified=caller_identified(),
                field="approve",
            )
        # A manual firing has no slot: one firing (refused while the schedule's rollout is live or a run of
        # it awaits approval), or none when its request id was recorded meanwhile.
        claimed = await firing.claim(
            self.db,
            conn,
            [schedule],
            trigger="manual",
            now=now,
            owner_id=self.instance_id,
            approver=approver,
            request_id=request_id,
        )
        if not claimed:
            raise _FiredAlready(schedule.id)
        return claimed[0]

    async def _fired_before(
        self, conn: AsyncConnection, schedule_id: uuid.UUID, request_id: str | None
    ) -> Run | None:
        """The run of `schedule_id` a trigger or retry with `request_id` fired, if one is kept."""
        if request_id is None:
            return None
        return await run_history.run_of_request(conn, schedule_id, request_id)

    async def _fired_meanwhile(self, schedule_id: uuid.UUID, request_id: str | None) -> Run:
        """The run whose request id refused a firing's insert (`_FiredAlready`), read once it committed."""
        async with self.db.read() as conn:
            fired = await self._fired_before(conn, schedule_id, request_id)
        if fired is None:  # pruned since, or its schedule deleted: it fired, and is no longer kept
            raise FailedPrecondition(
                f"request_id: {request_id!r} fired a run of schedule {schedule_id} already"
            )
        return fired

    @staticmethod
    def _check_same_request(fired: Run, request_id: str | None, *, retry_of: uuid.UUID | None) -> None:
        """Refuse a call whose request id `fired` (a run of its schedule) carries but that is not the call
        that fired it sent again: a trigger (`retry_of` None) finding a retry's run, a retry of `retry_of`
        finding a trigger's or another run's retry. Answered as the earlier call was, it would be told
        "nothing new fired" with a run that is not what it asked for (a retry's failed racks never
        retried), so it is refused, firing nothing: a request id names one request."""
        if fired.retry_of == retry_of:
            return

        def call(of: uuid.UUID | None) -> str:
            return "a trigger of the schedule" if of is None else f"a retry of run {of}"

        raise FailedPrecondition(
            f"request_id: {request_id!r} was used by {call(fired.retry_of)} (run {fired.id}, fired at "
            f"{format_rfc3339(fired.fired_at)}), not by {call(retry_of)}: a request id names one request; "
            "nothing was fired: send this one with an id of its own"
        )

    @staticmethod
    def _check_fired(fired: Run, request_id: str | None) -> None:
        """A run found by its request id is answered only once its trigger's phases 2 and 3 are done: while
        it is "running" its tasks are not all known, and firing again is what the id forbids."""
        if fired.state == "running":
            raise Unavailable(
                f"request_id: the same request ({request_id}) is still being fired as run {fired.id}; "
                "try again"
            )

    async def _answer_again(self, fired: Run, request_id: str | None) -> Triggered:
        """What the trigger that fired `fired` answered, for a trigger again with its request id: the tasks
        its run submitted (a rollout's, the tasks its steps started so far; none while it awaits approval,
        or once that approval expired or was refused), or the same FailedPrecondition when every scope of
        a plain firing failed; marked `replayed`, the error too (`SubmittedNothing`). Refused when `fired`
        is not a trigger's (`_check_same_request`)."""
        self._check_same_request(fired, request_id, retry_of=None)
        self._check_fired(fired, request_id)
        result = RunResult(fired.id, fired.outcomes)
        if fired.rollout is None and fired.outcomes and not result.task_ids and fired.approval is None:
            schedule = await self.get(fired.schedule_id)
            raise await self._nothing_submitted(schedule, result, fired.fired_at, earlier=request_id)
        return Triggered(result.task_ids, fired.id, fired.fired_at, replayed=True)

    async def _in_doubt(self, claimed: Firing | None, lost: Unavailable) -> Firing:
        """A manual firing whose transaction lost its connection (`lost`): once claimed, its COMMIT may
        have reached the database before the answer was lost. Returns the firing if the database recorded
        it, to go on with as with any claim (left alone, its run would stay "running" until the sweep,
        and the client, told UNAVAILABLE, would fire a second run by trying again); raises Unavailable
        saying nothing was fired if it did not, or naming the run if it cannot tell (`firing.committed`,
        `firing.settle_in_doubt`)."""
        if claimed is None:
            raise lost
        what = f"schedule {claimed.schedule.name!r} ({claimed.schedule.id})"

        async def recorded() -> bool:
            return bool(await firing.committed(self.db, [claimed]))

        await firing.settle_in_doubt(
            lost,
            recorded(),
            not_done=f"{what} was not fired",
            unknown=f"{what} may have fired as run {claimed.run_id}: list its runs before firing it again",
        )
        log.warning(
            "%s: its firing's commit outcome was unknown (%s); it committed as run %s: firing it",
            what,
            lost,
            claimed.run_id,
        )
        return claimed

    async def fire(self, claimed: Sequence[Firing]) -> list[RunResult]:
        """Phases 2 and 3 for claimed firings (`firing.fire`), then the first step of their rollouts at once
        rather than at the rollout driver's next step: the one way the dispatcher, a manual trigger and an
        approval fire what they claimed. A rollout's result is its run as its first step left it (which
        tasks its first wave started, which racks it settled or was refused), by this step or, when another
        instance's step took the run first, by that one; the run deleted since with its schedule, the tasks
        that still name it (`_stepped`). A firing awaiting approval is left out (it starts when approved). A
        firing whose schedule was deleted since its claim submits nothing (`RunResult.deleted`,
        `firing.fire`)."""
        claimed = [f for f in claimed if not f.needs_approval]
        results = await firing.fire(self.db, self.tasks, self.clock, claimed)
        rolling = [f.run_id for f in claimed if f.rolls_out]
        if not rolling:
            return results
        step = await self.rollouts.advance(rolling)
        # A run this step started nothing of: another instance's rollout driver may be stepping it, or have
        # stepped it first, or its schedule gone with it since. What the rollout started is what the
        # answer names (`first_steps`).
        idle = [run_id for run_id in rolling if not step.started.get(run_id)]
        looked = await self.rollouts.first_steps(idle) if idle else FirstSteps({}, {})
        runs = {**step.stepped, **looked.runs}
        return [
            self._stepped(r, runs.get(r.run_id), looked.gone) if f.rolls_out else r
            for f, r in zip(claimed, results, strict=True)
        ]

    @staticmethod
    def _stepped(
        result: RunResult, run: Run | None, gone: Mapping[uuid.UUID, tuple[uuid.UUID, ...]] | None
    ) -> RunResult:
        """A rollout firing's result once its first step is over: its run as that step left it, or, the run
        deleted since with its schedule, the tasks that still name it (`deleted` when none does; `untold`
        when the deletion cleared their names)."""
        if run is not None:
            started = tuple(o.task_id for o in run.outcomes if o.task_id is not None)
            return replace(result, outcomes=run.outcomes, started=started, state=run.state)
        if gone is None:
            return replace(result, untold=True)
        started = gone.get(result.run_id, ())
        return replace(result, started=started) if started else replace(result, deleted=True)

    async def fire_one(self, claimed: Firing) -> list[RunResult]:
        """`fire` for one firing whose caller answers with it (a trigger, a retry, an approval that starts
        its run): RunGone (NotFound) when its schedule was deleted, with its run, before anything of it was
        submitted, or, a rollout's, before its own first step where what another step started first
        cannot be told (`RunResult.untold`)."""
        results = await self.fire([claimed])
        if any(r.deleted for r in results):
            raise firing.RunGone.of(claimed)
        if any(r.untold for r in results):
            raise firing.RunGone.untold(claimed)
        return results

    async def fired_report(self, claimed: Firing, fired: Run, results: Sequence[RunResult]) -> RunReport:
        """The report of the run a retry or an approval fired (`fired`: as its claim or approval recorded
        it; `results`: `fire_one`'s): as it stands; or, deleted since with its schedule once its tasks were
        submitted (a rollout's first step started), as it was last recorded (`firing.recorded_state`), with
        those tasks, which outlive it (`RolloutService.as_fired`). A run deleted before anything of it was
        submitted is NotFound (`fire_one`'s RunGone, or, awaiting approval, nothing fired)."""
        try:
            return await self.rollouts.get(fired.id)
        except NotFound:
            if not results or not (results[0].task_ids or results[0].started):
                raise
        (result,) = results
        last = replace(fired, state=recorded_state(claimed, result), outcomes=result.outcomes)
        return await self.rollouts.as_fired(last, [*result.task_ids, *result.started])

    async def _nothing_submitted(
        self, schedule: Schedule, result: RunResult, fired_at: datetime, *, earlier: str | None = None
    ) -> SubmittedNothing:
        """The error of a trigger whose every scope failed: each rack, by name and id, and why. `earlier`:
        the request id of the trigger that fired the run, when this is its answer again; the message says
        so, with when it fired, since that is what the operator who sent it again needs to know."""
        async with self.db.read() as conn:
            names = await inventory_store.rack_names(conn, {o.rack_id for o in result.outcomes})
        reasons = []
        for outcome in result.outcomes:
            label = rack_label(outcome.rack_id, names)
            reasons.append(f"{label}: {outcome.error.removeprefix(f'{label}: ')}")
        recorded = f"recorded as run {result.run_id}"
        if earlier is not None:
            recorded += (
                f", fired at {format_rfc3339(fired_at)} by an earlier request with request_id {earlier!r}: "
                "nothing new fired"
            )
        return SubmittedNothing(
            f"id: schedule {schedule.name!r} ({schedule.id}) fired but submitted no task, every scope failed "
            f"({recorded}): {'; '.join(reasons)}",
            result.run_id,
            fired_at,
            replayed=earlier is not None,
        )

    # --- scope -----------------------------------------------------------------------------------

    async def add_scope(self, schedule_id: uuid.UUID, target: TargetSpec) -> list[Scope]:
        """Merge the target's racks into the scope (see `scope.merge`); returns the whole resulting scope."""
        async with self.db.transaction() as conn:
            self._check_rescope(await self._load(conn, schedule_id, "schedule_id", lock=True))
            incoming = await self._resolve_locked(conn, target)
            changes = merge(await store.list_scopes(conn, schedule_id), incoming)
            await self._apply(conn, schedule_id, changes)
            await store.set_last_edited_by(conn, schedule_id, caller_name(), self.clock.now())
            return await store.list_scopes(conn, schedule_id)

    async def update_scope(
        self, schedule_id: uuid.UUID, desired: TargetSpec
    ) -> tuple[list[Scope], ScopeChanges]:
        """Make the scope exactly `desired`; returns the resulting scope and what changed."""
        async with self.db.transaction() as conn:
            self._check_rescope(await self._load(conn, schedule_id, "schedule_id", lock=True))
            wanted = await self._resolve_locked(conn, desired, "desired_scope")
            changes = reconcile(await store.list_scopes(conn, schedule_id), wanted)
            await self._apply(conn, schedule_id, changes)
            await store.set_last_edited_by(conn, schedule_id, caller_name(), self.clock.now())
            return await store.list_scopes(conn, schedule_id), changes

    async def _resolve_locked(
        self, conn: AsyncConnection, target: TargetSpec, field: str = FIELD
    ) -> list[RackSelection]:
        """Resolve the target for a scope write (errors naming it under the request's `field`), with the
        racks of its component filters locked until commit.

        RemoveComponent locks the component's rack before taking it out of scopes: holding those racks keeps
        a component named here from vanishing before our scope row commits, and a component that vanished
        since `resolve_targets` looked it up is NOT_FOUND, as it would have been a moment earlier.

        Lock order: the schedule row (add, update; `FOR NO KEY UPDATE`, `_load`), these racks in id order,
        then scope rows. No cycle: a scope row we insert key-locks its rack, one we hold already (a target
        names one kind, so either all its selections are filtered or we lock no rack, as before);
        RemoveComponent and DeleteRack lock the schedule rows they stamp (`store.scope_removals`) before the
        rack and then its scope rows (and try again, rather than lock one more schedule once they hold the
        rack, when an entry came meanwhile), task submission only racks in id order, the dispatcher's
        write-back only scope rows, and a rollout's step pauses the schedules it halts before it locks racks.
        What holds a rack and then writes a row naming our schedule (a journal round's failing-streak mark)
        only checks its key, which our lock lets it do. None of them waits for a schedule row while it holds
        a rack or a scope row, and none that holds a scope row we want goes on to wait for a rack we hold.
        """
        selections = await resolve_targets(conn, target, field)
        named = {s.rack_id: s.filter.ids for s in selections if isinstance(s.filter, ComponentsFilter)}
        if named:
            await inventory_store.racks_for_update(self.db, conn, named)
            ids = {c for component_ids in named.values() for c in component_ids}
            vanished = ids - (await inventory_store.components_by_ids(conn, ids)).keys()
            if vanished:  # components never change racks: one still here is still on its rack
                await resolve_targets(conn, target, field)  # raises its NOT_FOUND, naming it by position
                # It resolved: an external id now names a component added meanwhile.
                raise NotFound(f"{field}: component {min(vanished)} was removed while the request ran")
        return selections

    async def _apply(self, conn: AsyncConnection, schedule_id: uuid.UUID, changes: ScopeChanges) -> None:
        touched = [scope.id for scope in changes.to_remove] + [scope.id for scope, _ in changes.to_update]
        await store.lock_scopes(self.db, conn, touched)
        await store.delete_scopes(conn, [scope.id for scope in changes.to_remove])
        for scope, value in changes.to_update:
            await store.set_scope_filter(conn, scope.id, value)
        await store.insert_scopes(conn, schedule_id, changes.to_add, self.clock.now())

    async def remove_scope(self, scope_id: uuid.UUID) -> None:
        """Remove one scope entry (its tasks keep running); never the last one."""
        async with self.db.transaction() as conn:
            scope = await store.get_scope(conn, scope_id)
            if scope is None:
                raise NotFound(f"scope_id: no schedule scope {scope_id}")
            schedule = await self._load(conn, scope.schedule_id, "scope_id", lock=True)
            self._check_rescope(schedule)
            remaining = [s for s in await store.list_scopes(conn, schedule.id) if s.id != scope_id]
            if not remaining:
                raise FailedPrecondition(
                    f"scope_id: {scope_id} is the last scope of schedule {schedule.name!r}; "
                    "delete the schedule instead"
                )
            await store.delete_scopes(conn, [scope_id])
            await store.set_last_edited_by(conn, schedule.id, caller_name(), self.clock.now())

    def _check_rescope(self, schedule: Schedule) -> None:
        """A re-scope makes its caller the schedule's last editor: refused, as an update would be, when its
        runs could then never be approved (an approver re-scoping a schedule that needs every other)."""
        check_approvable(schedule.approval, self.approvers, caller_name(), MIN_APPROVERS_PATH)

    async def name_unapprovable(self) -> int:
        """Log at WARNING each schedule whose runs the principals this server lets approve could never
        approve (its tokens changed since the policy was set, or a server with other tokens set it), and
        return how many. Called once at start-up, when the tokens are read: until the policy or the tokens
        change, each of its firings awaits approval and expires."""
        if not self.approvers.counted:
            return 0
        found = 0
        async with self.db.read(in_transaction=True) as conn:
            async for set_up in store.approval_set_ups(conn):
                why = unapprovable(set_up.policy, self.approvers, set_up.last_edited_by)
                if why is None:
                    continue
                found += 1
                log.warning(
                    "schedule %r (%s) cannot be approved: it needs %s, %s; until then each of its firings "
                    "awaits approval and expires",
                    set_up.name,
                    set_up.schedule_id,
                    counted(set_up.policy.min_approvers, "approver"),
                    why,
                )
        return found

    async def list_scopes(self, schedule_id: uuid.UUID) -> list[Scope]:
        async with self.db.read() as conn:
            await self._load(conn, schedule_id, "schedule_id")
            return await store.list_scopes(conn, schedule_id)

    async def scope_list_page(
        self,
        schedule_id: uuid.UUID,
        *,
        offset: int = 0,
        limit: int | None = None,
        after: Sequence[Any] | None = None,
    ) -> tuple[list[ListedScope], int]:
        """A page of the schedule's scope entries by rack id (after the `store.SCOPE_ORDER` key `after`),
        each with its rack's name and its ids as text, and their total before paging (counted up to
        LIST_COUNT_CAP, then more): a 10,000-rack scope came whole (docs/PERFORMANCE.md, issue 29)."""
        async with self.db.read() as conn:
            await self._load(conn, schedule_id, "schedule_id")
            return await store.list_scope_page(conn, schedule_id, offset=offset, limit=limit, after=after)

    # --- advisory and history --------------------------------------------------------------------

    async def check_conflicts(
        self, operation: Operation, target: TargetSpec, exclude_schedule_id: uuid.UUID | None = None
    ) -> list[Schedule]:
        """Enabled schedules on any of the target's racks whose operation the task manager's conflict rules
        could refuse to run beside `operation` there.

        Coarse on purpose (`conflicts.could_conflict`): both operations are taken to touch the whole rack,
        component filters are not intersected, so it may over-report but never misses a pair the rules
        would refuse at run time. Advisory only; nothing is blocked.
        """
        async with self.db.read() as conn:
            selections = await resolve_targets(conn, target)
            candidates = await store.enabled_schedules_on_racks(
                conn, {selection.rack_id for selection in selections}, excluding=exclude_schedule_id
            )
        return [s for s in candidates if could_conflict(operation.kind, s.operation.kind) is not None]

    def preview(self, spec: ScheduleSpec, after: datetime | None, count: int) -> list[datetime]:
        """The next `count` fire times after `after` (default now), validated exactly as create does."""
        count = preview_count(count)
        timing = timing_of(spec, field_prefix="")
        return timing.preview(after or self.clock.now(), count)

    async def preview_schedule(
        self,
        schedule_id: uuid.UUID,
        after: datetime | None,
        count: int,
        *,
        resume_at: datetime | None = None,
    ) -> list[PlannedFiring]:
        """The next `count` firings of the schedule (`planned_times`) and, per scope, what the planner
        decides then over a snapshot read now (`domain.firing.plan`, the dispatcher's own decision): a scope
        whose last task is still active is skipped for overlap (under overlap SKIP), the windows skip or
        defer the others.

        A paused schedule's times are "paused": all of them, or, with a `resume_at`, those before it, and
        after it the times of the schedule as the dispatcher resumes it then (`resumed`), decided.
        `resume_at` given previews the schedule as if paused until then (whatever its own pause says), so
        an operator sees which slots a late resume would find past the start deadline (`would_be_missed`).
        """
        count = preview_count(count)
        async with self.db.read() as conn:
            schedule = await self._load(conn, schedule_id)
            snapshot = await firing_store.load(conn, [schedule], "dispatch")
            scopes = snapshot.scopes[schedule.id]
            names = await inventory_store.rack_names(conn, {scope.rack_id for scope in scopes})
        now = self.clock.now()
        if resume_at is not None:
            # A resume cannot happen before now: one at a time already past is a resume now (else `resumed`
            # would restart interval and cron from then and show an overdue firing no resume makes).
            resume_at = max(resume_at, now)
            schedule = replace(schedule, enabled=False, pause=Pause("", "", now, resume_at))
        resume_at = schedule.pause.resume_at if schedule.pause is not None else None
        paused_times: list[datetime] = []
        firing_schedule: Schedule | None = schedule
        if not schedule.enabled:
            paused_times = planned_times(replace(schedule, enabled=True), after, now, count)
            if resume_at is None:
                firing_schedule = None
            else:
                paused_times = [moment for moment in paused_times if moment < resume_at]
                firing_schedule = resumed(schedule, resume_at)
        planned = [
            PlannedFiring(
                moment,
                tuple(PlannedScope(s, names.get(s.rack_id, "?"), None) for s in scopes),
                resume_at,
                needs_approval=schedule.approval is not None,
            )
            for moment in paused_times
        ]
        if firing_schedule is None:
            return planned
        from_ = max(now, resume_at) if resume_at is not None else now
        return planned + _decided(
            snapshot,
            firing_schedule,
            names,
            after,
            from_,
            count - len(planned),
            self.default_start_deadline,
        )

    async def preview_draft(
        self, draft: Draft, editing: uuid.UUID | None, after: datetime | None, count: int
    ) -> list[PlannedFiring]:
        """The next `count` firings of an unsaved schedule and each of its racks' decision, planned as
        `preview_schedule` plans a saved one. `editing`: the draft is that schedule's edit, so a rack
        already in its scope keeps its scope (and last task: the overlap check sees it) and its live
        rollout counts, and its name is checked as UpdateTaskSchedule checks it (`Draft.checked`'s `was`),
        as is a weaker approval gate than the schedule's (`check_may_weaken`), so a form says what its save
        would refuse as it is typed; the draft itself is previewed enabled."""
        count = preview_count(count)
        now = self.clock.now()
        async with self.db.read() as conn:
            current = await self._load(conn, editing) if editing else None
            was = current.name if current is not None else None
            schedule = draft.checked(editing or new_id(), now, named=False, was=was)
            if current is not None:
                check_may_weaken(
                    current.approval,
                    schedule.approval,
                    current_principal.get(),
                    schedule=current.name,
                    field=APPROVAL_PATH,
                )
            check_approvable(schedule.approval, self.approvers, schedule.last_edited_by, MIN_APPROVERS_PATH)
            saved = await store.list_scopes(conn, current.id) if current is not None else []
            kept = {scope.rack_id: scope for scope in saved}
            scopes = [
                replace(kept[s.rack_id], filter=s.filter)
                if s.rack_id in kept
                else Scope(new_id(), schedule.id, s.rack_id, s.filter, None, now)
                for s in await resolve_targets(conn, draft.target)
            ]
            snapshot = await firing_store.load(conn, [schedule], "dispatch", {schedule.id: scopes})
            names = await inventory_store.rack_names(conn, {scope.rack_id for scope in scopes})
        return _decided(snapshot, schedule, names, after, now, count, self.default_start_deadline)

    async def recent_runs(
        self, schedule_ids: Collection[uuid.UUID], per_schedule: int
    ) -> dict[uuid.UUID, list[Run]]:
        """Each schedule's newest runs, newest first (unknown ids map to [])."""
        async with self.db.read() as conn:
            return await run_history.recent_runs(conn, schedule_ids, per_schedule)

    # --- names and overview ----------------------------------------------------------------------

    async def id_by_name(self, name: str, field: str = "name") -> uuid.UUID:
        """The id of the schedule called `name`; NotFound naming `field` otherwise."""
        check_text(name, field, required=True)
        async with self.db.read() as conn:
            found = await store.schedule_ids_by_name(conn, [name])
        if name not in found:
            raise NotFound(f"{field}: no task schedule named {name!r}")
        return found[name]

    async def names(self, schedule_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The name of each schedule that still exists among `schedule_ids`."""
        async with self.db.read() as conn:
            return await store.schedule_names(conn, schedule_ids)

    async def state_counts(self) -> store.StateCounts:
        async with self.db.read() as conn:
            return await store.state_counts(conn)

    async def next_to_fire(self, limit: int) -> list[Schedule]:
        """The enabled schedules that fire soonest, soonest first."""
        async with self.db.read() as conn:
            return await store.next_to_fire(conn, limit)

    async def due_count(self) -> int:
        """How many enabled schedules are due and not yet fired, up to DUE_COUNT_CAP ("at least" there):
        the dispatcher's backlog."""
        async with self.db.read() as conn:
            return await count_due(conn, await self.db.now(conn))

    async def list_runs(
        self,
        schedule_id: uuid.UUID,
        *,
        offset: int = 0,
        limit: int | None = None,
        after: Sequence[Any] | None = None,
        outcomes: bool = True,
    ) -> tuple[Sequence[Run], int]:
        """The schedule's firings, newest first (after the `store.runs.RUN_ORDER` key `after`), and their
        total before paging (counted up to LIST_COUNT_CAP, then more); without `outcomes`, each run without
        its outcomes (a run of 10,000 racks carries 10,000)."""
        async with self.db.read() as conn:
            await self._load(conn, schedule_id, "schedule_id")
            return await run_history.list_runs(
                conn, schedule_id, offset=offset, limit=limit, after=after, outcomes=outcomes
            )

    async def full_runs_page(
        self,
        schedule_id: uuid.UUID,
        *,
        offset: int,
        limit: int,
        after: Sequence[Any] | None,
        within: int = 0,
    ) -> tuple[list[RunReport], int, tuple[Any, ...] | None]:
        """A page of the schedule's firings newest first with every outcome (ListTaskScheduleRuns' FULL view
        asked with a limit), after the `store.runs.RUN_ORDER` key `after`, or from outcome `within` of the run
        `after` names: at most `limit` runs and RUN_OUTCOMES_PER_PAGE outcomes (`outcome_parts`: a larger
        run comes in parts, a page each). Returns its runs, their total (as `list_runs`) and the key the
        next page starts from, (fired_at, id) or (fired_at, id, outcome) within a run; None after the last.
        Each run's size is its `outcome_counts`, read before any outcome."""
        async with self.db.read() as conn:
            await self._load(conn, schedule_id, "schedule_id")
            heads, total = await run_history.list_runs(
                conn, schedule_id, offset=offset, limit=limit, after=after, outcomes=False
            )
            more = len(heads) == limit  # runs may follow the last one read
            begun = await run_history.run_head(conn, after[1]) if within and after is not None else None
            if begun is not None and begun.schedule_id == schedule_id:
                heads = [begun, *heads]
            else:
                within = 0  # gone (pruned) since the last page: this one goes on after it
            tallies = await run_history.run_tallies(conn, [head.id for head in heads])
            sizes = [sum(tallies[head.id].values()) for head in heads]
            if within and within >= sizes[0]:
                heads, sizes, within = heads[1:], sizes[1:], 0  # the begun run has no more outcomes
            chosen = outcome_parts(sizes, within, limit, RUN_OUTCOMES_PER_PAGE)
            parts = [RunPart(heads[i], start, stop, sizes[i]) for i, start, stop in chosen]
            reports = await self.rollouts.part_reports(conn, parts)
        if not parts:
            return reports, total, None
        last = parts[-1]
        if last.stop < last.count:
            return reports, total, (last.run.fired_at, last.run.id, last.stop)
        if more or chosen[-1][0] + 1 < len(heads):
            return reports, total, (last.run.fired_at, last.run.id)
        return reports, total, None

    async def scope_page(
        self, schedule_id: uuid.UUID, offset: int, limit: int
    ) -> tuple[list[tuple[Scope, str]], int]:
        """A page of the schedule's scope by rack name, with the names, and how many racks its whole scope
        has (`store.scope_page`)."""
        async with self.db.read() as conn:
            await self._load(conn, schedule_id, "schedule_id")
            return await store.scope_page(conn, schedule_id, offset, limit)

    async def run_rack_page(self, run: Run, offset: int, limit: int) -> list[tuple[ScopeOutcome, str | None]]:
        """A page of a run's racks (the run as read, without its outcomes) as its page lists them, with
        their names (`store.runs.run_rack_page`)."""
        async with self.db.read() as conn:
            return await run_history.run_rack_page(conn, run, offset, limit)

    async def has_run(self, run_id: uuid.UUID) -> bool:
        """Whether the run is still recorded: a task keeps its run's id after the run is pruned
        (migration 0036), as a retry keeps the id of the run it re-ran."""
        async with self.db.read() as conn:
            return await run_history.run_head(conn, run_id) is not None

    async def run_heads(self, schedule_id: uuid.UUID, limit: int) -> tuple[list[Run], int]:
        """The schedule's newest `limit` firings without their outcomes, newest first, and their total
        (as `list_runs`): a runs grid reads its outcomes per page of racks (`grid_outcomes`)."""
        async with self.db.read() as conn:
            await self._load(conn, schedule_id, "schedule_id")
            return await run_history.run_heads(conn, schedule_id, limit)

    async def grid_outcomes(
        self, schedule_id: uuid.UUID, run_ids: Collection[uuid.UUID], page_racks: Collection[uuid.UUID]
    ) -> tuple[run_history.GridOutcomes, dict[uuid.UUID, dict[TaskStatus, int]]]:
        """What a page of the runs grid shows of these runs of the schedule (`store.runs.grid_outcomes`: each
        run's tally, the outcomes of `page_racks` and of racks no longer in its scope, and their tasks'
        statuses), and how many of each run's tasks are in each status (its column's verdict).

        The two largest reads overlap, on two connections: the runs' tasks counted by status (200,000
        index entries for 20 runs of 10,000 racks) and the page's cells read from the tasks of the runs
        whose every rack got one (`all_tasked`), which the counts then confirm (`told_by_its_tasks`) or
        send to their outcomes: 46-47 ms for both where one after the other took 62-64, with a core free
        (docs/PERFORMANCE.md, issue 29). The racks that left the scope are looked for only when one of the
        runs fired at or before the schedule's last scope removal (`scope_removals.may_have_left`). A run
        whose tasks have all ended, and can get no more, has its count kept in its row and read from
        there the next time (`store.kept_counts`)."""

        async def counted() -> dict[uuid.UUID, dict[TaskStatus, int]]:
            # A run's count kept once final is read from its row; the others are counted, and those found
            # final kept (`store.kept_counts`: their states are read in a statement before the count).
            async with self.db.read() as conn:
                kept, states = await kept_counts.kept(conn, run_ids)
                counts = await rollout_store.task_status_counts(conn, states) if states else {}
            final = {run_id: c for run_id, c in counts.items() if kept_counts.is_final(states[run_id], c)}
            if final:
                async with self.db.transaction() as conn:
                    await kept_counts.keep(conn, final)
            return {run_id: kept[run_id] if run_id in kept else counts[run_id] for run_id in run_ids}

        counting = asyncio.ensure_future(counted())
        try:
            async with self.db.read() as conn:
                tallies = await run_history.run_tallies(conn, run_ids)
                leaving = await scope_removals.may_have_left(conn, schedule_id, run_ids)
                tasked = [run_id for run_id in run_ids if run_history.all_tasked(tallies[run_id])]
                ahead = (
                    await run_history.cells_from_tasks(conn, schedule_id, tasked, page_racks, leaving=leaving)
                    if tasked
                    else None
                )
            task_counts = await counting
        finally:
            counting.cancel()  # nothing, once it is done
        async with self.db.read() as conn:
            found = await run_history.grid_outcomes(
                conn,
                schedule_id,
                run_ids,
                page_racks,
                task_counts,
                tallies=tallies,
                read_ahead=(tasked, ahead) if ahead is not None else None,
                leaving=leaving,
            )
        return found, task_counts


def _decided(
    snapshot: Snapshot,
    schedule: Schedule,
    names: dict[uuid.UUID, str],
    after: datetime | None,
    now: datetime,
    count: int,
    default_start_deadline: timedelta | None,
) -> list[PlannedFiring]:
    """The schedule's next `count` firings and what the planner decides for each of its scopes then. Each
    is planned for its slot: the first, when overdue at `now`, for the schedule's `next_run_at` (so its
    start deadline may have passed), the others each for their own time."""
    scopes = snapshot.scopes[schedule.id]
    planned: list[PlannedFiring] = []
    overdue = schedule.next_run_at is not None and schedule.next_run_at < now
    for moment in planned_times(schedule, after, now, count):
        slot = moment
        if overdue and moment == now:  # the overdue slot, fired at once
            assert schedule.next_run_at is not None
            slot = schedule.next_run_at
        slotted = replace(snapshot, schedules=(replace(schedule, next_run_at=slot),))
        (decided,) = plan(slotted, moment, "dispatch", default_start_deadline=default_start_deadline)
        decisions = scope_decisions(decided)
        planned.append(
            PlannedFiring(
                moment,
                tuple(
                    PlannedScope(s, names.get(s.rack_id, "?"), decisions[s.id], decided.skipped or "")
                    for s in scopes
                ),
                needs_approval=schedule.approval is not None and not decided.missed and not decided.skipped,
                would_be_missed=decided.missed,
            )
        )
    return planned
