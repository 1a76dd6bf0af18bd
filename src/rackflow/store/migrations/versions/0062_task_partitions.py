"""tasks: partitioned by week of their filing time on PostgreSQL, with the five tables that reference a task,
so retention drops a week instead of deleting its rows (issue 29)

Every table gets its filing time: `tasks.filed_at`, and `task_filed_at` on `task_attempt`,
`task_step_state`, `preflight_tasks`, `preflight_results` and `preflight_overrides`, a constant default
(LONG_AGO, 0001-01-01 UTC) that the rows found keep and the release before this one writes while it still
serves. This release writes the filing time of each task's id (`store.task_partitions`). SQLite: the
columns and the table `task_live_weeks` (step 6), nothing else.

PostgreSQL: each table becomes a table partitioned by RANGE of its filing time, the table found becoming
its partition `…_before`, [MINVALUE, BOUND), with its rows, key, indexes and foreign keys: nothing is
copied. BOUND is the Monday (UTC) of the week after the week LEAD_DAYS from now (8 to 14 days ahead), or
this week's Monday on a database with no task and no run (nothing the release before could split). On a
connection of its own, outside the migration's transaction, while reads and writes go on:

1. the columns added (an ACCESS EXCLUSIVE lock each, for no scan: a constant default);
2. on each table `CHECK (filed_at < BOUND) NOT VALID` (the lock, no scan), then validated (a scan under
   SHARE UPDATE EXCLUSIVE, which writes do not wait for); and alike on the tasks `tasks_filed_by_id`, which every
   partition inherits: a task is filed where its id says, and a run's tasks together (below);
3. `CREATE UNIQUE INDEX CONCURRENTLY uq_tasks_run_id_rack_id_filed_at ON tasks (run_id, rack_id,
   filed_at)`, the partitioned table's unique index, taken over as the partition's.

Then, in the migration's transaction, the racks locked against writes (the partitioned tasks' key to them is
made), then the tasks, then the children (the order every writer takes), for catalog changes only:

4. `tasks` renamed `tasks_before` with its indexes; the partitioned `tasks` made like it, with the old
   table's foreign key to the racks and its indexes (their definitions read from the catalog, so each is
   taken over as the partitioned one's: no build), but for its key on `id` and its unique (run_id,
   rack_id), which stay the partition's own; `tasks_before` attached ([MINVALUE, BOUND): the CHECK spares
   the scan);
5. each child alike (its key and its key to `tasks_before` stay the partition's);
6. the weeks from BOUND to `task_partitions.LOOKAHEAD` from now, six tables each; and the table
   `task_live_weeks`, where the weeks that can hold a live task begin (BOUND: every week), which the reads
   of the live tasks are bounded by (`task_partitions.live_weeks`).

If the side connection cannot take a step (a lock timeout), the migration does it itself: the CHECKs' scans
and the index's build then block writes. A retry takes over the CHECKs and the index it finds.

Downgrade copies every table into an unpartitioned one (a rewrite, offline) with its keys and indexes.

Revision ID: 0062
Revises: 0061
Create Date: 2026-12-07
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from rackflow.store.task_partitions import ensure_partitions

revision = "0062"
down_revision = "0061"
branch_labels = None
depends_on = None

TASKS = "tasks"
CHILDREN = ("task_attempt", "task_step_state", "preflight_tasks", "preflight_results", "preflight_overrides")
LONG_AGO = "'0001-01-01 00:00:00+00'"
LEAD_DAYS = 7
UNIQUE = "uq_tasks_run_id_rack_id_filed_at"
LIVE_WEEKS = "task_live_weeks"
UNIQUE_BEFORE = "uq_tasks_run_id_rack_id"  # the flat table's, kept by the partition before the weeks
SIDE_LOCK_TIMEOUT = "5s"

BOUND = f"""
SELECT CASE
    WHEN NOT EXISTS (SELECT FROM {TASKS}) AND NOT EXISTS (SELECT FROM task_schedule_run)
    THEN date_trunc('week', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
    ELSE date_trunc('week', (greatest(now(), (SELECT max(created_at) FROM {TASKS})) + interval '{LEAD_DAYS} days')
        AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' + interval '7 days'
END
"""


# Every task is filed where its id says (`task_partitions.filed_at`), and a task of a run has an id of its
# run's millisecond (`ids.id_beside`), so that the partitioned unique index of (run_id, rack_id, filed_at)
# holds one task per rack per firing, whatever writes it: a run's tasks share a filing time, in one
# partition. Or it is filed LONG_AGO (the rows found, and what the release before writes until it is gone)
# for a run of before BOUND, or of an id that tells no time, which the partition before the weeks holds,
# where its own unique index of (run_id, rack_id) holds the rule. Refused: a task filed LONG_AGO for a run
# of BOUND or later (it would go before the weeks, its run's other tasks in a week), or filed in a week
# with an id not of its run's millisecond. The millisecond of a version 7 id (version nibble 7, RFC 9562's
# variant, as `ids.time_of` reads it): its first 48 bits, 12 hex digits.
FILED_BY_ID = "tasks_filed_by_id"
_MS = "(left({u}::text, 8) || substr({u}::text, 10, 4))"
_TIME = "to_timestamp((('x' || {ms})::bit(48)::bigint) / 1000.0)"
_V7 = "(substr({u}::text, 15, 1) = '7' AND substr({u}::text, 20, 1) IN ('8', '9', 'a', 'b'))"


def _filed_by_id(bound: datetime) -> str:
    """The CHECK, BOUND's millisecond written in it as the 12 hex digits an id of BOUND starts with."""
    bound_ms = f"{int(bound.timestamp() * 1000):012x}"
    task_ms, run_ms = _MS.format(u="id"), _MS.format(u="run_id")
    return (
        f"CHECK (filed_at = {LONG_AGO}"
        f" AND (run_id IS NULL OR NOT {_V7.format(u='run_id')} OR {run_ms} < '{bound_ms}')"
        f" OR {_V7.format(u='id')} AND filed_at = {_TIME.format(ms=task_ms)}"
        f" AND (run_id IS NULL OR {task_ms} = {run_ms}))"
    )


def _column(table: str) -> str:
    return "filed_at" if table == TASKS else "task_filed_at"


def _check(table: str) -> str:
    return f"{table}_filed_before"


def upgrade() -> None:
    conn = op.get_bind()
    op.create_table(
        LIVE_WEEKS,
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{LIVE_WEEKS}"),
    )
    if conn.dialect.name != "postgresql":  # the row too, as on PostgreSQL (nothing reads it here)
        conn.execute(text(f"INSERT INTO {LIVE_WEEKS} (id, since) VALUES (1, '0001-01-01 00:00:00.000000')"))
        for table in (TASKS, *CHILDREN):
            op.add_column(
                table,
                sa.Column(
                    _column(table), sa.DateTime(timezone=True), nullable=False, server_default=text(LONG_AGO)
                ),
            )
        return
    now: datetime = conn.execute(text("SELECT now()")).scalar_one()
    _prepare_online(conn)  # on the side connection, so this one holds no lock on the tasks yet
    _prepare(conn)  # what the side connection could not do
    bound = _bound(conn)
    assert bound is not None
    _convert(conn, bound)
    ensure_partitions(conn, now)
    # Every week may hold a live task (none does yet): the first keeper's round raises it.
    conn.execute(text(f"INSERT INTO {LIVE_WEEKS} (id, since) VALUES (1, :b)"), {"b": bound})


def _prepare_online(conn: Connection) -> None:
    """Steps 1-3 on a connection of their own, in autocommit; left to `_prepare` when a lock is not had in
    SIDE_LOCK_TIMEOUT."""
    side = conn.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        side.execute(text(f"SET lock_timeout = '{SIDE_LOCK_TIMEOUT}'"))
        _prepare(side, concurrently=True)
    except DBAPIError:
        return
    finally:
        side.close()


def _prepare(conn: Connection, *, concurrently: bool = False) -> None:
    """Steps 1-3, each skipped where done: the columns, the validated CHECKs of BOUND (a CHECK found, from a
    try that failed after, keeps its bound), the unique index with the filing time."""
    has_column = text(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass(:t) AND attname = :c"
        " AND NOT attisdropped)"
    )
    for table in (TASKS, *CHILDREN):  # asked first: ALTER takes its lock even when there is nothing to do
        if not conn.execute(has_column, {"t": table, "c": _column(table)}).scalar_one():
            conn.execute(
                text(
                    f"ALTER TABLE {table} ADD COLUMN {_column(table)}"
                    f" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT {LONG_AGO}"
                )
            )
    bound = _bound(conn) or conn.execute(text(BOUND)).scalar_one()
    checks = [(t, _check(t), f"CHECK ({_column(t)} < '{bound.isoformat()}')") for t in (TASKS, *CHILDREN)]
    for table, name, check in [*checks, (TASKS, FILED_BY_ID, _filed_by_id(bound))]:
        state = _check_state(conn, table, name)
        if state is None:
            conn.execute(text(f"ALTER TABLE {table} ADD CONSTRAINT {name} {check} NOT VALID"))
        if not state:
            conn.execute(text(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}"))
    valid = conn.execute(
        text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:i)"), {"i": UNIQUE}
    ).scalar()
    if valid is False:  # left invalid by a concurrent build that failed
        conn.execute(text(f"DROP INDEX {'CONCURRENTLY ' if concurrently else ''}{UNIQUE}"))
    if not valid:
        how = "CONCURRENTLY " if concurrently else ""
        conn.execute(text(f"CREATE UNIQUE INDEX {how}{UNIQUE} ON {TASKS} (run_id, rack_id, filed_at)"))


def _check_state(conn: Connection, table: str, name: str) -> bool | None:
    """Whether `table`'s CHECK `name` is validated; None when there is none."""
    query = text("SELECT convalidated FROM pg_constraint WHERE conname = :c AND conrelid = to_regclass(:t)")
    validated: bool | None = conn.execute(query, {"c": name, "t": table}).scalar()
    return validated


def _bound(conn: Connection) -> datetime | None:
    """BOUND, from the text of the tasks' CHECK (a try's, or this one's); None before it is made."""
    query = text(
        "SELECT (regexp_match(pg_get_constraintdef(oid), '< ''([^'']*)''::timestamp'))[1]::timestamptz"
        " FROM pg_constraint WHERE conname = :c AND conrelid = to_regclass(:t)"
    )
    bound: datetime | None = conn.execute(query, {"c": _check(TASKS), "t": TASKS}).scalar()
    return bound


def _indexes(conn: Connection, table: str) -> dict[str, str]:
    """`table`'s indexes but its primary key, by name: their definitions as PostgreSQL prints them."""
    query = text(
        "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
        " WHERE i.indrelid = to_regclass(:t) AND NOT i.indisprimary"
    )
    return {name: definition for name, definition in conn.execute(query, {"t": table})}


def _switch(
    conn: Connection,
    table: str,
    bound: datetime,
    shared: dict[str, str],
    keys: Sequence[tuple[str, str]] = (),
) -> None:
    """Steps 4 and 5 for one table: renamed `…_before` with its key and its `shared` indexes (name:
    definition, made on the partitioned table under the same name), the partitioned table made like it with
    `keys` (name, definition: foreign keys) and the old one attached before the weeks, which takes the
    partitioned table's indexes and keys over from its own (PostgreSQL finds them equal: no build, no scan)."""
    before = f"{table}_before"
    key = conn.execute(
        text("SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:t) AND contype = 'p'"),
        {"t": table},
    ).scalar_one()
    conn.execute(text(f"ALTER TABLE {table} RENAME TO {before}"))
    conn.execute(text(f"ALTER INDEX {key} RENAME TO {before}_pkey"))
    for index in shared:
        conn.execute(text(f"ALTER INDEX {index} RENAME TO {_renamed(index, table)}"))
    conn.execute(
        text(
            f"CREATE TABLE {table} (LIKE {before} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            f" PARTITION BY RANGE ({_column(table)})"
        )
    )
    conn.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT {_check(table)}"))  # the partition's bound
    for definition in shared.values():
        conn.execute(text(definition.replace(f" ON public.{table} ", f" ON {table} ", 1)))
    for name, definition in keys:
        conn.execute(text(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}"))
    conn.execute(
        text(
            f"ALTER TABLE {table} ATTACH PARTITION {before} FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')"
        )
    )
    conn.execute(text(f"ALTER TABLE {before} DROP CONSTRAINT {_check(table)}"))


def _renamed(index: str, table: str) -> str:
    """An index of `table` as the partition before the weeks names it."""
    for prefix in (f"ix_{table}_", f"uq_{table}_"):
        if index.startswith(prefix):
            return f"{table}_before_{index.removeprefix(prefix)}"
    return f"{index}_before"


def _foreign_keys(conn: Connection, table: str) -> list[tuple[str, str]]:
    query = text(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = to_regclass(:t) AND contype = 'f' ORDER BY conname"
    )
    return [(name, definition) for name, definition in conn.execute(query, {"t": table})]


def _convert(conn: Connection, bound: datetime) -> None:
    """Steps 4 and 5, under the locks (racks, tasks, children: every writer's order)."""
    conn.execute(text("LOCK TABLE racks IN SHARE ROW EXCLUSIVE MODE"))
    conn.execute(text(f"LOCK TABLE {TASKS}, {', '.join(CHILDREN)} IN ACCESS EXCLUSIVE MODE"))
    shared = {name: d for name, d in _indexes(conn, TASKS).items() if name != UNIQUE_BEFORE}
    _switch(conn, TASKS, bound, shared, _foreign_keys(conn, TASKS))
    for table in CHILDREN:  # their keys to the tasks stay the partitions' own
        _switch(conn, table, bound, _indexes(conn, table))


def downgrade() -> None:
    conn = op.get_bind()
    op.drop_table(LIVE_WEEKS)
    if conn.dialect.name != "postgresql":
        for table in (TASKS, *CHILDREN):
            op.execute(f"ALTER TABLE {table} DROP COLUMN {_column(table)}")
        return
    # What the flat tables had: the partitioned indexes (their text is the partitioned table's, ON ONLY),
    # the unique (run_id, rack_id) and the storage of the partition before the weeks, the keys.
    indexes = {
        table: {
            name: d.replace(f" ON ONLY public.{table} ", f" ON {table} ", 1)
            for name, d in _indexes(conn, table).items()
            if name != UNIQUE
        }
        for table in (TASKS, *CHILDREN)
    }
    indexes[TASKS][UNIQUE_BEFORE] = f"CREATE UNIQUE INDEX {UNIQUE_BEFORE} ON {TASKS} (run_id, rack_id)"
    rack_keys = _foreign_keys(conn, TASKS)
    storage = conn.execute(
        text(f"SELECT reloptions FROM pg_class WHERE oid = to_regclass('{TASKS}_before')")
    ).scalar()
    primary = {
        table: conn.execute(
            text(
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = to_regclass(:t) AND contype = 'p'"
            ),
            {"t": f"{table}_before"},
        ).scalar_one()
        for table in (TASKS, *CHILDREN)
    }
    for table in (TASKS, *CHILDREN):
        conn.execute(
            text(f"CREATE TABLE {table}_flat (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        )
        conn.execute(text(f"INSERT INTO {table}_flat SELECT * FROM {table}"))
    conn.execute(text(f"DROP TABLE {', '.join(CHILDREN)}, {TASKS}"))  # and their partitions
    for table in (TASKS, *CHILDREN):
        conn.execute(text(f"ALTER TABLE {table}_flat RENAME TO {table}"))
        conn.execute(text(f"ALTER TABLE {table} DROP COLUMN {_column(table)}"))
        conn.execute(text(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} {primary[table]}"))
        for definition in indexes[table].values():
            conn.execute(text(definition))
    if storage:
        conn.execute(text(f"ALTER TABLE {TASKS} SET ({', '.join(storage)})"))
    for name, definition in rack_keys:
        conn.execute(text(f"ALTER TABLE {TASKS} ADD CONSTRAINT {name} {definition}"))
    for table in CHILDREN:
        conn.execute(
            text(
                f"ALTER TABLE {table} ADD CONSTRAINT fk_{table}_task_id_tasks"
                f" FOREIGN KEY (task_id) REFERENCES {TASKS} (id) ON DELETE CASCADE"
            )
        )
