"""`step_batches`: steps of one component type run together, up to the backend's `step_concurrency`; types
stay in order. The executor running them against a backend is tests/store/test_step_concurrency.py."""

from __future__ import annotations

import uuid

from rackflow.domain.inventory import Component, ComponentType, PowerState
from rackflow.tasks.executor import step_batches

RACK = uuid.uuid4()


def component(name: str, ctype: ComponentType) -> Component:
    return Component(uuid.uuid4(), RACK, ctype, name, "", "", PowerState.UNKNOWN)


def names(batches: list[list[tuple[int, Component]]]) -> list[list[str]]:
    return [[f"{n}:{c.name}" for n, c in batch] for batch in batches]


SHELF = ComponentType.POWERSHELF
NODE = ComponentType.COMPUTE
STEPS = [component("ps-0", SHELF), component("ps-1", SHELF)] + [component(f"n{i}", NODE) for i in range(5)]


def test_width_one_runs_every_step_alone() -> None:
    assert names(step_batches(STEPS, 1)) == [[f"{i}:{c.name}"] for i, c in enumerate(STEPS, 1)]


def test_batches_never_mix_types_and_hold_at_most_width_steps() -> None:
    shelves = ["1:ps-0", "2:ps-1"]
    assert names(step_batches(STEPS, 2)) == [shelves, ["3:n0", "4:n1"], ["5:n2", "6:n3"], ["7:n4"]]
    assert names(step_batches(STEPS, 4)) == [shelves, ["3:n0", "4:n1", "5:n2", "6:n3"], ["7:n4"]]


def test_a_type_that_comes_back_later_starts_a_new_batch() -> None:
    steps = [component("a", NODE), component("b", SHELF), component("c", NODE)]
    assert names(step_batches(steps, 8)) == [["1:a"], ["2:b"], ["3:c"]]


def test_no_steps_no_batches() -> None:
    assert step_batches([], 4) == []
