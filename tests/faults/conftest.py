"""Fault-injection fixtures: a PostgreSQL database of one's own, and ways to take it away.

The PostgreSQL server is shared with other test sessions, so it is never restarted: an outage is made by
refusing new connections to this test's database only (`ALLOW_CONNECTIONS false`) and terminating the
backends it has (`pg_terminate_backend`). To rackflow that is what a restart looks like: every pooled
connection dies mid-use, and reconnecting fails until the database is back.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql
from sqlalchemy.engine import make_url

from tests.conftest import postgres_admin_url
from tests.e2e.cluster import fresh_postgres_database


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def own_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A migrated database of its own, once per backend (SQLite: `rackflow.db` in a directory of its own,
    `tmp_path / "db"`, which a test may move away to make an outage)."""
    if request.param == "sqlite":
        (tmp_path / "db").mkdir()
        shutil.copy(request.getfixturevalue("sqlite_template"), tmp_path / "db" / "rackflow.db")
        yield f"sqlite:///{tmp_path / 'db' / 'rackflow.db'}"
        return
    template = request.getfixturevalue("pg_template")  # fails under CI, skips elsewhere, when unreachable
    with fresh_postgres_database(postgres_admin_url(), template=template) as url:
        yield url


def _admin() -> psycopg.Connection[tuple[object, ...]]:
    url = make_url(postgres_admin_url()).set(drivername="postgresql").render_as_string(False)
    return psycopg.connect(url, autocommit=True, connect_timeout=5)


def terminate_backends(db_url: str) -> int:
    """Kill every connection to the database of `db_url`; returns how many there were."""
    name = make_url(db_url).database
    with _admin() as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchall()
    return len(rows)


def allow_connections(db_url: str, allowed: bool) -> None:
    name = make_url(db_url).database
    assert name is not None
    statement = pgsql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
        pgsql.Identifier(name), pgsql.SQL("true" if allowed else "false")
    )
    with _admin() as conn:
        conn.execute(statement)


@contextmanager
def terminating(db_url: str, every: float = 0.1) -> Iterator[list[int]]:
    """Terminate the database's backends every `every` seconds while the block runs (connections come
    back at once: a flapping network). Yields the running list of how many were killed each time."""
    killed: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            killed.append(terminate_backends(db_url))
            stop.wait(every)

    thread = threading.Thread(target=loop, name="terminator", daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def database_down(db_url: str) -> Iterator[None]:
    """The database is gone while the block runs: new connections refused, existing ones killed
    (repeatedly, in case one slipped in between). Always back afterwards."""
    allow_connections(db_url, False)
    try:
        with terminating(db_url, every=0.25):
            yield
    finally:
        allow_connections(db_url, True)
        time.sleep(0.05)
