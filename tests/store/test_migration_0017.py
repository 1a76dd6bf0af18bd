"""Migration 0017 on a database holding 0016's notification rows, on both databases: an event and a channel
written before it read back unkeyed, never cleared and with a full bucket; the event is pruned as before;
a second event with a key already taken is left out; and the downgrade goes back to 0016."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, insert, select

from rackflow.domain.notifications import Event, EventType, Severity
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate, run_scripts
from rackflow.store.tables import notification_channel, notification_event

pytestmark = pytest.mark.asyncio

OLD = datetime.now(UTC) - timedelta(days=30)
EVENT, CHANNEL = uuid.uuid4(), uuid.uuid4()


@pytest.fixture
async def db_at_0016(empty_db_url: str) -> AsyncIterator[Database]:
    db = Database(empty_db_url)
    assert await migrate(db, "0016") == "0016"
    async with db.transaction() as conn:
        await conn.execute(
            insert(notification_event).values(
                id=EVENT, type="task.failed", severity="warning", at=OLD, summary="task failed",
                principal="rackflow", payload={}, fanned_out=True,
            )
        )  # fmt: skip
        await conn.execute(
            insert(notification_channel).values(
                id=CHANNEL, name="hook", kind="webhook", url="http://127.0.0.1:9/", event_types=[],
                schedules=[], operations=[], min_severity="info", rate_per_minute=60, max_attempts=10,
                created_at=OLD, updated_at=OLD,
            )
        )  # fmt: skip
    yield db
    await db.dispose()


async def test_old_rows_read_back_and_keys_are_written_once(db_at_0016: Database) -> None:
    db = db_at_0016
    assert await migrate(db) == head_revision()
    async with db.read() as conn:
        (event,) = await outbox.list_events(conn, 10)
        row = (await conn.execute(select(notification_event.c.cleared_at))).one()
        bucket = (await conn.execute(select(notification_channel.c.rate_tokens))).one()
    assert (event.id, event.key, row.cleared_at, bucket.rate_tokens) == (EVENT, "", None, None)

    keyed = [Event(EventType.TASK_FAILED, Severity.WARNING, OLD, "found", key="k") for _ in range(2)]
    async with db.transaction() as conn:
        await outbox.record_events(conn, keyed)  # the same key twice: one event
    async with db.read() as conn:
        assert [e.key for e in await outbox.list_events(conn, 10)].count("k") == 1
    assert sum([n async for n in outbox.prune_delivered(db, timedelta(days=7))]) == 1  # the unkeyed one

    def downgrade(sync: Connection) -> None:
        run_scripts(sync, "0016", down=True)

    async with db.engine.begin() as conn:
        await conn.run_sync(downgrade)
    assert await current_revision(db) == "0016"
