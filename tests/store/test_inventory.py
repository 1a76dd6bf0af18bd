"""Inventory service and store helpers, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from rackflow.clock import FakeClock
from rackflow.domain.inventory import (
    Component,
    ComponentsFilter,
    ComponentSpec,
    ComponentTarget,
    ComponentType,
    ListedDomain,
    NVLDomain,
    PowerState,
    TargetSpec,
)
from rackflow.domain.tasks import ComponentChange
from rackflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from rackflow.inventory.service import InventoryService
from rackflow.store import inventory as store
from rackflow.store.db import Database
from rackflow.store.tables import components, task_schedule, task_schedule_scope, tasks
from rackflow.store.task_runs import record_changes
from rackflow.validation import check_text
from tests.conftest import table_counts
from tests.store.schedules_support import make_env, rack_target

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
COMPUTE = ComponentType.COMPUTE
NVSWITCH = ComponentType.NVSWITCH


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def inventory(db: Database, clock: FakeClock) -> InventoryService:
    return InventoryService(db, clock)


def spec(
    name: str, ctype: ComponentType = COMPUTE, external_id: str = "", firmware: str = ""
) -> ComponentSpec:
    return ComponentSpec(type=ctype, name=name, external_id=external_id, firmware_version=firmware)


async def add_task(
    db: Database, rack_id: uuid.UUID, status: str, component_ids: list[str] | None = None
) -> uuid.UUID:
    task_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            insert(tasks).values(
                id=task_id,
                operation="power_on",
                parameters={},
                rack_id=rack_id,
                component_ids=component_ids or [],
                status=status,
                created_at=T0,
                updated_at=T0,
            )
        )
    return task_id


def component_target(*chosen: Component) -> TargetSpec:
    return TargetSpec(components=tuple(ComponentTarget(id=c.id) for c in chosen))


# --- validation (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", " r1", "r1 ", "r\x001", "r\n1", "x" * 256])
def test_check_text_refuses_bad_names(bad: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^name: "):
        check_text(bad, "name", required=True, identifier=True)


def test_check_text_accepts_names_and_optional_empty() -> None:
    assert check_text("rack-01 ü 机架", "name", required=True, identifier=True) == "rack-01 ü 机架"
    assert check_text("x" * 255, "name", required=True, identifier=True) == "x" * 255
    assert check_text("", "external_id", identifier=True) == ""
    assert check_text(" v1 ", "firmware_version") == " v1 "


# --- racks ---------------------------------------------------------------------------------------


async def test_create_rack_with_components(inventory: InventoryService) -> None:
    rack = await inventory.create_rack(
        "r1",
        "ext-r1",
        None,
        [spec("n1", NVSWITCH, "sw-1", "2.0"), spec("c1", external_id="node-1", firmware="1.0")],
    )
    assert (rack.name, rack.external_id, rack.nvl_domain_id, rack.created_at) == ("r1", "ext-r1", None, T0)
    assert [(c.type, c.name, c.external_id, c.firmware_version) for c in rack.components] == [
        (COMPUTE, "c1", "node-1", "1.0"),
        (NVSWITCH, "n1", "sw-1", "2.0"),
    ]
    assert all(c.power_state is PowerState.UNKNOWN and c.rack_id == rack.id for c in rack.components)
    assert await inventory.get_rack(rack.id) == rack


async def test_rack_without_external_id_or_components(inventory: InventoryService) -> None:
    first = await inventory.create_rack("r1")
    second = await inventory.create_rack("r2")  # two empty external ids do not clash
    assert (first.external_id, first.components, second.external_id) == ("", (), "")


async def test_duplicate_rack_name_is_already_exists_and_writes_nothing(
    db: Database, inventory: InventoryService
) -> None:
    await inventory.create_rack("r1", "e1")
    before = await table_counts(db)
    with pytest.raises(AlreadyExists, match="'r1'"):
        await inventory.create_rack("r1", "e2", components=[spec("c")])
    with pytest.raises(AlreadyExists, match=r"external_id.*'e1'"):
        await inventory.create_rack("r2", "e1", components=[spec("c")])
    assert await table_counts(db) == before


async def test_create_rack_refusals_write_nothing(db: Database, inventory: InventoryService) -> None:
    await inventory.create_rack("taken", components=[spec("c", external_id="node-1")])
    before = await table_counts(db)
    cases: list[tuple[type[Exception], str, dict[str, object]]] = [
        (InvalidArgument, "^name: must not be empty", {"name": ""}),
        (InvalidArgument, "^name: .*whitespace", {"name": " r"}),
        (InvalidArgument, "^external_id: .*control", {"name": "r", "external_id": "a\tb"}),
        (NotFound, "^nvl_domain_id: .*", {"name": "r", "nvl_domain_id": uuid.uuid4()}),
        (
            InvalidArgument,
            r"^components\[0\]\.type",
            {"name": "r", "components": [spec("c", ComponentType.UNKNOWN)]},
        ),
        (InvalidArgument, r"^components\[0\]\.name", {"name": "r", "components": [spec("")]}),
        (
            InvalidArgument,
            r"^components\[1\]\.external_id: .*twice",
            {"name": "r", "components": [spec("a", external_id="x"), spec("b", external_id="x")]},
        ),
        (
            AlreadyExists,
            r"^components\[1\]\.external_id: a COMPUTE component .*'node-1'",
            {"name": "r", "components": [spec("a"), spec("b", external_id="node-1")]},
        ),
    ]
    for error, message, kwargs in cases:
        with pytest.raises(error, match=message):
            await inventory.create_rack(**kwargs)  # type: ignore[arg-type]
    assert await table_counts(db) == before


async def test_external_ids_are_unique_per_type_only(inventory: InventoryService) -> None:
    rack = await inventory.create_rack("r", components=[spec("a", COMPUTE, "x"), spec("b", NVSWITCH, "x")])
    assert len(rack.components) == 2


async def test_get_unknown_rack_is_not_found(inventory: InventoryService) -> None:
    missing = uuid.uuid4()
    with pytest.raises(NotFound, match=str(missing)):
        await inventory.get_rack(missing)


async def test_a_rack_is_found_by_its_name(db: Database, inventory: InventoryService) -> None:
    """The whole rack, components included, as by its id; a name matches exactly (not a prefix, not in
    another case, not another rack's external id)."""
    rack = await inventory.create_rack("r1", "ext-r1", components=[spec("c1"), spec("n1", NVSWITCH)])
    await inventory.create_rack("r10", components=[spec("c2")])
    assert await inventory.get_rack_by_name("r1") == rack == await inventory.get_rack(rack.id)
    for other in ("r", "R1", "ext-r1", "r1 "):
        with pytest.raises(NotFound, match=f"^name: no rack named {other!r}$"):
            await inventory.get_rack_by_name(other)
    with pytest.raises(NotFound, match=r"^rack: no rack named 'gone'$"):
        await inventory.get_rack_by_name("gone", "rack")
    with pytest.raises(InvalidArgument, match=r"^name: must not be empty"):
        await inventory.get_rack_by_name("")
    async with db.read() as conn:
        assert await store.get_rack_by_name(conn, "nothing") is None


async def test_list_racks_orders_pages_and_filters(inventory: InventoryService, clock: FakeClock) -> None:
    names = ["r3", "r1", "r2", "r0"]
    for name in names:
        await inventory.create_rack(name, components=[spec(f"{name}-c")])
        clock.advance(timedelta(seconds=1))
    racks, listed = await inventory.list_racks()
    assert ([r.name for r in racks], listed.total) == (names, 4)
    assert [c.name for c in racks[0].components] == ["r3-c"]
    page, listed = await inventory.list_racks(offset=1, limit=2)
    assert ([r.name for r in page], listed.total) == (["r1", "r2"], 4)
    domain = await inventory.create_domain("d", [racks[3].id, racks[1].id])
    in_domain, listed = await inventory.list_racks(nvl_domain_id=domain.id)
    assert ([r.name for r in in_domain], listed.total) == (["r1", "r0"], 2)
    with pytest.raises(NotFound, match="nvl_domain_id"):
        await inventory.list_racks(nvl_domain_id=uuid.uuid4())


async def test_same_created_at_orders_by_id(inventory: InventoryService) -> None:
    made = [await inventory.create_rack(f"r{i}") for i in range(5)]
    racks, _ = await inventory.list_racks()
    assert [r.id for r in racks] == sorted(r.id for r in made)


async def test_delete_rack_cascades(db: Database, inventory: InventoryService) -> None:
    rack = await inventory.create_rack("r", components=[spec("c")])
    keep = await inventory.create_rack("keep", components=[spec("k")])
    await add_task(db, rack.id, "completed")
    async with db.transaction() as conn:
        schedule_id = uuid.uuid4()
        await conn.execute(
            insert(task_schedule).values(
                id=schedule_id,
                name="s",
                spec_type="interval",
                spec="1h",
                operation_template={},
                created_at=T0,
                updated_at=T0,
            )
        )
        await conn.execute(
            insert(task_schedule_scope).values(
                id=uuid.uuid4(), schedule_id=schedule_id, rack_id=rack.id, created_at=T0
            )
        )
    await inventory.delete_rack(rack.id)
    counts = await table_counts(db)
    assert (counts["racks"], counts["components"], counts["tasks"], counts["task_schedule_scope"]) == (
        1,
        1,
        0,
        0,
    )
    assert await inventory.get_rack(keep.id) == keep
    with pytest.raises(NotFound):
        await inventory.delete_rack(rack.id)


@pytest.mark.parametrize("status", ["waiting", "pending", "running"])
async def test_delete_rack_with_active_task_is_refused(
    db: Database, inventory: InventoryService, status: str
) -> None:
    rack = await inventory.create_rack("r", components=[spec("c")])
    await add_task(db, rack.id, status)
    before = await table_counts(db)
    with pytest.raises(FailedPrecondition, match=str(rack.id)):
        await inventory.delete_rack(rack.id)
    assert await table_counts(db) == before


# --- components ----------------------------------------------------------------------------------


async def test_add_components_returns_them_in_order(inventory: InventoryService) -> None:
    rack = await inventory.create_rack("r", components=[spec("a", external_id="x")])
    added = await inventory.add_components(rack.id, [spec("z", NVSWITCH, "x", "9"), spec("b")])
    assert [(c.name, c.type, c.external_id, c.firmware_version) for c in added] == [
        ("z", NVSWITCH, "x", "9"),
        ("b", COMPUTE, "", ""),
    ]
    assert len((await inventory.get_rack(rack.id)).components) == 3


async def test_add_components_refusals_write_nothing(db: Database, inventory: InventoryService) -> None:
    other = await inventory.create_rack("other", components=[spec("a", external_id="x")])
    rack = await inventory.create_rack("r")
    before = await table_counts(db)
    with pytest.raises(NotFound, match="rack_id"):
        await inventory.add_components(uuid.uuid4(), [spec("c")])
    with pytest.raises(InvalidArgument, match="at least one"):
        await inventory.add_components(rack.id, [])
    with pytest.raises(AlreadyExists, match=r"components\[1\].*'x'"):
        await inventory.add_components(rack.id, [spec("ok", external_id="y"), spec("dup", external_id="x")])
    with pytest.raises(InvalidArgument, match="firmware_version"):
        await inventory.add_components(rack.id, [spec("ok", firmware="v\x07")])
    assert await table_counts(db) == before
    assert other.components[0].external_id == "x"


async def test_many_components_in_one_request(inventory: InventoryService) -> None:
    specs = [spec(f"c{i:05}", external_id=f"node-{i}") for i in range(2500)]
    rack = await inventory.create_rack("big", components=specs)
    assert len(rack.components) == 2500
    with pytest.raises(AlreadyExists, match=r"components\[2499\]"):
        await inventory.add_components(
            rack.id,
            [spec(f"d{i}", external_id=f"new-{i}") for i in range(2499)] + [spec("d", external_id="node-7")],
        )


async def test_remove_component(db: Database, inventory: InventoryService) -> None:
    rack = await inventory.create_rack("r", components=[spec("a"), spec("b")])
    a, b = rack.components
    await add_task(db, rack.id, "completed", [str(a.id)])
    await add_task(db, rack.id, "running", [str(b.id)])
    await inventory.remove_component(a.id)
    assert [c.id for c in (await inventory.get_rack(rack.id)).components] == [b.id]
    before = await table_counts(db)
    with pytest.raises(FailedPrecondition, match=f"{b.id}.*in use"):
        await inventory.remove_component(b.id)
    with pytest.raises(NotFound):
        await inventory.remove_component(a.id)
    assert await table_counts(db) == before


async def test_remove_component_narrows_the_scopes_that_name_it(db: Database) -> None:
    env = make_env(db)
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    a, b, c = r1.components
    named = {
        "a-and-b": await env.schedule("a-and-b", target=component_target(a, b)),
        "only-a": await env.schedule("only-a", target=component_target(a)),
        "a-and-r2": await env.schedule("a-and-r2", target=component_target(a)),
        "whole-r1": await env.schedule("whole-r1", racks=[r1]),
        "c": await env.schedule("c", target=component_target(c)),
    }
    await env.services.schedules.add_scope(named["a-and-r2"].id, rack_target(r2))
    before = {name: await env.services.schedules.list_scopes(s.id) for name, s in named.items()}

    await env.services.inventory.remove_component(a.id)

    after = {name: await env.services.schedules.list_scopes(s.id) for name, s in named.items()}
    assert [(s.rack_id, s.filter) for s in after["a-and-b"]] == [(r1.id, ComponentsFilter(frozenset({b.id})))]
    assert after["a-and-b"][0].id == before["a-and-b"][0].id
    assert after["only-a"] == []  # as DeleteRack leaves it: the schedule advances and submits nothing
    assert [(s.rack_id, s.filter) for s in after["a-and-r2"]] == [(r2.id, None)]
    for unchanged in ("whole-r1", "c"):
        assert after[unchanged] == before[unchanged]
    (task_id,) = await env.services.schedules.trigger(named["a-and-b"].id)
    assert [t.component_ids for t in await env.services.tasks.get_tasks([task_id])] == [(b.id,)]
    assert await env.services.schedules.trigger(named["only-a"].id) == []
    (task_id,) = await env.services.schedules.trigger(named["a-and-r2"].id)
    assert [t.rack_id for t in await env.services.tasks.get_tasks([task_id])] == [r2.id]


async def test_a_refused_remove_component_leaves_the_scopes_alone(db: Database) -> None:
    env = make_env(db)
    rack = await env.rack("r1")
    a = rack.components[0]
    schedule = await env.schedule("only-a", target=component_target(a))
    await add_task(db, rack.id, "running", [str(a.id)])
    before = await env.services.schedules.list_scopes(schedule.id)
    with pytest.raises(FailedPrecondition, match="in use"):
        await env.services.inventory.remove_component(a.id)
    assert await env.services.schedules.list_scopes(schedule.id) == before


# --- NVLink domains ------------------------------------------------------------------------------


def listed(domain: NVLDomain, *, paged: bool) -> ListedDomain:
    """The domain as the list names it: its ids and its racks' as their canonical text, its time (its
    key's) only in a page of a limit."""
    return ListedDomain(
        str(domain.id), domain.name, list(map(str, domain.rack_ids)), domain.created_at if paged else None
    )


async def test_create_and_list_domains(inventory: InventoryService, clock: FakeClock) -> None:
    r1 = await inventory.create_rack("r1")
    clock.advance(timedelta(seconds=1))
    r2 = await inventory.create_rack("r2")
    d1 = await inventory.create_domain("d1", [r2.id, r1.id])
    assert (d1.name, d1.rack_ids) == ("d1", (r1.id, r2.id))
    clock.advance(timedelta(seconds=1))
    empty = await inventory.create_domain("empty", [])
    assert empty.rack_ids == ()
    assert await inventory.list_domains() == ([listed(d1, paged=False), listed(empty, paged=False)], 2)
    assert await inventory.list_domains(limit=1) == ([listed(d1, paged=True)], 2)
    assert (await inventory.get_rack(r1.id)).nvl_domain_id == d1.id
    r3 = await inventory.create_rack("r3", nvl_domain_id=empty.id)
    assert (await inventory.list_domains())[0][1].rack_ids == [str(r3.id)]
    assert await inventory.list_domains(limit=1, after=(d1.created_at, d1.id)) == (
        [listed(replace(empty, rack_ids=(r3.id,)), paged=True)],
        2,
    )
    assert await inventory.domain_names([empty.id, r3.id]) == {empty.id: "empty"}
    assert await inventory.domain_id_by_name("d1") == d1.id
    with pytest.raises(NotFound, match=r"^domain: no NVLink domain named 'd9'$"):
        await inventory.domain_id_by_name("d9", "domain")


async def test_create_domain_refusals_write_nothing(db: Database, inventory: InventoryService) -> None:
    r1 = await inventory.create_rack("r1")
    r2 = await inventory.create_rack("r2")
    await inventory.create_domain("d1", [r1.id])
    before = await table_counts(db)
    missing = uuid.uuid4()
    with pytest.raises(AlreadyExists, match="'d1'"):
        await inventory.create_domain("d1", [r2.id])
    with pytest.raises(FailedPrecondition, match=rf"rack_ids\[1\]: rack {r1.id} is already"):
        await inventory.create_domain("d2", [r2.id, r1.id])
    with pytest.raises(NotFound, match=rf"rack_ids\[1\]: no rack with id {missing}"):
        await inventory.create_domain("d2", [r2.id, missing])
    with pytest.raises(InvalidArgument, match=r"rack_ids\[1\].*twice"):
        await inventory.create_domain("d2", [r2.id, r2.id])
    with pytest.raises(InvalidArgument, match=r"^name"):
        await inventory.create_domain("d2\n", [r2.id])
    assert await table_counts(db) == before
    assert (await inventory.get_rack(r2.id)).nvl_domain_id is None


# --- store helpers -------------------------------------------------------------------------------


async def test_components_by_rack_and_rack_exists(db: Database, inventory: InventoryService) -> None:
    r1 = await inventory.create_rack("r1", components=[spec("b"), spec("a"), spec("s", NVSWITCH)])
    r2 = await inventory.create_rack("r2")
    missing = uuid.uuid4()
    async with db.read() as conn:
        by_rack = await store.components_by_rack(conn, [r1.id, r2.id, missing])
        assert [c.name for c in by_rack[r1.id]] == ["a", "b", "s"]
        assert by_rack[r2.id] == [] and by_rack[missing] == []
        assert await store.rack_exists(conn, r1.id)
        assert not await store.rack_exists(conn, missing)


async def test_record_changes_writes_what_steps_reported(db: Database, inventory: InventoryService) -> None:
    """The executor's write of what backend steps changed; a component removed meanwhile is skipped."""
    rack = await inventory.create_rack("r", components=[spec("c", firmware="1.0")])
    component_id = rack.components[0].id
    async with db.transaction() as conn:
        await record_changes(conn, [ComponentChange(component_id, power_state=PowerState.ON)])
        await record_changes(conn, [ComponentChange(component_id, firmware_version="2.0")])
        await record_changes(conn, [ComponentChange(uuid.uuid4(), power_state=PowerState.OFF)])
    (component,) = (await inventory.get_rack(rack.id)).components
    assert (component.power_state, component.firmware_version) == (PowerState.ON, "2.0")


async def test_integrity_error_becomes_already_exists(db: Database, inventory: InventoryService) -> None:
    """The race a pre-check cannot see: the constraint itself, translated at the store boundary."""
    rack = await inventory.create_rack("r", "e", components=[spec("c", external_id="x")])
    with pytest.raises(AlreadyExists, match="'r'"):
        async with db.transaction() as conn:
            await store.insert_rack(conn, name="r", external_id="", nvl_domain_id=None, created_at=T0)
    with pytest.raises(AlreadyExists, match="external_id"):
        async with db.transaction() as conn:
            await store.insert_components(conn, rack.id, [spec("d", external_id="x")], T0)
    with pytest.raises(AlreadyExists, match="'d'"):
        async with db.transaction() as conn:
            await store.insert_domain(conn, name="d", created_at=T0)
            await store.insert_domain(conn, name="d", created_at=T0)
    async with db.read() as conn:
        assert len((await conn.execute(select(components))).all()) == 1


async def test_the_translated_error_names_the_column_that_clashed(db: Database) -> None:
    """A rack has two unique columns: the error names the one the database refused, with its value."""
    async with db.transaction() as conn:
        await store.insert_rack(conn, name="r", external_id="e", nvl_domain_id=None, created_at=T0)
    with pytest.raises(AlreadyExists, match=r"^external_id: a rack with external_id 'e' already exists$"):
        async with db.transaction() as conn:
            await store.insert_rack(conn, name="other", external_id="e", nvl_domain_id=None, created_at=T0)
    with pytest.raises(AlreadyExists, match=r"^name: a rack named 'r' already exists$") as caught:
        async with db.transaction() as conn:
            await store.insert_rack(conn, name="r", external_id="f", nvl_domain_id=None, created_at=T0)
    assert (caught.value.field, caught.value.value) == ("name", "r")


async def test_concurrent_creates_of_one_name_leave_one_rack(
    db: Database, inventory: InventoryService
) -> None:
    results = await asyncio.gather(*(inventory.create_rack("same") for _ in range(5)), return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, AlreadyExists) for r in results if isinstance(r, BaseException))
    assert (await table_counts(db))["racks"] == 1


async def test_concurrent_domains_cannot_share_a_rack(db: Database, inventory: InventoryService) -> None:
    rack = await inventory.create_rack("r")
    results = await asyncio.gather(
        *(inventory.create_domain(f"d{i}", [rack.id]) for i in range(5)), return_exceptions=True
    )
    won = [r for r in results if not isinstance(r, BaseException)]
    assert len(won) == 1
    assert all(isinstance(r, FailedPrecondition) for r in results if isinstance(r, BaseException))
    assert (await table_counts(db))["nvl_domains"] == 1
    assert (await inventory.get_rack(rack.id)).nvl_domain_id == won[0].id
