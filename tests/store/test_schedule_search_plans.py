"""The schedule name search (`name_contains`: ListTaskSchedules, the dashboard's `/schedules?search=`) reads
the names' trigram index on PostgreSQL (migration 0027), where it read every name: 3 s at a million
schedules (docs/PERFORMANCE.md, "Sorted by next or last run, and the name search"). These tests EXPLAIN the
two statements the list really sends (the capped count and the page) over 20,000 schedules with fresh
statistics, as PostgreSQL plans each run with its values (rackflow's `force_custom_plan`).

A text of one or two characters holds no trigram: the index could only be read whole, so a page of such a
search walks a bounded range of the list's index instead (`config.SEARCH_WALK`). The answers are
the same through the index: ILIKE's case folding, and `%` and `_` taken literally. SQLite has no trigram
index and keeps its scan; its answers are checked by the list's own tests (tests/web, tests/api)."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, insert, select

from rackflow.config import LIST_COUNT_CAP
from rackflow.domain.schedules import Schedule
from rackflow.store import paging
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.dialect import name_holds
from rackflow.store.paging import Listed
from rackflow.store.tables import task_schedule
from tests.built_once import built_once
from tests.conftest import postgres_admin_url
from tests.e2e.cluster import sql
from tests.store.query_plans import explain, plan_with_one_index, statement_sent, statements_sent

pytestmark = pytest.mark.postgres

TRIGRAM_INDEX = "ix_task_schedule_name_trgm"
SCHEDULES = 20_000
SEQ_SCAN = re.compile(r"Seq Scan on task_schedule\b")
T0 = datetime(2026, 6, 1, tzinfo=UTC)
ODD_NAME = "weekly-50%_off"  # `%` and `_` in a name, which a search must take literally


def _name(i: int) -> str:
    return f"scale-s{i:07d}"  # as bench/scale.py names them


NAMES = [*map(_name, range(SCHEDULES)), ODD_NAME]


def _count(text: str) -> int:
    """How many names hold `text`, whatever its case, counted as the list counts: up to the cap, plus one."""
    return min(sum(text.lower() in name.lower() for name in NAMES), LIST_COUNT_CAP + 1)


async def _write(url: str) -> None:
    db = Database(url)
    try:
        rows = [
            {
                "id": uuid.uuid4(),
                "name": name,
                "spec_type": "interval",
                "spec": "24h",
                "operation_template": {"operation": {"kind": "power_on"}, "queue_timeout_seconds": 3600},
                "created_at": T0 + timedelta(seconds=i),
                "updated_at": T0,
            }
            for i, name in enumerate(NAMES)
        ]
        async with db.transaction() as conn:
            await conn.execute(insert(task_schedule), rows)
    finally:
        await db.dispose()
    # Statistics, and the rows moved from the index's pending list into its tree, as autovacuum leaves
    # them (a full pending list is read by every search, and made PostgreSQL scan 20,000 names instead).
    sql(url, "VACUUM ANALYZE task_schedule")


def _written(url: str) -> str:
    asyncio.run(_write(url))
    return url


@pytest.fixture(scope="module")
def schedules_url(pg_template: str) -> str:
    """A migrated database of its own holding the schedules, written once for every worker of the run: the
    module's tests only read."""
    return built_once(postgres_admin_url(), pg_template, "schedule_search_plans", _written)


@pytest.fixture
async def db(schedules_url: str) -> AsyncIterator[Database]:
    database = Database(schedules_url)
    yield database
    await database.dispose()


async def _search(db: Database, text: str) -> tuple[list[str], Listed, list[str]]:
    """The first page's names, what the list said besides, and the plan of each statement it sent."""
    found: list[Schedule] = []
    with statements_sent(db) as sent:
        async with db.read(in_transaction=True) as conn:
            listed = await store.each_schedule_chunk(conn, found.extend, name_contains=text, limit=50)
    return [s.name for s in found], listed, [await explain(db, *one) for one in sent]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("s00012", [_name(i) for i in range(1200, 1250)]),  # 100 match; the first page
        ("S0001234", [_name(1234)]),  # ILIKE folds case
        ("50%_o", [ODD_NAME]),  # `%` and `_` literal: as a pattern, it would match no other name either
        ("nothing-like-it", []),
    ],
)
async def test_a_text_of_three_characters_or_more_reads_the_trigram_index(
    db: Database, text: str, names: list[str]
) -> None:
    found, listed, plans = await _search(db, text)
    assert found == names
    assert listed == Listed(_count(text))
    assert len(plans) == 2  # the count, then the page
    for plan in plans:
        assert TRIGRAM_INDEX in plan, plan
        assert not SEQ_SCAN.search(plan), plan


@pytest.mark.parametrize("text", ["s0", "7", "zz"])
async def test_no_plan_of_a_shorter_text_can_read_the_trigram_index(db: Database, text: str) -> None:
    """Such a text's condition is one the trigram index cannot answer, so no statistics make PostgreSQL
    read the whole index for it (at a million schedules it did, beside the walk's range of the creation
    index: 470 ms a count). With the table's other indexes dropped (in a transaction rolled back) and its
    scan forbidden, a plan that could read the trigram index would; this one scans the table."""
    counted = select(func.count()).select_from(task_schedule).where(name_holds(task_schedule.c.name, text))
    statement, parameters = await statement_sent(db, lambda conn: conn.execute(counted))
    plan = await plan_with_one_index(db, statement, parameters, "task_schedule", TRIGRAM_INDEX)
    assert TRIGRAM_INDEX not in plan, plan
    assert SEQ_SCAN.search(plan), plan
    found, _, _ = await _search(db, text)  # still the same names, whatever their case
    assert found == [name for name in NAMES if text.lower() in name.lower()][:50]


@pytest.mark.parametrize("text", ["s0", "7", "zz"])
async def test_a_shorter_text_walks_a_bounded_range(
    db: Database, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No trigram to look up: the index would be read whole, and a rare text made every page read every
    name. The page walks SEARCH_WALK schedules in the list's order (here 1,000 of the 20,000, where a
    range of the creation index is cheaper than a scan, as 10,000 are of a million): the walk's end found
    in the index, then the count and the page both bounded by it, no statement reading the table whole."""
    monkeypatch.setattr(paging, "SEARCH_WALK", 1_000)
    walked = NAMES[:1_000]
    found, listed, plans = await _search(db, text)
    assert found == [name for name in walked if text.lower() in name.lower()][:50]
    assert listed.total == sum(text.lower() in name.lower() for name in walked)
    assert listed.count_bounded
    if len(found) < 50:
        assert listed.searched_to is not None and listed.searched_to[0] == T0 + timedelta(seconds=999)
    assert len(plans) == 3  # the walk's end, the count, the page
    for plan in plans:
        assert TRIGRAM_INDEX not in plan, plan
        assert not SEQ_SCAN.search(plan), plan
        assert "ix_task_schedule_created_at_id" in plan, plan
