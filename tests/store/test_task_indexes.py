"""The hot statements on live tasks are answered by indexes, never by a scan of every ended task.

The executor's claim, a submission's look at its racks' blocking and waiting tasks, the promotion check
and the SKIP overlap check each look for a few live tasks among a long history of ended ones. Both
databases match the partial index `ix_tasks_active` (`status IN ('pending', 'running', 'waiting')`) by its
predicate, and PostgreSQL cannot match it at all from a parameter once it plans a prepared statement
generically (psycopg prepares a statement after a few runs): these statements write their statuses as SQL
literals (`rackflow.store.tasks.status_in`). These tests EXPLAIN the statements the store really sends over
a history of ended tasks: on PostgreSQL with fresh statistics (autovacuum keeps them), planned with the
parameter values and generically, and (for the statements that name their tasks) with statistics taken
while no task was live; on SQLite without statistics, as rackflow runs it (it never ANALYZEs).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import pytest
from sqlalchemy import insert, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.schedules import Scope
from rackflow.store import checks as checks_store
from rackflow.store import schedules as schedules_store
from rackflow.store import task_partitions, task_runs
from rackflow.store import tasks as tasks_store
from rackflow.store.db import Database
from rackflow.store.tables import instances, racks, task_schedule, task_schedule_scope, tasks
from tests.built_once import built_once
from tests.conftest import postgres_admin_url
from tests.store.query_plans import explain, explain_generic, explain_walked, statement_sent

ACTIVE_INDEX = "ix_tasks_active"
# PostgreSQL's live tasks in the queue's order: a claim walks them from the oldest and stops once it has its
# tasks, where it read and sorted every live task (27 ms a claim with 9,264 pending at full size; migration
# 0030). SQLite, without statistics, still reads the live tasks by status and sorts them.
QUEUE_INDEX = "ix_tasks_live_queue"
# A sort of the rows read: every live task read to take the oldest few. (A Merge Append of the tasks'
# partitions, each read in the index's order, names its "Sort Key" without sorting anything.)
SORTED = re.compile(r"\bSort  \(")
BACKLOG = 2_000  # pending tasks a burst left: what a claim must not read whole
ENDED_SINCE = 20_000  # tasks ended since the table was last vacuumed: their entries in the live indexes dead
# A rack's live tasks: read through the whole rack's history, or every live task of the fleet, a
# submission's read grew with either; PostgreSQL reads the live tasks by rack (migration 0026). SQLite has
# no such index (with it, its planner left `ix_tasks_held` for the status index in the dead-hold sweep,
# test_held_index.py) and reads the rack's tasks by its index.
LIVE_BY_RACK_INDEX = {"postgresql": "ix_tasks_live_rack_id", "sqlite": "ix_tasks_rack_id_status"}
ENDED_TASKS = 20_000
RACKS = 200
# A read of every row of tasks (or of its alias `blocker`), in either database's EXPLAIN.
FULL_SCAN = re.compile(r"Seq Scan on tasks\b|\bSCAN (tasks|blocker)\b")
T0 = datetime(2026, 3, 1, tzinfo=UTC)
NOW = datetime(2026, 3, 2, tzinfo=UTC)
LEASE = timedelta(seconds=15)
# When PostgreSQL's statistics of the tables were taken: after the whole history was written ("fresh", as
# autovacuum keeps them), of the empty tables ("empty"), or while every task had ended ("ended").
Statistics = Literal["fresh", "empty", "ended"]


@dataclass(frozen=True)
class HistoryRows:
    """A database holding the history, and what the statements are asked about: racks with live work, its
    running tasks and schedule scopes (some whose last task still runs)."""

    url: str
    owner_id: uuid.UUID
    rack_ids: list[uuid.UUID]
    batch_rack_ids: list[uuid.UUID]  # as many racks as a large dispatch batch names
    running_ids: list[uuid.UUID]
    scopes: list[Scope]


@dataclass(frozen=True)
class History:
    """The history's rows, and a connection pool to their database for one test."""

    db: Database
    rows: HistoryRows


def _task(status: str, rack_id: uuid.UUID, owner_id: uuid.UUID | None = None) -> dict[str, Any]:
    return {"id": uuid.uuid4(), "status": status, "rack_id": rack_id, "owner_id": owner_id}


async def _add_history(db: Database, *, statistics: Statistics, backlog: int = 0) -> HistoryRows:
    """Many ended tasks on many racks; on the first racks a few pending, running, waiting and held ones;
    and `backlog` more pending ones, spread over the racks."""
    live = uuid.uuid4()
    rack_ids = [uuid.uuid4() for _ in range(RACKS)]
    ended = ("completed", "failed", "terminated")
    history = [_task(ended[i % 3], rack_ids[i % RACKS]) for i in range(ENDED_TASKS)]
    running = [_task("running", rack_ids[i], live) for i in range(3)]
    live_work = running + [_task("pending", rack_ids[i]) for i in range(3, 6)]
    live_work += [_task("waiting", rack_ids[i]) for i in range(6)]
    live_work.append(_task("terminated", rack_ids[0], live))  # cancelled, its executor not yet stopped
    live_work += [_task("pending", rack_ids[i % RACKS]) for i in range(backlog)]
    schedule_id = uuid.uuid4()
    scopes = [
        Scope(
            id=uuid.uuid4(),
            schedule_id=schedule_id,
            rack_id=rack_id,
            filter=None,
            last_task_id=(running[0] if i == 0 else history[i])["id"],
            created_at=T0,
        )
        for i, rack_id in enumerate(rack_ids)
    ]
    async with db.transaction() as conn:
        await conn.execute(
            insert(instances), [{"id": live, "host": "h", "pid": 1, "started_at": NOW, "heartbeat_at": NOW}]
        )
        await conn.execute(
            insert(racks), [{"id": r, "name": f"r{i}", "created_at": T0} for i, r in enumerate(rack_ids)]
        )
        base = {"operation": "power_on", "parameters": {"kind": "power_on"}, "component_ids": []}
        await conn.execute(
            insert(tasks), [{**base, "created_at": T0, "updated_at": T0, **t} for t in history]
        )
        if db.is_postgres and statistics == "ended":
            await conn.exec_driver_sql("ANALYZE tasks")
        await conn.execute(
            insert(tasks), [{**base, "created_at": T0, "updated_at": T0, **t} for t in live_work]
        )
        await conn.execute(
            insert(task_schedule),
            {
                "id": schedule_id,
                "name": "nightly",
                "spec_type": "interval",
                "spec": "1h",
                "operation_template": {"kind": "power_on"},
                "created_at": T0,
                "updated_at": T0,
            },
        )
        await conn.execute(
            insert(task_schedule_scope),
            [
                {
                    "id": s.id,
                    "schedule_id": schedule_id,
                    "rack_id": s.rack_id,
                    "last_task_id": s.last_task_id,
                    "created_at": T0,
                }
                for s in scopes
            ],
        )
        if db.is_postgres and statistics == "fresh":
            await conn.exec_driver_sql("ANALYZE")
    return HistoryRows(db.url, live, rack_ids[:5], rack_ids, [t["id"] for t in running], scopes[:10])


def _history_database(url: str, statistics: Statistics, *, backlog: int = 0) -> HistoryRows:
    """Write the history once into the database at `url` (its own), for all of a module's tests: they only
    EXPLAIN, and `statement_sent` rolls back what it sends. Written anew for each test, the 20,000 tasks
    took 6-9 s of a loaded machine a time, 19 times."""

    async def write() -> HistoryRows:
        db = Database(url)
        try:
            if db.is_postgres and statistics != "fresh":
                async with db.transaction() as conn:
                    await conn.exec_driver_sql("ANALYZE")
            return await _add_history(db, statistics=statistics, backlog=backlog)
        finally:
            await db.dispose()

    return asyncio.run(write())


def _built_once(pg_template: str, key: str, build: Callable[[str], HistoryRows]) -> HistoryRows:
    """A history on PostgreSQL, written once for every worker of the run (the tests only read it)."""
    return built_once(postgres_admin_url(), pg_template, f"task_indexes_{key}", build)


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def history_rows(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HistoryRows]:
    """The history in a migrated database of its own, once per backend; on PostgreSQL with fresh
    statistics (autovacuum keeps them)."""
    if request.param == "sqlite":
        template: Path = request.getfixturevalue("sqlite_template")
        path = tmp_path_factory.mktemp("task-indexes") / "rackflow.db"
        shutil.copy(template, path)
        yield _history_database(f"sqlite:///{path}", "fresh")
        return
    yield _built_once(
        request.getfixturevalue("pg_template"), "fresh", lambda url: _history_database(url, "fresh")
    )


@pytest.fixture(scope="module")
def pg_history_rows_analyzed_empty(pg_template: str) -> HistoryRows:
    """The history on PostgreSQL, written into a database of its own after its empty tables were analyzed:
    no statistics at all, as at a fleet's first drain before autovacuum has looked at the tables it fills."""
    return _built_once(pg_template, "empty", lambda url: _history_database(url, "empty"))


@pytest.fixture(scope="module")
def pg_history_rows_analyzed_ended(pg_template: str) -> HistoryRows:
    """The history on PostgreSQL, analyzed while every task had ended, then the live ones added: as a fleet
    whose tasks autovacuum last looked at while it was quiet, then a drain."""
    return _built_once(pg_template, "ended", lambda url: _history_database(url, "ended"))


@asynccontextmanager
async def _connected(rows: HistoryRows) -> AsyncIterator[History]:
    database = Database(rows.url)
    try:
        yield History(database, rows)
    finally:
        await database.dispose()


@pytest.fixture
async def history(history_rows: HistoryRows) -> AsyncIterator[History]:
    async with _connected(history_rows) as connected:
        yield connected


@pytest.fixture
async def pg_history_analyzed_empty(pg_history_rows_analyzed_empty: HistoryRows) -> AsyncIterator[History]:
    async with _connected(pg_history_rows_analyzed_empty) as connected:
        yield connected


@pytest.fixture
async def pg_history_analyzed_ended(pg_history_rows_analyzed_ended: HistoryRows) -> AsyncIterator[History]:
    async with _connected(pg_history_rows_analyzed_ended) as connected:
        yield connected


Send = Callable[[History, AsyncConnection], Awaitable[object]]


@dataclass(frozen=True)
class Hot:
    """A hot statement: how the store sends it, and the index it must read, or one of them (None: any
    index will do, e.g. the rack's or the primary key, when the statement names the racks or tasks it is
    about), or per database (by dialect name)."""

    send: Send
    index: str | tuple[str, ...] | dict[str, str] | None = None


HOT = {
    "claim": Hot(  # its pick: its UPDATE then names the tasks picked
        lambda h, conn: task_runs.pick(
            h.db,
            conn,
            owner_id=h.rows.owner_id,
            lease_ttl=LEASE,
            running_here=h.rows.running_ids,
            now=NOW,
            limit=10,
        ),
        # Few live tasks: by status, or in the queue's order (PostgreSQL picks by its statistics).
        {"postgresql": (ACTIVE_INDEX, QUEUE_INDEX), "sqlite": ACTIVE_INDEX},
    ),
    "racks_needing_promotion": Hot(
        lambda h, conn: tasks_store.racks_needing_promotion(conn, now=NOW),
        # Waiting tasks, by either index led by the status (PostgreSQL picks by its statistics).
        (ACTIVE_INDEX, "ix_tasks_status_created_at_id"),
    ),
    "blocking_and_waiting": Hot(
        lambda h, conn: tasks_store.blocking_and_waiting(conn, h.rows.rack_ids), LIVE_BY_RACK_INDEX
    ),
    "blocking_tasks": Hot(lambda h, conn: tasks_store.blocking_tasks(conn, h.rows.rack_ids)),
    "waiting_tasks": Hot(lambda h, conn: tasks_store.waiting_tasks(conn, h.rows.rack_ids)),
    # Which of the racks locked as their tasks end have a waiting task to promote.
    "racks_with_waiting": Hot(
        lambda h, conn: tasks_store.racks_with_waiting(h.db, conn, h.rows.rack_ids), LIVE_BY_RACK_INDEX
    ),
    # The active tasks of each scope's rack, never the last tasks' rows of the history, nor every live task
    # of the fleet filtered by id for each scope, which PostgreSQL read through ix_tasks_active when its
    # statistics said few tasks were live (docs/PERFORMANCE.md, "The drain among a loaded history").
    "overlapping_scope_ids": Hot(
        lambda h, conn: schedules_store.overlapping_scope_ids(conn, h.rows.scopes), LIVE_BY_RACK_INDEX
    ),
}


async def _statement(history: History, hot: Hot) -> tuple[str, Any]:
    await _floor_read(history.db)
    return await statement_sent(history.db, lambda conn: hot.send(history, conn))


async def _floor_read(db: Database) -> None:
    """The tasks' first week read (`task_partitions.live_weeks` reads it from the catalog once per
    engine), so that the statements sent next are the read's own."""
    async with db.read() as conn:
        await task_partitions.live_weeks(conn)


def _assert_reads_indexes(hot: Hot, plan: str, dialect: str) -> None:
    assert not FULL_SCAN.search(plan), f"a full scan of tasks:\n{plan}"
    if hot.index is not None:
        index = hot.index[dialect] if isinstance(hot.index, dict) else hot.index
        indexes = (index,) if isinstance(index, str) else index
        assert any(name in plan for name in indexes), plan


@pytest.mark.parametrize("name", HOT)
async def test_reads_indexes(history: History, name: str) -> None:
    plan = await explain(history.db, *await _statement(history, HOT[name]))
    _assert_reads_indexes(HOT[name], plan, history.db.dialect)


@pytest.mark.postgres
@pytest.mark.parametrize("name", HOT)
@pytest.mark.parametrize("history_rows", ["postgres"], indirect=True)  # PostgreSQL's generic plans
async def test_reads_indexes_when_prepared_generically(history: History, name: str) -> None:
    plan = await explain_generic(history.db, *await _statement(history, HOT[name]))
    _assert_reads_indexes(HOT[name], plan, history.db.dialect)


@pytest.mark.parametrize("history_rows", ["sqlite"], indirect=True)
async def test_the_skip_check_searches_a_racks_index_by_status_on_sqlite(history: History) -> None:
    """SQLite has no index of live tasks by rack: the SKIP check asks for the active statuses alone, which
    it finds in the rack's index by status. Asked with the held ones too (`is_live_on_rack`'s OR), it read
    every task of the rack: 5.6 ms a scope with 5,000 ended tasks a rack, against 0.065 ms."""
    hot = HOT["overlapping_scope_ids"]
    plan = await explain(history.db, *await _statement(history, hot))
    assert re.search(r"ix_tasks_rack_id_status \(rack_id=\? AND status=\?\)", plan), plan


# Statements run once per dispatched batch, about all its racks, which must not read the whole table while
# it grows from empty (docs/PERFORMANCE.md, "flat as work grows").
PER_BATCH = {
    "blocking_and_waiting": Hot(
        lambda h, conn: tasks_store.blocking_and_waiting(conn, h.rows.batch_rack_ids), LIVE_BY_RACK_INDEX
    ),
}


@pytest.mark.postgres
@pytest.mark.parametrize("name", PER_BATCH)
async def test_a_batch_reads_indexes_with_the_statistics_of_empty_tables(
    pg_history_analyzed_empty: History, name: str
) -> None:
    history = pg_history_analyzed_empty
    plan = await explain(history.db, *await _statement(history, PER_BATCH[name]))
    _assert_reads_indexes(PER_BATCH[name], plan, history.db.dialect)


# Statistics that say no task is live, while some are: the partial indexes of live tasks look empty to the
# planner, which then reads them for statements that name their tasks. (The claim's reads are held by
# `test_the_oldest_live_tasks_are_read_in_the_queue_order`.)
QUIET = {"overlapping_scope_ids": HOT["overlapping_scope_ids"]}


@pytest.mark.postgres
@pytest.mark.parametrize("name", QUIET)
async def test_reads_indexes_with_the_statistics_of_a_quiet_fleet(
    pg_history_analyzed_ended: History, name: str
) -> None:
    history = pg_history_analyzed_ended
    plan = await explain(history.db, *await _statement(history, QUIET[name]))
    _assert_reads_indexes(QUIET[name], plan, history.db.dialect)


# Each rack's waiting tasks looked up by the rack, as a scan under the rack's index condition: with
# statistics that say no task is live, PostgreSQL planned the per-rack EXISTS as one hashed subplan over
# every live task of the fleet instead (`Filter` on the status, no `Index Cond`), 9,852 buffers and 8 ms
# for ten racks with 9,670 tasks live at full size, at each round of ended tasks.
PROBED_BY_RACK = re.compile(
    r"Scan using ix_tasks_\w+ on tasks\w*\b.*\n\s+Index Cond: \(rack_id = racks\.id\)"
)


@pytest.mark.postgres
async def test_the_promotion_check_looks_up_each_rack_with_the_statistics_of_a_quiet_fleet(
    pg_history_analyzed_ended: History,
) -> None:
    history = pg_history_analyzed_ended
    hot = HOT["racks_with_waiting"]
    plan = await explain(history.db, *await _statement(history, hot))
    _assert_reads_indexes(hot, plan, history.db.dialect)
    assert PROBED_BY_RACK.search(plan), plan


@pytest.fixture(scope="module")
def pg_backlog_rows(pg_template: str) -> HistoryRows:
    """The history on PostgreSQL with a backlog of BACKLOG pending tasks, analyzed while every task had
    ended: a large table's statistics, which a burst moves too little for autovacuum to analyze again. (With
    statistics that know the backlog, or none, PostgreSQL may read the live tasks by status and sort them,
    costing them as few; at full size, with these statistics, it read all 9,264 for each claim.)"""
    return _built_once(pg_template, "backlog", lambda url: _history_database(url, "ended", backlog=BACKLOG))


@pytest.fixture
async def pg_backlog(pg_backlog_rows: HistoryRows) -> AsyncIterator[History]:
    async with _connected(pg_backlog_rows) as connected:
        yield connected


async def _end_a_burst_then_queue_another(db: Database, rows: HistoryRows) -> None:
    """After the table was vacuumed and analyzed with few tasks live: ENDED_SINCE tasks that were live and
    have ended (a burst the executors ran), each leaving its entry in the live tasks' indexes dead until the
    next vacuum (autovacuum off for the table, as it is in effect for a large one, which it vacuums once a
    fifth of it changed), then BACKLOG pending ones newer than them (the next burst)."""
    earlier, later = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    base = {"operation": "power_on", "parameters": {"kind": "power_on"}, "component_ids": []}
    racks_ = rows.batch_rack_ids
    async with db.transaction() as conn:
        # (on the partition of these tasks, filed before the weeks: a partitioned table has no storage)
        await conn.exec_driver_sql("ALTER TABLE tasks_before SET (autovacuum_enabled = false)")
        burst = [_task("pending", racks_[i % RACKS]) for i in range(ENDED_SINCE)]
        await conn.execute(
            insert(tasks), [{**base, "created_at": earlier, "updated_at": earlier, **t} for t in burst]
        )
        await conn.execute(update(tasks).where(tasks.c.created_at == earlier).values(status="completed"))
        backlog = [_task("pending", racks_[i % RACKS]) for i in range(BACKLOG)]
        await conn.execute(
            insert(tasks), [{**base, "created_at": later, "updated_at": later, **t} for t in backlog]
        )


@pytest.fixture(scope="module")
def pg_between_vacuums_rows(pg_template: str) -> HistoryRows:
    """The history on PostgreSQL with a few tasks live, vacuumed and analyzed so, then a burst ended and
    another queued (`_end_a_burst_then_queue_another`): statistics that say a handful of tasks are live, and
    live tasks' indexes whose dead entries make them look large. With these, PostgreSQL planned the claim
    as a bitmap read of every entry of the status index, dead or not, and a sort of the live tasks (at full
    size 8,400 blocks and 29 ms a claim: `store.dialect.walking_in_order`)."""

    async def write(url: str) -> HistoryRows:
        db = Database(url)
        try:
            rows = await _add_history(db, statistics="fresh")
            async with db.engine.connect() as conn:
                autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await autocommit.exec_driver_sql("VACUUM ANALYZE tasks")
            await _end_a_burst_then_queue_another(db, rows)
            return rows
        finally:
            await db.dispose()

    return _built_once(pg_template, "between_vacuums", lambda url: asyncio.run(write(url)))


@pytest.mark.postgres
async def test_a_claim_walks_the_live_queue_in_its_order_between_two_vacuums(
    pg_between_vacuums_rows: HistoryRows,
) -> None:
    async with _connected(pg_between_vacuums_rows) as history:
        await _floor_read(history.db)
        plan = await explain_walked(history.db, lambda conn: HOT["claim"].send(history, conn))
    assert QUEUE_INDEX in plan, plan
    assert not SORTED.search(plan), f"every live task read and sorted:\n{plan}"


# The statements that take the oldest few live tasks, and the index each walks in the queue's order: the
# claim the live tasks', the look at the queue's head the status index from its one status ('pending').
IN_QUEUE_ORDER = {
    "claim": (HOT["claim"].send, (QUEUE_INDEX,)),
    "queue_head": (
        lambda h, conn: checks_store.queue_head(conn, "preflight", now=NOW, limit=10),
        (QUEUE_INDEX, "ix_tasks_status_created_at_id"),
    ),
}


@pytest.mark.postgres
@pytest.mark.parametrize("generic", [False, True], ids=["planned", "generic"])
@pytest.mark.parametrize("name", IN_QUEUE_ORDER)
async def test_the_oldest_live_tasks_are_read_in_the_queue_order(
    pg_backlog: History, name: str, generic: bool
) -> None:
    send, indexes = IN_QUEUE_ORDER[name]
    await _floor_read(pg_backlog.db)
    if generic:
        statement = await statement_sent(pg_backlog.db, lambda conn: send(pg_backlog, conn))
        plan = await explain_generic(pg_backlog.db, *statement, walking=True)
    else:
        plan = await explain_walked(pg_backlog.db, lambda conn: send(pg_backlog, conn))
    assert any(index in plan for index in indexes), plan
    assert not SORTED.search(plan), f"every live task read and sorted:\n{plan}"
