"""run_migration: migration 0046 (the runs partitioned by week of their slot) on a loaded run table, while
it is used.

Makes a PostgreSQL database at revision 0045, loads `--runs` runs over `--schedules` schedules (a year of
daily slots, every tenth run manual), then migrates it to head while one writer records a run (as a
firing does) and reads a schedule's newest runs every `--every` seconds: the migration's seconds, and the
median and longest write and read during it against the same in the WARM seconds before (one that waited
for a lock shows here). Each line ends with the load average.

    python bench/run_migration.py --runs 2000000
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from datetime import UTC, datetime

from _common import add_db_arguments, code_line, machine_line, sync_engine
from sqlalchemy import text

from rackflow.domain.firing import run_id
from rackflow.store import runs as store
from rackflow.store.db import Database
from rackflow.store.migrate import migrate
from tests.e2e.cluster import fresh_postgres_database

# Seconds of writes and reads before the migration starts: what they take on this machine now.
WARM = 5.0

SCHEDULES = """
INSERT INTO task_schedule (id, name, spec_type, spec, timezone, operation_template, overlap_policy, enabled,
                           next_run_at, description, created_at, updated_at, run_count)
SELECT gen_random_uuid(), 'mig-' || g, 'interval', '24h', 'UTC',
       '{"operation": {"kind": "power_off", "parameters": {}}, "queue_timeout_seconds": 0}', 'skip', true,
       now() + interval '1 day', '', now(), now(), 0
FROM generate_series(1, :n) g
"""
RUNS = """
INSERT INTO task_schedule_run (id, schedule_id, fired_at, scheduled_for, trigger, state, outcomes,
                               outcome_counts)
SELECT gen_random_uuid(), s.id, now() - (k % 365) * interval '1 day',
       CASE WHEN k % 10 = 0 THEN NULL ELSE now() - (k % 365) * interval '1 day' END,
       CASE WHEN k % 10 = 0 THEN 'manual' ELSE 'dispatch' END, 'completed', '[]', '{}'
FROM (SELECT id, row_number() OVER () AS r FROM task_schedule) s, generate_series(0, :each - 1) k
"""


def ms(values: list[float]) -> str:
    if not values:
        return "-"
    return f"median {statistics.median(values) * 1000:.1f} ms, max {max(values) * 1000:.1f} ms"


async def use(db: Database, schedule_id: uuid.UUID, every: float, stop: asyncio.Event) -> dict[str, list]:
    """Record a run and read the schedule's newest runs each `every` seconds until `stop`: the seconds each
    write and read took, with the time it started."""
    done: dict[str, list[tuple[float, float]]] = {"write": [], "read": []}
    while not stop.is_set():
        now = datetime.now(UTC)
        new = store.NewRun(run_id(now), schedule_id, now, "dispatch", now, state="completed")
        started = time.perf_counter()
        async with db.transaction() as conn:
            await store.insert_runs(db, conn, [new])
        done["write"].append((started, time.perf_counter() - started))
        started = time.perf_counter()
        async with db.read() as conn:
            await store.list_runs(conn, schedule_id, limit=20)
        done["read"].append((started, time.perf_counter() - started))
        await asyncio.sleep(every)
    return done


async def measure(url: str, every: float) -> None:
    db = Database(url)
    async with db.read() as conn:
        schedule_id = (await conn.execute(text("SELECT id FROM task_schedule LIMIT 1"))).scalar_one()
    stop = asyncio.Event()
    user = asyncio.create_task(use(db, schedule_id, every, stop))
    await asyncio.sleep(WARM)
    began = time.perf_counter()
    revision = await migrate(db)
    took = time.perf_counter() - began
    await asyncio.sleep(1.0)
    stop.set()
    done = await user
    await db.dispose()
    for what, samples in done.items():
        before = [s for at, s in samples if at < began]
        during = [s for at, s in samples if began <= at < began + took]
        print(f"run_migration {what}: before {ms(before)}; during {ms(during)} ({len(during)} of them)")
    print(f"run_migration to {revision}: {took:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--schedules", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=2_000_000)
    parser.add_argument("--every", type=float, default=0.05)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    with fresh_postgres_database(args.pg_admin) as url:
        asyncio.run(migrate_to(url, "0045"))
        engine = sync_engine(url)
        started = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text(SCHEDULES), {"n": args.schedules})
            conn.execute(text(RUNS), {"each": max(1, args.runs // args.schedules)})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE task_schedule_run"))
            count = conn.execute(text("SELECT count(*) FROM task_schedule_run")).scalar_one()
        engine.dispose()
        print(f"# loaded {count} runs at 0045 in {time.perf_counter() - started:.1f} s", flush=True)
        asyncio.run(measure(url, args.every))


async def migrate_to(url: str, revision: str) -> None:
    db = Database(url)
    try:
        await migrate(db, revision)
    finally:
        await db.dispose()


if __name__ == "__main__":
    main()
