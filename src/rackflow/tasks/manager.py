"""The task manager: turns operations into tasks, applies the conflict rules, queues, promotes and cancels.

Every change to which tasks of a rack may run happens under that rack's row lock (PostgreSQL; SQLite has
one writer anyway), in one transaction per request: a refused request writes nothing. A rack's *blocking*
tasks are its PENDING and RUNNING ones, plus a cancelled task whose executor has not stopped yet (it still
holds the hardware). New tasks are checked against those; the QUEUE strategy parks a conflicting task as
WAITING, and the rack's waiting tasks are promoted oldest first, in order, whenever a blocking task ends.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.clock import Clock
from rackflow.domain.inventory import Component, ComponentsFilter, RackSelection, TargetSpec, TypesFilter
from rackflow.domain.tasks import (
    MAX_WAITING_PER_RACK,
    WINDOW_HOLD,
    ConflictStrategy,
    Ending,
    Operation,
    QueueOptions,
    RetryPolicy,
    Task,
    TaskAttempt,
    TaskStatus,
)
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound, RackflowError
from rackflow.frozen import quick_init
from rackflow.ids import id_beside
from rackflow.inventory.targets import resolve_targets
from rackflow.metrics import TASKS_FINISHED
from rackflow.store import checks as preflight
from rackflow.store import task_runs
from rackflow.store import tasks as store
from rackflow.store.db import Database, in_id_order
from rackflow.store.inventory import components_by_rack
from rackflow.tasks.backends.base import Backend
from rackflow.tasks.conflicts import first_conflict, shape_of
from rackflow.timespec import format_rfc3339
from rackflow.validation import check_description, check_operation, check_queue, check_window_not_over

log = logging.getLogger(__name__)

CANCELLED_MESSAGE = "cancelled by user"
EXPIRED_MESSAGE = "queue timeout expired"


# --- validation and selection: pure ---------------------------------------------------------------


def selected_components(selection: RackSelection, rack_components: Sequence[Component]) -> list[Component]:
    """The rack's components the selection's filter picks (no filter: all of them)."""
    chosen = selection.filter
    if chosen is None:
        return list(rack_components)
    if isinstance(chosen, TypesFilter):
        return [c for c in rack_components if c.type in chosen.types]
    assert isinstance(chosen, ComponentsFilter)
    return [c for c in rack_components if c.id in chosen.ids]


def _in_utc(operation: Operation) -> Operation:
    """A firmware upgrade's window is kept in UTC, as every time (CONTRIBUTING.md, "Time"); an operation
    without one (or with one in UTC already) as it is."""
    start, end = operation.window_start, operation.window_end
    if (start is None or start.tzinfo is UTC) and (end is None or end.tzinfo is UTC):
        return operation
    return replace(
        operation,
        window_start=start.astimezone(UTC) if start else None,
        window_end=end.astimezone(UTC) if end else None,
    )


class WindowWait(NamedTuple):
    """When a task may start (`not_before`) and by when it must have (`not_after`), what it says first,
    and whether it waits (then it is held by "window", its message the reason)."""

    not_before: datetime | None
    not_after: datetime | None
    message: str
    waits: bool


def window_wait(
    operation: Operation, reason: str, opens_at: datetime | None, closes_at: datetime | None, now: datetime
) -> WindowWait:
    """A task's wait for its window: the operation's own window (a firmware upgrade's) within the opening
    a deferred firing waits for (`opens_at`, `closes_at`), saying `reason` (else what its own window
    waits for). Written once for a submission and for a deferral decided again (`tasks.deferrals`)."""
    starts = [t for t in (operation.window_start, opens_at) if t is not None]
    ends = [t for t in (operation.window_end, closes_at) if t is not None]
    not_before = max(starts, default=None)
    own = operation.window_start
    if not reason and own is not None and own > now:
        reason = f"waits for its maintenance window, opening at {format_rfc3339(own)}"
    return WindowWait(
        not_before, min(ends, default=None), reason, not_before is not None and not_before > now
    )


def _expired(task: Task, now: datetime) -> bool:
    return task.queue_expires_at is not None and task.queue_expires_at <= now


def rack_label(rack_id: uuid.UUID, names: dict[uuid.UUID, str]) -> str:
    """`rack 'r1' (<id>)`: how every refusal names a rack (`'?'` for one that no longer exists)."""
    return f"rack {names.get(rack_id, '?')!r} ({rack_id})"


def _may_wait(
    operation: Operation, queue: QueueOptions, label: str, conflict: tuple[Task, str], waiting: int
) -> None:
    """Refuse a conflicting task unless it may queue and the rack's waiting queue has room."""
    other, reason = conflict
    clash = (
        f"{operation.kind.value} conflicts with task {other.id} "
        f"({other.status.value} {other.operation.kind.value}): {reason}"
    )
    if queue.strategy is ConflictStrategy.REJECT:
        raise FailedPrecondition(f"{label}: {clash}")
    if waiting >= MAX_WAITING_PER_RACK:
        raise FailedPrecondition(
            f"{label}: waiting queue full ({MAX_WAITING_PER_RACK} tasks waiting); {clash}"
        )


@quick_init
@dataclass(frozen=True)
class Submission:
    """One request for tasks: an operation on some racks, all of whose tasks are created or none."""

    operation: Operation
    selections: Sequence[RackSelection]
    description: str
    queue: QueueOptions
    schedule_id: uuid.UUID | None = None
    run_id: uuid.UUID | None = None  # the schedule firing it is for (its tasks carry it)
    message: str = ""  # what its tasks say first (default: what their operation's window waits for)
    # The opening a DEFER firing waits for: its tasks are held until `opens_at`, and fail if they have not
    # started by `closes_at` (with a firmware upgrade's own window, the later start and the earlier end).
    opens_at: datetime | None = None
    closes_at: datetime | None = None
    retry: RetryPolicy | None = None  # its schedule's: each task retries retryable failures so


def _checked(submission: Submission) -> Submission:
    """Validate what needs no database, and normalise (UTC windows, default queue timeout)."""
    check_operation(submission.operation)
    check_description(submission.description)
    rack_ids = [s.rack_id for s in submission.selections]
    if not rack_ids:
        raise InvalidArgument("target_spec: the targets select no rack")
    seen: set[uuid.UUID] = set()
    for rack_id in rack_ids:
        if rack_id in seen:
            raise InvalidArgument(f"target_spec: rack {rack_id} is targeted twice")
        seen.add(rack_id)
    operation, queue = _in_utc(submission.operation), check_queue(submission.queue)
    if operation is submission.operation and queue is submission.queue:
        return submission  # already normal, as a schedule's saved operation and queue options are
    return replace(submission, operation=operation, queue=queue)


@dataclass
class _RackState:
    """What the conflict rules need to know about the locked racks, kept current as tasks are admitted."""

    names: dict[uuid.UUID, str]
    components: dict[uuid.UUID, list[Component]]
    blocking: dict[uuid.UUID, list[Task]]
    waiting: dict[uuid.UUID, int]

    def plan(self, submission: Submission, now: datetime) -> list[Task]:
        """The submission's tasks, or the error that refuses all of them."""
        operation, queue = submission.operation, submission.queue
        missing = [s.rack_id for s in submission.selections if s.rack_id not in self.names]
        if missing:
            raise NotFound(f"rack_id: rack {missing[0]} not found")
        planned: list[Task] = []
        not_before, not_after, message, waits = window_wait(
            operation, submission.message, submission.opens_at, submission.closes_at, now
        )
        for selection in submission.selections:
            rack_id = selection.rack_id
            rack_components = self.components.get(rack_id, [])
            chosen = selected_components(selection, rack_components)
            if selection.filter is not None and not chosen:
                raise InvalidArgument(
                    "target_spec: the component filter selects no component of "
                    f"{rack_label(rack_id, self.names)}"
                )
            blocking = self.blocking.get(rack_id)
            conflict = None
            if blocking:  # a rack with nothing blocking (the usual one) conflicts with nothing
                shape = shape_of(operation.kind, (c.id for c in chosen), rack_components)
                conflict = first_conflict(shape, blocking, rack_components)
            status = TaskStatus.PENDING
            if conflict is not None:
                label = rack_label(rack_id, self.names)
                _may_wait(operation, queue, label, conflict, self.waiting.get(rack_id, 0))
                status = TaskStatus.WAITING
            planned.append(
                Task(
                    id=id_beside(submission.run_id),  # filed in its run's week
                    operation=operation,
                    rack_id=rack_id,
                    component_ids=tuple(c.id for c in chosen),
                    description=submission.description,
                    status=status,
                    message=message,
                    queue_expires_at=now + queue.timeout if status is TaskStatus.WAITING else None,
                    created_at=now,
                    started_at=None,
                    finished_at=None,
                    updated_at=now,
                    schedule_id=submission.schedule_id,
                    run_id=submission.run_id,
                    ignore_windows=queue.ignore_windows,
                    not_before=not_before,
                    not_after=not_after,
                    held_by=WINDOW_HOLD if waits else None,
                    held_reason=message if waits else None,
                    held_since=now if waits else None,
                    retry=submission.retry,
                )
            )
        return planned

    def admit(self, made: Sequence[Task]) -> None:
        """Count newly planned tasks in, so later submissions in the same batch see them."""
        for task in made:
            if task.status is TaskStatus.PENDING:
                self.blocking.setdefault(task.rack_id, []).append(task)
            else:
                self.waiting[task.rack_id] = self.waiting.get(task.rack_id, 0) + 1


@dataclass(frozen=True)
class LetGo:
    """What recording endings did: the tasks ended as reported, those sent back for another attempt,
    the waiting tasks promoted, and how many tasks reached each final status (those ended and the waiting
    ones that expired), for `count_ended` once the transaction has committed."""

    finished: frozenset[uuid.UUID]
    promoted: list[uuid.UUID]
    ended: Mapping[TaskStatus, int] = field(default_factory=dict)
    retried: frozenset[uuid.UUID] = frozenset()


class Promotion(NamedTuple):
    """What `promote_in` did: the waiting tasks promoted, and how many expired (TERMINATED)."""

    promoted: list[uuid.UUID]
    expired: int


class Ended(NamedTuple):
    """What ending tasks that had not begun did: the tasks it made TERMINATED, the promotion of the racks
    they left, and how many such tasks it left to the transactions that held them (`left`, counted by
    `cancel_not_begun_in`: a claim's, whose start gates decide them)."""

    task_ids: tuple[uuid.UUID, ...]
    promotion: Promotion
    left: int = 0


def count_ended(ended: Mapping[TaskStatus, int]) -> None:
    """`rackflow_tasks_finished_total`: tasks that reached a final status, counted once their transaction
    committed (a rolled-back one ended nothing)."""
    for status, count in ended.items():
        if count:
            TASKS_FINISHED.labels(status=status.value).inc(count)


# --- the manager --------------------------------------------------------------------------------


class TaskManager:
    """Submits, lists and cancels tasks; promotes and expires waiting ones for the executor.

    `on_submit` callbacks run after a commit that made tasks PENDING, so this process's executor can start
    them at once instead of at its next poll. `decide_owed`: what decides, once their submit committed,
    tasks it recorded as owed a window's decision (`tasks.deferrals`, which sets it; None: the executors'
    look again alone decides them).
    """

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.on_submit: list[Callable[[], None]] = []
        self.decide_owed: Callable[[Collection[uuid.UUID]], Awaitable[None]] | None = None
        # This process's backend (its executor's, set by the server): what it says no task could carry out
        # is refused up front (`check_runnable`). None: nothing is known (no executor here).
        self.backend: Backend | None = None

    def check_runnable(self, operation: Operation, field: str = "") -> Operation:
        """FailedPrecondition when this process's backend says every task of `operation` would fail, on any
        rack (`Backend.refusal`: a redfish upgrade by version without RACKFLOW_REDFISH_IMAGE_URI). Peers
        are meant to share their backend settings: the peer asked decides for the one that will run it."""
        refusal = self.backend.refusal(operation, field) if self.backend is not None else None
        if refusal is not None:
            raise FailedPrecondition(refusal)
        return operation

    def wake_executors(self) -> None:
        for callback in self.on_submit:
            callback()

    def _wake_if_pending(self, made: Iterable[Task]) -> None:
        if any(t.status is TaskStatus.PENDING for t in made):
            self.wake_executors()

    # --- submitting -----------------------------------------------------------------------------

    async def submit(
        self,
        operation: Operation,
        target: Sequence[RackSelection] | TargetSpec,
        *,
        description: str,
        queue: QueueOptions,
        schedule_id: uuid.UUID | None = None,
    ) -> list[Task]:
        """One task per selected rack, all or none, in one transaction (a target spec is resolved to racks
        in it). A direct submission only: an upgrade whose window has ended is refused here, and so is one
        its backend cannot carry out (`check_runnable`); a schedule's firing past that end submits nothing
        (the planner skips it and pauses the schedule: `domain.firing.window_ended_reason`), nor does a
        rollout's step (its rule has rackflow cancel the run: `domain.rollouts.window_ended_cancel`) or an
        approval (its run expires at the end: `domain.approvals.opened`) past it; a task made before the
        end and not started by then fails at its claim, as the run shows (`submit_each_in`)."""
        check_window_not_over(
            operation, self.clock.now(), "", "the upgrade could never start (its task would fail unrun)"
        )
        self.check_runnable(operation)
        async with self.db.transaction() as conn:
            selections = await resolve_targets(conn, target) if isinstance(target, TargetSpec) else target
            made = await self.submit_in(
                conn, operation, selections, description=description, queue=queue, schedule_id=schedule_id
            )
        self._wake_if_pending(made)
        return made

    async def submit_in(
        self,
        conn: AsyncConnection,
        operation: Operation,
        selections: Sequence[RackSelection],
        *,
        description: str,
        queue: QueueOptions,
        schedule_id: uuid.UUID | None = None,
    ) -> list[Task]:
        """The submission inside the caller's transaction; after commit the caller calls `wake_executors`.

        Raises InvalidArgument (bad operation, options or filter), NotFound (unknown rack) or
        FailedPrecondition (a conflict under REJECT, or a full waiting queue) and writes nothing then,
        provided the caller rolls back.
        """
        submission = Submission(operation, tuple(selections), description, queue, schedule_id)
        (result,) = await self.submit_each_in(conn, [submission])
        if isinstance(result, RackflowError):
            raise result
        return result

    async def submit_each_in(
        self, conn: AsyncConnection, submissions: Sequence[Submission]
    ) -> list[list[Task] | RackflowError]:
        """Several independent submissions in the caller's transaction, each all or nothing on its own.

        A refused submission comes back as its error and writes nothing; the others' tasks are inserted.
        The racks of all of them are locked and read once, and each submission is decided against that
        state as the earlier ones in the list left it (so two submissions on one rack conflict as two
        requests would). This is what lets the dispatcher fire a whole batch in a few round trips.
        """
        results: list[list[Task] | RackflowError | None] = []
        checked: list[Submission | None] = []
        for submission in submissions:
            try:
                checked.append(_checked(submission))
                results.append(None)
            except RackflowError as exc:
                checked.append(None)
                results.append(exc)
        rack_ids = {s.rack_id for c in checked if c is not None for s in c.selections}
        if not rack_ids:
            return [r if r is not None else InvalidArgument("target_spec: no rack") for r in results]
        names = await store.lock_racks(self.db, conn, rack_ids)
        blocking, waiting = await store.blocking_and_waiting(conn, names.keys())
        state = _RackState(
            names=names,
            components=await components_by_rack(conn, names.keys()),
            blocking=blocking,
            waiting=waiting,
        )
        now = self.clock.now()
        made: list[Task] = []
        for index, candidate in enumerate(checked):
            if candidate is None:
                continue
            try:
                planned = state.plan(candidate, now)
            except RackflowError as exc:
                results[index] = exc
                continue
            state.admit(planned)
            made.extend(planned)
            results[index] = planned
        await store.insert_tasks(conn, made)
        return [r for r in results if r is not None]

    # --- reading --------------------------------------------------------------------------------

    async def list_tasks(
        self,
        *,
        rack_id: uuid.UUID | None = None,
        schedule_id: uuid.UUID | None = None,
        active_only: bool = False,
        statuses: Collection[TaskStatus] = (),
        offset: int = 0,
        limit: int | None = None,
        after: Sequence[Any] | None = None,
    ) -> tuple[list[Task], int]:
        """Newest first (after the `store.TASK_ORDER` key `after`), with the total before paging (counted
        up to LIST_COUNT_CAP, then more); `statuses` (if any) and `active_only` both apply. Read in a
        transaction: a schedule's page is planned with settings local to it (`store.list_tasks`)."""
        async with self.db.read(in_transaction=True) as conn:
            return await store.list_tasks(
                conn,
                rack_id=rack_id,
                schedule_id=schedule_id,
                active_only=active_only,
                statuses=statuses,
                offset=offset,
                limit=limit,
                after=after,
            )

    async def get_tasks(self, task_ids: Sequence[uuid.UUID]) -> list[Task]:
        """The tasks that exist, in the order asked (each once); unknown ids are left out."""
        async with self.db.read() as conn:
            found = {t.id: t for t in await store.get_tasks(conn, task_ids)}
        return [found[i] for i in dict.fromkeys(task_ids) if i in found]

    async def attempts(self, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, list[TaskAttempt]]:
        """The ended attempts of each of these tasks that has any, oldest first."""
        if not task_ids:
            return {}
        async with self.db.read() as conn:
            return await store.attempts(conn, task_ids)

    async def statuses(self, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, TaskStatus]:
        """The status of each task that exists among `task_ids`."""
        async with self.db.read() as conn:
            return await store.statuses(conn, task_ids)

    async def status_counts(self, created_since: datetime) -> dict[TaskStatus, int]:
        """Active tasks, and ended tasks created since `created_since`, by status."""
        async with self.db.read() as conn:
            return await store.status_counts(conn, created_since=created_since)

    async def failed_since(self, created_since: datetime, limit: int) -> list[Task]:
        """FAILED tasks created since `created_since`, newest first."""
        async with self.db.read() as conn:
            return await store.failed_since(conn, created_since=created_since, limit=limit)

    async def held(self, limit: int) -> tuple[list[Task], int]:
        """Pending tasks a freeze, a budget or a deferral holds back now (newest first), and how many."""
        async with self.db.read() as conn:
            return await store.held_tasks(conn, now=self.clock.now(), limit=limit)

    # --- cancelling -----------------------------------------------------------------------------

    async def cancel(self, task_id: uuid.UUID) -> Task:
        """Stop an active task (TERMINATED, "cancelled by user"); a terminated one stays as it is.

        A RUNNING task keeps its executor's hold until the executor notices between two steps and lets
        go; only then are the rack's waiting tasks promoted.
        """
        async with self.db.transaction() as conn:
            found = await store.get_task(conn, task_id)
            if found is None:
                raise NotFound(f"task_id: task {task_id} not found")
            await store.lock_racks(self.db, conn, [found.rack_id])
            task = await store.get_task(conn, task_id, lock=self.db)
            if task is None:  # deleted with its rack meanwhile
                raise NotFound(f"task_id: task {task_id} not found")
            if task.status is TaskStatus.TERMINATED:
                return task
            if task.status.is_final:
                raise FailedPrecondition(
                    f"task_id: task {task_id} is already {task.status.value}; "
                    "only active tasks can be cancelled"
                )
            # A RUNNING task's rack is promoted once its executor lets go.
            freed = [] if task.status is TaskStatus.RUNNING else [task.rack_id]
            ended = await self._terminate_in(conn, [task_id], freed, CANCELLED_MESSAGE)
            cancelled = await store.get_task(conn, task_id)
        self.after_ended(ended)
        assert cancelled is not None
        return cancelled

    async def cancel_not_begun_in(self, conn: AsyncConnection, run_id: uuid.UUID, message: str) -> Ended:
        """End the run's tasks that have not begun acting (`store.not_begun_of_run`), in the caller's
        transaction, as CancelTask ends a task that has not started: TERMINATED with `message`, their racks'
        queues promoted; the caller calls `after_ended` once it committed. Their racks are locked first, as
        CancelTask locks its task's. A task a claim holds meanwhile is left to that claim (`lock_not_begun`:
        it starts, or the run's start gate ends it, there or once another gate's hold there ends), and
        counted (`Ended.left`, so that the cancel can say so); tasks that began go on."""
        racks = await store.not_begun_racks(conn, run_id)
        if not racks:
            return Ended((), Promotion([], 0))
        await store.lock_racks(self.db, conn, racks)
        ended = await self._terminate_in(
            conn, await store.lock_not_begun(self.db, conn, run_id), racks, message
        )
        return ended._replace(left=await store.count_not_begun(conn, run_id))

    async def end_deferred_in(self, conn: AsyncConnection, ending: Sequence[tuple[Task, str]]) -> Ended:
        """End, TERMINATED with its reason, each of these tasks that has still not started
        (`store.deferred_tasks`), in the caller's transaction: their racks locked first, as CancelTask
        locks its task's (a window's change holds them already: the lock order of `tasks.deferrals`), then
        the tasks, skipping one a claim holds (its opening came: it starts); their racks' queues promoted.
        The caller calls `after_ended` once it committed."""
        racks = {task.rack_id for task, _ in ending}
        await store.lock_racks(self.db, conn, racks)
        locked = set(await store.lock_deferred(self.db, conn, [task.id for task, _ in ending]))
        by_reason: dict[str, list[uuid.UUID]] = {}
        for task, reason in ending:
            if task.id in locked:
                by_reason.setdefault(reason, []).append(task.id)
        now = self.clock.now()
        for reason, task_ids in by_reason.items():
            await store.set_status(conn, task_ids, TaskStatus.TERMINATED, now=now, message=reason)
        ended = tuple(task.id for task, _ in ending if task.id in locked)
        return Ended(ended, await self.promote_in(conn, racks) if ended else Promotion([], 0))

    async def _terminate_in(
        self,
        conn: AsyncConnection,
        task_ids: Sequence[uuid.UUID],
        freed: Collection[uuid.UUID],
        message: str,
    ) -> Ended:
        """Make the tasks (locked, with their racks) TERMINATED with `message`, and promote the queues of
        `freed`, the racks they no longer block."""
        await store.set_status(conn, task_ids, TaskStatus.TERMINATED, now=self.clock.now(), message=message)
        return Ended(tuple(task_ids), await self.promote_in(conn, freed) if freed else Promotion([], 0))

    def after_ended(self, ended: Ended) -> None:
        """Once tasks ended by `cancel_not_begun_in` (or CancelTask) committed: count them (and the waiting
        tasks the promotion expired), and wake the executors for the tasks promoted."""
        count_ended({TaskStatus.TERMINATED: len(ended.task_ids) + ended.promotion.expired})
        if ended.promotion.promoted:
            self.wake_executors()

    # --- promotion and expiry: called by the executor -------------------------------------------

    async def promote_in(self, conn: AsyncConnection, rack_ids: Iterable[uuid.UUID]) -> Promotion:
        """Expire the racks' overdue waiting tasks, then promote the rest oldest first, while they fit.

        The caller holds the racks' locks. Promotion stops at the first waiting task that still conflicts,
        so tasks queued on one rack start in the order they were submitted.
        """
        queues = await store.waiting_tasks(conn, set(rack_ids))
        if not queues:
            return Promotion([], 0)
        racks = in_id_order(queues)
        now = self.clock.now()
        by_rack = await components_by_rack(conn, racks)
        blocking = await store.blocking_tasks(conn, racks)
        expired = {t.id for queue in queues.values() for t in queue if _expired(t, now)}
        promoted: list[uuid.UUID] = []
        for rack_id in racks:
            active = list(blocking.get(rack_id, ()))
            for task in (t for t in queues[rack_id] if t.id not in expired):
                shape = shape_of(task.operation.kind, task.component_ids, by_rack[rack_id])
                if first_conflict(shape, active, by_rack[rack_id]) is not None:
                    break
                active.append(task)
                promoted.append(task.id)
        await store.set_status(conn, list(expired), TaskStatus.TERMINATED, now=now, message=EXPIRED_MESSAGE)
        await store.set_status(conn, promoted, TaskStatus.PENDING, now=now)
        return Promotion(promoted, len(expired))

    async def finish(
        self, task_id: uuid.UUID, *, owner_id: uuid.UUID, status: TaskStatus, message: str
    ) -> bool:
        """End a task `owner_id` runs, drop its hold and promote the rack's waiting tasks.

        False when the task was cancelled meanwhile (its hold is dropped all the same) or taken over by
        another instance (nothing changes).
        """
        return await self._let_go(task_id, owner_id, (status, message))

    async def release(self, task_id: uuid.UUID, *, owner_id: uuid.UUID) -> None:
        """`owner_id` has stopped working on a cancelled task: drop its hold and promote the rack."""
        await self._let_go(task_id, owner_id, None)

    async def _let_go(
        self, task_id: uuid.UUID, owner_id: uuid.UUID, outcome: tuple[TaskStatus, str] | None
    ) -> bool:
        async with self.db.transaction() as conn:
            task = await store.get_task(conn, task_id)
            if task is None:
                return False
            let_go = await self.let_go_in(conn, owner_id, [Ending(task_id, task.rack_id, outcome)])
        count_ended(let_go.ended)
        if let_go.promoted:
            self.wake_executors()
        return task_id in let_go.finished

    async def let_go_in(self, conn: AsyncConnection, owner_id: uuid.UUID, endings: Sequence[Ending]) -> LetGo:
        """Record what `owner_id`'s executor is done with, in the caller's transaction; the caller calls
        `wake_executors` after commit when something was promoted.

        Locks the racks first (so a submit on them waits and then sees the tasks gone), then learns which
        have waiting tasks (most have none), those a submit queued while the lock waited included; ends
        the tasks that are still RUNNING there, sends those whose attempt failed retryably back for their
        next attempt (`Ending.retry_at`: they stay active, so the rack stays theirs), drops the hold on
        those cancelled meanwhile, and promotes the waiting tasks of those racks. A task taken over by
        another instance is left alone. The attempts of tasks with retries are recorded (`task_attempt`).
        """
        waiting = await store.lock_racks_with_waiting(self.db, conn, {e.rack_id for e in endings})
        now = self.clock.now()
        retries = {
            e.task_id: (e.retry_at, e.outcome[1])
            for e in endings
            if e.retry_at is not None and e.outcome is not None
        }
        outcomes = {
            e.task_id: e.outcome for e in endings if e.outcome is not None and e.task_id not in retries
        }
        finished = await task_runs.finish(conn, outcomes, owner_id=owner_id, now=now)
        retried = await task_runs.retry_later(conn, retries, owner_id=owner_id, now=now) if retries else set()
        if retried:
            await preflight.forget_overrides(conn, retried)  # checks run again for every attempt
        stopped = [e.task_id for e in endings if e.task_id not in finished and e.task_id not in retried]
        freed = finished | (await task_runs.release(conn, stopped, owner_id=owner_id) if stopped else set())
        recorded = finished | retried
        await task_runs.record_attempts(
            conn, [e.attempt for e in endings if e.attempt is not None and e.task_id in recorded]
        )
        racks = {e.rack_id for e in endings if e.task_id in freed} & waiting
        promotion = await self.promote_in(conn, racks) if racks else Promotion([], 0)
        ended = Counter(outcomes[i][0] for i in finished)
        ended[TaskStatus.TERMINATED] += promotion.expired
        return LetGo(
            finished=frozenset(finished), promoted=promotion.promoted, ended=ended, retried=frozenset(retried)
        )

    async def sweep(self, *, lease_ttl: timedelta, dead_holds: bool = True) -> list[uuid.UUID]:
        """Housekeeping the executors run; returns the ids promoted.

        Expires overdue waiting tasks and promotes waiting tasks of racks nothing blocks any more
        (normally finishing a task promotes at once; this catches what a crash or an expiry left behind).
        With `dead_holds`, also drops the holds of dead instances on cancelled tasks (found through the
        partial index on held tasks); executors ask for it once per lease period.
        """
        async with self.db.read() as conn:  # usually there is nothing to do: find out without writing
            stale_before = await self.db.now(conn) - lease_ttl
            held = await store.racks_with_dead_holds(conn, stale_before=stale_before) if dead_holds else set()
            racks = held | await store.racks_needing_promotion(conn, now=self.clock.now())
        if not racks:
            return []
        async with self.db.transaction() as conn:
            await store.lock_racks(self.db, conn, racks)
            await store.release_dead_holds(conn, held, stale_before=stale_before)
            promoted, expired = await self.promote_in(conn, racks)
        count_ended({TaskStatus.TERMINATED: expired})
        if promoted:
            log.info("promoted %d waiting task(s)", len(promoted))
            self.wake_executors()
        return promoted
