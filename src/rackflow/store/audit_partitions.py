"""The audit trail's partitions on PostgreSQL (migration 0028): `audit_events` is partitioned by RANGE (at)
into one partition a week, so retention drops a week's partition instead of deleting its rows.

* Period: a week (from Monday, UTC). A partition is dropped only once all of it is older than the
  retention, so the trail is kept at least as long as configured and at most a period longer: retentions
  are Go durations of at least an hour (`config.MIN_RETENTION`), pruned hourly, and a day would keep at
  most a day more. But every read of the trail that no time bound narrows plans every partition: at 344
  day partitions (a year) the audit page took 25-50 ms to plan, against 0.1-0.2 ms unpartitioned
  (docs/PERFORMANCE.md), and a trail kept forever (the default) gains one partition a period. A week
  divides that by seven and keeps at most a week more than the retention; a month would keep a 1 h
  retention's events a month.
* `ensure_partitions` makes the partitions of this week and of the days up to LOOKAHEAD later, and the
  DEFAULT one; the migration, and the audit pruner at each round (`store.audit.prune_events`), call it.
  Past periods get none: the pruner would drop them again.
* The DEFAULT partition is the safety net: an event whose week has no partition (an instance whose
  clock is weeks off, a spooled event replayed after its week was dropped) goes there instead of failing,
  and with it the whole group-commit INSERT it is part of. It stays near empty: a partition made later
  takes over the rows of its range from it, and the pruner deletes those older than the retention in
  batches. Each partition made scans it (ATTACH checks that none of its rows belong to the new range), so
  near empty keeps that short.
* Every change runs under an advisory lock, so instances pruning at once do not make a partition twice,
  and with a short lock timeout, so a DROP or ATTACH waiting behind a long read of the trail gives up
  (tried again at the next round) rather than queueing every reader and writer behind it.

SQLite has no partitions: nothing here applies to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, text

# One partition a week; made this far ahead, so a week of failed rounds passes before an event would land
# in the DEFAULT partition (where it is still kept).
PERIOD = timedelta(days=7)
LOOKAHEAD = timedelta(days=7)
PARENT = "audit_events"
DEFAULT_PARTITION = "audit_events_default"
# Held by each transaction that makes or drops a partition (pg_advisory_xact_lock).
_PARTITIONS_LOCK = 7_262_532_028
# How long a DROP or ATTACH waits for the trail's readers and writers before giving up for this round.
LOCK_TIMEOUT = "2s"


@dataclass(frozen=True)
class Partition:
    """One partition of `audit_events`: [lower, upper), None for MINVALUE or MAXVALUE; `default` for the
    DEFAULT partition (neither bound)."""

    name: str
    lower: datetime | None
    upper: datetime | None
    default: bool


def is_partitioned(conn: Connection, parent: str = PARENT) -> bool:
    """Whether `parent` (`audit_events` unless named) is partitioned here (PostgreSQL from migration 0028
    on; the runs from 0046 on)."""
    if conn.dialect.name != "postgresql":
        return False
    query = text("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(:t)")
    return bool(conn.execute(query, {"t": parent}).scalar())


def partitions(conn: Connection, parent: str = PARENT) -> list[Partition]:
    """The partitions of `parent` (`audit_events` unless named), oldest first (DEFAULT last). The bounds are
    read back from their text in this session, so the literal's time zone is the one it was printed in. A
    partition another transaction is dropping meanwhile (its bound reads as NULL) is left out."""
    rows = conn.execute(
        text(
            """
            SELECT c.relname AS name,
                   (regexp_match(b.bound, 'FROM \\(''([^'']*)''\\)'))[1]::timestamptz AS lower,
                   (regexp_match(b.bound, 'TO \\(''([^'']*)''\\)'))[1]::timestamptz AS upper,
                   b.bound = 'DEFAULT' AS is_default
            FROM pg_inherits i
            JOIN pg_class c ON c.oid = i.inhrelid
            CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) b
            WHERE i.inhparent = to_regclass(:t) AND b.bound IS NOT NULL
            """
        ),
        {"t": parent},
    ).all()
    found = [Partition(row.name, row.lower, row.upper, row.is_default) for row in rows]
    oldest = datetime.min.replace(tzinfo=UTC)
    return sorted(found, key=lambda p: (p.default, p.lower or oldest))


def period_start(at: datetime) -> datetime:
    """The start of the period holding `at`: the Monday of its week, 00:00 UTC."""
    day = at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return day - timedelta(days=day.weekday())


def partition_name(start: datetime) -> str:
    return f"{PARENT}_p{start:%Y%m%d}"


def _lock(conn: Connection) -> None:
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PARTITIONS_LOCK})


def wait_briefly(conn: Connection) -> None:
    """The pruner's transactions that make or drop partitions wait LOCK_TIMEOUT at most for a lock (the
    migration's wait as long as they must)."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))


def ensure_partitions(conn: Connection, now: datetime) -> list[str]:
    """Make the DEFAULT partition and the partitions of the periods from `now`'s to LOOKAHEAD later that no
    partition covers yet, in the caller's transaction; returns the names made. A period whose events
    already went to the DEFAULT partition (it had no partition then) takes them over as it is attached."""
    if not is_partitioned(conn):
        return []
    _lock(conn)
    existing = partitions(conn)
    made: list[str] = []
    if not any(p.default for p in existing):
        conn.execute(text(f"CREATE TABLE {DEFAULT_PARTITION} PARTITION OF {PARENT} DEFAULT"))
        made.append(DEFAULT_PARTITION)
    ranges = [p for p in existing if not p.default]
    start = period_start(now)
    while start <= now + LOOKAHEAD:
        end = start + PERIOD
        overlaps = any(
            (p.lower is None or p.lower < end) and (p.upper is None or start < p.upper) for p in ranges
        )
        if not overlaps:
            _attach(conn, partition_name(start), start, end)
            made.append(partition_name(start))
        start = end
    return made


def _attach(conn: Connection, name: str, start: datetime, end: datetime) -> None:
    """A partition for [start, end), made apart and attached (ATTACH holds a SHARE UPDATE EXCLUSIVE lock on
    the parent, so reads and writes of the trail go on; CREATE TABLE … PARTITION OF would hold an ACCESS
    EXCLUSIVE one), with the DEFAULT partition's rows of that range moved into it first."""
    conn.execute(text(f"CREATE TABLE {name} (LIKE {PARENT} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"))
    conn.execute(text(f"LOCK TABLE {DEFAULT_PARTITION} IN SHARE ROW EXCLUSIVE MODE"))
    conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {DEFAULT_PARTITION} WHERE at >= :lo AND at < :hi RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved"
        ),
        {"lo": start, "hi": end},
    )
    bounds = f"FROM ({bound_literal(start)}) TO ({bound_literal(end)})"
    conn.execute(text(f"ALTER TABLE {PARENT} ATTACH PARTITION {name} FOR VALUES {bounds}"))


def bound_literal(at: datetime) -> str:
    """A bound as DDL takes it (no parameters in ALTER TABLE): an ISO timestamp with its offset."""
    return f"'{at.astimezone(UTC).isoformat()}'"


def droppable(conn: Connection, cutoff: datetime) -> list[Partition]:
    """The partitions all of whose range is older than `cutoff`, oldest first."""
    if not is_partitioned(conn):
        return []
    return older_than(partitions(conn), cutoff)


def older_than(parts: Iterable[Partition], cutoff: datetime) -> list[Partition]:
    """Those of `parts` all of whose range is older than `cutoff`, in their order: what a retention with
    that cutoff may drop whole (the audit trail's, the runs' and the tasks' weeks)."""
    return [p for p in parts if p.upper is not None and p.upper <= cutoff]


def kept_from(parts: Iterable[Partition], cutoff: datetime) -> datetime | None:
    """The start of the oldest of `parts` not all older than `cutoff`: where a retention's batched delete
    stops, a row from there on going with its partition; None: no such partition."""
    return min(
        (p.lower for p in parts if p.lower is not None and (p.upper is None or p.upper > cutoff)),
        default=None,
    )


def drop_partition(conn: Connection, partition: Partition) -> int:
    """Drop `partition` (in the caller's transaction, which should do nothing else) and return how many rows
    it held, counted just before; 0 if another instance dropped it first."""
    wait_briefly(conn)
    _lock(conn)
    if conn.execute(text("SELECT to_regclass(:p) IS NULL"), {"p": partition.name}).scalar_one():
        return 0
    rows = int(conn.execute(text(f"SELECT count(*) FROM {partition.name}")).scalar_one())
    conn.execute(text(f"DROP TABLE {partition.name}"))
    return rows


def first_period_start(conn: Connection) -> datetime | None:
    """The lower bound of the oldest period's partition: older events are in the partition of the rows the
    migration found, or in the DEFAULT one, and are deleted in batches."""
    lowers = [p.lower for p in partitions(conn) if p.lower is not None] if is_partitioned(conn) else []
    return min(lowers, default=None)
