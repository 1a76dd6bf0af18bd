"""`rackflow check …` and `rackflow task override-checks` over a fake client: what each sends, the usage
errors, and what it shows."""

from __future__ import annotations

import json
from collections.abc import Callable

from click.testing import Result

from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import TASK_ID, FakeClient, a_task, fake, run

__all__ = ["fake", "run"]  # the fixtures, shared with test_cli_commands


def a_check() -> pb.PreflightCheck:
    return pb.PreflightCheck(
        id=pb.UUID(id="1d2c3b4a-5e6f-4a7b-8c9d-0e1f2a3b4c5d"),
        name="no-alerts",
        operations=["upgrade_firmware"],
        racks=[pb.WindowTarget(name="rack-01")],
        alertmanager=pb.AlertmanagerCheck(
            url="http://am:9093", matchers=['rack="{rack.name}"'], fail_closed=True
        ),
        interval="30s",
        max_wait="1h",
    )


def test_check_create_sends_the_kind_and_what_it_applies_to(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["create_check"] = a_check()
    result = run(
        "check", "create", "no-alerts", "--alertmanager", "http://am:9093", "--matcher", 'rack="{rack.name}"',
        "--op", "upgrade-firmware", "--rack", "rack-01", "--domain", "nvl-a", "--max-wait", "2h",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [((sent,), _)] = fake.called("create_check")
    assert sent.name == "no-alerts" and list(sent.operations) == ["upgrade_firmware"]
    assert (sent.alertmanager.url, list(sent.alertmanager.matchers)) == (
        "http://am:9093",
        ['rack="{rack.name}"'],
    )
    assert sent.alertmanager.fail_closed and sent.max_wait == "2h" and sent.interval == ""
    assert [t.name for t in sent.racks] == ["rack-01"] and [t.name for t in sent.nvl_domains] == ["nvl-a"]
    assert "alertmanager http://am:9093" in result.output

    fake.answers["create_check"] = a_check()
    run("check", "create", "drained", "--webhook", "http://h/drain", "--secret", "env:KEY", "--timeout", "5s")
    run("check", "create", "idle", "--rack-idle", "--busy", "power-reset", "--failed-within", "1h")
    (_, (hook,), _), (_, (idle,), _) = [c for c in fake.calls if c[0] == "create_check"][1:]
    assert (hook.webhook.url, hook.webhook.secret, hook.webhook.timeout) == (
        "http://h/drain",
        "env:KEY",
        "5s",
    )
    assert (list(idle.rack_idle.busy_operations), idle.rack_idle.failed_within) == (["power_reset"], "1h")


def test_check_create_needs_exactly_one_kind(fake: FakeClient, run: Callable[..., Result]) -> None:
    for args in (
        ("check", "create", "x"),
        ("check", "create", "x", "--webhook", "http://h", "--rack-idle"),
    ):
        result = run(*args)
        assert (
            result.exit_code == 2 and "give one of --alertmanager, --webhook or --rack-idle" in result.output
        )
    assert fake.called("create_check") == []


def test_check_list_show_update_and_delete(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_checks"] = pb.ListPreflightChecksResponse(checks=[a_check()])
    result = run("check", "list")
    assert result.exit_code == 0 and "1 check\n" in result.output and "no-alerts" in result.output
    fake.answers["get_check"] = a_check()
    result = run("check", "show", "no-alerts", "-o", "json")
    assert json.loads(result.output)["alertmanager"]["url"] == "http://am:9093"
    fake.answers["update_check"] = a_check()
    result = run("check", "update", "no-alerts", "--interval", "1m", "--all-racks")
    assert result.exit_code == 0, result.output
    [((ref, message, paths), _)] = fake.called("update_check")
    assert (ref, message.interval) == ("no-alerts", "1m")
    assert paths == ["check.racks", "check.nvl_domains", "check.interval"]
    assert run("check", "update", "no-alerts").exit_code == 2
    result = run("check", "delete", "no-alerts")
    assert (
        fake.called("delete_check") == [(("no-alerts",), {})] and "deleted check no-alerts" in result.output
    )


def test_a_check_or_window_whose_racks_were_deleted_says_it_covers_no_rack(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """Both lists empty read "all racks": a check or window that named racks, all deleted since, covers
    none, and says so (`covers_no_rack`), as the console does."""
    fake.answers["get_check"] = pb.PreflightCheck(name="drained", covers_no_rack=True)
    shown = run("check", "show", "drained")
    assert shown.exit_code == 0, shown.output
    assert "no rack (its racks were deleted)" in shown.output and "all racks" not in shown.output
    fake.answers["get_check"] = pb.PreflightCheck(name="drained")
    assert "all racks" in run("check", "show", "drained").output
    fake.answers["get_window"] = pb.MaintenanceWindow(name="launch", covers_no_rack=True)
    shown = run("window", "show", "launch")
    assert shown.exit_code == 0, shown.output
    assert "no rack (its racks were deleted)" in shown.output


def test_an_alertmanager_check_with_no_matcher_is_marked_and_warned_of_by_list_and_show(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """A check stored before a matcher was required holds every task it applies to on any alert: `check
    list` and `check show` mark it and warn, on stderr, that it matches every alert and would be refused
    today (also under -o json, whose stdout stays the message); a check with a matcher is neither."""
    every = a_check()
    every.name = "every-alert"
    del every.alertmanager.matchers[:]
    fake.answers["list_checks"] = pb.ListPreflightChecksResponse(checks=[a_check(), every])
    listed = run("check", "list")
    assert listed.exit_code == 0, listed.output
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[2:]}
    assert "matches every alert" in rows["every-alert"] and "matches every alert" not in rows["no-alerts"]
    warning = " ".join(listed.stderr.split())
    assert warning.startswith("warning: pre-flight check 'every-alert' matches every alert. No matcher:")
    assert "would be refused today" in warning and 'alertname=~".+"' in warning
    assert "no-alerts" not in listed.stderr

    fake.answers["get_check"] = every
    shown = run("check", "show", "every-alert")
    assert shown.exit_code == 0, shown.output
    assert "matches every alert" in shown.stdout and " ".join(shown.stderr.split()) == warning
    as_json = run("check", "show", "every-alert", "-o", "json")
    assert json.loads(as_json.stdout)["alertmanager"]["matchers"] == []
    assert " ".join(as_json.stderr.split()) == warning
    fake.answers["get_check"] = a_check()
    fine = run("check", "show", "no-alerts")
    assert fine.stderr == "" and "matches every alert" not in fine.stdout


def test_task_override_checks_sends_the_reason_and_shows_the_task(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    task = a_task(pb.TASK_STATUS_PENDING)
    task.held_by = "preflight"
    task.held_reason = "pre-flight checks overridden: INC-7"
    fake.answers["override_checks"] = task
    result = run("task", "override-checks", TASK_ID, "--reason", "INC-7")
    assert result.exit_code == 0, result.output
    assert fake.called("override_checks") == [((TASK_ID, "INC-7", ()), {})]
    assert (
        run("task", "override-checks", TASK_ID, "--reason", "x", "--check", "a", "--check", "b").exit_code
        == 0
    )
    assert fake.called("override_checks")[1] == ((TASK_ID, "x", ("a", "b")), {})
    assert "pre-flight checks overridden: INC-7" in " ".join(result.output.split())
    assert run("task", "override-checks", TASK_ID).exit_code == 2  # --reason is required


def test_a_kinds_setting_without_its_kind_is_a_usage_error_not_dropped(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """`check update drained --max-wait 4h --timeout 30s` changed the maximum wait and dropped the timeout
    without a word; `check update no-alerts --matcher …` said only "nothing to change"; `--busy` given to an
    alertmanager check was dropped. A kind's setting needs its kind's option (which replaces all its
    settings), and names it."""
    fake.answers["update_check"] = fake.answers["create_check"] = a_check()
    for args, kind in (
        (("check", "update", "drained", "--max-wait", "4h", "--timeout", "30s"), "--webhook"),
        (("check", "update", "no-alerts", "--matcher", 'alertname!~"Rackflow.*"'), "--alertmanager"),
        (("check", "update", "no-alerts", "--fail-open"), "--alertmanager"),
        (("check", "update", "idle", "--failed-within", "2h"), "--rack-idle"),
        (
            ("check", "create", "x", "--alertmanager", "http://am:9093", "--busy", "power-reset"),
            "--rack-idle",
        ),
        (("check", "create", "x", "--webhook", "http://h", "--matcher", 'rack="r"'), "--alertmanager"),
    ):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        assert kind in result.output, (args, result.output)
    assert fake.called("update_check") == fake.called("create_check") == []
