"""The redfish backend: each step talks to the component's BMC over DMTF Redfish, through sushy.

Power steps send `Reset` and then poll `PowerState` until it reads the wanted state (or the step times out),
so a completed task means the hardware got there, not merely that a BMC said "accepted"; a restart, which
ends in the state it began in, must also be seen to happen where the BMC gives a way to see it, and is
otherwise done with a note that it was not observed (`rules.reset_progress`). Firmware steps send
`UpdateService.SimpleUpdate`, follow the returned task where the BMC gives one, then read the version back.
Bring-up and ingest read the inventory. What a step observed is returned as a `ComponentChange` for the
executor to record on the component, as the simulator's is. Steps are idempotent (a component already in
the wanted state is left alone), because a task taken over from a dead instance repeats them. A restart is
not (it ends where it began): before sending one, the step records the reading it decides from, and
when, in its `StepState`, and its repeat after a takeover reads it back and never sends it again: it waits
for the proof that the restart happened (`rules.earlier_restart`) as the run before it would have, so a
machine is never restarted twice by one step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from rackflow.clock import Clock, SystemClock
from rackflow.domain.bmc import Target, target_of
from rackflow.domain.inventory import Bmc, Component, ComponentType, PowerState
from rackflow.domain.tasks import ComponentChange, Operation, OperationKind, Task
from rackflow.errors import InvalidArgument
from rackflow.retry import Sleep
from rackflow.tasks.backends.base import Backend, StepFailed, StepState
from rackflow.tasks.backends.redfish.bmc import BmcSession, Observed
from rackflow.tasks.backends.redfish.calls import call
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.tasks.backends.redfish.endpoint import Credentials, read_credentials
from rackflow.tasks.backends.redfish.rules import (
    RESTARTS,
    Earlier,
    PowerAction,
    PowerPlan,
    PowerReading,
    Progress,
    earlier_restart,
    firmware_image,
    power_plan,
    recorded_ago,
    recorded_reading,
    reset_progress,
    restart_record,
    restart_seen,
    update_failure,
    waits_for_settled_power,
)
from rackflow.validation import field_path

log = logging.getLogger(__name__)


class Session(Protocol):
    """What the backend needs of a BMC connection (`BmcSession`; tests may pass a fake)."""

    def close(self) -> None: ...
    def read_power(self) -> PowerReading: ...
    def reset(self, action: PowerAction) -> str: ...
    def firmware_version(self) -> str | None: ...
    def start_update(self, image_uri: str) -> Any | None: ...
    def update_running(self, monitor: Any) -> bool: ...
    def update_result(self, monitor: Any) -> dict[str, Any] | None: ...
    def observe(self) -> Observed: ...


Connect = Callable[[Target, Credentials, RedfishConfig], Session]


class RedfishBackend(Backend):
    """`step_concurrency` (RACKFLOW_REDFISH_CONCURRENCY): how many components of one type the executor may
    run at once. `clock`: the wall clock a restart's record is stamped with, and its repeat after a
    takeover (another instance's) counts from; `monotonic` times the waits within one run."""

    def __init__(
        self,
        config: RedfishConfig | None = None,
        *,
        connect: Connect = BmcSession,
        env: Mapping[str, str] | None = None,
        sleep: Sleep = asyncio.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        clock: Clock | None = None,
    ) -> None:
        self.config = config or RedfishConfig()
        self.step_concurrency = self.config.concurrency
        self._connect = connect
        self._env = env
        self._sleep = sleep
        self._monotonic = monotonic
        self._clock = clock or SystemClock()

    def refusal(self, operation: Operation, field: str = "") -> str | None:
        """An upgrade by version with no RACKFLOW_REDFISH_IMAGE_URI to map it to an image: `_firmware` fails
        every component's step so (`firmware_image`), on any rack."""
        if operation.kind is not OperationKind.UPGRADE_FIRMWARE:
            return None
        try:
            firmware_image(operation.target_version, self.config.image_uri, ComponentType.COMPUTE)
        except ValueError as exc:
            return (
                f"{field_path(field, 'target_version')}: every component's upgrade would fail on this "
                f"server's redfish backend: {exc}"
            )
        return None

    async def run_step(self, task: Task, component: Component, state: StepState) -> ComponentChange | None:
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
            change = await self._run(task, component, session, where, state)
        finally:
            await asyncio.to_thread(session.close)
        if change.note is not None:
            log.warning("task %s (rack %s), %s: %s", task.id, task.rack_id, component.name, change.note)
        return change

    async def _run(
        self, task: Task, component: Component, session: Session, where: str, state: StepState
    ) -> ComponentChange:
        kind = task.operation.kind
        if kind.is_power:
            return await self._power(task, component, session, where, state)
        if kind is OperationKind.UPGRADE_FIRMWARE:
            return await self._firmware(task, component, session, where)
        return await self._inventory(kind, component, session, where, state)

    def _call(self, fn: Callable[[], Any], what: str, *, once: bool = False) -> Awaitable[Any]:
        return call(fn, what=what, config=self.config, sleep=self._sleep, once=once)

    # --- power -----------------------------------------------------------------------------------

    async def _power(
        self, task: Task, component: Component, session: Session, where: str, state: StepState
    ) -> ComponentChange:
        current = await self._read_power(session, where)
        op = task.operation
        power, note = await self._power_from(op.kind, current, session, where, state, forced=op.forced)
        return ComponentChange(component.id, power_state=power, note=note)

    async def _power_from(
        self,
        kind: OperationKind,
        current: PowerReading,
        session: Session,
        where: str,
        state: StepState,
        *,
        forced: bool,
    ) -> tuple[PowerState, str | None]:
        """Carry out `kind` on a component that read `current`; the state it ends in, and the note of a
        restart not observed (`_reach`). A repeat of a reset step whose earlier run recorded a restart
        (`state`) never sends it again: proved by `current`, it waits for On; not yet, it watches for the
        proof (`_await_earlier_restart`), each reading, a state in between included."""
        earlier = earlier_restart(state.recorded, current)
        if earlier is Earlier.DONE:
            await self._earlier_restart_done(current, session, where, state, forced=forced)
            return PowerState.ON, None
        if earlier is Earlier.UNPROVED:
            return PowerState.ON, await self._await_earlier_restart(session, where, state, forced=forced)
        if waits_for_settled_power(kind):
            current = await self._settle(current, session, where, kind)
        plan = power_plan(kind, forced=forced, current=current.state)
        return plan.wanted, await self._reach(plan, current, session, where, state)

    async def _earlier_restart_done(
        self, current: PowerReading, session: Session, where: str, state: StepState, *, forced: bool
    ) -> None:
        """The restart the run before a takeover recorded has happened: wait for the power to read On, and
        send nothing (a Reset into a restart under way would restart it again, or be refused)."""
        action = power_plan(OperationKind.POWER_RESET, forced=forced, current=PowerState.ON).action
        assert action is not None and state.recorded is not None  # a restart, proved done
        log.info(
            "%s: the restart sent before a takeover happened (read %s); not sent again",
            where,
            current.describe(),
        )
        sent = f"{action.value} (sent before a takeover)"
        await self._watch(
            action, PowerState.ON, recorded_reading(state.recorded), session, where, sent, "sent", seen=True
        )

    async def _await_earlier_restart(
        self, session: Session, where: str, state: StepState, *, forced: bool
    ) -> str | None:
        """The restart the run before a takeover recorded has not shown yet. It may be under way (a
        graceful restart's OS still shutting down: On, and `LastResetTime` unmoved, as it is recorded only
        once the restart is carried out), or never have been sent (that run died between its record and
        its Reset); nothing read now tells which, and sending it again would restart a machine twice. So
        the step goes on with the watch that run began, as if it were still running it, timed from the
        record (`recorded_ago`): done once proved; on a BMC without `LastResetTime`, done unverified past
        the proof window; otherwise failed, not retried, past the power timeout, as without a takeover.
        Returns the note of a restart counted done unverified."""
        recorded = state.recorded
        assert recorded is not None  # UNPROVED: a restart was recorded
        action = power_plan(OperationKind.POWER_RESET, forced=forced, current=PowerState.ON).action
        assert action is not None  # a restart
        ago = recorded_ago(recorded, self._clock.now())
        log.info(
            "%s: the restart recorded before a takeover, %.0fs ago, has not shown yet; watching for it, "
            "not sending it again",
            where,
            ago,
        )
        sent = f"{action.value} (recorded before a takeover)"
        before = recorded_reading(recorded)
        return await self._watch(
            action, PowerState.ON, before, session, where, sent, "perhaps sent", seen=False, since=ago
        )

    def _read_power(self, session: Session, where: str) -> Awaitable[PowerReading]:
        return self._call(session.read_power, f"reading the power state of {where}")

    async def _settle(
        self, current: PowerReading, session: Session, where: str, kind: OperationKind
    ) -> PowerReading:
        """Poll until the power reads On or Off (`waits_for_settled_power` says why); nothing is sent."""
        deadline = self._monotonic() + self.config.power_timeout
        while current.state is PowerState.UNKNOWN:
            if self._monotonic() >= deadline:
                raise StepFailed(
                    f"{where}: power still {current.describe()} after {self.config.power_timeout:g}s, "
                    f"not On or Off; nothing sent: a {kind.value} acts only from On or Off",
                    retryable=True,  # a timeout: the component may have settled by a later attempt
                )
            await self._sleep(self.config.poll_interval)
            current = await self._read_power(session, where)
        return current

    async def _reach(
        self, plan: PowerPlan, before: PowerReading, session: Session, where: str, state: StepState
    ) -> str | None:
        """Send the plan's action (if any), then poll until the power state is the wanted one, and for a
        restart until it has been seen to happen, or the step times out (`rules.reset_progress`). Returns
        the note of a restart counted done without being observed, None otherwise. A restart is recorded
        (`state`) before it is sent: a takeover may repeat this step."""
        action, wanted = plan.action, plan.wanted
        if action is None:
            return None
        if action in RESTARTS:
            await state.record(restart_record(before, self._clock.now()))
        try:
            sent = await self._call(lambda: session.reset(action), f"{action.value} of {where}", once=True)
            taken = "accepted"
        except StepFailed as failed:
            if not failed.retryable:
                raise
            # A timeout or a 5xx: the BMC may have carried it out. Not sent again; the power state decides.
            log.warning("%s: %s; not sent again: waiting for power %s", where, failed, wanted.value)
            sent, taken = f"{action.value} (its answer lost: {failed})", "sent"
        log.info("%s: sent Reset %s; waiting for power %s", where, sent, wanted.value)
        return await self._watch(
            action, wanted, before, session, where, sent, taken, seen=action not in RESTARTS
        )

    async def _watch(
        self,
        action: PowerAction,
        wanted: PowerState,
        before: PowerReading,
        session: Session,
        where: str,
        sent: str,
        taken: str,
        *,
        seen: bool,
        since: float = 0.0,
    ) -> str | None:
        """Poll after `action` was sent to a component that read `before`, `since` seconds ago (a watch
        taken over), as `_reach` says."""
        started = self._monotonic() - since
        window = min(self.config.restart_proof_window, self.config.power_timeout)
        while True:
            now = await self._read_power(session, where)
            seen = seen or restart_seen(before, now)
            watched = self._monotonic() - started
            progress = reset_progress(wanted, before, now, seen=seen, watched=watched, window=window)
            if progress is Progress.DONE:
                return None
            if progress is Progress.DONE_UNOBSERVED:
                return (
                    f"{where}: restart unverified: Reset {sent} {taken}, but not observed: no Off, "
                    f"PoweringOff or PoweringOn read in {window:g}s, and the BMC keeps no LastResetTime; "
                    "counted done, not retried"
                )
            if watched >= self.config.power_timeout:
                raise self._not_reached(action, wanted, before, now, sent, where)
            await self._sleep(self.config.poll_interval)

    def _not_reached(
        self,
        action: PowerAction,
        wanted: PowerState,
        before: PowerReading,
        now: PowerReading,
        sent: str,
        where: str,
    ) -> StepFailed:
        timeout = self.config.power_timeout
        if now.state is wanted:  # a restart that never showed, on a BMC that keeps LastResetTime
            return StepFailed(
                f"{where}: no sign that Reset {sent} restarted it: power read On throughout {timeout:g}s "
                f"and its LastResetTime stayed {before.last_reset}; not retried: a restart carried out "
                "unseen would be repeated",
                retryable=False,
            )
        graceful = action in (PowerAction.GRACEFUL_OFF, PowerAction.GRACEFUL_RESTART)
        hint = "; a forced operation does not wait for the OS" if graceful else ""
        still = now.describe() if now.state is PowerState.UNKNOWN else now.state.value  # the BMC's word
        return StepFailed(
            f"{where}: power still {still}, not {wanted.value}, {timeout:g}s after Reset {sent}{hint}",
            retryable=True,  # a timeout: the component may get there on a later attempt
        )

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
        self, kind: OperationKind, component: Component, session: Session, where: str, state: StepState
    ) -> ComponentChange:
        observed: Observed = await self._call(session.observe, f"reading the inventory of {where}")
        log.info("%s (%s): %s", component.name, where, observed.summary)
        power, note = observed.power_state, None
        if kind is OperationKind.BRING_UP and observed.power is not None:  # None: a manager, no power
            power, note = await self._power_from(kind, observed.power, session, where, state, forced=False)
        return ComponentChange(component.id, power_state=power, firmware_version=observed.firmware, note=note)


def _target(bmc: Bmc, component: Component) -> Target:
    try:
        return target_of(bmc, f"component {component.name} bmc")
    except InvalidArgument as exc:
        raise StepFailed(str(exc)) from None
