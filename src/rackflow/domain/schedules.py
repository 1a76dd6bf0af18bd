"""Schedule values: the schedule, its scope entries, and the record of each firing."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from rackflow.domain.inventory import ComponentFilter
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import ConflictStrategy, Operation
from rackflow.domain.windows import WindowPolicy
from rackflow.timespec import ScheduleSpec, SpecType


class OverlapPolicy(enum.StrEnum):
    """What a firing does for a scope whose previous task is still active. The value is the stored form."""

    SKIP = "skip"
    QUEUE = "queue"

    @property
    def conflict_strategy(self) -> ConflictStrategy:
        """SKIP submits with REJECT (a conflict is refused), QUEUE with QUEUE (it waits its turn)."""
        return ConflictStrategy.QUEUE if self is OverlapPolicy.QUEUE else ConflictStrategy.REJECT


Trigger = Literal["dispatch", "manual"]
# A rollout's run is "rolling", then "completed", "halted" or "cancelled"; "skipped" when the schedule's
# previous rollout was still rolling or halted (rackflow.rollouts).
RunState = Literal["running", "completed", "interrupted", "rolling", "halted", "cancelled", "skipped"]
ROLLOUT_LIVE_STATES: tuple[RunState, ...] = ("rolling", "halted")  # at most one such run per schedule
# "pending" (waiting its turn) and "not_started" (halted or cancelled first) are a rollout's.
Outcome = Literal["submitted", "skipped_overlap", "skipped_window", "failed", "pending", "not_started"]


@dataclass(frozen=True)
class Pause:
    """Why and until when a schedule is paused, and who paused it (`by`: the principal, or empty)."""

    reason: str
    by: str
    at: datetime
    resume_at: datetime | None = None


def pause_to_json(pause: Pause) -> dict[str, str | None]:
    """The pause as the audit trail records it."""
    return {
        "reason": pause.reason,
        "by": pause.by,
        "at": pause.at.isoformat(),
        "resume_at": pause.resume_at.isoformat() if pause.resume_at else None,
    }


@dataclass(frozen=True)
class Schedule:
    id: uuid.UUID
    name: str
    spec: ScheduleSpec
    overlap_policy: OverlapPolicy
    enabled: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    operation: Operation
    queue_timeout: timedelta
    description: str
    pause: Pause | None = None  # set only while paused by PauseTaskSchedule (enabled is False)
    window_policy: WindowPolicy = WindowPolicy.SKIP
    rollout: RolloutPolicy | None = None  # None: a firing starts every scope at once

    @property
    def is_consumed(self) -> bool:
        """A one-time schedule that has fired: it has no next run and can never be re-armed."""
        return self.spec.type is SpecType.ONE_TIME and self.next_run_at is None


SCHEDULE_ORDER_FIELDS = ("created_at", "name", "next_run_at", "last_run_at")


@dataclass(frozen=True)
class ScheduleOrder:
    """How a schedule list is sorted: one of SCHEDULE_ORDER_FIELDS, ascending unless `descending`."""

    field: str = "created_at"
    descending: bool = False

    def key_of(self, schedule: Schedule) -> tuple[Any, ...]:
        """The schedule's place in a list in this order (a page token holds it): the order's field, then
        the creation time and id that break ties."""
        return (getattr(schedule, self.field), schedule.created_at, schedule.id)

    @property
    def name(self) -> str:
        """As ListTaskSchedules' order_by spells it."""
        return f"{self.field} desc" if self.descending else self.field


CREATION_ORDER = ScheduleOrder()  # ListTaskSchedules' order when none is asked for


@dataclass(frozen=True)
class Scope:
    """One rack a schedule targets; `filter=None` means all of the rack's components."""

    id: uuid.UUID
    schedule_id: uuid.UUID
    rack_id: uuid.UUID
    filter: ComponentFilter | None
    last_task_id: uuid.UUID | None
    created_at: datetime


@dataclass(frozen=True)
class ScopeOutcome:
    """What one firing did for one scope: `task_id` when submitted, `error` when failed. `canary`: one of
    a rollout's first scopes."""

    scope_id: uuid.UUID
    rack_id: uuid.UUID
    outcome: Outcome
    task_id: uuid.UUID | None = None
    error: str = ""
    canary: bool = False


@dataclass(frozen=True)
class Run:
    """One firing of a schedule, as run history shows it.

    A rollout's run also keeps its policy (as it was when it fired), why it halted or was skipped, and
    what a resume excused: the failures before it, and the canary gate (`resumed`).
    """

    id: uuid.UUID
    schedule_id: uuid.UUID
    fired_at: datetime
    trigger: Trigger
    state: RunState
    outcomes: tuple[ScopeOutcome, ...]
    rollout: RolloutPolicy | None = None
    reason: str = ""
    failures_excused: int = 0
    resumed: bool = False
