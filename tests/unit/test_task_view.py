"""`rackflow task show` says what holds a task, why and since when, and until when at most: the hold's end
(`Task.not_before`), which is no start time (a pre-flight check's hold ends at its maximum wait, and the
task fails then if the checks still hold it)."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich.console import Console

from rackflow.cli.tasks import task_view
from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import a_task, stamp


def _text(task: pb.Task) -> str:
    screen = io.StringIO()
    Console(file=screen, width=160).print(task_view(task, {}, ""))
    return screen.getvalue()


def test_a_held_task_shows_its_hold() -> None:
    task = a_task(pb.TASK_STATUS_PENDING)
    task.held_by, task.held_reason = "budget", "waits for budget 'fw' (8 of 8 running)"
    task.held_since.CopyFrom(stamp(datetime(2026, 12, 2, 20, 0, tzinfo=UTC)))
    task.not_before.CopyFrom(stamp(datetime(2026, 12, 2, 20, 0, 10, tzinfo=UTC)))
    task.not_after.CopyFrom(stamp(datetime(2026, 12, 2, 22, 0, tzinfo=UTC)))
    text = _text(task)
    assert "held by" in text and "budget since 2026-12-02" in text
    assert "waits for budget 'fw' (8 of 8 running)" in text
    assert "held at most until 2026-12-02 20:00:10Z" in " ".join(text.split()) and "not after" in text
    assert "not before" not in text  # it read as a start time


def test_a_task_a_check_holds_says_it_fails_at_the_end_of_the_hold() -> None:
    task = a_task(pb.TASK_STATUS_PENDING)
    task.held_by, task.held_reason = "preflight", "pre-flight check 'no-alerts': 2 alerts firing"
    task.held_since.CopyFrom(stamp(datetime(2026, 12, 2, 20, 0, tzinfo=UTC)))
    task.not_before.CopyFrom(stamp(datetime(2026, 12, 2, 21, 0, tzinfo=UTC)))
    text = " ".join(_text(task).split())
    assert (
        "held at most until 2026-12-02 21:00Z (asked again then; it fails once a check's maximum wait "
        "has run out)" in text
    )
    assert "not before" not in text


def test_a_task_nothing_holds_shows_no_hold() -> None:
    text = _text(a_task(pb.TASK_STATUS_RUNNING))
    assert "held by" not in text and "held at most" not in text and "not after" not in text
