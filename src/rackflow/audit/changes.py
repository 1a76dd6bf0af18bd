"""What an audited call changed that its request does not name, told to its audit event by the service
that changed it.

DeleteRack names a rack and RemoveComponent a component; they also take entries out of schedules' scopes
(or narrow them). The event must name those schedules, so that an operator reading a schedule's history
finds it, and say what happened to each; only the service's transaction knows what it changed (a read
afterwards could race with another change). So the audit interceptor opens a `Changes` for each call
(`noting`), the service adds its transaction's result once it has committed (`note_scope_changes`), and
the event records them: the schedules' ids in `target_ids`, what happened in `changes`. A service called
outside an audited call (rackflow itself, a test) notes nothing. Likewise UpdateMaintenanceWindow and
DeleteMaintenanceWindow name a window, and also move, release or end the tasks waiting for its openings:
their ids and what became of each (`note_deferral_changes`).

The event's id is made when the call begins (`Changes.event_id`), not when it is written: what one of the
call's transactions records for later may then name the event that will tell of the call
(`listening_call`: a decision a window's change owes, `rackflow.audit.decisions`), before that event
exists. Only such a record reads it; every other call merely makes its id earlier.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from rackflow.domain.schedules import ScopeChange
from rackflow.domain.tasks import DeferralChange
from rackflow.ids import new_id
from rackflow.timespec import format_rfc3339


@dataclass
class Changes:
    """The changes noted during one audited call: the ids they touched, each change as JSON, and the id
    the call's event will carry (`AuditTrail.record`'s `event_id`)."""

    target_ids: list[str] = field(default_factory=list)
    recorded: list[dict[str, Any]] = field(default_factory=list)
    event_id: uuid.UUID = field(default_factory=new_id)


_noted: ContextVar[Changes | None] = ContextVar("rackflow_audit_changes", default=None)


@contextmanager
def noting(changes: Changes) -> Iterator[None]:
    """Collect into `changes` what the services note while the block runs (the audited call)."""
    reset = _noted.set(changes)
    try:
        yield
    finally:
        _noted.reset(reset)


def note_scope_changes(scope_changes: Sequence[ScopeChange]) -> None:
    """Tell the audited call's event which schedule scope entries were removed or narrowed (call it once
    the change has committed)."""
    changes = _noted.get()
    if changes is None:
        return
    for change in scope_changes:
        changes.target_ids.append(str(change.schedule_id))
        changes.recorded.append(_scope_change_json(change))


def note_deferral_changes(deferral_changes: Sequence[DeferralChange]) -> None:
    """Tell the audited call's event (a window's creation, update or deletion) which tasks it moved, released,
    rebound (to an ALLOW window's new end) or ended (call it once the change has committed)."""
    changes = _noted.get()
    if changes is None:
        return
    for change in deferral_changes:
        changes.target_ids.append(str(change.task_id))
        changes.recorded.append(deferral_change_json(change))


def note_schedule_of_run(schedule_id: uuid.UUID) -> None:
    """Tell the audited call's event (an action on a run: approve, reject, retry) the schedule of the run
    it acts on, as soon as the run is read: the event then names it whatever the call's answer, so a
    refused one (the two-person rule's, a second approval, a run no longer waiting) is in the schedule's
    history (`rackflow audit --target SCHEDULE`) as an accepted one is, not only in the run's."""
    changes = _noted.get()
    if changes is not None:
        changes.target_ids.append(str(schedule_id))


def noted_by_a_call() -> bool:
    """Whether an audited call is listening: what a service changes now is noted on that call's event, so
    a decision made outside any call (an executor's, a firing's) records its own (`audit.decisions`)."""
    return listening_call() is not None


def listening_call() -> Changes | None:
    """The audited call listening now (its event's id: `Changes.event_id`), or None outside any."""
    return _noted.get()


def deferral_change_json(change: DeferralChange) -> dict[str, Any]:
    """What became of a task a window's change decided, as an event's `changes` holds it."""
    recorded: dict[str, Any] = {
        "deferred_task": change.change,
        "task_id": str(change.task_id),
        "run_id": str(change.run_id),
        "rack_id": str(change.rack_id),
    }
    for key, at in (("not_before", change.not_before), ("not_after", change.not_after)):
        if at is not None:
            recorded[key] = format_rfc3339(at)
    if change.outcome:
        recorded["outcome"] = change.outcome
    if change.held_by:
        recorded["held_by"] = change.held_by
    return recorded


def _scope_change_json(change: ScopeChange) -> dict[str, Any]:
    recorded: dict[str, Any] = {
        "scope_entry": "removed" if change.removed else "narrowed",
        "schedule_id": str(change.schedule_id),
        "schedule_name": change.schedule_name,
        "scope_id": str(change.scope_id),
        "rack_id": str(change.rack_id),
    }
    if change.components_left is not None:
        recorded["components_left"] = sorted(str(i) for i in change.components_left)
    return recorded
