"""run_reads: what a year of the runs' weekly partitions costs the reads of a schedule's runs, in process.

A fresh database (`--db`, PostgreSQL by default) with `--schedules` daily schedules of one rack each,
`--history` completed runs each (one a day, named by its slot as rackflow names a dispatched run), the
runs' partitions as `--run-weeks` weeks after migration 0046 (the history in them), each schedule's
`run_count` and `runs_since` as its firings keep them; then, `--repeat` times each after two, the reads
a schedule's pages make through the store (`store.runs`): a page of 20 of its runs (`list_runs`,
the capped count included), the runs grid's 50 columns (`run_heads`), and the schedule list's strips of
12 runs for a page of 50 schedules (`recent_runs`). Prints each read's median and p90 in milliseconds.

    python bench/run_reads.py --run-weeks 52
    PYTHONPATH=/tmp/base/src python bench/run_reads.py --run-weeks 52   # another checkout's code
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from _common import (
    add_db_arguments,
    bulk_load,
    code_line,
    fresh_database,
    machine_line,
    median,
    percentile,
    result,
    sync_engine,
)
from dispatch_drain import add_run_weeks, load_history, set_run_counts
from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.schedules import ScheduleSpec, SpecType
from rackflow.store import runs as store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule

PAGE = 20  # a page of runs
GRID = 50  # the runs grid's columns
LIST_PAGE, STRIP = 50, 12  # the schedule list's page, and its strip of runs per schedule


async def _measure(url: str, repeat: int) -> None:
    db = Database(url)
    try:
        async with db.read() as conn:
            ids = list((await conn.execute(select(task_schedule.c.id).limit(LIST_PAGE))).scalars())
        reads: dict[str, Callable[[AsyncConnection], Awaitable[Any]]] = {
            "list_runs": lambda conn: store.list_runs(conn, ids[0], limit=PAGE),
            "run_heads": lambda conn: store.run_heads(conn, ids[1], GRID),
            "recent_runs": lambda conn: store.recent_runs(conn, ids, STRIP),
        }
        for name, read in reads.items():
            took: list[float] = []
            for i in range(repeat + 2):
                async with db.read() as conn:
                    started = time.perf_counter()
                    await read(conn)
                    if i >= 2:  # the first two warm the session's caches
                        took.append((time.perf_counter() - started) * 1000)
            result(f"read={name}", median_ms=median(took), p90_ms=percentile(took, 90))
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--schedules", type=int, default=2_000)
    parser.add_argument("--history", type=int, default=110, help="runs each schedule has (the cap keeps 100)")
    parser.add_argument(
        "--run-weeks", type=int, default=52, help="weeks of the runs' partitions (PostgreSQL)"
    )
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    print(code_line(), flush=True)
    print(machine_line(), flush=True)
    with fresh_database(args.db, args.pg_admin) as ws:
        due = datetime.now(UTC).replace(microsecond=0)
        daily = ScheduleSpec(SpecType.INTERVAL, "24h", "UTC")
        bulk_load(ws.url, args.schedules, spec=daily, next_run_at=lambda _: due)
        engine = sync_engine(ws.url)
        add_run_weeks(engine, args.run_weeks)
        load_history(engine, args.history, due)
        set_run_counts(engine, args.history, due)
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        engine.dispose()
        asyncio.run(_measure(ws.url, args.repeat))
    print(machine_line(), flush=True)


if __name__ == "__main__":
    main()
