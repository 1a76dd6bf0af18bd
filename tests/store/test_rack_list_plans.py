"""The rack list and a domain's racks are read in their order from an index (migration 0032), never by
reading every rack and sorting them: at 20,000 racks PostgreSQL did that for the first page and for every
next one (docs/PERFORMANCE.md, issue 29). This EXPLAINs the statements the store really sends, on both
databases; a small table costs nothing to scan, so full scans and sorts are priced out on PostgreSQL and a
plan takes one only where no index can answer."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store import inventory
from rackflow.store.db import Database
from rackflow.store.paging import Key, Listed
from rackflow.store.tables import nvl_domains, racks
from tests.store.query_plans import statements_sent

T0 = datetime(2026, 6, 1, tzinfo=UTC)
DOMAIN = uuid.UUID(int=1)
# A sort of the rows read (PostgreSQL), or a temporary B-tree built to order them (SQLite).
SORTS = ("Sort", "USE TEMP B-TREE")


async def _racks(db: Database) -> list[uuid.UUID]:
    """Forty racks, every other one in DOMAIN, some created at the same instant (ties broken by id)."""
    ids = [uuid.uuid4() for _ in range(40)]
    async with db.transaction() as conn:
        await conn.execute(insert(nvl_domains).values(id=DOMAIN, name="nvl-1", created_at=T0))
        await conn.execute(
            insert(racks),
            [
                {
                    "id": rack_id,
                    "name": f"r{i:02d}",
                    "external_id": None,
                    "nvl_domain_id": DOMAIN if i % 2 else None,
                    "created_at": T0 + timedelta(minutes=i // 3),
                }
                for i, rack_id in enumerate(ids)
            ],
        )
    return ids


async def _plan(db: Database, statement: str, parameters: object) -> str:
    async with db.transaction() as conn:
        if db.is_postgres:
            await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            await conn.exec_driver_sql("SET LOCAL enable_sort = off")
            rows = (await conn.exec_driver_sql("EXPLAIN " + statement, parameters)).all()
            return "\n".join(str(row[0]) for row in rows)
        rows = (await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement, parameters)).all()
        return "\n".join(str(row[-1]) for row in rows)


async def _page_statement(
    db: Database, read: Callable[[AsyncConnection], Awaitable[object]]
) -> tuple[str, object]:
    """The statement of `read` that takes its racks in order (not the capped count, not the components)."""
    with statements_sent(db) as sent:
        async with db.read() as conn:
            await read(conn)
    ordered = [(s, p) for s, p in sent if "FROM racks" in s and "ORDER BY" in s]
    assert len(ordered) == 1, [s for s, _ in sent]
    return ordered[0]


ALL_RACKS = "ix_racks_created_at_id"
BY_DOMAIN = "ix_racks_nvl_domain_id_created_at_id"


def _page(domain: uuid.UUID | None, after: Key | None) -> Callable[[AsyncConnection], Awaitable[object]]:
    return lambda conn: inventory.list_racks(conn, nvl_domain_id=domain, offset=0, limit=5, after=after)


async def test_every_rack_page_and_a_domains_racks_read_an_index_in_order(db: Database) -> None:
    await _racks(db)
    first, _ = await _first_page(db)
    after = (first[-1].created_at, first[-1].id)
    reads: dict[str, tuple[str, Callable[[AsyncConnection], Awaitable[object]]]] = {
        "first page": (ALL_RACKS, _page(None, None)),
        "next page": (ALL_RACKS, _page(None, after)),
        "a domain's page": (BY_DOMAIN, _page(DOMAIN, None)),
        "a domain's next page": (BY_DOMAIN, _page(DOMAIN, after)),
        "the racks of domains": (BY_DOMAIN, lambda conn: inventory.rack_ids_by_domain(conn, [DOMAIN])),
    }
    for what, (index, read) in reads.items():
        statement, parameters = await _page_statement(db, read)
        plan = await _plan(db, statement, parameters)
        assert index in plan, f"{what}:\n{plan}"
        assert not any(sort in plan for sort in SORTS), f"{what}:\n{plan}"


async def _first_page(db: Database) -> tuple[list[inventory.Rack], Listed]:
    async with db.read() as conn:
        return await inventory.list_racks(conn, nvl_domain_id=None, offset=0, limit=5)


@pytest.mark.parametrize("limit", [5, None])
async def test_the_pages_walk_every_rack_once_in_order(db: Database, limit: int | None) -> None:
    """The order the index serves is the list's: creation time, ties by id, a domain's racks likewise."""
    ids = await _racks(db)
    async with db.read() as conn:
        created = {row.id: (row.created_at, row.id) for row in (await conn.execute(racks.select())).all()}
    for domain in (None, DOMAIN):
        seen: list[uuid.UUID] = []
        after = None
        while True:
            async with db.read() as conn:
                page, listed = await inventory.list_racks(
                    conn, nvl_domain_id=domain, offset=0, limit=limit, after=after
                )
            seen += [rack.id for rack in page]
            if limit is None or len(page) < limit:
                break
            after = (page[-1].created_at, page[-1].id)
        expected = sorted((r for r in ids if domain is None or ids.index(r) % 2), key=created.__getitem__)
        assert seen == expected
        assert listed.total == len(expected)


async def test_a_rack_by_name_is_one_read_of_the_unique_name_index(db: Database) -> None:
    """GetRack by name (the CLI's every rack named on the command line) seeks the name's unique index: the
    rack list read 20 pages to find it at 20,000 racks (issue 29). Its components are read by the rack's
    id from their own index, as a rack's by id are."""
    await _racks(db)
    with statements_sent(db) as sent:
        async with db.read() as conn:
            found = await inventory.get_rack_by_name(conn, "r17")
    assert found is not None and found.name == "r17"
    reads = [(s, p) for s, p in sent if s.lstrip().startswith("SELECT")]
    assert len(reads) == 2, [s for s, _ in sent]
    by_name, by_rack = reads
    assert "FROM racks" in by_name[0] and "FROM components" in by_rack[0], reads
    name_index = "uq_racks_name" if db.is_postgres else "USING INDEX sqlite_autoindex_racks_"
    for what, (statement, parameters), index in (
        ("the rack", by_name, name_index),
        ("its components", by_rack, "ix_components_rack_id"),
    ):
        plan = await _plan(db, statement, parameters)
        assert index in plan, f"{what}:\n{plan}"
        assert not any(scan in plan for scan in ("Seq Scan", "SCAN racks", "SCAN components")), plan
