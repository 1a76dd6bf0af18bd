"""The one entry point: a schedule's spec in, a `Timing` out, or `InvalidSpec`.

Create, update, resume and preview all call `parse_spec`, so a spec is validated one way everywhere, and
the dispatcher asks the resulting `Timing` when to fire next. Timings are pure: the caller passes the time
in (the clock is read in one place, the dispatcher), and every datetime in and out is aware UTC.
"""

from __future__ import annotations

import enum
import functools
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final, Protocol
from zoneinfo import ZoneInfo

from rackflow.timespec.cron import CronExpr
from rackflow.timespec.duration import parse_go_duration
from rackflow.timespec.rfc3339 import parse_rfc3339
from rackflow.timespec.zones import resolve_zone

_quote = functools.partial(json.dumps, ensure_ascii=False)

MAX_SPEC_LENGTH: Final = 256
# How many specs' timings `parse_spec` keeps: a fleet's schedules share few specs; a miss only parses again.
PARSED_SPECS_KEPT: Final = 1024


class SpecType(enum.StrEnum):
    INTERVAL = "interval"
    CRON = "cron"
    ONE_TIME = "one-time"


@dataclass(frozen=True)
class ScheduleSpec:
    type: SpecType
    spec: str
    timezone: str = ""  # "" means UTC; only cron uses it, but it is validated for every type


class InvalidSpec(ValueError):
    """A bad spec or timezone. `str()` names the field and the value, ready for an INVALID_ARGUMENT reply:
    `spec.spec: invalid cron expression "61 * * * *": minute 61 out of range 0-59`."""

    def __init__(self, field: str, value: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.value = value
        self.reason = reason


class Timing(Protocol):
    """When a schedule fires. All datetimes are aware UTC; a naive one raises ValueError."""

    def first_run(self, now: datetime) -> datetime:
        """The first next_run_at, at create or resume."""
        ...

    def next_after(self, t: datetime) -> datetime | None:
        """next_run_at after a firing at dispatch time `t`; None when nothing is left to fire."""
        ...

    def preview(self, after: datetime, count: int) -> list[datetime]:
        """The next `count` fire times after `after`, for showing an operator what a spec will do."""
        ...


@dataclass(frozen=True)
class IntervalTiming:
    """Every `interval_ns` nanoseconds, counted from each dispatch (not on a fixed grid), as the seeds say."""

    interval_ns: int

    @property
    def step(self) -> timedelta:
        """The interval in datetime's microseconds, rounded up so a next time is always strictly later."""
        return timedelta(microseconds=-(-self.interval_ns // 1000))

    def first_run(self, now: datetime) -> datetime:
        return _required(self.next_after(now), now)

    def next_after(self, t: datetime) -> datetime | None:
        try:
            return _utc(t) + self.step
        except OverflowError:
            return None

    def preview(self, after: datetime, count: int) -> list[datetime]:
        return _iterate(self, after, count)


@dataclass(frozen=True)
class CronTiming:
    """A cron expression evaluated in a time zone, with the DST rule of `rackflow.timespec.cron`."""

    expr: CronExpr
    zone: ZoneInfo

    def first_run(self, now: datetime) -> datetime:
        return _required(self.next_after(now), now)

    def next_after(self, t: datetime) -> datetime | None:
        return self.expr.next_after(_utc(t), self.zone)

    def preview(self, after: datetime, count: int) -> list[datetime]:
        return _iterate(self, after, count)


@dataclass(frozen=True)
class OneTimeTiming:
    """Fires once at `at`; a past `at` is simply due at once. Consumed after that firing."""

    at: datetime

    def first_run(self, now: datetime) -> datetime:
        _utc(now)
        return self.at

    def next_after(self, t: datetime) -> datetime | None:
        _utc(t)
        return None

    def preview(self, after: datetime, count: int) -> list[datetime]:
        _utc(after)
        _check_count(count)
        return [self.at][:count]


@functools.lru_cache(maxsize=PARSED_SPECS_KEPT)
def parse_spec(spec: ScheduleSpec) -> Timing:
    """Validate `spec` as SPEC §3 says and return its timing; raise InvalidSpec naming the bad field.

    The timezone is checked for every type (a bad zone on an interval schedule is still a mistake worth
    reporting); the spec text is capped at MAX_SPEC_LENGTH characters. A timing is immutable, so the
    timings of recent specs are kept (PARSED_SPECS_KEPT): every firing advances its schedule through its
    timing, and a fleet's schedules share a few specs (an invalid one raises each time).
    """
    try:
        kind = SpecType(spec.type)
    except ValueError:
        value = str(spec.type)
        raise InvalidSpec("spec.type", value, f"unknown schedule type {_quote(value)}") from None
    if len(spec.spec) > MAX_SPEC_LENGTH:
        reason = f"spec is {len(spec.spec)} characters long; at most {MAX_SPEC_LENGTH} are allowed"
        raise InvalidSpec("spec.spec", spec.spec, reason)
    try:
        zone = resolve_zone(spec.timezone)
    except ValueError as exc:
        raise InvalidSpec("spec.timezone", spec.timezone, str(exc)) from None
    try:
        return _timing(kind, spec.spec, zone)
    except ValueError as exc:
        raise InvalidSpec("spec.spec", spec.spec, str(exc)) from None


def _timing(kind: SpecType, text: str, zone: ZoneInfo) -> Timing:
    if kind is SpecType.INTERVAL:
        interval_ns = parse_go_duration(text)
        if interval_ns <= 0:
            raise ValueError(f"invalid interval {_quote(text)}: must be greater than zero")
        return IntervalTiming(interval_ns)
    if kind is SpecType.CRON:
        return CronTiming(CronExpr.parse(text), zone)
    return OneTimeTiming(parse_rfc3339(text))


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"expected a timezone-aware datetime, got naive {moment.isoformat()}")
    return moment.astimezone(UTC)


def _check_count(count: int) -> None:
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")


def _required(next_time: datetime | None, now: datetime) -> datetime:
    if next_time is None:
        raise ValueError(f"no run time after {now.isoformat()} fits before year 10000")
    return next_time


def _iterate(timing: Timing, after: datetime, count: int) -> list[datetime]:
    """Up to `count` successive next times; fewer only if they run past year 9999."""
    _check_count(count)
    times: list[datetime] = []
    current: datetime | None = _utc(after)
    while len(times) < count and current is not None:
        current = timing.next_after(current)
        if current is not None:
            times.append(current)
    return times
