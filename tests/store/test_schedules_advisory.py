"""The advisory RPCs: CheckScheduleConflicts (the task manager's rules, coarse on purpose) and
PreviewScheduleSpec."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.domain.inventory import ComponentTarget, ComponentType, TargetSpec
from rackflow.domain.tasks import Operation, OperationKind
from rackflow.errors import InvalidArgument, NotFound
from rackflow.store.db import Database
from rackflow.timespec import ScheduleSpec, SpecType
from tests.conftest import table_counts
from tests.store.schedules_support import POWER_OFF, START, Env, make_env, rack_target

FIRMWARE = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="v2.1.0")


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


# --- conflicts -----------------------------------------------------------------------------------


async def test_same_operation_on_a_shared_rack_conflicts(env: Env) -> None:
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    first = await env.schedule("first", racks=[r1, r2])
    env.clock.advance(timedelta(seconds=1))
    second = await env.schedule("second", racks=[r2])
    await env.schedule("elsewhere", racks=[r3])
    conflicts = await env.services.schedules.check_conflicts(POWER_OFF, rack_target(r1, r2))
    assert [s.id for s in conflicts] == [first.id, second.id]


async def test_existing_bring_up_conflicts_with_a_proposed_power_on(env: Env) -> None:
    r1 = await env.rack("r1")
    bring_up = await env.schedule("bring-up", racks=[r1], operation=Operation(OperationKind.BRING_UP))
    conflicts = await env.services.schedules.check_conflicts(
        Operation(OperationKind.POWER_ON), rack_target(r1)
    )
    assert [s.id for s in conflicts] == [bring_up.id]


async def test_compute_power_reset_conflicts_with_an_nvswitch_firmware_upgrade_of_the_same_rack(
    env: Env,
) -> None:
    # At run time these two would run side by side (disjoint components); the check is coarse on purpose.
    r1 = await env.rack("r1")
    reset = await env.schedule(
        "reset-trays",
        target=rack_target(r1, types=(ComponentType.COMPUTE,)),
        operation=Operation(OperationKind.POWER_RESET),
    )
    conflicts = await env.services.schedules.check_conflicts(
        FIRMWARE, rack_target(r1, types=(ComponentType.NVSWITCH,))
    )
    assert [s.id for s in conflicts] == [reset.id]


async def test_one_match_among_several_schedules(env: Env) -> None:
    r1, r2, r3 = await env.rack("r1"), await env.rack("r2"), await env.rack("r3")
    await env.schedule("ingest-r2", racks=[r2], operation=Operation(OperationKind.INGEST))
    on_r1 = await env.schedule("firmware-r1", racks=[r1], operation=FIRMWARE)
    await env.schedule("power-on-r3", racks=[r3], operation=Operation(OperationKind.POWER_ON))
    paused = await env.schedule("paused-r1", racks=[r1], operation=Operation(OperationKind.BRING_UP))
    await env.services.schedules.pause(paused.id)
    conflicts = await env.services.schedules.check_conflicts(
        Operation(OperationKind.POWER_OFF, forced=True), rack_target(r1)
    )
    assert [s.id for s in conflicts] == [on_r1.id]


async def test_conflict_check_ignores_component_filters(env: Env) -> None:
    r1 = await env.rack("r1")
    existing = await env.schedule(target=rack_target(r1, types=(ComponentType.COMPUTE,)))
    proposed = TargetSpec(components=(ComponentTarget(id=r1.components[2].id),))  # the power shelf only
    conflicts = await env.services.schedules.check_conflicts(POWER_OFF, proposed)
    assert [s.id for s in conflicts] == [existing.id]


async def test_conflict_check_skips_paused_and_excluded_schedules(env: Env) -> None:
    r1 = await env.rack("r1")
    paused = await env.schedule("paused", racks=[r1])
    await env.services.schedules.pause(paused.id)
    editing = await env.schedule("editing", racks=[r1])
    assert [s.id for s in await env.services.schedules.check_conflicts(POWER_OFF, rack_target(r1))] == [
        editing.id
    ]
    assert await env.services.schedules.check_conflicts(POWER_OFF, rack_target(r1), editing.id) == []
    assert await env.services.schedules.check_conflicts(POWER_OFF, rack_target(r1), uuid.uuid4()) != []


async def test_conflict_check_validates_its_target(env: Env) -> None:
    with pytest.raises(NotFound, match="target_spec"):
        await env.services.schedules.check_conflicts(
            POWER_OFF, TargetSpec(components=(ComponentTarget(id=uuid.uuid4()),))
        )
    with pytest.raises(InvalidArgument, match="target_spec"):
        await env.services.schedules.check_conflicts(POWER_OFF, TargetSpec())


# --- preview -------------------------------------------------------------------------------------

AFTER = datetime(2026, 6, 1, 0, 0, tzinfo=UTC)


async def test_preview_interval_steps_from_after(env: Env) -> None:
    times = env.services.schedules.preview(ScheduleSpec(SpecType.INTERVAL, "90m"), AFTER, 3)
    assert times == [AFTER + timedelta(minutes=90 * n) for n in (1, 2, 3)]


async def test_preview_cron_is_strictly_after_and_in_the_zone(env: Env) -> None:
    spec = ScheduleSpec(SpecType.CRON, "0 0 * * *", "Europe/Paris")  # midnight in Paris = 22:00 UTC (CEST)
    times = env.services.schedules.preview(spec, datetime(2026, 5, 31, 22, 0, tzinfo=UTC), 2)
    assert times == [datetime(2026, 6, 1, 22, 0, tzinfo=UTC), datetime(2026, 6, 2, 22, 0, tzinfo=UTC)]


async def test_preview_one_time_gives_its_time_even_if_past(env: Env) -> None:
    times = env.services.schedules.preview(
        ScheduleSpec(SpecType.ONE_TIME, "2020-01-01T00:00:00-05:00"), None, 5
    )
    assert times == [datetime(2020, 1, 1, 5, 0, tzinfo=UTC)]


async def test_preview_defaults_to_now_and_ten_times(env: Env) -> None:
    times = env.services.schedules.preview(ScheduleSpec(SpecType.INTERVAL, "1h"), None, 0)
    assert times == [START + timedelta(hours=n) for n in range(1, 11)]
    assert len(env.services.schedules.preview(ScheduleSpec(SpecType.INTERVAL, "1h"), None, 100)) == 100


@pytest.mark.parametrize(
    ("spec", "count", "message"),
    [
        (ScheduleSpec(SpecType.INTERVAL, "1h"), 101, "count"),
        (ScheduleSpec(SpecType.INTERVAL, "1h"), -1, "count"),
        (ScheduleSpec(SpecType.INTERVAL, "soon"), 1, r"^spec\.spec: "),
        (ScheduleSpec(SpecType.CRON, "* * * *"), 1, r"^spec\.spec: "),
        (ScheduleSpec(SpecType.ONE_TIME, "tomorrow"), 1, r"^spec\.spec: "),
        (ScheduleSpec(SpecType.CRON, "0 2 * * *", "Local"), 1, r"^spec\.timezone: "),
        (ScheduleSpec(SpecType.INTERVAL, "1" * 300 + "s"), 1, r"^spec\.spec: "),
    ],
)
async def test_preview_validates_like_create(env: Env, spec: ScheduleSpec, count: int, message: str) -> None:
    before = await table_counts(env.db)
    with pytest.raises(InvalidArgument, match=message):
        env.services.schedules.preview(spec, None, count)
    assert await table_counts(env.db) == before
