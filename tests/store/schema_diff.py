"""The difference between a migrated database's schema and `rackflow.store.tables` (the migration tests)."""

from __future__ import annotations

import warnings
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, text

from rackflow.store.db import Database
from rackflow.store.run_partitions import LIVE
from rackflow.store.tables import metadata


async def schema_diff(db: Database) -> list[object]:
    """What alembic would change to make the database's schema `metadata`'s: [] when they match. An index
    or foreign key declared for the other database only (`ddl_if`) is left out: the migrations do not
    create it here. The partitions of the audit trail and of the runs (PostgreSQL) are not metadata either,
    nor is the runs' table of live runs kept by their trigger (`store.run_partitions`)."""

    def for_this_database(obj: Any, name: Any, type_: str, _reflected: bool, _compare_to: Any) -> bool:
        if type_ == "table" and name in partitions:
            return False
        only = getattr(obj, "_ddl_if", None) if type_ in ("index", "foreign_key_constraint") else None
        return only is None or only.dialect in (None, db.dialect)

    # The audit trail's and the runs' partitions, and the runs' live table, on PostgreSQL: not metadata.
    partitions: set[str] = set()

    def diff(conn: Connection) -> list[object]:
        if db.is_postgres:
            query = text("SELECT relname FROM pg_class WHERE relispartition")
            partitions.update(conn.execute(query).scalars())
            partitions.add(LIVE)
        context = MigrationContext.configure(conn, opts={"include_object": for_this_database})
        with warnings.catch_warnings():
            # An expression index (PostgreSQL's alone, `ddl_if`, which `for_this_database` leaves out on
            # SQLite): alembic warns that SQLite cannot reflect one before it asks whether to compare it.
            warnings.filterwarnings(
                "ignore", "autogenerate skipping metadata-specified expression-based index"
            )
            found: list[object] = compare_metadata(context, metadata)
        if db.is_postgres:
            found += storage_diff(conn)
        return found

    async with db.engine.connect() as conn:
        return await conn.run_sync(diff)


def storage_diff(conn: Connection) -> list[object]:
    """Each table whose PostgreSQL storage parameters (`postgresql_with`, e.g. the history's fillfactor)
    differ from `metadata`'s, which alembic does not compare: ("storage", table, declared, found)."""
    query = text(
        "SELECT relname, reloptions FROM pg_class"
        " WHERE relkind IN ('r', 'p') AND relnamespace = current_schema()::regnamespace"
    )
    found = {
        name: dict(option.split("=", 1) for option in options or []) for name, options in conn.execute(query)
    }
    differing: list[object] = []
    for table in metadata.sorted_tables:
        declared = {
            key: str(value) for key, value in (table.dialect_options["postgresql"]["with"] or {}).items()
        }
        if found.get(table.name, {}) != declared:
            differing.append(("storage", table.name, declared, found.get(table.name, {})))
    return differing
