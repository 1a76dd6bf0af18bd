"""Schema migrations (Alembic), run programmatically by `rackflow db migrate` and `serve --migrate`."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection

from rackflow.errors import FailedPrecondition, Unavailable
from rackflow.retry import Retry, retrying
from rackflow.store.db import Database, connection_errors_as_unavailable
from rackflow.store.dialect import migrations_locked, waited_too_long_for_a_lock

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# A migration that gave up waiting for a table lock (PostgreSQL: `dialect.MIGRATION_LOCK_TIMEOUT`, or a
# deadlock) is tried again, from the first migration not yet committed, for up to 5 minutes: the tables it
# needs are busy with the fleet's work, which it must not hold up.
MIGRATION_RETRY = Retry(first_delay=0.5, max_delay=10.0, deadline=300.0)


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


@functools.cache
def scripts() -> ScriptDirectory:
    """The migration scripts, read once a process: reading every revision's file takes about 20 ms of CPU,
    which `migrate` paid three times a call (its check, Alembic's upgrade, its answer) and the tests'
    thousands of migrations with it."""
    return ScriptDirectory.from_config(_config())


def run_scripts(conn: Connection, revision: str, *, down: bool = False) -> None:
    """Alembic's `command.upgrade` to `revision` on `conn` (`down`: its `command.downgrade`, which tests take
    a database back down with), from `scripts()` where the command reads every file again. The steps are
    the ones Alembic's command asks its script directory for."""
    cfg = _config()
    cfg.attributes["connection"] = conn
    directory = scripts()

    def steps(current: Any, _context: MigrationContext) -> Any:
        if down:
            return directory._downgrade_revs(revision, current)
        return directory._upgrade_revs(revision, current)

    with EnvironmentContext(cfg, directory, fn=steps, destination_rev=revision):
        directory.run_env()


def head_revision() -> str:
    head = scripts().get_current_head()
    assert head is not None
    return head


def _refuse_unknown(current: str | None) -> None:
    """Refuse a database at a revision this release does not know: a newer release migrated it, and this
    one is run on it (the binaries rolled back after `db migrate`). Migrating cannot help (Alembic's own
    answer was a traceback, `Can't locate revision`), nor can `serve`'s usual advice to migrate."""
    if current is None:
        return
    try:
        known = scripts().get_revision(current) is not None
    except CommandError:  # an id no migration has (or a prefix of several)
        known = False
    if not known:
        raise FailedPrecondition(
            f"the database is at revision {current}, which this rackflow (whose newest is {head_revision()})"
            " does not know: a newer release migrated it. Run that release or a newer one; to go back to"
            " this one, restore the backup taken before the upgrade (there is no downgrade)"
        )


def _upgrade(conn: Connection, revision: str) -> None:
    with migrations_locked(conn):
        run_scripts(conn, revision)


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


async def migrate(db: Database, revision: str = "head") -> str:
    """Bring the schema to `revision` (the newest by default; an older one lets tests write rows as an
    older rackflow did, then upgrade them); returns it. Safe to run again and concurrently.

    On PostgreSQL each migration commits on its own (env.py), so the locks one takes are held for it alone,
    and a migration that waited too long for a lock is rolled back and tried again after a pause
    (MIGRATION_RETRY) while the fleet goes on; those before it stay applied. On SQLite the whole upgrade is
    one transaction."""

    # Read on a connection of its own: a read on the upgrade's would begin the transaction Alembic's env.py
    # begins itself, and on SQLite the upgrade was then never committed.
    _refuse_unknown(await current_revision(db))

    async def attempt() -> None:
        async with db.engine.connect() as conn:
            await conn.run_sync(_upgrade, revision)

    try:
        with connection_errors_as_unavailable():
            await retrying(
                attempt,
                MIGRATION_RETRY,
                what="a migration waiting for a table lock",
                retry_if=waited_too_long_for_a_lock,
            )
    except Unavailable as exc:
        if not waited_too_long_for_a_lock(exc.__cause__ or exc):
            raise
        raise Unavailable(
            f"a migration could not take the table locks it needs in {MIGRATION_RETRY.deadline:.0f} s of"
            f" tries ({exc.__cause__}): the instances' work holds them; run `rackflow db migrate` again when"
            " the fleet is quieter, or stop the instances first"
        ) from exc.__cause__
    return head_revision() if revision == "head" else revision


async def current_revision(db: Database) -> str | None:
    with connection_errors_as_unavailable():
        async with db.engine.connect() as conn:
            return await conn.run_sync(_current)


async def require_migrated(db: Database) -> None:
    """Refuse to serve on a database whose schema is not the one this code expects."""
    current, head = await current_revision(db), head_revision()
    _refuse_unknown(current)
    if current != head:
        state = "has no rackflow schema" if current is None else f"is at revision {current}"
        raise FailedPrecondition(
            f"the database {state}, this rackflow needs {head}: run `rackflow db migrate --db URL` "
            "(or `rackflow serve --migrate`)"
        )
