"""Schedule time: Go durations, strict RFC 3339, tz database zones and robfig cron with Vixie's DST rule.

Pure functions and frozen values, no clock and no I/O beyond reading the `tzdata` package. Everyone else
calls `parse_spec` and asks the returned `Timing`; the parsers are exported for the few places (flags,
display) that need one piece alone.
"""

from rackflow.timespec.cron import CronExpr
from rackflow.timespec.duration import format_go_duration, parse_go_duration
from rackflow.timespec.rfc3339 import format_rfc3339, parse_rfc3339, rfc3339_utc
from rackflow.timespec.spec import (
    MAX_SPEC_LENGTH,
    CronTiming,
    IntervalTiming,
    InvalidSpec,
    OneTimeTiming,
    ScheduleSpec,
    SpecType,
    Timing,
    parse_spec,
)
from rackflow.timespec.zones import resolve_zone

__all__ = [
    "MAX_SPEC_LENGTH",
    "CronExpr",
    "CronTiming",
    "IntervalTiming",
    "InvalidSpec",
    "OneTimeTiming",
    "ScheduleSpec",
    "SpecType",
    "Timing",
    "format_go_duration",
    "format_rfc3339",
    "parse_go_duration",
    "parse_rfc3339",
    "parse_spec",
    "resolve_zone",
    "rfc3339_utc",
]
