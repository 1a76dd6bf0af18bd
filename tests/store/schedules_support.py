"""Shared set-up for the schedule store tests: services on a FakeClock, racks, and a schedule factory."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rackflow.clock import FakeClock
from rackflow.domain.inventory import ComponentSpec, ComponentType, Rack, RackTarget, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.timespec import ScheduleSpec, SpecType

START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
HOURLY = ScheduleSpec(SpecType.INTERVAL, "1h")
POWER_OFF = Operation(OperationKind.POWER_OFF)
RACK_TYPES = (ComponentType.COMPUTE, ComponentType.NVSWITCH, ComponentType.POWERSHELF)


@dataclass
class Env:
    db: Database
    clock: FakeClock
    services: Services

    async def rack(self, name: str, types: Sequence[ComponentType] = RACK_TYPES) -> Rack:
        specs = [ComponentSpec(t, f"{name}-{t.value.lower()}-{i}") for i, t in enumerate(types)]
        return await self.services.inventory.create_rack(name, components=specs)

    async def schedule(
        self,
        name: str = "nightly",
        *,
        racks: Sequence[Rack] = (),
        target: TargetSpec | None = None,
        spec: ScheduleSpec = HOURLY,
        policy: OverlapPolicy = OverlapPolicy.SKIP,
        operation: Operation = POWER_OFF,
        rollout: RolloutPolicy | None = None,
    ) -> Schedule:
        return await self.services.schedules.create(
            name=name,
            spec=spec,
            overlap_policy=policy,
            operation=operation,
            queue=QueueOptions(),
            description=f"{name} description",
            target=target or rack_target(*racks),
            rollout=rollout,
        )

    def delete_before_its_submit(self, monkeypatch: pytest.MonkeyPatch, schedule: Schedule) -> None:
        """DeleteSchedule of `schedule` commits between the next firing's claim and its submit: the
        service's `fire` (phases 2 and 3) deletes the schedule first."""
        schedules = self.services.schedules
        fire = schedules.fire

        async def deleted_first(claimed: Any, **kwargs: Any) -> Any:
            await schedules.delete(schedule.id)
            return await fire(claimed, **kwargs)

        monkeypatch.setattr(schedules, "fire", deleted_first)


class MovingClock(FakeClock):
    """A test's clock that moves with real time (from now), and further when told to: for tests of loops
    that wait in real time for what falls due. Like any FakeClock it stands for the database's clock."""

    def __init__(self) -> None:
        super().__init__(datetime.now(UTC))
        self._started = time.monotonic()

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=time.monotonic() - self._started)


def make_env(db: Database, clock: FakeClock | None = None) -> Env:
    """Services on `clock` (a FakeClock at START by default), which `db` then reads too."""
    clock = clock or FakeClock(START)
    return Env(db, clock, Services.build(db, clock))


def rack_target(*racks: Rack, types: Sequence[ComponentType] = ()) -> TargetSpec:
    return TargetSpec(racks=tuple(RackTarget(id=r.id, component_types=tuple(types)) for r in racks))
