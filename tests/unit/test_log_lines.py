"""What the retention loop says in the log (rackflow/retention.py): the retention as the operator gave it,
a Go duration, and which retention it is; and how work tried again later reports a failure (`logs.failed`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from rackflow import logs
from rackflow.errors import Unavailable
from rackflow.retention import Pruner, run_in_order


async def _two_chunks(_db: Any, _retention: timedelta, *, chunk: int = 0) -> AsyncGenerator[int, None]:
    yield 3
    yield 2


def _pruner(retention: timedelta) -> Pruner:
    counter = Counter("pruned_total", "test", registry=CollectorRegistry())
    return Pruner(None, retention, name="audit", what="events", prune=_two_chunks, counter=counter)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("retention", "said"),
    [(timedelta(days=90), "2160h"), (timedelta(days=7), "168h"), (timedelta(hours=1), "1h")],
)
def test_the_log_gives_the_retention_as_a_go_duration_and_names_it(
    caplog: pytest.LogCaptureFixture, retention: timedelta, said: str
) -> None:
    """`--audit-retention 2160h` was logged as `events retention: deleting those older than 90 days,
    0:00:00, every 1:00:00` and `audit retention: pruned 5 events older than 90 days, 0:00:00`."""
    stop = asyncio.Event()
    stop.set()  # the first lines only
    with caplog.at_level(logging.INFO, logger="rackflow.retention"):
        asyncio.run(run_in_order([_pruner(retention)], stop))
        asyncio.run(_pruner(retention).prune_once(asyncio.Event()))
    assert [r.getMessage() for r in caplog.records] == [
        f"audit retention: deleting events older than {said}, every 1h",
        f"audit retention: pruned 5 events older than {said}",
    ]


def test_work_tried_again_reports_an_outage_in_a_line_and_a_bug_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`logs.failed`, what the executor (its polls, a task's run, its heartbeat), the pre-flight checker and
    the rollout driver report a failure with: through a database outage each logged a traceback at ERROR."""
    log = logging.getLogger("rackflow.test")
    with caplog.at_level(logging.WARNING, logger="rackflow.test"):
        for failure in (Unavailable("database unavailable: connection refused"), KeyError("bug")):
            try:
                raise failure
            except Exception:
                logs.failed(log, "task %s: run interrupted", "t1", then="; it will be run again")
    assert [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        (
            logging.WARNING,
            "task t1: run interrupted (database unavailable: connection refused); it will be run again",
            False,
        ),
        (logging.ERROR, "task t1: run interrupted; it will be run again", True),
    ]
