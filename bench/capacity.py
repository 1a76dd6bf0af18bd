"""capacity: what one firing, one task and one API read cost PostgreSQL — the inputs of docs/CAPACITY.md.

Measured from outside on a fresh database with one `rackflow serve`, per unit of work:

* firing: N single-scope schedules due at once, drained with the executor idle (`--sim-step 3600`: it
  starts 32 tasks that never finish, so the tasks' own work stays out); they fall due `--lead` seconds after
  the load, once the server is up and the first snapshot taken;
* task: the same N tasks then run to completion by a server whose simulator takes 0.01 s a step (the
  executor's claims, status changes, and the write-back of each run's outcome), measured from before that
  server starts (the database) and from the moment it listens (its own CPU);
* read: GetTaskSchedule by id, and ListTasks' first page of 50, `--reads` times each, one client.

For each: transactions (`pg_stat_database.xact_commit`), rows inserted, updated, deleted and returned
(`tup_*`), WAL bytes (its records and their commits, read with `pg_walinspect` between the positions flushed
before and after, so the server must keep the WAL of a run: a `max_wal_size` above it), CPU seconds of the
database's backends (utime + stime from /proc of every `postgres: … <db> …` process) and of the rackflow
server process, and the statements sent: where the server preloads `pg_stat_statements`, their calls in the
same pass; elsewhere with `--statements`, a second pass with `log_min_duration_statement = 0` on that
database only, counting its entries in the PostgreSQL log (`RACKFLOW_BENCH_POSTGRES_LOG`; logging costs CPU,
so that pass's CPU figures are not used).

    python bench/capacity.py --pg-admin postgresql://postgres@127.0.0.1:5433/postgres --n 3000 --reads 300
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import (
    ServerProcess,
    bulk_load,
    code_line,
    fresh_database,
    machine_line,
    result,
    start_server,
    sync_engine,
)
from _pg_io import statement_counters, wal_position
from dispatch_drain import RUNNING_RUN, first_due
from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url

from rackflow.store.tables import task_schedule, tasks
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.v1 import flow_pb2 as pb

DEFAULT_ADMIN = os.environ.get("RACKFLOW_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
POSTGRES_LOG = Path(
    os.environ.get("RACKFLOW_BENCH_POSTGRES_LOG", "/var/log/postgresql/postgresql-15-main.log")
)
TICKS = os.sysconf("SC_CLK_TCK")
COUNTERS = text(
    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_returned, tup_fetched "
    "FROM pg_stat_database WHERE datname = current_database()"
)
COUNTER_NAMES = (
    "xact_commit",
    "xact_rollback",
    "tup_inserted",
    "tup_updated",
    "tup_deleted",
    "tup_returned",
    "tup_fetched",
)


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def backend_pids(database: str) -> list[int]:
    """The PostgreSQL backends connected to `database` (their process titles name it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if title.startswith("postgres:") and f" {database} " in title:
            found.append(int(entry.name))
    return found


# The WAL written between two flushed positions for this database (`pg_walinspect`, PostgreSQL 15's
# contrib): the records of its relations, with the other records (commits) of their transactions. The
# server's WAL position is shared by every database on it (other benchmarks and tests run beside this one),
# so only these records are counted. Full-page images are in a record's length.
DATABASE_WAL = text(
    "WITH records AS (SELECT xid, record_length, "
    "coalesce((regexp_match(block_ref, 'rel \\d+/(\\d+)/'))[1]::oid, 0) AS database "
    "FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn))), "
    "ours AS (SELECT DISTINCT xid FROM records WHERE database = :oid AND xid <> 0) "
    "SELECT coalesce(sum(record_length), 0) FROM records "
    "WHERE database = :oid OR xid IN (SELECT xid FROM ours)"
)


def wal_bytes(engine: Engine, oid: int, start: str, end: str) -> int:
    if start == end:  # nothing flushed since (pg_walinspect refuses a start at the flushed end)
        return 0
    with engine.connect() as conn:
        return int(conn.execute(DATABASE_WAL, {"start": start, "end": end, "oid": oid}).scalar_one())


@dataclass
class Snapshot:
    counters: dict[str, int]
    wal: str  # the WAL flushed (`_pg_io.wal_position`)
    backend_cpu: dict[int, float]
    server_cpu: float
    log_offset: int
    calls: int | None  # every statement's calls in the database, where pg_stat_statements is preloaded


def snapshot(engine: Engine, database: str, server_pid: int | None) -> Snapshot:
    with engine.connect() as conn:
        row = conn.execute(COUNTERS).one()
        wal = wal_position(conn)
        statements = statement_counters(conn)
        if wal is None:
            raise RuntimeError("this PostgreSQL has no pg_walinspect (PostgreSQL 15's contrib) for its WAL")
    return Snapshot(
        dict(zip(COUNTER_NAMES, (int(v) for v in row), strict=True)),
        wal,
        {pid: cpu_seconds(pid) for pid in backend_pids(database)},
        cpu_seconds(server_pid) if server_pid else 0.0,
        POSTGRES_LOG.stat().st_size if POSTGRES_LOG.exists() else 0,
        None if statements is None else sum(int(counters[0]) for _, counters in statements.values()),
    )


def statements_since(offset: int, database: str) -> int:
    """Statements logged for `database` since `offset` (log_min_duration_statement = 0 logs each)."""
    with POSTGRES_LOG.open("rb") as log:
        log.seek(offset)
        data = log.read().decode(errors="replace")
    marker = f"@{database} LOG:  duration:"
    return sum(1 for line in data.splitlines() if marker in line)


def report(
    what: str,
    units: int,
    before: Snapshot,
    after: Snapshot,
    database: str,
    statements: bool,
    wal: Callable[[str, str], int],
) -> None:
    diff = {k: after.counters[k] - before.counters[k] for k in COUNTER_NAMES}
    backend = sum(cpu - before.backend_cpu.get(pid, 0.0) for pid, cpu in after.backend_cpu.items())
    fields: dict[str, Any] = {
        "units": units,
        "xacts": diff["xact_commit"] / units,
        "ins": diff["tup_inserted"] / units,
        "upd": diff["tup_updated"] / units,
        "del": diff["tup_deleted"] / units,
        "returned": diff["tup_returned"] / units,
        "fetched": diff["tup_fetched"] / units,
        "wal_bytes": wal(before.wal, after.wal) / units,
        "pg_cpu_us": backend / units * 1e6,
        "server_cpu_us": (after.server_cpu - before.server_cpu) / units * 1e6,
    }
    if before.calls is not None and after.calls is not None:  # the bench's own few statements included
        fields["statements"] = (after.calls - before.calls) / units
    if statements:
        fields = {"units": units, "statements": statements_since(before.log_offset, database) / units}
    result(f"capacity_{what}", **fields, loadavg=round(os.getloadavg()[0], 2))


@contextmanager
def logged_statements(admin: str, database: str, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    engine = create_engine(make_url(admin).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{database}" SET log_min_duration_statement = 0'))
    try:
        yield
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{database}" RESET log_min_duration_statement'))
        engine.dispose()


def wait_until(check: Callable[[], bool], server: ServerProcess, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting; log tail:\n{server.output[-3000:]}")
        time.sleep(0.5)


def settle() -> None:
    """Until the backends have reported their counters: PostgreSQL 15 reports a busy backend's at most once
    a second, and an idle one's that came within that second 10 s later (PGSTAT_IDLE_INTERVAL)."""
    time.sleep(11.0)


def run(args: argparse.Namespace, statements: bool) -> None:
    with fresh_database("postgres", args.pg_admin) as ws:
        database = make_url(ws.url).database
        assert database is not None
        # Due once the server has started and the first snapshot is taken: a drain of a few thousand takes
        # under a second, so schedules due already fired before a snapshot after start-up.
        due = datetime.now(UTC) + timedelta(seconds=args.lead)
        bulk_load(
            ws.url,
            args.n,
            spec=ScheduleSpec(SpecType.INTERVAL, "24h", "UTC"),
            next_run_at=lambda _: due,
            components=args.components,
            powered_on=args.powered_on,
        )
        engine = sync_engine(ws.url)
        with engine.connect() as conn:
            oid = int(
                conn.execute(
                    text("SELECT oid FROM pg_database WHERE datname = current_database()")
                ).scalar_one()
            )

        def wal(start: str, end: str) -> int:
            return wal_bytes(engine, oid, start, end)

        def scalar(stmt: Any) -> Any:
            with engine.connect() as conn:
                return conn.execute(stmt).scalar_one()

        with logged_statements(args.pg_admin, database, statements):
            # Firings: the executor starts 32 tasks and no more (each takes an hour a step).
            server = start_server(ws.url, ws.log_dir, env={"RACKFLOW_SIM_STEP_SECONDS": "3600"}, name="fire")
            try:
                settle()
                before = snapshot(engine, database, server.proc.pid)
                if datetime.now(UTC) >= due:
                    raise RuntimeError("the server started after the schedules were due; raise --lead")
                wait_until(
                    lambda: (
                        scalar(select(func.count()).select_from(first_due(due).subquery())) == 0
                        and scalar(select(func.count()).select_from(RUNNING_RUN.subquery())) == 0
                    ),
                    server,
                )
                settle()
                report(
                    "firing",
                    args.n,
                    before,
                    snapshot(engine, database, server.proc.pid),
                    database,
                    statements,
                    wal,
                )
            finally:
                server.stop()
            # Tasks: every one of them run to completion.
            # The executor starts on the tasks as the server starts listening, so the database's figures are
            # taken before it starts, and the server's CPU from the moment it listens (its start-up left out).
            before = snapshot(engine, database, None)
            server = start_server(ws.url, ws.log_dir, env={"RACKFLOW_SIM_STEP_SECONDS": "0.01"}, name="tasks")
            before.server_cpu = cpu_seconds(server.proc.pid)
            try:
                ended = select(func.count()).where(tasks.c.status.in_(("completed", "failed", "terminated")))
                wait_until(lambda: scalar(ended) >= args.n, server)
                settle()
                report(
                    "task",
                    args.n,
                    before,
                    snapshot(engine, database, server.proc.pid),
                    database,
                    statements,
                    wal,
                )
                stub = server.stub()
                some_id = scalar(select(task_schedule.c.id).limit(1))
                for what, call in (
                    (
                        "read_get_schedule",
                        lambda: stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=pb.UUID(id=str(some_id)))),
                    ),
                    (
                        "read_list_tasks",
                        lambda: stub.ListTasks(pb.ListTasksRequest(pagination=pb.Pagination(limit=50))),
                    ),
                ):
                    call()
                    settle()
                    before = snapshot(engine, database, server.proc.pid)
                    for _ in range(args.reads):
                        call()
                    settle()
                    report(
                        what,
                        args.reads,
                        before,
                        snapshot(engine, database, server.proc.pid),
                        database,
                        statements,
                        wal,
                    )
                # Idle: what the loops cost with nothing to do, per second.
                before = snapshot(engine, database, server.proc.pid)
                time.sleep(args.idle)
                report(
                    "idle_second",
                    int(args.idle),
                    before,
                    snapshot(engine, database, server.proc.pid),
                    database,
                    statements,
                    wal,
                )
            finally:
                server.stop()
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-admin", default=DEFAULT_ADMIN)
    parser.add_argument("--n", type=int, default=5000, help="schedules due at once (firings, then tasks)")
    parser.add_argument("--reads", type=int, default=500, help="calls of each read")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of an idle server measured")
    parser.add_argument("--statements", action="store_true", help="also count statements (second pass)")
    parser.add_argument(
        "--lead",
        type=float,
        default=20.0,
        help="seconds from the load to the firings (the server must have started and been snapshotted)",
    )
    parser.add_argument(
        "--components",
        type=int,
        default=1,
        help="components a rack (36: a GB200 NVL72 rack); each firing's task names them all",
    )
    parser.add_argument(
        "--powered-on",
        action="store_true",
        help="the racks are on already, as a nightly power-on finds them (their components not rewritten)",
    )
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(
        f"# capacity n={args.n} reads={args.reads} components={args.components} powered_on={args.powered_on}",
        flush=True,
    )
    run(args, statements=False)
    if args.statements:
        run(args, statements=True)


if __name__ == "__main__":
    main()
