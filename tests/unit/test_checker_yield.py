"""The pre-flight checker yields to its process's firing pass, for a bounded time (issue 26): while the
dispatcher fires, a poll waits for the pass to end, but at most `yield_for`, so checks are slowed during a
long drain and never starved. The poll itself is replaced: this is the loop's timing alone (the rounds it
takes are tested on both databases in tests/store/test_checks.py).

Each test runs the checker until it has polled (or looked) as often as it needs, never for a fixed time, and
asserts only lower bounds on when it polled: a busy machine makes the loop late, never early. "At once" is
shown by a bound (or an idle interval) of an hour that the wait would otherwise have to outlast."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import cast

from rackflow.checks.checker import PreflightChecker
from rackflow.clock import FakeClock
from rackflow.store.db import Database
from rackflow.tasks.manager import TaskManager

YIELD = timedelta(seconds=0.3)
POLL_INTERVAL = timedelta(seconds=0.05)
AN_HOUR = timedelta(hours=1)  # longer than any wait of these tests


class Polls:
    """A checker, running, whose poll is replaced: when (seconds after the start) it polled."""

    def __init__(self, firing: Callable[[], bool] | None, yield_for: timedelta) -> None:
        self.checker = PreflightChecker(
            cast(Database, SimpleNamespace(on_commit={})),  # only its hooks: the poll is replaced
            FakeClock(datetime(2026, 12, 3, tzinfo=UTC)),
            cast(TaskManager, object()),
            poll_interval=POLL_INTERVAL,
            idle_interval=AN_HOUR,
            firing=firing,
            yield_for=yield_for,
        )
        self.at: list[float] = []
        self.checker.poll = self._poll  # type: ignore[method-assign]
        self._start = asyncio.get_running_loop().time()
        self._stop = asyncio.Event()
        self._running = asyncio.create_task(self.checker.run(self._stop))

    async def _poll(self) -> int:
        self.at.append(asyncio.get_running_loop().time() - self._start)
        return 0

    async def until(self, done: Callable[[], bool]) -> None:
        """Until `done()` holds (at most 15 s)."""
        async with asyncio.timeout(15):
            while True:
                if done():
                    return
                await asyncio.sleep(0.01)

    async def polled(self, count: int) -> None:
        await self.until(lambda: len(self.at) >= count)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(self._running, 10)


class Pass:
    """A firing pass the test ends; how often the checker looked whether it had."""

    def __init__(self) -> None:
        self.on = True
        self.looks = 0

    def __call__(self) -> bool:
        self.looks += 1
        return self.on


async def test_a_poll_waits_for_the_firing_pass_to_end() -> None:
    """With a bound of an hour, the checker looks again and again while the pass lasts, polls not once,
    and polls as soon as the pass has ended."""
    firing = Pass()
    polls = Polls(firing, yield_for=AN_HOUR)
    try:
        await polls.until(lambda: firing.looks >= 5)
        assert polls.at == []  # not during the pass
        firing.on = False
        await polls.polled(1)  # at once after it, not after the hour's bound
    finally:
        await polls.stop()


async def test_a_poll_waits_at_most_the_bound_while_the_dispatcher_keeps_firing() -> None:
    polls = Polls(lambda: True, yield_for=YIELD)
    try:
        await polls.polled(3)  # a long drain slows the checks, but never starves them
    finally:
        await polls.stop()
    assert polls.at[0] >= YIELD.total_seconds() - 0.01
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls.at)]
    assert all(gap >= YIELD.total_seconds() for gap in gaps)


async def test_without_a_firing_pass_it_polls_at_once() -> None:
    """With a bound and an idle interval of an hour, it polls without waiting for either, and again after
    the poll interval (the pause's look at the next round fails on the fake database: a failed look pauses
    the poll interval)."""
    firings: list[Callable[[], bool] | None] = [None, lambda: False]
    for firing in firings:
        polls = Polls(firing, yield_for=AN_HOUR)
        try:
            await polls.polled(2)
        finally:
            await polls.stop()
