"""Notification channel use cases (the `NotificationChannel` RPCs, `rackflow notify`). Each change is one
transaction, validated first with the request's field named (`channel.url`, `channel.event_types[1]`), so a
refused request writes nothing. Secrets go in and never come out: `ChannelView` is what callers see.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from rackflow.clock import Clock
from rackflow.config import DEFAULT_NOTIFY_MAX_ATTEMPTS, DEFAULT_NOTIFY_RATE_PER_MINUTE
from rackflow.domain.notifications import (
    Channel,
    ChannelKind,
    Delivery,
    DeliveryState,
    EventType,
    Severity,
    Subscription,
    takes_secret,
)
from rackflow.domain.tasks import OperationKind
from rackflow.errors import AlreadyExists, InvalidArgument, NotFound
from rackflow.ids import new_id
from rackflow.notify.senders import redacted_url
from rackflow.store import outbox as store
from rackflow.store.db import Database, unique_violation_as
from rackflow.validation import (
    at_most,
    check_mask,
    check_name,
    check_rename,
    check_text,
    distinct_operations,
    enum_values,
    has_control_characters,
    http_url,
)

FIELD = "channel"
UPDATE_PATHS = tuple(
    f"{FIELD}.{name}"
    for name in (
        "name",
        "url",
        "secret",
        "disabled",
        "event_types",
        "schedules",
        "operations",
        "min_severity",
        "rate_per_minute",
        "max_attempts",
    )
)
MAX_ATTEMPTS_LIMIT = 100
MAX_RATE_PER_MINUTE = 6000
DELIVERIES_SHOWN = 100
MAX_DELIVERIES_SHOWN = 1000
MAX_URL_LENGTH = 2048  # the column's
MAX_SECRET_LENGTH = 1024
# What a channel's subscription lists may hold: each is matched against every event (a repeated event type
# is kept once, and an operation may be named once). A channel for more schedules subscribes to all of them
# (an empty list), as RedeliverNotifications takes at most a listing's worth of ids.
MAX_CHANNEL_EVENT_TYPES = 100
MAX_CHANNEL_SCHEDULES = 1000


@dataclass(frozen=True)
class ChannelInput:
    """A channel as a request gives it (create, or the masked fields of an update). Zero rate or attempts:
    the defaults."""

    name: str = ""
    kind: str = ""
    url: str = ""
    secret: str = ""
    disabled: bool = False
    event_types: tuple[str, ...] = ()
    schedules: tuple[str, ...] = ()
    operations: tuple[OperationKind, ...] = ()
    min_severity: str = ""
    rate_per_minute: int = 0
    max_attempts: int = 0


@dataclass(frozen=True)
class ChannelView:
    """A channel as the API returns it: the URL redacted (`senders.redacted_url`), whether it has a
    secret, never the secret."""

    channel: Channel
    url: str
    has_secret: bool


def view(channel: Channel) -> ChannelView:
    return ChannelView(channel, redacted_url(channel.kind, channel.url), bool(channel.secret))


def _kind(value: str) -> ChannelKind:
    try:
        return ChannelKind(value)
    except ValueError:
        kinds = ", ".join(k.value for k in ChannelKind)
        raise InvalidArgument(f"{FIELD}.kind: must be one of {kinds}, got {value!r}") from None


def _secret(value: str, kind: ChannelKind) -> str:
    """A webhook's HMAC key; a refusal never quotes it. Another kind takes none (`takes_secret`); an empty
    one removes what such a channel stored before this was checked."""
    if value and not takes_secret(kind):
        raise InvalidArgument(
            f"{FIELD}.secret: only a webhook channel is signed with a secret; a {kind.value} channel has none"
        )
    if len(value) > MAX_SECRET_LENGTH:
        raise InvalidArgument(f"{FIELD}.secret: at most {MAX_SECRET_LENGTH} characters, got {len(value)}")
    if has_control_characters(value):
        raise InvalidArgument(f"{FIELD}.secret: must not hold control characters")
    return value


def _url(value: str) -> str:
    if len(value) > MAX_URL_LENGTH:
        raise InvalidArgument(f"{FIELD}.url: at most {MAX_URL_LENGTH} characters, got {len(value)}")
    if http_url(value) is None:
        raise InvalidArgument(f"{FIELD}.url: must be an http:// or https:// URL, got {redacted(value)!r}")
    return value


def redacted(url: str) -> str:
    """A refused URL as an error message may quote it: its scheme and host only (it may hold a token)."""
    parts = http_url(url)
    return f"{parts.scheme}://{parts.hostname}/…" if parts is not None else "(not a URL)"


def _event_types(values: Sequence[str]) -> tuple[EventType, ...]:
    at_most(values, MAX_CHANNEL_EVENT_TYPES, f"{FIELD}.event_types", "event types")
    return tuple(dict.fromkeys(enum_values(EventType, values, f"{FIELD}.event_types", "event type")))


def _severity(value: str) -> Severity:
    try:
        return Severity(value or Severity.INFO.value)
    except ValueError:
        known = ", ".join(s.value for s in Severity)
        raise InvalidArgument(f"{FIELD}.min_severity: must be one of {known}, got {value!r}") from None


def _schedules(values: Sequence[str]) -> tuple[str, ...]:
    at_most(values, MAX_CHANNEL_SCHEDULES, f"{FIELD}.schedules", "schedules")
    for i, name in enumerate(values):
        check_name(name, f"{FIELD}.schedules[{i}]")
    return tuple(dict.fromkeys(values))


def _bounded(value: int, default: int, limit: int, name: str) -> int:
    if value == 0:
        return default
    if not 1 <= value <= limit:
        raise InvalidArgument(f"{FIELD}.{name}: must be 1..{limit} (0 for the default), got {value}")
    return value


def _rate(given: ChannelInput) -> int:
    return _bounded(
        given.rate_per_minute, DEFAULT_NOTIFY_RATE_PER_MINUTE, MAX_RATE_PER_MINUTE, "rate_per_minute"
    )


def _attempts(given: ChannelInput) -> int:
    return _bounded(given.max_attempts, DEFAULT_NOTIFY_MAX_ATTEMPTS, MAX_ATTEMPTS_LIMIT, "max_attempts")


def _subscription(given: ChannelInput) -> Subscription:
    return Subscription(
        event_types=_event_types(given.event_types),
        schedules=_schedules(given.schedules),
        operations=tuple(sorted(distinct_operations(given.operations, f"{FIELD}.operations"))),
        min_severity=_severity(given.min_severity),
    )


class NotificationService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    async def create(self, given: ChannelInput) -> ChannelView:
        check_name(given.name, f"{FIELD}.name")
        now = self.clock.now()
        channel = Channel(
            id=new_id(),
            name=given.name,
            kind=_kind(given.kind),
            url=_url(given.url),
            secret=_secret(given.secret, _kind(given.kind)),
            enabled=not given.disabled,
            subscription=_subscription(given),
            rate_per_minute=_rate(given),
            max_attempts=_attempts(given),
            created_at=now,
            updated_at=now,
        )
        async with self.db.transaction() as conn:
            with unique_violation_as(self._taken(given.name)):
                await store.insert_channel(conn, channel)
        return view(channel)

    @staticmethod
    def _taken(name: str) -> AlreadyExists:
        return AlreadyExists(f"{FIELD}.name", name, "a notification channel named")

    async def get(self, channel_id: uuid.UUID) -> ChannelView:
        async with self.db.read() as conn:
            channel = await store.get_channel(conn, channel_id)
        if channel is None:
            raise NotFound(f"id: no notification channel {channel_id}")
        return view(channel)

    async def list_channels(self) -> list[ChannelView]:
        """Every channel, by name."""
        async with self.db.read() as conn:
            return [view(c) for c in await store.list_channels(conn)]

    async def update(self, channel_id: uuid.UUID, paths: Collection[str], given: ChannelInput) -> ChannelView:
        """Apply the masked fields (`channel.<field>`); the kind cannot change (delete and create)."""
        mask = {path.removeprefix(f"{FIELD}.") for path in check_mask(paths, UPDATE_PATHS)}
        if "name" in mask:
            check_text(given.name, f"{FIELD}.name", required=True)  # a new one is checked as on create, below
        if "url" in mask:
            _url(given.url)
        checked = _subscription(given)
        rate, attempts = _rate(given), _attempts(given)
        async with self.db.transaction() as conn:
            current = await store.get_channel(conn, channel_id)
            if current is None:
                raise NotFound(f"id: no notification channel {channel_id}")
            if "secret" in mask:
                _secret(given.secret, current.kind)
            sub = current.subscription
            updated = replace(
                current,
                name=check_rename(given.name, f"{FIELD}.name", current.name)
                if "name" in mask
                else current.name,
                url=given.url if "url" in mask else current.url,
                secret=given.secret if "secret" in mask else current.secret,
                enabled=not given.disabled if "disabled" in mask else current.enabled,
                subscription=Subscription(
                    event_types=checked.event_types if "event_types" in mask else sub.event_types,
                    schedules=checked.schedules if "schedules" in mask else sub.schedules,
                    operations=checked.operations if "operations" in mask else sub.operations,
                    min_severity=checked.min_severity if "min_severity" in mask else sub.min_severity,
                ),
                rate_per_minute=rate if "rate_per_minute" in mask else current.rate_per_minute,
                max_attempts=attempts if "max_attempts" in mask else current.max_attempts,
                updated_at=self.clock.now(),
            )
            with unique_violation_as(self._taken(updated.name)):
                await store.save_channel(conn, updated)
        return view(updated)

    async def delete(self, channel_id: uuid.UUID) -> None:
        """Delete the channel with its deliveries (pending and dead ones too)."""
        async with self.db.transaction() as conn:
            if not await store.delete_channel(conn, channel_id):
                raise NotFound(f"id: no notification channel {channel_id}")

    async def redeliver(
        self, delivery_ids: Collection[uuid.UUID] = (), channel_id: uuid.UUID | None = None
    ) -> int:
        """Make dead deliveries (these, or the channel's, or every one) pending again, due now, with a fresh
        count of attempts. Returns how many. At most a listing's worth of ids (`MAX_DELIVERIES_SHOWN`): they
        come from one, and unbounded they were one statement past PostgreSQL's 65,535 parameters."""
        if len(delivery_ids) > MAX_DELIVERIES_SHOWN:
            count = len(delivery_ids)
            raise InvalidArgument(f"delivery_ids: at most {MAX_DELIVERIES_SHOWN} ids, got {count}")
        async with self.db.transaction() as conn:
            if channel_id is not None and await store.get_channel(conn, channel_id) is None:
                raise NotFound(f"channel_id: no notification channel {channel_id}")
            return await store.redeliver(
                conn, await self.db.now(conn), delivery_ids=delivery_ids, channel_id=channel_id
            )

    async def deliveries(
        self,
        states: Collection[DeliveryState] = (),
        channel_id: uuid.UUID | None = None,
        limit: int = DELIVERIES_SHOWN,
    ) -> list[Delivery]:
        """The newest deliveries (of `states`, to `channel_id`), newest first."""
        if not 1 <= limit <= MAX_DELIVERIES_SHOWN:
            raise InvalidArgument(
                f"limit: must be 1..{MAX_DELIVERIES_SHOWN} (0 for {DELIVERIES_SHOWN}), got {limit}"
            )
        async with self.db.read() as conn:
            return await store.list_deliveries(conn, states=states, channel_id=channel_id, limit=limit)
