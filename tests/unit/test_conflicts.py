"""The conflict rules, pair by pair; every case is checked in both directions."""

from __future__ import annotations

import uuid

import pytest

from rackflow.inventory.model import ComponentType as T
from rackflow.tasks.conflicts import RULES, TaskShape, conflicts
from rackflow.tasks.model import OperationKind as Op

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
