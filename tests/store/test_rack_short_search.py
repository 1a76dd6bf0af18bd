"""A rack or NVLink-domain name search of one or two characters (`domain.inventory.short_search`: no
trigram, so no index answers it) walks at most SEARCH_WALK rows per page and says where it stopped
(`store.paging.walked`), as the schedules' does, so a rare text costs a bounded walk per page where it read
every name: 0.4-0.8 s a ListRacks page and 0.3-0.4 s a picker's request at 100,000 racks
(docs/PERFORMANCE.md). Walking the pages on, from where each stopped, finds every match once, in the
unpaged list's order, on both databases: ListRacks' (creation order, the whole list or a domain's racks) and
the picker's (`names_holding`: the name typed in full first, then the others by name)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Table, insert, select

from rackflow.domain.inventory import Rack
from rackflow.store import inventory, paging
from rackflow.store.db import Database
from rackflow.store.paging import Key, Listed
from rackflow.store.tables import nvl_domains, racks

WALK = 4
T0 = datetime(2026, 6, 1, tzinfo=UTC)
DOMAIN = uuid.UUID(int=1)
# Twelve racks in creation order (two created at one instant: ties by id); "qx" in the third, the tenth and
# the twelfth (any case): past the first walks. Every other one is in DOMAIN, "QX-j" and "z-qx" among them.
NAMES = ("n-a", "n-b", "QX-j", "n-c", "n-d", "n-e", "n-f", "n-g", "n-h", "qx-k", "n-i", "z-qx")
IN_DOMAIN = {"n-a", "QX-j", "n-d", "n-f", "n-h", "n-i", "z-qx"}


@pytest.fixture
async def names(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The racks, and a domain of the same names (their picker's list); the walk bounded at WALK."""
    monkeypatch.setattr(paging, "SEARCH_WALK", WALK)
    async with db.transaction() as conn:
        await conn.execute(insert(nvl_domains).values(id=DOMAIN, name="domain", created_at=T0))
        await conn.execute(
            insert(racks),
            [
                {
                    "id": uuid.UUID(int=100 + i),  # n-i's below z-qx's, whom it ties with
                    "name": name,
                    "external_id": None,
                    "nvl_domain_id": DOMAIN if name in IN_DOMAIN else None,
                    "created_at": T0 + timedelta(seconds=min(i, 10)),  # n-i and z-qx tie
                }
                for i, name in enumerate(NAMES)
            ],
        )
        await conn.execute(
            insert(nvl_domains),
            [
                {"id": uuid.uuid4(), "name": f"d-{name}", "created_at": T0 + timedelta(seconds=i)}
                for i, name in enumerate(NAMES)
            ],
        )
    return list(NAMES)


async def _page(
    db: Database,
    text: str,
    limit: int | None,
    after: Key | None = None,
    domain: uuid.UUID | None = None,
    offset: int = 0,
) -> tuple[list[Rack], Listed]:
    async with db.read() as conn:
        return await inventory.list_racks(
            conn, nvl_domain_id=domain, offset=offset, limit=limit, after=after, name_contains=text
        )


async def _walk_on(
    db: Database, text: str, limit: int, domain: uuid.UUID | None = None
) -> tuple[list[list[str]], list[Listed]]:
    """Every page's names and what each said, page after page, each from where the last stopped: its last
    row when full, else where its walk stopped (as ListRacks makes its token), until neither."""
    pages: list[list[str]] = []
    said: list[Listed] = []
    after: Key | None = None
    while True:
        found, listed = await _page(db, text, limit, after, domain)
        pages.append([r.name for r in found])
        said.append(listed)
        if len(found) == limit:
            after = (found[-1].created_at, found[-1].id)
        elif listed.searched_to is not None:
            after = listed.searched_to
        else:
            return pages, said
        assert len(pages) <= len(NAMES), "the walk does not advance"


@pytest.mark.parametrize("domain", [None, DOMAIN], ids=["every-rack", "a-domain"])
@pytest.mark.parametrize("limit", [1, 2, 50])
async def test_the_pages_find_every_match_once_in_order(
    db: Database, names: list[str], limit: int, domain: uuid.UUID | None
) -> None:
    everything, unbounded = await _page(db, "qx", None, domain=domain)  # no limit asked: no bound
    expected = [n for n in ("QX-j", "qx-k", "z-qx") if domain is None or n in IN_DOMAIN]
    assert [r.name for r in everything] == expected and unbounded == Listed(len(expected))
    pages, _ = await _walk_on(db, "qx", limit, domain)
    assert [name for page in pages for name in page] == expected
    assert all(len(page) <= limit for page in pages)


async def test_a_rare_text_past_the_first_walk_is_found_on_a_later_page(
    db: Database, names: list[str]
) -> None:
    """The first page walks n-a … n-c and finds QX-j; the second walks n-d … n-g and finds nothing, yet
    says where it stopped; the third finds qx-k and z-qx and says that the list ends there (no empty page
    after it). The count is of the first walk's matches, page after page, and says there are more."""
    pages, said = await _walk_on(db, "qx", 50)
    assert pages == [["QX-j"], [], ["qx-k", "z-qx"]]
    assert [(s.total, s.count_bounded) for s in said] == [(1, True)] * 3
    everything, _ = await _page(db, "", None)
    assert said[0].searched_to == (everything[WALK - 1].created_at, everything[WALK - 1].id)  # n-c
    assert said[1].searched_to == (everything[2 * WALK - 1].created_at, everything[2 * WALK - 1].id)
    assert said[2].searched_to is None


async def test_a_domain_s_racks_are_walked_alone(db: Database, names: list[str]) -> None:
    """A domain's racks are a range of their own index: the walk counts the domain's racks, not the list's
    (its first walk is n-a, QX-j, n-d, n-f)."""
    pages, said = await _walk_on(db, "qx", 50, DOMAIN)
    assert pages == [["QX-j"], ["z-qx"]]
    assert [(s.total, s.count_bounded) for s in said] == [(1, True)] * 2


async def test_a_longer_text_an_offset_or_the_list_s_end_is_not_bounded(
    db: Database, names: list[str]
) -> None:
    found, listed = await _page(db, "-QX", 50)  # three characters: the trigram index's to answer
    assert [r.name for r in found] == ["z-qx"] and listed == Listed(1)
    everything, _ = await _page(db, "", None)
    tenth = (everything[9].created_at, everything[9].id)
    found, listed = await _page(db, "-", 50, after=tenth)  # two racks left, fewer than WALK
    assert [r.name for r in found] == ["n-i", "z-qx"] and listed.searched_to is None
    found, listed = await _page(db, "N-", 2, offset=1)  # an offset skips within the walk
    assert [r.name for r in found] == ["n-b", "n-c"] and listed.searched_to is not None


async def _names_on(db: Database, table: Table, text: str, limit: int) -> list[list[str]]:
    """The picker's pages of names, each asked after the name the page before said, until none."""
    pages: list[list[str]] = []
    after: str | None = None
    while True:
        async with db.read() as conn:
            found, after = await inventory.names_holding(conn, table, text, limit, after)
        pages.append(found)
        if after is None:
            return pages
        assert len(pages) <= len(NAMES), "the walk does not advance"


@pytest.mark.parametrize("limit", [2, 3, 20])
@pytest.mark.parametrize(("table", "prefix"), [(racks, ""), (nvl_domains, "d-")])
async def test_the_picker_s_pages_find_every_name_once_in_name_order(
    db: Database, names: list[str], table: Table, prefix: str, limit: int
) -> None:
    """By name: n-a n-b n-c n-d | n-e n-f n-g n-h | n-i qx-k QX-j z-qx, or as the database's collation
    orders them; the picker's pages of "QX" are every name holding it once, in the names' order."""
    holding = [f"{prefix}{n}" for n in ("QX-j", "qx-k", "z-qx")]
    pages = await _names_on(db, table, "QX", limit)
    found = [name for page in pages for name in page]
    assert sorted(found) == sorted(holding) and len(found) == len(holding)
    async with db.read() as conn:  # the names' order, as the database's collation has it
        everything = (await conn.execute(select(table.c.name).order_by(table.c.name))).scalars().all()
    assert found == [name for name in everything if name in holding]
    assert all(len(page) <= limit for page in pages) and [] in pages  # a walk that found none went on


async def test_the_picker_offers_a_short_name_typed_in_full_first_and_once(
    db: Database, names: list[str]
) -> None:
    """A name of one or two characters is found by its unique index, wherever the walk is, on the first
    page only; later pages leave it out."""
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=uuid.uuid4(), name="qx", created_at=T0))
    pages = await _names_on(db, racks, "qx", 20)
    assert pages[0][0] == "qx" and [name for page in pages for name in page].count("qx") == 1
    assert sorted(name for page in pages for name in page) == sorted(["qx", "QX-j", "qx-k", "z-qx"])
