"""audit_migration: migration 0028 (the audit trail partitioned by day) on a loaded trail, while it is used.

Migrates `--database` (at revision 0026 or 0027, its trail loaded by `bench/scale.py` of that revision) to
head while one writer inserts an audit event and then reads the trail's first page, over and over, every
`--every` seconds: the median and longest write and read during the migration (one that waited for a lock
shows here), against the same in the WARM seconds before it. Each line ends with the load average.

    python bench/audit_migration.py --database rackflow_scale
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from rackflow.domain.audit import OK, AuditEvent
from rackflow.store import audit as store
from rackflow.store.db import Database
from rackflow.store.migrate import current_revision, migrate
from rackflow.store.tables import audit_events

# Seconds of writes and reads before the migration starts: what they take on this machine now.
WARM = 10.0


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


async def use(
    db: Database,
    every: float,
    stop: asyncio.Event,
    writes: list[tuple[float, float]],
    reads: list[tuple[float, float]],
) -> int:
    """Write one event and read the first page each `every` seconds until `stop`; returns the failures."""
    failures = 0
    while not stop.is_set():
        event = AuditEvent(
            id=uuid.uuid4(),
            at=datetime.now(UTC),
            principal="bench",
            method="CreateRack",
            target_ids=(),
            outcome=OK,
            error="",
            request={},
        )
        try:
            started = time.perf_counter()
            async with db.transaction() as conn:
                await store.insert_events(conn, [event])
            writes.append((started, time.perf_counter() - started))
            started = time.perf_counter()
            async with db.read() as conn:
                await store.list_events(conn, limit=50)
            reads.append((started, time.perf_counter() - started))
        except Exception as exc:
            failures += 1
            print(f"# failed: {exc!r}", flush=True)
        await asyncio.sleep(every)
    return failures


def summary(name: str, timed: list[tuple[float, float]], start: float, end: float) -> str:
    """Count, median and longest of the calls `timed` (start, seconds) begun between `start` and `end`."""
    seconds = [took for at, took in timed if start <= at < end]
    if not seconds:
        return f"{name}=0"
    return (
        f"{name}={len(seconds)} {name}_median_ms={statistics.median(seconds) * 1000:.1f} "
        f"{name}_max_ms={max(seconds) * 1000:.1f}"
    )


async def main(url: str, every: float) -> None:
    db = Database(url)
    user = Database(url)
    try:
        async with db.read() as conn:
            rows = (await conn.execute(select(func.count()).select_from(audit_events))).scalar_one()
        print(f"# from revision {await current_revision(db)}, {rows} audit events", flush=True)
        stop = asyncio.Event()
        writes: list[tuple[float, float]] = []
        reads: list[tuple[float, float]] = []
        load = load_avg()
        worker = asyncio.create_task(use(user, every, stop, writes, reads))
        begun = time.perf_counter()
        await asyncio.sleep(WARM)
        started = time.perf_counter()
        await migrate(db)
        ended = time.perf_counter()
        stop.set()
        failures = await worker
        for when, start, end in (("before", begun, started), ("during", started, ended)):
            print(
                f"audit_migration when={when} rows={rows} seconds={end - start:.2f} "
                f"{summary('writes', writes, start, end)} {summary('reads', reads, start, end)} "
                f"failures={failures} loadavg={load}",
                flush=True,
            )
    finally:
        await user.dispose()
        await db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database", required=True)
    parser.add_argument("--every", type=float, default=0.02, help="seconds between a write and the next")
    args = parser.parse_args()
    asyncio.run(main(make_url(args.pg_admin).set(database=args.database).render_as_string(False), args.every))
