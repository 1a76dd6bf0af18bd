"""The simulator backend: racks that exist only in the database, with timed steps and injected failures.

Its steps report power and firmware changes exactly as a real backend would, and the executor records them
in the inventory (`power_state`, `firmware_version`), so everything above the backend behaves as it would
against hardware.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass

from rackflow.domain.inventory import Component, PowerState
from rackflow.domain.tasks import ComponentChange, OperationKind, Task
from rackflow.errors import InvalidArgument
from rackflow.tasks.backends.base import Backend, StepFailed

# The power state each operation leaves behind; ingest only looks, so it changes nothing.
POWER_AFTER: dict[OperationKind, PowerState] = {
    OperationKind.POWER_ON: PowerState.ON,
    OperationKind.POWER_OFF: PowerState.OFF,
    OperationKind.POWER_RESET: PowerState.ON,
    OperationKind.BRING_UP: PowerState.ON,
}


@dataclass(frozen=True)
class SimulatorConfig:
    """How long each step takes, and which steps fail (by component external id, or at random)."""

    step_seconds: float = 0.2
    fail_external_ids: frozenset[str] = frozenset()
    fail_rate: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_seconds) and self.step_seconds >= 0):
            raise InvalidArgument(f"RACKFLOW_SIM_STEP_SECONDS: must be >= 0, got {self.step_seconds}")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise InvalidArgument(f"RACKFLOW_SIM_FAIL_RATE: must be between 0 and 1, got {self.fail_rate}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SimulatorConfig:
        """RACKFLOW_SIM_STEP_SECONDS, RACKFLOW_SIM_FAIL_IDS (comma list), RACKFLOW_SIM_FAIL_RATE,
        RACKFLOW_SIM_SEED; unset variables keep the defaults."""
        env = os.environ if env is None else env
        ids = frozenset(i.strip() for i in env.get("RACKFLOW_SIM_FAIL_IDS", "").split(",") if i.strip())
        return cls(
            step_seconds=_float(env, "RACKFLOW_SIM_STEP_SECONDS", cls.step_seconds),
            fail_external_ids=ids,
            fail_rate=_float(env, "RACKFLOW_SIM_FAIL_RATE", cls.fail_rate),
            seed=_int(env, "RACKFLOW_SIM_SEED"),
        )


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        raise InvalidArgument(f"{name}: {raw!r} is not a number") from None


def _int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        raise InvalidArgument(f"{name}: {raw!r} is not a whole number") from None


class SimulatorBackend(Backend):
    """Steps take `step_seconds` and then report the change the operation would make to hardware."""

    def __init__(self, config: SimulatorConfig | None = None) -> None:
        self.config = config or SimulatorConfig()
        self._random = random.Random(self.config.seed)

    async def run_step(self, task: Task, component: Component) -> ComponentChange | None:
        await asyncio.sleep(self.config.step_seconds)
        if component.external_id and component.external_id in self.config.fail_external_ids:
            raise StepFailed(f"simulated failure: {component.external_id!r} is in RACKFLOW_SIM_FAIL_IDS")
        if self.config.fail_rate and self._random.random() < self.config.fail_rate:
            raise StepFailed(f"simulated failure (fail rate {self.config.fail_rate:g})")
        kind = task.operation.kind
        firmware = task.operation.target_version if kind is OperationKind.UPGRADE_FIRMWARE else None
        power = POWER_AFTER.get(kind)
        if power is None and firmware is None:
            return None
        return ComponentChange(component.id, power_state=power, firmware_version=firmware)
