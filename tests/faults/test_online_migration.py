"""Migrations applied online (docs/OPERATIONS.md, "Upgrades"; issue 29, target 2): `rackflow db migrate`
brings a loaded database from an older release's schema to head while that release's instance drains a
stream of due schedules, then the instance is replaced by the current release, as an operator upgrades.

The older release is the one whose head was `BASE`, run from its own source (`tests/faults/releases.py`):
`rackflow serve` refuses any schema but its own, so what runs during the migration is always the release
before it, never the current code. Every migration after `BASE` is one an operator applies under a running
fleet, so this test migrates all of them, to whatever head is.

The history (`load_history`) is cloned server-side from rows the older release wrote itself, so its columns
are that release's: tens of thousands of runs and tasks, so that the migrations that rewrite runs or index
tasks take a measurable time. The stream (`DRAIN` schedules, each due once at its own slot, spread over
`STREAM_S` seconds) is what the migration must not stop: a sampler counts the runs recorded while the
migration holds its advisory lock, and gives up waiting for a table lock after `SAMPLE_LOCK_TIMEOUT`, so
a migration that locks the runs out for its whole length is seen as such rather than waited for.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from rackflow.store.db import Database
from rackflow.store.migrate import head_revision
from rackflow.store.runs import run_tallies
from rackflow.store.schedules import Tally
from rackflow.store.tables import task_schedule_run
from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, sql, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request, wait_until
from tests.faults.releases import release_at
from tests.store.schema_diff import schema_diff

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

BASE = "0023"  # the last schema before issue 29's migrations (0024 on), all meant to be applied online
RACKS = 1_250
HISTORY_RUNS = 20_000  # 16 a rack's schedule, each with its task
DRAIN = RACKS  # schedules due once each, one on each rack, one every STREAM_S / DRAIN seconds (38 ms)
# Long enough for the whole chain of migrations to end inside the stream on a loaded machine: at 20 s, with
# the suite's other workers and a second suite beside it (load 7 on 2 cores), the migrations outlasted the
# stream without waiting for it, which this test cannot tell from a migration that waited; at 36 s, once
# 0051 and 0052 added three CONCURRENTLY steps (each waits for the transactions older than it), a fresh
# clone's suite with two more test workers beside it took the chain 40.9 s (10.3 s alone).
STREAM_S = 48
ARGS = ["--dispatch-interval", "1s", "--lease-ttl", "3s"]
ENDED = ("completed", "failed", "terminated")
SAMPLE_LOCK_TIMEOUT = "200ms"


class NotOnline(AssertionError):
    """What this test is for: the migration stopped the drain or needed it to stop, or the rows the
    previous release wrote while the upgrade lasted are not what the current release reads."""


def test_migrate_a_loaded_database_under_a_running_drain(pg_db_empty: str, tmp_path: Path) -> None:
    old_env = {"PYTHONPATH": str(release_at(BASE, tmp_path / "base"))}
    cli(pg_db_empty, env=old_env)
    assert sql(pg_db_empty, "SELECT version_num FROM alembic_version") == [(BASE,)]

    running = [start_server(pg_db_empty, tmp_path, args=ARGS, env=old_env, name="old")]
    try:
        template = write_template(running[0], pg_db_empty)
        loading = time.monotonic()
        load_history(pg_db_empty, template)
        loaded_s = time.monotonic() - loading
        stream_start = sql(pg_db_empty, "SELECT now() + interval '2 seconds'")[0][0]
        assert isinstance(stream_start, datetime)
        make_stream(pg_db_empty, template, stream_start)
        wait_until(lambda: drained(pg_db_empty) >= DRAIN // 10, 60, what="the stream to start")

        with Sampler(pg_db_empty) as sampler:
            migrated = cli(pg_db_empty)
        assert head_revision() in migrated.stdout

        new = start_server(pg_db_empty, tmp_path, args=ARGS, name="new")
        running.append(new)
        assert running.pop(0).stop() == 0
        # Every run written back (after its tasks were submitted), then every task ended: a run counts as
        # drained once fired, before its tasks exist, so "drained and no task live" could hold for a moment
        # before the last firing's tasks were submitted.
        wait_until(
            lambda: written_back(pg_db_empty) == DRAIN and not live_tasks(pg_db_empty), 120, what="the stream"
        )
    finally:
        for server in running:
            server.stop()

    # Each stream schedule g was due once, at start + g * step: one run at that slot, completed, and every
    # task ended.
    runs = sql(
        pg_db_empty,
        "SELECT %s::timestamptz + substr(s.name, 8)::int * %s * interval '1 second', r.scheduled_for, r.state"
        " FROM task_schedule s LEFT JOIN task_schedule_run r ON r.schedule_id = s.id"
        " WHERE left(s.name, 7) = 'stream-'",
        stream_start,
        STREAM_S / DRAIN,
    )
    assert len(runs) == DRAIN, "a slot fired twice"
    assert [(due, state) for due, slot, state in runs if slot != due or state != "completed"] == []
    assert live_tasks(pg_db_empty) == 0
    assert sql(pg_db_empty, "SELECT version_num FROM alembic_version") == [(head_revision(),)]
    assert asyncio.run(diff(pg_db_empty)) == []

    during = sampler.during_migration()
    assert during and during[0] < DRAIN, "the stream ended before the migration began: lengthen it"
    retries = migrated.stderr.count("waiting for a table lock failed")
    print(
        f"\nload {loaded_s:.1f} s; migration {sampler.migration_s():.1f} s ({retries} retries),"
        f" the stream's runs meanwhile {during[0]} to {during[-1]} of {DRAIN}, {sampler.blocked} samples"
        f" blocked, longest stall {sampler.longest_stall_s():.1f} s"
    )
    if during[-1] == DRAIN:
        raise NotOnline(
            f"the migration ended only after the stream did ({retries} retries): it waited for it"
        )
    if len(set(during)) < 2:
        raise NotOnline("no run was recorded while the migration ran: the drain stopped")
    # Migration 0024's column, which the previous release does not write: the runs it wrote meanwhile are
    # counted from their outcomes when read (`run_tallies`, which the runs grid and a run's summary read).
    ((uncounted,),) = sql(
        pg_db_empty,
        "SELECT count(*) FROM task_schedule_run WHERE outcome_counts = '{}' AND outcomes <> '[]'",
    )
    print(f"runs written without outcome_counts: {uncounted}")
    counted, read = asyncio.run(tallies(pg_db_empty))
    if read != counted:
        wrong = sum(1 for run_id, tally in counted.items() if read.get(run_id) != tally)
        raise NotOnline(f"{wrong} runs are summarised otherwise than counting their outcomes finds")


def cli(url: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`rackflow db migrate` in a process of its own, as the operator runs it (of the release `env` names)."""
    done = subprocess.run(
        [sys.executable, "-m", "rackflow", "db", "migrate", "--db", url],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, f"rackflow db migrate failed:\n{done.stdout}{done.stderr}"
    return done


async def tallies(url: str) -> tuple[dict[uuid.UUID, Tally], dict[uuid.UUID, Tally]]:
    """Every run's `Tally` counted from its outcomes here, and as the current release reads it."""
    counted: dict[uuid.UUID, Tally] = {}
    for run_id, outcome, has_task, racks in sql(
        url,
        "SELECT r.id, o->>'outcome', o->>'task_id' IS NOT NULL, count(*)"
        " FROM task_schedule_run r, jsonb_array_elements(r.outcomes) o GROUP BY 1, 2, 3",
    ):
        assert isinstance(run_id, uuid.UUID) and isinstance(racks, int)
        counted.setdefault(run_id, {})[(str(outcome), bool(has_task))] = racks
    db = Database(url)
    try:
        async with db.read() as conn:
            run_ids = list((await conn.execute(select(task_schedule_run.c.id))).scalars())
            read = await run_tallies(conn, run_ids)
    finally:
        await db.dispose()
    return {run_id: counted.get(run_id, {}) for run_id in run_ids}, read


async def diff(url: str) -> list[object]:
    db = Database(url)
    try:
        return await schema_diff(db)
    finally:
        await db.dispose()


STREAM_RUNS = (
    "SELECT count(*) FROM task_schedule_run r JOIN task_schedule s ON s.id = r.schedule_id"
    " WHERE left(s.name, 7) = 'stream-'"
)


def drained(url: str) -> int:
    """How many of the stream's schedules have fired."""
    return int(sql(url, STREAM_RUNS)[0][0])  # type: ignore[call-overload]


def written_back(url: str) -> int:
    """How many of the stream's runs are written back (completed): their tasks were submitted."""
    return int(sql(url, STREAM_RUNS + " AND r.state = 'completed'")[0][0])  # type: ignore[call-overload]


def drained_on(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    row = conn.execute(STREAM_RUNS).fetchone()
    assert row is not None
    return int(row[0])  # type: ignore[call-overload]


def live_tasks(url: str) -> int:
    rows = sql(url, "SELECT count(*) FROM tasks WHERE status <> ALL(%s)", list(ENDED))
    return int(rows[0][0])  # type: ignore[call-overload]


@dataclass
class Template:
    """Rows the older release wrote through its own API, which the load copies."""

    rack: object
    component: object
    schedule: object
    scope: object
    run: object
    task: object


def write_template(server: ServerProcess, url: str) -> Template:
    """A rack with one component, a schedule on it (every hour), one manual firing of it run to its end."""
    stub = server.stub()
    create_racks(stub, ["tpl"])
    (schedule,) = create_schedules(
        stub, [schedule_request("tpl", ["tpl"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h")]
    )
    stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id), timeout=10)
    wait_until(lambda: live_tasks(url) == 0 and bool(sql(url, "SELECT 1 FROM tasks")), 30, what="the task")
    wait_until(
        lambda: sql(url, "SELECT state FROM task_schedule_run") == [("completed",)], 30, what="the run"
    )
    ((rack, component, sched, scope, run, task),) = sql(
        url,
        "SELECT c.rack_id, c.id, s.id, sc.id, r.id, t.id FROM components c, task_schedule s"
        " JOIN task_schedule_scope sc ON sc.schedule_id = s.id"
        " JOIN task_schedule_run r ON r.schedule_id = s.id JOIN tasks t ON t.run_id = r.id",
    )
    return Template(rack, component, sched, scope, run, task)


def uid(kind: str, n: str) -> str:
    """Row `n`'s id of `kind`, md5-derived, so rows link to each other without a join; a version 4 id, as
    the older release made them (a time-ordered id's version and variant tell a time, which migration
    0062's CHECK reads)."""
    return f"overlay(overlay(md5('{kind}' || ({n})::text) placing '4' from 13) placing '8' from 17)::uuid"


def clone(
    conn: psycopg.Connection[tuple[object, ...]], table: str, template: object, count: int, **overrides: str
) -> None:
    """INSERT `count` copies of `table`'s row `template` (one per `g` of 0..count-1), each with `overrides`
    (column -> SQL over g and the template row t). Columns are read from the database, so every column of
    the older release's schema is copied."""
    columns = [
        str(name)
        for (name,) in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema()"
            " AND table_name = %s ORDER BY ordinal_position",
            (table,),
        )
    ]
    values = [overrides.get(c, f"t.{c}") for c in columns]
    conn.execute(
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {', '.join(values)}"  # type: ignore[arg-type]
        f" FROM {table} t, generate_series(0, {count - 1}) g WHERE t.id = %s",
        (template,),
    )


def connect(url: str, autocommit: bool = False) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(
        make_url(url).set(drivername="postgresql").render_as_string(False), autocommit=autocommit
    )


def load_history(url: str, tpl: Template) -> None:
    """RACKS racks (one component each), a schedule on each (not due during the test), and HISTORY_RUNS
    completed runs of them over the past year, each with one outcome and its task, completed; then VACUUM
    ANALYZE, as a database in service would have its statistics."""
    per_rack = HISTORY_RUNS // RACKS
    fired = (
        f"(now() - interval '365 days' + (g / {RACKS}) * interval '{365 // per_rack} days'"
        f" + mod(g, {RACKS}) * interval '1 second')"
    )
    rack, schedule = uid("rack", f"mod(g, {RACKS})"), uid("history", f"mod(g, {RACKS})")
    outcome = (
        f"jsonb_build_object('scope_id', {uid('scope', f'mod(g, {RACKS})')}::text, 'rack_id', {rack}::text,"
        f" 'task_id', {uid('task', 'g')}::text)"
    )
    with connect(url) as conn:
        clone(conn, "racks", tpl.rack, RACKS, id=uid("rack", "g"), name="'r' || g", external_id="'r' || g")
        clone(
            conn,
            "components",
            tpl.component,
            RACKS,
            id=uid("comp", "g"),
            rack_id=uid("rack", "g"),
            name="'r' || g || '-c0'",
            external_id="'r' || g || '-c0'",
        )
        clone(
            conn,
            "task_schedule",
            tpl.schedule,
            RACKS,
            id=uid("history", "g"),
            name="'history-' || g",
            next_run_at="now() + interval '2 days'",
        )
        scopes(conn, tpl, "history", "scope")
        clone(
            conn,
            "task_schedule_run",
            tpl.run,
            HISTORY_RUNS,
            id=uid("run", "g"),
            schedule_id=schedule,
            fired_at=fired,
            scheduled_for=fired,
            trigger="'dispatch'",
            outcomes=f"jsonb_build_array(t.outcomes->0 || {outcome})",
        )
        clone(
            conn,
            "tasks",
            tpl.task,
            HISTORY_RUNS,
            id=uid("task", "g"),
            rack_id=rack,
            component_ids=f"jsonb_build_array({uid('comp', f'mod(g, {RACKS})')}::text)",
            schedule_id=schedule,
            run_id=uid("run", "g"),
            created_at=fired,
            started_at=fired,
            finished_at=f"{fired} + interval '30 seconds'",
            updated_at=f"{fired} + interval '30 seconds'",
        )
    with connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def make_stream(url: str, tpl: Template, start: datetime) -> None:
    """DRAIN schedules (every hour, as the template), one on each rack, the first due at `start` and one
    more every STREAM_S / DRAIN seconds: each is due exactly once during the test, at its own slot."""
    with connect(url) as conn:
        clone(
            conn,
            "task_schedule",
            tpl.schedule,
            DRAIN,
            id=uid("stream", "g"),
            name="'stream-' || g",
            next_run_at=f"'{start.isoformat()}'::timestamptz + g * interval '{STREAM_S / DRAIN} seconds'",
        )
        scopes(conn, tpl, "stream", "stream-scope")


def scopes(conn: psycopg.Connection[tuple[object, ...]], tpl: Template, schedules: str, kind: str) -> None:
    """One scope for each schedule g of `schedules`, on rack g, as the template's."""
    clone(
        conn,
        "task_schedule_scope",
        tpl.scope,
        RACKS,
        id=uid(kind, "g"),
        schedule_id=uid(schedules, "g"),
        rack_id=uid("rack", "g"),
        last_task_id="NULL",
    )


@dataclass
class Sampler:
    """Every 50 ms, whether `rackflow db migrate` holds its advisory lock (so is migrating) and how many
    runs the stream has recorded; a count that waits on a table lock for SAMPLE_LOCK_TIMEOUT is recorded
    as blocked (None) rather than waited for."""

    url: str
    samples: list[tuple[float, bool, int | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, name="sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(10)

    def _loop(self) -> None:
        with connect(self.url, autocommit=True) as conn:
            conn.execute(f"SET lock_timeout = '{SAMPLE_LOCK_TIMEOUT}'")  # type: ignore[arg-type]
            while not self._stop.is_set():
                (migrating,) = conn.execute(
                    "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
                ).fetchone() or (False,)
                try:
                    count: int | None = drained_on(conn)
                except psycopg.errors.LockNotAvailable:
                    count = None
                self.samples.append((time.monotonic(), bool(migrating), count))
                self._stop.wait(0.05)

    def during_migration(self) -> list[int]:
        """The counts sampled while the migration ran (blocked ones left out), in order."""
        return [c for _, migrating, c in self.samples if migrating and c is not None]

    @property
    def blocked(self) -> int:
        return sum(1 for _, migrating, c in self.samples if migrating and c is None)

    def migration_s(self) -> float:
        times = [t for t, migrating, _ in self.samples if migrating]
        return times[-1] - times[0] if times else 0.0

    def longest_stall_s(self) -> float:
        """The longest time, while the migration ran, in which no sample saw the count grow."""
        times = [t for t, migrating, _ in self.samples if migrating]
        grew = [
            t
            for (_, _, before), (t, migrating, count) in itertools.pairwise(self.samples)
            if migrating and count is not None and before is not None and count > before
        ]
        edges = [*times[:1], *grew, *times[-1:]]
        return max((b - a for a, b in itertools.pairwise(edges)), default=0.0)


@pytest.fixture
def pg_db_empty(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL database of its own with no schema (the older release migrates it)."""
    from tests.conftest import postgres_admin_url
    from tests.e2e.cluster import fresh_postgres_database

    with fresh_postgres_database(postgres_admin_url()) as url:
        yield url
