"""Audit retention: `prune_events` deletes the events past the retention, oldest first, in chunks of their
own transactions, by the database's clock on PostgreSQL; `AuditPruner` counts them, stops between chunks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, select

from rackflow import metrics
from rackflow.audit.retention import AuditPruner
from rackflow.clock import SystemClock
from rackflow.domain.audit import OK, AuditEvent
from rackflow.store import audit as store
from rackflow.store.db import Database
from rackflow.store.retention import PRUNE_CHUNK
from rackflow.store.tables import audit_events
from tests.conftest import sqlite_threads, sqlite_threads_ended
from tests.store.test_executor import eventually

RETENTION = timedelta(hours=1)
# The old events are older than this week, so on PostgreSQL they are in no week's partition but in the
# DEFAULT one, whose old rows are deleted in batches: a week's partition goes whole once all of it is past
# the retention (test_audit_partitions.py).
OLD = timedelta(days=8)


def _event(at: datetime) -> AuditEvent:
    return AuditEvent(
        id=uuid.uuid4(),
        at=at,
        principal="alice",
        method="CreateRack",
        target_ids=(),
        outcome=OK,
        error="",
        request={},
    )


async def _add_events(db: Database, ages: Sequence[timedelta]) -> list[uuid.UUID]:
    """One event per age (how long before now it happened); their ids in the same order."""
    now = datetime.now(UTC)
    events = [_event(now - age) for age in ages]
    async with db.transaction() as conn:
        await store.insert_events(conn, events)
    return [event.id for event in events]


async def _remaining(db: Database) -> set[uuid.UUID]:
    async with db.read() as conn:
        return set((await conn.execute(select(audit_events.c.id))).scalars())


async def _prune(db: Database, chunk: int) -> list[int]:
    return [deleted async for deleted in store.prune_events(db, RETENTION, chunk=chunk)]


async def test_prune_deletes_old_events_in_chunks_and_keeps_recent_ones(db: Database) -> None:
    await _add_events(db, [OLD + timedelta(hours=h) for h in (0, 1, 3, 48, 24 * 400)])
    recent = await _add_events(db, [timedelta(minutes=1), timedelta(minutes=50)])

    assert await _prune(db, chunk=2) == [2, 2, 1]
    assert await _remaining(db) == set(recent)
    assert await _prune(db, chunk=2) == [0]  # nothing left to prune: one empty chunk
    assert await _remaining(db) == set(recent)


async def test_prune_deletes_the_oldest_first_and_ends_on_a_short_chunk(db: Database) -> None:
    newest_old, *_ = await _add_events(db, [OLD + timedelta(hours=h) for h in (0, 1, 2, 3)])

    chunks = store.prune_events(db, RETENTION, chunk=3)
    async with contextlib.aclosing(chunks):
        assert await anext(chunks) == 3
        assert await _remaining(db) == {newest_old}  # the first chunk took the three oldest
        assert [deleted async for deleted in chunks] == [1]
    assert await _remaining(db) == set()


async def test_concurrent_pruners_delete_each_event_once(db: Database) -> None:
    """Every instance prunes; on PostgreSQL they skip each other's rows, on SQLite they take turns."""
    await _add_events(db, [OLD + timedelta(seconds=i) for i in range(25)])
    recent = await _add_events(db, [timedelta(minutes=5)])

    results = await asyncio.gather(*(_prune(db, chunk=4) for _ in range(3)))

    assert sum(sum(chunks) for chunks in results) == 25
    assert await _remaining(db) == set(recent)


async def test_the_cutoff_is_the_database_clock_on_postgresql(db_url: str) -> None:
    """A process clock 10 h fast would prune the recent events, but on PostgreSQL the database decides."""
    fast = Database(db_url, clock=SystemClock(timedelta(hours=10)))
    try:
        recent = await _add_events(fast, [timedelta(minutes=5)])
        pruned = sum(await _prune(fast, chunk=10))
        assert (pruned, await _remaining(fast)) == ((0, set(recent)) if fast.is_postgres else (1, set()))
    finally:
        await fast.dispose()


async def test_pruner_counts_what_it_deletes_and_stops_between_chunks(db: Database) -> None:
    old = await _add_events(db, [OLD + timedelta(seconds=i) for i in range(5)])
    pruner = AuditPruner(db, RETENTION, chunk=2)
    before = metrics.AUDIT_EVENTS_PRUNED._value.get()
    stop = asyncio.Event()
    stop.set()

    assert await pruner.prune_once(stop) == 2  # asked to stop: the first chunk only
    assert await _remaining(db) == set(old[:3])  # the two oldest went
    assert await pruner.prune_once(asyncio.Event()) == 3
    assert await _remaining(db) == set()
    assert metrics.AUDIT_EVENTS_PRUNED._value.get() - before == 5


async def test_pruner_runs_at_once_and_survives_a_failed_prune(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    await _add_events(db, [OLD])
    recent = await _add_events(db, [timedelta(minutes=5)])
    before = sqlite_threads()
    broken = Database("sqlite:////nonexistent-dir/rackflow.db")
    stop = asyncio.Event()

    async def pruned() -> bool:  # at once: the working pruner's next prune is an hour away
        return await _remaining(db) == set(recent)

    async def failed_a_few_times() -> bool:
        return sum(r.getMessage().startswith("audit prune failed") for r in caplog.records) >= 3

    try:
        with caplog.at_level(logging.WARNING, logger="rackflow.retention"):
            failing = asyncio.create_task(
                AuditPruner(broken, RETENTION, every=timedelta(seconds=0.05)).run(stop)
            )
            working = asyncio.create_task(AuditPruner(db, RETENTION, every=timedelta(hours=1)).run(stop))
            await eventually(pruned)
            await eventually(failed_a_few_times)
        assert not failing.done()  # a few failed prunes later, the failing pruner still runs
        stop.set()
        await asyncio.wait_for(asyncio.gather(failing, working), 10)  # no waiting out the hour
    finally:
        await broken.dispose()
        await db.dispose()  # its threads too, which end as its connections close
        await sqlite_threads_ended(sqlite_threads() - before)  # the failed opens' (tests/conftest.py)


async def test_a_chunk_reads_the_time_index_and_the_primary_key_not_the_table(db: Database) -> None:
    """Each chunk finds its rows by ix_audit_events_at_id and deletes them by id, so a first prune of a
    large trail costs each chunk its own rows, not a read of the whole table."""
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if statement.startswith("DELETE FROM audit_events"):
            sent.append((statement, parameters))

    event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        await _prune(db, chunk=PRUNE_CHUNK)
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
    statement, parameters = sent[0]
    await _add_events(db, [OLD + timedelta(seconds=i) for i in range(20_000)])
    async with db.transaction() as conn:
        await conn.exec_driver_sql("ANALYZE audit_events" if db.is_postgres else "ANALYZE")
        prefix = "EXPLAIN " if db.is_postgres else "EXPLAIN QUERY PLAN "
        rows = (await conn.exec_driver_sql(prefix + statement, parameters)).all()
    plan = "\n".join(" ".join(str(col) for col in row) for row in rows)
    # On PostgreSQL the DEFAULT partition's copy of it, and no other partition (test_audit_partitions.py).
    assert ("audit_events_default_at_id_idx" if db.is_postgres else "ix_audit_events_at_id") in plan, plan
    assert "audit_events_p2" not in plan, plan
    assert "Seq Scan" not in plan and "SCAN audit_events" not in plan, plan
