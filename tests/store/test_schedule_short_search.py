"""A schedule name search of one or two characters (`domain.inventory.short_search`: no trigram, so no
index answers it) walks at most SEARCH_WALK schedules per page in the list's order and says where it
stopped (`store.paging.walked`), so a rare text costs a bounded walk per page, not a read of every name
(docs/PERFORMANCE.md, issue 29). Walking the pages on, from where each stopped, finds every match once, in
the unpaged list's order, in every order and on both databases; the count covers the first walk only and
says so."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from rackflow.domain.schedules import Schedule, ScheduleOrder
from rackflow.store import paging
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.paging import Key, Listed
from rackflow.store.tables import task_schedule
from tests.store.schedules_support import START, make_env

WALK = 4
# Twelve schedules in creation order; "qx" only in the tenth and the twelfth: past the first walks.
NAMES = ("n-a", "n-b", "QX-j", "n-c", "n-d", "n-e", "n-f", "n-g", "n-h", "qx-k", "n-i", "z-qx")
ORDERS = [
    ScheduleOrder(field, descending)
    for field in ("created_at", "name", "next_run_at", "last_run_at")
    for descending in (False, True)
]


@pytest.fixture
async def names(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The schedules, with ties and NULLs among their next and last runs; the walk bounded at WALK."""
    monkeypatch.setattr(paging, "SEARCH_WALK", WALK)
    env = make_env(db)
    rack = await env.rack("r1")
    for i, name in enumerate(NAMES):
        created = await env.schedule(name, racks=[rack])
        env.clock.advance(timedelta(seconds=1))
        at = None if i % 4 == 1 else START + timedelta(hours=i % 3)
        async with db.transaction() as conn:
            await conn.execute(
                update(task_schedule)
                .where(task_schedule.c.id == created.id)
                .values(next_run_at=at, last_run_at=at)
            )
    return list(NAMES)


async def _page(
    db: Database, text: str, order: ScheduleOrder, limit: int | None, after: Key | None = None
) -> tuple[list[Schedule], Listed]:
    found: list[Schedule] = []
    async with db.read(in_transaction=True) as conn:
        listed = await store.each_schedule_chunk(
            conn, found.extend, name_contains=text, order=order, limit=limit, after=after
        )
    return found, listed


async def _walk_on(db: Database, text: str, order: ScheduleOrder, limit: int) -> list[list[str]]:
    """Every page's names, page after page, each from where the last stopped: its last row when full, else
    where its walk stopped (as ListTaskSchedules makes its token), until neither."""
    pages: list[list[str]] = []
    after: Key | None = None
    while True:
        found, listed = await _page(db, text, order, limit, after)
        pages.append([s.name for s in found])
        if len(found) == limit:
            after = order.key_of(found[-1])
        elif listed.searched_to is not None:
            after = listed.searched_to
        else:
            return pages
        assert len(pages) <= len(NAMES), "the walk does not advance"


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: o.name)
@pytest.mark.parametrize("limit", [1, 2, 50])
async def test_the_pages_find_every_match_once_in_order(
    db: Database, names: list[str], order: ScheduleOrder, limit: int
) -> None:
    everything, unbounded = await _page(db, "qx", order, None)  # no limit asked: no bound
    assert sorted(s.name for s in everything) == ["QX-j", "qx-k", "z-qx"] and unbounded == Listed(3)
    pages = await _walk_on(db, "qx", order, limit)
    assert [name for page in pages for name in page] == [s.name for s in everything]
    assert all(len(page) <= limit for page in pages)


async def test_a_rare_text_past_the_first_walk_is_found_on_a_later_page(
    db: Database, names: list[str]
) -> None:
    """By creation time: the first page walks n-a … n-c and finds QX-j; the second walks n-d … n-g and
    finds nothing, yet says where it stopped; the third finds qx-k and z-qx and says that the list ends
    there (no empty page after it)."""
    order = ScheduleOrder()
    assert await _walk_on(db, "qx", order, 50) == [["QX-j"], [], ["qx-k", "z-qx"]]
    first, listed = await _page(db, "qx", order, 50)
    assert [s.name for s in first] == ["QX-j"]
    assert listed.total == 1 and listed.count_bounded  # one match among the first WALK, more to search
    everything, _ = await _page(db, "", order, None)
    assert listed.searched_to == order.key_of(everything[WALK - 1])  # n-c, the walk's last
    _, last = await _page(db, "qx", order, 50, after=listed.searched_to)
    assert last.total == 1 and last.count_bounded  # the count is of the list's first walk, page after page


async def test_a_longer_text_or_the_list_s_end_is_not_bounded(db: Database, names: list[str]) -> None:
    order = ScheduleOrder()
    found, listed = await _page(db, "-QX", order, 50)  # three characters: the trigram index's to answer
    assert [s.name for s in found] == ["z-qx"] and listed == Listed(1)
    everything, _ = await _page(db, "", order, None)
    tenth = order.key_of(everything[9])
    found, listed = await _page(db, "-", order, 50, after=tenth)  # two schedules left, fewer than WALK
    assert [s.name for s in found] == ["n-i", "z-qx"] and listed.searched_to is None
