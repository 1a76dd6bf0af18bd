"""Task conversions to protobuf, without a server or database: a start gate's refusal recorded on a task."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.json_format import MessageToDict
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.api.convert.tasks import task_to
from rackflow.domain.checks import CheckResult
from rackflow.domain.tasks import Fail, Operation, OperationKind, RetryPolicy, Task, TaskAttempt, TaskStatus
from rackflow.v1 import flow_pb2 as pb

NOW = datetime(2026, 12, 2, 20, 0, tzinfo=UTC)
GAVE_UP = "pre-flight check 'drained': not drained (pre-flight check 'drained' gave up after 2h)"


def running(refusal: Fail | None) -> Task:
    """A task as the claim that consulted the gates leaves it: RUNNING, with what a gate refused, if any."""
    return Task(
        id=uuid.uuid4(),
        operation=Operation(OperationKind.POWER_ON),
        rack_id=uuid.uuid4(),
        component_ids=(),
        description="",
        status=TaskStatus.RUNNING,
        message="",
        queue_expires_at=None,
        created_at=NOW,
        started_at=NOW,
        finished_at=None,
        updated_at=NOW,
        refusal=refusal,
    )


@pytest.mark.parametrize(
    ("refusal", "ends_as"),
    [
        (Fail(GAVE_UP), pb.TASK_STATUS_FAILED),
        (Fail("its rollout was cancelled before it began", TaskStatus.TERMINATED), pb.TASK_STATUS_TERMINATED),
    ],
    ids=["fails", "terminates"],
)
def test_a_refused_task_carries_its_refusal_while_it_is_running(
    refusal: Fail, ends_as: pb.TaskStatus.ValueType
) -> None:
    msg = task_to(running(refusal))
    assert msg.status == pb.TASK_STATUS_RUNNING
    assert msg.HasField("refusal")
    assert msg.refusal == pb.TaskRefusal(reason=refusal.reason, ends_as=ends_as)


def test_a_task_no_gate_refused_has_no_refusal() -> None:
    msg = task_to(running(None))
    assert not msg.HasField("refusal")
    assert "refusal" not in MessageToDict(msg, preserving_proto_field_name=True)


def ts(value: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(value)
    return stamp


def test_every_field_of_a_task_and_of_none_is_answered() -> None:
    """A task is set field by field into its message (`task_into`, made in a list's answer itself): every
    field a task may hold is answered, its component ids in their order, and a field a task does not
    hold is left unset, as the message made from keyword arguments did."""
    ids = [uuid.uuid4() for _ in range(6)]
    later = [NOW + timedelta(minutes=m) for m in range(8)]
    retry = RetryPolicy(3, timedelta(seconds=5), 2.0, timedelta(minutes=1))
    full = replace(
        running(Fail(GAVE_UP)),
        id=ids[0],
        rack_id=ids[1],
        component_ids=(ids[3], ids[2]),
        description="why",
        message="doing",
        queue_expires_at=later[0],
        finished_at=later[1],
        schedule_id=ids[4],
        run_id=ids[5],
        ignore_windows=True,
        not_before=later[2],
        not_after=later[3],
        held_by="retry",
        held_reason="backing off",
        held_since=later[4],
        retry=retry,
        attempt=2,
        attempt_started_at=later[5],
    )
    attempt = TaskAttempt(ids[0], 1, NOW, later[6], TaskStatus.FAILED, "lost power", retryable=True)
    check = CheckResult(ids[0], ids[2], "drained", 1, False, "not drained", later[7], later[7])
    assert task_to(full, [attempt], [check]) == pb.Task(
        id=pb.UUID(id=str(ids[0])),
        operation="power_on",
        rack_id=pb.UUID(id=str(ids[1])),
        component_ids=[pb.UUID(id=str(ids[3])), pb.UUID(id=str(ids[2]))],
        description="why",
        status=pb.TASK_STATUS_RUNNING,
        message="doing",
        queue_expires_at=ts(later[0]),
        created_at=ts(NOW),
        started_at=ts(NOW),
        finished_at=ts(later[1]),
        updated_at=ts(NOW),
        schedule_id=pb.UUID(id=str(ids[4])),
        not_before=ts(later[2]),
        ignore_windows=True,
        run_id=pb.UUID(id=str(ids[5])),
        held_by="retry",
        held_reason="backing off",
        held_since=ts(later[4]),
        not_after=ts(later[3]),
        attempt=2,
        max_attempts=3,
        attempts=[
            pb.TaskAttempt(
                attempt=1,
                started_at=ts(NOW),
                finished_at=ts(later[6]),
                status=pb.TASK_STATUS_FAILED,
                message="lost power",
                retryable=True,
            )
        ],
        attempt_started_at=ts(later[5]),
        refusal=pb.TaskRefusal(reason=GAVE_UP, ends_as=pb.TASK_STATUS_FAILED),
        checks=[
            pb.TaskCheckResult(
                check_id=pb.UUID(id=str(ids[2])),
                check="drained",
                round=1,
                passed=False,
                reason="not drained",
                checked_at=ts(later[7]),
            )
        ],
    )
    bare = replace(running(None), id=ids[0], rack_id=ids[1], started_at=None)
    assert task_to(bare) == pb.Task(
        id=pb.UUID(id=str(ids[0])),
        operation="power_on",
        rack_id=pb.UUID(id=str(ids[1])),
        status=pb.TASK_STATUS_RUNNING,
        created_at=ts(NOW),
        updated_at=ts(NOW),
        attempt=1,
        max_attempts=1,
    )
    assert [field.name for field, _ in task_to(bare).ListFields()] == [
        "id",
        "operation",
        "rack_id",
        "status",
        "created_at",
        "updated_at",
        "attempt",
        "max_attempts",
    ]
