"""nvl_domains: ListNVLDomains at a fleet's size — every NVLink domain in one answer, and its pages.

A fleet of GB200 NVL72 racks has an NVLink domain a rack. This loads `--racks` racks, each in a domain of
its own (`comps-d<n>` for rack `comps-r<n>`), and nothing else:

* PostgreSQL (`--db postgres`, the default): a scratch database `rackflow_nvl_<pid>` made on `--pg-admin`
  and migrated with `rackflow db migrate`, loaded by SQL (`INSERT … SELECT … FROM generate_series`:
  `rack_components.load_racks` and `load_domains`), then VACUUM ANALYZE; dropped at the end unless
  `--keep`;
* SQLite (`--db sqlite`): a migrated file in a temporary directory, the same rows inserted by SQLAlchemy
  Core (executemany), the ids as SQLAlchemy stores them.

Then, with one `rackflow serve` (no dispatcher), over gRPC on loopback: the request of no fields (every
domain, as SPEC.md's `{}` asks) and the keyset pages of 1,000 (first and next): p50 and p95 of `--repeat`
calls after a warm-up, the server's CPU a call (`server_cpu_ms`, from /proc), the answer's KiB (issue 29's
target: 100 ms p95 an RPC). The whole list twice: as the server keeps it while nothing changed (migration
0059), and read anew, a change to the list (rack 0 put in its own domain again, untimed) before each call.

Then, the server stopped, in this process, with the server's collector settings (`server.tune_gc`): the
CPU (process time, which a busy machine changes less than wall time) of the unpaged answer, by part:
the service's read (`InventoryService.list_domains`), the whole handler (`FlowServicer.ListNVLDomains`,
as the server calls it), each after a change and again as kept, and serializing its answer; the median of
`--cpu-rounds` after a warm-up. The handler less the read is what making the response costs. Run it with
PYTHONPATH at another checkout's `src` to measure that one (the `# code` line names it).

    python bench/nvl_domains.py --racks 20000 --repeat 20
    python bench/nvl_domains.py --db sqlite --racks 20000 --repeat 20
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
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from _common import (
    ServerProcess,
    code_line,
    cpu_seconds,
    machine_line,
    percentile,
    result,
    start_server,
    sync_engine,
)
from rack_components import (
    CHANNEL_OPTIONS,
    DEFAULT_ADMIN,
    TARGET_RPC_MS,
    analyze,
    drop_database,
    load_domains,
    load_racks,
    make_database,
)
from sqlalchemy import insert, update

from rackflow.api.servicer import FlowServicer
from rackflow.clock import SystemClock
from rackflow.ids import new_id
from rackflow.server import tune_gc
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.store.tables import nvl_domains, racks
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc

PAGE = 1000  # a client's largest page (MAX_PAGE_SIZE), as `rackflow domain list` reads them


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def load_sqlite(url: str, racks_n: int) -> None:
    """The same fleet as `load_racks` and `load_domains` make on PostgreSQL, on SQLite: racks and domains
    0..R-1 made one a millisecond a day ago, rack n in domain n."""
    start = datetime.now(UTC) - timedelta(days=1)
    domain_rows, rack_rows = [], []
    for n in range(racks_n):
        at = start + timedelta(milliseconds=n)
        domain_id = new_id()
        domain_rows.append({"id": domain_id, "name": f"comps-d{n:06d}", "created_at": at})
        name = f"comps-r{n:06d}"
        rack_rows.append(
            {"id": new_id(), "name": name, "external_id": name, "nvl_domain_id": domain_id, "created_at": at}
        )
    engine = sync_engine(url)
    with engine.begin() as conn:
        conn.execute(insert(nvl_domains), domain_rows)
        conn.execute(insert(racks), rack_rows)
    engine.dispose()


class Changer:
    """A change to the domain list that leaves it as it was (rack 0 put in its own domain again), which
    replaces the token of migration 0059 all the same: the next whole list is read anew, as after a rack
    joined or left a domain."""

    def __init__(self, url: str) -> None:
        self.engine = sync_engine(url)

    def change(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(racks)
                .where(racks.c.name == "comps-r000000")
                .values(nvl_domain_id=racks.c.nvl_domain_id)
            )


def measure_rpc(server: ServerProcess, repeat: int, changer: Changer) -> None:
    """Each read's calls timed (and the server's CPU they took: `server_cpu_ms`, a call's share). The whole
    list twice: as the server keeps it (no change between calls), and read anew after a change before each
    call (the change untimed, made on a connection of this process: none of the server's CPU)."""
    stub = flow_pb2_grpc.FlowStub(grpc.insecure_channel(server.address, options=CHANNEL_OPTIONS))
    first = pb.ListNVLDomainsRequest(pagination=pb.Pagination(limit=PAGE))
    token = stub.ListNVLDomains(first).next_page_token
    every_domain = partial(stub.ListNVLDomains, pb.ListNVLDomainsRequest())
    next_page = pb.ListNVLDomainsRequest(pagination=pb.Pagination(limit=PAGE, page_token=token))
    reads: list[tuple[str, Callable[[], Any], Callable[[], None] | None]] = [
        ("ListNVLDomains[unpaged]", every_domain, None),
        ("ListNVLDomains[unpaged,after a change]", every_domain, changer.change),
        (f"ListNVLDomains[limit={PAGE}]", partial(stub.ListNVLDomains, first), None),
        (f"ListNVLDomains[limit={PAGE},next]", partial(stub.ListNVLDomains, next_page), None),
    ]
    for name, call, change in reads:
        load = load_avg()
        call()  # a first call (statements compiled, the list kept) outside the times and CPU counted
        cpu = cpu_seconds(server.proc.pid)
        times = []
        for _ in range(repeat):
            if change is not None:
                change()
            started = time.perf_counter()
            answer = call()
            times.append((time.perf_counter() - started) * 1000)
        server_cpu_ms = (cpu_seconds(server.proc.pid) - cpu) * 1000 / repeat
        p95 = percentile(times, 95)
        result(
            "nvl_rpc",
            read=name,
            p50_ms=percentile(times, 50),
            p95_ms=p95,
            server_cpu_ms=server_cpu_ms,
            domains=len(answer.domains),
            kib=answer.ByteSize() // 1024,
            target_ms=TARGET_RPC_MS,
            met="yes" if p95 <= TARGET_RPC_MS else "no",
            loadavg=load,
        )


async def cpu_in_process(url: str, rounds: int, changer: Changer) -> None:
    """The unpaged answer's CPU in this process, by part (the module's docstring): each read anew after a
    change, and as kept (`kept_read_ms`, `kept_handler_ms`: no change since the last)."""
    tune_gc()
    db = Database(url)
    try:
        services = Services.build(db, SystemClock())
        servicer = FlowServicer(services)
        request = pb.ListNVLDomainsRequest()
        parts: dict[str, list[float]] = {}
        size = 0
        load = load_avg()

        def took(part: str, started: float) -> None:
            parts.setdefault(part, []).append(time.process_time() - started)

        for _ in range(rounds + 1):
            for kept in ("", "kept_"):
                if not kept:
                    changer.change()
                started = time.process_time()
                await services.inventory.list_domains()
                took(f"{kept}read", started)
            for kept in ("", "kept_"):
                if not kept:
                    changer.change()
                started = time.process_time()
                answer = await servicer.ListNVLDomains(request, None)  # type: ignore[arg-type]
                took(f"{kept}handler", started)
            started = time.process_time()
            size = len(answer.SerializeToString())
            took("serialize", started)
        ms = {part: statistics.median(times[1:]) * 1000 for part, times in parts.items()}
        result(
            "nvl_cpu",
            read_ms=ms["read"],
            handler_ms=ms["handler"],
            response_ms=ms["handler"] - ms["read"],
            serialize_ms=ms["serialize"],
            kept_read_ms=ms["kept_read"],
            kept_handler_ms=ms["kept_handler"],
            kib=size // 1024,
            loadavg=load,
        )
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--pg-admin", default=DEFAULT_ADMIN, help="PostgreSQL server to make the database on")
    parser.add_argument("--racks", type=int, default=20_000, help="racks, each in a domain of its own")
    parser.add_argument("--repeat", type=int, default=20, help="calls per read, after a warm-up")
    parser.add_argument("--cpu-rounds", type=int, default=10, help="rounds of the in-process CPU figure")
    parser.add_argument("--keep", action="store_true", help="keep the database made on PostgreSQL")
    args = parser.parse_args()
    name = f"rackflow_nvl_{os.getpid()}"
    print(f"# db={args.db} racks={args.racks} domains={args.racks} repeat={args.repeat}")
    print(code_line())
    print(machine_line())
    with tempfile.TemporaryDirectory(prefix="rackflow-nvl-") as tmp:
        started = time.perf_counter()
        if args.db == "postgres":
            print(f"# database={name}")
            url = make_database(args.pg_admin, name)
        else:
            url = f"sqlite:///{Path(tmp) / 'nvl.db'}"
            subprocess.run([sys.executable, "-m", "rackflow", "db", "migrate", "--db", url], check=True)
        try:
            if args.db == "postgres":
                load_racks(url, args.racks, 0)
                load_domains(url)
                analyze(url)
            else:
                load_sqlite(url, args.racks)
            result("nvl_load", seconds=time.perf_counter() - started, racks=args.racks, loadavg=load_avg())
            changer = Changer(url)
            server = start_server(url, Path(tmp), args=["--no-dispatcher"])
            try:
                measure_rpc(server, args.repeat, changer)
            finally:
                server.stop()
            asyncio.run(cpu_in_process(url, args.cpu_rounds, changer))
            changer.engine.dispose()
        finally:
            if args.db == "postgres":
                if args.keep:
                    print(f"# kept {url}")
                else:
                    drop_database(args.pg_admin, name)


if __name__ == "__main__":
    main()
