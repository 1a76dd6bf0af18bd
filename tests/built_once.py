"""What one test run builds once for all its xdist workers: PostgreSQL databases that tests only read.

A session-scoped fixture is built by every xdist worker, and a module-scoped one by every worker that runs
one of the module's tests. Under `--dist loadgroup`, which spread a module's tests over every worker, the
plan tests' fleets (20,000 tasks, thousands of racks or schedules, then ANALYZE) were built up to three
times a run: 111 worker-seconds of `test_task_indexes.py`'s fixtures alone on a machine that ran the suite
in 17 minutes (docs/PERFORMANCE.md, "The suite at the fortieth stop"). `make test` now keeps each module on
one worker (`--dist loadfile`); what is built here is still built once a run whatever the distribution:
the migrated template every worker copies, and the fleets. `built_once` builds each in a database named
after the run and the fixture, under a file lock, and gives the other workers what the build returned; the
controller drops the run's databases as it ends (`drop_the_runs_databases`).

The run's name is made by the controller before it starts its workers, which inherit it (`RUN`).
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psycopg
from sqlalchemy.engine import make_url

T = TypeVar("T")

RUN = "RACKFLOW_TEST_RUN"
PREFIX = "rackflow_run_"


def name_the_run() -> None:
    """In the controller (or a run without workers), before any worker starts: one name for the run."""
    os.environ.setdefault(RUN, uuid.uuid4().hex[:10])


def _directory() -> Path:
    """Where the run's workers leave their locks and what each build returned."""
    return Path(tempfile.gettempdir()) / f"rackflow-test-run-{os.environ[RUN]}"


def _database(key: str) -> str:
    """The name of the run's database for `key` (`%`: a LIKE pattern of them all)."""
    return f"{PREFIX}{os.environ[RUN]}_{key}"


def _admin(admin_url: str) -> str:
    return make_url(admin_url).set(drivername="postgresql").render_as_string(False)


def built_once(admin_url: str, template: str | None, key: str, build: Callable[[str], T]) -> T:
    """What `build` returned for a copy of the database `template` (None: a new, empty database), made and
    built by the first worker of the run to ask for `key`, which the others wait for. `build` writes the
    database at the URL it is given; the tests then only read it, from every worker at once. A build that
    failed leaves no answer, and the next worker to ask builds it again in a new copy."""
    directory = _directory()
    directory.mkdir(exist_ok=True)
    with open(directory / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        answer = directory / f"{key}.pickle"
        if answer.exists():
            value: T = pickle.loads(answer.read_bytes())
            return value
        name = _database(key)
        with psycopg.connect(_admin(admin_url), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        value = build(make_url(admin_url).set(database=name).render_as_string(hide_password=False))
        answer.write_bytes(pickle.dumps(value))
        return value


def drop_the_runs_databases(admin_url: str) -> None:
    """In the controller, once its workers have ended: drop every database `built_once` made for this run.
    Nothing to do, and no connection made, when the run built none."""
    if RUN not in os.environ or not (directory := _directory()).exists():
        return
    pattern = _database("%")
    try:
        with psycopg.connect(_admin(admin_url), autocommit=True, connect_timeout=5) as conn:
            names = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", [pattern]
            ).fetchall()
            for (name,) in names:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.OperationalError as exc:  # the server gone by the end: say what is left behind
        warnings.warn(f"this run's databases ({pattern}) were not dropped: {exc}", stacklevel=1)
    shutil.rmtree(directory)
