"""`schedule trigger` and `run retry` carry a request id (--request-id, else a new UUID per invocation), and
send the call again with the same id, saying so on stderr, while its answer is lost (UNAVAILABLE,
DEADLINE_EXCEEDED), up to `requests.ATTEMPTS` tries; any other error, or the last lost answer, ends it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import grpc
from click.testing import Result

from rackflow.cli import requests
from rackflow.client import RackflowClientError
from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import TASK_ID, FakeClient, fake, run

__all__ = ["fake", "run"]

RUN_ID = "6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f"


def _lost_then(answer: Any, lost: list[grpc.StatusCode]) -> Callable[[], Any]:
    """An answer lost with each of `lost` in turn, then `answer`."""
    left = list(lost)

    def call() -> Any:
        if left:
            raise RackflowClientError(left.pop(0), "connection lost")
        return answer

    return call


def _request_ids(fake: FakeClient, name: str) -> list[str]:
    return [kwargs["request_id"] for _, kwargs in fake.called(name)]


def test_a_trigger_is_sent_again_with_the_same_id(fake: FakeClient, run: Callable[..., Result]) -> None:
    lost = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED]
    fake.answers["trigger_schedule"] = _lost_then(pb.SubmitTaskResponse(task_ids=[pb.UUID(id=TASK_ID)]), lost)

    result = run("schedule", "trigger", "nightly")

    assert result.exit_code == 0, result.output
    assert TASK_ID in result.stdout
    sent = _request_ids(fake, "trigger_schedule")
    assert len(sent) == 3 and len(set(sent)) == 1 and uuid.UUID(sent[0])
    assert "warning: UNAVAILABLE: connection lost; sending it again with the same request id" in result.stderr
    assert (
        "warning: DEADLINE_EXCEEDED" in result.stderr and f"(try 3 of {requests.ATTEMPTS})" in result.stderr
    )
    # Each invocation its own id; --request-id the operator's.
    assert run("schedule", "trigger", "nightly").exit_code == 0
    assert run("schedule", "trigger", "nightly", "--request-id", "change-4711").exit_code == 0
    first, second, third = dict.fromkeys(_request_ids(fake, "trigger_schedule"))
    assert third == "change-4711" and len({first, second, third}) == 3


def test_other_errors_and_the_last_lost_answer_are_not_sent_again(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["trigger_schedule"] = RackflowClientError(grpc.StatusCode.FAILED_PRECONDITION, "refused")
    refused = run("schedule", "trigger", "nightly")
    assert refused.exit_code == 1 and len(fake.called("trigger_schedule")) == 1
    assert "warning" not in refused.stderr
    fake.answers["trigger_schedule"] = RackflowClientError(grpc.StatusCode.UNAVAILABLE, "down")
    down = run("schedule", "trigger", "nightly")
    assert down.exit_code == 1 and "error: UNAVAILABLE: down" in down.stderr
    assert len(fake.called("trigger_schedule")) == 1 + requests.ATTEMPTS


def test_a_run_retry_is_sent_again_with_the_same_id(fake: FakeClient, run: Callable[..., Result]) -> None:
    new_run = pb.TaskScheduleRun(id=pb.UUID(id=RUN_ID), state="running")
    fake.answers["retry_run"] = _lost_then(new_run, [grpc.StatusCode.UNAVAILABLE])

    result = run("--output", "json", "run", "retry", RUN_ID, "--request-id", "r-1")

    assert result.exit_code == 0, result.output
    assert _request_ids(fake, "retry_run") == ["r-1", "r-1"]
    assert "sending it again with the same request id r-1" in result.stderr
