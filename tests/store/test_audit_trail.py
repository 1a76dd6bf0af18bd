"""`AuditTrail`, the entry point every front end records through (not only the gRPC interceptor), on both
databases: one event with the schedule before and after, and the list filters."""

from __future__ import annotations

import pytest

from rackflow.domain.audit import OK, EventFilter
from rackflow.errors import InvalidArgument
from rackflow.store.db import Database
from rackflow.store.paging import Listed
from tests.store.schedules_support import Env, make_env


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def test_an_action_outside_grpc_is_recorded_with_its_schedule_before_and_after(env: Env) -> None:
    trail = env.services.audit
    schedule = await env.schedule(racks=[await env.rack("r1")])
    before = await trail.schedule_before(schedule.id)
    await env.services.schedules.pause(schedule.id)
    await trail.record(
        principal="oncall",
        method="PauseTaskSchedule",
        target_ids=[str(schedule.id)],
        outcome=OK,
        request={"id": str(schedule.id), "via": "http"},
        schedule_id=schedule.id,
        before=before,
    )
    (event,), total = await trail.list_events(EventFilter(principal="oncall"))
    assert total == Listed(1)
    assert (event.method, event.outcome, event.target_ids) == ("PauseTaskSchedule", OK, (str(schedule.id),))
    assert event.request == {"id": str(schedule.id), "via": "http"}
    assert before is not None and before["enabled"] is True
    assert event.schedule_before == before
    assert event.schedule_after is not None and event.schedule_after["enabled"] is False
    assert await trail.list_events(EventFilter(method="CreateRack")) == ([], Listed(0))


async def test_a_principal_no_row_can_hold_is_refused(env: Env) -> None:
    with pytest.raises(InvalidArgument, match=r"^principal: "):
        await env.services.audit.list_events(EventFilter(principal="a\x00b"))
