"""runs: partitioned by week of their slot on PostgreSQL, retention drops a week instead of deleting its runs
(issue 29)

PostgreSQL: `task_schedule_run` becomes a table partitioned by RANGE (scheduled_for), one partition a week
(`store.run_partitions`). No column is added, so the release before this one, which an online upgrade keeps
running until it is replaced, writes the partitioned table unchanged. SQLite: unchanged.

The table with its rows becomes the DEFAULT partition, `task_schedule_run_default`: nothing is copied. It
keeps the manual runs (no slot) and every run it holds; the weeks' partitions start at BOUND, the Monday
(UTC) of the week LEAD_DAYS after now or after the newest slot. On a connection of its own, outside the
migration's transaction, while reads and writes go on:

1. `ADD CONSTRAINT task_schedule_run_default_before CHECK (scheduled_for IS NULL OR scheduled_for < BOUND)
   NOT VALID` (an ACCESS EXCLUSIVE lock, for no scan), then `VALIDATE CONSTRAINT` (a scan under SHARE
   UPDATE EXCLUSIVE, which writes do not wait for); then, CONCURRENTLY, the live runs' indexes and the
   schedule's index of runs with their slot (`BY_SCHEDULE`), which replaces the one without under the lock.

Then, in the migration's transaction, under an ACCESS EXCLUSIVE lock on the runs for catalog changes only
(no scan, no build):

2. the table of live runs and its trigger function; the live rollouts and runs awaiting approval copied
   into it (each read by its own partial index), and those two unique indexes dropped;
3. the table and its indexes renamed `task_schedule_run_default…`; the partitioned `task_schedule_run`
   made with its columns, checks, foreign key, indexes (the slot's unique one among them) and trigger;
4. the old table attached as the DEFAULT partition (its indexes are taken as the partitioned ones'; with
   no range partition yet there is nothing to check), then the first week's from BOUND and the weeks up to
   `run_partitions.LOOKAHEAD` from now (the CHECK proves the DEFAULT partition holds none of them).

If the side connection cannot take step 1 (an earlier migration of the same run holds a lock on the
runs), the migration does it itself, and the CHECK's scan then blocks writes of the runs. BOUND is weeks
ahead because, should the migration fail after step 1 committed, the constraint stays while the older
release goes on firing: its slots are all before BOUND for LEAD_DAYS days (docs/OPERATIONS.md: retry, or
drop the constraint, within that time); a retry takes over the constraint it finds.

Downgrade copies the runs into an unpartitioned table (a rewrite, offline) with its unique indexes back.

Revision ID: 0046
Revises: 0045
Create Date: 2026-12-05
"""

from __future__ import annotations

from datetime import datetime

from alembic import op
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from rackflow.store.run_partitions import add_week, ensure_partitions, first_week

revision = "0046"
down_revision = "0045"
branch_labels = None
depends_on = None

TABLE = "task_schedule_run"
DEFAULT = "task_schedule_run_default"
BEFORE = "task_schedule_run_default_before"
LIVE = "task_schedule_run_live"
LEAD_DAYS = 30
# The runs' indexes at revision 0037, made on the partitioned table under the same names.
INDEXES = {
    "ix_task_schedule_run_schedule_id_fired_at": "(schedule_id, fired_at) INCLUDE (scheduled_for)",
    "ix_task_schedule_run_fired_at_id": "(fired_at, id)",
    "ix_task_schedule_run_running": "(owner_id) WHERE state = 'running'",
    "ix_task_schedule_run_approval_expires_at": "(approval_expires_at) WHERE state = 'awaiting_approval'",
    "ix_task_schedule_run_retries": "(retry_of) WHERE retry_of IS NOT NULL",
    "ix_task_schedule_run_rolling": "(id) WHERE state = 'rolling'",
}
SLOT = ("uq_task_schedule_run_slot_by_time", "(scheduled_for, schedule_id) WHERE scheduled_for IS NOT NULL")
# The schedule's index of runs holds each run's slot from this migration on, so that the run cap's look,
# which PostgreSQL narrows to the partitions from the schedule's `runs_since` on (migration 0047), reads the
# index alone (`store.runs.prune_runs`). Built beside the old one on the side connection, swapped in
# under the lock; without it the look read every run's row from the table.
BY_SCHEDULE = "ix_task_schedule_run_schedule_id_fired_at"
BY_SCHEDULE_BEFORE = "(schedule_id, fired_at)"
BY_SCHEDULE_NEW = f"{BY_SCHEDULE}_slot"
# What the live-runs table holds: by the partial unique index that held it before, the non-unique one that
# finds a schedule's live runs from now on, and which runs they are.
LIVE_KINDS = {
    "rollout": (
        "uq_task_schedule_run_live_rollout",
        "ix_task_schedule_run_live_rollout",
        "state IN ('rolling', 'halted')",
    ),
    "approval": (
        "uq_task_schedule_run_awaiting",
        "ix_task_schedule_run_awaiting",
        "state = 'awaiting_approval'",
    ),
}
LIVE_INDEXES = {index: f"(schedule_id) WHERE {where}" for _, index, where in LIVE_KINDS.values()}
FOREIGN_KEY = (
    "fk_task_schedule_run_schedule_id_task_schedule",
    "FOREIGN KEY (schedule_id) REFERENCES task_schedule (id) ON DELETE CASCADE",
)
# How long the side connection waits for a lock before the migration does the step itself.
SIDE_LOCK_TIMEOUT = "5s"

BOUND = (
    "SELECT date_trunc('week', (greatest(now(), max(scheduled_for)) + interval '"
    f"{LEAD_DAYS} days') AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM {TABLE}"
)

_KIND = "CASE WHEN {row}.state IN ('rolling', 'halted') THEN 'rollout' WHEN {row}.state = 'awaiting_approval' THEN 'approval' END"

# The trigger keeping LIVE: a run entering a live kind takes its schedule's row of that kind, one leaving it
# gives it back. A row naming a run no longer of that kind (the run went by a path this trigger did not see,
# or a slot's duplicate insert took the row and was then skipped by the slot's index) is taken over.
LIVE_TRIGGER = f"""
CREATE OR REPLACE FUNCTION {LIVE}() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    old_kind text;
    new_kind text;
    holder uuid;
BEGIN
    IF TG_OP <> 'INSERT' THEN
        old_kind := {_KIND.format(row="OLD")};
    END IF;
    IF TG_OP <> 'DELETE' THEN
        new_kind := {_KIND.format(row="NEW")};
    END IF;
    IF old_kind IS NOT DISTINCT FROM new_kind THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    IF old_kind IS NOT NULL THEN
        DELETE FROM {LIVE} WHERE schedule_id = OLD.schedule_id AND kind = old_kind AND run_id = OLD.id;
    END IF;
    IF new_kind IS NOT NULL THEN
        INSERT INTO {LIVE} (schedule_id, kind, run_id) VALUES (NEW.schedule_id, new_kind, NEW.id)
            ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            SELECT run_id INTO holder FROM {LIVE}
                WHERE schedule_id = NEW.schedule_id AND kind = new_kind FOR UPDATE;
            IF EXISTS (SELECT FROM {TABLE} r WHERE r.id = holder AND {_KIND.format(row="r")} = new_kind) THEN
                IF TG_OP = 'INSERT' THEN
                    RETURN NULL;
                END IF;
                RAISE unique_violation USING
                    MESSAGE = format('schedule %s already has a live %s run', NEW.schedule_id, new_kind),
                    CONSTRAINT = '{LIVE}_pkey';
            END IF;
            UPDATE {LIVE} SET run_id = NEW.id WHERE schedule_id = NEW.schedule_id AND kind = new_kind;
        END IF;
    END IF;
    RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
END
$$
"""


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    now: datetime = conn.execute(text("SELECT now()")).scalar_one()
    bound = _prepare_online(conn)  # asked on the side connection, so this one holds no lock on the runs yet
    if _check_state(conn) is None:
        bound = conn.execute(text(BOUND)).scalar_one()
        conn.execute(text(_add_check(bound)))
    elif not _check_state(conn):
        conn.execute(text(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {BEFORE}"))
    bound = bound or first_week(conn)
    _convert(conn, bound, now)


def _prepare_online(conn: Connection) -> datetime | None:
    """Step 1 on a connection of its own, in autocommit; returns the bound it set, or None when it could
    not (a lock timeout), leaving it to `upgrade`."""
    side = conn.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    bound: datetime | None = None
    try:
        side.execute(text(f"SET lock_timeout = '{SIDE_LOCK_TIMEOUT}'"))
        if side.execute(text(f"SELECT to_regclass('{TABLE}') IS NULL")).scalar_one():
            return None  # made by this very migration run, not yet committed: `upgrade` does it all
        if _check_state(side) is None:
            bound = side.execute(text(BOUND)).scalar_one()
            side.execute(text(_add_check(bound) + " NOT VALID"))
        side.execute(text(f"ALTER TABLE {TABLE} VALIDATE CONSTRAINT {BEFORE}"))
        for index, definition in _prebuilt().items():
            if _index_state(side, index) is False:
                side.execute(text(f"DROP INDEX CONCURRENTLY {index}"))  # left invalid by a failed build
            side.execute(text(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {TABLE} {definition}"))
    except DBAPIError:
        return None
    finally:
        side.close()
    return bound


def _prebuilt() -> dict[str, str]:
    """The indexes built on the old table before its conversion (concurrently where the side connection
    can): the live runs' and the schedule's index with the slot."""
    return {**LIVE_INDEXES, BY_SCHEDULE_NEW: INDEXES[BY_SCHEDULE]}


def _check_state(conn: Connection) -> bool | None:
    """Whether the BEFORE constraint is validated; None when there is none."""
    query = text(
        f"SELECT convalidated FROM pg_constraint WHERE conname = :c AND conrelid = to_regclass('{TABLE}')"
    )
    validated: bool | None = conn.execute(query, {"c": BEFORE}).scalar()
    return validated


def _index_state(conn: Connection, index: str) -> bool | None:
    """Whether `index` is valid; None when there is none."""
    query = text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:i)")
    valid: bool | None = conn.execute(query, {"i": index}).scalar()
    return valid


def _add_check(bound: datetime) -> str:
    return (
        f"ALTER TABLE {TABLE} ADD CONSTRAINT {BEFORE}"
        f" CHECK (scheduled_for IS NULL OR scheduled_for < '{bound.isoformat()}')"
    )


def _convert(conn: Connection, bound: datetime, now: datetime) -> None:
    for index, definition in _prebuilt().items():  # what the side connection could not build
        if _index_state(conn, index) is False:
            conn.execute(text(f"DROP INDEX {index}"))
        conn.execute(text(f"CREATE INDEX IF NOT EXISTS {index} ON {TABLE} {definition}"))
    # Step 2.
    conn.execute(
        text(
            f"CREATE TABLE {LIVE} (schedule_id UUID NOT NULL, kind VARCHAR(16) NOT NULL, run_id UUID NOT NULL,"
            f" CONSTRAINT {LIVE}_pkey PRIMARY KEY (schedule_id, kind))"
        )
    )
    conn.execute(text(LIVE_TRIGGER))
    conn.execute(text(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE"))
    for kind, (unique, _, where) in LIVE_KINDS.items():
        conn.execute(text(f"INSERT INTO {LIVE} SELECT schedule_id, '{kind}', id FROM {TABLE} WHERE {where}"))
        conn.execute(text(f"DROP INDEX {unique}"))
    conn.execute(text(f"DROP INDEX {BY_SCHEDULE}"))
    conn.execute(text(f"ALTER INDEX {BY_SCHEDULE_NEW} RENAME TO {BY_SCHEDULE}"))
    # Step 3.
    conn.execute(text(f"ALTER TABLE {TABLE} RENAME TO {DEFAULT}"))
    conn.execute(text(f"ALTER INDEX pk_{TABLE} RENAME TO {DEFAULT}_pkey"))
    for name in (*INDEXES, *LIVE_INDEXES, SLOT[0]):
        suffix = name.removeprefix(f"ix_{TABLE}_").removeprefix(f"uq_{TABLE}_")
        conn.execute(text(f"ALTER INDEX {name} RENAME TO {DEFAULT}_{suffix}"))
    conn.execute(
        text(
            f"CREATE TABLE {TABLE} (LIKE {DEFAULT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            " PARTITION BY RANGE (scheduled_for)"
        )
    )
    conn.execute(text(f"ALTER TABLE {TABLE} DROP CONSTRAINT {BEFORE}"))  # the DEFAULT partition's alone
    conn.execute(text(f"ALTER TABLE {TABLE} ADD CONSTRAINT {FOREIGN_KEY[0]} {FOREIGN_KEY[1]}"))
    for name, definition in {**INDEXES, **LIVE_INDEXES}.items():
        conn.execute(text(f"CREATE INDEX {name} ON {TABLE} {definition}"))
    conn.execute(text(f"CREATE UNIQUE INDEX {SLOT[0]} ON {TABLE} {SLOT[1]}"))
    conn.execute(
        text(
            f"CREATE TRIGGER {LIVE} BEFORE INSERT OR UPDATE OF state OR DELETE ON {TABLE}"
            f" FOR EACH ROW EXECUTE FUNCTION {LIVE}()"
        )
    )
    # Step 4.
    conn.execute(text(f"ALTER TABLE {TABLE} ATTACH PARTITION {DEFAULT} DEFAULT"))
    add_week(conn, bound)
    ensure_partitions(conn, now)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    plain = f"{TABLE}_plain"
    conn.execute(text(f"CREATE TABLE {plain} (LIKE {TABLE} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"))
    conn.execute(text(f"INSERT INTO {plain} SELECT * FROM {TABLE}"))
    conn.execute(text(f"DROP TABLE {TABLE}"))  # and its partitions, the DEFAULT one among them
    conn.execute(text(f"DROP TABLE {LIVE}"))
    conn.execute(text(f"DROP FUNCTION {LIVE}()"))
    conn.execute(text(f"ALTER TABLE {plain} RENAME TO {TABLE}"))
    conn.execute(text(f"ALTER TABLE {TABLE} SET (fillfactor = 90)"))
    conn.execute(text(f"ALTER TABLE {TABLE} ADD CONSTRAINT pk_{TABLE} PRIMARY KEY (id)"))
    conn.execute(text(f"ALTER TABLE {TABLE} ADD CONSTRAINT {FOREIGN_KEY[0]} {FOREIGN_KEY[1]}"))
    for name, definition in {**INDEXES, BY_SCHEDULE: BY_SCHEDULE_BEFORE}.items():
        conn.execute(text(f"CREATE INDEX {name} ON {TABLE} {definition}"))
    conn.execute(text(f"CREATE UNIQUE INDEX {SLOT[0]} ON {TABLE} {SLOT[1]}"))
    for unique, _, where in LIVE_KINDS.values():
        conn.execute(text(f"CREATE UNIQUE INDEX {unique} ON {TABLE} (schedule_id) WHERE {where}"))
