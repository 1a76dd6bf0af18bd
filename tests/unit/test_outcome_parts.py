"""`outcome_parts`: what one page of ListTaskScheduleRuns' FULL view carries of its runs' outcomes."""

from __future__ import annotations

import pytest

from rackflow.domain.schedules import outcome_parts


@pytest.mark.parametrize(
    ("sizes", "start", "limit", "budget", "parts"),
    [
        ([], 0, 20, 1000, []),
        ([3, 3, 3], 0, 20, 1000, [(0, 0, 3), (1, 0, 3), (2, 0, 3)]),  # all fit
        ([3, 3, 3], 0, 2, 1000, [(0, 0, 3), (1, 0, 3)]),  # the limit first
        ([3, 3, 3], 0, 20, 7, [(0, 0, 3), (1, 0, 3)]),  # the budget first: whole runs only
        ([3, 8, 3], 0, 20, 7, [(0, 0, 3)]),  # a larger run waits for a page of its own
        ([8, 3], 0, 20, 7, [(0, 0, 7)]),  # and there comes in parts
        ([8, 3], 7, 20, 7, [(0, 7, 8)]),  # its rest alone, though the next run would fit
        ([10_000], 9_000, 20, 1000, [(0, 9_000, 10_000)]),
        ([0, 0, 2], 0, 20, 1, [(0, 0, 0), (1, 0, 0)]),  # runs of no outcome cost nothing
    ],
)
def test_parts(
    sizes: list[int], start: int, limit: int, budget: int, parts: list[tuple[int, int, int]]
) -> None:
    assert outcome_parts(sizes, start, limit, budget) == parts


def test_every_page_stays_within_the_budget_and_the_walk_covers_every_outcome() -> None:
    sizes, budget = [5, 1, 12, 2, 2, 7, 3], 4
    seen: list[tuple[int, int]] = []
    first, start = 0, 0
    while first < len(sizes):
        parts = outcome_parts(sizes[first:], start, 3, budget)
        assert parts and sum(stop - begin for _, begin, stop in parts) <= budget and len(parts) <= 3
        seen += [(first + i, n) for i, begin, stop in parts for n in range(begin, stop)]
        index, _, stop = parts[-1]
        first, start = (first + index, stop) if stop < sizes[first + index] else (first + index + 1, 0)
    assert seen == [(i, n) for i, size in enumerate(sizes) for n in range(size)]
