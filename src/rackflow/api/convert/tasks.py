"""Operation and task conversions between protobuf messages and task values.

The schedules API reuses these: `scheduled_operation_from` reads a `ScheduledOperation` exactly as the
matching submit RPC reads its request, so a schedule's tasks get the same validation and the same
operation a direct submission would. Every converter takes the field path of the message it reads, so
errors name the field as the client wrote it (`operation.upgrade_firmware.target_version`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from rackflow.api.convert import target_spec_from, timestamp_from, timestamp_into, timestamp_to, uuid_to
from rackflow.domain.checks import CheckResult
from rackflow.domain.inventory import TargetSpec
from rackflow.domain.tasks import (
    ConflictStrategy,
    Operation,
    OperationKind,
    QueueOptions,
    Task,
    TaskAttempt,
    TaskStatus,
)
from rackflow.errors import InvalidArgument
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import (
    check_description,
    check_target_version,
    check_window,
    field_path,
    queue_timeout,
)

OperationRequest = (
    pb.PowerOnRackRequest
    | pb.PowerOffRackRequest
    | pb.PowerResetRackRequest
    | pb.BringUpRackRequest
    | pb.IngestRackRequest
    | pb.UpgradeFirmwareRequest
)

_STRATEGY_FROM_PB = {
    pb.CONFLICT_STRATEGY_REJECT: ConflictStrategy.REJECT,
    pb.CONFLICT_STRATEGY_QUEUE: ConflictStrategy.QUEUE,
}

_STRATEGY_TO_PB = {v: k for k, v in _STRATEGY_FROM_PB.items()}

_STATUS_TO_PB = {
    TaskStatus.PENDING: pb.TASK_STATUS_PENDING,
    TaskStatus.RUNNING: pb.TASK_STATUS_RUNNING,
    TaskStatus.COMPLETED: pb.TASK_STATUS_COMPLETED,
    TaskStatus.FAILED: pb.TASK_STATUS_FAILED,
    TaskStatus.TERMINATED: pb.TASK_STATUS_TERMINATED,
    TaskStatus.WAITING: pb.TASK_STATUS_WAITING,
}
_STATUS_FROM_PB = {v: k for k, v in _STATUS_TO_PB.items()}
# No attempts or checks for any task (a list's answer: `tasks_into`).
_NONE: Mapping[uuid.UUID, Any] = MappingProxyType({})


def queue_options_from(msg: pb.QueueOptions, field: str = "queue_options") -> QueueOptions:
    """Strategy REJECT unless asked; a zero timeout is the default (1 h), at most 24 h."""
    strategy = _STRATEGY_FROM_PB.get(msg.conflict_strategy)
    if strategy is None:
        raise InvalidArgument(f"{field}.conflict_strategy: unknown strategy {msg.conflict_strategy}")
    timeout = queue_timeout(msg.queue_timeout_seconds, f"{field}.queue_timeout_seconds")
    return QueueOptions(strategy, timeout, ignore_windows=msg.ignore_windows)


def operation_from_request(
    kind: OperationKind, msg: OperationRequest, field: str = ""
) -> tuple[Operation, QueueOptions, str]:
    """The operation, queue options and description of one submit request (its target is read apart).

    `field` is the path of `msg` in the enclosing request ("" for a submit RPC itself).
    """
    check_description(msg.description, field_path(field, "description"))
    queue = queue_options_from(msg.queue_options, field_path(field, "queue_options"))
    if isinstance(msg, pb.PowerOffRackRequest | pb.PowerResetRackRequest):
        return Operation(kind, forced=msg.forced), queue, msg.description
    if isinstance(msg, pb.UpgradeFirmwareRequest):
        return _firmware_from(msg, field), queue, msg.description
    return Operation(kind), queue, msg.description


def _firmware_from(msg: pb.UpgradeFirmwareRequest, field: str) -> Operation:
    check_target_version(msg.target_version, field_path(field, "target_version"))
    start_field, end_field = field_path(field, "start_time"), field_path(field, "end_time")
    start = timestamp_from(msg.start_time, start_field) if msg.HasField("start_time") else None
    end = timestamp_from(msg.end_time, end_field) if msg.HasField("end_time") else None
    check_window(start, end, start_field, end_field)
    return Operation(
        OperationKind.UPGRADE_FIRMWARE, target_version=msg.target_version, window_start=start, window_end=end
    )


def scheduled_operation_from(
    msg: pb.ScheduledOperation, field: str = "operation"
) -> tuple[Operation, QueueOptions, str, TargetSpec]:
    """A schedule's operation: what `operation_from_request` gives, plus its target spec (the scope)."""
    which = msg.WhichOneof("operation")
    if which is None:
        names = ", ".join(k.value for k in OperationKind)
        raise InvalidArgument(f"{field}: an operation is required ({names})")
    inner: OperationRequest = getattr(msg, which)
    path = f"{field}.{which}"
    operation, queue, description = operation_from_request(OperationKind(which), inner, path)
    return operation, queue, description, target_spec_from(inner.target_spec, f"{path}.target_spec")


def scheduled_operation_to(
    operation: Operation, queue: QueueOptions, description: str
) -> pb.ScheduledOperation:
    """The inverse of `scheduled_operation_from`, without a target (a schedule's lives in its scope)."""
    message = pb.ScheduledOperation()
    inner: OperationRequest = getattr(message, operation.kind.value)
    inner.description = description
    inner.queue_options.conflict_strategy = _STRATEGY_TO_PB[queue.strategy]
    inner.queue_options.queue_timeout_seconds = int(queue.timeout.total_seconds())
    if isinstance(inner, pb.PowerOffRackRequest | pb.PowerResetRackRequest):
        inner.forced = operation.forced
    if isinstance(inner, pb.UpgradeFirmwareRequest):
        inner.MergeFrom(
            pb.UpgradeFirmwareRequest(
                target_version=operation.target_version,
                start_time=timestamp_to(operation.window_start),
                end_time=timestamp_to(operation.window_end),
            )
        )
    return message


def operation_kind_from(value: str, field: str) -> OperationKind | None:
    """An operation name (`power_on`, …) as `Task.operation` spells it; None for an empty one."""
    if not value:
        return None
    try:
        return OperationKind(value)
    except ValueError:
        names = ", ".join(k.value for k in OperationKind)
        raise InvalidArgument(f"{field}: {value!r} is not an operation ({names})") from None


def task_statuses_from(values: Sequence[int], field: str) -> frozenset[TaskStatus]:
    """Status filters; UNKNOWN or an unknown number is refused, naming its position."""
    statuses = set()
    for i, value in enumerate(values):
        status = _STATUS_FROM_PB.get(value)  # type: ignore[call-overload]
        if status is None:
            raise InvalidArgument(f"{field}[{i}]: {value} is not a task status (PENDING, RUNNING, …)")
        statuses.add(status)
    return frozenset(statuses)


def task_status_to(status: TaskStatus) -> pb.TaskStatus.ValueType:
    return _STATUS_TO_PB[status]


def task_to(task: Task, attempts: Sequence[TaskAttempt] = (), checks: Sequence[CheckResult] = ()) -> pb.Task:
    """The task; `attempts`: its ended attempts, `checks`: its checks' answers in its last round
    (GetTasksByIDs reads both, lists leave them out)."""
    msg = pb.Task()
    task_into(msg, task, attempts, checks)
    return msg


def tasks_into(
    target: Any,
    tasks: Iterable[Task],
    attempts: Mapping[uuid.UUID, Sequence[TaskAttempt]] = _NONE,
    checks: Mapping[uuid.UUID, Sequence[CheckResult]] = _NONE,
) -> None:
    """Append the tasks to `target` (a repeated `pb.Task` field), each made in place, with its attempts and
    checks by task id: a `pb.Task` made apart is copied into the answer, its component ids with it, and
    its times and ids were messages made and copied into it too (docs/PERFORMANCE.md, "The 1,000-row
    pages at 36 components")."""
    add = target.add
    for task in tasks:
        task_into(add(), task, attempts.get(task.id, ()), checks.get(task.id, ()))


def task_into(
    msg: pb.Task, task: Task, attempts: Sequence[TaskAttempt] = (), checks: Sequence[CheckResult] = ()
) -> None:
    """Set the empty message `msg` to the task (`task_to`); a time or id the task does not hold is left
    unset."""
    msg.id.id = str(task.id)
    msg.operation = task.operation.kind.value
    msg.rack_id.id = str(task.rack_id)
    # Added in place, each id's message made by the field itself: a task on a rack of 36 components names
    # 36, most of a page of 1,000 tasks' conversion (docs/PERFORMANCE.md, "Racks of 36 components").
    add = msg.component_ids.add
    for component_id in task.component_ids:
        add(id=str(component_id))
    msg.description = task.description
    msg.status = _STATUS_TO_PB[task.status]
    msg.message = task.message
    for field, value in (
        (msg.queue_expires_at, task.queue_expires_at),
        (msg.created_at, task.created_at),
        (msg.started_at, task.started_at),
        (msg.finished_at, task.finished_at),
        (msg.updated_at, task.updated_at),
        (msg.not_before, task.not_before),
        (msg.held_since, task.held_since),
        (msg.not_after, task.not_after),
        (msg.attempt_started_at, task.attempt_started_at),
    ):
        if value is not None:
            timestamp_into(field, value)
    if task.schedule_id is not None:
        msg.schedule_id.id = str(task.schedule_id)
    if task.run_id is not None:
        msg.run_id.id = str(task.run_id)
    msg.ignore_windows = task.ignore_windows
    msg.held_by = task.held_by or ""
    msg.held_reason = task.held_reason or ""
    msg.attempt = task.attempt
    msg.max_attempts = task.max_attempts
    msg.attempts.extend(
        pb.TaskAttempt(
            attempt=a.attempt,
            started_at=timestamp_to(a.started_at),
            finished_at=timestamp_to(a.finished_at),
            status=task_status_to(a.status),
            message=a.message,
            retryable=a.retryable,
        )
        for a in attempts
    )
    # From the claim that recorded it on: a RUNNING task shows it will not run before it is ended.
    if task.refusal is not None:
        msg.refusal.reason = task.refusal.reason
        msg.refusal.ends_as = task_status_to(task.refusal.ends_as)
    msg.checks.extend(
        pb.TaskCheckResult(
            check_id=uuid_to(c.check_id),
            check=c.check_name,
            round=c.attempt,
            passed=c.passed,
            reason=c.reason,
            checked_at=timestamp_to(c.checked_at),
        )
        for c in checks
    )
