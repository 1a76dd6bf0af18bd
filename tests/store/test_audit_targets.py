"""The audit trail by target (`EventFilter.target`, ListAuditEvents' `target`), on both databases: the
events naming an id, newest first, page by page; PostgreSQL reads them from the GIN index of migration
0044, SQLite walks a bounded range of the trail per page and still finds every match by paging on."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.domain.audit import OK, AuditEvent, EventFilter
from rackflow.store import audit as store
from rackflow.store import paging
from rackflow.store.audit_partitions import period_start
from rackflow.store.db import Database
from rackflow.store.paging import Key, Listed
from tests.store.query_plans import explain, statements_sent

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
RACK = uuid.uuid4()
SCHEDULE = uuid.uuid4()


def _event(
    at: datetime, *targets: uuid.UUID, method: str = "CreateRack", principal: str = "oncall"
) -> AuditEvent:
    return AuditEvent(
        id=uuid.uuid4(),
        at=at,
        principal=principal,
        method=method,
        target_ids=tuple(str(t) for t in targets),
        outcome=OK,
        error="",
        request={},
    )


async def _insert(db: Database, events: list[AuditEvent]) -> None:
    async with db.transaction() as conn:
        await store.insert_events(conn, events)


async def _pages(
    db: Database, matching: EventFilter, limit: int
) -> tuple[list[list[AuditEvent]], list[Listed]]:
    """Every page of `matching`, paging on by each page's last event, or where a walk stopped."""
    pages: list[list[AuditEvent]] = []
    said: list[Listed] = []
    after: Key | None = None
    while True:
        async with db.read() as conn:
            events, listed = await store.list_events(conn, matching, limit=limit, after=after)
        pages.append(events)
        said.append(listed)
        if len(events) == limit:
            after = (events[-1].at, events[-1].id)
        elif listed.searched_to is not None:
            after = listed.searched_to
        else:
            return pages, said


async def test_the_events_naming_an_id_newest_first_page_by_page(db: Database) -> None:
    other = uuid.uuid4()
    events = [
        _event(T0, RACK, method="CreateRack"),
        _event(T0 + timedelta(minutes=1), SCHEDULE, method="CreateTaskSchedule"),
        _event(T0 + timedelta(minutes=2), other, method="CreateRack"),
        # A DeleteRack names the schedules whose scope it changed (migration 0041, `audit.changes`).
        _event(T0 + timedelta(minutes=3), RACK, SCHEDULE, method="DeleteRack", principal="alice"),
        _event(T0 + timedelta(minutes=4), SCHEDULE, method="PauseTaskSchedule"),
    ]
    await _insert(db, events)
    newest_first = events[::-1]

    pages, said = await _pages(db, EventFilter(target=SCHEDULE), limit=2)
    assert [[e.method for e in page] for page in pages] == [
        ["PauseTaskSchedule", "DeleteRack"],
        ["CreateTaskSchedule"],
    ]
    assert said[0] == Listed(3)
    async with db.read() as conn:
        found, listed = await store.list_events(conn, EventFilter(target=RACK))
        assert [e.id for e in found] == [e.id for e in newest_first if str(RACK) in e.target_ids]
        assert listed == Listed(2)
        by_alice, _ = await store.list_events(conn, EventFilter(principal="alice", target=SCHEDULE))
        assert [e.method for e in by_alice] == ["DeleteRack"]
        later, _ = await store.list_events(conn, EventFilter(since=T0 + timedelta(minutes=1), target=RACK))
        assert [e.method for e in later] == ["DeleteRack"]
        assert await store.list_events(conn, EventFilter(target=uuid.uuid4())) == ([], Listed(0))


@pytest.mark.parametrize("sorted_at_most", [0, 2_000])
async def test_matches_far_apart_in_time_are_all_found_in_order(
    db: Database, monkeypatch: pytest.MonkeyPatch, sorted_at_most: int
) -> None:
    """PostgreSQL reads a page of a target with many events from a window of the newest events that widens
    until it holds the page, and of one with few all its matches, sorted (`store.audit._newest_matches`):
    either way, matches a year apart, among others, come page by page, in order, each once, as do pages
    after an offset."""
    monkeypatch.setattr(store, "TARGET_SORTED_AT_MOST", sorted_at_most)
    ages = [timedelta(days=d) for d in (0, 0.5, 2, 9, 40, 200, 365)]
    events = [_event(T0 - age, RACK if i % 2 == 0 else SCHEDULE) for i, age in enumerate(ages)]
    await _insert(db, events)

    pages, _ = await _pages(db, EventFilter(target=RACK), limit=2)

    assert [[e.id for e in page] for page in pages] == [
        [events[0].id, events[2].id],
        [events[4].id, events[6].id],
        [],
    ]
    async with db.read() as conn:
        found, _ = await store.list_events(conn, EventFilter(target=SCHEDULE), offset=2, limit=2)
    assert [e.id for e in found] == [events[5].id]


async def test_a_page_by_target_on_sqlite_walks_a_bounded_range_and_paging_on_finds_every_match(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite has no index over `target_ids`: a page reads at most SEARCH_WALK events, comes back short (or
    empty) where its walk stopped, and says so; paging on finds every match, each once. PostgreSQL reads the
    matches from its index: full pages, an exact count."""
    monkeypatch.setattr(paging, "SEARCH_WALK", 4)
    events = [_event(T0 + timedelta(minutes=i), *([RACK] if i in (0, 1, 9) else [])) for i in range(12)]
    await _insert(db, events)

    pages, said = await _pages(db, EventFilter(target=RACK), limit=3)

    matches = [e.id for e in events[::-1] if e.target_ids]
    assert [e.id for page in pages for e in page] == matches
    if db.is_postgres:
        assert said == [Listed(3), Listed(3)]
    else:  # newest first: 11-8 (9), 7-4 (none), 3-0 (1, 0)
        assert [len(page) for page in pages] == [1, 0, 2]
        assert [s.searched_to for s in said] == [(e.at, e.id) for e in (events[8], events[4])] + [None]
        assert {(s.total, s.count_bounded) for s in said} == {(1, True)}


async def test_the_targets_page_reads_an_index(db: Database) -> None:
    """PostgreSQL: the GIN index of each partition, never a scan of the trail, nor a walk of (at, id)
    filtering every event, which its planner picks for an id its statistics see often (here one event in
    fifty). SQLite: its walk reads the trail's (at, id) index newest first, never a sort.

    On PostgreSQL the trail is vacuumed first, as autovacuum leaves it: just inserted, the GIN index's
    entries wait in its pending list, whose pages its planner counts as read by every search; then a scan
    of 10,000 events cost about as much (310 against 319), and the suite once saw the scan chosen.

    The events are the first 10,000 seconds of this week's partition: spread back from the time the test
    ran, early on a Monday (UTC) they straddled two weeks, and the new week's few events (its partition's
    estimate 11 rows) were rightly read by a scan, which the check below counts as a scan of the trail."""
    week = period_start(datetime.now(UTC))
    racks = [uuid.uuid4() for _ in range(50)]
    await _insert(db, [_event(week + timedelta(seconds=i), racks[i % 50]) for i in range(10_000)])
    async with db.engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.exec_driver_sql("VACUUM ANALYZE audit_events" if db.is_postgres else "ANALYZE")

    with statements_sent(db) as sent:
        async with db.read() as conn:
            found, _ = await store.list_events(conn, EventFilter(target=racks[7]), limit=50)
    assert len(found) == 50
    ((statement, parameters),) = [(s, p) for s, p in sent if "ORDER BY" in s and "target_ids" in s]
    plan = await explain(db, statement, parameters)
    if db.is_postgres:
        # each partition's GIN index, named by the partitioned one (`query_plans.by_parent_index`)
        assert "ix_audit_events_target_ids" in plan and "at_id" not in plan, plan
        assert not re.search(r"Seq Scan on audit_events_(default|legacy|p\d+) .*rows=[1-9]\d", plan), plan
    else:
        assert "ix_audit_events_at_id" in plan and "USE TEMP B-TREE" not in plan, plan
