"""audit trail: partitioned by week on PostgreSQL, retention drops a week instead of deleting its rows (issue 29)

PostgreSQL: `audit_events` becomes a table partitioned by RANGE (at), one partition a week
(`store.audit_partitions`); its key becomes (id, at), which still writes a replayed event once (a replay keeps
its `at`). SQLite: unchanged (no partitions; the prune stays a batched delete).

An empty trail (a new database) is dropped and made partitioned. A trail with rows is converted in place,
online, and its rows become the first partition, `audit_events_legacy`, FROM (MINVALUE) TO (the start
of the week holding the day LEGACY_DAYS after today, or after its newest event): nothing is copied. On a connection of its own, outside
the migration's transaction, while reads and writes go on:

1. `CREATE UNIQUE INDEX CONCURRENTLY audit_events_id_at ON audit_events (id, at)`;
2. `ADD CONSTRAINT audit_events_before_0028 CHECK (at < bound) NOT VALID` (an ACCESS EXCLUSIVE lock, for no
   scan), then `VALIDATE CONSTRAINT` (a scan under SHARE UPDATE EXCLUSIVE, which writes do not wait for).

Then, in the migration's transaction, under an ACCESS EXCLUSIVE lock on the trail for catalog changes only
(no scan, no build): the key becomes that index, the table is renamed `audit_events_legacy`, the partitioned
`audit_events` is made with the same columns, key and indexes, and the legacy table attached as its first
partition (the validated CHECK proves its range, so ATTACH does not scan it, and its indexes are taken as
the partitioned ones'); then the DEFAULT partition. The weeks' partitions start where the legacy one ends:
the pruner makes them a week ahead (`ensure_partitions`) and deletes the legacy partition's old rows in
batches, as before, until all of it is past the retention and it is dropped.

If the migration's transaction cannot take steps 1 and 2 apart (an earlier migration of the same run holds
a lock on the trail, so the side connection times out), it does them itself: the index build then blocks
writes of the trail, and the CHECK's scan reads and writes (docs/OPERATIONS.md). The CHECK's bound is weeks
ahead because, should the migration fail after step 2 committed, the constraint stays while rackflow's
older release goes on writing events, all before the bound for LEGACY_DAYS days; a retry takes over the
index and constraint it finds (docs/OPERATIONS.md: retry, or drop the constraint, within that time).

Downgrade copies the trail into an unpartitioned table (a rewrite, offline).

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-03
"""

from __future__ import annotations

from datetime import datetime

from alembic import op
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError

from rackflow.store.audit_partitions import ensure_partitions

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

LEGACY = "audit_events_legacy"
KEY_INDEX = "audit_events_id_at"
BEFORE = "audit_events_before_0028"
LEGACY_DAYS = 30
# The trail's indexes (migrations 0002 and 0022), made on the partitioned table under the same names.
INDEXES = {
    "ix_audit_events_at_id": "(at, id)",
    "ix_audit_events_principal_at_id": "(principal, at, id)",
    "ix_audit_events_method_at_id": "(method, at, id)",
}
# How long the side connection waits for a lock before the migration does the step itself.
SIDE_LOCK_TIMEOUT = "5s"


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    now: datetime = conn.execute(text("SELECT now()")).scalar_one()
    # Asked on the side connection: a read of the trail here would hold a lock that step 2 waits for.
    bound = _prepare_online(conn)
    if bound is None:
        conn.execute(text("LOCK TABLE audit_events IN ACCESS EXCLUSIVE MODE"))
        if conn.execute(text("SELECT NOT EXISTS (SELECT FROM audit_events)")).scalar_one():
            conn.execute(text("DROP TABLE audit_events"))
            _create_partitioned(conn)
            ensure_partitions(conn, now)
            return
        bound = conn.execute(text(BOUND)).scalar_one()  # rows came since: convert them
    _convert(conn, bound, now)


# The legacy partition's upper bound: the start (Monday, UTC) of the week LEGACY_DAYS after now or the newest
# event, where the weeks' partitions (`store.audit_partitions.period_start`) begin.
BOUND = (
    "SELECT date_trunc('week', (greatest(now(), max(at)) + interval '"
    f"{LEGACY_DAYS} days') AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' FROM audit_events"
)


def _prepare_online(conn: Connection) -> datetime | None:
    """Steps 1 and 2 on a connection of their own, in autocommit, if the trail has rows there; returns the
    legacy partition's bound, or None for a trail this connection sees empty or not at all (made by this
    very migration run). A failure (a lock timeout) leaves what is left of them to `_convert`."""
    side = conn.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    bound: datetime | None = None
    try:
        side.execute(text(f"SET lock_timeout = '{SIDE_LOCK_TIMEOUT}'"))
        found = side.execute(text("SELECT to_regclass('audit_events') IS NOT NULL")).scalar_one()
        if not found or side.execute(text("SELECT NOT EXISTS (SELECT FROM audit_events)")).scalar_one():
            return None
        bound = side.execute(text(BOUND)).scalar_one()
        if _index_state(side) is False:
            side.execute(text(f"DROP INDEX CONCURRENTLY {KEY_INDEX}"))  # left invalid by a failed build
        side.execute(
            text(f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {KEY_INDEX} ON audit_events (id, at)")
        )
        if _check_state(side) is None:
            side.execute(text(_add_check(bound) + " NOT VALID"))
        side.execute(text(f"ALTER TABLE audit_events VALIDATE CONSTRAINT {BEFORE}"))
    except DBAPIError:
        pass  # `upgrade` and `_convert` do what is left, in the migration's transaction
    finally:
        side.close()
    return bound


def _index_state(conn: Connection) -> bool | None:
    """Whether KEY_INDEX is valid; None when there is none."""
    query = text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:i)")
    valid: bool | None = conn.execute(query, {"i": KEY_INDEX}).scalar()
    return valid


def _check_state(conn: Connection) -> bool | None:
    """Whether the BEFORE constraint is validated; None when there is none."""
    query = text(
        "SELECT convalidated FROM pg_constraint WHERE conname = :c AND conrelid = to_regclass('audit_events')"
    )
    validated: bool | None = conn.execute(query, {"c": BEFORE}).scalar()
    return validated


def _add_check(bound: datetime) -> str:
    return f"ALTER TABLE audit_events ADD CONSTRAINT {BEFORE} CHECK (at < '{bound.isoformat()}')"


def _convert(conn: Connection, bound: datetime, now: datetime) -> None:
    if _index_state(conn) is False:
        conn.execute(text(f"DROP INDEX {KEY_INDEX}"))
    conn.execute(text(f"CREATE UNIQUE INDEX IF NOT EXISTS {KEY_INDEX} ON audit_events (id, at)"))
    validated = _check_state(conn)
    if validated is None:
        conn.execute(text(_add_check(bound)))
    elif not validated:
        conn.execute(text(f"ALTER TABLE audit_events VALIDATE CONSTRAINT {BEFORE}"))
    # From here on, catalog changes only.
    conn.execute(text("ALTER TABLE audit_events DROP CONSTRAINT pk_audit_events"))
    conn.execute(
        text(f"ALTER TABLE audit_events ADD CONSTRAINT {LEGACY}_pkey PRIMARY KEY USING INDEX {KEY_INDEX}")
    )
    conn.execute(text(f"ALTER TABLE audit_events RENAME TO {LEGACY}"))
    for name in INDEXES:
        conn.execute(text(f"ALTER INDEX {name} RENAME TO {name.replace('audit_events', LEGACY)}"))
    _create_partitioned(conn, like=LEGACY)
    conn.execute(
        text(
            f"ALTER TABLE audit_events ATTACH PARTITION {LEGACY} FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')"
        )
    )
    conn.execute(text(f"ALTER TABLE {LEGACY} DROP CONSTRAINT {BEFORE}"))  # the partition's bound holds it now
    ensure_partitions(conn, now)


def _create_partitioned(conn: Connection, like: str = "audit_events") -> None:
    """The partitioned `audit_events`, with the columns of `like` (its own old table when empty, dropped
    already: then the columns are written out), its key (id, at) and its indexes."""
    if like == "audit_events":
        conn.execute(
            text(
                """
                CREATE TABLE audit_events (
                    id UUID NOT NULL,
                    at TIMESTAMP WITH TIME ZONE NOT NULL,
                    principal VARCHAR(255) NOT NULL,
                    method VARCHAR(64) NOT NULL,
                    target_ids JSONB NOT NULL,
                    outcome VARCHAR(32) NOT NULL,
                    error TEXT DEFAULT '' NOT NULL,
                    request JSONB NOT NULL,
                    schedule_before JSONB,
                    schedule_after JSONB
                ) PARTITION BY RANGE (at)
                """
            )
        )
    else:
        conn.execute(
            text(f"CREATE TABLE audit_events (LIKE {like} INCLUDING DEFAULTS) PARTITION BY RANGE (at)")
        )
    conn.execute(text("ALTER TABLE audit_events ADD CONSTRAINT pk_audit_events PRIMARY KEY (id, at)"))
    for name, columns in INDEXES.items():
        conn.execute(text(f"CREATE INDEX {name} ON audit_events {columns}"))


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    conn.execute(text("CREATE TABLE audit_events_plain (LIKE audit_events INCLUDING DEFAULTS)"))
    conn.execute(text("INSERT INTO audit_events_plain SELECT * FROM audit_events"))
    conn.execute(text("DROP TABLE audit_events"))  # and its partitions, the DEFAULT one among them
    conn.execute(text("ALTER TABLE audit_events_plain RENAME TO audit_events"))
    conn.execute(text("ALTER TABLE audit_events ADD CONSTRAINT pk_audit_events PRIMARY KEY (id)"))
    for name, columns in INDEXES.items():
        conn.execute(text(f"CREATE INDEX {name} ON audit_events {columns}"))
