"""The notification outbox (docs/NOTIFICATIONS.md): events, channels and deliveries.

`record_events` is the one way an event is written: inside the caller's transaction, so an event exists
exactly when the change it reports committed. The delivery loop (`rackflow.notify.delivery`) then, from any
instance, fans new events out into one delivery per matching channel (`fan_out`), claims due deliveries
(`claim_deliveries`: SKIP LOCKED on PostgreSQL, and the attempt and the claim counted and the row moved
past a lease in the same statement, so no other instance sends it meanwhile), and writes each result fenced
by the claim it made (`record_results`).

Every write that gives the delivery loop work at once (an event, a redelivery, a channel made or changed)
asks for `CHANGED` after its commit (`store.db.after_commit`): the loop of this process then looks at once,
and otherwise sleeps until the next delivery it knows is due (`Work.next_due`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, case, delete, exists, func, or_, select, union_all, update
from sqlalchemy.engine import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.config import ALERT_RESEND_ENDS_AFTER
from rackflow.domain.notifications import (
    CLEARS,
    CONDITION_SUBJECT,
    Channel,
    ChannelKind,
    Delivery,
    DeliveryState,
    Event,
    EventType,
    Severity,
    Subscription,
    condition_of,
    condition_types,
    tokens_now,
)
from rackflow.domain.tasks import OperationKind, TaskStatus
from rackflow.ids import new_id
from rackflow.store.db import Database, after_commit, chunked
from rackflow.store.dialect import insert_rows, not_in_keys
from rackflow.store.retention import PRUNE_CHUNK, prune_older
from rackflow.store.tables import (
    notification_channel,
    notification_delivery,
    notification_event,
    racks,
    task_schedule,
    task_schedule_run,
    tasks,
)

_event = notification_event.c
_channel = notification_channel.c
_delivery = notification_delivery.c
PENDING, DELIVERED, DEAD = (s.value for s in DeliveryState)
# What the writes above ask to be told after commit (`Database.on_commit`): the outbox has work now.
CHANGED = "outbox"


# --- events ----------------------------------------------------------------------------------------------


async def record_events(conn: AsyncConnection, events: Sequence[Event]) -> None:
    """Write `events` to the outbox in the caller's transaction, with the names of what they concern
    (`_with_context`). No events, no query: the write sites call this on every change."""
    if not events:
        return
    named = await _as_raised(conn, await _with_context(conn, events))
    await _mark_cleared(conn, named)  # the raises recorded before: a raise anew in `events` stays open
    rows = [_event_row(event) for event in named]
    keyed = any(event.key for event in events)  # another instance may have written the same key first
    await conn.execute(*insert_rows(conn.dialect.name, notification_event, rows, new_only=keyed))
    after_commit(conn, CHANGED)


async def _with_context(conn: AsyncConnection, events: Sequence[Event]) -> list[Event]:
    """The events with what their ids imply: a task's rack, run, schedule and operation; a run's schedule;
    a schedule's name and operation; a rack's name (what a constructor already set is kept)."""
    found = await _lookup(conn, tasks, [e.task_id for e in events])
    events = [
        replace(
            e,
            rack_id=e.rack_id or row.rack_id,
            run_id=e.run_id or row.run_id,
            schedule_id=e.schedule_id or row.schedule_id,
            operation=e.operation or row.operation,
        )
        if (row := found.get(e.task_id)) is not None
        else e
        for e in events
    ]
    runs = await _lookup(conn, task_schedule_run, [e.run_id for e in events if e.schedule_id is None])
    events = [replace(e, schedule_id=runs[e.run_id].schedule_id) if e.run_id in runs else e for e in events]
    schedules = await _lookup(conn, task_schedule, [e.schedule_id for e in events])
    events = [
        replace(
            e,
            schedule_name=e.schedule_name or row.name,
            operation=e.operation or str(row.operation_template["operation"]["kind"]),
        )
        if (row := schedules.get(e.schedule_id)) is not None
        else e
        for e in events
    ]
    named = await _lookup(conn, racks, [e.rack_id for e in events if not e.rack_name])
    return [replace(e, rack_name=named[e.rack_id].name) if e.rack_id in named else e for e in events]


async def _as_raised(conn: AsyncConnection, events: Sequence[Event]) -> list[Event]:
    """The events, each clearing with the names (schedule, rack, operation) of the latest event that raised
    its condition: Alertmanager ends an alert by its labels, so a clearing named anew (the schedule renamed
    between a halt and its resume) left the halt's alert firing on. A clearing
    with no raise recorded keeps its own. Clearings are few (a resume, a decision, a hold's end)."""
    named = []
    for event in events:
        condition = CLEARS.get(event.type)
        value = getattr(event, CONDITION_SUBJECT[condition]) if condition is not None else None
        if condition is not None and value is not None:
            stmt = (
                select(_event.schedule_name, _event.rack_name, _event.operation)
                .where(
                    _event.type == condition.value,
                    notification_event.c[CONDITION_SUBJECT[condition]] == value,
                    _event.at <= event.at,
                )
                .order_by(_event.at.desc(), _event.id.desc())
                .limit(1)
            )
            if (row := (await conn.execute(stmt)).first()) is not None:
                event = replace(
                    event, schedule_name=row.schedule_name, rack_name=row.rack_name, operation=row.operation
                )
        named.append(event)
    return named


async def _lookup(
    conn: AsyncConnection, table: Any, ids: Collection[uuid.UUID | None]
) -> dict[Any, Row[Any]]:
    wanted = {i for i in ids if i is not None}
    found: dict[Any, Row[Any]] = {}
    for chunk in chunked(wanted):
        found.update({row.id: row for row in await conn.execute(select(table).where(table.c.id.in_(chunk)))})
    return found


def _event_row(event: Event) -> dict[str, Any]:
    return {
        "id": event.id,
        "type": event.type.value,
        "severity": event.severity.value,
        "at": event.at,
        "summary": event.summary,
        "reason": event.reason,
        "schedule_id": event.schedule_id,
        "schedule_name": event.schedule_name,
        "run_id": event.run_id,
        "rack_id": event.rack_id,
        "rack_name": event.rack_name,
        "task_id": event.task_id,
        "operation": event.operation,
        "principal": event.principal,
        "payload": dict(event.payload),
        "fanned_out": False,
        "dedupe_key": event.key or None,
    }


def _event_from(row: Any) -> Event:
    return Event(
        id=row.id,
        type=EventType(row.type),
        severity=Severity(row.severity),
        at=row.at,
        summary=row.summary,
        reason=row.reason,
        schedule_id=row.schedule_id,
        schedule_name=row.schedule_name,
        run_id=row.run_id,
        rack_id=row.rack_id,
        rack_name=row.rack_name,
        task_id=row.task_id,
        operation=row.operation,
        principal=row.principal,
        payload=row.payload,
        key=row.dedupe_key or "",
    )


async def list_events(conn: AsyncConnection, limit: int) -> list[Event]:
    """The newest `limit` events, newest first."""
    stmt = select(notification_event).order_by(_event.at.desc(), _event.id.desc()).limit(limit)
    return [_event_from(row) for row in await conn.execute(stmt)]


async def fan_out(db: Database, conn: AsyncConnection, now: datetime, limit: int) -> int:
    """Make the deliveries of up to `limit` events not fanned out yet (oldest first, SKIP LOCKED): one per
    enabled channel whose subscription matches, due at once. Returns how many events it took."""
    stmt = select(notification_event).where(_event.fanned_out.is_(False)).order_by(_event.at).limit(limit)
    events = [_event_from(row) for row in await conn.execute(db.skip_locked(stmt))]
    if not events:
        return 0
    channels = [c for c in await list_channels(conn) if c.enabled]
    rows = [
        {
            "id": new_id(),
            "event_id": event.id,
            "channel_id": channel.id,
            "state": PENDING,
            "attempts": 0,
            "next_attempt_at": now,
            "last_error": "",
            "created_at": now,
        }
        for event in events
        for channel in channels
        if channel.subscription.matches(event)
    ]
    if rows:
        await conn.execute(*insert_rows(db.dialect, notification_delivery, rows, new_only=True))
    for chunk in chunked([e.id for e in events]):
        await conn.execute(update(notification_event).where(_event.id.in_(chunk)).values(fanned_out=True))
    return len(events)


# --- conditions a loop finds: tasks held too long (rackflow.notify.holds) -------------------------------


@dataclass(frozen=True)
class Held:
    """A task a start gate holds: which gate, since when, why."""

    task_id: uuid.UUID
    rack_id: uuid.UUID
    held_by: str
    held_since: datetime
    reason: str


def _held(row: Any) -> Held:
    return Held(row.id, row.rack_id, row.held_by, row.held_since, row.held_reason or "")


async def long_holds(
    conn: AsyncConnection,
    cutoff: datetime,
    *,
    exclude: Collection[str],
    reported: Collection[uuid.UUID],
    limit: int,
) -> list[Held]:
    """Pending tasks held (by anything but `exclude`) since `cutoff` or earlier, longest held first, but not
    the `reported` ones (whose hold has an open condition): else, once the `limit` longest were reported
    and stayed held, no later one ever was."""
    held = [
        tasks.c.status == TaskStatus.PENDING.value,
        tasks.c.held_by.is_not(None),
        tasks.c.held_by.not_in(list(exclude)),
        tasks.c.held_since <= cutoff,
    ]
    if reported:
        held.append(not_in_keys(conn.dialect.name, tasks.c.id, list(reported)))
    stmt = (
        select(tasks.c.id, tasks.c.rack_id, tasks.c.held_by, tasks.c.held_since, tasks.c.held_reason)
        .where(*held)
        .order_by(tasks.c.held_since, tasks.c.id)
        .limit(limit)
    )
    return [_held(row) for row in await conn.execute(stmt)]


async def held_now(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Held | None]:
    """Of these tasks (deleted ones left out), what holds each now (None: it is not a held pending task)."""
    found = await _lookup(conn, tasks, task_ids)
    pending = TaskStatus.PENDING.value
    return {
        task_id: _held(row) if row.status == pending and row.held_by and row.held_since else None
        for task_id, row in found.items()
    }


async def keys_taken(conn: AsyncConnection, keys: Collection[str]) -> set[str]:
    """Which of `keys` an event already has."""
    taken: set[str] = set()
    for chunk in chunked(set(keys)):
        stmt = select(_event.dedupe_key).where(_event.dedupe_key.in_(chunk))
        taken.update(key for key in (await conn.execute(stmt)).scalars() if key is not None)
    return taken


async def open_conditions(conn: AsyncConnection, kind: EventType) -> list[Event]:
    """The keyed events of `kind` whose condition is not cleared yet (few: the partial index)."""
    stmt = select(notification_event).where(
        _event.type == kind.value, _event.dedupe_key.is_not(None), _event.cleared_at.is_(None)
    )
    return [_event_from(row) for row in await conn.execute(stmt)]


async def clear_condition(conn: AsyncConnection, event_id: uuid.UUID, now: datetime) -> bool:
    """Mark the condition `event_id` raised as cleared; False when it was already (another instance got
    there first: only the transaction that answers True writes the clearing event)."""
    stmt = (
        update(notification_event)
        .where(_event.id == event_id, _event.cleared_at.is_(None))
        .values(cleared_at=now)
    )
    return (await conn.execute(stmt)).rowcount == 1


async def conditions_now(conn: AsyncConnection, events: Sequence[Event]) -> dict[uuid.UUID, Event]:
    """For each of `events` that raises or clears a condition, the latest event of that condition (the
    same run, schedule or task: `CONDITION_SUBJECT`) at or after it, by `at`: itself, unless the condition
    changed since. Alertmanager keeps the last alert it was sent for a set of labels, and deliveries are
    retried out of order (a back-off, a lease), so a halt sent after its clearing must say what holds now,
    not fire again. Read from `at` on (its index): a delivery on time reads a few rows."""
    found: dict[uuid.UUID, Event] = {}
    for event in events:
        condition = condition_of(event.type)
        if condition is None:
            continue
        subject = CONDITION_SUBJECT[condition]
        if (value := getattr(event, subject)) is None:
            continue
        stmt = (
            select(notification_event)
            .where(
                _event.at >= event.at,
                _event.type.in_([t.value for t in condition_types(condition)]),
                notification_event.c[subject] == value,
            )
            .order_by(_event.at.desc(), _event.id.desc())
            .limit(1)
        )
        row = (await conn.execute(stmt)).first()
        found[event.id] = _event_from(row) if row is not None else event
    return found


# --- channels --------------------------------------------------------------------------------------------


def _channel_row(channel: Channel) -> dict[str, Any]:
    sub = channel.subscription
    return {
        "id": channel.id,
        "name": channel.name,
        "kind": channel.kind.value,
        "url": channel.url,
        "secret": channel.secret,
        "enabled": channel.enabled,
        "event_types": [t.value for t in sub.event_types],
        "schedules": list(sub.schedules),
        "operations": [op.value for op in sub.operations],
        "min_severity": sub.min_severity.value,
        "rate_per_minute": channel.rate_per_minute,
        "max_attempts": channel.max_attempts,
        "created_at": channel.created_at,
        "updated_at": channel.updated_at,
    }


def _channel_from(row: Any) -> Channel:
    return Channel(
        id=row.id,
        name=row.name,
        kind=ChannelKind(row.kind),
        url=row.url,
        secret=row.secret,
        enabled=row.enabled,
        subscription=Subscription(
            event_types=tuple(EventType(t) for t in row.event_types),
            schedules=tuple(row.schedules),
            operations=tuple(OperationKind(op) for op in row.operations),
            min_severity=Severity(row.min_severity),
        ),
        rate_per_minute=row.rate_per_minute,
        max_attempts=row.max_attempts,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def insert_channel(conn: AsyncConnection, channel: Channel) -> None:
    await conn.execute(notification_channel.insert().values(**_channel_row(channel)))
    after_commit(conn, CHANGED)


async def save_channel(conn: AsyncConnection, channel: Channel) -> None:
    row = _channel_row(channel)
    del row["id"], row["created_at"]
    await conn.execute(update(notification_channel).where(_channel.id == channel.id).values(**row))
    after_commit(conn, CHANGED)  # enabled again, or a higher rate: its due deliveries may go now


async def get_channel(conn: AsyncConnection, channel_id: uuid.UUID) -> Channel | None:
    row = (await conn.execute(select(notification_channel).where(_channel.id == channel_id))).first()
    return _channel_from(row) if row is not None else None


async def channel_named(conn: AsyncConnection, name: str) -> Channel | None:
    row = (await conn.execute(select(notification_channel).where(_channel.name == name))).first()
    return _channel_from(row) if row is not None else None


async def list_channels(conn: AsyncConnection) -> list[Channel]:
    """Every channel, by name."""
    stmt = select(notification_channel).order_by(_channel.name)
    return [_channel_from(row) for row in await conn.execute(stmt)]


async def delete_channel(conn: AsyncConnection, channel_id: uuid.UUID) -> bool:
    """Delete the channel with its deliveries; False when there was none."""
    result = await conn.execute(delete(notification_channel).where(_channel.id == channel_id))
    return result.rowcount > 0


# --- deliveries ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    """A delivery this instance is sending: its attempt (from 1, again after a redelivery), and `claim`, the
    fence its result is written under (the delivery's claims ever made, never reset: migration 0040)."""

    id: uuid.UUID
    attempt: int
    claim: int
    event: Event


async def claim_deliveries(
    db: Database, conn: AsyncConnection, channel_id: uuid.UUID, now: datetime, limit: int, lease: timedelta
) -> list[Claimed]:
    """Up to `limit` of the channel's due pending deliveries, oldest due first, skipping rows another
    instance is claiming; each counts one more attempt and is not due again until `lease` from `now` (its
    send's bound), so only a sender that died leaves it to be claimed again."""
    due = (
        select(_delivery.id)
        .where(
            _delivery.channel_id == channel_id, _delivery.state == PENDING, _delivery.next_attempt_at <= now
        )
        .order_by(_delivery.next_attempt_at, _delivery.id)
        .limit(limit)
    )
    ids = list((await conn.execute(db.skip_locked(due))).scalars())
    if not ids:
        return []
    claimed = (
        update(notification_delivery)
        .where(_delivery.id.in_(ids))
        .values(attempts=_delivery.attempts + 1, claims=_delivery.claims + 1, next_attempt_at=now + lease)
        .returning(_delivery.id, _delivery.attempts, _delivery.claims, _delivery.event_id)
    )
    rows = {row.id: row for row in await conn.execute(claimed)}
    events = await _lookup(conn, notification_event, [row.event_id for row in rows.values()])
    return [Claimed(i, rows[i].attempts, rows[i].claims, _event_from(events[rows[i].event_id])) for i in ids]


async def take_tokens(
    db: Database, conn: AsyncConnection, channels: Sequence[Channel], now: datetime, burst: timedelta
) -> dict[uuid.UUID, float]:
    """Lock the channels' token buckets (their rows, in id order, so two instances' claims never wait for
    each other in a cycle) until the caller's transaction ends, and return the tokens each holds at `now`:
    every instance's claims for a channel draw from its one bucket, one at a time. The caller writes what
    it took with `spend_tokens` in the same transaction. A channel deleted meanwhile is left out."""
    by_id = {channel.id: channel for channel in channels}
    stmt = (
        select(_channel.id, _channel.rate_tokens, _channel.rate_at)
        .where(_channel.id.in_(list(by_id)))
        .order_by(_channel.id)
    )
    return {
        row.id: tokens_now(row.rate_tokens, row.rate_at, now, by_id[row.id].rate_per_minute, burst)
        for row in await conn.execute(db.for_update(stmt))
    }


async def spend_tokens(conn: AsyncConnection, channel_id: uuid.UUID, left: float, now: datetime) -> None:
    await conn.execute(
        update(notification_channel).where(_channel.id == channel_id).values(rate_tokens=left, rate_at=now)
    )


@dataclass(frozen=True)
class Result:
    """How one claimed send went: delivered, or failed with `error` and tried again `retry_after` from when
    the result is written (None: the channel's attempts are used up, the delivery is dead). A delivered
    condition's alert to an Alertmanager is sent again `resend_after` on (`claim_resends`)."""

    claimed: Claimed
    delivered: bool
    error: str = ""
    retry_after: timedelta | None = None
    resend_after: timedelta | None = None


async def record_results(conn: AsyncConnection, results: Sequence[Result], now: datetime) -> int:
    """Write the sends' results, each only while its claim is still the row's (a send that outlived its
    lease and was claimed again leaves the newer claim's row alone, even one with its attempt number, after
    a redelivery). The attempt is checked too: a claim by an instance of the release before migration 0040
    counts attempts only. Returns how many were written."""
    written = 0
    for result in results:
        if result.delivered:
            values: dict[str, Any] = {"state": DELIVERED, "delivered_at": now, "last_error": ""}
            if result.resend_after is not None:
                values["next_attempt_at"] = now + result.resend_after
        elif result.retry_after is None:
            values = {"state": DEAD, "last_error": result.error}
        else:
            values = {"next_attempt_at": now + result.retry_after, "last_error": result.error}
        fence = and_(
            _delivery.id == result.claimed.id,
            _delivery.claims == result.claimed.claim,
            _delivery.attempts == result.claimed.attempt,
            _delivery.state == PENDING,
        )
        written += (await conn.execute(update(notification_delivery).where(fence).values(**values))).rowcount
    return written


async def list_deliveries(
    conn: AsyncConnection,
    *,
    states: Collection[DeliveryState] = (),
    channel_id: uuid.UUID | None = None,
    limit: int = 100,
) -> list[Delivery]:
    """Deliveries (of `states`, to `channel_id`, when given), newest first, with their events."""
    stmt = (
        select(notification_delivery, _channel.name.label("channel_name"))
        .join(notification_channel, _channel.id == _delivery.channel_id)
        .order_by(_delivery.created_at.desc(), _delivery.id.desc())
        .limit(limit)
    )
    if states:
        stmt = stmt.where(_delivery.state.in_([s.value for s in states]))
    if channel_id is not None:
        stmt = stmt.where(_delivery.channel_id == channel_id)
    rows = list(await conn.execute(stmt))
    events = await _lookup(conn, notification_event, [row.event_id for row in rows])
    return [
        Delivery(
            id=row.id,
            event=_event_from(events[row.event_id]),
            channel_id=row.channel_id,
            channel_name=row.channel_name,
            state=DeliveryState(row.state),
            attempts=row.attempts,
            next_attempt_at=row.next_attempt_at,
            last_error=row.last_error,
            delivered_at=row.delivered_at,
        )
        for row in rows
    ]


async def redeliver(
    conn: AsyncConnection,
    now: datetime,
    *,
    delivery_ids: Collection[uuid.UUID] = (),
    channel_id: uuid.UUID | None = None,
) -> int:
    """Make dead deliveries (these, or the channel's, or all) pending again, due now, with their attempts
    counted from zero (their claims, the fence, go on counting). Returns how many."""
    stmt = (
        update(notification_delivery)
        .where(_delivery.state == DEAD)
        .values(state=PENDING, attempts=0, next_attempt_at=now)
    )
    if delivery_ids:
        stmt = stmt.where(_delivery.id.in_(list(delivery_ids)))
    if channel_id is not None:
        stmt = stmt.where(_delivery.channel_id == channel_id)
    count: int = (await conn.execute(stmt)).rowcount
    if count:
        after_commit(conn, CHANGED)
    return count


# --- re-sends of open conditions' alerts to Alertmanagers (docs/NOTIFICATIONS.md, "Alertmanager") ------


def _open(event: Any) -> ColumnElement[bool]:
    """Whether `event` (a row of notification_event) raised a condition still open, the one definition of
    it: what the look for re-sends sends again (`_resendable`), and what retention keeps (`prune_delivered`).
    Open: not marked cleared (`clear_condition` for a keyed event, a task held too long; `_mark_cleared`
    for the others, when their clearing is recorded) and, unkeyed, still holding in the rows it concerns
    (`_holds`), since some ends record no clearing. Each test is by key: nothing here reads the events
    that came later (a look for them by time read a week of events for each open raise: hundreds of ms a
    look, every 15 s on every instance, docs/PERFORMANCE.md "The look for re-sends")."""
    holds = _holds(event)
    raised = [
        and_(event.c.type == condition.value, event.c[subject].is_not(None), holds[condition])
        for condition, subject in CONDITION_SUBJECT.items()
    ]
    return and_(
        event.c.type.in_([c.value for c in CONDITION_SUBJECT]),
        event.c.cleared_at.is_(None),
        or_(event.c.dedupe_key.is_not(None), *raised),
    )


def _holds(event: Any) -> dict[EventType, ColumnElement[bool]]:
    """Whether each unkeyed condition `event` raised still holds in the rows it concerns: some ends record
    no clearing (an operator resuming a schedule rackflow paused, a schedule deleted with its halted or
    awaiting run), and their alerts must not be sent again. The schedule's pause must be the one reported
    (begun at or before it), not a later one. A long hold is keyed: its watcher clears it."""
    run, schedule = task_schedule_run.c, task_schedule.c
    return {
        EventType.RUN_HALTED: exists().where(run.id == event.c.run_id, run.state == "halted"),
        EventType.RUN_AWAITING_APPROVAL: exists().where(
            run.id == event.c.run_id, run.state == "awaiting_approval"
        ),
        EventType.SCHEDULE_PAUSED: exists().where(
            schedule.id == event.c.schedule_id, schedule.enabled.is_(False), schedule.paused_at <= event.c.at
        ),
        EventType.TASK_HELD_TOO_LONG: exists().where(tasks.c.id == event.c.task_id),
    }


async def _mark_cleared(conn: AsyncConnection, events: Sequence[Event]) -> None:
    """Mark cleared the unkeyed raised events of the conditions these events clear (those raised at or
    before the clearing), so the look for open alerts to send again (`_open`) passes them by without
    reading on. A keyed raise (a task held too long) is marked by `clear_condition`, exactly: its task may
    be held again, by a new raise recorded with the clearing."""
    for event in events:
        condition = CLEARS.get(event.type)
        if condition in (None, EventType.TASK_HELD_TOO_LONG):  # a long hold is keyed: `clear_condition`
            continue
        if (value := getattr(event, CONDITION_SUBJECT[condition])) is None:
            continue
        await conn.execute(
            update(notification_event)
            .where(
                _event.type == condition.value,
                notification_event.c[CONDITION_SUBJECT[condition]] == value,
                _event.at <= event.at,
                _event.dedupe_key.is_(None),
                _event.cleared_at.is_(None),
            )
            .values(cleared_at=event.at)
        )


def _clearing() -> ColumnElement[bool]:
    """Whether a delivery's event is a clearing (its alert to an Alertmanager is resolved): its event looked
    up by key, where an `IN` of every clearing's id read every event of the week."""
    return exists().where(_event.id == _delivery.event_id, _event.type.in_([t.value for t in CLEARS]))


def _resendable(
    channel_ids: Collection[uuid.UUID], now: datetime, interval: timedelta
) -> ColumnElement[bool]:
    """The delivered deliveries, to these channels, that an Alertmanager is sent again: the alerts of
    events whose condition is still open, and a clearing's resolved alert once more, while one is owed
    (`next_attempt_at` after `delivered_at`, which that send sets it back to). A re-send claimed before the
    clearing may still be under way on any instance when the clearing is sent, and reach Alertmanager
    last, which keeps what came last: the alert would fire on until its `endsAt`. Owed no longer once such
    a re-send's `endsAt` has passed (`ALERT_RESEND_ENDS_AFTER` intervals), the alert resolved by itself.
    A delivered row's `next_attempt_at` is when it is sent again (a pending one's, when it is tried).

    Two ranges, each read from its own index (migration 0054), never the week's events and deliveries
    whole: the deliveries of the open raises (`ix_notification_event_type_cleared_at`, then each raise's
    deliveries by its key), and the channels' deliveries of the last few intervals, of which the clearings
    (`ix_notification_delivery_channel_id_delivered_at`)."""
    delivered = (_delivery.channel_id.in_(list(channel_ids)), _delivery.state == DELIVERED)
    of_open_raises = select(_delivery.id).where(
        *delivered, _delivery.event_id.in_(select(_event.id).where(_open(notification_event)))
    )
    resolved_again = select(_delivery.id).where(
        *delivered,
        _delivery.delivered_at >= now - ALERT_RESEND_ENDS_AFTER * interval,
        _delivery.next_attempt_at > _delivery.delivered_at,
        _clearing(),
    )
    return _delivery.id.in_(union_all(of_open_raises, resolved_again))


async def next_resend(
    conn: AsyncConnection, channel_ids: Collection[uuid.UUID], now: datetime, interval: timedelta
) -> datetime | None:
    """When the first of these channels' alerts is to be sent again (`_resendable`), if any."""
    if not channel_ids:
        return None
    stmt = select(func.min(_delivery.next_attempt_at)).where(_resendable(channel_ids, now, interval))
    found: datetime | None = (await conn.execute(stmt)).scalar()
    return found


async def claim_resends(
    db: Database,
    conn: AsyncConnection,
    channel_ids: Collection[uuid.UUID],
    now: datetime,
    limit: int,
    interval: timedelta,
) -> list[tuple[uuid.UUID, Event]]:
    """Up to `limit` alerts due to be sent again to these channels (`_resendable`), each with its channel,
    claimed as a delivery is (`claim_deliveries`: SKIP LOCKED, and moved on in the same statement: an open
    condition's an `interval`, a clearing's back to its `delivered_at`, owing nothing more), so one
    instance of a cluster sends each, whichever looks first. A clearing whose condition is open again is
    passed by (`_raised_again`). A re-send's outcome is not written: one that failed is sent at the next
    interval, as Prometheus does (a clearing's, not again). No row is added."""
    due = (
        select(_delivery.id)
        .where(_resendable(channel_ids, now, interval), _delivery.next_attempt_at <= now)
        .order_by(_delivery.next_attempt_at, _delivery.id)
        .limit(limit)
    )
    ids = list((await conn.execute(db.skip_locked(due))).scalars())
    if not ids:
        return []
    moved = (
        update(notification_delivery)
        .where(_delivery.id.in_(ids))
        .values(next_attempt_at=case((_clearing(), _delivery.delivered_at), else_=now + interval))
        .returning(_delivery.channel_id, _delivery.event_id)
    )
    rows = list(await conn.execute(moved))
    events = await _lookup(conn, notification_event, [row.event_id for row in rows])
    claimed = [(row.channel_id, _event_from(events[row.event_id])) for row in rows]
    raised_again = await _raised_again(conn, [event for _, event in claimed if event.type in CLEARS])
    return [(channel_id, event) for channel_id, event in claimed if event.id not in raised_again]


async def _raised_again(conn: AsyncConnection, clearings: Sequence[Event]) -> set[uuid.UUID]:
    """The clearings whose condition is open again (raised since, or at the same time: a task held anew
    as its hold ends): their resolved alert must not be sent once more, which would resolve the open
    alert of the same labels; the open raise's re-sends keep it firing."""
    found: set[uuid.UUID] = set()
    for event in clearings:
        condition = CLEARS[event.type]
        subject = CONDITION_SUBJECT[condition]
        if (value := getattr(event, subject)) is None:
            continue
        open_raise = exists().where(
            _open(notification_event),
            _event.type == condition.value,
            notification_event.c[subject] == value,
        )
        if (await conn.execute(select(open_raise))).scalar():
            found.add(event.id)
    return found


@dataclass(frozen=True)
class Work:
    """What a delivery round has to do: whether events wait to be fanned out, the channels, each channel's
    earliest pending delivery (due when it is not after the round's now; a claimed one is pending until its
    lease ends), and the tokens each channel's bucket holds (`take_tokens` locks and draws)."""

    new_events: bool
    channels: list[Channel]
    pending: dict[uuid.UUID, datetime]
    tokens: dict[uuid.UUID, float]
    now: datetime

    @property
    def due(self) -> set[uuid.UUID]:
        return {channel_id for channel_id, at in self.pending.items() if at <= self.now}

    def next_due(self) -> datetime | None:
        """When the first pending delivery of an enabled channel not due yet comes due (a retry's back-off
        or a send's lease ending), if any: what an idle delivery loop sleeps until."""
        enabled = {c.id for c in self.channels if c.enabled}
        later = (at for channel_id, at in self.pending.items() if at > self.now and channel_id in enabled)
        return min(later, default=None)


async def work(conn: AsyncConnection, now: datetime, burst: timedelta) -> Work:
    """Three short reads (the partial indexes of new events and of pending deliveries, and the channels)."""
    new = select(_event.id).where(_event.fanned_out.is_(False)).limit(1)
    pending = (
        select(_delivery.channel_id, func.min(_delivery.next_attempt_at))
        .where(_delivery.state == PENDING)
        .group_by(_delivery.channel_id)
    )
    rows = list(await conn.execute(select(notification_channel).order_by(_channel.name)))
    return Work(
        new_events=(await conn.execute(new)).first() is not None,
        channels=[_channel_from(row) for row in rows],
        pending={channel_id: at for channel_id, at in await conn.execute(pending)},
        tokens={
            row.id: tokens_now(row.rate_tokens, row.rate_at, now, row.rate_per_minute, burst) for row in rows
        },
        now=now,
    )


@dataclass(frozen=True)
class Backlog:
    """What waits: the oldest undelivered event's time (None: nothing waits), and dead deliveries."""

    oldest: datetime | None
    dead: int


async def backlog(conn: AsyncConnection) -> Backlog:
    """The outbox's age (the oldest event not fanned out, or with a pending delivery) and dead count, of
    enabled channels only: a disabled channel's deliveries wait, unsent, by the operator's choice (and are
    sent when it is enabled again), so they are no backlog, and disabling a noisy channel must not page
    (RackflowNotificationOutboxOld, RackflowNotificationsDead)."""
    enabled = select(_channel.id).where(_channel.enabled.is_(True))
    pending_event = (
        select(func.min(_event.at))
        .join(notification_delivery, _delivery.event_id == _event.id)
        .where(_delivery.state == PENDING, _delivery.channel_id.in_(enabled))
    )
    new_event = select(func.min(_event.at)).where(_event.fanned_out.is_(False))
    dates = [(await conn.execute(stmt)).scalar() for stmt in (pending_event, new_event)]
    dead_count = select(func.count()).where(_delivery.state == DEAD, _delivery.channel_id.in_(enabled))
    dead = (await conn.execute(dead_count)).scalar_one()
    oldest = min((d for d in dates if d is not None), default=None)
    return Backlog(oldest, dead)


def prune_delivered(
    db: Database, retention: timedelta, *, chunk: int = PRUNE_CHUNK
) -> AsyncGenerator[int, None]:
    """Delete the events older than `retention` whose deliveries all went through (with them), oldest first
    (`prune_older`). An event still pending or dead anywhere stays, to be delivered or re-driven, and so
    does the raise of a condition still open, as the look for re-sends finds it (`_open`), however old: its
    deliveries are what an Alertmanager is sent again (a rollout halted for longer than the retention
    stayed halted, and its alert resolved by its `endsAt`), and its clearing takes the raise's names. Once
    the condition clears, or ends without a clearing (its run or schedule deleted), the raise goes."""
    unfinished = exists().where(_delivery.event_id == _event.id, _delivery.state != DELIVERED)
    still_open = _open(notification_event)
    return prune_older(
        db,
        notification_event,
        retention,
        older=lambda cutoff: and_(_event.at < cutoff, _event.fanned_out.is_(True), ~unfinished, ~still_open),
        order_by=(_event.at, _event.id),
        chunk=chunk,
    )
