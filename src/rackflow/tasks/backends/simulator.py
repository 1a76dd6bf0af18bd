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
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from rackflow.domain.inventory import Component, PowerState
from rackflow.domain.tasks import ComponentChange, OperationKind, Task
from rackflow.errors import InvalidArgument
from rackflow.tasks.backends.base import Backend, StepFailed, StepState

# The power state each operation leaves behind; ingest only looks, so it changes nothing.
POWER_AFTER: dict[OperationKind, PowerState] = {
    OperationKind.POWER_ON: PowerState.ON,
    OperationKind.POWER_OFF: PowerState.OFF,
    OperationKind.POWER_RESET: PowerState.ON,
    OperationKind.BRING_UP: PowerState.ON,
}


@dataclass(frozen=True)
class SimulatorConfig:
    """How long each step takes, and which steps fail (by component external id, or at random): with a
    refusal (`fail_*`, never retried) or with a retryable failure, as a BMC timeout or 5xx would
    (`transient_*`; docs/SAFETY.md, "Retries"). `transient_external_ids` maps an id to how many of its steps
    fail in this process before one succeeds (None: every one)."""

    step_seconds: float = 0.2
    fail_external_ids: frozenset[str] = frozenset()
    fail_rate: float = 0.0
    seed: int | None = None
    transient_external_ids: Mapping[str, int | None] = field(default_factory=dict)
    transient_rate: float = 0.0
    # Each step lasts `step_seconds` times a factor drawn from 1 ± `step_jitter` (0: every step alike), so
    # tasks started together do not all end together, as real ones do not.
    step_jitter: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.step_seconds) and self.step_seconds >= 0):
            raise InvalidArgument(f"RACKFLOW_SIM_STEP_SECONDS: must be >= 0, got {self.step_seconds}")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise InvalidArgument(f"RACKFLOW_SIM_FAIL_RATE: must be between 0 and 1, got {self.fail_rate}")
        if not 0.0 <= self.step_jitter <= 1.0:
            raise InvalidArgument(
                f"RACKFLOW_SIM_STEP_JITTER: must be between 0 and 1, got {self.step_jitter}"
            )
        if not 0.0 <= self.transient_rate <= 1.0:
            raise InvalidArgument(
                f"RACKFLOW_SIM_TRANSIENT_RATE: must be between 0 and 1, got {self.transient_rate}"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SimulatorConfig:
        """RACKFLOW_SIM_STEP_SECONDS, RACKFLOW_SIM_FAIL_IDS (comma list), RACKFLOW_SIM_FAIL_RATE,
        RACKFLOW_SIM_SEED, RACKFLOW_SIM_TRANSIENT_IDS (comma list of `id` or `id:N`),
        RACKFLOW_SIM_TRANSIENT_RATE, RACKFLOW_SIM_STEP_JITTER; unset variables keep the defaults."""
        env = os.environ if env is None else env
        ids = frozenset(i.strip() for i in env.get("RACKFLOW_SIM_FAIL_IDS", "").split(",") if i.strip())
        return cls(
            step_seconds=_float(env, "RACKFLOW_SIM_STEP_SECONDS", cls.step_seconds),
            fail_external_ids=ids,
            fail_rate=_float(env, "RACKFLOW_SIM_FAIL_RATE", cls.fail_rate),
            seed=_int(env, "RACKFLOW_SIM_SEED"),
            transient_external_ids=_transient_ids(env.get("RACKFLOW_SIM_TRANSIENT_IDS", "")),
            transient_rate=_float(env, "RACKFLOW_SIM_TRANSIENT_RATE", cls.transient_rate),
            step_jitter=_float(env, "RACKFLOW_SIM_STEP_JITTER", cls.step_jitter),
        )


def _transient_ids(text: str) -> dict[str, int | None]:
    """`a,b:2`: every step on `a` fails retryably, the first 2 steps on `b` do."""
    found: dict[str, int | None] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, _, count = item.partition(":")
        if count and not (count.isdigit() and int(count) > 0):
            raise InvalidArgument(
                f"RACKFLOW_SIM_TRANSIENT_IDS: {item!r}: the count after ':' must be a whole number > 0"
            )
        found[name.strip()] = int(count) if count else None
    return found


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
        self._transient_failures: Counter[str] = Counter()  # by external id, in this process

    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
        jitter = self.config.step_jitter
        factor = 1.0 + jitter * self._random.uniform(-1.0, 1.0) if jitter else 1.0
        await asyncio.sleep(self.config.step_seconds * factor)
        if component.external_id and component.external_id in self.config.fail_external_ids:
            raise StepFailed(f"simulated failure: {component.external_id!r} is in RACKFLOW_SIM_FAIL_IDS")
        if self.config.fail_rate and self._random.random() < self.config.fail_rate:
            raise StepFailed(f"simulated failure (fail rate {self.config.fail_rate:g})")
        self._fail_transiently(component)
        kind = task.operation.kind
        firmware = task.operation.target_version if kind is OperationKind.UPGRADE_FIRMWARE else None
        power = POWER_AFTER.get(kind)
        if power is None and firmware is None:
            return None
        return ComponentChange(component.id, power_state=power, firmware_version=firmware)

    def _fail_transiently(self, component: Component) -> None:
        """Raise a retryable failure when the configuration injects one for this step."""
        external_id = component.external_id
        transient = self.config.transient_external_ids
        if external_id and external_id in transient:
            limit = transient[external_id]
            if limit is None or self._transient_failures[external_id] < limit:
                self._transient_failures[external_id] += 1
                raise StepFailed(
                    f"simulated retryable failure: {external_id!r} is in RACKFLOW_SIM_TRANSIENT_IDS "
                    "(as a BMC timeout)",
                    retryable=True,
                )
        if self.config.transient_rate and self._random.random() < self.config.transient_rate:
            raise StepFailed(
                f"simulated retryable failure (transient rate {self.config.transient_rate:g})", retryable=True
            )
