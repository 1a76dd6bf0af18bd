"""The pre-flight checker yields to its process's firing pass, for a bounded time (issue 26): while the
dispatcher fires, a poll waits for the pass to end, but at most `yield_for`, so checks are slowed during a
long drain and never starved. The poll itself is replaced: this is the loop's timing alone (the rounds it
takes are tested on both databases in tests/store/test_checks.py)."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

from rackflow.checks.checker import PreflightChecker
from rackflow.clock import FakeClock
from rackflow.store.db import Database
from rackflow.tasks.manager import TaskManager

YIELD = 0.3
POLL_INTERVAL = 0.05


async def _polls(firing: Any, seconds: float) -> list[float]:
    """When (seconds after the start) a checker polled, run for `seconds` with `firing`."""
    checker = PreflightChecker(
        cast(Database, SimpleNamespace(on_commit={})),  # only its hooks: the poll is replaced
        FakeClock(datetime(2026, 12, 3, tzinfo=UTC)),
        cast(TaskManager, object()),
        poll_interval=timedelta(seconds=POLL_INTERVAL),
        firing=firing,
        yield_for=timedelta(seconds=YIELD),
    )
    loop = asyncio.get_running_loop()
    start = loop.time()
    polls: list[float] = []

    async def poll() -> int:
        polls.append(loop.time() - start)
        return 0

    checker.poll = poll  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(checker.run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    await asyncio.wait_for(running, 5)
    return polls


async def test_a_poll_waits_for_the_firing_pass_to_end() -> None:
    loop = asyncio.get_running_loop()
    ends = loop.time() + 0.15
    polls = await _polls(lambda: loop.time() < ends, 0.3)
    assert polls, "the checker polled once the pass ended"
    assert 0.15 <= polls[0] < YIELD  # not during the pass, and at once after it


async def test_a_poll_waits_at_most_the_bound_while_the_dispatcher_keeps_firing() -> None:
    polls = await _polls(lambda: True, 3 * (YIELD + POLL_INTERVAL) + 0.2)
    assert polls[0] >= YIELD - 0.01
    assert len(polls) >= 2  # a long drain slows the checks, but never starves them
    gaps = [later - earlier for earlier, later in itertools.pairwise(polls)]
    assert all(gap >= YIELD for gap in gaps)


async def test_without_a_firing_pass_it_polls_at_once() -> None:
    for firing in (None, lambda: False):
        polls = await _polls(firing, 0.25)
        assert polls[0] < 0.1
        assert len(polls) >= 2  # every poll interval
