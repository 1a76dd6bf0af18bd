"""Migration 0007 on a database holding schedules, on both databases: a schedule paused before it stays
paused with no reason and no end, an enabled one stays enabled, and the columns round-trip afterwards."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert

from rackflow.domain.schedules import Pause
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import task_schedule
from tests.conftest import database_at

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PAUSED, ENABLED = uuid.uuid4(), uuid.uuid4()


@pytest.fixture
async def db_at_0006(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0006") as db:
        yield db


def _schedule(schedule_id: uuid.UUID, name: str, enabled: bool) -> dict[str, object]:
    return {
        "id": schedule_id,
        "name": name,
        "spec_type": "interval",
        "spec": "1h",
        "operation_template": {"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
        "enabled": enabled,
        "next_run_at": T0 + timedelta(hours=1),
        "created_at": T0,
        "updated_at": T0,
    }


async def test_upgrade_keeps_paused_schedules_paused_with_no_reason_or_end(db_at_0006: Database) -> None:
    db = db_at_0006
    async with db.transaction() as conn:
        await conn.execute(
            insert(task_schedule),
            [_schedule(PAUSED, "paused", False), _schedule(ENABLED, "enabled", True)],
        )

    assert await migrate(db) == head_revision() == await current_revision(db)

    async with db.transaction() as conn:
        paused = await store.get_schedule(conn, PAUSED)
        enabled = await store.get_schedule(conn, ENABLED)
        assert paused is not None and enabled is not None
        assert not paused.enabled and paused.pause is None
        assert enabled.enabled and enabled.pause is None
        pause = Pause(reason="PSU swap", by="oncall", at=T0, resume_at=T0 + timedelta(hours=2))
        await store.save_schedule(conn, replace(paused, pause=pause))
    async with db.read() as conn:
        again = await store.get_schedule(conn, PAUSED)
        assert again is not None and again.pause == pause
        assert await store.claim_pauses_ended(db, conn, T0 + timedelta(hours=2), 10) == [again]
        assert await store.claim_pauses_ended(db, conn, T0 + timedelta(hours=1), 10) == []
