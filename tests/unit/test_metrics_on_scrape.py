"""Gauges read on scrape (`metrics.ReadOnScrape`): a scrape from another thread runs the reader on the
event loop and shows what it read; a reader that fails leaves the last values; on the loop's own thread
(which cannot wait for the loop) and without a reader, the last values, the reader not called."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from rackflow.metrics import ReadOnScrape

NAME = "rackflow_test_read_on_scrape"


@pytest.fixture
def gauge() -> Iterator[ReadOnScrape]:
    made = ReadOnScrape({NAME: "A gauge read on scrape (a test's)."})
    yield made
    REGISTRY.unregister(made)


async def test_a_scrape_from_another_thread_reads_on_the_loop(gauge: ReadOnScrape) -> None:
    reads: list[int] = []
    values = iter([3.0, 5.0])

    async def read() -> dict[str, float]:
        reads.append(1)
        return {NAME: next(values)}

    def scrape() -> float | None:
        return REGISTRY.get_sample_value(NAME)

    assert scrape() == 0.0 and reads == []  # no reader yet
    gauge.read_with(asyncio.get_running_loop(), read)
    assert await asyncio.to_thread(scrape) == 3.0
    assert await asyncio.to_thread(scrape) == 5.0
    assert scrape() == 5.0 and len(reads) == 2  # on the loop's thread: the last value, no read
    gauge.read_with(None, None)
    assert await asyncio.to_thread(scrape) == 5.0 and len(reads) == 2


async def test_a_failed_read_shows_the_last_values(
    gauge: ReadOnScrape, caplog: pytest.LogCaptureFixture
) -> None:
    answers: list[dict[str, float] | Exception] = [{NAME: 7.0}, RuntimeError("database unavailable")]

    async def read() -> dict[str, float]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    gauge.read_with(asyncio.get_running_loop(), read)
    assert await asyncio.to_thread(REGISTRY.get_sample_value, NAME) == 7.0
    assert await asyncio.to_thread(REGISTRY.get_sample_value, NAME) == 7.0
    assert "reading gauges for a scrape failed (database unavailable)" in caplog.text
