"""Notification values: the events rackflow reports (docs/NOTIFICATIONS.md), the channels they go to, and
what a channel subscribes to.

An event is written to the outbox in the transaction of the change it reports (`store.outbox`), so none is
lost and none is invented by a rolled-back change; the delivery loop (`rackflow.notify`) fans it out to
the channels whose subscription matches and delivers it at least once.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from rackflow.domain.audit import SYSTEM_PRINCIPAL
from rackflow.domain.tasks import OperationKind
from rackflow.ids import new_id


class EventType(enum.StrEnum):
    """What happened. The value is the wire and stored name."""

    RUN_COMPLETED_WITH_FAILURES = "run.completed_with_failures"
    # A dispatched firing found past its schedule's start deadline: nothing was submitted.
    RUN_MISSED = "run.missed"
    RUN_HALTED = "run.halted"
    # A halted run was resumed or cancelled: the halt's condition has cleared.
    RUN_HALT_CLEARED = "run.halt_cleared"
    # rackflow cancelled a rollout that still had racks to start at its firmware window's end (nothing could
    # resume it); an operator's cancel is not notified.
    RUN_CANCELLED = "run.cancelled"
    ROLLOUT_FINISHED = "rollout.finished"
    TASK_FAILED = "task.failed"
    # By rackflow itself: a rollout's halt or cancel at its firmware window's end, pause_after_failed_runs
    # or a firing past its firmware window paused the schedule, or kept it paused at its pause's end (the
    # window ends first); resumed: an operator's pause reached its end.
    SCHEDULE_PAUSED = "schedule.paused"
    SCHEDULE_RESUMED = "schedule.resumed"
    # A start gate (a freeze, a budget, a pre-flight check) has held a task longer than the threshold
    # (--notification-hold-threshold), and the end of that hold: the task started, ended, or another gate
    # holds it now (`rackflow.notify.holds`).
    TASK_HELD_TOO_LONG = "task.held_too_long"
    TASK_HOLD_CLEARED = "task.hold_cleared"
    # A firing waits for approval (docs/SAFETY.md); it ends approved, rejected or expired.
    RUN_AWAITING_APPROVAL = "run.awaiting_approval"
    RUN_APPROVED = "run.approved"
    RUN_REJECTED = "run.rejected"
    RUN_EXPIRED = "run.expired"


# The event that ends the condition another one reported: Alertmanager gets the alert again with `endsAt`,
# and a subscription to the condition receives its clearing too.
CLEARS: Mapping[EventType, EventType] = {
    EventType.RUN_HALT_CLEARED: EventType.RUN_HALTED,
    EventType.SCHEDULE_RESUMED: EventType.SCHEDULE_PAUSED,
    EventType.TASK_HOLD_CLEARED: EventType.TASK_HELD_TOO_LONG,
    EventType.RUN_APPROVED: EventType.RUN_AWAITING_APPROVAL,
    EventType.RUN_REJECTED: EventType.RUN_AWAITING_APPROVAL,
    EventType.RUN_EXPIRED: EventType.RUN_AWAITING_APPROVAL,
}


# What names one instance of a condition (the field its raising and clearing events share, and its alert's
# labels): the run that halted or awaits approval, the paused schedule, the held task.
CONDITION_SUBJECT: Mapping[EventType, str] = {
    EventType.RUN_HALTED: "run_id",
    EventType.SCHEDULE_PAUSED: "schedule_id",
    EventType.TASK_HELD_TOO_LONG: "task_id",
    EventType.RUN_AWAITING_APPROVAL: "run_id",
}


def condition_of(event_type: EventType) -> EventType | None:
    """The condition an event raises or clears (`run.halted` for itself and `run.halt_cleared`); None for a
    one-off event."""
    condition = CLEARS.get(event_type, event_type)
    return condition if condition in CONDITION_SUBJECT else None


def condition_types(condition: EventType) -> tuple[EventType, ...]:
    """The condition's type and the types of the events that clear it."""
    return (condition, *(t for t, cleared in CLEARS.items() if cleared is condition))


class Severity(enum.StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return list(Severity).index(self)


# Each type's severity; a clearing has the severity of what it clears (the same Alertmanager labels, and
# it reaches whoever received the condition).
SEVERITY: Mapping[EventType, Severity] = {
    EventType.RUN_COMPLETED_WITH_FAILURES: Severity.WARNING,
    EventType.RUN_MISSED: Severity.WARNING,
    EventType.RUN_HALTED: Severity.CRITICAL,
    EventType.RUN_HALT_CLEARED: Severity.CRITICAL,
    EventType.RUN_CANCELLED: Severity.WARNING,
    EventType.ROLLOUT_FINISHED: Severity.INFO,
    EventType.TASK_FAILED: Severity.WARNING,
    EventType.SCHEDULE_PAUSED: Severity.WARNING,
    EventType.SCHEDULE_RESUMED: Severity.WARNING,
    EventType.TASK_HELD_TOO_LONG: Severity.WARNING,
    EventType.TASK_HOLD_CLEARED: Severity.WARNING,
    EventType.RUN_AWAITING_APPROVAL: Severity.WARNING,
    EventType.RUN_APPROVED: Severity.WARNING,
    EventType.RUN_REJECTED: Severity.WARNING,
    EventType.RUN_EXPIRED: Severity.WARNING,
}


class ChannelKind(enum.StrEnum):
    WEBHOOK = "webhook"  # generic JSON, signed (X-Rackflow-Signature)
    SLACK = "slack"  # a Slack incoming webhook's message format
    ALERTMANAGER = "alertmanager"  # Alertmanager's POST /api/v2/alerts


def takes_secret(kind: ChannelKind) -> bool:
    """Whether a channel of `kind` has a secret: a webhook's HMAC key signs its requests; Slack's URL is its
    own credential and Alertmanager's requests are not signed, so a secret given them would be stored and
    never used (refused: the operator would believe the receiver checks it)."""
    return kind is ChannelKind.WEBHOOK


class DeliveryState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"  # gave up after the channel's attempts; `rackflow notify redeliver` tries again


@dataclass(frozen=True)
class Event:
    """One thing that happened, as the outbox keeps it.

    The constructors name the ids they know; `store.outbox.record_events` fills in the rest from the rows
    they name (a task's rack, schedule and run; the schedule's name and operation; the rack's name), so a
    channel can filter on names and show them even after those rows are gone.
    """

    type: EventType
    severity: Severity
    at: datetime
    summary: str  # what happened, one line
    reason: str = ""  # why, when rackflow knows
    schedule_id: uuid.UUID | None = None
    run_id: uuid.UUID | None = None
    rack_id: uuid.UUID | None = None
    task_id: uuid.UUID | None = None
    principal: str = SYSTEM_PRINCIPAL
    payload: Mapping[str, Any] = field(default_factory=dict)
    schedule_name: str = ""
    rack_name: str = ""
    operation: str = ""
    id: uuid.UUID = field(default_factory=new_id)
    # What a loop found, named (`task.held_too_long`: the task, its gate, since when): the outbox holds one
    # event per key, however many instances found it. Empty for the events write sites record.
    key: str = ""

    def to_json(self) -> dict[str, Any]:
        """The event as a webhook receives it (and `notify` shows it)."""
        ids = {"schedule_id": self.schedule_id, "run_id": self.run_id, "rack_id": self.rack_id}
        return {
            "id": str(self.id),
            "type": self.type.value,
            "severity": self.severity.value,
            "at": self.at.isoformat(),
            "summary": self.summary,
            "reason": self.reason,
            **{k: str(v) if v is not None else None for k, v in ids.items()},
            "task_id": str(self.task_id) if self.task_id else None,
            "schedule": self.schedule_name,
            "rack": self.rack_name,
            "operation": self.operation,
            "principal": self.principal,
            "payload": dict(self.payload),
        }


@dataclass(frozen=True)
class Subscription:
    """Which events a channel receives: every filter that is set must match (an empty one matches all).

    `event_types` also admits the clearing of each type it names (`CLEARS`); `schedules` are schedule names.
    """

    event_types: tuple[EventType, ...] = ()
    schedules: tuple[str, ...] = ()
    operations: tuple[OperationKind, ...] = ()
    min_severity: Severity = Severity.INFO

    def matches(self, event: Event) -> bool:
        if self.event_types and event.type not in self.event_types:
            cleared = CLEARS.get(event.type)
            if cleared is None or cleared not in self.event_types:
                return False
        if self.schedules and event.schedule_name not in self.schedules:
            return False
        if self.operations and event.operation not in {op.value for op in self.operations}:
            return False
        return event.severity.rank >= self.min_severity.rank


@dataclass(frozen=True)
class Channel:
    """Where notifications go. `secret` (a webhook's HMAC key) is write-only: the API never returns it, and
    a Slack URL, which is a credential itself, is returned without its path (`redacted_url`)."""

    id: uuid.UUID
    name: str
    kind: ChannelKind
    url: str
    secret: str = field(repr=False)
    enabled: bool
    subscription: Subscription
    # Deliveries this channel gets per minute, from all instances together (`tokens_now`); more wait.
    rate_per_minute: int
    max_attempts: int
    created_at: datetime
    updated_at: datetime


def tokens_now(
    tokens: float | None, at: datetime | None, now: datetime, rate_per_minute: int, burst: timedelta
) -> float:
    """A channel's token bucket at `now`: `tokens` left at `at` (None: never drawn from, full), refilled at
    `rate_per_minute`, holding at most `burst`'s worth (at least one send). One token, one send."""
    capacity = max(1.0, rate_per_minute / 60 * burst.total_seconds())
    if tokens is None or at is None:
        return capacity
    return min(capacity, tokens + max(0.0, (now - at).total_seconds()) * rate_per_minute / 60)


@dataclass(frozen=True)
class Delivery:
    """One event's delivery to one channel, as `rackflow notify` lists it."""

    id: uuid.UUID
    event: Event
    channel_id: uuid.UUID
    channel_name: str
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime | None
    last_error: str
    delivered_at: datetime | None
