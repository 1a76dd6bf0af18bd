"""A `StepState` kept in memory, for tests that run a backend's steps without the executor (which keeps it
in the database: `task_step_state`)."""

from __future__ import annotations

from collections.abc import Mapping

from rackflow.tasks.backends.base import StepState


class Kept(StepState):
    """`recorded`: what an earlier run of the step recorded (a takeover's repeat), None at first; `records`:
    what this run recorded, in order."""

    def __init__(self, recorded: Mapping[str, str] | None = None) -> None:
        self._recorded = recorded
        self.records: list[dict[str, str]] = []

    @property
    def recorded(self) -> Mapping[str, str] | None:
        return self._recorded

    async def record(self, values: Mapping[str, str]) -> None:
        self.records.append(dict(values))
