"""What the pages show for a state: one label, one glyph and one colour class per state, as tables.

There is one table per kind of state the API has, each covering every value (tests/unit/test_web_views.py
holds them to the domain's lists): `RUN_LOOKS` for a firing's recorded state (`Run.state`),
`OUTCOME_LOOKS` for what a firing did for one rack (`ScopeOutcome.outcome`), `TASK_LOOKS` for a task's
status, and `LOOKS` for a *verdict*: how a firing, or one rack of it, stands once its tasks' statuses are
taken into account (the grid cells, strips and headers). `BAR_LOOKS` are the segments of a progress bar.

Colours are the Okabe–Ito palette (distinguishable with every common colour-vision deficiency) and every
state also has a text label and a glyph, so no state is told by colour alone. `static/app.css` defines the
`st-*` classes.
"""

from __future__ import annotations

import enum
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from rackflow.domain.schedules import ROLLOUT_LIVE_STATES, Outcome, Run, RunState, Schedule
from rackflow.domain.tasks import TaskStatus
from rackflow.words import counted


@dataclass(frozen=True)
class Look:
    label: str
    glyph: str
    css: str  # st-ok, st-fail, st-part, st-run, st-wait, st-stop, st-skip, st-idle


RUN_LOOKS: dict[RunState, Look] = {
    "running": Look("running", "▶", "st-run"),
    "completed": Look("completed", "✓", "st-ok"),
    "interrupted": Look("interrupted", "!", "st-fail"),
    "rolling": Look("rolling", "»", "st-run"),
    "halted": Look("halted", "‖", "st-fail"),
    "cancelled": Look("cancelled", "■", "st-stop"),
    "skipped": Look("skipped", "–", "st-skip"),
    "awaiting_approval": Look("awaiting approval", "?", "st-wait"),
    "rejected": Look("rejected", "✋", "st-stop"),
    "expired": Look("expired", "⌛", "st-skip"),
    "missed": Look("missed", "⌛", "st-stop"),
}

OUTCOME_LOOKS: dict[Outcome, Look] = {
    "submitted": Look("submitted", "↑", "st-run"),
    "skipped_overlap": Look("skipped: still busy", "–", "st-skip"),
    "skipped_window": Look("skipped: window closed", "⊘", "st-skip"),
    "failed": Look("not submitted", "✗", "st-fail"),
    "pending": Look("waiting its turn", "◦", "st-idle"),
    "not_started": Look("not started", "○", "st-skip"),
    "missed": Look("missed: past the start deadline", "⌛", "st-stop"),
}

TASK_LOOKS: dict[TaskStatus, Look] = {
    TaskStatus.COMPLETED: Look("completed", "✓", "st-ok"),
    TaskStatus.FAILED: Look("failed", "✗", "st-fail"),
    TaskStatus.RUNNING: Look("running", "▶", "st-run"),
    TaskStatus.PENDING: Look("pending", "…", "st-wait"),
    TaskStatus.WAITING: Look("waiting", "⧗", "st-wait"),
    TaskStatus.TERMINATED: Look("terminated", "■", "st-stop"),
}


class Verdict(enum.StrEnum):
    """How one firing (or one rack of it) stands, from its state, its outcomes and its tasks' statuses."""

    SUCCEEDED = "succeeded"
    PARTIAL = "partial"  # some racks failed, others did not
    FAILED = "failed"  # every rack that was tried failed
    RUNNING = "running"
    ROLLING = "rolling"  # a rollout still starting racks (after a resume too, whatever failed before)
    WAITING = "waiting"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"
    HALTED = "halted"  # a rollout stopped by its failure budget
    PENDING = "pending"  # a rollout's rack waiting its turn
    NOT_STARTED = "not_started"  # a rollout's rack that never got its turn (halted or cancelled)
    AWAITING_APPROVAL = "awaiting_approval"  # nothing starts until it is approved
    REJECTED = "rejected"
    EXPIRED = "expired"  # not approved in time
    MISSED = "missed"  # past its start deadline: nothing submitted
    EMPTY = "empty"


LOOKS: dict[Verdict, Look] = {
    Verdict.SUCCEEDED: Look("succeeded", "✓", "st-ok"),
    Verdict.PARTIAL: Look("partial", "◐", "st-part"),
    Verdict.FAILED: Look("failed", "✗", "st-fail"),
    Verdict.RUNNING: Look("running", "▶", "st-run"),
    Verdict.ROLLING: RUN_LOOKS["rolling"],
    Verdict.WAITING: Look("waiting", "…", "st-wait"),
    Verdict.CANCELLED: Look("cancelled", "■", "st-stop"),
    Verdict.SKIPPED: Look("skipped", "–", "st-skip"),
    Verdict.INTERRUPTED: RUN_LOOKS["interrupted"],
    Verdict.HALTED: RUN_LOOKS["halted"],
    Verdict.PENDING: OUTCOME_LOOKS["pending"],
    Verdict.NOT_STARTED: OUTCOME_LOOKS["not_started"],
    Verdict.AWAITING_APPROVAL: RUN_LOOKS["awaiting_approval"],
    Verdict.REJECTED: RUN_LOOKS["rejected"],
    Verdict.EXPIRED: RUN_LOOKS["expired"],
    Verdict.MISSED: RUN_LOOKS["missed"],
    Verdict.EMPTY: Look("no racks", "·", "st-idle"),
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

# Run states that say how the firing stands whatever its racks did.
_STATE_VERDICT: dict[str, Verdict] = {
    "interrupted": Verdict.INTERRUPTED,
    "halted": Verdict.HALTED,
    "cancelled": Verdict.CANCELLED,
    "skipped": Verdict.SKIPPED,
    "rolling": Verdict.ROLLING,
    "awaiting_approval": Verdict.AWAITING_APPROVAL,
    "rejected": Verdict.REJECTED,
    "expired": Verdict.EXPIRED,
    "missed": Verdict.MISSED,
}

# A firing whose racks still have work ahead: the first of these any rack has.
_STILL_GOING = (Verdict.RUNNING, Verdict.WAITING, Verdict.PENDING)
# A firing that has ended with no rack failed: the first of these any rack has.
_ENDED = (Verdict.CANCELLED, Verdict.SUCCEEDED, Verdict.NOT_STARTED, Verdict.MISSED, Verdict.SKIPPED)
# Racks that were never tried (they do not count against "every rack failed").
_NOT_TRIED = (Verdict.SKIPPED, Verdict.NOT_STARTED, Verdict.MISSED)

# Rack outcomes that have no task (yet, or ever) and say more than "skipped".
_ROLLOUT_VERDICT = {"pending": Verdict.PENDING, "not_started": Verdict.NOT_STARTED, "missed": Verdict.MISSED}


def _untasked_verdict(outcome: str) -> Verdict:
    """A rack of a firing that has no task to tell: not submitted, waiting its turn, never started …"""
    if outcome == "failed":
        return Verdict.FAILED
    return _ROLLOUT_VERDICT.get(outcome, Verdict.SKIPPED)


class RackOutcome(Protocol):
    """A rack's outcome in a firing as a verdict needs it (`ScopeOutcome`, a grid's `ShownOutcome`)."""

    @property
    def outcome(self) -> Outcome: ...

    @property
    def task_id(self) -> uuid.UUID | None: ...


def outcome_verdict(outcome: RackOutcome, statuses: Mapping[uuid.UUID, TaskStatus]) -> Verdict:
    """One rack of one firing: its task's status when submitted (a vanished task counts as done)."""
    if outcome.outcome != "submitted" or outcome.task_id is None:
        return _untasked_verdict(outcome.outcome)
    status = statuses.get(outcome.task_id)
    return _TASK_VERDICT[status] if status is not None else Verdict.SUCCEEDED


def run_verdict(run: Run, statuses: Mapping[uuid.UUID, TaskStatus]) -> Verdict:
    """A firing: its state when that says it all (halted, cancelled, rolling …); else running while any
    rack has work ahead; else "failed" when every rack tried failed, "partial" when only some did."""
    return verdict_of(run.state, Counter(outcome_verdict(o, statuses) for o in run.outcomes))


def tallied_verdict(
    state: RunState, tally: Mapping[tuple[str, bool], int], task_counts: Mapping[TaskStatus, int]
) -> Verdict:
    """`run_verdict` from counts (a runs grid's column of 10,000 racks; `tallied_verdicts`)."""
    return verdict_of(state, tallied_verdicts(tally, task_counts))


def tallied_verdicts(
    tally: Mapping[tuple[str, bool], int], task_counts: Mapping[TaskStatus, int]
) -> Counter[Verdict]:
    """How many of a run's racks have each verdict, from counts: `tally`, the racks by (outcome, has a
    task), and `task_counts`, the run's tasks by status; submitted racks whose task is gone count as done,
    as `outcome_verdict` counts them. A rack with a task under another outcome (a cancelled rollout's
    "not_started" rack whose task the cancel ended, TERMINATED, before it began) counts by its outcome,
    as `outcome_verdict` counts it, so its task is taken off the terminated ones."""
    verdicts: Counter[Verdict] = Counter()
    for (outcome, has_task), racks in tally.items():
        if outcome != "submitted" or not has_task:
            verdicts[_untasked_verdict(outcome)] += racks
    not_submitted = sum(
        racks for (outcome, has_task), racks in tally.items() if has_task and outcome != "submitted"
    )
    counts = Counter(task_counts)
    counts[TaskStatus.TERMINATED] = max(0, counts[TaskStatus.TERMINATED] - not_submitted)
    for status, racks in counts.items():
        verdicts[_TASK_VERDICT[status]] += racks
    submitted = tally.get(("submitted", True), 0)
    verdicts[Verdict.SUCCEEDED] += max(0, submitted - sum(counts.values()))
    return verdicts


def verdict_of(state: RunState, verdicts: Counter[Verdict]) -> Verdict:
    """A firing's verdict from its state and how many of its racks have each verdict."""
    if state in _STATE_VERDICT:
        return _STATE_VERDICT[state]
    if state == "running":
        verdicts[Verdict.RUNNING] += 1
    going = next((v for v in _STILL_GOING if verdicts[v]), None)
    if going is not None:
        return going
    if verdicts[Verdict.FAILED]:
        tried = sum(n for v, n in verdicts.items() if v not in _NOT_TRIED)
        return Verdict.FAILED if verdicts[Verdict.FAILED] == tried else Verdict.PARTIAL
    return next((v for v in _ENDED if verdicts[v]), Verdict.EMPTY)


SCHEDULE_LOOKS = {
    "enabled": Look("enabled", "●", "st-ok"),
    "paused": Look("paused", "❚❚", "st-wait"),
    "finished": Look("finished", "✓", "st-idle"),
}


def schedule_state(schedule: Schedule, live_rollout: str | None = None) -> Look:
    """Enabled, paused, or finished (a one-time schedule that has fired) — but a one-time schedule whose
    rollout still rolls or is halted has not finished: it shows its rollout's state (`live_rollout`)."""
    if schedule.is_consumed:
        live: dict[str, Look] = {state: RUN_LOOKS[state] for state in ROLLOUT_LIVE_STATES}
        return live.get(live_rollout or "", SCHEDULE_LOOKS["finished"])
    return SCHEDULE_LOOKS["enabled"] if schedule.enabled else SCHEDULE_LOOKS["paused"]


@dataclass(frozen=True)
class Segment:
    key: str
    look: Look
    count: int
    start: int  # racks before this segment (its x on the bar)


@dataclass(frozen=True)
class Bar:
    """A firing's racks by where they stand, as a segmented bar (every segment, empty ones too, so the
    legend names them all)."""

    segments: list[Segment]
    total: int

    @property
    def summary(self) -> str:
        parts = [f"{s.count} {s.look.label}" for s in self.segments if s.count]
        return f"{counted(self.total, 'rack')}: " + (", ".join(parts) or "none")


BAR_LOOKS: dict[str, Look] = {
    "succeeded": Look("succeeded", "✓", "st-ok"),
    "failed": Look("failed", "✗", "st-fail"),
    "running": Look("running", "▶", "st-run"),
    "pending": Look("waiting its turn", "◦", "st-idle"),
    "not_started": Look("not started", "○", "st-skip"),
    "skipped": Look("skipped", "–", "st-skip"),
}

# A rack's verdict as its bar segment; a terminated task counts as failed, as a rollout counts it.
_BAR_OF_VERDICT = {
    Verdict.SUCCEEDED: "succeeded",
    Verdict.FAILED: "failed",
    Verdict.CANCELLED: "failed",
    Verdict.RUNNING: "running",
    Verdict.WAITING: "running",
    Verdict.PENDING: "pending",
    Verdict.NOT_STARTED: "not_started",
    Verdict.MISSED: "not_started",  # past its start deadline: never started
    Verdict.SKIPPED: "skipped",
}


def bar_of(counts: Mapping[str, int]) -> Bar:
    segments, start = [], 0
    for key, look in BAR_LOOKS.items():
        segments.append(Segment(key, look, counts.get(key, 0), start))
        start += counts.get(key, 0)
    return Bar(segments, start)


def verdicts_bar(verdicts: Counter[Verdict]) -> Bar:
    """The racks of a firing by where they stand, from how many have each verdict (`tallied_verdicts`);
    a rollout's bar is the counters `RolloutService` keeps (`pages.runs.progress_bar`)."""
    segments: Counter[str] = Counter()
    for verdict, racks in verdicts.items():
        segments[_BAR_OF_VERDICT[verdict]] += racks
    return bar_of(segments)
