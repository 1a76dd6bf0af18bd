"""`keyed_reads.fetch_by_key`, the driver-level path of the hottest reads (GetTaskSchedule): the same rows
as SQLAlchemy's, concurrent callers answered together, and on PostgreSQL its own connection replaced when
it dies."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC

import psycopg
import pytest
from sqlalchemy.engine import make_url

from rackflow.errors import Unavailable
from rackflow.store import schedules as store
from rackflow.store.db import Database
from tests.store.schedules_support import Env, make_env


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
        (close,) = db.on_dispose  # closes the keyed reads' connection, outside the pool
        own = close.__self__
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
