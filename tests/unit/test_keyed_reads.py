"""`KeyedReads`: who is answered by which round, when a round waits to gather concurrent callers, and what
a failed round or a cancelled caller does."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence

import pytest

from rackflow.store.keyed_reads import KeyedReads


class Reader:
    """Rows are (key, key * 10) for keys below 100; each round waits until the test releases it."""

    def __init__(self) -> None:
        self.rounds: list[list[Hashable]] = []
        self.release = asyncio.Event()
        self.fail_next = False

    async def read_many(self, keys: list[Hashable]) -> Sequence[tuple[int, int]]:
        self.rounds.append(sorted(keys, key=repr))
        await self.release.wait()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        return [(k, k * 10) for k in keys if isinstance(k, int) and k < 100]


def reads(reader: Reader, *, gather_window: float = 3600.0) -> KeyedReads:
    """By default a window no test outlasts: a round that waits for it never goes."""
    return KeyedReads(reader.read_many, lambda row: row[0], gather_window=gather_window)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_callers_queued_together_share_one_round_and_get_their_own_rows() -> None:
    reader = Reader()
    keyed = reads(reader)
    asked = [asyncio.ensure_future(keyed.get(k)) for k in (3, 1, 3, 500)]
    await settle()
    reader.release.set()
    assert await asyncio.gather(*asked) == [(3, 30), (1, 10), (3, 30), None]
    assert reader.rounds == [[1, 3, 500]]


async def test_a_key_asked_during_a_round_waits_for_the_next_one() -> None:
    reader = Reader()
    keyed = reads(reader, gather_window=0.01)
    first = asyncio.ensure_future(keyed.get(1))
    await settle()  # the first round is in flight
    late = asyncio.ensure_future(keyed.get(2))
    await settle()
    assert reader.rounds == [[1]]  # not sent with the round already asked
    reader.release.set()
    assert (await first, await late) == ((1, 10), (2, 20))
    assert reader.rounds == [[1], [2]]


async def test_a_failed_round_fails_its_callers_only() -> None:
    reader = Reader()
    keyed = reads(reader, gather_window=0.01)
    reader.fail_next = True
    failing = [asyncio.ensure_future(keyed.get(k)) for k in (1, 2)]
    await settle()
    later = asyncio.ensure_future(keyed.get(3))
    reader.release.set()
    for f in failing:
        with pytest.raises(RuntimeError, match="boom"):
            await f
    assert await later == (3, 30)


async def test_a_cancelled_caller_leaves_the_others_answered() -> None:
    reader = Reader()
    keyed = reads(reader, gather_window=0.01)
    gone, kept = asyncio.ensure_future(keyed.get(1)), asyncio.ensure_future(keyed.get(1))
    await settle()
    gone.cancel()
    reader.release.set()
    assert await kept == (1, 10)
    assert gone.cancelled()
    assert await keyed.get(4) == (4, 40)  # the reader is still usable


async def test_callers_one_after_another_are_never_held() -> None:
    reader = Reader()
    reader.release.set()
    keyed = reads(reader)
    for key in range(5):
        asked = asyncio.ensure_future(keyed.get(key))
        await settle()  # no time passes: a round that waited for the window would still be waiting
        assert asked.done() and asked.result() == (key, key * 10)
    assert reader.rounds == [[0], [1], [2], [3], [4]]


async def two_come_during_a_round(
    reader: Reader, keyed: KeyedReads
) -> tuple[asyncio.Future[object], list[asyncio.Future[object]]]:
    """Round [1] goes out, keys 2 and 3 are asked while it is out, then it is answered: the next round
    expects three callers (the one it answered and the two who came)."""
    first = asyncio.ensure_future(keyed.get(1))
    await settle()
    during = [asyncio.ensure_future(keyed.get(k)) for k in (2, 3)]
    reader.release.set()
    return first, during


async def test_callers_who_came_during_a_round_make_the_next_wait_for_as_many() -> None:
    reader = Reader()
    keyed = reads(reader)
    first, during = await two_come_during_a_round(reader, keyed)
    assert await first == (1, 10)
    await settle()
    # Round [1] answered one caller and two came while it was out: the next waits for three.
    assert reader.rounds == [[1]] and not any(f.done() for f in during)
    third = asyncio.ensure_future(keyed.get(4))
    assert await asyncio.gather(*during, third) == [(2, 20), (3, 30), (4, 40)]
    assert reader.rounds == [[1], [2, 3, 4]]


async def test_a_round_waits_no_longer_than_the_window() -> None:
    reader = Reader()
    keyed = reads(reader, gather_window=0.05)
    first, during = await two_come_during_a_round(reader, keyed)
    await first
    # Three expected, two came: the round goes when the window closes.
    assert await asyncio.wait_for(asyncio.gather(*during), timeout=5) == [(2, 20), (3, 30)]
    assert reader.rounds == [[1], [2, 3]]


async def test_readers_gone_quiet_longer_than_the_window_are_not_waited_for() -> None:
    reader = Reader()
    keyed = reads(reader, gather_window=0.05)
    first, during = await two_come_during_a_round(reader, keyed)
    await asyncio.gather(first, *during)  # the last round expected three and answered two
    await asyncio.sleep(0.2)
    lone = asyncio.ensure_future(keyed.get(9))
    await settle()
    assert lone.done() and lone.result() == (9, 90)
