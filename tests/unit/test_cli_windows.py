"""`rackflow window …` over the fake client: options in, client calls and tables out, usage errors."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import Result

from rackflow.client import Recurrence, Span, Window
from rackflow.domain import firing as domain_firing
from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import FakeClient, fake, run, stamp  # noqa: F401 (fixtures)

WINDOW_ID = "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"


def a_window() -> pb.MaintenanceWindow:
    return pb.MaintenanceWindow(
        id=pb.UUID(id=WINDOW_ID),
        name="sat-night",
        kind=pb.WINDOW_KIND_ALLOW,
        recurring=pb.RecurringWindow(cron="0 22 * * 6", duration="6h", timezone="Europe/Berlin"),
        racks=[pb.WindowTarget(name="rack-01")],
        nvl_domains=[pb.WindowTarget(name="nvl-a")],
        operations=["upgrade_firmware"],
        reason="agreed with the tenants",
    )


@pytest.fixture(autouse=True)
def answers(fake: FakeClient) -> None:  # noqa: F811
    for name in ("create_window", "get_window", "update_window"):
        fake.answers[name] = a_window()
    fake.answers["list_windows"] = pb.ListMaintenanceWindowsResponse(windows=[a_window()])


def test_create_recurring(fake: FakeClient, run: Callable[..., Result]) -> None:  # noqa: F811
    result = run(
        "window", "create", "sat-night", "--allow", "--cron", "0 22 * * 6", "--duration", "6h",
        "--tz", "Europe/Berlin", "--rack", "rack-01", "--domain", "nvl-a", "--op", "upgrade-firmware",
        "--reason", "agreed with the tenants",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [(args, _)] = fake.called("create_window")
    assert args == (
        "sat-night",
        Window(
            "allow",
            Recurrence("0 22 * * 6", "6h", "Europe/Berlin"),
            ("rack-01",),
            ("nvl-a",),
            ["upgrade_firmware"],
            "agreed with the tenants",
        ),
    )
    assert 'cron "0 22 * * 6" Europe/Berlin for 6h' in result.output
    assert "rack-01, domain nvl-a" in result.output


def test_create_one_off_freeze(fake: FakeClient, run: Callable[..., Result]) -> None:  # noqa: F811
    result = run(
        "window",
        "create",
        "launch",
        "--freeze",
        "--start",
        "2026-12-07T00:00:00Z",
        "--end",
        "2026-12-14T00:00:00Z",
    )
    assert result.exit_code == 0, result.output
    [(args, _)] = fake.called("create_window")
    start, end = datetime(2026, 12, 7, tzinfo=UTC), datetime(2026, 12, 14, tzinfo=UTC)
    assert args == ("launch", Window("freeze", Span(start, end), (), (), [], ""))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("window", "create", "w", "--cron", "0 2 * * *", "--duration", "1h"), "give --allow or --freeze"),
        (("window", "create", "w", "--allow", "--freeze", "--cron", "x", "--duration", "1h"), "not both"),
        (("window", "create", "w", "--allow"), "give when"),
        (("window", "create", "w", "--allow", "--cron", "0 2 * * *"), "needs --cron and --duration"),
        (("window", "create", "w", "--allow", "--start", "2026-12-07T00:00:00Z"), "needs --start and --end"),
        (
            (
                "window",
                "create",
                "w",
                "--allow",
                "--cron",
                "x",
                "--duration",
                "1h",
                "--start",
                "2026-12-07T00:00:00Z",
            ),
            "not both",
        ),
        (
            ("window", "create", "w", "--allow", "--start", "tomorrow", "--end", "later"),
            "not an RFC 3339 time",
        ),
        (
            ("window", "create", "w", "--freeze", "--cron", "x", "--duration", "1h", "--op", "reboot"),
            "reboot",
        ),
        (("window", "update", "w"), "nothing to change"),
        (("window", "update", "w", "--all-racks", "--rack", "r1"), "not both"),
    ],
)
def test_bad_usage_exits_2(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
    args: tuple[str, ...],
    message: str,
) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not fake.calls


def test_update_sends_only_what_changes(fake: FakeClient, run: Callable[..., Result]) -> None:  # noqa: F811
    assert run("window", "update", "sat-night", "--duration", "4h", "--cron", "0 22 * * 6").exit_code == 0
    assert run("window", "update", "sat-night", "--all-racks", "--all-ops", "--reason", "").exit_code == 0
    (first_args, first), (_, second) = fake.called("update_window")
    assert first_args == ("sat-night",)
    assert first == {
        "name": None,
        "reason": None,
        "kind": None,
        "when": Recurrence("0 22 * * 6", "4h", "Europe/Berlin"),  # the window's zone kept
        "racks": None,
        "domains": None,
        "operations": None,
    }
    assert (second["racks"], second["domains"], second["operations"], second["reason"]) == ((), (), [], "")


def test_update_of_part_of_the_timing_keeps_the_rest_of_the_windows(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
) -> None:
    """A recurring window's zone, cron or duration not given stays as it is: `--duration 4h` on a window
    in Europe/Berlin used to need --cron too, and without --tz moved the window to UTC, an hour earlier."""
    start, end = datetime(2026, 12, 7, tzinfo=UTC), datetime(2026, 12, 14, tzinfo=UTC)
    assert run("window", "update", "sat-night", "--duration", "4h").exit_code == 0
    assert run("window", "update", "sat-night", "--tz", "UTC").exit_code == 0
    fake.answers["get_window"] = pb.MaintenanceWindow(
        id=pb.UUID(id=WINDOW_ID),
        name="launch",
        kind=pb.WINDOW_KIND_FREEZE,
        one_off=pb.OneOffWindow(start=stamp(start), end=stamp(end)),
    )
    assert run("window", "update", "launch", "--end", "2026-12-10T00:00:00Z").exit_code == 0
    whens = [kwargs["when"] for _, kwargs in fake.called("update_window")]
    assert whens == [
        Recurrence("0 22 * * 6", "4h", "Europe/Berlin"),
        Recurrence("0 22 * * 6", "6h", "UTC"),
        Span(start, datetime(2026, 12, 10, tzinfo=UTC)),
    ]
    # Turning a one-off window into a recurring one (or back) still takes the whole new timing.
    result = run("window", "update", "launch", "--duration", "4h")
    assert result.exit_code == 2, result.output
    assert "a recurring window needs --cron and --duration" in result.output
    assert len(fake.called("update_window")) == 3


def test_list_and_preview(fake: FakeClient, run: Callable[..., Result]) -> None:  # noqa: F811
    result = run("window", "list", "--rack", "rack-01")
    assert result.exit_code == 0, result.output
    assert fake.called("list_windows") == [((), {"rack": "rack-01"})]
    header = result.output.splitlines()[1].split()
    assert header == ["NAME", "KIND", "WHEN", "COVERS", "OPERATIONS", "REASON"]
    fake.answers["preview_windows"] = pb.PreviewMaintenanceWindowsResponse(
        events=[
            pb.WindowEvent(
                at=stamp(datetime(2026, 12, 5, 21, tzinfo=UTC)),
                window_name="sat-night",
                kind=pb.WINDOW_KIND_ALLOW,
                change="opens",
            )
        ]
    )
    result = run("window", "preview", "rack-01", "-n", "3", "--tz", "Europe/Berlin")
    assert result.exit_code == 0, result.output
    assert fake.called("preview_windows") == [(("rack-01",), {"count": 3, "after": None})]
    assert "sat-night" in result.output and "opens" in result.output and "22:00 CET" in result.output


def _decision(rack: str, decision: str, **fields: object) -> pb.ScopeDecision:
    return pb.ScopeDecision(rack_name=rack, decision=decision, **fields)  # type: ignore[arg-type]


def test_schedule_preview_of_a_schedule_is_a_table_of_decisions(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
) -> None:
    at = stamp(datetime(2026, 12, 5, 21, tzinfo=UTC))
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[
            pb.PreviewFiring(
                at=at,
                scopes=[
                    _decision("rack-01", "fire"),
                    _decision("rack-02", "skip_window", window_name="launch"),
                    _decision(
                        "rack-03", "defer", window_name="sat", until=stamp(datetime(2026, 12, 6, tzinfo=UTC))
                    ),
                    _decision("rack-04", "skip_overlap"),
                ],
            )
        ]
    )
    result = run("schedule", "preview", "nightly", "-n", "3")
    assert result.exit_code == 0, result.output
    assert fake.called("preview_schedule") == [(("nightly",), {"count": 3, "after": None, "resume_at": None})]
    header, row = result.output.splitlines()[0:2]
    assert header.split() == [
        "FIRES",
        "(UTC)",
        "America/Los_Angeles",
        "rack-01",
        "rack-02",
        "rack-03",
        "rack-04",
    ]
    assert row.startswith("2026-12-05 21:00Z  2026-12-05 13:00 PST (21:00Z)  fire ")  # the schedule's zone
    assert "skip (launch)" in row and "defer → 2026-12-05 16:00 PST (00:00Z)" in row
    assert "skip (still running)" in row
    berlin = run("schedule", "preview", "nightly", "-n", "3", "--tz", "Europe/Berlin")
    assert berlin.exit_code == 0, berlin.output
    header, row = berlin.output.splitlines()[0:2]
    assert header.split()[:3] == ["FIRES", "(UTC)", "Europe/Berlin"]
    assert row.startswith("2026-12-05 21:00Z  2026-12-05 22:00 CET (21:00Z)  fire ")
    assert "defer → 2026-12-06 01:00 CET (00:00Z)" in row
    bad = run("schedule", "preview", "nightly", "--tz", "Europe/Berln")
    assert bad.exit_code == 2 and "--tz" in bad.output and "Europe/Berln" in bad.output
    usage = run("schedule", "preview", "nightly", "--cron", "0 2 * * *")
    assert usage.exit_code == 2 and "not both" in usage.output
    assert run("schedule", "preview").exit_code == 2


def test_schedule_preview_of_many_racks_lists_them_by_decision_in_the_zone_asked(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
) -> None:
    """More racks than fit as columns: a row per firing still, in UTC and in --tz, racks by decision."""
    at = stamp(datetime(2026, 12, 5, 21, tzinfo=UTC))
    racks = [_decision(f"rack-{i:02}", "fire") for i in range(1, 9)]
    racks[6] = _decision("rack-07", "skip_window", window_name="launch")
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[pb.PreviewFiring(at=at, scopes=racks)]
    )
    result = run("schedule", "preview", "nightly", "--tz", "Asia/Tokyo")
    assert result.exit_code == 0, result.output
    assert fake.called("get_schedule") == []  # --tz given: the schedule's zone is not needed
    header, row = result.output.splitlines()[0:2]
    assert header.split() == ["FIRES", "(UTC)", "Asia/Tokyo", "RACKS"]
    assert row.startswith("2026-12-05 21:00Z  2026-12-06 06:00 JST (21:00Z)  fire: rack-01, rack-02")
    assert "skip (launch): rack-07" in " ".join(result.output.split())


def test_schedule_preview_names_racks_in_rollout_order_whatever_order_the_server_sends(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
) -> None:
    """The server sends a firing's scopes in scope order (ids made as the racks were added): 40 racks of
    four domains read as a shuffle ("rack-c04, rack-c10, rack-c05, …"). The table names them by rack name,
    the order a rollout starts them in, as columns and within each decision."""
    at = stamp(datetime(2026, 12, 5, 21, tzinfo=UTC))
    shuffled = [
        "rack-c04",
        "rack-c10",
        "rack-c05",
        "rack-c03",
        "rack-c02",
        "rack-c06",
        "rack-c01",
        "rack-c09",
    ]
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[pb.PreviewFiring(at=at, scopes=[_decision(name, "fire") for name in shuffled])]
    )
    result = run("schedule", "preview", "nightly", "--tz", "UTC")
    assert result.exit_code == 0, result.output
    listed = " ".join(result.output.split()).split("fire: ")[1]
    assert listed.startswith(", ".join(sorted(shuffled))), result.output
    few = [_decision(name, "fire") for name in ("rack-b", "rack-a", "rack-c")]
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[pb.PreviewFiring(at=at, scopes=few)]
    )
    header = run("schedule", "preview", "nightly", "--tz", "UTC").output.splitlines()[0]
    assert header.split()[-3:] == ["rack-a", "rack-b", "rack-c"]


@pytest.mark.parametrize(
    ("why", "shown"),
    [
        (
            "the schedule's previous rollout (run 0f5c) is still halted (resume or cancel it first)",
            "rollout live",
        ),
        (domain_firing.awaiting_skip_reason(uuid.UUID(int=5)), "awaiting approval"),
        (domain_firing.window_ended_reason(datetime(2026, 12, 5, 20, tzinfo=UTC)), "firmware window ended"),
    ],
)
def test_schedule_preview_shows_why_a_firing_is_skipped_whole(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
    why: str,
    shown: str,
) -> None:
    at = stamp(datetime(2026, 12, 5, 21, tzinfo=UTC))
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[pb.PreviewFiring(at=at, scopes=[_decision("rack-01", "skip_run", reason=why)])]
    )
    result = run("schedule", "preview", "nightly", "--tz", "UTC")
    assert result.exit_code == 0, result.output
    assert f"skip ({shown})" in " ".join(result.output.split()), result.output


def test_schedule_preview_says_by_when_a_rack_firing_inside_an_allow_window_must_start(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
) -> None:
    """A rack that fires inside an ALLOW window must start before it closes, or its task fails
    (WINDOWS.md): the preview's `closes_at`, which the table left out."""
    at = stamp(datetime(2027, 3, 28, 1, tzinfo=UTC))
    closes = stamp(datetime(2027, 3, 28, 3, tzinfo=UTC))
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[
            pb.PreviewFiring(
                at=at, scopes=[_decision("rack-01", "fire", closes_at=closes), _decision("rack-02", "fire")]
            )
        ]
    )
    result = run("schedule", "preview", "nightly", "--tz", "Europe/Berlin")
    assert result.exit_code == 0, result.output
    row = " ".join(result.output.splitlines()[1].split())
    assert "fire (by 2027-03-28 05:00 CEST (03:00Z)) fire" in row, result.output


def test_task_commands_can_ignore_windows(fake: FakeClient, run: Callable[..., Result]) -> None:  # noqa: F811
    assert run("task", "power-on", "--rack", "rack-01", "--ignore-windows").exit_code == 0
    [(args, _)] = fake.called("submit")
    assert args[0].ignore_windows
    assert args[0].to_proto().power_on.queue_options.ignore_windows


def test_window_preview_refuses_a_zone_it_cannot_show(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
) -> None:
    """A zone only used for display never reaches the server, so the CLI checks it (it showed UTC)."""
    bad = run("window", "preview", "rack-01", "--tz", "Mars/Olympus_Mons")
    assert bad.exit_code == 2 and "--tz" in bad.output and "not in the IANA tz database" in bad.output
    assert fake.called("preview_windows") == []


def test_schedule_preview_marks_each_firing_that_would_await_approval(
    fake: FakeClient,  # noqa: F811
    run: Callable[..., Result],  # noqa: F811
) -> None:
    """docs/SAFETY.md, "Seeing it": the preview marks each next firing that needs approval
    (`PreviewFiring.needs_approval`); the table showed "fire" alone, as if it would start unattended."""
    at = datetime(2026, 12, 5, 21, tzinfo=UTC)
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[
            pb.PreviewFiring(at=stamp(at), scopes=[_decision("rack-01", "fire")], needs_approval=True),
            pb.PreviewFiring(
                at=stamp(at + timedelta(days=1)),
                scopes=[_decision("rack-01", "missed")],
                would_be_missed=True,
            ),
        ]
    )
    result = run("schedule", "preview", "nightly", "--tz", "UTC")
    assert result.exit_code == 0, result.output
    header, awaits, missed = result.output.splitlines()[0:3]
    assert header.split() == ["FIRES", "(UTC)", "UTC", "APPROVAL", "rack-01"]
    assert awaits.split()[4:] == ["awaits", "approval", "fire"]
    assert missed.split()[4:] == ["-", "missed", "(past", "the", "start", "deadline)"]
    # A schedule without approval has no such column.
    fake.answers["preview_schedule"] = pb.PreviewTaskScheduleResponse(
        firings=[pb.PreviewFiring(at=stamp(at), scopes=[_decision("rack-01", "fire")])]
    )
    plain = run("schedule", "preview", "nightly", "--tz", "UTC")
    assert "APPROVAL" not in plain.output
