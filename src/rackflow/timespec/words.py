"""A schedule spec in words, for people: "every day at 02:00 Europe/Berlin", "every 15 minutes on Mon–Fri".

Common shapes are described; anything else falls back to the expression itself (`cron "5 4 1,15 * MON"
UTC`), which is never wrong. The words come from the parsed expression (`CronExpr`), so names, ranges and
steps read the same way however they were written.
"""

from __future__ import annotations

import functools

from rackflow.timespec.cron import CronExpr
from rackflow.timespec.rfc3339 import parse_rfc3339
from rackflow.timespec.spec import ScheduleSpec, SpecType

_DAY_NAMES = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat")
_MONTH_NAMES = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_MAX_TIMES = 4  # "at 02:00, 14:00": beyond this many times of day, the expression says it better


@functools.lru_cache(maxsize=4096)  # a page of schedules shares a handful of specs; each parse is not free
def describe(spec: ScheduleSpec) -> str:
    """The spec in words; a spec that does not parse is shown as written."""
    if spec.type is SpecType.INTERVAL:
        return f"every {spec.spec}"
    if spec.type is SpecType.ONE_TIME:
        try:
            return f"once at {parse_rfc3339(spec.spec).strftime('%Y-%m-%d %H:%M')} UTC"
        except ValueError:
            return f"once at {spec.spec}"
    zone = spec.timezone or "UTC"
    try:
        words = _cron_words(CronExpr.parse(spec.spec), zone)
    except ValueError:
        words = None
    return words or f'cron "{spec.spec}" {zone}'


def _step(values: tuple[int, ...], start: int, span: int) -> int | None:
    """n when `values` is start, start+n, … covering the field (span values); else None."""
    if len(values) < 2 or values[0] != start:
        return None
    n = values[1] - values[0]
    return n if values == tuple(range(start, start + span, n)) and span % n == 0 else None


def _runs(values: tuple[int, ...], names: tuple[str, ...], offset: int) -> str:
    """1,2,3,5 -> "Mon–Wed, Fri": consecutive values as ranges."""
    parts: list[str] = []
    run: list[int] = []
    for value in (*values, None):
        if run and (value is None or value != run[-1] + 1):
            first, last = names[run[0] - offset], names[run[-1] - offset]
            joiner = ", " if len(run) == 2 else "–"
            parts.append(first if len(run) == 1 else f"{first}{joiner}{last}")
            run = []
        if value is not None:
            run.append(value)
    return ", ".join(parts)


def _time_words(expr: CronExpr) -> tuple[str, bool] | None:
    """How often within a day, and whether that names clock times; None when it is not simple."""
    minutes, hours = expr.minutes, expr.hours
    all_hours = hours == tuple(range(24))
    if all_hours and len(minutes) == 60:
        return "every minute", False
    if all_hours and (n := _step(minutes, 0, 60)):
        return f"every {n} minutes", False
    if all_hours and len(minutes) == 1:
        return f"every hour at :{minutes[0]:02d}", False
    if len(minutes) == 1 and (n := _step(hours, 0, 24)):
        return f"every {n} hours at :{minutes[0]:02d}", False
    if len(minutes) * len(hours) <= _MAX_TIMES:
        return "at " + ", ".join(f"{h:02d}:{m:02d}" for h in hours for m in minutes), True
    return None


def _day_words(expr: CronExpr) -> str | None:
    """Which days: "" for every day; None when both day fields restrict (robfig: either may match)."""
    all_days = expr.days == tuple(range(1, 32))
    all_weekdays = expr.weekdays == tuple(range(7))
    if all_days and all_weekdays:
        words = ""
    elif all_days and expr.days_and_weekdays:
        words = f"on {_runs(expr.weekdays, _DAY_NAMES, 0)}"
    elif all_weekdays and expr.days_and_weekdays:
        numbers = ", ".join(str(d) for d in expr.days)
        words = f"on day {numbers} of the month"
    else:
        return None
    if expr.months != tuple(range(1, 13)):
        words = f"{words} in {_runs(expr.months, _MONTH_NAMES, 1)}".strip()
    return words


def _cron_words(expr: CronExpr, zone: str) -> str | None:
    """The words, with the zone when they name clock times or days (where the zone decides when)."""
    time, names_clock = _time_words(expr) or (None, False)
    days = _day_words(expr)
    if time is None or days is None:
        return None
    if days.startswith("in "):
        days = f"every day {days}"
    if names_clock:
        return f"{days or 'every day'} {time} {zone}"
    return f"{time} {days} {zone}" if days else time
