"""The one place that reads the wall clock, so tests and fault drills can move time."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    # True for a clock that a test sets: then it is the time the database is asked too (`Database.now`,
    # the database's own clock on PostgreSQL), so what is due follows the test. False for the real clock,
    # shifted or not: a skewed host must not decide what is due on PostgreSQL.
    stands_for_the_database: bool

    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...


class SystemClock:
    """The real clock, optionally shifted (`RACKFLOW_CLOCK_OFFSET`, for clock-jump drills)."""

    stands_for_the_database = False

    def __init__(self, offset: timedelta = timedelta(0)) -> None:
        self.offset = offset

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset


class FakeClock:
    """A clock that only moves when told to; for unit tests."""

    stands_for_the_database = True

    def __init__(self, start: datetime) -> None:
        if start.tzinfo is None:
            raise ValueError("FakeClock needs an aware datetime")
        self._now = start.astimezone(UTC)

    def now(self) -> datetime:
        return self._now

    def advance(self, delta: timedelta) -> None:
        self._now += delta


async def sleep_unless_stopped(stop: asyncio.Event, delay: timedelta) -> bool:
    """Wait `delay`, or less if `stop` is set first (the background loops' pause); True when stopping."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay.total_seconds())
    return stop.is_set()


async def sleep_unless_woken(stop: asyncio.Event, woken: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if `woken` or `stop` is set first (the pause of a loop that sleeps while it
    has nothing to do, until what gives it work wakes it)."""
    if woken.is_set() or stop.is_set():
        return
    waiters = [asyncio.ensure_future(woken.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
