"""A component's BMC endpoint stored and read back, and a refused one writing nothing, on both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from rackflow.api.convert.inventory import component_specs_from, component_to
from rackflow.clock import SystemClock
from rackflow.domain.inventory import Bmc, ComponentSpec, ComponentType
from rackflow.errors import InvalidArgument
from rackflow.inventory.service import InventoryService
from rackflow.store.db import Database
from rackflow.store.tables import components
from rackflow.v1 import flow_pb2 as pb
from tests.conftest import table_counts
from tests.unit.test_redfish_inventory import BMC, spec_msg

CLOCK = SystemClock()


async def test_bmc_is_stored_as_a_reference_and_read_back(db: Database) -> None:
    specs = [ComponentSpec(ComponentType.COMPUTE, "node-0", bmc=BMC)]
    specs.append(ComponentSpec(ComponentType.COMPUTE, "n1"))
    rack = await InventoryService(db, CLOCK).create_rack("r1", components=specs)
    found = {c.name: c for c in (await InventoryService(db, CLOCK).get_rack(rack.id)).components}
    assert found["node-0"].bmc == BMC
    assert found["n1"].bmc is None
    async with db.read() as conn:
        rows = (await conn.execute(select(components.c.name, components.c.bmc_credentials))).all()
    assert sorted(rows) == [("n1", None), ("node-0", "env:BMC_RACK1")]
    assert component_to(found["node-0"]).bmc == pb.BmcEndpoint(
        url="https://10.0.0.5", resource="Systems/1", credentials="env:BMC_RACK1"
    )
    assert not component_to(found["n1"]).HasField("bmc")


async def test_a_refused_bmc_writes_nothing(db: Database) -> None:
    before = await table_counts(db)
    with pytest.raises(InvalidArgument):
        specs = component_specs_from([spec_msg(url="https://x", resource="Storage/1", credentials="env:A")])
        await InventoryService(db, CLOCK).create_rack("r1", components=specs)
    assert await table_counts(db) == before


async def test_the_service_refuses_a_bad_bmc_from_any_caller(db: Database) -> None:
    """The converter checks at the door; the service checks again for callers that skip it."""
    before = await table_counts(db)
    bad = Bmc("https://10.0.0.5", "Systems/1", "admin:hunter2")
    with pytest.raises(InvalidArgument, match=r"^components\[0\]\.bmc\.credentials: expected env:NAME"):
        await InventoryService(db, CLOCK).create_rack(
            "r1", components=[ComponentSpec(ComponentType.COMPUTE, "n", bmc=bad)]
        )
    assert await table_counts(db) == before
