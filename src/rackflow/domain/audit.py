"""Audit values: one recorded event, and how a target given by name is told from the things of that name."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

from rackflow.config import AUDIT_JSON_MAX_BYTES, AUDIT_REFUSED_TARGET_IDS
from rackflow.errors import InvalidArgument, NotFound
from rackflow.security import SYSTEM_PRINCIPAL as SYSTEM_PRINCIPAL  # the trail's name for rackflow itself

OK = "OK"  # the outcome of an action that succeeded; a refused one records its status code's name
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
    the scope entries DeleteRack and RemoveComponent removed or narrowed), None when nothing. What the trail
    keeps of each is bounded in bytes (`bounded_event`).
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


# The key that marks a JSON document of an event cut to AUDIT_JSON_MAX_BYTES (`bounded_json`): a request's
# object gets it as a member, a list (`changes`) as its last item, with the document's size as it came.
TRUNCATED = "rackflow_truncated"
# A cut document first keeps texts of up to this many characters and lists (and objects) of up to this many
# items, then fewer and fewer until it fits.
_CUTS = ((16384, 1024), (8192, 512), (4096, 256), (2048, 128), (1024, 64), (256, 16), (64, 4), (16, 1))
# About what an event holds besides its JSON and ids on the wire (its id, time, field tags), and an id.
_EVENT_OVERHEAD_BYTES = 128
_TARGET_ID_BYTES = 40

_J = TypeVar("_J", dict[str, Any], list[dict[str, Any]])


def json_bytes(value: object) -> int:
    """The size of `value` as the API sends it (`api.convert.audit`: ASCII JSON, one byte a character)."""
    return len(json.dumps(value, sort_keys=True))


def event_bytes(event: AuditEvent) -> int:
    """About how many bytes `event` takes in a ListAuditEvents answer (what a page's budget counts)."""
    documents = (event.request, event.schedule_before, event.schedule_after, event.changes)
    texts = (event.principal, event.method, event.outcome, event.error)
    return (
        _EVENT_OVERHEAD_BYTES
        + sum(json_bytes(d) for d in documents if d is not None)
        + sum(len(t.encode()) for t in texts)
        + _TARGET_ID_BYTES * len(event.target_ids)
    )


def bounded_event(event: AuditEvent) -> AuditEvent:
    """`event` as the trail keeps it: each JSON document at most AUDIT_JSON_MAX_BYTES (`bounded_json`),
    and a refused call's `target_ids` at most AUDIT_REFUSED_TARGET_IDS ids (the first ones, the request's
    own; its request then says how many there were). An accepted call's ids are all kept: they are what it
    touched, and what a thing's history finds it by.

    Why: a caller may send a request up to gRPC's receive limit (64 MiB), refused or accepted, and the
    trail records it; kept whole, a few such rows made every page holding them larger than gRPC sends, and
    the trail could not be read past them. An event already within bounds is returned as it is."""
    ids = event.target_ids
    request = bounded_json(event.request)
    if event.outcome != OK and len(ids) > AUDIT_REFUSED_TARGET_IDS:
        ids = ids[:AUDIT_REFUSED_TARGET_IDS]
        mark = {**request.get(TRUNCATED, {}), "target_ids": len(event.target_ids)}
        request = {**request, TRUNCATED: mark}
    return replace(
        event,
        target_ids=ids,
        request=request,
        schedule_before=_bounded_or_none(event.schedule_before),
        schedule_after=_bounded_or_none(event.schedule_after),
        changes=_bounded_or_none(event.changes),
    )


def _bounded_or_none(value: _J | None) -> _J | None:
    return None if value is None else bounded_json(value)


def bounded_json(value: _J, limit: int = AUDIT_JSON_MAX_BYTES) -> _J:
    """`value` if its JSON (`json_bytes`) is at most `limit` bytes; else a copy cut to fit, still valid
    JSON of the same shape: long texts shortened to their start and `… [N more characters]`, long lists and
    objects to their first items and `… [N more items]` (an object's: a `…` member, `[N more keys]`),
    keeping as much as fits; marked with TRUNCATED: `{"original_bytes": N, "limit_bytes": limit}`. Each try
    stops building once past `limit`, so cutting a huge document costs about `limit`, not its size."""
    size = json_bytes(value)
    if size <= limit:
        return value
    mark = {"original_bytes": size, "limit_bytes": limit}
    for chars, items in _CUTS:
        try:
            cut: _J = _marked(_shortened(value, chars, items, _Spent(limit)), mark)
        except _TooBig:
            continue
        if json_bytes(cut) <= limit:
            return cut
    nothing: _J = _marked([] if isinstance(value, list) else {}, mark)
    return nothing


def _marked(value: Any, mark: dict[str, Any]) -> Any:
    if isinstance(value, list):
        return [*value, {TRUNCATED: mark}]
    return {**value, TRUNCATED: mark}


class _TooBig(Exception):
    """A try of `bounded_json` passed its limit: try keeping less."""


@dataclass
class _Spent:
    limit: int
    spent: int = 0

    def add(self, size: int) -> None:
        self.spent += size
        if self.spent > self.limit:
            raise _TooBig


def _shortened(value: Any, chars: int, items: int, spent: _Spent) -> Any:
    """`value` with texts past `chars` characters and lists and objects past `items` items cut (marked)."""
    if isinstance(value, str):
        kept = value if len(value) <= chars else f"{value[:chars]}… [{len(value) - chars} more characters]"
        spent.add(len(kept) + 4)
        return kept
    if isinstance(value, list):
        shortened = [_shortened(item, chars, items, spent) for item in value[:items]]
        if len(value) > items:
            shortened.append(_shortened(f"… [{len(value) - items} more items]", 64, items, spent))
        return shortened
    if isinstance(value, dict):
        kept_members: dict[str, Any] = {}
        for index, (key, item) in enumerate(value.items()):
            if index == items:
                kept_members["…"] = _shortened(f"[{len(value) - items} more keys]", 64, items, spent)
                break
            kept_members[_shortened(key, chars, items, spent)] = _shortened(item, chars, items, spent)
        return kept_members
    spent.add(24)
    return value


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
