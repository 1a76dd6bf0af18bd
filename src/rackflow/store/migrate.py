"""Schema migrations (Alembic), run programmatically by `rackflow db migrate` and `serve --migrate`."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from rackflow.errors import FailedPrecondition
from rackflow.store.db import Database, connection_errors_as_unavailable
from rackflow.store.dialect import lock_migrations

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def _upgrade(conn: Connection, revision: str) -> None:
    cfg = _config()
    cfg.attributes["connection"] = conn
    lock_migrations(conn)
    command.upgrade(cfg, revision)


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


async def migrate(db: Database, revision: str = "head") -> str:
    """Bring the schema to `revision` (the newest by default; an older one lets tests write rows as an
    older rackflow did, then upgrade them); returns it. Safe to run again and concurrently."""
    with connection_errors_as_unavailable():
        async with db.engine.begin() as conn:
            await conn.run_sync(_upgrade, revision)
    return head_revision() if revision == "head" else revision


async def current_revision(db: Database) -> str | None:
    with connection_errors_as_unavailable():
        async with db.engine.connect() as conn:
            return await conn.run_sync(_current)


async def require_migrated(db: Database) -> None:
    """Refuse to serve on a database whose schema is not the one this code expects."""
    current, head = await current_revision(db), head_revision()
    if current != head:
        state = "has no rackflow schema" if current is None else f"is at revision {current}"
        raise FailedPrecondition(
            f"the database {state}, this rackflow needs {head}: run `rackflow db migrate --db URL` "
            "(or `rackflow serve --migrate`)"
        )
