"""Scope rows are locked in id order by every writer of several of them, so a scope update and the
dispatcher's write-back of the same schedule wait for each other instead of deadlocking (PostgreSQL)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import update

from rackflow.domain.inventory import ComponentType
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule_scope
from tests.store.lock_waits import waiting_for
from tests.store.schedules_support import Env, make_env, rack_target

pytestmark = pytest.mark.postgres


@pytest.fixture
async def env(postgres_url: str) -> AsyncIterator[Env]:
    """Row locks are PostgreSQL's (SQLite has one writer). This database is not emptied between tests."""
    db = Database(postgres_url)
    yield make_env(db)
    await db.dispose()


async def test_a_scope_update_waits_for_a_write_back_holding_a_lower_scope_row(env: Env) -> None:
    suffix = uuid.uuid4().hex[:8]
    racks = [await env.rack(f"r1-{suffix}"), await env.rack(f"r2-{suffix}")]
    schedule = await env.schedule(f"nightly-{suffix}", racks=racks)
    low, high = sorted(await env.services.schedules.list_scopes(schedule.id), key=lambda s: s.id)
    by_id = {r.id: r for r in racks}
    # Listed high first, so an update in change order would lock the high row before the low one.
    desired = rack_target(by_id[high.rack_id], by_id[low.rack_id], types=[ComponentType.COMPUTE])

    async with env.db.transaction() as write_back:  # as the dispatcher's phase 3: rows in id order
        touch = update(task_schedule_scope).values(last_task_id=None)
        await write_back.execute(touch.where(task_schedule_scope.c.id == low.id))
        scope_update = asyncio.create_task(env.services.schedules.update_scope(schedule.id, desired))
        await waiting_for(env.db, write_back, scope_update)  # for the low row
        await write_back.execute(touch.where(task_schedule_scope.c.id == high.id))  # no deadlock
    scopes, changes = await asyncio.wait_for(scope_update, 10)
    assert changes.updated == 2
    assert all(s.filter is not None for s in scopes)
