"""capacity: what one firing, one task and one API read cost PostgreSQL — the inputs of docs/CAPACITY.md.

Measured from outside on a fresh database with one `rackflow serve`, per unit of work:

* firing: N single-scope schedules due at once, drained with the executor idle (`--sim-step 3600`: it
  starts 32 tasks that never finish, so the tasks' own work stays out);
* task: the same N tasks then run to completion by a server whose simulator takes 0.01 s a step (the
  executor's claims, status changes, and the write-back of each run's outcome);
* read: GetTaskSchedule by id, and ListTasks' first page of 50, `--reads` times each, one client.

For each: transactions (`pg_stat_database.xact_commit`), rows inserted, updated, deleted and returned
(`tup_*`), WAL bytes (`pg_current_wal_lsn()` difference), CPU seconds of the database's backends (utime +
stime from /proc of every `postgres: … <db> …` process) and of the rackflow server process, and with
`--statements` the statements sent (a second pass with `log_min_duration_statement = 0` on that database
only, counting its entries in the PostgreSQL log; logging costs CPU, so its CPU figures are not used).

    python bench/capacity.py --n 5000 --reads 500
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import threading
import time
from collections import defaultdict
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


WALDUMP = os.environ.get("RACKFLOW_BENCH_PG_WALDUMP", "/usr/lib/postgresql/15/bin/pg_waldump")
WAL_DIR = os.environ.get("RACKFLOW_BENCH_PG_WAL", "/var/lib/postgresql/15/main/pg_wal")
WAL_RECORD = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+), tx:\s*(\d+), lsn: ([0-9A-F]+/[0-9A-F]+),")


def lsn_value(lsn: str) -> int:
    high, low = lsn.split("/")
    return (int(high, 16) << 32) + int(low, 16)


class WalReader:
    """WAL bytes written for one database from a start LSN on: the server's LSN is shared by every
    database on it (other benchmarks and tests run beside this one), so the records are read with
    `pg_waldump --follow` as they are written (a segment may be recycled by the time a phase ends) and
    only those of the database's relations counted, with the other records (commits) of their
    transactions. Full-page images are in a record's total length."""

    def __init__(self, database_oid: int, start: str) -> None:
        self._mine = f"rel 1663/{database_oid}/"
        self._proc = subprocess.Popen(
            [WALDUMP, "--follow", "-p", WAL_DIR, "-s", start],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._by_tx: defaultdict[int, int] = defaultdict(int)
        self._ours: set[int] = set()
        self._total = 0
        self._seen = lsn_value(start)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            match = WAL_RECORD.search(line)
            if match is None:
                continue
            length, tx, lsn = int(match.group(1)), int(match.group(2)), lsn_value(match.group(3))
            if self._mine in line:
                self._total += length
                self._ours.add(tx)
            elif tx:
                self._by_tx[tx] += length
            self._seen = lsn

    def bytes_until(self, end: str, timeout: float = 120.0) -> int:
        """The bytes up to LSN `end` (waits until the reader got there), and stops the reader."""
        deadline = time.monotonic() + timeout
        while self._seen < lsn_value(end) and time.monotonic() < deadline and self._proc.poll() is None:
            time.sleep(0.2)
        self._proc.terminate()
        self._proc.wait(10)
        self._thread.join(10)
        if self._seen < lsn_value(end):
            print(f"# pg_waldump stopped at {self._seen:x}, before {end}", flush=True)
        return self._total + sum(self._by_tx[tx] for tx in self._ours if tx)


@dataclass
class Snapshot:
    counters: dict[str, int]
    wal: str
    backend_cpu: dict[int, float]
    server_cpu: float
    log_offset: int
    reader: WalReader | None = None  # a start snapshot's: reads the WAL written from it on


def snapshot(engine: Engine, database: str, server_pid: int | None, oid: int | None = None) -> Snapshot:
    with engine.connect() as conn:
        row = conn.execute(COUNTERS).one()
        wal = str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())
        conn.commit()
    return Snapshot(
        dict(zip(COUNTER_NAMES, (int(v) for v in row), strict=True)),
        wal,
        {pid: cpu_seconds(pid) for pid in backend_pids(database)},
        cpu_seconds(server_pid) if server_pid else 0.0,
        POSTGRES_LOG.stat().st_size if POSTGRES_LOG.exists() else 0,
        WalReader(oid, wal) if oid is not None else None,
    )


def statements_since(offset: int, database: str) -> int:
    """Statements logged for `database` since `offset` (log_min_duration_statement = 0 logs each)."""
    with POSTGRES_LOG.open("rb") as log:
        log.seek(offset)
        data = log.read().decode(errors="replace")
    marker = f"@{database} LOG:  duration:"
    return sum(1 for line in data.splitlines() if marker in line)


def report(
    what: str, units: int, before: Snapshot, after: Snapshot, database: str, statements: bool, oid: int
) -> None:
    # The stats collector reports a backend's counters at its transaction ends, at most every 500 ms.
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
        "wal_bytes": before.reader.bytes_until(after.wal) / units if before.reader else float("nan"),
        "pg_cpu_us": backend / units * 1e6,
        "server_cpu_us": (after.server_cpu - before.server_cpu) / units * 1e6,
    }
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
    time.sleep(1.0)  # the statistics collector's 500 ms reporting interval, twice


def run(args: argparse.Namespace, statements: bool) -> None:
    with fresh_database("postgres", args.pg_admin) as ws:
        database = make_url(ws.url).database
        assert database is not None
        due = datetime.now(UTC) - timedelta(minutes=1)
        bulk_load(
            ws.url, args.n, spec=ScheduleSpec(SpecType.INTERVAL, "24h", "UTC"), next_run_at=lambda _: due
        )
        engine = sync_engine(ws.url)
        with engine.connect() as conn:
            oid = int(
                conn.execute(
                    text("SELECT oid FROM pg_database WHERE datname = current_database()")
                ).scalar_one()
            )

        def scalar(stmt: Any) -> Any:
            with engine.connect() as conn:
                return conn.execute(stmt).scalar_one()

        with logged_statements(args.pg_admin, database, statements):
            # Firings: the executor starts 32 tasks and no more (each takes an hour a step).
            server = start_server(ws.url, ws.log_dir, env={"RACKFLOW_SIM_STEP_SECONDS": "3600"}, name="fire")
            try:
                settle()
                before = snapshot(engine, database, server.proc.pid, oid)
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
                    oid,
                )
            finally:
                server.stop()
            # Tasks: every one of them run to completion.
            server = start_server(ws.url, ws.log_dir, env={"RACKFLOW_SIM_STEP_SECONDS": "0.01"}, name="tasks")
            try:
                before = snapshot(engine, database, server.proc.pid, oid)
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
                    oid,
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
                    before = snapshot(engine, database, server.proc.pid, oid)
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
                        oid,
                    )
                # Idle: what the loops cost with nothing to do, per second.
                before = snapshot(engine, database, server.proc.pid, oid)
                time.sleep(args.idle)
                report(
                    "idle_second",
                    int(args.idle),
                    before,
                    snapshot(engine, database, server.proc.pid),
                    database,
                    statements,
                    oid,
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
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(f"# capacity n={args.n} reads={args.reads}", flush=True)
    run(args, statements=False)
    if args.statements:
        run(args, statements=True)


if __name__ == "__main__":
    main()
