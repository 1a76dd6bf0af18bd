"""Alembic environment: always handed a live connection by rackflow.store.migrate, outside a transaction.

On PostgreSQL each migration runs in a transaction of its own, so the table locks one migration takes are
held until it commits, not until the last of an upgrade's migrations does: applied under a running fleet
(docs/OPERATIONS.md, "Upgrades"), each stalls the tables it changes for its own length only. SQLite runs
the whole upgrade in one transaction (one instance, and no concurrent writer to wait for)."""

from alembic import context

from rackflow.store.tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    transaction_per_migration=connection.dialect.name == "postgresql",
)
with context.begin_transaction():
    context.run_migrations()
