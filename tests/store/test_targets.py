"""Resolving target specs to rack selections, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert

from rackflow.clock import FakeClock
from rackflow.domain.inventory import (
    ComponentsFilter,
    ComponentSpec,
    ComponentTarget,
    ComponentType,
    NVLDomainTarget,
    Rack,
    RackSelection,
    RackTarget,
    TargetSpec,
    TypesFilter,
)
from rackflow.errors import InvalidArgument, NotFound
from rackflow.inventory.service import InventoryService
from rackflow.inventory.targets import resolve_targets
from rackflow.store.db import Database
from rackflow.store.tables import racks as racks_table
from tests.store.query_plans import queries, statements_sent

COMPUTE = ComponentType.COMPUTE
NVSWITCH = ComponentType.NVSWITCH
UNKNOWN = ComponentType.UNKNOWN


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(datetime(2026, 3, 1, tzinfo=UTC))


@pytest.fixture
def inventory(db: Database, clock: FakeClock) -> InventoryService:
    return InventoryService(db, clock)


@pytest.fixture
async def racks(inventory: InventoryService, clock: FakeClock) -> list[Rack]:
    """r0..r2, oldest first, each with a compute node and an NVSwitch; r0's switch reuses id node-0."""
    made = []
    for i in range(3):
        made.append(
            await inventory.create_rack(
                f"r{i}",
                f"rack-ext-{i}",
                components=[
                    ComponentSpec(COMPUTE, f"c{i}", external_id=f"node-{i}"),
                    ComponentSpec(NVSWITCH, f"s{i}", external_id="node-0" if i == 0 else f"sw-{i}"),
                ],
            )
        )
        clock.advance(timedelta(seconds=1))
    return made


async def resolve(db: Database, spec: TargetSpec) -> list[RackSelection]:
    """What a submission does with a target spec (`TaskManager.submit`): resolve it in its transaction."""
    async with db.transaction() as conn:
        return await resolve_targets(conn, spec)


def by_type(rack: Rack, ctype: ComponentType) -> uuid.UUID:
    return next(c.id for c in rack.components if c.type is ctype)


async def test_racks_by_id_name_and_external_id_keep_input_order(
    inventory: InventoryService, racks: list[Rack]
) -> None:
    spec = TargetSpec(
        racks=(
            RackTarget(external_id="rack-ext-2"),
            RackTarget(id=racks[0].id, component_types=(NVSWITCH, COMPUTE)),
            RackTarget(name="r1"),
        )
    )
    assert await resolve(inventory.db, spec) == [
        RackSelection(racks[2].id, None),
        RackSelection(racks[0].id, TypesFilter(frozenset({NVSWITCH, COMPUTE}))),
        RackSelection(racks[1].id, None),
    ]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (RackTarget(name="nope"), r"racks\[1\]: no rack with name 'nope'"),
        (RackTarget(external_id="nope"), r"racks\[1\]: no rack with external_id 'nope'"),
        (
            RackTarget(id=uuid.UUID(int=7)),
            r"racks\[1\]: no rack with id 00000000-0000-0000-0000-000000000007",
        ),
    ],
)
async def test_unknown_rack_is_not_found(
    inventory: InventoryService, racks: list[Rack], target: RackTarget, message: str
) -> None:
    with pytest.raises(NotFound, match=message):
        await resolve(inventory.db, TargetSpec(racks=(RackTarget(name="r0"), target)))


async def test_rack_reached_twice_is_invalid(inventory: InventoryService, racks: list[Rack]) -> None:
    spec = TargetSpec(racks=(RackTarget(id=racks[1].id), RackTarget(name="r0"), RackTarget(name="r1")))
    with pytest.raises(
        InvalidArgument, match=r"racks\[2\]: rack with name 'r1' is listed twice \(also .*racks\[0\]\)"
    ):
        await resolve(inventory.db, spec)


async def test_components_grouped_per_rack(inventory: InventoryService, racks: list[Rack]) -> None:
    spec = TargetSpec(
        components=(
            ComponentTarget(id=by_type(racks[1], NVSWITCH)),
            ComponentTarget(external_type=COMPUTE, external_id="node-0"),
            ComponentTarget(external_type=UNKNOWN, external_id="node-1"),  # one match: fine untyped
            ComponentTarget(external_type=NVSWITCH, external_id="node-0"),
        )
    )
    assert await resolve(inventory.db, spec) == [
        RackSelection(
            racks[1].id,
            ComponentsFilter(frozenset({by_type(racks[1], NVSWITCH), by_type(racks[1], COMPUTE)})),
        ),
        RackSelection(
            racks[0].id,
            ComponentsFilter(frozenset({by_type(racks[0], COMPUTE), by_type(racks[0], NVSWITCH)})),
        ),
    ]


async def test_untyped_ref_matching_several_types_is_ambiguous(
    inventory: InventoryService, racks: list[Rack]
) -> None:
    with pytest.raises(
        InvalidArgument, match=r"components\[0\]: external_id 'node-0' is ambiguous.*COMPUTE, NVSWITCH"
    ):
        await resolve(
            inventory.db,
            TargetSpec(components=(ComponentTarget(external_type=UNKNOWN, external_id="node-0"),)),
        )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (ComponentTarget(id=uuid.UUID(int=9)), r"components\[0\]: no component with id .*0009"),
        (
            ComponentTarget(external_type=COMPUTE, external_id="sw-1"),
            r"no COMPUTE component with external_id 'sw-1'",
        ),
        (ComponentTarget(external_type=UNKNOWN, external_id="zz"), r"no component with external_id 'zz'"),
    ],
)
async def test_unknown_component_is_not_found(
    inventory: InventoryService, racks: list[Rack], target: ComponentTarget, message: str
) -> None:
    with pytest.raises(NotFound, match=message):
        await resolve(inventory.db, TargetSpec(components=(target,)))


async def test_component_reached_twice_is_invalid(inventory: InventoryService, racks: list[Rack]) -> None:
    spec = TargetSpec(
        components=(
            ComponentTarget(external_type=NVSWITCH, external_id="sw-2"),
            ComponentTarget(id=by_type(racks[2], NVSWITCH)),
        )
    )
    with pytest.raises(InvalidArgument, match=r"components\[1\]: component .* is listed twice"):
        await resolve(inventory.db, spec)


async def test_domains_expand_to_their_racks(inventory: InventoryService, racks: list[Rack]) -> None:
    d1 = await inventory.create_domain("d1", [racks[2].id, racks[0].id])
    await inventory.create_domain("d2", [racks[1].id])
    spec = TargetSpec(
        nvl_domains=(NVLDomainTarget(name="d2", component_types=(COMPUTE,)), NVLDomainTarget(id=d1.id))
    )
    assert await resolve(inventory.db, spec) == [
        RackSelection(racks[1].id, TypesFilter(frozenset({COMPUTE}))),
        RackSelection(racks[0].id, None),
        RackSelection(racks[2].id, None),
    ]


async def test_domain_errors(inventory: InventoryService, racks: list[Rack]) -> None:
    d1 = await inventory.create_domain("d1", [racks[0].id])
    await inventory.create_domain("empty", [])
    with pytest.raises(NotFound, match=r"nvl_domains\[1\]: no NVLink domain with name 'nope'"):
        await resolve(
            inventory.db, TargetSpec(nvl_domains=(NVLDomainTarget(id=d1.id), NVLDomainTarget(name="nope")))
        )
    with pytest.raises(
        InvalidArgument, match=r"nvl_domains\[1\]: NVLink domain with name 'd1' is listed twice"
    ):
        await resolve(
            inventory.db, TargetSpec(nvl_domains=(NVLDomainTarget(id=d1.id), NVLDomainTarget(name="d1")))
        )
    with pytest.raises(InvalidArgument, match="select no rack"):
        await resolve(inventory.db, TargetSpec(nvl_domains=(NVLDomainTarget(name="empty"),)))
    # An empty domain next to a populated one is fine: the spec as a whole selects racks.
    spec = TargetSpec(nvl_domains=(NVLDomainTarget(name="empty"), NVLDomainTarget(name="d1")))
    assert await resolve(inventory.db, spec) == [RackSelection(racks[0].id, None)]


async def test_spec_shape_errors(inventory: InventoryService, racks: list[Rack]) -> None:
    with pytest.raises(InvalidArgument, match="no targets"):
        await resolve(inventory.db, TargetSpec())
    with pytest.raises(InvalidArgument, match="one kind of target"):
        await resolve(
            inventory.db, TargetSpec(racks=(RackTarget(name="r0"),), nvl_domains=(NVLDomainTarget(name="d"),))
        )
    with pytest.raises(InvalidArgument, match=r"racks\[0\]\.component_types"):
        await resolve(inventory.db, TargetSpec(racks=(RackTarget(name="r0", component_types=(UNKNOWN,)),)))


async def test_ten_thousand_rack_targets_are_batched(db: Database, inventory: InventoryService) -> None:
    """10,000 racks by id, name and external id: a few IN queries per kind (chunks of 1,000)."""
    rack_ids = [uuid.uuid4() for _ in range(10_000)]
    async with db.transaction() as conn:
        await conn.execute(
            insert(racks_table),
            [
                {
                    "id": rack_id,
                    "name": f"rack-{i:05}",
                    "external_id": f"e{i}",
                    "created_at": datetime(2026, 1, 1, tzinfo=UTC),
                }
                for i, rack_id in enumerate(rack_ids)
            ],
        )
    targets = tuple(
        RackTarget(id=rack_id)
        if i % 3 == 0
        else RackTarget(name=f"rack-{i:05}")
        if i % 3 == 1
        else RackTarget(external_id=f"e{i}")
        for i, rack_id in enumerate(rack_ids)
    )
    with statements_sent(db) as sent:
        selections = await resolve(inventory.db, TargetSpec(racks=targets))
    assert [s.rack_id for s in selections] == rack_ids
    selects = [s for s in queries(sent) if s.lstrip().upper().startswith("SELECT")]
    assert 3 <= len(selects) <= 12


async def test_thousands_of_component_targets_are_batched(db: Database, inventory: InventoryService) -> None:
    specs = [ComponentSpec(COMPUTE, f"c{i}", external_id=f"n{i}") for i in range(2500)]
    rack = await inventory.create_rack("big", components=specs)
    halves = rack.components[:1250], rack.components[1250:]
    spec = TargetSpec(
        components=tuple(ComponentTarget(id=c.id) for c in halves[0])
        + tuple(ComponentTarget(external_type=COMPUTE, external_id=c.external_id) for c in halves[1])
    )
    with statements_sent(db) as sent:
        selections = await resolve(inventory.db, spec)
    assert selections == [RackSelection(rack.id, ComponentsFilter(frozenset(c.id for c in rack.components)))]
    selects = [s for s in queries(sent) if s.lstrip().upper().startswith("SELECT")]
    assert 2 <= len(selects) <= 6
