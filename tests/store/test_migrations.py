"""The migrations create exactly the tables of rackflow.store.tables, on both databases."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select, text

from rackflow.errors import FailedPrecondition
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, head_revision, migrate, require_migrated
from rackflow.store.tables import instances
from tests.store.schema_diff import schema_diff


async def test_migrated_schema_matches_tables(db: Database) -> None:
    assert await current_revision(db) == head_revision()
    await require_migrated(db)

    assert await schema_diff(db) == []


async def _set_revision(db: Database, revision: str) -> None:
    async with db.transaction() as conn:
        await conn.execute(text("UPDATE alembic_version SET version_num = :v"), {"v": revision})


@pytest.mark.parametrize("found", ["0099", "zzz"])
async def test_a_database_a_newer_release_migrated_is_refused_saying_so(db: Database, found: str) -> None:
    """The previous release started on a database the new one migrated (a rollback of the binaries):
    `serve` told the operator to run `rackflow db migrate`, and `db migrate` ended in an Alembic traceback
    (`Can't locate revision identified by '0099'`). Both now say what happened and what to do."""
    await _set_revision(db, found)
    try:
        for action in (require_migrated(db), migrate(db)):
            with pytest.raises(FailedPrecondition) as refused:
                await action
            assert str(refused.value) == (
                f"the database is at revision {found}, which this rackflow"
                f" (whose newest is {head_revision()}) does not know: a newer release migrated it. Run that"
                " release or a newer one; to go back to this one, restore the backup taken before the upgrade"
                " (there is no downgrade)"
            )
        assert await current_revision(db) == found  # nothing was changed
    finally:
        await _set_revision(db, head_revision())


async def test_utc_times_round_trip_exactly(db: Database) -> None:
    """SQLite drops offsets; the UTCDateTime type must hand back the same instant, aware, in UTC."""
    stamp = datetime(2026, 3, 8, 2, 30, 15, 123456, tzinfo=timezone(timedelta(hours=-5)))
    async with db.transaction() as conn:
        await conn.execute(
            insert(instances).values(id=uuid.uuid4(), host="h", pid=1, started_at=stamp, heartbeat_at=stamp)
        )
    async with db.read() as conn:
        got = (await conn.execute(select(instances.c.started_at))).scalar_one()
    assert got == stamp
    assert got.tzinfo == UTC
    assert got.microsecond == 123456
