"""Bulk loading for `bench/scale.py`: a fleet with a year of history, cloned server-side from rows rackflow
itself wrote.

Why server-side: 10^7 runs and 10^7 tasks sent from Python, even by COPY, spend most of the load turning
values into text on this side; `INSERT … SELECT … FROM generate_series` makes them inside PostgreSQL, in
chunks of `CHUNK` rows per transaction (so no transaction holds gigabytes of WAL).

Faithful rows: a rack, a schedule on it, one manual firing of it (its run and task) and one audit event are
first written through rackflow's own services and store on the migrated schema; every other row is a copy
of those with only its ids, names, times and links changed (`_clone`): the columns it does not name are the
template's, so a column added by a later migration is copied too. Outcomes are written in
`store.schedules.outcomes_to_json`'s shape (their counts in `outcome_counts_to_json`'s), and `check_rows`
reads a cloned run and task back through rackflow's own row readers. Ids are shaped as rackflow makes them
(`rackflow.ids`: UUIDv7, the row's own time first) and derived from the row's number and time, so rows link
to each other without a join (`run k` submitted `task k`, of schedule `k % schedules`): see `Ids`. A task's
id is of its run's millisecond (`ids.id_beside`), and the task is filed there (`filed_at`, the tasks'
partition key since migration 0062, `store.task_partitions`), so each goes to its run's week.

Layout (S schedules, R racks, N runs, A audit events, K racks an NVLink domain):
* racks 0..R-1, each with one COMPUTE component, made a year and a day ago, rack r in NVLink domain r // K
  (K = 1 by default: a fleet of GB200 NVL72 racks has a domain a rack; K = 0: no domains);
* schedules 0..S-1 (interval 24h), made one a millisecond from then, schedule s on rack s % R, next run
  spread over the day after tomorrow (so nothing fires during the reads; the drain makes 10,000 of them due
  on purpose); a fleet's mix of operations and pauses rather than one of each (`operation_kind`,
  `PAUSED_EVERY`), so that a filter an operator uses matches what it would in a real fleet: a few of them,
  or most, or almost none;
* run k (0..N-1) of schedule k % S, its (k // S)-th firing, spread over the past year, completed, one
  outcome "submitted" naming task k; task k (its schedule's operation) ended 30 s after it started, most
  completed, some failed or terminated (`task_status`), most created as their run fired and some days or
  weeks later (`task_created`); each scope's last task is its newest run's;
* one schedule "scale-big" over racks 0..B-1 with G runs of B outcomes each (the runs grid);
* audit events 0..A-1 spread over the year, by 50 principals round-robin.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Table, literal_column, select, text, update

from rackflow.clock import SystemClock
from rackflow.domain.audit import AuditEvent
from rackflow.ids import time_of
from rackflow.services import Services
from rackflow.store import audit as audit_store
from rackflow.store import runs as run_history
from rackflow.store import schedules as schedule_store
from rackflow.store import task_partitions
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import (
    audit_events,
    components,
    racks,
    task_schedule,
    task_schedule_run,
    task_schedule_scope,
    tasks,
)

CHUNK = 500_000
PRINCIPALS = 50
# One schedule in PAUSED_EVERY is paused (by an operator, for a firmware freeze), as some of a fleet are.
PAUSED_EVERY = 50
DAY_S = 86_400
YEAR = "interval '365 days'"


def unix_ms(at: str) -> str:
    """The SQL of the unix millisecond `at` (SQL, a timestamptz) falls in, a bigint."""
    return f"floor(extract(epoch FROM {at}) * 1000)::bigint"


def uid(kind: str, n: str, at: str) -> str:
    """The SQL of row `n`'s id of `kind`, made at `at` (SQL, the row's own time): a UUIDv7 as rackflow
    makes them (`rackflow.ids`), so the loaded indexes are in the order rackflow's own writes leave them.
    The unix milliseconds of `at`, version 7, then the bits of md5(kind, n) but for the variant's nibble
    (`8`: md5 is computed once an id, which keeps the loader's speed): deterministic, so a row names
    another by its number and time, without a join."""
    ms = f"lpad(to_hex({unix_ms(at)}), 12, '0')"
    hashed = f"md5('{kind}' || ({n})::text)"
    return f"overlay(overlay({hashed} placing {ms} || '7' from 1 for 13) placing '8' from 17 for 1)::uuid"


def filed(at: str) -> str:
    """The SQL of the filing time of a task whose id is of `at` (`uid`): the millisecond its id tells, as
    a timestamptz (`task_partitions.filed_at`), computed as the CHECK `tasks_filed_by_id` reads it from
    the id (milliseconds / 1000.0), so the two agree to the microsecond."""
    return f"to_timestamp({unix_ms(at)} / 1000.0)"


def operation_kind(n: str) -> str:
    """The SQL of the operation schedule `n` runs: a fleet's mix, power on and reset the most, a firmware
    upgrade on 15 %, bring-up on one schedule in a thousand (the rare filter)."""
    return (
        f"CASE WHEN ({n}) % 1000 = 999 THEN 'bring_up' WHEN ({n}) % 20 < 8 THEN 'power_on' "
        f"WHEN ({n}) % 20 < 10 THEN 'power_off' WHEN ({n}) % 20 < 14 THEN 'power_reset' "
        f"WHEN ({n}) % 20 < 17 THEN 'upgrade_firmware' ELSE 'ingest' END"
    )


# The version the loaded firmware upgrades install: a firmware upgrade with none is refused at every firing
# (`target_version: a firmware upgrade needs a target version`), so without it the loaded fleet's upgrades
# failed where a real fleet's fire, and a drain of them did other work than the empty database's.
TARGET_VERSION = "2.1.0"


def operation_parameters(parameters: str, n: str) -> str:
    """The SQL of an operation's parameters (`parameters`: a JSON object as a template's operation holds
    them) for schedule `n`'s operation (`operation_kind`), its firmware upgrade with `TARGET_VERSION`."""
    kind = operation_kind(n)
    version = f"CASE WHEN {kind} = 'upgrade_firmware' THEN '{TARGET_VERSION}' ELSE '' END"
    with_kind = f"jsonb_set({parameters}, '{{kind}}', to_jsonb({kind}))"
    return f"jsonb_set({with_kind}, '{{target_version}}', to_jsonb({version}))"


def operation_template(template: str, n: str) -> str:
    """The SQL of schedule `n`'s operation template, from `template` (a schedule's, as JSON)."""
    operation = operation_parameters(f"({template} -> 'operation')", n)
    return f"jsonb_set({template}, '{{operation}}', {operation})"


def task_status(n: str) -> str:
    """The SQL of how task `n` ended: 3 % failed, 1 % terminated, the rest completed, spread over the fleet
    (by a hash of its number: not by schedule nor operation, whose tasks fail now and then, not always)."""
    bucket = f"abs(hashint8(({n})::bigint)) % 100"
    return f"CASE WHEN {bucket} < 3 THEN 'failed' WHEN {bucket} = 3 THEN 'terminated' ELSE 'completed' END"


def task_created(fired: str, n: str, anchor: str) -> str:
    """The SQL of task `n`'s creation time, its run having fired at `fired`: most at once, but 1 % one to
    three days later (a rollout's later wave, an approval or a window waited for) and 1 in 10,000 a week to
    seven weeks later (a long wait), never after the load (`anchor`). A task created after its filing
    week ended is a late one (migration 0063, `task_late_weeks`): without them every list of tasks read
    its newest weeks alone, which no fleet could count on."""
    bucket = f"abs(hashint8(({n})::bigint)) % 10000"
    late = (
        f"CASE WHEN {bucket} = 0 THEN interval '1 day' * (7 + ({n}) % 44)"
        f" WHEN {bucket} % 100 = 1 THEN interval '1 hour' * (24 + ({n}) % 49) END"
    )
    return f"CASE WHEN {fired} + {late} <= {anchor} THEN {fired} + {late} ELSE {fired} END"


def task_message(status: str) -> str:
    """The SQL of an ended task's message, by its status (SQL), as the executor words one."""
    return (
        f"CASE {status} WHEN 'failed' THEN 'failed on node-0 (1/1): BMC did not answer within 30s' "
        f"WHEN 'terminated' THEN 'cancelled by user-3' ELSE t.message END"
    )


class Ids:
    """Each loaded row's id (SQL) from its number, and the time it was made (SQL) from which its id is."""

    def __init__(
        self, anchor: datetime, schedules: int, per_schedule: int, audit: int, big_runs: int
    ) -> None:
        self.anchor = f"'{anchor.isoformat()}'::timestamptz"
        self.schedules = schedules
        self.per_schedule = per_schedule
        self.audit_n = max(audit, 1)
        self.big_runs = big_runs
        # The fleet's racks, components and scopes: made a year and a day before the load.
        self.born = f"({self.anchor} - {YEAR} - interval '1 day')"

    def rack(self, n: str) -> str:
        return uid("rack", n, self.born)

    def domain(self, n: str) -> str:
        return uid("domain", n, self.born)

    def comp(self, n: str) -> str:
        return uid("comp", n, self.born)

    def scope(self, n: str) -> str:
        return uid("scope", n, self.born)

    def sched_made(self, n: str) -> str:
        """One a millisecond, as created one after another (one creation time for all would make every
        list by creation time one tie, broken by id)."""
        return f"({self.born} + ({n}) * interval '1 millisecond')"

    def sched(self, n: str) -> str:
        return uid("sched", n, self.sched_made(n))

    def fired(self, n: str) -> str:
        """Run n's time: schedule n % S's (n // S)-th firing, spaced evenly over the year before the load
        (one fixed time: a run and its task, loaded minutes apart, agree)."""
        s, per = self.schedules, self.per_schedule
        return (
            f"({self.anchor} - {YEAR} + (({n}) / {s}) * ({YEAR} / {per})"
            f" + (({n}) % {s} % {DAY_S}) * interval '1 second')"
        )

    def run(self, n: str) -> str:
        return uid("run", n, self.fired(n))

    def task(self, n: str) -> str:
        """Run n's task, minted at its run's millisecond, as rackflow mints a run's tasks
        (`ids.id_beside`): of `fired(n)`, the time run n's id is of."""
        return uid("task", n, self.fired(n))

    def task_filed(self, n: str) -> str:
        """Task n's filing time, its partition key (`tasks.filed_at`): the millisecond its id tells, its
        run's."""
        return filed(self.fired(n))

    def audit_at(self, n: str) -> str:
        return f"({self.anchor} - {YEAR} + ({n}) * ({YEAR} / {self.audit_n}))"

    def audit(self, n: str) -> str:
        return uid("audit", n, self.audit_at(n))

    def big(self) -> str:
        return uid("big", "0", self.born)

    def big_fired(self, j: str) -> str:
        """The grid schedule's run j: daily, the last yesterday."""
        return f"(date_trunc('day', {self.anchor}) - ({self.big_runs} - ({j})) * interval '1 day')"

    def bigrun(self, j: str) -> str:
        return uid("bigrun", j, self.big_fired(j))

    def bigtask(self, n: str, j: str) -> str:
        """Task n of the grid schedule's run j, minted at that run's millisecond (as `task`)."""
        return uid("bigtask", n, self.big_fired(j))

    def bigtask_filed(self, j: str) -> str:
        """The filing time of the grid schedule's run j's tasks: that run's millisecond."""
        return filed(self.big_fired(j))

    def bigscope(self, n: str) -> str:
        return uid("bigscope", n, self.born)


def rack_name(n: str) -> str:
    return f"'scale-r' || lpad(({n})::text, 7, '0')"


def domain_name(n: str) -> str:
    return f"'scale-d' || lpad(({n})::text, 7, '0')"


async def write_templates(url: str) -> dict[str, uuid.UUID]:
    """A rack, a schedule on it, one manual firing (its run and its task, through the services), the task
    completed and the run written back as the executor would, and one audit event of a pause on it."""
    from _common import _create_template  # the bench's own service-made rack and schedule

    from rackflow.timespec import ScheduleSpec, SpecType

    rack_id, schedule_id = await _create_template(
        url, "scale-template", ScheduleSpec(SpecType.INTERVAL, "24h", "UTC")
    )
    db = Database(url)
    try:
        services = Services.build(db, SystemClock())
        (task_id,) = await services.schedules.trigger(schedule_id)
        async with db.transaction() as conn:
            run_id = (
                await conn.execute(
                    select(task_schedule_run.c.id).where(task_schedule_run.c.schedule_id == schedule_id)
                )
            ).scalar_one()
            snapshot = (await audit_store.schedule_snapshots(conn, {schedule_id}))[schedule_id]
            now = await db.now(conn)
            audit_id = uuid.uuid4()
            await audit_store.insert_events(
                conn,
                [
                    AuditEvent(
                        id=audit_id,
                        at=now,
                        principal="user-0",
                        method="PauseTaskSchedule",
                        target_ids=(str(schedule_id),),
                        outcome="OK",
                        error="",
                        request={"id": {"id": str(schedule_id)}, "reason": "firmware freeze"},
                        schedule_before=snapshot,
                        schedule_after={**snapshot, "enabled": False},
                    )
                ],
            )
            await conn.execute(
                update(tasks)
                .where(tasks.c.id == task_id)
                .values(status="completed", started_at=now, finished_at=now, updated_at=now, owner_id=None)
            )
            run = (
                await conn.execute(select(task_schedule_run).where(task_schedule_run.c.id == run_id))
            ).one()
            await run_history.complete_runs(conn, {run_id: schedule_store.run_from_row(run).outcomes})
    finally:
        await db.dispose()
    return {"rack": rack_id, "schedule": schedule_id, "task": task_id, "run": run_id, "audit": audit_id}


def series(first: int, last: int) -> str:
    """The FROM item of rows first..last-1, each named g."""
    return f"generate_series({first}, {last - 1}) g"


def _clone(
    conn: Any, table: Table, template_id: uuid.UUID, overrides: Mapping[str, str], series: str
) -> None:
    """INSERT into `table` one row per `g` of `series` (a FROM item naming g, and anything the overrides
    use), each the template row with `overrides` (column -> SQL expression)."""
    columns = [c.name for c in table.columns]
    values = [overrides.get(c, f"t.{c}") for c in columns]
    conn.execute(
        text(
            f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {', '.join(values)} "
            f"FROM {table.name} t, {series} WHERE t.id = :template"
        ),
        {"template": template_id},
    )


SECONDARY_INDEXES = text(
    "SELECT i.indexname, i.indexdef FROM pg_indexes i WHERE i.tablename = :table AND NOT EXISTS "
    "(SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname) AND i.indexdef NOT LIKE '% WHERE %'"
)
# A partitioned index (on the partitioned runs, migration 0046, and tasks, migration 0062) and its
# partitions' indexes, parents first: each with its own definition and the index it is attached to. A
# partitioned index's definition is `CREATE INDEX … ON ONLY <parent> …`, which makes it alone (invalid, on
# no partition); each partition's index is made from its own and attached to it, so every index gets its
# name back (the DEFAULT partition's, or the one before the weeks', are the old table's, renamed by the
# migration). Nothing for an index of a plain table.
INDEX_TREE = text(
    "SELECT p.relid::regclass::text, p.parentrelid::regclass::text, pg_get_indexdef(p.relid)"
    " FROM pg_partition_tree(CAST(:index AS regclass)) p ORDER BY p.level"
)
# Those of `names` that are not there, not valid, or not attached to their `parents`' index.
INDEXES_BROKEN = text(
    "SELECT n.name FROM unnest(CAST(:names AS text[]), CAST(:parents AS text[])) AS n(name, parent)"
    " LEFT JOIN pg_index i ON i.indexrelid = to_regclass(n.name)"
    " WHERE i.indexrelid IS NULL OR NOT i.indisvalid OR (n.parent IS NOT NULL AND NOT EXISTS"
    " (SELECT FROM pg_inherits h WHERE h.inhrelid = i.indexrelid AND h.inhparent = to_regclass(n.parent)))"
)


@contextmanager
def secondary_indexes_rebuilt(engine: Engine, *tables: Table) -> Iterator[None]:
    """Drop the full indexes of `tables` that back no constraint, and make them again (from their own
    definitions, as migrated) after the block: one sort per index instead of ten million random inserts
    into each, as pg_restore does. Primary keys and unique constraints stay (foreign keys need them), and
    so do partial indexes (history rows are not in most of them, and PostgreSQL spells a rebuilt one's
    predicate differently from the migration's). A partitioned table's index is dropped with its
    partitions' indexes, and made again as one per partition attached to it (`INDEX_TREE`); every index
    made is checked valid and attached after."""
    with engine.connect() as conn:
        tops = [row for table in tables for row in conn.execute(SECONDARY_INDEXES, {"table": table.name})]
        found: list[tuple[str, str | None, str]] = []
        for name, definition in tops:
            tree = [(row[0], row[1], row[2]) for row in conn.execute(INDEX_TREE, {"index": name})]
            found += tree or [(name, None, definition)]
    with engine.begin() as conn:
        for name, _ in tops:  # a partitioned index takes its partitions' indexes with it
            conn.execute(text(f'DROP INDEX "{name}"'))
    yield
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL maintenance_work_mem = '512MB'"))
        for name, parent, definition in found:
            conn.execute(text(definition))
            if parent is not None:  # the last partition's index attached makes its parent valid
                conn.execute(text(f"ALTER INDEX {parent} ATTACH PARTITION {name}"))
        broken = (
            conn.execute(
                INDEXES_BROKEN, {"names": [row[0] for row in found], "parents": [row[1] for row in found]}
            )
            .scalars()
            .all()
        )
    if broken:
        raise RuntimeError(f"indexes not valid or not attached after the rebuild: {', '.join(broken)}")
    print(
        f"# rebuilt {len(tops)} indexes ({len(found)} with their partitions') in "
        f"{time.perf_counter() - started:.1f}s",
        flush=True,
    )


# The partitions that hold a partitioned table's rows (the runs from migration 0046: the DEFAULT one and the
# weeks'; the tasks from migration 0062: the one before the weeks and the weeks'); nothing for a plain
# table, which holds its own. A partitioned table has no storage, so no storage options (`ALTER TABLE … SET
# (fillfactor …)` fails on it).
PARTITIONS = text(
    "SELECT relid::regclass::text FROM pg_partition_tree(CAST(:table AS regclass)) WHERE isleaf"
)


@contextmanager
def pages_filled(engine: Engine, *tables: Table) -> Iterator[None]:
    """Write the history's rows into full pages (`fillfactor = 100`), then give `tables` back the storage
    options they were migrated with (`HISTORY_STORAGE`, 90 since migration 0033). Both are done on the
    relations that hold the rows: a plain table itself, each of a partitioned table's `PARTITIONS` (the
    runs), each given its own options back.

    Why: a year of runs and tasks leaves no room a new row can take in its old pages. Each was inserted
    small and rewritten larger (a firing's write-back, a task's end), so a page takes new rows until the fill
    factor stops them, its rows then grow into the room kept for that, and vacuum gives back only the old
    versions of the latest rows: the free space map offers only the newest pages (`bench/free_space.py
    --layout aged`: 1 page of the oldest 5,342 offered to a new run, 459 of the newest 2,136). Loaded at their
    final size at fill factor 90 (`--layout loaded90`), every page kept 10 % and up to a row more, and every
    page was offered: each run a drain inserted read one old page from the disk, a state a real database is
    in only after a restore or a rewrite, until each old page has taken one new row (docs/PERFORMANCE.md,
    "The slot's index led by time")."""
    with engine.connect() as conn:
        heaps = [
            heap
            for table in tables
            for heap in conn.execute(PARTITIONS, {"table": table.name}).scalars().all() or [table.name]
        ]
        options: dict[str, list[str] | None] = {
            heap: conn.execute(
                text("SELECT reloptions FROM pg_class WHERE oid = to_regclass(:heap)"), {"heap": heap}
            ).scalar()
            for heap in heaps
        }
    with engine.begin() as conn:
        for heap in heaps:
            conn.execute(text(f"ALTER TABLE {heap} SET (fillfactor = 100)"))
    yield
    with engine.begin() as conn:
        for heap in heaps:
            conn.execute(text(f"ALTER TABLE {heap} RESET (fillfactor)"))
            migrated = options[heap]
            if migrated:
                conn.execute(text(f"ALTER TABLE {heap} SET ({', '.join(migrated)})"))


def _chunked(engine: Engine, total: int, what: str, insert: Any, start: int = 0) -> None:
    """`insert(conn, first, last)` for each chunk [first, last) of start..total, one transaction each."""
    started = time.perf_counter()
    for first in range(start, total, CHUNK):
        last = min(total, first + CHUNK)
        with engine.begin() as conn:
            # The rows are made consistent by construction (`check_rows` reads them back): the foreign keys'
            # per-row checks are skipped for the load, as pg_restore's data-only mode does.
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            insert(conn, first, last)
    print(f"# loaded {what}={total - start} in {time.perf_counter() - started:.1f}s", flush=True)


def load(
    engine: Engine,
    *,
    schedules: int,
    racks_n: int,
    runs: int,
    tasks_n: int,
    audit: int,
    big_racks: int,
    big_runs: int,
    domain_racks: int = 1,
) -> Ids:
    """Write the fleet and its history (see the module docstring), then ANALYZE; returns its ids. Only the
    newest `tasks_n` runs keep their task, as with a --task-retention shorter than the --run-retention (the
    older runs' outcomes name tasks that are gone, as pruning leaves them)."""
    tpl = asyncio.run(write_templates(engine.url.render_as_string(hide_password=False)))
    per_schedule = max(1, runs // schedules)
    r, s = racks_n, schedules
    paused = f"g % {PAUSED_EVERY} = {PAUSED_EVERY // 2}"
    ids = Ids(datetime.now(UTC), s, per_schedule, audit, big_runs)

    k = domain_racks
    # A domain has only its id, name and creation time (no template row to clone): one a millisecond, so
    # that the list's order is the creation order, as domains made one after another leave it.
    _chunked(
        engine,
        -(-r // k) if k else 0,
        "nvl_domains",
        lambda conn, a, b: conn.execute(
            text(
                f"INSERT INTO nvl_domains (id, name, created_at) SELECT {ids.domain('g')}, "
                f"{domain_name('g')}, {ids.born} + g * interval '1 millisecond' FROM {series(a, b)}"
            )
        ),
    )
    _chunked(
        engine,
        r,
        "racks",
        lambda conn, a, b: (
            _clone(
                conn,
                racks,
                tpl["rack"],
                {
                    "id": ids.rack("g"),
                    "name": rack_name("g"),
                    "external_id": rack_name("g"),
                    "nvl_domain_id": ids.domain(f"g / {k}") if k else "NULL",
                    "created_at": ids.born,
                },
                series(a, b),
            ),
        ),
    )
    component_id = _scalar(engine, select(components.c.id).where(components.c.rack_id == tpl["rack"]))
    _chunked(
        engine,
        r,
        "components",
        lambda conn, a, b: _clone(
            conn,
            components,
            component_id,
            {
                "id": ids.comp("g"),
                "rack_id": ids.rack("g"),
                "name": rack_name("g") + " || '-c0'",
                "external_id": rack_name("g") + " || '-c0'",
                "created_at": ids.born,
            },
            series(a, b),
        ),
    )
    _chunked(
        engine,
        s,
        "schedules",
        lambda conn, a, b: _clone(
            conn,
            task_schedule,
            tpl["schedule"],
            {
                "id": ids.sched("g"),
                "name": "'scale-s' || lpad(g::text, 7, '0')",
                "next_run_at": f"now() + interval '2 days' + (g % {DAY_S}) * interval '1 second'",
                "last_run_at": f"now() - interval '1 day' + (g % {DAY_S}) * interval '1 second'",
                "created_at": ids.sched_made("g"),
                "updated_at": ids.sched_made("g"),
                "operation_template": operation_template("t.operation_template", "g"),
                "enabled": f"NOT ({paused})",
                "paused_at": f"CASE WHEN {paused} THEN now() - interval '3 days' END",
                "pause_reason": f"CASE WHEN {paused} THEN 'firmware freeze' ELSE '' END",
                "paused_by": f"CASE WHEN {paused} THEN 'user-3' ELSE '' END",
                # The runs `_load_history` gives it (run g is schedule g % s's), as its firings counted them.
                "run_count": f"{runs // s} + CASE WHEN g < {runs % s} THEN 1 ELSE 0 END",
                # Its oldest run's slot (migration 0047), as its firings keep it: its first, run g. Written
                # here, not by an UPDATE of every schedule after the load, which left the front half of the
                # heap empty (every capped count or filter read in physical order read twice the pages).
                "runs_since": f"CASE WHEN g < {runs} THEN {ids.fired('g')} END",
            },
            series(a, b),
        ),
    )
    with (
        secondary_indexes_rebuilt(engine, task_schedule_run, tasks),
        pages_filled(engine, task_schedule_run, tasks),
    ):
        _load_history(engine, tpl, ids, r, runs, tasks_n)
    with engine.begin() as conn:
        # The late tasks' weeks, which the trigger on `tasks` would have recorded but for `_chunked`'s
        # replica role.
        task_partitions.find_late_weeks(conn)
    scope_id = _scalar(
        engine, select(task_schedule_scope.c.id).where(task_schedule_scope.c.schedule_id == tpl["schedule"])
    )
    newest = f"g + {(per_schedule - 1) * s}"
    _chunked(
        engine,
        s,
        "scopes",
        lambda conn, a, b: _clone(
            conn,
            task_schedule_scope,
            scope_id,
            {
                "id": ids.scope("g"),
                "schedule_id": ids.sched("g"),
                "rack_id": ids.rack(f"g % {r}"),
                "last_task_id": f"CASE WHEN {newest} < {runs} THEN {ids.task(newest)} END",
                "created_at": ids.born,
            },
            series(a, b),
        ),
    )
    _load_big(engine, tpl, ids, big_racks, big_runs, scope_id, r)
    _chunked(
        engine,
        audit,
        "audit",
        lambda conn, a, b: _clone(
            conn,
            audit_events,
            tpl["audit"],
            {
                "id": ids.audit("g"),
                "at": ids.audit_at("g"),
                "principal": f"'user-' || (g % {PRINCIPALS})",
                "target_ids": f"jsonb_build_array({ids.sched(f'g % {s}')}::text)",
            },
            series(a, b),
        ),
    )
    started = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    print(f"# VACUUM ANALYZE in {time.perf_counter() - started:.1f}s", flush=True)
    return ids


def _load_history(
    engine: Engine, tpl: Mapping[str, uuid.UUID], ids: Ids, r: int, runs: int, tasks_n: int
) -> None:
    s, fired = ids.schedules, ids.fired("g")
    outcomes = (
        "jsonb_build_array(jsonb_build_object("
        f"'scope_id', {ids.scope(f'g % {s}')}::text, 'rack_id', {ids.rack(f'g % {s} % {r}')}::text, "
        f"'outcome', 'submitted', 'task_id', {ids.task('g')}::text, 'error', ''))"
    )

    _chunked(
        engine,
        runs,
        "runs",
        lambda conn, a, b: _clone(
            conn,
            task_schedule_run,
            tpl["run"],
            {
                "id": ids.run("g"),
                "schedule_id": ids.sched(f"g % {s}"),
                "fired_at": fired,
                "scheduled_for": fired,
                "trigger": "'dispatch'",
                "outcomes": outcomes,
            },
            series(a, b),
        ),
    )
    _chunked(
        engine,
        runs,
        "tasks",
        lambda conn, a, b: _clone_tasks(conn, tpl, ids, r, series(a, b)),
        start=max(0, runs - tasks_n),
    )


def _clone_tasks(conn: Any, tpl: Mapping[str, uuid.UUID], ids: Ids, r: int, series: str) -> None:
    s, fired = ids.schedules, ids.fired("g")
    created = task_created(fired, "g", ids.anchor)
    _clone(
        conn,
        tasks,
        tpl["task"],
        {
            "id": ids.task("g"),
            "rack_id": ids.rack(f"g % {s} % {r}"),
            "component_ids": f"jsonb_build_array({ids.comp(f'g % {s} % {r}')}::text)",
            "schedule_id": ids.sched(f"g % {s}"),
            "run_id": ids.run("g"),
            "filed_at": ids.task_filed("g"),
            "operation": operation_kind(f"g % {s}"),
            "parameters": operation_parameters("t.parameters", f"g % {s}"),
            "status": task_status("g"),
            "message": task_message(task_status("g")),
            "created_at": created,
            "started_at": f"{created} + interval '1 second'",
            "finished_at": f"{created} + interval '31 seconds'",
            "updated_at": f"{created} + interval '31 seconds'",
            "queue_expires_at": f"CASE WHEN t.queue_expires_at IS NOT NULL THEN {created} + "
            "(t.queue_expires_at - t.created_at) END",
        },
        series,
    )


def _load_big(
    engine: Engine,
    tpl: Mapping[str, uuid.UUID],
    ids: Ids,
    big_racks: int,
    big_runs: int,
    scope_id: uuid.UUID,
    len_racks: int,
) -> None:
    """The schedule of the runs grid: `big_racks` scopes, `big_runs` daily runs of one outcome each."""
    if big_racks <= 0:
        return
    if big_racks > len_racks:
        raise ValueError(f"--big-racks {big_racks} is more than --racks {len_racks}")
    started = time.perf_counter()
    big = ids.big()
    with engine.begin() as conn:
        _clone(
            conn,
            task_schedule,
            tpl["schedule"],
            {
                "id": big,
                "name": "'scale-big'",
                "next_run_at": "now() + interval '2 days'",
                "run_count": str(big_runs),
                "runs_since": ids.big_fired("0"),
                "created_at": ids.born,
                "updated_at": ids.born,
            },
            "generate_series(0, 0) g",
        )
    fired = ids.big_fired("j")
    for j in range(big_runs):
        with engine.begin() as conn:
            task_number = f"{j} * {big_racks} + g"
            outcomes = (
                "(SELECT jsonb_agg(jsonb_build_object("
                f"'scope_id', {ids.bigscope('g')}::text, 'rack_id', {ids.rack('g')}::text, "
                f"'outcome', 'submitted', 'task_id', {ids.bigtask(task_number, str(j))}::text, 'error', '') "
                f"ORDER BY g) FROM generate_series(0, {big_racks - 1}) g)"
            )
            _clone(
                conn,
                task_schedule_run,
                tpl["run"],
                {
                    "id": ids.bigrun("j"),
                    "schedule_id": big,
                    "fired_at": fired,
                    "scheduled_for": fired,
                    "trigger": "'dispatch'",
                    "outcomes": outcomes,
                    "outcome_counts": f"jsonb_build_object('submitted', jsonb_build_array(0, {big_racks}))",
                },
                f"(SELECT {j} AS j) g",
            )
            _clone(
                conn,
                tasks,
                tpl["task"],
                {
                    "id": ids.bigtask(task_number, "j"),
                    "rack_id": ids.rack("g"),
                    "component_ids": f"jsonb_build_array({ids.comp('g')}::text)",
                    "schedule_id": big,
                    "run_id": ids.bigrun(str(j)),
                    "filed_at": ids.bigtask_filed(str(j)),
                    "status": task_status(task_number),
                    "message": task_message(task_status(task_number)),
                    "created_at": fired,
                    "started_at": f"{fired} + interval '1 second'",
                    "finished_at": f"{fired} + interval '31 seconds'",
                    "updated_at": f"{fired} + interval '31 seconds'",
                    "queue_expires_at": "NULL",
                },
                f"generate_series(0, {big_racks - 1}) g, (SELECT {j} AS j) jj",
            )
    with engine.begin() as conn:
        _clone(
            conn,
            task_schedule_scope,
            scope_id,
            {
                "id": ids.bigscope("g"),
                "schedule_id": big,
                "rack_id": ids.rack("g"),
                "last_task_id": ids.bigtask(f"{big_runs - 1} * {big_racks} + g", str(big_runs - 1)),
                "created_at": ids.born,
            },
            f"generate_series(0, {big_racks - 1}) g",
        )
    print(
        f"# loaded big schedule racks={big_racks} runs={big_runs} in {time.perf_counter() - started:.1f}s",
        flush=True,
    )


def _scalar(engine: Engine, stmt: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(stmt).scalar_one()


async def check_rows(url: str, ids: Ids, run_number: int) -> None:
    """Read cloned run `run_number` (the newest: its task is kept), its task and an audit event back
    through rackflow's own readers: a loader that wrote something rackflow would not fails here, not in a
    figure. Its id is a UUIDv7 of the time it fired."""
    db = Database(url)
    try:
        async with db.read() as conn:
            row = (
                await conn.execute(
                    select(task_schedule_run).where(
                        task_schedule_run.c.id == literal_column(ids.run(str(run_number)))
                    )
                )
            ).one()
            fired_ms = (row.fired_at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)
            assert row.id.version == 7 and row.id.int >> 80 == fired_ms, (row.id, row.fired_at)
            run = schedule_store.run_from_row(row)
            (outcome,) = run.outcomes
            counted = schedule_store.tally_from_json(schedule_store.outcome_counts_to_json(run.outcomes))
            assert schedule_store.tally_from_json(row.outcome_counts) == counted
            task = await task_store.get_task(conn, outcome.task_id)  # type: ignore[arg-type]
            expected = (await conn.execute(text(f"SELECT {task_status(str(run_number))}"))).scalar_one()
            assert task is not None and task.status.value == expected, task
            # Filed where its id says, at its run's millisecond, in a week's partition where there are
            # weeks (`scale.make_year_of_task_partitions`), not in the one before them.
            filing = (
                await conn.execute(
                    select(tasks.c.filed_at, literal_column("tableoid::regclass::text")).where(
                        tasks.c.id == task.id
                    )
                )
            ).one()
            assert filing[0] == task_partitions.filed_at(task.id) == time_of(row.id), (task.id, filing)
            if db.is_postgres and (await conn.run_sync(task_partitions.first_week)) is not None:
                assert filing[1] != f"{tasks.name}{task_partitions.BEFORE_SUFFIX}", filing
            events, _ = await audit_store.list_events(conn, limit=1)
            assert events, "no audit events"
    finally:
        await db.dispose()
