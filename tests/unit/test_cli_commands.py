"""The CLI's commands over a fake client: arguments in, client calls and output out, and exit codes."""

from __future__ import annotations

import io
import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import grpc
import pytest
import yaml
from click.testing import CliRunner, Result
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console

from rackflow.cli.main import main
from rackflow.cli.output import Session
from rackflow.cli.racks import import_fleet, parse_fleet
from rackflow.client import NewComponent, Operation, RackflowClientError, Spec, Targets
from rackflow.clock import FakeClock
from rackflow.v1 import flow_pb2 as pb

NOW = datetime(2026, 12, 1, 6, 48, tzinfo=UTC)
TASK_ID = "6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f"
RACK_ID = "5f0c4a51-2c1b-4d7e-9a43-0f3a1b2c3d4e"
DOMAIN_ID = "6a1d5b62-3d2c-4e8f-8b54-1a4b2c3d4e5f"


def stamp(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


def a_schedule(name: str = "nightly") -> pb.TaskSchedule:
    return pb.TaskSchedule(
        id=pb.UUID(id="0c9d8e7f-6a5b-4c3d-2e1f-0a9b8c7d6e5f"),
        name=name,
        spec=pb.ScheduleSpec(
            type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 2 * * *", timezone="America/Los_Angeles"
        ),
        enabled=True,
        next_run_at=stamp(datetime(2026, 12, 1, 10, 0, tzinfo=UTC)),
        operation_type="power_reset",
        operation=pb.ScheduledOperation(power_reset=pb.PowerResetRackRequest(forced=True)),
        summary="Power Reset (forced)",
    )


def a_task(status: pb.TaskStatus.ValueType) -> pb.Task:
    return pb.Task(id=pb.UUID(id=TASK_ID), operation="power_on", rack_id=pb.UUID(id=RACK_ID), status=status)


class FakeClient:
    """Records calls by method name; answers from `answers` (a value, or a callable for a sequence)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.answers: dict[str, Any] = {
            "list_racks": pb.ListRacksResponse(
                racks=[pb.Rack(id=pb.UUID(id=RACK_ID), name="rack-01")], total=1
            ),
            "list_domains": pb.ListNVLDomainsResponse(),
            "submit": pb.SubmitTaskResponse(task_ids=[pb.UUID(id=TASK_ID)]),
            "trigger_schedule": pb.SubmitTaskResponse(task_ids=[pb.UUID(id=TASK_ID)]),
            "create_schedule": a_schedule(),
            "get_schedule": a_schedule(),
            "update_schedule": a_schedule(),
            "list_schedules": pb.ListTaskSchedulesResponse(task_schedules=[a_schedule()], total=1),
            "create_rack": pb.Rack(id=pb.UUID(id=RACK_ID), name="rack-09"),
            "create_domain": pb.NVLDomain(name="nvl-a"),
        }

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            answer = self.answers.get(name)
            if isinstance(answer, Exception):
                raise answer
            return answer() if callable(answer) else answer

        return call

    def called(self, name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        return [(args, kwargs) for called, args, kwargs in self.calls if called == name]

    def all_racks(self) -> Iterator[pb.Rack]:
        """As the client's, every rack: here the `list_racks` answer's, recorded as that call."""
        return iter(self.__getattr__("list_racks")().racks)

    def all_domains(self) -> Iterator[pb.NVLDomain]:
        """As the client's, every domain: here the `list_domains` answer's, recorded as that call."""
        return iter(self.__getattr__("list_domains")().domains)

    def domains_asked(self, *, ids: Sequence[str] = (), names: Sequence[str] = ()) -> list[pb.NVLDomain]:
        """Those of the `list_domains` answer's domains asked for (one ListNVLDomains, as the client's)."""
        self.calls.append(("domains_asked", (), {"ids": list(ids), "names": list(names)}))
        listed = self.answers["list_domains"]
        found = (listed() if callable(listed) else listed).domains
        return [d for d in found if d.id.id in ids or d.name in names]

    def get_rack(self, rack: str) -> pb.Rack:
        """The rack of that id or name (one GetRack either way, as the client's) in the `list_racks`
        answer; NOT_FOUND else."""
        self.calls.append(("get_rack", (rack,), {}))
        for found in self._listed():
            if rack in (found.id.id, found.name):
                return found
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"rack {rack!r} not found")

    knows_rack_ids = True  # False: as the client of a server from before ListRacks took ids

    def racks_by_id(self, rack_ids: list[str]) -> list[pb.Rack] | None:
        """Those of the `list_racks` answer's racks asked for (one ListRacks by id, as the client's)."""
        self.calls.append(("racks_by_id", (rack_ids,), {}))
        asked = set(rack_ids)
        return [r for r in self._listed() if r.id.id in asked] if self.knows_rack_ids else None

    def _listed(self) -> list[pb.Rack]:
        listed = self.answers["list_racks"]
        return list((listed() if callable(listed) else listed).racks)


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


@pytest.fixture
def run(fake: FakeClient) -> Callable[..., Result]:
    def invoke(*args: str) -> Result:
        session = Session(connect=lambda _server: fake, clock=FakeClock(NOW), sleep=lambda _s: None)  # type: ignore[arg-type,return-value]
        return CliRunner().invoke(main, list(args), obj=session)

    return invoke


@pytest.fixture
def run_at(fake: FakeClient) -> Callable[..., Result]:
    """`run`, printing to a pipe of this many columns (None: a pipe as the CLI sees it, 200)."""

    def invoke(width: int | None, *args: str) -> Result:
        console = Console(width=width, force_terminal=False) if width else Session().console
        session = Session(connect=lambda _server: fake, clock=FakeClock(NOW), console=console)  # type: ignore[arg-type,return-value]
        return CliRunner().invoke(main, list(args), obj=session)

    return invoke


WIDTHS = [100, 140, 200, None]


def test_task_command_sends_the_operation_and_targets(fake: FakeClient, run: Callable[..., Result]) -> None:
    result = run(
        "task",
        "power-on",
        "--rack",
        "rack-01",
        "--types",
        "compute,NVSWITCH",
        "--queue",
        "--queue-timeout",
        "30m",
        "--description",
        "after maintenance",
    )
    assert result.exit_code == 0, result.output
    [(args, _)] = fake.called("submit")
    assert args[0] == Operation(
        "power_on",
        Targets(racks=("rack-01",), types=("COMPUTE", "NVSWITCH")),
        "after maintenance",
        queue=True,
        queue_timeout=1800,
    )
    assert TASK_ID in result.output and "rackflow task watch" in result.output


def test_json_output_is_the_full_message_wherever_the_option_is(run: Callable[..., Result]) -> None:
    for args in (
        ("-o", "json", "task", "bring-up", "--rack", "r"),
        ("task", "bring-up", "--rack", "r", "-o", "json"),
    ):
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert json.loads(result.output) == {"task_ids": [{"id": TASK_ID}]}


def test_yaml_output(run: Callable[..., Result]) -> None:
    result = run("schedule", "get", "nightly", "-o", "yaml")
    assert yaml.safe_load(result.output)["spec"]["timezone"] == "America/Los_Angeles"


def test_schedule_get_shows_what_it_runs_and_json_has_both_forms(run: Callable[..., Result]) -> None:
    shown = run("schedule", "get", "nightly")
    assert shown.exit_code == 0, shown.output
    assert any(
        line.split(None, 1) == ["operation", "Power Reset (forced)"] for line in shown.output.splitlines()
    )
    as_json = json.loads(run("schedule", "get", "nightly", "-o", "json").output)
    assert as_json["summary"] == "Power Reset (forced)"
    assert as_json["operation"]["power_reset"]["forced"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("task", "power-on"), "give the targets"),
        (("task", "power-on", "--rack", "a", "--domain", "b"), "--rack and --domain cannot be combined"),
        (("task", "power-on", "--rack", "a", "--types", "GPU"), "unknown component type 'GPU'"),
        (("task", "power-on", "--component", "node-1"), "expected a UUID or TYPE:EXTERNAL_ID"),
        (("task", "upgrade-firmware", "--rack", "a"), "Missing option '--version'"),
        (("task", "power-off", "--rack", "a", "--queue-timeout", "soon"), "not a duration"),
        (("schedule", "create", "s", "--op", "ingest", "--rack", "a"), "--interval, --cron or --at"),
        (
            (
                "schedule",
                "create",
                "s",
                "--interval",
                "1h",
                "--cron",
                "* * * * *",
                "--op",
                "ingest",
                "--rack",
                "a",
            ),
            "give one of",
        ),
        (
            ("schedule", "create", "s", "--interval", "1h", "--op", "ingest", "--rack", "a", "--forced"),
            "--forced applies to power-off and power-reset",
        ),
        # The operation as the options spell it (power-on), not as the API does (power_on).
        (
            ("schedule", "create", "s", "--interval", "1h", "--op", "bring-up", "--rack", "a", "--forced"),
            "--forced applies to power-off and power-reset, not bring-up",
        ),
        (
            (
                "schedule",
                "create",
                "s",
                "--interval",
                "1h",
                "--op",
                "power-on",
                "--rack",
                "a",
                "--version",
                "9",
            ),
            "applies to upgrade-firmware, not power-on",
        ),
        # Without --queue a conflicting task is refused at once: a timeout would be silently ignored.
        (
            ("task", "power-on", "--rack", "a", "--queue-timeout", "30m"),
            "--queue-timeout applies with --queue",
        ),
        # The bake is the wait after the canaries: without any it was stored and did nothing.
        (
            ("schedule", "create", "s", "--interval", "1h", "--op", "ingest", "--rack", "a", "--bake", "15m"),
            "--bake applies with --canary",
        ),
        # A port past 65535 reached gRPC, which took it modulo 65536 (99999: port 34463).
        (("--server", "127.0.0.1:99999", "rack", "list"), "expected HOST:PORT, got '127.0.0.1:99999'"),
        (("--server", "127.0.0.1:0", "rack", "list"), "expected HOST:PORT, got '127.0.0.1:0'"),
        (("--server", "", "rack", "list"), "expected HOST:PORT, got ''"),
        (("--server", "[::1]:x", "rack", "list"), "expected HOST:PORT, got '[::1]:x'"),
        # gRPC refused it as "INTERNAL: Invalid metadata", naming neither the option nor the newline.
        (("--token", "a\nb", "rack", "list"), "'--token': a bearer token has no control characters"),
        (("schedule", "update", "s"), "nothing to change"),
        (("schedule", "conflicts"), "give NAME_OR_ID, or --op with targets"),
        (("rack", "create", "r", "--component", "COMPUTE"), "expected TYPE:NAME"),
        (("rack", "add-components", "r"), "at least one --component"),
        (("-o", "csv", "rack", "list"), "'csv' is not one of"),
    ],
)
def test_bad_usage_exits_2_and_says_why(
    fake: FakeClient, run: Callable[..., Result], args: tuple[str, ...], message: str
) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not [c for c in fake.calls if c[0] not in ("list_racks",)]


def test_a_server_error_is_one_line_on_stderr_and_exit_1(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["get_schedule"] = RackflowClientError(grpc.StatusCode.NOT_FOUND, "schedule 'x' not found")
    result = run("schedule", "get", "x")
    assert result.exit_code == 1
    assert result.stderr == "error: NOT_FOUND: schedule 'x' not found\n"
    assert result.stdout == ""


def test_schedule_create_sends_spec_operation_and_overlap(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    result = run(
        "schedule",
        "create",
        "nightly",
        "--cron",
        "0 2 * * *",
        "--tz",
        "America/Los_Angeles",
        "--op",
        "power-reset",
        "--rack",
        "rack-01",
        "--rack",
        RACK_ID,
        "--forced",
        "--overlap",
        "queue",
    )
    assert result.exit_code == 0, result.output
    [(args, kwargs)] = fake.called("create_schedule")
    assert args == (
        "nightly",
        Spec("cron", "0 2 * * *", "America/Los_Angeles"),
        Operation("power_reset", Targets(racks=("rack-01", RACK_ID)), forced=True),
    )
    assert kwargs == {
        "overlap": "queue",
        "window_policy": "skip",
        "rollout": None,
        "approval": None,
        "start_deadline": "",
        "pause_after_failed_runs": 0,
        "retry": None,
    }
    assert "2026-12-01 02:00 PST (10:00Z), in 3h 12m" in result.output


def test_schedule_list_shows_next_firing_in_the_schedule_zone_and_utc(run: Callable[..., Result]) -> None:
    result = run("schedule", "list")
    assert result.exit_code == 0, result.output
    header, row = result.output.splitlines()[1:3]
    assert header.split() == ["NAME", "OPERATION", "SPEC", "STATE", "OVERLAP", "NEXT", "LAST"]
    assert row.startswith("nightly")
    assert "Power Reset (forced)" in row and "2026-12-01 02:00 PST (10:00Z), in 3h 12m" in row
    assert header.index("NEXT") == row.index("2026-12-01 02:00 PST")  # aligned columns


def test_schedule_update_with_only_tz_changes_only_the_zone(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    assert run("schedule", "update", "nightly", "--tz", "Europe/Berlin").exit_code == 0
    [(args, kwargs)] = fake.called("update_schedule")
    assert args == ("nightly",)
    assert kwargs == {
        "name": None,
        "spec": None,
        "timezone": "Europe/Berlin",
        "overlap": None,
        "window_policy": None,
        "rollout": None,
        "remove_rollout": False,
        "approval": None,
        "remove_approval": False,
        "start_deadline": None,
        "pause_after_failed_runs": None,
        "retry": None,
        "remove_retry": False,
    }


def test_schedule_preview_prints_utc_and_the_zone(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["preview"] = pb.PreviewScheduleSpecResponse(
        times=[stamp(datetime(2026, 12, 1, 10, tzinfo=UTC))]
    )
    result = run(
        "schedule",
        "preview",
        "--cron",
        "0 2 * * *",
        "--tz",
        "America/Los_Angeles",
        "-n",
        "1",
        "--after",
        "2026-12-01T00:00:00Z",
    )
    assert result.exit_code == 0, result.output
    [(args, kwargs)] = fake.called("preview")
    assert args == (Spec("cron", "0 2 * * *", "America/Los_Angeles"),)
    assert kwargs == {"count": 1, "after": datetime(2026, 12, 1, tzinfo=UTC)}
    assert "America/Los_Angeles" in result.output.splitlines()[0]
    assert "2026-12-01 10:00Z  2026-12-01 02:00 PST (10:00Z)  in 3h 12m" in result.output


RUN_ID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"


def test_schedule_runs_summarises_outcomes(fake: FakeClient, run: Callable[..., Result]) -> None:
    outcomes = [
        pb.ScopeOutcome(outcome="submitted", task_status=pb.TASK_STATUS_COMPLETED),
        pb.ScopeOutcome(outcome="failed", error="rack busy"),
        pb.ScopeOutcome(outcome="skipped_window"),
        pb.ScopeOutcome(outcome="skipped_overlap"),
    ]
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(
        runs=[
            pb.TaskScheduleRun(
                id=pb.UUID(id=RUN_ID),
                fired_at=stamp(NOW),
                trigger="manual",
                state="completed",
                outcomes=outcomes,
            )
        ],
        total=1,
    )
    result = run("schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].split() == [
        "RUN", "FIRED", "STATE", "LATE", "TASKS", "FAILED", "SKIPPED", "HELD", "ROLLOUT", "ERROR"
    ]  # fmt: skip
    assert result.output.splitlines()[2].split() == [
        RUN_ID, "2026-12-01", "06:48Z", "(manual)", "completed", "-", "1", "1", "2", "0", "-", "rack", "busy"
    ]  # fmt: skip


def test_schedule_runs_says_which_racks_of_a_run_in_parts_a_page_holds(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    outcomes = [pb.ScopeOutcome(outcome="submitted", task_status=pb.TASK_STATUS_COMPLETED)] * 2
    part = pb.TaskScheduleRun(
        id=pb.UUID(id=RUN_ID), fired_at=stamp(NOW), state="completed", outcomes=outcomes, outcome_count=10_000
    )
    part.first_outcome = 500
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[part], total=1, next_page_token="t")
    result = run("schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    assert "(racks 501-502 of 10000)" in " ".join(result.output.split())
    whole = pb.TaskScheduleRun(id=pb.UUID(id=RUN_ID), state="completed", outcomes=outcomes, outcome_count=2)
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[whole], total=1)
    assert "racks" not in run("schedule", "runs", "nightly").output


def test_schedule_runs_shows_a_missed_run_and_how_late(fake: FakeClient, run: Callable[..., Result]) -> None:
    reason = "found 2h after its slot, past its start deadline of 15m; nothing was submitted"
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(
        runs=[
            pb.TaskScheduleRun(
                id=pb.UUID(id=RUN_ID),
                fired_at=stamp(NOW),
                trigger="dispatch",
                state="missed",
                late_by="2h0m0s",
                reason=reason,
                outcomes=[pb.ScopeOutcome(outcome="missed", error=reason)],
            )
        ],
        total=1,
    )
    result = run("schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    row = result.output.splitlines()[2].split()
    assert row[3:10] == ["missed", "2h", "0", "0", "0", "0", "-"]
    assert "past its start deadline" in result.output


def test_schedule_runs_shows_how_late_in_whole_seconds_as_its_reason_does(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """The run keeps `late_by` to the microsecond (`-o json` shows it so); the table's LATE says it as the
    ERROR beside it does (`missed_reason`: whole seconds), not `1h10m48.598383s` next to `1h10m49s`."""
    reason = "found 1h10m49s after its slot, past its start deadline of 15m; nothing was submitted"
    late = pb.TaskScheduleRun(
        id=pb.UUID(id=RUN_ID),
        fired_at=stamp(NOW),
        trigger="dispatch",
        state="missed",
        late_by="1h10m48.598383s",
        reason=reason,
    )
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[late], total=1)
    result = run("schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[2].split()[4] == "1h10m49s"


def test_schedule_create_and_update_send_the_start_deadline_and_pause_after(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    base = ("schedule", "create", "s", "--interval", "1h", "--op", "ingest", "--rack", "a")
    assert run(*base, "--start-deadline", "15m", "--pause-after-failed-runs", "3").exit_code == 0
    [(_args, kwargs)] = fake.called("create_schedule")
    assert (kwargs["start_deadline"], kwargs["pause_after_failed_runs"]) == ("15m", 3)
    assert run("schedule", "update", "s", "--start-deadline", "").exit_code == 0
    [(_args, kwargs)] = fake.called("update_schedule")
    assert (kwargs["start_deadline"], kwargs["pause_after_failed_runs"]) == ("", None)


def test_schedule_runs_counts_a_rack_whose_task_failed_as_failed(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """A rack whose task was submitted and then failed (or was terminated) failed in that run: FAILED
    counted only failed submissions and read 0 while a rack's task failed every run. ERROR is then the
    first failed task's message, looked up for every listed run in one call."""

    def a_run(run_id: str, *statuses: pb.TaskStatus.ValueType) -> pb.TaskScheduleRun:
        outcomes = [
            pb.ScopeOutcome(outcome="submitted", task_id=pb.UUID(id=f"{run_id}-{n}"), task_status=status)
            for n, status in enumerate(statuses)
        ]
        return pb.TaskScheduleRun(
            id=pb.UUID(id=run_id),
            fired_at=stamp(NOW),
            trigger="dispatch",
            state="completed",
            outcomes=outcomes,
        )

    runs = [
        a_run("r1", pb.TASK_STATUS_COMPLETED, pb.TASK_STATUS_FAILED, pb.TASK_STATUS_TERMINATED),
        a_run("r2", pb.TASK_STATUS_FAILED),
        a_run("r3", pb.TASK_STATUS_COMPLETED),
    ]
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=runs, total=3)
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(
        tasks=[
            pb.Task(id=pb.UUID(id="r1-1"), message="BMC timeout"),
            pb.Task(id=pb.UUID(id="r2-0"), message="PSU"),
        ]
    )
    result = run("schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines()[2:]]
    assert [row[5:] for row in rows] == [
        ["3", "2", "0", "0", "-", "BMC", "timeout"],
        ["1", "1", "0", "0", "-", "PSU"],
        ["1", "0", "0", "0", "-"],
    ]
    assert fake.called("get_tasks") == [((["r1-1", "r2-0"],), {})]


HOLD = "pre-flight check 'drained': webhook: draining 3 jobs"


def _a_held_run() -> pb.TaskScheduleRun:
    """A rolling run with one rack done and one whose task a pre-flight check holds."""
    held = _a_rollout_run("rolling", 0)
    held.outcomes.append(
        pb.ScopeOutcome(
            rack_id=pb.UUID(id=RACK_ID),
            outcome="submitted",
            task_id=pb.UUID(id=RUN_ID),
            task_status=pb.TASK_STATUS_PENDING,
            held_by="preflight",
            held_reason=HOLD,
        )
    )
    return held


def test_schedule_runs_counts_held_racks_and_says_why_the_first_waits(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[_a_held_run()], total=1)
    result = run("schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    held_column = lines[1].split().index("HELD")
    assert lines[2].split()[held_column + 1] == "1"  # FIRED takes two words
    assert f"held by preflight: {HOLD}" in " ".join(" ".join(lines[2:]).split())
    as_json = json.loads(run("schedule", "runs", "nightly", "-o", "json").output)
    [outcome] = [o for o in as_json["runs"][0]["outcomes"] if o.get("held_by")]
    assert outcome["held_by"] == "preflight" and outcome["held_reason"] == HOLD


def test_run_show_says_what_holds_a_racks_task(fake: FakeClient, run: Callable[..., Result]) -> None:
    held = _a_held_run()
    held.schedule_id.id = a_schedule().id.id
    fake.answers["get_run"] = held
    result = run("run", "show", TASK_ID)
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if RUN_ID in line)
    assert row.split()[:4] == ["rack-01", "submitted", RUN_ID, "PENDING"]
    assert f"held by preflight: {HOLD}" in " ".join(result.output.split())


def test_schedule_create_sends_the_rollout_policy(fake: FakeClient, run: Callable[..., Result]) -> None:
    base = ("schedule", "create", "fw", "--interval", "24h", "--op", "power-on", "--rack", "rack-01")
    flags = ("--max-concurrent", "5", "--max-per-domain", "1", "--canary", "2", "--bake", "15m")
    result = run(*base, *flags, "--halt-after", "10%", "--no-pause-on-halt")
    assert result.exit_code == 0, result.output
    [(_args, kwargs)] = fake.called("create_schedule")
    assert kwargs["rollout"] == pb.RolloutPolicy(
        max_concurrent_racks=5,
        max_per_domain=1,
        canary_racks=2,
        bake_time="15m",
        halt_after_failure_percent=10,
        pause_on_halt=False,
    )
    assert run(*base, "--halt-after", "3").exit_code == 0
    assert fake.called("create_schedule")[1][1]["rollout"] == pb.RolloutPolicy(halt_after_failures=3)
    bad = run(*base, "--halt-after", "three")
    assert bad.exit_code == 2 and "neither a number of racks (3) nor a percentage (10%)" in bad.output


def test_schedule_update_changes_only_the_named_rollout_fields(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    current = a_schedule()
    current.rollout.CopyFrom(pb.RolloutPolicy(max_concurrent_racks=5, canary_racks=2))
    fake.answers["get_schedule"] = current
    assert run("schedule", "update", "nightly", "--halt-after", "2").exit_code == 0
    [(_args, kwargs)] = fake.called("update_schedule")
    assert kwargs["rollout"] == pb.RolloutPolicy(
        max_concurrent_racks=5, canary_racks=2, halt_after_failures=2
    )
    assert run("schedule", "update", "nightly", "--no-rollout").exit_code == 0
    assert fake.called("update_schedule")[1][1]["remove_rollout"] is True
    both = run("schedule", "update", "nightly", "--no-rollout", "--canary", "1")
    assert both.exit_code == 2 and "--no-rollout removes the rollout policy" in both.output


def test_a_bake_needs_canaries_given_or_kept(fake: FakeClient, run: Callable[..., Result]) -> None:
    """`--bake` waits after the canaries: on a schedule with none it did nothing; with canaries it is fine,
    and taking the canaries away (`--canary 0`) from a policy that bakes leaves a bake that does nothing."""
    current = a_schedule()
    current.rollout.CopyFrom(pb.RolloutPolicy(max_concurrent_racks=5))
    fake.answers["get_schedule"] = current
    alone = run("schedule", "update", "nightly", "--bake", "15m")
    assert alone.exit_code == 2 and "--bake applies with --canary" in alone.output
    assert not fake.called("update_schedule")
    assert run("schedule", "update", "nightly", "--bake", "15m", "--canary", "2").exit_code == 0
    current.rollout.CopyFrom(pb.RolloutPolicy(canary_racks=2, bake_time="15m"))
    assert run("schedule", "update", "nightly", "--bake", "20m").exit_code == 0
    assert fake.called("update_schedule")[1][1]["rollout"] == pb.RolloutPolicy(
        canary_racks=2, bake_time="20m"
    )
    dropped = run("schedule", "update", "nightly", "--canary", "0")
    assert dropped.exit_code == 2 and "--bake applies with --canary" in dropped.output
    assert run("schedule", "update", "nightly", "--canary", "0", "--bake", "").exit_code == 0
    assert fake.called("update_schedule")[2][1]["rollout"] == pb.RolloutPolicy()


def test_schedule_get_shows_a_stored_bake_without_canaries(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """A schedule stored before the server refused a bake without canaries still shows (not an error)."""
    current = a_schedule()
    current.rollout.CopyFrom(pb.RolloutPolicy(max_concurrent_racks=5, bake_time="15m"))
    fake.answers["get_schedule"] = current
    shown = run("schedule", "get", "nightly")
    assert shown.exit_code == 0 and "max 5, bake 15m, pause on halt" in shown.output


def _a_rollout_run(state: str, active: int) -> pb.TaskScheduleRun:
    return pb.TaskScheduleRun(
        id=pb.UUID(id=TASK_ID),
        fired_at=stamp(NOW),
        trigger="dispatch",
        state=state,
        reason="rollout halted: 2 of 4 racks failed (limit 2)" if state == "halted" else "",
        rollout=pb.RolloutPolicy(max_concurrent_racks=2, halt_after_failures=2),
        progress=pb.RolloutProgress(
            total=4, succeeded=1, failed=2 if state == "halted" else 0, active=active
        ),
        outcomes=[
            pb.ScopeOutcome(
                rack_id=pb.UUID(id=RACK_ID),
                outcome="submitted",
                task_id=pb.UUID(id=TASK_ID),
                task_status=pb.TASK_STATUS_RUNNING,
                canary=True,
            )
        ],
    )


def test_run_show_watch_follows_until_the_rollout_halts(fake: FakeClient, run: Callable[..., Result]) -> None:
    answers = iter([_a_rollout_run("rolling", 2), _a_rollout_run("rolling", 1), _a_rollout_run("halted", 0)])
    fake.answers["get_run"] = lambda: next(answers)
    result = run("run", "show", TASK_ID, "--watch")
    assert result.exit_code == 1, result.output  # halted: not completed
    assert len(fake.called("get_run")) == 3
    assert "rollout halted: 2 of 4 racks failed (limit 2)" in result.output
    assert "rack-01 (canary)" in result.output and "max 2, halt after 2, pause on halt" in result.output
    assert "1/4 ok, 2 failed" in result.output


def test_run_show_watch_follows_a_plain_run_until_its_tasks_end(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """A run without a rollout is "completed" once its tasks are submitted: --watch returned at once,
    its tasks still RUNNING, though it says it follows the run until it ends."""

    def plain(status: pb.TaskStatus.ValueType) -> pb.TaskScheduleRun:
        return pb.TaskScheduleRun(
            id=pb.UUID(id=TASK_ID),
            fired_at=stamp(NOW),
            trigger="manual",
            state="completed",
            outcomes=[
                pb.ScopeOutcome(
                    rack_id=pb.UUID(id=RACK_ID),
                    outcome="submitted",
                    task_id=pb.UUID(id=TASK_ID),
                    task_status=s,
                )
                for s in (pb.TASK_STATUS_COMPLETED, status)
            ],
        )

    answers = iter(
        [plain(pb.TASK_STATUS_PENDING), plain(pb.TASK_STATUS_RUNNING), plain(pb.TASK_STATUS_FAILED)]
    )
    fake.answers["get_run"] = lambda: next(answers)
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse()
    result = run("run", "show", TASK_ID, "--watch")
    assert len(fake.called("get_run")) == 3, result.output
    assert "FAILED" in result.output and "RUNNING" not in result.output


def test_run_resume_and_cancel_call_the_server(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["resume_run"] = _a_rollout_run("rolling", 1)
    fake.answers["cancel_run"] = _a_rollout_run("cancelled", 1)
    assert run("run", "resume", TASK_ID).exit_code == 0
    assert fake.called("resume_run") == [((TASK_ID,), {})]
    result = run("run", "cancel", TASK_ID, "-o", "json")
    assert result.exit_code == 0 and json.loads(result.output)["state"] == "cancelled"


def test_run_retry_asks_for_the_failed_racks_or_all_and_shows_the_new_run(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    again = _a_rollout_run("rolling", 1)
    again.retry_of.id = RACK_ID
    fake.answers["retry_run"] = again
    result = run("run", "retry", TASK_ID)
    assert result.exit_code == 0, result.output
    assert re.search(rf"retry of +{RACK_ID}", result.output), result.output
    assert run("run", "retry", TASK_ID, "--all").exit_code == 0
    assert [(args, kwargs["only_failed"]) for args, kwargs in fake.called("retry_run")] == [
        ((TASK_ID,), True),
        ((TASK_ID,), False),
    ]


def test_schedule_create_and_update_send_the_retry_policy(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    base = ("schedule", "create", "fw", "--interval", "24h", "--op", "power-on", "--rack", "rack-01")
    result = run(*base, "--retries", "3", "--retry-backoff", "1m", "--retry-max-backoff", "30m")
    assert result.exit_code == 0, result.output
    [(_args, kwargs)] = fake.called("create_schedule")
    assert kwargs["retry"] == pb.RetryPolicy(max_attempts=3, initial_backoff="1m", max_backoff="30m")
    current = a_schedule()
    current.retry.CopyFrom(
        pb.RetryPolicy(max_attempts=3, initial_backoff="1m", multiplier=2, max_backoff="30m")
    )
    fake.answers["get_schedule"] = current
    assert run("schedule", "update", "nightly", "--retries", "5").exit_code == 0
    assert fake.called("update_schedule")[0][1]["retry"] == pb.RetryPolicy(
        max_attempts=5, initial_backoff="1m", multiplier=2, max_backoff="30m"
    )
    assert run("schedule", "update", "nightly", "--no-retries").exit_code == 0
    assert fake.called("update_schedule")[1][1]["remove_retry"] is True
    both = run("schedule", "update", "nightly", "--no-retries", "--retries", "2")
    assert both.exit_code == 2 and "--no-retries removes the retry policy" in both.output
    shown = run("schedule", "show", "nightly")
    assert "3 attempts, back-off 1m x2 up to 30m" in shown.output


def test_task_show_shows_each_attempt(fake: FakeClient, run: Callable[..., Result]) -> None:
    task = a_task(pb.TASK_STATUS_PENDING)
    task.attempt, task.max_attempts = 2, 3
    task.attempts.append(
        pb.TaskAttempt(
            attempt=1,
            started_at=stamp(NOW),
            finished_at=stamp(NOW),
            status=pb.TASK_STATUS_FAILED,
            message="power on failed on c0 (1/1): timed out",
            retryable=True,
        )
    )
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[task])
    result = run("task", "show", TASK_ID)
    assert result.exit_code == 0, result.output
    assert "2 of 3" in result.output
    assert "FAILED (retryable): power on failed on c0 (1/1): timed out" in result.output


def test_task_show_says_an_attempt_the_task_ended_before_never_started(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """Cancelled while it waited out its back-off, a task's `attempt` is the one it waited for: "attempt 2
    of 3" beside TERMINATED read as if attempt 2 had run and been cut short."""
    task = a_task(pb.TASK_STATUS_TERMINATED)
    task.attempt, task.max_attempts = 2, 3
    task.attempts.append(
        pb.TaskAttempt(attempt=1, started_at=stamp(NOW), finished_at=stamp(NOW), status=pb.TASK_STATUS_FAILED)
    )
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[task])
    result = run("task", "show", TASK_ID)
    assert result.exit_code == 0, result.output
    assert "2 of 3 (never started: the task ended before it)" in " ".join(result.output.split())
    task.attempts.append(
        pb.TaskAttempt(
            attempt=2, started_at=stamp(NOW), finished_at=stamp(NOW), status=pb.TASK_STATUS_TERMINATED
        )
    )
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[task])
    assert "never started" not in run("task", "show", TASK_ID).output


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (pb.TASK_STATUS_RUNNING, "(ends FAILED without running)"),
        (pb.TASK_STATUS_FAILED, "(never ran)"),
    ],
    ids=["running", "ended"],
)
def test_task_show_says_a_start_gate_refused_it(
    fake: FakeClient, run: Callable[..., Result], status: pb.TaskStatus.ValueType, said: str
) -> None:
    task = a_task(status)
    reason = "pre-flight check 'drained' gave up after 2h"
    task.refusal.CopyFrom(pb.TaskRefusal(reason=reason, ends_as=pb.TASK_STATUS_FAILED))
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[task])
    result = run("task", "show", TASK_ID)
    assert result.exit_code == 0, result.output
    assert f"refused by a start gate: {reason} {said}" in " ".join(result.output.split())
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[a_task(status)])
    assert "refused" not in run("task", "show", TASK_ID).output


def test_task_show_lists_each_checks_answer_in_its_last_round(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    task = a_task(pb.TASK_STATUS_PENDING)
    for check, passed, reason in (
        ("alerts", True, "alertmanager: cannot ask http://am:9093: refused (fail_closed is off)"),
        ("drained", False, "webhook: not drained yet"),
    ):
        task.checks.append(
            pb.TaskCheckResult(
                check=check,
                round=3,
                passed=passed,
                reason=f"pre-flight check {check!r}: {reason}",
                checked_at=stamp(NOW),
            )
        )
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[task])
    result = run("task", "show", TASK_ID)
    assert result.exit_code == 0, result.output
    shown = " ".join(result.output.split())
    assert "check alerts passed (round 3, " in shown and "refused (fail_closed is off)" in shown
    assert "check drained holds it (round 3, " in shown and "): webhook: not drained yet" in shown
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[a_task(pb.TASK_STATUS_PENDING)])
    assert "check " not in run("task", "show", TASK_ID).output


def test_schedule_runs_shows_a_rollouts_progress(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[_a_rollout_run("halted", 0)], total=1)
    result = run("schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    assert "1/4 ok, 2 failed" in result.output and "rollout halted: 2 of 4" in result.output


def test_schedule_runs_basic_view_shows_the_counts(fake: FakeClient, run: Callable[..., Result]) -> None:
    counted = pb.TaskScheduleRun(
        id=pb.UUID(id=RUN_ID),
        state="completed",
        outcome_counts=[
            pb.OutcomeCount(outcome="submitted", racks=9_990, with_task=9_990),
            pb.OutcomeCount(outcome="failed", racks=4),
            pb.OutcomeCount(outcome="skipped_overlap", racks=5),
            pb.OutcomeCount(outcome="skipped_window", racks=1),
        ],
        task_counts=[
            pb.TaskStatusCount(status=pb.TASK_STATUS_COMPLETED, tasks=9_987),
            pb.TaskStatusCount(status=pb.TASK_STATUS_FAILED, tasks=2),
            pb.TaskStatusCount(status=pb.TASK_STATUS_TERMINATED, tasks=1),
        ],
    )
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[counted], total=1)
    result = run("schedule", "runs", "big", "--view", "basic")
    assert result.exit_code == 0, result.output
    assert fake.called("list_runs")[-1][1]["view"] == "basic"
    (row,) = [line for line in result.output.splitlines() if RUN_ID in line]
    assert row.split()[4:9] == ["-", "9990", "7", "6", "-"], row  # LATE, TASKS, FAILED (4 + 3), SKIPPED, HELD
    refused = run("schedule", "runs", "big", "--view", "some")
    assert refused.exit_code == 2 and "'some' is not one of" in refused.output


def test_schedule_runs_counts_no_failure_for_the_racks_a_cancel_did_not_start(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """A cancelled rollout's rack whose task the cancel ended before it began is "not_started" with a
    TERMINATED task: not a failed rack, in either view."""
    ended = pb.ScopeOutcome(
        rack_id=pb.UUID(id=RACK_ID),
        outcome="not_started",
        task_id=pb.UUID(id=TASK_ID),
        task_status=pb.TASK_STATUS_TERMINATED,
        error="its rollout was cancelled by oncall",
    )
    listed = pb.TaskScheduleRun(id=pb.UUID(id=RUN_ID), state="cancelled", outcomes=[ended])
    counted = pb.TaskScheduleRun(
        id=pb.UUID(id=RUN_ID),
        state="cancelled",
        outcome_counts=[
            pb.OutcomeCount(outcome="submitted", racks=2, with_task=2),
            pb.OutcomeCount(outcome="not_started", racks=3, with_task=1),
        ],
        task_counts=[
            pb.TaskStatusCount(status=pb.TASK_STATUS_COMPLETED, tasks=1),
            pb.TaskStatusCount(status=pb.TASK_STATUS_FAILED, tasks=1),
            pb.TaskStatusCount(status=pb.TASK_STATUS_TERMINATED, tasks=1),
        ],
    )
    for found, tasks_failed in ((listed, ["0", "0"]), (counted, ["2", "1"])):
        fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(runs=[found], total=1)
        result = run("schedule", "runs", "fw")
        assert result.exit_code == 0, result.output
        (row,) = [line for line in result.output.splitlines() if RUN_ID in line]
        assert row.split()[5:7] == tasks_failed, row  # TASKS, FAILED
    assert fake.called("get_tasks") == []  # no failed task's message to look up


def test_conflicts_of_an_existing_schedule_use_its_operation_and_scope(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["list_scopes"] = pb.ListTaskScheduleScopesResponse(
        scopes=[pb.TaskScheduleScope(rack_id=pb.UUID(id=RACK_ID))]
    )
    fake.answers["check_conflicts"] = pb.CheckScheduleConflictsResponse()
    result = run("schedule", "conflicts", "nightly")
    assert result.exit_code == 0, result.output
    [(args, kwargs)] = fake.called("check_conflicts")
    target = Targets(racks=[RACK_ID]).to_proto()
    assert args == (
        pb.ScheduledOperation(power_reset=pb.PowerResetRackRequest(target_spec=target, forced=True)),
    )
    assert kwargs == {"exclude": a_schedule().id.id}
    assert "no conflicts" in result.output


@pytest.mark.parametrize(
    ("statuses", "exit_code"),
    [
        ([pb.TASK_STATUS_PENDING, pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_COMPLETED], 0),
        ([pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_FAILED], 1),
        ([pb.TASK_STATUS_TERMINATED], 1),
    ],
)
def test_task_watch_follows_until_finished(
    fake: FakeClient, run: Callable[..., Result], statuses: list[pb.TaskStatus.ValueType], exit_code: int
) -> None:
    answers: Iterator[pb.Task] = iter(a_task(s) for s in statuses)
    fake.answers["get_task"] = lambda: next(answers)
    result = run("task", "watch", TASK_ID)
    assert result.exit_code == exit_code, result.output
    assert len(fake.called("get_task")) == len(statuses)
    assert pb.TaskStatus.Name(statuses[-1]).removeprefix("TASK_STATUS_") in result.output


def test_task_watch_json_prints_the_final_task(fake: FakeClient, run: Callable[..., Result]) -> None:
    answers = iter([a_task(pb.TASK_STATUS_RUNNING), a_task(pb.TASK_STATUS_COMPLETED)])
    fake.answers["get_task"] = lambda: next(answers)
    result = run("task", "watch", TASK_ID, "-o", "json")
    assert result.exit_code == 0
    assert json.loads(result.output)["status"] == "TASK_STATUS_COMPLETED"


def test_task_get_reports_a_missing_id(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse()
    result = run("task", "get", TASK_ID)
    assert result.exit_code == 1
    assert result.stderr == f"error: NOT_FOUND: task '{TASK_ID}' not found\n"


def test_rack_create_parses_components(fake: FakeClient, run: Callable[..., Result]) -> None:
    result = run(
        "rack",
        "create",
        "rack-09",
        "--external-id",
        "SN-9",
        "--component",
        "COMPUTE:node-0:BMC-1",
        "--component",
        "powershelf:ps-0",
    )
    assert result.exit_code == 0, result.output
    [(args, kwargs)] = fake.called("create_rack")
    assert args == ("rack-09",)
    assert kwargs == {
        "external_id": "SN-9",
        "domain": "",
        "components": [NewComponent("COMPUTE", "node-0", "BMC-1"), NewComponent("powershelf", "ps-0")],
    }


def test_inventory_import_creates_what_is_missing_and_skips_existing_names(
    fake: FakeClient, run: Callable[..., Result], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text(
        json.dumps(
            {
                "domains": [{"name": "nvl-a"}],
                "racks": [
                    {"name": "rack-01", "domain": "nvl-a"},
                    {"name": "rack-09", "domain": "nvl-a", "components": [{"type": "COMPUTE", "name": "n0"}]},
                ],
            }
        )
    )
    result = run("inventory", "import", str(fleet), "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "created": ["rack rack-09 (0 components)", "domain nvl-a (2 racks)"],
        "skipped": ["rack rack-01"],
    }
    [(args, kwargs)] = fake.called("create_rack")
    assert args == ("rack-09",) and kwargs["components"] == (NewComponent("COMPUTE", "n0"),)
    assert fake.called("create_domain") == [(("nvl-a", [RACK_ID, RACK_ID]), {})]


def _refused_at_the_third_rack(fake: FakeClient, tmp_path: Path) -> Path:
    """rack-01 exists; rack-02 is created; the server refuses rack-03; rack-04 and nvl-a are never sent."""
    answers = iter(
        [
            pb.Rack(id=pb.UUID(id=RACK_ID), name="rack-02"),
            RackflowClientError(grpc.StatusCode.ALREADY_EXISTS, "bmc 10.0.0.7/Systems/1 is rack-77's node-0"),
        ]
    )

    def create_rack() -> pb.Rack:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    fake.answers["create_rack"] = create_rack
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "domains": [{"name": "nvl-a"}],
                "racks": [{"name": f"rack-0{i}", "domain": "nvl-a"} for i in range(1, 5)],
            }
        )
    )
    return fleet


def test_inventory_import_refused_part_way_says_what_was_created_and_how_to_resume(
    fake: FakeClient, run: Callable[..., Result], tmp_path: Path
) -> None:
    result = run("inventory", "import", str(_refused_at_the_third_rack(fake, tmp_path)))
    assert result.exit_code == 1
    assert [args for args, _ in fake.called("create_rack")] == [("rack-02",), ("rack-03",)]
    assert fake.called("create_domain") == []
    assert result.stdout.splitlines() == [
        "created rack rack-02 (0 components)",
        "skipped rack rack-01: the name exists",
    ]
    assert result.stderr == (
        "error: rack rack-03 refused: ALREADY_EXISTS: bmc 10.0.0.7/Systems/1 is rack-77's node-0\n"
        "created before it: 1 rack (rack rack-02); "
        "not attempted: 1 rack, 1 domain (rack rack-04, domain nvl-a)\n"
        "fix the file or the inventory and run the same import again: what exists by name is skipped\n"
    )


def test_inventory_import_refused_part_way_in_json_lists_every_step(
    fake: FakeClient, run: Callable[..., Result], tmp_path: Path
) -> None:
    result = run("inventory", "import", str(_refused_at_the_third_rack(fake, tmp_path)), "-o", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {
        "created": ["rack rack-02 (0 components)"],
        "skipped": ["rack rack-01"],
        "refused": {
            "step": "rack rack-03",
            "code": "ALREADY_EXISTS",
            "message": "bmc 10.0.0.7/Systems/1 is rack-77's node-0",
        },
        "not_attempted": ["rack rack-04", "domain nvl-a"],
    }
    assert result.stderr.startswith("error: rack rack-03 refused: ALREADY_EXISTS: ")


def test_inventory_import_counts_each_step_on_the_progress_bar(fake: FakeClient, tmp_path: Path) -> None:
    plan = parse_fleet(yaml.safe_load(_refused_at_the_third_rack(fake, tmp_path).read_text()))
    counted: list[int] = []

    @contextmanager
    def progress(total: int) -> Iterator[Callable[[int], None]]:
        counted.append(total)
        yield counted.append

    result = import_fleet(plan, fake, progress)  # type: ignore[arg-type]
    assert counted == [4, 1]  # rack-02..04 and nvl-a to create; rack-02 created before the refusal
    assert result.done == ["rack rack-02"] and result.refused_step == "rack rack-03"


def test_inventory_import_checks_the_whole_file_first(
    fake: FakeClient, run: Callable[..., Result], tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("racks:\n  - name: ok\n  - name: bad\n    domain: nowhere\n")
    result = run("inventory", "import", str(fleet))
    assert result.exit_code == 2
    assert "racks[1].domain: 'nowhere' is not listed under domains" in result.output
    assert fake.calls == []


def test_inventory_export_round_trips_through_import(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_domains"] = pb.ListNVLDomainsResponse(
        domains=[pb.NVLDomain(id=pb.UUID(id="d1"), name="nvl-a")]
    )
    component = pb.Component(type=pb.COMPONENT_TYPE_NVSWITCH, name="sw-0", firmware_version="1.2")
    fake.answers["list_racks"] = pb.ListRacksResponse(
        racks=[pb.Rack(name="rack-01", nvl_domain_id=pb.UUID(id="d1"), components=[component])]
    )
    result = run("inventory", "export")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == {
        "domains": [{"name": "nvl-a"}],
        "racks": [
            {
                "name": "rack-01",
                "domain": "nvl-a",
                "components": [{"type": "NVSWITCH", "name": "sw-0", "firmware_version": "1.2"}],
            }
        ],
    }


ISSUE_8_COMMANDS = {
    *(f"rack {c}" for c in ("create", "show", "list", "delete", "add-components", "remove-component")),
    "domain create",
    "domain list",
    "domain show",
    *(
        f"task {c}"
        for c in (
            "power-on", "power-off", "power-reset", "bring-up", "ingest", "upgrade-firmware",
            "list", "show", "cancel", "watch",
        )
    ),
    *(
        f"schedule {c}"
        for c in (
            "create", "show", "list", "update", "pause", "resume", "delete", "trigger", "preview", "runs",
            "conflicts",
        )
    ),
    *(f"schedule scope {c}" for c in ("add", "update", "remove", "list")),
    "inventory import",
    "inventory export",
    "serve",
    "db migrate",
}  # fmt: skip


def _leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _leaf_commands(command, (*prefix, name))
        else:
            yield (*prefix, name)


def test_every_command_help_has_an_example(run: Callable[..., Result]) -> None:
    commands = list(_leaf_commands(main))
    assert {" ".join(path) for path in commands} >= ISSUE_8_COMMANDS
    for path in commands:
        result = run(*path, "--help")
        assert result.exit_code == 0, path
        assert "Example:" in result.output, f"rackflow {' '.join(path)} --help has no example"


SHOWN_BY_GROUP = {
    "rack": "rack-01", "task": TASK_ID, "schedule": "nightly", "window": "w", "budget": "b", "run": TASK_ID,
    "notify": "ops", "check": "am", "domain": "nvl-a",
}  # fmt: skip


def test_every_group_shows_one_object_with_show_and_still_takes_get(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """`show` is the verb everywhere (budgets and runs had it; racks, tasks, windows and schedules said
    `get`, which still works but is no longer listed)."""
    fake.answers["get_rack"] = pb.Rack(id=pb.UUID(id=RACK_ID), name="rack-01")
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[a_task(pb.TASK_STATUS_RUNNING)])
    fake.answers["get_window"] = pb.MaintenanceWindow(name="w")
    fake.answers["get_budget"] = pb.OperationBudget(name="b")
    fake.answers["get_run"] = pb.TaskScheduleRun(id=pb.UUID(id=TASK_ID))
    fake.answers["get_channel"] = pb.NotificationChannel(name="ops")
    fake.answers["get_check"] = pb.PreflightCheck(name="am")
    fake.answers["get_domain"] = pb.NVLDomain(name="nvl-a")
    groups = {name for name, command in main.commands.items() if "show" in getattr(command, "commands", {})}
    assert groups == set(SHOWN_BY_GROUP)
    for group, ref in SHOWN_BY_GROUP.items():
        help_text = run(group, "--help").output
        assert " show " in help_text and " get " not in help_text, group
        shown = run(group, "show", ref, "-o", "json")
        assert shown.exit_code == 0, (group, shown.output)
        assert run(group, "get", ref, "-o", "json").output == shown.output


def test_task_watch_on_a_terminal_uses_a_live_display(fake: FakeClient) -> None:
    answers = iter([a_task(pb.TASK_STATUS_RUNNING), a_task(pb.TASK_STATUS_FAILED)])
    fake.answers["get_task"] = lambda: next(answers)
    screen = io.StringIO()
    session = Session(
        connect=lambda _server: fake,  # type: ignore[arg-type,return-value]
        clock=FakeClock(NOW),
        sleep=lambda _s: None,
        console=Console(file=screen, force_terminal=True, width=120),
    )
    result = CliRunner().invoke(main, ["task", "watch", TASK_ID], obj=session)
    assert result.exit_code == 1
    assert "FAILED" in screen.getvalue()
    assert "\x1b[" in screen.getvalue()  # drawn with terminal control codes


def test_list_commands_pass_their_filters(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_tasks"] = pb.ListTasksResponse()
    listed = run(
        "schedule",
        "list",
        "--paused-only",
        "--name-contains",
        "night",
        "--op",
        "power-reset",
        "--sort",
        "name desc",
    )
    assert listed.exit_code == 0, listed.output
    [(_, kwargs)] = fake.called("list_schedules")
    assert kwargs == {
        "rack": "",
        "enabled_only": False,
        "paused_only": True,
        "name_contains": "night",
        "operation": "power-reset",
        "order_by": "name desc",
        "offset": 0,
        "limit": 0,
        "page_token": "",
    }
    racks = run("rack", "list", "--name-contains", "gb200", "--limit", "20")
    assert racks.exit_code == 0, racks.output
    [(_, kwargs)] = fake.called("list_racks")
    assert kwargs == {"domain": "", "name_contains": "gb200", "offset": 0, "limit": 20, "page_token": ""}
    tasks = run("task", "list", "--status", "failed", "--status", "TERMINATED")
    assert tasks.exit_code == 0, tasks.output
    [(_, kwargs)] = fake.called("list_tasks")
    assert kwargs["statuses"] == ("failed", "terminated")
    refused = run("task", "list", "--status", "lost")
    assert refused.exit_code == 2 and "'lost' is not one of" in refused.output
    # Both filters apply: --active with a status that is not active lists nothing, whatever there is.
    narrowed = run("task", "list", "--active", "--status", "running")
    assert narrowed.exit_code == 0, narrowed.output
    contradicted = run("task", "list", "--active", "--status", "running", "--status", "completed")
    assert contradicted.exit_code == 2, contradicted.output
    assert "--active lists WAITING, PENDING and RUNNING tasks: --status completed is none of them" in (
        contradicted.output
    )
    assert len(fake.called("list_tasks")) == 2


def test_a_list_page_says_how_to_get_the_next_and_the_token_continues_it(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["list_tasks"] = pb.ListTasksResponse(
        tasks=[a_task(pb.TASK_STATUS_COMPLETED)], total=10_000, total_capped=True, next_page_token="tok-2"
    )
    first = run("task", "list", "--limit", "1")
    assert first.exit_code == 0, first.output
    assert "1 of 10000+ tasks" in first.stdout
    assert "More: add --page-token tok-2" in first.stderr and "tok-2" not in first.stdout

    fake.answers["list_tasks"] = pb.ListTasksResponse(tasks=[a_task(pb.TASK_STATUS_FAILED)], total=2)
    last = run("task", "list", "--limit", "1", "--page-token", "tok-2")
    assert last.exit_code == 0, last.output
    assert fake.called("list_tasks")[-1][1]["page_token"] == "tok-2"
    assert "--page-token" not in last.stderr  # the last page names no next one

    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse()
    fake.answers["list_audit_events"] = pb.ListAuditEventsResponse()
    for command in (("rack", "list"), ("schedule", "list"), ("schedule", "runs", "nightly"), ("audit",)):
        listed = run(*command, "--page-token", "tok-x")
        assert listed.exit_code == 0, (command, listed.output)
    assert [calls[-1][1]["page_token"] for calls in map(fake.called, _PAGED)] == ["tok-x"] * 4

    fake.answers["list_scopes"] = pb.ListTaskScheduleScopesResponse(
        scopes=[pb.TaskScheduleScope(rack_id=pb.UUID(id=RACK_ID), rack_name="rack-named")],
        total=3,
        next_page_token="tok-s",
    )
    racks_listed = len(fake.called("list_racks"))
    scopes = run("schedule", "scope", "list", "nightly", "--limit", "1", "--page-token", "tok-x")
    assert scopes.exit_code == 0, scopes.output
    [(args, kwargs)] = fake.called("list_scopes")
    assert (args, kwargs) == (("nightly",), {"offset": 0, "limit": 1, "page_token": "tok-x"})
    assert "1 of 3 scope entries" in scopes.stdout and "More: add --page-token tok-s" in scopes.stderr
    # The page names its racks: no list of every rack (20,000 with their components) to name one page.
    assert "rack-named" in scopes.stdout and len(fake.called("list_racks")) == racks_listed


_PAGED = ("list_racks", "list_schedules", "list_runs", "list_audit_events")


def test_a_short_search_goes_on_past_pages_that_found_few_and_says_so(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """A search of one or two characters: each page walks a bounded part of the list (the server's
    SEARCH_WALK), so a page that found fewer than asked, with a token, is not the end. The CLI asks on
    from each token, saying so on stderr, until it has --limit schedules or the list ends."""
    night, day = a_schedule(), a_schedule()
    night.name, day.name = "nx-1", "nx-2"
    pages = iter(
        [
            pb.ListTaskSchedulesResponse(total=0, total_capped=True, next_page_token="walk-2"),
            pb.ListTaskSchedulesResponse(
                task_schedules=[night], total=0, total_capped=True, next_page_token="walk-3"
            ),
            pb.ListTaskSchedulesResponse(
                task_schedules=[day], total=0, total_capped=True, next_page_token="row-2"
            ),
        ]
    )
    fake.answers["list_schedules"] = lambda: next(pages)
    limited = run("schedule", "list", "--name-contains", "nx", "--limit", "2", "--offset", "1")
    assert limited.exit_code == 0, limited.output
    asked = [(kw["limit"], kw["page_token"], kw["offset"]) for _, kw in fake.called("list_schedules")]
    assert asked == [(2, "", 1), (2, "walk-2", 0), (1, "walk-3", 0)]  # the offset once, then the tokens
    assert "nx-1" in limited.stdout and "nx-2" in limited.stdout and "2 of 2+ schedules" in limited.stdout
    assert "searching on: 0 found in 1 pages so far" in limited.stderr
    assert "searching on: 1 found in 2 pages so far" in limited.stderr
    assert "More: add --page-token row-2" in limited.stderr  # the limit reached: the rest from there

    ends = iter(
        [
            pb.ListTaskSchedulesResponse(total=1, total_capped=True, next_page_token="walk-2"),
            pb.ListTaskSchedulesResponse(task_schedules=[night]),
        ]
    )
    fake.answers["list_schedules"] = lambda: next(ends)
    every = run("schedule", "list", "--name-contains", "nx")  # no limit: pages of the most a page may hold
    assert every.exit_code == 0, every.output
    assert [kw["limit"] for _, kw in fake.called("list_schedules")[3:]] == [1000, 1000]
    assert "nx-1" in every.stdout and "--page-token" not in every.stderr

    fake.answers["list_schedules"] = pb.ListTaskSchedulesResponse(total=5, next_page_token="row-9")
    longer = run("schedule", "list", "--name-contains", "nxt", "--limit", "3")  # the index answers: one page
    assert len(fake.called("list_schedules")) == 6 and "searching on" not in longer.stderr


def test_a_short_rack_search_goes_on_past_pages_that_found_few_and_says_so(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """`rack list --name-contains` of one or two characters, as `schedule list`'s: each page walks a bounded
    part of the list (the server's SEARCH_WALK), so a page that found fewer than asked, with a token, is
    not the end. The CLI asks on from each token, saying so on stderr, until it has --limit racks or the
    list ends, the domain looked up once."""
    racks = [pb.Rack(id=pb.UUID(id=str(uuid.UUID(int=i + 1))), name=f"nx-{i}") for i in range(2)]
    pages = iter(
        [
            pb.ListRacksResponse(total=0, total_capped=True, next_page_token="walk-2"),
            pb.ListRacksResponse(racks=racks[:1], total=0, total_capped=True, next_page_token="walk-3"),
            pb.ListRacksResponse(racks=racks[1:], total=0, total_capped=True, next_page_token="row-2"),
        ]
    )
    fake.answers["list_racks"] = lambda: next(pages)
    fake.answers["resolve_domain_id"] = DOMAIN_ID
    limited = run(
        "rack", "list", "--name-contains", "nx", "--domain", "nvl-a", "--limit", "2", "--offset", "1"
    )
    assert limited.exit_code == 0, limited.output
    asked = [
        (kw["limit"], kw["page_token"], kw["offset"], kw["domain"]) for _, kw in fake.called("list_racks")
    ]
    assert asked == [(2, "", 1, DOMAIN_ID), (2, "walk-2", 0, DOMAIN_ID), (1, "walk-3", 0, DOMAIN_ID)]
    assert fake.called("resolve_domain_id") == [(("nvl-a",), {})]
    assert "nx-0" in limited.stdout and "nx-1" in limited.stdout and "2 of 2+ racks" in limited.stdout
    assert "searching on: 0 found in 1 pages so far" in limited.stderr
    assert "searching on: 1 found in 2 pages so far" in limited.stderr
    assert "More: add --page-token row-2" in limited.stderr  # the limit reached: the rest from there

    ends = iter(
        [
            pb.ListRacksResponse(total=1, total_capped=True, next_page_token="walk-2"),
            pb.ListRacksResponse(racks=racks[:1]),
        ]
    )
    fake.answers["list_racks"] = lambda: next(ends)
    every = run("rack", "list", "--name-contains", "nx")  # no limit: pages of the most a page may hold
    assert every.exit_code == 0, every.output
    assert [kw["limit"] for _, kw in fake.called("list_racks")[3:]] == [1000, 1000]
    assert "nx-0" in every.stdout and "--page-token" not in every.stderr

    fake.answers["list_racks"] = pb.ListRacksResponse(total=5, next_page_token="row-9")
    longer = run("rack", "list", "--name-contains", "nxt", "--limit", "3")  # the index answers: one page
    assert len(fake.called("list_racks")) == 6 and "searching on" not in longer.stderr


def test_every_list_filters_names_by_name_contains_and_still_takes_the_old_search(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """`rack list --name-contains` and `schedule list --search` were the same filter (the RPCs'
    `name_contains`) under two names. `--name-contains` is its one name on every list that has it, as in
    the RPCs and the JSON API; `--search`, the old name, still works for the scripts that use it, hidden
    from `--help`, and is refused beside a different `--name-contains`."""
    for group in ("rack", "schedule"):
        shown = run(group, "list", "--help")
        assert shown.exit_code == 0, shown.output
        assert "--name-contains" in shown.output and "--search" not in shown.output, shown.output
        for flag in ("--name-contains", "--search"):
            listed = run(group, "list", flag, "gb200", "--limit", "20")
            assert listed.exit_code == 0, listed.output
            (_, kwargs) = fake.called(f"list_{group}s")[-1]
            assert kwargs["name_contains"] == "gb200", (group, flag)
        same = run(group, "list", "--name-contains", "gb", "--search", "gb", "--limit", "20")
        assert same.exit_code == 0, same.output
        assert fake.called(f"list_{group}s")[-1][1]["name_contains"] == "gb"
        both = run(group, "list", "--name-contains", "gb", "--search", "nv")
        assert both.exit_code == 2, both.output
        assert "--search is the old name of --name-contains; give one" in both.output, both.output


def test_audit_by_target_goes_on_past_pages_that_found_few(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """By target, a page on SQLite walks a bounded part of the trail (the server's SEARCH_WALK): the CLI
    asks on from each token, as a short schedule search does, until it has --limit events or the trail
    ends; without --target a page is the answer."""
    event = pb.AuditEvent(at=stamp(NOW), principal="oncall", method="DeleteRack", outcome="OK")
    pages = iter(
        [
            pb.ListAuditEventsResponse(total=0, total_capped=True, next_page_token="walk-2"),
            pb.ListAuditEventsResponse(events=[event], total=1, total_capped=True, next_page_token="walk-3"),
            pb.ListAuditEventsResponse(events=[event]),
        ]
    )
    fake.answers["list_audit_events"] = lambda: next(pages)
    fake.answers["resolve_target_id"] = RACK_ID
    found = run("audit", "--target", "rack-01", "--limit", "5")  # a name, resolved once to the id asked by
    assert found.exit_code == 0, found.output
    assert fake.called("resolve_target_id") == [(("rack-01",), {})]
    asked = [(kw["target"], kw["limit"], kw["page_token"]) for _, kw in fake.called("list_audit_events")]
    assert asked == [(RACK_ID, 5, ""), (RACK_ID, 5, "walk-2"), (RACK_ID, 4, "walk-3")]
    assert "2 of 2+ events" in found.stdout and "searching on: 1 found in 2 pages so far" in found.stderr

    fake.answers["list_audit_events"] = pb.ListAuditEventsResponse(total=0, next_page_token="walk-9")
    plain = run("audit", "--method", "DeleteRack", "--limit", "5")
    assert len(fake.called("list_audit_events")) == 4 and "searching on" not in plain.stderr


def test_schedule_pause_sends_the_reason_and_the_end(fake: FakeClient, run: Callable[..., Result]) -> None:
    paused = a_schedule()
    paused.enabled = False
    paused.pause_reason, paused.paused_by = "PSU swap", "oncall"
    paused.paused_at.CopyFrom(stamp(NOW))
    paused.resume_at.CopyFrom(stamp(NOW + timedelta(hours=2)))
    fake.answers["pause_schedule"] = paused

    result = run("schedule", "pause", "nightly", "--reason", "PSU swap", "--for", "2h")

    assert result.exit_code == 0, result.output
    [(args, kwargs)] = fake.called("pause_schedule")
    assert args == ("nightly",) and kwargs == {"reason": "PSU swap", "resume_at": NOW + timedelta(hours=2)}
    assert "PSU swap" in result.output and "by oncall" in result.output
    assert "(08:48Z), in 2h" in result.output  # when it resumes, in its zone and UTC
    until = run("schedule", "pause", "nightly", "--until", "2026-12-24T06:00:00Z")
    assert until.exit_code == 0, until.output
    assert fake.called("pause_schedule")[1][1]["resume_at"] == datetime(2026, 12, 24, 6, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--for", "2h", "--until", "2026-12-24T06:00:00Z"), "give one of --until or --for"),
        (("--for", "soon"), "not a duration"),
        (("--until", "2026-12-24T06:00:00"), "has no offset"),
        # A pause that would end as it begins: said of --for, not as the server's "resume_at: must be in
        # the future, got <now>", a time the operator never typed.
        (("--for", "0s"), "--for: must be longer than 0s"),
    ],
)
def test_schedule_pause_refuses_bad_ends(
    fake: FakeClient, run: Callable[..., Result], args: tuple[str, ...], message: str
) -> None:
    result = run("schedule", "pause", "nightly", *args)
    assert result.exit_code == 2 and message in result.output
    assert fake.called("pause_schedule") == []


# --- operation budgets ------------------------------------------------------------------------------

BUDGET_ID = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d"


def a_budget(per_domain: int | None = 2) -> pb.OperationBudget:
    return pb.OperationBudget(
        id=pb.UUID(id=BUDGET_ID),
        name="fw",
        operations=["upgrade_firmware"],
        max_running=8,
        max_running_per_domain=per_domain,
        created_at=stamp(NOW),
        updated_at=stamp(NOW),
    )


def test_budget_create_sends_the_operations_and_caps(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["create_budget"] = a_budget()
    result = run(
        "budget", "create", "fw", "--op", "upgrade-firmware", "--op", "power-off", "--max-running", "8",
        "--max-per-domain", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert fake.called("create_budget") == [(("fw", ("upgrade-firmware", "power-off"), 8, 2), {})]
    assert "upgrade-firmware" in result.output and "8" in result.output


def test_budget_create_needs_an_operation_and_a_cap(fake: FakeClient, run: Callable[..., Result]) -> None:
    for args in (
        ("budget", "create", "fw", "--max-running", "8"),
        ("budget", "create", "fw", "--op", "ingest"),
    ):
        result = run(*args)
        assert result.exit_code == 2 and "Missing option" in result.output
    result = run("budget", "create", "fw", "--op", "reboot", "--max-running", "1")
    assert result.exit_code == 2 and "reboot" in result.output
    assert fake.called("create_budget") == []


def test_budget_list_and_show(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_budgets"] = pb.ListOperationBudgetsResponse(budgets=[a_budget(), a_budget(None)])
    result = run("budget", "list")
    assert result.exit_code == 0, result.output
    assert "2 budgets" in result.output and "upgrade-firmware" in result.output
    assert "RUNNING NOW" in result.output
    fake.answers["get_budget"] = a_budget()
    result = run("budget", "show", "fw", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["max_running_per_domain"] == 2
    assert fake.called("get_budget") == [(("fw",), {})]


def test_budget_show_says_how_full_its_caps_are(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["get_budget"] = pb.OperationBudget(
        name="fw", max_running=8, max_running_per_domain=2, running=5, running_in_fullest_domain=2
    )
    result = run("budget", "show", "fw")
    assert result.exit_code == 0, result.output
    assert "5 of 8; 2 of 2 in the fullest domain" in " ".join(result.output.split())
    fake.answers["get_budget"] = pb.OperationBudget(name="fw", max_running=8, running=3)
    result = run("budget", "show", "fw")
    assert "running now" in result.output and "3 of 8" in result.output and "fullest" not in result.output


def test_budget_update_sends_only_what_is_given(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["update_budget"] = a_budget(None)
    result = run("budget", "update", "fw", "--max-running", "12", "--no-per-domain-cap")
    assert result.exit_code == 0, result.output
    [(args, kwargs)] = fake.called("update_budget")
    assert args == ("fw",)
    assert kwargs == {
        "name": None,
        "operations": None,
        "max_running": 12,
        "max_per_domain": None,
        "no_per_domain_cap": True,
    }
    for bad, message in (
        (("budget", "update", "fw"), "nothing to change"),
        (("budget", "update", "fw", "--max-per-domain", "2", "--no-per-domain-cap"), "not both"),
    ):
        result = run(*bad)
        assert result.exit_code == 2 and message in result.output
    assert len(fake.called("update_budget")) == 1


def test_budget_delete(fake: FakeClient, run: Callable[..., Result]) -> None:
    result = run("budget", "delete", "fw")
    assert result.exit_code == 0, result.output
    assert fake.called("delete_budget") == [(("fw",), {})]
    assert "deleted budget fw" in result.output


def test_a_task_a_budget_holds_shows_why(fake: FakeClient, run: Callable[..., Result]) -> None:
    held = a_task(pb.TASK_STATUS_PENDING)
    held.message = "waits for budget 'fw' (8 of 8 running)"
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[held])
    fake.answers["list_tasks"] = pb.ListTasksResponse(tasks=[held], total=1)
    for args in (("task", "get", TASK_ID), ("task", "list", "--active")):
        result = run(*args)
        assert result.exit_code == 0, result.output
        assert "waits for budget 'fw' (8 of 8 running)" in " ".join(result.output.split()), result.output


# --- the key columns at 100-200 columns and in a pipe (issue 25) ---------------------------------

LONG_ERROR = (
    "submit power_reset on rack-07: BMC 10.0.0.7 refused the connection after 3 attempts (connection "
    "reset by peer); the last answer was 503 Service Unavailable from the Redfish service root"
)
FIRED = "2026-12-01 06:48:17Z"


def _columns(output: str, line: int) -> list[str]:
    return output.splitlines()[line].split()


@pytest.mark.parametrize("width", WIDTHS)
def test_schedule_runs_keeps_id_time_and_counts_whole_beside_a_long_error(
    fake: FakeClient, run_at: Callable[..., Result], width: int | None
) -> None:
    outcomes = [pb.ScopeOutcome(outcome="failed", error=LONG_ERROR), pb.ScopeOutcome(outcome="submitted")]
    fake.answers["list_runs"] = pb.ListTaskScheduleRunsResponse(
        runs=[
            pb.TaskScheduleRun(
                id=pb.UUID(id=RUN_ID),
                fired_at=stamp(NOW + timedelta(seconds=17)),
                trigger="dispatch",
                state="completed",
                outcomes=outcomes,
            )
        ],
        total=1,
    )
    result = run_at(width, "schedule", "runs", "nightly")
    assert result.exit_code == 0, result.output
    assert _columns(result.output, 1)[:7] == ["RUN", "FIRED", "STATE", "LATE", "TASKS", "FAILED", "SKIPPED"]
    assert _columns(result.output, 2)[:8] == [RUN_ID, *FIRED.split(), "completed", "-", "1", "1", "0"]
    assert all(len(line) <= (width or 200) for line in result.output.splitlines())
    assert " ".join(LONG_ERROR.split()) in " ".join(" ".join(result.output.splitlines()[2:]).split()) or (
        set(LONG_ERROR.split()) <= set(result.output.split())
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_run_show_of_a_halted_run_keeps_rack_outcome_task_and_status(
    fake: FakeClient, run_at: Callable[..., Result], width: int | None
) -> None:
    halted = _a_rollout_run("halted", 0)
    halted.schedule_id.id = a_schedule().id.id
    halted.outcomes.append(
        pb.ScopeOutcome(
            rack_id=pb.UUID(id=RACK_ID),
            outcome="submitted",
            task_id=pb.UUID(id=RUN_ID),
            task_status=pb.TASK_STATUS_FAILED,
        )
    )
    fake.answers["get_run"] = halted
    failed_task = pb.Task(id=pb.UUID(id=RUN_ID), status=pb.TASK_STATUS_FAILED, message=LONG_ERROR)
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[failed_task])
    result = run_at(width, "run", "show", TASK_ID)
    assert result.exit_code == 0, result.output
    assert fake.called("get_tasks") == [(([RUN_ID],), {})]  # the failed task's message is its ERROR
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("RACK"))
    assert lines[header].split()[:4] == ["RACK", "OUTCOME", "TASK", "STATUS"]
    assert lines[header + 1].split() == ["rack-01", "(canary)", "submitted", TASK_ID, "RUNNING"]
    assert lines[header + 2].split()[:4] == ["rack-01", "submitted", RUN_ID, "FAILED"]
    assert set(LONG_ERROR.split()) <= set(" ".join(lines[header:]).split())


@pytest.mark.parametrize("width", WIDTHS)
def test_schedule_list_keeps_name_state_and_times(
    fake: FakeClient, run_at: Callable[..., Result], width: int | None
) -> None:
    listed = a_schedule("nightly-reset-nvl-a")
    listed.summary = "Upgrade Firmware to 2.1.7-hotfix3 (COMPUTE, NVSWITCH)"
    listed.last_run_at.CopyFrom(stamp(datetime(2026, 11, 30, 10, 0, tzinfo=UTC)))  # a firing: a whole minute
    fake.answers["list_schedules"] = pb.ListTaskSchedulesResponse(task_schedules=[listed], total=1)
    result = run_at(width, "schedule", "list")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert {"NAME", "STATE", "OVERLAP", "NEXT", "LAST"} <= set(lines[1].split())
    for value in (
        "nightly-reset-nvl-a",
        "enabled",
        "2026-12-01 02:00 PST (10:00Z), in 3h 12m",
        "2026-11-30 10:00Z",
    ):
        assert value in lines[2], (value, lines[2])
    assert "Upgrade Firmware" in result.output


def test_run_and_task_show_name_their_schedule(fake: FakeClient, run: Callable[..., Result]) -> None:
    """The schedule by its name, not its UUID (`-o json` keeps the id for scripts)."""
    fired = _a_rollout_run("rolling", 1)
    fired.schedule_id.id = a_schedule().id.id
    fake.answers["get_run"] = fired
    submitted = a_task(pb.TASK_STATUS_RUNNING)
    submitted.schedule_id.id = a_schedule().id.id
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[submitted])
    for args in (("run", "show", TASK_ID), ("task", "show", TASK_ID)):
        result = run(*args)
        assert result.exit_code == 0, result.output
        [row] = [line.split() for line in result.output.splitlines() if line.startswith("schedule")]
        assert row == ["schedule", "nightly"]
    assert [args for args, _ in fake.called("get_schedule")] == [(a_schedule().id.id,)] * 2
    as_json = json.loads(run("run", "show", TASK_ID, "-o", "json").output)
    assert as_json["schedule_id"] == {"id": a_schedule().id.id}
    assert len(fake.called("get_schedule")) == 2  # no look-up for scripts


def test_a_deleted_schedule_is_named_by_its_id(fake: FakeClient, run: Callable[..., Result]) -> None:
    submitted = a_task(pb.TASK_STATUS_COMPLETED)
    submitted.schedule_id.id = a_schedule().id.id
    fake.answers["get_tasks"] = pb.GetTasksByIDsResponse(tasks=[submitted])
    fake.answers["get_schedule"] = RackflowClientError(grpc.StatusCode.NOT_FOUND, "schedule not found")
    result = run("task", "show", TASK_ID)
    assert result.exit_code == 0, result.output
    assert f"schedule     {a_schedule().id.id}" in result.output


def test_a_page_of_tasks_names_its_racks_without_reading_every_rack(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """The page's racks are read by their ids, in one call: the whole rack list is 20 pages at 20,000
    racks, read for every `task list` before (docs/PERFORMANCE.md, "The CLI at full size")."""
    gone = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"
    fake.answers["list_tasks"] = pb.ListTasksResponse(
        tasks=[
            a_task(pb.TASK_STATUS_RUNNING),
            pb.Task(id=pb.UUID(id=TASK_ID), rack_id=pb.UUID(id=gone), status=pb.TASK_STATUS_COMPLETED),
        ],
        total=2,
    )
    result = run("task", "list")
    assert result.exit_code == 0, result.output
    assert "rack-01" in result.output and gone[:8] in result.output  # a rack deleted since: by its id
    assert fake.called("list_racks") == [] and fake.called("get_rack") == []
    assert fake.called("racks_by_id") == [((sorted([RACK_ID, gone]),), {})]


GONE_RACK = "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a"


@pytest.mark.parametrize(
    ("args", "row"),
    [
        (("run", "show", TASK_ID), "rack-01 (canary)"),
        (("schedule", "scope", "add", "nightly", "--rack", "rack-01"), "rack-01 all"),
        (("domain", "list"), f"nvl-a rack-01, {GONE_RACK}"),
    ],
)
def test_a_run_a_scope_change_and_the_domains_name_their_racks_without_reading_every_rack(
    fake: FakeClient, run: Callable[..., Result], args: tuple[str, ...], row: str
) -> None:
    """A run's table, the scope an add or update leaves and the NVLink domains read their racks by id, as a
    page of tasks does: they read the whole rack list, 20 pages at 20,000 racks."""
    fake.answers["get_run"] = _a_held_run()
    scopes = [pb.TaskScheduleScope(rack_id=pb.UUID(id=r)) for r in (RACK_ID, GONE_RACK)]
    fake.answers["add_scope"] = pb.AddTaskScheduleScopeResponse(scopes=scopes)
    fake.answers["list_domains"] = pb.ListNVLDomainsResponse(
        domains=[pb.NVLDomain(name="nvl-a", rack_ids=[pb.UUID(id=RACK_ID), pb.UUID(id=GONE_RACK)])]
    )
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert row in " ".join(result.output.split()), result.output
    assert fake.called("list_racks") == [] and fake.called("get_rack") == []
    [((asked,), _)] = fake.called("racks_by_id")
    assert RACK_ID in asked and set(asked) <= {RACK_ID, GONE_RACK}


def _racks(count: int) -> list[pb.Rack]:
    return [pb.Rack(id=pb.UUID(id=str(uuid.UUID(int=i + 1))), name=f"rack-{i:05}") for i in range(count)]


def _a_run_of(racks: list[pb.Rack]) -> pb.TaskScheduleRun:
    return pb.TaskScheduleRun(
        id=pb.UUID(id=RUN_ID),
        state="completed",
        outcomes=[pb.ScopeOutcome(rack_id=r.id, outcome="submitted") for r in racks],
    )


@pytest.mark.parametrize(("racks", "calls"), [(250, [250]), (2001, [1000, 1000, 1])])
def test_a_run_of_hundreds_of_racks_reads_its_racks_alone_a_thousand_at_a_time(
    fake: FakeClient, run: Callable[..., Result], racks: int, calls: list[int]
) -> None:
    """Past 100 racks a run's table read the whole rack list (20 pages at 20,000 racks) for its names: it
    reads the run's racks alone, by id, at most 1,000 a call (ListRacksRequest.ids takes a page's worth)."""
    fleet = _racks(racks + 10)
    fake.answers["list_racks"] = pb.ListRacksResponse(racks=fleet)
    fake.answers["get_run"] = _a_run_of(fleet[5 : 5 + racks])
    result = run("run", "show", RUN_ID)
    assert result.exit_code == 0, result.output
    assert all(r.name in result.output for r in fleet[5 : 5 + racks])
    assert fake.called("list_racks") == [] and fake.called("get_rack") == []
    asked = [ids for (ids,), _ in fake.called("racks_by_id")]
    assert [len(ids) for ids in asked] == calls
    assert sorted(i for ids in asked for i in ids) == sorted(r.id.id for r in fleet[5 : 5 + racks])


@pytest.mark.parametrize(("racks", "reads"), [(100, {"get_rack": 100}), (250, {"list_racks": 1})])
def test_a_server_that_takes_no_rack_ids_is_read_as_before(
    fake: FakeClient, run: Callable[..., Result], racks: int, reads: dict[str, int]
) -> None:
    """A CLI upgraded before its servers: the old ListRacks ignores ids (`racks_by_id` says None), so the
    names are read as that release's CLI read them, each by id when at most 100, else every rack."""
    fake.knows_rack_ids = False
    fleet = _racks(racks)
    fake.answers["list_racks"] = pb.ListRacksResponse(racks=fleet)
    fake.answers["get_run"] = _a_run_of(fleet)
    result = run("run", "show", RUN_ID)
    assert result.exit_code == 0, result.output
    assert all(r.name in result.output for r in fleet)
    assert len(fake.called("racks_by_id")) == 1
    assert {name: len(fake.called(name)) for name in ("get_rack", "list_racks")} == {
        "get_rack": 0,
        "list_racks": 0,
    } | reads


def test_the_failed_tasks_of_a_run_are_read_a_thousand_at_a_time(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """Why each failed rack failed is its task's message: one GetTasksByIDs for every failed task was
    refused past 1,000 (its limit), and so was `run show` of a run of more failed racks."""
    failed = _a_run_of(_racks(1001))
    for i, outcome in enumerate(failed.outcomes):
        outcome.task_id.id, outcome.task_status = str(uuid.UUID(int=10**6 + i)), pb.TASK_STATUS_FAILED
    fake.answers["get_run"] = failed
    fake.answers["get_tasks"] = lambda: pb.GetTasksByIDsResponse(
        tasks=[pb.Task(id=pb.UUID(id=i), message=f"bmc {i[-4:]} gone") for i in fake.calls[-1][1][0]]
    )
    result = run("run", "show", RUN_ID)
    assert result.exit_code == 0, result.output
    assert [len(ids) for (ids,), _ in fake.called("get_tasks")] == [1000, 1]
    assert all(f"bmc {o.task_id.id[-4:]} gone" in result.output for o in failed.outcomes)


def test_reading_the_names_of_many_racks_shows_progress_on_a_terminal(fake: FakeClient) -> None:
    """More than one call's worth of racks counts on a progress bar while the table waits; on a terminal
    alone (a pipe and -o json see the table or the run, nothing else)."""
    fleet = _racks(1001)
    fake.answers["list_racks"] = pb.ListRacksResponse(racks=fleet)
    fake.answers["get_run"] = _a_run_of(fleet)

    def show(*args: str, terminal: bool) -> str:
        screen = io.StringIO()
        console = Console(file=screen, force_terminal=terminal, width=200)
        session = Session(connect=lambda _server: fake, clock=FakeClock(NOW), console=console)  # type: ignore[arg-type,return-value]
        result = CliRunner().invoke(main, ["run", "show", RUN_ID, *args], obj=session)
        assert result.exit_code == 0, result.output
        return screen.getvalue() + result.output

    assert "reading rack names" in show(terminal=True)
    assert "reading rack names" not in show(terminal=False)
    assert "reading rack names" not in show("-o", "json", terminal=True)


def test_a_page_of_racks_names_its_own_domains_alone(fake: FakeClient, run: Callable[..., Result]) -> None:
    """Its racks' domains asked for by id, not the whole domain list (20,000 domains in a fleet of NVL72
    racks): one ListNVLDomains for each 1,000 of them."""
    racks = [pb.Rack(id=pb.UUID(id=str(uuid.UUID(int=i + 1))), name=f"rack-{i}") for i in range(3)]
    racks[0].nvl_domain_id.id = "d1"
    racks[2].nvl_domain_id.id = "d1"
    fake.answers["list_racks"] = pb.ListRacksResponse(racks=racks, total=3)
    fake.answers["list_domains"] = pb.ListNVLDomainsResponse(
        domains=[
            pb.NVLDomain(id=pb.UUID(id="d1"), name="nvl-a"),
            pb.NVLDomain(id=pb.UUID(id="d2"), name="nvl-b"),
        ]
    )
    result = run("rack", "list")
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.output.splitlines()]
    assert [line.split()[:4:3] for line in lines if line.startswith("rack-")] == [
        ["rack-0", "nvl-a"],
        ["rack-1", "-"],
        ["rack-2", "nvl-a"],
    ]
    assert fake.called("list_domains") == []
    assert fake.called("domains_asked") == [((), {"ids": ["d1"], "names": []})]


def test_domain_list_pages(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_domains"] = pb.ListNVLDomainsResponse(
        domains=[pb.NVLDomain(id=pb.UUID(id="d1"), name="nvl-a")], total=20_000, next_page_token="tok2"
    )
    result = run("domain", "list", "--limit", "1", "--page-token", "tok1")
    assert result.exit_code == 0, result.output
    assert fake.called("list_domains") == [((), {"offset": 0, "limit": 1, "page_token": "tok1"})]
    assert "1 of 20000 domains" in result.output.replace(",", "")
    assert "nvl-a" in result.output and "More: add --page-token tok2" in result.output


def test_rack_list_of_every_rack_reads_a_page_at_a_time(fake: FakeClient, run: Callable[..., Result]) -> None:
    """`rack list` (--limit 0, every rack) follows the pages' tokens, 1,000 racks a call: one answer of every
    rack passes gRPC's message limit on a fleet of 20,000 racks of 36 components (100 MB)."""
    racks = [pb.Rack(id=pb.UUID(id=str(uuid.UUID(int=i + 1))), name=f"rack-{i}") for i in range(3)]
    pages = iter(
        [
            pb.ListRacksResponse(racks=racks[:2], total=3, next_page_token="p2"),
            pb.ListRacksResponse(racks=racks[2:], total=3),
        ]
    )
    fake.answers["list_racks"] = lambda: next(pages)
    result = run("-o", "json", "rack", "list")
    assert result.exit_code == 0, result.output
    assert [r["name"] for r in json.loads(result.output)["racks"]] == ["rack-0", "rack-1", "rack-2"]
    assert fake.called("list_racks") == [
        ((), {"domain": "", "name_contains": "", "offset": 0, "limit": 1000, "page_token": ""}),
        ((), {"domain": "", "name_contains": "", "offset": 0, "limit": 1000, "page_token": "p2"}),
    ]
    assert json.loads(result.output)["next_page_token"] == ""  # the list ended: no page after it
