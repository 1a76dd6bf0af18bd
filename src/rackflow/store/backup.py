"""`rackflow db backup`: a consistent copy of a live database, taken while rackflow serves.

SQLite: SQLite's online backup API (`sqlite3.Connection.backup`) copies the database page by page from
one read transaction, so the copy is one committed state even while instances write (a plain `cp` of a WAL
database can catch a half-checkpointed file). PostgreSQL: `pg_dump --format=custom`, which reads one
snapshot; restore it with `pg_restore` into an empty database (docs/OPERATIONS.md, "Backups").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from rackflow.errors import FailedPrecondition, InvalidArgument
from rackflow.store.db import normalise_url


def _copy_sqlite(source: str, path: Path) -> None:
    """The online backup of `source` into the new file `path`. What SQLite refuses (a directory that does
    not exist, a file that is no database) is said in a line naming the file, not a traceback, and no part
    of a copy is left at `path`, which the next try would refuse as existing."""
    try:
        copy = sqlite3.connect(path)
    except sqlite3.Error as exc:
        raise FailedPrecondition(f"backup: cannot write {path}: {exc}") from None
    try:
        with contextlib.closing(sqlite3.connect(source)) as live, contextlib.closing(copy):
            live.backup(copy)
    except sqlite3.Error as exc:
        path.unlink(missing_ok=True)
        raise FailedPrecondition(f"backup: cannot copy {source}: {exc}") from None


def backup(url: str, path: Path) -> str:
    """Copy the database of `url` to `path` (which must not exist yet); returns what was done, for the CLI."""
    if path.exists():
        raise InvalidArgument(f"backup: {path} exists; give a new file")
    parsed = make_url(normalise_url(url))
    if parsed.get_backend_name() == "sqlite":
        source = parsed.database
        if not source or source == ":memory:" or not Path(source).exists():
            raise InvalidArgument(f"backup: no SQLite database at {source!r}")
        _copy_sqlite(source, path)
        return f"SQLite online backup of {source} written to {path}"
    pg_dump = shutil.which("pg_dump")
    if pg_dump is None:
        raise FailedPrecondition("backup: pg_dump not found; install the PostgreSQL client tools")
    # The password goes to pg_dump in its environment (libpq's PGPASSWORD), not in its arguments, which
    # `ps` shows to every user of the host for as long as the dump runs.
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    libpq_url = URL.create(
        "postgresql",
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query=parsed.query,
    ).render_as_string(hide_password=False)
    done = subprocess.run(
        [pg_dump, "--format=custom", "--file", str(path), "--dbname", libpq_url],
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        path.unlink(missing_ok=True)
        raise FailedPrecondition(f"backup: pg_dump failed: {done.stderr.strip()}")
    return f"pg_dump (custom format) written to {path}; restore with pg_restore into an empty database"
