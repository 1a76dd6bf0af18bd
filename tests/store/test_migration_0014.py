"""Migration 0014 on a database holding 0013's tasks, on both databases: an active task's window moves
from its JSON parameters into the typed hold (the opening into `not_before`, the later of it and a
freeze's hold; the end into `not_after`), what holds it is named from its message, and an ended task is
left as it was."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from rackflow.store.db import Database
from rackflow.store.migrate import head_revision, migrate
from rackflow.store.tables import racks, tasks
from rackflow.store.tasks import get_task
from tests.conftest import database_at

NOW = datetime.now(UTC).replace(microsecond=0)
OPENS, ENDS = NOW + timedelta(hours=2), NOW + timedelta(hours=4)
RACK = uuid.uuid4()
DEFERRED, FROZEN, RUNNING, ENDED = (uuid.uuid4() for _ in range(4))


@pytest.fixture
async def db_at_0013(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0013") as db:
        yield db


def _task(task_id: uuid.UUID, status: str, message: str, window: bool, **fields: Any) -> dict[str, Any]:
    parameters: dict[str, Any] = {"kind": "power_off"}
    if window:
        parameters.update(window_start=OPENS.isoformat(), window_end=ENDS.isoformat())
    return {
        "id": task_id, "operation": "power_off", "parameters": parameters, "rack_id": RACK,
        "component_ids": [], "status": status, "message": message, "created_at": NOW, "updated_at": NOW,
        "not_before": None, **fields,
    }  # fmt: skip


async def test_active_tasks_windows_become_typed_holds(db_at_0013: Database) -> None:
    db = db_at_0013
    freeze_end = OPENS + timedelta(hours=1)
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=NOW))
        await conn.execute(
            insert(tasks),
            [
                _task(DEFERRED, "pending", "waits for the opening at …", True),
                _task(FROZEN, "pending", "waits for freeze 'f' to end at …", True, not_before=freeze_end),
                _task(RUNNING, "running", "powering off", True),
                _task(ENDED, "completed", "done", True),
            ],
        )
    assert await migrate(db) == head_revision()
    async with db.read() as conn:
        deferred, frozen, running, ended = [
            await get_task(conn, i) for i in (DEFERRED, FROZEN, RUNNING, ENDED)
        ]
    assert deferred is not None and frozen is not None and running is not None and ended is not None
    assert (deferred.not_before, deferred.not_after, deferred.held_by) == (OPENS, ENDS, "window")
    assert (deferred.held_reason, deferred.held_since) == ("waits for the opening at …", NOW)
    assert (frozen.not_before, frozen.not_after, frozen.held_by) == (freeze_end, ENDS, "freeze")
    assert (running.not_before, running.not_after, running.held_by) == (None, ENDS, None)
    assert (ended.not_before, ended.not_after, ended.held_by) == (None, None, None)
