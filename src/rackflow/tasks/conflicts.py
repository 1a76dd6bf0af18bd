"""Which tasks may not run on one rack at the same time: a rule table and one pure function.

The task manager only fetches a rack's active tasks and asks `conflicts(new, active)` for each; every
policy decision is a row of `RULES`. A rule is written once, from one side; `conflicts` tries both orders,
so the table is symmetric by construction ("power shelf power vs firmware" also means "firmware vs power
shelf power").
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rackflow.domain.inventory import Component, ComponentType
from rackflow.domain.tasks import OperationKind, Task


class Activity(enum.Enum):
    """The families the rules speak about."""

    POWER = "power"
    FIRMWARE = "firmware"
    EXCLUSIVE = "exclusive"  # bring-up and ingest own the whole rack


ACTIVITY_OF: dict[OperationKind, Activity] = {
    OperationKind.POWER_ON: Activity.POWER,
    OperationKind.POWER_OFF: Activity.POWER,
    OperationKind.POWER_RESET: Activity.POWER,
    OperationKind.UPGRADE_FIRMWARE: Activity.FIRMWARE,
    OperationKind.BRING_UP: Activity.EXCLUSIVE,
    OperationKind.INGEST: Activity.EXCLUSIVE,
}


@dataclass(frozen=True)
class TaskShape:
    """What a task does and which components it touches: all the rules need to know about it."""

    kind: OperationKind
    components: frozenset[tuple[ComponentType, uuid.UUID]]

    @property
    def activity(self) -> Activity:
        return ACTIVITY_OF[self.kind]

    def touches(self, ctype: ComponentType) -> bool:
        return any(t is ctype for t, _ in self.components)

    def ids(self, ctype: ComponentType | None = None) -> frozenset[uuid.UUID]:
        """Ids of the touched components, of one type or of every type."""
        return frozenset(i for t, i in self.components if ctype is None or t is ctype)


def _any(_a: TaskShape, _b: TaskShape) -> bool:
    return True


def _overlap(ctype: ComponentType | None) -> Callable[[TaskShape, TaskShape], bool]:
    """Both tasks touch at least one common component (of `ctype`, or of any type)."""

    def overlapping(a: TaskShape, b: TaskShape) -> bool:
        return not a.ids(ctype).isdisjoint(b.ids(ctype))

    return overlapping


@dataclass(frozen=True)
class Rule:
    """`first` and `second` conflict when each side matches and `together` holds for the pair.

    A side matches a task whose activity is one of `activities` and, when `touching` is set, which touches
    a component of that type.
    """

    reason: str
    first: frozenset[Activity]
    second: frozenset[Activity]
    first_touching: ComponentType | None = None
    together: Callable[[TaskShape, TaskShape], bool] = _any

    def matches(self, a: TaskShape, b: TaskShape) -> bool:
        if a.activity not in self.first or b.activity not in self.second:
            return False
        if self.first_touching is not None and not a.touches(self.first_touching):
            return False
        return self.together(a, b)


_POWER = frozenset({Activity.POWER})
_POWER_OR_FIRMWARE = frozenset({Activity.POWER, Activity.FIRMWARE})
_FIRMWARE = frozenset({Activity.FIRMWARE})
_EVERYTHING = frozenset(Activity)

RULES: tuple[Rule, ...] = (
    Rule(
        "bring-up and ingest need the rack to themselves",
        first=frozenset({Activity.EXCLUSIVE}),
        second=_EVERYTHING,
    ),
    Rule(
        "power shelf power changes affect every power or firmware operation on the rack",
        first=_POWER,
        first_touching=ComponentType.POWERSHELF,
        second=_POWER_OR_FIRMWARE,
    ),
    Rule(
        "power and firmware operations on the same compute trays",
        first=_POWER,
        first_touching=ComponentType.COMPUTE,
        second=_POWER_OR_FIRMWARE,
        together=_overlap(ComponentType.COMPUTE),
    ),
    Rule(
        "power and firmware operations on the same NVLink switches",
        first=_POWER,
        first_touching=ComponentType.NVSWITCH,
        second=_POWER_OR_FIRMWARE,
        together=_overlap(ComponentType.NVSWITCH),
    ),
    Rule(
        "firmware upgrades of the same components",
        first=_FIRMWARE,
        second=_FIRMWARE,
        together=_overlap(None),
    ),
)


def conflicts(new: TaskShape, active: TaskShape) -> str | None:
    """Why `new` may not run while `active` does, or None when both may run together."""
    for rule in RULES:
        if rule.matches(new, active) or rule.matches(active, new):
            return rule.reason
    return None


# One stand-in component of every type: together, all a task could touch on any rack.
_WHOLE_RACK = frozenset((ctype, uuid.UUID(int=index)) for index, ctype in enumerate(ComponentType, start=1))


def whole_rack(kind: OperationKind) -> TaskShape:
    """A task of `kind` that touches every component a rack could have.

    Every rule only grows with what a task touches (a `first_touching` type, an overlap of components), so
    two real tasks on one rack that conflict have whole-rack shapes that conflict too.
    """
    return TaskShape(kind, _WHOLE_RACK)


def could_conflict(a: OperationKind, b: OperationKind) -> str | None:
    """Why tasks of kinds `a` and `b` might not run together on one rack, whatever components each touches,
    or None when no two such tasks ever conflict.

    Coarse on purpose (the schedule conflict check, which ignores component filters): it may report a pair
    that would run side by side, never miss one the rules refuse.
    """
    return conflicts(whole_rack(a), whole_rack(b))


def shape_of(
    kind: OperationKind, component_ids: Iterable[uuid.UUID], rack_components: Sequence[Component]
) -> TaskShape:
    """The conflict shape; components removed from the rack since the task was made no longer count."""
    types = {c.id: c.type for c in rack_components}
    return TaskShape(kind, frozenset((types[i], i) for i in component_ids if i in types))


def first_conflict(
    shape: TaskShape, active: Iterable[Task], rack_components: Sequence[Component]
) -> tuple[Task, str] | None:
    """The first of `active` (tasks on the same rack) that a task of `shape` conflicts with, and why."""
    for task in active:
        reason = conflicts(shape, shape_of(task.operation.kind, task.component_ids, rack_components))
        if reason is not None:
            return task, reason
    return None
