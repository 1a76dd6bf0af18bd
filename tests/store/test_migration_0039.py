"""Migration 0039 on a database holding components with and without a BMC, on both databases: each keyed by
its resource whatever the spelling, the key unique from then on; components that already share a resource
refuse the migration, listing them, until one is removed; and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, delete, insert, inspect, select

from rackflow.domain.bmc import stored_resource_key
from rackflow.domain.inventory import Bmc, ComponentSpec, ComponentType
from rackflow.errors import AlreadyExists, FailedPrecondition
from rackflow.store import inventory as store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import components, racks
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
INDEX = "uq_components_bmc_resource_key"


@pytest.fixture
async def db_at_0038(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0038") as db:
        yield db


async def _rack(db: Database, name: str, *endpoints: tuple[str, str] | None) -> dict[str, uuid.UUID]:
    """A rack with a component per endpoint (url, resource; None: no BMC), as release 0038 stored them:
    each component's id by name (c0, c1, …)."""
    rack_id, ids = uuid.uuid4(), {}
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack_id, name=name, created_at=T0))
        for n, endpoint in enumerate(endpoints):
            ids[f"c{n}"] = uuid.uuid4()
            url, resource = endpoint or (None, None)
            await conn.execute(
                insert(components).values(
                    id=ids[f"c{n}"],
                    rack_id=rack_id,
                    type="COMPUTE",
                    name=f"c{n}",
                    created_at=T0,
                    bmc_url=url,
                    bmc_resource=resource,
                    bmc_credentials="env:BMC" if endpoint else None,
                )
            )
    return ids


async def _keys(db: Database) -> dict[uuid.UUID, str | None]:
    async with db.read() as conn:
        rows = await conn.execute(select(components.c.id, components.c.bmc_resource_key))
        return {row.id: row.bmc_resource_key for row in rows}


async def _rack_id(db: Database, name: str) -> uuid.UUID:
    async with db.read() as conn:
        return (await store.racks_by_column(conn, "name", [name]))[name]


def _has_index(conn: Connection) -> bool:
    return any(index["name"] == INDEX for index in inspect(conn).get_indexes("components"))


async def test_components_are_keyed_by_resource_and_it_is_unique_from_then_on(db_at_0038: Database) -> None:
    db = db_at_0038
    r1 = await _rack(db, "r1", ("https://BMC-7.lab", "1"), None, ("https://bmc-7.lab:99999", "Systems/1"))
    r2 = await _rack(db, "r2", ("https://bmc-7.lab/redfish/v1/", "Systems/2"))
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    # No BMC, or an endpoint that does not parse (a port out of range, once stored): no key.
    assert await _keys(db) == {
        r1["c0"]: stored_resource_key(Bmc("https://bmc-7.lab:443/redfish/v1", "Systems/1", "")),
        r1["c1"]: None,
        r1["c2"]: None,
        r2["c0"]: stored_resource_key(Bmc("https://bmc-7.lab", "Systems/2", "")),
    }
    # The index holds what the inventory's pre-check would refuse, should a race let it past.
    taken = ComponentSpec(
        ComponentType.COMPUTE, "again", bmc=Bmc("https://bmc-7.lab.:443", "/Systems/1/", "env:X")
    )
    with pytest.raises(AlreadyExists, match=r"^components\.bmc: a component acting on one of "):
        async with db.transaction() as conn:
            await store.insert_components(conn, await _rack_id(db, "r2"), [taken], T0)

    await downgrade(db, "0038")
    assert await current_revision(db) == "0038"
    async with db.engine.connect() as conn:
        assert not await conn.run_sync(_has_index)
        columns = await conn.run_sync(lambda c: {col["name"] for col in inspect(c).get_columns("components")})
    assert "bmc_resource_key" not in columns


async def test_components_already_sharing_a_resource_refuse_it_until_one_is_removed(
    db_at_0038: Database,
) -> None:
    db = db_at_0038
    await _rack(db, "r1", ("https://bmc-7.lab", "Systems/1"))
    r2 = await _rack(db, "r2", ("https://BMC-7.lab:443/redfish/v1/", "1"), ("https://bmc-8.lab", "1"))

    with pytest.raises(FailedPrecondition) as refused:
        await migrate(db)
    message = str(refused.value)
    assert "2 components share 1 resource(s)" in message
    assert "rack 'r1' component 'c0'" in message
    assert f"rack 'r2' component 'c0' ({r2['c0']}): https://BMC-7.lab:443/redfish/v1/ 1" in message
    assert "bmc-8.lab" not in message
    assert "run `rackflow db migrate` again" in message
    # Nothing of it in force: still 0038, no index (on PostgreSQL the column and its keys wait for the
    # next try, which goes on from them).
    assert await current_revision(db) == "0038"
    async with db.engine.connect() as conn:
        assert not await conn.run_sync(_has_index)

    async with db.transaction() as conn:
        await conn.execute(delete(components).where(components.c.id == r2["c0"]))
    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert sum(key is not None for key in (await _keys(db)).values()) == 2
