"""Trying again: the one loop behind every retry in rackflow.

Each caller states its policy as a `Retry` (first delay, the cap that doubling stops at, and when to give
up: a deadline, a number of attempts, or never) and which errors are worth another try; `retrying` does
the waiting, the logging and the giving up. The policies in use, and why they differ:

* an executor's final write of a task's outcome: forever, 0.1 s doubling to 5 s (the run only counts as
  over once it is recorded; giving up would leave the task to a takeover);
* registering an instance: every poll interval until the server stops;
* a firing's write-back: 0.2 s doubling to 2 s for 30 s (then the dispatcher's sweep marks the run);
* the dispatcher's poll after an error: every second until the server stops;
* a call to a BMC: `RACKFLOW_REDFISH_RETRIES` times, on transient errors only;
* a pre-flight check's GET that Alertmanager refuses as busy (503, 429): 0.1 s doubling to 2 s, within the
  look's timeout (`checks.kinds.BUSY_RETRY`: the round still answers, and a failing Alertmanager is not
  waited on longer than the look would wait for its answer); each retry a DEBUG line, the poll's one
  WARNING saying what they came to (`checks.kinds.Answers.say_busy`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from rackflow.clock import sleep_unless_stopped

_T = TypeVar("_T")

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class Retry:
    """When to try again: after `first_delay` seconds, doubling up to `max_delay`; give up once the next
    wait would end past `deadline` seconds from the first attempt, or after `attempts` attempts (None:
    never)."""

    first_delay: float
    max_delay: float
    deadline: float | None = None
    attempts: int | None = None

    @classmethod
    def every(cls, seconds: float, *, attempts: int | None = None) -> Retry:
        """The same delay each time."""
        return cls(seconds, seconds, attempts=attempts)

    def delays(self) -> Iterator[float]:
        delay = self.first_delay
        while True:
            yield delay
            delay = min(delay * 2, self.max_delay)


def _always(_exc: Exception) -> bool:
    return True


async def retrying(
    attempt: Callable[[], Awaitable[_T]],
    policy: Retry,
    *,
    what: str,
    retry_if: Callable[[Exception], bool] = _always,
    explain: Callable[[Exception], str] = str,
    stop: asyncio.Event | None = None,
    sleep: Sleep = asyncio.sleep,
    logger: logging.Logger = log,
    level: int = logging.WARNING,
) -> _T:
    """`await attempt()` until it returns, waiting the policy's delays after each error `retry_if` accepts.

    Raises the error as it is when `retry_if` refuses it, and the last error when the policy gives up or
    `stop` is set (while waiting, too: the wait ends at once). Each retry is logged at `level` (a warning
    unless the caller says otherwise) saying `what` failed, why (`explain`), and when it is tried again. A
    caller whose retries come by the thousand (a busy Alertmanager's refusals, asked again within a
    pre-flight poll) logs each at DEBUG and says once what they came to itself.
    """
    started = time.monotonic()
    delays = policy.delays()
    tries = 0
    while True:
        tries += 1
        try:
            return await attempt()
        except Exception as exc:
            delay = next(delays)
            out_of_time = policy.deadline is not None and time.monotonic() - started + delay > policy.deadline
            out_of_tries = policy.attempts is not None and tries >= policy.attempts
            if not retry_if(exc) or out_of_time or out_of_tries or (stop is not None and stop.is_set()):
                raise
            why = explain(exc) or type(exc).__name__
            logger.log(level, "%s failed (%s); try %d, again in %.1fs", what, why, tries, delay)
            if stop is None:
                await sleep(delay)
            elif await sleep_unless_stopped(stop, timedelta(seconds=delay)):
                raise
