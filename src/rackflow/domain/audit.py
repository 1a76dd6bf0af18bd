"""Audit values: one recorded event, and how a target given by name is told from the things of that name."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from rackflow.errors import InvalidArgument, NotFound

OK = "OK"  # the outcome of an action that succeeded; a refused one records its status code's name
SYSTEM_PRINCIPAL = "rackflow"  # the principal of what rackflow does by itself (a pause ending at resume_at)
# What rackflow records by itself under a name that is no RPC's: a run awaiting approval expiring; a
# task's decision a window's change owed it, made outside any audited call (an executor's look again, a
# firing's submit: `rackflow.tasks.deferrals`); a freeze's hold an executor's look again let go of
# (`rackflow.windows.gate`).
EXPIRE_RUN = "ExpireTaskScheduleRun"
REDECIDE_WINDOW_TASK = "RedecideWindowTask"
RELEASE_FREEZE_HOLD = "ReleaseFreezeHold"
SYSTEM_METHODS = frozenset({EXPIRE_RUN, REDECIDE_WINDOW_TASK, RELEASE_FREEZE_HOLD})
# What made a task owed the decision a `REDECIDE_WINDOW_TASK` event records (its request's `owed_by.change`,
# `rackflow.audit.decisions`): a window's creation, update or deletion that skipped it; a firing's submit
# that found the windows changed since its claim; a record with no cause (written by a release before
# migration 0050).
WINDOW_CREATED = "window_created"
WINDOW_UPDATED = "window_updated"
WINDOW_DELETED = "window_deleted"
WINDOWS_CHANGED_BEFORE_SUBMIT = "windows_changed_before_submit"
NOT_RECORDED = "not_recorded"
# Set false on an `owed_by` whose `event_id` the trail did not hold as the decision was written: the call's
# event is written after the call's transaction committed (or replayed from a spool once the database is
# back), so it may come later, or never (its instance died first, or its spool was full: docs/SECURITY.md).
EVENT_FOUND = "event_found"


@dataclass(frozen=True)
class AuditEvent:
    """One action: who called `method` on which ids, when, and how it ended (`OK` or a code name).

    `request` is the request as JSON; for an action on a schedule, `schedule_before` and `schedule_after`
    hold the schedule (row and scopes) as read just before the action and just after it. `changes` is what
    the action changed that its request does not name, as its service did it (`rackflow.audit.changes`:
    the scope entries DeleteRack and RemoveComponent removed or narrowed), None when nothing.
    """

    id: uuid.UUID
    at: datetime
    principal: str
    method: str
    target_ids: tuple[str, ...]
    outcome: str
    error: str
    request: dict[str, Any]
    schedule_before: dict[str, Any] | None = None
    schedule_after: dict[str, Any] | None = None
    changes: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class EventFilter:
    """Which events to list: at or after `since`, of `method`, by `principal`, naming `target` in their
    `target_ids` (None: any)."""

    since: datetime | None = None
    method: str | None = None
    principal: str | None = None
    target: uuid.UUID | None = None


EVERY_EVENT = EventFilter()


# The kinds of audited thing an operator may name as a target, each named uniquely within its kind (a
# unique column), with how a message calls one. Names are not unique across kinds, hence `target_named`.
NAMED_TARGETS: dict[str, str] = {
    "rack": "a rack",
    "schedule": "a schedule",
    "window": "a maintenance window",
    "domain": "an NVLink domain",
    "budget": "an operation budget",
    "check": "a pre-flight check",
    "channel": "a notification channel",
}


Found = TypeVar("Found")
Found_co = TypeVar("Found_co", covariant=True)


class TargetLookups(Protocol[Found_co]):
    """A front end's look-up of a name in each kind of `NAMED_TARGETS`, as that front end's commands or
    pages look up theirs: the id (`Found_co`: an id, or an awaitable one) of the thing of that kind so
    named, or the front end's NotFound. The CLI's client is one (`rackflow.client.RackflowClient`), the
    dashboard another (`rackflow.web.refs`); `target_lookups` is the one table that pairs them with the
    kinds, so a kind added here is looked up by both front ends or fails their type check."""

    def resolve_rack_id(self, name: str, /) -> Found_co: ...
    def resolve_schedule_id(self, name: str, /) -> Found_co: ...
    def resolve_window_id(self, name: str, /) -> Found_co: ...
    def resolve_domain_id(self, name: str, /) -> Found_co: ...
    def resolve_budget_id(self, name: str, /) -> Found_co: ...
    def resolve_check_id(self, name: str, /) -> Found_co: ...
    def resolve_channel_id(self, name: str, /) -> Found_co: ...


def target_lookups(lookups: TargetLookups[Found]) -> dict[str, Callable[[str], Found]]:
    """Each kind of `NAMED_TARGETS`, in its order, with its look-up in `lookups`: what a front end asks of
    an audit target given by name before `target_named` tells which it is."""
    return {
        "rack": lookups.resolve_rack_id,
        "schedule": lookups.resolve_schedule_id,
        "window": lookups.resolve_window_id,
        "domain": lookups.resolve_domain_id,
        "budget": lookups.resolve_budget_id,
        "check": lookups.resolve_check_id,
        "channel": lookups.resolve_channel_id,
    }


def target_named(field: str, name: str, found: Mapping[str, str]) -> str:
    """The id of the one thing named `name`, given `found`: the id of each kind (a `NAMED_TARGETS` key)
    that has a thing of that name. The trail is filtered by one id, so a name that several kinds use is
    refused with their ids to choose from rather than guessed, and a name nothing has is NotFound."""
    if len(found) == 1:
        return next(iter(found.values()))
    if not found:
        kinds = list(NAMED_TARGETS)
        raise NotFound(f"{field}: no {', '.join(kinds[:-1])} or {kinds[-1]} is named {name!r}")
    kinds = [NAMED_TARGETS[kind] for kind in found]
    ids = ", ".join(f"{kind} {found[kind]}" for kind in found)
    raise InvalidArgument(
        f"{field}: {name!r} names {', '.join(kinds[:-1])} and {kinds[-1]}; give the id ({ids})"
    )
