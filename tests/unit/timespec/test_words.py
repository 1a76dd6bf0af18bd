"""Specs in words: the common shapes read as sentences, everything else as the expression itself."""

from __future__ import annotations

import pytest

from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.timespec.words import describe


@pytest.mark.parametrize(
    ("expression", "zone", "words"),
    [
        ("0 2 * * *", "Europe/Berlin", "every day at 02:00 Europe/Berlin"),
        ("@daily", "UTC", "every day at 00:00 UTC"),
        ("@midnight", "", "every day at 00:00 UTC"),
        ("30 6,18 * * *", "UTC", "every day at 06:30, 18:30 UTC"),
        ("0 9 * * MON-FRI", "America/New_York", "on Mon–Fri at 09:00 America/New_York"),
        ("0 8 * * 1,3,5", "UTC", "on Mon, Wed, Fri at 08:00 UTC"),
        ("0 8 * * sat,sun", "UTC", "on Sun, Sat at 08:00 UTC"),
        ("@weekly", "UTC", "on Sun at 00:00 UTC"),
        ("0 9 1 * *", "UTC", "on day 1 of the month at 09:00 UTC"),
        ("0 0 * 1,7 *", "UTC", "every day in Jan, Jul at 00:00 UTC"),
        ("* * * * *", "Asia/Tokyo", "every minute"),
        ("*/1 * * * *", "UTC", "every minute"),
        ("*/15 * * * *", "UTC", "every 15 minutes"),
        ("*/15 * * * 1-5", "Asia/Tokyo", "every 15 minutes on Mon–Fri Asia/Tokyo"),
        ("30 * * * *", "UTC", "every hour at :30"),
        ("@hourly", "UTC", "every hour at :00"),
        ("0 */6 * * *", "UTC", "every 6 hours at :00"),
        # Not simple: the expression itself.
        ("5 4 1,15 * MON", "UTC", 'cron "5 4 1,15 * MON" UTC'),
        ("*/7 * * * *", "UTC", 'cron "*/7 * * * *" UTC'),
        ("0 1-6 * * *", "UTC", 'cron "0 1-6 * * *" UTC'),
        ("not cron", "UTC", 'cron "not cron" UTC'),
    ],
)
def test_cron_in_words(expression: str, zone: str, words: str) -> None:
    assert describe(ScheduleSpec(SpecType.CRON, expression, zone)) == words


def test_interval_and_one_time_in_words() -> None:
    assert describe(ScheduleSpec(SpecType.INTERVAL, "1h30m", "")) == "every 1h30m"
    assert (
        describe(ScheduleSpec(SpecType.ONE_TIME, "2026-06-01T06:00:00+02:00", ""))
        == "once at 2026-06-01 04:00 UTC"
    )
    assert describe(ScheduleSpec(SpecType.ONE_TIME, "tomorrow", "")) == "once at tomorrow"
