"""Keyed reads: concurrent one-row reads by key, answered together by one query per round.

Why: a GetTaskSchedule is one primary-key SELECT, and under many concurrent clients the query's own cost
(a pooled connection's checkout and return, the driver's send, an event-loop wake-up for its answer) was
most of the server's time per call, several times what the row's conversion costs (docs/PERFORMANCE.md,
"api"). Here a caller queues its key and awaits its row; one flusher at a time takes every key queued so
far and reads them with one `= ANY(:keys)` query. So the reads never hold more than one connection.

Rounds gather: requests from concurrent clients reach the server spread out, one every few hundred
microseconds, and a round is sent, answered and done before the next arrives, so sent at once a round
answered 1.15 callers on average under 16 clients, and each paid a whole query (about 300 µs of CPU on
this side and PostgreSQL's). So when readers are concurrent (callers came while the last round was out),
a round first waits up to `GATHER_WINDOW_S` for as many callers as the last round answered plus those that
came during it; callers that keep reading come back within that. Under 16 clients a round then answers
4–7 callers, and the server's CPU per Get fell from about 800 to about 500 µs (docs/PERFORMANCE.md, issue
17's third round). A lone caller, or callers one after another, never wait: nobody came while their round
was out, and after a pause longer than the window nobody is expected.

The rows come two ways. SQLite: an `IN` list in a read transaction. PostgreSQL: `column = ANY(:keys)` sent
by psycopg itself on a connection of the statement's own, outside the pool (`_OwnConnection`), with the
statement compiled once (`_DriverQuery`): under 16 clients a read through the pool cost the server about
400 µs of CPU more than one answered from memory, mostly the pool's checkout and return (each a new
greenlet, whose frame stack is a fresh mmap) and one event-loop wake-up per query (docs/PERFORMANCE.md,
"api"). `_DriverQuery` converts values as SQLAlchemy would, through its public type API (`dialect_impl`,
`bind_processor`, `result_processor`) and the compiled statement's bind names; tests/store/test_fetch.py
compares its rows with SQLAlchemy's own, so an upgrade that changes either fails there.

Read-your-writes holds: a key queued while a round is in flight waits for the next round, whose query is
sent after the key was queued, so it sees every write committed before the caller asked. A round that
fails gives its error to each of its callers; a caller that gives up (cancelled) leaves the others alone.
"""

from __future__ import annotations

import asyncio
from collections import namedtuple
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import psycopg
from sqlalchemy import ColumnElement, any_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql import Select

from rackflow.errors import Unavailable
from rackflow.metrics import KEYED_READ_CALLERS, KEYED_READ_ROUNDS
from rackflow.store.db import Database
from rackflow.store.dialect import binary_arrays, with_session_settings

# Reads the rows of these keys (at most one per key, in any order).
ReadMany = Callable[[list[Hashable]], Awaitable[Sequence[Any]]]

# The longest a round waits for the concurrent callers it expects. Under 16 clients a fixed wait of 1 ms
# gathered 2.7 callers a round and one of 2 ms 5.1 (bench/api.py); next to a Get's latency under that
# load (p50 9–12 ms unbatched, 5–7 ms batched) the wait is small, and only concurrent readers pay it.
GATHER_WINDOW_S = 0.002


class KeyedReads:
    """`get(key)` is the row whose `key_of(row)` is `key`, or None."""

    def __init__(
        self,
        read_many: ReadMany,
        key_of: Callable[[Any], Hashable],
        *,
        gather_window: float = GATHER_WINDOW_S,
    ) -> None:
        self._read_many = read_many
        self._key_of = key_of
        self._gather_window = gather_window
        self._queued: dict[Hashable, list[asyncio.Future[Any]]] = {}
        self._callers = 0  # callers waiting in `_queued`
        self._expected = 1  # callers the next round waits for, up to the window
        self._last_answered = 0.0  # the loop's time when the last round was answered
        self._gathered: asyncio.Future[None] | None = None  # set once `_expected` callers are queued
        self._flusher: asyncio.Task[None] | None = None

    async def get(self, key: Hashable) -> Any | None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(key, []).append(future)
        self._callers += 1
        if self._gathered is not None and self._callers >= self._expected:
            _settle(self._gathered)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        round_: dict[Hashable, list[asyncio.Future[Any]]] = {}
        try:
            while self._queued:
                await self._gather()
                round_, self._queued = self._queued, {}
                answering, self._callers = self._callers, 0
                KEYED_READ_ROUNDS.inc()
                KEYED_READ_CALLERS.inc(answering)
                try:
                    rows = await self._read_many(list(round_))
                except Exception as exc:
                    for future in _waiting(round_):
                        future.set_exception(exc)
                    continue
                finally:
                    # Those who came while the round was out read concurrently with its callers, who
                    # are likely to read again: the next round waits for them all.
                    self._expected = answering + self._callers
                self._last_answered = asyncio.get_running_loop().time()
                found = {self._key_of(row): row for row in rows}
                for key, futures in round_.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(found.get(key))
        except asyncio.CancelledError:  # the loop is closing: nobody will answer these callers
            for future in [*_waiting(round_), *_waiting(self._queued)]:
                future.cancel()
            self._queued, self._callers = {}, 0
            raise
        finally:
            self._flusher = None

    async def _gather(self) -> None:
        """Wait until `_expected` callers are queued or the window has passed, whichever is first."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_answered > self._gather_window:
            self._expected = 1  # the readers went quiet: whoever reads now is not waited for
        if self._callers >= self._expected:
            return
        self._gathered = loop.create_future()
        timer = loop.call_later(self._gather_window, _settle, self._gathered)
        try:
            await self._gathered
        finally:
            timer.cancel()
            self._gathered = None


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _waiting(callers: dict[Hashable, list[asyncio.Future[Any]]]) -> list[asyncio.Future[Any]]:
    """The futures still to answer (a caller that was cancelled is not)."""
    return [future for futures in callers.values() for future in futures if not future.done()]


# --- fetching by key -------------------------------------------------------------------------------

# Per database, per statement (a module-level constant): its keyed reads.
_READS: WeakKeyDictionary[Database, dict[int, tuple[Select[Any], KeyedReads]]] = WeakKeyDictionary()


async def fetch_by_key(db: Database, stmt: Select[Any], column: ColumnElement[Any], key: Any) -> Any | None:
    """The row of `stmt` (a module-level constant selecting `column`) whose `column` is `key`, or None,
    read outside any transaction. Concurrent calls for the same `stmt` share one query per round."""
    by_stmt = _READS.setdefault(db, {})
    cached = by_stmt.get(id(stmt))
    if cached is None or cached[0] is not stmt:
        cached = (stmt, _keyed_reads_of(db, stmt, column))
        by_stmt[id(stmt)] = cached
    return await cached[1].get(key)


def _keyed_reads_of(db: Database, stmt: Select[Any], column: ColumnElement[Any]) -> KeyedReads:
    name = column.key
    assert name is not None
    if db.is_sqlite:
        by_list = stmt.where(column.in_(bindparam("keys", expanding=True)))

        async def read_many(keys: list[Any]) -> Sequence[Any]:
            async with db.read() as conn:
                return list((await conn.execute(by_list, {"keys": keys})).all())

    else:
        query = _driver_query(
            stmt.where(column == any_(bindparam("keys", type_=ARRAY(column.type)))), db.engine.dialect
        )
        own = _OwnConnection(db.engine)
        db.on_dispose.append(own.close)

        async def read_many(keys: list[Any]) -> Sequence[Any]:
            return query.rows(await own.fetchall(query.sql, query.bind({"keys": keys})))

    return KeyedReads(read_many, lambda row: getattr(row, name))


@dataclass(frozen=True)
class _DriverQuery:
    """A SELECT compiled once for psycopg, with SQLAlchemy's own bind and result conversions."""

    sql: str
    defaults: Mapping[str, Any]  # values bound in the statement itself (literals)
    binds: Mapping[str, Callable[[Any], Any]]
    results: tuple[Callable[[Any], Any] | None, ...]
    row: Callable[..., tuple[Any, ...]]

    def bind(self, params: Mapping[str, Any]) -> dict[str, Any]:
        values = {**self.defaults, **params}
        return {k: self.binds[k](v) if k in self.binds else v for k, v in values.items()}

    def rows(self, raw_rows: Sequence[Sequence[Any]]) -> list[Any]:
        return [
            self.row(*(f(v) if f is not None else v for f, v in zip(self.results, raw, strict=True)))
            for raw in raw_rows
        ]


def _driver_query(stmt: Select[Any], dialect: Dialect) -> _DriverQuery:
    """Compile `stmt` and take the conversions SQLAlchemy would apply: each bound parameter's
    `bind_processor` under the name the SQL text uses, each selected column's `result_processor`, from
    the types' implementations for `dialect` (public API; built once per statement, so nothing is lost
    to SQLAlchemy's private per-dialect caches)."""
    compiled = stmt.compile(dialect=dialect)
    if compiled.post_compile_params:
        raise ValueError("a driver query takes no expanding (IN) parameters")
    binds: dict[str, Callable[[Any], Any]] = {}
    for param, name in compiled.bind_names.items():
        processor = param.type.dialect_impl(dialect).bind_processor(dialect)
        if processor is not None:
            binds[compiled.escaped_bind_names.get(name, name)] = processor
    columns = list(stmt.selected_columns)
    return _DriverQuery(
        sql=compiled.string,
        defaults=compiled.params,
        binds=binds,
        results=tuple(c.type.dialect_impl(dialect).result_processor(dialect, None) for c in columns),
        row=_row_type([str(c.key) for c in columns]),
    )


def _row_type(names: Sequence[str]) -> Callable[..., tuple[Any, ...]]:
    """Rows that read as SQLAlchemy's do: each column an attribute and an item of `_mapping`, which the
    store's conversions read (`schedules.schedule_from_row`)."""
    base = namedtuple("Row", names)  # type: ignore[misc]  # its fields are known only at run time
    return type("Row", (base,), {"__slots__": (), "_mapping": property(base._asdict)})


class _OwnConnection:
    """One psycopg connection in autocommit, outside the pool, for one caller at a time (`KeyedReads`).

    Opened on first use with the pool's own connect arguments, so rows convert the same. A connection that
    fails is closed; if it had been used before (it may have died idle, with a database restart), one new
    connection is tried at once, as the pool's ping on checkout would; otherwise the caller gets
    `Unavailable`.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def fetchall(self, sql: str, params: Mapping[str, Any]) -> list[Any]:
        while True:
            reused = self._conn is not None
            try:
                if self._conn is None:
                    args, kwargs = self._engine.dialect.create_connect_args(self._engine.url)
                    kwargs["options"] = with_session_settings(kwargs.get("options"))
                    self._conn = await psycopg.AsyncConnection.connect(*args, autocommit=True, **kwargs)
                    binary_arrays(self._conn)  # its keys are sent as the pool's connections send them
                return await (await self._conn.execute(sql, params)).fetchall()
            except (psycopg.OperationalError, OSError) as exc:
                await self.close()
                if not reused:
                    raise Unavailable(f"database unavailable: {exc}") from exc

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(psycopg.Error, OSError):
                await conn.close()
