"""poll_cost: the time of one empty dispatcher poll with 1,000 and with 1,000,000 schedules (none due).

In-process: `Dispatcher.poll_once()` on a fresh database, exactly the code `rackflow serve` runs each poll
interval (a transaction, the database's clock, the claim query, commit). The table is filled with schedule
rows only (no scopes: an empty poll never reads them), bulk-inserted with executemany; 90 % are enabled and
due in the next days, 10 % are consumed one-time schedules (disabled, no next run), so the partial index
`ix_task_schedule_due` has something to leave out. The two sizes live in two databases, ANALYZEd after
loading, and are polled in turn `--polls` times each after a warm-up, so machine noise hits both alike.
The claim statement the dispatcher sent is captured and EXPLAINed (ANALYZE, BUFFERS on PostgreSQL; QUERY
PLAN on SQLite) to show which index answers it.

    python bench/poll_cost.py --db postgres --small 1000 --large 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
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
_EXECUTION_TIME = re.compile(r"Execution Time: ([0-9.]+) ms")


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


async def time_polls(urls: Sequence[str], polls: int) -> tuple[list[list[float]], list[list[str]]]:
    """Seconds per empty poll on each database, and each claim's query plan.

    The databases are polled in turn (the order alternating), so a busy moment of a shared machine falls
    on all of them alike and their ratio stays fair.
    """
    dbs = [Database(url) for url in urls]
    try:
        services = [Services.build(db, SystemClock()) for db in dbs]
        dispatchers = [Dispatcher(s.schedules, s.audit, batch=10) for s in services]
        for _ in range(WARMUP_POLLS):
            for dispatcher in dispatchers:
                await dispatcher.poll_once()
        times: list[list[float]] = [[] for _ in dbs]
        for round_ in range(polls):
            order = range(len(dbs)) if round_ % 2 == 0 else reversed(range(len(dbs)))
            for i in order:
                started = time.perf_counter()
                claimed = await dispatchers[i].poll_once()
                times[i].append(time.perf_counter() - started)
                if claimed:
                    raise RuntimeError(f"a poll claimed {claimed} schedules; none should be due")
        plans = []
        for db, dispatcher in zip(dbs, dispatchers, strict=True):
            with captured_claims(db) as claims:
                await dispatcher.poll_once()
            if not claims:
                raise RuntimeError("no claim query seen; has the dispatcher's due scan changed shape?")
            plans.append(await explain(db, *claims[0]))
        return times, plans
    finally:
        for db in dbs:
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
    parser.add_argument("--polls", type=int, default=500, help="timed polls per table size")
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

    with ExitStack() as stack:
        workspaces = [stack.enter_context(fresh_database(args.db, args.pg_admin)) for _ in range(2)]
        for ws, size in zip(workspaces, (args.small, args.large), strict=True):
            started = time.perf_counter()
            bulk_load(
                ws.url,
                size,
                spec=spec,
                next_run_at=next_run_at,
                enabled=enabled,
                with_scopes=False,
                prefix="poll",
            )
            analyze(ws.url)
            print(f"# loaded {size} schedules ({time.perf_counter() - started:.1f}s)", flush=True)
        times, plans = asyncio.run(time_polls([ws.url for ws in workspaces], args.polls))
    for size, plan in zip((args.small, args.large), plans, strict=True):
        for line in plan:
            print(f"# plan[{size}] {line}")
    for size, taken, plan in zip((args.small, args.large), times, plans, strict=True):
        executed = _EXECUTION_TIME.search("\n".join(plan))
        result(
            "poll_cost",
            db=args.db,
            schedules=size,
            polls=len(taken),
            p50_ms=median(taken) * 1000,
            p99_ms=percentile(taken, 99) * 1000,
            claim_execution_ms=float(executed.group(1)) if executed else "n/a",
            uses_due_index="yes" if any(DUE_INDEX in line for line in plan) else "no",
        )
    ratio = median(times[1]) / median(times[0])
    result("poll_cost_ratio", db=args.db, large_over_small=ratio, met="yes" if ratio <= 2.0 else "no")


if __name__ == "__main__":
    main()
