"""What a backend is: the thing that carries out one task step on one component.

The executor owns everything around the steps (claiming, progress, cancellation, finishing); a backend only
knows how to talk to hardware, or to pretend to. Step order is decided here once, in `plan`, for every
backend: power shelves come up first and go down last, so nothing is switched on without power behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rackflow.inventory.model import Component, ComponentType
from rackflow.tasks.model import OperationKind, Task


class StepFailed(Exception):
    """A component's step failed; the text says why and becomes part of the task's message."""


class Backend(Protocol):
    """Runs steps. A backend may also set `step_concurrency` (an int, 1 when absent): how many steps on
    components of one type the executor runs at once (`executor.step_batches`); types stay in plan order.
    A backend may also offer `run_step_deferred` (`executor.DeferringBackend`): it returns what the step
    changed instead of writing it, and the executor writes it with the task's next progress or its end.
    """

    async def run_step(self, task: Task, component: Component) -> None:
        """Carry out `task.operation` on one component, recording what changed in the inventory.

        Raise `StepFailed` with a reason when the component refuses. Steps must be idempotent: a task taken
        over after its instance died repeats the steps that may already have happened.
        """
        ...


# Infrastructure before what depends on it: power, cooling, management, network, fabric, then compute.
POWER_ON_ORDER: tuple[ComponentType, ...] = (
    ComponentType.POWERSHELF,
    ComponentType.CDU,
    ComponentType.UMS,
    ComponentType.TORSWITCH,
    ComponentType.NVSWITCH,
    ComponentType.COMPUTE,
    ComponentType.UNKNOWN,
)


def plan(kind: OperationKind, components: Sequence[Component]) -> list[Component]:
    """The components in the order their steps run.

    Power-off runs in reverse (compute first, power shelves last); everything else, power-on and reset
    included, in `POWER_ON_ORDER`, so a dependant never comes back before what it depends on. Within a type
    the given order is kept.
    """
    rank = {ctype: i for i, ctype in enumerate(POWER_ON_ORDER)}
    direction = -1 if kind is OperationKind.POWER_OFF else 1
    return sorted(components, key=lambda c: direction * rank[c.type])


STEP_VERB: dict[OperationKind, str] = {
    OperationKind.POWER_ON: "powering on",
    OperationKind.POWER_OFF: "powering off",
    OperationKind.POWER_RESET: "resetting",
    OperationKind.BRING_UP: "bringing up",
    OperationKind.INGEST: "ingesting",
    OperationKind.UPGRADE_FIRMWARE: "upgrading firmware",
}

DONE_VERB: dict[OperationKind, str] = {
    OperationKind.POWER_ON: "powered on",
    OperationKind.POWER_OFF: "powered off",
    OperationKind.POWER_RESET: "reset",
    OperationKind.BRING_UP: "brought up",
    OperationKind.INGEST: "ingested",
    OperationKind.UPGRADE_FIRMWARE: "upgraded firmware of",
}
