"""The rollout gate's short-cut for the failure limit (`rollouts.gate.could_halt_counted`): it skips the
rollout rule for a run whose tally by outcome and tasks say it cannot be halting, so it must never skip one
the rule would halt. Checked against the rule itself over many random runs (scopes in every outcome, tasks in
every status or gone, limits, percentages, canaries, resumes), and on the cases each of its terms is for."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime

import pytest

from rackflow.domain.rollouts import RolloutPolicy, decide
from rackflow.domain.schedules import Outcome, Run, ScopeOutcome
from rackflow.domain.tasks import TaskStatus
from rackflow.rollouts.gate import FAILED_STATUSES, could_halt_counted, scope_views
from rackflow.store.rollouts import LockedRollout, RunTaskCounts, TaskState
from rackflow.store.schedules import outcome_counts_to_json, tally_from_json

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def could_halt(
    run: LockedRollout, run_id: uuid.UUID, states: dict[tuple[uuid.UUID, uuid.UUID], TaskState]
) -> bool:
    """`could_halt_counted` with the run's task counts as `store.run_task_counts` would count its `states`."""
    mine = [state for (of_run, _), state in states.items() if of_run == run_id]
    counts = RunTaskCounts(len(mine), sum(state.status in FAILED_STATUSES for state in mine))
    return could_halt_counted(run, counts)


OUTCOMES: list[Outcome] = [
    "submitted",
    "submitted",
    "submitted",
    "pending",
    "failed",
    "not_started",
    "missed",
    "skipped_window",
    "skipped_overlap",
]
STATUSES = [
    TaskStatus.PENDING,
    TaskStatus.WAITING,
    TaskStatus.RUNNING,
    TaskStatus.COMPLETED,
    TaskStatus.FAILED,
    TaskStatus.TERMINATED,
]


def a_run(
    scopes: list[tuple[Outcome, bool, TaskStatus | None]], policy: RolloutPolicy, excused: int, resumed: bool
) -> tuple[Run, dict[tuple[uuid.UUID, uuid.UUID], TaskState], LockedRollout]:
    """A rolling run of `scopes` (outcome, whether it names a task, its task's status: None when gone), the
    first `policy.canary_racks` of them canaries; its tasks as the gate reads them; its row as locked."""
    run_id = uuid.uuid4()
    outcomes, states = [], {}
    for i, (outcome, named, status) in enumerate(scopes):
        rack, task = uuid.uuid4(), uuid.uuid4() if named else None
        outcomes.append(ScopeOutcome(uuid.uuid4(), rack, outcome, task, canary=i < policy.canary_racks))
        if task is not None and status is not None:
            states[(run_id, rack)] = TaskState(task, status, NOW if status.is_final else None)
    run = Run(
        id=run_id,
        schedule_id=uuid.uuid4(),
        fired_at=NOW,
        trigger="manual",
        state="rolling",
        outcomes=tuple(outcomes),
        rollout=policy,
        failures_excused=excused,
        resumed=resumed,
    )
    tally = tally_from_json(outcome_counts_to_json(run.outcomes))
    return run, states, LockedRollout(policy, "rolling", "", tally, excused, resumed)


def halts(run: Run, states: dict[tuple[uuid.UUID, uuid.UUID], TaskState]) -> bool:
    assert run.rollout is not None
    views = scope_views(run, states, {})
    decision = decide(run.rollout, views, now=NOW, failures_excused=run.failures_excused, resumed=run.resumed)
    return decision.halt is not None


def test_it_never_skips_a_run_the_rule_halts() -> None:
    rng = random.Random(20261206)
    halted = skipped = 0
    for _ in range(3000):
        scopes: list[tuple[Outcome, bool, TaskStatus | None]] = []
        for _ in range(rng.randint(1, 12)):
            outcome = rng.choice(OUTCOMES)
            named = (outcome == "submitted" and rng.random() < 0.9) or (
                outcome != "pending" and rng.random() < 0.2
            )
            status = None if rng.random() < 0.1 else rng.choice(STATUSES)
            scopes.append((outcome, named, status))
        policy = RolloutPolicy(
            halt_after_failures=rng.choice([0, 1, 2, 3, 5]),
            halt_after_failure_percent=rng.choice([0.0, 0.0, 20.0, 50.0]),
            canary_racks=rng.choice([0, 0, 1, 2]),
        )
        run, states, locked = a_run(scopes, policy, rng.choice([0, 0, 1, 2]), rng.random() < 0.3)
        if halts(run, states):
            halted += 1
            assert could_halt(locked, run.id, states), (scopes, policy, run.failures_excused, run.resumed)
        elif not could_halt(locked, run.id, states):
            skipped += 1
    assert halted > 300 and skipped > 300  # both sides were tried


S, P = TaskStatus.COMPLETED, TaskStatus.PENDING


@pytest.mark.parametrize(
    ("scopes", "policy", "excused", "resumed", "expected"),
    [
        # No failure anywhere: nothing to look at, whatever the limit.
        (
            [("submitted", True, S), ("submitted", True, P)],
            RolloutPolicy(halt_after_failures=1),
            0,
            False,
            False,
        ),
        # A failed task, a failed submission, a task gone with its rack: each can reach a limit of 1.
        (
            [("submitted", True, TaskStatus.FAILED), ("submitted", True, P)],
            RolloutPolicy(halt_after_failures=1),
            0,
            False,
            True,
        ),
        (
            [("failed", False, None), ("submitted", True, P)],
            RolloutPolicy(halt_after_failures=1),
            0,
            False,
            True,
        ),
        (
            [("submitted", True, None), ("submitted", True, P)],
            RolloutPolicy(halt_after_failures=1),
            0,
            False,
            True,
        ),
        # Under the limit: skipped; the failures a resume excused do not count.
        (
            [("submitted", True, TaskStatus.FAILED), ("submitted", True, P)],
            RolloutPolicy(halt_after_failures=2),
            0,
            False,
            False,
        ),
        (
            [("submitted", True, TaskStatus.FAILED), ("submitted", True, P)],
            RolloutPolicy(halt_after_failures=1),
            1,
            True,
            False,
        ),
        # A failed canary halts whatever the limit, until a resume passes the canary gate.
        (
            [("submitted", True, TaskStatus.FAILED), ("pending", False, None)],
            RolloutPolicy(canary_racks=1),
            0,
            False,
            True,
        ),
        (
            [("submitted", True, TaskStatus.FAILED), ("pending", False, None)],
            RolloutPolicy(canary_racks=1),
            0,
            True,
            False,
        ),
        # A percentage of all scopes, pending ones included.
        (
            [("submitted", True, TaskStatus.FAILED)] + [("pending", False, None)] * 3,
            RolloutPolicy(halt_after_failure_percent=50),
            0,
            False,
            False,
        ),
        (
            [("submitted", True, TaskStatus.FAILED)] * 2 + [("pending", False, None)] * 2,
            RolloutPolicy(halt_after_failure_percent=50),
            0,
            False,
            True,
        ),
    ],
)
def test_each_term(
    scopes: list[tuple[Outcome, bool, TaskStatus | None]],
    policy: RolloutPolicy,
    excused: int,
    resumed: bool,
    expected: bool,
) -> None:
    run, states, locked = a_run(scopes, policy, excused, resumed)
    assert could_halt(locked, run.id, states) is expected


def test_a_run_without_a_kept_tally_is_read_whole_and_one_not_rolling_not_at_all() -> None:
    policy = RolloutPolicy(halt_after_failures=1)
    assert could_halt(LockedRollout(policy, "rolling", "", None), uuid.uuid4(), {})
    assert not could_halt(LockedRollout(policy, "halted", "", {("failed", False): 1}), uuid.uuid4(), {})
