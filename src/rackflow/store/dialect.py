"""Where rackflow's SQL differs between SQLite and PostgreSQL: the one module that branches on the database.

The other store modules write each statement once and call here for the part that differs: how an engine
is set up (`engine_options`, `prepare_engine`), which clock is "now" (`database_now`, `now_minus`), row
locks (`skip_locked`, `for_update`, `locks_rows`), lookups by many keys (`by_keys`, `keys_table`,
`past_newest`, `ids_in`, `not_in_keys`), a UUID as text (`uuid_text`), bulk writes (`insert_rows`,
`update_rows`, `insert_new`), an item of a JSON array (`array_holds`), a name search that PostgreSQL's
trigram indexes answer (`name_holds`), statements planned to walk an index in its order
(`walking_in_order`, `newest_from_own_index`) and the migrations' lock and online index builds. `dialect`
is `Database.dialect` or, where only a connection is at hand, `conn.dialect.name`.

How a transaction starts (SQLite: one writer, `BEGIN IMMEDIATE`; PostgreSQL: row locks) is
`store.db.Database`'s; the PostgreSQL keyed-read path is `store.keyed_reads`'.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from alembic import op
from psycopg.types.array import ListBinaryDumper
from psycopg.types.json import set_json_loads
from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    DateTime,
    Insert,
    Interval,
    Table,
    Text,
    TextClause,
    Update,
    all_,
    and_,
    any_,
    bindparam,
    event,
    exists,
    func,
    literal,
    literal_column,
    select,
    text,
    true,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql import Select
from sqlalchemy.sql.selectable import TableValuedAlias
from sqlalchemy.sql.type_api import TypeEngine

from rackflow.clock import Clock
from rackflow.config import DB_POOL_OVERFLOW, SHORT_SEARCH_TEXT
from rackflow.errors import FailedPrecondition
from rackflow.store.types import UTCDateTime

_S = TypeVar("_S", bound=Select[Any])

POSTGRESQL = "postgresql"
SQLITE = "sqlite"

SQLITE_BUSY_TIMEOUT_MS = 30_000
# A pooled PostgreSQL connection idle longer than this is pinged before use, so one that died with a
# database restart is replaced unseen. Busy connections are not: a ping is a round trip, and under load it
# was a quarter of a read's (docs/PERFORMANCE.md). A connection that dies in use fails its request with
# UNAVAILABLE, and SQLAlchemy then discards every connection of the pool opened before the failure.
PING_AFTER_IDLE_S = 1.0
# psycopg prepares a statement after five runs, and PostgreSQL may then keep a generic plan costed on the
# tables' statistics at that moment: a server started on an almost empty database kept sequential scans of
# `tasks` and `task_schedule_run` while a drain grew them, and slowed from 1,189 to 430 firings/s
# (docs/PERFORMANCE.md, "flat as work grows"). Planning each run with its values keeps index use whatever
# the statistics were; the prepared statement still saves the parse.
PLAN_CACHE_MODE = "force_custom_plan"
# Each connection's TimeZone. Every time rackflow stores or compares is an aware UTC datetime, computed in
# Python, so no statement depends on the session's zone; what it decides is the zone psycopg hands a
# `timestamptz` back in: for "UTC" Python's own `timezone.utc`, converted to UTC again for free, for a
# server default such as "Etc/UTC" a `ZoneInfo`, converted twice per value (load, then `UTCDateTime`): 10
# against 3 µs for a row of seven times, and a claimed schedule reads seven (docs/PERFORMANCE.md, "Issue 29").
SESSION_TIME_ZONE = "UTC"
# Each connection's JIT. PostgreSQL compiles a statement to machine code when its estimated cost passes
# `jit_above_cost`, which pays for itself only in queries that run for seconds; rackflow's run for
# milliseconds, and an estimate swollen by correlated subqueries (the look for re-sends, `outbox._open`)
# passed it: over a week of 10,000 events the look ran 30 ms and compiled for 650, every 15 s
# (docs/PERFORMANCE.md, "The look for re-sends").
JIT = "off"
# Several instances may start with --migrate at once; on PostgreSQL they take turns on this lock (the same
# number in every version, so an old and a new instance exclude each other too).
_PG_MIGRATION_LOCK = 7_262_532_861
# How often a migration waiting for another's turn on that lock asks for it again (`migrations_locked`).
MIGRATION_TURN_POLL = timedelta(milliseconds=200)
# How long a migration's statement may wait for a table lock on PostgreSQL before its migration gives up
# (and is tried again, `migrate.MIGRATION_RETRY`). While it waits, every statement that needs a conflicting
# lock on the table queues behind it, the fleet's firings and tasks included: this bounds that stall, and
# ends a wait on a transaction that is itself waiting for the migration sooner than PostgreSQL's deadlock
# detector would (tests/faults/test_online_migration.py). A statement that must wait for every older
# transaction, CREATE INDEX CONCURRENTLY, waits without a limit (`building_index_concurrently`).
MIGRATION_LOCK_TIMEOUT = timedelta(milliseconds=500)
LOCK_NOT_AVAILABLE = "55P03"  # SQLSTATE of a statement that waited lock_timeout
INSUFFICIENT_PRIVILEGE = "42501"  # SQLSTATE of a statement the role may not run (CREATE EXTENSION)
# The escape character of the name searches' LIKE patterns, as SQLAlchemy's `autoescape` has it.
LIKE_ESCAPE = "/"
# What the names' trigram indexes need (migrations 0027, 0056), on PostgreSQL only.
CREATE_PG_TRGM = "CREATE EXTENSION IF NOT EXISTS pg_trgm"
DEADLOCK_DETECTED = "40P01"


# --- engines and clocks -----------------------------------------------------------------------------


def with_session_settings(options: str | None) -> str:
    """libpq `options` (the URL's, if any) with rackflow's plan cache mode, session time zone and JIT."""
    settings = f"-c plan_cache_mode={PLAN_CACHE_MODE} -c timezone={SESSION_TIME_ZONE} -c jit={JIT}"
    return " ".join(filter(None, (options, settings)))


def engine_options(dialect: str, pool_size: int) -> dict[str, Any]:
    """`create_async_engine` arguments: PostgreSQL's pool, plan cache mode, time zone and JIT; SQLite's
    busy timeout."""
    if dialect == POSTGRESQL:
        return {
            "pool_size": pool_size,
            "max_overflow": DB_POOL_OVERFLOW,
            "pool_recycle": 1800,
            "connect_args": {"options": with_session_settings(None)},
        }
    return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}}


def prepare_engine(dialect: str, engine: AsyncEngine) -> None:
    """SQLite: WAL, foreign keys, busy timeout and explicit BEGIN (IMMEDIATE for writers). PostgreSQL:
    a connection idle in the pool longer than PING_AFTER_IDLE_S is pinged before use, arrays are sent
    in binary (`binary_arrays`), and JSON null is read without parsing (`_json_loads`)."""
    if dialect == SQLITE:
        _configure_sqlite(engine)
    else:
        _ping_when_idle(engine)
        event.listen(engine.sync_engine, "connect", _on_postgresql_connect)


def binary_arrays(dbapi_conn: Any) -> None:
    """Send a list parameter (an array: the keys of `by_keys`, the columns of `insert_rows` and
    `update_rows`) in PostgreSQL's binary format on this connection.

    psycopg sends a list as text by default, since text allows mixed element types, and builds that text in
    Python: per element, about 1.3 µs for a UUID, 8 µs for a timestamp and 12 µs for a JSON text (quoted and
    escaped), against 0.2-0.5 µs in binary (psycopg 3.3, this machine). Every array rackflow sends holds
    values of one column, so binary loses nothing; sending a drain's arrays as text was about a tenth of the
    server's CPU (docs/PERFORMANCE.md, "Issue 29")."""
    connection = getattr(dbapi_conn, "driver_connection", dbapi_conn)
    connection.adapters.register_dumper(list, ListBinaryDumper)


def _on_postgresql_connect(dbapi_conn: Any, _record: Any) -> None:
    binary_arrays(dbapi_conn)
    connection = getattr(dbapi_conn, "driver_connection", dbapi_conn)
    set_json_loads(_json_loads, connection)


def _json_loads(data: str | bytes) -> Any:
    """A JSON column's value: JSON null without parsing it. The columns SQLAlchemy writes None to hold
    JSON null (a schedule's rollout, approval and retry policies, a scope's filter), and `json.loads`
    took about 1.5 µs for each: a claimed schedule and its scope read five, four of them null."""
    return None if data in (b"null", "null") else json.loads(data)


async def database_now(dialect: str, conn: AsyncConnection, clock: Clock) -> datetime:
    """The clock that decides what is due: the database's on PostgreSQL, this process's on SQLite (and
    a test's clock on either: `Clock.stands_for_the_database`)."""
    if dialect == POSTGRESQL and not clock.stands_for_the_database:
        value = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
        assert isinstance(value, datetime)
        return value.astimezone(UTC)
    return clock.now()


def uuid_text(dialect: str, column: ColumnElement[Any]) -> ColumnElement[str]:
    """The UUID `column` as its canonical text (8-4-4-4-12 lower-case hex digits, NULL for NULL), made
    by the database, for a list answered as text: psycopg makes a `uuid.UUID` of each value, and `str()`
    of it takes Python about as long again. SQLite holds a SQLAlchemy `Uuid` as its 32 hex digits."""
    if dialect == POSTGRESQL:
        return sql_cast(column, Text)
    groups = [func.substr(column, start, length, type_=Text) for start, length in _UUID_GROUPS]
    joined: ColumnElement[str] = groups[0]
    for group in groups[1:]:
        joined = joined + "-" + group  # `||`, which is NULL for NULL
    return joined


def epoch_micros(dialect: str, column: ColumnElement[datetime]) -> ColumnElement[int]:
    """The UTCDateTime `column` as whole microseconds since the Unix epoch (NULL for NULL), made by the
    database, for a list whose times go straight into its messages: psycopg makes an aware `datetime` of
    each value, `UTCDateTime` checks it is UTC, and the message's `Timestamp` is then made from it again:
    about 1 µs a value more than from an integer. A 10,000-rack schedule's whole scope list took 8–30 ms
    less in process (docs/PERFORMANCE.md, "The scopes' creation times as integers").

    SQLite holds the time as its text in UTC, seconds then six digits of fraction (none in a value another
    writer left whole): its seconds are read without the fraction, which SQLite's time functions round to
    the millisecond (…59.999999 would be the next second)."""
    if dialect == POSTGRESQL:
        return sql_cast(func.extract("epoch", column) * 1_000_000, BigInteger)
    seconds = sql_cast(func.strftime("%s", func.substr(column, 1, 19)), BigInteger)
    return seconds * 1_000_000 + sql_cast(func.substr(column, 21, 6), BigInteger)


# Where each group of a UUID's canonical text starts in its 32 hex digits (1-based, as substr counts), and
# how many digits it has.
_UUID_GROUPS = ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))


def now_minus(dialect: str) -> ColumnElement[datetime]:
    """SQL for "now minus a span" on the clock `database_now` reads, so a statement compares times without
    first asking the database for its time. Its parameters come from `now_minus_params`."""
    if dialect == POSTGRESQL:
        now = func.statement_timestamp(type_=DateTime(timezone=True))
        return now - bindparam("span", type_=Interval())
    return bindparam("before", type_=UTCDateTime())


def now_minus_params(dialect: str, clock: Clock, span: timedelta) -> dict[str, datetime | timedelta]:
    """The values `now_minus` needs."""
    if dialect == POSTGRESQL:
        return {"span": span}
    return {"before": clock.now() - span}


# --- name searches ---------------------------------------------------------------------------------


def name_holds(column: ColumnElement[str], text: str) -> ColumnElement[bool]:
    """The rows whose name (`column`) holds `text`, whatever its case, `%` and `_` taken literally: the
    schedules', racks' and NVLink domains' name searches. A text of SHORT_SEARCH_TEXT characters or more is
    `column ILIKE '%' || text || '%'`, which the column's trigram index answers on PostgreSQL (migrations
    0027, 0056). A shorter one holds no trigram, so that index could only be read whole, every entry of
    it: it is spelled `lower(column) LIKE lower(pattern)`, which the index (of the column) cannot answer,
    so that no plan reads it (PostgreSQL sometimes chose to: 470 ms a count at a million schedules,
    docs/PERFORMANCE.md, "The twenty-seventh stop"). That is ILIKE itself on both databases (PostgreSQL's
    ILIKE of a UTF-8 text lowers both sides so, SQLite's is ASCII-only either way), with one `lower` of
    each name where `lower(column) ILIKE` took two (90-120 against 140-190 ms for 100,000 names)."""
    if len(text) < SHORT_SEARCH_TEXT:
        escaped = text.replace(LIKE_ESCAPE, 2 * LIKE_ESCAPE).replace("%", LIKE_ESCAPE + "%")
        pattern = "%" + escaped.replace("_", LIKE_ESCAPE + "_") + "%"
        return func.lower(column).like(func.lower(pattern), escape=LIKE_ESCAPE)
    return column.icontains(text, autoescape=True)


# --- JSON arrays ------------------------------------------------------------------------------------


def array_holds(dialect: str, column: ColumnElement[Any], item: str) -> ColumnElement[bool]:
    """`column`, a JSON array of texts, holds `item`. PostgreSQL: `column @> '["item"]'`, which a GIN index
    over the column (`jsonb_path_ops`) answers; SQLite looks into each row's array (`json_each`), as no
    index of its can (`indexes_array_items`)."""
    if dialect == POSTGRESQL:
        return column.bool_op("@>")(literal([item], postgresql.JSONB()))
    items = func.json_each(column).table_valued("value")
    return exists(select(literal(1)).select_from(items).where(items.c.value == item))


def indexes_array_items(dialect: str) -> bool:
    """Whether an index answers `array_holds` (PostgreSQL's GIN), so a list filtered by it reads its
    matches only; on SQLite such a list walks a bounded range of its order instead (config.SEARCH_WALK)."""
    return dialect == POSTGRESQL


def keeps_deleted_runs_on_tasks(dialect: str) -> bool:
    """Whether a task still names its run once the run is deleted (with its schedule): on PostgreSQL
    `tasks.run_id` has no foreign key (migration 0036); SQLite's clears it (ON DELETE SET NULL)."""
    return dialect == POSTGRESQL


# --- row locks --------------------------------------------------------------------------------------


def locks_rows(dialect: str) -> bool:
    """PostgreSQL locks rows; SQLite's single writer already excludes every other writer."""
    return dialect == POSTGRESQL


def skip_locked(dialect: str, stmt: _S) -> _S:
    """Claim rows no other transaction holds (PostgreSQL); SQLite's single writer needs nothing."""
    return stmt.with_for_update(skip_locked=True) if locks_rows(dialect) else stmt


def for_update(dialect: str, stmt: _S, *, nowait: bool = False, keys_kept: bool = False) -> _S:
    """Lock rows until commit (PostgreSQL); SQLite's single writer already excludes other writers.
    `nowait`: a row another transaction holds fails the statement (LockNotAvailable) instead of waiting.
    `keys_kept`: the locker neither deletes the rows nor changes their keys (`FOR NO KEY UPDATE`), so the
    lock excludes every other locker but not the `FOR KEY SHARE` a foreign key's check takes on the row a
    referencing row names: a transaction writing a row that references a locked one never waits for it."""
    return stmt.with_for_update(nowait=nowait, key_share=keys_kept) if locks_rows(dialect) else stmt


def _autocommits(conn: AsyncConnection) -> bool:
    """Whether `conn` runs each statement as its own transaction (`Database.read` on PostgreSQL)."""
    sync = conn.sync_connection
    return sync is not None and sync.get_execution_options().get("isolation_level") == "AUTOCOMMIT"


class _PlannerOff:
    """Two statements that turn planner settings off for a block of statements (PostgreSQL, in the
    transaction) and set them back after: `off` answers their values before it (read in a subquery that
    `OFFSET 0` keeps apart, so they are read first), `back` sets those values again, by name. Setting them
    back from `pg_settings`' reset values built that view's every row each time: 0.5 ms of PostgreSQL's
    time a claim, against 0.01."""

    def __init__(self, *names: str) -> None:
        self.names = names
        before = (
            select(*(func.current_setting(name).label(name) for name in names))
            .offset(literal_column("0"))
            .subquery("before_off")
        )
        self.off = select(
            *(before.c[name] for name in names), *(func.set_config(name, "off", True) for name in names)
        )
        self.back = select(*(func.set_config(name, bindparam(name, type_=Text), True) for name in names))

    @asynccontextmanager
    async def during(self, conn: AsyncConnection) -> AsyncIterator[None]:
        if conn.dialect.name != POSTGRESQL:
            yield
            return
        # Settings local to a transaction last one statement in autocommit: the block would plan as before.
        if _autocommits(conn):
            raise AssertionError("planner settings need a transaction: Database.read(in_transaction=True)")
        before = (await conn.execute(self.off)).one()
        yield
        # Set back only after the block succeeded: a statement that failed aborted the transaction, which
        # discards the settings as it rolls back, and a statement sent now would fail too and hide its
        # error.
        await conn.execute(self.back, {name: before._mapping[name] for name in self.names})


# The settings that leave PostgreSQL one way to take the first rows of an ORDER BY ... LIMIT: an index read
# in its order and stopped early (`walking_in_order`).
_WALK = _PlannerOff("enable_bitmapscan", "enable_sort")
# The setting without which a walk of one index that gives the order only in part (the creation-time
# index, whose ties an incremental sort orders) costs a sort of every row it finds
# (`newest_from_own_index`).
_OWN_INDEX = _PlannerOff("enable_incremental_sort")


def walking_in_order(conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
    """The block's statements planned with no bitmap read and no sort (PostgreSQL, in the transaction of
    `conn`, set back after; SQLite plans as it does), so that one taking the oldest rows of a partial index
    walks it in its order and stops once it has them.

    Why: the executor's claim takes the oldest live tasks from `ix_tasks_live_queue`, whose entries also
    keep every task that ended since `tasks` was last vacuumed (an ended task leaves its index entry dead;
    autovacuum comes once a fifth of a large table changed). Its statistics, taken while few tasks were
    live, say a handful are; the planner then reads every entry of the status index by a bitmap, each one's
    heap page included, dead or not, and sorts the live ones to take a few. At a million schedules, ten
    million tasks and a burst of 10,000 firings that was 8,400 blocks and 29 ms a claim, where the walk in
    order, which marks the dead entries as it passes so that the next claim skips them unread, took 1,275
    blocks and 5 ms (docs/PERFORMANCE.md, "The thirty-third stop")."""
    return _WALK.during(conn)


def newest_from_own_index(conn: AsyncConnection) -> AbstractAsyncContextManager[None]:
    """The block's statements planned with no incremental sort (PostgreSQL, in the transaction of `conn`,
    set back after; SQLite plans as it does), so that a schedule's newest tasks of a status are read from
    the schedule's own index (`ix_tasks_schedule_id_status_created_at_id`), in the list's order and stopped
    at the page's end.

    Why: the planner prices a walk of the creation-time index backward, keeping the schedule's tasks and
    ordering ties by an incremental sort, as if those tasks were spread evenly through time. They are not:
    a schedule's tasks are made together when it fires, and every task the fleet made since lies above
    them. At a million schedules, with 120,000 newer tasks of other schedules in the week, that walk read
    21,679 blocks and took 75–96 ms for a page of the 10,000-rack schedule's completed tasks, against 2 ms
    from its index (docs/PERFORMANCE.md, "A schedule's newest tasks from its own index")."""
    return _OWN_INDEX.during(conn)


def keys_shared(dialect: str, stmt: _S) -> _S:
    """Hold rows' keys until commit (`FOR KEY SHARE`, PostgreSQL): the rows can be neither deleted nor their
    keys changed meanwhile (a `FOR UPDATE`, a DELETE, its cascade wait), but every other writer of them
    (`FOR NO KEY UPDATE`, an UPDATE of other columns) goes on; SQLite's single writer already excludes
    every other writer."""
    return stmt.with_for_update(read=True, key_share=True) if locks_rows(dialect) else stmt


async def take_turns(conn: AsyncConnection, key: int) -> None:
    """Until the caller's transaction ends, every other transaction that takes `key` waits for it, so they
    run one after another and each reads what the one before committed: on PostgreSQL a transaction-level
    advisory lock (`key`: a number of the code's own, one per kind of turn); SQLite's single writer already
    runs write transactions so."""
    if conn.dialect.name == POSTGRESQL:
        await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})


async def beside_turns(conn: AsyncConnection, key: int) -> None:
    """Until the caller's transaction ends, a transaction that takes `key`'s turn (`take_turns`) waits for
    it, and it waits for one that holds that turn, but not for another that takes this shared form: on
    PostgreSQL the shared form of the same transaction-level advisory lock; SQLite's single writer already
    runs write transactions one after another."""
    if conn.dialect.name == POSTGRESQL:
        await conn.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": key})


async def writers_under_way(conn: AsyncConnection) -> frozenset[str] | None:
    """The write transactions under way on the caller's database, for `writers_ended` (None: none): on
    PostgreSQL the transaction ids of its sessions (a transaction has one from its first write; any role
    sees them), those of other databases left out. None on SQLite, whose one writer runs write
    transactions one after another: none reads what another changes and commits after it."""
    if conn.dialect.name != POSTGRESQL:
        return None
    found = frozenset((await conn.execute(text(_WRITERS))).scalars())
    return found or None


async def writers_ended(conn: AsyncConnection, writers: frozenset[str] | None) -> bool:
    """Whether every write transaction of `writers` (`writers_under_way`) has ended, committed or not."""
    if writers is None:
        return True
    still = text(f"{_WRITERS} AND backend_xid::text = ANY(:writers)")
    return (await conn.execute(still, {"writers": sorted(writers)})).first() is None


# The ids of the transactions of this database's sessions, as text (PostgreSQL's `xid` type has no
# comparison with a number).
_WRITERS = (
    "SELECT backend_xid::text FROM pg_stat_activity"
    " WHERE datname = current_database() AND backend_xid IS NOT NULL"
)


@contextmanager
def migrations_locked(conn: Connection) -> Iterator[None]:
    """Migrations from several instances at once run one after another: on PostgreSQL they take turns on
    an advisory lock held by the session for the whole upgrade (each migration commits on its own), and
    each statement waits at most MIGRATION_LOCK_TIMEOUT for a table lock; SQLite's single writer takes
    turns already. Leaves `conn` outside any transaction, as Alembic must find it to run each migration in
    a transaction of its own."""
    if conn.dialect.name != POSTGRESQL:
        yield
        return
    # Asked again and again, not waited for in one `pg_advisory_lock`: a statement waiting holds a
    # snapshot, which the upgrade in progress must outwait at its next `CREATE INDEX CONCURRENTLY` while
    # that statement waits for its advisory lock, a deadlock PostgreSQL broke by failing one of them. Between
    # tries this session is outside any transaction, holding nothing the upgrade in progress waits for.
    while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _PG_MIGRATION_LOCK}).scalar():
        conn.commit()
        time.sleep(MIGRATION_TURN_POLL.total_seconds())
    # After the advisory lock: waiting for another host's upgrade to end is no table lock held up.
    _wait_for_locks_at_most(conn, MIGRATION_LOCK_TIMEOUT)
    conn.commit()
    try:
        yield
    finally:
        conn.rollback()  # a migration that failed leaves its transaction open
        conn.execute(text("RESET lock_timeout"))
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_MIGRATION_LOCK})
        conn.commit()


def _wait_for_locks_at_most(conn: Connection, timeout: timedelta) -> None:
    """PostgreSQL's lock_timeout for the rest of the session (0: no limit)."""
    conn.execute(text(f"SET lock_timeout = '{int(timeout.total_seconds() * 1000)}ms'"))


def creating_pg_trgm(conn: Connection, revision: str) -> None:
    """In a migration on PostgreSQL that builds a trigram index (`gin_trgm_ops`), the extension `pg_trgm`
    created if missing. PostgreSQL 13 and later mark it trusted, so a role with CREATE on the database may
    create it; when it exists already the statement is a no-op that needs no privilege (PostgreSQL looks for
    it before checking any). A role that may not create it fails the migration with the statement a
    superuser must run, before anything of it is done (its transaction is rolled back; `rackflow db migrate`
    run again goes on from it). Skipping the index instead would leave a schema other than the one
    `tables.py` declares, which `rackflow serve` could not tell, and a search that reads every name with
    nobody told why."""
    try:
        conn.execute(text(CREATE_PG_TRGM))
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != INSUFFICIENT_PRIVILEGE:
            raise
        refusal = getattr(exc.orig, "diag", None)
        raise FailedPrecondition(
            f"migration {revision} needs the PostgreSQL extension pg_trgm, which this role may not create "
            f"({refusal.message_primary if refusal else exc.orig}); nothing of migration {revision} is "
            f"applied: have a superuser run `{CREATE_PG_TRGM};` in the database {conn.engine.url.database} "
            "(or, from PostgreSQL 13, grant this role CREATE on it), then run `rackflow db migrate` again"
        ) from exc


@contextmanager
def building_index_concurrently(conn: Connection, index: str) -> Iterator[None]:
    """Around a migration's `CREATE INDEX CONCURRENTLY ... IF NOT EXISTS` on PostgreSQL, in an autocommit
    block: writes to the table go on while it builds (a plain CREATE INDEX blocks them to the end, and
    would hold its SHARE lock while waiting behind the fleet's transactions, which then queue behind it).
    The build waits for every transaction older than it, so for as long as it takes (lock_timeout 0, then
    MIGRATION_LOCK_TIMEOUT again). A build interrupted earlier (a killed migration, a cancelled statement)
    leaves the index invalid, which IF NOT EXISTS would keep: it is dropped first and built again, so the
    migration is safe to run again whatever stopped it."""
    _wait_for_locks_at_most(conn, timedelta(0))
    try:
        invalid = conn.execute(
            text("SELECT NOT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:index)"),
            {"index": index},
        ).scalar()
        if invalid:
            conn.execute(text(f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"'))
        yield
    finally:
        _wait_for_locks_at_most(conn, MIGRATION_LOCK_TIMEOUT)


def replace_index_online(
    table: str,
    old: str,
    new: str,
    columns: Sequence[str],
    *,
    where: TextClause | None = None,
    unique: bool = False,
    postgresql_include: Sequence[str] = (),
) -> None:
    """In a migration (alembic's `op`), the swap of the index `old` of `table` for `new` (`columns`, WHERE
    `where` if partial; on PostgreSQL carrying `postgresql_include` too). On PostgreSQL, in an autocommit
    block, `new` is built CONCURRENTLY (`building_index_concurrently`: writes go on, and `old` answers, or
    refuses what a unique `new` will, until `new` is valid), then `old` is dropped CONCURRENTLY; each step
    is safe to run again. On SQLite both are plain statements."""
    bind = op.get_bind()
    if bind.dialect.name != POSTGRESQL:
        op.create_index(new, table, list(columns), unique=unique, sqlite_where=where)
        op.drop_index(old, table_name=table)
        return
    with op.get_context().autocommit_block(), building_index_concurrently(bind, new):
        op.create_index(
            new,
            table,
            list(columns),
            unique=unique,
            postgresql_where=where,
            postgresql_include=list(postgresql_include),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.drop_index(old, table_name=table, postgresql_concurrently=True, if_exists=True)


def waited_too_long_for_a_lock(exc: BaseException) -> bool:
    """True for a PostgreSQL statement that gave up waiting for a lock (lock_timeout) or was chosen to end
    a deadlock: nothing was wrong with it but the moment, so trying again later may succeed."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) in (LOCK_NOT_AVAILABLE, DEADLOCK_DETECTED)


# --- lookups by many keys ---------------------------------------------------------------------------


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
    """
    if dialect != POSTGRESQL:
        return stmt.where(column.in_(keys)).order_by(*order_by)
    each_once = list(dict.fromkeys(keys))  # as in an IN list
    return _keyed_lookup(stmt, column, tuple(order_by)).params(lookup_keys=each_once)


@functools.lru_cache(maxsize=64)
def _keyed_lookup(
    stmt: Select[Any], column: ColumnElement[Any], order_by: tuple[Column[Any], ...]
) -> Select[Any]:
    """`by_keys`' statement on PostgreSQL, without its keys (`.params(lookup_keys=…)` binds them: 2 µs).

    Built once per statement object: building it took 1.5-3 ms, most of it SQLAlchemy copying each
    column of the LATERAL subquery with its foreign keys, and a firing batch built seven, about 4 % of a
    draining dispatcher's CPU (docs/PERFORMANCE.md, "Issue 29"). So the hot callers pass statements
    built once, at module level; a statement built per call is still right, only not reused. Cached by
    the objects themselves (a statement compares by identity, and a column's `==` is true only of
    itself), which the cache keeps alive."""
    lookup = keys_table((), column, "lookup")
    found = stmt.where(column == lookup.c.key).offset(0).lateral("found")
    return select(found).select_from(lookup.join(found, true())).order_by(*(found.c[c.key] for c in order_by))


def in_keys(dialect: str, column: ColumnElement[Any], keys: Sequence[Any]) -> ColumnElement[bool]:
    """`column` is one of `keys`. PostgreSQL: `column = ANY(:keys)`, the keys one array parameter, sent in
    binary (`binary_arrays`); `IN (…)` has a parameter per key, each bound and dumped apart, and its text
    split again for each count of keys: 8-10 ms of CPU for 1,000 ids against 2-3, for each of GetTasksByIDs'
    reads (docs/PERFORMANCE.md, "The 1,000-row pages at 36 components"). A primary key's index answers both
    alike. SQLite: `IN (…)`."""
    if dialect != POSTGRESQL:
        return column.in_(keys)
    return column == any_(bindparam("wanted_keys", list(keys), type_=ARRAY(column.type)))


def not_in_keys(dialect: str, column: ColumnElement[Any], keys: Sequence[Any]) -> ColumnElement[bool]:
    """`column` is none of `keys` (none NULL). PostgreSQL: `column <> ALL(:keys)`, the keys one array
    parameter, so the text is the same for any number of keys. `NOT IN (…)` has a parameter per key, a new
    text for each count: psycopg splits and dumps it again each time (it caches statements under 4 KB), and
    a draining dispatcher's claim left out up to two batches in flight this way (docs/PERFORMANCE.md, "Issue
    29"). PostgreSQL plans both alike (a list is an array to it). SQLite: `NOT IN (…)`."""
    if dialect != POSTGRESQL:
        return column.not_in(keys)
    return column != all_(bindparam("excluded_keys", list(keys), type_=ARRAY(column.type)))


def past_newest(
    dialect: str,
    stmt: Select[Any],
    column: ColumnElement[Any],
    keys: Sequence[Any],
    *,
    newest: ColumnElement[Any],
    tiebreak: ColumnElement[Any],
    keep: int,
    bounded: tuple[Sequence[Any], TypeEngine[Any], Callable[[ColumnElement[Any]], ColumnElement[bool]]]
    | None = None,
) -> Select[Any]:
    """The rows of `stmt` (a SELECT without ORDER BY) for each of `keys` in `column`, but the newest `keep`
    of each key by (`newest`, `tiebreak`) descending; the columns `stmt` selects.

    `bounded` (PostgreSQL; SQLite, which partitions nothing, reads as if it were not given): each key's
    bound (of the type given with them), and the condition every row of a key meets given
    its bound, which PostgreSQL prunes a partitioned table's partitions by at each key (the runs' slots:
    `store.run_partitions.from_slot`).

    PostgreSQL walks an index of (`column`, `newest`) per key (`keys_table`, LATERAL subqueries), where
    ranking the rows of `column IN (…)` with a window was planned as a full scan of a table that grew from
    empty (docs/PERFORMANCE.md, "flat as work grows"). It reads from the table only the rows past the
    newest `keep`: first the index alone gives `edge`, the `newest` of the key's (keep + 1)-th row, and no
    row at all for a key with no more than `keep` (a schedule's run prune mostly finds nothing to delete);
    then the index alone counts the rows newer than `edge` (`above`, fewer than `keep`), and the table is
    read from `edge` down, past the `keep - above` rows that tie with it and are still among the newest.
    Walking from the newest row instead read every kept row from the table: once a schedule had `keep`
    runs, each of its firings read its 101 runs to delete one, 124 buffers and most of PostgreSQL's time a
    firing (docs/PERFORMANCE.md, "A firing at the run cap"). SQLite, which has no LATERAL, does the same
    reads with correlated subqueries over the keys the index holds, and ranks the rows from the edge down
    with a window; it ranked every row of the key, each read from the table.
    """
    if dialect == POSTGRESQL:
        if bounded is None:
            lookup = keys_table(keys, column, "lookup")
            at_key = column == lookup.c.key
        else:
            key_bounds, bound_type, within = bounded
            lookup = (
                func.unnest(
                    bindparam("lookup_keys", list(keys), type_=ARRAY(column.type)),
                    bindparam("lookup_bounds", list(key_bounds), type_=ARRAY(bound_type)),
                )
                .table_valued("key", "bound")
                .render_derived(name="lookup")
            )
            at_key = and_(column == lookup.c.key, within(lookup.c.bound))
        edge = (
            select(newest.label("edge"))
            .where(at_key)
            .order_by(newest.desc())
            .offset(keep)
            .limit(1)
            .lateral("beyond")
        )
        above = select(func.count().label("above")).where(at_key, newest > edge.c.edge).lateral("newer")
        rest = (
            stmt.where(at_key, newest <= edge.c.edge)
            .order_by(newest.desc(), tiebreak.desc())
            .offset(literal(keep) - above.c.above)
            .lateral("rest")
        )
        return select(*rest.c).select_from(lookup.join(edge, true()).join(above, true()).join(rest, true()))
    # SQLite: each key's edge and count as correlated subqueries over the keys found in the index (`keyed`,
    # grouped; all three are index-only), then the rows from the edge down ranked by a window.
    table = column.table
    keyed = select(column.label("key")).where(column.in_(keys)).group_by(column).subquery("keyed")
    edge_rows = table.alias("edge_rows")
    edge_at = (
        select(edge_rows.c[newest.name])
        .where(edge_rows.c[column.name] == keyed.c.key)
        .order_by(edge_rows.c[newest.name].desc())
        .offset(keep)
        .limit(1)
        .scalar_subquery()
    )
    edges = select(keyed.c.key, edge_at.label("edge")).subquery("edges")
    newer_rows = table.alias("newer_rows")
    newer_count = (
        select(func.count())
        .where(newer_rows.c[column.name] == edges.c.key, newer_rows.c[newest.name] > edges.c.edge)
        .scalar_subquery()
    )
    bounds = (
        select(edges.c.key, edges.c.edge, newer_count.label("above"))
        .where(edges.c.edge.is_not(None))
        .subquery("bounds")
    )
    rank = (
        func.row_number().over(partition_by=column, order_by=(newest.desc(), tiebreak.desc())).label("rank")
    )
    ranked = (
        stmt.add_columns(rank, bounds.c.above)
        .join(bounds, and_(column == bounds.c.key, newest <= bounds.c.edge))
        .subquery("ranked")
    )
    return select(*list(ranked.c)[: len(stmt.selected_columns)]).where(
        ranked.c.rank > literal(keep) - ranked.c.above
    )


def ids_in(dialect: str, key: ColumnElement[Any], ids: Select[Any]) -> ColumnElement[bool]:
    """`key` is one of the ids the subquery `ids` selects. PostgreSQL plans `id IN (subquery)` as a hash
    join over a scan of the whole table; `id = ANY(ARRAY(subquery))` looks the ids up in the primary key
    (at 1M audit rows a prune chunk took 180 ms against 26 ms)."""
    subquery = ids.scalar_subquery()
    return key == any_(func.array(subquery)) if dialect == POSTGRESQL else key.in_(subquery)


def some_element_holds(dialect: str, array: ColumnElement[Any], key: str) -> ColumnElement[bool]:
    """Some object of the JSON array `array` holds `key` with a value other than null (`key`: a name
    written in the code, never input)."""
    if dialect == POSTGRESQL:
        return func.jsonb_path_exists(array, literal_column(f"'$[*] ? (@.{key} != null)'::jsonpath"))
    each = func.json_each(array).table_valued("value", joins_implicitly=True)
    return exists().select_from(each).where(func.json_extract(each.c.value, f"$.{key}").is_not(None))


# --- bulk inserts -----------------------------------------------------------------------------------


def insert_rows(
    dialect: str, table: Table, rows: Sequence[Mapping[str, Any]], *, new_only: bool = False
) -> tuple[Insert, dict[str, list[Any]] | Sequence[Mapping[str, Any]]]:
    """An INSERT of `rows` (each with the same keys, at least one row) and the parameters to run it with:
    `await conn.execute(*insert_rows(...))`. `new_only` leaves out the rows a unique constraint already
    holds a value of (`insert_new`).

    PostgreSQL: `INSERT … SELECT … FROM unnest(:a, :b, …)` (`rows_table`), a column every row holds one
    value of as that value (`_row_columns`). Its text does not depend on the number of rows, so psycopg
    parses it once per set of such columns. The multi-row VALUES that SQLAlchemy renders for an
    executemany with RETURNING is a new text for each count of rows, with a parameter per value, and psycopg
    parses it again every time (it caches statements under 4 KB with at most 50 parameters): recording a
    drain's batches of 200 runs that way was 10 % of the server's time (docs/PERFORMANCE.md). A plain
    executemany (no RETURNING) keeps one short text but runs a statement per row, each a round of the
    pipeline and a statement for PostgreSQL to execute: a batch's tasks went in that way while their JSON
    columns' text arrays cost more to send than the statements saved, until arrays went in binary
    (`binary_arrays`). SQLite: the plain executemany (no round trips).
    """
    insert = insert_new(dialect, table) if new_only else table.insert()
    if dialect != POSTGRESQL:
        return insert, rows
    first = next(iter(rows[0]))
    columns, values = _row_columns(table, rows, "new_rows", first)
    selected = [column.label(name) for name, column in columns.items()]
    return insert.from_select(list(columns), select(*selected)), values


async def insert_rows_together(
    conn: AsyncConnection, batches: Sequence[tuple[Table, Sequence[Mapping[str, Any]]]]
) -> None:
    """Insert each batch's rows (table, rows each with the same keys; an empty batch is left out).

    PostgreSQL: one statement, as `insert_rows` writes them, the first batches data-modifying CTEs of the
    last (`WITH inserted_0 AS (INSERT …) INSERT …`): one round trip however many tables. A claim's
    pre-flight round is a waiting row and its results, and the executor's journal waits for every round
    trip of a claim (docs/PERFORMANCE.md, issue 26). SQLite: an executemany per table (no round trips)."""
    batches = [(table, rows) for table, rows in batches if rows]
    if conn.dialect.name != POSTGRESQL:
        for table, rows in batches:
            await conn.execute(table.insert(), rows)
        return
    if not batches:
        return
    shape = tuple((table, tuple(rows[0])) for table, rows in batches)
    stmt = _TOGETHER.get(shape)
    if stmt is None:  # built once per shape: building it cost a claim more than running it
        inserts = []
        for i, (table, rows) in enumerate(batches):
            new_rows, _ = rows_table(table, rows[:1], "new_rows", prefix=f"b{i}")
            inserts.append(table.insert().from_select(list(rows[0]), select(*new_rows.c)))
        *first, last = inserts
        stmt = _TOGETHER[shape] = last.add_cte(
            *(insert.cte(f"inserted_{i}") for i, insert in enumerate(first))
        )
    parameters: dict[str, list[Any]] = {}
    for i, (table, rows) in enumerate(batches):
        parameters.update(rows_values(table, rows, prefix=f"b{i}"))
    await conn.execute(stmt, parameters)


# `insert_rows_together`'s statements, by their tables and columns.
_TOGETHER: dict[tuple[tuple[Table, tuple[str, ...]], ...], Insert] = {}


def update_rows(
    dialect: str,
    table: Table,
    key: str,
    rows: Sequence[Mapping[str, Any]],
    constants: Mapping[str, Any] | None = None,
    *,
    combined: Mapping[str, Callable[[ColumnElement[Any], ColumnElement[Any]], ColumnElement[Any]]]
    | None = None,
) -> tuple[Update, dict[str, Any] | list[dict[str, Any]]]:
    """An UPDATE writing each of `rows` (each with the same keys, at least one row) to the row of `table`
    whose `key` column holds its `key` value, every other key of the row a column to set, and `constants`
    (column -> value) set on each; and the parameters to run it with: `await conn.execute(*update_rows(...))`.
    A row whose key is not in the table updates nothing, as its own `UPDATE … WHERE key = …` would.
    `combined` (column -> f(the column, the row's value)): what those columns are set to instead of the
    row's value, from the value the row holds (a count lowered by it, say), so writers of the same row at
    once do not overwrite each other.

    PostgreSQL: one statement for any number of rows, its text the same for every count:

        UPDATE table SET a = new_values.a, …, c = :c_c
        FROM unnest(:key, :a, …) AS new_values(key, a, …) WHERE table.key = new_values.key

    (a column every row holds one value of goes as that value, `_row_columns`).

    An executemany ran one UPDATE per row: a drain's advances, last-task ids and completions were three
    statements a firing for PostgreSQL to bind and execute (docs/PERFORMANCE.md, "Issue 29"). Which order
    the rows are updated in is the plan's: a caller that must lock rows in an order (against deadlocks)
    locks them first. SQLite: the plain executemany of `UPDATE … WHERE key = :key` (no round trips).
    """
    names = [name for name in rows[0] if name != key]
    constant_values = {f"c_{name}": value for name, value in (constants or {}).items()}
    constant_columns: dict[str, Any] = {
        name: bindparam(f"c_{name}", type_=table.c[name].type) for name in constants or {}
    }

    def set_to(name: str, value: ColumnElement[Any]) -> ColumnElement[Any]:
        combine = (combined or {}).get(name)
        return combine(table.c[name], value) if combine is not None else value

    if dialect != POSTGRESQL:
        by_row = (
            update(table)
            .where(table.c[key] == bindparam(f"b_{key}", type_=table.c[key].type))
            .values(
                {name: set_to(name, bindparam(f"b_{name}", type_=table.c[name].type)) for name in names}
                | constant_columns
            )
        )
        return by_row, [{**{f"b_{n}": v for n, v in row.items()}, **constant_values} for row in rows]
    columns, values = _row_columns(table, rows, "new_values", key)
    stmt = (
        update(table)
        .where(table.c[key] == columns[key])
        .values({name: set_to(name, columns[name]) for name in names} | constant_columns)
    )
    return stmt, {**values, **constant_values}


def rows_table(
    table: Table, rows: Sequence[Mapping[str, Any]], name: str, *, prefix: str = "b"
) -> tuple[TableValuedAlias, dict[str, list[Any]]]:
    """PostgreSQL: `unnest(:a, :b, …) AS name(a, b, …)`, the rows (each with the same keys, columns of
    `table`) as a table, one array parameter per column, and the parameters (`<prefix>_<column>`: the
    column's values in row order, `rows_values`). JSON values go as text cast to their type, so None
    stays JSON null, as SQLAlchemy stores it."""
    return _unnest(table, list(rows[0]), name, prefix), rows_values(table, rows, prefix=prefix)


def _unnest(table: Table, columns: Sequence[str], name: str, prefix: str) -> TableValuedAlias:
    arrays: list[ColumnElement[Any]] = []
    for column in columns:
        column_type = table.c[column].type
        parameter = f"{prefix}_{column}"
        if isinstance(column_type, JSON):
            arrays.append(sql_cast(bindparam(parameter, type_=ARRAY(Text)), ARRAY(column_type)))
        else:
            arrays.append(bindparam(parameter, type_=ARRAY(column_type)))
    return func.unnest(*arrays).table_valued(*columns).render_derived(name=name)


def _row_columns(
    table: Table, rows: Sequence[Mapping[str, Any]], name: str, first: str
) -> tuple[dict[str, ColumnElement[Any]], dict[str, Any]]:
    """PostgreSQL: the rows' columns for one statement (by name, in the rows' order) and its parameters.

    A column that holds one value in every row goes as that value, one parameter (`s_<column>`); the
    others as columns of `rows_table`'s unnest (`b_<column>`), which always holds `first`, so the statement
    has one row for each row. A batch's rows share most of their columns (a new task's status, times,
    owner and NULLs; a new run's state, trigger and owner), and psycopg dumps an array's elements one by
    one in Python: sent as arrays, those were most of the cost of sending a firing batch's writes
    (docs/PERFORMANCE.md, issue 29). The text then depends on which columns are shared, so a statement
    has a few texts, each parsed and cached alike."""
    values = rows_values(table, rows)
    shared = [column for column in rows[0] if column != first and _one_value(values[f"b_{column}"])]
    varying = [column for column in rows[0] if column not in shared]
    unnested = _unnest(table, varying, name, "b")
    columns: dict[str, ColumnElement[Any]] = {column: unnested.c[column] for column in varying}
    parameters: dict[str, Any] = {f"b_{column}": values[f"b_{column}"] for column in varying}
    for column in shared:
        column_type = table.c[column].type
        parameter = f"s_{column}"
        if isinstance(column_type, JSON):
            columns[column] = sql_cast(bindparam(parameter, type_=Text), column_type)
        else:
            columns[column] = bindparam(parameter, type_=column_type)
        parameters[parameter] = values[f"b_{column}"][0]
    return {column: columns[column] for column in rows[0]}, parameters


def _one_value(values: Sequence[Any]) -> bool:
    first = values[0]
    return all(value is first or value == first for value in values)


def rows_values(
    table: Table, rows: Sequence[Mapping[str, Any]], *, prefix: str = "b"
) -> dict[str, list[Any]]:
    """The parameters of `rows_table`'s arrays for `rows` (the same keys as the rows it was built for)."""
    return {
        f"{prefix}_{column}": (
            [_json_text(row[column]) for row in rows]
            if isinstance(table.c[column].type, JSON)
            else [row[column] for row in rows]
        )
        for column in rows[0]
    }


# The texts of the JSON values most rows of a firing carry, as `json.dumps` writes them: a new run's
# outcomes, counts, rollout and approval, a task's retry policy. `json.dumps` took about 2 µs for each.
_EMPTY_JSON: dict[type, str] = {list: "[]", dict: "{}"}


def _json_text(value: Any) -> str:
    """`json.dumps(value)`, without calling it for JSON null and an empty list or object."""
    if value is None:
        return "null"
    if not value and type(value) in _EMPTY_JSON:
        return _EMPTY_JSON[type(value)]
    return json.dumps(value)


def insert_new(dialect: str, table: Table) -> Insert:
    """An INSERT that leaves out the rows a unique constraint or index already holds a value of
    (`ON CONFLICT DO NOTHING`, spelled alike by both databases); with RETURNING it says which went in."""
    dialect_insert = postgresql.insert if dialect == POSTGRESQL else sqlite.insert
    return dialect_insert(table).on_conflict_do_nothing()


# --- engine setup -----------------------------------------------------------------------------------


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
