"""The web app in process (JSON API and pages) over the `db` fixture, with an httpx client, and a small
fleet to look at: racks r1..r3 and schedules built through the services."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from rackflow.api.audit import AuditInterceptor
from rackflow.clock import Clock, FakeClock
from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackTarget, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.security import TokenTable
from rackflow.services import Services
from rackflow.store import tasks as task_store
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.web.app import build_app
from rackflow.web.security import HttpSecurity
from tests.api.conftest import services  # noqa: F401  (the fixture)

BASE_URL = "http://127.0.0.1:8080"
START = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
NIGHTLY = ScheduleSpec(SpecType.CRON, "0 2 * * *", "Europe/Berlin")


@pytest.fixture
def clock() -> Clock:
    return FakeClock(START)


@pytest.fixture
def tokens() -> TokenTable | None:
    """No bearer tokens: everyone reads and acts (a module overrides this to turn them on)."""
    return None


@pytest.fixture
def security() -> HttpSecurity:
    """The request guard's settings: `rackflow serve --http-listen 127.0.0.1:8080`'s (`make run`)."""
    return HttpSecurity()


@pytest.fixture
async def http(
    services: Services,  # noqa: F811
    tokens: TokenTable | None,
    security: HttpSecurity,
) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(services, AuditInterceptor(services.audit), tokens, services.clock, security)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        yield client
    await services.audit.close()


async def make_racks(services: Services, *names: str) -> list[uuid.UUID]:  # noqa: F811
    types = (ComponentType.POWERSHELF, ComponentType.COMPUTE, ComponentType.NVSWITCH)
    ids = []
    for name in names:
        specs = [ComponentSpec(t, f"{name}-{t.value.lower()}", f"{name}-{t.value.lower()}") for t in types]
        ids.append((await services.inventory.create_rack(name, components=specs)).id)
        _tick(services)
    return ids


def _tick(services: Services) -> None:  # noqa: F811
    """Move a fake clock on a second, so what is made one after another is listed in that order."""
    if isinstance(services.clock, FakeClock):
        services.clock.advance(timedelta(seconds=1))


async def make_schedule(
    services: Services,  # noqa: F811
    name: str,
    *racks: str,
    spec: ScheduleSpec = NIGHTLY,
    kind: OperationKind = OperationKind.POWER_RESET,
    rollout: RolloutPolicy | None = None,
    approval: ApprovalPolicy | None = None,
) -> Schedule:
    _tick(services)
    return await services.schedules.create(
        name=name,
        spec=spec,
        overlap_policy=OverlapPolicy.SKIP,
        operation=Operation(kind),
        queue=QueueOptions(),
        description="",
        target=TargetSpec(racks=tuple(RackTarget(name=r) for r in racks)),
        rollout=rollout,
        approval=approval,
    )


async def end_task(services: Services, task_id: uuid.UUID, status: TaskStatus) -> None:  # noqa: F811
    """Move a task to a final status, as an executor would have."""
    async with services.db.transaction() as conn:
        await task_store.set_status(conn, [task_id], status, now=services.clock.now(), message=status.value)
