"""Migration 0044 on a database holding audit events, on both databases: every event kept, the trail by
target read back; on PostgreSQL the GIN index built on each partition of migration 0028 (the legacy and
DEFAULT ones, the weeks'), valid, taken by a week's partition made later; a run cut short (an invalid
partition index, one partition not indexed) finished by running it again; and back down again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Connection, text

from rackflow.domain.audit import OK, AuditEvent, EventFilter
from rackflow.store import audit as store
from rackflow.store import audit_partitions as partitions
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate
from tests.conftest import database_at, downgrade, table_counts, upgraded_counts
from tests.store.schema_diff import schema_diff

pytestmark = pytest.mark.asyncio

INDEX = "ix_audit_events_target_ids"
RACK = uuid.uuid4()


@pytest.fixture
async def db_at_0043(empty_db_url: str) -> AsyncIterator[Database]:
    async with database_at(empty_db_url, "0043") as db:
        yield db


def _event(at: datetime, *targets: uuid.UUID) -> AuditEvent:
    return AuditEvent(
        id=uuid.uuid4(),
        at=at,
        principal="oncall",
        method="DeleteRack",
        target_ids=tuple(str(t) for t in targets),
        outcome=OK,
        error="",
        request={},
    )


def _indexes(conn: Connection) -> dict[str, bool]:
    """Each partition's index attached to INDEX, and whether it is valid; INDEX's own under its name."""
    rows = conn.execute(
        text(
            """
            SELECT c.relname AS partition, i.indisvalid AS valid
            FROM pg_inherits p
            JOIN pg_index i ON i.indexrelid = p.inhrelid
            JOIN pg_class c ON c.oid = i.indrelid
            WHERE p.inhparent = to_regclass(:index)
            UNION ALL SELECT :index, indisvalid FROM pg_index WHERE indexrelid = to_regclass(:index)
            """
        ),
        {"index": INDEX},
    ).all()
    return {row.partition: row.valid for row in rows}


async def test_events_are_kept_and_found_by_target_and_back_down(db_at_0043: Database) -> None:
    db = db_at_0043
    now = datetime.now(UTC)
    events = [_event(now - timedelta(days=days), *([RACK] if days % 2 else [])) for days in (0, 1, 2, 3)]
    async with db.transaction() as conn:
        await store.insert_events(conn, events)
    before = await table_counts(db)

    assert await migrate(db) == head_revision()
    assert await schema_diff(db) == []
    assert await table_counts(db) == upgraded_counts(before)
    async with db.read() as conn:
        found, _ = await store.list_events(conn, EventFilter(target=RACK))
    assert [e.id for e in found] == [events[1].id, events[3].id]
    if db.is_postgres:
        async with db.engine.connect() as conn:
            made = await conn.run_sync(_indexes)
            names = {p.name for p in await conn.run_sync(partitions.partitions)}
        assert made == dict.fromkeys([INDEX, *names], True)

    await downgrade(db, "0043")
    assert await current_revision(db) == "0043"
    if db.is_postgres:
        async with db.engine.connect() as conn:
            assert await conn.run_sync(_indexes) == {}
    assert (await table_counts(db))["audit_events"] == len(events)


@pytest.mark.parametrize(
    "empty_db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_a_run_cut_short_is_finished_and_later_weeks_take_the_index(db_at_0043: Database) -> None:
    """As a killed migration leaves it: the partitioned index made, one partition's build left invalid,
    another not begun. Migrating again builds what is missing, and a week's partition made afterwards by
    the pruner has its index as it is attached."""
    db = db_at_0043
    async with db.engine.connect() as conn:
        names = sorted(p.name for p in await conn.run_sync(partitions.partitions))
    invalid, *_ = names
    async with db.engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        using = "USING gin (target_ids jsonb_path_ops)"
        await autocommit.exec_driver_sql(f"CREATE INDEX {INDEX} ON ONLY audit_events {using}")
        await autocommit.exec_driver_sql(f"CREATE INDEX {invalid}_target_ids_idx ON {invalid} {using}")
        await autocommit.exec_driver_sql(
            f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{invalid}_target_ids_idx'::regclass"
        )

    assert await migrate(db) == head_revision()
    async with db.transaction() as conn:
        made = await conn.run_sync(partitions.ensure_partitions, datetime.now(UTC) + timedelta(days=60))
        assert made
        indexes = await conn.run_sync(_indexes)
    assert indexes == dict.fromkeys([INDEX, *names, *made], True)
