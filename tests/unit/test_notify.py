"""Notification rules without a database: subscriptions, the back-off, the token bucket, redacted URLs,
and what each channel kind is sent (an Alertmanager alert and the one that clears it share their labels)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from rackflow.config import ALERT_ONE_OFF, ALERT_RESEND_ENDS_AFTER, DEFAULT_ALERT_RESEND_INTERVAL
from rackflow.domain.notifications import ChannelKind, Event, EventType, Severity, Subscription, tokens_now
from rackflow.domain.tasks import OperationKind
from rackflow.notify.delivery import retry_delay
from rackflow.notify.senders import alert, redacted_url, slack_text

AT = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
RUN = uuid.uuid4()


def _event(kind: EventType, severity: Severity, **fields: object) -> Event:
    given: dict[str, object] = {
        "at": AT,
        "summary": "x",
        "schedule_name": "fw",
        "operation": "upgrade_firmware",
        "run_id": RUN,
        **fields,
    }
    return Event(kind, severity, **given)  # type: ignore[arg-type]


def test_a_subscription_matches_type_schedule_operation_and_severity() -> None:
    halted = _event(EventType.RUN_HALTED, Severity.CRITICAL)
    cleared = _event(EventType.RUN_HALT_CLEARED, Severity.CRITICAL)
    failed = _event(EventType.TASK_FAILED, Severity.WARNING)
    assert Subscription().matches(failed)
    by_type = Subscription(event_types=(EventType.RUN_HALTED,))
    assert by_type.matches(halted) and by_type.matches(cleared) and not by_type.matches(failed)
    assert not Subscription(schedules=("other",)).matches(halted)
    assert Subscription(schedules=("fw",)).matches(halted)
    assert not Subscription(operations=(OperationKind.POWER_OFF,)).matches(halted)
    assert Subscription(operations=(OperationKind.UPGRADE_FIRMWARE,)).matches(halted)
    critical = Subscription(min_severity=Severity.CRITICAL)
    assert critical.matches(halted) and critical.matches(cleared) and not critical.matches(failed)


def test_the_back_off_doubles_to_its_cap_with_jitter() -> None:
    assert [retry_delay(n, 1.0).total_seconds() for n in (1, 2, 3)] == [2.0, 4.0, 8.0]
    assert retry_delay(30, 1.0) == timedelta(minutes=10)
    assert retry_delay(2, 0.5).total_seconds() == 2.0


def test_the_token_bucket_bursts_then_refills_at_its_rate() -> None:
    burst = timedelta(seconds=10)

    def tokens(left: float | None, seconds_later: float, rate: int = 60) -> float:
        return tokens_now(left, AT, AT + timedelta(seconds=seconds_later), rate, burst)

    assert tokens(None, 0) == 10  # never drawn from: full, ten seconds' worth at one a second
    assert tokens(0, 0.5) == 0.5
    assert tokens(0, 3) == 3
    assert tokens(0, 100) == 10
    assert tokens(0, -5) == 0  # a clock behind the last draw refills nothing
    assert tokens(None, 0, rate=1) == 1  # a slow channel still sends one at a time


def test_urls_are_shown_without_credentials() -> None:
    slack = "https://hooks.slack.com/services/T000/B000/XXXX"
    assert redacted_url(ChannelKind.SLACK, slack) == "https://hooks.slack.com/…"
    hook = "https://user:pw@hooks.example.com:8443/rackflow?token=abc"
    assert redacted_url(ChannelKind.WEBHOOK, hook) == "https://hooks.example.com:8443/rackflow"
    assert redacted_url(ChannelKind.WEBHOOK, "http://[::1]:8080/hook") == "http://[::1]:8080/hook"
    # One stored before its port was checked is shown as such, never a failed listing.
    assert redacted_url(ChannelKind.WEBHOOK, "http://example.com:99999/") == "(not a valid URL)"


def test_a_condition_alert_and_its_clearing_share_labels_and_the_clearing_ends_it() -> None:
    sent = AT + timedelta(minutes=3)  # sent late, or sent again: it ends a few intervals after the send
    fired = alert(_event(EventType.RUN_HALTED, Severity.CRITICAL), "https://rf/runs/1", now=sent)
    later = AT + timedelta(minutes=5)
    cleared = alert(_event(EventType.RUN_HALT_CLEARED, Severity.CRITICAL, at=later), "", now=later)
    assert (
        fired["labels"]
        == cleared["labels"]
        == {
            "alertname": "RackflowRunHalted",
            "severity": "critical",
            "schedule": "fw",
            "operation": "upgrade_firmware",
            "run": str(RUN),
        }
    )
    assert fired["endsAt"] == (sent + ALERT_RESEND_ENDS_AFTER * DEFAULT_ALERT_RESEND_INTERVAL).isoformat()
    assert fired["generatorURL"] == "https://rf/runs/1"
    assert cleared["endsAt"] == later.isoformat()
    one_off = alert(
        _event(EventType.TASK_FAILED, Severity.WARNING, rack_name="r1", run_id=None), "", now=sent
    )
    assert one_off["labels"]["rack"] == "r1" and "run" not in one_off["labels"]
    assert one_off["endsAt"] == (AT + ALERT_ONE_OFF).isoformat()


def test_a_slack_message_says_when_and_how_late_past_a_minute() -> None:
    at = datetime(2026, 6, 1, 4, 12, 9, 250000, tzinfo=UTC)
    event = Event(EventType.RUN_HALTED, Severity.CRITICAL, at, "rollout halted")

    def when(sent_after: timedelta) -> str:
        return slack_text(event, "", now=at + sent_after).splitlines()[-1]

    assert when(timedelta(seconds=60)) == "when: 2026-06-01T04:12:09Z"
    assert when(timedelta(seconds=61)) == "when: 2026-06-01T04:12:09Z, sent 1m1s late"
    assert when(timedelta(hours=2, seconds=0.9)) == "when: 2026-06-01T04:12:09Z, sent 2h late"
