"""domain_list_version: a token every change to the NVLink domains or their racks replaces, so a server can
keep the whole domain list and read it again only when it changed

ListNVLDomains asked for no page answers every domain with its racks: at a fleet's size, 20,000 domains
(one an NVL72 rack), 134-206 ms a call on the 2-core machine of docs/PERFORMANCE.md, over the 100 ms of
issue 29, though the list changes only when a domain is made or a rack joins, leaves or is deleted.
`inventory.InventoryService` keeps the last whole list it read with the token it read first, and answers
from it while the token is the same (docs/PERFORMANCE.md, "The whole domain list kept").

The token is replaced by triggers, so every writer replaces it, in the writer's own transaction: each
release's code, a rolling upgrade's older release (which knows nothing of it), and an operator's SQL.
It is random, not a counter, so a database restored from a backup, or another database behind the same
URL, never gives a server a token that names a list it kept from before. One row (id 1), written by
upsert, so a row deleted by hand is made again by the next change.

- PostgreSQL: one function, which replaces the token once a transaction, fired at its commit by a
  constraint trigger (DEFERRABLE INITIALLY DEFERRED, once a row) on each INSERT and DELETE of
  `nvl_domains` or `racks`, each UPDATE of `nvl_domains` and each of `racks.nvl_domain_id`, and at once by
  a trigger on TRUNCATE of either. At commit, because the row's lock is then the last the transaction
  takes: replaced by the first statement that changed the list, a transaction that made a domain then
  held the row while it waited for a rack to put in it, beside a DeleteRack that held the rack while it
  waited for the row (a deadlock), and every writer of racks or domains waited for the row until the
  one before it committed. Once a transaction: racks written as many statements (executemany) replaced
  it once each, and PostgreSQL follows a row's versions of one transaction from the first on every update
  (20,000 racks written in 28 s where they took 6). A token new at the commit is new to every reader.
- SQLite: triggers run once per row (it has no statement triggers): the same changes but TRUNCATE, which
  it lacks.

A rack's other columns (its name, its components) are not in the list, so their changes keep the token.
A later migration that rebuilds `racks` or `nvl_domains` on SQLite (alembic's batch mode copies the table)
drops their triggers and must make them again; tests/store/test_domain_list_version.py fails if any is
missing.
The triggers take a brief lock on each table (PostgreSQL: SHARE ROW EXCLUSIVE, which writes of that table
wait for and reads do not), under the migrations' lock timeout.

Revision ID: 0059
Revises: 0058
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0059"
down_revision = "0058"
branch_labels = None
depends_on = None

TABLE = "domain_list_version"
TRIGGER = "domain_list_changed"  # PostgreSQL's function, and each table's trigger (SQLite: with a suffix)
TRUNCATED = "domain_list_truncated"  # PostgreSQL: TRUNCATE, which a constraint trigger cannot be fired by
# What changes the list, by table (PostgreSQL adds TRUNCATE).
EVENTS = {
    "nvl_domains": ["INSERT", "UPDATE", "DELETE"],
    "racks": ["INSERT", "UPDATE OF nvl_domain_id", "DELETE"],
}
REPLACED = "rackflow.domain_list_replaced"  # PostgreSQL: set in a transaction that replaced the token
NEW_TOKEN = {"postgresql": "gen_random_uuid()::text", "sqlite": "lower(hex(randomblob(16)))"}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        TABLE,
        sa.Column("id", sa.Integer, nullable=False),
        sa.Column("token", sa.String(36), nullable=False),
        sa.PrimaryKeyConstraint("id", name=f"pk_{TABLE}"),
    )
    replace = (
        f"INSERT INTO {TABLE} (id, token) VALUES (1, {NEW_TOKEN[dialect]})"
        " ON CONFLICT (id) DO UPDATE SET token = excluded.token"
    )
    op.execute(replace)
    if dialect == "postgresql":
        # Once a transaction, which a setting local to it remembers. Not the row's xmin: a frozen row's is
        # an old id that comes round again.
        op.execute(
            f"CREATE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF current_setting('{REPLACED}', true) IS DISTINCT FROM 'yes' THEN"
            f" {replace}; PERFORM set_config('{REPLACED}', 'yes', true); END IF;"
            " RETURN NULL; END $$"
        )
        for table, events in EVENTS.items():
            op.execute(
                f"CREATE CONSTRAINT TRIGGER {TRIGGER} AFTER {' OR '.join(events)} ON {table}"
                f" DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {TRIGGER}()"
            )
            op.execute(
                f"CREATE TRIGGER {TRUNCATED} AFTER TRUNCATE ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {TRIGGER}()"
            )
        return
    for table, events in EVENTS.items():
        for event in events:
            op.execute(
                f"CREATE TRIGGER {_sqlite_trigger(table, event)} AFTER {event} ON {table} BEGIN {replace}; END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in EVENTS:
            op.execute(f"DROP TRIGGER {TRIGGER} ON {table}")
            op.execute(f"DROP TRIGGER {TRUNCATED} ON {table}")
        op.execute(f"DROP FUNCTION {TRIGGER}()")
    else:
        for table, events in EVENTS.items():
            for event in events:
                op.execute(f"DROP TRIGGER {_sqlite_trigger(table, event)}")
    op.drop_table(TABLE)


def _sqlite_trigger(table: str, event: str) -> str:
    """SQLite's trigger names are the database's, not a table's, and it has one trigger an event."""
    return f"{TRIGGER}_{table}_{event.split()[0].lower()}"
