"""RFC 3339 timestamps for ONE_TIME specs, read exactly as Go's `time.Parse(time.RFC3339, ...)` reads them.

The shape is `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±hh:mm)` with an upper-case `T` and `Z` (Go rejects `t`
and `z`, and so does the golden corpus). A timestamp without an offset is rejected: it would name a
different instant on every server. Where Go's parser is more lenient than the RFC, rackflow follows Go, as
the golden corpus requires, so a spec accepted by the reference is accepted here: a one-digit hour
(`T4:00:00Z`), a comma before the fraction, offsets up to `±24:60`, year 0000. Any number of fraction
digits is accepted and the first nine are kept (Go's nanoseconds). No leap second; days must exist.

Two views of one parse:

- `parse_rfc3339` gives the aware UTC `datetime` a schedule is stored and compared with. Datetimes stop at
  microseconds, so a sub-microsecond remainder is rounded *up*: the stored time is never before the
  written instant and a one-time job never fires early (at most 999 ns late). Instants outside datetime's
  years 1-9999 (only reachable through year 0000 or an offset at the ends of the range) are clamped to
  its first or last microsecond: equally long past (due at once) or equally never.
- `rfc3339_utc` gives the same instant as UTC text with the fraction kept to the nanosecond, printed as
  Go's `RFC3339Nano` prints it (trailing zeros dropped), for showing the spec without losing precision.
"""

from __future__ import annotations

import calendar
import functools
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Final

_quote = functools.partial(json.dumps, ensure_ascii=False)

_PATTERN: Final = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"T(?P<hour>[0-9]{1,2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
    r"(?:[.,](?P<fraction>[0-9]+))?"
    r"(?:(?P<utc>Z)|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))"
)
_FORM: Final = "YYYY-MM-DDTHH:MM:SS[.fraction] and Z or ±hh:mm"
# Arithmetic runs 400 years away from the ends of datetime's range; 400 Gregorian years are exactly
# 146097 days, so leap days and weekdays fall the same and only the printed year is shifted back.
_CYCLE: Final = 400
_EARLIEST: Final = datetime.min.replace(tzinfo=UTC)
_LATEST: Final = datetime.max.replace(tzinfo=UTC)


def parse_rfc3339(text: str) -> datetime:
    """The instant `text` names, as an aware UTC datetime (sub-microsecond remainder rounded up).

    Raises ValueError naming the text for anything Go's RFC 3339 parser rejects.
    """
    year, shifted, nanos = _parse(text)
    if year < datetime.min.year:
        return _EARLIEST
    if year > datetime.max.year:
        return _LATEST
    whole = shifted.replace(year=year, tzinfo=UTC)
    try:
        return whole + timedelta(microseconds=-(-nanos // 1000))
    except OverflowError:
        return _LATEST


def rfc3339_utc(text: str) -> str:
    """The instant `text` names, written in UTC with its fraction kept to the nanosecond.

    `2021-03-05T01:43:49.5-08:00` becomes `2021-03-05T09:43:49.5Z`.
    """
    year, shifted, nanos = _parse(text)
    sign = "-" if year < 0 else ""
    fraction = f".{nanos:09d}".rstrip("0") if nanos else ""
    return f"{sign}{abs(year):04d}-{shifted:%m-%dT%H:%M:%S}{fraction}Z"


def format_rfc3339(moment: datetime) -> str:
    """An aware datetime written in UTC as RFC 3339: `2026-06-01T04:00:00Z` (microseconds when not zero)."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse(text: str) -> tuple[int, datetime, int]:
    """The UTC year, the UTC wall time in a year shifted into datetime's range, and the nanoseconds."""
    match = _PATTERN.fullmatch(text)
    if match is None:
        raise _invalid(text, f"expected {_FORM}")
    year, month, day = (int(match[k]) for k in ("year", "month", "day"))
    hour, minute, second = (int(match[k]) for k in ("hour", "minute", "second"))
    shift = _CYCLE if year < 5000 else -_CYCLE
    if not 1 <= month <= 12:
        raise _invalid(text, "month out of range")
    if not 1 <= day <= calendar.monthrange(year + shift, month)[1]:
        raise _invalid(text, "day out of range")
    if hour > 23:
        raise _invalid(text, "hour out of range")
    if minute > 59:
        raise _invalid(text, "minute out of range")
    if second > 59:
        raise _invalid(text, "second out of range (no leap seconds)")
    offset = timedelta(0)
    if match["utc"] is None:
        off_hour, off_minute = int(match["off_hour"]), int(match["off_minute"])
        if off_hour > 24 or off_minute > 60:  # Go's own limits: some people write 24:00
            raise _invalid(text, "UTC offset out of range")
        offset = timedelta(hours=off_hour, minutes=off_minute)
        if match["sign"] == "-":
            offset = -offset
    nanos = int(match["fraction"][:9].ljust(9, "0")) if match["fraction"] else 0
    shifted = datetime(year + shift, month, day, hour, minute, second) - offset
    return shifted.year - shift, shifted, nanos


def _invalid(text: str, reason: str) -> ValueError:
    return ValueError(f"invalid RFC 3339 timestamp {_quote(text)}: {reason}")
