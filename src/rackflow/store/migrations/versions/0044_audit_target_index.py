"""audit trail: the events naming an id, read from an index (PostgreSQL)

ListAuditEvents' `target` (`rackflow audit --target ID`, the audit page's Target) lists the events whose
`target_ids` hold an id: everything that happened to a rack, schedule or task, and, since migration 0041,
the DeleteRack and RemoveComponent that changed a schedule's scope. `target_ids` is a JSON array; on
PostgreSQL a GIN index over it (`jsonb_path_ops`, which answers `target_ids @> '["id"]'` and is smaller
than the default operator class) reads the matching events only. SQLite has no such index: its
list by target walks a bounded range of the trail (`store.audit.list_events`), and this migration does
nothing there.

The trail is partitioned by week (migration 0028), and PostgreSQL cannot build an index CONCURRENTLY on a
partitioned table. So, outside a transaction (an autocommit block), while the fleet goes on writing
events:

1. `CREATE INDEX … ON ONLY audit_events`: the partitioned index, alone, marked invalid (catalog only);
2. for each partition with no index attached to it yet: `CREATE INDEX CONCURRENTLY` on the partition
   (writes go on; an invalid one left by an interrupted build is dropped and built again,
   `dialect.building_index_concurrently`), then `ALTER INDEX … ATTACH PARTITION` (catalog only);
3. once every partition has its index, PostgreSQL marks the partitioned one valid. A partition made
   meanwhile (the pruner's `ensure_partitions`) gets its index as it is attached, like every partition
   made later: it is built in the pruner's transaction, on a new week's near-empty table.

Each step is safe to run again: a migration cut short goes on where it stopped.

Revision ID: 0044
Revises: 0043
Create Date: 2026-12-05
"""

from alembic import op
from sqlalchemy import Connection, text

from rackflow.store.dialect import building_index_concurrently

revision = "0044"
down_revision = "0043"
branch_labels = None
depends_on = None

INDEX = "ix_audit_events_target_ids"
USING = "USING gin (target_ids jsonb_path_ops)"

# The partitions of audit_events with no index attached to INDEX yet.
UNINDEXED = text(
    f"""
    SELECT c.relname FROM pg_inherits p JOIN pg_class c ON c.oid = p.inhrelid
    WHERE p.inhparent = 'audit_events'::regclass
      AND NOT EXISTS (
          SELECT FROM pg_inherits pi JOIN pg_index i ON i.indexrelid = pi.inhrelid
          WHERE pi.inhparent = '{INDEX}'::regclass AND i.indrelid = c.oid
      )
    ORDER BY c.relname
    """
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    with op.get_context().autocommit_block():
        bind.execute(text(f"CREATE INDEX IF NOT EXISTS {INDEX} ON ONLY audit_events {USING}"))
        for partition in bind.execute(UNINDEXED).scalars().all():
            _index_partition(bind, partition)
        valid = bind.execute(text(f"SELECT indisvalid FROM pg_index WHERE indexrelid = '{INDEX}'::regclass"))
        if not valid.scalar_one():
            raise RuntimeError(f"{INDEX}: a partition of audit_events still has no index; migrate again")


def _index_partition(bind: Connection, partition: str) -> None:
    """Build the partition's index CONCURRENTLY under the name PostgreSQL gives the ones it makes itself
    (a partition attached later), and attach it to INDEX."""
    child = f"{partition}_target_ids_idx"
    with building_index_concurrently(bind, child):
        bind.execute(text(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {child} ON {partition} {USING}"))
    bind.execute(text(f"ALTER INDEX {INDEX} ATTACH PARTITION {child}"))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(f"DROP INDEX IF EXISTS {INDEX}")  # and its partitions' indexes
