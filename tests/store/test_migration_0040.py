"""Migration 0040 on a database holding a delivery the previous release claimed, on both databases: every
row kept, its claims counted from 0, the fence of a claim made after the upgrade, a send of the previous
release's claim fenced out by it, and back down again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, inspect, select, text

from rackflow.domain.notifications import Event, EventType, Severity
from rackflow.notify.service import ChannelInput
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from rackflow.store.tables import notification_delivery
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.schedules_support import make_env
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
async def db_at_0039(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0039") as db:
        yield db


def _columns(conn: Connection) -> set[str]:
    return {column["name"] for column in inspect(conn).get_columns("notification_delivery")}


async def test_claims_count_from_zero_fence_the_next_claim_and_back_down(db_at_0039: Database) -> None:
    db = db_at_0039
    env = make_env(db)
    hook = ChannelInput(name="hook", kind="webhook", url="http://127.0.0.1:9/hook")
    channel = (await env.services.notifications.create(hook)).channel
    async with db.transaction() as conn:
        await outbox.record_events(conn, [Event(EventType.TASK_FAILED, Severity.WARNING, T0, "task failed")])
        await outbox.fan_out(db, conn, T0, 10)
        # The previous release's claim: one more attempt, the lease, nothing else.
        await conn.execute(text("UPDATE notification_delivery SET attempts = attempts + 1"))
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.read() as conn:
        assert (await conn.execute(select(notification_delivery.c.claims))).scalars().all() == [0]
    async with db.transaction() as conn:
        (claimed,) = await outbox.claim_deliveries(db, conn, channel.id, T0, 10, timedelta(0))
    assert (claimed.attempt, claimed.claim) == (2, 1)
    async with db.transaction() as conn:  # the previous release claims it again, while both serve
        await conn.execute(text("UPDATE notification_delivery SET attempts = attempts + 1"))
        assert await outbox.record_results(conn, [outbox.Result(claimed, delivered=True)], T0) == 0

    await downgrade(db, "0039")
    assert await current_revision(db) == "0039"
    async with db.engine.connect() as conn:
        assert "claims" not in await conn.run_sync(_columns)
    assert await table_counts(db) == before
