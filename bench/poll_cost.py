"""poll_cost: the time of one empty dispatcher poll with 1,000 and with 1,000,000 schedules (none due).

In-process: `Dispatcher.poll_once()` on a fresh database, exactly the code `rackflow serve` runs each poll
interval (a transaction, the database's clock, the claim query, commit). The table is filled with schedule
rows only (no scopes: an empty poll never reads them), bulk-inserted with executemany; 90 % are enabled and
due in the next days, 10 % are consumed one-time schedules (disabled, no next run), so the partial index
`ix_task_schedule_due` has something to leave out. After each fill the table is ANALYZEd, the poll is
warmed up, then timed `--polls` times. The claim statement the dispatcher sent is captured and EXPLAINed
(ANALYZE, BUFFERS on PostgreSQL; QUERY PLAN on SQLite) to show which index answers it.

    python bench/poll_cost.py --db postgres --small 1000 --large 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
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
)
from sqlalchemy import event, text

from rackflow.clock import SystemClock
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.timespec import ScheduleSpec, SpecType

WARMUP_POLLS = 20
DUE_INDEX = "ix_task_schedule_due"


@contextmanager
def captured_claims(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """The SELECTs on task_schedule that filter on next_run_at (the claim), as sent to the driver."""
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        is_select = statement.lstrip().upper().startswith("SELECT")
        if is_select and "FROM task_schedule" in statement and "next_run_at <=" in statement:
            seen.append((statement, parameters))

    event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", capture)


async def time_polls(url: str, polls: int) -> tuple[list[float], list[str]]:
    """Seconds per empty poll, and the claim's query plan."""
    db = Database(url)
    try:
        dispatcher = Dispatcher(Services.build(db, SystemClock()), instance_id=uuid.uuid4(), batch=10)
        for _ in range(WARMUP_POLLS):
            await dispatcher.poll_once()
        times = []
        for _ in range(polls):
            started = time.perf_counter()
            claimed = await dispatcher.poll_once()
            times.append(time.perf_counter() - started)
            if claimed:
                raise RuntimeError(f"a poll claimed {claimed} schedules; none should be due")
        with captured_claims(db) as claims:
            await dispatcher.poll_once()
        if not claims:
            raise RuntimeError("no claim query seen; has the dispatcher's due scan changed shape?")
        return times, await explain(db, *claims[0])
    finally:
        await db.dispose()


async def explain(db: Database, statement: str, parameters: Any) -> list[str]:
    """The plan of exactly the statement the dispatcher sent, with its parameters bound."""
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if db.is_postgres else "EXPLAIN QUERY PLAN "
    async with db.transaction() as conn:
        rows = (await conn.exec_driver_sql(prefix + statement, parameters)).all()
    return [" | ".join(str(col) for col in row) for row in rows]


def analyze(url: str) -> None:
    async def run() -> None:
        db = Database(url)
        try:
            async with db.transaction() as conn:
                await conn.execute(text("ANALYZE"))
        finally:
            await db.dispose()

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--small", type=int, default=1_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--polls", type=int, default=300, help="timed polls per table size")
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(
        f"# poll_cost db={args.db} small={args.small} large={args.large} polls={args.polls} "
        "load=bulk-executemany rows=90%-enabled-future/10%-consumed",
        flush=True,
    )
    now = datetime.now(UTC)
    spec = ScheduleSpec(SpecType.INTERVAL, "24h", "UTC")

    def next_run_at(i: int) -> datetime | None:
        return None if i % 10 == 9 else now + timedelta(hours=1, seconds=i % 86_400)

    def enabled(i: int) -> bool:
        return i % 10 != 9

    medians = {}
    with fresh_database(args.db, args.pg_admin) as ws:
        loaded = 0
        for size in (args.small, args.large):
            started = time.perf_counter()
            bulk_load(
                ws.url,
                size - loaded,
                spec=spec,
                next_run_at=next_run_at,
                enabled=enabled,
                with_scopes=False,
                start=loaded,
                prefix="poll",
            )
            loaded = size
            analyze(ws.url)
            print(f"# loaded {size} schedules ({time.perf_counter() - started:.1f}s)", flush=True)
            times, plan = asyncio.run(time_polls(ws.url, args.polls))
            medians[size] = median(times)
            for line in plan:
                print(f"# plan[{size}] {line}")
            result(
                "poll_cost",
                db=args.db,
                schedules=size,
                polls=len(times),
                p50_ms=medians[size] * 1000,
                p99_ms=percentile(times, 99) * 1000,
                uses_due_index="yes" if any(DUE_INDEX in line for line in plan) else "no",
            )
    ratio = medians[args.large] / medians[args.small]
    result("poll_cost_ratio", db=args.db, large_over_small=ratio, met="yes" if ratio <= 2.0 else "no")


if __name__ == "__main__":
    main()
