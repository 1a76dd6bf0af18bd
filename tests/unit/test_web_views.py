"""How the dashboard shows every state: one look (label, glyph, colour class) per run state, outcome,
task status and verdict, checked one state at a time, and how a firing and each of its racks are judged."""

from __future__ import annotations

import typing
import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from rackflow.domain.schedules import (
    ROLLOUT_LIVE_STATES,
    Outcome,
    OverlapPolicy,
    Run,
    RunState,
    Schedule,
    ScopeOutcome,
)
from rackflow.domain.tasks import Operation, OperationKind, TaskStatus
from rackflow.timespec import ScheduleSpec, SpecType
from rackflow.web.views import (
    BAR_LOOKS,
    LOOKS,
    OUTCOME_LOOKS,
    RUN_LOOKS,
    TASK_LOOKS,
    Bar,
    Look,
    Verdict,
    bar_of,
    outcome_verdict,
    run_verdict,
    schedule_state,
    tallied_verdict,
    tallied_verdicts,
    verdicts_bar,
)

T1, T2, T3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
AT = datetime(2026, 1, 1, tzinfo=UTC)


def outcome(kind: Outcome, task: uuid.UUID | None = None, error: str = "") -> ScopeOutcome:
    return ScopeOutcome(uuid.uuid4(), uuid.uuid4(), kind, task, error)


def run(*outcomes: ScopeOutcome, state: RunState = "completed") -> Run:
    return Run(uuid.uuid4(), uuid.uuid4(), AT, "dispatch", state, outcomes)


# --- one look per state, each state on its own -----------------------------------------------------


@pytest.mark.parametrize(
    ("state", "look"),
    [
        ("running", Look("running", "▶", "st-run")),
        ("completed", Look("completed", "✓", "st-ok")),
        ("interrupted", Look("interrupted", "!", "st-fail")),
        ("rolling", Look("rolling", "»", "st-run")),
        ("halted", Look("halted", "‖", "st-fail")),
        ("cancelled", Look("cancelled", "■", "st-stop")),
        ("skipped", Look("skipped", "–", "st-skip")),
    ],
)
def test_each_run_state_has_its_look(state: RunState, look: Look) -> None:
    assert RUN_LOOKS[state] == look


@pytest.mark.parametrize(
    ("kind", "look"),
    [
        ("submitted", Look("submitted", "↑", "st-run")),
        ("skipped_overlap", Look("skipped: still busy", "–", "st-skip")),
        ("skipped_window", Look("skipped: window closed", "⊘", "st-skip")),
        ("failed", Look("not submitted", "✗", "st-fail")),
        ("pending", Look("waiting its turn", "◦", "st-idle")),
        ("not_started", Look("not started", "○", "st-skip")),
    ],
)
def test_each_outcome_has_its_look(kind: Outcome, look: Look) -> None:
    assert OUTCOME_LOOKS[kind] == look


@pytest.mark.parametrize(
    ("status", "look"),
    [
        (TaskStatus.PENDING, Look("pending", "…", "st-wait")),
        (TaskStatus.WAITING, Look("waiting", "⧗", "st-wait")),
        (TaskStatus.RUNNING, Look("running", "▶", "st-run")),
        (TaskStatus.COMPLETED, Look("completed", "✓", "st-ok")),
        (TaskStatus.FAILED, Look("failed", "✗", "st-fail")),
        (TaskStatus.TERMINATED, Look("terminated", "■", "st-stop")),
    ],
)
def test_each_task_status_has_its_look(status: TaskStatus, look: Look) -> None:
    assert TASK_LOOKS[status] == look


@pytest.mark.parametrize(
    ("verdict", "look"),
    [
        (Verdict.SUCCEEDED, Look("succeeded", "✓", "st-ok")),
        (Verdict.PARTIAL, Look("partial", "◐", "st-part")),
        (Verdict.FAILED, Look("failed", "✗", "st-fail")),
        (Verdict.RUNNING, Look("running", "▶", "st-run")),
        (Verdict.ROLLING, Look("rolling", "»", "st-run")),
        (Verdict.WAITING, Look("waiting", "…", "st-wait")),
        (Verdict.CANCELLED, Look("cancelled", "■", "st-stop")),
        (Verdict.SKIPPED, Look("skipped", "–", "st-skip")),
        (Verdict.INTERRUPTED, Look("interrupted", "!", "st-fail")),
        (Verdict.HALTED, Look("halted", "‖", "st-fail")),
        (Verdict.PENDING, Look("waiting its turn", "◦", "st-idle")),
        (Verdict.NOT_STARTED, Look("not started", "○", "st-skip")),
        (Verdict.EMPTY, Look("no racks", "·", "st-idle")),
        (Verdict.MISSED, Look("missed", "⌛", "st-stop")),
    ],
)
def test_each_verdict_has_its_look(verdict: Verdict, look: Look) -> None:
    assert LOOKS[verdict] == look


def test_the_tables_cover_every_state_of_the_api_and_no_two_look_alike() -> None:
    assert set(RUN_LOOKS) == set(typing.get_args(RunState))
    assert set(OUTCOME_LOOKS) == set(typing.get_args(Outcome))
    assert set(TASK_LOOKS) == set(TaskStatus) and set(LOOKS) == set(Verdict)
    assert list(BAR_LOOKS) == ["succeeded", "failed", "running", "pending", "not_started", "skipped"]
    for table in (RUN_LOOKS, OUTCOME_LOOKS, TASK_LOOKS, LOOKS, BAR_LOOKS):
        looks = list(table.values())  # type: ignore[attr-defined]
        assert all(look.label and look.glyph and look.css.startswith("st-") for look in looks)
        glyph_and_colour = [(look.glyph, look.css) for look in looks]
        assert len(set(glyph_and_colour)) == len(glyph_and_colour)  # never two states that look alike


# --- verdicts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statuses", "outcomes", "state", "verdict"),
    [
        (
            {T1: TaskStatus.COMPLETED, T2: TaskStatus.COMPLETED},
            [("submitted", T1), ("submitted", T2)],
            "completed",
            Verdict.SUCCEEDED,
        ),
        # one of two racks failed: partial; both failed: failed
        (
            {T1: TaskStatus.COMPLETED, T2: TaskStatus.FAILED},
            [("submitted", T1), ("submitted", T2)],
            "completed",
            Verdict.PARTIAL,
        ),
        (
            {T1: TaskStatus.FAILED, T2: TaskStatus.FAILED},
            [("submitted", T1), ("submitted", T2)],
            "completed",
            Verdict.FAILED,
        ),
        # a rack never tried (skipped) does not make a failure partial
        (
            {T1: TaskStatus.FAILED},
            [("submitted", T1), ("skipped_overlap", None)],
            "completed",
            Verdict.FAILED,
        ),
        ({T1: TaskStatus.COMPLETED}, [("submitted", T1), ("failed", None)], "completed", Verdict.PARTIAL),
        # while a rack still has work ahead, the firing runs
        ({T1: TaskStatus.RUNNING}, [("submitted", T1), ("failed", None)], "completed", Verdict.RUNNING),
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
        # rollouts: the run's own state says it
        (
            {T1: TaskStatus.FAILED, T2: TaskStatus.COMPLETED},
            [("submitted", T1), ("submitted", T2), ("not_started", None)],
            "cancelled",
            Verdict.CANCELLED,
        ),
        (  # resumed after a failure, rolling on
            {T1: TaskStatus.FAILED, T2: TaskStatus.RUNNING},
            [("submitted", T1), ("submitted", T2), ("pending", None)],
            "rolling",
            Verdict.ROLLING,
        ),
        ({T1: TaskStatus.FAILED}, [("submitted", T1), ("not_started", None)], "halted", Verdict.HALTED),
        ({}, [], "skipped", Verdict.SKIPPED),
        # a finished rollout: 1 of 8 racks failed is partial, not the failure of all 8
        (
            {T1: TaskStatus.FAILED, **{T2: TaskStatus.COMPLETED}},
            [("submitted", T1), *[("submitted", T2)] * 7],
            "completed",
            Verdict.PARTIAL,
        ),
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
    assert outcome_verdict(outcome("skipped_window"), {}) is Verdict.SKIPPED
    assert outcome_verdict(outcome("submitted", T1), {T1: TaskStatus.PENDING}) is Verdict.WAITING
    assert outcome_verdict(outcome("pending"), {}) is Verdict.PENDING  # a rollout's rack waiting its turn
    assert outcome_verdict(outcome("not_started"), {}) is Verdict.NOT_STARTED


# --- schedule state and the progress bar -------------------------------------------------------------


def schedule(spec: ScheduleSpec, *, enabled: bool, next_run_at: datetime | None) -> Schedule:
    return Schedule(
        uuid.uuid4(),
        "s",
        spec,
        OverlapPolicy.SKIP,
        enabled,
        next_run_at,
        None,
        AT,
        AT,
        Operation(OperationKind.POWER_ON),
        AT - AT,
        "",
    )


def test_a_one_time_schedule_is_finished_only_once_its_rollout_is_over() -> None:
    once = schedule(ScheduleSpec(SpecType.ONE_TIME, "2026-01-01T00:00:00Z"), enabled=False, next_run_at=None)
    assert schedule_state(once).label == "finished"
    assert schedule_state(once, "halted") == RUN_LOOKS["halted"]
    assert schedule_state(once, "rolling") == RUN_LOOKS["rolling"]
    assert set(ROLLOUT_LIVE_STATES) == {"rolling", "halted"}
    hourly = schedule(ScheduleSpec(SpecType.INTERVAL, "1h"), enabled=True, next_run_at=AT)
    assert schedule_state(hourly).label == "enabled"
    assert schedule_state(replace(hourly, enabled=False), "halted").label == "paused"  # its pause says why


def run_bar(firing: Run, statuses: dict[uuid.UUID, TaskStatus]) -> Bar:
    return verdicts_bar(Counter(outcome_verdict(o, statuses) for o in firing.outcomes))


def test_counted_verdicts_are_the_per_rack_verdicts_counted() -> None:
    """The runs grid and a run's page count a firing's racks in the database (by outcome and whether it
    has a task, and its tasks by status); counted, they must say what each rack's verdict says."""
    gone = uuid.uuid4()  # a submitted rack whose task was pruned counts as done
    ended_unbegun = uuid.uuid4()  # a cancelled rollout's rack whose task the cancel ended: not started
    outcomes = (
        outcome("not_started", ended_unbegun),
        outcome("submitted", T1),
        outcome("submitted", T2),
        outcome("submitted", T3),
        outcome("submitted", gone),
        outcome("submitted"),
        outcome("failed", error="conflict"),
        outcome("pending"),
        outcome("not_started"),
        outcome("missed"),
        outcome("skipped_window"),
    )
    statuses = {
        T1: TaskStatus.COMPLETED,
        T2: TaskStatus.FAILED,
        T3: TaskStatus.RUNNING,
        ended_unbegun: TaskStatus.TERMINATED,
    }
    tally = Counter((o.outcome, o.task_id is not None) for o in outcomes)
    task_counts = Counter(statuses.values())
    assert tallied_verdicts(tally, task_counts) == Counter(outcome_verdict(o, statuses) for o in outcomes)
    for state in ("completed", "running", "halted"):
        firing = run(*outcomes, state=state)
        assert tallied_verdict(state, tally, task_counts) == run_verdict(firing, statuses)
    ended = {**statuses, T3: TaskStatus.COMPLETED}
    assert tallied_verdict("completed", tally, Counter(ended.values())) == run_verdict(run(*outcomes), ended)


def test_a_halted_rollouts_bar_is_not_all_green() -> None:
    halted = run(
        outcome("submitted", T1), outcome("submitted", T2), *[outcome("not_started")] * 10, state="halted"
    )
    bar = run_bar(halted, {T1: TaskStatus.COMPLETED, T2: TaskStatus.FAILED})
    counts = {s.key: s.count for s in bar.segments}
    assert counts == {
        "succeeded": 1,
        "failed": 1,
        "running": 0,
        "pending": 0,
        "not_started": 10,
        "skipped": 0,
    }
    assert bar.total == 12 and [s.start for s in bar.segments] == [0, 1, 2, 2, 2, 12]
    assert bar.summary == "12 racks: 1 succeeded, 1 failed, 10 not started"
    going = run_bar(run(outcome("submitted", T3), outcome("pending")), {T3: TaskStatus.WAITING})
    assert {s.key: s.count for s in going.segments if s.count} == {"running": 1, "pending": 1}
    assert bar_of({}).summary == "0 racks: none"
