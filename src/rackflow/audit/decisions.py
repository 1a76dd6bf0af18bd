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
decide), so the cost, one statement per decision transaction that decided something, is small; a look
that decides nothing writes nothing. A decision made while an audited call listens (`noted_by_a_call`)
writes no row of its own: the call's event names it, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit.changes import deferral_change_json, noted_by_a_call
from rackflow.domain.audit import OK, REDECIDE_WINDOW_TASK, RELEASE_FREEZE_HOLD, SYSTEM_PRINCIPAL, AuditEvent
from rackflow.domain.tasks import DeferralChange, ReleasedHold
from rackflow.ids import new_id
from rackflow.store import audit as store

# Who made a decision outside a call (an event's `request.decided_by`): an executor's look again; the
# instance of a firing once its submit committed; the instance of a window's change once it committed.
LOOK_AGAIN = "look_again"
SUBMIT = "submit"
CHANGE = "change"


async def record_deferral_decisions(
    conn: AsyncConnection, changes: Sequence[DeferralChange], at: datetime, decided_by: str
) -> None:
    """In the caller's transaction, which made these decisions: one event per task, unless an audited
    call listens (its event notes them)."""
    if not changes or noted_by_a_call():
        return
    await store.insert_events(conn, [_deferral_event(change, at, decided_by) for change in changes])


async def record_freeze_releases(
    conn: AsyncConnection, released: Sequence[ReleasedHold], at: datetime, decided_by: str
) -> None:
    """In the caller's transaction, which let go of these freeze holds: one event per task, unless an
    audited call listens (the window's change it is part of is that call's event)."""
    if not released or noted_by_a_call():
        return
    await store.insert_events(conn, [_release_event(hold, at, decided_by) for hold in released])


def _deferral_event(change: DeferralChange, at: datetime, decided_by: str) -> AuditEvent:
    request: dict[str, Any] = {"task_id": str(change.task_id), "decided_by": decided_by}
    window = [] if change.window_id is None else [str(change.window_id)]
    if window:
        request["window_id"] = window[0]
    if change.reason:
        request["reason"] = change.reason
    targets = (str(change.task_id), str(change.run_id), str(change.rack_id), *window)
    return _event(at, REDECIDE_WINDOW_TASK, targets, request, deferral_change_json(change))


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
