"""Properties of the cron evaluator over random expressions, zones and times.

1. In any zone and any year, next times are strictly after the given time and strictly increasing.
2. Near real DST transitions, the fast evaluator agrees with a brute-force reading of the DST rule that
   walks every UTC minute (independent of the evaluator's wall-time scan).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rackflow.timespec import CronExpr, resolve_zone
from rackflow.timespec.zones import _known_keys

DST_ZONES = (
    "America/New_York",
    "Europe/London",
    "Australia/Lord_Howe",  # 30-minute shift
    "America/St_Johns",  # -3:30 / -2:30
    "Pacific/Chatham",  # +12:45 / +13:45
    "America/Santiago",  # changes at midnight: the gap and the overlap cross a day boundary
    "Australia/Sydney",
    "Europe/Berlin",
)
ALL_ZONES = sorted(_known_keys())
MINUTE = timedelta(minutes=1)
FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ORACLE = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MONTHS = ("JAN", "feb", "Mar", "APR", "may", "JUN", "jul", "AUG", "sep", "OCT", "nov", "DEC")
DAYS = ("SUN", "mon", "Tue", "WED", "thu", "FRI", "sat")


def _items(low: int, high: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    value = st.integers(low, high)
    named = st.sampled_from(names) if names else value.map(str)
    step = st.integers(1, high - low + 1).map(str)
    return st.one_of(
        st.sampled_from(["*", "?"]),
        step.map(lambda k: f"*/{k}"),
        value.map(str),
        named,
        st.tuples(value, value).map(lambda ab: f"{min(ab)}-{max(ab)}"),
        st.tuples(value, value, step).map(lambda abk: f"{min(abk[:2])}-{max(abk[:2])}/{abk[2]}"),
        st.tuples(value, step).map(lambda ak: f"{ak[0]}/{ak[1]}"),
    )


def _field(low: int, high: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[str]:
    return st.lists(_items(low, high, names), min_size=1, max_size=3).map(",".join)


cron_texts = st.tuples(
    _field(0, 59), _field(0, 23), _field(1, 31), _field(1, 12, MONTHS), _field(0, 6, DAYS)
).map(" ".join)


def _parsed(text: str) -> CronExpr:
    try:
        return CronExpr.parse(text)
    except ValueError:
        assume(False)  # e.g. "0 0 30 2 *": never fires
        raise


@FAST
@given(
    text=cron_texts,
    zone=st.one_of(st.sampled_from(DST_ZONES), st.sampled_from(ALL_ZONES)),
    start=st.datetimes(datetime(1890, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC)),
)
def test_next_times_are_strictly_after_and_increasing(text: str, zone: str, start: datetime) -> None:
    cron, tz = _parsed(text), resolve_zone(zone)
    t = start
    for _ in range(20):
        nxt = cron.next_after(t, tz)
        assert nxt is not None and nxt > t, (text, zone, t, nxt)
        assert nxt.tzinfo is UTC
        t = nxt


@functools.cache
def _transitions(zone: str) -> tuple[datetime, ...]:
    """Every UTC-offset change of `zone` in 2024-2030, to the minute (a day scan, then bisection)."""
    tz, found = resolve_zone(zone), []
    day = datetime(2024, 1, 1, tzinfo=UTC)
    while day.year < 2031:
        nxt = day + timedelta(days=1)
        if day.astimezone(tz).utcoffset() != nxt.astimezone(tz).utcoffset():
            low, high = day, nxt
            while high - low > MINUTE:
                mid = low + (high - low) / 2
                mid = mid.replace(second=0, microsecond=0)
                if mid.astimezone(tz).utcoffset() == low.astimezone(tz).utcoffset():
                    low = mid
                else:
                    high = mid
            found.append(high)
        day = nxt
    return tuple(found)


def _oracle(
    match: Callable[[datetime], bool], fixed: bool, tz: ZoneInfo, t: datetime, count: int
) -> list[datetime]:
    """The DST rule read literally, one UTC minute at a time (these zones change offset on whole minutes)."""
    out: list[datetime] = []
    instant = t.replace(second=0, microsecond=0) + MINUTE
    previous = (instant - MINUTE).astimezone(tz).utcoffset()
    assert previous is not None
    while len(out) < count and instant < t + timedelta(days=6):
        local = instant.astimezone(tz)
        offset = local.utcoffset()
        assert offset is not None
        wall = local.replace(tzinfo=None)
        fire = match(wall) and (not fixed or local.fold == 0)  # fixed: first occurrence only
        if fixed and offset > previous:  # a gap ends here: its wall times fire now
            skipped = (instant + previous).replace(tzinfo=None)
            while skipped < wall and not fire:
                fire = match(skipped)
                skipped += MINUTE
        if fire:
            out.append(instant)
        previous, instant = offset, instant + MINUTE
    return out


@ORACLE
@given(
    minute=_field(0, 59),
    hour=_field(0, 23),
    zone=st.sampled_from(DST_ZONES),
    pick=st.integers(0, 10_000),
    before=st.integers(-2 * 60, 36 * 60 * 60),
)
def test_matches_brute_force_near_transitions(
    minute: str, hour: str, zone: str, pick: int, before: int
) -> None:
    cron, tz = _parsed(f"{minute} {hour} * * *"), resolve_zone(zone)
    transitions = _transitions(zone)
    t = transitions[pick % len(transitions)] - timedelta(seconds=before)

    def match(wall: datetime) -> bool:
        return wall.minute in cron.minutes and wall.hour in cron.hours

    expected = _oracle(match, cron.fixed_time, tz, t, 4)
    got: list[datetime] = []
    current = t
    while len(got) < len(expected):
        nxt = cron.next_after(current, tz)
        assert nxt is not None
        got.append(nxt)
        current = nxt
    assert got == expected, (f"{minute} {hour} * * *", zone, t)
