"""A component's BMC endpoint through the API converters and the fleet file (stored and read back:
tests/store/test_inventory_bmc.py)."""

from __future__ import annotations

import pytest

from rackflow.api.convert.inventory import component_specs_from
from rackflow.cli.racks import parse_fleet
from rackflow.clock import SystemClock
from rackflow.domain.inventory import Bmc
from rackflow.errors import InvalidArgument
from rackflow.v1 import flow_pb2 as pb

CLOCK = SystemClock()
BMC = Bmc("https://10.0.0.5", "Systems/1", "env:BMC_RACK1")


def spec_msg(**bmc: str) -> pb.ComponentSpec:
    return pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="node-0", bmc=pb.BmcEndpoint(**bmc))


def test_spec_with_bmc_converts_trimmed() -> None:
    msg = spec_msg(url=" https://10.0.0.5 ", resource="Systems/1 ", credentials="env:BMC_RACK1")
    [spec] = component_specs_from([msg])
    assert spec.bmc == BMC


def test_spec_without_bmc_has_none() -> None:
    [spec] = component_specs_from([pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="n")])
    assert spec.bmc is None


def test_a_password_in_place_of_a_reference_is_refused_naming_the_field() -> None:
    msg = spec_msg(url="https://10.0.0.5", resource="Systems/1", credentials="admin:hunter2")
    with pytest.raises(InvalidArgument) as caught:
        component_specs_from([pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name="ok"), msg])
    assert str(caught.value).startswith("components[1].bmc.credentials: expected env:NAME")
    assert "hunter2" not in str(caught.value)


def test_an_empty_bmc_message_is_refused_not_ignored() -> None:
    with pytest.raises(InvalidArgument, match=r"^components\[0\]\.bmc\.url: "):
        component_specs_from([spec_msg()])


# --- the fleet file (`rackflow inventory import`) -------------------------------------------------

FLEET_BMC = {"url": "https://10.0.0.5", "resource": "Systems/1", "credentials": "env:BMC_RACK1"}


def fleet(component: dict[str, object]) -> dict[str, object]:
    return {"racks": [{"name": "r1", "components": [component]}]}


def test_fleet_components_carry_their_bmc_to_the_request() -> None:
    plan = parse_fleet(fleet({"type": "COMPUTE", "name": "node-0", "bmc": FLEET_BMC}))
    [component] = plan.racks[0].components
    assert component.to_proto().bmc == pb.BmcEndpoint(**FLEET_BMC)


def test_fleet_components_without_bmc_send_none() -> None:
    [component] = parse_fleet(fleet({"type": "COMPUTE", "name": "node-0"})).racks[0].components
    assert not component.to_proto().HasField("bmc")


@pytest.mark.parametrize(
    ("bmc", "message"),
    [
        ({"url": "https://x", "resource": "1"}, "racks[0].components[0].bmc.credentials: expected a non-"),
        ({**FLEET_BMC, "password": "x"}, "racks[0].components[0].bmc: unknown key 'password'"),
        ("https://x", "racks[0].components[0].bmc: expected a mapping"),
    ],
)
def test_fleet_bmc_mistakes_name_the_place(bmc: object, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_fleet(fleet({"type": "COMPUTE", "name": "node-0", "bmc": bmc}))
    assert str(caught.value).startswith(message)
