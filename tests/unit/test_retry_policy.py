"""Retries without a database: the back-off rule, the input rules (bad input names the field), which
runs and racks RetryTaskScheduleRun takes, what the executor reports for an ended attempt, the simulator's
fault injection of both kinds, and that a rollout counts a rack waiting for its next attempt as active."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from rackflow.domain.inventory import Component, ComponentType, PowerState
from rackflow.domain.rollouts import Phase
from rackflow.domain.schedules import Run, ScopeOutcome, racks_to_retry
from rackflow.domain.tasks import RETRY_HOLD, Operation, OperationKind, RetryPolicy, Task, TaskStatus
from rackflow.errors import InvalidArgument
from rackflow.rollouts.gate import scope_phase as _phase
from rackflow.store.rollouts import TaskState
from rackflow.tasks.backends.base import StepFailed
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from rackflow.tasks.executor import _ending
from rackflow.validation import check_retry, retry_from
from tests.step_state import Kept

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
POLICY = RetryPolicy(4, timedelta(seconds=30), 2.0, timedelta(minutes=1))


def test_backoff_grows_by_the_multiplier_and_stops_at_the_maximum() -> None:
    waits = [POLICY.backoff(n) for n in (1, 2, 3, 4)]
    assert waits == [timedelta(seconds=30), timedelta(minutes=1), timedelta(minutes=1), timedelta(minutes=1)]
    flat = RetryPolicy(3, timedelta(seconds=5), 1.0, timedelta(seconds=5))
    assert [flat.backoff(n) for n in (1, 2)] == [timedelta(seconds=5)] * 2


def test_the_policy_survives_its_stored_form() -> None:
    assert RetryPolicy.from_json(POLICY.to_json()) == POLICY
    assert POLICY.describe() == "4 attempts, back-off 30s x2 up to 1m"


def test_defaults_fill_what_the_api_leaves_unset() -> None:
    policy = retry_from(3, "", 0.0, "")
    assert policy == RetryPolicy(3, timedelta(seconds=30), 2.0, timedelta(minutes=10))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # A policy given without its attempts (`--retry-backoff 1m` alone, on a schedule without retries):
        # required, rather than "got 0", which no one gave.
        (
            (0, "1m", 0.0, ""),
            "schedule.retry.max_attempts: required (attempts in all, the first included: 2..10)",
        ),
        ((1, "", 0.0, ""), "schedule.retry.max_attempts: must be 2..10, got 1"),
        ((11, "", 0.0, ""), "schedule.retry.max_attempts: must be 2..10, got 11"),
        ((3, "", 0.5, ""), "schedule.retry.multiplier: must be 1..10, got 0.5"),
        ((3, "soon", 0.0, ""), "schedule.retry.initial_backoff: "),
        ((3, "-1s", 0.0, ""), "schedule.retry.initial_backoff: "),
        (
            (3, "", 0.0, "48h"),
            "schedule.retry.max_backoff: must be positive and at most 24h, got 48h",
        ),
        ((3, "1h", 0.0, "1m"), "schedule.retry.initial_backoff: 1h is longer than max_backoff 1m"),
    ],
)
def test_bad_input_names_the_field(args: tuple[int, str, float, str], message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        retry_from(*args)
    assert str(caught.value).startswith(message)


def test_check_retry_names_the_field_it_is_given() -> None:
    with pytest.raises(InvalidArgument, match=r"^draft\.schedule\.retry\.max_attempts: "):
        check_retry(RetryPolicy(0, timedelta(1), 1.0, timedelta(1)), "draft.schedule.retry")


def task(attempt: int = 1, retry: RetryPolicy | None = POLICY) -> Task:
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
        retry=retry,
        attempt=attempt,
        attempt_started_at=NOW,
    )


def test_a_retryable_failure_with_attempts_left_is_tried_again_after_its_backoff() -> None:
    ending = _ending(task(attempt=2), ((TaskStatus.FAILED, "timed out"), True), NOW)
    assert ending.retry_at == NOW + timedelta(minutes=1)
    assert ending.outcome == (
        TaskStatus.FAILED,
        "attempt 3 of 4 at 2026-12-02T12:01:00Z; attempt 2 failed: timed out",
    )
    assert ending.attempt is not None
    assert (ending.attempt.attempt, ending.attempt.message, ending.attempt.retryable) == (
        2,
        "timed out",
        True,
    )


@pytest.mark.parametrize(
    ("attempt", "retryable", "retry"),
    [(1, False, POLICY), (1, True, None)],
    ids=["a refusal", "no policy"],
)
def test_otherwise_the_task_ends(attempt: int, retryable: bool, retry: RetryPolicy | None) -> None:
    ending = _ending(task(attempt, retry), ((TaskStatus.FAILED, "no"), retryable), NOW)
    assert (ending.retry_at, ending.outcome) == (None, (TaskStatus.FAILED, "no"))
    assert (ending.attempt is None) == (retry is None)


def test_a_success_is_recorded_as_the_attempt_that_completed() -> None:
    ending = _ending(task(attempt=3), ((TaskStatus.COMPLETED, "powered on 2 components"), False), NOW)
    assert ending.retry_at is None and ending.attempt is not None
    assert (ending.attempt.attempt, ending.attempt.status) == (3, TaskStatus.COMPLETED)


def test_a_rack_waiting_for_its_next_attempt_is_active_not_failed() -> None:
    outcome = ScopeOutcome(uuid.uuid4(), uuid.uuid4(), "submitted", task_id=uuid.uuid4())
    waiting = TaskState(uuid.uuid4(), TaskStatus.PENDING, None, held_by=RETRY_HOLD)
    assert _phase(outcome, waiting) is Phase.ACTIVE


def _run(*outcomes: ScopeOutcome) -> Run:
    return Run(uuid.uuid4(), uuid.uuid4(), NOW, "dispatch", "halted", outcomes)


def test_retrying_a_run_takes_its_failed_and_never_started_racks() -> None:
    ok, bad, cut = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def submitted(task_id: uuid.UUID) -> ScopeOutcome:
        return ScopeOutcome(uuid.uuid4(), uuid.uuid4(), "submitted", task_id=task_id)

    outcomes = (
        submitted(ok),
        submitted(bad),
        submitted(cut),
        ScopeOutcome(uuid.uuid4(), uuid.uuid4(), "failed", error="conflict"),
        ScopeOutcome(uuid.uuid4(), uuid.uuid4(), "not_started"),
        ScopeOutcome(uuid.uuid4(), uuid.uuid4(), "skipped_overlap"),
    )
    statuses = {ok: TaskStatus.COMPLETED, bad: TaskStatus.FAILED, cut: TaskStatus.TERMINATED}
    run = _run(*outcomes)
    assert racks_to_retry(run, statuses, only_failed=True) == [
        outcomes[1],
        outcomes[2],
        outcomes[3],
        outcomes[4],
    ]
    assert racks_to_retry(run, statuses, only_failed=False) == list(outcomes)


def component(external_id: str) -> Component:
    return Component(
        id=uuid.uuid4(),
        rack_id=uuid.uuid4(),
        type=ComponentType.COMPUTE,
        name=external_id,
        external_id=external_id,
        firmware_version="1",
        power_state=PowerState.OFF,
    )


async def test_the_simulator_injects_retryable_failures_a_given_number_of_times() -> None:
    config = SimulatorConfig.from_env(
        {
            "RACKFLOW_SIM_STEP_SECONDS": "0",
            "RACKFLOW_SIM_TRANSIENT_IDS": "a:2, b",
            "RACKFLOW_SIM_FAIL_IDS": "c",
        }
    )
    backend = SimulatorBackend(config)
    a, b, c = component("a"), component("b"), component("c")
    for _ in range(2):
        with pytest.raises(StepFailed) as caught:
            await backend.run_step(task(), a, Kept())
        assert caught.value.retryable
    assert await backend.run_step(task(), a, Kept()) is not None  # the third step on "a" succeeds
    for _ in range(3):
        with pytest.raises(StepFailed) as caught:
            await backend.run_step(task(), b, Kept())
        assert caught.value.retryable
    with pytest.raises(StepFailed) as caught:
        await backend.run_step(task(), c, Kept())
    assert not caught.value.retryable


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RACKFLOW_SIM_TRANSIENT_IDS": "a:0"}, "RACKFLOW_SIM_TRANSIENT_IDS: 'a:0': the count"),
        ({"RACKFLOW_SIM_TRANSIENT_RATE": "2"}, "RACKFLOW_SIM_TRANSIENT_RATE: must be between 0 and 1, got 2"),
    ],
)
def test_bad_simulator_settings_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        SimulatorConfig.from_env(env)
    assert str(caught.value).startswith(message)


def test_a_failed_last_attempt_says_which_it_was() -> None:
    ending = _ending(task(attempt=4), ((TaskStatus.FAILED, "timed out"), True), NOW)
    assert ending.outcome == (TaskStatus.FAILED, "attempt 4 of 4: timed out")
    assert ending.attempt is not None and ending.attempt.message == "timed out"
