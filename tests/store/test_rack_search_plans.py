"""The rack and NVLink-domain name searches (ListRacks' `name_contains`, `rackflow rack list --name-contains`,
the schedule form's picker `/names/{racks|nvl_domains}`) read the names' trigram indexes on PostgreSQL
(migration 0056), where they read every name when few matched: 0.1-0.3 s a search at 100,000 racks
(docs/PERFORMANCE.md, "The schedule form's racks"). These tests EXPLAIN the statements the store really
sends (ListRacks' capped count and page; the picker's names) over 20,000 racks, each in its own domain, with
fresh statistics, as PostgreSQL plans each run with its values (rackflow's `force_custom_plan`).

A text of one or two characters holds no trigram: the index could only be read whole, so its condition is
spelled so that no plan can read it (`store.dialect.name_holds`), and such a search reads names as it did.
The answers are the same through the index: ILIKE's case folding, and `%` and `_` taken literally. SQLite
has no trigram index and keeps its scan; its answers are checked by the list's own tests (tests/web,
tests/api)."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Table, insert

from rackflow.config import LIST_COUNT_CAP, SEARCH_WALK
from rackflow.store import inventory, paging
from rackflow.store.db import Database
from rackflow.store.paging import Listed
from rackflow.store.tables import nvl_domains, racks
from tests.built_once import built_once
from tests.conftest import postgres_admin_url
from tests.e2e.cluster import sql
from tests.store.query_plans import explain, plan_with_one_index, statements_sent

pytestmark = pytest.mark.postgres

RACKS = 20_000
RACK_INDEX = "ix_racks_name_trgm"
DOMAIN_INDEX = "ix_nvl_domains_name_trgm"
T0 = datetime(2026, 6, 1, tzinfo=UTC)
ODD_NAME = "gb200-50%_off"  # `%` and `_` in a name, which a search must take literally
PICKED = 20  # the picker's names a request (web.pages.schedules.PICKED_NAMES)


def _rack(i: int) -> str:
    return f"gb200-r{i:05d}"  # as docs/PERFORMANCE.md's fleet names them


def _domain(i: int) -> str:
    return f"nvl-{i:05d}"


RACK_NAMES = [*map(_rack, range(RACKS)), ODD_NAME]
DOMAIN_NAMES = list(map(_domain, range(RACKS)))


def _holding(names: list[str], text: str) -> list[str]:
    return [name for name in names if text.lower() in name.lower()]


async def _write(url: str) -> None:
    db = Database(url)
    try:
        domain_ids = [uuid.uuid4() for _ in DOMAIN_NAMES]
        async with db.transaction() as conn:
            await conn.execute(
                insert(nvl_domains),
                [
                    {"id": domain_id, "name": name, "created_at": T0 + timedelta(seconds=i)}
                    for i, (domain_id, name) in enumerate(zip(domain_ids, DOMAIN_NAMES, strict=True))
                ],
            )
            await conn.execute(
                insert(racks),
                [
                    {
                        "id": uuid.uuid4(),
                        "name": name,
                        "external_id": None,
                        "nvl_domain_id": domain_ids[i] if i < RACKS else None,
                        "created_at": T0 + timedelta(seconds=i),
                    }
                    for i, name in enumerate(RACK_NAMES)
                ],
            )
    finally:
        await db.dispose()
    # Statistics, and the rows moved from the indexes' pending lists into their trees, as autovacuum leaves
    # them (a full pending list is read by every search).
    sql(url, "VACUUM ANALYZE racks")
    sql(url, "VACUUM ANALYZE nvl_domains")


def _written(url: str) -> str:
    asyncio.run(_write(url))
    return url


@pytest.fixture(scope="module")
def racks_url(pg_template: str) -> str:
    """A migrated database of its own holding the racks and domains, written once for every worker of the
    run: the module's tests only read."""
    return built_once(postgres_admin_url(), pg_template, "rack_search_plans", _written)


@pytest.fixture
async def db(racks_url: str) -> AsyncIterator[Database]:
    database = Database(racks_url)
    yield database
    await database.dispose()


async def _list(db: Database, text: str) -> tuple[list[str], Listed, list[str]]:
    """ListRacks' first page of 20 (without components): its names, what it says besides (its total), the
    plan of each statement it sent."""
    names, listed, sent = await _listed(db, text)
    return names, listed, [await explain(db, *one) for one in sent]


async def _listed(db: Database, text: str) -> tuple[list[str], Listed, list[tuple[str, Any]]]:
    """ListRacks' first page of 20 (without components), and the statements it sent."""
    with statements_sent(db) as sent:
        async with db.read() as conn:
            page, listed = await inventory.list_racks(
                conn, nvl_domain_id=None, offset=0, limit=20, name_contains=text, with_components=False
            )
    return [r.name for r in page], listed, sent


async def _picked(db: Database, table: Table, text: str) -> tuple[list[str], tuple[str, Any]]:
    """The picker's names, and its search (its last statement, after the one of the exact name and, for a
    text of one or two characters, the walk's end) with its parameters."""
    names, _, sent = await _picked_sent(db, table, text)
    assert len(sent) == (3 if len(text) < 3 else 2), [s for s, _ in sent]
    return names, sent[-1]


async def _picked_sent(
    db: Database, table: Table, text: str
) -> tuple[list[str], str | None, list[tuple[str, Any]]]:
    """The picker's names, where its next page goes on after, and the statements it sent."""
    with statements_sent(db) as sent:
        async with db.read() as conn:
            names, after = await inventory.names_holding(conn, table, text, PICKED)
    return names, after, sent


def _seq_scan(table: str) -> re.Pattern[str]:
    return re.compile(rf"Seq Scan on {table}\b")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("r19999", [_rack(19999)]),
        ("GB200-R1234", [_rack(i) for i in range(12340, 12350)]),  # ILIKE folds case
        ("50%_o", [ODD_NAME]),  # `%` and `_` literal: as a pattern, it would match every rack
        ("nothing-like-it", []),
    ],
)
async def test_a_few_racks_are_listed_from_the_trigram_index(
    db: Database, text: str, names: list[str]
) -> None:
    found, listed, plans = await _list(db, text)
    assert found == names
    assert listed == Listed(len(names))
    assert len(plans) == 2  # the count, then the page
    for plan in plans:
        assert RACK_INDEX in plan, plan
        assert not _seq_scan("racks").search(plan), plan


@pytest.mark.parametrize(
    ("table", "index", "names", "text"),
    [
        (racks, RACK_INDEX, RACK_NAMES, "r19999"),
        (racks, RACK_INDEX, RACK_NAMES, "R1999"),
        (racks, RACK_INDEX, RACK_NAMES, "zzz"),
        (nvl_domains, DOMAIN_INDEX, DOMAIN_NAMES, "l-1999"),
        (nvl_domains, DOMAIN_INDEX, DOMAIN_NAMES, "zzz"),
    ],
)
async def test_the_picker_finds_a_few_names_from_the_trigram_index(
    db: Database, table: Table, index: str, names: list[str], text: str
) -> None:
    found, search = await _picked(db, table, text)
    assert found == sorted(_holding(names, text))[:PICKED]
    plan = await explain(db, *search)
    assert index in plan, plan
    assert not _seq_scan(table.name).search(plan), plan


async def test_many_matches_are_listed_as_before(db: Database) -> None:
    """A text most names hold: what the index finds is most of the table, and PostgreSQL may as well walk
    the list's order (or the names') and stop at its page; the answers are the same either way."""
    found, listed, _ = await _list(db, "gb200-r1")
    assert found == _holding(RACK_NAMES, "gb200-r1")[:20]
    assert listed == Listed(min(len(_holding(RACK_NAMES, "gb200-r1")), LIST_COUNT_CAP + 1))
    picked, _ = await _picked(db, racks, "GB200-R1")
    assert picked == sorted(_holding(RACK_NAMES, "gb200-r1"))[:PICKED]


@pytest.mark.parametrize(("table", "index"), [(racks, RACK_INDEX), (nvl_domains, DOMAIN_INDEX)])
@pytest.mark.parametrize("text", ["r1", "7", "ZZ"])
async def test_no_plan_of_a_shorter_text_can_read_the_trigram_index(
    db: Database, table: Table, index: str, text: str
) -> None:
    """Such a text holds no trigram: the index could only be read whole, every entry of it. Its condition
    is one the index cannot answer: with the table's other indexes dropped and its scan forbidden, a plan
    that could read the trigram index would; this one scans the table. The answers are those of the
    first SEARCH_WALK names (a bounded walk: below)."""
    found, search = await _picked(db, table, text)
    names = RACK_NAMES if table is racks else DOMAIN_NAMES
    assert found == _holding(sorted(names)[:SEARCH_WALK], text)[:PICKED]
    plan = await plan_with_one_index(db, *search, table.name, index)
    assert index not in plan, plan
    assert _seq_scan(table.name).search(plan), plan


# What an EXPLAIN ANALYZE says a scan of a table read: the rows it returned, and those its filter removed.
_SCANNED = re.compile(r"Scan(?: Backward)? (?:using \S+ )?on (\w+).*actual time=\S+ rows=(\d+) loops=(\d+)")
_REMOVED = re.compile(r"Rows Removed by (?:Filter|Index Recheck): (\d+)")


async def _rows_read(db: Database, statement: str, parameters: Any, table: str) -> list[int]:
    """How many rows each scan of `table` read (returned and filtered out) when PostgreSQL ran
    `statement` (EXPLAIN ANALYZE, in a transaction rolled back)."""
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        try:
            lines = [row[0] for row in await conn.exec_driver_sql("EXPLAIN ANALYZE " + statement, parameters)]
        finally:
            await transaction.rollback()
    read: list[int] = []
    for line in lines:
        if (scan := _SCANNED.search(line)) and scan.group(1) == table:
            read.append(int(scan.group(2)) * int(scan.group(3)))
        elif (removed := _REMOVED.search(line)) and read:
            read[-1] += int(removed.group(1))
    return read


WALK = 1_000  # SEARCH_WALK in these tests: a twentieth of the racks


@pytest.mark.parametrize("text", ["r1", "7", "ZZ"])
async def test_a_shorter_text_lists_racks_from_a_bounded_walk(
    db: Database, text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No trigram to look up, and a rare text made ListRacks read every name for its count and again for
    its page (0.4-0.8 s at 100,000 racks). A page walks SEARCH_WALK racks in the list's order: the walk's
    end found in the creation index, then the count and the page both bounded by it, each statement
    reading at most SEARCH_WALK + 1 rows of the index and of the table, none the table whole. The page
    holds the walked racks' matches and, when short, says where the walk stopped; the count is theirs,
    and says that there are more to search."""
    monkeypatch.setattr(paging, "SEARCH_WALK", WALK)
    walked = RACK_NAMES[:WALK]  # in creation order
    found, listed, sent = await _listed(db, text)
    assert found == _holding(walked, text)[:20]
    assert listed.total == len(_holding(walked, text)) and listed.count_bounded
    if len(found) < 20:
        assert listed.searched_to is not None and listed.searched_to[0] == T0 + timedelta(seconds=WALK - 1)
    assert len(sent) == 3  # the walk's end, the count, the page
    for one in sent:
        plan = await explain(db, *one)
        assert "ix_racks_created_at_id" in plan and RACK_INDEX not in plan, plan
        assert not _seq_scan("racks").search(plan), plan
        read = await _rows_read(db, *one, "racks")
        assert read and max(read) <= WALK + 1, (read, plan)


@pytest.mark.parametrize(("table", "names"), [(racks, RACK_NAMES), (nvl_domains, DOMAIN_NAMES)])
@pytest.mark.parametrize("text", ["r1", "7", "ZZ"])
async def test_a_shorter_text_picks_names_from_a_bounded_walk(
    db: Database, table: Table, names: list[str], text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The picker's search of such a text read every name when few held it: it walks SEARCH_WALK names
    along the names' unique index, its end found there first, and keeps those that hold the text, no
    statement reading more than SEARCH_WALK + 1 rows; a page short of the picker's 20 names where its walk
    stopped, the next page's `after`."""
    monkeypatch.setattr(paging, "SEARCH_WALK", WALK)
    walked = sorted(names)[:WALK]
    found, after, sent = await _picked_sent(db, table, text)
    assert found == _holding(walked, text)[:PICKED]
    assert after == (found[-1] if len(found) == PICKED else walked[-1])
    assert len(sent) == 3  # the name itself, the walk's end, the page
    for one in sent:
        plan = await explain(db, *one)
        assert f"uq_{table.name}_name" in plan and not _seq_scan(table.name).search(plan), plan
        read = await _rows_read(db, *one, table.name)
        assert read and max(read) <= WALK + 1, (read, plan)
