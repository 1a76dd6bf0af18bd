"""Schedule lifecycle on both databases: create, get, list, update, pause, resume, delete."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.domain.inventory import (
    ComponentsFilter,
    ComponentTarget,
    ComponentType,
    NVLDomainTarget,
    RackTarget,
    TargetSpec,
    TypesFilter,
)
from rackflow.domain.schedules import OverlapPolicy
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from rackflow.store import dispatch
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.timespec import ScheduleSpec, SpecType
from tests.conftest import table_counts
from tests.store.schedules_support import HOURLY, POWER_OFF, START, Env, make_env, rack_target


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


# --- create --------------------------------------------------------------------------------------


async def test_create_interval_schedule_with_its_initial_scope(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1, r2])
    assert schedule.enabled
    assert schedule.next_run_at == START + timedelta(hours=1)
    assert schedule.last_run_at is None
    assert schedule.spec == ScheduleSpec(SpecType.INTERVAL, "1h", "UTC")
    assert schedule.overlap_policy is OverlapPolicy.SKIP
    assert schedule.operation == POWER_OFF
    assert schedule.description == "nightly description"
    assert await env.services.schedules.get(schedule.id) == schedule
    scopes = await env.services.schedules.list_scopes(schedule.id)
    assert {(s.rack_id, s.filter, s.last_task_id) for s in scopes} == {
        (r1.id, None, None),
        (r2.id, None, None),
    }


async def test_create_cron_evaluates_in_the_timezone(env: Env) -> None:
    r1 = await env.rack("r1")
    spec = ScheduleSpec(SpecType.CRON, "0 2 * * *", "America/Los_Angeles")
    schedule = await env.schedule(racks=[r1], spec=spec)
    # 12:00 UTC is 04:00 in Los Angeles (PST, UTC-8); the next 02:00 there is 10:00 UTC the next day.
    assert schedule.next_run_at == datetime(2026, 3, 3, 10, 0, tzinfo=UTC)
    assert schedule.spec.timezone == "America/Los_Angeles"


async def test_create_one_time_is_due_at_its_time_even_in_the_past(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(
        racks=[r1], spec=ScheduleSpec(SpecType.ONE_TIME, "2026-01-01T06:00:00+02:00")
    )
    assert schedule.next_run_at == datetime(2026, 1, 1, 4, 0, tzinfo=UTC)
    async with env.db.read() as conn:
        assert await dispatch.count_due(conn, START) == 1


async def test_create_keeps_the_queue_timeout_and_operation_parameters(env: Env) -> None:
    r1 = await env.rack("r1")
    operation = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1.0")
    schedule = await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.QUEUE,
        operation=operation,
        queue=QueueOptions(timeout=timedelta(minutes=5)),
        description="",
        target=rack_target(r1),
    )
    stored = await env.services.schedules.get(schedule.id)
    assert stored.operation == operation
    assert stored.queue_timeout == timedelta(minutes=5)
    assert stored.overlap_policy is OverlapPolicy.QUEUE


async def test_component_targets_are_grouped_per_rack(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    c1, c2 = r1.components[0], r1.components[1]
    c3 = r2.components[2]
    target = TargetSpec(
        components=(ComponentTarget(id=c1.id), ComponentTarget(id=c3.id), ComponentTarget(id=c2.id))
    )
    schedule = await env.schedule(target=target)
    scopes = {s.rack_id: s.filter for s in await env.services.schedules.list_scopes(schedule.id)}
    assert scopes == {
        r1.id: ComponentsFilter(frozenset({c1.id, c2.id})),
        r2.id: ComponentsFilter(frozenset({c3.id})),
    }


async def test_nvl_domains_are_expanded_to_their_racks(env: Env) -> None:
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    domain = await env.services.inventory.create_domain("d1", [r1.id, r2.id])
    target = TargetSpec(
        nvl_domains=(NVLDomainTarget(name=domain.name, component_types=(ComponentType.COMPUTE,)),)
    )
    schedule = await env.schedule(target=target)
    scopes = {s.rack_id: s.filter for s in await env.services.schedules.list_scopes(schedule.id)}
    compute = TypesFilter(frozenset({ComponentType.COMPUTE}))
    assert scopes == {r1.id: compute, r2.id: compute}
    assert r3.id not in scopes


async def test_duplicate_name_is_already_exists_and_writes_nothing(env: Env) -> None:
    r1 = await env.rack("r1")
    await env.schedule("dup", racks=[r1])
    before = await table_counts(env.db)
    with pytest.raises(AlreadyExists, match=r"schedule\.name: .*'dup'"):
        await env.schedule("dup", racks=[r1])
    assert await table_counts(env.db) == before


BAD_CREATES = [
    ("", HOURLY, "schedule.name"),
    ("x" * 256, HOURLY, "schedule.name"),
    ("bad\x00name", HOURLY, "schedule.name"),
    (" padded", HOURLY, "schedule.name"),
    ("n", ScheduleSpec(SpecType.INTERVAL, "0s"), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.INTERVAL, "-1h"), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.INTERVAL, "1d"), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.INTERVAL, "x" * 257), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.CRON, "61 * * * *"), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.CRON, "@every 1h"), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.CRON, "0 0 30 2 *"), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T04:00:00"), "schedule.spec.spec"),
    ("n", ScheduleSpec(SpecType.CRON, "0 2 * * *", "Mars/Olympus"), "schedule.spec.timezone"),
    ("n", ScheduleSpec(SpecType.CRON, "0 2 * * *", "Local"), "schedule.spec.timezone"),
    ("n", ScheduleSpec(SpecType.INTERVAL, "1h", "Nowhere/Town"), "schedule.spec.timezone"),
]


@pytest.mark.parametrize(("name", "spec", "field"), BAD_CREATES)
async def test_bad_create_names_the_field_and_writes_nothing(
    env: Env, name: str, spec: ScheduleSpec, field: str
) -> None:
    r1 = await env.rack("r1")
    before = await table_counts(env.db)
    with pytest.raises(InvalidArgument, match=field.replace(".", r"\.")):
        await env.schedule(name, racks=[r1], spec=spec)
    assert await table_counts(env.db) == before


async def test_bad_targets_write_nothing(env: Env) -> None:
    r1 = await env.rack("r1")
    before = await table_counts(env.db)
    with pytest.raises(NotFound, match="target_spec"):
        await env.schedule(target=TargetSpec(racks=(RackTarget(id=uuid.uuid4()),)))
    with pytest.raises(InvalidArgument, match="target_spec"):
        await env.schedule(target=TargetSpec(racks=(RackTarget(id=r1.id), RackTarget(name="r1"))))
    with pytest.raises(InvalidArgument, match="target_spec"):
        await env.schedule(target=TargetSpec())
    assert await table_counts(env.db) == before


async def test_bad_operation_is_refused_at_create(env: Env) -> None:
    r1 = await env.rack("r1")
    before = await table_counts(env.db)
    with pytest.raises(InvalidArgument, match="target_version"):
        await env.schedule(racks=[r1], operation=Operation(OperationKind.UPGRADE_FIRMWARE))
    assert await table_counts(env.db) == before


# --- get and list --------------------------------------------------------------------------------


async def test_get_unknown_is_not_found(env: Env) -> None:
    with pytest.raises(NotFound, match="id: "):
        await env.services.schedules.get(uuid.uuid4())


async def test_list_orders_by_creation_filters_and_counts_before_paging(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    made = []
    for index in range(5):
        made.append(await env.schedule(f"s{index}", racks=[r1] if index % 2 == 0 else [r2]))
        env.clock.advance(timedelta(seconds=1))
    await env.services.schedules.pause(made[2].id)
    service = env.services.schedules

    everything, total = await service.list_schedules()
    assert [s.name for s in everything] == ["s0", "s1", "s2", "s3", "s4"] and total == 5
    page, total = await service.list_schedules(offset=1, limit=2)
    assert [s.name for s in page] == ["s1", "s2"] and total == 5
    on_r1, total = await service.list_schedules(rack_id=r1.id)
    assert [s.name for s in on_r1] == ["s0", "s2", "s4"] and total == 3
    enabled_on_r1, total = await service.list_schedules(rack_id=r1.id, enabled_only=True, limit=1)
    assert [s.name for s in enabled_on_r1] == ["s0"] and total == 2
    beyond, total = await service.list_schedules(offset=10)
    assert beyond == [] and total == 5


async def test_list_breaks_creation_time_ties_by_id(env: Env) -> None:
    r1 = await env.rack("r1")
    made = [await env.schedule(f"same-{i}", racks=[r1]) for i in range(4)]
    listed, _ = await env.services.schedules.list_schedules()
    assert [s.id for s in listed] == sorted((s.id for s in made), key=lambda i: str(i))


# --- update --------------------------------------------------------------------------------------


async def test_update_name_and_policy_leave_the_timing_alone(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    env.clock.advance(timedelta(minutes=10))
    updated = await env.services.schedules.update(
        schedule.id,
        ["schedule.name", "schedule.overlap_policy"],
        name="renamed",
        overlap_policy=OverlapPolicy.QUEUE,
    )
    assert (updated.name, updated.overlap_policy) == ("renamed", OverlapPolicy.QUEUE)
    assert updated.next_run_at == schedule.next_run_at
    assert updated.updated_at == START + timedelta(minutes=10)
    assert await env.services.schedules.get(schedule.id) == updated


async def test_update_spec_replaces_type_and_text_and_recomputes_from_now(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "0 2 * * *", "Europe/Paris"))
    env.clock.advance(timedelta(minutes=10))
    updated = await env.services.schedules.update(
        schedule.id,
        ["schedule.spec"],
        spec_type=SpecType.INTERVAL,
        spec="30m",
        timezone="ignored/without/path",
    )
    assert updated.spec == ScheduleSpec(SpecType.INTERVAL, "30m", "Europe/Paris")
    assert updated.next_run_at == START + timedelta(minutes=40)


async def test_update_timezone_only_keeps_the_spec(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "0 14 * * *"))
    assert schedule.next_run_at == datetime(2026, 3, 2, 14, 0, tzinfo=UTC)
    updated = await env.services.schedules.update(
        schedule.id, ["schedule.spec.timezone"], timezone="Asia/Tokyo"
    )
    assert updated.spec == ScheduleSpec(SpecType.CRON, "0 14 * * *", "Asia/Tokyo")
    assert updated.next_run_at == datetime(2026, 3, 3, 5, 0, tzinfo=UTC)  # 14:00 JST = 05:00 UTC


async def test_update_timezone_to_empty_means_utc(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "0 14 * * *", "Asia/Tokyo"))
    updated = await env.services.schedules.update(schedule.id, ["schedule.spec.timezone"], timezone="")
    assert updated.spec.timezone == "UTC"


@pytest.mark.parametrize(
    "spec", [ScheduleSpec(SpecType.INTERVAL, "1h"), ScheduleSpec(SpecType.ONE_TIME, "2026-03-05T08:00:00Z")]
)
async def test_update_timezone_only_leaves_an_interval_or_one_time_next_run_alone(
    env: Env, spec: ScheduleSpec
) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=spec)
    env.clock.advance(timedelta(minutes=40))  # recomputing from now would postpone an interval's next run
    updated = await env.services.schedules.update(
        schedule.id, ["schedule.spec.timezone"], timezone="Asia/Tokyo"
    )
    assert updated.spec == replace(spec, timezone="Asia/Tokyo")
    assert updated.next_run_at == schedule.next_run_at
    assert await env.services.schedules.get(schedule.id) == updated


async def test_update_timezone_of_a_cron_schedule_recomputes_its_next_run(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "0 14 * * *"))
    updated = await env.services.schedules.update(
        schedule.id, ["schedule.spec.timezone"], timezone="America/New_York"
    )
    assert updated.next_run_at == datetime(2026, 3, 2, 19, 0, tzinfo=UTC)  # 14:00 EST


BAD_UPDATES: list[tuple[list[str], dict[str, object], str]] = [
    ([], {}, "update_mask"),
    (["schedule.operation"], {}, "update_mask: unknown path 'schedule.operation'"),
    (["schedule.name", "name"], {"name": "ok"}, "update_mask: unknown path 'name'"),
    (["schedule.name"], {"name": ""}, "schedule.name"),
    (["schedule.spec"], {"spec_type": None, "spec": "1h"}, r"schedule\.spec\.type"),
    (["schedule.spec"], {"spec_type": SpecType.CRON, "spec": "* * *"}, r"schedule\.spec\.spec"),
    (["schedule.spec.timezone"], {"timezone": "Local"}, r"schedule\.spec\.timezone"),
    (["schedule.spec.timezone"], {}, r"^schedule\.spec: .* no schedule\.spec"),
    (["schedule.name", "schedule.spec.timezone"], {"name": "new"}, r"^schedule\.spec: "),
    (["schedule.overlap_policy"], {}, r"schedule\.overlap_policy"),
]


@pytest.mark.parametrize(("paths", "values", "message"), BAD_UPDATES)
async def test_bad_update_is_invalid_and_changes_nothing(
    env: Env, paths: list[str], values: dict[str, object], message: str
) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    before = await table_counts(env.db)
    with pytest.raises(InvalidArgument, match=message):
        await env.services.schedules.update(schedule.id, paths, **values)  # type: ignore[arg-type]
    assert await env.services.schedules.get(schedule.id) == schedule
    assert await table_counts(env.db) == before


async def test_rename_to_a_taken_name_applies_nothing(env: Env) -> None:
    r1 = await env.rack("r1")
    await env.schedule("taken", racks=[r1])
    schedule = await env.schedule("mine", racks=[r1])
    with pytest.raises(AlreadyExists, match=r"schedule\.name: .*'taken'"):
        await env.services.schedules.update(
            schedule.id,
            ["schedule.spec", "schedule.name", "schedule.overlap_policy"],
            name="taken",
            overlap_policy=OverlapPolicy.QUEUE,
            spec_type=SpecType.INTERVAL,
            spec="5m",
        )
    assert await env.services.schedules.get(schedule.id) == schedule


async def test_rename_to_its_own_name_is_fine(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule("mine", racks=[r1])
    updated = await env.services.schedules.update(schedule.id, ["schedule.name"], name="mine")
    assert updated.name == "mine"


async def test_update_unknown_is_not_found(env: Env) -> None:
    with pytest.raises(NotFound):
        await env.services.schedules.update(uuid.uuid4(), ["schedule.name"], name="x")


# --- pause and resume ----------------------------------------------------------------------------


async def test_paused_schedule_is_not_due(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    paused = await env.services.schedules.pause(schedule.id)
    assert not paused.enabled and paused.next_run_at == schedule.next_run_at
    async with env.db.read() as conn:
        assert await dispatch.count_due(conn, START + timedelta(days=1)) == 0


async def test_pause_twice_is_a_no_op(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    paused = await env.services.schedules.pause(schedule.id)
    env.clock.advance(timedelta(minutes=1))
    assert await env.services.schedules.pause(schedule.id) == paused


async def test_resume_recomputes_from_now_so_it_does_not_fire_at_once(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    await env.services.schedules.pause(schedule.id)
    env.clock.advance(timedelta(hours=5))  # the old next_run_at is now 4 hours in the past
    resumed = await env.services.schedules.resume(schedule.id)
    assert resumed.enabled
    assert resumed.next_run_at == START + timedelta(hours=6)
    async with env.db.read() as conn:
        assert await dispatch.count_due(conn, env.clock.now()) == 0


async def test_resume_cron_recomputes_from_now(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.CRON, "30 12 * * *"))
    await env.services.schedules.pause(schedule.id)
    env.clock.advance(timedelta(days=2))
    resumed = await env.services.schedules.resume(schedule.id)
    assert resumed.next_run_at == datetime(2026, 3, 4, 12, 30, tzinfo=UTC)


async def test_resume_of_an_unfired_one_time_keeps_its_time(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.ONE_TIME, "2026-03-02T13:00:00Z"))
    await env.services.schedules.pause(schedule.id)
    env.clock.advance(timedelta(hours=3))
    resumed = await env.services.schedules.resume(schedule.id)
    assert resumed.enabled and resumed.next_run_at == datetime(2026, 3, 2, 13, 0, tzinfo=UTC)


async def test_resume_when_enabled_is_a_no_op(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1])
    env.clock.advance(timedelta(minutes=30))
    assert await env.services.schedules.resume(schedule.id) == schedule


@pytest.mark.parametrize("action", ["pause", "resume"])
async def test_pause_and_resume_unknown_are_not_found(env: Env, action: str) -> None:
    with pytest.raises(NotFound):
        await getattr(env.services.schedules, action)(uuid.uuid4())


# --- delete --------------------------------------------------------------------------------------


async def test_delete_cascades_scopes_and_runs_and_cancels_no_task(env: Env) -> None:
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule(racks=[r1, r2])
    task_ids = await env.services.schedules.trigger(schedule.id)
    assert len(task_ids) == 2
    await env.services.schedules.delete(schedule.id)
    counts = await table_counts(env.db)
    assert counts["task_schedule"] == counts["task_schedule_scope"] == counts["task_schedule_run"] == 0
    tasks = await env.services.tasks.get_tasks(task_ids)
    assert [t.status.value for t in tasks] == ["pending", "pending"]
    with pytest.raises(NotFound):
        await env.services.schedules.get(schedule.id)
    with pytest.raises(NotFound):
        await env.services.schedules.delete(schedule.id)


async def test_consumed_one_time_cannot_be_paused_resumed_or_re_armed(env: Env) -> None:
    r1 = await env.rack("r1")
    schedule = await env.schedule(racks=[r1], spec=ScheduleSpec(SpecType.ONE_TIME, "2026-04-01T00:00:00Z"))
    await env.services.schedules.trigger(schedule.id)
    consumed = await env.services.schedules.get(schedule.id)
    assert not consumed.enabled and consumed.next_run_at is None
    before = await table_counts(env.db)
    for action in (env.services.schedules.pause, env.services.schedules.resume):
        with pytest.raises(FailedPrecondition, match="already fired"):
            await action(schedule.id)
    with pytest.raises(FailedPrecondition, match="already fired"):
        await env.services.schedules.update(
            schedule.id, ["schedule.spec"], spec_type=SpecType.ONE_TIME, spec="2027-01-01T00:00:00Z"
        )
    with pytest.raises(FailedPrecondition, match="already fired"):
        await env.services.schedules.update(schedule.id, ["schedule.spec.timezone"], timezone="Europe/Paris")
    assert await env.services.schedules.get(schedule.id) == consumed
    assert await table_counts(env.db) == before
    renamed = await env.services.schedules.update(schedule.id, ["schedule.name"], name="done")
    assert renamed.name == "done" and renamed.next_run_at is None


async def test_store_translates_a_name_race_into_already_exists(env: Env) -> None:
    """Two creates that both pass the pre-check: the unique constraint decides, reported as ALREADY_EXISTS."""
    r1 = await env.rack("r1")
    first = await env.schedule("first", racks=[r1])
    second = await env.schedule("second", racks=[r1])
    with pytest.raises(AlreadyExists, match="'first'"):
        async with env.db.transaction() as conn:
            await store.insert_schedule(conn, replace(second, id=uuid.uuid4(), name="first"))
    with pytest.raises(AlreadyExists, match="'first'"):
        async with env.db.transaction() as conn:
            await store.save_schedule(conn, replace(second, name="first"))
    assert await env.services.schedules.get(first.id) == first
    assert await env.services.schedules.get(second.id) == second
