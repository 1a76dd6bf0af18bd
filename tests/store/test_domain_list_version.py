"""The whole NVLink domain list kept by each server and read again only when it changed (migration 0059), on
both databases: every change to the domains or their racks' membership replaces the token, whoever makes
it; a change to anything else keeps it; a server answers the whole list from what it kept while the token
is the one it read, and reads it again, exactly as it is, once another server or an operator's SQL changed
it. On PostgreSQL the token is replaced once a transaction, at its commit: racks written as many statements
write its row once, and a writer waiting for a rack another holds does not hold the row meanwhile."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from sqlalchemy import delete, insert, text

from rackflow.domain.inventory import ComponentSpec, ComponentType, ListedDomain
from rackflow.store import inventory as store
from rackflow.store.db import Database
from rackflow.store.tables import domain_list_version, racks
from tests.store.query_plans import queries, statements_sent
from tests.store.schedules_support import START, Env, make_env

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def other(db_url: str) -> AsyncIterator[Env]:
    """A second server's services on the same database: its own engine, its own kept list."""
    db = Database(db_url)
    try:
        yield make_env(db)
    finally:
        await db.dispose()


async def _token(db: Database) -> str | None:
    async with db.read() as conn:
        return await store.domain_list_token(conn)


async def _sql(db: Database, statement: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(text(statement))


async def _read_afresh(db: Database) -> tuple[list[ListedDomain], int]:
    """The whole list as the store reads it, past any server's kept list."""
    async with db.read() as conn:
        return await store.list_domains(conn)


async def test_every_change_to_the_domains_or_their_membership_replaces_the_token(db: Database) -> None:
    env = make_env(db)
    inventory = env.services.inventory
    seen: list[str | None] = [await _token(db)]
    spare, kept = await env.rack("spare"), await env.rack("kept")
    first = await inventory.create_domain("d-first")

    async def made(change: Callable[[], Awaitable[object]], replaces: bool) -> None:
        await change()
        token = await _token(db)
        assert token is not None
        assert (token not in seen) is replaces, (change, token, seen)
        seen.append(token)

    await made(lambda: inventory.create_domain("d-second", [spare.id]), True)  # a domain, a rack joining
    await made(lambda: inventory.create_rack("joined", nvl_domain_id=first.id), True)
    await made(lambda: inventory.create_rack("alone"), True)  # an insert of racks, in a domain or not
    await made(lambda: inventory.delete_rack(spare.id), True)
    await made(lambda: _sql(db, "UPDATE racks SET nvl_domain_id = NULL WHERE name = 'joined'"), True)
    await made(lambda: _sql(db, "UPDATE nvl_domains SET name = 'd-renamed' WHERE name = 'd-second'"), True)
    await made(lambda: _sql(db, "DELETE FROM nvl_domains WHERE name = 'd-renamed'"), True)
    # Not in the list: a rack's name, its components.
    await made(lambda: _sql(db, "UPDATE racks SET name = 'renamed' WHERE name = 'kept'"), False)
    await made(lambda: inventory.add_components(kept.id, [ComponentSpec(ComponentType.COMPUTE, "c9")]), False)
    if db.is_postgres:
        await made(lambda: _sql(db, "TRUNCATE nvl_domains CASCADE"), True)
        await made(lambda: _sql(db, "TRUNCATE racks CASCADE"), True)


async def test_the_whole_list_is_read_again_only_after_a_change(db: Database, other: Env) -> None:
    env = make_env(db)
    ours, theirs = env.services.inventory, other.services.inventory
    joined = await env.rack("joined")
    await theirs.create_domain("d-one", [joined.id])

    assert await ours.list_domains() == await _read_afresh(db)
    with statements_sent(db) as sent:
        kept = await ours.list_domains()
    assert kept == await _read_afresh(db)
    [token_read] = queries(sent)  # the token alone
    assert "domain_list_version" in token_read

    async def answered_as_read_afresh(change: Callable[[], Awaitable[object]]) -> None:
        """After `change`, the whole list is read again and is the database's."""
        await change()
        with statements_sent(db) as sent:
            listed = await ours.list_domains()
        assert listed == await _read_afresh(db)
        assert len(queries(sent)) > 1, sent

    await answered_as_read_afresh(lambda: theirs.create_domain("d-two"))
    await answered_as_read_afresh(lambda: theirs.create_rack("late", nvl_domain_id=uuid.UUID(kept[0][0].id)))
    await answered_as_read_afresh(lambda: theirs.delete_rack(joined.id))
    await answered_as_read_afresh(lambda: _sql(db, "UPDATE racks SET nvl_domain_id = NULL"))
    assert [domain.rack_ids for domain in (await ours.list_domains())[0]] == [[], []]

    # A page, or a list by ids or names, is read each time, not kept.
    with statements_sent(db) as sent:
        await ours.list_domains(limit=1)
        await ours.list_domains(names=["d-one"])
    assert not any("domain_list_version" in statement for statement in queries(sent)), sent


async def test_a_token_deleted_by_hand_keeps_nothing_until_a_change_makes_it_again(
    db: Database, other: Env
) -> None:
    ours = make_env(db).services.inventory
    await other.services.inventory.create_domain("d-one")
    async with db.transaction() as conn:
        await conn.execute(delete(domain_list_version))

    for _ in range(2):
        with statements_sent(db) as sent:
            assert await ours.list_domains() == await _read_afresh(db)
        assert len(queries(sent)) > 1, sent  # no token: read each time

    await other.services.inventory.create_domain("d-two")
    assert await _token(db) is not None
    await ours.list_domains()
    with statements_sent(db) as sent:
        listed, total = await ours.list_domains()
    assert len(queries(sent)) == 1 and [d.name for d in listed] == ["d-one", "d-two"] and total == 2


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_many_racks_made_in_one_transaction_replace_the_token_once(db: Database) -> None:
    """The trigger runs once a rack, and a list of racks written as many rows (psycopg's executemany, as
    tests and scripts load a fleet) was a statement a rack when it ran once a statement. Each replaced the
    one row again in the same transaction, whose versions PostgreSQL then follows from the first on every
    update: 20,000 racks took 28 s to write where they took 6. The token is replaced once a transaction."""
    rows = [{"id": uuid.uuid4(), "name": f"bulk-{i}", "created_at": START} for i in range(300)]
    async with db.transaction() as conn:
        await conn.execute(insert(racks), rows)
        await conn.execute(text("SET CONSTRAINTS ALL IMMEDIATE"))  # the commit's triggers, fired now
        written = await conn.execute(
            text(
                "SELECT n_tup_ins + n_tup_upd FROM pg_stat_xact_user_tables"
                " WHERE relname = 'domain_list_version'"
            )
        )
        assert written.scalar_one() == 1
    assert await _token(db) is not None


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_a_domain_made_beside_a_rack_deleted_neither_waits_for_the_other_s_token(db: Database) -> None:
    """A transaction that made a domain and then puts a rack in it, beside one that locked that rack and then
    deletes it. Were the token replaced by the first statement that changed the list, the first would hold
    its row while waiting for the rack, and the second hold the rack while waiting for the row: a deadlock,
    which PostgreSQL ends by failing one. The token is replaced at commit, the last lock either takes."""
    env = make_env(db)
    rack = await env.rack("contested")
    async with db.engine.connect() as making, db.engine.connect() as deleting:
        await making.begin()
        await deleting.begin()
        await making.execute(
            text("INSERT INTO nvl_domains VALUES (:id, 'd-new', now())"), {"id": uuid.uuid4()}
        )
        await deleting.execute(text("SELECT 1 FROM racks WHERE id = :id FOR UPDATE"), {"id": rack.id})
        joined = asyncio.create_task(
            making.execute(
                text(
                    "UPDATE racks SET nvl_domain_id = (SELECT id FROM nvl_domains WHERE name = 'd-new')"
                    " WHERE id = :id"
                ),
                {"id": rack.id},
            )
        )
        await asyncio.sleep(0.2)  # the update waits for the rack's lock
        await asyncio.wait_for(
            deleting.execute(text("DELETE FROM racks WHERE id = :id"), {"id": rack.id}), 10
        )
        await deleting.commit()
        assert (await asyncio.wait_for(joined, 10)).rowcount == 0  # the rack was gone when its lock came
        await making.commit()
    assert [d.name for d in (await _read_afresh(db))[0]] == ["d-new"]
