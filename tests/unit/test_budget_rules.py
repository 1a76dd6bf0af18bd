"""The budgets' admission rule (`rackflow.budgets.rules.admit`): what starts, what waits and the words it
waits with, and, for any budgets and tasks, that no cap is ever passed by what it lets start."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from rackflow.budgets.rules import admit
from rackflow.domain.budgets import OperationBudget, Started
from rackflow.domain.tasks import OperationKind

T0 = datetime(2026, 12, 1, tzinfo=UTC)
FW, OFF, ON = OperationKind.UPGRADE_FIRMWARE, OperationKind.POWER_OFF, OperationKind.POWER_ON
DOMAINS = [uuid.UUID(int=i) for i in range(1, 5)]


def budget(name: str, ops: set[OperationKind], cap: int, per_domain: int | None = None) -> OperationBudget:
    return OperationBudget(uuid.uuid4(), name, frozenset(ops), cap, per_domain, T0, T0)


def test_candidates_start_in_order_until_the_cap_and_the_rest_wait_with_the_budget_named() -> None:
    fw = budget("fw", {FW}, 3)
    running = [Started(FW, DOMAINS[0])] * 2
    held = admit([fw], running, [(i, Started(FW, DOMAINS[1])) for i in range(3)])
    assert list(held) == [1, 2]
    assert held[1].message == "waits for budget 'fw' (3 of 3 running)"


def test_other_operations_pass_and_do_not_count() -> None:
    fw = budget("fw", {FW}, 1)
    held = admit(
        [fw], [Started(ON, DOMAINS[0])] * 5, [("a", Started(ON, DOMAINS[0])), ("b", Started(FW, DOMAINS[0]))]
    )
    assert held == {}


def test_a_full_domain_does_not_hold_back_a_task_of_another_domain() -> None:
    fw = budget("fw", {FW}, 10, per_domain=1)
    candidates = [
        ("a1", Started(FW, DOMAINS[0])),
        ("a2", Started(FW, DOMAINS[0])),
        ("b1", Started(FW, DOMAINS[1])),
    ]
    held = admit([fw], [], candidates)
    assert list(held) == ["a2"]
    assert held["a2"].message == "waits for budget 'fw' (1 of 1 running in its NVLink domain)"


def test_every_budget_counting_the_operation_must_have_room() -> None:
    wide = budget("all-power", {ON, OFF}, 1)
    narrow = budget("off", {OFF}, 5)
    held = admit([narrow, wide], [Started(ON, DOMAINS[0])], [("x", Started(OFF, DOMAINS[1]))])
    assert held["x"].budget is wide


def test_a_budget_below_what_runs_says_how_many_run() -> None:
    fw = budget("fw", {FW}, 2)
    held = admit([fw], [Started(FW, DOMAINS[0])] * 5, [("x", Started(FW, DOMAINS[0]))])
    assert held["x"].message == "waits for budget 'fw' (5 of 2 running)"


OPS = st.sampled_from([FW, OFF, ON])
STARTED = st.builds(Started, OPS, st.sampled_from(DOMAINS))
BUDGETS = st.lists(
    st.builds(
        budget,
        st.text(alphabet="abc", min_size=1, max_size=3),
        st.sets(OPS, min_size=1),
        st.integers(1, 6),
        st.none() | st.integers(1, 3),
    ),
    max_size=3,
)


@given(budgets=BUDGETS, running=st.lists(STARTED, max_size=10), candidates=st.lists(STARTED, max_size=20))
def test_what_starts_never_passes_a_cap_that_had_room(
    budgets: list[OperationBudget], running: list[Started], candidates: list[Started]
) -> None:
    held = admit(budgets, running, list(enumerate(candidates)))
    started = [task for i, task in enumerate(candidates) if i not in held]
    for b in budgets:
        before = [t for t in running if b.counts(t.operation)]
        added = [t for t in started if b.counts(t.operation)]
        # Nothing starts under a budget already at or past its cap; otherwise the total stays within it.
        assert not added or len(before) + len(added) <= b.max_running
        if b.max_running_per_domain is not None:
            per_before = Counter(t.domain for t in before)
            for domain, count in Counter(t.domain for t in added).items():
                assert per_before[domain] + count <= b.max_running_per_domain
    # A held task names a budget that counts it and was full for it.
    for i, reason in held.items():
        assert reason.budget.counts(candidates[i].operation) and reason.running >= reason.cap
    # Nothing is held that every budget had room for: with no budgets, everything starts.
    if not budgets:
        assert held == {}
