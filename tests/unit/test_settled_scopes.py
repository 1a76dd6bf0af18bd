"""A scope settled after its firing's submit (a window's change, the rollout gate) and before its
write-back: recorded in the run naming its task (`settled_scopes`), kept by the write-back (`kept_settled`).
"""

from __future__ import annotations

import uuid

from rackflow.domain.schedules import REMOVED_SCOPE, ScopeOutcome, kept_settled, settled_scopes

S1, S2 = uuid.uuid4(), uuid.uuid4()
R1, R2 = uuid.uuid4(), uuid.uuid4()
T1, T2 = uuid.uuid4(), uuid.uuid4()
SKIPPED = ("skipped_window", "no opening left")


def test_a_running_run_s_empty_outcomes_get_the_settled_task() -> None:
    assert settled_scopes((), {T1: SKIPPED}, {T1: (S1, R1)}) == (
        ScopeOutcome(S1, R1, "skipped_window", task_id=T1, error="no opening left"),
    )


def test_a_task_whose_scope_was_removed_is_recorded_all_the_same_and_its_scope_written_back() -> None:
    """Its scope gone before the write-back, the settled task is kept under its rack (no scope id yet),
    and the write-back, which names the scope the firing had, keeps its outcome rather than "submitted"."""
    settled = settled_scopes((), {T1: SKIPPED}, {T1: (None, R1)})
    assert settled == (
        ScopeOutcome(REMOVED_SCOPE, R1, "skipped_window", task_id=T1, error="no opening left"),
    )
    written = (ScopeOutcome(S1, R1, "submitted", task_id=T1),)
    assert kept_settled(written, settled) == (
        ScopeOutcome(S1, R1, "skipped_window", task_id=T1, error="no opening left"),
    )


def test_an_approved_run_s_pending_entry_of_the_rack_is_replaced() -> None:
    plan = (ScopeOutcome(S1, R1, "pending", canary=True), ScopeOutcome(S2, R2, "pending"))
    assert settled_scopes(plan, {T1: SKIPPED}, {T1: (S1, R1)}) == (
        ScopeOutcome(S1, R1, "skipped_window", task_id=T1, error="no opening left", canary=True),
        ScopeOutcome(S2, R2, "pending"),
    )


def test_a_named_task_is_settled_in_place() -> None:
    outcomes = (ScopeOutcome(S1, R1, "submitted", task_id=T1),)
    assert settled_scopes(outcomes, {T1: SKIPPED}, {T1: (S1, R1)}) == (
        ScopeOutcome(S1, R1, "skipped_window", task_id=T1, error="no opening left"),
    )


def test_the_write_back_keeps_what_was_settled_and_writes_the_rest() -> None:
    written = (ScopeOutcome(S1, R1, "submitted", task_id=T1), ScopeOutcome(S2, R2, "submitted", task_id=T2))
    stored = (ScopeOutcome(S1, R1, "skipped_window", task_id=T1, error="no opening left"),)
    assert kept_settled(written, stored) == (stored[0], written[1])
