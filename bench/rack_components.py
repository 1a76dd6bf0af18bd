"""rack_components: racks of 36 components (a GB200 NVL72 rack) — what grows with them?

Every other scale figure loads one component a rack. This one loads `--racks` racks of `--components`
components each (a rack's mix as an NVL72's: 18 COMPUTE trays, 9 NVSWITCH trays, 8 POWERSHELF, one
TORSWITCH, repeated past 36) by SQL into a scratch database `rackflow_comps_*` after `rackflow db migrate`,
and two power-on schedules made through the services on one rack and given the others' scopes by SQL: one
over `--small` racks and one over `--big` racks. Then, with one `rackflow serve` (simulator steps of
`--sim-step` seconds, so the fired tasks run slowly and keep the executor quiet during the reads):

* ListRacks first and next page (default page and 1,000), GetRack, /racks and /racks/{name}: p95 of
  `--repeat` calls, server time over loopback (issue 29's targets: 100 ms an RPC page, 300 ms a page);
* each schedule triggered: the TriggerTaskSchedule call (time to submit) and the time until its run's last
  task exists (fan-out);
* the big run: GetTaskScheduleRun, /runs/{id}, ListTasks (first and next page, default and 1,000, and by
  schedule), GetTasksByIDs of 1,000 of its tasks, with the answer's size;
* the CLI against the server: `rackflow run show RUN` and `rackflow task list` (wall time of the command,
  Python's start-up included).

The database is dropped at the end unless `--keep`.

`--names` measures the name searches instead, and nothing else: each rack in an NVLink domain of its own
(`comps-d<n>`, as an NVL72 fleet's), no schedule; then ListRacks' `name_contains` (a page of 20, and the
next page where the first gave a token) and the schedule form's picker (`/names/racks`,
`/names/nvl_domains`, and the next page where the first named one: `after`) for texts that many, one and no
name holds, and one of two characters: p95 of `--repeat` calls through the server, and the store's own
statements in process (`store.inventory.list_racks`, `names_holding`: p50 and p95, the server stopped). Run
it on a release before a change (PYTHONPATH) and on one after it to compare: `--database NAME --keep` the
first time, `--database NAME --reuse` the next (the racks loaded once; both releases at one migration).

    python bench/rack_components.py --components 36 --racks 20000
    python bench/rack_components.py --components 1 --racks 20000      # the one-component fleet, to compare
    python bench/rack_components.py --names --components 4 --racks 100000 --repeat 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
from _common import (
    NVL72_MIX,
    ServerProcess,
    code_line,
    machine_line,
    percentile,
    result,
    start_server,
    sync_engine,
    timed,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from rackflow.api.convert.inventory import rack_to
from rackflow.api.convert.tasks import task_to
from rackflow.api.servicer import FlowServicer
from rackflow.clock import SystemClock
from rackflow.domain.inventory import RackTarget, TargetSpec
from rackflow.domain.schedules import OverlapPolicy
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.services import Services
from rackflow.store import inventory
from rackflow.store.db import Database
from rackflow.store.tables import nvl_domains, racks
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc

DEFAULT_ADMIN = os.environ.get("RACKFLOW_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TARGET_RPC_MS = 100.0
TARGET_PAGE_MS = 300.0
# The pages asked for: the dashboard's and the CLI's (50) and a client's largest (MAX_PAGE_SIZE).
PAGES = (50, 1000)
# As the CLI's channel takes (a page of 1,000 racks of 36 components is about 5 MB, past gRPC's 4 MiB).
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 2**20)]


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def rack_name(n: int) -> str:
    return f"comps-r{n:06d}"


# The name searches `--names` measures: texts that many names hold (one in ten: the picker stops at its 20th,
# ListRacks' count at its cap), one holds, none holds, and one of two characters (no trigram), of the
# racks' names and of the domains'.
RACK_SEARCHES = ("comps-r01", "r000999", "zzz", "zz")
DOMAIN_SEARCHES = ("comps-d01", "d000999", "zzz", "zz")
PICKED = 20  # the picker's names a request, and the page asked of ListRacks


def make_database(admin: str, name: str) -> str:
    engine = create_engine(make_url(admin).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    url = make_url(admin).set(database=name).render_as_string(hide_password=False)
    subprocess.run([sys.executable, "-m", "rackflow", "db", "migrate", "--db", url], check=True)
    return url


def drop_database(admin: str, name: str) -> None:
    engine = create_engine(make_url(admin).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


def load_racks(url: str, racks_n: int, components_n: int) -> None:
    """Racks 0..R-1 made one a millisecond a day ago, each with C components named `<rack>-c<k>`, a rack's
    components inserted together, as CreateRack inserts them (so they share heap pages, as in a fleet)."""
    types = "ARRAY[" + ",".join(f"'{t}'" for t in NVL72_MIX) + "]"
    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO racks (id, name, external_id, created_at) SELECT gen_random_uuid(),"
                " 'comps-r' || lpad(n::text, 6, '0'), 'comps-r' || lpad(n::text, 6, '0'),"
                " now() - interval '1 day' + n * interval '1 millisecond' FROM generate_series(0, :r - 1) n"
            ),
            {"r": racks_n},
        )
        conn.execute(
            text(
                "INSERT INTO components (id, rack_id, type, name, external_id, firmware_version, power_state,"
                " created_at) "
                f"SELECT gen_random_uuid(), r.id, ({types})[k % {len(NVL72_MIX)} + 1], r.name || '-c' || k,"
                " r.name || '-c' || k, '1.0.0', 'on', r.created_at"
                " FROM racks r CROSS JOIN generate_series(0, :c - 1) k ORDER BY r.name, k"
            ),
            {"c": components_n},
        )
    engine.dispose()


def load_domains(url: str) -> None:
    """An NVLink domain a rack, `comps-d<n>` for rack `comps-r<n>`, made when it was."""
    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO nvl_domains (id, name, created_at)"
                " SELECT gen_random_uuid(), replace(name, 'comps-r', 'comps-d'), created_at FROM racks"
            )
        )
        conn.execute(
            text(
                "UPDATE racks r SET nvl_domain_id = d.id FROM nvl_domains d"
                " WHERE d.name = replace(r.name, 'comps-r', 'comps-d')"
            )
        )
    engine.dispose()


async def make_schedule(url: str, name: str, first: int) -> uuid.UUID:
    """A daily power-on schedule on rack `first`, through the services (next firing a day away)."""
    db = Database(url)
    try:
        services = Services.build(db, SystemClock())
        rack = await services.inventory.get_rack_by_name(rack_name(first))
        schedule = await services.schedules.create(
            name=name,
            spec=ScheduleSpec(SpecType.INTERVAL, "24h", "UTC"),
            overlap_policy=OverlapPolicy.SKIP,
            operation=Operation(OperationKind.POWER_ON),
            queue=QueueOptions(),
            description="",
            target=TargetSpec(racks=(RackTarget(id=rack.id),)),
        )
        return schedule.id
    finally:
        await db.dispose()


def widen(url: str, schedule_id: uuid.UUID, first: int, racks_n: int) -> None:
    """The schedule's scopes: racks first..first+N-1 (the first's the services made), as its own scope row
    is. The schedules' racks do not overlap: a power-on on a rack another one's task runs on conflicts."""
    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO task_schedule_scope (id, schedule_id, rack_id, component_filter, created_at) "
                "SELECT gen_random_uuid(), :s, r.id, NULL, now() FROM racks r "
                "WHERE r.name > :first AND r.name < :end"
            ),
            {"s": schedule_id, "first": rack_name(first), "end": rack_name(first + racks_n)},
        )
    engine.dispose()


def analyze(url: str) -> None:
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()


def report(figure: str, name: str, times: list[float], target: float, **extra: object) -> None:
    p95 = percentile(times, 95)
    result(
        figure,
        read=name,
        p95_ms=p95,
        p50_ms=percentile(times, 50),
        **extra,
        target_ms=target,
        met="yes" if p95 <= target else "no",
        loadavg=load_avg(),
    )


def rpc(name: str, call: Callable[[], Any], repeat: int) -> Any:
    times, answer = timed(call, repeat)
    report("comps_rpc", name, times, TARGET_RPC_MS, kib=answer.ByteSize() // 1024)
    return answer


def page(client: httpx.Client, path: str, repeat: int, params: dict[str, str] | None = None) -> Any:
    """The page's p95 of `repeat` loads; its last answer, as JSON when it is JSON."""
    answer: list[httpx.Response] = []

    def get() -> int:
        response = client.get(path, params=params)
        response.raise_for_status()
        answer[:] = [response]
        return len(response.content)

    times, size = timed(get, repeat)
    shown = path if not params else f"{path}?" + "&".join(f"{k}={v}" for k, v in params.items())
    report("comps_page", shown, times, TARGET_PAGE_MS, kib=size // 1024)
    is_json = answer[0].headers.get("content-type", "").startswith("application/json")
    return answer[0].json() if is_json else None


def stub_of(server: ServerProcess) -> Any:
    return flow_pb2_grpc.FlowStub(grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS))


def measure_racks(server: ServerProcess, repeat: int) -> None:
    stub = stub_of(server)
    for limit in PAGES:
        first = rpc(
            f"ListRacks[limit={limit}]",
            partial(stub.ListRacks, pb.ListRacksRequest(pagination=pb.Pagination(limit=limit))),
            repeat,
        )
        nxt = pb.Pagination(limit=limit, page_token=first.next_page_token)
        rpc(
            f"ListRacks[limit={limit},next]",
            partial(stub.ListRacks, pb.ListRacksRequest(pagination=nxt)),
            repeat,
        )
    rpc("GetRack", partial(stub.GetRack, pb.GetRackRequest(name=rack_name(1))), repeat)
    with httpx.Client(base_url=server.http_url, timeout=120) as client:
        for path in ("/racks", "/racks?page=50", f"/racks/{rack_name(1)}"):
            page(client, path, repeat)


def measure_names(server: ServerProcess, repeat: int) -> None:
    """ListRacks' `name_contains` and the picker's requests, through the server."""
    stub = stub_of(server)
    for search in RACK_SEARCHES:
        request = pb.ListRacksRequest(
            name_contains=search, pagination=pb.Pagination(limit=PICKED), view=pb.RACK_VIEW_BASIC
        )
        first = rpc(f"ListRacks[name_contains={search}]", partial(stub.ListRacks, request), repeat)
        if first.next_page_token:
            request.pagination.page_token = first.next_page_token
            rpc(f"ListRacks[name_contains={search},next]", partial(stub.ListRacks, request), repeat)
    with httpx.Client(base_url=server.http_url, timeout=120) as client:
        for kind, searches in (("racks", RACK_SEARCHES), ("nvl_domains", DOMAIN_SEARCHES)):
            for search in searches:
                answer = page(client, f"/names/{kind}", repeat, {"contains": search})
                if answer and answer.get("after"):  # a release that pages the picker, and more to see
                    page(client, f"/names/{kind}", repeat, {"contains": search, "after": answer["after"]})


async def names_in_process(url: str, repeat: int) -> None:
    """The store's reads of the same searches, in process (the server stopped): ListRacks' count and page,
    the picker's name and names; milliseconds of wall time, after a warm-up."""
    db = Database(url)
    try:
        reads: list[tuple[str, Callable[[Any], Any]]] = [
            (
                f"list_racks[{search}]",
                partial(
                    inventory.list_racks,
                    nvl_domain_id=None,
                    offset=0,
                    limit=PICKED,
                    name_contains=search,
                    with_components=False,
                ),
            )
            for search in RACK_SEARCHES
        ]
        for table, searches in ((racks, RACK_SEARCHES), (nvl_domains, DOMAIN_SEARCHES)):
            reads += [
                (f"names_holding[{table.name},{search}]", partial(_names, table=table, text=search))
                for search in searches
            ]
        for name, read in reads:
            times = []
            for _ in range(repeat + 1):
                started = time.perf_counter()
                async with db.read() as conn:
                    await read(conn)
                times.append((time.perf_counter() - started) * 1000)
            times = times[1:]
            result(
                "comps_names_store",
                read=name,
                p50_ms=percentile(times, 50),
                p95_ms=percentile(times, 95),
                loadavg=load_avg(),
            )
    finally:
        await db.dispose()


async def _names(conn: Any, *, table: Any, text: str) -> list[str]:
    return await inventory.names_holding(conn, table, text, PICKED)


def fire(server: ServerProcess, url: str, schedule_id: uuid.UUID, racks_n: int) -> str:
    """Trigger the schedule: the call's time, and the time until its run's last task exists."""
    stub = stub_of(server)
    engine = sync_engine(url)
    load = load_avg()
    started = time.perf_counter()
    answer = stub.TriggerTaskSchedule(
        pb.TriggerTaskScheduleRequest(id=pb.UUID(id=str(schedule_id))), timeout=900
    )
    submitted = time.perf_counter() - started
    run_id = str(answer.run_id.id)
    count = 0
    with engine.connect() as conn:
        while True:
            count = conn.execute(
                text("SELECT count(*) FROM tasks WHERE run_id = :r"), {"r": run_id}
            ).scalar_one()
            if count >= racks_n or time.perf_counter() - started > 300:
                break
            time.sleep(0.05)
            conn.commit()
    engine.dispose()
    result(
        "comps_fire",
        racks=racks_n,
        trigger_s=submitted,
        fanout_s=time.perf_counter() - started,
        tasks=count,
        answered_task_ids=len(answer.task_ids),
        loadavg=load,
    )
    return run_id


def measure_run(server: ServerProcess, run_id: str, schedule_id: uuid.UUID, repeat: int) -> None:
    stub = stub_of(server)
    rpc(
        "GetTaskScheduleRun",
        partial(stub.GetTaskScheduleRun, pb.GetTaskScheduleRunRequest(id=pb.UUID(id=run_id))),
        repeat,
    )
    sched = pb.UUID(id=str(schedule_id))
    for limit in PAGES:
        pagination = pb.Pagination(limit=limit)
        first = rpc(
            f"ListTasks[limit={limit}]",
            partial(stub.ListTasks, pb.ListTasksRequest(pagination=pagination)),
            repeat,
        )
        nxt = pb.Pagination(limit=limit, page_token=first.next_page_token)
        rpc(
            f"ListTasks[limit={limit},next]",
            partial(stub.ListTasks, pb.ListTasksRequest(pagination=nxt)),
            repeat,
        )
        rpc(
            f"ListTasks[schedule,limit={limit}]",
            partial(stub.ListTasks, pb.ListTasksRequest(schedule_id=sched, pagination=pagination)),
            repeat,
        )
    page_of = stub.ListTasks(pb.ListTasksRequest(schedule_id=sched, pagination=pb.Pagination(limit=1000)))
    ids = [t.id for t in page_of.tasks]
    rpc(
        f"GetTasksByIDs[{len(ids)}]",
        partial(stub.GetTasksByIDs, pb.GetTasksByIDsRequest(task_ids=ids)),
        repeat,
    )
    with httpx.Client(base_url=server.http_url, timeout=120) as client:
        for path in (f"/runs/{run_id}", f"/runs/{run_id}?page=50", "/tasks", f"/tasks/{ids[0].id}"):
            page(client, path, repeat)


def cli(server: ServerProcess, name: str, args: list[str], repeat: int) -> None:
    command = [sys.executable, "-m", "rackflow", "--server", server.address, *args]

    def run() -> int:
        done = subprocess.run(command, check=True, capture_output=True)
        return len(done.stdout)

    times, size = timed(run, repeat)
    result(
        "comps_cli",
        command=name,
        p50_ms=percentile(times, 50),
        max_ms=max(times),
        kib=size // 1024,
        loadavg=load_avg(),
    )


async def cpu_of_reads(url: str, run_id: str, rounds: int) -> None:
    """The CPU (process time, which a busy machine changes little, where it doubles wall times) this process
    spends, in process, reading a page of 1,000 racks through the service and converting it to its answer,
    then 1,000 of the fired tasks (by GetTasksByIDs's read) likewise: the median of `rounds` after a
    warm-up, the server stopped. Then (`comps_cpu_rpc`) the CPU of the RPCs' own handlers, called in
    process as the server calls them, each answer serialized: ListRacks and ListTasks of 1,000, GetTasksByIDs
    of those 1,000 tasks and GetTaskScheduleRun of the big run, which converts as the server does (the
    figures above convert each message apart, as `rack_to` and `task_to` do)."""
    db = Database(url)
    try:
        services = Services.build(db, SystemClock())
        rack_read, rack_convert, task_read, task_convert = [], [], [], []
        async with db.read() as conn:
            found = await conn.execute(text("SELECT id FROM tasks ORDER BY id LIMIT 1000"))
            task_ids = [row.id for row in found]
        for _ in range(rounds + 1):
            started = time.process_time()
            page, _total = await services.inventory.list_racks(limit=1000)
            read = time.process_time()
            pb.ListRacksResponse(racks=[rack_to(r) for r in page]).SerializeToString()
            converted = time.process_time()
            tasks = await services.tasks.get_tasks(task_ids)
            tasks_read = time.process_time()
            pb.GetTasksByIDsResponse(tasks=[task_to(t) for t in tasks]).SerializeToString()
            rack_read.append(read - started)
            rack_convert.append(converted - read)
            task_read.append(tasks_read - converted)
            task_convert.append(time.process_time() - tasks_read)
        result(
            "comps_cpu",
            racks_1000_read_ms=statistics.median(rack_read[1:]) * 1000,
            racks_1000_convert_ms=statistics.median(rack_convert[1:]) * 1000,
            tasks=len(task_ids),
            tasks_read_ms=statistics.median(task_read[1:]) * 1000,
            tasks_convert_ms=statistics.median(task_convert[1:]) * 1000,
            loadavg=load_avg(),
        )
        servicer = FlowServicer(services)
        big = pb.Pagination(limit=1000)
        requests: dict[str, Callable[[], Any]] = {
            "ListRacks[limit=1000]": partial(servicer.ListRacks, pb.ListRacksRequest(pagination=big), None),
            "ListTasks[limit=1000]": partial(servicer.ListTasks, pb.ListTasksRequest(pagination=big), None),
            "GetTasksByIDs[1000]": partial(
                servicer.GetTasksByIDs,
                pb.GetTasksByIDsRequest(task_ids=[pb.UUID(id=str(i)) for i in task_ids]),
                None,
            ),
            "GetTaskScheduleRun": partial(
                servicer.GetTaskScheduleRun, pb.GetTaskScheduleRunRequest(id=pb.UUID(id=run_id)), None
            ),
        }
        for name, call in requests.items():
            spent = []
            for _ in range(rounds + 1):
                started = time.process_time()
                (await call()).SerializeToString()
                spent.append(time.process_time() - started)
            result("comps_cpu_rpc", rpc=name, cpu_ms=statistics.median(spent[1:]) * 1000, loadavg=load_avg())
    finally:
        await db.dispose()


def names(url: str, args: argparse.Namespace) -> None:
    """`--names`: the racks loaded, a domain each (unless `--reuse`), then the name searches measured."""
    if not args.reuse:
        started = time.perf_counter()
        load_domains(url)
        analyze(url)
        result("comps_load", seconds=time.perf_counter() - started, racks=args.racks, loadavg=load_avg())
    with tempfile.TemporaryDirectory() as log_dir:
        server = start_server(url, Path(log_dir), args=["--http-listen", "127.0.0.1:0", "--no-dispatcher"])
        try:
            measure_names(server, args.repeat)
        finally:
            server.stop()
    asyncio.run(names_in_process(url, args.repeat))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-admin", default=DEFAULT_ADMIN, help="PostgreSQL server to make the database on")
    parser.add_argument("--racks", type=int, default=20_000)
    parser.add_argument("--components", type=int, default=36, help="components a rack")
    parser.add_argument("--small", type=int, default=1_000, help="racks of the small schedule")
    parser.add_argument("--big", type=int, default=10_000, help="racks of the big schedule")
    parser.add_argument("--repeat", type=int, default=10, help="calls per read (p95 of them)")
    parser.add_argument("--cli-repeat", type=int, default=3)
    parser.add_argument("--cpu-rounds", type=int, default=5, help="rounds of the in-process CPU figure")
    parser.add_argument("--sim-step", default="600", help="simulator step seconds of the server")
    parser.add_argument("--keep", action="store_true", help="keep the database (named in the output)")
    parser.add_argument("--names", action="store_true", help="measure the name searches alone")
    parser.add_argument("--database", default="", help="the scratch database's name (rackflow_comps_PID)")
    parser.add_argument(
        "--reuse", action="store_true", help="--names on the racks a run with --keep left in --database"
    )
    args = parser.parse_args()
    if args.reuse and not (args.names and args.database):
        parser.error("--reuse measures --names again in a --database a run kept")
    name = args.database or f"rackflow_comps_{os.getpid()}"
    print(
        f"# racks={args.racks} components={args.components} small={args.small} big={args.big} database={name}"
    )
    print(code_line())
    print(machine_line())
    if args.reuse:
        url = make_url(args.pg_admin).set(database=name).render_as_string(hide_password=False)
    else:
        url = make_database(args.pg_admin, name)
    try:
        started = time.perf_counter()
        if not args.reuse:
            load_racks(url, args.racks, args.components)
        if args.names:
            names(url, args)
            return
        small = asyncio.run(make_schedule(url, "comps-small", 0))
        big = asyncio.run(make_schedule(url, "comps-big", args.small))
        widen(url, small, 0, args.small)
        widen(url, big, args.small, args.big)
        analyze(url)
        result(
            "comps_load",
            seconds=time.perf_counter() - started,
            components=args.racks * args.components,
            loadavg=load_avg(),
        )
        with tempfile.TemporaryDirectory() as log_dir:
            server = start_server(
                url,
                Path(log_dir),
                args=["--http-listen", "127.0.0.1:0", "--no-dispatcher"],
                env={"RACKFLOW_SIM_STEP_SECONDS": args.sim_step},
            )
            try:
                measure_racks(server, args.repeat)
                fire(server, url, small, args.small)
                run_id = fire(server, url, big, args.big)
                analyze(url)
                measure_run(server, run_id, big, args.repeat)
                cli(server, "run show", ["run", "show", run_id], args.cli_repeat)
                cli(server, "task list", ["task", "list"], args.cli_repeat)
                cli(
                    server,
                    "task list --schedule big --limit 1000",
                    ["task", "list", "--schedule", "comps-big", "--limit", "1000"],
                    args.cli_repeat,
                )
            finally:
                server.stop()
        asyncio.run(cpu_of_reads(url, run_id, args.cpu_rounds))
    finally:
        if args.keep:
            print(f"# kept {url}")
        else:
            drop_database(args.pg_admin, name)


if __name__ == "__main__":
    main()
