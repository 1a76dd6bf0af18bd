"""The database handle, and the only module that knows SQLite from PostgreSQL.

Everything dialect-specific lives here: URL normalisation, how a write transaction starts (SQLite: one
writer, `BEGIN IMMEDIATE`; PostgreSQL: row locks), whether `FOR UPDATE SKIP LOCKED` exists, and which clock
is "now" (PostgreSQL: the database's, so instances with skewed clocks agree on what is due).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import namedtuple
from collections.abc import AsyncIterator, Callable, Collection, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import psycopg
from sqlalchemy import (
    JSON,
    Column,
    ColumnElement,
    Insert,
    Table,
    Text,
    any_,
    bindparam,
    event,
    func,
    select,
    text,
    true,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql import Select
from sqlalchemy.sql.selectable import TableValuedAlias

from rackflow.clock import Clock, SystemClock
from rackflow.config import DB_POOL_OVERFLOW, DEFAULT_DB_POOL_SIZE
from rackflow.errors import AlreadyExists, InvalidArgument, Unavailable
from rackflow.store.keyed_reads import KeyedReads
from rackflow.store.wakeups import Wakeups

_S = TypeVar("_S", bound=Select[Any])
_T = TypeVar("_T")

SQLITE_BUSY_TIMEOUT_MS = 30_000
# A pooled PostgreSQL connection idle longer than this is pinged before use, so one that died with a
# database restart is replaced unseen. Busy connections are not: a ping is a round trip, and under load it
# was a quarter of a read's (docs/PERFORMANCE.md). A connection that dies in use fails its request with
# UNAVAILABLE, and SQLAlchemy then discards every connection of the pool opened before the failure.
PING_AFTER_IDLE_S = 1.0
# Values per IN list: lookups by many keys run in chunks, so a 10,000-target request costs a handful of
# queries and no IN list grows past what every driver accepts.
CHUNK_SIZE = 1000
UNIQUE_VIOLATION_SQLSTATE = "23505"


def chunked(values: Collection[_T], size: int = CHUNK_SIZE) -> Iterator[list[_T]]:
    """The values in lists of at most `size`, in their original order."""
    items = list(values)
    for start in range(0, len(items), size):
        yield items[start : start + size]


def some_of(values: Sequence[str], shown: int = 3) -> str:
    """The first few values for a message, and how many more there are: `a, b, c (+7 more)`."""
    more = f" (+{len(values) - shown} more)" if len(values) > shown else ""
    return ", ".join(values[:shown]) + more


def is_unique_violation(exc: IntegrityError) -> bool:
    """PostgreSQL reports SQLSTATE 23505; SQLite says so in its message."""
    if getattr(exc.orig, "sqlstate", None) == UNIQUE_VIOLATION_SQLSTATE:
        return True
    return "UNIQUE constraint failed" in str(exc.orig)


def _violated_columns(exc: IntegrityError) -> set[str]:
    """The columns of the unique constraint `exc` violated, as the driver names them (PostgreSQL:
    `Key (type, external_id)=(…)`; SQLite: `UNIQUE constraint failed: components.type, …`)."""
    detail = getattr(getattr(exc.orig, "diag", None), "message_detail", None) or ""
    if found := re.match(r"Key \(([^)]*)\)=", detail):
        return {column.strip() for column in found.group(1).split(",")}
    if found := re.search(r"UNIQUE constraint failed: (.*)$", str(exc.orig)):
        return {part.strip().rpartition(".")[2] for part in found.group(1).split(",")}
    return set()


@contextmanager
def unique_violation_as(*taken: AlreadyExists) -> Iterator[None]:
    """Inside the block, a unique-constraint violation becomes `AlreadyExists` naming the field and value.

    The services pre-check for a clear message; this covers the race a pre-check cannot see. With several
    unique columns, `taken` holds one error each and the one whose field ends in a column of the violated
    constraint is raised (the first when the driver does not say). Other errors pass through.
    """
    try:
        yield
    except IntegrityError as exc:
        if not is_unique_violation(exc):
            raise
        columns = _violated_columns(exc)
        chosen = next((e for e in taken if e.field.rpartition(".")[2] in columns), taken[0])
        raise chosen from None


def normalise_url(url: str) -> str:
    """Map the URLs operators write to the async drivers rackflow uses.

    `sqlite:///x.db` -> `sqlite+aiosqlite:///x.db`; `postgresql://…` and `postgres://…` ->
    `postgresql+psycopg://…`. Explicit async drivers are kept.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # SQLAlchemy raises ArgumentError with a clear text
        raise InvalidArgument(f"db: cannot parse the database URL: {exc}") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite":
        if driver not in ("", "aiosqlite"):
            raise InvalidArgument(f"db: unsupported SQLite driver {driver!r} (use sqlite:///path.db)")
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg", "psycopg_async"):
            raise InvalidArgument(f"db: unsupported PostgreSQL driver {driver!r} (use postgresql://…)")
        parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise InvalidArgument(f"db: unsupported database {backend!r} (use sqlite:///… or postgresql://…)")
    return parsed.render_as_string(hide_password=False)


def is_connection_error(exc: BaseException) -> bool:
    """True when a driver error means the database is unreachable rather than the query being wrong."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, InterfaceError):
        return True
    if isinstance(exc, OperationalError):
        msg = str(exc.orig).lower()
        # SQLite reports lock contention as OperationalError too; that is not an outage.
        return "database is locked" not in msg
    return False


@contextmanager
def connection_errors_as_unavailable() -> Iterator[None]:
    """Turn "the database cannot be reached" into `Unavailable`, so callers and clients can tell an
    outage (retry later) from a bug; other driver errors pass through unchanged."""
    try:
        yield
    except (OperationalError, InterfaceError, DBAPIError) as exc:
        if is_connection_error(exc):
            raise Unavailable(f"database unavailable: {exc.orig or exc}") from exc
        raise
    except OSError as exc:
        raise Unavailable(f"database unavailable: {exc}") from exc


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


def _driver_query(stmt: Select[Any], dialect: Any) -> _DriverQuery:
    compiled = stmt.compile(dialect=dialect)
    if compiled.post_compile_params:
        raise ValueError("a driver query takes no expanding (IN) parameters")
    columns = list(stmt.selected_columns)
    return _DriverQuery(
        sql=compiled.string,
        defaults=compiled.params,
        binds={k: cast(Callable[[Any], Any], f) for k, f in compiled._bind_processors.items()},
        results=tuple(c.type._cached_result_processor(dialect, None) for c in columns),
        row=namedtuple("Row", [c.key for c in columns]),  # type: ignore[misc]
    )


# psycopg prepares a statement after five runs, and PostgreSQL may then keep a generic plan costed on the
# tables' statistics at that moment: a server started on an almost empty database kept sequential scans of
# `tasks` and `task_schedule_run` while a drain grew them, and slowed from 1,189 to 430 firings/s
# (docs/PERFORMANCE.md, "flat as work grows"). Planning each run with its values keeps index use whatever
# the statistics were; the prepared statement still saves the parse.
PLAN_CACHE_MODE = "force_custom_plan"


def _with_plan_cache_mode(options: str | None) -> str:
    """libpq `options` (the URL's, if any) with rackflow's plan cache mode."""
    return " ".join(filter(None, (options, f"-c plan_cache_mode={PLAN_CACHE_MODE}")))


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
                    kwargs["options"] = _with_plan_cache_mode(kwargs.get("options"))
                    self._conn = await psycopg.AsyncConnection.connect(*args, autocommit=True, **kwargs)
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


class Database:
    """An async engine plus the dialect rules above. One per process."""

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        pool_size: int = DEFAULT_DB_POOL_SIZE,
        echo: bool = False,
    ) -> None:
        self.url = normalise_url(url)
        self.clock = clock or SystemClock()
        self.dialect = make_url(self.url).get_backend_name()
        kwargs: dict[str, Any] = {"echo": echo}
        if self.dialect == "postgresql":
            kwargs.update(
                pool_size=pool_size,
                max_overflow=DB_POOL_OVERFLOW,
                pool_recycle=1800,
                connect_args={"options": _with_plan_cache_mode(None)},
            )
        else:
            kwargs.update(connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        # SQLite allows one writer; serialise this process's writers here instead of spinning on
        # "database is locked". Other processes on the same file wait on the busy timeout.
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        self._keyed_reads: dict[int, tuple[Select[Any], KeyedReads]] = {}
        self._own_connections: list[_OwnConnection] = []
        # Who in this process hears that a schedule became due sooner (`store.wakeups`).
        self.wakeups = Wakeups()
        if self.is_sqlite:
            _configure_sqlite(self.engine)
        else:
            _ping_when_idle(self.engine)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    async def dispose(self) -> None:
        for own in self._own_connections:
            await own.close()
        await self.engine.dispose()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A read-write transaction: committed on success, rolled back on any error.

        Connection failures surface as `Unavailable` so callers (and clients) can tell an outage from a bug.
        """
        if self._write_lock is not None:
            async with self._write_lock, self._begin(immediate=True) as conn:
                yield conn
        else:
            async with self._begin(immediate=False) as conn:
                yield conn

    @asynccontextmanager
    async def read(self, *, streaming: bool = False) -> AsyncIterator[AsyncConnection]:
        """A read-only connection (never takes SQLite's write lock).

        SQLite: one transaction, so every statement sees the same snapshot. PostgreSQL: autocommit, which
        saves the `BEGIN` and `COMMIT` round trips and changes nothing else, because at READ COMMITTED each
        statement takes its own snapshot inside a transaction too; `streaming` opens a transaction
        instead, which the server-side cursor of `AsyncConnection.stream` needs.
        """
        if self.is_sqlite or streaming:
            async with self._begin(immediate=False) as conn:
                yield conn
            return
        with connection_errors_as_unavailable():
            async with self.engine.connect() as conn:
                yield await conn.execution_options(isolation_level="AUTOCOMMIT")

    @asynccontextmanager
    async def _begin(self, *, immediate: bool) -> AsyncIterator[AsyncConnection]:
        with connection_errors_as_unavailable():
            async with self.engine.connect() as conn:
                if self.is_sqlite:
                    conn = await conn.execution_options(sqlite_immediate=immediate)
                async with conn.begin():
                    yield conn

    async def fetch_by_key(self, stmt: Select[Any], column: ColumnElement[Any], key: Any) -> Any | None:
        """The row of `stmt` (a module-level constant selecting `column`) whose `column` is `key`, or None.

        Concurrent calls for the same `stmt` share one query per round (`store.keyed_reads`):
        `column = ANY(:keys)` on PostgreSQL, on a connection of the statement's own outside the pool
        (`_OwnConnection`); an `IN` list in a read transaction on SQLite. Under 16 clients, a GetTaskSchedule
        read through the pool cost the server about 400 µs of CPU more than one answered from memory, mostly
        the pool's checkout and return (each a new greenlet, whose frame stack is a fresh mmap) and one
        event-loop wake-up per query (docs/PERFORMANCE.md, "api").
        """
        cached = self._keyed_reads.get(id(stmt))
        if cached is None or cached[0] is not stmt:
            cached = (stmt, self._keyed_reads_of(stmt, column))
            self._keyed_reads[id(stmt)] = cached
        return await cached[1].get(key)

    def _keyed_reads_of(self, stmt: Select[Any], column: ColumnElement[Any]) -> KeyedReads:
        name = column.key
        assert name is not None
        if self.is_sqlite:
            by_list = stmt.where(column.in_(bindparam("keys", expanding=True)))

            async def read_many(keys: list[Any]) -> Sequence[Any]:
                async with self.read() as conn:
                    return list((await conn.execute(by_list, {"keys": keys})).all())

        else:
            query = _driver_query(
                stmt.where(column == any_(bindparam("keys", type_=ARRAY(column.type)))), self.engine.dialect
            )
            own = _OwnConnection(self.engine)
            self._own_connections.append(own)

            async def read_many(keys: list[Any]) -> Sequence[Any]:
                return query.rows(await own.fetchall(query.sql, query.bind({"keys": keys})))

        return KeyedReads(read_many, lambda row: getattr(row, name))

    async def now(self, conn: AsyncConnection) -> datetime:
        """The clock that decides what is due: the database's on PostgreSQL, this process's on SQLite."""
        if self.is_postgres:
            value = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
            assert isinstance(value, datetime)
            return value.astimezone(UTC)
        return self.clock.now()

    def skip_locked(self, stmt: _S) -> _S:
        """Claim rows no other transaction holds (PostgreSQL); SQLite's single writer needs nothing."""
        return stmt.with_for_update(skip_locked=True) if self.is_postgres else stmt

    def for_update(self, stmt: _S) -> _S:
        """Lock rows until commit (PostgreSQL); SQLite's single writer already excludes other writers."""
        return stmt.with_for_update() if self.is_postgres else stmt

    def insert_new(self, table: Table) -> Insert:
        """`insert_new(self.dialect, table)`."""
        return insert_new(self.dialect, table)


def keys_table(keys: Sequence[Any], column: ColumnElement[Any], name: str) -> TableValuedAlias:
    """PostgreSQL: `unnest(:keys) AS name(key)`, the keys as a table of one column typed as `column`.

    Joined to a LATERAL subquery that looks one key up (`… WHERE column = name.key`), it makes the planner
    walk an index once per key whatever the table's statistics say. A plain `column IN (…)` over a table
    that grew from empty since it was last analyzed is costed as matching most of it and read in full.
    """
    return (
        func.unnest(bindparam(f"{name}_keys", list(keys), type_=ARRAY(column.type)))
        .table_valued("key")
        .render_derived(name=name)
    )


def insert_rows(
    dialect: str, table: Table, rows: Sequence[Mapping[str, Any]], *, new_only: bool = False
) -> tuple[Insert, dict[str, list[Any]] | Sequence[Mapping[str, Any]]]:
    """An INSERT of `rows` (each with the same keys, at least one row) and the parameters to run it with:
    `await conn.execute(*insert_rows(...))`. `new_only` leaves out the rows a unique constraint already
    holds a value of (`insert_new`).

    PostgreSQL: `INSERT … SELECT … FROM unnest(:a, :b, …)`, one array per column, JSON values as text cast
    to their type (so None stays JSON null, as SQLAlchemy stores it). Its text is the same for any number
    of rows, so psycopg parses it once. The multi-row VALUES that SQLAlchemy renders for an executemany
    with RETURNING is a new text for each count of rows, with a parameter per value, and psycopg parses it
    again every time (it caches statements under 4 KB with at most 50 parameters): recording a drain's
    batches of 200 runs that way was 10 % of the server's time (docs/PERFORMANCE.md). A plain executemany
    (no RETURNING) keeps one short text but runs a statement per row; with JSON columns, psycopg's quoting
    of text arrays costs more than it saves, so `insert_tasks` stays one. SQLite: the plain executemany.
    """
    insert = insert_new(dialect, table) if new_only else table.insert()
    if dialect != "postgresql":
        return insert, rows
    names = list(rows[0])
    arrays: list[ColumnElement[Any]] = []
    values: dict[str, list[Any]] = {}
    for name in names:
        column_type = table.c[name].type
        if isinstance(column_type, JSON):
            arrays.append(sql_cast(bindparam(name, type_=ARRAY(Text)), ARRAY(column_type)))
            values[name] = [json.dumps(row[name]) for row in rows]
        else:
            arrays.append(bindparam(name, type_=ARRAY(column_type)))
            values[name] = [row[name] for row in rows]
    new_rows = func.unnest(*arrays).table_valued(*names).render_derived(name="new_rows")
    return insert.from_select(names, select(*new_rows.c)), values


def by_keys(
    dialect: str,
    stmt: Select[Any],
    column: ColumnElement[Any],
    keys: Sequence[Any],
    *,
    order_by: Sequence[Column[Any]] = (),
) -> Select[Any]:
    """The rows of `stmt` (a SELECT without ORDER BY) whose `column` is one of `keys`, ordered by `order_by`
    (columns `stmt` selects), each key looked up on its own, in an index of `column`.

    PostgreSQL (`keys_table`):

        SELECT found.* FROM unnest(:lookup_keys) AS lookup(key)
        JOIN LATERAL (<stmt> AND column = lookup.key OFFSET 0) AS found ON true ORDER BY …

    `column IN (…)` of a dispatched batch's keys (up to `DISPATCH_BATCH_CAP`) was planned as a full scan
    whatever the statistics: without any (a table filled since it was last analyzed) as matching most of the
    table, and with them as a hashed scan that PostgreSQL costs below as many index probes, which it stays
    only while the fleet is small
    (docs/PERFORMANCE.md, "flat as work grows"). OFFSET 0 keeps the planner from folding the lookups back
    into one join. SQLite: `<stmt> AND column IN (…)`, which it answers by an index lookup per key.
    `dialect` is `Database.dialect` or `conn.dialect.name`.
    """
    if dialect != "postgresql":
        return stmt.where(column.in_(keys)).order_by(*order_by)
    lookup = keys_table(list(dict.fromkeys(keys)), column, "lookup")  # each key once, as in an IN list
    found = stmt.where(column == lookup.c.key).offset(0).lateral("found")
    return select(found).select_from(lookup.join(found, true())).order_by(*(found.c[c.key] for c in order_by))


def insert_new(dialect: str, table: Table) -> Insert:
    """An INSERT that leaves out the rows a unique constraint or index already holds a value of
    (`ON CONFLICT DO NOTHING`, spelled alike by both databases); with RETURNING it says which went in.
    `dialect` is `Database.dialect` or, where only a connection is at hand, `conn.dialect.name`."""
    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return dialect_insert(table).on_conflict_do_nothing()


def _ping_when_idle(engine: AsyncEngine) -> None:
    """Ping a connection on checkout only if it sat in the pool longer than PING_AFTER_IDLE_S.

    Raising DisconnectionError makes the pool discard the connection and check out another (three tries).
    """

    @event.listens_for(engine.sync_engine.pool, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine.sync_engine.pool, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("idle_since")
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return  # new, or in steady use
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError(f"pooled connection is dead: {exc}") from exc
        if not alive:
            raise DisconnectionError("pooled connection is dead")


def _configure_sqlite(engine: AsyncEngine) -> None:
    """WAL, foreign keys, busy timeout, and explicit BEGIN (IMMEDIATE for writers).

    pysqlite's own transaction handling is switched off so that `BEGIN IMMEDIATE` takes the write lock at
    the start of a write transaction; otherwise two writers can both read, then deadlock on upgrade.
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")
