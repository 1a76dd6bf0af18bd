"""robfig syntax quirks, the day-of-month/day-of-week rule, rejections, and the DST rule at named edges."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from rackflow.timespec import CronExpr, resolve_zone


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def upcoming(expr: str, zone: str, after: str, count: int) -> list[str]:
    cron, tz, out = CronExpr.parse(expr), resolve_zone(zone), []
    t: datetime | None = utc(after)
    for _ in range(count):
        assert t is not None
        t = cron.next_after(t, tz)
        out.append(t.strftime("%Y-%m-%dT%H:%MZ") if t else "none")
    return out


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ("*-5 * * * *", "* * * * *"),  # robfig ignores what follows "*-"
        ("1,,2 * * * *", "1,2 * * * *"),  # empty list items are dropped
        ("+5 * * * *", "5 * * * *"),  # strconv.Atoi takes a sign
        ("5/15 * * * *", "5-59/15 * * * *"),  # N/step means N-max/step
        ("? ? ? ? ?", "* * * * *"),
        ("0 0 * jan-MAR Mon-fri", "0 0 * 1-3 1-5"),
        ("0 0 * * FRİ", "0 0 * * 5"),  # Go lower-cases U+0130 to a plain i
        ("\t0\u3000 0 * * *\n", "0 0 * * *"),  # Go's strings.Fields splits on Unicode spaces
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
    ],
)
def test_equivalent_spellings(left: str, right: str) -> None:
    a, b = CronExpr.parse(left), CronExpr.parse(right)
    fields = ("minutes", "hours", "days", "months", "weekdays", "days_and_weekdays", "fixed_time")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]


@pytest.mark.parametrize(
    ("expr", "reason"),
    [
        ("", "empty"),
        ("* * * *", "expected 5 fields"),
        ("* * * * * *", "expected 5 fields"),
        (" @daily", "expected 5 fields"),  # a descriptor must start the text
        ("@daily ", "unknown descriptor"),
        ("@reboot", "unknown descriptor"),
        ("@every 1h", "use an INTERVAL spec"),
        ("TZ=UTC 0 0 * * *", "timezone field"),
        ("CRON_TZ=UTC 0 0 * * *", "timezone field"),
        ("61 * * * *", "minute 61 out of range 0-59"),
        ("* 24 * * *", "hour 24 out of range 0-23"),
        ("* * 0 * *", "day of month 0 out of range 1-31"),
        ("* * * 13 *", "month 13 out of range 1-12"),
        ("* * * * 7", "day of week 7 out of range 0-6"),
        ("5-1 * * * *", "runs backwards"),
        ("* * * * MON-SUN", "runs backwards"),
        ("*/0 * * * *", "must be positive"),
        ("*/-1 * * * *", "negative"),
        ("1-2-3 * * * *", "more than one '-'"),
        ("*/2/3 * * * *", "more than one '/'"),
        ("-1 * * * *", "is not a number"),
        ("L * * * *", "is not a number"),
        ("* * * * 5#3", "is not a number or a name"),
        ("* * * JANUARY *", "is not a number or a name"),
        ("99999999999999999999 * * * *", "out of range"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
        (", * * * *", "never fires"),
    ],
)
def test_rejected(expr: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as caught:
        CronExpr.parse(expr)
    assert str(caught.value).startswith("invalid cron expression ")


def test_day_rule_or_when_both_restricted_and_when_star() -> None:
    # Both fields restricted: the 13th OR any Friday. A star in either: both must match.
    assert upcoming("0 0 13 * 5", "UTC", "2026-03-01T00:00:00Z", 3) == [
        "2026-03-06T00:00Z",
        "2026-03-13T00:00Z",
        "2026-03-20T00:00Z",
    ]
    assert upcoming("0 0 */1 * 5", "UTC", "2026-03-01T00:00:00Z", 1) == ["2026-03-06T00:00Z"]
    assert upcoming("0 0 1-31 * 5", "UTC", "2026-02-28T12:00:00Z", 1) == ["2026-03-01T00:00Z"]
    assert upcoming("0 0 */2 * 5", "UTC", "2026-02-28T12:00:00Z", 1) == ["2026-03-01T00:00Z"]


def test_leap_day_across_a_non_leap_century() -> None:
    assert upcoming("0 0 29 2 *", "UTC", "2097-01-01T00:00:00Z", 1) == ["2104-02-29T00:00Z"]


def test_nothing_after_year_9999() -> None:
    assert upcoming("0 0 1 1 *", "UTC", "9999-06-01T00:00:00Z", 1) == ["none"]


def test_fixed_time_flag() -> None:
    assert CronExpr.parse("30 2 * * *").fixed_time
    assert CronExpr.parse("0,30 1-3 * * *").fixed_time
    assert CronExpr.parse("@daily").fixed_time
    assert not CronExpr.parse("*/15 2 * * *").fixed_time
    assert not CronExpr.parse("0 */2 * * *").fixed_time
    assert not CronExpr.parse("? 2 * * *").fixed_time
    assert not CronExpr.parse("@hourly").fixed_time


# America/New_York 2026: 03-08 02:00 EST -> 03:00 EDT (07:00Z); 11-01 02:00 EDT -> 01:00 EST (06:00Z).
def test_worked_example_from_the_module_docstring() -> None:
    ny, spring, autumn = "America/New_York", "2026-03-08T00:00:00Z", "2026-11-01T00:00:00Z"
    assert upcoming("30 2 * * *", ny, spring, 2) == ["2026-03-08T07:00Z", "2026-03-09T06:30Z"]
    assert upcoming("0,30 2 * * *", ny, spring, 2) == ["2026-03-08T07:00Z", "2026-03-09T06:00Z"]
    assert upcoming("30 1 * * *", ny, autumn, 2) == ["2026-11-01T05:30Z", "2026-11-02T06:30Z"]
    assert upcoming("30 * * * *", ny, "2026-11-01T04:00:00Z", 4) == [
        "2026-11-01T04:30Z",
        "2026-11-01T05:30Z",
        "2026-11-01T06:30Z",
        "2026-11-01T07:30Z",
    ]
    assert upcoming("30 * * * *", ny, "2026-03-08T06:00:00Z", 2) == ["2026-03-08T06:30Z", "2026-03-08T07:30Z"]


def test_wildcard_job_inside_an_overlap() -> None:
    ny = "America/New_York"
    # From the first pass (01:30 EDT): the rest of the first pass, then the second pass from 01:00 EST.
    assert upcoming("*/20 1 * * *", ny, "2026-11-01T05:30:00Z", 4) == [
        "2026-11-01T05:40Z",
        "2026-11-01T06:00Z",
        "2026-11-01T06:20Z",
        "2026-11-01T06:40Z",
    ]
    # From the second pass (01:30 EST) nothing of the first pass comes back.
    assert upcoming("*/20 1 * * *", ny, "2026-11-01T06:30:00Z", 2) == [
        "2026-11-01T06:40Z",
        "2026-11-02T06:00Z",
    ]


def test_half_hour_shift_lord_howe() -> None:
    # 2026-10-04 02:00 +10:30 -> 02:30 +11:00 (15:30Z); 2026-04-05 02:00 +11:00 -> 01:30 +10:30 (15:00Z).
    lh = "Australia/Lord_Howe"
    assert upcoming("15 2 * * *", lh, "2026-10-03T12:00:00Z", 2) == ["2026-10-03T15:30Z", "2026-10-04T15:15Z"]
    assert upcoming("15 2 * * *", lh, "2026-10-03T12:00:00Z", 1) == ["2026-10-03T15:30Z"]
    assert upcoming("*/30 * * * *", lh, "2026-10-03T15:00:00Z", 2) == [
        "2026-10-03T15:30Z",
        "2026-10-03T16:00Z",
    ]
    assert upcoming("45 1 * * *", lh, "2026-04-04T12:00:00Z", 2) == ["2026-04-04T14:45Z", "2026-04-05T15:15Z"]


def test_a_whole_missing_day_apia_2011() -> None:
    # Samoa skipped 2011-12-30: 12-29 23:59:59 -10:00 is followed by 12-31 00:00 +14:00 (12-30T10:00Z).
    apia = "Pacific/Apia"
    assert upcoming("0 12 30 12 *", apia, "2011-12-01T00:00:00Z", 2) == [
        "2011-12-30T10:00Z",
        "2012-12-29T22:00Z",
    ]
    assert upcoming("* 12 30 12 *", apia, "2011-12-01T00:00:00Z", 1) == ["2012-12-29T22:00Z"]


def test_next_is_strictly_after_even_on_the_instant() -> None:
    assert upcoming("30 2 * * *", "America/New_York", "2026-03-08T07:00:00Z", 1) == ["2026-03-09T06:30Z"]
    assert upcoming("0 * * * *", "UTC", "2026-03-08T07:00:00Z", 1) == ["2026-03-08T08:00Z"]
    assert upcoming("0 * * * *", "UTC", "2026-03-08T06:59:59.999999Z", 1) == ["2026-03-08T07:00Z"]


def test_results_are_utc_and_any_aware_input_is_accepted() -> None:
    cron = CronExpr.parse("0 9 * * *")
    t = cron.next_after(datetime(2026, 1, 1, 12, tzinfo=resolve_zone("Asia/Tokyo")), resolve_zone("UTC"))
    assert t == datetime(2026, 1, 1, 9, tzinfo=UTC)
    assert t is not None and t.tzinfo is UTC


def test_naive_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        CronExpr.parse("* * * * *").next_after(datetime(2026, 1, 1), resolve_zone("UTC"))
