"""Cron expressions: robfig/cron/v3 `ParseStandard` syntax and matching, with Vixie cron's DST rule.

Syntax and matching are robfig's, quirks included, so a schedule copied from the Go reference means the
same thing here: five fields (minute hour day-of-month month day-of-week), each a comma list of `*` or `?`,
`N`, `N-M`, with an optional `/step` (`N/step` means `N-max/step`); month names JAN-DEC and day names
SUN-SAT in any case; Sunday is 0 and 7 is out of range; empty list items are ignored (`1,,2`); text after
`*-` is ignored (`*-5` is `*`). The descriptors are @yearly @annually @monthly @weekly @daily @midnight
@hourly. Day rule: if the day-of-month or the day-of-week field contains a `*` or `?` item without a step,
a day must match both fields; otherwise it may match either (`0 0 1 * MON`: the 1st and every Monday).

Rejected although robfig takes them: `@every` (use an INTERVAL spec), `TZ=`/`CRON_TZ=` prefixes (use the
schedule's timezone field), and expressions that can never fire (`0 0 30 2 *`).

DST rule (Vixie cron's; robfig instead skips a day in the spring gap and fires twice in the autumn overlap).
A *fixed-time* job is one whose minute and hour fields do not start with `*` (or robfig's synonym `?`):
- its wall time in a gap fires once, at the first instant after the gap;
- its wall time that occurs twice fires once, at the first occurrence.
A *wildcard* job fires at each real occurrence of a matching wall time and never for one that does not
exist. Wall times that land on the same instant fire once.
Worked example, America/New_York, 2026-03-08 (02:00 EST jumps to 03:00 EDT) and 2026-11-01 (02:00 EDT falls
back to 01:00 EST): `30 2 * * *` fires on 8 March at 03:00 EDT (07:00Z), the first instant after the gap;
`0,30 2 * * *` fires there once, not twice. `30 1 * * *` fires on 1 November at 01:30 EDT (05:30Z) only,
while `30 * * * *` fires at 01:30 EDT and again at 01:30 EST (06:30Z), and skips 02:30 on 8 March.

How the next time is found: wall times are visited in increasing order, skipping whole months, days and
hours that cannot match, and each matching wall time is mapped to its instants by the rule above. The
*first* instant of a wall time never decreases as the wall time increases (across a gap or an overlap
alike), and a second occurrence is never before the first, so the scan can stop at the first wall time
whose first instant is after `t`. A typical call visits one or two wall times.
"""

from __future__ import annotations

import calendar
import functools
import json
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Final

_quote = functools.partial(json.dumps, ensure_ascii=False)

_MONTH_NAMES: Final = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTHS: Final = {name: i for i, name in enumerate(_MONTH_NAMES, start=1)}
_DAYS: Final = {name: i for i, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_DESCRIPTORS: Final = {  # descriptor -> equivalent five fields
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Go's strings.Fields splits on Unicode White_Space, which is not quite Python's str.split() set.
_GO_SPACE: Final = re.compile("[\t\n\v\f\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")
_GO_INT: Final = re.compile(r"[+-]?[0-9]+")  # what strconv.Atoi accepts
_MAX_DAYS: Final = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # per month, in any year
# The longest wait a valid expression can have is 8 years (29 February across 2100); searching 30 is safe.
_SEARCH_YEARS: Final = 30
_MINUTE: Final = timedelta(minutes=1)


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_FIELDS: Final = (
    _Field("minute", 0, 59),
    _Field("hour", 0, 23),
    _Field("day of month", 1, 31),
    _Field("month", 1, 12, _MONTHS),
    _Field("day of week", 0, 6, _DAYS),
)


@dataclass(frozen=True)
class CronExpr:
    """A parsed cron expression: the allowed values of each field, ascending, and how to read them."""

    text: str
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]  # day of month
    months: tuple[int, ...]
    weekdays: tuple[int, ...]  # 0 = Sunday
    days_and_weekdays: bool  # robfig's star rule: a day must match both fields (else either)
    fixed_time: bool  # DST rule: neither the minute nor the hour field starts with * or ?

    @classmethod
    def parse(cls, text: str) -> CronExpr:
        """Parse `text`, or raise ValueError with a message naming it and what is wrong."""
        try:
            return cls._parse(text)
        except ValueError as exc:
            raise ValueError(f"invalid cron expression {_quote(text)}: {exc}") from None

    @classmethod
    def _parse(cls, text: str) -> CronExpr:
        if not text:
            raise ValueError("empty expression")
        if text.startswith(("TZ=", "CRON_TZ=")):
            raise ValueError("TZ= and CRON_TZ= are not supported here; use the schedule's timezone field")
        if text.startswith("@every"):
            raise ValueError("@every is not supported here; use an INTERVAL spec")
        source = text
        if text.startswith("@"):
            if text not in _DESCRIPTORS:
                raise ValueError(f"unknown descriptor; use one of {', '.join(_DESCRIPTORS)}")
            source = _DESCRIPTORS[text]
        fields = [f for f in _GO_SPACE.split(source) if f]
        if len(fields) != 5:
            raise ValueError(f"expected 5 fields (minute hour day month weekday), found {len(fields)}")
        parsed = [_parse_field(item, field) for item, field in zip(fields, _FIELDS, strict=True)]
        (minutes, _), (hours, _), (days, day_star), (months, _), (weekdays, weekday_star) = parsed
        expr = cls(
            text=text,
            minutes=minutes,
            hours=hours,
            days=days,
            months=months,
            weekdays=weekdays,
            days_and_weekdays=day_star or weekday_star,
            fixed_time=not fields[0].startswith(("*", "?")) and not fields[1].startswith(("*", "?")),
        )
        if not expr._can_fire():
            raise ValueError("the expression never fires")
        return expr

    def _can_fire(self) -> bool:
        """Whether some date ever matches. Each valid (month, day), 29 February too, falls on every weekday
        in some year, so only the combination of month and day of month can be impossible."""
        if not (self.minutes and self.hours and self.months):
            return False
        some_day = any(d <= _MAX_DAYS[m] for m in self.months for d in self.days)
        if self.days_and_weekdays:
            return some_day and bool(self.weekdays)
        return some_day or bool(self.weekdays)

    def next_after(self, t: datetime, zone: tzinfo) -> datetime | None:
        """The first fire time strictly after `t` (aware) in `zone`, as aware UTC; None past year 9999."""
        if t.utcoffset() is None:
            raise ValueError(f"expected a timezone-aware datetime, got naive {t.isoformat()}")
        try:
            return self._next_after(t.astimezone(UTC), zone)
        except OverflowError:
            return None

    def _next_after(self, t: datetime, zone: tzinfo) -> datetime | None:
        local = t.astimezone(zone)
        start = local.replace(tzinfo=None)
        overlap = _offset(local) - _offset(local.replace(fold=1))
        if overlap > timedelta(0) and not self.fixed_time:
            # t is in the first pass of an overlap: earlier wall times of that overlap still have their
            # second occurrence ahead, so the scan starts up to the overlap's length earlier.
            start -= overlap
        best: datetime | None = None
        wall = self._next_wall(start)
        while wall is not None:
            instants = self._instants(wall, zone)
            later = [instant for instant in instants if instant > t]
            if later:
                best = later[0] if best is None else min(best, later[0])
                # Done if this wall time's first instant is after t (later wall times start later), or if
                # t is in the second pass of an overlap (no first occurrence is left before the next one).
                if later[0] == instants[0] or local.fold:
                    return best
            wall = self._next_wall(wall + _MINUTE)
        return best

    def _instants(self, wall: datetime, zone: tzinfo) -> tuple[datetime, ...]:
        """The instants a matching wall time fires at under the DST rule, earliest first."""
        before = _offset(wall.replace(tzinfo=zone))  # fold=0: the offset in force before a transition
        after = _offset(wall.replace(tzinfo=zone, fold=1))
        first = (wall - before).replace(tzinfo=UTC)
        if before == after:
            return (first,)
        if before > after:  # overlap: the wall time occurs twice
            return (first,) if self.fixed_time else (first, (wall - after).replace(tzinfo=UTC))
        if not self.fixed_time:  # gap: the wall time does not exist
            return ()
        return (_gap_end((wall - after).replace(tzinfo=UTC), first, zone),)

    def _next_wall(self, start: datetime) -> datetime | None:
        """The earliest matching naive wall time at or after `start`, on a whole minute."""
        if start.second or start.microsecond:
            start = start.replace(second=0, microsecond=0) + _MINUTE
        year, month, day, hour, minute = start.year, start.month, start.day, start.hour, start.minute
        last_year = min(start.year + _SEARCH_YEARS, datetime.max.year)
        while year <= last_year:
            i = bisect_left(self.months, month)
            if i == len(self.months):
                year, month, day, hour, minute = year + 1, 1, 1, 0, 0
                continue
            if self.months[i] != month:
                month, day, hour, minute = self.months[i], 1, 0, 0
            found = self._next_day(year, month, day)
            if found is None:
                year, month = (year + 1, 1) if month == 12 else (year, month + 1)
                day, hour, minute = 1, 0, 0
                continue
            if found != day:
                day, hour, minute = found, 0, 0
            j = bisect_left(self.hours, hour)
            if j == len(self.hours):
                day, hour, minute = day + 1, 0, 0
                continue
            if self.hours[j] != hour:
                hour, minute = self.hours[j], 0
            k = bisect_left(self.minutes, minute)
            if k == len(self.minutes):
                hour, minute = hour + 1, 0
                continue
            return datetime(year, month, day, hour, self.minutes[k])
        return None

    def _next_day(self, year: int, month: int, day: int) -> int | None:
        """The first day of the month from `day` on that matches, robfig's way."""
        first_weekday, length = calendar.monthrange(year, month)  # Monday = 0
        for d in range(day, length + 1):
            in_days = d in self.days
            in_weekdays = (first_weekday + d) % 7 in self.weekdays  # Sunday = 0
            if (in_days and in_weekdays) if self.days_and_weekdays else (in_days or in_weekdays):
                return d
        return None


def _offset(moment: datetime) -> timedelta:
    offset = moment.utcoffset()
    if offset is None:
        raise ValueError(f"time zone {moment.tzinfo!r} gives no UTC offset")
    return offset


def _gap_end(before: datetime, after: datetime, zone: tzinfo) -> datetime:
    """The transition instant in (before, after]: the first instant whose offset differs from `before`'s.

    Transitions fall on whole seconds; a binary search over seconds needs at most 17 steps for a day.
    """
    old = _offset(before.astimezone(zone))
    low, high = 0, int((after - before).total_seconds())
    while high - low > 1:
        mid = (low + high) // 2
        if _offset((before + timedelta(seconds=mid)).astimezone(zone)) == old:
            low = mid
        else:
            high = mid
    return before + timedelta(seconds=high)


def _parse_field(text: str, field: _Field) -> tuple[tuple[int, ...], bool]:
    """A field's allowed values and whether it holds a `*`/`?` item without a step (robfig's star bit)."""
    values: set[int] = set()
    star = False
    for item in text.split(","):
        if item:  # Go's strings.FieldsFunc drops empty items
            item_values, item_star = _parse_item(item, field)
            values.update(item_values)
            star = star or item_star
    return tuple(sorted(values)), star


def _parse_item(item: str, field: _Field) -> tuple[range, bool]:
    range_and_step = item.split("/")
    low_high = range_and_step[0].split("-")
    if len(range_and_step) > 2:
        raise ValueError(f"{field.name} {_quote(item)} has more than one '/'")
    star = low_high[0] in ("*", "?")
    if star:  # robfig ignores whatever follows "*-"
        start, end = field.low, field.high
    elif len(low_high) > 2:
        raise ValueError(f"{field.name} {_quote(item)} has more than one '-'")
    else:
        start = _number(low_high[0], field.name, field.names)
        end = _number(low_high[-1], field.name, field.names)
    step = 1
    if len(range_and_step) == 2:
        step = _number(range_and_step[1], f"{field.name} step", None)
        if len(low_high) == 1:
            end = field.high
        star = star and step <= 1
    if start < field.low:
        raise ValueError(f"{field.name} {start} out of range {field.low}-{field.high}")
    if end > field.high:
        raise ValueError(f"{field.name} {end} out of range {field.low}-{field.high}")
    if start > end:
        raise ValueError(f"{field.name} range {_quote(item)} runs backwards")
    if step == 0:
        raise ValueError(f"{field.name} step in {_quote(item)} must be positive")
    return range(start, end + 1, step), star


def _number(text: str, what: str, names: dict[str, int] | None) -> int:
    """A name (case-insensitive) or a non-negative decimal as Go's strconv.Atoi reads it (`+5` too)."""
    if names is not None:
        # Go's ToLower maps U+0130 (İ) to a plain i; Python's lower() adds a combining dot.
        named = names.get(text.replace("\u0130", "i").lower())
        if named is not None:
            return named
    if not _GO_INT.fullmatch(text):
        raise ValueError(f"{what} {_quote(text)} is not {'a number or a name' if names else 'a number'}")
    if len(text.lstrip("+-").lstrip("0")) > 18:  # past int64, where Atoi fails (and int() would be slow)
        raise ValueError(f"{what} {_quote(text)} is out of range")
    value = int(text)
    if value < 0:
        raise ValueError(f"{what} {value} is negative")
    return value
