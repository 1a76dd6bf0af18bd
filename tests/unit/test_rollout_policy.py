"""The rollout rule alone (`domain.rollouts.decide`): no database, no clock but the one passed in."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from rackflow.checks.gate import GATE_NAME
from rackflow.domain.rollouts import Decision, Phase, RolloutPolicy, ScopeView, caps_reached, decide
from rackflow.domain.schedules import ScopeOutcome
from rackflow.domain.tasks import TaskStatus
from rackflow.rollouts.gate import scope_phase as _phase
from rackflow.store.rollouts import TaskState

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
DOM_A, DOM_B = uuid.uuid4(), uuid.uuid4()


def scope(
    name: str,
    phase: Phase = Phase.PENDING,
    *,
    domain: uuid.UUID | None = None,
    canary: bool = False,
    finished_at: datetime | None = None,
) -> ScopeView:
    return ScopeView(
        uuid.uuid5(uuid.NAMESPACE_DNS, name), uuid.uuid4(), name, domain, phase, canary, finished_at
    )


def started(decision: Decision, *scopes: ScopeView) -> list[str]:
    by_id = {s.scope_id: s.label for s in scopes}
    return [by_id[i] for i in decision.start]


def test_no_policy_limits_start_everything_pending_at_once() -> None:
    scopes = [scope("a"), scope("b", Phase.SUCCEEDED), scope("c")]
    assert started(decide(RolloutPolicy(), scopes, now=NOW), *scopes) == ["a", "c"]


def test_max_concurrent_counts_the_active_ones() -> None:
    scopes = [scope("a", Phase.ACTIVE), scope("b"), scope("c"), scope("d")]
    assert started(decide(RolloutPolicy(max_concurrent_racks=3), scopes, now=NOW), *scopes) == ["b", "c"]
    full = [scope("a", Phase.ACTIVE), scope("b", Phase.ACTIVE), scope("c")]
    assert decide(RolloutPolicy(max_concurrent_racks=2), full, now=NOW) == Decision()


def test_a_full_domain_does_not_hold_back_later_racks_of_other_domains() -> None:
    scopes = [
        scope("a1", Phase.ACTIVE, domain=DOM_A),
        scope("a2", domain=DOM_A),
        scope("b1", domain=DOM_B),
        scope("b2", domain=DOM_B),
        scope("x"),
        scope("y"),
    ]
    decision = decide(RolloutPolicy(max_per_domain=1), scopes, now=NOW)
    assert started(decision, *scopes) == ["b1", "x", "y"]  # racks without a domain: each its own


def test_canaries_alone_first_then_the_rest_after_the_bake_time() -> None:
    policy = RolloutPolicy(canary_racks=2, bake_time=timedelta(minutes=15))
    waiting = [scope("c1", canary=True), scope("c2", canary=True), scope("r1")]
    assert started(decide(policy, waiting, now=NOW), *waiting) == ["c1", "c2"]
    one_left = [
        scope("c1", Phase.SUCCEEDED, canary=True, finished_at=NOW),
        scope("c2", Phase.ACTIVE, canary=True),
        scope("r1"),
    ]
    assert decide(policy, one_left, now=NOW) == Decision()
    done = NOW + timedelta(minutes=1)
    baked = [
        scope("c1", Phase.SUCCEEDED, canary=True, finished_at=NOW),
        scope("c2", Phase.SUCCEEDED, canary=True, finished_at=done),
        scope("r1"),
    ]
    assert decide(policy, baked, now=done + timedelta(minutes=14)) == Decision(
        bake_until=done + timedelta(minutes=15)
    )
    assert started(decide(policy, baked, now=done + timedelta(minutes=15)), *baked) == ["r1"]


def test_a_failed_canary_halts_unless_the_run_was_resumed() -> None:
    scopes = [scope("c1", Phase.FAILED, canary=True), scope("c2", canary=True), scope("r1")]
    assert decide(RolloutPolicy(canary_racks=2), scopes, now=NOW).halt == "rollout halted: canary c1 failed"
    resumed = decide(RolloutPolicy(canary_racks=2), scopes, now=NOW, failures_excused=1, resumed=True)
    assert started(resumed, *scopes) == ["c2", "r1"]


def test_halting_at_exactly_the_count_or_the_percentage() -> None:
    one = [scope("a", Phase.FAILED), scope("b"), scope("c"), scope("d")]
    two = [scope("a", Phase.FAILED), scope("b", Phase.FAILED), scope("c"), scope("d")]
    assert decide(RolloutPolicy(halt_after_failures=2), one, now=NOW).halt is None
    assert decide(RolloutPolicy(halt_after_failures=2), two, now=NOW).halt == (
        "rollout halted: 2 of 4 racks failed (limit 2)"
    )
    assert decide(RolloutPolicy(halt_after_failure_percent=50), one, now=NOW).halt is None
    assert decide(RolloutPolicy(halt_after_failure_percent=50), two, now=NOW).halt == (
        "rollout halted: 2 of 4 racks failed (limit 50%)"
    )
    # After a resume, the failures before it are excused.
    assert decide(RolloutPolicy(halt_after_failures=2), two, now=NOW, failures_excused=1).halt is None


def test_done_only_when_nothing_is_pending_or_active_and_over_its_limit_then_not_halted() -> None:
    running = [scope("a", Phase.FAILED), scope("b", Phase.ACTIVE)]
    assert decide(RolloutPolicy(halt_after_failures=1), running, now=NOW) == Decision(done=False)
    # A task submitted and not begun (a budget holds it) still waits to start: the halt stops it.
    unbegun = [scope("a", Phase.FAILED), replace(scope("b", Phase.ACTIVE), unbegun=True)]
    assert decide(RolloutPolicy(halt_after_failures=1), unbegun, now=NOW).halt == (
        "rollout halted: 1 of 2 racks failed (limit 1)"
    )
    assert decide(RolloutPolicy(halt_after_failures=2), unbegun, now=NOW) == Decision()
    ended = [scope("a", Phase.FAILED), scope("b", Phase.SUCCEEDED), scope("c", Phase.SKIPPED)]
    # Every rack began, so nothing is left to halt: done, and over its limit (its schedule is paused).
    assert decide(RolloutPolicy(halt_after_failures=1), ended, now=NOW) == Decision(
        done=True, over_limit="rollout completed over its failure limit: 1 of 3 racks failed (limit 1)"
    )
    assert decide(RolloutPolicy(halt_after_failure_percent=50), ended, now=NOW) == Decision(done=True)
    assert decide(RolloutPolicy(halt_after_failures=2), ended, now=NOW) == Decision(done=True)
    # Failures before a resume are excused, as for a halt.
    assert decide(RolloutPolicy(halt_after_failures=1), ended, now=NOW, failures_excused=1) == Decision(
        done=True
    )


def test_no_wave_starts_at_or_past_its_firmware_window_s_end() -> None:
    """Rule 0: the window is half-open, so at its end the run is cancelled while anything waits to start
    (a pending scope, or a task submitted and not begun, which the cancel ends), whatever the caps or the
    failures say: no resume could move the end, so a halt could only wait for an operator's cancel; with
    nothing left to start, it ends as it would have."""
    end = NOW + timedelta(minutes=30)
    reason = (
        "rollout cancelled by rackflow: its firmware window ended at 2026-12-01T12:30:00Z (its upgrade's "
        "end_time): no wave starts at or after it"
    )
    pending = [scope("a", Phase.SUCCEEDED), scope("b"), scope("c")]
    assert started(
        decide(RolloutPolicy(), pending, now=end - timedelta(seconds=1), window_end=end), *pending
    ) == [
        "b",
        "c",
    ]
    for now in (end, end + timedelta(days=1)):
        decision = decide(RolloutPolicy(), pending, now=now, window_end=end)
        assert decision.halt is None and decision.cancel is not None and decision.cancel.startswith(reason)
        assert decision.pause_reason == decision.cancel  # its schedule paused as a halt's
    failed = [scope("a", Phase.FAILED), scope("b")]
    cancel = decide(RolloutPolicy(halt_after_failures=1), failed, now=end, window_end=end).cancel
    assert cancel is not None and cancel.startswith(reason)  # the end, which no resume can move, first
    unbegun = [scope("a", Phase.SUCCEEDED), replace(scope("b", Phase.ACTIVE), unbegun=True)]
    cancel = decide(RolloutPolicy(), unbegun, now=end, window_end=end).cancel
    assert cancel is not None and cancel.startswith(reason)
    running = [scope("a", Phase.SUCCEEDED), scope("b", Phase.ACTIVE)]
    assert decide(RolloutPolicy(), running, now=end, window_end=end) == Decision()  # it finishes
    ended = [scope("a", Phase.SUCCEEDED), scope("b", Phase.FAILED)]
    assert decide(RolloutPolicy(), ended, now=end, window_end=end) == Decision(done=True)


def test_the_policy_round_trips_through_json() -> None:
    policy = RolloutPolicy(3, 1, 2, timedelta(minutes=15), 2, 12.5, False)
    assert RolloutPolicy.from_json(policy.to_json()) == policy


def test_racks_held_by_pre_flight_checks_count_neither_against_the_cap_nor_as_failed() -> None:
    """docs/CHECKS.md: a held rack's task is not running, so it takes no room; the run is not done while
    one is held; only a check that gives up fails the task, and then it counts. Held, it has not begun: a
    failure limit other racks reach halts the run (ROLLOUTS.md, "Halting")."""
    scopes = [scope("a", Phase.HELD), scope("b", Phase.HELD), scope("c"), scope("d")]
    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
    assert started(decide(policy, scopes, now=NOW), *scopes) == ["c"]
    all_held = [scope("a", Phase.HELD), scope("b", Phase.SUCCEEDED)]
    assert decide(policy, all_held, now=NOW) == Decision(done=False)
    held_and_failed = [scope("a", Phase.HELD), scope("b", Phase.FAILED)]
    assert decide(policy, held_and_failed, now=NOW).halt == "rollout halted: 1 of 2 racks failed (limit 1)"
    gave_up = [scope("a", Phase.FAILED), scope("c")]
    assert decide(policy, gave_up, now=NOW).halt == "rollout halted: 1 of 2 racks failed (limit 1)"


def test_a_pending_task_held_by_the_pre_flight_gate_is_a_held_scope() -> None:
    outcome = ScopeOutcome(uuid.uuid4(), uuid.uuid4(), "submitted", task_id=uuid.uuid4())
    held = TaskState(uuid.uuid4(), TaskStatus.PENDING, None, held_by=GATE_NAME)
    assert _phase(outcome, held) is Phase.HELD
    by_budget = TaskState(uuid.uuid4(), TaskStatus.PENDING, None, held_by="budget")
    assert _phase(outcome, by_budget) is Phase.ACTIVE


def cap_reached(policy: RolloutPolicy, active: list[uuid.UUID], domain: uuid.UUID) -> str:
    """`caps_reached` of a scope in `domain` beside the `active` ones, listed by domain."""
    return caps_reached(policy, len(active), active.count(domain))


def test_a_released_held_rack_finds_room_only_under_both_caps() -> None:
    domain_a, domain_b, lone = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    both = RolloutPolicy(max_concurrent_racks=2, max_per_domain=1)
    assert cap_reached(both, [], domain_a) == ""
    assert cap_reached(both, [domain_b], domain_a) == ""
    assert cap_reached(both, [domain_a], domain_a) == (
        "1 of its racks active in this rack's domain (max 1 per domain)"
    )
    assert cap_reached(both, [domain_b, lone], domain_a) == "2 of its racks active (max 2)"
    assert cap_reached(RolloutPolicy(), [domain_a] * 50, domain_a) == ""  # no caps
