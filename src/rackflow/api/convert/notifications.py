"""Notification messages to domain values and back. Shape is checked here (ids, operation and state
names); meaning (a known kind, an http URL, bounds) is the service's. A secret never goes back out."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.message import Message

from rackflow.api.convert import timestamp_to, uuid_to
from rackflow.api.convert.windows import operations_from
from rackflow.domain.notifications import ChannelKind, Delivery, DeliveryState, Event
from rackflow.notify.senders import redacted_url
from rackflow.notify.service import ChannelInput, ChannelView
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import enum_values

REDACTED = "(redacted)"


def channel_from(msg: pb.NotificationChannel, field: str = "channel") -> ChannelInput:
    return ChannelInput(
        name=msg.name,
        kind=msg.kind,
        url=msg.url,
        secret=msg.secret,
        disabled=msg.disabled,
        event_types=tuple(msg.event_types),
        schedules=tuple(msg.schedules),
        operations=operations_from(msg.operations, f"{field}.operations"),
        min_severity=msg.min_severity,
        rate_per_minute=msg.rate_per_minute,
        max_attempts=msg.max_attempts,
    )


def channel_to(shown: ChannelView) -> pb.NotificationChannel:
    channel, sub = shown.channel, shown.channel.subscription
    return pb.NotificationChannel(
        id=uuid_to(channel.id),
        name=channel.name,
        kind=channel.kind.value,
        url=shown.url,
        has_secret=shown.has_secret,
        disabled=not channel.enabled,
        event_types=[t.value for t in sub.event_types],
        schedules=list(sub.schedules),
        operations=[op.value for op in sub.operations],
        min_severity=sub.min_severity.value,
        rate_per_minute=channel.rate_per_minute,
        max_attempts=channel.max_attempts,
        created_at=timestamp_to(channel.created_at),
        updated_at=timestamp_to(channel.updated_at),
    )


def states_from(names: Sequence[str], field: str = "states") -> tuple[DeliveryState, ...]:
    return enum_values(DeliveryState, names, field, "state")


def event_to(event: Event) -> pb.NotificationEvent:
    return pb.NotificationEvent(
        id=uuid_to(event.id),
        type=event.type.value,
        severity=event.severity.value,
        at=timestamp_to(event.at),
        summary=event.summary,
        reason=event.reason,
        schedule_id=uuid_to(event.schedule_id),
        schedule=event.schedule_name,
        run_id=uuid_to(event.run_id),
        rack_id=uuid_to(event.rack_id),
        rack=event.rack_name,
        task_id=uuid_to(event.task_id),
        operation=event.operation,
        principal=event.principal,
    )


def delivery_to(delivery: Delivery) -> pb.NotificationDelivery:
    return pb.NotificationDelivery(
        id=uuid_to(delivery.id),
        event=event_to(delivery.event),
        channel_id=uuid_to(delivery.channel_id),
        channel=delivery.channel_name,
        state=delivery.state.value,
        attempts=delivery.attempts,
        next_attempt_at=timestamp_to(delivery.next_attempt_at)
        if delivery.state is DeliveryState.PENDING
        else None,
        last_error=delivery.last_error,
        delivered_at=timestamp_to(delivery.delivered_at),
    )


def without_secrets(request: Message) -> Message:
    """The request as the audit trail records it: a channel's secret replaced by "(redacted)" and its URL
    shown as the API shows it (a Slack URL is a credential); any other request as it is."""
    channel = getattr(request, "channel", None)
    if not isinstance(channel, pb.NotificationChannel):
        return request
    copy = type(request)()
    copy.CopyFrom(request)
    kept: pb.NotificationChannel = copy.channel  # type: ignore[attr-defined]
    if kept.secret:
        kept.secret = REDACTED
    if kept.url:
        try:
            kind = ChannelKind(kept.kind)
        except ValueError:
            kind = ChannelKind.SLACK  # unknown (an update names none): hide the path, to be safe
        kept.url = redacted_url(kind, kept.url)
    return copy
