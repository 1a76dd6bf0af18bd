"""What the tests of a migration that builds an index CONCURRENTLY on PostgreSQL share (0051, 0052, 0053):
whether the index is valid, and the invalid build a killed migration leaves, which migrating again must
drop and build anew (`rackflow.store.dialect.building_index_concurrently`)."""

from __future__ import annotations

from sqlalchemy import text

from rackflow.store.db import Database


async def index_valid(db: Database, index: str) -> bool | None:
    """Whether `index` is valid; None: there is none."""
    async with db.engine.connect() as conn:
        query = text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:index)")
        return (await conn.execute(query, {"index": index})).scalar()


async def leave_an_invalid_build(db: Database, index: str, table: str, column: str) -> None:
    """`index` as a killed CONCURRENTLY build leaves it: there, but invalid, and here of `column` alone (not
    what the migration builds, so the test can tell it was built anew)."""
    async with db.engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.exec_driver_sql(f"CREATE INDEX {index} ON {table} ({column})")
        await autocommit.exec_driver_sql(
            f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{index}'::regclass"
        )
