"""docs/NOTIFICATIONS.md's examples, run: every `rackflow notify …` command parses and sends what it says
(against a fake client), and the receiver's signature check verifies what rackflow really sends (and
refuses a tampered body)."""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from rackflow.domain.notifications import Channel, ChannelKind, Event, EventType, Severity, Subscription
from rackflow.notify.senders import request_for
from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import FakeClient, fake, run
from tests.unit.test_cli_notify import a_channel

__all__ = ["fake", "run"]  # the fixtures, shared with the other CLI tests

DOC = Path(__file__).parents[2] / "docs" / "NOTIFICATIONS.md"
AT = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.S)


def _commands() -> list[list[str]]:
    """The doc's shell lines that run `rackflow notify`, continuations joined, comments dropped."""
    text = "\n".join(_blocks("sh")).replace("\\\n", " ")
    return [
        shlex.split(line, comments=True) for line in text.splitlines() if line.startswith("rackflow notify")
    ]


def test_the_doc_has_an_example_of_every_notify_command() -> None:
    used = {words[2] for words in _commands()}
    assert used == {"create", "list", "show", "update", "deliveries", "redeliver", "delete"}


@pytest.mark.parametrize("words", _commands(), ids=lambda words: " ".join(words[1:4]))
def test_every_notify_example_runs(
    words: list[str], fake: FakeClient, run: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOOK_SECRET", "0123abcd")  # as the doc's `export` line sets it
    for method in ("create_channel", "get_channel", "update_channel"):
        fake.answers[method] = a_channel()
    fake.answers["list_channels"] = pb.ListNotificationChannelsResponse(channels=[a_channel()])
    fake.answers["list_deliveries"] = pb.ListNotificationDeliveriesResponse()
    fake.answers["redeliver"] = pb.RedeliverNotificationsResponse(redelivered=1)
    result = run(*words[1:])
    assert result.exit_code == 0, f"{words}: {result.output}"
    assert fake.calls, words


def test_the_docs_signature_check_verifies_what_rackflow_sends() -> None:
    (snippet,) = _blocks("python")
    scope: dict[str, Any] = {}
    exec(snippet, scope)  # the doc's own code
    verify = scope["verify"]
    channel = Channel(
        id=uuid.uuid4(),
        name="ops-hook",
        kind=ChannelKind.WEBHOOK,
        url="https://hooks.example.com/rackflow",
        secret="0123abcd",
        enabled=True,
        subscription=Subscription(),
        rate_per_minute=60,
        max_attempts=10,
        created_at=AT,
        updated_at=AT,
    )
    event = Event(EventType.RUN_HALTED, Severity.CRITICAL, AT, "rollout halted", schedule_name="fw-nightly")
    sent = request_for(channel, event, now=datetime.now(UTC), external_url="")
    assert verify(b"0123abcd", sent.headers, sent.body)
    assert not verify(b"0123abcd", sent.headers, sent.body.replace(b"fw-nightly", b"fw-nightlx"))
    assert not verify(b"another key", sent.headers, sent.body)
    old = request_for(channel, event, now=AT, external_url="")  # a replay of a request sent long ago
    assert not verify(b"0123abcd", old.headers, old.body)
