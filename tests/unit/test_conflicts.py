"""The conflict rules, pair by pair; every case is checked in both directions. And the coarse check
(`could_conflict`) the schedule conflict check uses, which must never miss a pair the rules refuse."""

from __future__ import annotations

import itertools
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rackflow.domain.inventory import Component, PowerState
from rackflow.domain.inventory import ComponentType as T
from rackflow.domain.tasks import OperationKind as Op
from rackflow.tasks.conflicts import RULES, TaskShape, conflicts, could_conflict, shape_of

SHELF_1, SHELF_2 = uuid.uuid4(), uuid.uuid4()
GPU_1, GPU_2 = uuid.uuid4(), uuid.uuid4()
SWITCH_1, SWITCH_2 = uuid.uuid4(), uuid.uuid4()
TOR_1 = uuid.uuid4()
FIRMWARE = Op.UPGRADE_FIRMWARE

TYPE_OF = {
    SHELF_1: T.POWERSHELF,
    SHELF_2: T.POWERSHELF,
    GPU_1: T.COMPUTE,
    GPU_2: T.COMPUTE,
    SWITCH_1: T.NVSWITCH,
    SWITCH_2: T.NVSWITCH,
    TOR_1: T.TORSWITCH,
}


def shape(kind: Op, *ids: uuid.UUID) -> TaskShape:
    return TaskShape(kind, frozenset((TYPE_OF[i], i) for i in ids))


CASES = [
    # bring-up and ingest vs everything, even on disjoint components
    ("bring-up vs bring-up", shape(Op.BRING_UP, GPU_1), shape(Op.BRING_UP, GPU_2), True),
    ("bring-up vs power on a tor switch", shape(Op.BRING_UP, GPU_1), shape(Op.POWER_ON, TOR_1), True),
    ("ingest vs firmware", shape(Op.INGEST, TOR_1), shape(FIRMWARE, GPU_1), True),
    ("ingest vs bring-up", shape(Op.INGEST), shape(Op.BRING_UP), True),
    ("ingest with no components vs power", shape(Op.INGEST), shape(Op.POWER_OFF, GPU_1), True),
    # power shelf power vs any power or firmware
    ("shelf power vs compute power", shape(Op.POWER_OFF, SHELF_1), shape(Op.POWER_ON, GPU_1), True),
    ("shelf power vs other shelf power", shape(Op.POWER_ON, SHELF_1), shape(Op.POWER_OFF, SHELF_2), True),
    ("shelf power vs tor firmware", shape(Op.POWER_RESET, SHELF_1), shape(FIRMWARE, TOR_1), True),
    ("shelf power vs tor power", shape(Op.POWER_ON, SHELF_1), shape(Op.POWER_ON, TOR_1), True),
    ("shelf firmware vs compute power", shape(FIRMWARE, SHELF_1), shape(Op.POWER_ON, GPU_1), False),
    ("shelf firmware vs other shelf firmware", shape(FIRMWARE, SHELF_1), shape(FIRMWARE, SHELF_2), False),
    # compute power vs compute power or firmware on overlapping components
    ("compute power, same tray", shape(Op.POWER_OFF, GPU_1), shape(Op.POWER_ON, GPU_1, GPU_2), True),
    ("compute power, other tray", shape(Op.POWER_OFF, GPU_1), shape(Op.POWER_ON, GPU_2), False),
    ("compute power vs firmware, same tray", shape(Op.POWER_ON, GPU_1), shape(FIRMWARE, GPU_1), True),
    ("compute power vs firmware, other tray", shape(Op.POWER_ON, GPU_1), shape(FIRMWARE, GPU_2), False),
    ("compute power vs switch power", shape(Op.POWER_ON, GPU_1), shape(Op.POWER_OFF, SWITCH_1), False),
    ("compute power vs switch firmware", shape(Op.POWER_ON, GPU_1), shape(FIRMWARE, SWITCH_1), False),
    # NVSWITCH likewise
    ("switch power, same switch", shape(Op.POWER_RESET, SWITCH_1), shape(Op.POWER_OFF, SWITCH_1), True),
    ("switch power, other switch", shape(Op.POWER_RESET, SWITCH_1), shape(Op.POWER_OFF, SWITCH_2), False),
    (
        "switch power vs firmware, same switch",
        shape(Op.POWER_ON, SWITCH_1, GPU_2),
        shape(FIRMWARE, SWITCH_1),
        True,
    ),
    (
        "switch power vs firmware, other switch",
        shape(Op.POWER_ON, SWITCH_1),
        shape(FIRMWARE, SWITCH_2),
        False,
    ),
    # firmware vs firmware on overlapping components, of any type
    ("firmware, same tor", shape(FIRMWARE, TOR_1), shape(FIRMWARE, TOR_1, GPU_1), True),
    ("firmware, disjoint", shape(FIRMWARE, GPU_1), shape(FIRMWARE, GPU_2, TOR_1), False),
    # what the table leaves alone
    ("tor power vs tor power", shape(Op.POWER_ON, TOR_1), shape(Op.POWER_OFF, TOR_1), False),
    ("tor power vs compute firmware", shape(Op.POWER_ON, TOR_1), shape(FIRMWARE, GPU_1), False),
]


@pytest.mark.parametrize(("new", "active", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_conflict_pairs_both_ways(new: TaskShape, active: TaskShape, expected: bool) -> None:
    forward, backward = conflicts(new, active), conflicts(active, new)
    assert (forward is not None) is expected
    assert (backward is not None) is expected
    assert forward == backward


def test_every_rule_is_exercised() -> None:
    reasons = {conflicts(new, active) for _, new, active, _ in CASES}
    assert {rule.reason for rule in RULES} <= reasons


def test_reason_names_the_rule() -> None:
    reason = conflicts(shape(Op.POWER_OFF, SHELF_1), shape(FIRMWARE, GPU_1))
    assert reason is not None and "power shelf" in reason


# --- the coarse check ------------------------------------------------------------------------------

RACK_ID = uuid.uuid4()
KIND_PAIRS = list(itertools.product(Op, repeat=2))


def _component(ctype: T, index: int) -> Component:
    return Component(uuid.UUID(int=index + 1), RACK_ID, ctype, f"c{index}", "", "", PowerState.UNKNOWN)


@st.composite
def rack_and_two_selections(draw: st.DrawFn) -> tuple[list[Component], list[uuid.UUID], list[uuid.UUID]]:
    """A rack of any components, and the components two tasks on it touch (any subsets, even none)."""
    types = draw(st.lists(st.sampled_from(T), max_size=10))
    rack = [_component(ctype, index) for index, ctype in enumerate(types)]
    ids = [c.id for c in rack]
    subsets = st.lists(st.sampled_from(ids), unique=True) if ids else st.just([])
    return rack, draw(subsets), draw(subsets)


@pytest.mark.parametrize(("kind_a", "kind_b"), KIND_PAIRS, ids=[f"{a}-{b}" for a, b in KIND_PAIRS])
@settings(max_examples=40)
@given(case=rack_and_two_selections())
def test_the_coarse_check_never_misses_a_conflict_the_rules_refuse(
    kind_a: Op, kind_b: Op, case: tuple[list[Component], list[uuid.UUID], list[uuid.UUID]]
) -> None:
    rack, touched_a, touched_b = case
    real = conflicts(shape_of(kind_a, touched_a, rack), shape_of(kind_b, touched_b, rack))
    if real is not None:
        assert could_conflict(kind_a, kind_b) is not None


@pytest.mark.parametrize(
    ("kind_a", "kind_b"),
    [(Op.BRING_UP, Op.POWER_ON), (Op.POWER_RESET, FIRMWARE), (Op.INGEST, Op.INGEST), (FIRMWARE, FIRMWARE)],
)
def test_the_coarse_check_reports_pairs_that_collide_on_some_components_only(kind_a: Op, kind_b: Op) -> None:
    # Power reset of compute trays and a firmware upgrade of NVLink switches run side by side, but the same
    # two operations on shared trays do not: ignoring filters, the coarse check reports the pair.
    assert could_conflict(kind_a, kind_b) is not None
    assert could_conflict(kind_a, kind_b) == could_conflict(kind_b, kind_a)
