"""audit_migration: migration 0028 (the audit trail partitioned by day) on a loaded trail, while it is used.

Migrates `--database` (at revision 0026 or 0027, its trail loaded by `bench/scale.py` of that revision) to
head while one writer inserts an audit event every `--every` seconds and one reader lists the trail's first
page as often: how long the migration took, and the longest and p99 write and read meanwhile (a write or
read that waited for a lock shows here). Every line ends with the load average at its start.

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


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


async def use(
    db: Database, every: float, stop: asyncio.Event, writes: list[float], reads: list[float]
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
            writes.append(time.perf_counter() - started)
            started = time.perf_counter()
            async with db.read() as conn:
                await store.list_events(conn, limit=50)
            reads.append(time.perf_counter() - started)
        except Exception as exc:
            failures += 1
            print(f"# failed: {exc!r}", flush=True)
        await asyncio.sleep(every)
    return failures


def summary(name: str, seconds: list[float]) -> str:
    if not seconds:
        return f"{name}=0"
    p99 = statistics.quantiles(seconds, n=100)[98] if len(seconds) >= 2 else seconds[0]
    return f"{name}={len(seconds)} {name}_p99_ms={p99 * 1000:.1f} {name}_max_ms={max(seconds) * 1000:.1f}"


async def main(url: str, every: float) -> None:
    db = Database(url)
    user = Database(url)
    try:
        async with db.read() as conn:
            rows = (await conn.execute(select(func.count()).select_from(audit_events))).scalar_one()
        print(f"# from revision {await current_revision(db)}, {rows} audit events", flush=True)
        stop = asyncio.Event()
        writes: list[float] = []
        reads: list[float] = []
        load = load_avg()
        worker = asyncio.create_task(use(user, every, stop, writes, reads))
        await asyncio.sleep(2)
        started = time.perf_counter()
        await migrate(db)
        seconds = time.perf_counter() - started
        await asyncio.sleep(2)
        stop.set()
        failures = await worker
        print(
            f"audit_migration rows={rows} seconds={seconds:.2f} {summary('writes', writes)} "
            f"{summary('reads', reads)} failures={failures} loadavg={load}",
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
