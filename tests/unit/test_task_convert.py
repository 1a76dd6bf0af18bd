"""Task conversions to protobuf, without a server or database: a start gate's refusal recorded on a task."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from google.protobuf.json_format import MessageToDict

from rackflow.api.convert.tasks import task_to
from rackflow.domain.tasks import Fail, Operation, OperationKind, Task, TaskStatus
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
