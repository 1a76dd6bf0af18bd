"""`Database.fetch`, the driver-level path of the hottest reads: the same rows as SQLAlchemy's, and on
PostgreSQL the same connection hygiene (autocommit put back, dead connections dropped)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC

import psycopg
import pytest
from sqlalchemy import func, literal, select, text
from sqlalchemy.engine import make_url

from rackflow.errors import Unavailable
from rackflow.store import db as db_module
from rackflow.store import schedules as store
from rackflow.store.db import Database
from tests.store.schedules_support import Env, make_env

ONE = select(literal(1).label("one"))
PID = select(func.pg_backend_pid().label("pid"))


def terminate(postgres_url: str, pid: int) -> None:
    url = make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def test_fetch_reads_what_the_sqlalchemy_path_reads(env: Env) -> None:
    made = await env.schedule("nightly", racks=[await env.rack("r1")])
    async with env.db.read() as conn:
        expected = await store.get_schedule(conn, made.id)
    fetched = await store.fetch_schedule(env.db, made.id)
    assert fetched == expected == made
    assert fetched is not None and fetched.created_at.tzinfo is UTC


async def test_fetch_of_an_unknown_id_is_none(env: Env) -> None:
    made = await env.schedule("nightly", racks=[await env.rack("r1")])
    await env.services.schedules.delete(made.id)
    assert await store.fetch_schedule(env.db, made.id) is None


@pytest.mark.postgres
async def test_fetch_hands_back_a_connection_that_still_opens_transactions(postgres_url: str) -> None:
    db = Database(postgres_url, pool_size=1)  # one connection: the fetch's and the transaction's
    try:
        assert [row.one for row in await db.fetch(ONE, {})] == [1]
        started = text("SELECT xact_start, query_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        async with db.transaction() as conn:
            await conn.execute(text("SELECT pg_sleep(0.02)"))
            xact_start, query_start = (await conn.execute(started)).one()
        assert xact_start < query_start  # not left in autocommit
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_fetch_on_a_dead_connection_is_unavailable_once(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE_S", 3600.0)  # no checkout ping to hide the death
    db = Database(postgres_url, pool_size=1)
    try:
        async with db.read() as conn:
            pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        terminate(postgres_url, pid)
        with pytest.raises(Unavailable, match="database unavailable"):
            await db.fetch(ONE, {})
        assert (await db.fetch(PID, {}))[0].pid != pid  # a new connection
    finally:
        await db.dispose()


@pytest.mark.postgres
async def test_fetch_replaces_a_connection_that_died_while_idle_unseen(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE_S", 0.0)  # every checkout pings
    db = Database(postgres_url, pool_size=1)
    try:
        pid = (await db.fetch(PID, {}))[0].pid
        terminate(postgres_url, pid)
        assert (await db.fetch(PID, {}))[0].pid != pid  # no error: the checkout ping found it dead
    finally:
        await db.dispose()


async def test_concurrent_gets_each_receive_their_own_schedule(env: Env) -> None:
    made = [await env.schedule(f"s{i}", racks=[await env.rack(f"r{i}")]) for i in range(5)]
    gone = await env.schedule("gone", racks=[await env.rack("r-gone")])
    await env.services.schedules.delete(gone.id)
    wanted = [m.id for m in made] * 2 + [gone.id]  # a key asked twice in one round is answered twice
    got = await asyncio.gather(*(store.fetch_schedule(env.db, i) for i in wanted))
    assert got == [*made, *made, None]


async def test_a_get_sees_a_write_committed_before_it_was_asked(env: Env) -> None:
    made = await env.schedule("nightly", racks=[await env.rack("r1")])
    reading = [asyncio.ensure_future(store.fetch_schedule(env.db, made.id)) for _ in range(3)]
    await env.services.schedules.pause(made.id, reason="x")
    after = await store.fetch_schedule(env.db, made.id)  # queued after the pause committed
    assert after is not None and after.pause is not None
    assert all(r is not None for r in await asyncio.gather(*reading))


@pytest.mark.postgres
async def test_keyed_reads_replace_their_connection_when_it_died_while_idle(postgres_url: str) -> None:
    db = Database(postgres_url, pool_size=1)
    env = make_env(db)
    try:
        suffix = uuid.uuid4().hex[:8]  # this database is not emptied between tests
        made = await env.schedule(f"nightly-{suffix}", racks=[await env.rack(f"r-{suffix}")])
        assert await store.fetch_schedule(db, made.id) == made
        (own,) = db._own_connections  # the keyed reads' connection, outside the pool
        assert own._conn is not None
        terminate(postgres_url, own._conn.info.backend_pid)
        assert await store.fetch_schedule(db, made.id) == made  # no error: a new connection, at once
    finally:
        await db.dispose()


async def test_keyed_reads_are_unavailable_when_the_database_cannot_be_reached() -> None:
    db = Database("postgresql://postgres@127.0.0.1:1/nowhere")
    try:
        with pytest.raises(Unavailable, match="database unavailable"):
            await store.fetch_schedule(db, uuid.uuid4())
    finally:
        await db.dispose()
