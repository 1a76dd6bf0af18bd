"""Deleting the rows past a retention, in bounded transactions, from every instance at once: the one loop
behind the audit trail's, the schedule runs' and the finished tasks' retention (`rackflow.retention`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Connection, Table, delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.audit_partitions import Partition, wait_briefly
from rackflow.store.db import Database
from rackflow.store.dialect import ids_in

# Rows deleted per transaction when pruning: a first prune of millions of rows holds no long transaction
# (nor SQLite's write lock), and each chunk is a short range scan of an index in `order_by`'s order.
PRUNE_CHUNK = 10_000


async def prune_older(
    db: Database,
    table: Table,
    retention: timedelta,
    *,
    older: Callable[[datetime], ColumnElement[bool]],
    order_by: Sequence[ColumnElement[object]],
    chunk: int = PRUNE_CHUNK,
    narrow: bool = False,
    before: Callable[[AsyncConnection, datetime], Awaitable[None]] | None = None,
) -> AsyncGenerator[int, None]:
    """Delete the rows of `table` for which `older(cutoff)` holds, cutoff being `retention` before
    `Database.now`, in `order_by` order (oldest first), `chunk` rows per transaction, yielding each committed
    chunk's count so the caller can count progress and stop between chunks (`contextlib.aclosing`).

    `narrow` repeats `older` in the DELETE: on a partitioned table (the audit trail on PostgreSQL) that
    keeps it to the partitions that can hold such rows, where looking the ids up would visit every one.

    `before`: what to write, given the cutoff, in a transaction committed before any row is deleted (the
    task prune's horizon, `store.kept_counts`).

    Safe from every instance at once: on PostgreSQL a pruner skips the rows another one is deleting and takes
    the next ones; a chunk short of `chunk` ends the prune, and whatever a rival still holds is its to finish.
    """
    async with db.read() as conn:
        cutoff = await db.now(conn) - retention
    key = table.c.id
    oldest = select(key).where(older(cutoff)).order_by(*order_by).limit(chunk)
    # `ids_in`: on PostgreSQL, `id IN (subquery)` would read the whole table once per chunk (a first prune
    # of n rows would read it n / chunk times).
    prune = delete(table).where(
        *([older(cutoff)] if narrow else []), ids_in(db.dialect, key, db.skip_locked(oldest))
    )
    if before is not None:
        async with db.transaction() as conn:
            await before(conn, cutoff)
    while True:
        async with db.transaction() as conn:
            deleted = (await conn.execute(prune)).rowcount
        yield deleted
        if deleted < chunk:
            return


# --- the weeks of a table partitioned by week (the runs, the tasks) --------------------------------------


async def made_ahead(db: Database, ensure: Callable[[Connection, datetime], list[str]]) -> list[str]:
    """`ensure` (a table's `ensure_partitions`: its coming weeks) in a transaction of its own that waits
    briefly for its locks, at the database's time (an instance's start-up and hourly rounds:
    `rackflow.retention.keep_weeks`); returns the names made. Nothing on SQLite."""
    if not db.is_postgres:
        return []
    async with db.transaction() as conn:
        await conn.run_sync(wait_briefly)
        now = await db.now(conn)
        made: list[str] = await conn.run_sync(ensure, now)
        return made


async def drop_past_weeks(
    db: Database,
    retention: timedelta,
    *,
    recent: timedelta,
    past_weeks: Callable[[Connection, datetime], list[Partition]],
    drop: Callable[[Connection, Partition, datetime], int | None],
    kept_floor: Callable[[Connection, datetime], datetime | None],
    floor: list[datetime | None],
    before: Callable[[AsyncConnection, datetime], Awaitable[None]] | None = None,
) -> AsyncGenerator[int, None]:
    """The first half of a partitioned table's prune (PostgreSQL): drop each week all of whose range is
    older than the retention's cutoff and than `recent` (`past_weeks`), one short transaction each, if
    `drop` finds none of its rows kept, yielding the rows each held; then set `floor[0]` to where the
    batched delete of the rest stops (`kept_floor`: the oldest week still kept). `before`: what to commit
    first, given the cutoff, if a week may go (the task prune's horizon)."""
    async with db.read() as conn:
        now = await db.now(conn)
        cutoff = now - retention
        past = await conn.run_sync(past_weeks, min(cutoff, now - recent))
    if past and before is not None:
        async with db.transaction() as conn:
            await before(conn, cutoff)
    for week in past:
        async with db.transaction() as conn:
            dropped = await conn.run_sync(drop, week, cutoff)
        if dropped:
            yield dropped
    async with db.read() as conn:
        floor[0] = await conn.run_sync(kept_floor, cutoff)
