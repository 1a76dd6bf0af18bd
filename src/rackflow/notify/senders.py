"""What a channel receives for an event, by kind, and the HTTP POST that sends it (docs/NOTIFICATIONS.md).

* webhook: the event as JSON, signed: `X-Rackflow-Signature: sha256=<hex>`, the HMAC-SHA256 with the
  channel's secret of `<X-Rackflow-Timestamp>.<body>`, so a receiver can check it and refuse old replays;
* slack: an incoming webhook's `{"text": …}`: what, where, why, when (and how late, when sent well after
  it happened), and a link to the run's page;
* alertmanager: one alert for `POST /api/v2/alerts`, labelled alertname, schedule, rack, severity (and
  run or task); the event that clears a condition sends the same labels with `endsAt` now. An open
  condition's alert is sent again every resend interval (`resend_request`, `rackflow.notify.delivery`).

Every request carries the event id as its idempotency key (`Idempotency-Key`, `X-Rackflow-Event-Id`):
delivery is at least once, and a receiver that remembers ids sees each event once.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from rackflow.config import ALERT_ONE_OFF, ALERT_RESEND_ENDS_AFTER, DEFAULT_ALERT_RESEND_INTERVAL, host_port
from rackflow.domain.notifications import CLEARS, Channel, ChannelKind, Event, EventType
from rackflow.http_answers import NO_REDIRECTS, not_followed, read_within
from rackflow.timespec import format_go_duration, format_rfc3339

USER_AGENT = "rackflow-notify"
ALERTS_PATH = "/api/v2/alerts"
# How much of a receiver's answer a failed delivery keeps as its error, and how much of a 2xx answer is read
# (the rest is not waited for).
ERROR_BODY_CHARS = 200
ANSWER_BYTES = 64 * 1024

ALERT_NAMES: Mapping[EventType, str] = {
    EventType.RUN_COMPLETED_WITH_FAILURES: "RackflowRunCompletedWithFailures",
    EventType.RUN_HALTED: "RackflowRunHalted",
    EventType.RUN_CANCELLED: "RackflowRunCancelled",
    EventType.RUN_MISSED: "RackflowRunMissed",
    EventType.ROLLOUT_FINISHED: "RackflowRolloutFinished",
    EventType.TASK_FAILED: "RackflowTaskFailed",
    EventType.SCHEDULE_PAUSED: "RackflowSchedulePaused",
    EventType.TASK_HELD_TOO_LONG: "RackflowTaskHeldTooLong",
    EventType.RUN_AWAITING_APPROVAL: "RackflowRunAwaitingApproval",
}
# A Slack message sent this much later than its event happened (a retry after its back-off, a receiver that
# was down) says how late it is: without it, a halt sent after its clearing reads as a new halt.
SLACK_LATE = timedelta(minutes=1)
SLACK_ICONS: Mapping[str, str] = {
    "info": ":information_source:",
    "warning": ":warning:",
    "critical": ":rotating_light:",
}


@dataclass(frozen=True)
class Request:
    url: str
    headers: Mapping[str, str]
    body: bytes


class SendFailed(Exception):
    """The receiver could not be reached, or did not answer 2xx; the message says which, never the URL."""


def redacted_url(kind: ChannelKind, url: str) -> str:
    """The URL as the API shows it: no user, password or query; a Slack URL (whose path is its credential)
    without its path either."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:  # a URL stored before its port was checked: shown, never a failed listing
        return "(not a valid URL)"
    netloc = host_port(host, port)
    path = "/…" if kind is ChannelKind.SLACK and parts.path not in ("", "/") else parts.path
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def run_link(external_url: str, event: Event) -> str:
    """The page of the event's run on the dashboard (`--external-url`), or empty."""
    if not external_url or event.run_id is None:
        return ""
    return f"{external_url.rstrip('/')}/runs/{event.run_id}"


def request_for(
    channel: Channel,
    event: Event,
    *,
    now: datetime,
    external_url: str,
    current: Event | None = None,
    resend: timedelta = DEFAULT_ALERT_RESEND_INTERVAL,
) -> Request:
    """The request that delivers `event` to `channel`. An Alertmanager's alert is made from `current`, the
    latest event of the event's condition (`outbox.conditions_now`; the event itself when not given): it
    keeps the last alert sent for its labels, so a halt retried after its clearing sends the resolved
    alert again rather than firing on. The headers name `event` in any case."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Idempotency-Key": str(event.id),
        "X-Rackflow-Event-Id": str(event.id),
    }
    link = run_link(external_url, event)
    if channel.kind is ChannelKind.WEBHOOK:
        body = _json({**event.to_json(), "link": link})
        timestamp = str(int(now.timestamp()))
        headers["X-Rackflow-Timestamp"] = timestamp
        if channel.secret:
            headers["X-Rackflow-Signature"] = "sha256=" + sign(channel.secret, timestamp, body)
        return Request(channel.url, headers, body)
    if channel.kind is ChannelKind.SLACK:
        return Request(channel.url, headers, _json({"text": slack_text(event, link, now=now)}))
    state = current or event
    url = channel.url.rstrip("/") + ALERTS_PATH
    return Request(url, headers, _json([alert(state, run_link(external_url, state), now=now, resend=resend)]))


def resend_request(
    channel: Channel, events: Sequence[Event], *, now: datetime, external_url: str, resend: timedelta
) -> Request:
    """One POST to an Alertmanager of the firing alerts of open conditions (`events`, each its condition's
    latest), sent again as Prometheus re-sends its own: one request for them all, so the re-sends of many
    open conditions cost the channel one send an interval, whatever their number."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    alerts = [alert(event, run_link(external_url, event), now=now, resend=resend) for event in events]
    return Request(channel.url.rstrip("/") + ALERTS_PATH, headers, _json(alerts))


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """The webhook signature: hex HMAC-SHA256 of `<timestamp>.<body>` keyed with the channel's secret."""
    return hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def slack_text(event: Event, link: str, *, now: datetime) -> str:
    """What (the summary), where (schedule, rack, operation), why (the reason), when (the event's time, in
    whole seconds; and how late, sent at `now` more than SLACK_LATE after it), and the run's page."""
    where = ", ".join(
        f"{label} `{value}`"
        for label, value in (
            ("schedule", event.schedule_name),
            ("rack", event.rack_name),
            ("operation", event.operation),
        )
        if value
    )
    lines = [f"{SLACK_ICONS[event.severity.value]} *{event.summary}*"]
    if where:
        lines.append(f"where: {where}")
    if event.reason:
        lines.append(f"why: {event.reason}")
    when = f"when: {format_rfc3339(event.at.replace(microsecond=0))}"
    late = now - event.at
    if late > SLACK_LATE:
        when += f", sent {format_go_duration(timedelta(seconds=int(late.total_seconds())))} late"
    lines.append(when)
    if link:
        lines.append(f"<{link}|open the run>")
    return "\n".join(lines)


def alert(
    event: Event, link: str, *, now: datetime, resend: timedelta = DEFAULT_ALERT_RESEND_INTERVAL
) -> dict[str, Any]:
    """The Alertmanager alert of an event, sent at `now`. A condition's alert ends ALERT_RESEND_ENDS_AFTER
    resend intervals from `now`: it is sent again each interval while open, so it fires on, and resolves
    by itself a few intervals after the sends stop (its clearing lost, rackflow gone). Its clearing ends it
    (the same labels, `endsAt` the clearing's time). A one-off's alert ends ALERT_ONE_OFF after the event."""
    condition = CLEARS.get(event.type, event.type)
    labels = {
        "alertname": ALERT_NAMES[condition],
        "severity": event.severity.value,
        "schedule": event.schedule_name,
        "rack": event.rack_name,
        "operation": event.operation,
    }
    if condition.value.startswith("run."):
        labels["run"] = str(event.run_id) if event.run_id else ""
    if condition.value.startswith("task."):
        labels["task"] = str(event.task_id) if event.task_id else ""
    if event.type in CLEARS:
        ends = event.at
    elif event.type in CLEARS.values():
        ends = now + ALERT_RESEND_ENDS_AFTER * resend
    else:
        ends = event.at + ALERT_ONE_OFF
    found = {
        "labels": {k: v for k, v in labels.items() if v},
        "annotations": {"summary": event.summary, "description": event.reason, "event_id": str(event.id)},
        "startsAt": event.at.isoformat(),
        "endsAt": ends.isoformat(),
    }
    if link:
        found["generatorURL"] = link
    return found


def _without_userinfo(url: str, headers: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The URL without a `user:password@` part, which urllib cannot send (it reads the password as a
    port), and the headers with the HTTP Basic authorization that carries them instead."""
    parts = urlsplit(url)
    if parts.username is None:
        return url, dict(headers)
    netloc = host_port(parts.hostname or "", parts.port)
    user_and_password = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    basic = base64.b64encode(user_and_password.encode()).decode()
    return urlunsplit(parts._replace(netloc=netloc)), {**headers, "Authorization": f"Basic {basic}"}


def post(request: Request, timeout: float) -> None:
    """POST the request (blocking: run it on a thread); raises `SendFailed` unless the receiver answers 2xx,
    whatever went wrong, with a message that never holds the URL (it may hold credentials). `timeout`
    bounds each socket operation (the caller bounds the whole)."""
    url, headers = _without_userinfo(request.url, request.headers)
    posted = urllib.request.Request(url, data=request.body, headers=headers, method="POST")
    deadline = time.monotonic() + timeout
    try:
        with NO_REDIRECTS.open(posted, timeout=timeout) as answer:
            read_within(answer, deadline, ANSWER_BYTES)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            raise SendFailed(not_followed(exc.code)) from None
        text = exc.read(ERROR_BODY_CHARS).decode(errors="replace").strip()
        raise SendFailed(f"HTTP {exc.code}" + (f": {text}" if text else "")) from None
    except urllib.error.URLError as exc:
        raise SendFailed(f"unreachable: {exc.reason}") from None
    except (http.client.InvalidURL, ValueError) as exc:  # their messages quote the URL
        raise SendFailed(f"invalid URL ({type(exc).__name__})") from None
    except http.client.HTTPException as exc:  # a status line or body that is not HTTP
        raise SendFailed(f"the answer was not HTTP ({type(exc).__name__})") from None
    except TimeoutError as exc:
        raise SendFailed(str(exc)) from None
    except OSError as exc:
        raise SendFailed(f"unreachable: {exc}") from None
