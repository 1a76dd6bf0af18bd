"""Row ids are RFC 9562 version 7 UUIDs: the time first, so new rows append to their indexes."""

from __future__ import annotations

import itertools
import os
import random
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.ids import EPOCH, id_at, id_at_time, id_beside, new_id, time_of
from rackflow.store.db import in_id_order


def test_an_id_is_a_version_7_uuid_of_the_rfc_variant_that_parses_back() -> None:
    made = new_id()
    assert made.version == 7
    assert made.variant == uuid.RFC_4122
    assert uuid.UUID(str(made)) == made
    assert str(made)[14] == "7"
    assert str(made)[19] in "89ab"


def test_an_id_starts_with_its_unix_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    made = new_id()
    after = time.time_ns() // 1_000_000
    assert before <= made.int >> 80 <= after
    assert id_at(1_700_000_000_123).int >> 80 == 1_700_000_000_123


def test_ids_of_later_milliseconds_sort_after_as_uuids_as_text_and_as_bytes() -> None:
    # Twenty ids a millisecond: within one the random bits order them, across two never.
    groups = [[id_at(ms) for _ in range(20)] for ms in range(1_700_000_000_000, 1_700_000_000_050)]
    for key in (lambda u: u, str, lambda u: u.bytes):
        for earlier, later in itertools.pairwise(groups):
            assert max(map(key, earlier)) < min(map(key, later))


def test_ids_made_in_a_burst_are_distinct_and_ordered_by_millisecond() -> None:
    made = [new_id() for _ in range(100_000)]
    assert len(set(made)) == len(made)
    stamps = [u.int >> 80 for u in made]
    assert stamps == sorted(stamps)
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in made)


def test_a_millisecond_keeps_74_random_bits() -> None:
    made = [id_at(0) for _ in range(1_000)]
    assert len(set(made)) == len(made)
    assert {u.int >> 76 & 0xF for u in made} == {7}
    # Every random bit varies (rand_a: bits 64-75; rand_b: 0-61).
    random_bits = [*range(62), *range(64, 76)]
    assert all(len({u.int >> bit & 1 for u in made}) == 2 for bit in random_bits)


def test_a_forked_child_draws_random_bits_of_its_own() -> None:
    # The random bits are drawn for many ids at once: a child must not make the ids its parent makes next.
    random_bits = 0xFFF << 64 | (1 << 62) - 1  # rand_a and rand_b
    new_id()  # the parent is part-way through a draw
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        os.write(write, b"".join(new_id().bytes for _ in range(3)))
        os._exit(0)
    os.waitpid(pid, 0)
    made = os.read(read, 48)
    children = {uuid.UUID(bytes=made[i : i + 16]).int & random_bits for i in range(0, 48, 16)}
    parents = {new_id().int & random_bits for _ in range(3)}
    assert not children & parents


@pytest.mark.parametrize("unix_ms", [-1, 1 << 48])
def test_a_time_outside_48_bits_is_refused(unix_ms: int) -> None:
    with pytest.raises(ValueError, match="48 bits"):
        id_at(unix_ms)


def test_in_id_order_is_the_order_uuids_sort_in_without_repeats() -> None:
    # Lock orders: every locker must take one batch's rows in the same order (store.db.in_id_order).
    made = [uuid.uuid4() for _ in range(500)] + [new_id() for _ in range(500)]
    shuffled = made + made[::3]
    random.shuffle(shuffled)
    assert in_id_order(shuffled) == sorted(set(made))


def test_an_id_minted_at_a_time_tells_its_millisecond_back() -> None:
    at = datetime(2027, 3, 1, 10, 0, 0, 123_999, tzinfo=UTC)
    made = id_at_time(at)
    assert made.int >> 80 == (at - EPOCH) // timedelta(milliseconds=1)
    assert time_of(made) == datetime(2027, 3, 1, 10, 0, 0, 123_000, tzinfo=UTC)
    assert time_of(id_at_time(EPOCH)) == EPOCH
    with pytest.raises(ValueError, match="48 bits"):
        id_at_time(EPOCH - timedelta(milliseconds=1))


def test_an_id_of_another_version_or_past_a_datetime_tells_no_time() -> None:
    assert time_of(uuid.uuid4()) is None
    assert time_of(uuid.uuid1()) is None
    assert time_of(uuid.UUID(int=0)) is None
    assert time_of(id_at((1 << 48) - 1)) is None  # the year 10889


def test_an_id_beside_another_tells_the_same_time() -> None:
    """A run's tasks are minted beside their run (`id_beside`): the same millisecond for a time-ordered
    id, no time at all beside an id that tells none (so such a run's tasks are filed together, "long
    ago"), and now beside none."""
    run = id_at_time(datetime(2026, 12, 7, 12, 0, 0, 123000, tzinfo=UTC))
    beside = id_beside(run)
    assert beside != run and beside.version == 7 and time_of(beside) == time_of(run)
    old_run = uuid.uuid4()
    assert time_of(id_beside(old_run)) is None and id_beside(old_run) != old_run
    before = datetime.now(UTC) - timedelta(milliseconds=1)
    now = time_of(id_beside(None))
    assert now is not None and before <= now <= datetime.now(UTC)
