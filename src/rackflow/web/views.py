"""What the pages show for a state: one label, one glyph and one colour class per state, as tables.

Colours are the Okabe–Ito palette (distinguishable with every common colour-vision deficiency) and every
state also has a text label and a glyph, so no state is told by colour alone. `static/app.css` defines the
`st-*` classes.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from rackflow.domain.schedules import Run, Schedule, ScopeOutcome
from rackflow.domain.tasks import TaskStatus


@dataclass(frozen=True)
class Look:
    label: str
    glyph: str
    css: str  # st-ok, st-fail, st-run, st-wait, st-stop, st-skip, st-idle


class Verdict(enum.StrEnum):
    """How one firing (or one rack of it) ended, from its outcomes and its tasks' statuses."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RUNNING = "running"
    WAITING = "waiting"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"
    HALTED = "halted"  # a rollout stopped by its failure budget
    PENDING = "pending"  # a rollout's rack waiting its turn
    NOT_STARTED = "not_started"  # a rollout's rack that never got its turn (halted or cancelled)
    EMPTY = "empty"


LOOKS: dict[str, Look] = {
    Verdict.SUCCEEDED: Look("succeeded", "✓", "st-ok"),
    Verdict.FAILED: Look("failed", "✗", "st-fail"),
    Verdict.RUNNING: Look("running", "▶", "st-run"),
    Verdict.WAITING: Look("waiting", "…", "st-wait"),
    Verdict.CANCELLED: Look("cancelled", "■", "st-stop"),
    Verdict.SKIPPED: Look("skipped", "–", "st-skip"),
    Verdict.INTERRUPTED: Look("interrupted", "!", "st-fail"),
    Verdict.HALTED: Look("halted", "‖", "st-fail"),
    Verdict.PENDING: Look("waiting its turn", "◦", "st-idle"),
    Verdict.NOT_STARTED: Look("not started", "○", "st-skip"),
    Verdict.EMPTY: Look("no racks", "·", "st-idle"),
}

TASK_LOOKS: dict[TaskStatus, Look] = {
    TaskStatus.COMPLETED: Look("completed", "✓", "st-ok"),
    TaskStatus.FAILED: Look("failed", "✗", "st-fail"),
    TaskStatus.RUNNING: Look("running", "▶", "st-run"),
    TaskStatus.PENDING: Look("pending", "…", "st-wait"),
    TaskStatus.WAITING: Look("waiting", "⧗", "st-wait"),
    TaskStatus.TERMINATED: Look("terminated", "■", "st-stop"),
}

# A task's status as the verdict of its rack in a firing.
_TASK_VERDICT = {
    TaskStatus.COMPLETED: Verdict.SUCCEEDED,
    TaskStatus.FAILED: Verdict.FAILED,
    TaskStatus.RUNNING: Verdict.RUNNING,
    TaskStatus.PENDING: Verdict.WAITING,
    TaskStatus.WAITING: Verdict.WAITING,
    TaskStatus.TERMINATED: Verdict.CANCELLED,
}

# A firing's verdict is the first of these that any of its racks has (so one failure marks the firing).
_PRECEDENCE = (
    Verdict.FAILED,
    Verdict.RUNNING,
    Verdict.WAITING,
    Verdict.PENDING,
    Verdict.CANCELLED,
    Verdict.SUCCEEDED,
    Verdict.NOT_STARTED,
    Verdict.SKIPPED,
)

# A rollout's rack outcomes that have no task (yet, or ever).
_ROLLOUT_VERDICT = {"pending": Verdict.PENDING, "not_started": Verdict.NOT_STARTED}


def outcome_verdict(outcome: ScopeOutcome, statuses: Mapping[uuid.UUID, TaskStatus]) -> Verdict:
    """One rack of one firing: its task's status when submitted (a vanished task counts as done)."""
    if outcome.outcome == "failed":
        return Verdict.FAILED
    if outcome.outcome in _ROLLOUT_VERDICT:
        return _ROLLOUT_VERDICT[outcome.outcome]
    if outcome.outcome != "submitted" or outcome.task_id is None:
        return Verdict.SKIPPED
    status = statuses.get(outcome.task_id)
    return _TASK_VERDICT[status] if status is not None else Verdict.SUCCEEDED


def run_verdict(run: Run, statuses: Mapping[uuid.UUID, TaskStatus]) -> Verdict:
    if run.state == "interrupted":
        return Verdict.INTERRUPTED
    if run.state == "halted":
        return Verdict.HALTED
    verdicts = {outcome_verdict(o, statuses) for o in run.outcomes}
    if run.state in ("running", "rolling"):
        verdicts.add(Verdict.RUNNING)
    return next((v for v in _PRECEDENCE if v in verdicts), Verdict.EMPTY)


def task_ids_of(runs: list[Run]) -> set[uuid.UUID]:
    return {o.task_id for run in runs for o in run.outcomes if o.task_id is not None}


def schedule_state(schedule: Schedule) -> Look:
    if schedule.is_consumed:
        return Look("finished", "✓", "st-idle")
    return Look("enabled", "●", "st-ok") if schedule.enabled else Look("paused", "❚❚", "st-wait")
