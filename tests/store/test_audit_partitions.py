"""The audit trail partitioned by week on PostgreSQL (migration 0028, store/audit_partitions.py).

Migrating a trail keeps every event and its pages; an event of any time is written (a week without a
partition goes to the DEFAULT one), and a replayed one once; the prune drops the weeks all past the
retention and never an event younger than it; the principal's page reads an index of each partition.
SQLite keeps one table and the batched prune: the tests that apply to it run on it too.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest
from sqlalchemy import func, insert, literal_column, select

from rackflow.domain.audit import OK, AuditEvent, EventFilter
from rackflow.store import audit as store
from rackflow.store import audit_partitions as partitions
from rackflow.store.db import Database
from rackflow.store.migrate import migrate
from rackflow.store.paging import Key
from rackflow.store.tables import audit_events
from tests.conftest import database_at, table_counts, upgraded_counts
from tests.store.query_plans import explain, statements_sent
from tests.store.schema_diff import schema_diff

DAY = timedelta(days=1)
# The partition a row is in.
HOME = literal_column("tableoid::regclass::text")

# SQLite has no partitions: these tests are PostgreSQL's only.
ON_POSTGRESQL = pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


def _event(at: datetime, principal: str = "alice") -> AuditEvent:
    return AuditEvent(
        id=uuid.uuid4(),
        at=at,
        principal=principal,
        method="CreateRack",
        target_ids=(),
        outcome=OK,
        error="",
        request={},
    )


async def _insert(db: Database, events: list[AuditEvent]) -> None:
    async with db.transaction() as conn:
        await store.insert_events(conn, events)


async def _insert_as_0027(db: Database, events: list[AuditEvent]) -> None:
    """Insert `events` as the release at 0027 did, into its schema: without the later `changes` (0041)."""
    async with db.transaction() as conn:
        await conn.execute(
            insert(audit_events),
            [
                {key: value for key, value in vars(event).items() if key != "changes"}
                | {"target_ids": list(event.target_ids)}
                for event in events
            ],
        )


async def _ids(db: Database) -> set[uuid.UUID]:
    async with db.read() as conn:
        return set((await conn.execute(select(audit_events.c.id))).scalars())


async def _pages(db: Database, matching: EventFilter, size: int) -> list[list[uuid.UUID]]:
    """Every page of the trail, newest first, each after the last one's key (the list's keyset paging)."""
    pages: list[list[uuid.UUID]] = []
    after: Key | None = None
    while True:
        async with db.read() as conn:
            events, _total = await store.list_events(conn, matching, limit=size, after=after)
        if not events:
            return pages
        pages.append([e.id for e in events])
        after = (events[-1].at, events[-1].id)


def _paged(ids: list[uuid.UUID], size: int) -> list[list[uuid.UUID]]:
    return [ids[start : start + size] for start in range(0, len(ids), size)]


@pytest.fixture
async def db_at_0027(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0027") as db:
        yield db


@pytest.fixture
async def db(empty_db_url: str) -> AsyncIterator[Database]:
    """A database of its own: these tests make and drop partitions."""
    db = Database(empty_db_url)
    await migrate(db)
    yield db
    await db.dispose()


def _history(now: datetime) -> list[AuditEvent]:
    """Events over the past 400 days (several a day, some at the same instant), and a few ahead."""
    events = [_event(now - timedelta(hours=7 * i), f"user-{i % 3}") for i in range(1, 1400)]
    twins = [_event(now - timedelta(days=3)) for _ in range(5)]
    ahead = [_event(now + timedelta(days=d)) for d in (1, 9, 400)]
    return [*events, *twins, *ahead]


async def test_the_upgrade_keeps_every_event_and_its_pages(db_at_0027: Database) -> None:
    db = db_at_0027
    now = datetime.now(UTC)
    history = _history(now)
    await _insert_as_0027(db, history)
    counts = upgraded_counts(await table_counts(db))
    by_user = EventFilter(principal="user-1")
    # The pages the trail listed before (the current list reads columns 0027 lacks): newest first.
    newest_first = sorted(history, key=lambda e: (e.at, e.id), reverse=True)
    pages = _paged([e.id for e in newest_first], 50)
    user_pages = _paged([e.id for e in newest_first if e.principal == "user-1"], 20)

    await migrate(db)

    assert await schema_diff(db) == []
    assert await table_counts(db) == counts
    assert await _ids(db) == {e.id for e in history}
    assert await _pages(db, EventFilter(), 50) == pages
    assert await _pages(db, by_user, 20) == user_pages
    if db.is_postgres:
        async with db.read() as conn:
            names = [p.name for p in await conn.run_sync(partitions.partitions)]
            where = await conn.execute(select(HOME, func.count()).select_from(audit_events).group_by(HOME))
            spread = dict(where.all())
        assert names == ["audit_events_legacy", "audit_events_default"]  # the weeks start after it
        assert spread == {"audit_events_legacy": len(history)}  # up to 30 days after the newest event


async def test_an_event_of_any_time_is_written_and_a_replay_once(db: Database) -> None:
    now = datetime.now(UTC)
    today = partitions.period_start(now)
    times = [
        datetime(1990, 1, 1, tzinfo=UTC),
        today - timedelta(microseconds=1),
        today,
        today + partitions.PERIOD - timedelta(microseconds=1),
        today + partitions.PERIOD,
        today + partitions.LOOKAHEAD + 2 * partitions.PERIOD,  # past the partitions made ahead
        datetime(2200, 1, 1, tzinfo=UTC),
    ]
    events = [_event(at) for at in times]
    await _insert(db, events)
    await _insert(db, [*events, _event(now)])  # the spool replays all of them with one new event

    async with db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(audit_events))).scalar_one()
    assert count == len(times) + 1
    assert {e.id for e in events} <= await _ids(db)


async def test_the_prune_drops_whole_past_weeks_and_never_a_younger_event(db: Database) -> None:
    now = datetime.now(UTC)
    retention = timedelta(days=5, hours=1)
    cutoff = now - retention
    if db.is_postgres:
        async with db.transaction() as conn:  # the partitions a pruner would have made a month ago
            await conn.run_sync(partitions.ensure_partitions, now - 30 * DAY)
    events = [_event(now - timedelta(hours=5 * i)) for i in range(150)]  # 31 days, every 5 h
    await _insert(db, events)
    async with db.read() as conn:
        before = await conn.run_sync(partitions.partitions) if db.is_postgres else []

    pruned = sum([n async for n in store.prune_events(db, retention)])

    left = await _ids(db)
    assert all(e.id in left for e in events if e.at >= cutoff)  # never younger than the retention
    assert pruned == len(events) - len(left)
    if not db.is_postgres:
        assert left == {e.id for e in events if e.at >= cutoff}
        return
    async with db.read() as conn:
        after = await conn.run_sync(partitions.partitions)
    days = [p for p in before if not p.default]
    assert [p for p in days if p.upper is not None and p.upper <= cutoff]  # some week was all past it
    assert [p for p in after if not p.default] == [
        p for p in days if p.upper is not None and p.upper > cutoff
    ]

    def kept(at: datetime) -> bool:
        """In a week kept whole, or in none (then in the DEFAULT partition) and not older than the cutoff."""
        day = next(
            (p for p in days if p.lower is not None and p.upper is not None and p.lower <= at < p.upper), None
        )
        return at >= cutoff or (day is not None and day.upper is not None and day.upper > cutoff)

    assert left == {e.id for e in events if kept(e.at)}


@ON_POSTGRESQL
async def test_the_prune_makes_the_coming_weeks_partitions(db: Database) -> None:
    async with db.transaction() as conn:
        for p in await conn.run_sync(partitions.partitions):
            if not p.default:
                await conn.run_sync(partitions.drop_partition, p)

    assert [n async for n in store.prune_events(db, timedelta(days=30))] == [0]

    now = datetime.now(UTC)
    async with db.read() as conn:
        days = [p for p in await conn.run_sync(partitions.partitions) if not p.default]
    assert days[0].lower == partitions.period_start(now)
    assert days[-1].upper is not None and days[-1].upper > now + partitions.LOOKAHEAD
    assert all(a.upper == b.lower for a, b in pairwise(days))


@ON_POSTGRESQL
async def test_a_week_made_late_takes_its_events_from_the_default_partition(db: Database) -> None:
    now = datetime.now(UTC)
    late = _event(now + partitions.LOOKAHEAD + 2 * partitions.PERIOD)  # no partition yet: the DEFAULT one
    await _insert(db, [late])

    async with db.transaction() as conn:
        made = await conn.run_sync(partitions.ensure_partitions, now + 3 * partitions.PERIOD)
        where = select(HOME).where(audit_events.c.id == late.id)
        home = (await conn.execute(where)).scalar_one()

    assert home == partitions.partition_name(partitions.period_start(late.at)) and home in made


async def test_the_legacy_partition_is_pruned_in_batches_then_dropped(db_at_0027: Database) -> None:
    db = db_at_0027
    now = datetime.now(UTC)
    history = _history(now)
    await _insert_as_0027(db, history)
    await migrate(db)

    retention = timedelta(days=100)
    await _prune_all(db, retention)
    assert await _ids(db) == {e.id for e in history if e.at >= now - retention}
    if not db.is_postgres:
        return
    async with db.read() as conn:
        (legacy, *_) = await conn.run_sync(partitions.partitions)
    assert legacy.name == "audit_events_legacy" and legacy.upper is not None
    # Once all of it is past the retention (a retention ending after its bound stands for that time).
    await _prune_all(db, now - legacy.upper - DAY)
    async with db.read() as conn:
        names = [p.name for p in await conn.run_sync(partitions.partitions)]
    assert "audit_events_legacy" not in names
    assert await _ids(db) == {e.id for e in history if e.at >= legacy.upper + DAY}


async def _prune_all(db: Database, retention: timedelta) -> None:
    async for _ in store.prune_events(db, retention, chunk=100):
        pass


async def test_the_principals_page_reads_an_index(db: Database) -> None:
    """The audit page filtered by principal, newest first: each partition's (principal, at, id) index, in
    order, never a scan and sort of the trail."""
    now = datetime.now(UTC)
    for day in range(3):  # a week back: this week's partition and the DEFAULT one (before any partition)
        minutes = range(day * 10_000, (day + 1) * 10_000)
        await _insert(db, [_event(now - timedelta(minutes=i / 3), f"user-{i % 10}") for i in minutes])
    async with db.transaction() as conn:
        await conn.exec_driver_sql("ANALYZE audit_events" if db.is_postgres else "ANALYZE")

    with statements_sent(db) as sent:
        async with db.read() as conn:
            await store.list_events(conn, EventFilter(principal="user-7"), limit=50)
    ((statement, parameters),) = [(s, p) for s, p in sent if "ORDER BY" in s]
    plan = await explain(db, statement, parameters)
    assert "principal_at_id" in plan, plan
    assert not re.search(r"\bSort  \(|USE TEMP B-TREE|SCAN audit_events", plan), plan  # a sort, a scan
    assert not re.search(r"Seq Scan on audit_events_(default|legacy|p\d+) .*rows=[1-9]\d", plan), plan


@ON_POSTGRESQL
async def test_concurrent_prunes_drop_each_week_once(db: Database) -> None:
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await conn.run_sync(partitions.ensure_partitions, now - 30 * DAY)
    events = [_event(now - timedelta(hours=5 * i)) for i in range(150)]
    await _insert(db, events)

    async def prune() -> int:
        return sum([n async for n in store.prune_events(db, timedelta(days=5, hours=1))])

    pruned = await asyncio.gather(prune(), prune(), prune())

    assert sum(pruned) == len(events) - len(await _ids(db))
