"""How the CLI writes times, specs and messages: what operators read and what scripts parse."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.cli.output import (
    relative_text,
    schedule_time_text,
    spec_text,
    to_dict,
    utc_text,
    when,
    zoned_text,
)
from rackflow.v1 import flow_pb2 as pb

NOW = datetime(2026, 12, 1, 6, 48, tzinfo=UTC)


def stamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(hours=3, minutes=12), "in 3h 12m"),
        (timedelta(hours=3, minutes=12, seconds=40), "in 3h 12m"),
        (timedelta(hours=3), "in 3h"),
        (timedelta(days=2, hours=4, minutes=5), "in 2d 4h"),
        (timedelta(seconds=45), "in 45s"),
        (timedelta(minutes=5, seconds=3), "in 5m 3s"),
        (-timedelta(minutes=5, seconds=3), "5m 3s ago"),
        (timedelta(milliseconds=300), "now"),
        (timedelta(minutes=89, seconds=59, milliseconds=999), "in 1h 30m"),
    ],
)
def test_relative_text_shows_the_two_largest_units(delta: timedelta, text: str) -> None:
    assert relative_text(NOW + delta, NOW) == text


def test_utc_text_drops_zero_seconds_and_marks_utc() -> None:
    assert utc_text(datetime(2026, 12, 1, 10, 0, tzinfo=UTC)) == "2026-12-01 10:00Z"
    assert utc_text(datetime(2026, 12, 1, 10, 0, 17, tzinfo=UTC)) == "2026-12-01 10:00:17Z"
    assert utc_text(None) == "-"


def test_zoned_text_gives_local_wall_time_with_abbreviation_and_utc() -> None:
    at = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert zoned_text(at, "America/Los_Angeles") == "2026-12-01 02:00 PST (10:00Z)"
    assert zoned_text(datetime(2026, 7, 1, 9, 0, tzinfo=UTC), "America/Los_Angeles") == (
        "2026-07-01 02:00 PDT (09:00Z)"
    )
    assert zoned_text(at, "") == "2026-12-01 10:00Z"
    assert zoned_text(at, "UTC") == "2026-12-01 10:00Z"


def test_zoned_text_falls_back_to_utc_for_a_zone_this_machine_does_not_know() -> None:
    at = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert zoned_text(at, "Mars/Olympus_Mons") == "2026-12-01 10:00 UTC (10:00Z)"


def test_schedule_time_text_is_the_issue_example() -> None:
    ts = stamp(datetime(2026, 12, 1, 10, 0, tzinfo=UTC))
    assert schedule_time_text(ts, "America/Los_Angeles", NOW) == "2026-12-01 02:00 PST (10:00Z), in 3h 12m"
    assert schedule_time_text(Timestamp(), "America/Los_Angeles", NOW) == "-"


def test_when_treats_an_unset_timestamp_as_no_time() -> None:
    assert when(Timestamp()) is None
    assert when(stamp(NOW)) == NOW


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h"), "every 24h"),
        (pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 2 * * 1"), 'cron "0 2 * * 1" UTC'),
        (
            pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 2 * * *", timezone="Europe/Berlin"),
            'cron "0 2 * * *" Europe/Berlin',
        ),
        (
            pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec="2026-06-01T04:00:00Z"),
            "once at 2026-06-01T04:00:00Z",
        ),
    ],
)
def test_spec_text(spec: pb.ScheduleSpec, text: str) -> None:
    assert spec_text(spec) == text


def test_to_dict_keeps_proto_names_and_default_values_for_scripts() -> None:
    schedule = pb.TaskSchedule(id=pb.UUID(id="abc"), name="nightly", operation_type="power_on")
    result = to_dict(schedule)
    assert result["id"] == {"id": "abc"}
    assert result["operation_type"] == "power_on"
    assert result["enabled"] is False
    assert result["overlap_policy"] == "OVERLAP_POLICY_SKIP"
    assert to_dict({"already": "plain"}) == {"already": "plain"}
