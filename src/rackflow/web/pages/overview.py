"""Overview: schedules by state, tasks by status, what waits for someone (halted rollouts, tasks held by a
window, a freeze or a budget, paused schedules), recent failures, the dispatcher's backlog, and the next
firings across all schedules on a time axis.

The axis counts a dense schedule's firings per slot (`SLOTS` across the horizon) rather than drawing each:
a schedule firing every 2 minutes shows a count in every slot to the end of the horizon.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.config import DUE_COUNT_CAP
from rackflow.domain.schedules import Schedule, ScheduleOrder
from rackflow.domain.tasks import Task
from rackflow.timespec import IntervalTiming, SpecType, parse_spec
from rackflow.validation import MAX_PREVIEW_COUNT
from rackflow.web.pages import Site, capped_count

FAILURE_WINDOW = timedelta(hours=24)
HORIZON = timedelta(hours=24)  # the time axis
AXIS_SCHEDULES = 12  # rows on the time axis: the schedules that fire soonest
SLOTS = 96  # the axis in slots of 15 minutes: one mark per slot that has firings, with their count
MAX_FIRINGS = 1440  # a cron's firings over the horizon at most: one a minute
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


@dataclass(frozen=True)
class FailureGroup:
    """Failed tasks of one schedule (or of no schedule: manual tasks) in the failure window."""

    schedule_id: Any
    tasks: list[Task]


def routes(site: Site) -> list[Route]:
    async def overview(request: Request) -> Response:
        return await site.page(request, "overview.html", "Overview", lambda _: _load(site))

    return [Route("/", overview)]


# A slot's firings: how many, the first and the last.
Slots = dict[int, tuple[int, datetime, datetime]]


def _slot_of(moment: datetime, now: datetime) -> int:
    return min(SLOTS - 1, max(0, int((moment - now) / (HORIZON / SLOTS))))


def _ceil_div(a: timedelta, b: timedelta) -> int:
    return -(-a // b)


def interval_slots(first: datetime, step: timedelta, now: datetime) -> Slots:
    """Every `step` from `first` to the horizon's end, counted per slot without listing each firing (an
    interval may be seconds: 86,400 firings a day)."""
    end, slot = now + HORIZON, HORIZON / SLOTS
    last_k = (end - first) // step
    found: Slots = {}
    for index in range(_slot_of(first, now), SLOTS):
        low = 0 if index == _slot_of(first, now) else _ceil_div(now + slot * index - first, step)
        high = last_k if index == SLOTS - 1 else _ceil_div(now + slot * (index + 1) - first, step) - 1
        high = min(high, last_k)
        if low <= high:
            found[index] = (high - low + 1, first + step * low, first + step * high)
    return found


def listed_slots(times: list[datetime], now: datetime) -> Slots:
    found: Slots = {}
    for t in times:
        index = _slot_of(t, now)
        count, first, _ = found.get(index, (0, t, t))
        found[index] = (count + 1, first, t)
    return found


def firing_slots(site: Site, schedule: Schedule, now: datetime) -> Slots:
    """The schedule's firings from its next run to the horizon's end, by slot. A cron fires at most once a
    minute (MAX_FIRINGS over the horizon), so its times are listed; an interval's are counted."""
    assert schedule.next_run_at is not None
    end = now + HORIZON
    if schedule.next_run_at > end:
        return {}
    timing = parse_spec(schedule.spec)
    if isinstance(timing, IntervalTiming):
        return interval_slots(schedule.next_run_at, timing.step, now)
    times = [schedule.next_run_at]
    if schedule.spec.type is not SpecType.ONE_TIME:
        while times[-1] <= end and len(times) <= MAX_FIRINGS:
            more = site.services.schedules.preview(schedule.spec, times[-1], MAX_PREVIEW_COUNT)
            if not more:
                break
            times += more
    return listed_slots([t for t in times if t <= end], now)


def marks_of(slots: Slots, now: datetime) -> list[Mark]:
    """One mark per slot with firings: a lone firing where it falls, several in the slot's middle."""
    slot = HORIZON / SLOTS
    marks = []
    for index, (count, first, last) in sorted(slots.items()):
        middle = now + slot * (index + 0.5) if count > 1 else max(now, first)
        x = (middle - now).total_seconds() / HORIZON.total_seconds() * AXIS_WIDTH
        marks.append(Mark(x, count, first, last))
    return marks


def _axis(site: Site, schedules: list[Schedule], now: datetime) -> list[AxisRow]:
    rows = []
    for schedule in schedules:
        slots = firing_slots(site, schedule, now)
        rows.append(AxisRow(schedule, marks_of(slots, now), sum(n for n, _, _ in slots.values())))
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
        "counts": {
            state: capped_count(count)
            for state, count in asdict(await services.schedules.state_counts()).items()
        },
        "task_counts": {
            status.value: capped_count(count)
            for status, count in (await services.tasks.status_counts(now - FAILURE_WINDOW)).items()
        },
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
