"""`schedule trigger` and `run retry` carry a request id (--request-id, else a new UUID per invocation), and
send the call again with the same id, saying so on stderr, while its answer is lost (UNAVAILABLE,
DEADLINE_EXCEEDED), up to `requests.ATTEMPTS` tries; any other error, or the last lost answer, ends it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import grpc
from click.testing import Result

from rackflow.api.errors import AnsweredFiring
from rackflow.cli import requests
from rackflow.client import RackflowClientError
from rackflow.v1 import flow_pb2 as pb
from tests.unit.test_cli_commands import TASK_ID, FakeClient, fake, run

__all__ = ["fake", "run"]

RUN_ID = "6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f"


def _lost_then(answer: Any, lost: list[grpc.StatusCode]) -> Callable[[], Any]:
    """An answer lost with each of `lost` in turn, then `answer` (raised, if it is an error)."""
    left = list(lost)

    def call() -> Any:
        if left:
            raise RackflowClientError(left.pop(0), "connection lost")
        if isinstance(answer, RackflowClientError):
            raise answer
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


FIRED_AT = datetime(2026, 12, 5, 20, 31, 7, tzinfo=UTC)


def _fired(answer: Any, replayed: bool) -> Any:
    answer.fired_at.FromDatetime(FIRED_AT)
    answer.replayed = replayed
    return answer


def test_a_trigger_answered_by_its_earlier_request_says_nothing_new_fired(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    answer = _fired(pb.SubmitTaskResponse(task_ids=[pb.UUID(id=TASK_ID)], run_id=pb.UUID(id=RUN_ID)), True)
    fake.answers["trigger_schedule"] = _lost_then(answer, [grpc.StatusCode.UNAVAILABLE])

    result = run("schedule", "trigger", "nightly", "--request-id", "change-4711")

    assert result.exit_code == 0, result.output
    assert TASK_ID in result.stdout
    assert (
        f"request change-4711 had already fired run {RUN_ID} at 2026-12-05 20:31:07Z: nothing new fired"
        in result.stderr
    )
    # Run again by hand with the same id: the same line, no try sent again.
    again = run("-o", "json", "schedule", "trigger", "nightly", "--request-id", "change-4711")
    assert "nothing new fired" in again.stderr and json.loads(again.stdout)["replayed"] is True


def test_a_trigger_sent_again_that_fired_now_says_so(fake: FakeClient, run: Callable[..., Result]) -> None:
    answer = _fired(pb.SubmitTaskResponse(task_ids=[pb.UUID(id=TASK_ID)], run_id=pb.UUID(id=RUN_ID)), False)
    fake.answers["trigger_schedule"] = _lost_then(answer, [grpc.StatusCode.DEADLINE_EXCEEDED])

    result = run("schedule", "trigger", "nightly", "--request-id", "r-1")

    assert result.exit_code == 0, result.output
    assert (
        f"request r-1 fired run {RUN_ID} at 2026-12-05 20:31:07Z now: its earlier try had not reached "
        "the server" in result.stderr
    )
    assert "nothing new fired" not in result.stderr
    # Heard at the first try: nothing to tell.
    fake.answers["trigger_schedule"] = answer
    quiet = run("schedule", "trigger", "nightly")
    assert quiet.exit_code == 0 and quiet.stderr == ""


def test_a_run_retry_answered_by_its_earlier_request_says_nothing_new_fired(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["retry_run"] = _fired(pb.TaskScheduleRun(id=pb.UUID(id=RUN_ID), state="completed"), True)

    result = run("run", "retry", RUN_ID, "--request-id", "r-2")

    assert result.exit_code == 0, result.output
    assert (
        f"request r-2 had already fired run {RUN_ID} at 2026-12-05 20:31:07Z: nothing new fired"
        in result.stderr
    )


def _submitted_nothing(replayed: bool) -> RackflowClientError:
    firing = AnsweredFiring(uuid.UUID(RUN_ID), FIRED_AT, replayed)
    return RackflowClientError(grpc.StatusCode.FAILED_PRECONDITION, "fired but submitted no task", firing)


def test_a_refused_trigger_answered_by_its_earlier_request_says_nothing_new_fired(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    """Every scope of the run the earlier request fired failed: the refusal answered again says which run
    and when, that it submitted no task, and that nothing new fired; then the error, and exit 1."""
    fake.answers["trigger_schedule"] = _lost_then(_submitted_nothing(True), [grpc.StatusCode.UNAVAILABLE])

    result = run("schedule", "trigger", "nightly", "--request-id", "change-4711")

    assert result.exit_code == 1 and len(fake.called("trigger_schedule")) == 2
    told, error = result.stderr.splitlines()[-2:]
    assert told == (
        f"request change-4711 had already fired run {RUN_ID} at 2026-12-05 20:31:07Z: it submitted no task; "
        "nothing new fired"
    )
    assert error == "error: FAILED_PRECONDITION: fired but submitted no task"


def test_a_refused_trigger_sent_again_that_fired_now_says_so(
    fake: FakeClient, run: Callable[..., Result]
) -> None:
    fake.answers["trigger_schedule"] = _lost_then(_submitted_nothing(False), [grpc.StatusCode.UNAVAILABLE])

    result = run("schedule", "trigger", "nightly", "--request-id", "r-1")

    assert result.exit_code == 1
    assert (
        f"request r-1 fired run {RUN_ID} at 2026-12-05 20:31:07Z now: it submitted no task; its earlier try "
        "had not reached the server, so this is its one firing" in result.stderr
    )
    assert "nothing new fired" not in result.stderr
    # Heard at the first try, or from a server too old to name its run: only the error.
    for refusal in (
        _submitted_nothing(False),
        RackflowClientError(grpc.StatusCode.FAILED_PRECONDITION, "no"),
    ):
        fake.answers["trigger_schedule"] = refusal
        quiet = run("schedule", "trigger", "nightly")
        assert quiet.exit_code == 1 and quiet.stderr.startswith("error: FAILED_PRECONDITION")
        assert len(quiet.stderr.splitlines()) == 1
