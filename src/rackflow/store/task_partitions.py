"""The tasks' partitions on PostgreSQL (migration 0062): `tasks` is partitioned by RANGE (filed_at), one
partition a week, and the five tables that reference a task (`CHILDREN`) alike by `task_filed_at`, so
retention drops a week of tasks, with their attempts, step records and pre-flight rows, instead of deleting
them row by row (docs/PERFORMANCE.md, "The tasks' partitions by filing time").

**The filing time is a function of the task's id** (`filed_at`): the millisecond of a version 7 id, and
LONG_AGO for any other id (the random ids of tasks made before rackflow's ids were time-ordered). A
run's tasks are minted at their run id's millisecond (`ids.id_beside`; a dispatched run's id is its
slot's), so every task of a run, whichever path submits it and whenever (a rollout's later wave, a
window's deferral), is filed in one week, and the partitioned unique index on (run_id, rack_id,
filed_at) holds "one task per rack per firing" as the flat table's (run_id, rack_id) did. A manual
task's id is minted at its creation.

* **The table the migration found is the partition before the weeks**, `tasks_before`, [MINVALUE, BOUND),
  kept whole with its rows, its key and its unique (run_id, rack_id) index; each child's old table is its
  `…_before` partition, with its key to `tasks_before`. Its rows were filed at LONG_AGO (the column's
  default), as is whatever the release before 0062 writes while a rolling upgrade keeps it serving: that
  release must be gone by BOUND, a Monday a week or more after the migration (the weeks' first; on a
  database with no task and no run, the Monday of the migration's week), so a run's tasks are never split
  between the partition before and a week.
* **Each week's children reference the tasks' week** (`ON DELETE CASCADE`, as before): a key to the
  partitioned tasks would cost every step record a look over the partitions (4x the CPU, measured). A
  week is six tables, made together (`add_week`: each made apart and attached, so the drain goes on) and
  dropped together, the children first.
* **Weeks are made** LOOKAHEAD ahead by every instance (at start-up and hourly: `keep_ahead`) and by the
  migration, and at once for a task filed in a week that has none (`ensure_weeks_for`, in the insert's
  transaction): a late firing whose week was dropped, a clock weeks ahead. **Weeks are dropped** by the
  task retention (`drop_week`) once all of their range is past it and none of their tasks is one the prune
  keeps; the partition before, and a week that must stay, are deleted in batches as before.
* **A statement naming tasks by id names their partitions** (`of_tasks`): the filing times of those ids,
  and LONG_AGO for the rows filed before 0062. Without it PostgreSQL probes every week's key.
* **A read of the live tasks reads the weeks that can hold one** (`live_filing`, `live_weeks`): the
  partition before the weeks and the weeks from `task_live_weeks.since`, lowered by the transaction that
  files a task further back and raised by the keeper (`raise_live_since`). Without it each lookup of a
  rack's live tasks planned every week: 19-44 ms of planning a statement at a year of weeks.

SQLite keeps flat tables with the same columns (written alike, never read for routing); nothing else here
applies to it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from weakref import WeakKeyDictionary

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Engine,
    Table,
    and_,
    any_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.ids import time_of
from rackflow.store.audit_partitions import (
    PERIOD,
    Partition,
    bound_literal,
    kept_from,
    older_than,
    partitions,
    period_start,
    wait_briefly,
)
from rackflow.store.audit_partitions import is_partitioned as _is_partitioned
from rackflow.store.db import Database
from rackflow.store.retention import made_ahead
from rackflow.store.tables import (
    TASK_STORAGE,
    preflight_overrides,
    preflight_results,
    preflight_tasks,
    task_attempt,
    task_late_weeks,
    task_live_weeks,
    task_step_state,
    tasks,
)

# Where a task of an id that tells no time is filed, and every task the migration found.
LONG_AGO = datetime(1, 1, 1, tzinfo=UTC)
PARENT = tasks.name
# The tables whose rows belong to a task, partitioned by their task's filing time (`task_filed_at`).
CHILDREN: tuple[Table, ...] = (
    task_attempt,
    task_step_state,
    preflight_tasks,
    preflight_results,
    preflight_overrides,
)
# The partitions the migration made of the tables it found.
BEFORE_SUFFIX = "_before"
# Made this far ahead: two weeks of every instance's rounds failing pass before a task's week is made
# in its insert's transaction.
LOOKAHEAD = timedelta(days=14)
# A week is dropped only once all of it is this far behind (and past the retention), so a task filed
# within this of now always finds its week without asking the catalog.
RECENT = timedelta(days=7)
# Held by each transaction that makes or drops a week of tasks (pg_advisory_xact_lock).
_PARTITIONS_LOCK = 7_262_532_062


def filed_at(task_id: uuid.UUID) -> datetime:
    """The task's filing time, its partition key: the millisecond its id was minted at, LONG_AGO for an
    id that tells none."""
    return time_of(task_id) or LONG_AGO


def of_tasks(
    dialect: str, column: ColumnElement[datetime], task_ids: Iterable[uuid.UUID]
) -> ColumnElement[bool]:
    """The condition on a filing column (`tasks.c.filed_at`, a child's `task_filed_at`) that bounds a
    statement naming these tasks by id to their partitions: their filing times, and LONG_AGO for a task
    filed before migration 0062 whatever its id. One array parameter, so the text does not depend on the
    number of tasks; PostgreSQL prunes to those partitions when it plans with the values. TRUE on SQLite."""
    if dialect != "postgresql":
        return true()
    values = sorted({LONG_AGO, *map(filed_at, task_ids)})
    return column == any_(bindparam(f"{column.name}_of_tasks", values, type_=ARRAY(column.type)))


def partition_name(table: str, start: datetime) -> str:
    return f"{table}_p{start:%Y%m%d}"


def is_partitioned(conn: Connection) -> bool:
    """Whether the tasks are partitioned here (PostgreSQL from migration 0062 on)."""
    return _is_partitioned(conn, PARENT)


def weeks(conn: Connection) -> list[Partition]:
    """The tasks' weeks, oldest first (the partition before them left out)."""
    return [p for p in partitions(conn, PARENT) if p.lower is not None]


def first_week(conn: Connection) -> datetime | None:
    """BOUND: where the weeks begin (the upper bound of the partition before them); None where the tasks
    are not partitioned."""
    if not is_partitioned(conn):
        return None
    return next((p.upper for p in partitions(conn, PARENT) if p.lower is None), None)


def _lock(conn: Connection) -> None:
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PARTITIONS_LOCK})


def add_week(conn: Connection, start: datetime) -> None:
    """The six partitions of the week from `start`, the tasks' first: each made apart, with its key (the
    parents have none: a key must hold the filing time), and attached (a SHARE UPDATE EXCLUSIVE lock on its
    parent, which reads and writes do not wait for; CREATE TABLE … PARTITION OF would take an ACCESS
    EXCLUSIVE one). A child's week references the tasks' week."""
    bounds = f"FOR VALUES FROM ({bound_literal(start)}) TO ({bound_literal(start + PERIOD)})"
    week = partition_name(PARENT, start)
    for table in (tasks, *CHILDREN):
        name = partition_name(table.name, start)
        key = ", ".join(column.name for column in table.primary_key.columns)
        parts = [
            f"LIKE {table.name} INCLUDING DEFAULTS INCLUDING CONSTRAINTS",
            f"CONSTRAINT {name}_pkey PRIMARY KEY ({key})",
        ]
        storage = ""
        if table is tasks:
            storage = " WITH (" + ", ".join(f"{k} = {v}" for k, v in TASK_STORAGE.items()) + ")"
        else:
            references = f"REFERENCES {week} (id) ON DELETE CASCADE"
            parts.append(f"CONSTRAINT {name}_task_id_fkey FOREIGN KEY (task_id) {references}")
        conn.execute(text(f"CREATE TABLE {name} ({', '.join(parts)}){storage}"))
        conn.execute(text(f"ALTER TABLE {table.name} ATTACH PARTITION {name} {bounds}"))


def make_weeks(conn: Connection, starts: Iterable[datetime]) -> list[str]:
    """The weeks of `starts` that have none yet (under the partitions' lock), made; their names."""
    _lock(conn)
    existing = {p.lower for p in weeks(conn)}
    made: list[str] = []
    for start in sorted(set(starts) - existing):
        add_week(conn, start)
        made.append(partition_name(PARENT, start))
    return made


def ensure_partitions(conn: Connection, now: datetime) -> list[str]:
    """Make every week from `now`'s to LOOKAHEAD later (none before the first week) that has none, in the
    caller's transaction; returns the tasks' names of those made."""
    bound = first_week(conn)
    if bound is None:
        return []
    start, starts = max(bound, period_start(now)), []
    while start <= now + LOOKAHEAD:
        starts.append(start)
        start += PERIOD
    made = make_weeks(conn, starts)
    _known_weeks(conn.engine).update(starts)
    return made


async def keep_ahead(db: Database) -> list[str]:
    """`ensure_partitions` in a round of the instance's keeper (`store.retention.made_ahead`)."""
    return await made_ahead(db, ensure_partitions)


# Per engine: the weeks known to exist from RECENT ago on (none of them is dropped), so that a task filed
# in one asks the catalog nothing; and BOUND, read once (the migration sets it, nothing changes it).
_known: WeakKeyDictionary[Engine, set[datetime]] = WeakKeyDictionary()
_bounds: WeakKeyDictionary[Engine, datetime | None] = WeakKeyDictionary()


def _known_weeks(engine: Engine) -> set[datetime]:
    return _known.setdefault(engine, set())


async def ensure_weeks_for(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> list[str]:
    """Before these tasks (or rows of theirs) are inserted, in the caller's transaction: make the weeks
    they are filed in that have no partition (a task whose week has none is refused). A week known to
    exist from RECENT ago on costs nothing; an older one (it may have been dropped: a late firing of a slot
    past the retention) is looked up in the catalog each time. Returns the tasks' names of the weeks made."""
    if conn.dialect.name != "postgresql":
        return []
    engine = conn.sync_engine
    bound = await _bound(conn)
    if bound is None:
        return []
    recent = period_start(_now() - RECENT)
    known = _known_weeks(engine)
    needed = {period_start(at) for at in map(filed_at, task_ids) if at >= bound}
    await _lower_live_since(conn, needed)
    missing = {start for start in needed if start < recent or start not in known}
    if not missing:
        return []
    made: list[str] = await conn.run_sync(make_weeks, missing)
    known.update(start for start in missing if start >= recent)
    return made


# --- the weeks a page of the newest tasks is in -----------------------------------------------------------

# How many weeks, back from the newest a page can hold, each try of a newest-first page of tasks reads
# before every week is (`page_weeks`). A page of a schedule's tasks of every status, planned over a year
# of weeks, planned for 86 ms and ran for 17 (docs/PERFORMANCE.md, "A page of tasks from the newest weeks").
PAGE_WEEKS = (1, 4, 16)
_LATE_SINCE = select(task_late_weeks.c.week).where(
    task_late_weeks.c.last_created_at >= bindparam("since", type_=task_late_weeks.c.last_created_at.type)
)


async def page_weeks(conn: AsyncConnection, newest: datetime) -> list[datetime]:
    """Where each try of a newest-first page of tasks created no later than `newest` (a page after a key:
    the key's creation time; a first page: now) begins, narrowest first: the start of the last
    PAGE_WEEKS[i] weeks to `newest`'s (none where the tasks are not partitioned: SQLite, PostgreSQL before
    0062). A try reads the tasks created since its start (`created_since`); one that fills its page answers
    it, since every task created since then was read and every other one is older than all of those."""
    if not await _in_weeks(conn):
        return []
    return [period_start(newest) - (count - 1) * PERIOD for count in PAGE_WEEKS]


async def created_since(conn: AsyncConnection, since: datetime) -> tuple[ColumnElement[bool], ...]:
    """The conditions that hold for every task created at or after `since` (a week's start, on PostgreSQL)
    and bound a read to the partitions such a task can be in: those filed from `since` on, and those where
    a task was created that late (`task_late_weeks`; for a week before BOUND, the partition before the
    weeks). Exact: a task filed before `since` and created after it was created after its week ended, and
    the trigger of migration 0063 wrote its week in the insert's transaction. Their values are parameters
    PostgreSQL plans with, so it plans those partitions alone."""
    column = tasks.c.filed_at
    bound = await _bound(conn)
    filed = [column >= since]
    for (week,) in await conn.execute(_LATE_SINCE, {"since": since}):
        if bound is not None and week < bound:
            filed.append(column < bound)
        else:
            filed.append(and_(column >= week, column < week + PERIOD))
    return tasks.c.created_at >= since, or_(*filed)


async def created_from(conn: AsyncConnection, at: datetime) -> tuple[ColumnElement[bool], ...]:
    """`created_since` the start of `at`'s week, for a read of the tasks created at or after `at` (the
    overview's counts and failures of a day); none where the tasks are not partitioned."""
    return await created_since(conn, period_start(at)) if await _in_weeks(conn) else ()


# --- the weeks that can hold a live task -------------------------------------------------------------

_LIVE_SINCE = select(task_live_weeks.c.since).where(task_live_weeks.c.id == 1)


def live_filing(
    filed: ColumnElement[datetime] = tasks.c.filed_at, weeks: Mapping[str, datetime] | None = None
) -> ColumnElement[bool]:
    """The condition on a filing column (`tasks.c.filed_at`, an alias's, a child's `task_filed_at`) that
    bounds a read of live (or held) tasks to the partitions that can hold one, its values from
    `live_weeks` (`weeks` if given, else the statement's parameters): the partition before the weeks, and
    the weeks from `since` on."""

    def value(name: str) -> BindParameter[datetime]:
        if weeks is None:
            return bindparam(name, type_=filed.type)
        return bindparam(name, weeks[name], type_=filed.type)

    return or_(filed < value("filed_before"), filed >= value("live_since"))


LIVE_FILING = live_filing()


def in_live_weeks(
    weeks: Mapping[str, datetime], *filed: ColumnElement[datetime]
) -> tuple[ColumnElement[bool], ...]:
    """`live_filing` of each filing column for a statement run with `weeks` (`live_weeks`'s values); none
    on SQLite, whose `weeks` are empty."""
    return tuple(live_filing(column) for column in filed) if weeks else ()


async def live_only(conn: AsyncConnection) -> tuple[ColumnElement[bool], ...]:
    """`live_filing` of `tasks.filed_at` with its values (`live_weeks`) read now, for a read of live tasks
    whose statement is not run with them (a count, a list); none on SQLite."""
    weeks = await live_weeks(conn)
    return (live_filing(tasks.c.filed_at, weeks),) if weeks else ()


async def live_weeks(conn: AsyncConnection) -> dict[str, datetime]:
    """The values of `live_filing`, read in the caller's transaction ({} on SQLite, which has no partitions
    and whose statements leave it out): BOUND, and where the weeks that can hold a live task begin
    (`task_live_weeks`; BOUND, every week, when it has no row). The reads of the live tasks (the executor's
    claim, a submission's conflicts, the promotion check) then plan the partitions from there alone: at a
    year of weeks a claim planned in 9 ms over every week, against 0.7 (docs/PERFORMANCE.md).

    Exact, whoever files: a transaction that files a task in a week before `since` lowers it first, holding
    its row until it commits (`ensure_weeks_for`), and the keeper raises it under that row's lock
    (`raise_live_since`). A reader that holds a rack's lock reads every live task of that rack: one filed
    for it meanwhile was filed under the same lock."""
    if conn.dialect.name != "postgresql":
        return {}
    bound = await _bound(conn)
    if bound is None:  # not partitioned: every condition holds
        return {"filed_before": LONG_AGO, "live_since": LONG_AGO}
    since = (await conn.execute(_LIVE_SINCE)).scalar()
    return {"filed_before": bound, "live_since": bound if since is None else max(since, bound)}


async def _in_weeks(conn: AsyncConnection) -> bool:
    """Whether the tasks are partitioned by week here (PostgreSQL from 0062 on, as this engine first saw
    it)."""
    return conn.dialect.name == "postgresql" and await _bound(conn) is not None


async def _bound(conn: AsyncConnection) -> datetime | None:
    engine = conn.sync_engine
    if engine not in _bounds:
        _bounds[engine] = await conn.run_sync(first_week)
    return _bounds[engine]


_LOWER_LIVE_SINCE = (
    update(task_live_weeks)
    .where(task_live_weeks.c.id == 1)
    .values(since=func.least(task_live_weeks.c.since, bindparam("week", type_=task_live_weeks.c.since.type)))
)


async def _lower_live_since(conn: AsyncConnection, starts: Collection[datetime]) -> None:
    """Tasks about to be filed in the weeks of `starts`, some of them before the weeks every live read
    covers whatever `since` says (a week before this one): lower `since` to the oldest, holding its row
    until commit, so that the keeper, which raises it under that lock, sees them once they are there."""
    late = [start for start in starts if start < period_start(_now() - RECENT)]
    if late:
        await conn.execute(_LOWER_LIVE_SINCE, {"week": min(late)})


def _now() -> datetime:
    return datetime.fromtimestamp(time.time(), UTC)


# Whether a task is live or held, as the reads `LIVE_FILING` bounds take it (`store.tasks.is_live_on_rack`).
_OLDEST_LIVE = text(
    "SELECT min(filed_at) FROM tasks WHERE filed_at >= :bound"
    " AND (status IN ('pending', 'running', 'waiting') OR owner_id IS NOT NULL)"
)


async def raise_live_since(db: Database) -> datetime | None:
    """The keeper's round: `task_live_weeks.since` raised to the week of the oldest live or held task filed
    in a week, or of a week ago if that is older. Its row is locked first, so a transaction filing a task
    further back (which lowers it, holding the row) has committed, and the task is counted. A missing row
    is made (every week) and raised at the next round: a filer that found none took no lock. Returns the
    value written (None: nothing, not partitioned or the row just made)."""
    if not db.is_postgres:
        return None
    async with db.transaction() as conn:
        await conn.run_sync(wait_briefly)
        bound = await _bound(conn)
        if bound is None:
            return None
        locked = await conn.execute(_LIVE_SINCE.with_for_update())
        if locked.scalar() is None:
            await conn.execute(insert(task_live_weeks).values(id=1, since=bound))
            return None
        oldest: datetime | None = (await conn.execute(_OLDEST_LIVE, {"bound": bound})).scalar()
        since = max(bound, period_start(min(oldest or _now(), _now() - RECENT)))
        await conn.execute(update(task_live_weeks).where(task_live_weeks.c.id == 1).values(since=since))
        return since


# --- retention ---------------------------------------------------------------------------------------

# A week is dropped only when, under its lock, none of its tasks is one the prune keeps: not ended, or
# ended or made since the cutoff, held by an executor, or of a live rollout (`tasks.prune_finished_tasks`).
_DROPPABLE = """
SELECT NOT EXISTS (
    SELECT FROM {week} t
    WHERE t.status NOT IN ('completed', 'failed', 'terminated')
       OR t.created_at >= :cutoff OR t.finished_at IS NULL OR t.finished_at >= :cutoff
       OR t.owner_id IS NOT NULL
) AND NOT EXISTS (
    SELECT FROM {week} t JOIN task_schedule_run_live l ON l.run_id = t.run_id AND l.kind = 'rollout'
)
"""


def past_weeks(conn: Connection, cutoff: datetime) -> list[Partition]:
    """The weeks all of whose range is older than `cutoff`, oldest first: those `drop_week` may drop."""
    if not is_partitioned(conn):
        return []
    return older_than(weeks(conn), cutoff)


def drop_week(conn: Connection, week: Partition, cutoff: datetime) -> int | None:
    """Drop the six partitions of `week` (in the caller's transaction, which should do nothing else), the
    children first, if none of its tasks is kept (above); returns how many tasks it held, counted just
    before; None when it must stay (its tasks are then deleted in batches) or another instance dropped it.
    The tasks are locked first (DROP would lock them last), as every writer locks them before their
    children: a reader of the tasks waiting for the week's lock would otherwise deadlock with it."""
    wait_briefly(conn)
    _lock(conn)
    if conn.execute(text("SELECT to_regclass(:p) IS NULL"), {"p": week.name}).scalar_one():
        return None
    conn.execute(text(f"LOCK TABLE {PARENT} IN ACCESS EXCLUSIVE MODE"))
    if not conn.execute(text(_DROPPABLE.format(week=week.name)), {"cutoff": cutoff}).scalar_one():
        return None
    rows = int(conn.execute(text(f"SELECT count(*) FROM {week.name}")).scalar_one())
    assert week.lower is not None
    for table in (*CHILDREN, tasks):
        conn.execute(text(f"DROP TABLE {partition_name(table.name, week.lower)}"))
    conn.execute(delete(task_late_weeks).where(task_late_weeks.c.week == week.lower))
    return rows


def find_late_weeks(conn: Connection) -> None:
    """Record in `task_late_weeks` the late tasks `tasks` holds (PostgreSQL): for each week, the latest
    creation at or after the week's end, read from the week's creation-time index; for the partition
    before the weeks, whose rows were filed long ago, its latest creation, as one row of the week of long
    ago. A week's row only rises. Migration 0063 runs it on the tasks it found, under its trigger's lock; a
    bulk load whose inserts skipped the trigger (`bench/scale_load.py` loads as a replica) runs it after.
    SQLite's tasks are not partitioned, and its table stays empty.

        INSERT INTO task_late_weeks (week, last_created_at)
        SELECT :week, max(created_at) FROM tasks_p<week> WHERE created_at >= :week_end
        HAVING max(created_at) IS NOT NULL ON CONFLICT (week) DO UPDATE …
    """
    if not is_partitioned(conn):
        return
    found = [(f"{PARENT}{BEFORE_SUFFIX}", LONG_AGO, "TRUE")]
    for week in weeks(conn):
        assert week.lower is not None
        found.append(
            (week.name, week.lower, f"created_at >= timestamptz {bound_literal(week.lower + PERIOD)}")
        )
    for partition, start, where in found:
        conn.execute(
            text(
                f"INSERT INTO {task_late_weeks.name} (week, last_created_at)"
                f" SELECT timestamptz {bound_literal(start)}, max(created_at) FROM {partition} WHERE {where}"
                " HAVING max(created_at) IS NOT NULL ON CONFLICT (week) DO UPDATE"
                " SET last_created_at = excluded.last_created_at"
                f" WHERE {task_late_weeks.name}.last_created_at < excluded.last_created_at"
            )
        )


def kept_floor(conn: Connection, cutoff: datetime) -> datetime | None:
    """Where the batched delete stops: the start of the oldest week not all older than `cutoff` (a task of
    a week from there on goes with its week); None: no weeks."""
    if not is_partitioned(conn):
        return None
    return kept_from(weeks(conn), cutoff)
