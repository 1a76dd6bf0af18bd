"""Shared fixtures: a migrated database on SQLite and on PostgreSQL for every store test.

PostgreSQL tests use `RACKFLOW_TEST_POSTGRES_URL` (default postgresql://postgres@127.0.0.1:5432/test). Each
pytest session works in a database of its own (created from that server, dropped at the end), so several
sessions can share one server. Unreachable server: skip locally, FAIL under CI=true.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from rackflow.ids import new_id
from rackflow.store.db import Database
from rackflow.store.dialect import insert_rows
from rackflow.store.migrate import migrate, run_scripts
from rackflow.store.tables import metadata, task_schedule_run
from tests.built_once import built_once, drop_the_runs_databases, name_the_run
from tests.e2e.cluster import forget_connections, fresh_postgres_database, kept_connection

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def postgres_admin_url() -> str:
    return os.environ.get("RACKFLOW_TEST_POSTGRES_URL", DEFAULT_PG)


def pytest_configure(config: pytest.Config) -> None:
    name_the_run()


# The tiers whose multi-process modules hold the longest single tests (the minute of faults, the online
# migration, the Redfish emulator's power cycles, then the four-instance clusters), handed out first.
LONGEST_FIRST = {tier: rank for rank, tier in enumerate(("faults", "integration", "e2e", "browser"))}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each multi-process module (marked `slow`: mostly waiting, on servers, real cron minutes, a browser)
    spread among the others, which keep the CPU busy meanwhile, the longest tiers first. xdist hands a
    worker a whole module at a time in this order (`make test`: `--dist loadfile --no-loadscope-reorder`).
    Its own order (the modules of most tests first) left the minute of faults, one test, for last: it
    began 13 minutes into a 15½-minute run and ran on alone; all of them first left the CPU idle while
    three workers waited. Every worker computes the same order, as xdist requires."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = [m for m, its in modules.items() if any(i.get_closest_marker("slow") for i in its)]
    slow.sort(key=lambda m: LONGEST_FIRST.get(m.split("/")[1], len(LONGEST_FIRST)))
    chosen = set(slow)
    others = [m for m in modules if m not in chosen]
    order: list[str] = []
    taken_slow = taken_others = 0
    while len(order) < len(modules):  # a slow module whenever the slow ones are behind their share
        if taken_others == len(others) or (
            taken_slow < len(slow) and taken_slow * len(others) <= taken_others * len(slow)
        ):
            order.append(slow[taken_slow])
            taken_slow += 1
        else:
            order.append(others[taken_others])
            taken_others += 1
    items[:] = [item for module in order for item in modules[module]]


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller, its workers ended (or a run without workers)
        drop_the_runs_databases(postgres_admin_url())


def _pg_unreachable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL tests cannot run under CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unreachable: {reason}")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database for this pytest session."""
    admin = make_url(postgres_admin_url())
    name = f"rackflow_test_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(
            admin.set(drivername="postgresql").render_as_string(False), autocommit=True, connect_timeout=5
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        _pg_unreachable(str(exc))
    url = admin.set(database=name).render_as_string(hide_password=False)
    _run(_migrate(url))
    yield url
    forget_connections(url)
    with psycopg.connect(admin.set(drivername="postgresql").render_as_string(False), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file; each test gets a copy."""
    path = tmp_path_factory.mktemp("sqlite") / "template.db"
    _run(_migrate(f"sqlite:///{path}"))
    return path


def sqlite_copy(template: Path, directory: Path, name: str = "rackflow.db") -> str:
    """The URL of a copy of the migrated SQLite template in `directory`: what `rackflow db migrate` would
    leave there, without a migration (a `rackflow db migrate` process took two seconds of CPU)."""
    path = directory / name
    shutil.copy(template, path)
    return f"sqlite:///{path}"


def _run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def _migrate(url: str) -> None:
    db = Database(url)
    try:
        await migrate(db)
    finally:
        await db.dispose()


# What `db_url` empties the session's PostgreSQL database with before each test: the rows of a test are
# few, and DELETE of them took 4 ms where TRUNCATE of every table took 330-470 ms (new files for each
# table and its indexes), paid by about a thousand tests. Dependent tables first.
EMPTY_EVERY_TABLE = "; ".join(f'DELETE FROM "{t.name}"' for t in reversed(metadata.sorted_tables))


@pytest.fixture(scope="session")
def sqlite_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where `db_url` puts each test's SQLite database on this worker: one path, so that its URL, like the
    PostgreSQL one, is the same from test to test and `db` keeps one engine for it."""
    return tmp_path_factory.mktemp("sqlite-db")


def fresh_sqlite_copy(template: Path, directory: Path) -> str:
    """`sqlite_copy` over whatever the last test left there: its files unlinked first, so that a connection
    it leaked (never the kept engine's, disposed at its end) holds the old file, not the new copy."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        (directory / f"rackflow.db{suffix}").unlink(missing_ok=True)
    return sqlite_copy(template, directory)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """A clean migrated database URL, once per backend; the same URL for every test of a worker."""
    if request.param == "sqlite":
        return fresh_sqlite_copy(
            request.getfixturevalue("sqlite_template"), request.getfixturevalue("sqlite_home")
        )
    url: str = request.getfixturevalue("postgres_url")
    conn = kept_connection(url)
    with conn.transaction():
        conn.execute(EMPTY_EVERY_TABLE)
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database with no schema at all, once per backend: for tests that migrate step by step."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    request.getfixturevalue("postgres_url")  # fails under CI, skips elsewhere, when unreachable
    with fresh_postgres_database(postgres_admin_url()) as url:
        yield url


def sqlite_threads() -> set[threading.Thread]:
    """aiosqlite's worker threads now running, one a connection."""
    return {t for t in threading.enumerate() if t.name.endswith("(_connection_worker_thread)")}


async def sqlite_threads_ended(threads: set[threading.Thread]) -> None:
    """Wait until `threads` (aiosqlite's workers) have ended. A connection that failed to open is stopped by
    aiosqlite through a future of the test's loop, which its thread completes a moment later, unawaited:
    with the loop closed by then, the thread dies with "Event loop is closed" in the next test."""
    for _ in range(500):
        if not any(t.is_alive() for t in threads):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"aiosqlite threads still running after 5 s: {threads}")


# The engine `db` gives each test of a worker on the same URL (`db_url`'s): SQLAlchemy keeps its compiled
# statements, and the dialect what it asked the server at the first connection, in the engine, so a new
# engine a test compiled every statement again (a quarter of a store test's CPU on PostgreSQL). A test's
# connections belong to its event loop: `Database.dispose` closes them at its end and leaves the engine,
# and a test that listens to the engine's events stops listening before it ends.
_KEPT_ENGINES: dict[str, AsyncEngine] = {}


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[Database]:
    database = Database(db_url)
    database.engine = _KEPT_ENGINES.setdefault(db_url, database.engine)
    yield database
    await database.dispose()


def migrate_with_cli(url: str) -> None:
    """`rackflow db migrate --db URL`, as an operator would run it before starting servers."""
    subprocess.run(
        [sys.executable, "-m", "rackflow", "db", "migrate", "--db", url], check=True, capture_output=True
    )


@pytest.fixture(scope="session")
def pg_template(postgres_url: str) -> str:
    """The name of a PostgreSQL database migrated once per run by `rackflow db migrate`, as an operator
    would, and never connected to afterwards: `pg_db` copies it, where migrating each test's database
    anew took a process and two seconds of CPU. One for every worker of the run (`built_once`)."""

    def migrated(url: str) -> str:
        migrate_with_cli(url)
        name = make_url(url).database
        assert name is not None
        return name

    return built_once(postgres_admin_url(), None, "template", migrated)


@pytest.fixture
def pg_db(pg_template: str) -> Iterator[str]:
    """A migrated PostgreSQL database of its own, for tests that start real `rackflow serve` processes."""
    with fresh_postgres_database(postgres_admin_url(), template=pg_template) as url:
        yield url


def served_sqlite_copy(template: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A copy of the migrated SQLite template for one module's servers."""
    return sqlite_copy(template, tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def served_db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database shared by one module's real servers: once on SQLite, once on PostgreSQL. A copy
    of the session's template (`sqlite_template`, `pg_template`), where migrating each anew took a process
    and two seconds of CPU."""
    if request.param == "sqlite":
        yield served_sqlite_copy(request.getfixturevalue("sqlite_template"), tmp_path_factory)
    else:
        pg_template: str = request.getfixturevalue("pg_template")  # fails under CI when unreachable
        with fresh_postgres_database(postgres_admin_url(), template=pg_template) as url:
            yield url


# Tables whose rows a trigger derives from other tables' as they are written, which `table_counts` leaves
# out: the weeks of tasks created late (0063; tests/store/test_migration_0063.py checks them).
DERIVED_TABLES = {"task_late_weeks"}


async def table_counts(db: Database) -> dict[str, int]:
    """Row count of every table but the DERIVED_TABLES: tests assert a refused request left these unchanged.
    The audit trail's partitions (PostgreSQL, migration 0028) are not tables of `metadata`: `audit_events`
    counts their rows."""
    async with db.read() as conn:
        present = set(await conn.run_sync(lambda sync: sync.dialect.get_table_names(sync)))
        return {
            t.name: (await conn.execute(text(f'SELECT count(*) FROM "{t.name}"'))).scalar_one()
            for t in metadata.sorted_tables
            if t.name in present and t.name not in DERIVED_TABLES  # an older revision lacks the later tables
        }


async def stored_rows(db: Database) -> dict[str, Any]:
    """Every table's rows exactly as stored, by table name (the empty ones left out): PostgreSQL's COPY text,
    SQLite's values as its driver reads them. Not through the tables' types, which read a JSON column's SQL
    NULL and its JSON null alike, as None."""
    found: dict[str, Any] = {}
    async with db.read() as conn:
        for table in metadata.sorted_tables:
            select_all = f'SELECT * FROM "{table.name}"'
            if db.is_postgres:
                raw = (await conn.get_raw_connection()).driver_connection
                async with raw.cursor() as cursor, cursor.copy(f"COPY ({select_all}) TO STDOUT") as copy:
                    rows: Any = b"".join([bytes(chunk) async for chunk in copy])
            else:
                rows = [tuple(row) for row in await conn.exec_driver_sql(select_all)]
            if rows:
                found[table.name] = rows
    return found


# The rows a migration writes into a table it creates, which triggers keep from then on: the domain list's
# token (0059).
MIGRATIONS_ROWS = {"domain_list_version": 1, "task_live_weeks": 1}


async def write_back_rows(db: Database, found: dict[str, Any]) -> None:
    """Write the rows `stored_rows` read into the same (empty) tables, references first (metadata's order).
    The rows a migration wrote (`MIGRATIONS_ROWS`) are left out: a migrated copy already holds them, and
    their triggers write them anew as the rows they follow are written."""
    async with db.transaction() as conn:
        for name, rows in found.items():
            if name in MIGRATIONS_ROWS:
                continue
            if db.is_postgres:
                raw = (await conn.get_raw_connection()).driver_connection
                async with raw.cursor() as cursor, cursor.copy(f'COPY "{name}" FROM STDIN') as copy:
                    await copy.write(rows)
            else:
                marks = ", ".join("?" * len(rows[0]))
                await conn.exec_driver_sql(f'INSERT INTO "{name}" VALUES ({marks})', rows)


@asynccontextmanager
async def database_at(url: str, revision: str) -> AsyncIterator[Database]:
    """The empty database at `url` migrated to `revision` and no further: an upgrade test writes there what
    that release wrote, then migrates on."""
    db = Database(url)
    try:
        assert await migrate(db, revision) == revision
        yield db
    finally:
        await db.dispose()


async def downgrade(db: Database, revision: str) -> None:
    """Take the database back down to `revision` (alembic's downgrade, in one transaction): a migration test
    checks that its downgrade leaves what the older release reads."""

    async with db.engine.begin() as conn:
        await conn.run_sync(run_scripts, revision, down=True)


def upgraded_counts(before: dict[str, int]) -> dict[str, int]:
    """What `table_counts` must read once a database counted at an older revision is upgraded to the head:
    every table kept its rows, and every table a later revision created is there, empty but for the rows
    its migration writes (`MIGRATIONS_ROWS`)."""
    made = (t.name for t in metadata.sorted_tables if t.name not in DERIVED_TABLES)
    return {**dict.fromkeys(made, 0), **MIGRATIONS_ROWS, **before}


def schedule_row(schedule_id: uuid.UUID, name: str, at: datetime) -> dict[str, object]:
    """A schedule's row with only the columns every revision has (0001): an upgrade test writes it at an
    older revision, as that release would have."""
    return {
        "id": schedule_id,
        "name": name,
        "spec_type": "interval",
        "spec": "1h",
        "operation_template": {"operation": {"kind": "power_off"}},
        "created_at": at,
        "updated_at": at,
    }


async def run_recorded(
    db: Database, schedule_id: uuid.UUID, fired_at: datetime, slot: datetime | None, state: str = "running"
) -> bool:
    """Whether a firing of `schedule_id` for `slot` (None: manual) in `state` is recorded, as phase 1 records
    it (`runs.insert_runs`: the unique indexes, and on PostgreSQL the live runs' trigger, leave a second one
    out), with only the columns every revision has: an upgrade test asks it at an older revision too."""
    row = {
        "id": new_id(),
        "schedule_id": schedule_id,
        "fired_at": fired_at,
        "scheduled_for": slot,
        "trigger": "dispatch" if slot else "manual",
        "state": state,
        "outcomes": [],
    }
    statement, values = insert_rows(db.dialect, task_schedule_run, [row], new_only=True)
    async with db.transaction() as conn:
        recorded = await conn.execute(statement.returning(task_schedule_run.c.id), values)
        return set(recorded.scalars()) == {row["id"]}


def task_row(task_id: uuid.UUID, rack_id: uuid.UUID, at: datetime, **later: object) -> dict[str, object]:
    """A completed power-off task's row with only the columns every revision has (0001), plus `later` ones
    the test's revision has (`run_id`, `schedule_id`)."""
    return {
        "id": task_id,
        "operation": "power_off",
        "parameters": {"kind": "power_off"},
        "rack_id": rack_id,
        "component_ids": [],
        "status": "completed",
        "created_at": at,
        "updated_at": at,
        **later,
    }
