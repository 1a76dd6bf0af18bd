"""How a firing and each of its racks are judged for the dashboard's colours."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from rackflow.domain.schedules import Outcome, Run, RunState, ScopeOutcome
from rackflow.domain.tasks import TaskStatus
from rackflow.web.views import LOOKS, TASK_LOOKS, Verdict, outcome_verdict, run_verdict

T1, T2 = uuid.uuid4(), uuid.uuid4()


def outcome(kind: Outcome, task: uuid.UUID | None = None, error: str = "") -> ScopeOutcome:
    return ScopeOutcome(uuid.uuid4(), uuid.uuid4(), kind, task, error)


def run(*outcomes: ScopeOutcome, state: RunState = "completed") -> Run:
    return Run(uuid.uuid4(), uuid.uuid4(), datetime(2026, 1, 1, tzinfo=UTC), "dispatch", state, outcomes)


@pytest.mark.parametrize(
    ("statuses", "outcomes", "state", "verdict"),
    [
        (
            {T1: TaskStatus.COMPLETED, T2: TaskStatus.COMPLETED},
            [("submitted", T1), ("submitted", T2)],
            "completed",
            Verdict.SUCCEEDED,
        ),
        (
            {T1: TaskStatus.COMPLETED, T2: TaskStatus.FAILED},
            [("submitted", T1), ("submitted", T2)],
            "completed",
            Verdict.FAILED,
        ),
        ({T1: TaskStatus.RUNNING}, [("submitted", T1), ("failed", None)], "completed", Verdict.FAILED),
        (
            {T1: TaskStatus.RUNNING, T2: TaskStatus.COMPLETED},
            [("submitted", T1), ("submitted", T2)],
            "completed",
            Verdict.RUNNING,
        ),
        ({T1: TaskStatus.WAITING}, [("submitted", T1)], "completed", Verdict.WAITING),
        (
            {T1: TaskStatus.TERMINATED},
            [("submitted", T1), ("skipped_overlap", None)],
            "completed",
            Verdict.CANCELLED,
        ),
        ({}, [("skipped_overlap", None)], "completed", Verdict.SKIPPED),
        ({}, [("submitted", T1)], "completed", Verdict.SUCCEEDED),  # its task is gone with its rack
        ({}, [], "completed", Verdict.EMPTY),
        ({}, [], "running", Verdict.RUNNING),
        ({T1: TaskStatus.COMPLETED}, [("submitted", T1)], "interrupted", Verdict.INTERRUPTED),
    ],
)
def test_run_verdict(
    statuses: dict[uuid.UUID, TaskStatus],
    outcomes: list[tuple[Outcome, uuid.UUID | None]],
    state: RunState,
    verdict: Verdict,
) -> None:
    assert run_verdict(run(*(outcome(k, t) for k, t in outcomes), state=state), statuses) == verdict


def test_a_rack_in_a_firing() -> None:
    assert outcome_verdict(outcome("failed", error="conflict"), {}) is Verdict.FAILED
    assert outcome_verdict(outcome("skipped_overlap"), {}) is Verdict.SKIPPED
    assert outcome_verdict(outcome("submitted", T1), {T1: TaskStatus.PENDING}) is Verdict.WAITING
    assert outcome_verdict(outcome("pending"), {}) is Verdict.PENDING  # a rollout's rack waiting its turn
    assert outcome_verdict(outcome("not_started"), {}) is Verdict.NOT_STARTED


def test_every_state_has_a_label_and_a_glyph_besides_its_colour() -> None:
    looks = [*LOOKS.values(), *TASK_LOOKS.values()]
    assert set(LOOKS) == set(Verdict) and set(TASK_LOOKS) == set(TaskStatus)
    assert all(look.label and look.glyph and look.css.startswith("st-") for look in looks)
    for kind in (LOOKS, TASK_LOOKS):
        glyph_and_colour = [(look.glyph, look.css) for look in kind.values()]
        assert len(set(glyph_and_colour)) == len(glyph_and_colour)  # never two states that look alike
