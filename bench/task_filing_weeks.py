"""task_filing_weeks: the tasks partitioned by week of their filing time, the migration walked through on a
loaded database while the previous release writes (PostgreSQL; a probe, not rackflow's schema:
docs/PERFORMANCE.md, "The tasks' partitions by filing time: a route, walked through").

`bench/task_partitions.py` measured the route by ranges of the task's id, which the old random ids and the
unique (run, rack) key stand in the way of. This walks another route, on a fresh database migrated to
revision 0061 (`REVISION`) and loaded with `--tasks` ended tasks over a year (half of them with random
version 4 ids) and rows in the five tables that reference a task; it measures the route from 0061, which
migration 0062 (`store/migrations/versions/0062_task_partitions.py`) now builds:

* `tasks.filed_at` is the partition key: `time_of(id)` for a task whose id is of a millisecond at or after
  BOUND, and `-infinity` for every other (the rows found, and whatever the previous release writes while it
  still serves). A function of the id alone, so a statement naming tasks by id can name their one partition,
  and a run's tasks, whose ids would be minted at their run id's millisecond, share it: the unique (run_id,
  rack_id, filed_at) holds "one task per rack per firing".
* The old table becomes the partition `[MINVALUE, BOUND)` (a CHECK proves it, so nothing is scanned under a
  lock), keeping its own key, its unique (run, rack) index and its foreign key to the racks; each of the five
  referencing tables the same by `task_filed_at`. Weeks from BOUND are six partitions each (`tasks` and its
  five), made ahead and dropped together, children first.
* The children's keys (`--keys`): "weekly" (the route), each old table keeping its key to the old tasks and
  each week's child its own to the tasks' week; or "partitioned", each partitioned child's own key to the
  partitioned tasks' (id, filed_at), added NOT VALID and validated online before the switch so that the
  switch reuses it.

Each step is timed, with the locks it takes, while a writer thread runs the previous release's statements
every 20 ms (insert a task and an attempt of it, complete the task by id, read an old task by id): its
slowest call during each step is printed, and any error fails the probe. Then: the partitioned table's
refusals (a second task of a (run, rack), an attempt of a missing task) and cascades, what a row costs
(`--rows` tasks inserted in one statement, then a step's record of each, whose key is checked against the
tasks: on the flat table before the migration, in a week after), the planning of a look-up by id among
`--weeks` weeks (named by its partition, and unbounded), the executor's claim with `--live` tasks live
before the migration and as many filed in its first week (on the flat table, then over the weeks as it is
and bounded to those a live task can be in), and a week of the six tables dropped.

    python bench/task_filing_weeks.py --tasks 1000000 [--keys partitioned]
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from _common import (
    add_db_arguments,
    code_line,
    fresh_database,
    machine_line,
    median,
    result,
    slot_run_id,
)
from sqlalchemy import Select, true
from sqlalchemy import text as sql_text
from sqlalchemy.engine import make_url
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BinaryExpression, ClauseElement

from rackflow.ids import id_at_time
from rackflow.store.db import Database
from rackflow.store.dialect import PLAN_CACHE_MODE
from rackflow.store.tables import tasks as tasks_table
from rackflow.store.task_runs import _pick_statement

WEEK = timedelta(days=7)
# The schema the route starts from: the flat tasks, before migration 0062 partitioned them.
REVISION = "0061"
# The five tables that reference a task, each with its key's columns.
CHILDREN = {
    "task_attempt": "task_id, attempt",
    "task_step_state": "task_id, attempt, component_id",
    "preflight_tasks": "task_id",
    "preflight_results": "task_id, check_id, attempt",
    "preflight_overrides": "task_id, check_id",
}
# `tables.TASK_STORAGE`, which a partitioned table cannot carry: each partition is made with it.
STORAGE = (
    "fillfactor = 70, vacuum_index_cleanup = on, autovacuum_vacuum_scale_factor = 0.01,"
    " autovacuum_vacuum_threshold = 10000"
)
# What the previous release's writer and the week's tasks write (the head's columns, no filing time).
TASK_COLUMNS = "id, operation, parameters, rack_id, component_ids, status, created_at, updated_at, run_id"


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _load(conn: psycopg.Connection[Any], tasks: int) -> None:
    """2,000 racks, `tasks` ended tasks over the past year (every other one with a random version 4 id, the
    rest time-ordered), nine in ten of a run; and rows referencing them: an attempt for half, a step's record
    for each, a pre-flight row and a result for a tenth, an override for a hundredth."""
    conn.execute(
        "INSERT INTO racks (id, name, external_id, created_at)"
        " SELECT gen_random_uuid(), 'r' || g, 'e' || g, now() FROM generate_series(1, 2000) g"
    )
    racks = "(SELECT array_agg(id) FROM racks)"
    # The tasks' other indexes built after their rows, not entry by entry (ten million rows into eleven
    # indexes had not gone in after ten minutes on a small server; built after, the whole load took six).
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'tasks' AND indexname <> 'pk_tasks'"
    ).fetchall()
    for name, _ in indexes:
        conn.execute(f"DROP INDEX {name}")
    conn.execute(
        f"INSERT INTO tasks ({TASK_COLUMNS})"
        # A time-ordered id is a UUIDv7 of its creation's millisecond, made as a run's of its slot is.
        f" SELECT CASE WHEN g % 2 = 0 THEN gen_random_uuid() ELSE {slot_run_id('t')} END,"
        f" 'power_reset', '{{}}', ({racks})[1 + g % 2000], '[]', 'completed', t, t,"
        " CASE WHEN g % 10 = 0 THEN NULL ELSE gen_random_uuid() END"
        f" FROM (SELECT g, now() - interval '365 days' + g * interval '{365 * 86400 / tasks} seconds' AS t"
        f"       FROM generate_series(1, {tasks}) g) s"
    )
    for _, definition in indexes:
        conn.execute(definition)
    conn.execute(
        "INSERT INTO task_attempt (task_id, attempt, started_at, finished_at, status)"
        " SELECT id, 1, created_at, created_at, 'failed' FROM tasks WHERE get_byte(uuid_send(id), 15) % 2 = 0"
    )
    conn.execute(
        "INSERT INTO task_step_state (task_id, attempt, component_id, recorded)"
        " SELECT id, 1, gen_random_uuid(), '{}' FROM tasks"
    )
    conn.execute(
        "INSERT INTO preflight_tasks (task_id, attempt)"
        " SELECT id, 1 FROM tasks WHERE get_byte(uuid_send(id), 15) % 10 = 0"
    )
    conn.execute(
        "INSERT INTO preflight_results"
        " (task_id, check_id, attempt, check_name, passed, reason, checked_at, recheck_at)"
        " SELECT task_id, gen_random_uuid(), 1, 'idle', true, '', now(), now() FROM preflight_tasks"
    )
    conn.execute(
        "INSERT INTO preflight_overrides (task_id, check_id, reason, overridden_at)"
        " SELECT task_id, gen_random_uuid(), 'probe', now() FROM preflight_tasks"
        " WHERE get_byte(uuid_send(task_id), 14) % 10 = 0"
    )


class PreviousRelease(threading.Thread):
    """The previous release's writes every 20 ms on a connection of its own, which knows no filing time:
    a new task and an attempt of it, the task completed by id, an old task read by id. Each call's time is
    kept under the step running then; an error is kept and fails the probe."""

    def __init__(self, dsn: str, old_ids: list[uuid.UUID], rack_id: uuid.UUID) -> None:
        super().__init__(daemon=True)
        self.dsn, self.old_ids, self.rack_id = dsn, old_ids, rack_id
        self.step = "before"
        self.slowest: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.errors: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            k = 0
            while not self.stopping.wait(0.02):
                task_id, k = uuid.uuid4(), k + 1
                started = time.perf_counter()
                try:
                    with conn.transaction():
                        conn.execute(
                            f"INSERT INTO tasks ({TASK_COLUMNS}) VALUES"
                            " (%s, 'power_reset', '{}', %s, '[]', 'running', now(), now(), %s)",
                            (task_id, self.rack_id, uuid.uuid4()),
                        )
                        conn.execute(
                            "INSERT INTO task_attempt (task_id, attempt, started_at, finished_at, status)"
                            " VALUES (%s, 1, now(), now(), 'failed')",
                            (task_id,),
                        )
                    conn.execute("UPDATE tasks SET status = 'completed' WHERE id = %s", (task_id,))
                    conn.execute(
                        f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s",
                        (self.old_ids[k % len(self.old_ids)],),
                    )
                except psycopg.Error as exc:
                    self.errors.append(f"{self.step}: {exc}")
                step = self.step
                self.slowest[step] = max(self.slowest[step], time.perf_counter() - started)
                self.calls[step] += 1


@contextmanager
def step(writer: PreviousRelease, name: str, locks: str) -> Iterator[None]:
    writer.step = name
    started = time.perf_counter()
    yield
    took = time.perf_counter() - started
    time.sleep(0.1)  # the writer's call that waited, if any, is counted under this step
    result(
        f"step {name}",
        ms=took * 1000,
        locks=locks,
        writer_slowest_ms=writer.slowest[name] * 1000,
        writer_calls=writer.calls[name],
    )


def _indexes(conn: psycopg.Connection[Any], table: str) -> list[tuple[str, str]]:
    """The non-unique indexes of `table`: (name, definition after `ON public.<table>`)."""
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes"
        " WHERE tablename = %s AND indexdef NOT LIKE 'CREATE UNIQUE%%'",
        (table,),
    ).fetchall()
    return [(name, definition.split(f" ON public.{table} ", 1)[1]) for name, definition in rows]


def _foreign_key(conn: psycopg.Connection[Any], table: str, references: str) -> str:
    return str(
        conn.execute(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = %s::regclass"
            " AND confrelid = %s::regclass",
            (table, references),
        ).fetchone()[0]  # type: ignore[index]
    )


def migrate(conn: psycopg.Connection[Any], writer: PreviousRelease, bound: datetime, keys: str) -> None:
    """The route's steps, each timed; `conn` is in autocommit. `keys` (`--keys`): "partitioned", the
    children's keys the partitioned tables' own, to the partitioned tasks' (id, filed_at), validated before
    the switch; "weekly", each child's old table keeping its key to the old tasks, and each week's its own
    to the tasks' week (`make_week`)."""
    before = f"'{bound.isoformat()}'"
    with step(writer, "1_columns", "ACCESS EXCLUSIVE, no scan, no rewrite (a constant default)"):
        conn.execute("ALTER TABLE tasks ADD COLUMN filed_at timestamptz NOT NULL DEFAULT '-infinity'")
        for child in CHILDREN:
            conn.execute(
                f"ALTER TABLE {child} ADD COLUMN task_filed_at timestamptz NOT NULL DEFAULT '-infinity'"
            )
    with step(writer, "2_checks_validated", "SHARE UPDATE EXCLUSIVE (writes go on), a scan each"):
        for table, column in [("tasks", "filed_at"), *((child, "task_filed_at") for child in CHILDREN)]:
            conn.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {table}_filed_before"
                f" CHECK ({column} < {before}) NOT VALID"
            )
            conn.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {table}_filed_before")
    with step(writer, "3_keys_built_concurrently", "SHARE UPDATE EXCLUSIVE, an index build each"):
        if keys == "partitioned":
            conn.execute("CREATE UNIQUE INDEX CONCURRENTLY tasks_id_filed ON tasks (id, filed_at)")
        conn.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY tasks_run_rack_filed ON tasks (run_id, rack_id, filed_at)"
        )
    indexes = _indexes(conn, "tasks")
    racks_key = _foreign_key(conn, "tasks", "racks")
    with step(writer, "4_tasks_switched", "ACCESS EXCLUSIVE on tasks, catalog only"), conn.transaction():
        # In the order writers take them (a rack, then its tasks), so that none deadlocks with the switch.
        conn.execute("LOCK TABLE racks IN SHARE ROW EXCLUSIVE MODE")
        conn.execute("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE")
        conn.execute("ALTER TABLE tasks RENAME TO tasks_legacy")
        conn.execute(
            "CREATE TABLE tasks (LIKE tasks_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            " PARTITION BY RANGE (filed_at)"
        )
        conn.execute("ALTER TABLE tasks DROP CONSTRAINT tasks_filed_before")
        conn.execute(
            f"ALTER TABLE tasks ATTACH PARTITION tasks_legacy FOR VALUES FROM (MINVALUE) TO ({before})"
        )
        if keys == "partitioned":
            conn.execute("CREATE UNIQUE INDEX tasks_key ON tasks (id, filed_at)")
        conn.execute("CREATE UNIQUE INDEX tasks_one_per_rack_and_run ON tasks (run_id, rack_id, filed_at)")
        for name, definition in indexes:
            conn.execute(f"CREATE INDEX {name}_all ON tasks {definition}")
        conn.execute(
            f"ALTER TABLE tasks ADD CONSTRAINT {racks_key} FOREIGN KEY (rack_id) REFERENCES racks (id)"
            " ON DELETE CASCADE"
        )
    with step(
        writer, "5_child_keys_validated", "SHARE UPDATE EXCLUSIVE on each child, a scan and a probe a row"
    ):
        for child in CHILDREN if keys == "partitioned" else ():
            with conn.transaction():  # the key's SHARE ROW EXCLUSIVE locks, the tasks first (step 6)
                conn.execute("LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE")
                conn.execute(
                    f"ALTER TABLE {child} ADD CONSTRAINT {child}_filed_task"
                    " FOREIGN KEY (task_id, task_filed_at) REFERENCES tasks (id, filed_at)"
                    " ON DELETE CASCADE NOT VALID"
                )
            conn.execute(f"ALTER TABLE {child} VALIDATE CONSTRAINT {child}_filed_task")
    old_keys = {child: _foreign_key(conn, child, "tasks_legacy") for child in CHILDREN}
    with (
        step(writer, "6_children_switched", "ACCESS EXCLUSIVE on each child, catalog only"),
        conn.transaction(),
    ):
        # The tasks first: a writer inserts a task, then its attempt, in one transaction (found deadlocked
        # when the children were locked first).
        conn.execute("LOCK TABLE tasks IN SHARE ROW EXCLUSIVE MODE")
        for child in CHILDREN:
            conn.execute(f"ALTER TABLE {child} RENAME TO {child}_legacy")
            conn.execute(
                f"CREATE TABLE {child} (LIKE {child}_legacy INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                " PARTITION BY RANGE (task_filed_at)"
            )
            conn.execute(f"ALTER TABLE {child} DROP CONSTRAINT {child}_filed_before")
            conn.execute(
                f"ALTER TABLE {child} ATTACH PARTITION {child}_legacy"
                f" FOR VALUES FROM (MINVALUE) TO ({before})"
            )
            if keys == "partitioned":
                conn.execute(
                    f"ALTER TABLE {child} ADD CONSTRAINT {child}_filed_task"
                    " FOREIGN KEY (task_id, task_filed_at) REFERENCES tasks (id, filed_at) ON DELETE CASCADE"
                )
                conn.execute(f"ALTER TABLE {child}_legacy DROP CONSTRAINT {old_keys[child]}")


def make_week(conn: psycopg.Connection[Any], k: int, start: datetime, keys: str) -> None:
    """Week `k`'s six partitions, each with its own key; with `keys` "weekly", each child's with its key to
    the tasks' week."""
    bounds = f"FOR VALUES FROM ('{start.isoformat()}') TO ('{(start + WEEK).isoformat()}')"
    with conn.transaction():
        conn.execute(f"CREATE TABLE tasks_w{k} PARTITION OF tasks {bounds} WITH ({STORAGE})")
        conn.execute(f"ALTER TABLE tasks_w{k} ADD PRIMARY KEY (id)")
        for child, key in CHILDREN.items():
            conn.execute(f"CREATE TABLE {child}_w{k} PARTITION OF {child} {bounds}")
            conn.execute(f"ALTER TABLE {child}_w{k} ADD PRIMARY KEY ({key})")
            if keys == "weekly":
                conn.execute(
                    f"ALTER TABLE {child}_w{k} ADD FOREIGN KEY (task_id) REFERENCES tasks_w{k} (id)"
                    " ON DELETE CASCADE"
                )


def drop_week(conn: psycopg.Connection[Any], k: int) -> None:
    """Week `k`'s six partitions, the children first; the tasks' week detached, then dropped (with the
    partitioned children's keys, which depend on every partition of `tasks`, it cannot be dropped else)."""
    with conn.transaction():
        for child in CHILDREN:
            conn.execute(f"DROP TABLE {child}_w{k}")
        conn.execute(f"ALTER TABLE tasks DETACH PARTITION tasks_w{k}")
        conn.execute(f"DROP TABLE tasks_w{k}")


def refused(conn: psycopg.Connection[Any], sql: str, args: tuple[Any, ...]) -> str:
    try:
        with conn.transaction():
            conn.execute(sql, args)
    except psycopg.errors.IntegrityError as exc:
        return type(exc).__name__
    return "accepted"


def old_with_rows(conn: psycopg.Connection[Any]) -> uuid.UUID:
    """A task of the old partition with an attempt and a step's record."""
    row = conn.execute(
        "SELECT a.task_id FROM task_attempt_legacy a JOIN task_step_state_legacy s USING (task_id) LIMIT 1"
    ).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


def cascades(conn: psycopg.Connection[Any], task_id: uuid.UUID) -> str:
    """Whether deleting the task (by id alone, every partition probed) took its attempts and step records."""
    left = (
        "SELECT (SELECT count(*) FROM task_attempt WHERE task_id = %s)"
        " + (SELECT count(*) FROM task_step_state WHERE task_id = %s)"
    )
    before = conn.execute(left, (task_id, task_id)).fetchone()[0]  # type: ignore[index]
    conn.execute("DELETE FROM tasks WHERE id = %s", (task_id,))
    after = conn.execute(left, (task_id, task_id)).fetchone()[0]  # type: ignore[index]
    return f"{before}->{after}"


def rows_cost_us(
    conn: psycopg.Connection[Any], rack_id: uuid.UUID, filed: datetime | None, rows: int, repeat: int
) -> tuple[float, float]:
    """Median µs a row of inserting `rows` tasks in one statement, then a step's record of each (its key
    checked against the tasks: a row trigger each); filed at `filed`, or without a filing time (the flat
    table). Each repetition rolled back."""
    tasks_us, records_us = [], []
    filing = ", filed_at" if filed else ""
    recorded_filing = ", task_filed_at" if filed else ""
    for _ in range(repeat):
        ids = [id_at_time(filed) if filed else id_at_time(datetime.now(UTC)) for _ in range(rows)]
        with conn.transaction(force_rollback=True):
            started = time.perf_counter()
            conn.execute(
                f"INSERT INTO tasks ({TASK_COLUMNS}{filing})"
                " SELECT i, 'power_reset', '{}', %s, '[]', 'pending', now(), now(), NULL"
                + (", %s" if filed else "")
                + " FROM unnest(%s::uuid[]) i",
                (rack_id, filed, ids) if filed else (rack_id, ids),
            )
            middle = time.perf_counter()
            conn.execute(
                f"INSERT INTO task_step_state (task_id, attempt, component_id, recorded{recorded_filing})"
                f" SELECT id, 1, gen_random_uuid(), '{{}}'{filing} FROM tasks WHERE id = ANY(%s)"
                + (" AND filed_at = %s" if filed else ""),
                (ids, filed) if filed else (ids,),
            )
            ended = time.perf_counter()
        tasks_us.append((middle - started) / rows * 1e6)
        records_us.append((ended - middle) / rows * 1e6)
    return median(tasks_us), median(records_us)


def _without_filing(stmt: Select[Any]) -> Select[Any]:
    """The claim without the bound on the filing time that rackflow's pick carries since migration 0062
    (`filed_before`, `live_since`: `task_partitions.live_floor`), each comparison of `tasks.filed_at` made
    TRUE: the claim as this route was walked with, which the flat table (no `filed_at`) runs too, and which
    `claim_ms` bounds with this probe's own condition."""

    def replace(element: ClauseElement) -> ClauseElement | None:
        if isinstance(element, BinaryExpression) and element.left is tasks_table.c.filed_at:
            return true()
        return None

    stripped: Select[Any] = visitors.replacement_traverse(stmt, {}, replace)
    return stripped


def claim_ms(
    conn: psycopg.Connection[Any], url: str, since: datetime, repeat: int, *, partitioned: bool = True
) -> dict[str, tuple[float, float]]:
    """The executor's claim (`task_runs._pick_statement`, as rackflow builds it but for its own bound on the
    filing time, `_without_filing`, and plans it: custom plans, no bitmap read nor sort) over the
    partitioned tasks: median (planning, execution) ms, as it is and bounded to the old partition and the
    two weeks from `since` (the oldest live task's week, to a week past the current one: no task is filed
    later than its run fired), each run rolled back (it locks what it takes)."""
    db = Database(url)
    values = {
        "running_here": [uuid.uuid4()],
        "room": 10,
        "claimed_at": datetime.now(UTC),
        "claimer": uuid.uuid4(),
        "span": timedelta(seconds=30),
        "since": since,
        "until": since + 2 * WEEK,
    }
    pick = _without_filing(_pick_statement(db))
    bounded = pick.where(
        sql_text("(tasks.filed_at = '-infinity' OR tasks.filed_at >= :since AND tasks.filed_at < :until)")
    )
    medians = {}
    for name, stmt in (("as_it_is", pick), ("bounded", bounded))[: 2 if partitioned else 1]:
        compiled = stmt.compile(dialect=db.engine.dialect)
        assert "filed_before" not in compiled.string, compiled.string
        expanded = compiled.construct_expanded_state(values)
        planned, executed = [], []
        for _ in range(repeat):
            with conn.transaction(force_rollback=True):
                conn.execute(f"SET LOCAL plan_cache_mode = {PLAN_CACHE_MODE}")
                conn.execute("SET LOCAL enable_bitmapscan = off")
                conn.execute("SET LOCAL enable_sort = off")
                explained = f"EXPLAIN (ANALYZE, SUMMARY, FORMAT JSON) {expanded.statement}"
                plan = conn.execute(explained, expanded.parameters).fetchone()[0][0]  # type: ignore[index]
            planned.append(plan["Planning Time"])
            executed.append(plan["Execution Time"])
        medians[name] = (median(planned), median(executed))
    return medians


def planning_ms(conn: psycopg.Connection[Any], sql: str, args: tuple[Any, ...], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        plan = conn.execute(f"EXPLAIN (ANALYZE, SUMMARY, FORMAT JSON) {sql}", args).fetchone()[0][0]  # type: ignore[index]
        times.append(plan["Planning Time"])
    return median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser, kinds=("postgres",))
    parser.add_argument("--tasks", type=int, default=1_000_000, help="ended tasks over the past year")
    parser.add_argument("--weeks", type=int, default=52, help="weeks' partitions made after the switch")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--keys",
        choices=("partitioned", "weekly"),
        default="weekly",
        help="the children's keys: the partitioned tables' own, or each week's to the tasks' week",
    )
    parser.add_argument(
        "--live",
        type=int,
        default=300,
        help="live tasks before the migration and in its first week, for the claim",
    )
    parser.add_argument("--rows", type=int, default=5000, help="rows a statement, for the cost a row")
    args = parser.parse_args()
    print(code_line(), flush=True)
    print(machine_line(), flush=True)
    now = datetime.now(UTC)
    bound = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=7 - now.weekday())
    with fresh_database(args.db, args.pg_admin, REVISION) as ws:
        dsn = _dsn(ws.url)
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.perf_counter()
            with conn.transaction():
                _load(conn, args.tasks)
            conn.execute("VACUUM ANALYZE")
            sizes = conn.execute(
                "SELECT relname, reltuples::bigint FROM pg_class WHERE relname = ANY(%s)",
                (["tasks", *CHILDREN],),
            ).fetchall()
            result("loaded", s=time.perf_counter() - started, **{name: rows for name, rows in sizes})
            old_ids = [
                row[0] for row in conn.execute("SELECT id FROM tasks TABLESAMPLE SYSTEM (1) LIMIT 1000")
            ]
            rack_id = conn.execute("SELECT id FROM racks LIMIT 1").fetchone()[0]  # type: ignore[index]
            flat = rows_cost_us(conn, rack_id, None, args.rows, 5)
            # Live tasks when the migration runs (the old partition's, after it), for the claim.
            conn.execute(
                f"INSERT INTO tasks ({TASK_COLUMNS}) SELECT gen_random_uuid(), 'power_reset', '{{}}', %s,"
                " '[]', 'pending', now(), now(), NULL FROM generate_series(1, %s)",
                (rack_id, args.live),
            )
            conn.execute("ANALYZE tasks")
            flat_claim = claim_ms(conn, ws.url, bound, args.repeat, partitioned=False)["as_it_is"]
            writer = PreviousRelease(dsn, old_ids, rack_id)
            writer.start()
            time.sleep(1)
            migrate(conn, writer, bound, args.keys)
            with step(writer, "7_weeks_made", f"{args.weeks} weeks of six partitions, no scan"):
                for k in range(args.weeks):
                    make_week(conn, k, bound + k * WEEK, args.keys)
            time.sleep(1)
            writer.stopping.set()
            writer.join()
            result("previous_release", errors=len(writer.errors), calls=sum(writer.calls.values()))
            for error in writer.errors[:5]:
                print(f"# writer error: {error}")
            if writer.errors:
                raise SystemExit("the previous release's writes failed during the migration")

            # The head's rules after BOUND: a run's tasks filed at its id's millisecond, in its week.
            run_id = id_at_time(bound + timedelta(days=1))
            filed = bound + timedelta(days=1)
            task_id = id_at_time(filed)
            insert = (
                f"INSERT INTO tasks ({TASK_COLUMNS}, filed_at)"
                " VALUES (%s, 'power_reset', '{}', %s, '[]', 'completed', now(), now(), %s, %s)"
            )
            result(
                "a_task_of_a_run_in_its_week",
                outcome=refused(conn, insert, (task_id, rack_id, run_id, filed)),
            )
            second = (id_at_time(filed), rack_id, run_id, filed)
            result("a_second_task_of_the_rack_and_run", outcome=refused(conn, insert, second))
            attempt = (
                "INSERT INTO task_attempt (task_id, attempt, finished_at, status, task_filed_at)"
                " VALUES (%s, 1, now(), 'failed', %s)"
            )
            result("an_attempt_of_the_task", outcome=refused(conn, attempt, (task_id, filed)))
            result("an_attempt_of_no_task", outcome=refused(conn, attempt, (id_at_time(filed), filed)))
            result(
                "deleted_with_their_rows",
                week=cascades(conn, task_id),
                old=cascades(conn, old_with_rows(conn)),
            )

            weekly = rows_cost_us(conn, rack_id, bound + timedelta(days=2), args.rows, 5)
            result(
                "us_a_row",
                rows=args.rows,
                task_flat=flat[0],
                task_in_a_week=weekly[0],
                step_record_flat=flat[1],
                step_record_in_a_week=weekly[1],
            )
            by_id = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s"
            in_week = f"SELECT {TASK_COLUMNS} FROM tasks WHERE id = %s AND filed_at = %s"
            old = old_ids[0]
            result(
                "lookup_by_id_planning_ms",
                weeks=args.weeks,
                unbounded=planning_ms(conn, by_id, (task_id,), args.repeat),
                named_week=planning_ms(conn, in_week, (task_id, filed), args.repeat),
                named_legacy=planning_ms(conn, in_week, (old, "-infinity"), args.repeat),
            )
            live = [id_at_time(bound + timedelta(hours=1)) for _ in range(args.live)]
            conn.execute(
                f"INSERT INTO tasks ({TASK_COLUMNS}, filed_at)"
                " SELECT i, 'power_reset', '{}', %s, '[]', 'pending', now(), now(), NULL, %s"
                " FROM unnest(%s::uuid[]) i",
                (rack_id, bound + timedelta(hours=1), live),
            )
            conn.execute("ANALYZE tasks")
            claims = claim_ms(conn, ws.url, bound, args.repeat)
            result(
                "claim_ms",
                weeks=args.weeks,
                live=f"{args.live}+{args.live}",
                flat_planning=flat_claim[0],
                flat_execution=flat_claim[1],
                planning=claims["as_it_is"][0],
                execution=claims["as_it_is"][1],
                bounded_planning=claims["bounded"][0],
                bounded_execution=claims["bounded"][1],
            )
            started = time.perf_counter()
            drop_week(conn, 0)
            result("week_dropped", ms=(time.perf_counter() - started) * 1000, partitions=6)
    print(machine_line(), flush=True)


if __name__ == "__main__":
    main()
