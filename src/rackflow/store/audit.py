"""Audit trail queries: write events (with their after snapshots), list them, prune the old ones, read
schedules as JSON."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Row, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.audit import EVERY_EVENT, AuditEvent, EventFilter, bounded_event
from rackflow.store import audit_partitions as partitions
from rackflow.store import run_partitions
from rackflow.store.db import Database
from rackflow.store.dialect import array_holds, indexes_array_items, insert_new
from rackflow.store.paging import NOT_WALKED, Key, Listed, after_key, count_capped, keys_in_order, walked
from rackflow.store.retention import PRUNE_CHUNK, prune_older
from rackflow.store.tables import audit_events, task_schedule, task_schedule_run, task_schedule_scope


@dataclass(frozen=True)
class PendingEvent:
    """An event to write whose `schedule_after` is the schedule `after_of` as the write finds it."""

    event: AuditEvent
    after_of: uuid.UUID | None = None


async def insert_events(conn: AsyncConnection, events: Sequence[AuditEvent]) -> None:
    """One INSERT for all of `events`, leaving out ids already in the trail: a spooled event replayed twice
    (`rackflow.audit.spool`) is written once. Each as the trail keeps events (`domain.audit.bounded_event`:
    its "after" snapshot, read here, and rows spooled by an older release included)."""
    events = [bounded_event(event) for event in events]
    await conn.execute(
        insert_new(conn.dialect.name, audit_events),
        [
            {
                "id": event.id,
                "at": event.at,
                "principal": event.principal,
                "method": event.method,
                "target_ids": list(event.target_ids),
                "outcome": event.outcome,
                "error": event.error,
                "request": event.request,
                "schedule_before": event.schedule_before,
                "schedule_after": event.schedule_after,
                "changes": event.changes,
            }
            for event in events
        ],
    )


async def in_the_trail(conn: AsyncConnection, event_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Those of these events the trail holds now (by id alone: on PostgreSQL, one probe of the key's
    index in each week's partition)."""
    if not event_ids:
        return set()
    stmt = select(audit_events.c.id).where(audit_events.c.id.in_(sorted(event_ids, key=str)))
    return set((await conn.execute(stmt)).scalars())


async def write_events(conn: AsyncConnection, pending: Sequence[PendingEvent]) -> list[None]:
    """Read the after snapshots of all of `pending` at once, then insert them all (a group-commit round).

    Called after the RPCs' own transactions committed, so each snapshot is the schedule as its RPC left
    it, unless a concurrent change came in between.
    """
    after = await schedule_snapshots(conn, {p.after_of for p in pending if p.after_of is not None})
    await insert_events(
        conn,
        [
            replace(p.event, schedule_after=after.get(p.after_of)) if p.after_of is not None else p.event
            for p in pending
        ],
    )
    return [None] * len(pending)


# The trail's order, newest first (each column descending); a page token holds its values.
EVENT_ORDER = (audit_events.c.at, audit_events.c.id)


async def list_events(
    conn: AsyncConnection,
    matching: EventFilter = EVERY_EVENT,
    *,
    offset: int = 0,
    limit: int | None = None,
    after: Key | None = None,
) -> tuple[list[AuditEvent], Listed]:
    """One page of events, newest first (after the key `after` of EVENT_ORDER if given), and what the list
    says besides (`paging.Listed`: the total matching the filter before paging, `paging.count_capped`).

    By target: the events whose `target_ids` hold its id (canonical, as `target_ids` are written: a
    DeleteRack's event names the schedules whose scope it changed there too, `audit.changes`). PostgreSQL
    reads them from the GIN index over `target_ids` (migration 0044; `_newest_matches`). SQLite has no
    index over a row's ids: a page (`limit`) walks at most SEARCH_WALK events after `after` in EVENT_ORDER
    (narrowed by the other filters, which its indexes answer: `paging.walked`), may come back short or
    empty before the trail's end, and says where it stopped (`Listed.searched_to`); its count is of the
    first SEARCH_WALK events' matches (`Listed.count_bounded`). A request without a limit asked for every
    match: it is not bounded.
    """
    where: list[ColumnElement[bool]] = []
    if matching.since is not None:
        where.append(audit_events.c.at >= matching.since)
    if matching.method:
        where.append(audit_events.c.method == matching.method)
    if matching.principal:
        where.append(audit_events.c.principal == matching.principal)
    indexed = list(where)
    walk = NOT_WALKED
    if matching.target is not None:
        holds = array_holds(conn.dialect.name, audit_events.c.target_ids, str(matching.target))
        where.append(holds)
        if limit is not None and not indexes_array_items(conn.dialect.name):
            walk = await walked(conn, keys_in_order(EVENT_ORDER, indexed, descending=True), after)
    total = await count_capped(conn, audit_events, [*where, *walk.counted(EVENT_ORDER, descending=True)])
    paged = [*after_key(EVENT_ORDER, after, descending=True), *walk.bounded(EVENT_ORDER, descending=True)]
    where += paged
    if matching.target is not None and limit is not None and indexes_array_items(conn.dialect.name):
        windowed = total > TARGET_SORTED_AT_MOST
        rows = await _newest_matches(conn, holds, [*indexed, *paged], offset, limit, windowed=windowed)
    else:
        query = (
            select(audit_events)
            .where(*where)
            .order_by(*(column.desc() for column in EVENT_ORDER))
            .offset(offset)
            .limit(limit)
        )
        rows = (await conn.execute(query)).all()
    events = [
        AuditEvent(
            id=row.id,
            at=row.at,
            principal=row.principal,
            method=row.method,
            target_ids=tuple(row.target_ids),
            outcome=row.outcome,
            error=row.error,
            request=row.request,
            schedule_before=row.schedule_before,
            schedule_after=row.schedule_after,
            changes=row.changes,
        )
        for row in rows
    ]
    return events, walk.listed(int(total))


# A page by target on PostgreSQL whose count (which read them from the index already) found at most
# TARGET_SORTED_AT_MOST matches reads them all and sorts them; one of more reads the matches of the newest
# TARGET_WINDOW of the trail first, then of a window TARGET_WINDOW_GROWTH times longer, until it has a page
# or the window holds the whole trail (`_newest_matches`).
TARGET_SORTED_AT_MOST = 2_000
TARGET_WINDOW = timedelta(days=1)
TARGET_WINDOW_GROWTH = 4


async def _newest_matches(
    conn: AsyncConnection,
    holds: ColumnElement[bool],
    where: Sequence[ColumnElement[bool]],
    offset: int,
    limit: int,
    *,
    windowed: bool,
) -> Sequence[Row[Any]]:
    """The page of the events that `holds` (a target's) picks among those matching `where` (the other
    filters, the page's key), in EVENT_ORDER, on PostgreSQL: all the matches from the GIN index (a
    MATERIALIZED CTE, so the planner cannot choose otherwise), sorted; `windowed`, those of a time window
    from the newest event of `where` (which the B-tree indexes find), widened until it holds a page.

    Why: PostgreSQL cannot tell how many events name an id (its statistics sample whole arrays), and each
    way one statement may read a page costs a lot for some ids. Walking (at, id) newest first and filtering
    every event read 31 ms for a rack named by 1,500 of 3 M events, and would read the whole trail for an
    id no recent event names; all of an id's matches from the index, then sorted, read 343 ms for a rack
    named by 100,000 (docs/PERFORMANCE.md, "The trail by target"). The caller's count tells which an id
    is: a few matches are read all at once; many, window by window, about a page's worth past the page.
    """
    at = audit_events.c.at
    newest = oldest = None
    if windowed:
        oldest, newest = (await conn.execute(select(func.min(at), func.max(at)).where(*where))).one()
        if oldest is None:
            return []
    window = TARGET_WINDOW
    while True:
        since = [] if newest is None else [at >= newest - window]
        fenced = select(audit_events).where(holds, *where, *since).cte("matched").prefix_with("MATERIALIZED")
        query = select(fenced).order_by(fenced.c.at.desc(), fenced.c.id.desc()).offset(offset).limit(limit)
        rows = (await conn.execute(query)).all()
        if len(rows) == limit or newest is None or oldest is None or newest - window <= oldest:
            return rows
        window *= TARGET_WINDOW_GROWTH


async def prune_events(
    db: Database, retention: timedelta, *, chunk: int = PRUNE_CHUNK
) -> AsyncGenerator[int, None]:
    """Remove the events older than `retention`, yielding how many went at each step.

    PostgreSQL (partitioned by week, `store.audit_partitions`): make the coming weeks' partitions, drop each
    partition all older than the retention (one short transaction each), then delete in batches only the
    old events outside the weeks' partitions (those of the partition migration 0028 made of the rows it
    found, and strays in the DEFAULT one). An event inside a week's partition stays until its whole week is
    past the retention: the trail is kept at least as long as configured, at most a week longer.
    SQLite: delete in batches, oldest first, by ix_audit_events_at_id (`prune_older`).
    """
    floor: datetime | None = None
    if db.is_postgres:
        async with db.transaction() as conn:
            await conn.run_sync(partitions.wait_briefly)
            await conn.run_sync(partitions.ensure_partitions, await db.now(conn))
        async with db.read() as conn:
            cutoff = await db.now(conn) - retention
            doomed = await conn.run_sync(partitions.droppable, cutoff)
        for partition in doomed:
            async with db.transaction() as conn:
                dropped = await conn.run_sync(partitions.drop_partition, partition)
            yield dropped
        async with db.read() as conn:
            floor = await conn.run_sync(partitions.first_period_start)

    def older(cutoff: datetime) -> ColumnElement[bool]:
        return audit_events.c.at < (cutoff if floor is None else min(cutoff, floor))

    chunks = prune_older(
        db,
        audit_events,
        retention,
        older=older,
        order_by=(audit_events.c.at, audit_events.c.id),
        chunk=chunk,
        narrow=True,
    )
    async with contextlib.aclosing(chunks):
        async for deleted in chunks:
            yield deleted


def _jsonable(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


async def schedule_snapshot(conn: AsyncConnection, schedule_id: uuid.UUID) -> dict[str, Any] | None:
    """The schedule row and its scopes as plain JSON, or None when there is no such schedule."""
    return (await schedule_snapshots(conn, [schedule_id])).get(schedule_id)


async def schedule_snapshots(
    conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, dict[str, Any]]:
    """`schedule_snapshot` of each id, in two queries however many; missing schedules are left out."""
    if not schedule_ids:
        return {}
    query = select(task_schedule).where(task_schedule.c.id.in_(list(schedule_ids)))
    snapshots: dict[uuid.UUID, dict[str, Any]] = {}
    for row in await conn.execute(query):
        snapshots[row.id] = {key: _jsonable(value) for key, value in row._mapping.items()}
        snapshots[row.id]["scopes"] = []
    if not snapshots:
        return {}
    scope = task_schedule_scope.c
    scopes = await conn.execute(
        select(scope.schedule_id, scope.id, scope.rack_id, scope.component_filter)
        .where(scope.schedule_id.in_(list(snapshots)))
        .order_by(scope.schedule_id, scope.rack_id)
    )
    for row in scopes:
        snapshots[row.schedule_id]["scopes"].append(
            {key: _jsonable(value) for key, value in row._mapping.items() if key != "schedule_id"}
        )
    return snapshots


async def schedule_of_scope(conn: AsyncConnection, scope_id: uuid.UUID) -> uuid.UUID | None:
    query = select(task_schedule_scope.c.schedule_id).where(task_schedule_scope.c.id == scope_id)
    found: uuid.UUID | None = (await conn.execute(query)).scalar_one_or_none()
    return found


async def schedule_of_run(conn: AsyncConnection, run_id: uuid.UUID) -> uuid.UUID | None:
    """The schedule of a run, read in the run's partition (`run_partitions.run_rows`)."""
    query = select(task_schedule_run.c.schedule_id).where(task_schedule_run.c.id == run_id)
    rows = await run_partitions.run_rows(conn, run_id, query)
    return rows[0].schedule_id if rows else None
