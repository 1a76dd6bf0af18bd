"""The runs' partitions on PostgreSQL (migration 0046): `task_schedule_run` is partitioned by RANGE
(scheduled_for), one partition a week, so retention drops a week of runs instead of deleting its rows.

* Once per tick stays in the database as it was: the slot's unique index (scheduled_for, schedule_id)
  contains the partition key, so it is the partitioned table's own, and a slot's second run goes to the
  same partition and is refused there.
* A manual run has no slot (NULL), which no range holds: it goes to the DEFAULT partition,
  `task_schedule_run_default`, which is also every run the migration found (the old table, attached, not
  copied). Its CHECK `task_schedule_run_default_before` (scheduled_for IS NULL OR scheduled_for < the
  first week's start) is what lets a week's partition be attached without scanning it: PostgreSQL sees the
  CHECK excludes the new range. The same CHECK refuses a slot's run whose week has no partition, so
  partitions must exist before their slots fire: `ensure_partitions` makes them LOOKAHEAD ahead, at each
  instance's start-up (before its dispatcher), hourly after, and in the migration.
* One live rollout and one run awaiting approval per schedule cannot be unique indexes of `schedule_id`
  alone on a partitioned table. A row trigger on it (`task_schedule_run_live`, migration 0046) keeps them
  in LIVE, one row per (schedule, kind) naming its run: a second live run's insert is skipped, as `ON
  CONFLICT DO NOTHING` skipped it before; one made by an UPDATE raises `unique_violation`.
* Every other index is the partitioned table's, on each partition; each partition's primary key is its
  `id` (the parent has none: a key must hold `scheduled_for`, NULL for manual runs). A lookup by id alone
  reads each partition's key, unless bounded by what the id tells (below).
* `drop_partition` drops a week once it is all older than the run retention, none of its runs fired
  since the cutoff, none is still running, rolling, halted or awaiting approval (the runs the prune keeps).
  A schedule's next slot in or before it does not keep it: a paused schedule keeps its next slot for as
  long as it is paused, and would keep every week from there on; a slot of a dropped week that fires late
  makes its week again first (`ensure_weeks_for`). The runs of the DEFAULT partition, and of a past week
  that could not be dropped, are deleted in batches as before.
* Every change runs under an advisory lock, so instances do not make a week twice, and the pruner's and
  keeper's with a short lock timeout (`audit_partitions.wait_briefly`), so an ATTACH or DROP waiting behind
  a long read gives up for the round rather than queueing the drain behind it.

**A run's id names its partition.** A statement naming runs by id alone (the firing's write-back, the
kept task counts, the dispatcher's look-up of a claim in doubt, one run's reads and updates) planned and
probed every partition's key: at a year of weeks the drain's write-back spent about 350 ms planning. A
dispatched run's id is minted at its slot's millisecond (`domain.firing.run_id`), so its id tells the
slot, and `of_runs` bounds such a statement to the partitions that can hold those runs, which PostgreSQL
prunes to at plan time (rackflow's custom plans; at executor start for a generic one):

    scheduled_for IS NULL OR scheduled_for < :before               -- the DEFAULT partition
    OR scheduled_for >= :from_0 AND scheduled_for < :until_0 …     -- the ids' slots, SLOT_RANGES ranges

The first two arms are the DEFAULT partition whole (`before`: the bound of its CHECK, the first week the
migration made): manual runs, and every run the migration found there or an older release recorded
there, whatever their ids (those tell when a run was made, not its slot). The ranges are the ids'
milliseconds (min to max + 1 ms), split at their widest gaps into up to SLOT_RANGES, so a batch of slots
months apart does not plan the weeks between them; an id of another version, or of a millisecond before
`before`, adds no range (its run can only be in the DEFAULT partition). `of_slots` bounds by the runs'
own slots where a statement has them (the cap's delete, a run read before it is written): exact,
whoever made the ids.

**A run an id does not find**: one an instance of the previous release recorded while it still served
during a rolling upgrade, for a slot in a week's partition (on or after `before`, the Monday of the week
30 days after the migration; before it, its runs are in the DEFAULT partition): its id is when it fired. The
reads by id read again unbounded for the runs the bounded read did not find (`run_rows`, `read_runs`: one
run the API asks for, its page, approval, rejection, retry, a rollout's resume or cancel; a write-back's
second pass, so an approved run is completed; the grid's tallies and kept counts; start deadlines), which
costs a second statement only when a run is missing (such a run, or one pruned meanwhile). What such a run
misses: its count of tasks is never kept in its row (`kept_counts.keep`, a batch UPDATE by id), so the
grid counts its tasks at each look, as for a run not yet final; and a rollout of it approved or resumed
takes its first step at the rollout driver's next round, not at once (`rollouts.claim_rolling`)
(docs/OPERATIONS.md, "Migration 0046").
The dispatcher's look-up of its own claim (`dispatch.claimed_runs`) names only runs this release made.

SQLite has no partitions: it keeps the unique indexes, and nothing here applies to it (`of_runs` is TRUE).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import ColumnElement, Connection, Engine, Row, Select, and_, bindparam, or_, text, true
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.ids import time_of
from rackflow.store.audit_partitions import (
    PERIOD,
    Partition,
    bound_literal,
    is_partitioned,
    kept_from,
    older_than,
    partitions,
    wait_briefly,
)
from rackflow.store.db import Database
from rackflow.store.retention import made_ahead
from rackflow.store.tables import HISTORY_STORAGE, task_schedule_run

PARENT = "task_schedule_run"
DEFAULT_PARTITION = "task_schedule_run_default"
# The DEFAULT partition's CHECK: no slot on or after the first week's start.
BEFORE = "task_schedule_run_default_before"
# One row per schedule with a live rollout ('rollout': rolling or halted) or a run awaiting approval
# ('approval'), kept by the trigger of the same name.
LIVE = "task_schedule_run_live"
# Made this far ahead: two weeks of every instance's rounds failing pass before a slot finds no partition.
LOOKAHEAD = timedelta(days=14)
# A past week is dropped (emptied by the run cap, or past the retention) only once all of it is this far
# behind, so a firing's slot within this of its firing always finds its week; an older slot (a late firing,
# a one-time schedule set in the past) has its week made first, if it was dropped (`ensure_weeks_for`).
RECENT = timedelta(days=7)
# Held by each transaction that makes or drops a week of runs (pg_advisory_xact_lock).
_PARTITIONS_LOCK = 7_262_532_038


def from_slot(since: ColumnElement[Any]) -> ColumnElement[bool]:
    """A run of a schedule whose `runs_since` is `since` (a bound parameter or column): one without a slot
    (the DEFAULT partition), or of a slot from `since` on. PostgreSQL prunes the partitions before `since` by
    it, at planning or, for a per-row `since`, at each row (`dialect.past_newest`)."""
    slot = task_schedule_run.c.scheduled_for
    return or_(slot.is_(None), slot >= since)


def is_runs_partitioned(conn: Connection) -> bool:
    """Whether the runs are partitioned here (PostgreSQL from migration 0046 on)."""
    return is_partitioned(conn, PARENT)


def weeks(conn: Connection) -> list[Partition]:
    """The weeks' partitions, oldest first (the DEFAULT one left out)."""
    return [p for p in partitions(conn, PARENT) if not p.default]


def partition_name(start: datetime) -> str:
    return f"{PARENT}_p{start:%Y%m%d}"


def _lock(conn: Connection) -> None:
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PARTITIONS_LOCK})


def ensure_partitions(conn: Connection, now: datetime) -> list[str]:
    """Make the weeks from the newest partition's end to LOOKAHEAD after `now`, in the caller's
    transaction; returns the names made. Contiguous from the newest one, so an instance that was down for
    weeks fills the weeks its late firings need (their slots are after the newest week the migration or a
    keeper made)."""
    if not is_runs_partitioned(conn):
        return []
    _lock(conn)
    made: list[str] = []
    existing = weeks(conn)
    if not existing:  # migration 0046 makes the first; nothing to continue from
        return made
    start = max(p.upper for p in existing if p.upper is not None)
    while start <= now + LOOKAHEAD:
        add_week(conn, start)
        made.append(partition_name(start))
        start += PERIOD
    return made


def add_week(conn: Connection, start: datetime) -> None:
    """The partition of the week from `start`: made apart, with its key and the history's fill factor, and
    attached (a SHARE UPDATE EXCLUSIVE lock on the parent, so the drain goes on; the DEFAULT partition is
    locked for the catalog change only, its CHECK proving it holds none of the week)."""
    name = partition_name(start)
    storage = ", ".join(f"{key} = {value}" for key, value in HISTORY_STORAGE.items())
    conn.execute(
        text(
            f"CREATE TABLE {name} (LIKE {PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS,"
            f" CONSTRAINT {name}_pkey PRIMARY KEY (id)) WITH ({storage})"
        )
    )
    bounds = f"FROM ({bound_literal(start)}) TO ({bound_literal(start + PERIOD)})"
    conn.execute(text(f"ALTER TABLE {PARENT} ATTACH PARTITION {name} FOR VALUES {bounds}"))


def past_weeks(conn: Connection, cutoff: datetime) -> list[Partition]:
    """The weeks all of whose range is older than `cutoff`, oldest first: those `drop_partition` may drop."""
    if not is_runs_partitioned(conn):
        return []
    return older_than(weeks(conn), cutoff)


# The bound in the text of the DEFAULT partition's CHECK (BEFORE), as this session prints it; on the runs'
# table still while migration 0046 has yet to make it the DEFAULT partition.
_DEFAULT_BOUND = text(
    "SELECT (regexp_match(pg_get_constraintdef(oid), '< ''([^'']*)''::timestamp'))[1]::timestamptz"
    " FROM pg_constraint WHERE conname = :c"
    f" AND conrelid IN (to_regclass('{DEFAULT_PARTITION}'), to_regclass('{PARENT}'))"
)


def first_week(conn: Connection) -> datetime:
    """Where the weeks' partitions begin (the DEFAULT partition's CHECK: every slot before it is there; on
    the runs' table still, while migration 0046 has yet to make it the DEFAULT partition)."""
    bound: datetime = conn.execute(_DEFAULT_BOUND, {"c": BEFORE}).scalar_one()
    return bound


def late_slots(slots: Iterable[datetime | None], fired_at: datetime) -> list[datetime]:
    """Those of `slots` older than RECENT before `fired_at`: the ones whose week may have been dropped
    (emptied by the run cap, or past the retention), which `ensure_weeks_for` makes again. Newer slots need
    nothing: no week that recent is dropped, so a firing on time asks the database nothing more."""
    return [slot for slot in slots if slot is not None and slot < fired_at - RECENT]


def ensure_weeks_for(conn: Connection, late: Collection[datetime]) -> list[str]:
    """Make the weeks of the `late` slots (`late_slots`) that have no partition, in the caller's
    transaction, before their runs are recorded; returns the names made. A slot's run whose week has none
    is refused by the DEFAULT partition's CHECK, and a one-time schedule may be set at any past time."""
    if not late or not is_runs_partitioned(conn):
        return []
    first = first_week(conn)
    starts = {first + ((slot - first) // PERIOD) * PERIOD for slot in late if slot >= first}
    if not starts:
        return []
    _lock(conn)
    covered = {p.lower for p in weeks(conn)}
    made: list[str] = []
    for start in sorted(starts - covered):
        add_week(conn, start)
        made.append(partition_name(start))
    return made


def kept_floor(conn: Connection, cutoff: datetime) -> datetime | None:
    """Where the batched delete stops: the start of the oldest week not all older than `cutoff`. A run of a
    week from there on goes with its week (it is kept at most a week past the retention); an older one (in
    the DEFAULT partition, or in a past week kept for a live run) is deleted by itself. None: no weeks."""
    if not is_runs_partitioned(conn):
        return None
    return kept_from(weeks(conn), cutoff)


# A week is dropped only when, under its lock, none of its runs is one the prune keeps or fired since the
# cutoff.
_DROPPABLE = """
SELECT NOT EXISTS (SELECT FROM {week} WHERE fired_at >= :cutoff)
   AND NOT EXISTS (SELECT FROM {week} WHERE state = 'running')
   AND NOT EXISTS (SELECT FROM {live} l JOIN {week} r ON r.id = l.run_id)
"""


def drop_partition(conn: Connection, week: Partition, cutoff: datetime) -> int | None:
    """Drop `week` (in the caller's transaction, which should do nothing else) if nothing in it is kept
    (above), returning how many runs it held, counted just before; None if it must stay (its runs are then
    deleted in batches, as the DEFAULT partition's are) or another instance dropped it first."""
    return _drop_week_unless(conn, week, _DROPPABLE.format(week=week.name, live=LIVE), {"cutoff": cutoff})


# A past week the run cap has emptied: nothing in it (a late slot of it makes it again: `ensure_weeks_for`).
_EMPTIED = "SELECT NOT EXISTS (SELECT FROM {week})"


async def drop_emptied(db: Database) -> list[str]:
    """Drop each week all of whose range is RECENT behind that the run cap has emptied (each schedule keeps
    its newest runs, so its older weeks empty row by row), one short transaction each, waiting briefly for
    its locks; returns the names dropped. Without it the weeks would only go by `--run-retention`, which is
    off by default, and each week kept is one more partition that a look by schedule opens."""
    if not db.is_postgres:
        return []
    async with db.read() as conn:
        now = await db.now(conn)
        past = await conn.run_sync(past_weeks, now - RECENT)
    dropped: list[str] = []
    for week in past:
        async with db.transaction() as conn:
            emptied = _EMPTIED.format(week=week.name)
            if await conn.run_sync(_drop_week_unless, week, emptied, {}) is not None:
                dropped.append(week.name)
    return dropped


def _drop_week_unless(
    conn: Connection, week: Partition, droppable: str, params: dict[str, Any]
) -> int | None:
    """Drop `week` if the query `droppable` (over it) says it may go, under the partitions' lock and
    waiting briefly for the table's; returns how many runs it held, or None when it stays (or is gone)."""
    wait_briefly(conn)
    _lock(conn)
    if conn.execute(text("SELECT to_regclass(:p) IS NULL"), {"p": week.name}).scalar_one():
        return None
    if not conn.execute(text(droppable), params).scalar_one():
        return None
    rows = int(conn.execute(text(f"SELECT count(*) FROM {week.name}")).scalar_one())
    conn.execute(text(f"DROP TABLE {week.name}"))
    return rows


async def keep_ahead(db: Database) -> list[str]:
    """`ensure_partitions` in a round of the instance's keeper (`store.retention.made_ahead`)."""
    return await made_ahead(db, ensure_partitions)


# --- a run's partition named by its id -----------------------------------------------------------------

# How many ranges of slots a bounded statement names (`SLOTS`): always this many, those a batch does not
# need empty, so the statement has one text whatever the batch.
SLOT_RANGES = 4
_slot = task_schedule_run.c.scheduled_for


def _slots(values: dict[str, datetime] | None) -> ColumnElement[bool]:
    """The condition of the module's "A run's id names its partition", its parameters holding `values`
    (`slot_bounds`), or none (given at execution)."""

    def value(name: str) -> ColumnElement[datetime]:
        return bindparam(name, values[name] if values is not None else None, type_=_slot.type)

    return or_(
        _slot.is_(None),
        _slot < value("slots_before"),
        *(
            and_(_slot >= value(f"slots_from_{i}"), _slot < value(f"slots_until_{i}"))
            for i in range(SLOT_RANGES)
        ),
    )


# The bound, its values given at execution (`slot_bounds`): for statements built once, or run many times.
SLOTS = _slots(None)
_ID_SPAN = timedelta(milliseconds=1)  # the slots an id's millisecond stands for
_SLOT_SPAN = timedelta(microseconds=1)  # a slot itself, as stored
# Per engine: the bound of the DEFAULT partition's CHECK, or None where the runs are not partitioned
# (`_default_bound`).
_default_bounds: WeakKeyDictionary[Engine, datetime | None] = WeakKeyDictionary()


async def _default_bound(conn: AsyncConnection) -> datetime | None:
    """The bound of the DEFAULT partition's CHECK (BEFORE: no slot from there on, the start of the first
    week the migration made): every run the DEFAULT partition can hold has no slot or one before it. None
    where the runs are not partitioned (SQLite; PostgreSQL before migration 0046). Read once per engine:
    the migration sets it, and nothing changes it after."""
    if conn.dialect.name != "postgresql":
        return None
    engine = conn.sync_engine
    if engine in _default_bounds:
        return _default_bounds[engine]
    found = await conn.execute(_DEFAULT_BOUND, {"c": BEFORE})
    bound: datetime | None = found.scalar()
    _default_bounds[engine] = bound
    return bound


def _ranges(spans: Iterable[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """The spans [from, until) merged where they touch, then cut at the widest gaps into at most
    SLOT_RANGES ranges, in order."""
    merged: list[tuple[datetime, datetime]] = []
    for lower, upper in sorted(spans):
        if merged and lower <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], upper))
        else:
            merged.append((lower, upper))
    if len(merged) <= SLOT_RANGES:
        return merged
    gaps = sorted(range(1, len(merged)), key=lambda i: merged[i][0] - merged[i - 1][1], reverse=True)
    cuts = sorted(gaps[: SLOT_RANGES - 1])
    starts = [0, *cuts]
    ends = [*cuts, len(merged)]
    return [(merged[a][0], merged[b - 1][1]) for a, b in zip(starts, ends, strict=True)]


async def slot_bounds(
    conn: AsyncConnection, run_ids: Iterable[uuid.UUID] = (), slots: Iterable[datetime | None] = ()
) -> dict[str, datetime] | None:
    """The values of `SLOTS` for the runs of `run_ids` (by the millisecond each id tells) and of the runs
    whose slots are `slots`; None where the runs are not partitioned (SQLite), where `SLOTS` is not to be
    used."""
    before = await _default_bound(conn)
    if before is None:
        return None
    spans = [(at, at + _ID_SPAN) for at in map(time_of, run_ids) if at is not None and at + _ID_SPAN > before]
    spans += [(at, at + _SLOT_SPAN) for at in slots if at is not None and at >= before]
    ranges = _ranges(spans)
    values = {"slots_before": before}
    for i in range(SLOT_RANGES):
        lower, upper = ranges[i] if i < len(ranges) else (before, before)  # empty: no partition
        values[f"slots_from_{i}"], values[f"slots_until_{i}"] = lower, upper
    return values


async def of_runs(conn: AsyncConnection, run_ids: Iterable[uuid.UUID]) -> ColumnElement[bool]:
    """The condition on `task_schedule_run` that bounds a statement naming these runs by id to the
    partitions that can hold them (`SLOTS` with its values); TRUE where the runs are not partitioned."""
    values = await slot_bounds(conn, run_ids)
    return _slots(values) if values is not None else true()


async def of_slots(conn: AsyncConnection, slots: Iterable[datetime | None]) -> ColumnElement[bool]:
    """`of_runs` for runs whose slots are known: exact, whoever made their ids."""
    values = await slot_bounds(conn, slots=slots)
    return _slots(values) if values is not None else true()


async def read_runs(
    conn: AsyncConnection,
    run_ids: Sequence[uuid.UUID],
    stmt: Select[Any],
    finish: Callable[[Select[Any]], Select[Any]] = lambda stmt: stmt,
) -> list[Row[Any]]:
    """The rows of `stmt`, a read of the runs `run_ids` by id (it names them itself, and selects their
    `id`), bounded to their partitions (`of_runs`); the runs that finds none of read again unbounded
    (`run_rows` says why), so a run that no longer exists costs a second read. `finish` (a lock, an
    order) is applied to each statement last."""
    values = await slot_bounds(conn, run_ids)
    if values is None:
        return list((await conn.execute(finish(stmt))).all())
    rows = list((await conn.execute(finish(stmt.where(SLOTS)), values)).all())
    found = {row.id for row in rows}
    missing = [run_id for run_id in run_ids if run_id not in found]
    if missing:
        rows += (await conn.execute(finish(stmt.where(task_schedule_run.c.id.in_(missing))))).all()
    return rows


async def run_rows(conn: AsyncConnection, run_id: uuid.UUID, stmt: Select[Any]) -> Sequence[Row[Any]]:
    """The rows of `stmt`, a read of the run `run_id` (by its id) that the API asked for, bounded to its
    partitions (`of_runs`); read again unbounded when that finds none, so that a run an instance of the
    previous release recorded in a week's partition during a rolling upgrade (its id made when it fired,
    not at its slot) is found too. A run that does not exist costs both reads."""
    values = await slot_bounds(conn, [run_id])
    rows: Sequence[Row[Any]] = []
    if values is not None:
        rows = (await conn.execute(stmt.where(SLOTS), values)).all()
    return rows or (await conn.execute(stmt)).all()
