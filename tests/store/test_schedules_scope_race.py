"""Scope writes against a concurrent RemoveComponent, on both databases.

A scope write resolves its target, then writes scope rows. A component removed in between must not end up
named by a new scope entry (every firing of it would fail with "the component filter selects no
component"): the write locks the racks of its component filters and refuses a component that is gone.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Collection
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.inventory import (
    Component,
    ComponentsFilter,
    ComponentSpec,
    ComponentTarget,
    RackSelection,
    TargetSpec,
)
from rackflow.errors import NotFound
from rackflow.inventory.targets import FIELD, resolve_targets
from rackflow.schedules import service as schedule_service
from rackflow.store import inventory as inventory_store
from rackflow.store.db import Database
from tests.store.lock_waits import waiting_for
from tests.store.schedules_support import RACK_TYPES, Env, make_env, rack_target

Meanwhile = Callable[[AsyncConnection], Awaitable[None]]


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def rack_with_external_ids(env: Env, name: str) -> tuple[Component, ...]:
    specs = [ComponentSpec(t, f"{name}-{i}", external_id=f"{name}-ext-{i}") for i, t in enumerate(RACK_TYPES)]
    return (await env.services.inventory.create_rack(name, components=specs)).components


def by_id(*chosen: Component) -> TargetSpec:
    return TargetSpec(components=tuple(ComponentTarget(id=c.id) for c in chosen))


def by_external_id(*chosen: Component) -> TargetSpec:
    return TargetSpec(
        components=tuple(ComponentTarget(external_id=c.external_id, external_type=c.type) for c in chosen)
    )


def after_resolving(monkeypatch: pytest.MonkeyPatch, meanwhile: Meanwhile) -> None:
    """Run `meanwhile` once, right after the schedule service's first target lookup returns.

    That is the window the race needs: the targets are resolved, nothing is locked or written yet.
    """
    ran: list[bool] = []

    async def resolve_then_interleave(
        conn: AsyncConnection, target: TargetSpec, field: str = FIELD
    ) -> list[RackSelection]:
        selections = await resolve_targets(conn, target, field)
        if not ran:
            ran.append(True)
            await meanwhile(conn)
        return selections

    monkeypatch.setattr(schedule_service, "resolve_targets", resolve_then_interleave)


def remove_meanwhile(env: Env, component: Component) -> Meanwhile:
    """RemoveComponent committing between the lookup and the write.

    PostgreSQL: the real RemoveComponent, in its own transaction; it commits before the scope write locks
    the rack (it needs no lock the write holds yet: the schedule row is not among its locks). SQLite: the
    scope write holds the single write lock, so no other transaction can commit in the window; deleting
    the component on the write's own connection shows the write exactly what a committed removal would.
    """

    async def remove(conn: AsyncConnection) -> None:
        if env.db.is_postgres:
            await env.services.inventory.remove_component(component.id)
        else:
            await inventory_store.delete_component(conn, component.id)

    return remove


async def write_scope(env: Env, write: str, schedule_id: uuid.UUID, target: TargetSpec) -> None:
    if write == "create":
        await env.schedule("racing", target=target)
    elif write == "add_scope":
        await env.services.schedules.add_scope(schedule_id, target)
    else:
        await env.services.schedules.update_scope(schedule_id, target)


async def scope_state(env: Env) -> list[Any]:
    schedules, _ = await env.services.schedules.list_schedules()
    return [(s.name, await env.services.schedules.list_scopes(s.id)) for s in schedules]


WRITES = ("create", "add_scope", "update_scope")


@pytest.mark.parametrize("write", WRITES)
async def test_a_component_removed_after_lookup_is_not_found(
    env: Env, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    a, b, _ = r1.components
    existing = await env.schedule("existing", racks=[r2])
    before = await scope_state(env)
    after_resolving(monkeypatch, remove_meanwhile(env, b))

    with pytest.raises(NotFound) as refused:
        await write_scope(env, write, existing.id, by_id(a, b))

    # Named where the request holds the targets: UpdateTaskScheduleScope's are its desired_scope.
    field = "desired_scope" if write == "update_scope" else "target_spec"
    assert str(refused.value) == f"{field}.components[1]: no component with id {b.id}"
    assert await scope_state(env) == before


async def test_a_component_named_by_external_id_is_not_found_by_it(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, _ = await rack_with_external_ids(env, "r1")
    existing = await env.schedule("existing", target=by_id(a))
    before = await env.services.schedules.list_scopes(existing.id)
    after_resolving(monkeypatch, remove_meanwhile(env, b))

    with pytest.raises(NotFound) as refused:
        await env.services.schedules.add_scope(existing.id, by_external_id(b))

    assert str(refused.value) == (
        f"target_spec.components[0]: no {b.type.value} component with external_id {b.external_id!r}"
    )
    assert await env.services.schedules.list_scopes(existing.id) == before


async def test_an_external_id_given_to_a_new_component_meanwhile_still_refuses(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old component is gone and the external id now names another one, on another rack: the write
    resolved to the old one, so it is refused (the caller retries) rather than naming a dead component."""
    b = (await rack_with_external_ids(env, "r1"))[1]
    r2 = await env.rack("r2")
    remove = remove_meanwhile(env, b)
    spec = ComponentSpec(b.type, "reusing", external_id=b.external_id)

    async def remove_and_reuse_the_external_id(conn: AsyncConnection) -> None:
        await remove(conn)
        if env.db.is_postgres:
            await env.services.inventory.add_components(r2.id, [spec])
        else:
            await inventory_store.insert_components(conn, r2.id, [spec], env.clock.now())

    after_resolving(monkeypatch, remove_and_reuse_the_external_id)

    with pytest.raises(NotFound, match=f"target_spec: component {b.id} was removed while the request ran"):
        await env.schedule("racing", target=by_external_id(b))
    assert await env.services.schedules.list_schedules() == ([], 0)


async def test_a_removal_once_the_rack_is_locked_waits_then_narrows_the_new_scope(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: RemoveComponent starts once the scope write holds the rack. PostgreSQL: it waits for
    the rack lock (without it, it would commit at once and the write would name a removed component), then
    finds the new entry and takes the component out. SQLite: the write lock makes it wait the same way."""
    r1 = await env.rack("r1")
    a, b, _ = r1.components
    removals: list[asyncio.Task[None]] = []

    async def lock_then_remove(
        db: Database, conn: AsyncConnection, rack_ids: Collection[uuid.UUID]
    ) -> dict[uuid.UUID, uuid.UUID | None]:
        locked = await inventory_store.racks_for_update(db, conn, rack_ids)
        removals.append(asyncio.create_task(env.services.inventory.remove_component(b.id)))
        await waiting_for(db, conn, removals[0])  # fails if it commits without waiting
        return locked

    monkeypatch.setattr(
        schedule_service,
        "inventory_store",
        SimpleNamespace(
            racks_for_update=lock_then_remove, components_by_ids=inventory_store.components_by_ids
        ),
    )
    schedule = await env.schedule("racing", target=by_id(a, b))
    await removals[0]

    assert len(removals) == 1
    assert await filters(env, schedule.id) == {r1.id: ids(a)}


async def test_component_scopes_are_written_as_before(env: Env) -> None:
    a, b, c = await rack_with_external_ids(env, "r1")
    r2 = await env.rack("r2")
    d = r2.components[0]
    r1_id = a.rack_id
    scopes = env.services.schedules

    schedule = await env.schedule(target=by_id(d, a))
    assert await filters(env, schedule.id) == {r1_id: ids(a), r2.id: ids(d)}

    await scopes.add_scope(schedule.id, by_external_id(b, c))
    assert await filters(env, schedule.id) == {r1_id: ids(a, b, c), r2.id: ids(d)}

    _, changes = await scopes.update_scope(schedule.id, by_id(b))
    assert (changes.added, changes.updated, changes.removed) == (0, 1, 1)
    assert await filters(env, schedule.id) == {r1_id: ids(b)}

    await scopes.update_scope(schedule.id, rack_target(r2))  # no component filter: no rack is locked
    assert await filters(env, schedule.id) == {r2.id: None}


def ids(*chosen: Component) -> ComponentsFilter:
    return ComponentsFilter(frozenset(c.id for c in chosen))


async def filters(env: Env, schedule_id: uuid.UUID) -> dict[uuid.UUID, object]:
    return {s.rack_id: s.filter for s in await env.services.schedules.list_scopes(schedule_id)}
