"""A task that waited for a window (or a deferral's start deadline) may not start at the window's end
itself: windows are half-open, `[start, end)` (docs/WINDOWS.md), as the planner's deferrals are (an
opening at the deadline is missed)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from rackflow.tasks.executor import _refusal
from rackflow.timespec import format_rfc3339
from tests.unit.test_retry_policy import NOW, task

END = NOW + timedelta(hours=2)


def test_a_task_may_start_up_to_its_windows_end_but_not_at_it() -> None:
    waited = replace(task(), not_after=END)  # its claim stamped `started_at`, as every claim does
    assert _refusal(waited, 1, END - timedelta(microseconds=1), None) is None
    assert (
        _refusal(waited, 1, END, None)
        == f"the maintenance window ended at {format_rfc3339(END)} before the task could run"
    )
    assert _refusal(waited, 1, END, END) == (
        f"its firing's start deadline passed at {format_rfc3339(END)} before the task could run"
    )


def test_an_attempt_after_the_task_ran_says_it_is_the_attempt_that_could_not() -> None:
    """A retry's next attempt (its first claim) or a takeover (a later claim of its attempt) past the
    window's end: the task did run, its attempt did not."""
    retried = replace(task(attempt=2), not_after=END)
    assert (
        _refusal(retried, 1, END, None)
        == f"the maintenance window ended at {format_rfc3339(END)} before attempt 2 could run"
    )
    taken_over = replace(task(), not_after=END)
    assert (
        _refusal(taken_over, 2, END, None)
        == f"the maintenance window ended at {format_rfc3339(END)} before attempt 1 could run"
    )
