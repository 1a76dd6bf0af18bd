"""Task values: operations, statuses, queue options."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from rackflow.domain.inventory import PowerState
from rackflow.frozen import quick_init
from rackflow.timespec import format_go_duration, format_rfc3339


class OperationKind(enum.StrEnum):
    """What a task does. The value is the wire name (`Task.operation`, `TaskSchedule.operation_type`)."""

    POWER_ON = "power_on"
    POWER_OFF = "power_off"
    POWER_RESET = "power_reset"
    BRING_UP = "bring_up"
    INGEST = "ingest"
    UPGRADE_FIRMWARE = "upgrade_firmware"

    @property
    def is_power(self) -> bool:
        return self in (OperationKind.POWER_ON, OperationKind.POWER_OFF, OperationKind.POWER_RESET)

    @property
    def display_name(self) -> str:
        """`Power On`, `Upgrade Firmware`: the name people read."""
        return self.value.replace("_", " ").title()


@dataclass(frozen=True)
class Operation:
    """An operation and its parameters, without its target."""

    kind: OperationKind
    forced: bool = False
    target_version: str = ""
    window_start: datetime | None = None
    window_end: datetime | None = None

    @property
    def summary(self) -> str:
        """What it does, in one line for people: `Power Off (forced)`, `Upgrade Firmware to v2.1.0`."""
        text = self.kind.display_name
        if self.forced:
            text += " (forced)"
        if self.target_version:
            text += f" to {self.target_version}"
        if self.window_start is not None:
            text += f" from {format_rfc3339(self.window_start)}"
        if self.window_end is not None:
            text += f" until {format_rfc3339(self.window_end)}"
        return text

    def window_over(self, now: datetime) -> bool:
        """Its own window (a firmware upgrade's `end_time`) has ended by `now`: a task made for it now could
        only fail unrun at its claim (its `not_after` is that end, `Task.too_late`; the window is half-open,
        so at the end itself it is over)."""
        return self.window_end is not None and now >= self.window_end

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind.value,
            "forced": self.forced,
            "target_version": self.target_version,
            "window_start": self.window_start.isoformat() if self.window_start else None,
            "window_end": self.window_end.isoformat() if self.window_end else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Operation:
        start, end = data.get("window_start"), data.get("window_end")
        return cls(
            kind=OperationKind(str(data["kind"])),
            forced=bool(data.get("forced", False)),
            target_version=str(data.get("target_version") or ""),
            window_start=datetime.fromisoformat(str(start)) if start else None,
            window_end=datetime.fromisoformat(str(end)) if end else None,
        )


class TaskStatus(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TERMINATED = "terminated"
    WAITING = "waiting"

    @property
    def is_active(self) -> bool:
        """Waiting, pending or running: the task still has work ahead of it (`ACTIVE_STATUSES`)."""
        return self in ACTIVE_STATUSES

    @property
    def is_final(self) -> bool:
        return not self.is_active


# An *active* task: the one definition. SQL spells it `store.tasks.is_active`, in this order, which is the
# predicate of the partial index `ix_tasks_active`.
ACTIVE_STATUSES = (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.WAITING)


# `held_by` of a task waiting out the back-off before its next attempt (`Task.retry_at`).
RETRY_HOLD = "retry"


class ConflictStrategy(enum.StrEnum):
    REJECT = "reject"
    QUEUE = "queue"


DEFAULT_QUEUE_TIMEOUT = timedelta(hours=1)
MAX_WAITING_PER_RACK = 5


@quick_init
@dataclass(frozen=True)
class QueueOptions:
    strategy: ConflictStrategy = ConflictStrategy.REJECT
    timeout: timedelta = DEFAULT_QUEUE_TIMEOUT
    ignore_windows: bool = False  # start even inside a FREEZE window (docs/WINDOWS.md)


# `held_by` of a task that waits for its window's opening (set at submission; no gate involved).
WINDOW_HOLD = "window"


@dataclass(frozen=True)
class DeferralChange:
    """What a maintenance window's change did to a task waiting for its window's opening
    (`rackflow.tasks.deferrals`): "moved" (it waits until `not_before`, by `not_after`), "released" (no
    window keeps it waiting now; it must start by `not_after`, if any) or "ended" (TERMINATED: the windows
    settle its scope as `outcome`, "skipped_window" or "missed"). `held_by`: what holds a task the windows
    let go all the same ("rollout": its rollout halted or was cancelled), if anything. `window_id` and
    `reason`: the window that closes its rack now and the words saying so, when the windows name one (it
    is moved or ended), which the event of a decision made outside the change's call records
    (`rackflow.audit.decisions`: the change's own event names its window already)."""

    task_id: uuid.UUID
    run_id: uuid.UUID
    rack_id: uuid.UUID
    change: str
    not_before: datetime | None = None
    not_after: datetime | None = None
    outcome: str = ""
    held_by: str = ""
    window_id: uuid.UUID | None = None
    reason: str = ""


@dataclass(frozen=True)
class ReleasedHold:
    """A task whose start gate's hold was let go of, to be claimed and gated again
    (`store.task_runs.release_held`): its rack, its run (None: submitted by hand), and the words of the
    hold it had (which name what held it: `waits for freeze 'launch-week' to end at …`)."""

    task_id: uuid.UUID
    rack_id: uuid.UUID
    run_id: uuid.UUID | None
    held_reason: str


@dataclass(frozen=True)
class RetryPolicy:
    """How a task retries a failure its backend classes as retryable (`StepFailed.retryable`): up to
    `max_attempts` attempts in all, attempt n+1 waiting `backoff(n)` after attempt n failed. Checked by
    `validation.check_retry`; the API's defaults are in config.py."""

    max_attempts: int
    initial_backoff: timedelta
    multiplier: float
    max_backoff: timedelta

    def backoff(self, failed_attempt: int) -> timedelta:
        """The wait after attempt `failed_attempt` (1-based) failed: the initial back-off, multiplied
        once per attempt since the first, never above the maximum."""
        grown = self.initial_backoff.total_seconds() * self.multiplier ** (failed_attempt - 1)
        return min(timedelta(seconds=grown), self.max_backoff)

    def describe(self) -> str:
        """For people: `3 attempts, back-off 30s x2 up to 10m`."""
        return (
            f"{self.max_attempts} attempts, back-off {format_go_duration(self.initial_backoff)} "
            f"x{self.multiplier:g} up to {format_go_duration(self.max_backoff)}"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "max_attempts": self.max_attempts,
            "initial_backoff_seconds": self.initial_backoff.total_seconds(),
            "multiplier": self.multiplier,
            "max_backoff_seconds": self.max_backoff.total_seconds(),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> RetryPolicy:
        return cls(
            max_attempts=int(str(data["max_attempts"])),
            initial_backoff=timedelta(seconds=float(str(data["initial_backoff_seconds"]))),
            multiplier=float(str(data["multiplier"])),
            max_backoff=timedelta(seconds=float(str(data["max_backoff_seconds"]))),
        )


@dataclass(frozen=True)
class TaskAttempt:
    """One ended attempt of a task with retries: when it ran, how it ended and, for a failure, whether
    the backend classed it as retryable."""

    task_id: uuid.UUID
    attempt: int
    started_at: datetime | None
    finished_at: datetime
    status: TaskStatus
    message: str
    retryable: bool = False


@dataclass(frozen=True)
class Fail:
    """The task must not start, ever: it ends without running, with `reason` as its message, FAILED, or
    TERMINATED (`ends_as`) when it was not refused but called off (its rollout was cancelled). What a
    start gate answers for a task it refuses (`rackflow.tasks.gates`), and what the claim records on the
    task (`Task.refusal`) so that a takeover ends it so too."""

    reason: str
    ends_as: TaskStatus = TaskStatus.FAILED


@quick_init
@dataclass(frozen=True)
class Task:
    id: uuid.UUID
    operation: Operation
    rack_id: uuid.UUID
    component_ids: tuple[uuid.UUID, ...]
    description: str
    status: TaskStatus
    message: str
    queue_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    schedule_id: uuid.UUID | None = None
    run_id: uuid.UUID | None = None  # the schedule firing that submitted it
    ignore_windows: bool = False  # submitted with the override: FREEZE windows do not hold it
    # The typed hold (`rackflow.tasks.gates`): the claim leaves the task until `not_before`; `held_by` names
    # what holds it ("window": its opening; "freeze", "budget": a start gate), `held_reason` says why to
    # people, `held_since` is when that hold began. A task that has not started by `not_after` (its
    # window's end) fails without running. Only `not_after` outlives the start.
    not_before: datetime | None = None
    not_after: datetime | None = None
    held_by: str | None = None
    held_reason: str | None = None
    held_since: datetime | None = None
    # Retries (its schedule's `RetryPolicy`, copied at submission; None: one attempt). `attempt` counts
    # from 1; a retried task goes back to PENDING held by "retry" until its back-off ends, and
    # `attempt_started_at` is when the current attempt started (`started_at` keeps the first start).
    retry: RetryPolicy | None = None
    attempt: int = 1
    attempt_started_at: datetime | None = None
    # A start gate's refusal, recorded by the claim that consulted the gates, in its transaction (migration
    # 0045): the claim leaves the task RUNNING for its executor to end, and a takeover, which no gate looks
    # at (it began), ends it with this instead of running it should that executor die first.
    refusal: Fail | None = None

    @property
    def max_attempts(self) -> int:
        return self.retry.max_attempts if self.retry is not None else 1

    def too_late(self, now: datetime) -> bool:
        """At or past the end of what the task waited for (`not_after`) without having started: a window is
        half-open (`[start, end)`, docs/WINDOWS.md), and a deferral's start deadline is too (an opening at
        it is missed), so at `not_after` itself the wait is over."""
        return self.not_after is not None and now >= self.not_after

    def retry_at(self, now: datetime) -> datetime | None:
        """When a retryable failure of the current attempt, ending at `now`, is tried again; None when
        this was the last attempt (or the task has no retries)."""
        if self.retry is None or self.attempt >= self.retry.max_attempts:
            return None
        return now + self.retry.backoff(self.attempt)

    def retry_reason(self, at: datetime, error: str) -> str:
        """What a task waiting for its next attempt says (its message and held reason)."""
        return (
            f"attempt {self.attempt + 1} of {self.max_attempts} at {format_rfc3339(at)}; "
            f"attempt {self.attempt} failed: {error}"
        )


@dataclass(frozen=True)
class Hold:
    """A task may not start before `until`, for `reason` (people read it on the task): what a start gate
    answers for a task it holds back (`rackflow.tasks.gates`), and what the store writes.

    `awaits_answer`: the gate holds the task only until an answer it asked for comes (a first round of
    pre-flight checks), which may start it at once. The executor that held it keeps a slot for it
    meanwhile, so a burst of new tasks is held, and asked about, no faster than the executor could start
    them (issue 26). Not stored: the executor counts those it held itself."""

    until: datetime
    reason: str
    awaits_answer: bool = False


@dataclass(frozen=True)
class ComponentChange:
    """What a step left on a component: its power state and/or firmware version (None: unchanged), and
    `note`, what an operator should know of a step that succeeded (a restart that was not observed), which
    the executor adds to the task's message."""

    component_id: uuid.UUID
    power_state: PowerState | None = None
    firmware_version: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class StepRecord:
    """What a step of a task's attempt recorded on one component before it acted
    (`tasks.backends.base.StepState`), kept for a run that takes the task over."""

    task_id: uuid.UUID
    attempt: int
    component_id: uuid.UUID
    values: Mapping[str, str]


@dataclass(frozen=True)
class Ending:
    """An executor is done with a task: it ran to `outcome` (status, message), or, with None, it stopped
    because the task was cancelled or taken over."""

    task_id: uuid.UUID
    rack_id: uuid.UUID
    outcome: tuple[TaskStatus, str] | None
    # A failed attempt to be tried again at `retry_at` (the task goes back to PENDING, held by "retry")
    # instead of ending; `attempt` is the record of the attempt that ended (tasks with retries only).
    retry_at: datetime | None = None
    attempt: TaskAttempt | None = None


@dataclass(frozen=True)
class InLine:
    """A task next in line as a look ahead reads it (`store.checks.queue_head`): only what the start gates'
    looks need, not its whole row (issue 26: a look ahead read some 100 rows whole to find a dozen new
    ones, and that was the event loop's work)."""

    id: uuid.UUID
    rack_id: uuid.UUID
    kind: OperationKind
    ignore_windows: bool

    @classmethod
    def of(cls, task: Task) -> InLine:
        return cls(task.id, task.rack_id, task.operation.kind, task.ignore_windows)
