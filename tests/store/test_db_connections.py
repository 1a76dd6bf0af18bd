"""How `Database` uses its PostgreSQL connections: reads without a transaction, and pings only after idling.

The connections are killed from outside with `pg_terminate_backend`, as a database restart would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from rackflow.errors import Unavailable
from rackflow.store import dialect as dialects
from rackflow.store.db import Database

pytestmark = pytest.mark.postgres


@pytest.fixture
async def pg(postgres_url: str) -> AsyncIterator[Database]:
    database = Database(postgres_url, pool_size=1)
    yield database
    await database.dispose()


async def _backend_pid(db: Database) -> int:
    async with db.read() as conn:
        return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())


def _terminate(postgres_url: str, pid: int) -> None:
    url = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_connections_plan_each_run_of_a_prepared_statement_with_its_values(pg: Database) -> None:
    async with pg.read() as conn:
        assert (await conn.execute(text("SHOW plan_cache_mode"))).scalar_one() == dialects.PLAN_CACHE_MODE
    async with pg.transaction() as conn:
        assert (await conn.execute(text("SHOW plan_cache_mode"))).scalar_one() == "force_custom_plan"


async def test_connections_never_compile_a_statement_just_in_time(pg: Database) -> None:
    """JIT compiles a statement whose estimated cost passes `jit_above_cost`: the look for re-sends over
    a week of 10,000 events ran 30 ms and compiled for 650 (docs/PERFORMANCE.md). Off on every connection,
    whatever the server's default."""
    async with pg.read() as conn:
        assert (await conn.execute(text("SHOW jit"))).scalar_one() == dialects.JIT
    async with pg.transaction() as conn:
        assert (await conn.execute(text("SHOW jit"))).scalar_one() == "off"


async def test_connections_read_times_in_utc_whatever_the_servers_zone(pg: Database) -> None:
    """The session's zone is UTC, so psycopg hands times back in `timezone.utc` (not, for a server whose
    default is "Etc/UTC", a ZoneInfo that each read converts twice); the instants are the same."""
    moment = datetime(2026, 6, 1, 4, 0, 0, 123456, tzinfo=UTC)
    async with pg.read() as conn:
        assert (await conn.execute(text("SHOW TimeZone"))).scalar_one() == dialects.SESSION_TIME_ZONE
        back = (await conn.execute(text("SELECT CAST(:t AS timestamptz)"), {"t": moment})).scalar_one()
    assert back == moment and back.tzinfo is UTC


async def test_a_read_runs_outside_a_transaction(pg: Database) -> None:
    """Autocommit: each statement is its own transaction, so the second one starts a new one."""
    started = text("SELECT xact_start, query_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
    async with pg.read() as conn:
        await conn.execute(text("SELECT pg_sleep(0.02)"))
        xact_start, query_start = (await conn.execute(started)).one()
    assert xact_start == query_start
    async with pg.transaction() as conn:  # a write transaction still spans its statements
        await conn.execute(text("SELECT pg_sleep(0.02)"))
        xact_start, query_start = (await conn.execute(started)).one()
    assert xact_start < query_start


async def test_a_connection_that_died_while_idle_is_replaced_unseen(
    pg: Database, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dialects, "PING_AFTER_IDLE_S", 0.0)
    first = await _backend_pid(pg)
    _terminate(postgres_url, first)
    assert await _backend_pid(pg) != first  # no error: the checkout ping found it dead


async def test_a_busy_connection_is_not_pinged_and_one_request_sees_the_outage(
    pg: Database, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dialects, "PING_AFTER_IDLE_S", 3600.0)
    first = await _backend_pid(pg)
    _terminate(postgres_url, first)
    with pytest.raises(Unavailable, match="database unavailable"):
        await _backend_pid(pg)
    assert await _backend_pid(pg) != first  # the pool let the dead connection go


async def test_a_lock_wait_the_database_ended_says_so_not_that_the_database_is_down(
    pg: Database, postgres_url: str
) -> None:
    """A statement whose wait for a lock PostgreSQL ended (here its lock_timeout; a deadlock alike) is
    UNAVAILABLE, to be tried again, but not "database unavailable": the database is up, another transaction
    held the row. That message sent operators looking for an outage."""
    url = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(url) as holder:
        holder.execute("CREATE TABLE IF NOT EXISTS lock_wait_probe (id int PRIMARY KEY)")
        holder.execute("INSERT INTO lock_wait_probe VALUES (1) ON CONFLICT DO NOTHING")
        holder.commit()
        holder.execute("SELECT id FROM lock_wait_probe WHERE id = 1 FOR UPDATE")  # held until the end
        with pytest.raises(Unavailable) as raised:
            async with pg.transaction() as conn:
                await conn.execute(text("SET LOCAL lock_timeout = '100ms'"))
                await conn.execute(text("SELECT id FROM lock_wait_probe WHERE id = 1 FOR UPDATE"))
        holder.rollback()
        holder.execute("DROP TABLE lock_wait_probe")
        holder.commit()
    assert str(raised.value).startswith("try again: the database ended this call's wait"), raised.value
    assert "database unavailable" not in str(raised.value)
    assert dialects.waited_too_long_for_a_lock(raised.value.__cause__ or raised.value)
