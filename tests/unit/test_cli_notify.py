"""`rackflow notify …` against a fake client: what each command sends (the secret read from the
environment, never the command line), what it prints, and the usage errors that send nothing."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from click.testing import Result

from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import NOW, FakeClient, fake, run, stamp

__all__ = ["fake", "run"]  # the fixtures, shared with the other CLI tests

CHANNEL_ID = "5b6c7d8e-9f0a-4b1c-8d2e-3f4a5b6c7d8e"


def a_channel(**fields: object) -> pb.NotificationChannel:
    given: dict[str, object] = {
        "id": pb.UUID(id=CHANNEL_ID),
        "name": "ops",
        "kind": "webhook",
        "url": "https://hooks.example.com/rf",
        "has_secret": True,
        "event_types": ["run.halted"],
        "min_severity": "warning",
        "rate_per_minute": 60,
        "max_attempts": 10,
        "created_at": stamp(NOW),
        "updated_at": stamp(NOW),
        **fields,
    }
    return pb.NotificationChannel(**given)  # type: ignore[arg-type]


def test_create_reads_the_secret_from_the_environment(
    fake: FakeClient, run: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_SECRET", "k3y")
    fake.answers["create_channel"] = a_channel()
    result = run(
        "notify", "create", "ops", "--kind", "webhook", "--url", "https://hooks.example.com/rf",
        "--secret-env", "HOOK_SECRET", "--event", "run.halted", "--op", "upgrade-firmware",
        "--min-severity", "warning",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    [((sent,), _)] = fake.called("create_channel")
    assert (sent.name, sent.kind, sent.secret, list(sent.event_types)) == (
        "ops",
        "webhook",
        "k3y",
        ["run.halted"],
    )
    assert (list(sent.operations), sent.min_severity) == (["upgrade-firmware"], "warning")
    assert "k3y" not in result.output and "secret" in result.output and "set" in result.output


def test_create_refuses_an_unset_secret_variable_and_unknown_choices(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    result = run(
        "notify", "create", "ops", "--kind", "webhook", "--url", "https://x/", "--secret-env", "NO_SUCH_VAR_X"
    )
    assert result.exit_code == 2 and "NO_SUCH_VAR_X" in result.output
    result = run("notify", "create", "ops", "--kind", "email", "--url", "https://x/")
    assert result.exit_code == 2 and "email" in result.output
    result = run("notify", "create", "ops", "--kind", "slack", "--url", "https://x/", "--event", "run.lost")
    assert result.exit_code == 2 and "run.lost" in result.output
    for kind in ("slack", "alertmanager"):  # only a webhook is signed: the secret was stored and never used
        result = run("notify", "create", "ops", "--kind", kind, "--url", "https://x/", "--secret-env", "X")
        assert result.exit_code == 2 and "--secret-env" in result.output and "webhook" in result.output
    assert fake.called("create_channel") == []


def test_update_refuses_a_secret_for_a_channel_that_is_not_a_webhook(
    fake: FakeClient, run: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_SECRET", "k3y")
    fake.answers["get_channel"] = a_channel(kind="slack", has_secret=False)
    result = run("notify", "update", "ops", "--secret-env", "HOOK_SECRET")
    assert result.exit_code == 2 and "--secret-env" in result.output and "slack" in result.output
    assert fake.called("update_channel") == []


def test_list_show_and_json(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["list_channels"] = pb.ListNotificationChannelsResponse(
        channels=[a_channel(), a_channel(name="am", kind="alertmanager", disabled=True, event_types=[])]
    )
    result = run("notify", "list")
    assert result.exit_code == 0, result.output
    assert "2 channels" in result.output and "disabled" in result.output and "any" in result.output
    fake.answers["get_channel"] = a_channel()
    result = run("notify", "show", "ops", "-o", "json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    assert (shown["name"], shown["has_secret"], shown["secret"]) == ("ops", True, "")
    assert fake.called("get_channel") == [(("ops",), {})]


def test_update_sends_only_what_is_given(fake: FakeClient, run: Callable[..., Result]) -> None:
    fake.answers["update_channel"] = a_channel(disabled=True)
    result = run("notify", "update", "ops", "--disable", "--any-event", "--min-severity", "critical")
    assert result.exit_code == 0, result.output
    [((ref, changes, fields), _)] = fake.called("update_channel")
    assert ref == "ops" and fields == ["disabled", "event_types", "min_severity"]
    assert (changes.disabled, list(changes.event_types), changes.min_severity) == (True, [], "critical")
    for bad, message in (
        (("notify", "update", "ops"), "nothing to change"),
        (("notify", "update", "ops", "--event", "run.halted", "--any-event"), "not both"),
        (("notify", "update", "ops", "--secret-env", "X", "--no-secret"), "not both"),
    ):
        result = run(*bad)
        assert result.exit_code == 2 and message in result.output
    assert len(fake.called("update_channel")) == 1


def test_delete_deliveries_and_redeliver(fake: FakeClient, run: Callable[..., Result]) -> None:
    result = run("notify", "delete", "ops")
    assert result.exit_code == 0 and "deleted notification channel ops" in result.output
    event = pb.NotificationEvent(type="task.failed", summary="task failed", rack="r1", at=stamp(NOW))
    dead = pb.NotificationDelivery(
        id=pb.UUID(id=CHANNEL_ID),
        channel="ops",
        state="dead",
        attempts=10,
        event=event,
        last_error="HTTP 500",
    )
    fake.answers["list_deliveries"] = pb.ListNotificationDeliveriesResponse(deliveries=[dead])
    result = run("notify", "deliveries", "--state", "dead", "--channel", "ops")
    assert result.exit_code == 0, result.output
    assert "HTTP 500" in result.output and "task.failed" in result.output
    assert fake.called("list_deliveries") == [((), {"states": ("dead",), "channel": "ops", "limit": 0})]
    fake.answers["redeliver"] = pb.RedeliverNotificationsResponse(redelivered=3)
    result = run("notify", "redeliver", "--channel", "ops", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"redelivered": 3}
    assert fake.called("redeliver") == [(((), "ops"), {})]
