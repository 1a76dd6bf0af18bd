"""Overview: schedules by state, tasks by status, what waits for someone (halted rollouts, tasks held by a
window, a freeze or a budget, paused schedules), recent failures, the dispatcher's backlog, and the next
firings across all schedules on a time axis.

The axis counts a dense schedule's firings per slot (`SLOTS` across the horizon) rather than drawing each:
a schedule firing every 2 minutes shows a count in every slot to the end of the horizon.
"""

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
from rackflow.domain.schedules import Schedule, ScheduleOrder
from rackflow.domain.tasks import Task
from rackflow.timespec import SpecType
from rackflow.validation import MAX_PREVIEW_COUNT
from rackflow.web.pages import Site

FAILURE_WINDOW = timedelta(hours=24)
HORIZON = timedelta(hours=24)  # the time axis
AXIS_SCHEDULES = 12  # rows on the time axis: the schedules that fire soonest
SLOTS = 96  # the axis in slots of 15 minutes: one mark per slot that has firings, with their count
MAX_FIRINGS = 1440  # firings read per row: one a minute for the whole horizon (cron's finest)
FAILED_TASKS_READ = 500
FLAG_ROWS = 10  # rows per flag panel (each says how many there are in all)
AXIS_WIDTH = 1000  # SVG user units; the axis scales to the page width


@dataclass(frozen=True)
class Mark:
    """The firings of one row in one slot: drawn once, with their count when more than one."""

    x: float
    count: int
    first: datetime
    last: datetime


@dataclass(frozen=True)
class AxisRow:
    schedule: Schedule
    marks: list[Mark]
    firings: int  # in the horizon
    capped: bool  # more than MAX_FIRINGS: the marks show the first MAX_FIRINGS


@dataclass(frozen=True)
class FailureGroup:
    """Failed tasks of one schedule (or of no schedule: manual tasks) in the failure window."""

    schedule_id: Any
    tasks: list[Task]


def routes(site: Site) -> list[Route]:
    async def overview(request: Request) -> Response:
        return await site.page(request, "overview.html", "Overview", lambda _: _load(site))

    return [Route("/", overview)]


def firings_within(site: Site, schedule: Schedule, end: datetime) -> tuple[list[datetime], bool]:
    """The schedule's firings from its next run to `end` (at most MAX_FIRINGS), and whether there are more."""
    assert schedule.next_run_at is not None
    times = [schedule.next_run_at]
    if schedule.spec.type is not SpecType.ONE_TIME:
        while times[-1] <= end and len(times) < MAX_FIRINGS:
            more = site.services.schedules.preview(schedule.spec, times[-1], MAX_PREVIEW_COUNT)
            if not more:
                break
            times += more
    inside = [t for t in times if t <= end]
    return inside[:MAX_FIRINGS], len(inside) > MAX_FIRINGS


def marks_of(times: list[datetime], now: datetime) -> list[Mark]:
    """One mark per slot with firings: a lone firing where it falls, several in the slot's middle."""
    slot = HORIZON / SLOTS
    by_slot: dict[int, list[datetime]] = defaultdict(list)
    for t in times:
        by_slot[min(SLOTS - 1, max(0, int((t - now) / slot)))].append(t)
    marks = []
    for index, found in sorted(by_slot.items()):
        middle = now + slot * (index + 0.5) if len(found) > 1 else max(now, found[0])
        x = (middle - now).total_seconds() / HORIZON.total_seconds() * AXIS_WIDTH
        marks.append(Mark(x, len(found), found[0], found[-1]))
    return marks


def _axis(site: Site, schedules: list[Schedule], now: datetime) -> list[AxisRow]:
    rows = []
    for schedule in schedules:
        times, capped = firings_within(site, schedule, now + HORIZON)
        rows.append(AxisRow(schedule, marks_of(times, now), len(times), capped))
    return rows


async def _flags(site: Site) -> Mapping[str, Any]:
    """What waits for someone: halted rollouts, held tasks, paused schedules (each its first FLAG_ROWS)."""
    services = site.services
    halted = await services.rollouts.halted(FLAG_ROWS + 1)
    held, held_total = await services.tasks.held(FLAG_ROWS)
    paused, paused_total = await services.schedules.list_schedules(
        paused_only=True, order=ScheduleOrder("name"), offset=0, limit=FLAG_ROWS
    )
    names = await services.schedules.names(
        {r.schedule_id for r in halted} | {t.schedule_id for t in held if t.schedule_id}
    )
    return {
        "halted": halted[:FLAG_ROWS],
        "halted_more": len(halted) > FLAG_ROWS,
        "held": held,
        "held_total": held_total,
        "paused": paused,
        "paused_total": paused_total,
        "flag_schedule_names": names,
        "held_rack_names": await services.inventory.rack_names({t.rack_id for t in held}),
    }


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
        **(await _flags(site)),
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
