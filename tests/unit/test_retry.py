"""The one retry loop: doubling delays to a cap, and each way of giving up."""

from __future__ import annotations

import asyncio
import logging

import pytest

from rackflow.retry import Retry, retrying


class Flaky:
    """Fails `failures` times with `error`, then returns "done"; records the waits it was given."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.failures = failures
        self.error = error or ConnectionError("database went away")
        self.calls = 0
        self.slept: list[float] = []

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "done"

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_delays_double_up_to_the_cap() -> None:
    delays = Retry(0.1, 0.5).delays()
    assert [next(delays) for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    fixed = Retry.every(2.0).delays()
    assert [next(fixed) for _ in range(3)] == [2.0, 2.0, 2.0]


async def test_retries_until_it_succeeds_waiting_each_delay() -> None:
    flaky = Flaky(3)
    assert await retrying(flaky, Retry(1.0, 3.0), what="writing", sleep=flaky.sleep) == "done"
    assert flaky.slept == [1.0, 2.0, 3.0]


async def test_gives_up_after_its_attempts_with_the_last_error() -> None:
    flaky = Flaky(5)
    with pytest.raises(ConnectionError):
        await retrying(flaky, Retry(1.0, 1.0, attempts=3), what="calling", sleep=flaky.sleep)
    assert (flaky.calls, flaky.slept) == (3, [1.0, 1.0])


async def test_gives_up_when_the_next_wait_would_pass_the_deadline() -> None:
    flaky = Flaky(100)
    with pytest.raises(ConnectionError):
        await retrying(flaky, Retry(0.0, 0.0, deadline=0.0), what="writing", sleep=flaky.sleep)
    assert flaky.calls == 1


async def test_an_error_not_worth_retrying_is_raised_at_once() -> None:
    flaky = Flaky(1, ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        await retrying(
            flaky,
            Retry(1.0, 1.0),
            what="calling",
            retry_if=lambda e: isinstance(e, OSError),
            sleep=flaky.sleep,
        )
    assert flaky.slept == []


async def test_stop_ends_the_wait_and_raises_the_last_error() -> None:
    stop = asyncio.Event()
    flaky = Flaky(100)

    async def stop_soon() -> None:
        await asyncio.sleep(0.05)
        stop.set()

    stopper = asyncio.create_task(stop_soon())
    with pytest.raises(ConnectionError):
        await retrying(flaky, Retry.every(3600.0), what="registering", stop=stop)
    await stopper
    assert flaky.calls == 1


async def test_each_retry_is_logged_at_the_level_the_caller_asks(caplog: pytest.LogCaptureFixture) -> None:
    """A WARNING a retry by default, as every caller had it; a caller that says what its retries came to
    by itself (the pre-flight checker's busy Alertmanager: thousands of retries a poll) logs each at DEBUG."""
    caplog.set_level(logging.DEBUG, logger="rackflow.retry")
    flaky = Flaky(2)
    await retrying(flaky, Retry(1.0, 1.0), what="writing", sleep=flaky.sleep)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, "writing failed (database went away); try 1, again in 1.0s"),
        (logging.WARNING, "writing failed (database went away); try 2, again in 1.0s"),
    ]
    caplog.clear()
    quiet = Flaky(2)
    await retrying(quiet, Retry(1.0, 1.0), what="asking", sleep=quiet.sleep, level=logging.DEBUG)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "asking failed (database went away); try 1, again in 1.0s"),
        (logging.DEBUG, "asking failed (database went away); try 2, again in 1.0s"),
    ]
