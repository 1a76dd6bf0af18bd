"""parse_spec and the three timings: validation, messages, and the first/next/preview contract."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from rackflow.timespec import (
    MAX_SPEC_LENGTH,
    CronTiming,
    IntervalTiming,
    InvalidSpec,
    OneTimeTiming,
    ScheduleSpec,
    SpecType,
    parse_spec,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def test_message_names_field_and_value() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(ScheduleSpec(SpecType.CRON, "61 * * * *"))
    err = caught.value
    assert str(err) == 'spec.spec: invalid cron expression "61 * * * *": minute 61 out of range 0-59'
    assert (err.field, err.value) == ("spec.spec", "61 * * * *")
    assert err.reason == 'invalid cron expression "61 * * * *": minute 61 out of range 0-59'
    assert isinstance(err, ValueError)


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        (ScheduleSpec(SpecType.INTERVAL, "0s"), "spec.spec", "greater than zero"),
        (ScheduleSpec(SpecType.INTERVAL, "-1h"), "spec.spec", "greater than zero"),
        (ScheduleSpec(SpecType.INTERVAL, "1d"), "spec.spec", "unknown unit"),
        (ScheduleSpec(SpecType.INTERVAL, "1h", "Local"), "spec.timezone", "Local"),
        (ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T04:00:00Z", "Mars/Base"), "spec.timezone", "Mars/Base"),
        (ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T04:00:00"), "spec.spec", "RFC 3339"),
        (ScheduleSpec(SpecType.CRON, "0 2 * * *", "../etc/passwd"), "spec.timezone", "tz database"),
        (ScheduleSpec(SpecType.CRON, "0 2 * * *", "/usr/share/zoneinfo/UTC"), "spec.timezone", "tz database"),
        (ScheduleSpec(SpecType.CRON, "@every 1h"), "spec.spec", "INTERVAL"),
        (ScheduleSpec(SpecType.CRON, "0 " * 200), "spec.spec", f"at most {MAX_SPEC_LENGTH}"),
        (ScheduleSpec("weekly", "x"), "spec.type", "unknown schedule type"),  # type: ignore[arg-type]
    ],
)
def test_rejections(spec: ScheduleSpec, field: str, reason: str) -> None:
    with pytest.raises(InvalidSpec, match=reason) as caught:
        parse_spec(spec)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_plain_strings_work_as_types() -> None:
    timing = parse_spec(ScheduleSpec("interval", "1h"))  # type: ignore[arg-type]
    assert timing == IntervalTiming(3_600_000_000_000)


def test_interval() -> None:
    timing = parse_spec(ScheduleSpec(SpecType.INTERVAL, "90m"))
    step = timedelta(minutes=90)
    assert timing.first_run(NOW) == NOW + step
    assert timing.next_after(NOW) == NOW + step
    assert timing.preview(NOW, 3) == [NOW + step, NOW + 2 * step, NOW + 3 * step]


@pytest.mark.parametrize(("spec", "micros"), [("1ns", 1), ("1000ns", 1), ("1001ns", 2), ("1.5us", 2)])
def test_interval_rounds_sub_microsecond_up(spec: str, micros: int) -> None:
    timing = parse_spec(ScheduleSpec(SpecType.INTERVAL, spec))
    assert timing.next_after(NOW) == NOW + timedelta(microseconds=micros)


def test_interval_preview_stops_before_year_10000() -> None:
    timing = parse_spec(ScheduleSpec(SpecType.INTERVAL, "2562047h"))  # about 292 years
    times = timing.preview(NOW, 100)
    assert len(times) == 27 and times[-1].year == 9917
    assert timing.next_after(times[-1]) is None


def test_cron_uses_its_zone() -> None:
    timing = parse_spec(ScheduleSpec(SpecType.CRON, "0 9 * * *", "Asia/Tokyo"))
    assert isinstance(timing, CronTiming)
    assert timing.first_run(NOW) == datetime(2026, 6, 2, 0, 0, tzinfo=UTC)
    assert timing.preview(NOW, 2) == [datetime(2026, 6, 2, tzinfo=UTC), datetime(2026, 6, 3, tzinfo=UTC)]


def test_one_time_is_due_even_when_past_and_then_consumed() -> None:
    timing = parse_spec(ScheduleSpec(SpecType.ONE_TIME, "2020-01-01T00:00:00+01:00"))
    at = datetime(2019, 12, 31, 23, tzinfo=UTC)
    assert timing == OneTimeTiming(at)
    assert timing.first_run(NOW) == at
    assert timing.next_after(at) is None
    assert timing.preview(NOW, 5) == [at]
    assert timing.preview(NOW, 0) == []


def test_one_time_rounds_nanoseconds_up() -> None:
    timing = parse_spec(ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T04:00:00.000000001Z"))
    assert timing.first_run(NOW) == datetime(2026, 6, 1, 4, 0, 0, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "spec",
    [
        ScheduleSpec(SpecType.INTERVAL, "1h"),
        ScheduleSpec(SpecType.CRON, "* * * * *"),
        ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T04:00:00Z"),
    ],
)
def test_naive_datetimes_are_rejected_and_aware_ones_normalised(spec: ScheduleSpec) -> None:
    timing = parse_spec(spec)
    naive = datetime(2026, 6, 1, 12)
    for call in (
        lambda: timing.first_run(naive),
        lambda: timing.next_after(naive),
        lambda: timing.preview(naive, 1),
    ):
        with pytest.raises(ValueError, match="timezone-aware"):
            call()
    with pytest.raises(ValueError, match="count"):
        timing.preview(NOW, -1)
    plus_two = NOW.astimezone(timezone(timedelta(hours=2)))
    assert timing.preview(plus_two, 3) == timing.preview(NOW, 3)
    assert all(t.tzinfo is UTC for t in timing.preview(plus_two, 3))


def test_timings_are_frozen_values() -> None:
    a = parse_spec(ScheduleSpec(SpecType.CRON, "0 2 * * *", "Europe/London"))
    b = parse_spec(ScheduleSpec(SpecType.CRON, "0 2 * * *", "Europe/London"))
    assert a == b and hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.zone = None  # type: ignore[attr-defined]
