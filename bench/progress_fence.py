"""progress_fence: what a batch's fence costs a journal round, as the progress message's UPDATE it was
(`task_runs.record_progress`: a HOT update of the task's row) and as the lock it is now (`task_runs.fence`:
`SELECT … FOR NO KEY UPDATE`, the lock that UPDATE takes, nothing written).

In process, on a fresh PostgreSQL database: `--tasks` power-on tasks RUNNING under one owner, each over a
rack of `--components` components (NVL72's mix; the task names them all, so its row is about 1.75 KB at
36). Each round is one transaction, as a journal round is, that fences `--batch` of the tasks in turn, one
way or the other (the UPDATE writes each a new message). The ways alternate in blocks of `--rounds` rounds,
`--blocks` times each. Per fence: the CPU of the database's backends (utime + stime from /proc) and of this
process (the store's statements, SQLAlchemy and the driver), and the database's WAL (its records and their
commits, read back with `pg_walinspect`, PostgreSQL 15's contrib, so the server must keep the WAL of a
block), with and without the full-page images that the first write of a page after a checkpoint carries
(either way: another session's checkpoint falls where it falls).

    python bench/progress_fence.py --pg-admin postgresql://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import UTC, datetime

from _common import (
    NVL72_MIX,
    DatabaseCpu,
    add_db_arguments,
    code_line,
    fresh_database,
    machine_line,
    result,
    sync_engine,
)
from _pg_io import wal_position
from sqlalchemy import Engine, text

from rackflow.clock import SystemClock
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackSelection
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.inventory.service import InventoryService
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.tasks.manager import TaskManager

OWNER = uuid.uuid4()
WAYS = ("update", "lock")
# The database's WAL between two flushed positions: its relations' records, with the other records
# (commits) of their transactions, and the full-page images among them.
DATABASE_WAL = text(
    "WITH records AS (SELECT xid, record_length, fpi_length, "
    "coalesce((regexp_match(block_ref, 'rel \\d+/(\\d+)/'))[1]::oid, 0) AS database "
    "FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn))), "
    "ours AS (SELECT DISTINCT xid FROM records WHERE database = :oid AND xid <> 0) "
    "SELECT coalesce(sum(record_length), 0), coalesce(sum(fpi_length), 0) FROM records "
    "WHERE database = :oid OR xid IN (SELECT xid FROM ours)"
)


async def load(db: Database, tasks: int, components: int) -> list[uuid.UUID]:
    """The running tasks, each over a rack of its own."""
    clock = SystemClock()
    inventory, manager = InventoryService(db, clock), TaskManager(db, clock)
    kinds = [NVL72_MIX[k % len(NVL72_MIX)] for k in range(components)]
    specs = [ComponentSpec(ComponentType[kind], f"{kind.lower()}-{k}") for k, kind in enumerate(kinds)]
    ids = []
    for r in range(tasks):
        rack = await inventory.create_rack(f"r{r}", components=specs)
        [task] = await manager.submit(
            Operation(OperationKind.POWER_ON), [RackSelection(rack.id)], description="", queue=QueueOptions()
        )
        ids.append(task.id)
    async with db.transaction() as conn:
        for task_id in ids:
            await task_runs.mark_running(conn, task_id, owner_id=OWNER, now=datetime.now(UTC))
    return ids


async def fence_rounds(
    db: Database, ids: list[uuid.UUID], way: str, rounds: int, batch: int, components: int
) -> None:
    for r in range(rounds):
        chunk = [ids[(r * batch + k) % len(ids)] for k in range(batch)]
        async with db.transaction() as conn:
            if way == "update":
                step = r % components + 1
                messages = {i: f"powering on {step}/{components}: compute-{step}" for i in chunk}
                held = await task_runs.record_progress(conn, messages, owner_id=OWNER, now=datetime.now(UTC))
            else:
                held = await task_runs.fence(conn, chunk, owner_id=OWNER)
        assert held == set(chunk)


async def measure(
    db: Database, engine: Engine, oid: int, ids: list[uuid.UUID], way: str, args: argparse.Namespace
) -> dict[str, float]:
    """One block of rounds fenced `way`, per fence (the sync engine's few reads around it count too)."""
    cpu = DatabaseCpu()
    with engine.connect() as conn:
        cpu.sample(conn)
        start = wal_position(conn)
    assert start is not None, "this PostgreSQL has no pg_walinspect (PostgreSQL 15's contrib) for its WAL"
    began = time.process_time()
    await fence_rounds(db, ids, way, args.rounds, args.batch, args.components)
    ours = time.process_time() - began
    with engine.connect() as conn:
        cpu.sample(conn)
        end = wal_position(conn)
        wal, fpi = conn.execute(DATABASE_WAL, {"start": start, "end": end, "oid": oid}).one()
    fences = args.rounds * args.batch
    return {
        "postgres_cpu_us": cpu.seconds / fences * 1e6,
        "rackflow_cpu_us": ours / fences * 1e6,
        "wal_bytes": int(wal) / fences,
        "wal_bytes_without_fpi": (int(wal) - int(fpi)) / fences,
    }


async def run(args: argparse.Namespace) -> None:
    with fresh_database("postgres", args.pg_admin) as ws:
        db = Database(ws.url)
        engine = sync_engine(ws.url)
        try:
            ids = await load(db, args.tasks, args.components)
            with engine.connect() as conn:
                oid = int(
                    conn.execute(
                        text("SELECT oid FROM pg_database WHERE datname = current_database()")
                    ).scalar_one()
                )
            await fence_rounds(db, ids, "update", args.rounds // 10, args.batch, args.components)  # warm up
            by_way: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
            for block in range(args.blocks):
                for way in WAYS:
                    figures = await measure(db, engine, oid, ids, way, args)
                    by_way[way].append(figures)
                    load_1m = round(os.getloadavg()[0], 2)
                    result("progress_fence_block", way=way, block=block + 1, **figures, loadavg=load_1m)
            for way, blocks in by_way.items():
                medians = {key: statistics.median(b[key] for b in blocks) for key in blocks[0]}
                result("progress_fence", way=way, blocks=len(blocks), **medians)
        finally:
            await db.dispose()
            engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser, kinds=("postgres",))
    parser.add_argument("--tasks", type=int, default=32, help="tasks running (an executor's default)")
    parser.add_argument("--components", type=int, default=36, help="components a rack, each task's")
    parser.add_argument("--batch", type=int, default=16, help="fences a round")
    parser.add_argument("--rounds", type=int, default=1000, help="rounds a block")
    parser.add_argument("--blocks", type=int, default=3, help="blocks of each way, alternated")
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    sizes = f"tasks={args.tasks} components={args.components} batch={args.batch} rounds={args.rounds}"
    print(f"# progress_fence {sizes} blocks={args.blocks}", flush=True)
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
