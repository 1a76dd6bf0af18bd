"""task_partitions: what partitioning `tasks` by weekly ranges of its id would cost (PostgreSQL; a probe, not
rackflow's schema: docs/PERFORMANCE.md, "The tasks' partitions, probed").

The tasks are not partitioned (issue 29's target 2). The route the runs left open is RANGE partitions of
the task's id, a UUIDv7 whose first 48 bits are its millisecond, so that the primary key and the five
foreign keys to it hold unchanged. This measures the two things that route's write-up says stand in its way,
on a fresh database migrated to revision 0061 (`REVISION`), the schema before migration 0062, which now
partitions the tasks itself (by filing time, not by id: the route `bench/task_filing_weeks.py` walks):

1. **The executor's claim over a year of weeks.** `--tasks` ended tasks spread over a year and `--live` live
   ones of the last hour (pending, running, waiting), as rackflow's `tasks`; the same rows in
   `tasks_by_week`, partitioned by week of their id (a year, two weeks ahead, and a DEFAULT), with the same
   indexes. Then the claim's statement as it was when this was measured, one UPDATE of the rows its
   subquery picked (since then a pick, `store.task_runs._pick_statement`, and `start`'s UPDATE; its SQL
   mirrored here with the table's name as a parameter), planned with rackflow's `plan_cache_mode`,
   `--repeat` times each in a rolled-back transaction: on `tasks`; on `tasks_by_week` as it is; bounded in
   its subquery to ids from the start of last week (`id >= :since`, what a "live since" bound of the oldest
   live task would give); and bounded in both the subquery and the UPDATE. Prints the median planning and
   execution times (ms), from `EXPLAIN (ANALYZE, SUMMARY)`.
2. **The old tasks' ids.** Tasks made before rackflow's ids were time-ordered have random version 4 ids. The
   same rows with such ids in a table whose only partition is the DEFAULT (the old table, attached): how many
   of them fall in each of the next `--weeks-ahead` weeks' ranges of ids (each such row refuses that week's
   partition: PostgreSQL will not make a partition whose range rows of the DEFAULT hold), and the making of
   the next ten weeks' partitions beside it (made or refused, and how long each took: the DEFAULT is scanned
   under an ACCESS EXCLUSIVE lock).

    python bench/task_partitions.py --tasks 1000000
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import add_db_arguments, code_line, fresh_database, machine_line, median, result, sync_engine
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from rackflow.store.dialect import PLAN_CACHE_MODE

WEEK = timedelta(days=7)
# A copy of `tasks`' columns, partitioned by ranges of its id.
PARTITIONED_LIKE_TASKS = "(LIKE tasks INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (id)"
LIVE = ("pending", "running", "waiting")
# The schema measured from: the flat tasks, before migration 0062 partitioned them.
REVISION = "0061"


def _v7(ts: str) -> str:
    """SQL: a UUIDv7 of the millisecond of `ts` (SQL, a timestamptz), random bits after."""
    ms = f"substring(int8send(floor(extract(epoch FROM {ts}) * 1000)::bigint) FROM 3)"
    return (
        f"encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) PLACING {ms} FROM 1 FOR 6), 52, 1),"
        " 53, 1), 'hex')::uuid"
    )


def _bound(at: datetime) -> str:
    """The smallest id of the millisecond `at`, as a UUID literal: a week's range starts there."""
    return f"{int(at.timestamp() * 1000):012x}" + "0" * 20


def _load(conn: Connection, ended: int, live: int) -> None:
    conn.execute(
        text(
            "INSERT INTO racks (id, name, external_id, created_at)"
            " SELECT gen_random_uuid(), 'r' || g, 'e' || g, now() FROM generate_series(1, 2000) g"
        )
    )
    columns = "id, operation, parameters, rack_id, component_ids, status, created_at, updated_at"
    columns += ", schedule_id, run_id"
    rows = (
        "SELECT {id}, 'power_reset', '{{}}', r.id, '[]', {status}, t, t, gen_random_uuid(), gen_random_uuid()"
        " FROM (SELECT g, {start} + g * {step} AS t FROM generate_series(1, {n}) g) s"
        " JOIN (SELECT row_number() OVER (ORDER BY id) AS k, id FROM racks) r ON r.k = 1 + s.g % 2000"
    )
    conn.execute(
        text(
            f"INSERT INTO tasks ({columns}) "
            + rows.format(
                id=_v7("t"),
                status="'completed'",
                start="now() - interval '365 days'",
                step=f"interval '{365 * 86400 / ended} seconds'",
                n=ended,
            )
        )
    )
    status = f"(ARRAY{list(LIVE)!r})[1 + g % 3]".replace('"', "'")
    conn.execute(
        text(
            f"INSERT INTO tasks ({columns}) "
            + rows.format(
                id=_v7("t"),
                status=status,
                start="now() - interval '1 hour'",
                step="interval '1 second'",
                n=live,
            )
        )
    )


def _copy_indexes(conn: Connection, target: str) -> None:
    """`tasks`' indexes on `target`, but the unique ones (a partitioned table's must hold its key)."""
    definitions = conn.execute(
        text(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'tasks' AND indexdef NOT LIKE 'CREATE UNIQUE%'"
        )
    ).scalars()
    for definition in definitions:
        name, rest = definition.split(" ON public.tasks ", 1)
        conn.execute(text(f"{name}_w ON {target} {rest}"))


def _by_week(conn: Connection, now: datetime) -> int:
    """`tasks_by_week`: `tasks`' rows in a partition a week of their ids (a year back, two weeks ahead) and
    a DEFAULT; returns the partitions made."""
    conn.execute(text(f"CREATE TABLE tasks_by_week {PARTITIONED_LIKE_TASKS}"))
    conn.execute(text("ALTER TABLE tasks_by_week ADD PRIMARY KEY (id)"))
    conn.execute(text("CREATE TABLE tasks_by_week_default PARTITION OF tasks_by_week DEFAULT"))
    week = datetime(now.year, now.month, now.day, tzinfo=UTC) - timedelta(days=now.weekday()) - 53 * WEEK
    made = 1
    while week < now + 2 * WEEK:
        conn.execute(
            text(
                f"CREATE TABLE tasks_by_week_{made} PARTITION OF tasks_by_week"
                f" FOR VALUES FROM ('{_bound(week)}') TO ('{_bound(week + WEEK)}')"
            )
        )
        week, made = week + WEEK, made + 1
    conn.execute(text("INSERT INTO tasks_by_week SELECT * FROM tasks"))
    _copy_indexes(conn, "tasks_by_week")
    return made


def _claim_sql(table: str, bounded_subquery: bool, bounded_update: bool) -> str:
    """The executor's claim (as one statement: `store.task_runs.pick` and `start`), on `table`, optionally
    bounded."""
    inner = "AND id >= :since" if bounded_subquery else ""
    outer = "id >= :since AND" if bounded_update else ""
    return (
        f"EXPLAIN (ANALYZE, SUMMARY, COSTS OFF, TIMING OFF) UPDATE {table} SET status = 'running',"
        " owner_id = :claimer, attempts = attempts + 1, started_at = coalesce(started_at, :now),"
        " attempt_started_at = coalesce(attempt_started_at, :now), updated_at = :now"
        f" WHERE {outer} id IN (SELECT id FROM {table}"
        "  WHERE status IN ('pending', 'running', 'waiting') AND ("
        "   (status = 'pending' AND (not_before IS NULL OR not_before <= :now))"
        "   OR (status = 'running' AND (owner_id IS NULL OR NOT EXISTS (SELECT 1 FROM instances"
        "       WHERE instances.id = owner_id AND heartbeat_at >= :cutoff)))"
        f"   OR (status = 'running' AND owner_id = :claimer)) {inner}"
        "  ORDER BY created_at, id LIMIT 32 FOR UPDATE SKIP LOCKED) RETURNING *"
    )


def _timings(plan: list[str]) -> tuple[float, float]:
    found = {line.split(":")[0]: float(line.split(":")[1].split()[0]) for line in plan if "Time:" in line}
    return found["Planning Time"], found["Execution Time"]


def _claims(engine: Any, repeat: int, since: datetime) -> None:
    params = {
        "claimer": "00000000-0000-7000-8000-000000000001",
        "now": datetime.now(UTC),
        "cutoff": datetime.now(UTC) - timedelta(seconds=15),
        "since": _bound(since),
    }
    cases = {
        "tasks": ("tasks", False, False),
        "by_week": ("tasks_by_week", False, False),
        "by_week_subquery_bounded": ("tasks_by_week", True, False),
        "by_week_bounded": ("tasks_by_week", True, True),
    }
    with engine.connect() as conn:
        conn.execute(text(f"SET plan_cache_mode = {PLAN_CACHE_MODE}"))
        conn.commit()
        for name, (table, inner, outer) in cases.items():
            planning, execution = [], []
            for i in range(repeat + 2):
                with conn.begin() as tx:
                    plan = conn.execute(text(_claim_sql(table, inner, outer)), params).scalars().all()
                    tx.rollback()
                if i >= 2:  # the first two warm the session's caches
                    p, e = _timings(plan)
                    planning.append(p)
                    execution.append(e)
            result(f"claim={name}", planning_ms=median(planning), execution_ms=median(execution))


def _old_ids(conn: Connection, now: datetime, weeks_ahead: int) -> None:
    conn.execute(text(f"CREATE TABLE tasks_v4 {PARTITIONED_LIKE_TASKS}"))
    conn.execute(text("CREATE TABLE tasks_v4_default PARTITION OF tasks_v4 DEFAULT"))
    columns = conn.execute(
        text(
            "SELECT string_agg(column_name, ', ' ORDER BY ordinal_position) FROM information_schema.columns"
            " WHERE table_name = 'tasks' AND column_name <> 'id'"
        )
    ).scalar_one()
    conn.execute(text(f"INSERT INTO tasks_v4 (id, {columns}) SELECT gen_random_uuid(), {columns} FROM tasks"))
    conn.execute(text("CREATE INDEX ON tasks_v4_default (id)"))
    conn.execute(text("ANALYZE tasks_v4"))
    monday = datetime(now.year, now.month, now.day, tzinfo=UTC) - timedelta(days=now.weekday()) + WEEK
    counts = [
        conn.execute(
            text("SELECT count(*) FROM tasks_v4_default WHERE id >= :lo AND id < :hi"),
            {"lo": _bound(monday + k * WEEK), "hi": _bound(monday + (k + 1) * WEEK)},
        ).scalar_one()
        for k in range(weeks_ahead)
    ]
    result(
        "old_ids",
        rows=conn.execute(text("SELECT count(*) FROM tasks_v4_default")).scalar_one(),
        weeks=weeks_ahead,
        weeks_with_old_rows=sum(1 for n in counts if n),
        old_rows_in_them=sum(counts),
    )
    for k in range(10):
        lo, hi = _bound(monday + k * WEEK), _bound(monday + (k + 1) * WEEK)
        started = time.perf_counter()
        try:
            with conn.begin_nested():
                week = f"FOR VALUES FROM ('{lo}') TO ('{hi}')"
                conn.execute(text(f"CREATE TABLE tasks_v4_w{k} PARTITION OF tasks_v4 {week}"))
            made = "made"
        except DBAPIError as exc:  # the refusal is the figure
            if "would be violated" not in str(exc):
                raise
            made = "refused"
        result(f"week_partition k={k}", outcome=made, ms=(time.perf_counter() - started) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser, kinds=("postgres",))
    parser.add_argument("--tasks", type=int, default=1_000_000, help="ended tasks over the past year")
    parser.add_argument("--live", type=int, default=300, help="live tasks of the last hour")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--weeks-ahead", type=int, default=52)
    args = parser.parse_args()
    print(code_line(), flush=True)
    print(machine_line(), flush=True)
    now = datetime.now(UTC)
    with fresh_database(args.db, args.pg_admin, REVISION) as ws:
        engine = sync_engine(ws.url)
        with engine.begin() as conn:
            _load(conn, args.tasks, args.live)
            made = _by_week(conn, now)
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        result("loaded", tasks=args.tasks + args.live, partitions=made)
        monday = datetime(now.year, now.month, now.day, tzinfo=UTC) - timedelta(days=now.weekday())
        _claims(engine, args.repeat, monday - WEEK)
        with engine.begin() as conn:
            _old_ids(conn, now, args.weeks_ahead)
        engine.dispose()
    print(machine_line(), flush=True)


if __name__ == "__main__":
    main()
