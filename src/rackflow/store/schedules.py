"""Schedule queries: schedules, their scope entries, and a claimed firing's advance (phase 1); the runs'
history is `store.runs`, which takes its row conversions from here.

With `store.runs`, the only schedule modules that speak SQL. A duplicate name is translated here into
`AlreadyExists` (the service pre-checks for a clear message; `db.unique_violation_as` covers the race a
pre-check cannot). Functions take an open connection, so the caller decides what one transaction holds.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, cast

from sqlalchemy import (
    ColumnElement,
    Row,
    RowMapping,
    Select,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.selectable import Subquery

from rackflow.domain.approvals import ApprovalPolicy, RunApproval
from rackflow.domain.audit import SYSTEM_PRINCIPAL
from rackflow.domain.firing import slot_deadline
from rackflow.domain.inventory import (
    ComponentFilter,
    ComponentsFilter,
    RackSelection,
    filter_from_json,
    short_search,
)
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import (
    CREATION_ORDER,
    ListedScope,
    Outcome,
    OverlapPolicy,
    Pause,
    Run,
    RunState,
    Schedule,
    ScheduleOrder,
    Scope,
    ScopeOutcome,
    Trigger,
)
from rackflow.domain.tasks import ACTIVE_STATUSES, Operation, OperationKind, RetryPolicy, TaskStatus
from rackflow.domain.windows import WindowPolicy
from rackflow.errors import AlreadyExists
from rackflow.ids import new_id
from rackflow.store import run_partitions, scope_removals, task_partitions
from rackflow.store.db import Database, chunked, in_id_order, unique_violation_as
from rackflow.store.dialect import (
    POSTGRESQL,
    SQLITE,
    by_keys,
    epoch_micros,
    for_update,
    keys_shared,
    locks_rows,
    name_holds,
    update_rows,
    uuid_text,
)
from rackflow.store.inventory import names_by_id
from rackflow.store.keyed_reads import fetch_by_key
from rackflow.store.paging import (
    NOT_WALKED,
    Key,
    KeysAfter,
    Listed,
    after_key,
    check_key,
    count_capped,
    up_to_key,
    walked,
)
from rackflow.store.streak_checks import mark_schedules
from rackflow.store.tables import (
    HAS_APPROVAL_POLICY,
    racks,
    schedule_operation,
    task_schedule,
    task_schedule_run,
    task_schedule_scope,
    tasks,
)
from rackflow.store.tasks import is_active, is_live_on_rack
from rackflow.timespec import ScheduleSpec, SpecType

SPEC_TYPE_TO_DB: dict[SpecType, str] = {
    SpecType.INTERVAL: "interval",
    SpecType.CRON: "cron",
    SpecType.ONE_TIME: "one-time",
}
_SPEC_TYPE_FROM_DB = {v: k for k, v in SPEC_TYPE_TO_DB.items()}

Lock = Callable[[Select[Any]], Select[Any]]


def key_kept(db: Database) -> Lock:
    """The lock of a writer that neither deletes the schedule nor changes its key (`FOR NO KEY UPDATE`): it
    excludes every other writer of the row, but not the key check (`FOR KEY SHARE`) of a row written that
    names it (a failing-streak mark, a run, a scope entry), which so never waits for it. A journal round
    marks a schedule's streak while it holds racks that such a writer (a scope RPC, DeleteRack's stamp, a
    halt's pause) may wait for: the lock order atop `rackflow.tasks.executor`."""

    def lock(stmt: Select[Any]) -> Select[Any]:
        return db.for_update(stmt, keys_kept=True)

    return lock


# --- rows to values and back ---------------------------------------------------------------------


def _template(operation: Operation, queue_timeout: timedelta) -> dict[str, object]:
    """What a firing needs to rebuild the request; the target lives in the scope rows."""
    return {"operation": operation.to_json(), "queue_timeout_seconds": queue_timeout.total_seconds()}


def _pause_from_row(columns: RowMapping) -> Pause | None:
    if columns["paused_at"] is None:
        return None
    return Pause(
        reason=columns["pause_reason"],
        by=columns["paused_by"],
        at=columns["paused_at"],
        resume_at=columns["resume_at"],
    )


def _pause_columns(pause: Pause | None) -> dict[str, object]:
    if pause is None:
        return {"pause_reason": "", "paused_by": "", "paused_at": None, "resume_at": None}
    return {
        "pause_reason": pause.reason,
        "paused_by": pause.by,
        "paused_at": pause.at,
        "resume_at": pause.resume_at,
    }


def schedule_from_row(row: Row[Any]) -> Schedule:
    """The schedule of a `task_schedule` row, its columns read by name from `Row._mapping`: an attribute of
    a Row (`row.name`) took about 1 µs in SQLAlchemy 2.1 (a failed attribute lookup, then `__getattr__`),
    the mapping's item 0.1 µs, and a claim converts up to a thousand rows of 25 columns (docs/PERFORMANCE.md,
    "Issue 29")."""
    columns = row._mapping
    template = columns["operation_template"]
    retry, approval = columns["retry"], columns["approval"]
    return Schedule(
        id=columns["id"],
        name=columns["name"],
        spec=ScheduleSpec(_SPEC_TYPE_FROM_DB[columns["spec_type"]], columns["spec"], columns["timezone"]),
        overlap_policy=OverlapPolicy(columns["overlap_policy"]),
        enabled=columns["enabled"],
        next_run_at=columns["next_run_at"],
        last_run_at=columns["last_run_at"],
        created_at=columns["created_at"],
        updated_at=columns["updated_at"],
        operation=Operation.from_json(template["operation"]),
        queue_timeout=timedelta(seconds=template["queue_timeout_seconds"]),
        description=columns["description"],
        pause=_pause_from_row(columns),
        window_policy=WindowPolicy(columns["window_policy"]),
        rollout=_rollout_from(columns["rollout"]),
        approval=ApprovalPolicy.from_json(approval) if approval is not None else None,
        last_edited_by=columns["last_edited_by"],
        start_deadline=_micros_from(columns["start_deadline_us"]),
        pause_after_failed_runs=columns["pause_after_failed_runs"],
        failures_counted_until=columns["failures_counted_until"],
        retry=RetryPolicy.from_json(retry) if retry is not None else None,
        run_count=columns["run_count"],
        runs_since=columns["runs_since"],
    )


def _micros_from(micros: int | None) -> timedelta | None:
    return timedelta(microseconds=micros) if micros is not None else None


def micros_to(value: timedelta | None) -> int | None:
    return value // timedelta(microseconds=1) if value is not None else None


def _safety_columns(schedule: Schedule) -> dict[str, object]:
    return {
        "start_deadline_us": micros_to(schedule.start_deadline),
        "pause_after_failed_runs": schedule.pause_after_failed_runs,
        "failures_counted_until": schedule.failures_counted_until,
    }


def _rollout_from(data: dict[str, Any] | None) -> RolloutPolicy | None:
    return RolloutPolicy.from_json(data) if data is not None else None


def rollout_to(policy: RolloutPolicy | None) -> dict[str, Any] | None:
    return policy.to_json() if policy is not None else None


def scope_from_row(row: Row[Any]) -> Scope:
    """The scope of a `task_schedule_scope` row (read by name from `Row._mapping`: `schedule_from_row`)."""
    columns = row._mapping
    return Scope(
        id=columns["id"],
        schedule_id=columns["schedule_id"],
        rack_id=columns["rack_id"],
        filter=filter_from_json(columns["component_filter"]),
        last_task_id=columns["last_task_id"],
        created_at=columns["created_at"],
    )


def _filter_to_json(value: ComponentFilter | None) -> dict[str, object] | None:
    return value.to_json() if value is not None else None


def _outcome_to_json(outcome: ScopeOutcome) -> dict[str, object]:
    data: dict[str, object] = {
        "scope_id": str(outcome.scope_id),
        "rack_id": str(outcome.rack_id),
        "outcome": outcome.outcome,
        "task_id": str(outcome.task_id) if outcome.task_id else None,
        "error": outcome.error,
    }
    if outcome.canary:
        data["canary"] = True
    if outcome.start_by:
        data["start_by"] = outcome.start_by.isoformat()
    return data


def outcome_from_json(data: dict[str, Any]) -> ScopeOutcome:
    return ScopeOutcome(
        scope_id=uuid.UUID(data["scope_id"]),
        rack_id=uuid.UUID(data["rack_id"]),
        outcome=cast(Outcome, data["outcome"]),
        task_id=uuid.UUID(data["task_id"]) if data.get("task_id") else None,
        error=data.get("error") or "",
        canary=bool(data.get("canary")),
        start_by=datetime.fromisoformat(data["start_by"]) if data.get("start_by") else None,
    )


def outcomes_to_json(outcomes: Sequence[ScopeOutcome]) -> list[dict[str, object]]:
    return [_outcome_to_json(o) for o in outcomes]


# How many of a run's racks had each outcome, with a task or without: (outcome, has task) -> racks.
Tally = dict[tuple[str, bool], int]


def outcome_counts_to_json(outcomes: Sequence[ScopeOutcome]) -> dict[str, list[int]]:
    """The run's `outcome_counts` column, written wherever its outcomes are (migration 0024): per outcome,
    [racks without a task, racks with one]. The runs grid's column verdicts and a run's page read it in
    place of counting 10,000 outcomes per request (docs/PERFORMANCE.md, issue 29)."""
    counts: dict[str, list[int]] = {}
    for outcome in outcomes:
        counts.setdefault(outcome.outcome, [0, 0])[outcome.task_id is not None] += 1
    return counts


def tally_from_json(counts: Mapping[str, Sequence[int]] | None) -> Tally:
    """The `Tally` of an `outcome_counts` column (its zero counts left out, as counting finds none)."""
    tally: Tally = {}
    for outcome, (untasked, tasked) in (counts or {}).items():
        for has_task, count in ((False, untasked), (True, tasked)):
            if count:
                tally[(outcome, has_task)] = count
    return tally


def run_from_row(row: Row[Any]) -> Run:
    """The run of a row; a row without the outcomes column (`run_heads`) gives a run with none."""
    return Run(
        id=row.id,
        schedule_id=row.schedule_id,
        fired_at=row.fired_at,
        trigger=cast(Trigger, row.trigger),
        state=cast(RunState, row.state),
        outcomes=tuple(outcome_from_json(item) for item in getattr(row, "outcomes", ()) or ()),
        rollout=_rollout_from(row.rollout),
        reason=row.reason,
        failures_excused=row.failures_excused,
        resumed=row.resumed,
        approval=RunApproval.from_json(row.approval) if row.approval is not None else None,
        scheduled_for=row.scheduled_for,
        late_by=_micros_from(row.late_by_us),
        retry_of=row.retry_of,
    )


def name_taken_error(name: str) -> AlreadyExists:
    return AlreadyExists("schedule.name", name, "a schedule named")


# --- schedules -----------------------------------------------------------------------------------


async def insert_schedule(conn: AsyncConnection, schedule: Schedule) -> None:
    values = {
        "id": schedule.id,
        "name": schedule.name,
        "spec_type": SPEC_TYPE_TO_DB[schedule.spec.type],
        "spec": schedule.spec.spec,
        "timezone": schedule.spec.timezone,
        "operation_template": _template(schedule.operation, schedule.queue_timeout),
        "overlap_policy": schedule.overlap_policy.value,
        "window_policy": schedule.window_policy.value,
        "enabled": schedule.enabled,
        "next_run_at": schedule.next_run_at,
        "last_run_at": schedule.last_run_at,
        "description": schedule.description,
        "created_at": schedule.created_at,
        "updated_at": schedule.updated_at,
        **_pause_columns(schedule.pause),
        "rollout": rollout_to(schedule.rollout),
        "approval": schedule.approval.to_json() if schedule.approval is not None else None,
        "last_edited_by": schedule.last_edited_by,
        **_safety_columns(schedule),
        "retry": schedule.retry.to_json() if schedule.retry is not None else None,
        "scope_removed_after": None,  # none removed yet (SQLite's column keeps migration 0031's default)
        "run_count": schedule.run_count,
        "runs_since": schedule.runs_since,
    }
    with unique_violation_as(name_taken_error(schedule.name)):
        await conn.execute(insert(task_schedule).values(values))


async def save_schedule(conn: AsyncConnection, schedule: Schedule) -> None:
    """Write the mutable columns (name, spec, policies, state, pause, times); the operation never changes.
    An enabled schedule that pauses after failures is marked for a look at its streak (a resume or a
    lower `pause_after_failed_runs` may complete one; `store.streak_checks`)."""
    values = {
        "name": schedule.name,
        "spec_type": SPEC_TYPE_TO_DB[schedule.spec.type],
        "spec": schedule.spec.spec,
        "timezone": schedule.spec.timezone,
        "overlap_policy": schedule.overlap_policy.value,
        "window_policy": schedule.window_policy.value,
        "enabled": schedule.enabled,
        "next_run_at": schedule.next_run_at,
        "last_run_at": schedule.last_run_at,
        "updated_at": schedule.updated_at,
        **_pause_columns(schedule.pause),
        "rollout": rollout_to(schedule.rollout),
        "approval": schedule.approval.to_json() if schedule.approval is not None else None,
        "last_edited_by": schedule.last_edited_by,
        **_safety_columns(schedule),
        "retry": schedule.retry.to_json() if schedule.retry is not None else None,
    }
    with unique_violation_as(name_taken_error(schedule.name)):
        await conn.execute(update(task_schedule).where(task_schedule.c.id == schedule.id).values(values))
    if schedule.enabled and schedule.pause_after_failed_runs > 0:
        await mark_schedules(conn, [schedule.id])


@dataclass(frozen=True)
class ApprovalSetUp:
    """A schedule's approval policy and its last editor: what decides who may approve its runs."""

    schedule_id: uuid.UUID
    name: str
    policy: ApprovalPolicy
    last_edited_by: str


async def approval_set_ups(conn: AsyncConnection) -> AsyncIterator[ApprovalSetUp]:
    """Every schedule with an approval policy, by name (the start-up look at whether this server's
    approvers can approve them: `ScheduleService.name_unapprovable`), streamed `LIST_CHUNK` rows at a time
    (`conn` a read in a transaction). Only those rows are read, from their own index
    (`HAS_APPROVAL_POLICY`, the predicate of `ix_task_schedule_approval_name`, migration 0060): a policy
    removed, or never set, is stored as JSON's null, which SQL's `IS NULL` does not see, so the look read
    every schedule (344-386 ms over a million at each start). It read four columns of every schedule into
    a list before that: at a million schedules, 488 MiB at its peak, 237 MiB kept once the server was
    idle."""
    stmt = (
        select(
            task_schedule.c.id, task_schedule.c.name, task_schedule.c.approval, task_schedule.c.last_edited_by
        )
        .where(text(HAS_APPROVAL_POLICY))
        .order_by(task_schedule.c.name)
    )
    rows = await conn.stream(stmt)
    async for chunk in rows.partitions(LIST_CHUNK):
        for row in chunk:
            yield ApprovalSetUp(row.id, row.name, ApprovalPolicy.from_json(row.approval), row.last_edited_by)


async def set_last_edited_by(conn: AsyncConnection, schedule_id: uuid.UUID, by: str, now: datetime) -> None:
    """Record who changed the schedule's scope, and when (the two-person rule reads it)."""
    await conn.execute(
        update(task_schedule)
        .where(task_schedule.c.id == schedule_id)
        .values(last_edited_by=by, updated_at=now)
    )


_SCHEDULES = select(task_schedule)
_SCHEDULE_BY_ID = _SCHEDULES.where(task_schedule.c.id == bindparam("schedule_id"))


async def get_schedule(
    conn: AsyncConnection, schedule_id: uuid.UUID, *, lock: Lock | None = None
) -> Schedule | None:
    """The schedule, or None; `lock` (e.g. `Database.for_update`) holds the row until commit."""
    stmt = _SCHEDULE_BY_ID if lock is None else lock(_SCHEDULE_BY_ID)
    row = (await conn.execute(stmt, {"schedule_id": schedule_id})).first()
    return schedule_from_row(row) if row is not None else None


async def hold_schedules(conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Hold these schedules undeleted until commit (`FOR KEY SHARE`, in id order, looked up by key:
    `by_keys`, a statement per thousand); the ids of those still there, the others deleted (a deletion
    under way is waited for).

    DeleteSchedule locks the schedule (`FOR UPDATE`) before it deletes it, so it waits for this hold to
    commit, or this for the deletion, which it then finds; no other writer waits for it but a rename,
    whose UPDATE changes a unique key, and the dispatcher's claim (`SKIP LOCKED`) passes the schedule over
    meanwhile. A firing's submit holds its schedules so (`schedules.firing`)."""
    dialect = conn.dialect.name
    held: set[uuid.UUID] = set()
    for chunk in chunked(in_id_order(schedule_ids)):
        stmt = by_keys(dialect, _SCHEDULE_KEYS, task_schedule.c.id, chunk, order_by=[task_schedule.c.id])
        held.update((await conn.execute(keys_shared(dialect, stmt))).scalars())
    return held


# Built once, so that `by_keys` builds its PostgreSQL statement once (`dialect._keyed_lookup`).
_SCHEDULE_KEYS = select(task_schedule.c.id)


async def fetch_schedule(db: Database, schedule_id: uuid.UUID) -> Schedule | None:
    """The schedule, or None, read outside any transaction by `keyed_reads.fetch_by_key`, together with
    concurrent callers' (GetTaskSchedule's fast path)."""
    row = await fetch_by_key(db, _SCHEDULES, task_schedule.c.id, schedule_id)
    return schedule_from_row(row) if row is not None else None


async def name_taken(conn: AsyncConnection, name: str, *, other_than: uuid.UUID | None = None) -> bool:
    stmt = select(task_schedule.c.id).where(task_schedule.c.name == name)
    if other_than is not None:
        stmt = stmt.where(task_schedule.c.id != other_than)
    return (await conn.execute(stmt.limit(1))).first() is not None


_ORDER_COLUMNS = {
    "created_at": task_schedule.c.created_at,
    "name": task_schedule.c.name,
    "next_run_at": task_schedule.c.next_run_at,
    "last_run_at": task_schedule.c.last_run_at,
}


async def list_schedules(conn: AsyncConnection, **query: Any) -> tuple[list[Schedule], int]:
    """Schedules in `order` (then creation time, then id), and how many match before paging; `query` is
    `each_schedule_chunk`'s."""
    found: list[Schedule] = []
    listed = await each_schedule_chunk(conn, found.extend, **query)
    return found, listed.total


# Rows converted at once by `each_schedule_chunk`: what a streamed list holds beyond its response.
LIST_CHUNK = 1_000


async def each_schedule_chunk(
    conn: AsyncConnection,
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
    after: Key | None = None,
) -> Listed:
    """Pass the schedules in `order` (then creation time, then id; after the key `after` of
    `ScheduleOrder.key_of` if given) to `consume`, LIST_CHUNK at a time, from
    a server-side cursor (PostgreSQL: `conn` must be in a transaction); returns how many match before paging
    (`Listed`).

    Only one chunk of rows and schedules exists at once, so listing 100,000 schedules costs the caller's
    response and one chunk, not every layer (rows, schedules, messages) of all of them at once. A NULL next
    or last run sorts last in either direction, on both databases.

    A page (`limit`) of a short search (`short_search`) walks at most SEARCH_WALK schedules after `after`,
    whatever the other filters, and may come back short or empty before the list's end (`Listed`); on both
    databases, so that they answer alike. A request without a limit asked for every match: it is not
    bounded.
    """
    conditions: list[ColumnElement[bool]] = []
    if rack_id is not None:
        conditions.append(
            exists().where(
                task_schedule_scope.c.schedule_id == task_schedule.c.id,
                task_schedule_scope.c.rack_id == rack_id,
            )
        )
    if enabled_only:
        conditions.append(task_schedule.c.enabled.is_(True))
    if paused_only:
        conditions.append(task_schedule.c.enabled.is_(False))
    if name_contains:
        conditions.append(name_holds(task_schedule.c.name, name_contains))
    if operation is not None:
        conditions.append(schedule_operation == operation.value)
    walk = NOT_WALKED
    if limit is not None and short_search(name_contains):
        walk = await walked(conn, _keys_after(order), after)
    counted = (
        conditions if walk.counted_to is None else [*conditions, *_up_to_schedule(order, walk.counted_to)]
    )
    total = await count_capped(conn, task_schedule, counted)
    if order.field in _TIMED_ORDERS:
        stmt = _by_run_time(conditions, order, after, offset, limit, until=walk.to)
    else:
        column = _ORDER_COLUMNS[order.field]
        until = [] if walk.to is None else _up_to_schedule(order, walk.to)
        stmt = (
            select(task_schedule)
            .where(*conditions, *_after_schedule(order, after), *until)
            .order_by(_ordered(column, order.descending), task_schedule.c.created_at, task_schedule.c.id)
            .offset(offset)
            .limit(limit)
        )
    rows = await conn.stream(stmt)
    async for chunk in rows.partitions(LIST_CHUNK):
        consume([schedule_from_row(row) for row in chunk])
    return walk.listed(int(total))


def _keys_after(order: ScheduleOrder) -> KeysAfter:
    """The schedules' keys (`ScheduleOrder.key_of`) in `order`, any filter aside: a short search's walk
    (`paging.walk_end`), a range of the order's index."""
    s = task_schedule.c
    keys = (_ORDER_COLUMNS[order.field].label("value"), s.created_at, s.id)

    def keys_after(after: Key | None, offset: int, limit: int) -> Select[Any]:
        if order.field in _TIMED_ORDERS:
            return _by_run_time([], order, after, offset, limit, columns=keys)
        return (
            select(*keys)
            .where(*_after_schedule(order, after))
            .order_by(_ordered(_ORDER_COLUMNS[order.field], order.descending), s.created_at, s.id)
            .offset(offset)
            .limit(limit)
        )

    return keys_after


def _ordered(column: ColumnElement[Any], descending: bool) -> ColumnElement[Any]:
    """`column` in a list's order, NULLs last. Only a nullable column says NULLS LAST: on a NOT NULL
    column it changes nothing but would keep PostgreSQL from reading its index backwards (an index read
    backwards gives DESC NULLS FIRST), and a million schedules by creation time, newest first, would be
    sorted for every page (docs/PERFORMANCE.md, issue 29)."""
    ordered = column.desc() if descending else column.asc()
    return ordered.nulls_last() if getattr(column, "nullable", True) else ordered


def _after_schedule(order: ScheduleOrder, key: Key | None) -> list[ColumnElement[bool]]:
    """The schedules after `key` (`ScheduleOrder.key_of`) in `order` by name or creation time, ties by
    creation time then id ascending. Spelled per column so that each is a range of one index: creation time
    ascending is one row comparison; a name is unique, so nothing ties with it."""
    if key is None:
        return []
    s = task_schedule.c
    check_key((_ORDER_COLUMNS[order.field], s.created_at, s.id), key)
    value, created_at, schedule_id = key
    ties = after_key((s.created_at, s.id), (created_at, schedule_id), descending=False)
    column = _ORDER_COLUMNS[order.field]
    if order.field == "created_at" and not order.descending:
        return ties
    bound = literal(value, column.type)
    beyond = column < bound if order.descending else column > bound
    if order.field == "name":
        return [beyond]
    return [or_(beyond, and_(column == bound, *ties))]


def _up_to_schedule(order: ScheduleOrder, key: Key) -> list[ColumnElement[bool]]:
    """The schedules up to `key` (itself included) in `order`: `_after_schedule`'s complement, spelled as a
    range of the same index from the other end, so that a bounded walk stops there. By a run time with the
    key among the NULLs: every timed schedule, then the NULLs up to the key."""
    value, created_at, schedule_id = key
    s = task_schedule.c
    ties = up_to_key((s.created_at, s.id), (created_at, schedule_id), descending=False)
    column = _ORDER_COLUMNS[order.field]
    if order.field == "created_at" and not order.descending:
        return ties
    if value is None:
        return [or_(column.is_not(None), *ties)]
    bound = literal(value, column.type)
    within = column >= bound if order.descending else column <= bound
    if order.field == "name":
        return [within]
    return [within, or_(column > bound if order.descending else column < bound, *ties)]


# The orders by a run time, which may be NULL (`_by_run_time`).
_TIMED_ORDERS = ("next_run_at", "last_run_at")


def _by_run_time(
    conditions: Sequence[ColumnElement[bool]],
    order: ScheduleOrder,
    after: Key | None,
    offset: int,
    limit: int | None,
    *,
    until: Key | None = None,
    columns: Sequence[ColumnElement[Any]] | None = None,
) -> Select[Any]:
    """The schedules in `order` by next or last run, NULLs last in either direction, ties by creation time
    then id ascending, after the key `after` (and up to the key `until`, itself included, if given): the
    rows with a time, then those without, each part a range of the column's (column, created_at, id) index
    (migration 0025), so a page reads about its own rows. `columns`: only these (the order's column, labelled
    "value", then created_at and id), not whole rows.

    One ORDER BY of the whole (`next_run_at DESC NULLS LAST, created_at, id`, or an OR of "later, NULL, or
    tied and after") matches no index: PostgreSQL sorted a million rows for every page (docs/PERFORMANCE.md,
    issue 29). Here each part is ordered by what its index holds (read backwards for `desc`, which leaves
    only each tie group to re-sort) and limited to the page, and the page is the first of their union:

        SELECT * FROM (SELECT *, 0 AS part FROM task_schedule WHERE … AND next_run_at >= :v
                         AND (next_run_at > :v OR (created_at, id) > (:c, :id))
                       ORDER BY next_run_at, created_at, id LIMIT :page) AS timed
        UNION ALL
        SELECT * FROM (SELECT *, 1 AS part FROM task_schedule WHERE … AND next_run_at IS NULL
                       ORDER BY created_at, id LIMIT :page) AS untimed
        ORDER BY part, next_run_at, created_at, id LIMIT :limit OFFSET :offset
    """
    s = task_schedule.c
    column = _ORDER_COLUMNS[order.field]
    ties = (s.created_at, s.id)
    value, created_at, schedule_id = after if after is not None else (None, None, None)
    page = None if limit is None else offset + limit
    selected = (task_schedule,) if columns is None else columns
    parts: list[Subquery] = []
    if after is None or value is not None:  # the rows with a time, unless the key is already past them
        timed: list[ColumnElement[bool]] = [column.is_not(None)]
        if value is not None:
            bound = literal(value, column.type)
            timed = [
                column <= bound if order.descending else column >= bound,
                or_(
                    column < bound if order.descending else column > bound,
                    *after_key(ties, (created_at, schedule_id), descending=False),
                ),
            ]
        if until is not None and until[0] is not None:  # the walk ends among the rows with a time
            timed.extend(_up_to_schedule(order, until))
        by_time = column.desc() if order.descending else column.asc()
        parts.append(
            select(*selected, literal(0).label("part"))
            .where(*conditions, *timed)
            .order_by(by_time, *ties)
            .limit(page)
            .subquery("timed")
        )
    if until is None or until[0] is None:  # the rows without, unless the walk ends before them
        untimed: list[ColumnElement[bool]] = []
        if after is not None and value is None:  # among the NULLs already
            untimed = after_key(ties, (created_at, schedule_id), descending=False)
        if until is not None:
            untimed.extend(up_to_key(ties, until[1:], descending=False))
        parts.append(
            select(*selected, literal(1).label("part"))
            .where(*conditions, column.is_(None), *untimed)
            .order_by(*ties)
            .limit(page)
            .subquery("untimed")
        )
    both = union_all(*(select(part) for part in parts)).subquery("by_run_time")
    by = both.c["value" if columns is not None else order.field]
    in_order = by.desc() if order.descending else by.asc()
    chosen = select(both) if columns is None else select(by, both.c.created_at, both.c.id)  # a key alone
    return chosen.order_by(both.c.part, in_order, both.c.created_at, both.c.id).offset(offset).limit(limit)


async def schedule_ids_by_name(conn: AsyncConnection, names: Collection[str]) -> dict[str, uuid.UUID]:
    """Each found name's schedule id (names are unique)."""
    found: dict[str, uuid.UUID] = {}
    for chunk in chunked(set(names)):
        stmt = select(task_schedule.c.name, task_schedule.c.id).where(task_schedule.c.name.in_(chunk))
        found.update({row.name: row.id for row in await conn.execute(stmt)})
    return found


async def schedule_names(conn: AsyncConnection, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
    return await names_by_id(conn, task_schedule, ids)


_no_next_run = task_schedule.c.next_run_at.is_(None)


@dataclass(frozen=True)
class StateCounts:
    """Each counted up to LIST_COUNT_CAP + 1 (more than the cap reads "more than LIST_COUNT_CAP")."""

    enabled: int
    paused: int
    finished: int  # one-time schedules that have fired


async def state_counts(conn: AsyncConnection) -> StateCounts:
    """How many schedules are enabled, paused, and finished: three capped counts. One grouped count read
    every schedule (about 500 ms at a million, for the overview page); each capped count reads at most
    LIST_COUNT_CAP + 1 rows, the paused and finished ones from the paused index."""
    disabled = task_schedule.c.enabled.is_(False)  # the paused index's predicate, written as it is
    finished = and_(task_schedule.c.spec_type == SPEC_TYPE_TO_DB[SpecType.ONE_TIME], _no_next_run)
    return StateCounts(
        enabled=await count_capped(conn, task_schedule, [task_schedule.c.enabled.is_(True)]),
        paused=await count_capped(conn, task_schedule, [disabled, ~finished]),
        finished=await count_capped(conn, task_schedule, [disabled, finished]),
    )


async def next_to_fire(conn: AsyncConnection, limit: int) -> list[Schedule]:
    """The enabled schedules that fire soonest, in order (the dispatcher's due index serves this)."""
    stmt = (
        select(task_schedule)
        .where(task_schedule.c.enabled.is_(True), task_schedule.c.next_run_at.is_not(None))
        .order_by(task_schedule.c.next_run_at, task_schedule.c.id)
        .limit(limit)
    )
    return [schedule_from_row(row) for row in (await conn.execute(stmt)).all()]


async def claim_pauses_ended(
    db: Database, conn: AsyncConnection, now: datetime, limit: int
) -> list[Schedule]:
    """Up to `limit` paused schedules whose `resume_at` has come, locked (SKIP LOCKED on PostgreSQL, so
    instances share the work) until the caller's transaction resumes them. The partial index on
    `resume_at` serves this."""
    stmt = (
        select(task_schedule)
        .where(task_schedule.c.resume_at.is_not(None), task_schedule.c.resume_at <= now)
        .order_by(task_schedule.c.resume_at, task_schedule.c.id)
        .limit(limit)
    )
    return [schedule_from_row(row) for row in (await conn.execute(db.skip_locked(stmt))).all()]


async def pausing_after_failures(
    conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]
) -> list[Schedule]:
    """The enabled schedules with a `pause_after_failed_runs` among `schedule_ids`."""
    pausing = (task_schedule.c.pause_after_failed_runs > 0, task_schedule.c.enabled.is_(True))
    found: list[Schedule] = []
    for chunk in chunked(schedule_ids):
        stmt = select(task_schedule).where(task_schedule.c.id.in_(chunk), *pausing)
        found.extend(schedule_from_row(row) for row in (await conn.execute(stmt)).all())
    return found


async def pause_after_failures(
    conn: AsyncConnection, schedule_id: uuid.UUID, pause: Pause, counted_until: datetime
) -> bool:
    """Pause the schedule for a failing streak whose newest run was fired at `counted_until`, unless it
    is no longer enabled, no longer pauses after failures, or that streak was counted already: a
    conditional UPDATE, so of any number of instances deciding the same streak exactly one pauses it (and
    reports it). Returns whether this one did."""
    schedule = task_schedule.c
    stmt = (
        update(task_schedule)
        .where(
            schedule.id == schedule_id,
            schedule.enabled.is_(True),
            schedule.pause_after_failed_runs > 0,
            schedule.failures_counted_until.is_(None) | (schedule.failures_counted_until < counted_until),
        )
        .values(
            enabled=False,
            failures_counted_until=counted_until,
            updated_at=pause.at,
            **_pause_columns(pause),
        )
    )
    return (await conn.execute(stmt)).rowcount == 1


async def pause_by_rackflow(
    db: Database, conn: AsyncConnection, schedule_id: uuid.UUID, reason: str, now: datetime
) -> bool:
    """Pause the schedule by rackflow itself, with `reason`: for a rollout's halt, or one done over its
    failure limit (`RolloutService`), and for a firing past its operation's window (`schedules.firing`).
    Its row is locked as every writer that keeps its key locks it (`key_kept`). False when there is
    nothing to pause: gone, already paused, or a one-time schedule that has fired."""
    schedule = await get_schedule(conn, schedule_id, lock=key_kept(db))
    if schedule is None or not schedule.enabled or schedule.is_consumed:
        return False
    pause = Pause(reason=reason, by=SYSTEM_PRINCIPAL, at=now)
    await save_schedule(conn, replace(schedule, enabled=False, pause=pause, updated_at=now))
    return True


async def enabled_schedules_on_racks(
    conn: AsyncConnection, rack_ids: Collection[uuid.UUID], *, excluding: uuid.UUID | None = None
) -> list[Schedule]:
    """Enabled schedules with a scope entry on any of the racks, in creation order."""
    found: dict[uuid.UUID, Schedule] = {}
    for chunk in chunked(rack_ids):
        in_scope = exists().where(
            task_schedule_scope.c.schedule_id == task_schedule.c.id, task_schedule_scope.c.rack_id.in_(chunk)
        )
        stmt = select(task_schedule).where(task_schedule.c.enabled.is_(True), in_scope)
        if excluding is not None:
            stmt = stmt.where(task_schedule.c.id != excluding)
        for row in (await conn.execute(stmt)).all():
            found.setdefault(row.id, schedule_from_row(row))
    return sorted(found.values(), key=lambda schedule: (schedule.created_at, str(schedule.id)))


async def delete_schedule(conn: AsyncConnection, schedule_id: uuid.UUID) -> None:
    """Delete the schedule; its scope entries and runs go with it (ON DELETE CASCADE). The caller holds
    the rows of its runs, locked before the schedule's (`ScheduleService.delete`)."""
    await conn.execute(delete(task_schedule).where(task_schedule.c.id == schedule_id))


# --- scope entries -------------------------------------------------------------------------------


async def list_scopes(conn: AsyncConnection, schedule_id: uuid.UUID) -> list[Scope]:
    """The schedule's scope entries, oldest first."""
    stmt = (
        select(task_schedule_scope)
        .where(task_schedule_scope.c.schedule_id == schedule_id)
        .order_by(task_schedule_scope.c.created_at, task_schedule_scope.c.id)
    )
    return [scope_from_row(row) for row in (await conn.execute(stmt)).all()]


# The scope list's order (ListTaskScheduleScopes): by rack, the order in which the (schedule_id, rack_id)
# unique index holds a schedule's entries, so a page seeks that index after its token's rack and reads only
# its own entries. Creation order would need one more index on a table every firing's write-back updates
# (docs/PERFORMANCE.md, issue 29); within one AddTaskScheduleScope it was id order, no more meaningful.
SCOPE_ORDER = (task_schedule_scope.c.rack_id,)


async def list_scope_page(
    conn: AsyncConnection,
    schedule_id: uuid.UUID,
    *,
    offset: int = 0,
    limit: int | None = None,
    after: Key | None = None,
) -> tuple[list[ListedScope], int]:
    """A page of the schedule's scope entries in SCOPE_ORDER (after the key `after` if given), each with
    its rack's name (a client naming a page's racks need not list every rack), its ids as text and its
    creation time as microseconds (`dialect.epoch_micros`), as the response carries them, and how
    many it has (`paging.count_capped`):

        SELECT scope.id::text, scope.rack_id::text, racks.name, scope.component_filter,
               scope.last_task_id::text, (extract(epoch FROM scope.created_at) * 1000000)::bigint
        FROM task_schedule_scope scope JOIN racks ON racks.id = scope.rack_id
        WHERE scope.schedule_id = :id AND scope.rack_id > :after ORDER BY scope.rack_id LIMIT :limit
    """
    scope, dialect = task_schedule_scope.c, conn.dialect.name
    where = [scope.schedule_id == schedule_id]
    total = await count_capped(conn, task_schedule_scope, where)
    page = (
        select(
            uuid_text(dialect, scope.id),
            uuid_text(dialect, scope.rack_id),
            racks.c.name,
            scope.component_filter,
            uuid_text(dialect, scope.last_task_id),
            epoch_micros(dialect, scope.created_at),
        )
        .join(racks, racks.c.id == scope.rack_id)
        .where(
            *where,
            *after_key(SCOPE_ORDER, after, descending=False),
            # The key bounds the racks too: else PostgreSQL's merge join walks the racks' index from its
            # start.
            *after_key((racks.c.id,), after, descending=False),
        )
        .order_by(*SCOPE_ORDER)
        .offset(offset)
        .limit(limit)
    )
    listed = [
        ListedScope(scope_id, rack_id, name, filter_from_json(component_filter), last_task_id, created_at_us)
        for scope_id, rack_id, name, component_filter, last_task_id, created_at_us in (
            await conn.execute(page)
        ).all()
    ]
    return listed, total


async def scope_page(
    conn: AsyncConnection, schedule_id: uuid.UUID, offset: int, limit: int
) -> tuple[list[tuple[Scope, str]], int]:
    """A page of the schedule's scope entries by rack name, each with its rack's name, and how many entries
    it has (the runs grid pages its racks; `grid_outcomes` finds the racks that left in the database):

        SELECT scope.*, racks.name FROM task_schedule_scope scope JOIN racks ON racks.id = scope.rack_id
        WHERE scope.schedule_id = :id ORDER BY racks.name, racks.id LIMIT :limit OFFSET :offset
    """
    scope = task_schedule_scope.c
    page = (
        select(task_schedule_scope, racks.c.name)
        .join(racks, racks.c.id == scope.rack_id)
        .where(scope.schedule_id == schedule_id)
        .order_by(racks.c.name, racks.c.id)
        .offset(offset)
        .limit(limit)
    )
    total = select(func.count()).select_from(task_schedule_scope).where(scope.schedule_id == schedule_id)
    return (
        [(scope_from_row(row), row.name) for row in (await conn.execute(page)).all()],
        (await conn.execute(total)).scalar_one(),
    )


async def scopes_by_ids(conn: AsyncConnection, scope_ids: Collection[uuid.UUID]) -> list[Scope]:
    """The scope entries that still exist among `scope_ids`, in any order."""
    found: list[Scope] = []
    for chunk in chunked(list(scope_ids)):
        stmt = select(task_schedule_scope).where(task_schedule_scope.c.id.in_(chunk))
        found += [scope_from_row(row) for row in (await conn.execute(stmt)).all()]
    return found


async def get_scope(conn: AsyncConnection, scope_id: uuid.UUID) -> Scope | None:
    row = (
        await conn.execute(select(task_schedule_scope).where(task_schedule_scope.c.id == scope_id))
    ).first()
    return scope_from_row(row) if row is not None else None


async def insert_scopes(
    conn: AsyncConnection, schedule_id: uuid.UUID, selections: Sequence[RackSelection], now: datetime
) -> None:
    if not selections:
        return
    rows = [
        {
            "id": new_id(),
            "schedule_id": schedule_id,
            "rack_id": selection.rack_id,
            "component_filter": _filter_to_json(selection.filter),
            "last_task_id": None,
            "created_at": now,
        }
        for selection in selections
    ]
    await conn.execute(insert(task_schedule_scope), rows)


async def set_scope_filter(conn: AsyncConnection, scope_id: uuid.UUID, value: ComponentFilter | None) -> None:
    await conn.execute(
        update(task_schedule_scope)
        .where(task_schedule_scope.c.id == scope_id)
        .values(component_filter=_filter_to_json(value))
    )


async def delete_scopes(conn: AsyncConnection, scope_ids: Collection[uuid.UUID]) -> None:
    """Delete these scope entries, their schedules stamped first (`scope_removals.stamp_scopes`: the runs
    grid reads the racks that left only for runs fired at or before the stamp)."""
    await scope_removals.stamp_scopes(conn, scope_ids)
    for chunk in chunked(scope_ids):
        await conn.execute(delete(task_schedule_scope).where(task_schedule_scope.c.id.in_(chunk)))


async def lock_scopes(db: Database, conn: AsyncConnection, scope_ids: Collection[uuid.UUID]) -> None:
    """Lock scope rows until commit, in id order: the order the dispatcher's write-back and RemoveComponent
    take them in, so writers of several scope rows of one schedule wait for each other instead of
    deadlocking (PostgreSQL; SQLite's single writer needs nothing)."""
    await _lock_scopes(conn, scope_ids)


# The statements of the firing path's lookups by key, built once (`dialect.by_keys` reuses what it builds
# from each).
_SCOPE_IDS = select(task_schedule_scope.c.id)
_SCOPE_ROWS = select(task_schedule_scope)
# The SKIP check's read of a rack's live tasks (`overlapping_scope_ids`), by database: on PostgreSQL spelled
# as `ix_tasks_live_rack_id`'s predicate, so that it reads that index; on SQLite, which has no such index,
# as the active statuses alone, which it reads from the rack's index by status, where the live predicate's
# OR made it read every task of the rack (5.6 ms a scope with 5,000 ended tasks a rack, 0.09 ms by key).
_LIVE_TASK_STATUSES = {
    POSTGRESQL: select(tasks.c.id, tasks.c.status).where(is_live_on_rack(tasks), task_partitions.LIVE_FILING),
    SQLITE: select(tasks.c.id, tasks.c.status).where(is_active(tasks.c.status)),
}


async def _lock_scopes(conn: AsyncConnection, scope_ids: Collection[uuid.UUID]) -> None:
    """`lock_scopes`, each scope looked up by its key (`by_keys`) and locked in the sorted order its
    lookups return them in."""
    dialect = conn.dialect.name
    if not scope_ids or not locks_rows(dialect):
        return
    column = task_schedule_scope.c.id
    for chunk in chunked(in_id_order(scope_ids)):
        stmt = by_keys(dialect, _SCOPE_IDS, column, chunk, order_by=[column])
        await conn.execute(for_update(dialect, stmt))


@dataclass(frozen=True)
class ComponentScope:
    """A schedule scope entry whose filter names components by id."""

    scope_id: uuid.UUID
    schedule_id: uuid.UUID
    schedule_name: str
    filter: ComponentsFilter


async def component_scopes_for_update(
    db: Database, conn: AsyncConnection, rack_id: uuid.UUID
) -> list[ComponentScope]:
    """The rack's scope entries with a component-id filter, locked so no scope RPC rewrites them meanwhile.

    Only the scope rows are locked, not their schedules: the scope RPCs lock a schedule before writing its
    scope rows, so locking schedules after scope rows could deadlock with them (RemoveComponent stamps, and
    so locks, the schedules it empties an entry of before it locks the rack: `scope_removals`). The
    filter is matched in Python, as JSON containment is spelled differently on each database and a rack has
    few scope entries.
    """
    stmt = (
        select(
            task_schedule_scope.c.id,
            task_schedule_scope.c.schedule_id,
            task_schedule_scope.c.component_filter,
        )
        .where(task_schedule_scope.c.rack_id == rack_id)
        .order_by(task_schedule_scope.c.id)
    )
    found: list[tuple[uuid.UUID, uuid.UUID, ComponentsFilter]] = []
    for row in await conn.execute(db.for_update(stmt)):
        value = filter_from_json(row.component_filter)
        if isinstance(value, ComponentsFilter):
            found.append((row.id, row.schedule_id, value))
    names: dict[uuid.UUID, str] = {}
    for chunk in chunked({schedule_id for _, schedule_id, _ in found}):
        names_stmt = select(task_schedule.c.id, task_schedule.c.name).where(task_schedule.c.id.in_(chunk))
        names.update({row.id: row.name for row in await conn.execute(names_stmt)})
    return [
        ComponentScope(scope_id, schedule_id, names[schedule_id], value)
        for scope_id, schedule_id, value in found
    ]


async def set_last_task_ids(conn: AsyncConnection, task_by_scope: dict[uuid.UUID, uuid.UUID]) -> None:
    """Record each scope's newest task (one statement, `update_rows`); a scope removed since the firing is
    not updated.

    The rows are locked first in scope-id order, the order RemoveComponent locks them in, so that concurrent
    batches and component removals wait for each other instead of deadlocking: the set-based UPDATE takes
    its rows in the order of its plan.
    """
    if not task_by_scope:
        return
    scope_ids = in_id_order(task_by_scope)
    await _lock_scopes(conn, scope_ids)
    rows = [{"id": scope_id, "last_task_id": task_by_scope[scope_id]} for scope_id in scope_ids]
    await conn.execute(*update_rows(conn.dialect.name, task_schedule_scope, "id", rows))


async def overlapping_scope_ids(conn: AsyncConnection, scopes: Sequence[Scope]) -> set[uuid.UUID]:
    """The scopes whose last task is still active (waiting, pending or running): SKIP leaves them out.

    Read from the live tasks of the scopes' racks, each rack looked up on its own (`by_keys`, in
    `ix_tasks_live_rack_id` on PostgreSQL, the active entries of the rack's index by status on SQLite),
    never from the last tasks themselves: a task's rack never changes, so a scope's last task is active
    exactly when it is among its rack's live tasks with an active status. Those are a few recent rows,
    where a scope's last task is mostly long ended: a row of a year's history, which each firing among a
    million schedules read from the disk (with a leaf of the primary key) only to find it ended
    (docs/PERFORMANCE.md, "The slot's index led by time"). On PostgreSQL the statuses are tested here,
    not in the statement (`_LIVE_TASK_STATUSES`).
    """
    scope_of_task = {scope.last_task_id: scope.id for scope in scopes if scope.last_task_id is not None}
    rack_ids = {scope.rack_id for scope in scopes if scope.last_task_id is not None}
    dialect = conn.dialect.name
    weeks = await task_partitions.live_weeks(conn) if rack_ids else {}
    found: set[uuid.UUID] = set()
    for chunk in chunked(in_id_order(rack_ids)):
        stmt = by_keys(dialect, _LIVE_TASK_STATUSES[dialect], tasks.c.rack_id, chunk)
        for task_id, status in await conn.execute(stmt, weeks):
            if task_id in scope_of_task and TaskStatus(status) in ACTIVE_STATUSES:
                found.add(scope_of_task[task_id])
    return found


async def tasks_of_firings(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> dict[tuple[uuid.UUID, uuid.UUID], uuid.UUID]:
    """The tasks that exist for these firings (runs), keyed by (run id, rack id).

    A firing's tasks carry its run id, one per scope's rack (UNIQUE (run_id, rack_id), whose index this
    reads); this is how a firing whose submit transaction had an unknown outcome finds what it committed.
    """
    found: dict[tuple[uuid.UUID, uuid.UUID], uuid.UUID] = {}
    for chunk in chunked(list(run_ids)):
        stmt = select(tasks.c.run_id, tasks.c.rack_id, tasks.c.id).where(tasks.c.run_id.in_(chunk))
        for row in (await conn.execute(stmt)).all():
            found[(row.run_id, row.rack_id)] = row.id
    return found


class StartDeadlines(NamedTuple):
    """The start deadlines of the tasks of some runs. `recorded`: by task id, for each task its run's
    outcomes name, the deadline its firing bound it to (its outcome's `start_by`; None: none). `slots`: by
    run id, its slot and its schedule's own start deadline, from which a task the outcomes do not name yet
    (between its plain firing's submit and write-back) finds its firing's (`domain.firing.slot_deadline`)."""

    recorded: dict[uuid.UUID, datetime | None]
    slots: dict[uuid.UUID, tuple[datetime | None, timedelta | None]]

    def of(self, task_id: uuid.UUID, run_id: uuid.UUID, default: timedelta | None) -> datetime | None:
        """The start deadline the task's firing bound it to: its outcome's, else (its firing's write-back
        has not recorded it yet) its run's slot plus its schedule's deadline (`default`: the server's), as
        the planner found it."""
        if task_id in self.recorded:
            return self.recorded[task_id]
        slot, own = self.slots.get(run_id, (None, None))
        return slot_deadline(slot, own, default)


async def start_deadlines(conn: AsyncConnection, run_ids: Collection[uuid.UUID]) -> StartDeadlines:
    """The start deadlines of these runs' tasks (`StartDeadlines`)."""
    found = StartDeadlines({}, {})
    run = task_schedule_run.c
    for chunk in chunked(list(run_ids)):
        stmt = (
            select(run.id, run.outcomes, run.scheduled_for, task_schedule.c.start_deadline_us)
            .join(task_schedule, task_schedule.c.id == run.schedule_id)
            .where(run.id.in_(chunk))
        )
        for row in await run_partitions.read_runs(conn, chunk, stmt):  # in the runs' partitions
            found.slots[row.id] = (row.scheduled_for, _micros_from(row.start_deadline_us))
            for outcome in map(outcome_from_json, row.outcomes):
                if outcome.task_id is not None:
                    found.recorded[outcome.task_id] = outcome.start_by
    return found


# --- firing (phase 1: `schedules.firing.claim`, through `store.firing`) ---------------------------


async def scopes_by_schedule(
    conn: AsyncConnection, schedule_ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, list[Scope]]:
    """Every claimed schedule's scopes, in creation order, with one query per chunk of schedules (each
    schedule's scopes by the (schedule_id, rack_id) unique index: `by_keys`)."""
    scope = task_schedule_scope.c
    found: dict[uuid.UUID, list[Scope]] = {sid: [] for sid in schedule_ids}
    for chunk in chunked(list(schedule_ids)):
        stmt = by_keys(
            conn.dialect.name,
            _SCOPE_ROWS,
            scope.schedule_id,
            chunk,
            order_by=(scope.created_at, scope.id),
        )
        for one in map(scope_from_row, (await conn.execute(stmt)).all()):
            found[one.schedule_id].append(one)
    return found


@dataclass(frozen=True)
class Advance:
    """The new timing of one claimed schedule."""

    schedule_id: uuid.UUID
    enabled: bool
    next_run_at: datetime | None
    last_run_at: datetime
    run_count: int | None  # with the firing's run (`counted_with_run`)
    runs_since: datetime | None  # with the firing's run (`since_with_run`)


async def advance(conn: AsyncConnection, advances: Sequence[Advance], now: datetime) -> None:
    """Write every claimed schedule's new timing and run count in one statement (`update_rows`)."""
    if not advances:
        return
    rows = [
        {
            "id": a.schedule_id,
            "enabled": a.enabled,
            "next_run_at": a.next_run_at,
            "last_run_at": a.last_run_at,
            "run_count": a.run_count,
            "runs_since": a.runs_since,
        }
        for a in advances
    ]
    await conn.execute(*update_rows(conn.dialect.name, task_schedule, "id", rows, {"updated_at": now}))
