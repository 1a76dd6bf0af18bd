"""The redfish backend: each step talks to the component's BMC over DMTF Redfish, through sushy.

Power steps send `Reset` and then poll `PowerState` until it reads the wanted state (or the step times out),
so a completed task means the hardware got there, not merely that a BMC said "accepted". Firmware steps
send `UpdateService.SimpleUpdate`, follow the returned task where the BMC gives one, then read the version
back. Bring-up and ingest read the inventory. What a step observed is returned as a `ComponentChange` for
the executor to record on the component, as the simulator's is. Steps are idempotent (a component already
in the wanted state is left alone), because a task taken over from a dead instance repeats them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from rackflow.domain.inventory import Bmc, Component, PowerState
from rackflow.domain.tasks import ComponentChange, OperationKind, Task
from rackflow.errors import InvalidArgument
from rackflow.inventory.bmc import Target, target_of
from rackflow.retry import Sleep
from rackflow.tasks.backends.base import Backend, StepFailed
from rackflow.tasks.backends.redfish.bmc import BmcSession, Observed
from rackflow.tasks.backends.redfish.calls import call
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.tasks.backends.redfish.endpoint import Credentials, read_credentials
from rackflow.tasks.backends.redfish.rules import PowerAction, firmware_image, power_plan, update_failure

log = logging.getLogger(__name__)


class Session(Protocol):
    """What the backend needs of a BMC connection (`BmcSession`; tests may pass a fake)."""

    def close(self) -> None: ...
    def power_state(self) -> PowerState: ...
    def reset(self, action: PowerAction) -> str: ...
    def firmware_version(self) -> str | None: ...
    def start_update(self, image_uri: str) -> Any | None: ...
    def update_running(self, monitor: Any) -> bool: ...
    def update_result(self, monitor: Any) -> dict[str, Any] | None: ...
    def observe(self) -> Observed: ...


Connect = Callable[[Target, Credentials, RedfishConfig], Session]


class RedfishBackend(Backend):
    """`step_concurrency` (RACKFLOW_REDFISH_CONCURRENCY): how many components of one type the executor may
    run at once."""

    def __init__(
        self,
        config: RedfishConfig | None = None,
        *,
        connect: Connect = BmcSession,
        env: Mapping[str, str] | None = None,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or RedfishConfig()
        self.step_concurrency = self.config.concurrency
        self._connect = connect
        self._env = env
        self._sleep = sleep
        self._monotonic = monotonic

    async def run_step(self, task: Task, component: Component) -> ComponentChange | None:
        bmc = component.bmc
        if bmc is None:
            raise StepFailed(
                f"component {component.name} has no BMC endpoint (give it bmc: url, resource, credentials)"
            )
        target = _target(bmc, component)
        where = target.describe()
        session = await self._call(
            lambda: self._connect(target, read_credentials(bmc.credentials, self._env), self.config),
            f"connecting to {where}",
        )
        try:
            kind = task.operation.kind
            if kind.is_power:
                return await self._power(task, component, session, where)
            if kind is OperationKind.UPGRADE_FIRMWARE:
                return await self._firmware(task, component, session, where)
            return await self._inventory(kind, component, session, where)
        finally:
            await asyncio.to_thread(session.close)

    def _call(self, fn: Callable[[], Any], what: str, *, once: bool = False) -> Awaitable[Any]:
        return call(fn, what=what, config=self.config, sleep=self._sleep, once=once)

    # --- power -----------------------------------------------------------------------------------

    async def _power(self, task: Task, component: Component, session: Session, where: str) -> ComponentChange:
        current = await self._call(session.power_state, f"reading the power state of {where}")
        plan = power_plan(task.operation.kind, forced=task.operation.forced, current=current)
        await self._reach(plan.action, plan.wanted, session, where)
        return ComponentChange(component.id, power_state=plan.wanted)

    async def _reach(
        self, action: PowerAction | None, wanted: PowerState, session: Session, where: str
    ) -> None:
        """Send `action` (if any), then poll until the power state is `wanted` or the step times out."""
        if action is None:
            return
        try:
            sent = await self._call(lambda: session.reset(action), f"{action.value} of {where}", once=True)
        except StepFailed as failed:
            if not failed.retryable:
                raise
            # A timeout or a 5xx: the BMC may have carried it out. Not sent again; the power state decides.
            log.warning("%s: %s; not sent again: waiting for power %s", where, failed, wanted.value)
            sent = f"{action.value} (its answer lost: {failed})"
        log.info("%s: sent Reset %s; waiting for power %s", where, sent, wanted.value)
        deadline = self._monotonic() + self.config.power_timeout
        while True:
            state = await self._call(session.power_state, f"reading the power state of {where}")
            if state is wanted:
                return
            if self._monotonic() >= deadline:
                graceful = action in (PowerAction.GRACEFUL_OFF, PowerAction.GRACEFUL_RESTART)
                hint = "; a forced operation does not wait for the OS" if graceful else ""
                raise StepFailed(
                    f"{where}: power still {state.value}, not {wanted.value}, "
                    f"{self.config.power_timeout:g}s after Reset {sent}{hint}",
                    retryable=True,  # a timeout: the component may get there on a later attempt
                )
            await self._sleep(self.config.poll_interval)

    # --- firmware --------------------------------------------------------------------------------

    async def _firmware(
        self, task: Task, component: Component, session: Session, where: str
    ) -> ComponentChange:
        try:
            image = firmware_image(task.operation.target_version, self.config.image_uri, component.type)
        except ValueError as exc:
            raise StepFailed(str(exc)) from None
        read_version = f"reading the firmware version of {where}"
        if image.expected_version is not None:
            current = await self._call(session.firmware_version, read_version)
            if current == image.expected_version:
                return ComponentChange(component.id, firmware_version=current)
        try:
            monitor = await self._call(
                lambda: session.start_update(image.uri),
                f"SimpleUpdate of {where} with {image.uri}",
                once=True,
            )
        except StepFailed as failed:
            if not failed.retryable:
                raise
            raise StepFailed(  # never a second SimpleUpdate while the first may be flashing
                f"{failed}; not sent again: the BMC may be applying it (see its update service)"
            ) from None
        if monitor is not None:
            await self._follow_update(session, monitor, where)
        version = await self._call(session.firmware_version, read_version)
        if image.expected_version is not None and version != image.expected_version:
            raise StepFailed(
                f"{where}: after the update the BMC reports firmware {version or 'unknown'}, expected "
                f"{image.expected_version} (some BMCs apply firmware only at the next reset)"
            )
        return ComponentChange(component.id, firmware_version=version)

    async def _follow_update(self, session: Session, monitor: Any, where: str) -> None:
        deadline = self._monotonic() + self.config.firmware_timeout
        what = f"following the update task of {where}"
        while await self._call(lambda: session.update_running(monitor), what):
            if self._monotonic() >= deadline:
                timeout = self.config.firmware_timeout
                raise StepFailed(  # not retried: a second SimpleUpdate must not start while this one runs
                    f"{where}: the update task is still running after {timeout:g}s; not retried while it runs"
                )
            await self._sleep(self.config.poll_interval)
        failure = update_failure(session.update_result(monitor))
        if failure is not None:
            raise StepFailed(f"{where}: {failure}")

    # --- bring-up and ingest ---------------------------------------------------------------------

    async def _inventory(
        self, kind: OperationKind, component: Component, session: Session, where: str
    ) -> ComponentChange:
        observed: Observed = await self._call(session.observe, f"reading the inventory of {where}")
        log.info("%s (%s): %s", component.name, where, observed.summary)
        power = observed.power
        if kind is OperationKind.BRING_UP and power is not PowerState.UNKNOWN:
            plan = power_plan(kind, forced=False, current=power)
            await self._reach(plan.action, plan.wanted, session, where)
            power = plan.wanted
        return ComponentChange(component.id, power_state=power, firmware_version=observed.firmware)


def _target(bmc: Bmc, component: Component) -> Target:
    try:
        return target_of(bmc, f"component {component.name} bmc")
    except InvalidArgument as exc:
        raise StepFailed(str(exc)) from None
