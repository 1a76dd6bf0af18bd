"""`rackflow notify …`: notification channels, their deliveries, and sending dead ones again
(docs/NOTIFICATIONS.md)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import click
from google.protobuf.empty_pb2 import Empty
from rich.table import Table

from rackflow.cli.output import (
    Group,
    Listing,
    Session,
    details,
    free_text,
    operation_label,
    pass_session,
    table,
    utc_text,
    when,
)
from rackflow.client import OPERATION_RPCS
from rackflow.domain.notifications import ChannelKind, DeliveryState, EventType, Severity, takes_secret
from rackflow.v1 import flow_pb2 as pb
from rackflow.words import counted

_OPERATIONS = click.Choice([operation_label(o) for o in OPERATION_RPCS])
_EVENTS = click.Choice([t.value for t in EventType])
_SEVERITIES = click.Choice([s.value for s in Severity])
_ref = click.argument("channel_ref", metavar="NAME_OR_ID")


@click.group(cls=Group)
def notify() -> None:
    """Notification channels: webhooks, Slack and Alertmanager receive rackflow's events (a rollout halted,
    a task failed, …) at least once, with back-off, a rate limit and dead letters."""


def _any(values: Sequence[str]) -> str:
    return ", ".join(values) or "any"


def channels_table(channels: Sequence[pb.NotificationChannel]) -> Listing:
    result = table(
        "NAME",
        "KIND",
        free_text("URL"),
        free_text("EVENTS"),
        "MIN SEVERITY",
        "STATE",
        title=counted(len(channels), "channel"),
    )
    for c in channels:
        state = "disabled" if c.disabled else "enabled"
        result.add_row(c.name, c.kind, c.url, _any(c.event_types), c.min_severity, state)
    return result


def channel_view(c: pb.NotificationChannel) -> Table:
    return details(
        [
            ("name", c.name),
            ("id", c.id.id),
            ("kind", c.kind),
            ("url", c.url),
            ("secret", "set" if c.has_secret else "-"),
            ("state", "disabled" if c.disabled else "enabled"),
            ("events", _any(c.event_types)),
            ("schedules", _any(c.schedules)),
            ("operations", _any([operation_label(o) for o in c.operations])),
            ("min severity", c.min_severity),
            ("rate", f"{c.rate_per_minute}/min"),
            ("max attempts", str(c.max_attempts)),
            ("created", utc_text(when(c.created_at))),
            ("updated", utc_text(when(c.updated_at))),
        ]
    )


def deliveries_table(deliveries: Sequence[pb.NotificationDelivery]) -> Listing:
    result = table(
        "ID", "CHANNEL", "EVENT", "STATE", "ATTEMPTS", "AT", free_text("WHAT"), free_text("LAST ERROR")
    )
    for d in deliveries:
        what = " · ".join(filter(None, (d.event.summary, d.event.schedule, d.event.rack)))
        at = utc_text(when(d.delivered_at) or when(d.event.at))
        result.add_row(
            d.id.id, d.channel, d.event.type, d.state, str(d.attempts), at, what, d.last_error or "-"
        )
    return result


def _show(session: Session, found: pb.NotificationChannel) -> None:
    session.emit(found, lambda: channel_view(found))


def _secret(variable: str | None) -> str:
    """The secret from the environment variable named (never from the command line: shell history and
    `ps` would show it)."""
    if variable is None:
        return ""
    value = os.environ.get(variable)
    if not value:
        raise click.UsageError(f"--secret-env: the environment variable {variable} is unset or empty")
    return value


def _channel(
    *,
    kind: str = "",
    name: str,
    url: str,
    secret: str,
    disabled: bool,
    lists: tuple[Sequence[str], Sequence[str], Sequence[str]],
    settings: tuple[str | None, int | None, int | None],
) -> pb.NotificationChannel:
    """The message of create and update: `lists` are the event types, schedules and operations; `settings`
    the minimum severity, rate and attempts (None: not given)."""
    events, schedules, operations = lists
    min_severity, rate_per_minute, max_attempts = settings
    return pb.NotificationChannel(
        name=name,
        kind=kind,
        url=url,
        secret=secret,
        disabled=disabled,
        event_types=events,
        schedules=schedules,
        operations=operations,
        min_severity=min_severity or "",
        rate_per_minute=rate_per_minute or 0,
        max_attempts=max_attempts or 0,
    )


def _signed(kind: str) -> None:
    """Refuse --secret-env for a channel kind that takes no secret (`takes_secret`): naming the option, and
    before its variable is read. A kind this client does not know is left to the server to judge."""
    if kind in set(ChannelKind) and not takes_secret(ChannelKind(kind)):
        raise click.UsageError(
            f"--secret-env: only a webhook is signed with a secret; a {kind} channel takes none"
        )


_secret_env = click.option(
    "--secret-env", metavar="VARIABLE", help="Read the webhook's HMAC key from this environment variable."
)
_event = click.option("--event", "events", multiple=True, type=_EVENTS, help="An event type (repeatable).")
_schedule = click.option("--schedule", "schedules", multiple=True, help="A schedule name (repeatable).")
_op = click.option("--op", "operations", multiple=True, type=_OPERATIONS, help="An operation (repeatable).")
_severity = click.option(
    "--min-severity", type=_SEVERITIES, default=None, help="The least severe event sent."
)
_rate = click.option("--rate-per-minute", type=int, default=None, help="At most this many sends a minute.")
_attempts = click.option("--max-attempts", type=int, default=None, help="Attempts before a delivery is dead.")


@notify.command()
@click.argument("name")
@click.option("--kind", type=click.Choice([k.value for k in ChannelKind]), required=True)
@click.option("--url", required=True, help="The receiver (Alertmanager: its base URL).")
@_secret_env
@_event
@_schedule
@_op
@_severity
@_rate
@_attempts
@click.option("--disabled", is_flag=True, help="Create it disabled.")
@click.pass_context
def create(
    ctx: click.Context,
    name: str,
    kind: str,
    url: str,
    secret_env: str | None,
    events: tuple[str, ...],
    schedules: tuple[str, ...],
    operations: tuple[str, ...],
    min_severity: str | None,
    rate_per_minute: int | None,
    max_attempts: int | None,
    disabled: bool,
) -> None:
    """Create a channel. Empty filters match everything.

    \b
    Example:
      export HOOK_SECRET=$(openssl rand -hex 32)
      rackflow notify create ops-hook --kind webhook --url https://hooks.example.com/rackflow \\
        --secret-env HOOK_SECRET --event run.halted --event task.failed
      rackflow notify create am --kind alertmanager --url http://alertmanager:9093 --min-severity warning
    """
    session = pass_session(ctx)
    if secret_env is not None:
        _signed(kind)
    channel = _channel(
        kind=kind,
        name=name,
        url=url,
        secret=_secret(secret_env),
        disabled=disabled,
        lists=(events, schedules, operations),
        settings=(min_severity, rate_per_minute, max_attempts),
    )
    _show(session, session.client.create_channel(channel))


@notify.command()
@_ref
@click.pass_context
def show(ctx: click.Context, channel_ref: str) -> None:
    """Show one channel (never its secret).

    \b
    Example:
      rackflow notify show ops-hook -o json
    """
    session = pass_session(ctx)
    _show(session, session.client.get_channel(channel_ref))


@notify.command(name="list")
@click.pass_context
def list_channels(ctx: click.Context) -> None:
    """List channels by name.

    \b
    Example:
      rackflow notify list -o json
    """
    session = pass_session(ctx)
    found = session.client.list_channels()
    session.emit(found, lambda: channels_table(found.channels))


@notify.command()
@_ref
@click.option("--name", default=None, help="A new name.")
@click.option("--url", default=None, help="A new URL.")
@_secret_env
@click.option("--no-secret", is_flag=True, help="Remove the secret (webhooks are then unsigned).")
@_event
@click.option("--any-event", is_flag=True, help="Send every event type.")
@_schedule
@click.option("--any-schedule", is_flag=True, help="Send events of every schedule.")
@_op
@click.option("--any-op", is_flag=True, help="Send events of every operation.")
@_severity
@_rate
@_attempts
@click.option("--enable/--disable", "enable", default=None, help="Start or stop sending.")
@click.pass_context
def update(
    ctx: click.Context,
    channel_ref: str,
    name: str | None,
    url: str | None,
    secret_env: str | None,
    no_secret: bool,
    events: tuple[str, ...],
    any_event: bool,
    schedules: tuple[str, ...],
    any_schedule: bool,
    operations: tuple[str, ...],
    any_op: bool,
    min_severity: str | None,
    rate_per_minute: int | None,
    max_attempts: int | None,
    enable: bool | None,
) -> None:
    """Change a channel; lists given replace the old ones.

    \b
    Example:
      rackflow notify update ops-hook --min-severity critical
      rackflow notify update ops-hook --disable
    """
    for given, cleared, flag in (
        (events, any_event, "event"),
        (schedules, any_schedule, "schedule"),
        (operations, any_op, "op"),
    ):
        if given and cleared:
            raise click.UsageError(f"give --{flag} or --any-{flag}, not both")
    if secret_env and no_secret:
        raise click.UsageError("give --secret-env or --no-secret, not both")
    if secret_env is not None:
        _signed(pass_session(ctx).client.get_channel(channel_ref).kind)
    changes = _channel(
        name=name or "",
        url=url or "",
        secret=_secret(secret_env),
        disabled=enable is False,
        lists=(events, schedules, operations),
        settings=(min_severity, rate_per_minute, max_attempts),
    )
    fields = [
        field
        for field, present in (
            ("name", name is not None),
            ("url", url is not None),
            ("secret", secret_env is not None or no_secret),
            ("disabled", enable is not None),
            ("event_types", bool(events) or any_event),
            ("schedules", bool(schedules) or any_schedule),
            ("operations", bool(operations) or any_op),
            ("min_severity", min_severity is not None),
            ("rate_per_minute", rate_per_minute is not None),
            ("max_attempts", max_attempts is not None),
        )
        if present
    ]
    if not fields:
        raise click.UsageError("nothing to change")
    session = pass_session(ctx)
    _show(session, session.client.update_channel(channel_ref, changes, fields))


@notify.command()
@_ref
@click.pass_context
def delete(ctx: click.Context, channel_ref: str) -> None:
    """Delete a channel with its deliveries, pending and dead ones too.

    \b
    Example:
      rackflow notify delete ops-hook
    """
    session = pass_session(ctx)
    session.client.delete_channel(channel_ref)
    session.emit(Empty(), lambda: f"deleted notification channel {channel_ref}")


@notify.command()
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in DeliveryState]),
    help="Only these states (repeatable).",
)
@click.option("--channel", default=None, help="Only this channel (name or id).")
@click.option("--limit", type=int, default=0, help="At most this many, newest first (default 100).")
@click.pass_context
def deliveries(ctx: click.Context, states: tuple[str, ...], channel: str | None, limit: int) -> None:
    """List deliveries, newest first: what was sent where, and why what failed failed.

    \b
    Example:
      rackflow notify deliveries --state dead
    """
    session = pass_session(ctx)
    found = session.client.list_deliveries(states=states, channel=channel, limit=limit)
    session.emit(found, lambda: deliveries_table(found.deliveries))


@notify.command()
@click.argument("delivery_ids", nargs=-1)
@click.option("--channel", default=None, help="Only this channel's dead deliveries (name or id).")
@click.pass_context
def redeliver(ctx: click.Context, delivery_ids: tuple[str, ...], channel: str | None) -> None:
    """Send dead deliveries again (these ids, or a channel's, or every one), with a fresh count of
    attempts.

    \b
    Example:
      rackflow notify redeliver --channel ops-hook
    """
    session = pass_session(ctx)
    done = session.client.redeliver(delivery_ids, channel)
    session.emit(done, lambda: f"{done.redelivered} dead deliveries pending again")
