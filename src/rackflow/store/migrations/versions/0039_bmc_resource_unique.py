"""components: no two components act on one BMC resource, in one rack or two

Two components naming one Redfish resource act on one machine: a power operation on the one's rack powers
the other's machine, and neither rack's conflict rules see it ("never power-cycle the wrong rack").
1f665ca refused it within one request; a component of another rack, or one added later, still could.

`components.bmc_resource_key` holds the resource a component's BMC fields name, one text for every
spelling of it (`domain.bmc.stored_resource_key`: the host in any case, the scheme's default port, the
service root and a bare id spelled out; as a SHA-256), NULL without a BMC, under the unique index
`uq_components_bmc_resource_key`: the inventory pre-checks it to name the other component and its rack,
and the index refuses what a race lets past. The components this migration finds are keyed here, from
their stored endpoint; one whose endpoint does not parse (a port out of range, which earlier releases
stored) stays NULL: no Redfish call can reach it either.

Components that already share a resource make the migration refuse, listing each (rack, component, id,
endpoint), before the index is built: which of two to keep (or to point elsewhere) is the operator's
call, and an index that skipped them (a partial index) would leave exactly those racks unguarded. Nothing
of it is then in force: remove or re-add one of each (`rackflow component remove ID`, with the previous
release, which still serves the database), then run `rackflow db migrate` again.

On PostgreSQL it is applied online, outside a transaction (an autocommit block), each step safe to run
again (docs/OPERATIONS.md, "Migrations applied online"): the column is added (nullable, without a default:
no row is rewritten, its exclusive lock lasts an instant), the components are keyed BACKFILL_CHUNK at a
time, each chunk one statement (a chunk's rows are locked for a moment, so the executor's power-state
writes go on), only those not keyed yet, then the index is built CONCURRENTLY
(`dialect.building_index_concurrently`). A refused try leaves the column, and the keys written, to the
next. Components the previous release adds while the upgrade lasts, once a chunk has passed them, are not
keyed: change no inventory until every instance runs the new release. SQLite does it all in the upgrade's
one transaction.

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-05
"""

import uuid

import sqlalchemy as sa
from alembic import op

from rackflow.domain.bmc import stored_resource_key
from rackflow.domain.inventory import Bmc
from rackflow.errors import FailedPrecondition, InvalidArgument
from rackflow.store.dialect import building_index_concurrently

revision = "0039"
down_revision = "0038"
branch_labels = None
depends_on = None

INDEX = "uq_components_bmc_resource_key"
# Components keyed per statement (PostgreSQL: per transaction).
BACKFILL_CHUNK = 2_000
# Clashing components a refusal lists by name; the rest it counts.
LISTED = 20

_UNKEYED = sa.text("""
    SELECT id, bmc_url, bmc_resource FROM components
    WHERE bmc_url IS NOT NULL AND bmc_resource_key IS NULL AND id > :after
    ORDER BY id LIMIT :chunk
""")
_KEY_CHUNK = {
    "postgresql": sa.text("""
        UPDATE components SET bmc_resource_key = k.key
        FROM unnest(CAST(:ids AS uuid[]), CAST(:keys AS text[])) AS k(id, key)
        WHERE components.id = k.id
    """),
    "sqlite": sa.text("UPDATE components SET bmc_resource_key = :key WHERE id = :id"),
}
_CLASHES = sa.text("""
    SELECT r.name AS rack, c.name, c.id, c.bmc_url, c.bmc_resource, c.bmc_resource_key FROM components c
    JOIN racks r ON r.id = c.rack_id
    WHERE c.bmc_resource_key IN (
        SELECT bmc_resource_key FROM components WHERE bmc_resource_key IS NOT NULL
        GROUP BY bmc_resource_key HAVING count(*) > 1
    )
    ORDER BY c.bmc_resource_key, r.name, c.name, c.id
""")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        op.add_column("components", sa.Column("bmc_resource_key", sa.String(length=64), nullable=True))
        _key_components(bind)
        _refuse_clashes(bind)
        op.create_index(INDEX, "components", ["bmc_resource_key"], unique=True)
        return
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE components ADD COLUMN IF NOT EXISTS bmc_resource_key varchar(64)")
        _key_components(bind)
        _refuse_clashes(bind)
        with building_index_concurrently(bind, INDEX):
            op.create_index(
                INDEX,
                "components",
                ["bmc_resource_key"],
                unique=True,
                if_not_exists=True,
                postgresql_concurrently=True,
            )


def _key_components(bind: sa.Connection) -> None:
    """Key every component with a BMC not keyed yet, a chunk at a time in id order."""
    after: object = uuid.UUID(int=0) if bind.dialect.name == "postgresql" else ""
    while rows := bind.execute(_UNKEYED, {"after": after, "chunk": BACKFILL_CHUNK}).all():
        keyed = [(row.id, key) for row in rows if (key := _key_of(row.bmc_url, row.bmc_resource))]
        if keyed and bind.dialect.name == "postgresql":
            ids, keys = zip(*keyed, strict=True)
            bind.execute(_KEY_CHUNK["postgresql"], {"ids": list(ids), "keys": list(keys)})
        elif keyed:
            bind.execute(_KEY_CHUNK["sqlite"], [{"id": row_id, "key": key} for row_id, key in keyed])
        after = rows[-1].id


def _key_of(url: str, resource: str | None) -> str | None:
    try:
        return stored_resource_key(Bmc(url, resource or "", ""))
    except (InvalidArgument, ValueError):
        return None


def _refuse_clashes(bind: sa.Connection) -> None:
    clashing = bind.execute(_CLASHES).all()
    if not clashing:
        return
    listed = "; ".join(
        f"rack {row.rack!r} component {row.name!r} ({uuid.UUID(str(row.id))}): {row.bmc_url} {row.bmc_resource}"
        for row in clashing[:LISTED]
    )
    more = f"; and {len(clashing) - LISTED} more" if len(clashing) > LISTED else ""
    resources = len({row.bmc_resource_key for row in clashing})
    raise FailedPrecondition(
        f"migration 0039 makes a component's BMC resource unique, and {len(clashing)} components share "
        f"{resources} resource(s), each acting on another's machine: {listed}{more}. Nothing of migration "
        "0039 is in force: remove (`rackflow component remove ID`) or re-add with its own endpoint all but "
        "one component of each resource, then run `rackflow db migrate` again"
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="components", if_exists=True)
    with op.batch_alter_table("components") as batch_op:
        batch_op.drop_column("bmc_resource_key")
