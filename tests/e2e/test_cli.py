"""The `rackflow` CLI end to end: a real `rackflow serve` process, the CLI run as a subprocess, JSON asserted.

The path a new operator takes: import the example fleet, create a schedule, list it, fire it by hand,
read its runs and the tasks it submitted, watch one finish. Runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from rackflow.cli.output import utc_text
from tests.e2e.cluster import ServerProcess, run_cli, start_server

# One worker: module-scoped servers. One database: the CLI is a gRPC client, so what it prints does not
# depend on the database under the server, and every RPC it calls is tested on both databases beneath it
# (tests/api, tests/store); SQLite is the default a first `rackflow serve` runs on.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.parametrize("served_db_url", ["sqlite"], indirect=True),
]

FLEET = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
FAILING = "cli-fail-c0"
FLAKY = "cli-flaky-c0"


@pytest.fixture(scope="module")
def server(served_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # A component with this external id fails every step (the FAILED count of `schedule runs`); FLAKY's
    # steps all fail retryably.
    env = {"RACKFLOW_SIM_FAIL_IDS": FAILING, "RACKFLOW_SIM_TRANSIENT_IDS": FLAKY}
    proc = start_server(served_db_url, tmp_path_factory.mktemp("cli"), env=env)
    yield proc
    assert proc.stop() == 0, proc.output


def rackflow(server: ServerProcess, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
    """Run `rackflow --server ADDRESS ARGS…` (`run_cli`) and check its exit code."""
    result = run_cli(server.address, *args)
    assert result.returncode == expect, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def rackflow_json(server: ServerProcess, *args: str) -> Any:
    return json.loads(rackflow(server, *args, "-o", "json").stdout)


def test_import_schedule_trigger_runs_tasks(server: ServerProcess) -> None:
    imported = rackflow_json(server, "inventory", "import", str(FLEET))
    assert imported == {
        "created": [*(f"rack rack-0{i} (8 components)" for i in range(1, 5)), "domain nvl-a (4 racks)"],
        "skipped": [],
    }
    again = rackflow_json(server, "inventory", "import", str(FLEET))
    assert again["created"] == [] and len(again["skipped"]) == 5

    created = rackflow_json(
        server, "schedule", "create", "nightly-reset", "--cron", "0 2 * * *", "--tz", "America/Los_Angeles",
        "--op", "power-reset", "--rack", "rack-01", "--rack", "rack-02", "--types", "COMPUTE",
    )  # fmt: skip
    assert created["name"] == "nightly-reset"
    assert created["operation_type"] == "power_reset"
    assert created["summary"] == "Power Reset"
    assert created["operation"]["power_reset"]["forced"] is False
    assert created["spec"] == {
        "type": "SCHEDULE_SPEC_TYPE_CRON",
        "spec": "0 2 * * *",
        "timezone": "America/Los_Angeles",
    }
    assert created["enabled"] is True
    assert created["next_run_at"].endswith(("T10:00:00Z", "T09:00:00Z"))  # 02:00 PST or PDT

    listed = rackflow_json(server, "schedule", "list")
    assert listed["total"] == 1
    assert [s["id"] for s in listed["task_schedules"]] == [created["id"]]

    triggered = rackflow_json(server, "schedule", "trigger", "nightly-reset")
    task_ids = sorted(t["id"] for t in triggered["task_ids"])
    assert len(task_ids) == 2

    runs = rackflow_json(server, "schedule", "runs", created["id"]["id"])
    assert runs["total"] == 1
    [run] = runs["runs"]
    assert run["trigger"] == "manual"
    assert run["schedule_id"] == created["id"]
    assert sorted(o["outcome"] for o in run["outcomes"]) == ["submitted", "submitted"]
    assert sorted(o["task_id"]["id"] for o in run["outcomes"]) == task_ids

    tasks = rackflow_json(server, "task", "list", "--schedule", "nightly-reset")
    assert tasks["total"] == 2
    assert sorted(t["id"]["id"] for t in tasks["tasks"]) == task_ids
    assert {t["operation"] for t in tasks["tasks"]} == {"power_reset"}
    assert {t["schedule_id"]["id"] for t in tasks["tasks"]} == {created["id"]["id"]}

    watched = rackflow(server, "task", "watch", task_ids[0], "--interval", "1")
    assert "COMPLETED" in watched.stdout
    finished = rackflow_json(server, "task", "get", *task_ids)  # `get`: the former `show`, still taken
    assert {t["status"] for t in finished["tasks"]} <= {"TASK_STATUS_COMPLETED", "TASK_STATUS_RUNNING",
                                                         "TASK_STATUS_PENDING"}  # fmt: skip


def test_tables_for_people(server: ServerProcess) -> None:
    rackflow(server, "inventory", "import", str(FLEET))
    racks = rackflow(server, "rack", "list").stdout.splitlines()
    assert racks[1].split()[:4] == ["NAME", "ID", "EXTERNAL", "ID"]
    assert any(line.startswith("rack-03") and "nvl-a" in line for line in racks)
    names = [line.split()[0] for line in racks if line.startswith("rack-")]
    paged: list[str] = []
    token_args: list[str] = []
    for _ in names:  # a page of two racks at a time, each continuing from the token the last one named
        page = rackflow(server, "rack", "list", "--limit", "2", *token_args)
        paged += [line.split()[0] for line in page.stdout.splitlines() if line.startswith("rack-")]
        if "--page-token" not in page.stderr:
            break
        token_args = ["--page-token", page.stderr.split("--page-token")[1].split()[0]]
    assert paged == names
    preview = rackflow(
        server, "schedule", "preview", "--cron", "0 2 * * *", "--tz", "America/Los_Angeles", "-n", "2",
        "--after", "2026-12-01T00:00:00Z",
    ).stdout  # fmt: skip
    assert "2026-12-01 10:00Z  2026-12-01 02:00 PST (10:00Z)" in preview
    assert "2026-12-02 10:00Z  2026-12-02 02:00 PST (10:00Z)" in preview


def test_a_trigger_that_submits_nothing_prints_each_rack_and_why(server: ServerProcess) -> None:
    rackflow(server, "inventory", "import", str(FLEET))
    # A firmware upgrade waiting for a window far ahead stays PENDING and holds rack-04 (and nothing else).
    rackflow(
        server, "task", "upgrade-firmware", "--rack", "rack-04", "--version", "9.9.9",
        "--start", "2999-01-01T00:00:00Z",
    )  # fmt: skip
    created = rackflow_json(
        server, "schedule", "create", "held", "--interval", "24h", "--op", "power-on", "--rack", "rack-04"
    )
    refused = rackflow(server, "schedule", "trigger", "held", expect=1)
    prefix = (
        f"error: FAILED_PRECONDITION: id: schedule 'held' ({created['id']['id']}) fired but submitted no task"
    )
    assert refused.stderr.startswith(prefix)
    assert "rack 'rack-04' (" in refused.stderr and "power_on conflicts with task" in refused.stderr
    runs = rackflow_json(server, "schedule", "runs", "held")
    assert [[o["outcome"] for o in run["outcomes"]] for run in runs["runs"]] == [["failed"]]
    # Run again with one request id, the refusal is the first one's answer, and says so before the error.
    first = rackflow(server, "schedule", "trigger", "held", "--request-id", "held-1", expect=1)
    again = rackflow(server, "schedule", "trigger", "held", "--request-id", "held-1", expect=1)
    runs = rackflow_json(server, "schedule", "runs", "held")["runs"]
    assert len(runs) == 2
    fired_at = datetime.fromisoformat(runs[0]["fired_at"])
    told = (
        f"request held-1 had already fired run {runs[0]['id']['id']} at {utc_text(fired_at)}: "
        "it submitted no task; nothing new fired"
    )
    assert again.stderr.splitlines()[0] == told
    assert "by an earlier request with request_id 'held-1'" in again.stderr.splitlines()[1]
    assert first.stderr.startswith(prefix) and "earlier" not in first.stderr


def test_a_firmware_schedule_shows_its_version_and_is_checked_with_it(server: ServerProcess) -> None:
    rackflow(server, "inventory", "import", str(FLEET))
    rackflow(
        server,
        "schedule",
        "create",
        "resets",
        "--interval",
        "24h",
        "--op",
        "power-reset",
        "--rack",
        "rack-03",
    )
    rackflow(
        server, "schedule", "create", "switch-fw", "--interval", "168h", "--op", "upgrade-firmware",
        "--version", "3.2.0", "--rack", "rack-03", "--types", "NVSWITCH",
    )  # fmt: skip
    listed = rackflow(server, "schedule", "list", "--rack", "rack-03").stdout
    assert any(
        line.startswith("switch-fw") and "Upgrade Firmware to 3.2.0" in line for line in listed.splitlines()
    )
    found = rackflow_json(server, "schedule", "conflicts", "switch-fw")  # its operation, version included
    assert [s["name"] for s in found["conflicts"]] == ["resets"]


def test_errors_are_one_line_with_the_grpc_code(server: ServerProcess) -> None:
    missing = rackflow(server, "schedule", "show", "no-such-schedule", expect=1)
    assert missing.stderr == "error: NOT_FOUND: schedule 'no-such-schedule' not found\n"
    bad_cron = rackflow(
        server,
        "schedule",
        "create",
        "bad",
        "--cron",
        "61 * * * *",
        "--op",
        "ingest",
        "--rack",
        "rack-01",
        expect=1,
    )
    assert bad_cron.stderr.startswith("error: INVALID_ARGUMENT: ")
    assert len(bad_cron.stderr.splitlines()) == 1
    usage = rackflow(server, "schedule", "create", "bad", "--op", "ingest", "--rack", "rack-01", expect=2)
    assert "give when it fires" in usage.stderr


def test_windows_freeze_a_manual_task_until_deleted_and_preview_a_schedule(server: ServerProcess) -> None:
    """On a rack of its own (the other tests' racks stay unfrozen): a freeze holds a task submitted by
    hand, `--ignore-windows` overrides it, deleting the freeze lets the held task run; the previews."""
    rackflow(server, "rack", "create", "rack-w", "--component", "COMPUTE:w-0:W-0")
    created = rackflow_json(
        server, "window", "create", "launch", "--freeze", "--start", "2026-01-01T00:00:00Z",
        "--end", "2100-01-01T00:00:00Z", "--rack", "rack-w", "--reason", "GA launch",
    )  # fmt: skip
    assert created["kind"] == "WINDOW_KIND_FREEZE" and created["racks"][0]["name"] == "rack-w"
    rackflow_json(
        server, "window", "create", "sat-night", "--allow", "--cron", "0 22 * * 6", "--duration", "6h",
        "--tz", "Europe/Berlin", "--rack", "rack-w",
    )  # fmt: skip
    assert [w["name"] for w in rackflow_json(server, "window", "list", "--rack", "rack-w")["windows"]] == [
        "launch",
        "sat-night",
    ]
    before = datetime.now(UTC)
    events = rackflow_json(server, "window", "preview", "rack-w", "-n", "3")["events"]
    # sat-night's next change: it opens Saturdays at 22:00 in Berlin, or, asked while it is open (until
    # Sunday 04:00), closes first; the freeze's end (2100) comes after either.
    first = events[0]
    at = datetime.fromisoformat(first["at"].replace("Z", "+00:00")).astimezone(ZoneInfo("Europe/Berlin"))
    assert first["window_name"] == "sat-night"
    assert (at.weekday(), at.hour, at.minute) == {"opens": (5, 22, 0), "closes": (6, 4, 0)}[first["change"]]
    assert timedelta(0) < at - before <= timedelta(days=7)

    (held_id,) = rackflow_json(server, "task", "power-on", "--rack", "rack-w")["task_ids"]

    def task(task_id: dict[str, str]) -> Any:
        return rackflow_json(server, "task", "get", task_id["id"])["tasks"][0]

    deadline = time.monotonic() + 30
    while not task(held_id)["message"].startswith("waits for freeze 'launch' to end at 2100-01-01"):
        assert time.monotonic() < deadline, task(held_id)
        time.sleep(0.5)
    assert task(held_id)["status"] == "TASK_STATUS_PENDING"

    schedule = rackflow_json(
        server, "schedule", "create", "w-nightly", "--cron", "0 2 * * *", "--op", "power-off",
        "--rack", "rack-w", "--window-policy", "defer",
    )  # fmt: skip
    assert schedule["window_policy"] == "WINDOW_POLICY_DEFER"
    planned = rackflow_json(server, "schedule", "preview", "w-nightly", "-n", "2")["firings"]
    assert [[d["decision"] for d in f["scopes"]] for f in planned] == [["skip_window"], ["skip_window"]]
    table = rackflow(server, "schedule", "preview", "w-nightly", "-n", "2").stdout
    assert "skip (launch)" in table
    rackflow(server, "schedule", "delete", "w-nightly")

    rackflow(server, "window", "delete", "launch")
    deadline = time.monotonic() + 60
    while task(held_id)["status"] != "TASK_STATUS_COMPLETED":
        assert time.monotonic() < deadline, task(held_id)
        time.sleep(0.5)
    rackflow(server, "window", "delete", "sat-night")


def test_a_rollout_from_the_command_line(server: ServerProcess) -> None:
    for name in ("ro-a", "ro-b", "ro-c"):
        rackflow(server, "rack", "create", name, "--component", f"COMPUTE:{name}-c0")
    created = rackflow_json(
        server, "schedule", "create", "fw-ro", "--interval", "24h", "--op", "power-on",
        "--rack", "ro-a", "--rack", "ro-b", "--rack", "ro-c",
        "--max-concurrent", "1", "--canary", "1", "--halt-after", "34%",
    )  # fmt: skip
    assert created["rollout"]["max_concurrent_racks"] == 1
    assert created["rollout"]["halt_after_failure_percent"] == 34
    shown = rackflow(server, "schedule", "show", "fw-ro").stdout
    assert "max 1, 1 canary, halt after 34%, pause on halt" in shown
    bad = rackflow(server, "schedule", "update", "fw-ro", "--bake", "0s", expect=1)
    assert "INVALID_ARGUMENT" in bad.stderr and "schedule.rollout.bake_time" in bad.stderr

    triggered = rackflow_json(server, "schedule", "trigger", "fw-ro")
    assert len(triggered["task_ids"]) == 1  # the canary alone
    (run,) = rackflow_json(server, "schedule", "runs", "fw-ro")["runs"]
    watched = rackflow(server, "run", "show", run["id"]["id"], "--watch", "--interval", "1")
    assert "completed" in watched.stdout and "3/3 ok" in watched.stdout
    done = rackflow_json(server, "run", "show", run["id"]["id"])
    assert done["state"] == "completed" and done["progress"]["succeeded"] == 3
    refused = rackflow(server, "run", "cancel", run["id"]["id"], expect=1)
    assert "FAILED_PRECONDITION" in refused.stderr and "only a rolling or halted rollout" in refused.stderr
    runs_table = rackflow(server, "schedule", "runs", "fw-ro").stdout
    assert "3/3 ok" in runs_table


def test_a_rack_whose_task_fails_counts_as_failed_and_run_show_names_it(server: ServerProcess) -> None:
    """The task fails after it was submitted: `schedule runs` counts it in FAILED (it read 0), and the
    piped tables keep every key column whole beside the long error."""
    rackflow(server, "rack", "create", "cli-fail", "--component", f"COMPUTE:c0:{FAILING}")
    rackflow(
        server, "schedule", "create", "fails", "--interval", "24h", "--op", "power-on", "--rack", "cli-fail"
    )
    (task_id,) = (t["id"] for t in rackflow_json(server, "schedule", "trigger", "fails")["task_ids"])

    deadline = time.monotonic() + 60
    while (lines := rackflow(server, "schedule", "runs", "fails").stdout.splitlines())[2].split()[7] != "1":
        assert time.monotonic() < deadline, lines  # the task has not failed yet
    assert lines[1].split()[:7] == ["RUN", "FIRED", "STATE", "LATE", "TASKS", "FAILED", "SKIPPED"]
    run_id, *_ = lines[2].split()
    assert lines[2].split()[3:9] == ["(manual)", "completed", "-", "1", "1", "0"]
    assert "simulated failure" in lines[2]  # the failed task's message

    shown = rackflow(server, "run", "show", run_id).stdout.splitlines()
    assert ["schedule", "fails"] in [line.split() for line in shown]
    header = next(i for i, line in enumerate(shown) if line.startswith("RACK"))
    assert shown[header].split()[:4] == ["RACK", "OUTCOME", "TASK", "STATUS"]
    assert shown[header + 1].split()[:4] == ["cli-fail", "submitted", task_id, "FAILED"]
    assert f"simulated failure: '{FAILING}'" in shown[header + 1]  # the task's message is its error


def test_retries_and_a_run_retried_from_the_command_line(server: ServerProcess) -> None:
    """A schedule with --retries: its task's retryable failures are retried to the last attempt, which
    `task show` lists; `run retry` re-runs the failed rack as a new run linked to the old."""
    rackflow(server, "rack", "create", "cli-flaky", "--component", f"COMPUTE:c0:{FLAKY}")
    created = rackflow_json(
        server, "schedule", "create", "flaky", "--interval", "24h", "--op", "power-on", "--rack", "cli-flaky",
        "--retries", "2", "--retry-backoff", "100ms", "--retry-max-backoff", "100ms",
    )  # fmt: skip
    assert created["retry"] == {
        "max_attempts": 2, "initial_backoff": "100ms", "multiplier": 2.0, "max_backoff": "100ms",
    }  # fmt: skip
    (task_id,) = (t["id"] for t in rackflow_json(server, "schedule", "trigger", "flaky")["task_ids"])
    rackflow(server, "task", "watch", task_id, "--interval", "1", expect=1)  # it failed
    shown = rackflow(server, "task", "show", task_id).stdout
    assert "2 of 2" in shown and "FAILED (retryable): power_on failed on c0 (1/1)" in shown
    (task,) = rackflow_json(server, "task", "show", task_id)["tasks"]
    assert [a["attempt"] for a in task["attempts"]] == [1, 2]
    (run,) = rackflow_json(server, "schedule", "runs", "flaky")["runs"]
    again = rackflow_json(server, "run", "retry", run["id"]["id"])
    assert again["retry_of"] == run["id"] and len(again["outcomes"]) == 1
    assert again["id"]["id"] in rackflow(server, "run", "show", run["id"]["id"]).stdout  # retried by
    refused = rackflow(server, "run", "retry", "00000000-0000-0000-0000-000000000009", expect=1)
    assert "NOT_FOUND" in refused.stderr and "no task schedule run" in refused.stderr


def test_an_operation_budget_from_the_command_line(server: ServerProcess) -> None:
    """Create, list, show, update and delete a budget; a refused create says which field."""
    created = rackflow_json(
        server, "budget", "create", "fw", "--op", "upgrade-firmware", "--max-running", "8",
        "--max-per-domain", "2",
    )  # fmt: skip
    assert (created["name"], created["operations"], created["max_running"]) == ("fw", ["upgrade_firmware"], 8)
    assert created["max_running_per_domain"] == 2
    assert [b["name"] for b in rackflow_json(server, "budget", "list")["budgets"]] == ["fw"]
    assert "upgrade-firmware" in rackflow(server, "budget", "list").stdout
    updated = rackflow_json(server, "budget", "update", "fw", "--max-running", "12", "--no-per-domain-cap")
    assert updated["max_running"] == 12 and "max_running_per_domain" not in updated
    assert rackflow_json(server, "budget", "show", created["id"]["id"])["max_running"] == 12
    refused = rackflow(server, "budget", "create", "fw2", "--op", "power-on", "--max-running", "0", expect=1)
    assert "INVALID_ARGUMENT" in refused.stderr and "budget.max_running" in refused.stderr
    rackflow(server, "budget", "delete", "fw")
    assert rackflow_json(server, "budget", "list") == {"budgets": []}


def test_an_approval_from_the_command_line(server: ServerProcess) -> None:
    rackflow(server, "rack", "create", "ap-a", "--component", "COMPUTE:ap-a-c0")
    created = rackflow_json(
        server, "schedule", "create", "fw-ap", "--interval", "24h", "--op", "power-on", "--rack", "ap-a",
        "--approval-timeout", "4h",
    )  # fmt: skip
    assert created["approval"] == {"required": True, "timeout": "4h", "min_approvers": 1}
    bad = rackflow(server, "schedule", "update", "fw-ap", "--min-approvers", "11", expect=1)
    assert "INVALID_ARGUMENT" in bad.stderr and "schedule.approval.min_approvers" in bad.stderr

    waiting = rackflow(server, "schedule", "trigger", "fw-ap").stdout
    assert "awaiting 1 more of 1 approver(s)" in waiting
    (run,) = rackflow_json(server, "schedule", "runs", "fw-ap")["runs"]
    assert run["state"] == "awaiting_approval" and run["outcomes"][0]["outcome"] == "pending"
    assert "awaiting_approval" in rackflow(server, "schedule", "runs", "fw-ap").stdout
    assert (
        "needs_approval" in rackflow(server, "schedule", "preview", "fw-ap", "-n", "1", "-o", "json").stdout
    )

    approved = rackflow_json(server, "run", "approve", run["id"]["id"], "--comment", "checked")
    assert approved["state"] == "completed" and approved["outcomes"][0]["outcome"] == "submitted"
    refused = rackflow(server, "run", "reject", run["id"]["id"], "--comment", "late", expect=1)
    assert "FAILED_PRECONDITION" in refused.stderr and "only a run awaiting approval" in refused.stderr


def test_audit_by_target_takes_a_name(server: ServerProcess) -> None:
    """`audit --target` takes a name as operators think of a thing: its history; a name a rack and a
    schedule share is refused with both ids to choose from, and one nothing has is NOT_FOUND."""
    rackflow(server, "inventory", "import", str(FLEET))
    schedule = ("--cron", "0 3 * * *", "--op", "power-reset")
    rackflow(server, "schedule", "create", "audited-by-name", *schedule, "--rack", "rack-03")
    rackflow(server, "schedule", "pause", "audited-by-name")
    history = rackflow_json(server, "audit", "--target", "audited-by-name")
    assert [e["method"] for e in history["events"]] == ["PauseTaskSchedule", "CreateTaskSchedule"]

    shared = rackflow_json(server, "schedule", "create", "rack-04", *schedule, "--rack", "rack-04")
    rack_id = next(
        r["id"]["id"] for r in rackflow_json(server, "rack", "list")["racks"] if r["name"] == "rack-04"
    )
    refused = rackflow(server, "audit", "--target", "rack-04", expect=1)
    assert refused.stderr == (
        "error: INVALID_ARGUMENT: target: 'rack-04' names a rack and a schedule; give the id "
        f"(rack {rack_id}, schedule {shared['id']['id']})\n"
    )
    by_id = rackflow_json(server, "audit", "--target", rack_id)
    assert by_id["events"] and all(rack_id in [t["id"] for t in e["target_ids"]] for e in by_id["events"])
    missing = rackflow(server, "audit", "--target", "no-such-thing", expect=1)
    assert missing.stderr == (
        "error: NOT_FOUND: target: no rack, schedule, window, domain, budget, check or channel is named "
        "'no-such-thing'\n"
    )
    for name in ("audited-by-name", "rack-04"):
        rackflow(server, "schedule", "delete", name)


def test_a_re_pause_says_what_it_removed(server: ServerProcess) -> None:
    """Pausing a paused schedule replaces its pause, reason and end together (docs/SCHEDULES.md): re-paused
    with only a new reason, it lost its automatic resume without a word, and the operator who only meant
    to update the ticket left it paused for good. The CLI says what the new pause no longer has."""
    rackflow(server, "inventory", "import", str(FLEET))
    schedule = ("--cron", "0 3 * * *", "--op", "power-reset", "--rack", "rack-02")
    rackflow(server, "schedule", "create", "re-paused", *schedule)
    first = rackflow_json(server, "schedule", "pause", "re-paused", "--reason", "PSU swap", "--for", "2h")
    assert first["resume_at"]

    again = rackflow(server, "schedule", "pause", "re-paused", "--reason", "PSU swap, INC-4412")
    assert again.stderr.startswith("note: this pause has no end, so its automatic resume at "), again.stderr
    assert "was removed: re-paused stays paused until resumed; give --until or --for to keep one" in (
        again.stderr
    )
    shown = rackflow_json(server, "schedule", "show", "re-paused")
    assert "resume_at" not in shown and shown["pause_reason"] == "PSU swap, INC-4412"

    ended = rackflow(server, "schedule", "pause", "re-paused", "--for", "1h", "-o", "json")
    assert json.loads(ended.stdout)["resume_at"]  # stdout stays the schedule, for scripts
    assert ended.stderr == "note: this pause has no reason, so its reason 'PSU swap, INC-4412' was removed\n"
    quiet = rackflow(server, "schedule", "pause", "re-paused", "--reason", "back", "--for", "1h")
    assert quiet.stderr == ""


def test_domain_show_by_name_or_id(server: ServerProcess) -> None:
    """`show` shows one object in every group (README): a domain too, by name or id, with its racks."""
    rackflow(server, "inventory", "import", str(FLEET))
    listed = rackflow_json(server, "domain", "list")["domains"]
    nvl_a = next(d for d in listed if d["name"] == "nvl-a")
    by_name = rackflow_json(server, "domain", "show", "nvl-a")
    assert by_name == nvl_a
    assert rackflow_json(server, "domain", "show", nvl_a["id"]["id"]) == nvl_a
    shown = rackflow(server, "domain", "show", "nvl-a").stdout
    assert shown.splitlines()[0].split() == ["name", "nvl-a"]
    assert f"id     {nvl_a['id']['id']}" in shown
    assert "racks  rack-01, rack-02, rack-03, rack-04" in shown
    missing = rackflow(server, "domain", "show", "nvl-none", expect=1)
    assert missing.stderr == "error: NOT_FOUND: name: no NVLink domain named 'nvl-none'\n"
    unknown_id = "00000000-0000-4000-8000-000000000000"
    missing = rackflow(server, "domain", "show", unknown_id, expect=1)
    assert missing.stderr == f"error: NOT_FOUND: id: no NVLink domain with id {unknown_id}\n"


def test_a_matcher_alertmanager_would_refuse_is_refused_at_create(server: ServerProcess) -> None:
    """Stored, `bad` made every ask of the check fail: every task held (fail closed) or let through."""
    am = (
        "check",
        "create",
        "am-bad",
        "--alertmanager",
        "http://127.0.0.1:9",
        "--matcher",
        'rack="{rack.name}"',
    )
    refused = rackflow(server, *am, "--matcher", "bad", expect=1)
    assert refused.stderr == (
        "error: INVALID_ARGUMENT: check.alertmanager.matchers[1]: 'bad' is not an Alertmanager matcher "
        '(name="value", name!="value", name=~"regex" or name!~"regex")\n'
    )
    assert "am-bad" not in rackflow(server, "check", "list").stdout
    rackflow(server, *am)
    lookahead = rackflow(
        server, "check", "update", "am-bad", "--alertmanager", "http://127.0.0.1:9",
        "--matcher", 'alertname=~"(?!Rackflow).*"', expect=1,
    )  # fmt: skip
    assert "INVALID_ARGUMENT: check.alertmanager.matchers[0]:" in lookahead.stderr
    assert "a lookahead, which Alertmanager's regexes (Go RE2) do not have" in lookahead.stderr
