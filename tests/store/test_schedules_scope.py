"""The scope RPCs on both databases: add (merge), update (reconcile), remove, list."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import cast, literal, literal_column, null, select

from rackflow.domain.inventory import (
    ComponentsFilter,
    ComponentTarget,
    ComponentType,
    NVLDomainTarget,
    TargetSpec,
    TypesFilter,
)
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound
from rackflow.ids import EPOCH
from rackflow.store.db import Database
from rackflow.store.dialect import epoch_micros
from rackflow.store.schedules import micros_to
from rackflow.store.types import UTCDateTime
from tests.conftest import table_counts
from tests.store.schedules_support import Env, make_env, rack_target

COMPUTE = (ComponentType.COMPUTE,)
NVSWITCH = (ComponentType.NVSWITCH,)


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def filters(env: Env, schedule_id: uuid.UUID) -> dict[uuid.UUID, object]:
    return {s.rack_id: s.filter for s in await env.services.schedules.list_scopes(schedule_id)}


# --- add: the merge table through the database -------------------------------------------------


async def test_add_types_to_types_unites_them(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(target=rack_target(r1, types=COMPUTE))
    scopes = await env.services.schedules.add_scope(schedule.id, rack_target(r1, types=NVSWITCH))
    assert len(scopes) == 1
    both = TypesFilter(frozenset({ComponentType.COMPUTE, ComponentType.NVSWITCH}))
    assert await filters(env, schedule.id) == {r1.id: both}


async def test_add_components_to_components_unites_them(env: Env) -> None:
    r1 = await env.rack("r1")
    c1, c2 = r1.components[0].id, r1.components[1].id
    schedule = await env.schedule(target=TargetSpec(components=(ComponentTarget(id=c1),)))
    await env.services.schedules.add_scope(schedule.id, TargetSpec(components=(ComponentTarget(id=c2),)))
    assert await filters(env, schedule.id) == {r1.id: ComponentsFilter(frozenset({c1, c2}))}


async def test_add_all_components_widens_and_existing_all_absorbs(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(
        target=TargetSpec(racks=rack_target(r1, types=COMPUTE).racks + rack_target(r2).racks)
    )
    await env.services.schedules.add_scope(schedule.id, rack_target(r1, r2))
    await env.services.schedules.add_scope(schedule.id, rack_target(r2, types=NVSWITCH))
    assert await filters(env, schedule.id) == {r1.id: None, r2.id: None}


async def test_add_new_rack_keeps_the_existing_ones(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1])
    scopes = await env.services.schedules.add_scope(schedule.id, rack_target(r2, types=COMPUTE))
    assert {s.rack_id for s in scopes} == {r1.id, r2.id}
    assert await filters(env, schedule.id) == {r1.id: None, r2.id: TypesFilter(frozenset(COMPUTE))}


@pytest.mark.parametrize("existing_kind", ["types", "components"])
async def test_add_with_mixed_kinds_fails_whole_request(env: Env, existing_kind: str) -> None:
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    component = r1.components[0].id
    types_on_r1 = rack_target(r1, types=COMPUTE)
    components_on_r1 = TargetSpec(components=(ComponentTarget(id=component),))
    existing, incoming = (
        (types_on_r1, components_on_r1) if existing_kind == "types" else (components_on_r1, types_on_r1)
    )
    schedule = await env.schedule(target=existing)
    await env.services.schedules.add_scope(schedule.id, rack_target(r2, types=COMPUTE))
    before_filters = await filters(env, schedule.id)
    before = await table_counts(env.db)
    # r3 is new and r2 would merge fine; r1 cannot merge, so nothing at all may change.
    request = (
        TargetSpec(racks=(*rack_target(r2, types=NVSWITCH).racks, *rack_target(r3).racks, *incoming.racks))
        if incoming.racks
        else TargetSpec(components=(ComponentTarget(id=r3.components[0].id), *incoming.components))
    )
    with pytest.raises(FailedPrecondition, match=str(r1.id)):
        await env.services.schedules.add_scope(schedule.id, request)
    assert await table_counts(env.db) == before
    assert await filters(env, schedule.id) == before_filters


async def test_add_expands_nvl_domains(env: Env) -> None:
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    domain = await env.services.inventory.create_domain("d", [r2.id, r3.id])
    schedule = await env.schedule(racks=[r1])
    await env.services.schedules.add_scope(
        schedule.id, TargetSpec(nvl_domains=(NVLDomainTarget(id=domain.id),))
    )
    assert set(await filters(env, schedule.id)) == {r1.id, r2.id, r3.id}


async def test_add_to_unknown_schedule_or_with_bad_target_writes_nothing(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    before = await table_counts(env.db)
    with pytest.raises(NotFound, match="schedule_id"):
        await env.services.schedules.add_scope(uuid.uuid4(), rack_target(r1))
    with pytest.raises(NotFound, match="target_spec"):
        await env.services.schedules.add_scope(
            schedule.id, TargetSpec(components=(ComponentTarget(id=uuid.uuid4()),))
        )
    with pytest.raises(InvalidArgument, match="target_spec"):
        await env.services.schedules.add_scope(schedule.id, rack_target(r1, r1))
    assert await table_counts(env.db) == before


# --- update: reconcile -------------------------------------------------------------------------


async def test_update_scope_reconciles_and_counts(env: Env) -> None:
    kept, changed, dropped, new = [await env.rack(n) for n in ("kept", "changed", "dropped", "new")]
    schedule = await env.schedule(
        target=TargetSpec(
            racks=(
                *rack_target(kept, types=COMPUTE).racks,
                *rack_target(changed, types=COMPUTE).racks,
                *rack_target(dropped).racks,
            )
        )
    )
    component = changed.components[1].id
    desired_rack_targets = TargetSpec(
        racks=(*rack_target(kept, types=COMPUTE).racks, *rack_target(changed, types=NVSWITCH).racks)
    )
    # The desired scope mixes racks; NVSWITCH on `changed` replaces COMPUTE rather than merging.
    scopes, changes = await env.services.schedules.update_scope(
        schedule.id,
        TargetSpec(racks=(*desired_rack_targets.racks, *rack_target(new).racks)),
    )
    assert (changes.added, changes.removed, changes.updated) == (1, 1, 1)
    assert {s.rack_id: s.filter for s in scopes} == {
        kept.id: TypesFilter(frozenset(COMPUTE)),
        changed.id: TypesFilter(frozenset(NVSWITCH)),
        new.id: None,
    }
    _, changes = await env.services.schedules.update_scope(
        schedule.id, TargetSpec(components=(ComponentTarget(id=component),))
    )
    assert (changes.added, changes.removed, changes.updated) == (0, 2, 1)
    assert await filters(env, schedule.id) == {changed.id: ComponentsFilter(frozenset({component}))}


async def test_update_scope_keeps_last_task_of_kept_racks(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1])
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    await env.services.schedules.update_scope(schedule.id, rack_target(r1, r2))
    last = {s.rack_id: s.last_task_id for s in await env.services.schedules.list_scopes(schedule.id)}
    assert last == {r1.id: task_id, r2.id: None}


async def test_update_scope_with_bad_target_writes_nothing(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    before = await table_counts(env.db)
    with pytest.raises(InvalidArgument, match="desired_scope"):
        await env.services.schedules.update_scope(schedule.id, TargetSpec())
    with pytest.raises(NotFound, match="schedule_id"):
        await env.services.schedules.update_scope(uuid.uuid4(), rack_target(r1))
    assert await table_counts(env.db) == before


# --- remove and list -----------------------------------------------------------------------------


async def test_remove_scope_but_never_the_last(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1, r2])
    (task_id, _) = await env.services.schedules.trigger(schedule.id)
    first, second = await env.services.schedules.list_scopes(schedule.id)
    await env.services.schedules.remove_scope(first.id)
    assert [s.id for s in await env.services.schedules.list_scopes(schedule.id)] == [second.id]
    assert len(await env.services.tasks.get_tasks([task_id])) == 1  # its task is not cancelled
    before = await table_counts(env.db)
    with pytest.raises(FailedPrecondition, match="delete the schedule instead"):
        await env.services.schedules.remove_scope(second.id)
    with pytest.raises(NotFound, match="scope_id"):
        await env.services.schedules.remove_scope(first.id)
    assert await table_counts(env.db) == before


async def test_list_scopes_of_unknown_schedule_is_not_found(env: Env) -> None:
    with pytest.raises(NotFound, match="schedule_id"):
        await env.services.schedules.list_scopes(uuid.uuid4())


async def test_the_scope_list_names_each_entry_as_it_is_held(env: Env) -> None:
    """ListTaskScheduleScopes' page reads the ids as text in the database (`dialect.uuid_text`) and the
    creation time as microseconds (`dialect.epoch_micros`): each must be the canonical text of the id the
    entry holds, a NULL last task none, and the time it holds, on both databases."""
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    schedule = await env.schedule(
        target=TargetSpec(racks=rack_target(r1, types=COMPUTE).racks + rack_target(r2).racks)
    )
    await env.services.schedules.trigger(schedule.id)
    await env.services.schedules.add_scope(schedule.id, rack_target(r3))  # no task yet
    held = sorted(await env.services.schedules.list_scopes(schedule.id), key=lambda s: s.rack_id)
    names = {r1.id: "r1", r2.id: "r2", r3.id: "r3"}

    listed, total = await env.services.schedules.scope_list_page(schedule.id)

    assert total == 3
    assert [tuple(entry) for entry in listed] == [
        (
            str(s.id),
            str(s.rack_id),
            names[s.rack_id],
            s.filter,
            None if s.last_task_id is None else str(s.last_task_id),
            micros_since_epoch(s.created_at),
        )
        for s in held
    ]
    assert sum(entry.last_task_id is None for entry in listed) == 1
    first, *rest = listed
    after, _ = await env.services.schedules.scope_list_page(
        schedule.id, limit=2, after=(uuid.UUID(first.rack_id),)
    )
    assert after == rest


def micros_since_epoch(moment: datetime) -> int:
    return micros_to(moment - EPOCH)


@pytest.mark.parametrize(
    "moment",
    [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2026, 12, 7, 21, 51, 34, 1, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2199, 2, 28, 12, 0, 0, 500_000, tzinfo=UTC),
    ],
)
async def test_epoch_micros_is_the_time_to_the_microsecond(db: Database, moment: datetime) -> None:
    """Exact on both databases: PostgreSQL's epoch is a numeric, not a float that would round a
    microsecond away; SQLite's is the whole seconds and the six digits after them in its text (its time
    functions would round …59.999999 up to the next second)."""
    async with db.read() as conn:
        read = select(epoch_micros(db.dialect, literal(moment, UTCDateTime())))
        assert (await conn.execute(read)).scalar_one() == micros_since_epoch(moment)
        assert (
            await conn.execute(select(epoch_micros(db.dialect, cast(null(), UTCDateTime()))))
        ).scalar_one() is None


async def test_epoch_micros_reads_a_time_held_to_the_whole_second(db: Database) -> None:
    """A time another writer left whole: on SQLite its text has no digits of fraction ("2026-03-01
    12:00:00", as CURRENT_TIMESTAMP writes it), and its microseconds are none."""
    held = "'2026-03-01 12:00:00'" if db.is_sqlite else "timestamptz '2026-03-01 12:00:00+00'"
    async with db.read() as conn:
        read = select(epoch_micros(db.dialect, literal_column(held)))
        assert (await conn.execute(read)).scalar_one() == micros_since_epoch(
            datetime(2026, 3, 1, 12, tzinfo=UTC)
        )
