"""audit_reads: what the audit trail's partitions cost its page (migration 0028), and its page by target
(migration 0044).

EXPLAIN ANALYZE, in one warm session, of the statements the audit page sends (`store.audit.list_events`:
the first page newest first, unfiltered and by principal, and the capped counts; by target, the two ways
one statement may read its page) on `--database`: the median planning and execution time of `--repeat`
runs after two, the rows, the indexes read, and how many partitions the trail has. Then the first page by
each target as the server reads it (`audit_reads_store`: `store.list_events`, count included, in
process). Each line ends with the load average.

    python bench/audit_reads.py --database rackflow_scale

`--fill N` first makes `--database` afresh (migrated to head, a year of the pruner's weekly partitions)
and loads N events over the year, server-side, each naming a rack (of RACKS), a schedule (of SCHEDULES)
and a task of its own, as a PowerOnRack fired by a schedule does; the targets measured are a rack
(N / RACKS events), a schedule (N / SCHEDULES), a task (one), an id no event names, a "hot" rack (every
HOT-th event) and a "retired" one (every RETIRED-th event of the year's first month only).

    python bench/audit_reads.py --database rackflow_audit_reads --fill 3000000

`--sqlite N` measures the page by target on SQLite instead (no index over `target_ids`: each page walks
at most SEARCH_WALK events): a fresh file of N events loaded the same way, then the first page (50) by
each target through `store.list_events`, median of `--repeat` in process after two.

    python bench/audit_reads.py --sqlite 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

from rackflow.config import SEARCH_WALK
from rackflow.domain.audit import OK, AuditEvent, EventFilter
from rackflow.store import audit as store
from rackflow.store.db import Database
from rackflow.store.migrate import migrate

RACKS = 2_000
SCHEDULES = 10_000


def _id(name: str) -> uuid.UUID:
    """The id the loader gives `name`: PostgreSQL's `md5(name)::uuid`."""
    return uuid.UUID(hashlib.md5(name.encode()).hexdigest())


TARGETS = {
    "rack": _id("rack-7"),
    "schedule": _id("schedule-7"),
    "task": _id("task-77777"),
    "none": _id("nothing"),
    "hot": _id("hot"),
    "retired": _id("retired"),
}
# Besides: every HOT-th event names the rack "hot" too (an automation powering it every few minutes), and
# every RETIRED-th of the year's first month the rack "retired" (gone since).
HOT = 30
RETIRED = 200


def _target_statements() -> list[tuple[str, str]]:
    """The page by target read the two ways a single statement may read it on PostgreSQL: every match
    from the GIN index, then sorted (a MATERIALIZED CTE), or as the planner chooses, which may walk (at, id)
    filtering each event; and its capped count. (`store.audit.list_events` reads the first way, over a
    window of the newest events that widens until it holds the page: `store_pages`.)"""
    found = []
    for kind, target in TARGETS.items():
        holds = f"target_ids @> '[\"{target}\"]'"
        matched = f"SELECT * FROM audit_events WHERE {holds}"
        fenced = f"WITH matched AS MATERIALIZED ({matched}) SELECT * FROM matched"
        found.append((f"page by {kind}, all matches sorted", f"{fenced} ORDER BY at DESC, id DESC LIMIT 50"))
        found.append((f"page by {kind}, as planned", f"{matched} ORDER BY at DESC, id DESC LIMIT 50"))
        count = f"SELECT count(*) FROM (SELECT 1 FROM audit_events WHERE {holds} LIMIT 10001) found"
        found.append((f"count by {kind}", count))
    return found


# What each statement is, and the statement.
STATEMENTS = (
    ("first page", "SELECT * FROM audit_events ORDER BY at DESC, id DESC LIMIT 50"),
    (
        "page by principal",
        "SELECT * FROM audit_events WHERE principal = 'user-7' ORDER BY at DESC, id DESC LIMIT 50",
    ),
    (
        "count by principal",
        "SELECT count(*) FROM (SELECT 1 FROM audit_events WHERE principal = 'user-7' LIMIT 10001) found",
    ),
    *_target_statements(),
)


def _indexes(node: dict[str, Any]) -> set[str]:
    """The indexes the plan reads, each partition's by the columns it indexes (`at_id`, `target_ids`)."""
    found = set()
    if "Index Name" in node:
        found.add(
            re.sub(r"^audit_events_(legacy|default|p\d+)_", "", node["Index Name"]).removesuffix("_idx")
        )
    for child in node.get("Plans", []):
        found |= _indexes(child)
    return found


# One chunk of the loader: events `lo` to `hi` (1-based) spread over the year before now, newest last.
_FILL = """
INSERT INTO audit_events (id, at, principal, method, target_ids, outcome, error, request)
SELECT gen_random_uuid(),
       now() - interval '365 days' * (1 - i::float8 / :n),
       'user-' || (i % 20),
       'PowerOnRack',
       jsonb_build_array(md5('rack-' || (i % :racks))::uuid::text,
                         md5('schedule-' || (i % :schedules))::uuid::text,
                         md5('task-' || i)::uuid::text)
       || CASE WHEN i % :hot = 0 THEN jsonb_build_array(md5('hot')::uuid::text) ELSE '[]' END
       || CASE WHEN i <= :n / 12 AND i % :retired = 0 THEN jsonb_build_array(md5('retired')::uuid::text)
               ELSE '[]' END,
       'OK', '', '{}'::jsonb
FROM generate_series(:lo, :hi) AS i
"""
FILL_CHUNK = 250_000


def fill(admin: str, name: str, events: int) -> None:
    """`name` afresh, migrated, with a year of weekly partitions and `events` events (above)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from scale import make_year_of_audit_partitions, recreate_database

    url = recreate_database(admin, name)
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    make_year_of_audit_partitions(engine)
    started = time.perf_counter()
    for lo in range(1, events + 1, FILL_CHUNK):
        with engine.begin() as conn:
            params = {"n": events, "racks": RACKS, "schedules": SCHEDULES, "hot": HOT, "retired": RETIRED}
            params["lo"] = lo
            conn.execute(text(_FILL), {**params, "hi": min(events, lo + FILL_CHUNK - 1)})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE audit_events"))
    engine.dispose()
    print(f"# filled events={events} seconds={time.perf_counter() - started:.1f}", flush=True)


def main(url: str, repeat: int) -> None:
    with psycopg.connect(url) as conn:
        # The trail's own: the runs are partitioned too (migration 0046), so not every partition is its.
        query = "SELECT count(*) FROM pg_partition_tree('audit_events') WHERE isleaf"
        partitions = conn.execute(query).fetchone()
        for label, statement in STATEMENTS:
            runs = []
            for _ in range(repeat + 2):
                row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement).fetchone()
                assert row is not None
                plan = row[0][0]
                runs.append((plan["Planning Time"], plan["Execution Time"]))
                rows, indexes = plan["Plan"].get("Actual Rows"), _indexes(plan["Plan"])
            warm = runs[2:]
            print(
                f"audit_reads partitions={partitions[0] if partitions else 0} "
                f"planning_ms={statistics.median(p for p, _ in warm):.2f} "
                f"execution_ms={statistics.median(e for _, e in warm):.2f} "
                f"rows={rows} indexes={','.join(sorted(indexes)) or '-'} "
                f"loadavg={round(os.getloadavg()[0], 2)} what={label!r} statement={statement!r}",
                flush=True,
            )


async def on_sqlite(events: int, repeat: int) -> None:
    """The page by target on a fresh SQLite file of `events` events."""
    with tempfile.TemporaryDirectory() as directory:
        db = Database(f"sqlite:///{directory}/audit.db")
        await migrate(db)
        started = time.perf_counter()
        await _fill_sqlite(db, events, datetime.now(UTC))
        print(f"# filled sqlite events={events} seconds={time.perf_counter() - started:.1f}", flush=True)
        await store_pages(db, repeat)
        await db.dispose()


async def store_pages(db: Database, repeat: int) -> None:
    """The first page (50) by each target as the server reads it (`store.list_events`, its count
    included), median of `repeat` after two, and how many statements it took."""
    sent: list[str] = []

    def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        sent.append(statement)

    event.listen(db.engine.sync_engine, "before_cursor_execute", count)
    for kind, target in TARGETS.items():
        times = []
        for _ in range(repeat + 2):
            sent.clear()
            began = time.perf_counter()
            async with db.read() as conn:
                found, listed = await store.list_events(conn, EventFilter(target=target), limit=50)
            times.append((time.perf_counter() - began) * 1000)
        print(
            f"audit_reads_store db={db.dialect} target={kind} ms={statistics.median(times[2:]):.1f} "
            f"statements={len(sent)} found={len(found)} total={listed.total} bounded={listed.count_bounded} "
            f"walk={SEARCH_WALK if not db.is_postgres else '-'} loadavg={round(os.getloadavg()[0], 2)}",
            flush=True,
        )


async def _store_pages_on(url: str, repeat: int) -> None:
    db = Database(url)
    await store_pages(db, repeat)
    await db.dispose()


def _targets_of(i: int, events: int) -> tuple[str, ...]:
    """What the `i`-th of `events` events names, as `_FILL` makes it on PostgreSQL."""
    names = [f"rack-{i % RACKS}", f"schedule-{i % SCHEDULES}", f"task-{i}"]
    names += ["hot"] * (i % HOT == 0) + ["retired"] * (i <= events // 12 and i % RETIRED == 0)
    return tuple(str(_id(name)) for name in names)


async def _fill_sqlite(db: Database, events: int, now: datetime) -> None:
    """`events` events over the year before `now`, each naming a rack, a schedule and a task of its own."""
    step = timedelta(days=365) / events
    for lo in range(1, events + 1, 50_000):
        chunk = [
            AuditEvent(
                id=uuid.uuid4(),
                at=now - timedelta(days=365) + step * i,
                principal=f"user-{i % 20}",
                method="PowerOnRack",
                target_ids=_targets_of(i, events),
                outcome=OK,
                error="",
                request={},
            )
            for i in range(lo, min(events, lo + 49_999) + 1)
        ]
        async with db.transaction() as conn:
            await store.insert_events(conn, chunk)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--database")
    parser.add_argument(
        "--fill", type=int, default=0, metavar="N", help="make --database afresh with N events"
    )
    parser.add_argument(
        "--sqlite", type=int, default=0, metavar="N", help="the page by target on SQLite, N events"
    )
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    if args.sqlite:
        asyncio.run(on_sqlite(args.sqlite, args.repeat))
    else:
        if not args.database:
            parser.error("--database is required (or --sqlite N)")
        if args.fill:
            fill(args.pg_admin, args.database, args.fill)
        url = make_url(args.pg_admin).set(database=args.database).render_as_string(False)
        main(url, args.repeat)
        asyncio.run(_store_pages_on(url, args.repeat))
