"""`rackflow db backup` on SQLite (store/backup.py): what it refuses, in its own words, leaving nothing
behind. The copy itself, while a server writes, is tests/faults/test_backup_restore.py's."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rackflow.errors import RackflowError
from rackflow.store import backup as backup_module
from rackflow.store.backup import backup


def _live_database(path: Path) -> None:
    with sqlite3.connect(path) as live:
        live.execute("CREATE TABLE t (x)")
        live.execute("INSERT INTO t VALUES (1)")


def test_a_copy_into_a_missing_directory_is_refused_naming_it(tmp_path: Path) -> None:
    """Was a traceback: `sqlite3.OperationalError: unable to open database file`."""
    _live_database(tmp_path / "live.db")
    target = tmp_path / "no-such-dir" / "copy.db"
    with pytest.raises(RackflowError, match=r"backup: cannot write .*no-such-dir/copy\.db: unable to open"):
        backup(f"sqlite:///{tmp_path / 'live.db'}", target)
    assert not target.parent.exists()


def test_a_file_that_is_no_sqlite_database_is_refused_and_no_copy_is_left(tmp_path: Path) -> None:
    """Was a traceback (`sqlite3.DatabaseError: file is not a database`) and a copy file left behind, which
    the next try then refused as existing."""
    (tmp_path / "notes.db").write_text("not a database, but an operator's notes\n" * 100)
    target = tmp_path / "copy.db"
    with pytest.raises(RackflowError, match=r"backup: cannot copy .*notes\.db: file is not a database"):
        backup(f"sqlite:///{tmp_path / 'notes.db'}", target)
    assert not target.exists()


def test_a_live_database_is_copied(tmp_path: Path) -> None:
    _live_database(tmp_path / "live.db")
    said = backup(f"sqlite:///{tmp_path / 'live.db'}", tmp_path / "copy.db")
    assert said == f"SQLite online backup of {tmp_path / 'live.db'} written to {tmp_path / 'copy.db'}"
    with sqlite3.connect(tmp_path / "copy.db") as copy:
        assert copy.execute("SELECT x FROM t").fetchall() == [(1,)]


def test_pg_dump_is_given_the_password_in_its_environment_not_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The URL was passed whole in pg_dump's arguments, so a password kept out of `ps` by giving the URL in
    RACKFLOW_DB showed in `ps` for as long as the dump ran."""
    ran: list[tuple[list[str], dict[str, str]]] = []

    def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append((args, kwargs.get("env") or {}))
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(backup_module.shutil, "which", lambda _name: "/usr/bin/pg_dump")
    monkeypatch.setattr(backup_module.subprocess, "run", run)
    backup("postgresql://rackflow:s3cr%40t@db.internal:5432/rackflow?sslmode=require", tmp_path / "r.dump")
    ((args, env),) = ran
    assert not any("s3cr" in arg for arg in args), args
    assert env["PGPASSWORD"] == "s3cr@t"
    assert "postgresql://rackflow@db.internal:5432/rackflow?sslmode=require" in args
