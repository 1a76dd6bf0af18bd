"""A list's page at any depth: the rows after the last one of the previous page (keyset), and the matching
rows counted up to a cap.

Why: an OFFSET page reads and throws away every row before it, and an exact total reads every matching
row, so both grow with the table (ten million tasks: docs/PERFORMANCE.md, issue 29). A keyset page reads
its own rows from an index in the list's order, and the capped count at most LIST_COUNT_CAP index entries.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, FromClause, Row, Select, Table, func, literal, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.config import LIST_COUNT_CAP, SEARCH_WALK
from rackflow.errors import InvalidArgument
from rackflow.store.types import UTCDateTime

# A keyset position: the values of a list's order columns in its previous page's last row.
Key = Sequence[Any]
PAGE_TOKEN = "pagination.page_token"


@dataclass(frozen=True)
class Listed:
    """What a list says besides its rows: `total`, how many match before paging, counted up to
    LIST_COUNT_CAP + 1 (more: "more than LIST_COUNT_CAP"); and, for a page of a filter no index answers
    (a short name search of schedules, racks or NVLink domains; the audit trail by target on SQLite:
    `walked`) that walked SEARCH_WALK rows before the list's end, `searched_to`, the key of the last row it
    walked: the next page searches on after it (the audit trail sets it too on a page it ended early, its
    bytes full: `rackflow.audit.trail`).
    Such a filter counts only the matches among the list's first SEARCH_WALK rows; `count_bounded` says
    that the list goes on past them, so `total` is a lower bound."""

    total: int
    searched_to: Key | None = None
    count_bounded: bool = False


async def count_capped(
    conn: AsyncConnection, source: FromClause, where: Sequence[ColumnElement[bool]]
) -> int:
    """How many rows of `source` match `where`, counted up to LIST_COUNT_CAP + 1 (more than the cap means
    "more than LIST_COUNT_CAP").

    SELECT count(*) FROM (SELECT 1 FROM source WHERE … LIMIT :cap + 1) AS found
    """
    found = select(literal(1)).select_from(source).where(*where).limit(LIST_COUNT_CAP + 1).subquery("found")
    return int((await conn.execute(select(func.count()).select_from(found))).scalar_one())


async def page_of(
    conn: AsyncConnection,
    table: Table,
    order: Sequence[ColumnElement[Any]],
    where: Sequence[ColumnElement[bool]],
    *,
    after: Key | None,
    offset: int,
    limit: int | None,
    unindexed: Sequence[ColumnElement[bool]] = (),
    columns: Sequence[ColumnElement[Any]] = (),
) -> tuple[Sequence[Row[*tuple[Any, ...]]], Listed]:
    """A page of `table`'s rows matching `where` and `unindexed` (of `columns` alone if given, else every
    column), ascending in `order` after the key `after` (or past `offset` rows), at most `limit` (None:
    all), and what the list says besides (`Listed`: how many match before paging, `count_capped`): a list
    of an inventory (racks, domains) whose order is an index, alone or after the columns of an equality in
    `where` (a domain's racks).

    `unindexed`: conditions no index answers (a name search of one or two characters,
    `dialect.name_holds`). A page with a limit then walks at most SEARCH_WALK rows of `where` after `after`
    and keeps those that match them (`walked`), so that it costs the same bounded walk, found or not,
    where a rare text read every row; it may come back short or empty before the list's end. A request
    without a limit asked for every match: it is not bounded."""
    walk = NOT_WALKED
    if unindexed and limit is not None:
        walk = await walked(conn, keys_in_order(order, where), after)
    counted = [*where, *unindexed, *walk.counted(order)]
    total = await count_capped(conn, table, counted)
    stmt = (
        (select(*columns) if columns else select(table))
        .where(*where, *unindexed, *after_key(order, after, descending=False), *walk.bounded(order))
        .order_by(*order)
        .offset(offset)
    )
    if limit is not None:
        stmt = stmt.limit(limit)
    return (await conn.execute(stmt)).all(), walk.listed(total)


# The key columns of a list's rows in its order after a key (None: from its start), past `offset` rows, at
# most `limit`: one range of the list's index (`walk_end`).
KeysAfter = Callable[[Key | None, int, int], Select[Any]]


def keys_in_order(
    order: Sequence[ColumnElement[Any]],
    where: Sequence[ColumnElement[bool]] = (),
    *,
    descending: bool = False,
) -> KeysAfter:
    """`KeysAfter` of the rows matching `where` in the order of `order`'s columns (all ascending, or all
    descending), the list's key: a range of the index on those columns (or on the columns of an equality
    in `where`, then those)."""

    def keys_after(after: Key | None, offset: int, limit: int) -> Select[Any]:
        in_order = (column.desc() if descending else column.asc() for column in order)
        return (
            select(*order)
            .where(*where, *after_key(order, after, descending=descending))
            .order_by(*in_order)
            .offset(offset)
            .limit(limit)
        )

    return keys_after


async def walk_end(conn: AsyncConnection, keys_after: KeysAfter, after: Key | None) -> Key | None:
    """The key of the SEARCH_WALK-th row after `after` in a list (`keys_after`'s), or None when the list
    ends there or before: a page of a filter no index answers reads up to there, an index range (about
    SEARCH_WALK index entries read to find it), and the next page searches on after it. The row after it
    is read too, so that a walk ending with the list says so, and no empty page follows it."""
    rows = (await conn.execute(keys_after(after, SEARCH_WALK - 1, 2))).all()
    return tuple(rows[0]) if len(rows) == 2 else None


@dataclass(frozen=True)
class Walk:
    """Where a page's bounded walk ends (`to`: its last row's key; None, with the list) and where the
    list's first walk ends (`counted_to`), which its count stops at, so that `total` stays put page after
    page: the matches among the list's first SEARCH_WALK rows, a lower bound when the list goes on."""

    to: Key | None
    counted_to: Key | None

    def bounded(
        self, order: Sequence[ColumnElement[Any]], *, descending: bool = False
    ) -> list[ColumnElement[bool]]:
        """The page's rows: up to its walk's end in the order of `order`'s columns (`up_to_key`)."""
        return [] if self.to is None else up_to_key(order, self.to, descending=descending)

    def counted(
        self, order: Sequence[ColumnElement[Any]], *, descending: bool = False
    ) -> list[ColumnElement[bool]]:
        """The rows the count counts: up to the first walk's end in the order of `order`'s columns."""
        return [] if self.counted_to is None else up_to_key(order, self.counted_to, descending=descending)

    def listed(self, total: int) -> Listed:
        return Listed(total, self.to, count_bounded=self.counted_to is not None)


NOT_WALKED = Walk(None, None)  # a page an index answers: neither bounded nor its count


async def walked(conn: AsyncConnection, keys_after: KeysAfter, after: Key | None) -> Walk:
    """The ends of the page's walk after `after` and of the list's first walk (`walk_end`, `Walk`): a
    later page finds the first walk's end again (one more index range), so its count stays the first's."""
    to = await walk_end(conn, keys_after, after)
    return Walk(to, to if after is None else await walk_end(conn, keys_after, None))


def after_key(
    columns: Sequence[ColumnElement[Any]], key: Key | None, *, descending: bool
) -> list[ColumnElement[bool]]:
    """The condition for the rows after `key` in the order of `columns` (all ascending, or all descending):
    one row comparison, which both databases answer by seeking an index on those columns. None: no
    condition (the first page)."""
    if key is None:
        return []
    row, values = _row_and_values(columns, key)
    return [row < values if descending else row > values]


def up_to_key(
    columns: Sequence[ColumnElement[Any]], key: Key, *, descending: bool
) -> list[ColumnElement[bool]]:
    """The condition for the rows up to `key` (itself included) in the order of `columns`: `after_key`'s
    complement, the same one-index range from the other end (a bounded walk's end)."""
    row, values = _row_and_values(columns, key)
    return [row >= values if descending else row <= values]


def _row_and_values(
    columns: Sequence[ColumnElement[Any]], key: Key
) -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    check_key(columns, key)
    values = tuple_(*(literal(value, column.type) for column, value in zip(columns, key, strict=True)))
    return tuple_(*columns), values


def check_key(columns: Sequence[ColumnElement[Any]], key: Key) -> None:
    """A key fits `columns`: as many values, each of its column's type (an aware time for a time), or
    None. A page token is the client's to send back, and may come back edited: a key that does not fit
    is refused as one, where the statement built from it failed as an internal error."""
    if len(key) != len(columns):
        raise InvalidArgument(f"{PAGE_TOKEN}: not a page token of this list ({len(key)} values)")
    for column, value in zip(columns, key, strict=True):
        if value is None:
            continue
        expected = datetime if isinstance(column.type, UTCDateTime) else column.type.python_type
        fits = isinstance(value, expected) and not isinstance(value, bool)
        if isinstance(value, datetime):
            fits = fits and value.tzinfo is not None
        elif isinstance(value, int):
            fits = fits and -(2**63) <= value < 2**63
        if not fits:
            raise InvalidArgument(f"{PAGE_TOKEN}: not a page token of this list ({column.key}: {value!r})")
