"""Migration 0013 on a database holding a rack and a pending task, on both databases: the task is still
claimable and no budget holds it; the CHECKs refuse caps below 1 and the name is unique; the downgrade
drops the table."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Connection, insert
from sqlalchemy.exc import IntegrityError

from rackflow.domain.tasks import TaskStatus
from rackflow.store import budgets as budget_store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate, run_scripts
from rackflow.store.tables import operation_budgets, racks, tasks
from rackflow.store.tasks import get_task
from tests.conftest import database_at

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
RACK, TASK = uuid.uuid4(), uuid.uuid4()


@pytest.fixture
async def db_at_0012(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0012") as db:
        yield db


def _budget(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "name": name,
        "operations": ["upgrade_firmware"],
        "max_running": 8,
        "created_at": T0,
        "updated_at": T0,
        **fields,
    }


async def test_upgrade_keeps_tasks_and_adds_the_budgets_table(db_at_0012: Database) -> None:
    db = db_at_0012
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=T0))
        await conn.execute(
            insert(tasks).values(
                id=TASK, operation="upgrade_firmware",
                parameters={"kind": "upgrade_firmware", "target_version": "2.1"}, rack_id=RACK,
                component_ids=[], status="pending", created_at=T0, updated_at=T0,
            )
        )  # fmt: skip
    assert await migrate(db) == head_revision() == await current_revision(db)
    async with db.read() as conn:
        task = await get_task(conn, TASK)
        assert task is not None and task.status is TaskStatus.PENDING and task.not_before is None
        assert await budget_store.all_budgets(conn) == []


async def test_the_checks_hold_and_the_downgrade_drops_the_table(db_at_0012: Database) -> None:
    db = db_at_0012
    await migrate(db)
    async with db.transaction() as conn:
        await conn.execute(insert(operation_budgets).values(**_budget("fw", max_running_per_domain=2)))
    for bad in (
        _budget("fw"),
        _budget("zero", max_running=0),
        _budget("per-domain-zero", max_running_per_domain=0),
    ):
        with pytest.raises(IntegrityError):
            async with db.transaction() as conn:
                await conn.execute(insert(operation_budgets).values(**bad))

    def downgrade(sync: Connection) -> list[str]:
        run_scripts(sync, "0012", down=True)
        return list(sync.dialect.get_table_names(sync))

    async with db.engine.begin() as conn:
        tables = await conn.run_sync(downgrade)
    assert await current_revision(db) == "0012"
    assert "operation_budgets" not in tables
