"""Audit values: one recorded event."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

OK = "OK"  # the outcome of an action that succeeded; a refused one records its status code's name
SYSTEM_PRINCIPAL = "rackflow"  # the principal of what rackflow does by itself (a pause ending at resume_at)
# What rackflow records by itself under a name that is no RPC's: a run awaiting approval expiring.
EXPIRE_RUN = "ExpireTaskScheduleRun"
SYSTEM_METHODS = frozenset({EXPIRE_RUN})


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
