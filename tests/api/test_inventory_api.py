"""Inventory RPCs through a real in-process gRPC server: happy paths, and refusals with their codes."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty
from sqlalchemy import insert

from rackflow.store.db import Database
from rackflow.store.tables import racks, tasks
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.conftest import table_counts

Stub = flow_pb2_grpc.FlowStub
COMPUTE = pb.COMPONENT_TYPE_COMPUTE
NVSWITCH = pb.COMPONENT_TYPE_NVSWITCH
MISSING = str(uuid.UUID(int=1))


def ident(value: str) -> pb.UUID:
    return pb.UUID(id=value)


async def refused(db: Database, call: Awaitable[object], code: grpc.StatusCode, pattern: str) -> None:
    """The call fails with `code`, a message matching `pattern`, and no table changes."""
    before = await table_counts(db)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == code, info.value.details()
    assert re.search(pattern, info.value.details() or ""), info.value.details()
    assert await table_counts(db) == before


async def make_rack(stub: Stub, name: str, *specs: pb.ComponentSpec, external_id: str = "") -> pb.Rack:
    rack: pb.Rack = await stub.CreateRack(
        pb.CreateRackRequest(name=name, external_id=external_id, components=list(specs))
    )
    return rack


# --- CreateRack / GetRack ------------------------------------------------------------------------


async def test_create_and_get_rack(stub: Stub) -> None:
    rack = await make_rack(
        stub,
        "r1",
        pb.ComponentSpec(type=COMPUTE, name="c1", external_id="node-1", firmware_version="1.2"),
        pb.ComponentSpec(type=NVSWITCH, name="s1"),
        external_id="rack-ext",
    )
    uuid.UUID(rack.id.id)
    assert (rack.name, rack.external_id, rack.HasField("nvl_domain_id")) == ("r1", "rack-ext", False)
    assert abs(rack.created_at.ToDatetime(tzinfo=UTC) - datetime.now(UTC)).total_seconds() < 60
    assert [(c.type, c.name, c.external_id, c.firmware_version, c.power_state) for c in rack.components] == [
        (COMPUTE, "c1", "node-1", "1.2", "unknown"),
        (NVSWITCH, "s1", "", "", "unknown"),
    ]
    assert all(c.rack_id == rack.id for c in rack.components)
    assert await stub.GetRack(pb.GetRackRequest(id=rack.id)) == rack


async def test_create_rack_refusals(stub: Stub, db: Database) -> None:
    await make_rack(stub, "taken", pb.ComponentSpec(type=COMPUTE, name="c", external_id="node-1"))
    bad = grpc.StatusCode.INVALID_ARGUMENT
    cases: list[tuple[pb.CreateRackRequest, grpc.StatusCode, str]] = [
        (pb.CreateRackRequest(name=""), bad, "^name: must not be empty"),
        (pb.CreateRackRequest(name="r\n"), bad, "^name: .*control"),
        (pb.CreateRackRequest(name=" r"), bad, "^name: .*whitespace"),
        (pb.CreateRackRequest(name="x" * 256), bad, "^name: at most 255"),
        # A reference that reads as a UUID is taken as an id: a rack named after another's would be it.
        (pb.CreateRackRequest(name=MISSING), bad, "^name: .*reads as an id"),
        (pb.CreateRackRequest(name=MISSING.replace("-", "").upper()), bad, "^name: .*reads as an id"),
        (pb.CreateRackRequest(name="taken"), grpc.StatusCode.ALREADY_EXISTS, "'taken'"),
        (
            pb.CreateRackRequest(name="r", nvl_domain_id=ident("nope")),
            bad,
            "^nvl_domain_id: 'nope' is not a UUID",
        ),
        (pb.CreateRackRequest(name="r", nvl_domain_id=ident(MISSING)), grpc.StatusCode.NOT_FOUND, MISSING),
        (
            pb.CreateRackRequest(name="r", components=[pb.ComponentSpec(type=99, name="c")]),
            bad,
            r"^components\[0\]\.type: unknown component type 99",
        ),
        (
            pb.CreateRackRequest(name="r", components=[pb.ComponentSpec(name="c")]),
            bad,
            r"^components\[0\]\.type: a component type is required",
        ),
        (
            pb.CreateRackRequest(name="r", components=[pb.ComponentSpec(type=COMPUTE)]),
            bad,
            r"^components\[0\]\.name: must not be empty",
        ),
        (
            pb.CreateRackRequest(
                name="r",
                components=[pb.ComponentSpec(type=COMPUTE, name="c", external_id="x")] * 2,
            ),
            bad,
            r"^components\[1\]\.external_id: .*twice",
        ),
        (
            # A copied fleet-file line: two components on one machine (the host's case and the service
            # root spelled out do not make it another).
            pb.CreateRackRequest(
                name="r",
                components=[
                    pb.ComponentSpec(
                        type=COMPUTE,
                        name=name,
                        bmc=pb.BmcEndpoint(url=url, resource="Systems/1", credentials="env:BMC"),
                    )
                    for name, url in (("c0", "https://bmc-7.lab"), ("c1", "https://BMC-7.lab/redfish/v1/"))
                ],
            ),
            bad,
            r"^components\[1\]\.bmc: https://BMC-7\.lab/redfish/v1/Systems/1 is also components\[0\]'s BMC",
        ),
        (
            pb.CreateRackRequest(
                name="r", components=[pb.ComponentSpec(type=COMPUTE, name="c", external_id="node-1")]
            ),
            grpc.StatusCode.ALREADY_EXISTS,
            r"^components\[0\]\.external_id: .*'node-1'",
        ),
        (
            pb.CreateRackRequest(name="r", components=[pb.ComponentSpec(type=COMPUTE, name="c")] * 10_001),
            bad,
            "^components: at most 10000",
        ),
    ]
    for request, code, pattern in cases:
        await refused(db, stub.CreateRack(request), code, pattern)


async def test_get_rack_refusals(stub: Stub, db: Database) -> None:
    await refused(db, stub.GetRack(pb.GetRackRequest(id=ident(MISSING))), grpc.StatusCode.NOT_FOUND, MISSING)
    await refused(
        db, stub.GetRack(pb.GetRackRequest(id=ident("12"))), grpc.StatusCode.INVALID_ARGUMENT, "^id: '12'"
    )
    await refused(
        db, stub.GetRack(pb.GetRackRequest()), grpc.StatusCode.INVALID_ARGUMENT, "^id: an id is required"
    )


async def test_get_rack_by_name(stub: Stub) -> None:
    """The same rack as by its id, in one call: a client looking a rack up by name reads no list."""
    rack = await make_rack(stub, "r1", pb.ComponentSpec(type=COMPUTE, name="c1"), external_id="e1")
    await make_rack(stub, "r10")
    assert await stub.GetRack(pb.GetRackRequest(name="r1")) == rack
    assert (await stub.GetRack(pb.GetRackRequest(name="r10"))).name == "r10"


async def test_get_rack_by_name_refusals(stub: Stub, db: Database) -> None:
    await make_rack(stub, "r1")
    bad, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    cases: list[tuple[pb.GetRackRequest, grpc.StatusCode, str]] = [
        (pb.GetRackRequest(name=""), bad, "^name: must not be empty$"),
        (pb.GetRackRequest(name="nowhere"), missing, "^name: no rack named 'nowhere'$"),
        (pb.GetRackRequest(name="R1"), missing, "^name: no rack named 'R1'$"),
        (pb.GetRackRequest(name="e1"), missing, "^name: no rack named 'e1'$"),
        (pb.GetRackRequest(name="x" * 256), bad, "^name: at most 255 characters"),
        (pb.GetRackRequest(name="r\x001"), bad, "^name: .* contains control characters"),
        (
            pb.GetRackRequest(id=ident(MISSING), name="r1"),
            bad,
            f"^name: not with an id, got 'r1' and '{MISSING}'",
        ),
        (pb.GetRackRequest(id=ident(""), name="r1"), bad, "^name: not with an id"),
        (pb.GetRackRequest(id=ident("12"), name=""), bad, "^name: not with an id"),
    ]
    for request, code, pattern in cases:
        await refused(db, stub.GetRack(request), code, pattern)


# --- ListRacks -----------------------------------------------------------------------------------


async def test_list_racks_pages_and_filters(stub: Stub) -> None:
    made = [await make_rack(stub, f"r{i}", pb.ComponentSpec(type=COMPUTE, name="c")) for i in range(5)]
    everything = await stub.ListRacks(pb.ListRacksRequest())
    assert everything.total == 5 and {r.name for r in everything.racks} == {r.name for r in made}
    assert all(len(r.components) == 1 for r in everything.racks)
    page = await stub.ListRacks(pb.ListRacksRequest(pagination=pb.Pagination(offset=1, limit=2)))
    assert (list(page.racks), page.total) == (list(everything.racks[1:3]), 5)
    domain = await stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d", rack_ids=[made[3].id]))
    filtered = await stub.ListRacks(pb.ListRacksRequest(nvl_domain_id=domain.id))
    assert ([r.name for r in filtered.racks], filtered.total) == (["r3"], 1)
    assert filtered.racks[0].nvl_domain_id == domain.id


async def test_a_listed_rack_is_the_rack_get_rack_answers(stub: Stub) -> None:
    """A page's racks are made in the answer itself (`racks_into`), its components grouped by type, then
    name: each is what GetRack answers, field for field, a rack without components, one in a domain and
    components with and without a BMC, external id and firmware version among them."""
    full = await make_rack(
        stub,
        "full",
        pb.ComponentSpec(type=NVSWITCH, name="a-switch", external_id="sw-1", firmware_version="2.0"),
        with_bmc("node-b", "https://bmc-b.lab"),
        pb.ComponentSpec(type=COMPUTE, name="node-a"),
        external_id="ext-full",
    )
    bare = await make_rack(stub, "bare")
    await stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d", rack_ids=[bare.id]))
    listed = await stub.ListRacks(pb.ListRacksRequest())
    assert [r.name for r in listed.racks] == ["full", "bare"]
    assert [c.name for c in listed.racks[0].components] == ["node-a", "node-b", "a-switch"]
    assert listed.racks[0].components[1].bmc.url == "https://bmc-b.lab"
    assert not listed.racks[0].components[0].HasField("bmc") and not listed.racks[1].components
    assert listed.racks[1].nvl_domain_id.id and not listed.racks[0].HasField("nvl_domain_id")
    for rack in (full, bare):
        assert listed.racks[[r.id for r in listed.racks].index(rack.id)] == await stub.GetRack(
            pb.GetRackRequest(id=rack.id)
        )


async def test_list_racks_by_id_answers_those_racks_alone(stub: Stub) -> None:
    """A table names the racks it shows by reading them alone (the CLI's `rack_names`), not the whole list;
    an id of no rack (deleted since) is left out, and a domain and a page narrow as without ids."""
    made = [await make_rack(stub, f"r{i}", pb.ComponentSpec(type=COMPUTE, name="c")) for i in range(5)]
    asked = [made[4].id, made[1].id, ident(MISSING), made[3].id]
    found = await stub.ListRacks(pb.ListRacksRequest(ids=asked))
    assert ([r.name for r in found.racks], found.total) == (["r1", "r3", "r4"], 3)
    assert list(found.racks) == [
        r for r in (await stub.ListRacks(pb.ListRacksRequest())).racks if r.id in asked
    ]
    paged = await stub.ListRacks(pb.ListRacksRequest(ids=asked, pagination=pb.Pagination(limit=2)))
    assert [r.name for r in paged.racks] == ["r1", "r3"] and paged.next_page_token
    rest = pb.Pagination(limit=2, page_token=paged.next_page_token)
    assert [
        r.name for r in (await stub.ListRacks(pb.ListRacksRequest(ids=asked, pagination=rest))).racks
    ] == ["r4"]
    domain = await stub.CreateNVLDomain(
        pb.CreateNVLDomainRequest(name="d", rack_ids=[made[3].id, made[0].id])
    )
    both = await stub.ListRacks(pb.ListRacksRequest(ids=asked, nvl_domain_id=domain.id))
    assert [r.name for r in both.racks] == ["r3"]
    most = pb.ListRacksRequest(ids=[ident(str(uuid.UUID(int=i + 2))) for i in range(999)] + [made[0].id])
    assert [r.name for r in (await stub.ListRacks(most)).racks] == ["r0"]  # a page's worth: 1,000


async def test_the_basic_view_answers_racks_without_their_components(stub: Stub, db: Database) -> None:
    """What a table naming racks asks for (the CLI's `racks_by_id`): a GB200 NVL72 rack has 36 components,
    a page of 1,000 such racks 5 MB with them. Unset or FULL: every component, as before views existed."""
    specs = [pb.ComponentSpec(type=COMPUTE, name=f"c{i}") for i in range(3)]
    made = [await make_rack(stub, f"r{i}", *specs) for i in range(2)]
    basic = await stub.ListRacks(pb.ListRacksRequest(view=pb.RACK_VIEW_BASIC))
    assert [(r.name, r.id, len(r.components)) for r in basic.racks] == [
        ("r0", made[0].id, 0),
        ("r1", made[1].id, 0),
    ]
    for view in (pb.RACK_VIEW_UNSPECIFIED, pb.RACK_VIEW_FULL):
        full = await stub.ListRacks(pb.ListRacksRequest(view=view))
        assert list(full.racks) == made
    by_id = await stub.ListRacks(pb.ListRacksRequest(ids=[made[1].id], view=pb.RACK_VIEW_BASIC))
    assert [(r.name, len(r.components)) for r in by_id.racks] == [("r1", 0)]
    bad = pb.ListRacksRequest(view=7)  # type: ignore[arg-type]
    await refused(
        db, stub.ListRacks(bad), grpc.StatusCode.INVALID_ARGUMENT, "^view: rack view 7 is not BASIC or FULL"
    )


async def test_list_racks_by_a_part_of_their_name(stub: Stub) -> None:
    """`name_contains` keeps the racks whose name holds the text, whatever its case, `%` and `_` taken
    literally; a page of them pages on as the whole list does, and other filters narrow it too."""
    made = [await make_rack(stub, name) for name in ("edge-A1", "core-a2", "core-b1", "50%_off", "5000ff")]

    async def names(request: pb.ListRacksRequest) -> tuple[list[str], int]:
        found = await stub.ListRacks(request)
        return [r.name for r in found.racks], found.total

    assert await names(pb.ListRacksRequest(name_contains="a")) == (["edge-A1", "core-a2"], 2)
    assert await names(pb.ListRacksRequest(name_contains="%_")) == (["50%_off"], 1)
    assert await names(pb.ListRacksRequest(name_contains="nowhere")) == ([], 0)
    first = await stub.ListRacks(pb.ListRacksRequest(name_contains="CORE", pagination=pb.Pagination(limit=1)))
    assert ([r.name for r in first.racks], first.total) == (["core-a2"], 2) and first.next_page_token
    rest = pb.Pagination(limit=1, page_token=first.next_page_token)
    assert await names(pb.ListRacksRequest(name_contains="CORE", pagination=rest)) == (["core-b1"], 2)
    domain = await stub.CreateNVLDomain(
        pb.CreateNVLDomainRequest(name="d", rack_ids=[made[2].id, made[0].id])
    )
    assert await names(pb.ListRacksRequest(name_contains="core", nvl_domain_id=domain.id)) == (["core-b1"], 1)


async def test_list_racks_refusals(stub: Stub, db: Database) -> None:
    bad = grpc.StatusCode.INVALID_ARGUMENT
    cases: list[tuple[pb.ListRacksRequest, grpc.StatusCode, str]] = [
        (pb.ListRacksRequest(pagination=pb.Pagination(limit=1001)), bad, r"^pagination\.limit: at most 1000"),
        (pb.ListRacksRequest(pagination=pb.Pagination(offset=-1)), bad, r"^pagination\.offset"),
        (pb.ListRacksRequest(nvl_domain_id=ident("x")), bad, "^nvl_domain_id: 'x' is not a UUID"),
        (pb.ListRacksRequest(nvl_domain_id=ident("")), bad, "^nvl_domain_id: an id is required"),
        (pb.ListRacksRequest(ids=[ident(MISSING)] * 1001), bad, "^ids: at most 1000 per request, got 1001"),
        (pb.ListRacksRequest(ids=[ident(MISSING), ident("x")]), bad, r"^ids\[1\]: 'x' is not a UUID"),
        (pb.ListRacksRequest(name_contains="a\x00"), bad, "^name_contains: .* contains control characters"),
        (
            pb.ListRacksRequest(name_contains="a" * 256),
            bad,
            "^name_contains: at most 255 characters, got 256",
        ),
        (
            pb.ListRacksRequest(nvl_domain_id=ident(MISSING)),
            grpc.StatusCode.NOT_FOUND,
            f"^nvl_domain_id: .*{MISSING}",
        ),
    ]
    for request, code, pattern in cases:
        await refused(db, stub.ListRacks(request), code, pattern)


# --- DeleteRack ----------------------------------------------------------------------------------


async def test_delete_rack(stub: Stub, db: Database) -> None:
    rack = await make_rack(stub, "r", pb.ComponentSpec(type=COMPUTE, name="c"))
    assert await stub.DeleteRack(pb.DeleteRackRequest(id=rack.id)) == Empty()
    counts = await table_counts(db)
    assert (counts["racks"], counts["components"]) == (0, 0)
    await refused(
        db, stub.DeleteRack(pb.DeleteRackRequest(id=rack.id)), grpc.StatusCode.NOT_FOUND, rack.id.id
    )
    await refused(
        db, stub.DeleteRack(pb.DeleteRackRequest(id=ident("r"))), grpc.StatusCode.INVALID_ARGUMENT, "^id"
    )


async def test_delete_rack_with_active_task_is_failed_precondition(stub: Stub, db: Database) -> None:
    rack = await make_rack(stub, "r")
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await conn.execute(
            insert(tasks).values(
                id=uuid.uuid4(),
                operation="power_on",
                parameters={},
                rack_id=uuid.UUID(rack.id.id),
                component_ids=[],
                status="running",
                created_at=now,
                updated_at=now,
            )
        )
    await refused(
        db,
        stub.DeleteRack(pb.DeleteRackRequest(id=rack.id)),
        grpc.StatusCode.FAILED_PRECONDITION,
        "active|running",
    )


# --- components ----------------------------------------------------------------------------------


async def test_add_and_remove_components(stub: Stub) -> None:
    rack = await make_rack(stub, "r")
    added = await stub.AddComponents(
        pb.AddComponentsRequest(
            rack_id=rack.id,
            components=[
                pb.ComponentSpec(type=NVSWITCH, name="s", external_id="x", firmware_version="3"),
                pb.ComponentSpec(type=COMPUTE, name="c", external_id="x"),
            ],
        )
    )
    assert [(c.type, c.name, c.power_state, c.rack_id) for c in added.components] == [
        (NVSWITCH, "s", "unknown", rack.id),
        (COMPUTE, "c", "unknown", rack.id),
    ]
    assert await stub.RemoveComponent(pb.RemoveComponentRequest(id=added.components[0].id)) == Empty()
    after = await stub.GetRack(pb.GetRackRequest(id=rack.id))
    assert [c.id for c in after.components] == [added.components[1].id]


async def test_component_refusals(stub: Stub, db: Database) -> None:
    rack = await make_rack(stub, "r", pb.ComponentSpec(type=COMPUTE, name="c", external_id="x"))
    bad = grpc.StatusCode.INVALID_ARGUMENT
    one = [pb.ComponentSpec(type=COMPUTE, name="d")]
    add_cases: list[tuple[pb.AddComponentsRequest, grpc.StatusCode, str]] = [
        (
            pb.AddComponentsRequest(rack_id=ident(MISSING), components=one),
            grpc.StatusCode.NOT_FOUND,
            "^rack_id: ",
        ),
        (pb.AddComponentsRequest(rack_id=ident("?"), components=one), bad, "^rack_id: '[?]' is not a UUID"),
        (pb.AddComponentsRequest(components=one), bad, "^rack_id: an id is required"),
        (pb.AddComponentsRequest(rack_id=rack.id), bad, "^components: at least one"),
        (
            pb.AddComponentsRequest(rack_id=rack.id, components=[pb.ComponentSpec(type=7, name="d")]),
            bad,
            r"^components\[0\]\.type: unknown component type 7",
        ),
        (
            pb.AddComponentsRequest(
                rack_id=rack.id,
                components=[*one, pb.ComponentSpec(type=COMPUTE, name="e", external_id="x")],
            ),
            grpc.StatusCode.ALREADY_EXISTS,
            r"^components\[1\]\.external_id: .*'x'",
        ),
    ]
    for request, code, pattern in add_cases:
        await refused(db, stub.AddComponents(request), code, pattern)
    remove = stub.RemoveComponent
    await refused(
        db, remove(pb.RemoveComponentRequest(id=ident(MISSING))), grpc.StatusCode.NOT_FOUND, MISSING
    )
    await refused(db, remove(pb.RemoveComponentRequest(id=ident("c"))), bad, "^id: 'c' is not a UUID")


def with_bmc(name: str, url: str, resource: str = "Systems/1") -> pb.ComponentSpec:
    return pb.ComponentSpec(
        type=COMPUTE, name=name, bmc=pb.BmcEndpoint(url=url, resource=resource, credentials="env:BMC")
    )


async def test_a_bmc_resource_another_component_has_is_refused_naming_it(stub: Stub, db: Database) -> None:
    """Never power-cycle the wrong rack: a component in another rack, or added later to the same one, may
    not act on a machine a stored component acts on, whatever the spelling of its endpoint."""
    rack = await make_rack(stub, "r1", with_bmc("node-0", "https://bmc-7.lab"))
    holder = rack.components[0].id.id
    taken = grpc.StatusCode.ALREADY_EXISTS
    held = rf"already exists: component 'node-0' \({holder}\) of rack 'r1'$"
    for url, resource in (
        ("https://bmc-7.lab", "Systems/1"),
        ("https://BMC-7.lab.:443/redfish/v1/", "/Systems/1/"),  # host's case and dot, default port, root
        ("http://bmc-7.lab:443", "1"),  # the port says which service; a bare id is a System
    ):
        spec = with_bmc("c1", url, resource)
        await refused(
            db,
            stub.CreateRack(
                pb.CreateRackRequest(name="r2", components=[with_bmc("c0", "https://other"), spec])
            ),
            taken,
            rf"^components\[1\]\.bmc: a component acting on '{re.escape(url.rstrip('/'))}.*Systems/1' {held}",
        )
        await refused(
            db, stub.AddComponents(pb.AddComponentsRequest(rack_id=rack.id, components=[spec])), taken, held
        )
    # Another resource of the same BMC, or the same resource of another BMC (or port), is another machine.
    r2 = await make_rack(
        stub,
        "r2",
        with_bmc("c0", "https://bmc-7.lab", "Systems/2"),
        with_bmc("c1", "https://bmc-8.lab"),
        with_bmc("c2", "https://bmc-7.lab:8443"),
    )
    assert len(r2.components) == 3


# --- NVLink domains ------------------------------------------------------------------------------


async def test_create_and_list_domains(stub: Stub) -> None:
    r1 = await make_rack(stub, "r1")
    r2 = await make_rack(stub, "r2")
    domain = await stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d1", rack_ids=[r1.id, r2.id]))
    uuid.UUID(domain.id.id)
    assert (domain.name, {r.id for r in domain.rack_ids}) == ("d1", {r1.id.id, r2.id.id})
    empty = await stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d2"))
    assert list(empty.rack_ids) == []
    listed = await stub.ListNVLDomains(pb.ListNVLDomainsRequest())
    assert list(listed.domains) == [domain, empty]
    assert (await stub.GetRack(pb.GetRackRequest(id=r1.id))).nvl_domain_id == domain.id


async def test_domains_are_listed_a_page_at_a_time_or_by_id_or_name(stub: Stub) -> None:
    """A fleet of NVL72 racks has a domain a rack: ListNVLDomains pages as ListRacks does (a keyset token,
    a capped total), and answers the domains asked for by id or name alone; with no field, every domain."""
    racks = [await make_rack(stub, f"r{i}") for i in range(3)]
    made = [
        await stub.CreateNVLDomain(
            pb.CreateNVLDomainRequest(name=f"d{i}", rack_ids=[racks[i].id] if i < 3 else [])
        )
        for i in range(5)
    ]
    everything = await stub.ListNVLDomains(pb.ListNVLDomainsRequest())
    assert list(everything.domains) == made and (everything.total, everything.next_page_token) == (5, "")
    first = await stub.ListNVLDomains(pb.ListNVLDomainsRequest(pagination=pb.Pagination(limit=2)))
    assert [d.name for d in first.domains] == ["d0", "d1"] and first.total == 5 and first.next_page_token
    assert [r.id for r in first.domains[1].rack_ids] == [racks[1].id.id]
    shown = [d.name for d in first.domains]
    token = first.next_page_token
    while token:
        page = await stub.ListNVLDomains(
            pb.ListNVLDomainsRequest(pagination=pb.Pagination(limit=2, page_token=token))
        )
        shown += [d.name for d in page.domains]
        token = page.next_page_token
    assert shown == ["d0", "d1", "d2", "d3", "d4"]
    by_offset = await stub.ListNVLDomains(
        pb.ListNVLDomainsRequest(pagination=pb.Pagination(offset=3, limit=1))
    )
    assert [d.name for d in by_offset.domains] == ["d3"]

    by_id = await stub.ListNVLDomains(pb.ListNVLDomainsRequest(ids=[made[4].id, made[2].id, ident(MISSING)]))
    assert list(by_id.domains) == [made[2], made[4]] and by_id.total == 2
    by_name = await stub.ListNVLDomains(pb.ListNVLDomainsRequest(names=["d1", "nope", "d3"]))
    assert list(by_name.domains) == [made[1], made[3]]
    both = await stub.ListNVLDomains(pb.ListNVLDomainsRequest(ids=[made[1].id], names=["d1", "d3"]))
    assert [d.name for d in both.domains] == ["d1"]  # each field narrows the list


async def test_every_domain_at_once_is_the_list_its_pages_make(stub: Stub, db: Database) -> None:
    """The request of no fields answers every domain in one answer, read and made apart from a page's
    (docs/PERFORMANCE.md, "Every NVLink domain at once"): it must be, field for field on both databases,
    the domains oldest first, each with its racks oldest first named by their ids' canonical text (the
    order neither of their ids nor of the request that put them there), no rack outside a domain, an empty
    domain empty; and the pages of one domain each, put end to end."""
    at = datetime(2026, 1, 1, tzinfo=UTC)
    rack_ids = sorted((uuid.uuid4() for _ in range(7)), reverse=True)  # the newer, the smaller its id
    async with db.transaction() as conn:
        await conn.execute(
            insert(racks),
            [
                {"id": rack_id, "name": f"r{i}", "created_at": at + timedelta(seconds=i)}
                for i, rack_id in enumerate(rack_ids)
            ],
        )
    groups = [[6, 0, 3], [], [5], [2, 1]]  # rack 4 in no domain
    made = [
        await stub.CreateNVLDomain(
            pb.CreateNVLDomainRequest(name=f"d{i}", rack_ids=[ident(str(rack_ids[r])) for r in group])
        )
        for i, group in enumerate(groups)
    ]
    expected = [
        pb.NVLDomain(id=d.id, name=d.name, rack_ids=[ident(str(rack_ids[r])) for r in sorted(group)])
        for d, group in zip(made, groups, strict=True)
    ]

    everything = await stub.ListNVLDomains(pb.ListNVLDomainsRequest())

    assert list(everything.domains) == expected
    assert (everything.total, everything.total_capped, everything.next_page_token) == (4, False, "")
    paged: list[pb.NVLDomain] = []
    token = ""
    while True:
        page = await stub.ListNVLDomains(
            pb.ListNVLDomainsRequest(pagination=pb.Pagination(limit=1, page_token=token))
        )
        paged += page.domains
        token = page.next_page_token
        if not token:
            break
    assert paged == expected


async def test_domain_list_refusals(stub: Stub, db: Database) -> None:
    bad = grpc.StatusCode.INVALID_ARGUMENT
    await make_rack(stub, "r0")
    await make_rack(stub, "r1")
    racks_token = (
        await stub.ListRacks(pb.ListRacksRequest(pagination=pb.Pagination(limit=1)))
    ).next_page_token
    assert racks_token
    cases: list[tuple[pb.ListNVLDomainsRequest, str]] = [
        (pb.ListNVLDomainsRequest(pagination=pb.Pagination(limit=1001)), r"^pagination\.limit: at most 1000"),
        (pb.ListNVLDomainsRequest(pagination=pb.Pagination(limit=-1)), r"^pagination\.limit: must be >= 0"),
        (
            pb.ListNVLDomainsRequest(pagination=pb.Pagination(page_token=racks_token)),
            r"^pagination\.page_token: a token of 'ListRacks', not of 'ListNVLDomains'",
        ),
        (pb.ListNVLDomainsRequest(ids=[ident(MISSING)] * 1001), "^ids: at most 1000 per request, got 1001"),
        (pb.ListNVLDomainsRequest(ids=[ident(MISSING), ident("x")]), r"^ids\[1\]: 'x' is not a UUID"),
        (pb.ListNVLDomainsRequest(names=["d"] * 1001), "^names: at most 1000 per request, got 1001"),
        (pb.ListNVLDomainsRequest(names=["d", ""]), r"^names\[1\]: must not be empty"),
    ]
    for request, pattern in cases:
        await refused(db, stub.ListNVLDomains(request), bad, pattern)


async def test_create_domain_refusals(stub: Stub, db: Database) -> None:
    r1 = await make_rack(stub, "r1")
    r2 = await make_rack(stub, "r2")
    await stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d1", rack_ids=[r1.id]))
    bad = grpc.StatusCode.INVALID_ARGUMENT
    cases: list[tuple[pb.CreateNVLDomainRequest, grpc.StatusCode, str]] = [
        (pb.CreateNVLDomainRequest(name="", rack_ids=[r2.id]), bad, "^name: must not be empty"),
        (pb.CreateNVLDomainRequest(name="d1", rack_ids=[r2.id]), grpc.StatusCode.ALREADY_EXISTS, "'d1'"),
        (pb.CreateNVLDomainRequest(name="d2", rack_ids=[r2.id, ident("no")]), bad, r"^rack_ids\[1\]: 'no'"),
        (
            pb.CreateNVLDomainRequest(name="d2", rack_ids=[r2.id, ident(MISSING)]),
            grpc.StatusCode.NOT_FOUND,
            rf"^rack_ids\[1\]: .*{MISSING}",
        ),
        (pb.CreateNVLDomainRequest(name="d2", rack_ids=[r2.id, r2.id]), bad, r"^rack_ids\[1\]: .*twice"),
        (
            pb.CreateNVLDomainRequest(name="d2", rack_ids=[r2.id, r1.id]),
            grpc.StatusCode.FAILED_PRECONDITION,
            rf"^rack_ids\[1\]: rack {r1.id.id} is already in NVLink domain",
        ),
    ]
    for request, code, pattern in cases:
        await refused(db, stub.CreateNVLDomain(request), code, pattern)
