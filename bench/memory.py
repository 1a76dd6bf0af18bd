"""memory: resident memory of `rackflow serve` with 100,000 schedules loaded and the dispatcher idle.

First a server on the empty (migrated) database, for the base figure; then `--schedules` daily cron
schedules (each with its rack, component and scope row) are bulk-loaded, none due for a day, and a fresh
server runs `--settle` seconds (the dispatcher polls every 10 s, the executor every 0.5 s) before its VmRSS
is read from /proc. Finally one client lists every schedule in one ListTaskSchedules call (limit 0, no
paging), the worst a single request can ask of the server, and VmRSS/VmHWM are read again: the peak
(VmHWM) has a target of 200 MiB too, which the list meets by streaming rows a chunk at a time.

    python bench/memory.py --db postgres --schedules 100000
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

import grpc
from _common import (
    ServerProcess,
    add_db_arguments,
    bulk_load,
    code_line,
    fresh_database,
    machine_line,
    result,
    rss_kib,
    servers,
)

from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc

TARGET_MIB = 200
LIST_TIMEOUT_S = 300


def rss_mib(server: ServerProcess, field: str = "VmRSS") -> float:
    return rss_kib(server.proc.pid, field) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--schedules", type=int, default=100_000)
    parser.add_argument("--settle", type=float, default=25.0, help="seconds the idle server runs first")
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(f"# memory db={args.db} schedules={args.schedules} settle_s={args.settle} load=bulk-executemany")
    with fresh_database(args.db, args.pg_admin) as ws:
        with servers(ws.url, ws.log_dir, 1) as (server,):
            time.sleep(args.settle)
            result("memory", db=args.db, schedules=0, state="idle", rss_mib=rss_mib(server))

        later = datetime.now(UTC) + timedelta(days=1)
        spec = ScheduleSpec(SpecType.CRON, "0 3 * * *", "UTC")
        bulk_load(ws.url, args.schedules, spec=spec, next_run_at=lambda _: later)
        with servers(ws.url, ws.log_dir, 1) as (server,):
            time.sleep(args.settle)
            idle = rss_mib(server)
            result(
                "memory",
                db=args.db,
                schedules=args.schedules,
                state="idle",
                rss_mib=idle,
                target_mib=TARGET_MIB,
                met="yes" if idle <= TARGET_MIB else "no",
            )
            options = [("grpc.max_receive_message_length", 256 * 1024 * 1024)]
            with grpc.insecure_channel(server.address, options=options) as channel:
                started = time.perf_counter()
                listed = flow_pb2_grpc.FlowStub(channel).ListTaskSchedules(
                    pb.ListTaskSchedulesRequest(), timeout=LIST_TIMEOUT_S
                )
                took = time.perf_counter() - started
            peak = rss_mib(server, "VmHWM")
            result(
                "memory",
                db=args.db,
                schedules=args.schedules,
                state="after-list-all",
                listed=len(listed.task_schedules),
                list_s=took,
                rss_mib=rss_mib(server),
                peak_mib=peak,
                target_peak_mib=TARGET_MIB,
                met="yes" if peak <= TARGET_MIB else "no",
            )
    print(machine_line(), flush=True)


if __name__ == "__main__":
    main()
