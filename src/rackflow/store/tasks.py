"""Task rows: mapping to `Task` and the queries the task manager runs (the executor's: `store.task_runs`).

No rules live here: which task may run, wait or be promoted is decided in `rackflow.tasks.manager`.

An `owner_id` is a *hold*: the instance named there is (or may still be) acting on the task's components.
Claiming sets it; finishing and letting go of a cancelled task clear it; a cancelled RUNNING task keeps it
until its executor has stopped, so nothing conflicting starts on the hardware before then.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import defaultdict
from collections.abc import AsyncGenerator, Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from operator import itemgetter
from typing import Any, NamedTuple

from sqlalchemy import (
    Row,
    String,
    and_,
    case,
    false,
    func,
    literal,
    literal_column,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement, FromClause, Select

from rackflow.config import LIST_COUNT_CAP
from rackflow.domain.schedules import ROLLOUT_LIVE_STATES, Trigger
from rackflow.domain.tasks import (
    ACTIVE_STATUSES,
    Fail,
    Hold,
    Operation,
    RetryPolicy,
    Task,
    TaskAttempt,
    TaskStatus,
)
from rackflow.domain.windows import WindowPolicy
from rackflow.errors import AlreadyExists
from rackflow.store import kept_counts, task_partitions
from rackflow.store.db import Database, chunked, in_id_order, some_of, unique_violation_as
from rackflow.store.dialect import (
    POSTGRESQL,
    SQLITE,
    by_keys,
    in_keys,
    insert_rows,
    locks_rows,
    newest_from_own_index,
    skip_locked,
)
from rackflow.store.instances import is_live
from rackflow.store.paging import Key, after_key, count_capped
from rackflow.store.retention import PRUNE_CHUNK, drop_past_weeks, prune_older
from rackflow.store.streak_checks import mark_schedules_of_tasks
from rackflow.store.tables import racks, task_attempt, task_schedule, task_schedule_run, tasks
from rackflow.store.types import UTCDateTime

_BLOCKING = (TaskStatus.PENDING, TaskStatus.RUNNING)
OLDEST_FIRST = (tasks.c.created_at, tasks.c.id)
# A task's row as its reads take it: all but its filing time, which only places it in its partition
# (`store.task_partitions`) and which no read needs.
TASK_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(c for c in tasks.c if c is not tasks.c.filed_at)


def status_in(status: ColumnElement[str], *statuses: TaskStatus) -> ColumnElement[bool]:
    """`status IN ('a', …)` with the statuses written into the SQL rather than sent as parameters.

    psycopg prepares a statement after a few runs, and PostgreSQL may then plan it generically: such a
    plan cannot match the partial index `ix_tasks_active` from a parameter, so it scans every ended task.
    """
    return status.in_([literal_column(f"'{s.value}'", String) for s in statuses])


def is_active(status: ColumnElement[str]) -> ColumnElement[bool]:
    """The task is active (`ACTIVE_STATUSES`: pending, running or waiting), spelled as the predicate of
    `ix_tasks_active` (statuses and their order): SQLite uses a partial index only for a query that repeats
    its predicate. Every query that asks for active tasks uses this."""
    return status_in(status, *ACTIVE_STATUSES)


def is_live_on_rack(task: FromClause) -> ColumnElement[bool]:
    """The task is live on its rack: active, or cancelled and still held. The predicate of
    `ix_tasks_live_rack_id` (PostgreSQL), which the reads of a rack's live tasks repeat so that they read
    that index by rack: given only the active statuses, PostgreSQL may read an index of every active task
    instead (`ix_tasks_active`, `ix_tasks_live_queue`) when its statistics say few are live, and filter all
    of them by rack, for each rack."""
    return or_(is_active(task.c.status), task.c.owner_id.is_not(None))


def blocks(task: FromClause) -> ColumnElement[bool]:
    """The task (of `tasks` or an alias) keeps a new one on its rack waiting: PENDING, RUNNING, or a
    cancelled one still held."""
    return or_(status_in(task.c.status, *_BLOCKING), task.c.owner_id.is_not(None))


def not_begun_of_run(run_id: uuid.UUID) -> ColumnElement[bool]:
    """The run's tasks that have not begun acting: at their first attempt and PENDING (not claimed yet, or
    handed back held by a start gate or waiting for their window) or WAITING in their rack's queue. A
    claim makes a task RUNNING, and a retry's next attempt is not the first, so neither is here."""
    return and_(
        tasks.c.run_id == run_id,
        status_in(tasks.c.status, TaskStatus.PENDING, TaskStatus.WAITING),
        tasks.c.attempt == 1,
    )


def unclaimed(conn: AsyncConnection, *conditions: ColumnElement[bool]) -> ColumnElement[bool]:
    """The tasks matching `conditions` that no other transaction holds, locked as the statement using this
    (`id IN (… FOR UPDATE SKIP LOCKED)`, PostgreSQL) takes them: how a writer holding a rollout run's row
    (a halt, a resume, a window's change) writes the run's tasks. The executor's claim locks its tasks,
    then its rollout gate takes their runs' rows only when free (`rollouts.gate`; the lock order atop
    `rackflow.tasks.executor`). The writer skips a task a claim holds rather than wait for that claim, and
    the claim's rollout gate decides it from the run as the writer left it: at that claim if the writer
    committed first, else at the next one."""
    return tasks.c.id.in_(skip_locked(conn.dialect.name, select(tasks.c.id).where(*conditions)))


def task_from_row(row: Row[*tuple[Any, ...]]) -> Task:
    return Task(
        id=row.id,
        operation=Operation.from_json(row.parameters),
        rack_id=row.rack_id,
        component_ids=tuple(uuid.UUID(i) for i in row.component_ids),
        description=row.description,
        status=TaskStatus(row.status),
        message=row.message,
        queue_expires_at=row.queue_expires_at,
        created_at=row.created_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        updated_at=row.updated_at,
        schedule_id=row.schedule_id,
        run_id=row.run_id,
        ignore_windows=row.ignore_windows,
        not_before=row.not_before,
        not_after=row.not_after,
        held_by=row.held_by,
        held_reason=row.held_reason,
        held_since=row.held_since,
        retry=RetryPolicy.from_json(row.retry) if row.retry is not None else None,
        attempt=row.attempt,
        attempt_started_at=row.attempt_started_at,
        refusal=Fail(row.refusal["reason"], TaskStatus(row.refusal["ends_as"])) if row.refusal else None,
    )


def refusal_json(refusal: Fail) -> dict[str, str]:
    """How `tasks.refusal` keeps a start gate's refusal (read back by `task_from_row`)."""
    return {"reason": refusal.reason, "ends_as": refusal.ends_as.value}


def _task_values(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "operation": task.operation.kind.value,
        "parameters": task.operation.to_json(),
        "rack_id": task.rack_id,
        "component_ids": [str(i) for i in task.component_ids],
        "description": task.description,
        "status": task.status.value,
        "message": task.message,
        "queue_expires_at": task.queue_expires_at,
        "created_at": task.created_at,
        "started_at": task.started_at,
        "finished_at": task.finished_at,
        "updated_at": task.updated_at,
        "schedule_id": task.schedule_id,
        "run_id": task.run_id,
        "ignore_windows": task.ignore_windows,
        "not_before": task.not_before,
        "not_after": task.not_after,
        "held_by": task.held_by,
        "held_reason": task.held_reason,
        "held_since": task.held_since,
        "retry": task.retry.to_json() if task.retry is not None else None,
        "attempt": task.attempt,
        "attempt_started_at": task.attempt_started_at,
        "filed_at": task_partitions.filed_at(task.id),
    }


def hold_values(gate: str, hold: Hold, now: datetime) -> dict[str, Any]:
    """The columns a hold writes on a task: `not_before` and who holds it, why and since when (since the
    first of this gate's holds in a row, so a gate can tell how long it has held the task). The message
    says the reason too, as everything that waits does."""
    at = literal(now, UTCDateTime())
    return {
        "not_before": hold.until,
        "held_by": gate,
        "held_reason": hold.reason,
        "held_since": case((tasks.c.held_by == gate, func.coalesce(tasks.c.held_since, at)), else_=at),
        "message": hold.reason,
        "updated_at": now,
    }


# Written when a task starts: nothing holds it any more (`not_after` stays: a takeover is refused past it).
NOT_HELD: dict[str, Any] = {"not_before": None, "held_by": None, "held_reason": None, "held_since": None}


async def insert_tasks(conn: AsyncConnection, new: Sequence[Task]) -> None:
    """Insert the tasks in one statement (`insert_rows`). A firing has one task per rack: a second one for
    a (run, rack) is refused by the database, whatever submitted it, as `AlreadyExists` naming the run.

    In order of filing time: a task created after its week ended takes its week's row of
    `task_late_weeks` (migration 0063's trigger, row by row in the statement's order), so two transactions
    writing such tasks of the same weeks take those rows in one order, and never deadlock on them."""
    if not new:
        return
    await task_partitions.ensure_weeks_for(conn, [t.id for t in new])
    rows = sorted(map(_task_values, new), key=itemgetter("filed_at"))
    try:
        await conn.execute(*insert_rows(conn.dialect.name, tasks, rows))
    except IntegrityError:
        # The runs are named only for the error: writing and sorting a batch's run ids cost every firing.
        runs = some_of(sorted({str(t.run_id) for t in new if t.run_id is not None}))
        with unique_violation_as(AlreadyExists("run_id", runs, "a task on one of these racks from the run")):
            raise


async def attempts(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, list[TaskAttempt]]:
    """The ended attempts of these tasks (`task_attempt`), by task, oldest first."""
    found: dict[uuid.UUID, list[TaskAttempt]] = {}
    for chunk in chunked(list(task_ids)):
        stmt = (
            select(task_attempt)
            .where(in_keys(conn.dialect.name, task_attempt.c.task_id, chunk))
            .order_by(task_attempt.c.task_id, task_attempt.c.attempt)
        )
        for row in await conn.execute(stmt):
            found.setdefault(row.task_id, []).append(
                TaskAttempt(
                    row.task_id,
                    row.attempt,
                    row.started_at,
                    row.finished_at,
                    TaskStatus(row.status),
                    row.message,
                    row.retryable,
                )
            )
    return found


# The statements of a submit's lookups by key, built once (`dialect.by_keys` reuses what it builds from each).
_RACK_NAMES = select(racks.c.id, racks.c.name)
# A rack's blocking or waiting tasks: every active task, and cancelled ones still held; on PostgreSQL in the
# partitions that can hold one (`task_partitions.live_weeks`).
_LIVE_TASKS = {
    POSTGRESQL: select(*TASK_COLUMNS).where(is_live_on_rack(tasks), task_partitions.LIVE_FILING),
    SQLITE: select(*TASK_COLUMNS).where(is_live_on_rack(tasks)),
}


async def lock_racks(
    db: Database, conn: AsyncConnection, rack_ids: Iterable[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """Lock the racks' rows until commit, in id order (so lockers never deadlock); returns id -> name.

    On PostgreSQL each row is locked as its lookup (`by_keys`) reaches it, so the keys go in sorted.

    Every change to which tasks of a rack may run (submit, promote, cancel, finish) takes this lock first.
    It is `FOR NO KEY UPDATE` (`keys_kept`: no such change deletes a rack or changes its id), which those
    changes exclude each other by as by `FOR UPDATE`, but which never makes a foreign key's check of the
    rack wait (`FOR KEY SHARE`). PostgreSQL checks `tasks.rack_id` again whenever a transaction writes a
    task row it wrote already, whether or not the key changed: the executor's claim does at every claim
    (a start gate's hold, the first progress message), holding the task rows it claimed. Were this lock
    `FOR UPDATE`, CancelTask (this lock, then its task's row) and a claim of that task would each wait for
    the other (the lock order atop `rackflow.tasks.executor`).
    """
    names: dict[uuid.UUID, str] = {}
    for chunk in chunked(in_id_order(rack_ids)):
        stmt = by_keys(db.dialect, _RACK_NAMES, racks.c.id, chunk, order_by=[racks.c.id])
        names.update({r.id: r.name for r in await conn.execute(db.for_update(stmt, keys_kept=True))})
    return names


async def _tasks_where(conn: AsyncConnection, stmt: Select[Any]) -> list[Task]:
    return [task_from_row(r) for r in await conn.execute(stmt)]


async def blocking_tasks(conn: AsyncConnection, rack_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, list[Task]]:
    """Per rack, the tasks a new task is checked against: PENDING, RUNNING, and still-held cancelled ones."""
    by_rack: dict[uuid.UUID, list[Task]] = defaultdict(list)
    for chunk in chunked(set(rack_ids)):
        stmt = select(*TASK_COLUMNS).where(tasks.c.rack_id.in_(chunk), blocks(tasks)).order_by(*OLDEST_FIRST)
        for task in await _tasks_where(conn, stmt):
            by_rack[task.rack_id].append(task)
    return by_rack


async def blocking_and_waiting(
    conn: AsyncConnection, rack_ids: Iterable[uuid.UUID]
) -> tuple[dict[uuid.UUID, list[Task]], dict[uuid.UUID, int]]:
    """Per rack, `blocking_tasks` and how many tasks wait in its queue, read with one query per chunk.

    Submission needs both for the same racks; reading them together saves it a round trip. Each rack's
    live tasks are looked up on their own (`by_keys`): on PostgreSQL `rack_id IN (…)` was planned as a full
    scan of `tasks`, once per dispatched batch, while the table grew from empty.
    """
    blocking: dict[uuid.UUID, list[Task]] = defaultdict(list)
    waiting: dict[uuid.UUID, int] = defaultdict(int)
    racks_, dialect = set(rack_ids), conn.dialect.name
    weeks = await task_partitions.live_weeks(conn) if racks_ else {}
    for chunk in chunked(racks_):
        stmt = by_keys(dialect, _LIVE_TASKS[dialect], tasks.c.rack_id, chunk, order_by=OLDEST_FIRST)
        for row in await conn.execute(stmt, weeks):
            if row.status == TaskStatus.WAITING.value:
                waiting[row.rack_id] += 1
            if row.status in _BLOCKING or row.owner_id is not None:
                blocking[row.rack_id].append(task_from_row(row))
    return blocking, waiting


async def waiting_tasks(
    conn: AsyncConnection, rack_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, list[Task]]:
    """Each rack's queue, oldest first (a rack without waiting tasks is left out)."""
    by_rack: dict[uuid.UUID, list[Task]] = defaultdict(list)
    for chunk in chunked(rack_ids):
        stmt = (
            select(*TASK_COLUMNS)
            .where(tasks.c.rack_id.in_(chunk), tasks.c.status == TaskStatus.WAITING.value)
            .order_by(*OLDEST_FIRST)
        )
        for task in await _tasks_where(conn, stmt):
            by_rack[task.rack_id].append(task)
    return by_rack


async def get_task(conn: AsyncConnection, task_id: uuid.UUID, *, lock: Database | None = None) -> Task | None:
    named = task_partitions.of_tasks(conn.dialect.name, tasks.c.filed_at, [task_id])
    stmt = select(*TASK_COLUMNS).where(tasks.c.id == task_id, named)
    found = await _tasks_where(conn, lock.for_update(stmt) if lock else stmt)
    return found[0] if found else None


async def get_tasks(conn: AsyncConnection, task_ids: Sequence[uuid.UUID]) -> list[Task]:
    """The tasks that exist, in any order."""
    found: list[Task] = []
    for chunk in chunked(set(task_ids)):
        named = task_partitions.of_tasks(conn.dialect.name, tasks.c.filed_at, chunk)
        found += await _tasks_where(
            conn, select(*TASK_COLUMNS).where(in_keys(conn.dialect.name, tasks.c.id, chunk), named)
        )
    return found


async def not_begun_racks(conn: AsyncConnection, run_id: uuid.UUID) -> set[uuid.UUID]:
    """The racks of the run's tasks that have not begun (`not_begun_of_run`): the racks to lock before
    ending them."""
    stmt = select(tasks.c.rack_id).where(not_begun_of_run(run_id)).distinct()
    return set((await conn.execute(stmt)).scalars())


async def lock_not_begun(db: Database, conn: AsyncConnection, run_id: uuid.UUID) -> list[uuid.UUID]:
    """Lock the run's tasks that have not begun, under their racks' locks (the caller's); a row another
    transaction holds is skipped, not waited for: a claim's (it started the task, or its start gates,
    which read the run, decide it), or a gate's hold written outside a claim (the task then comes before
    the gates, and so before the run's, when it would start)."""
    stmt = select(tasks.c.id).where(not_begun_of_run(run_id)).order_by(tasks.c.id)
    return list((await conn.execute(db.skip_locked(stmt))).scalars())


async def count_not_begun(conn: AsyncConnection, run_id: uuid.UUID) -> int:
    """How many of the run's tasks have not begun (`not_begun_of_run`), as the caller's transaction sees
    them: after `lock_not_begun` and the ending of what it locked, those it skipped (a claim, or a gate's
    hold written outside a claim, held them uncommitted)."""
    stmt = select(func.count()).select_from(tasks).where(not_begun_of_run(run_id))
    return int(await conn.scalar(stmt) or 0)


# The task list's order, newest first (each column descending); a page token holds its values.
TASK_ORDER = (tasks.c.created_at, tasks.c.id)
NEWEST_FIRST = [column.desc() for column in TASK_ORDER]  # the task list's order


async def list_tasks(
    conn: AsyncConnection,
    *,
    rack_id: uuid.UUID | None,
    schedule_id: uuid.UUID | None,
    active_only: bool,
    statuses: Collection[TaskStatus] = (),
    offset: int,
    limit: int | None,
    after: Key | None = None,
) -> tuple[list[Task], int]:
    """Newest first (after the key `after` of TASK_ORDER if given), and the total before paging
    (`paging.count_capped`).

    A page (`limit`) finds its tasks' ids first, then reads their rows by key: asked for whole rows,
    PostgreSQL judged a walk of the creation-time index, filtering each row, cheaper than a schedule's own
    index whenever the schedule's tasks were many, which reads the whole history newer than its newest
    task (113 ms at full size for a 10,000-rack schedule with 200,301 tasks newer than its newest); asked
    for the ids alone it reads them from the schedule's index and stops at the page's end
    (docs/PERFORMANCE.md, issue 29). That index is keyed by status before the list's order (migration
    0058), so a schedule's page of more than one status, or of every status, merges the newest of each
    (`_newest_of_each_status`), as a page of several statuses does without a schedule.

    On PostgreSQL a page is looked for in the newest weeks first (`task_partitions.page_weeks`), and so
    is its count: each statement is planned over the partitions it reads, and over a year of weeks a
    schedule's page of every status planned for 86 ms and ran for 17 (docs/PERFORMANCE.md, "A page of
    tasks from the newest weeks"). A schedule whose tasks fit in the page is read whole from its index
    and sorted, one read a week rather than one a status.

    A schedule's page is planned without incremental sort (`dialect.newest_from_own_index`), so `conn`
    must be in a transaction on PostgreSQL (`Database.read(in_transaction=True)`)."""
    conditions = []
    if rack_id is not None:
        conditions.append(tasks.c.rack_id == rack_id)
    if schedule_id is not None:
        conditions.append(tasks.c.schedule_id == schedule_id)
    if active_only:
        conditions += [is_active(tasks.c.status), *await task_partitions.live_only(conn)]
    status_values = sorted(s.value for s in statuses)
    where = and_(True, *conditions, *([tasks.c.status.in_(status_values)] if statuses else []))
    matching = (
        select(*TASK_COLUMNS)
        .where(where, *after_key(TASK_ORDER, after, descending=True))
        .order_by(*NEWEST_FIRST)
        .offset(offset)
    )
    if limit is None:
        return await _tasks_where(conn, matching), await count_capped(conn, tasks, [where])
    starts = await task_partitions.page_weeks(conn, after[0] if after else datetime.now(UTC))
    windows = [await task_partitions.created_since(conn, starts[0])] if starts else []
    total = await _count_newest_first(conn, where, windows)
    if total <= offset + limit and schedule_id is not None:
        return await _tasks_where(conn, matching.limit(limit)), total
    each_status = status_values
    if schedule_id is not None and not statuses:
        each_status = sorted(s.value for s in TaskStatus if s.is_active or not active_only)

    def page_in(window: Sequence[ColumnElement[bool]]) -> Select[Any]:
        if len(each_status) > 1:
            page_ids = _newest_of_each_status([*conditions, *window], each_status, after, offset, limit)
        else:
            page_ids = matching.where(*window).with_only_columns(tasks.c.id).limit(limit).correlate(None)
        return select(*TASK_COLUMNS).where(tasks.c.id.in_(page_ids), *window).order_by(*NEWEST_FIRST)

    # A schedule's page from its own index, not from a walk of the creation-time index through every task
    # the fleet made since the schedule last fired, which the planner prices as if that were a few.
    async with newest_from_own_index(conn) if schedule_id is not None else contextlib.nullcontext():
        if total > offset + limit:  # else the page holds every one left, which no window need hold
            for n, since in enumerate(starts):
                if n == len(windows):
                    windows.append(await task_partitions.created_since(conn, since))
                page = await _tasks_where(conn, page_in(windows[n]))
                if len(page) == limit:
                    return page, total
        return await _tasks_where(conn, page_in(())), total


async def _count_newest_first(
    conn: AsyncConnection, where: ColumnElement[bool], windows: Sequence[Sequence[ColumnElement[bool]]]
) -> int:
    """`count_capped` of the tasks matching `where`: in the first of `windows` alone when more than the
    cap are there (a busy list: a week of a fleet's tasks), else in every week."""
    if windows and (in_first := await count_capped(conn, tasks, [where, *windows[0]])) > LIST_COUNT_CAP:
        return in_first
    return await count_capped(conn, tasks, [where])


def _newest_of_each_status(
    conditions: Sequence[ColumnElement[bool]],
    status_values: Sequence[str],
    after: Key | None,
    offset: int,
    limit: int,
) -> Select[Any]:
    """The ids of a page of tasks of several statuses, newest first: the newest `offset + limit` of each
    status (a range of ix_tasks_status_created_at_id, of the schedule's index, or of the rack's index by
    status), merged. As one IN list PostgreSQL walked the creation-time index backward, filtering out every
    newer task of another status first: at full size 139,744 completed tasks read for a page of the failed
    and terminated, 114 ms (docs/PERFORMANCE.md, issue 29)."""
    each = [
        select(*TASK_ORDER)
        .where(*conditions, tasks.c.status == value, *after_key(TASK_ORDER, after, descending=True))
        .order_by(*NEWEST_FIRST)
        .limit(offset + limit)
        .subquery()
        for value in status_values
    ]
    merged = union_all(*(select(newest.c.created_at, newest.c.id) for newest in each)).subquery("newest")
    return (
        select(merged.c.id)
        .order_by(merged.c.created_at.desc(), merged.c.id.desc())
        .offset(offset)
        .limit(limit)
        .correlate(None)
    )


async def statuses(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, TaskStatus]:
    """The status of each task that exists among `task_ids` (only the status column is read)."""
    found: dict[uuid.UUID, TaskStatus] = {}
    for chunk in chunked(set(task_ids)):
        stmt = select(tasks.c.id, tasks.c.status).where(tasks.c.id.in_(chunk))
        found.update({row.id: TaskStatus(row.status) for row in await conn.execute(stmt)})
    return found


async def status_counts(conn: AsyncConnection, *, created_since: datetime) -> dict[TaskStatus, int]:
    """Active tasks (any age), and ended tasks created since `created_since`, by status: each counted up to
    LIST_COUNT_CAP + 1 (`paging.count_capped`; more than the cap means "more than LIST_COUNT_CAP").

    One capped count a status, by index: the active ones from ix_tasks_active (its predicate repeated, so
    both databases use it), the ended ones from a range of ix_tasks_status_created_at_id. A grouped count of
    a day's ended tasks read each of them (412 ms for the 280,101 of a busy day at full size: the overview
    page missed its 300 ms); a status with none is left out.
    """
    counts: dict[TaskStatus, int] = {}
    live = await task_partitions.live_only(conn)
    recent = await task_partitions.created_from(conn, created_since)
    for status in TaskStatus:
        where = (
            [is_active(tasks.c.status), tasks.c.status == status.value, *live]
            if status.is_active
            else [tasks.c.status == status.value, tasks.c.created_at >= created_since, *recent]
        )
        if count := await count_capped(conn, tasks, where):
            counts[status] = count
    return counts


async def failed_since(conn: AsyncConnection, *, created_since: datetime, limit: int) -> list[Task]:
    """FAILED tasks created since `created_since`, newest first, at most `limit`."""
    recent = await task_partitions.created_from(conn, created_since)
    stmt = (
        select(*TASK_COLUMNS)
        .where(tasks.c.created_at >= created_since, tasks.c.status == TaskStatus.FAILED.value, *recent)
        .order_by(tasks.c.created_at.desc(), tasks.c.id.desc())
        .limit(limit)
    )
    return await _tasks_where(conn, stmt)


async def held_tasks(conn: AsyncConnection, *, now: datetime, limit: int) -> tuple[list[Task], int]:
    """PENDING tasks that may not start yet: held back by a freeze or a budget (`not_before`), or deferred
    to a window's opening (their operation's `window_start`); newest first, and how many there are."""
    window_start = tasks.c.parameters["window_start"].as_string()
    where = and_(
        status_in(tasks.c.status, TaskStatus.PENDING),
        or_(tasks.c.not_before > now, window_start > now.astimezone(UTC).isoformat()),
        *await task_partitions.live_only(conn),
    )
    total = (await conn.execute(select(func.count()).select_from(tasks).where(where))).scalar_one()
    stmt = (
        select(*TASK_COLUMNS).where(where).order_by(tasks.c.created_at.desc(), tasks.c.id.desc()).limit(limit)
    )
    return await _tasks_where(conn, stmt), total


async def set_status(
    conn: AsyncConnection,
    task_ids: Sequence[uuid.UUID],
    status: TaskStatus,
    *,
    now: datetime,
    message: str | None = None,
) -> None:
    """Move tasks to `status`; a final status also stamps `finished_at`, drops what held the task
    (`NOT_HELD`: an ended task, as a started one, is held by nothing, and a cancelled task that a check had
    held went on saying "held by preflight … not before" its maximum wait; nothing reads the hold of an
    ended task, and its message says why it ended) and marks the tasks' schedules' failing streaks to be
    looked at again (`store.streak_checks`)."""
    if not task_ids:
        return
    values: dict[str, Any] = {"status": status.value, "updated_at": now}
    if message is not None:
        values["message"] = message
    if status.is_final:
        values.update(NOT_HELD, finished_at=now)
    await conn.execute(update(tasks).where(tasks.c.id.in_(list(task_ids))).values(**values))
    if status.is_final:
        await mark_schedules_of_tasks(conn, task_ids)


# --- tasks a window's change decides again (`rackflow.tasks.deferrals`) ------------------------------


class DeferredTask(NamedTuple):
    """A task that has not started (`_not_started`), with its run's trigger and its schedule's window
    policy."""

    task: Task
    trigger: Trigger
    window_policy: WindowPolicy


def _not_started() -> ColumnElement[bool]:
    """Not started (its attempt): PENDING, whatever holds it (its window, a start gate, a retry's back-off),
    or WAITING in its rack's queue; whether or not its window binds it (held by "window", or bound to start
    by an end, `not_after`): a window's change decides again a task a deleted window let go too, which a
    new ALLOW window may bind again (`rackflow.tasks.deferrals`)."""
    return status_in(tasks.c.status, TaskStatus.PENDING, TaskStatus.WAITING)


async def deferred_tasks(
    conn: AsyncConnection,
    rack_ids: Collection[uuid.UUID] | None,
    task_ids: Collection[uuid.UUID] | None = None,
) -> list[DeferredTask]:
    """The tasks of firings that have not started (`_not_started`), whatever binds them: those of `task_ids`
    when given, else those on these racks (None: any: the live tasks alone, by `ix_tasks_active`); oldest
    first."""
    run, schedule = task_schedule_run.c, task_schedule.c
    stmt = (
        select(*TASK_COLUMNS, run.trigger, schedule.window_policy)
        .join(task_schedule_run, run.id == tasks.c.run_id)
        .join(task_schedule, schedule.id == run.schedule_id)
        .where(_not_started())
        .order_by(*OLDEST_FIRST)
    )
    if task_ids is not None:
        rows = [
            r for chunk in chunked(task_ids) for r in await conn.execute(stmt.where(tasks.c.id.in_(chunk)))
        ]
    elif rack_ids is None:
        rows = list(await conn.execute(stmt))
    else:
        rows = [
            r
            for chunk in chunked(rack_ids)
            for r in await conn.execute(stmt.where(tasks.c.rack_id.in_(chunk)))
        ]
    return [DeferredTask(task_from_row(row), row.trigger, WindowPolicy(row.window_policy)) for row in rows]


async def rewait(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID], values: Mapping[str, Any]
) -> list[uuid.UUID]:
    """Write `values` (a task's wait for its window, or its end) on those of the tasks not started
    (`_not_started`) that no other transaction holds (`unclaimed`: a claim's, whose start gates decide
    them, or a gate's write); the ids written."""
    written: list[uuid.UUID] = []
    for chunk in chunked(in_id_order(task_ids)):
        stmt = update(tasks).where(unclaimed(conn, tasks.c.id.in_(chunk), _not_started())).values(**values)
        written += (await conn.execute(stmt.returning(tasks.c.id))).scalars()
    return written


async def lock_deferred(
    db: Database, conn: AsyncConnection, task_ids: Collection[uuid.UUID]
) -> list[uuid.UUID]:
    """Lock those of the tasks not started (`_not_started`), under their racks' locks (the caller's),
    skipping any another transaction holds; their ids."""
    locked: list[uuid.UUID] = []
    for chunk in chunked(in_id_order(task_ids)):
        stmt = select(tasks.c.id).where(tasks.c.id.in_(chunk), _not_started()).order_by(tasks.c.id)
        locked += (await conn.execute(db.skip_locked(stmt))).scalars()
    return locked


async def wait_for_row(db: Database, task_id: uuid.UUID) -> None:
    """Wait until no other transaction holds the task's row, in a transaction of its own that holds
    nothing else meanwhile (so whatever holds the row never waits for it) and lets go of it at once: how a
    writer that skipped the row (`unclaimed`) comes after its holder committed (`tasks.deferrals`)."""
    async with db.transaction() as conn:
        await conn.execute(db.for_update(select(tasks.c.id).where(tasks.c.id == task_id)))


# --- promotion and housekeeping -------------------------------------------------------------------


async def lock_racks_with_waiting(
    db: Database, conn: AsyncConnection, rack_ids: Iterable[uuid.UUID]
) -> set[uuid.UUID]:
    """Lock the racks' rows as `lock_racks` does; returns those with a waiting task (only they have
    anything to promote). Under the locks no submit can add one, so the answer holds until commit.

    The waiting tasks are looked for in a statement after the locks, not in the locking one: a submit that
    held a rack (queueing a task behind the one ending) made the lock wait, and the locking statement's
    snapshot, taken before it waited, did not see what the submit queued, which then waited for the sweep
    (tests/store/test_task_manager.py). Each rack's waiting tasks are looked up by the rack
    (`_RACK_HAS_WAITING`). PostgreSQL planned the EXISTS, given the status alone, as one hashed subplan
    over every waiting task of the fleet, or, with statistics taken while few tasks were live, as a walk of
    every live task for each rack: at full size 9,852 buffers and 8 ms for ten racks with 9,670 tasks live,
    at each round of ended tasks, growing with the fleet's queue (docs/PERFORMANCE.md, "The promotion
    check's look at a rack's waiting tasks, and the start-up look at the approval policies")."""
    ids = set(rack_ids)
    if locks_rows(db.dialect):  # SQLite's transaction holds its one writer's lock already
        await lock_racks(db, conn, ids)
    return await racks_with_waiting(db, conn, ids)


async def racks_with_waiting(
    db: Database, conn: AsyncConnection, rack_ids: Collection[uuid.UUID]
) -> set[uuid.UUID]:
    """Those of the racks with a waiting task (`lock_racks_with_waiting`'s look, after its locks)."""
    weeks = await task_partitions.live_weeks(conn)
    found: set[uuid.UUID] = set()
    for chunk in chunked(list(rack_ids)):
        waiting = select(racks.c.id).where(racks.c.id.in_(chunk), _RACK_HAS_WAITING[db.dialect])
        found.update((await conn.execute(waiting, weeks)).scalars())
    return found


# Whether a rack (of the outer statement) has a waiting task, by dialect. PostgreSQL reads the
# rack's live tasks (the predicate of `ix_tasks_live_rack_id` repeated, so that it reads that index by the
# rack) and tests their statuses above the scan: a status in the scan's condition would also match the
# index of every live task in the queue's order, which PostgreSQL read whole for each rack when its
# statistics said few tasks were live, and an EXISTS it may hash over every waiting task of the fleet;
# an aggregate it does neither with. SQLite reads the rack's index by status, for each rack.
_RACK_HAS_WAITING = {
    POSTGRESQL: select(func.coalesce(func.bool_or(status_in(tasks.c.status, TaskStatus.WAITING)), false()))
    .where(tasks.c.rack_id == racks.c.id, is_live_on_rack(tasks), task_partitions.LIVE_FILING)
    .scalar_subquery(),
    SQLITE: select(tasks.c.id)
    .where(tasks.c.rack_id == racks.c.id, status_in(tasks.c.status, TaskStatus.WAITING))
    .exists(),
}


def _dead_hold(stale_before: datetime) -> ColumnElement[bool]:
    # Only a cancelled RUNNING task keeps a hold after leaving RUNNING, so only TERMINATED rows qualify.
    return and_(
        tasks.c.status == TaskStatus.TERMINATED.value,
        tasks.c.owner_id.is_not(None),
        ~is_live(tasks.c.owner_id, stale_before),
    )


async def racks_with_dead_holds(conn: AsyncConnection, *, stale_before: datetime) -> set[uuid.UUID]:
    """Racks where a dead instance still holds a cancelled task (it died before letting go)."""
    rows = await conn.execute(select(tasks.c.rack_id).distinct().where(_dead_hold(stale_before)))
    return set(rows.scalars())


async def release_dead_holds(
    conn: AsyncConnection, rack_ids: Iterable[uuid.UUID], *, stale_before: datetime
) -> None:
    """Drop the holds dead instances left on the racks' tasks (the caller holds the racks' locks)."""
    for chunk in chunked(set(rack_ids)):
        await conn.execute(
            update(tasks).where(tasks.c.rack_id.in_(chunk), _dead_hold(stale_before)).values(owner_id=None)
        )


async def racks_needing_promotion(conn: AsyncConnection, *, now: datetime) -> set[uuid.UUID]:
    """Racks with a waiting task that has expired, or with waiting tasks and nothing blocking them."""
    blocker = tasks.alias("blocker")
    # On PostgreSQL both read the partitions that can hold a live task alone (`task_partitions.live_weeks`).
    weeks = await task_partitions.live_weeks(conn)
    in_live_weeks = task_partitions.in_live_weeks
    nothing_blocks = ~(
        select(blocker.c.id)
        .where(
            blocker.c.rack_id == tasks.c.rack_id, blocks(blocker), *in_live_weeks(weeks, blocker.c.filed_at)
        )
        .exists()
    )
    rows = await conn.execute(
        select(tasks.c.rack_id)
        .distinct()
        .where(
            # `is_active` adds nothing but the partial index's predicate, for SQLite to use the index.
            is_active(tasks.c.status),
            status_in(tasks.c.status, TaskStatus.WAITING),
            or_(tasks.c.queue_expires_at <= now, nothing_blocks),
            *in_live_weeks(weeks, tasks.c.filed_at),
        ),
        weeks,
    )
    return set(rows.scalars())


async def prune_finished_tasks(
    db: Database, retention: timedelta, *, chunk: int = PRUNE_CHUNK
) -> AsyncGenerator[int, None]:
    """`--task-retention`: delete the tasks that ended (completed, failed, terminated) longer than
    `retention` ago, oldest first (`prune_older`). Active tasks stay however old. A task ends after it was
    created, so `created_at < cutoff` holds for every one of them and lets ix_tasks_created_at find them;
    a schedule scope whose last task goes keeps its id (migration 0034: no key sets it NULL), which the
    SKIP check finds no task for: nothing left to overlap.
    Two kinds of ended task stay however old, as they are still in use:
    * one its executor still holds (a task cancelled mid-step keeps its rack until the step ends: deleted,
      the rack would look free while the step still drives it);
    * one of a live rollout (rolling or halted), whose driver reads a started rack without its task as
      failed: a long bake would otherwise halt the rollout on its canary's pruned task.
    The horizon of the runs whose kept task counts stay true is raised to the cutoff first
    (`kept_counts.raise_horizon`).

    PostgreSQL (partitioned by week of their filing time, `store.task_partitions`): drop each week all older
    than the retention that holds no kept task (one short transaction each, its attempts, step records and
    pre-flight rows with it), then delete in batches only the old tasks before the weeks still kept (the
    partition before the weeks, and a past week that had to stay). SQLite: delete in batches, oldest first.
    """
    ended = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.TERMINATED)
    run = task_schedule_run.c
    of_live_rollout = (
        select(run.id).where(run.id == tasks.c.run_id, run.state.in_(ROLLOUT_LIVE_STATES)).exists()
    )
    kept: list[datetime | None] = [None]
    if db.is_postgres:
        weeks = drop_past_weeks(
            db,
            retention,
            recent=task_partitions.RECENT,
            past_weeks=task_partitions.past_weeks,
            drop=task_partitions.drop_week,
            kept_floor=task_partitions.kept_floor,
            floor=kept,
            before=kept_counts.raise_horizon,
        )
        async with contextlib.aclosing(weeks):
            async for dropped in weeks:
                yield dropped
    floor = kept[0]

    def older(cutoff: datetime) -> ColumnElement[bool]:
        conditions = [
            tasks.c.created_at < cutoff,
            tasks.c.finished_at < cutoff,
            status_in(tasks.c.status, *ended),
            tasks.c.owner_id.is_(None),
            ~of_live_rollout,
        ]
        if floor is not None:  # before the weeks kept whole
            conditions.append(tasks.c.filed_at < floor)
        return and_(*conditions)

    chunks = prune_older(
        db,
        tasks,
        retention,
        older=older,
        order_by=OLDEST_FIRST,
        chunk=chunk,
        narrow=floor is not None,
        before=kept_counts.raise_horizon,
    )
    async with contextlib.aclosing(chunks):
        async for deleted in chunks:
            yield deleted
