"""What rackflow decides by itself about tasks, outside any audited call, recorded in the audit trail in the
decision's own transaction.

A window's change decides its tasks in its transaction, and its call's event names each (`changes`:
`note_deferral_changes`). A task whose row a claim held then is owed a decision (`store.decisions_owed`),
made later: by the change's own instance, in the call (noted on that call's event as well), or, should
that instance die or the decision fail, by an executor's look again; and a firing's submit decides its
tasks once it committed when the windows changed under it (`rackflow.tasks.deferrals`). Likewise a freeze's
hold that a change could not let go of is let go by an executor's look again (`rackflow.windows.gate`).
Those outside any call no call's event would name: an operator reading a rack's or a task's history would
find a task ended, released or rebound and no word of why. So each writes its own events, one per task,
by the principal `rackflow` (`SYSTEM_PRINCIPAL`), method `RedecideWindowTask` or `ReleaseFreezeHold`,
naming the task, its run and rack (and the window that closes the rack now, when the windows name one).

Why in the decision's transaction, with one INSERT for all its tasks, rather than `AuditTrail.record`
after commit: the decision and its rows commit together, so no crash between the two loses the row (a
look again's decision leaves no one to record it later), and a rolled-back decision leaves none; the
spool is not needed (a database that cannot take the row did not take the decision either). These
decisions are rare (only what a claim held at a change's instant, or what an instance did not live to
decide), so the cost, one statement per decision transaction that decided something (two when a cause
names a call's event, below), is small; a look
that decides nothing writes nothing. A decision made while an audited call listens (`noted_by_a_call`)
writes no row of its own: the call's event names it, once.

A decision a task was owed also names what made it owed (`owed_by`, the cause its record kept:
`store.decisions_owed`), so that an operator goes from "task ended by rackflow" to the change that caused
it: a window's change (`owed_by_change`: which window, created, updated or deleted, and, when an audited
call made it, that call's event id and principal; the event is in the window's history, which this row
joins), or a firing's submit that found the windows changed since its claim (`owed_by_submit`: when it
planned, and which windows differ, each of whose changes is in its window's history from then on). The
cause is made only for a task skipped or owed, in the transaction that owes it, so a change that owes
nothing pays nothing for it; a record a release before migration 0050 wrote has none ("not_recorded").
The call's event id is made when the call begins, and its event written once the call ended, after the
change committed, and not in its transaction (`audit.trail`): so it may not be in the trail yet when a look
again decides (the call still under way), nor ever (its instance died first, the very case a look again is
for, or its spool was full). So the row says whether the trail held that event as it was written
(`EVENT_FOUND` false when not; one read by id per transaction whose causes name calls), rather than name an
event as if it were there.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit.changes import deferral_change_json, listening_call, noted_by_a_call
from rackflow.domain.audit import (
    EVENT_FOUND,
    NOT_RECORDED,
    OK,
    REDECIDE_WINDOW_TASK,
    RELEASE_FREEZE_HOLD,
    SYSTEM_PRINCIPAL,
    WINDOWS_CHANGED_BEFORE_SUBMIT,
    AuditEvent,
)
from rackflow.domain.tasks import DeferralChange, ReleasedHold
from rackflow.domain.windows import MaintenanceWindow
from rackflow.ids import new_id
from rackflow.security import audited_name
from rackflow.store import audit as store
from rackflow.store.decisions_owed import Owed
from rackflow.timespec import format_rfc3339

# Who made a decision outside a call (an event's `request.decided_by`): an executor's look again; the
# instance of a firing once its submit committed; the instance of a window's change once it committed.
LOOK_AGAIN = "look_again"
SUBMIT = "submit"
CHANGE = "change"


def owed_by_change(change: str, window: MaintenanceWindow) -> dict[str, Any]:
    """The cause of a decision a window's `change` (`domain.audit.WINDOW_CREATED`, …) owes, made in its
    transaction: the window (as it is, or was when deleted) and, when an audited call makes the change,
    that call's event (its id is known before it is written: `audit.changes.Changes.event_id`) and
    principal."""
    return {"change": change, "window_id": str(window.id), "window_name": window.name, **_the_call()}


def owed_by_submit(planned_at: datetime, window_ids: Collection[uuid.UUID]) -> dict[str, Any]:
    """The cause of a decision a firing's submit owes: the windows (`window_ids`, created, changed or
    deleted) differ from those its plan read at `planned_at` (its claim, or its approval's start). No one
    call: each of those windows' changes since then is its own event in that window's history (the call
    the submit is part of, if any, an approval say, is named as a change's call is)."""
    return {
        "change": WINDOWS_CHANGED_BEFORE_SUBMIT,
        "planned_at": format_rfc3339(planned_at),
        "window_ids": [str(window_id) for window_id in sorted(window_ids, key=str)],
        **_the_call(),
    }


def _the_call() -> dict[str, Any]:
    call = listening_call()
    return {} if call is None else {"event_id": str(call.event_id), "principal": audited_name()}


async def record_deferral_decisions(
    conn: AsyncConnection,
    changes: Sequence[DeferralChange],
    at: datetime,
    decided_by: str,
    owed: Mapping[uuid.UUID, Owed],
) -> None:
    """In the caller's transaction, which made these decisions, owed as `owed` recorded them (its records
    by task, `store.decisions_owed.recorded`'s, which hold every task it decided): one event per task,
    unless an audited call listens (its event notes them)."""
    if not changes or noted_by_a_call():
        return
    calls = {_call_event(owed[change.task_id]) for change in changes}
    found = await store.in_the_trail(conn, {event_id for event_id in calls if event_id is not None})
    events = [_deferral_event(change, at, decided_by, owed[change.task_id], found) for change in changes]
    await store.insert_events(conn, events)


async def record_freeze_releases(
    conn: AsyncConnection, released: Sequence[ReleasedHold], at: datetime, decided_by: str
) -> None:
    """In the caller's transaction, which let go of these freeze holds: one event per task, unless an
    audited call listens (the window's change it is part of is that call's event)."""
    if not released or noted_by_a_call():
        return
    await store.insert_events(conn, [_release_event(hold, at, decided_by) for hold in released])


def _deferral_event(
    change: DeferralChange, at: datetime, decided_by: str, owed: Owed, found: Collection[uuid.UUID]
) -> AuditEvent:
    """The event of one task's decision; `owed`, the record that made it owed; `found`, the events of the
    calls that made decisions owed that the trail holds now (`EVENT_FOUND` marks one it does not)."""
    request: dict[str, Any] = {"task_id": str(change.task_id), "decided_by": decided_by}
    window = [] if change.window_id is None else [str(change.window_id)]
    if window:
        request["window_id"] = window[0]
    if change.reason:
        request["reason"] = change.reason
    cause = owed.cause or {"change": NOT_RECORDED}
    request["owed_by"] = {**cause, "owed_since": format_rfc3339(owed.owed_since)}
    call = _call_event(owed)
    if call is not None and call not in found:
        request["owed_by"][EVENT_FOUND] = False
    caused_by = [cause["window_id"]] if "window_id" in cause else list(cause.get("window_ids", ()))
    targets = (str(change.task_id), str(change.run_id), str(change.rack_id), *window, *caused_by)
    return _event(
        at, REDECIDE_WINDOW_TASK, tuple(dict.fromkeys(targets)), request, deferral_change_json(change)
    )


def _call_event(owed: Owed) -> uuid.UUID | None:
    """The event of the audited call whose change made the task owed (its cause's `event_id`), if one
    did."""
    event_id = (owed.cause or {}).get("event_id")
    return None if event_id is None else uuid.UUID(event_id)


def _release_event(hold: ReleasedHold, at: datetime, decided_by: str) -> AuditEvent:
    recorded: dict[str, Any] = {"freeze_hold": "released", "task_id": str(hold.task_id)}
    if hold.run_id is not None:
        recorded["run_id"] = str(hold.run_id)
    recorded["rack_id"] = str(hold.rack_id)
    if hold.held_reason:
        recorded["held_reason"] = hold.held_reason
    run = [] if hold.run_id is None else [str(hold.run_id)]
    targets = (str(hold.task_id), *run, str(hold.rack_id))
    request = {"task_id": str(hold.task_id), "decided_by": decided_by}
    return _event(at, RELEASE_FREEZE_HOLD, targets, request, recorded)


def _event(
    at: datetime, method: str, targets: tuple[str, ...], request: dict[str, Any], change: dict[str, Any]
) -> AuditEvent:
    return AuditEvent(
        id=new_id(),
        at=at,
        principal=SYSTEM_PRINCIPAL,
        method=method,
        target_ids=targets,
        outcome=OK,
        error="",
        request=request,
        changes=[change],
    )
