"""Inventory converters: protobuf shape checks and round trips, without a server or database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from rackflow.api.convert.inventory import component_specs_from, domain_to, rack_to, uuids_from
from rackflow.domain.inventory import Component, ComponentSpec, ComponentType, NVLDomain, PowerState, Rack
from rackflow.errors import InvalidArgument
from rackflow.v1 import flow_pb2 as pb


def test_rack_to_carries_every_field() -> None:
    rack_id, domain_id, component_id = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    created = datetime(2026, 3, 8, 2, 30, 15, 123456, tzinfo=UTC)
    component = Component(component_id, rack_id, ComponentType.CDU, "cdu", "cdu-1", "4.1", PowerState.OFF)
    msg = rack_to(Rack(rack_id, "r", "ext", domain_id, created, (component,)))
    assert (msg.id.id, msg.name, msg.external_id, msg.nvl_domain_id.id) == (
        str(rack_id),
        "r",
        "ext",
        str(domain_id),
    )
    assert msg.created_at.ToDatetime(tzinfo=UTC) == created
    assert msg.components[0] == pb.Component(
        id=pb.UUID(id=str(component_id)),
        rack_id=pb.UUID(id=str(rack_id)),
        type=pb.COMPONENT_TYPE_CDU,
        name="cdu",
        external_id="cdu-1",
        firmware_version="4.1",
        power_state="off",
    )


def test_rack_outside_a_domain_has_no_domain_id() -> None:
    msg = rack_to(Rack(uuid.uuid4(), "r", "", None, datetime.now(UTC)))
    assert not msg.HasField("nvl_domain_id")


def test_domain_to_keeps_rack_order() -> None:
    racks = (uuid.uuid4(), uuid.uuid4())
    msg = domain_to(NVLDomain(uuid.uuid4(), "d", racks, datetime(2026, 1, 1, tzinfo=UTC)))
    assert [r.id for r in msg.rack_ids] == [str(r) for r in racks]


def test_component_specs_from() -> None:
    specs = component_specs_from(
        [pb.ComponentSpec(type=pb.COMPONENT_TYPE_UMS, name="u", external_id="e", firmware_version="f")]
    )
    assert specs == [ComponentSpec(ComponentType.UMS, "u", "e", "f")]


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        ([pb.ComponentSpec(name="c")], r"^components\[0\]\.type: a component type is required"),
        ([pb.ComponentSpec(type=42, name="c")], r"^components\[0\]\.type: unknown component type 42"),
        ([pb.ComponentSpec(type=pb.COMPONENT_TYPE_CDU)] * 10_001, "^components: at most 10000 per request"),
    ],
)
def test_component_specs_from_refuses(specs: list[pb.ComponentSpec], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        component_specs_from(specs)


def test_uuids_from() -> None:
    value = uuid.uuid4()
    assert uuids_from([pb.UUID(id=str(value))], "rack_ids") == [value]
    with pytest.raises(InvalidArgument, match=r"^rack_ids\[1\]: 'x' is not a UUID"):
        uuids_from([pb.UUID(id=str(value)), pb.UUID(id="x")], "rack_ids")
    with pytest.raises(InvalidArgument, match=r"^rack_ids: at most 10000"):
        uuids_from([pb.UUID(id=str(value))] * 10_001, "rack_ids")
