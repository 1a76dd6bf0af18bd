"""Shared set-up for the benchmarks: fresh databases, `rackflow serve` processes, bulk-loaded fleets.

Servers are real `rackflow serve` child processes, started with the end-to-end tests' helpers
(`tests/e2e/cluster.py`), so a benchmark measures exactly what an operator runs.

Bulk loading: one rack and one schedule are created through the real services (validation, target
resolution, the operation template); every other row is a clone of those rows with fresh ids and names,
inserted with executemany (SQLAlchemy Core). Creating 10,000 schedules over the API would itself take
tens of seconds (`bench/api.py` measures CreateTaskSchedule), and 1,000,000 would take hours.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # for tests.e2e

from sqlalchemy import Connection, Engine, create_engine, insert, select, text, update  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from rackflow.clock import SystemClock  # noqa: E402
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackTarget, TargetSpec  # noqa: E402
from rackflow.domain.schedules import OverlapPolicy  # noqa: E402
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions  # noqa: E402
from rackflow.services import Services  # noqa: E402
from rackflow.store.db import Database, normalise_url  # noqa: E402
from rackflow.store.tables import components as components_table  # noqa: E402
from rackflow.store.tables import (  # noqa: E402
    preflight_checks,
    racks,
    task_schedule,
    task_schedule_scope,
)
from rackflow.timespec import ScheduleSpec  # noqa: E402
from tests.checks_support import receiving  # noqa: E402
from tests.e2e.cluster import ServerProcess, fresh_postgres_database, servers, start_server  # noqa: E402
from tests.store.task_weeks import weeks_made_earlier  # noqa: E402

__all__ = [
    "DatabaseCpu",
    "ServerProcess",
    "Workspace",
    "add_db_arguments",
    "bulk_load",
    "code_line",
    "cpu_seconds",
    "fresh_database",
    "machine_line",
    "median",
    "percentile",
    "py_spy",
    "result",
    "rss_kib",
    "servers",
    "slot_run_id",
    "start_server",
    "stat_cpu_seconds",
    "sync_engine",
    "tasks_partitioned_since",
]

DEFAULT_POSTGRES_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
LOAD_CHUNK = 5_000


def slot_run_id(slot: str) -> str:
    """The SQL of a new run's id for the slot `slot` (SQL, a timestamptz), as rackflow names a dispatched
    run (`rackflow.domain.firing.run_id`): a UUIDv7 of the slot's unix millisecond, random bits after (a
    version 4 UUID with its first 48 bits replaced by the millisecond and its version nibble set to 7), so
    on PostgreSQL the id tells the partition the run is in, as the by-id statements expect."""
    ms = f"substring(int8send(floor(extract(epoch FROM {slot}) * 1000)::bigint) FROM 3)"
    return (
        f"encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING {ms} FROM 1 FOR 6), 52, 1),"
        " 53, 1), 'hex')::uuid"
    )


# SIGTERM unwinds like Ctrl-C, so a stopped benchmark still stops its servers and drops its database.
signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))


def runs_partitioned_since(engine: Engine, weeks: int) -> datetime | None:
    """A fresh database's runs as migration 0046 leaves them `weeks` weeks after it ran (PostgreSQL): the
    DEFAULT partition's bound moved back `weeks` weeks, and a partition for each of them, so the runs of
    slots since go to their weeks, as rackflow puts them, where the weeks the migration made start a month
    ahead. The DEFAULT partition must be empty (nothing checks it against the new bound). Returns the new
    bound; None on SQLite, or for 0 weeks."""
    from rackflow.store import run_partitions
    from rackflow.store.audit_partitions import PERIOD, bound_literal

    if not weeks or engine.dialect.name != "postgresql":
        return None
    with engine.begin() as conn:
        first = run_partitions.first_week(conn)
        bound = first - weeks * PERIOD
        default, before = run_partitions.DEFAULT_PARTITION, run_partitions.BEFORE
        conn.execute(text(f"ALTER TABLE {default} DROP CONSTRAINT {before}"))
        conn.execute(
            text(
                f"ALTER TABLE {default} ADD CONSTRAINT {before}"
                f" CHECK (scheduled_for IS NULL OR scheduled_for < {bound_literal(bound)})"
            )
        )
        for k in range(weeks):
            run_partitions.add_week(conn, bound + k * PERIOD)
    return bound


def tasks_partitioned_since(engine: Engine, weeks: int) -> datetime | None:
    """A fresh database's tasks as migration 0062 leaves them `weeks` weeks after it ran
    (`tests.store.task_weeks.weeks_made_earlier`). Returns the new bound; None on SQLite, where the tasks
    are not partitioned, or for 0 weeks."""
    if not weeks or engine.dialect.name != "postgresql":
        return None
    with engine.begin() as conn:
        return weeks_made_earlier(conn, weeks)


def add_db_arguments(
    parser: argparse.ArgumentParser, *, kinds: Sequence[str] = ("sqlite", "postgres")
) -> None:
    """`--db` (PostgreSQL by default) and `--pg-admin`, the server scratch databases are made on."""
    parser.add_argument("--db", choices=kinds, default="postgres")
    parser.add_argument(
        "--pg-admin",
        default=os.environ.get("RACKFLOW_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_ADMIN),
        help="PostgreSQL server to create scratch databases on (env RACKFLOW_BENCH_POSTGRES_URL).",
    )


@dataclass(frozen=True)
class Workspace:
    """A fresh, migrated database and a directory for server logs (and the SQLite file)."""

    url: str
    kind: str
    log_dir: Path


@contextmanager
def fresh_database(kind: str, pg_admin: str, revision: str = "head") -> Iterator[Workspace]:
    """A new database migrated to `revision` (`_migrate`); PostgreSQL's is dropped afterwards."""
    with tempfile.TemporaryDirectory(prefix="rackflow-bench-") as tmp:
        log_dir = Path(tmp)
        if kind == "sqlite":
            url = f"sqlite:///{log_dir / 'bench.db'}"
            _migrate(url, revision)
            yield Workspace(url, kind, log_dir)
            return
        with fresh_postgres_database(pg_admin) as url:
            _migrate(url, revision)
            yield Workspace(url, kind, log_dir)


def _migrate(url: str, revision: str = "head") -> None:
    """To the head with `rackflow db migrate`, as an operator does; to an older `revision` in-process
    (`store.migrate.migrate`: the command takes no revision), for a probe that starts from the schema
    before a migration."""
    if revision == "head":
        subprocess.run(
            [sys.executable, "-m", "rackflow", "db", "migrate", "--db", url], check=True, capture_output=True
        )
        return
    from rackflow.store.migrate import migrate

    async def upgrade() -> None:
        db = Database(url)
        try:
            await migrate(db, revision)
        finally:
            await db.dispose()

    asyncio.run(upgrade())


def sync_engine(url: str) -> Engine:
    """A synchronous engine on the same database (pysqlite or psycopg), for loading and measuring."""
    parsed = make_url(normalise_url(url))
    if parsed.get_backend_name() == "sqlite":
        parsed = parsed.set(drivername="sqlite")
    return create_engine(parsed)


# --- bulk loading ------------------------------------------------------------------------------------


# An NVL72 rack's trays and shelves, in the order a rack lists them; component k of a rack is the k-th
# (modulo 36).
NVL72_MIX = ["COMPUTE"] * 18 + ["NVSWITCH"] * 9 + ["POWERSHELF"] * 8 + ["TORSWITCH"]


@dataclass(frozen=True)
class _Template:
    rack: dict[str, Any]
    component: dict[str, Any]
    schedule: dict[str, Any]
    scope: dict[str, Any]


async def _create_template(url: str, name: str, spec: ScheduleSpec) -> tuple[uuid.UUID, uuid.UUID]:
    """One rack with one COMPUTE component and one power-on schedule on it, through the services."""
    db = Database(url)
    try:
        services = Services.build(db, SystemClock())
        rack = await services.inventory.create_rack(
            name,
            external_id=name,
            components=[ComponentSpec(ComponentType.COMPUTE, f"{name}-c0", f"{name}-c0")],
        )
        schedule = await services.schedules.create(
            name=name,
            spec=spec,
            overlap_policy=OverlapPolicy.SKIP,
            operation=Operation(OperationKind.POWER_ON),
            queue=QueueOptions(),
            description="",
            target=TargetSpec(racks=(RackTarget(id=rack.id),)),
        )
        return rack.id, schedule.id
    finally:
        await db.dispose()


def _read_template(engine: Engine, rack_id: uuid.UUID, schedule_id: uuid.UUID) -> _Template:
    with engine.connect() as conn:

        def one(stmt: Any) -> dict[str, Any]:
            return dict(conn.execute(stmt).one()._mapping)

        return _Template(
            rack=one(select(racks).where(racks.c.id == rack_id)),
            component=one(select(components_table).where(components_table.c.rack_id == rack_id)),
            schedule=one(select(task_schedule).where(task_schedule.c.id == schedule_id)),
            scope=one(select(task_schedule_scope).where(task_schedule_scope.c.schedule_id == schedule_id)),
        )


def bulk_load(
    url: str,
    count: int,
    *,
    spec: ScheduleSpec,
    next_run_at: Callable[[int], datetime | None],
    enabled: Callable[[int], bool] = lambda _: True,
    with_scopes: bool = True,
    prefix: str = "bench",
    start: int = 0,
    components: int = 1,
    powered_on: bool = False,
) -> None:
    """`count` single-scope schedules named `<prefix>-<i>` (i from `start`), each on a rack of its own with
    `components` components (NVL72_MIX's types; a scope of the whole rack, so each firing's task names
    them all), powered on already when `powered_on` (else in the state CreateRack leaves, unknown).

    `next_run_at(i)` and `enabled(i)` set each schedule's timing. Without scopes only schedule rows are
    written (enough for the due scan, and far faster for a million rows).
    """
    engine = sync_engine(url)
    try:
        rack_id, schedule_id = asyncio.run(_create_template(url, f"{prefix}-{start:07d}", spec))
        template = _read_template(engine, rack_id, schedule_id)
        if powered_on:
            template = replace(template, component={**template.component, "power_state": "on"})
        with engine.begin() as conn:  # the template becomes item `start`
            conn.execute(
                update(task_schedule)
                .where(task_schedule.c.id == schedule_id)
                .values(next_run_at=next_run_at(start), enabled=enabled(start))
            )
            more = _component_rows(template, rack_id, f"{prefix}-{start:07d}", range(1, components))
            if more:
                conn.execute(insert(components_table), more)
            if powered_on:
                conn.execute(
                    update(components_table)
                    .where(components_table.c.rack_id == rack_id)
                    .values(power_state="on")
                )
        for chunk_start in range(start + 1, start + count, LOAD_CHUNK):
            indexes = range(chunk_start, min(chunk_start + LOAD_CHUNK, start + count))
            _insert_clones(engine, template, indexes, prefix, next_run_at, enabled, with_scopes, components)
        if engine.dialect.name == "postgresql":
            # A fleet that grew over weeks has planner statistics (autovacuum keeps them); a table filled a
            # moment ago has none, and PostgreSQL then guesses that 200 ids out of 50,000 match a third of
            # the rows and scans them all, once per batch (docs/PERFORMANCE.md, "flat as work grows").
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()


def _insert_clones(
    engine: Engine,
    template: _Template,
    indexes: Sequence[int],
    prefix: str,
    next_run_at: Callable[[int], datetime | None],
    enabled: Callable[[int], bool],
    with_scopes: bool,
    components_per_rack: int,
) -> None:
    rack_rows: list[dict[str, Any]] = []
    component_rows: list[dict[str, Any]] = []
    schedule_rows: list[dict[str, Any]] = []
    scope_rows: list[dict[str, Any]] = []
    for i in indexes:
        name = f"{prefix}-{i:07d}"
        schedule_id = uuid.uuid4()
        schedule_rows.append(
            {
                **template.schedule,
                "id": schedule_id,
                "name": name,
                "next_run_at": next_run_at(i),
                "enabled": enabled(i),
            }
        )
        if with_scopes:
            rack_id = uuid.uuid4()
            rack_rows.append({**template.rack, "id": rack_id, "name": name, "external_id": name})
            component_rows.extend(_component_rows(template, rack_id, name, range(components_per_rack)))
            scope_rows.append(
                {**template.scope, "id": uuid.uuid4(), "schedule_id": schedule_id, "rack_id": rack_id}
            )
    with engine.begin() as conn:
        for table, rows in (
            (racks, rack_rows),
            (components_table, component_rows),
            (task_schedule, schedule_rows),
            (task_schedule_scope, scope_rows),
        ):
            if rows:
                conn.execute(insert(table), rows)


def _component_rows(
    template: _Template, rack_id: uuid.UUID, rack_name: str, numbers: Iterable[int]
) -> list[dict[str, Any]]:
    """Components `<rack>-c<k>` of a rack, for each k of `numbers`, typed as an NVL72 rack's k-th."""
    return [
        {
            **template.component,
            "id": uuid.uuid4(),
            "rack_id": rack_id,
            "type": NVL72_MIX[k % len(NVL72_MIX)],
            "name": f"{rack_name}-c{k}",
            "external_id": f"{rack_name}-c{k}",
        }
        for k in numbers
    ]


# --- measuring and reporting -------------------------------------------------------------------------


def timed(call: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    """Milliseconds of each of `repeat` calls (after one warm-up), and the last answer."""
    answer = call()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        answer = call()
        times.append((time.perf_counter() - started) * 1000)
    return times, answer


CHECK_KINDS = ("rack_idle", "webhook")


def add_check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--passing-checks",
        type=int,
        default=0,
        help="pre-flight checks over every rack and operation that always pass",
    )
    parser.add_argument(
        "--check-kind",
        choices=CHECK_KINDS,
        default="rack_idle",
        help="rack_idle (asked in the executor's claim) or webhook (a local HTTP server answering ok, "
        "asked by the checker)",
    )


@contextmanager
def passing_checks(engine: Engine, count: int, kind: str) -> Iterator[None]:
    """`count` pre-flight checks over every rack and operation that always pass, asked every 30 s (only a
    held task is asked again): `rack_idle` busy only with power resets (the benches run none), which the
    executor's claim asks itself; or `webhook`s to a real HTTP server on loopback in this process that
    answers `{"ok": true}` (tests/checks_support.py), which the checker asks, a round trip per task."""
    if count == 0:
        yield
        return
    with contextlib.ExitStack() as stack:
        settings: dict[str, object] = {"busy_operations": ["power_reset"], "failed_within": ""}
        if kind == "webhook":
            hook = stack.enter_context(receiving())
            settings = {"url": hook.url, "secret": "", "timeout": "10s"}
        now = datetime.now(UTC)
        rows = [
            {
                "id": uuid.uuid4(),
                "name": f"bench-check-{i}",
                "kind": kind,
                "operations": [],
                "all_racks": True,
                "rack_ids": [],
                "domain_ids": [],
                "settings": settings,
                "interval": "30s",
                "max_wait": "1h",
                "created_at": now,
                "updated_at": now,
            }
            for i in range(count)
        ]
        with engine.begin() as conn:
            conn.execute(insert(preflight_checks), rows)
        yield


def percentile(values: Sequence[float], pct: float) -> float:
    """The `pct` percentile (nearest rank), e.g. 99 for p99."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(pct / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's resident memory in KiB, from /proc/<pid>/status (VmRSS now, VmHWM its peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU the process has used, from /proc/<pid>/stat."""
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat").read_text())


def stat_cpu_seconds(stat: str) -> float:
    """User plus system CPU seconds in the text of a /proc/<pid>/stat."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The backends serving the measuring connection's database, other than the measuring one itself.
_DATABASE_BACKENDS = text(
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
)


class DatabaseCpu:
    """CPU used by the PostgreSQL backends of one database (the server's connections, and autovacuum's
    there) since the first `sample`, whatever else the machine's PostgreSQL does meanwhile: other
    sessions' databases share the server on a shared machine, so counting every `postgres` process would
    charge their work to the figure.

    Backends are listed at every `sample` (each is a /proc read per backend); one that ends between two
    samples is counted up to the last sample that saw it, so sample often (the drain's wait does, twice a
    second). A backend first seen after the first sample started during the measurement and counts in full.
    """

    def __init__(self) -> None:
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._started = False

    def sample(self, conn: Connection) -> None:
        for pid in conn.execute(_DATABASE_BACKENDS).scalars():
            try:
                seconds = cpu_seconds(pid)
            except OSError:  # the backend ended
                continue
            if pid not in self._first:
                self._first[pid] = seconds if not self._started else 0.0
            self._last[pid] = seconds
        self._started = True

    @property
    def seconds(self) -> float:
        return sum(seconds - self._first[pid] for pid, seconds in self._last.items())


def result(figure: str, **fields: object) -> None:
    """One result line: `figure key=value …`, floats rounded to two decimals."""
    parts = [figure]
    for key, value in fields.items():
        parts.append(f"{key}={round(value, 2)}" if isinstance(value, float) else f"{key}={value}")
    print(" ".join(parts), flush=True)


@contextmanager
def py_spy(pid: int, output: Path | None, *, rate: int = 100) -> Iterator[None]:
    """Sample process `pid` with py-spy while the block runs (nothing when `output` is None).

    `.svg` writes a flame graph; any other suffix the raw collapsed stacks, which grep and sort read.
    """
    if output is None:
        yield
        return
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    fmt = "flamegraph" if output.suffix == ".svg" else "raw"
    cmd = [binary, "record", "--pid", str(pid), "--rate", str(rate), "--format", fmt, "-o", str(output)]
    sampler = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        sampler.send_signal(signal.SIGINT)
        _, err = sampler.communicate(timeout=60)
        if sampler.returncode not in (0, -signal.SIGINT):
            print(f"# py-spy failed ({sampler.returncode}): {err.decode(errors='replace')[-500:]}")


def code_line() -> str:
    """`# code …`: which rackflow source the servers run (PYTHONPATH can point at another checkout)."""
    import rackflow

    source = Path(rackflow.__file__).resolve().parents[1]
    revision_file = source.parent / "REVISION"
    if revision_file.exists():
        revision = revision_file.read_text().strip()
    else:
        described = subprocess.run(
            ["git", "-C", str(source), "describe", "--always", "--dirty"], capture_output=True, text=True
        )
        revision = described.stdout.strip() or "unknown"
    return f"# code rackflow={source} revision={revision}"


def machine_line() -> str:
    """`# machine …`: what the figures were measured on, and how busy it was when they started."""
    mem_kib = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    load = os.getloadavg()[0]
    return (
        f"# machine nproc={os.cpu_count()} mem_gib={mem_kib / 2**20:.1f} python={platform.python_version()} "
        f"loadavg_1m={load:.2f} at={datetime.now(UTC).isoformat(timespec='seconds')}"
    )
