"""one typed hold on tasks

* `tasks.not_after`: a task that has not started by then (its maintenance window's end) fails without
  running. It was read from the operation's JSON `parameters` (`window_end`).
* `tasks.held_by`, `tasks.held_reason`, `tasks.held_since`: what holds a task that may not start yet
  ("window": its opening; "freeze", "budget": a start gate), why, and since when (`rackflow.tasks.gates`).
  `not_before` (0011) is the hold's end for every kind: the claim compared the opening as ISO text in the
  JSON `parameters` (`window_start`), and now compares only that typed column.

The active tasks' openings and ends move from their JSON into the columns (a task a freeze holds already
waits past its opening: the later of the two is kept), and what holds them is named from what they say.
Only columns are added (`ALTER TABLE … ADD COLUMN` on both databases), so SQLite rebuilds no table.

Downgrade: a deferred task keeps waiting for its opening (`not_before` stays), but a task deferred after
this revision forgets its window's end (its JSON no longer carries the deferral).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from rackflow.store.types import UTCDateTime, json_type

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def _columns() -> list[sa.Column[object]]:
    """New each time: a Column belongs to the one table it was added to."""
    return [
        sa.Column("not_after", sa.DateTime(timezone=True), nullable=True),
        sa.Column("held_by", sa.String(length=32), nullable=True),
        sa.Column("held_reason", sa.Text(), nullable=True),
        sa.Column("held_since", sa.DateTime(timezone=True), nullable=True),
    ]


_tasks = sa.table(
    "tasks",
    sa.column("id", sa.Uuid()),
    sa.column("status", sa.String()),
    sa.column("parameters", json_type()),
    sa.column("message", sa.Text()),
    sa.column("updated_at", UTCDateTime()),
    sa.column("not_before", UTCDateTime()),
    sa.column("not_after", UTCDateTime()),
    sa.column("held_by", sa.String()),
    sa.column("held_reason", sa.Text()),
    sa.column("held_since", UTCDateTime()),
)

# What the start gates wrote as the message of a task they held, by the gate's name.
_GATE_MESSAGES = {"freeze": "waits for freeze ", "budget": "waits for budget "}


def upgrade() -> None:
    for column in _columns():
        op.add_column("tasks", column)
    bind = op.get_bind()
    now = datetime.now(UTC)
    active = sa.select(_tasks).where(_tasks.c.status.in_(["pending", "waiting", "running"]))
    for row in bind.execute(active).all():
        opening, end = (_instant(row.parameters.get(key)) for key in ("window_start", "window_end"))
        if opening is None and end is None and row.not_before is None:
            continue
        values: dict[str, object] = {"not_after": end}
        if row.status != "running":
            until = max((t for t in (row.not_before, opening) if t is not None), default=None)
            values["not_before"] = until
            if until is not None and until > now:
                gate = next((g for g, start in _GATE_MESSAGES.items() if row.message.startswith(start)), None)
                values.update(held_by=gate or "window", held_reason=row.message, held_since=row.updated_at)
        bind.execute(sa.update(_tasks).where(_tasks.c.id == row.id).values(values))


def _instant(text: object) -> datetime | None:
    return datetime.fromisoformat(str(text)).astimezone(UTC) if text else None


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for column in reversed(_columns()):
            op.drop_column("tasks", column.name)
    # SQLite keeps the columns (unused by 0013): dropping them means rebuilding `tasks`.
