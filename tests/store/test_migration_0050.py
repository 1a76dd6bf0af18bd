"""Migration 0050 on a database holding decisions owed, on both databases: each row is kept, its cause
NULL (read as none: a release before it recorded none), while a release at 0049 may still insert rows
naming only its columns; a row owed once upgraded keeps its cause, read as the decision finds it owed; the
downgrade drops the column and nothing else."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, insert, inspect

from rackflow.store import decisions_owed
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import window_decisions_owed
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 5, 22, 0, tzinfo=UTC)
T1 = datetime(2026, 12, 5, 23, 0, tzinfo=UTC)


@pytest.fixture
async def db_at_0049(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0049") as db:
        yield db


def _columns(conn: Connection) -> set[str]:
    return {c["name"] for c in inspect(conn).get_columns("window_decisions_owed")}


async def owe_as_0049(db: Database, task_id: uuid.UUID) -> None:
    """Record a decision owed as release 0049 does (`store.decisions_owed.owe` then): naming the task and
    when, and no other column."""
    async with db.transaction() as conn:
        await conn.execute(insert(window_decisions_owed), [{"task_id": task_id, "owed_since": T0}])


async def test_rows_kept_without_a_cause_a_cause_recorded_once_upgraded_and_back_down(
    db_at_0049: Database,
) -> None:
    db = db_at_0049
    old, older_release, new = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await owe_as_0049(db, old)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)

    await owe_as_0049(db, older_release)  # a release before it, still serving beside this one
    cause = {"change": "window_updated", "window_id": str(uuid.uuid4()), "window_name": "nightly"}
    async with db.transaction() as conn:
        await decisions_owed.owe(conn, {new: cause}, T1)
        await decisions_owed.owe(conn, {new: {"change": "window_deleted"}}, T1)  # the first cause stays
    async with db.transaction() as conn:
        settled = await decisions_owed.recorded(conn, {old, older_release, new})
        await decisions_owed.settle(conn, settled)
    assert settled == {
        old: decisions_owed.Owed(T0, None),
        older_release: decisions_owed.Owed(T0, None),
        new: decisions_owed.Owed(T1, cause),
    }
    async with db.read() as conn:
        assert await decisions_owed.owed(conn, 10) == []

    async with db.transaction() as conn:
        await decisions_owed.owe(conn, {new: cause}, T1)
    await downgrade(db, "0049")
    assert await current_revision(db) == "0049"
    async with db.engine.connect() as conn:
        assert "cause" not in await conn.run_sync(_columns)
    async with db.read() as conn:  # release 0049 reads its rows as before
        assert await decisions_owed.owed(conn, 10) == [new]
