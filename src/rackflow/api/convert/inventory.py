"""Inventory conversions between protobuf messages and inventory values."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from rackflow.api.convert import (
    COMPONENT_TYPES_TO_PB,
    MAX_PAGE_SIZE,
    component_type_from,
    required_uuid,
    timestamp_into,
    uuid_to,
)
from rackflow.domain.inventory import Bmc, Component, ComponentSpec, ListedDomain, NVLDomain, Rack
from rackflow.errors import InvalidArgument
from rackflow.inventory.bmc import check_bmc
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import MAX_TARGETS, check_text

MAX_COMPONENTS_PER_REQUEST = 10_000


def components_into(target: Any, rack_id: uuid.UUID, components: Iterable[Component]) -> None:
    """Append the components of the rack `rack_id` to `target` (a repeated `pb.Component` field), their ids
    given as dicts, which protobuf copies into the message faster than a `pb.UUID` made and then copied, and
    the rack's id made once: a rack of 36 components was converted a component at a time, most of a
    ListRacks page's server time (docs/PERFORMANCE.md, "Racks of 36 components"). A component's BMC, when
    it has one, is set on the component added (`bmc=None` cost a call a component), and its type and power
    state read without a call: a page of 1,000 racks adds 36,000 ("The 1,000-row pages at 36
    components")."""
    add = target.add
    rack = {"id": str(rack_id)}
    types = COMPONENT_TYPES_TO_PB
    for c in components:
        added = add(
            id={"id": str(c.id)},
            rack_id=rack,
            type=types[c.type],
            name=c.name,
            external_id=c.external_id,
            firmware_version=c.firmware_version,
            power_state=c.power_state,
        )
        if c.bmc is not None:
            added.bmc.CopyFrom(bmc_to(c.bmc))


def bmc_to(bmc: Bmc | None) -> pb.BmcEndpoint | None:
    if bmc is None:
        return None
    return pb.BmcEndpoint(url=bmc.url, resource=bmc.resource, credentials=bmc.credentials)


def bmc_from(msg: pb.BmcEndpoint, field: str) -> Bmc:
    """Checked here, at the door, so a bad endpoint (or a password where a reference belongs) is refused
    before anything is stored."""
    bmc = Bmc(url=msg.url.strip(), resource=msg.resource.strip(), credentials=msg.credentials.strip())
    return check_bmc(bmc, field)


def rack_to(rack: Rack) -> pb.Rack:
    msg = pb.Rack()
    rack_into(msg, rack)
    return msg


def racks_into(target: Any, racks: Iterable[Rack]) -> None:
    """Append the racks to `target` (a repeated `pb.Rack` field), each made in place: a `pb.Rack` made apart
    is copied into the answer, its components with it. With `components_into`'s changes, converting a page
    of 1,000 racks of 36 took 201 → 141 ms of CPU (docs/PERFORMANCE.md, "The 1,000-row pages at 36
    components")."""
    add = target.add
    for rack in racks:
        rack_into(add(), rack)


def rack_into(msg: pb.Rack, rack: Rack) -> None:
    """Set the empty message `msg` to the rack, its components with it."""
    msg.id.id = str(rack.id)
    msg.name = rack.name
    msg.external_id = rack.external_id
    if rack.nvl_domain_id is not None:
        msg.nvl_domain_id.id = str(rack.nvl_domain_id)
    timestamp_into(msg.created_at, rack.created_at)
    components_into(msg.components, rack.id, rack.components)


def rack_ref_from(request: pb.GetRackRequest) -> uuid.UUID | str:
    """The rack a GetRack asks for: its id, or its name (a str, checked by the service that looks it
    up). Both is refused rather than one chosen; neither is refused as a missing id, as before `name`."""
    if not request.HasField("name"):
        return required_uuid(request.id, "id")
    if request.HasField("id"):
        raise InvalidArgument(f"name: not with an id, got {request.name!r} and {request.id.id!r}")
    return request.name


def domain_to(domain: NVLDomain) -> pb.NVLDomain:
    return pb.NVLDomain(
        id=uuid_to(domain.id), name=domain.name, rack_ids=[pb.UUID(id=str(r)) for r in domain.rack_ids]
    )


def listed_domains_into(target: Any, domains: Iterable[ListedDomain]) -> None:
    """Append the listed domains to `target` (a repeated `pb.NVLDomain` field), each made in its place (as
    `racks_into`), its ids copied as the text they were read as and set on their fields (for a message
    this small, a third faster than given to `add` as dicts): 20,000 domains made apart as `domain_to`
    makes one, then copied in, took six times as long (docs/PERFORMANCE.md, "Every NVLink domain at
    once")."""
    add = target.add
    for domain in domains:
        msg = add(name=domain.name)
        msg.id.id = domain.id
        rack_ids = msg.rack_ids
        for rack_id in domain.rack_ids:
            rack_ids.add().id = rack_id


def component_spec_from(msg: pb.ComponentSpec, field: str) -> ComponentSpec:
    return ComponentSpec(
        type=component_type_from(msg.type, f"{field}.type"),
        name=msg.name,
        external_id=msg.external_id,
        firmware_version=msg.firmware_version,
        bmc=bmc_from(msg.bmc, f"{field}.bmc") if msg.HasField("bmc") else None,
    )


def component_specs_from(msgs: Sequence[pb.ComponentSpec], field: str = "components") -> list[ComponentSpec]:
    _check_count(len(msgs), field, MAX_COMPONENTS_PER_REQUEST)
    return [component_spec_from(msg, f"{field}[{i}]") for i, msg in enumerate(msgs)]


def listed_ids_from(msgs: Sequence[pb.UUID], field: str = "ids") -> list[uuid.UUID]:
    """The racks or domains a list is asked for by id: at most a page of them, as its answer is a page."""
    _check_count(len(msgs), field, MAX_PAGE_SIZE)
    return [required_uuid(msg, f"{field}[{i}]") for i, msg in enumerate(msgs)]


def listed_names_from(names: Sequence[str], field: str = "names") -> list[str]:
    """The domains a list is asked for by name: at most a page of them, each a name."""
    _check_count(len(names), field, MAX_PAGE_SIZE)
    return [check_text(name, f"{field}[{i}]", required=True) for i, name in enumerate(names)]


def uuids_from(msgs: Sequence[pb.UUID], field: str) -> list[uuid.UUID]:
    _check_count(len(msgs), field, MAX_TARGETS)
    return [required_uuid(msg, f"{field}[{i}]") for i, msg in enumerate(msgs)]


def _check_count(count: int, field: str, limit: int) -> None:
    if count > limit:
        raise InvalidArgument(f"{field}: at most {limit} per request, got {count}")


def basic_rack_view_from(value: int, field: str = "view") -> bool:
    """Whether a ListRacks asks for its racks without their components (unset: FULL, as before views)."""
    if value not in (pb.RACK_VIEW_UNSPECIFIED, pb.RACK_VIEW_BASIC, pb.RACK_VIEW_FULL):
        raise InvalidArgument(f"{field}: rack view {value} is not BASIC or FULL")
    return value == pb.RACK_VIEW_BASIC
