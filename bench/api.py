"""api: GetTaskSchedule and CreateTaskSchedule throughput and latency, against the gRPC echo ceiling.

One `rackflow serve` (dispatcher on, nothing due) on a fresh database with `--schedules` bulk-loaded
schedules (each on a rack of its own). One client process runs `--clients` asyncio workers, each with its
own channel, calling one RPC back to back for `--seconds` (after a one-second warm-up):

* echo: the standard gRPC health `Check`, served by the same server, process and event loop, with no
  interceptor and no database: the ceiling of gRPC in Python on this machine, with this client;
* GetTaskSchedule on a random loaded schedule (one read transaction);
* CreateTaskSchedule of a new daily cron schedule on a loaded rack (validation, one write transaction,
  and the audit interceptor's before/after snapshots and audit row).

The client shares the machine's cores with the server, so the echo figure is the ceiling of this pair.
PostgreSQL shares them too: each phase prints its CPU per call (all of the machine's PostgreSQL processes,
so only on a quiet machine is it the server's queries alone) beside the server's and the client's, and for
GetTaskSchedule how many calls each query answered (`rackflow_keyed_read_*`, store/keyed_reads.py).

    python bench/api.py --db postgres --clients 16 --seconds 10 --rounds 3

With `--rounds` > 1 echo and Get alternate, and the ratio is the median of each round's: on a shared
machine the load moves between phases, and adjacent phases see about the same. Each phase also prints the
server's CPU per call, which the client's and other processes' share of the cores moves far less.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
from _common import (
    ServerProcess,
    add_db_arguments,
    bulk_load,
    code_line,
    cpu_seconds,
    fresh_database,
    machine_line,
    median,
    percentile,
    py_spy,
    result,
    servers,
    stat_cpu_seconds,
    sync_engine,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import select

from rackflow.store.tables import task_schedule
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.e2e.cluster import free_port

WARMUP_SECONDS = 1.0
# Given a worker's channel, the function that makes its n-th call. The stub is built once per worker, as a
# client would: a FlowStub has dozens of methods, and building one per call cost the client 36 µs.
Call = Callable[[grpc.aio.Channel], Callable[[int], Awaitable[object]]]


@dataclass(frozen=True)
class Phase:
    rpc: str
    calls: int
    errors: int
    seconds: float
    latencies: list[float]

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds


async def run_phase(address: str, rpc: str, call: Call, clients: int, seconds: float) -> Phase:
    """`clients` workers call `call` back to back; only calls that start after the warm-up count."""
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    measure_from = start + WARMUP_SECONDS
    stop_at = measure_from + seconds

    async def worker(worker_id: int) -> None:
        nonlocal errors
        async with grpc.aio.insecure_channel(address) as channel:
            call_once = call(channel)
            for k in itertools.count():
                began = time.perf_counter()
                if began >= stop_at:
                    return
                try:
                    await call_once(worker_id * 1_000_000 + k)
                except grpc.aio.AioRpcError:
                    errors += 1
                    continue
                if began >= measure_from:
                    latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(worker(i) for i in range(clients)))
    return Phase(rpc, len(latencies), errors, seconds, latencies)


def echo() -> Call:
    request = health_pb2.HealthCheckRequest(service="")

    def on(channel: grpc.aio.Channel) -> Callable[[int], Awaitable[object]]:
        stub = health_pb2_grpc.HealthStub(channel)
        return lambda _n: stub.Check(request)

    return on


def get_schedule(ids: list[str]) -> Call:
    def on(channel: grpc.aio.Channel) -> Callable[[int], Awaitable[object]]:
        stub = flow_pb2_grpc.FlowStub(channel)
        return lambda _n: stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=pb.UUID(id=random.choice(ids))))

    return on


def create_schedule(rack_names: list[str], run_tag: str) -> Call:
    def on(channel: grpc.aio.Channel) -> Callable[[int], Awaitable[object]]:
        stub = flow_pb2_grpc.FlowStub(channel)
        return lambda n: stub.CreateTaskSchedule(request(n))

    def request(n: int) -> pb.CreateTaskScheduleRequest:
        target = pb.OperationTargetSpec(
            racks=pb.RackTargets(targets=[pb.RackTarget(name=random.choice(rack_names))])
        )
        return pb.CreateTaskScheduleRequest(
            schedule=pb.ScheduleConfig(
                name=f"api-{run_tag}-{n}",
                spec=pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="30 3 * * *", timezone="UTC"),
            ),
            operation=pb.ScheduledOperation(power_on=pb.PowerOnRackRequest(target_spec=target)),
        )

    return on


def postgres_cpu() -> dict[int, float]:
    """CPU seconds (user plus system) each of this machine's PostgreSQL processes has used so far."""
    used: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # the process ended
            continue
        if "(postgres)" in text:
            used[int(stat.parent.name)] = stat_cpu_seconds(text)
    return used


def postgres_cpu_since(before: dict[int, float]) -> float:
    """PostgreSQL's CPU since `before` (a backend that ended in between is not counted; a new one is)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in postgres_cpu().items())


def keyed_reads(metrics_url: str) -> tuple[float, float]:
    """(rounds, callers) of the server's keyed reads so far, from its /metrics."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    values = dict(line.split(" ", 1) for line in text.splitlines() if line.startswith("rackflow_keyed_read_"))
    # A revision from before the keyed reads' metrics has neither: its phases print "-".
    return (
        float(values.get("rackflow_keyed_read_rounds_total", 0)),
        float(values.get("rackflow_keyed_read_callers_total", 0)),
    )


async def run_all(
    server: ServerProcess,
    metrics_url: str,
    ids: list[str],
    rack_names: list[str],
    clients: int,
    seconds: float,
    rounds: int,
    profile_dir: Path | None,
) -> None:
    """`rounds` alternations of echo and Get (each ratio from adjacent phases, so a load change on a
    shared machine moves both), then Create once."""
    plan = [("Health.Check", echo()), ("GetTaskSchedule", get_schedule(ids))] * rounds
    plan.append(("CreateTaskSchedule", create_schedule(rack_names, uuid.uuid4().hex[:6])))
    phases: list[Phase] = []
    for k, (rpc, call) in enumerate(plan):
        profile = profile_dir / f"{rpc}.raw" if profile_dir and k in (0, 1, len(plan) - 1) else None
        cpu_before, client_before = cpu_seconds(server.proc.pid), time.process_time()
        postgres_before, reads_before = postgres_cpu(), keyed_reads(metrics_url)
        with py_spy(server.proc.pid, profile):
            phase = await run_phase(server.address, rpc, call, clients, seconds)
        cpu = cpu_seconds(server.proc.pid) - cpu_before
        client_cpu = time.process_time() - client_before
        database_cpu = postgres_cpu_since(postgres_before)
        reads_after = keyed_reads(metrics_url)
        rounds, callers = reads_after[0] - reads_before[0], reads_after[1] - reads_before[1]
        phases.append(phase)
        result(
            "api",
            rpc=phase.rpc,
            clients=clients,
            seconds=seconds,
            calls=phase.calls,
            errors=phase.errors,
            per_s=phase.per_s,
            p50_ms=percentile(phase.latencies, 50) * 1000,
            p99_ms=percentile(phase.latencies, 99) * 1000,
            # the whole phase's server CPU (warm-up included) over the calls measured: compare, not sum
            server_cpu_us_per_call=cpu / max(phase.calls, 1) * 1e6,
            client_cpu_us_per_call=client_cpu / max(phase.calls, 1) * 1e6,
            postgres_cpu_us_per_call=database_cpu / max(phase.calls, 1) * 1e6,
            calls_per_query=f"{callers / rounds:.2f}" if rounds else "-",
        )
    ratios = [get.per_s / echo.per_s for echo, get in zip(phases[0:-1:2], phases[1:-1:2], strict=True)]
    ratio = median(ratios)
    create_rate = phases[-1].per_s
    result(
        "api_ratio",
        get_over_echo=ratio,
        rounds=" ".join(f"{r:.2f}" for r in ratios),
        get_met="yes" if ratio >= 0.5 else "no",
        create_per_s=create_rate,
        create_met="yes" if create_rate >= 300 else "no",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per RPC")
    parser.add_argument(
        "--rounds", type=int, default=1, help="echo/Get alternations; the ratio is their median"
    )
    parser.add_argument("--schedules", type=int, default=10_000, help="schedules (and racks) loaded first")
    parser.add_argument("--profile", type=Path, help="py-spy the server into DIR/<rpc>.raw, one file per RPC")
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(
        f"# api db={args.db} clients={args.clients} seconds={args.seconds} schedules={args.schedules} "
        "load=bulk-executemany",
        flush=True,
    )
    with fresh_database(args.db, args.pg_admin) as ws:
        later = datetime.now(UTC) + timedelta(days=1)
        spec = ScheduleSpec(SpecType.CRON, "0 3 * * *", "UTC")
        bulk_load(ws.url, args.schedules, spec=spec, next_run_at=lambda _: later)
        engine = sync_engine(ws.url)
        with engine.connect() as conn:
            ids = [str(i) for i in conn.execute(select(task_schedule.c.id)).scalars()]
            names = list(
                conn.execute(select(task_schedule.c.name)).scalars()
            )  # rack i shares schedule i's name
        engine.dispose()
        metrics_port = free_port()
        metrics_args = ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
        with servers(ws.url, ws.log_dir, 1, args=metrics_args) as (server,):
            metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
            asyncio.run(
                run_all(
                    server, metrics_url, ids, names, args.clients, args.seconds, args.rounds, args.profile
                )
            )


if __name__ == "__main__":
    main()
