"""What a backend is: a driver that carries out one task step on one component and says what it changed.

The executor owns everything around the steps (claiming, progress, cancellation, finishing) and is the only
writer: a backend talks to hardware, or pretends to, and returns a `ComponentChange`; it holds no database
handle and knows nothing of storage. A new backend is a subclass of `Backend` with one method. Step order
is decided here once, in `plan`, for every backend: power shelves come up first and go down last, so
nothing is switched on without power behind it.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence

from rackflow.domain.inventory import Component, ComponentType
from rackflow.domain.tasks import ComponentChange, Operation, OperationKind, Task


class StepFailed(Exception):
    """A component's step failed; the text says why and becomes part of the task's message.

    `retryable`: the backend judges that the same step may succeed if tried again later (a timeout, a lost
    connection, a server error), so a task with a retry policy gets another attempt. A refusal (a 4xx, a
    request the component rejects) is not: trying again would fail the same way.
    """

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        super().__init__(reason)
        self.retryable = retryable


class StepState(abc.ABC):
    """One step's own record, kept with its task (per component and attempt) across a takeover.

    Steps are repeated when a task is taken over, and most are idempotent: the state they reach is proof
    enough. One that is not (a restart ends where it began) records, before it acts, what it needs in order
    to tell afterwards whether it acted; a repeat of the step reads that back in `recorded`. The backend
    touches no database: the executor keeps the record, and `record` returns once it is committed, fenced
    like every write of a running task (a task that is no longer this instance's is not acted on).
    """

    @property
    @abc.abstractmethod
    def recorded(self) -> Mapping[str, str] | None:
        """What an earlier run of this step recorded (this attempt's, before a takeover); None: nothing."""

    @abc.abstractmethod
    async def record(self, values: Mapping[str, str]) -> None:
        """Keep `values` for a later run of this step; returns once committed, before the step acts."""


class Backend(abc.ABC):
    """Runs steps, one component at a time.

    `step_concurrency`: how many steps on components of one type the executor runs at once
    (`executor.step_batches`); types stay in plan order.
    """

    step_concurrency: int = 1

    @abc.abstractmethod
    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
        """Carry out `task.operation` on one component; what it changed or observed there (None: nothing),
        which the executor records with the task's next write.

        Raise `StepFailed` with a reason when the component refuses. Steps must be idempotent: a task taken
        over after its instance died repeats the steps that may already have happened, or whose change was
        not recorded yet. A step that cannot be made so by reading the component keeps what it needs in
        `state` before it acts (a redfish restart: `StepState`).
        """

    def refusal(self, operation: Operation, field: str = "") -> str | None:
        """Why every step of `operation` would fail here whatever the rack, known before any task is made
        (this backend's settings cannot carry it out), as a refusal naming the field under `field` (the
        operation's path in the request); None: nothing known. The task manager refuses such a submission,
        and a schedule that would fire it, rather than make tasks that all fail
        (`TaskManager.check_runnable`)."""
        return None


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
