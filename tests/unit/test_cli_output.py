"""How the CLI writes times, specs and messages: what operators read and what scripts parse."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console

from rackflow.cli.audit import audit_table
from rackflow.cli.budgets import budgets_table
from rackflow.cli.output import (
    Listing,
    free_text,
    relative_text,
    schedule_time_text,
    spec_text,
    table,
    to_dict,
    utc_text,
    when,
    zoned_text,
)
from rackflow.cli.racks import components_table
from rackflow.cli.tasks import tasks_table
from rackflow.cli.windows import windows_table
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


# --- tables: the key columns stay whole at any width ---------------------------------------------

ID = "6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f"
LONG = "BMC 10.0.0.7 refused the connection after 3 attempts: connection reset by peer " * 3


def rendered(renderable: object, width: int) -> list[str]:
    """What a pipe of this width receives (as `Session.emit` writes it)."""
    console = Console(width=width, force_terminal=False)
    with console.capture() as captured:
        console.print(renderable, crop=False)
    return [line.rstrip() for line in captured.get().splitlines()]


def a_listing() -> Listing:
    result = table("RUN", "FIRED", "STATE", free_text("PROGRESS"), free_text("ERROR"), title="1 of 1 run")
    result.add_row(ID, "2026-12-01 10:00:17Z", "[green]completed[/]", "12/40 ok, 1 failed", LONG)
    return result


@pytest.mark.parametrize("width", [100, 140, 200])
def test_key_columns_are_whole_and_on_the_header_line_at_any_width(width: int) -> None:
    lines = rendered(a_listing(), width)
    assert lines[0] == "1 of 1 run"
    assert lines[1].split()[:3] == ["RUN", "FIRED", "STATE"]
    assert lines[2].split()[:4] == [ID, "2026-12-01", "10:00:17Z", "completed"]
    assert all(len(line) <= width for line in lines)
    words = " ".join(lines[2:]).split()
    assert set(LONG.split()) <= set(words)  # the free text is all there too, wrapped somewhere
    assert {"12/40", "failed"} <= set(words)


def test_free_text_wraps_in_its_column_when_there_is_room() -> None:
    lines = rendered(a_listing(), 200)
    error_at = lines[1].index("ERROR")
    assert len(lines) > 3  # the error took several lines
    assert all(line[:error_at].strip() == "" for line in lines[3:])  # ... in its own column
    assert " ".join(line[error_at:].strip() for line in lines[2:]) == LONG.strip()


def test_free_text_moves_under_the_row_when_its_column_would_be_too_narrow() -> None:
    lines = rendered(a_listing(), 100)
    assert "ERROR" not in lines[1]
    assert lines[3].startswith("    progress: 12/40 ok") or lines[3].startswith("    error: ")
    under = " ".join(line.strip() for line in lines[3:])
    assert f"error: {LONG.strip()}" in under


def test_key_columns_move_under_the_row_from_the_right_when_they_alone_are_too_wide() -> None:
    result = table("ID", "RACK", "CREATED", "FINISHED", free_text("MESSAGE"))
    result.add_row(ID, "rack-01", "2026-12-01 10:00:17Z", "2026-12-01 10:05:00Z", "done")
    lines = rendered(result, 70)
    assert lines[0].split() == ["ID", "RACK", "CREATED"]
    assert lines[1].split() == [ID, "rack-01", "2026-12-01", "10:00:17Z"]
    assert lines[2:] == ["    finished: 2026-12-01 10:05:00Z   message: done"]


def test_a_header_that_is_a_value_keeps_its_case_under_the_row() -> None:
    result = table("RACK", "10:00Z", "LAST TASK")
    result.add_row("rack-01-of-hall-b", "fire", "-")
    assert rendered(result, 20) == ["RACK", "rack-01-of-hall-b", "    10:00Z: fire"]


def test_a_cell_of_nothing_is_not_repeated_under_the_row() -> None:
    result = table("ID", free_text("MESSAGE"))
    result.add_row(ID, "-")
    assert rendered(result, 40) == ["ID", ID]


def test_a_row_must_fill_every_column() -> None:
    with pytest.raises(ValueError, match="a row of 1 cells in a table of 2 columns"):
        table("A", "B").add_row("x")


def _every_table() -> dict[str, Listing]:
    """Each list table of the CLI with long free text beside full ids and times."""
    at = stamp(datetime(2026, 12, 1, 10, 0, 17, tzinfo=UTC))
    task = pb.Task(
        id=pb.UUID(id=ID),
        operation="upgrade_firmware",
        rack_id=pb.UUID(id="r"),
        status=pb.TASK_STATUS_FAILED,
        message=LONG,
        created_at=at,
        finished_at=at,
    )
    event = pb.AuditEvent(
        at=at, principal="oncall", method="UpdateTaskSchedule", outcome="INVALID_ARGUMENT", error=LONG
    )
    event.target_ids.add(id=ID)
    window = pb.MaintenanceWindow(
        name="launch", kind=pb.WINDOW_KIND_FREEZE, reason=LONG, operations=["power_on", "upgrade_firmware"]
    )
    window.one_off.start.CopyFrom(at)
    window.one_off.end.CopyFrom(at)
    budget = pb.OperationBudget(name="fw", operations=["upgrade_firmware", "power_reset"], max_running=8)
    component = pb.Component(
        id=pb.UUID(id=ID), name="compute-0", external_id="SN-77-A", firmware_version="2.1.7-hotfix3"
    )
    return {
        "tasks": tasks_table([task], {"r": "rack-01"}),
        "audit": audit_table([event], "1 of 1 event"),
        "windows": windows_table([window]),
        "budgets": budgets_table([budget]),
        "components": components_table([component]),
    }


@pytest.mark.parametrize("width", [100, 140, 200])
@pytest.mark.parametrize("name", ["tasks", "audit", "windows", "budgets", "components"])
def test_every_list_shows_each_key_value_whole(name: str, width: int) -> None:
    listing = _every_table()[name]
    lines = rendered(listing, width)
    assert all(len(line) <= width for line in lines), lines
    console = Console()
    for row in listing.rows:
        for column, cell in zip(listing.columns, row, strict=True):
            if column.key:
                value = console.render_str(cell).plain if isinstance(cell, str) else str(cell)
                assert any(value in line for line in lines), (column.header, value, lines)
