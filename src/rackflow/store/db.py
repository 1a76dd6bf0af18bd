"""The database handle: the engine and its pool, transactions, and which database it is.

How a transaction starts differs (SQLite: one writer, `BEGIN IMMEDIATE`, serialised in this process;
PostgreSQL: row locks, and autocommit reads); every other difference between the two is in
`store.dialect`, which `Database` asks for its engine options and clock.
"""

from __future__ import annotations

import asyncio
import operator
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Insert, Table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.sql import Select

from rackflow.clock import Clock, SystemClock
from rackflow.config import DEFAULT_DB_POOL_SIZE
from rackflow.errors import AlreadyExists, InvalidArgument, Unavailable
from rackflow.store import dialect as dialects
from rackflow.store.wakeup_subscribers import Wakeups

_S = TypeVar("_S", bound=Select[Any])
_T = TypeVar("_T")

# Values per IN list: lookups by many keys run in chunks, so a 10,000-target request costs a handful of
# queries and no IN list grows past what every driver accepts.
CHUNK_SIZE = 1000
UNIQUE_VIOLATION_SQLSTATE = "23505"
# Where a transaction keeps what it asked to be told after it commits (`after_commit`): in its connection's
# `info`, which outlives the checkout, so `Database._begin` empties it before each transaction.
_AFTER_COMMIT = "rackflow_after_commit"


def chunked(values: Collection[_T], size: int = CHUNK_SIZE) -> Iterator[list[_T]]:
    """The values in lists of at most `size`, in their original order."""
    items = list(values)
    for start in range(0, len(items), size):
        yield items[start : start + size]


# A UUID's 128-bit value: the order `UUID.__lt__` gives, compared as ints in C.
_ID_VALUE = operator.attrgetter("int")


def in_id_order(ids: Iterable[uuid.UUID]) -> list[uuid.UUID]:
    """The distinct ids, ascending: the order every lock over many rows is taken in (so lockers never
    deadlock) and keyed lookups go in. The same order as `sorted(ids)`, ordered by each id's integer value:
    `UUID.__lt__` is a Python call per comparison, and sorting a batch's 1,000 ids with it took 1.3-2.3 ms
    where the integers take 0.4 (a firing batch sorts its ids five times; docs/PERFORMANCE.md, issue 29)."""
    return sorted(set(ids), key=_ID_VALUE)


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


def after_commit(conn: AsyncConnection, what: str) -> None:
    """In a `Database.transaction()`: once it commits (never for a rollback), call this process's hooks for
    `what` (`Database.on_commit`). A loop that sleeps while it has nothing to do is woken so by the writes
    that give it work (`store.outbox.CHANGED`), after they are visible to its next read."""
    conn.info.setdefault(_AFTER_COMMIT, set()).add(what)


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
    `postgresql+psycopg://…`. Explicit async drivers are kept. A URL no driver here takes is refused
    naming `--db`, the flag (and `RACKFLOW_DB`) every command reads it from.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:  # SQLAlchemy raises ArgumentError with a clear text
        raise InvalidArgument(f"--db: cannot parse the database URL: {exc}") from None
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite":
        if driver not in ("", "aiosqlite"):
            raise InvalidArgument(f"--db: unsupported SQLite driver {driver!r} (use sqlite:///path.db)")
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    elif backend in ("postgresql", "postgres"):
        if driver not in ("", "psycopg", "psycopg_async"):
            raise InvalidArgument(f"--db: unsupported PostgreSQL driver {driver!r} (use postgresql://…)")
        parsed = parsed.set(drivername="postgresql+psycopg")
    else:
        raise InvalidArgument(f"--db: unsupported database {backend!r} (use sqlite:///… or postgresql://…)")
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


# What a caller is told when PostgreSQL ended its statement's wait for a lock (lock_timeout, or chosen to end
# a deadlock): "database unavailable" sent operators looking for an outage that was not there.
_LOCK_WAIT_ENDED = "the database ended this call's wait for a row or table another transaction held"


@contextmanager
def connection_errors_as_unavailable() -> Iterator[None]:
    """Turn "the database cannot be reached" into `Unavailable`, so callers and clients can tell an
    outage (retry later) from a bug, and so a lock wait PostgreSQL ended (a deadlock, a lock timeout), saying
    which; other driver errors pass through unchanged."""
    try:
        yield
    except (OperationalError, InterfaceError, DBAPIError) as exc:
        if dialects.waited_too_long_for_a_lock(exc):  # the database is up: another transaction was in the way
            raise Unavailable(f"try again: {_LOCK_WAIT_ENDED} ({exc.orig})") from exc
        if is_connection_error(exc):
            raise Unavailable(f"database unavailable: {exc.orig or exc}") from exc
        raise
    except OSError as exc:
        raise Unavailable(f"database unavailable: {exc}") from exc


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
        self.engine: AsyncEngine = create_async_engine(
            self.url, echo=echo, **dialects.engine_options(self.dialect, pool_size)
        )
        dialects.prepare_engine(self.dialect, self.engine)
        # SQLite allows one writer; serialise this process's writers here instead of spinning on
        # "database is locked". Other processes on the same file wait on the busy timeout.
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        # Who in this process hears that a schedule became due sooner (`store.wakeups`).
        self.wakeups = Wakeups()
        # Called after a transaction that asked for them (`after_commit`) committed, by what it named.
        self.on_commit: dict[str, list[Callable[[], None]]] = {}
        # Run by `dispose` before the engine goes: connections of its users' own (`store.keyed_reads`).
        self.on_dispose: list[Callable[[], Awaitable[None]]] = []

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @property
    def is_postgres(self) -> bool:
        return self.dialect == "postgresql"

    async def dispose(self) -> None:
        for close in self.on_dispose:
            await close()
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
    async def read(self, *, in_transaction: bool = False) -> AsyncIterator[AsyncConnection]:
        """A read-only connection (never takes SQLite's write lock).

        SQLite: one transaction, so every statement sees the same snapshot. PostgreSQL: autocommit, which
        saves the `BEGIN` and `COMMIT` round trips and changes nothing else, because at READ COMMITTED each
        statement takes its own snapshot inside a transaction too; `in_transaction` opens a transaction
        instead, which the server-side cursor of `AsyncConnection.stream` needs, and planner settings local
        to it (`dialect.newest_from_own_index`).
        """
        if self.is_sqlite or in_transaction:
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
                conn.info.pop(_AFTER_COMMIT, None)  # what a rolled-back transaction asked for
                async with conn.begin():
                    yield conn
                for what in conn.info.pop(_AFTER_COMMIT, ()):
                    for hook in self.on_commit.get(what, ()):
                        hook()

    async def now(self, conn: AsyncConnection) -> datetime:
        """The clock that decides what is due: the database's on PostgreSQL, this process's on SQLite."""
        return await dialects.database_now(self.dialect, conn, self.clock)

    async def writers_under_way(self, conn: AsyncConnection) -> frozenset[str] | None:
        """The write transactions under way on this database (`dialects.writers_under_way`)."""
        return await dialects.writers_under_way(conn)

    async def writers_ended(self, conn: AsyncConnection, writers: frozenset[str] | None) -> bool:
        """Whether those write transactions have all ended (`dialects.writers_ended`)."""
        return await dialects.writers_ended(conn, writers)

    def skip_locked(self, stmt: _S) -> _S:
        """Claim rows no other transaction holds (`dialects.skip_locked`)."""
        return dialects.skip_locked(self.dialect, stmt)

    def for_update(self, stmt: _S, *, nowait: bool = False, keys_kept: bool = False) -> _S:
        """Lock rows until commit (`dialects.for_update`)."""
        return dialects.for_update(self.dialect, stmt, nowait=nowait, keys_kept=keys_kept)

    def insert_new(self, table: Table) -> Insert:
        """`dialects.insert_new(self.dialect, table)`."""
        return dialects.insert_new(self.dialect, table)
