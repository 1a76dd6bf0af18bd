"""A component's BMC endpoint stored and read back, and a refused one writing nothing, on both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from rackflow.api.convert.inventory import component_specs_from, rack_to
from rackflow.clock import SystemClock
from rackflow.domain.inventory import Bmc, ComponentSpec, ComponentType
from rackflow.errors import AlreadyExists, InvalidArgument
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
    read = await InventoryService(db, CLOCK).get_rack(rack.id)
    found = {c.name: c for c in read.components}
    assert found["node-0"].bmc == BMC
    assert found["n1"].bmc is None
    async with db.read() as conn:
        rows = (await conn.execute(select(components.c.name, components.c.bmc_credentials))).all()
    assert sorted(rows) == [("n1", None), ("node-0", "env:BMC_RACK1")]
    sent = {c.name: c for c in rack_to(read).components}
    assert sent["node-0"].bmc == pb.BmcEndpoint(
        url="https://10.0.0.5", resource="Systems/1", credentials="env:BMC_RACK1"
    )
    assert not sent["n1"].HasField("bmc")


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


@pytest.mark.parametrize("rpc", ["create_rack", "add_components"])
async def test_a_component_that_lost_a_race_is_refused_naming_its_field(
    db: Database, monkeypatch: pytest.MonkeyPatch, rpc: str
) -> None:
    """Two requests at once for one external id (or BMC resource): both pass the pre-check, the loser's
    insert hits the unique index, whose error knew neither the request's field nor the holder, so the
    loser read `external_id: a component of the same type with one of 'X' already exists` (the field read
    as the rack's), or `components.bmc: … one of …`. It is now told what the pre-check would have told it."""
    from rackflow.inventory import service as inventory

    svc = InventoryService(db, SystemClock())
    holder = await svc.create_rack("holder")
    await svc.add_components(
        holder.id, [ComponentSpec(ComponentType.COMPUTE, "node-0", external_id="SN-1", bmc=BMC)]
    )
    target = await svc.create_rack("target")
    real = (inventory._refuse_taken_external_ids, inventory._refuse_taken_bmc_resources)
    blind = [True, True]  # each pre-check misses once: the other request has not committed yet

    def missing_once(index: int) -> object:
        async def check(*args: object) -> None:
            if blind[index]:
                blind[index] = False
                return
            await real[index](*args)

        return check

    monkeypatch.setattr(inventory, "_refuse_taken_external_ids", missing_once(0))
    monkeypatch.setattr(inventory, "_refuse_taken_bmc_resources", missing_once(1))
    spec = ComponentSpec(ComponentType.COMPUTE, "node-1", external_id="SN-1", bmc=BMC)
    with pytest.raises(AlreadyExists) as caught:
        if rpc == "create_rack":
            await svc.create_rack("loser", components=[spec])
        else:
            await svc.add_components(target.id, [spec])
    assert str(caught.value).startswith("components[0].")
    assert "of rack 'holder'" in str(caught.value) or "external_id 'SN-1' already exists" in str(caught.value)
