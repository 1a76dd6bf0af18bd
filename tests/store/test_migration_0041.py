"""Migration 0041 on a database holding audit events, on both databases (on PostgreSQL, in the partitions
of migration 0028): every event kept with no changes, an event's changes written and read back once
upgraded, an insert of the previous release (which names no changes) still taken, and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import Connection, insert, inspect

from rackflow.domain.audit import AuditEvent
from rackflow.store import audit as store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import audit_events
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 8, 12, 0, tzinfo=UTC)
REMOVED = [{"scope_entry": "removed", "schedule_id": str(uuid.uuid4()), "schedule_name": "nightly"}]


@pytest.fixture
async def db_at_0040(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0040") as db:
        yield db


def _row(method: str) -> dict[str, object]:
    """An event's row with the columns every release since 0002 writes: inserted alone, as the release
    before 0041 inserts its events."""
    return {
        "id": uuid.uuid4(),
        "at": T0,
        "principal": "oncall",
        "method": method,
        "target_ids": [],
        "outcome": "OK",
        "error": "",
        "request": {},
    }


def _columns(conn: Connection) -> set[str]:
    return {column["name"] for column in inspect(conn).get_columns("audit_events")}


async def test_events_are_kept_changes_written_and_read_and_back_down(db_at_0040: Database) -> None:
    db = db_at_0040
    async with db.transaction() as conn:
        await conn.execute(insert(audit_events).values(_row("CreateRack")))
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.transaction() as conn:
        await conn.execute(insert(audit_events).values(_row("DeleteRack")))  # the previous release's insert
        deleted = AuditEvent(**{**_row("DeleteRack"), "target_ids": ()}, changes=REMOVED)  # type: ignore[arg-type]
        await store.insert_events(conn, [deleted])
    async with db.read() as conn:
        found, _ = await store.list_events(conn)
    assert sorted((e.method, e.changes) for e in found if e.id != deleted.id) == [
        ("CreateRack", None),
        ("DeleteRack", None),
    ]
    assert [e.changes for e in found if e.id == deleted.id] == [REMOVED]

    await downgrade(db, "0040")
    assert await current_revision(db) == "0040"
    async with db.engine.connect() as conn:
        assert "changes" not in await conn.run_sync(_columns)
    assert (await table_counts(db))["audit_events"] == 3
