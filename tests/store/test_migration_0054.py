"""Migration 0054 on a database holding notification events and their deliveries, on both databases: every
row kept, the look for re-sends reading them as before; the two indexes it reads built (on PostgreSQL,
valid; a build left invalid by a killed migration built again), and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, text

from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import notification_channel, notification_delivery, notification_event
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.index_builds import index_valid, leave_an_invalid_build
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

INDEXES = {
    "ix_notification_event_type_cleared_at": ("notification_event", "summary"),
    "ix_notification_delivery_channel_id_delivered_at": ("notification_delivery", "last_error"),
}
T0 = datetime(2026, 6, 1, tzinfo=UTC)
INTERVAL = timedelta(minutes=1)


@pytest.fixture
async def db_at_0053(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0053") as db:
        yield db


async def _history(db: Database) -> uuid.UUID:
    """An Alertmanager channel, as release 0053 writes it, sent a one-off failed task and a held task's
    alert still open (keyed, not cleared): its id. The open alert is due again at T0 + INTERVAL."""
    channel_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            insert(notification_channel).values(
                id=channel_id, name="am", kind="alertmanager", url="http://127.0.0.1:9093", secret="",
                enabled=True, event_types=[], schedules=[], operations=[], min_severity="info",
                rate_per_minute=60, max_attempts=10, rate_tokens=60.0, rate_at=T0, created_at=T0,
                updated_at=T0,
            )
        )  # fmt: skip
        for kind, key in (("task.failed", None), ("task.held_too_long", "held:1")):
            event_id = uuid.uuid4()
            await conn.execute(
                insert(notification_event).values(
                    id=event_id, type=kind, severity="warning", at=T0, summary=kind, principal="rackflow",
                    payload={}, fanned_out=True, dedupe_key=key, task_id=None,
                )
            )  # fmt: skip
            await conn.execute(
                insert(notification_delivery).values(
                    id=uuid.uuid4(), event_id=event_id, channel_id=channel_id, state="delivered", attempts=1,
                    claims=1, next_attempt_at=T0 + INTERVAL, delivered_at=T0, created_at=T0,
                )
            )  # fmt: skip
    return channel_id


async def _next_resend(db: Database, channel_id: uuid.UUID) -> datetime | None:
    async with db.read() as conn:
        return await outbox.next_resend(conn, [channel_id], T0 + INTERVAL, INTERVAL)


async def test_events_and_deliveries_are_kept_and_looked_at_and_back_down(db_at_0053: Database) -> None:
    db = db_at_0053
    channel_id = await _history(db)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    assert await _next_resend(db, channel_id) == T0 + INTERVAL  # the open hold's alert, due again
    if db.is_postgres:
        for index in INDEXES:
            assert await index_valid(db, index) is True

    await downgrade(db, "0053")
    assert await current_revision(db) == "0053"
    if db.is_postgres:
        for index in INDEXES:
            assert await index_valid(db, index) is None
    assert (await table_counts(db))["notification_delivery"] == 2


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_build_a_killed_migration_left_invalid_is_built_again(db_at_0053: Database) -> None:
    db = db_at_0053
    channel_id = await _history(db)
    for index, (table, column) in INDEXES.items():
        await leave_an_invalid_build(db, index, table, column)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    async with db.engine.connect() as conn:
        for index in INDEXES:
            assert await index_valid(db, index) is True
            definition = await conn.execute(text("SELECT pg_get_indexdef(to_regclass(:i))"), {"i": index})
            assert "summary" not in (found := definition.scalar_one()) and "last_error" not in found
    assert await _next_resend(db, channel_id) == T0 + INTERVAL
