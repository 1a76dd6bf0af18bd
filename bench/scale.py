"""scale: a million schedules and ten million runs — are the drain, the pages and the prune still flat?

Loads (`scale_load.py`) S schedules over R racks with N runs and their tasks as a year of history leaves
them, A audit events, and one schedule over B racks with G runs (the runs grid), into the dedicated
database `--database` (dropped and made again, migrated by `rackflow db migrate`), then ANALYZE. Then, on
that database, with one `rackflow serve` (dispatcher, executor, dashboard):

* reads: every List RPC's first page and its next page (by `page_token`), every dashboard page and the
  runs grid, the audit page filtered by principal: p95 of `--repeat` calls, server time (loopback);
  `--explain` prints the plan of every statement those calls ran (auto_explain in the server's sessions);
* idle RSS of the server (VmRSS after start-up and after the reads);
* fire lag: one-time schedules created one by one, each due 0.5 s later (p99 of task created_at - due);
* drain: `--drain` of the loaded schedules made due at once, against the same drain on an empty database
  (same run): firings/s and their ratio; `--io` prints what each drain read (by relation), wrote (WAL,
  by relation where the server has pg_walinspect; checkpoints) and waited on (`bench/_pg_io.py`);
  `--checkpoint` takes a CHECKPOINT before each drain, so it pays every full-page image a firing would;
* prune: `--run-retention`'s and `--task-retention`'s and the audit's prune of the oldest month (1/12 of
  each table), rows/s.

Every figure line ends with the load average at its start; the `# code` line names the revision.

    python bench/scale.py --schedules 100000 --racks 2000 --runs 1000000 --audit 100000   # 1/10 size
    python bench/scale.py --reuse --phases reads --explain                              # no reload
    python bench/scale.py --reuse --phases drain --drain 5000 --drain-rounds 2 --io --drain-first 10000
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import httpx
import scale_load
from _common import (
    DatabaseCpu,
    ServerProcess,
    bulk_load,
    code_line,
    cpu_seconds,
    fresh_database,
    machine_line,
    percentile,
    result,
    rss_kib,
    runs_partitioned_since,
    start_server,
    sync_engine,
    tasks_partitioned_since,
    timed,
)
from _pg_io import io_watch, track_io_timing
from sqlalchemy import Connection, Engine, create_engine, func, select, text, update
from sqlalchemy.engine import make_url

from rackflow.domain.tasks import ACTIVE_STATUSES, TaskStatus
from rackflow.store.tables import task_schedule, task_schedule_run, tasks
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.v1 import flow_pb2 as pb

DEFAULT_ADMIN = os.environ.get("RACKFLOW_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
PAGE = 50
ONLY = ""  # --only: the reads whose name or path contains it
SIM_STEP_SECONDS = "0.2"


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def database_url(admin: str, name: str) -> str:
    return make_url(admin).set(database=name).render_as_string(hide_password=False)


def recreate_database(admin: str, name: str) -> str:
    engine = create_engine(make_url(admin).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    url = database_url(admin, name)
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "rackflow", "db", "migrate", "--db", url], check=True)
    return url


def make_year_of_audit_partitions(engine: Engine) -> None:
    """The audit trail's day partitions over the year about to be loaded, as a year of the pruner's rounds
    would have made them (`store.audit_partitions`, migration 0028): without them the year's events would
    all go to the DEFAULT partition."""
    from rackflow.store.audit_partitions import LOOKAHEAD, ensure_partitions

    with engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
    start = now - timedelta(days=366)
    while start < now:
        with engine.begin() as conn:
            ensure_partitions(conn, start)
        start += LOOKAHEAD


def make_year_of_run_partitions(engine: Engine) -> None:
    """The runs' week partitions over the year about to be loaded, as a database a year after migration
    0046 has them (`_common.runs_partitioned_since`): without them the year's runs would all go to the
    DEFAULT partition, where the migration puts the runs it finds."""
    runs_partitioned_since(engine, 53 + 5)  # the migration's first week is a month ahead


def make_year_of_task_partitions(engine: Engine) -> None:
    """The tasks' week partitions (and their five children's) over the year about to be loaded, as a
    database a year after migration 0062 has them (`_common.tasks_partitioned_since`): without them the
    year's tasks, filed at their runs' milliseconds (`scale_load.Ids.task_filed`), would all go to the
    partition before the weeks, where the migration put the tasks it found. The same 58 weeks as the runs':
    on a database with tasks the migration's first week is one to two weeks ahead."""
    tasks_partitioned_since(engine, 53 + 5)


def load(args: argparse.Namespace) -> str:
    url = recreate_database(args.pg_admin, args.database)
    engine = sync_engine(url)
    started = time.perf_counter()
    make_year_of_audit_partitions(engine)
    make_year_of_run_partitions(engine)
    make_year_of_task_partitions(engine)
    ids = scale_load.load(
        engine,
        schedules=args.schedules,
        racks_n=args.racks,
        runs=args.runs,
        tasks_n=args.runs if args.tasks is None else args.tasks,
        audit=args.audit,
        big_racks=args.big_racks,
        big_runs=args.big_runs,
        domain_racks=args.domain_racks,
    )
    asyncio.run(scale_load.check_rows(url, ids, args.runs - 1))
    with engine.connect() as conn:
        size = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    engine.dispose()
    result("scale_load", seconds=time.perf_counter() - started, db_gib=size / 2**30, loadavg=load_avg())
    return url


# --- reads -------------------------------------------------------------------------------------------


def known_ids(url: str) -> dict[str, str]:
    """The ids the reads name, found by name and time: the loader's ids hold the time of their load
    (UUIDv7, `scale_load.Ids`). `run1` and `task1` are schedule 1's first firing and its task, `bigrun`
    the runs grid's newest run."""
    engine = sync_engine(url)
    found: dict[str, str] = {}
    with engine.connect() as conn:

        def one(sql: str, **params: str) -> str:
            return str(conn.execute(text(sql), params).scalar_one())

        found["sched1"] = one("SELECT id FROM task_schedule WHERE name = 'scale-s0000001'")
        found["big"] = one("SELECT id FROM task_schedule WHERE name = 'scale-big'")
        found["rack1"] = one("SELECT id FROM racks WHERE name = 'scale-r0000001'")
        by_time = "SELECT id FROM task_schedule_run WHERE schedule_id = :s ORDER BY fired_at"
        found["run1"] = one(f"{by_time} LIMIT 1", s=found["sched1"])
        found["bigrun"] = one(f"{by_time} DESC LIMIT 1", s=found["big"])
        found["task1"] = one("SELECT id FROM tasks WHERE run_id = :r", r=found["run1"])
    engine.dispose()
    return found


def _uuid(value: str) -> pb.UUID:
    return pb.UUID(id=value)


def _page(limit: int = PAGE, token: str = "") -> pb.Pagination:
    return pb.Pagination(limit=limit, page_token=token)


def rpc_cases(
    stub: Any, ids: dict[str, str]
) -> list[tuple[str, Callable[[], Any], Callable[[Any], Any] | None]]:
    """(name, first page, next page from the first's answer or None) for every List RPC, with the filters
    the dashboard and the CLI use."""
    normal = ids["sched1"]
    big = ids["big"]
    rack = ids["rack1"]
    cases: list[tuple[str, Callable[[], Any], Callable[[Any], Any] | None]] = []

    def paged(name: str, method: Any, make: Callable[..., Any]) -> None:
        cases.append(
            (
                name,
                lambda: method(make(pagination=_page())),
                lambda first: method(make(pagination=_page(token=first.next_page_token))),
            )
        )

    paged("ListRacks", stub.ListRacks, pb.ListRacksRequest)
    paged("ListNVLDomains", stub.ListNVLDomains, pb.ListNVLDomainsRequest)
    paged("ListTaskSchedules", stub.ListTaskSchedules, pb.ListTaskSchedulesRequest)
    for order in ("name", "next_run_at", "last_run_at desc", "created_at desc"):
        paged(
            f"ListTaskSchedules[order_by={order}]",
            stub.ListTaskSchedules,
            lambda order=order, **kw: pb.ListTaskSchedulesRequest(order_by=order, **kw),
        )
    paged(
        "ListTaskSchedules[enabled_only]",
        stub.ListTaskSchedules,
        lambda **kw: pb.ListTaskSchedulesRequest(enabled_only=True, **kw),
    )
    paged(
        "ListTaskSchedules[paused_only]",
        stub.ListTaskSchedules,
        lambda **kw: pb.ListTaskSchedulesRequest(paused_only=True, **kw),
    )
    paged(
        "ListTaskSchedules[name_contains]",
        stub.ListTaskSchedules,
        lambda **kw: pb.ListTaskSchedulesRequest(name_contains="s00012", **kw),
    )
    # Two characters, no trigram: one held by no name (each page walks SEARCH_WALK schedules and comes back
    # empty), one held by every name (the page fills at once).
    for short in ("zz", "e-"):
        paged(
            f"ListTaskSchedules[name_contains={short}]",
            stub.ListTaskSchedules,
            lambda short=short, **kw: pb.ListTaskSchedulesRequest(name_contains=short, **kw),
        )
    # The loaded fleet's operations (`scale_load.operation_kind`): one most schedules run (the page fills at
    # once), one 15 % run, one a schedule in a thousand runs (every schedule's row read for it, but for the
    # operation's index, migration 0051).
    for kind in ("power_on", "upgrade_firmware", "bring_up"):
        paged(
            f"ListTaskSchedules[operation_type={kind}]",
            stub.ListTaskSchedules,
            lambda kind=kind, **kw: pb.ListTaskSchedulesRequest(operation_type=kind, **kw),
        )
    # Filters combined as the dashboard and the CLI combine them.
    paged(
        "ListTaskSchedules[enabled_only,operation_type=bring_up]",
        stub.ListTaskSchedules,
        lambda **kw: pb.ListTaskSchedulesRequest(enabled_only=True, operation_type="bring_up", **kw),
    )
    paged(
        "ListTaskSchedules[paused_only,name_contains=s0001]",
        stub.ListTaskSchedules,
        lambda **kw: pb.ListTaskSchedulesRequest(paused_only=True, name_contains="s0001", **kw),
    )
    paged(
        "ListTaskSchedules[paused_only,operation_type=power_reset]",
        stub.ListTaskSchedules,
        lambda **kw: pb.ListTaskSchedulesRequest(paused_only=True, operation_type="power_reset", **kw),
    )
    paged(
        "ListTaskSchedules[rack_id]",
        stub.ListTaskSchedules,
        lambda **kw: pb.ListTaskSchedulesRequest(rack_id=_uuid(rack), **kw),
    )
    paged("ListTasks", stub.ListTasks, pb.ListTasksRequest)
    paged("ListTasks[rack_id]", stub.ListTasks, lambda **kw: pb.ListTasksRequest(rack_id=_uuid(rack), **kw))
    paged(
        "ListTasks[schedule_id]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(schedule_id=_uuid(normal), **kw),
    )
    # The 10,000-rack schedule's tasks, whose newest is older than the drains' (and a day of a fleet's):
    # its page walked the newer tasks before it found its ids first; and in the status all of them have,
    # whose count read every task before the schedule's index carried the status (migration 0052).
    paged(
        "ListTasks[schedule_id=big]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(schedule_id=_uuid(big), **kw),
    )
    paged(
        "ListTasks[schedule_id=big,statuses=COMPLETED]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(schedule_id=_uuid(big), statuses=[pb.TASK_STATUS_COMPLETED], **kw),
    )
    paged("ListTasks[active_only]", stub.ListTasks, lambda **kw: pb.ListTasksRequest(active_only=True, **kw))
    paged(
        "ListTasks[statuses=FAILED]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(statuses=[pb.TASK_STATUS_FAILED], **kw),
    )
    ended_badly = [pb.TASK_STATUS_FAILED, pb.TASK_STATUS_TERMINATED]
    paged(
        "ListTasks[statuses=FAILED,TERMINATED]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(statuses=ended_badly, **kw),
    )
    paged(
        "ListTasks[rack_id,statuses=FAILED]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(rack_id=_uuid(rack), statuses=[pb.TASK_STATUS_FAILED], **kw),
    )
    paged(
        "ListTasks[schedule_id,statuses=FAILED,TERMINATED]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(schedule_id=_uuid(normal), statuses=ended_badly, **kw),
    )
    paged(
        "ListTasks[schedule_id=big,statuses=FAILED]",
        stub.ListTasks,
        lambda **kw: pb.ListTasksRequest(schedule_id=_uuid(big), statuses=[pb.TASK_STATUS_FAILED], **kw),
    )
    paged(
        "ListTaskScheduleRuns",
        stub.ListTaskScheduleRuns,
        lambda **kw: pb.ListTaskScheduleRunsRequest(schedule_id=_uuid(normal), **kw),
    )
    cases.append(
        (
            "ListTaskScheduleRuns[big,limit=2]",
            lambda: stub.ListTaskScheduleRuns(
                pb.ListTaskScheduleRunsRequest(schedule_id=_uuid(big), pagination=_page(2))
            ),
            lambda first: stub.ListTaskScheduleRuns(
                pb.ListTaskScheduleRunsRequest(
                    schedule_id=_uuid(big), pagination=_page(2, first.next_page_token)
                )
            ),
        )
    )

    def basic_runs(limit: int, token: str = "") -> Any:
        request = pb.ListTaskScheduleRunsRequest(
            schedule_id=_uuid(big), pagination=_page(limit, token), view=pb.TASK_SCHEDULE_RUN_VIEW_BASIC
        )
        return stub.ListTaskScheduleRuns(request)

    def next_basic_runs(limit: int, first: Any) -> Any:
        return basic_runs(limit, first.next_page_token)

    for limit in (2, 20):  # 20: `rackflow schedule runs`' page
        cases.append(
            (
                f"ListTaskScheduleRuns[big,limit={limit},basic]",
                functools.partial(basic_runs, limit),
                functools.partial(next_basic_runs, limit),
            )
        )
    paged("ListAuditEvents", stub.ListAuditEvents, pb.ListAuditEventsRequest)
    paged(
        "ListAuditEvents[principal]",
        stub.ListAuditEvents,
        lambda **kw: pb.ListAuditEventsRequest(principal="user-7", **kw),
    )
    paged(
        "ListAuditEvents[method]",
        stub.ListAuditEvents,
        lambda **kw: pb.ListAuditEventsRequest(method="PauseTaskSchedule", **kw),
    )
    paged(
        "ListTaskScheduleScopes[big]",
        stub.ListTaskScheduleScopes,
        lambda **kw: pb.ListTaskScheduleScopesRequest(schedule_id=_uuid(big), **kw),
    )
    paged(
        "ListTaskScheduleScopes",
        stub.ListTaskScheduleScopes,
        lambda **kw: pb.ListTaskScheduleScopesRequest(schedule_id=_uuid(normal), **kw),
    )
    unpaged: list[tuple[str, Callable[[], Any]]] = [
        (  # what a client that asks for no page still gets: the whole scope
            "ListTaskScheduleScopes[big,unpaged]",
            lambda: stub.ListTaskScheduleScopes(pb.ListTaskScheduleScopesRequest(schedule_id=_uuid(big))),
        ),
        # A domain a rack (`--domain-racks 1`): every one of them, as a request of no fields asks.
        ("ListNVLDomains[unpaged]", lambda: stub.ListNVLDomains(pb.ListNVLDomainsRequest())),
        ("ListMaintenanceWindows", lambda: stub.ListMaintenanceWindows(pb.ListMaintenanceWindowsRequest())),
        ("ListOperationBudgets", lambda: stub.ListOperationBudgets(pb.ListOperationBudgetsRequest())),
        ("ListPreflightChecks", lambda: stub.ListPreflightChecks(pb.ListPreflightChecksRequest())),
        (
            "ListNotificationChannels",
            lambda: stub.ListNotificationChannels(pb.ListNotificationChannelsRequest()),
        ),
        (
            "ListNotificationDeliveries",
            lambda: stub.ListNotificationDeliveries(pb.ListNotificationDeliveriesRequest()),
        ),
    ]
    cases.extend((name, call, None) for name, call in unpaged)
    return cases


def page_paths(ids: dict[str, str]) -> list[str]:
    """Every dashboard page, with the filters an operator uses, and the runs grid of `scale-big`."""
    return [
        "/",
        "/schedules",
        "/schedules?page=2",
        "/schedules?state=paused",
        "/schedules?search=s00012",
        "/schedules?search=zz",  # two characters, held by no name: a bounded walk, "searching on"
        "/schedules?sort=next_run_at",
        "/schedules/scale-s0000001",
        "/schedules/scale-big",
        "/schedules/scale-big?page=50",  # the runs grid's racks 4,901-5,000
        f"/runs/{ids['run1']}",
        f"/runs/{ids['bigrun']}",
        f"/runs/{ids['bigrun']}?page=50",
        "/tasks",
        "/tasks?page=2",
        "/tasks?status=failed",
        "/tasks?status=terminated",
        "/tasks?status=failed&rack=scale-r0000001",
        "/tasks?schedule=scale-big&status=failed",
        "/schedules?state=paused&search=s0001",
        "/tasks?rack=scale-r0000001",
        "/tasks?schedule=scale-big&status=completed",
        f"/tasks/{ids['task1']}",
        "/racks",
        "/racks?page=50",
        "/racks/scale-r0000001",
        "/schedules/new",  # the schedule form: its racks and domains
        "/schedules/scale-s0000001/edit",
        "/windows",
        "/windows/new",
        "/budgets/new",
        "/notifications",
        "/audit",
        "/audit?principal=user-7",
        "/audit?method=PauseTaskSchedule",
        f"/audit?target={ids['sched1']}",  # one schedule's history, from the GIN index (migration 0044)
    ]


def measure_reads(
    server: ServerProcess, repeat: int, ids: dict[str, str], target_rpc: float, target_page: float
) -> None:
    stub = server.stub()
    misses: list[str] = []
    for name, first, follow in rpc_cases(stub, ids):
        if ONLY and ONLY not in name:
            continue
        load = load_avg()
        try:
            times, answer = timed(first, repeat)
        except grpc.RpcError as exc:
            misses.append(name)
            result("scale_rpc", rpc=name, error=exc.code().name, loadavg=load)  # type: ignore[attr-defined]
            continue
        p95 = percentile(times, 95)
        fields: dict[str, object] = {"first_p95_ms": p95, "first_p50_ms": percentile(times, 50)}
        worst = p95
        if follow is not None:
            if answer.next_page_token:
                next_times, _ = timed(functools.partial(follow, answer), repeat)
                fields["next_p95_ms"] = percentile(next_times, 95)
                fields["next_p50_ms"] = percentile(next_times, 50)
                worst = max(worst, percentile(next_times, 95))
            else:
                fields["next_p95_ms"] = "none(one page)"
        if worst > target_rpc:
            misses.append(name)
        result(
            "scale_rpc",
            rpc=name,
            **fields,
            target_ms=target_rpc,
            met="yes" if worst <= target_rpc else "no",
            loadavg=load,
        )
    with httpx.Client(base_url=server.http_url, timeout=120) as client:
        for path in page_paths(ids):
            if ONLY and ONLY not in path:
                continue
            load = load_avg()

            def get(path: str = path) -> int:
                response = client.get(path)
                response.raise_for_status()
                return len(response.content)

            times, size = timed(get, repeat)
            p95 = percentile(times, 95)
            if p95 > target_page:
                misses.append(path)
            result(
                "scale_page",
                path=path,
                p95_ms=p95,
                p50_ms=percentile(times, 50),
                kib=size // 1024,
                target_ms=target_page,
                met="yes" if p95 <= target_page else "no",
                loadavg=load,
            )
    result("scale_reads", missed=",".join(misses) or "none")


# --- plans -------------------------------------------------------------------------------------------

POSTGRES_LOG = Path(
    os.environ.get("RACKFLOW_BENCH_POSTGRES_LOG", "/var/log/postgresql/postgresql-15-main.log")
)
LOG_LINE = re.compile(r"^\S+ \S+ \S+ \[(\d+)\]")
AUTO_EXPLAIN = {
    "session_preload_libraries": "auto_explain",
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_analyze": "on",
    "auto_explain.log_buffers": "on",
    "auto_explain.log_timing": "off",
}


@contextmanager
def auto_explain(url: str, database: str, enabled: bool) -> Iterator[None]:
    """While the block runs, every statement of a new session on `database` logs its plan with row counts
    (auto_explain, set on this database only, so other databases on the server are left alone)."""
    if not enabled:
        yield
        return
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for name, value in AUTO_EXPLAIN.items():
            conn.execute(text(f"ALTER DATABASE \"{database}\" SET {name} = '{value}'"))
    try:
        yield
    finally:
        with engine.connect() as conn:
            for name in AUTO_EXPLAIN:
                conn.execute(text(f'ALTER DATABASE "{database}" RESET {name}'))
        engine.dispose()


def backend_pids(url: str, database: str, server_pid: int) -> set[int]:
    """The PostgreSQL backends serving `server_pid` (by client port, from /proc's sockets: simpler to ask
    pg_stat_activity for every backend on the database, which is the server's alone during the reads)."""
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    with engine.connect() as conn:
        pids = set(
            conn.execute(
                text("SELECT pid FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"),
                {"d": database},
            ).scalars()
        )
    engine.dispose()
    return pids


def plans_since(offset: int, pids: set[int]) -> list[str]:
    """auto_explain's entries in the PostgreSQL log after `offset`, from `pids`, one per distinct query."""
    with POSTGRES_LOG.open("rb") as log:
        log.seek(offset)
        lines = log.read().decode(errors="replace").splitlines()
    entries: list[list[str]] = []
    for line in lines:
        head = LOG_LINE.match(line)  # log_line_prefix '%m [%p] …': date, time, zone, [pid]
        if head is not None:
            pid = int(head.group(1))
            entries.append([line] if pid in pids and "plan:" in line else [])
        elif entries and entries[-1]:
            entries[-1].append(line)
    seen: dict[str, str] = {}
    for entry in entries:
        if not entry:
            continue
        body = "\n".join(entry)
        query = next((e for e in entry if "Query Text:" in e), body)
        seen.setdefault(query, body)
    return list(seen.values())


def explain_reads(server: ServerProcess, url: str, database: str, ids: dict[str, str]) -> None:
    """Each List RPC case and dashboard page once, with the plans of the statements it ran."""
    stub = server.stub()
    with httpx.Client(base_url=server.http_url, timeout=120) as client:
        calls: list[tuple[str, Callable[[], Any]]] = []
        for name, first, follow in rpc_cases(stub, ids):
            calls.append((name, first))
            if follow is not None:
                calls.append((f"{name} next", lambda first=first, follow=follow: follow(first())))
        calls.extend(
            (f"GET {path}", lambda path=path: client.get(path).raise_for_status()) for path in page_paths(ids)
        )
        for name, call in calls:
            if ONLY and ONLY not in name:
                continue
            call()  # the session may be new: warm it, then look at one call only
            offset = POSTGRES_LOG.stat().st_size
            call()
            time.sleep(0.3)  # the log is written asynchronously by the backends
            plans = plans_since(offset, backend_pids(url, database, server.proc.pid))
            print(f"### plans of {name}: {len(plans)} distinct statements", flush=True)
            for plan in plans:
                print(plan, flush=True)


# --- fire lag, memory, drain -------------------------------------------------------------------------


def measure_lag(server: ServerProcess, url: str, samples: int) -> None:
    """One-time schedules created one by one over gRPC on loaded racks, each due 0.5 s later."""
    from dispatch_lag import _create_one_by_one

    load = load_avg()
    racks = [f"scale-r{i:07d}" for i in range(samples)]
    # Named for this run, so a database measured again takes new schedules (the racks' names are taken).
    prefix = f"lag-{int(time.time())}-"
    due_by_id = asyncio.run(_create_one_by_one(server.address, racks, 0.5, 0.25, prefix))
    engine = sync_engine(url)
    created = select(tasks.c.schedule_id, tasks.c.created_at).where(tasks.c.schedule_id.in_(list(due_by_id)))
    deadline = time.monotonic() + 120
    with engine.connect() as conn:
        while len(rows := conn.execute(created).all()) < samples:
            conn.commit()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(rows)} of {samples} fired; log tail:\n{server.output[-3000:]}")
            time.sleep(0.2)
    engine.dispose()
    lags = [(at - due_by_id[schedule_id]).total_seconds() * 1000 for schedule_id, at in rows]
    p99 = percentile(lags, 99)
    result(
        "scale_fire_lag",
        samples=len(lags),
        p50_ms=percentile(lags, 50),
        p99_ms=p99,
        max_ms=max(lags),
        target_ms=500,
        met="yes" if p99 <= 500 else "no",
        loadavg=load,
    )


def rss_mib(server: ServerProcess) -> float:
    return rss_kib(server.proc.pid) / 1024


# A prime: schedule i * SPREAD % S for i < n picks n schedules spread over the loaded ones' creation order.
SPREAD = 7919


def end_live_tasks(conn: Connection) -> None:
    """End the tasks earlier rounds left live, as if they had run: a drain is over once its firings are
    recorded, not once their tasks have run, and the empty database each round is compared with starts
    without any. Left live, they were the next round's executor's work beside its drain (17,262 pending
    after four rounds), and every claim read all of them."""
    live = tasks.c.status.in_([status.value for status in ACTIVE_STATUSES])
    ended = conn.execute(
        update(tasks)
        .where(live)
        .values(status=TaskStatus.COMPLETED.value, owner_id=None, finished_at=func.now(), not_before=None)
    )
    print(f"# drain: {ended.rowcount} tasks earlier rounds left live ended", flush=True)


def spread_picks(n: int, schedules: int, first: int) -> list[int]:
    """The numbers of the n loaded schedules a drain picks from `first` on (`make_due`)."""
    return [i * SPREAD % schedules for i in range(first, first + n)]


def same_operations(url: str, picks: list[int]) -> None:
    """Give the empty database's schedules (`bench-<i>`, i from 0) the operations of the loaded schedules
    the drain picked (`picks`, in order: `scale_load.operation_template`), so that both drains fire the same
    mix and the executor beside each runs the same kinds of task: the empty one's were all power-ons, and
    its ratio compared a database's size and a mix at once."""
    engine = sync_engine(url)
    template = scale_load.operation_template("task_schedule.operation_template", "picked.s")
    with engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE task_schedule SET operation_template = {template} "
                "FROM unnest(CAST(:names AS text[]), CAST(:picks AS integer[])) AS picked(name, s) "
                "WHERE task_schedule.name = picked.name"
            ),
            {"names": [f"bench-{i:07d}" for i in range(len(picks))], "picks": picks},
        )
    engine.dispose()


def make_due(url: str, n: int, schedules: int, racks: int, first: int) -> datetime:
    """n loaded schedules due a minute ago, each on a rack of its own (as in dispatch_drain); returns that
    time. Schedule s is on rack s % racks. They are spread over the loaded schedules' creation order, so
    over the indexes led by their ids (UUIDv7: in creation order); schedules 0..n-1, the first n made,
    would sit together at the left of those indexes, which no drain of a real fleet could count on.
    `first`: where in that spread order to start, so that each round drains schedules no round fired
    before (a schedule fired in an earlier round has its pages freshly read and its newest run at the right
    edge of the runs' indexes: a drain of it again is flattered).

    A neighbour fired before flatters too: schedules s and s + 1 were made a millisecond apart, so their
    runs and tasks share the leaves of every schedule-led index, and their rows a heap page. At a million
    schedules, pick i + 17,679 is a neighbour of pick i (17,679 * SPREAD = 1 mod 10^6): from there on every
    pick is, so only a fresh load's first 17,679 picks read what no earlier round read. The count of picks
    beside an earlier one is printed, to tell those rounds apart."""
    picked = spread_picks(n, schedules, first)
    if len(set(picked)) != n or len({s % racks for s in picked}) != n:
        raise SystemExit(f"--drain {n}: cannot pick schedules on {n} racks of their own among {schedules}")
    earlier = {i * SPREAD % schedules for i in range(first)}
    beside = sum((s - 1) % schedules in earlier or (s + 1) % schedules in earlier for s in picked)
    print(
        f"# drain: schedules {first}..{first + n - 1} of the spread order (--drain-first), "
        f"{beside} of them next to one an earlier pick drained",
        flush=True,
    )
    due = datetime.now(UTC) - timedelta(minutes=1)
    names = [f"scale-s{s:07d}" for s in picked]
    engine = sync_engine(url)
    with engine.begin() as conn:
        end_live_tasks(conn)
        for first in range(0, n, 5_000):
            chunk = names[first : first + 5_000]
            # Some loaded schedules are paused (`scale_load.PAUSED_EVERY`): a drain picks them resumed.
            conn.execute(
                update(task_schedule)
                .where(task_schedule.c.name.in_(chunk))
                .values(next_run_at=due, enabled=True, paused_at=None, pause_reason="", paused_by="")
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE task_schedule"))
    engine.dispose()
    return due


@dataclass(frozen=True)
class Drained:
    """A drain's rate, and the CPU it cost a firing: the server's (user plus system, from the moment it
    listens until the drain ends: its executor's work on the tasks fired meanwhile included) and its
    database's backends' (`DatabaseCpu`), in µs; and the load average at its start."""

    firings_per_s: float
    server_cpu_us: float
    postgres_cpu_us: float
    load: float


def drain(url: str, log_dir: Path, n: int, due: datetime, timeout: float = 900.0) -> Drained:
    """Start a server, wait until nothing is due at `due` and no run is firing."""
    from dispatch_drain import RUNNING_RUN, first_due

    load = load_avg()
    engine = sync_engine(url)
    started = datetime.now(UTC)
    server = start_server(
        url,
        log_dir,
        args=["--dispatch-batch", "10"],
        env={"RACKFLOW_SIM_STEP_SECONDS": SIM_STEP_SECONDS},
        name="drain",
    )
    try:
        deadline = time.monotonic() + timeout
        server_cpu_before = cpu_seconds(server.proc.pid)
        database_cpu = DatabaseCpu()
        with engine.connect() as conn:
            database_cpu.sample(conn)
            while (
                conn.execute(first_due(due)).first() is not None
                or conn.execute(RUNNING_RUN).first() is not None
            ):
                conn.commit()
                database_cpu.sample(conn)
                if server.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"drain did not finish; log tail:\n{server.output[-3000:]}")
                time.sleep(0.5)
            database_cpu.sample(conn)
            server_cpu_s = cpu_seconds(server.proc.pid) - server_cpu_before
            run = task_schedule_run.c
            first_fired, fired = conn.execute(
                select(func.min(run.fired_at), func.count()).where(run.fired_at >= started)
            ).one()
            last_task = conn.execute(
                select(func.max(tasks.c.created_at)).where(tasks.c.created_at >= started)
            ).scalar_one()
    finally:
        server.stop()
        engine.dispose()
    if fired != n:
        raise RuntimeError(f"{fired} firings, expected {n}")
    return Drained(
        n / (last_task - first_fired).total_seconds(),
        server_cpu_s / n * 1e6,
        database_cpu.seconds / n * 1e6,
        load,
    )


def drained_result(db: str, round_: int, n: int, drained: Drained) -> None:
    result(
        "scale_drain",
        db=db,
        round=round_,
        n=n,
        firings_per_s=drained.firings_per_s,
        server_cpu_us_per_firing=drained.server_cpu_us,
        postgres_cpu_us_per_firing=drained.postgres_cpu_us,
        loadavg=drained.load,
    )


def measure_drain(url: str, log_dir: Path, args: argparse.Namespace) -> None:
    """The loaded database's drain, then the same on an empty one, alternating `--drain-rounds` times;
    with `--io`, what each drain read, wrote and waited on (`_pg_io`)."""

    def watched(url: str, label: str) -> AbstractContextManager[None]:
        return io_watch(url, label, args.drain) if args.io else nullcontext()

    if args.io:
        track_io_timing(url)
    loaded_rates, empty_rates = [], []
    for round_ in range(args.drain_rounds):
        if args.drain > args.racks:
            raise SystemExit("--drain must be at most --racks (a rack per due schedule)")
        due = make_due(url, args.drain, args.schedules, args.racks, args.drain_first + round_ * args.drain)
        if args.checkpoint:
            checkpoint(url)
        with watched(url, f"loaded round={round_}"):
            loaded = drain(url, log_dir, args.drain, due)
        loaded_rates.append(loaded.firings_per_s)
        drained_result("loaded", round_, args.drain, loaded)
        with fresh_database("postgres", args.pg_admin) as ws:
            empty_due = datetime.now(UTC) - timedelta(minutes=1)
            bulk_load(
                ws.url,
                args.drain,
                spec=ScheduleSpec(SpecType.INTERVAL, "24h", "UTC"),
                next_run_at=functools.partial(lambda due, _: due, empty_due),
            )
            same_operations(
                ws.url, spread_picks(args.drain, args.schedules, args.drain_first + round_ * args.drain)
            )
            if args.empty_sql:
                run_sql(ws.url, args.empty_sql)
            if args.io:
                track_io_timing(ws.url)
            if args.checkpoint:
                checkpoint(ws.url)
            with watched(ws.url, f"empty round={round_}"):
                empty = drain(ws.url, ws.log_dir, args.drain, empty_due)
            empty_rates.append(empty.firings_per_s)
            drained_result("empty", round_, args.drain, empty)
    ratio = (sum(loaded_rates) / len(loaded_rates)) / (sum(empty_rates) / len(empty_rates))
    result("scale_drain_ratio", loaded_over_empty=ratio, target=0.8, met="yes" if ratio >= 0.8 else "no")


def run_sql(url: str, statements: str) -> None:
    """`--empty-sql`: the `;`-separated statements, then ANALYZE, on the empty database once it is loaded,
    so that a schema change made by hand to the loaded database (an index dropped, say) is on both sides
    of the comparison."""
    engine = sync_engine(url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for statement in filter(str.strip, statements.split(";")):
            conn.execute(text(statement))
        conn.execute(text("ANALYZE"))
    engine.dispose()
    print(f"# empty database: ran --empty-sql {statements!r}", flush=True)


def checkpoint(url: str) -> None:
    """A CHECKPOINT before a drain (`--checkpoint`): the first change of every page after it logs the whole
    page, so the drain pays the full-page images of all it touches, the schedules' rows and their index
    leaves included, as a firing does once checkpoints come more often than a schedule fires. Without it,
    the pages `make_due` changed were logged whole by it, not by the drain."""
    engine = sync_engine(url)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CHECKPOINT"))
    engine.dispose()


# --- prune -------------------------------------------------------------------------------------------


def wal_lsn(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")).scalar_one())


def measure_prune(url: str, hours: float, *, runs_first: bool = False) -> None:
    """Each retention's prune of the oldest `hours` of the year of history (a backlog, as after a
    retention is first set), as `rackflow serve`'s pruner runs it (the store's functions, PRUNE_CHUNK rows a
    transaction, tasks before runs; `runs_first` for the order before f88b2d4): rows, seconds, rows/s, WAL
    bytes per row (the server's WAL position: other databases' writes meanwhile are counted too, so it is
    an upper bound)."""
    from rackflow.store import audit as audit_store
    from rackflow.store import runs as run_history
    from rackflow.store import tasks as task_store
    from rackflow.store.db import Database

    retention = timedelta(days=365) - timedelta(hours=hours)
    engine = sync_engine(url)
    history = [("tasks", task_store.prune_finished_tasks), ("runs", run_history.prune_old_runs)]
    for name, prune in (*(history[::-1] if runs_first else history), ("audit", audit_store.prune_events)):
        load = load_avg()

        async def run(prune: Any = prune) -> int:
            db = Database(url)
            try:
                return sum([n async for n in prune(db, retention)])
            finally:
                await db.dispose()

        wal_before = wal_lsn(engine)
        started = time.perf_counter()
        pruned = asyncio.run(run())
        seconds = time.perf_counter() - started
        wal = wal_lsn(engine) - wal_before
        result(
            "scale_prune",
            table=name,
            rows=pruned,
            seconds=seconds,
            rows_per_s=pruned / seconds if seconds else 0.0,
            wal_bytes_per_row=wal / pruned if pruned else 0.0,
            loadavg=load,
        )
    engine.dispose()


# --- main --------------------------------------------------------------------------------------------

PHASES = ("reads", "rss", "lag", "drain", "prune")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-admin", default=DEFAULT_ADMIN, help="PostgreSQL server to make --database on")
    parser.add_argument("--database", default="rackflow_scale", help="dropped and made again unless --reuse")
    parser.add_argument("--reuse", action="store_true", help="measure the database a previous run loaded")
    parser.add_argument("--schedules", type=int, default=1_000_000)
    parser.add_argument("--racks", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=10_000_000, help="runs (and as many tasks) of history")
    parser.add_argument(
        "--tasks",
        type=int,
        help="tasks of the newest runs only (default: every run's): a shorter --task-retention",
    )
    parser.add_argument("--audit", type=int, default=1_000_000, help="audit events over the year")
    parser.add_argument("--big-racks", type=int, default=10_000, help="racks of the runs grid's schedule")
    parser.add_argument("--big-runs", type=int, default=50, help="runs of the runs grid's schedule")
    parser.add_argument(
        "--domain-racks",
        type=int,
        default=1,
        help="racks an NVLink domain (1: a domain a rack, as a fleet of NVL72 racks; 0: no domains)",
    )
    parser.add_argument("--phases", default=",".join(PHASES), help=f"some of {','.join(PHASES)}")
    parser.add_argument("--repeat", type=int, default=20, help="calls per read (p95 of them)")
    parser.add_argument(
        "--explain", action="store_true", help="print the plan of every statement of every read"
    )
    parser.add_argument("--only", default="", help="only the reads whose RPC name or path contains this")
    parser.add_argument("--lag-samples", type=int, default=100)
    parser.add_argument("--drain", type=int, default=10_000, help="loaded schedules made due at once")
    parser.add_argument("--drain-rounds", type=int, default=1)
    parser.add_argument(
        "--drain-first",
        type=int,
        default=0,
        help="round r drains the schedules from --drain-first + r * --drain on in the spread order; "
        "with --reuse, pass the number an earlier invocation drained, so no round fires a schedule twice",
    )
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="a CHECKPOINT before each drain, which then pays every full-page image a firing would",
    )
    parser.add_argument(
        "--empty-sql",
        default="",
        help="statements (`;`-separated) run on each empty database after its load: the same schema change "
        "on both sides when one is probed on the loaded database by hand (docs/PERFORMANCE.md)",
    )
    parser.add_argument(
        "--io", action="store_true", help="what each drain read, wrote and waited on (bench/_pg_io.py)"
    )
    parser.add_argument(
        "--prune-hours", type=float, default=6.0, help="hours of the oldest history each prune deletes"
    )
    parser.add_argument(
        "--prune-runs-first",
        action="store_true",
        help="prune runs before their tasks (the server's order before f88b2d4), for comparison",
    )
    args = parser.parse_args()
    global ONLY
    ONLY = args.only
    phases = set(args.phases.split(","))
    print(machine_line())
    print(code_line())
    print(
        f"# scale schedules={args.schedules} racks={args.racks} runs={args.runs} audit={args.audit} "
        f"big={args.big_racks}x{args.big_runs} domain_racks={args.domain_racks} "
        f"database={args.database}",
        flush=True,
    )
    url = database_url(args.pg_admin, args.database) if args.reuse else load(args)
    with __import__("tempfile").TemporaryDirectory(prefix="rackflow-scale-") as tmp:
        log_dir = Path(tmp)
        if phases & {"reads", "rss", "lag"}:
            if "lag" in phases:
                # An earlier run's drain may have left tasks live on the lag's racks: a firing on a rack
                # with a conflicting task makes none, and the phase would wait for tasks that never come.
                engine = sync_engine(url)
                with engine.begin() as conn:
                    end_live_tasks(conn)
                engine.dispose()
            with auto_explain(args.pg_admin, args.database, args.explain):
                server = start_server(
                    url,
                    log_dir,
                    args=["--http-listen", "127.0.0.1:0"],
                    env={"RACKFLOW_SIM_STEP_SECONDS": SIM_STEP_SECONDS},
                )
                try:
                    time.sleep(5)
                    if "rss" in phases:
                        result(
                            "scale_rss",
                            when="idle",
                            rss_mib=rss_mib(server),
                            target_mib=250,
                            met="yes" if rss_mib(server) <= 250 else "no",
                            loadavg=load_avg(),
                        )
                    if args.explain:
                        explain_reads(server, args.pg_admin, args.database, known_ids(url))
                    elif "reads" in phases:
                        measure_reads(server, args.repeat, known_ids(url), 100.0, 300.0)
                    if "rss" in phases:
                        result(
                            "scale_rss",
                            when="after reads",
                            rss_mib=rss_mib(server),
                            peak_mib=rss_kib(server.proc.pid, "VmHWM") / 1024,
                            loadavg=load_avg(),
                        )
                    if "lag" in phases:
                        measure_lag(server, url, args.lag_samples)
                finally:
                    server.stop()
        if "drain" in phases:
            measure_drain(url, log_dir, args)
        if "prune" in phases:
            measure_prune(url, args.prune_hours, runs_first=args.prune_runs_first)


if __name__ == "__main__":
    main()
