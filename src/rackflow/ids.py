"""Row ids: UUIDv7 (RFC 9562), time-ordered, for every row rackflow makes.

Why not random (version 4) UUIDs: a random key sends each new row to a random leaf page of every index
that starts with it, so inserting a run, its tasks and an audit event reads and dirties a few dozen pages
spread over the whole of each index. With ten million runs and tasks those pages are mostly not cached and
a firing waits for the disk (docs/PERFORMANCE.md, "The drain among a loaded history"). A version 7 id
starts with the unix time in milliseconds, so new rows go to the right edge of their primary keys and of
the indexes led by such an id (`uq_tasks_run_id_rack_id`, `ix_tasks_run_id_status`), pages that are hot.

One rule for all ids (runs, tasks, audit events, notification events and deliveries, schedules, scopes,
racks, …) rather than a list of the tables that grow: the cost is the same, and no reader has to know
which kind an id is. Nothing orders by id for meaning: ids only break ties after a time column (keyset
pages by (created_at, id) stay total orders) and fix a lock order, which any total order does.

What the id tells: the millisecond its row was made, which every such row already shows in its own time
column; nothing uses an id as a secret. The time is read from the wall clock, not the injected `Clock`:
it only places the row in its indexes, rackflow decides nothing from it, and a clock that steps back (or a
fault drill's offset) only puts a few rows out of order, which costs a page read, not a wrong answer.
Within one millisecond the 74 random bits order ids at random (uniqueness does not depend on the clock).

Two exceptions. A dispatched run's id is minted at its slot's millisecond (`id_at_time`, from
`domain.firing.run_id`), not at the moment its row was made. The runs are partitioned by their slot on
PostgreSQL (`store.run_partitions`), so such an id says which partition holds its run, and a statement
naming runs by id alone is bounded to those partitions (`run_partitions.of_runs`) instead of probing
every one. Its place in the primary key is then its slot's: a partition's key still grows at its right
edge, the runs of one slot being made together. A manual run (no slot) keeps `new_id`.

And a run's tasks are minted at their run's id's millisecond (`id_beside`): on PostgreSQL the tasks are
partitioned by the time their id tells (`store.task_partitions`), so a run's tasks share a week whenever
they are submitted (a rollout's later wave, a deferral), and a statement naming tasks by id names their
partitions. A manual task keeps `new_id`.
"""

from __future__ import annotations

import os
import secrets
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

_RANDOM_BITS = 74  # rand_a (12 bits) and rand_b (62 bits)
_RAND_B_BITS = 62
# The random bits are drawn from the operating system for this many ids at a time: one draw per id
# (`secrets.randbits`) was 2.3 µs, nearly half of an id, and a firing makes two (docs/PERFORMANCE.md,
# issue 29). Ten bytes an id, of which 74 bits are used.
_IDS_PER_DRAW = 256
_BYTES_PER_ID = 10
_VERSION = 0x7
_VARIANT = 0b10  # RFC 9562's variant


def new_id() -> uuid.UUID:
    """A new row's id: now, in unix milliseconds, then random bits."""
    return id_at(time.time_ns() // 1_000_000)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MILLISECOND = timedelta(milliseconds=1)


def id_at_time(at: datetime) -> uuid.UUID:
    """A version 7 UUID of the millisecond `at` (aware) falls in (`id_at`); ValueError before 1970."""
    return id_at((at - EPOCH) // _MILLISECOND)


def id_beside(other: uuid.UUID | None) -> uuid.UUID:
    """A new id that tells the time `other` tells: of the millisecond `other` (a version 7 id) was minted
    at; a random (version 4) one, telling none, beside an id that tells none (a run recorded before ids
    were time-ordered); of now (`new_id`) beside None."""
    if other is None:
        return new_id()
    at = time_of(other)
    return id_at_time(at) if at is not None else uuid.uuid4()


def time_of(row_id: uuid.UUID) -> datetime | None:
    """The millisecond a version 7 id was minted at (`id_at`), as an aware UTC time; None for an id of
    another version (the random ids of rows made before rackflow's ids were time-ordered) or of a
    millisecond past what a datetime holds."""
    if row_id.version != _VERSION:
        return None
    try:
        return EPOCH + (row_id.int >> 80) * _MILLISECOND
    except OverflowError:
        return None


def id_at(unix_ms: int) -> uuid.UUID:
    """A version 7 UUID of millisecond `unix_ms` (48 bits) with fresh random bits: `unix_ts_ms`, `ver`,
    `rand_a`, `var`, `rand_b`, as RFC 9562 section 5.7 lays them out."""
    if not 0 <= unix_ms < 1 << 48:
        raise ValueError(f"unix_ms {unix_ms} does not fit in 48 bits")
    rand = _random_bits()
    rand_a = rand >> _RAND_B_BITS
    rand_b = rand & ((1 << _RAND_B_BITS) - 1)
    return uuid.UUID(int=unix_ms << 80 | _VERSION << 76 | rand_a << 64 | _VARIANT << 62 | rand_b)


_drawn: Iterator[int] = iter(())


def _random_bits() -> int:
    """74 random bits from the operating system's generator (as `secrets.randbits` gives them), from a
    draw of _IDS_PER_DRAW ids' worth. `next` on a list's iterator is one step under the GIL, so threads
    never share a value; two threads that find the draw used up each make a draw of their own."""
    global _drawn
    try:
        return next(_drawn)
    except StopIteration:
        pool = secrets.token_bytes(_IDS_PER_DRAW * _BYTES_PER_ID)
        bits = [
            int.from_bytes(pool[start : start + _BYTES_PER_ID]) >> (8 * _BYTES_PER_ID - _RANDOM_BITS)
            for start in range(0, len(pool), _BYTES_PER_ID)
        ]
        _drawn = iter(bits)
        return next(_drawn)


def _forget_draw() -> None:
    """A forked child draws its own bits: with its parent's rest of the draw, both would make the same ids."""
    global _drawn
    _drawn = iter(())


os.register_at_fork(after_in_child=_forget_draw)


def is_uuid(value: str) -> bool:
    """Whether `value` reads as a UUID in any spelling `uuid.UUID` takes: a reference that does is an id,
    never a name (the CLI, the web pages), so no name may read as one (`validation.check_name`)."""
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True
