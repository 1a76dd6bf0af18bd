"""A run's outcomes converted to protobuf, without a server or database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from rackflow.api.convert.schedules import run_to
from rackflow.domain.schedules import Run, ScopeOutcome
from rackflow.domain.tasks import TaskStatus
from rackflow.rollouts.service import RunReport
from rackflow.v1 import flow_pb2 as pb


def test_each_outcome_carries_its_tasks_status_and_hold_in_the_runs_order() -> None:
    """The outcomes are made in the run's message (`outcomes_into`): each with its ids, its task's status
    (UNKNOWN for a task the report does not know, such as one pruned since, and for a scope without a
    task) and its hold, in the run's order."""
    ids = [uuid.uuid4() for _ in range(9)]
    held, running, pruned = ids[6], ids[7], ids[8]
    outcomes = (
        ScopeOutcome(ids[0], ids[1], "submitted", held, canary=True),
        ScopeOutcome(ids[2], ids[3], "submitted", running),
        ScopeOutcome(ids[4], ids[5], "skipped_overlap", error="busy"),
        ScopeOutcome(ids[1], ids[0], "submitted", pruned),
    )
    run = Run(ids[0], ids[1], datetime(2026, 12, 6, tzinfo=UTC), "manual", "completed", outcomes)
    report = RunReport(
        run,
        {held: TaskStatus.PENDING, running: TaskStatus.RUNNING},
        None,
        holds={held: ("window", "waits for its window")},
    )
    assert list(run_to(report).outcomes) == [
        pb.ScopeOutcome(
            scope_id=pb.UUID(id=str(ids[0])),
            rack_id=pb.UUID(id=str(ids[1])),
            outcome="submitted",
            task_id=pb.UUID(id=str(held)),
            task_status=pb.TASK_STATUS_PENDING,
            canary=True,
            held_by="window",
            held_reason="waits for its window",
        ),
        pb.ScopeOutcome(
            scope_id=pb.UUID(id=str(ids[2])),
            rack_id=pb.UUID(id=str(ids[3])),
            outcome="submitted",
            task_id=pb.UUID(id=str(running)),
            task_status=pb.TASK_STATUS_RUNNING,
        ),
        pb.ScopeOutcome(
            scope_id=pb.UUID(id=str(ids[4])),
            rack_id=pb.UUID(id=str(ids[5])),
            outcome="skipped_overlap",
            error="busy",
            task_status=pb.TASK_STATUS_UNKNOWN,
        ),
        pb.ScopeOutcome(
            scope_id=pb.UUID(id=str(ids[1])),
            rack_id=pb.UUID(id=str(ids[0])),
            outcome="submitted",
            task_id=pb.UUID(id=str(pruned)),
            task_status=pb.TASK_STATUS_UNKNOWN,
        ),
    ]
    assert not run_to(report).outcomes[2].HasField("task_id")
