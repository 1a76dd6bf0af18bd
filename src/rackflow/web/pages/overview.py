"""Overview: schedules by state, tasks by status, recent failures, the dispatcher's backlog, and the next
firings across all schedules on a time axis."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.config import DUE_COUNT_CAP
from rackflow.domain.schedules import Schedule
from rackflow.domain.tasks import Task
from rackflow.timespec import SpecType
from rackflow.web.pages import Site

FAILURE_WINDOW = timedelta(hours=24)
HORIZON = timedelta(hours=24)  # the time axis
AXIS_SCHEDULES = 12  # rows on the time axis: the schedules that fire soonest
MAX_MARKS = 96  # firings drawn per row (a schedule every 15 minutes fills its row)
FAILED_TASKS_READ = 500
AXIS_WIDTH = 1000  # SVG user units; the axis scales to the page width


@dataclass(frozen=True)
class AxisRow:
    schedule: Schedule
    marks: list[tuple[datetime, float]]  # firing time, x position on the axis


@dataclass(frozen=True)
class FailureGroup:
    """Failed tasks of one schedule (or of no schedule: manual tasks) in the failure window."""

    schedule_id: Any
    tasks: list[Task]


def routes(site: Site) -> list[Route]:
    async def overview(request: Request) -> Response:
        return await site.page(request, "overview.html", "Overview", lambda _: _load(site))

    return [Route("/", overview)]


def _axis(site: Site, schedules: list[Schedule], now: datetime) -> list[AxisRow]:
    end = now + HORIZON
    rows = []
    for schedule in schedules:
        assert schedule.next_run_at is not None
        times = [schedule.next_run_at]
        if schedule.spec.type is not SpecType.ONE_TIME:
            times += site.services.schedules.preview(schedule.spec, schedule.next_run_at, MAX_MARKS - 1)
        inside = [t for t in times if t <= end]
        span = HORIZON.total_seconds()
        rows.append(
            AxisRow(schedule, [(t, max(0.0, (t - now).total_seconds()) / span * AXIS_WIDTH) for t in inside])
        )
    return rows


async def _load(site: Site) -> Mapping[str, Any]:
    services = site.services
    now = site.clock.now()
    soonest = await services.schedules.next_to_fire(AXIS_SCHEDULES)
    failed = await services.tasks.failed_since(now - FAILURE_WINDOW, FAILED_TASKS_READ)
    by_schedule: dict[Any, list[Task]] = defaultdict(list)
    for task in failed:
        by_schedule[task.schedule_id].append(task)
    groups = sorted(
        (FailureGroup(schedule_id, tasks) for schedule_id, tasks in by_schedule.items()),
        key=lambda g: g.tasks[0].created_at,
        reverse=True,
    )
    backlog = await services.schedules.due_count()
    return {
        "counts": await services.schedules.state_counts(),
        "task_counts": await services.tasks.status_counts(now - FAILURE_WINDOW),
        "backlog": backlog,
        "backlog_capped": backlog >= DUE_COUNT_CAP,
        "failures": groups,
        "failed_total": len(failed),
        "failed_capped": len(failed) == FAILED_TASKS_READ,
        "schedule_names": await services.schedules.names({g.schedule_id for g in groups if g.schedule_id}),
        "rack_names": await services.inventory.rack_names({t.rack_id for t in failed}),
        "axis": _axis(site, [s for s in soonest if s.next_run_at is not None], now),
        "axis_hours": [(h, h / 24 * AXIS_WIDTH) for h in range(0, 25, 3)],
        "axis_width": AXIS_WIDTH,
        "horizon_hours": int(HORIZON.total_seconds() // 3600),
    }
