"""RedfishBackend.run_step against a scripted BMC session: what it does to the BMC and what it reports.

The session fake stands where sushy would (`BmcSession`, exercised against the real emulator in
tests/integration); here every branch of the step logic is driven deterministically, with a fake clock.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sushy import exceptions as sushy_errors  # type: ignore[import-untyped]

from rackflow.clock import FakeClock
from rackflow.domain.bmc import Target
from rackflow.domain.inventory import Bmc, Component, ComponentType, PowerState
from rackflow.domain.tasks import ComponentChange, Operation, OperationKind, Task, TaskStatus
from rackflow.tasks.backends.base import StepFailed
from rackflow.tasks.backends.redfish.backend import RedfishBackend
from rackflow.tasks.backends.redfish.bmc import Observed
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.tasks.backends.redfish.endpoint import Credentials
from rackflow.tasks.backends.redfish.rules import RESTARTS, PowerAction, PowerReading, restart_record
from tests.step_state import Kept

ON, OFF, UNKNOWN = PowerState.ON, PowerState.OFF, PowerState.UNKNOWN
POWERING_ON, POWERING_OFF = PowerReading(UNKNOWN, "PoweringOn"), PowerReading(UNKNOWN, "PoweringOff")
BMC = Bmc("http://bmc:8000", "Systems/node-0", "env:BMC_RACK1")
ENV = {"BMC_RACK1": "admin:secret"}
WHERE = "http://bmc:8000/redfish/v1/Systems/node-0"
WALL = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)  # the wall clock a restart's record is stamped with


class FakeSession:
    """A BMC whose power follows a Reset after `lag` reads, with firmware and an update task.

    `reads` are what the next power reads return, before anything else. A restart is read as
    `restart_reads` (by default Off once: hardware goes down), then On; with `stamps_resets` it also moves
    LastResetTime, as a BMC that keeps one does. `reported` is the BMC's word for an unknown state."""

    def __init__(self, power: PowerState = OFF, *, lag: int = 2, firmware: str | None = "1.0") -> None:
        self.power = power
        self.lag = lag
        self.firmware = firmware
        self.pending: tuple[PowerState, int] | None = None
        self.reads: list[PowerReading] = []
        self.restart_reads: list[PowerReading] = [PowerReading(OFF, "Off")]
        self.reported: str | None = None
        self.last_reset: str | None = None
        self.stamps_resets = False
        self.power_control = True
        self.resets: list[PowerAction] = []
        self.updates: list[str] = []
        self.update_polls = 2
        self.update_doc: dict[str, Any] | None = {"TaskState": "Completed", "TaskStatus": "OK"}
        self.flashes_to: str | None = None
        self.errors: dict[str, list[Exception]] = {}
        self.closed = False

    def _maybe_fail(self, name: str) -> None:
        if self.errors.get(name):
            raise self.errors[name].pop(0)

    def close(self) -> None:
        self.closed = True

    def read_power(self) -> PowerReading:
        self._maybe_fail("read_power")
        if self.reads:
            return replace(self.reads.pop(0), last_reset=self.last_reset)
        if self.pending is not None:
            state, left = self.pending
            self.pending = (state, left - 1) if left > 1 else None
            if left <= 1:
                self.power = state
        reported = {ON: "On", OFF: "Off"}.get(self.power, self.reported)
        return PowerReading(self.power, reported, self.last_reset)

    def reset(self, action: PowerAction) -> str:
        self._maybe_fail("reset")
        self.resets.append(action)
        if action in RESTARTS:
            self.reads, self.power = list(self.restart_reads), ON
            if self.stamps_resets:
                self.last_reset = f"2025-06-01T12:00:{len(self.resets):02d}Z"
            return action.name
        wanted = OFF if action in (PowerAction.GRACEFUL_OFF, PowerAction.FORCE_OFF) else ON
        self.pending = (wanted, self.lag)
        return action.name

    def firmware_version(self) -> str | None:
        return self.firmware

    def start_update(self, image_uri: str) -> Any | None:
        self.updates.append(image_uri)
        return "monitor"

    def update_running(self, monitor: Any) -> bool:
        self.update_polls -= 1
        if self.update_polls < 0 and self.flashes_to is not None:
            self.firmware = self.flashes_to
        return self.update_polls >= 0

    def update_result(self, monitor: Any) -> dict[str, Any] | None:
        return self.update_doc

    def observe(self) -> Observed:
        power = self.read_power() if self.power_control else None
        return Observed(power, self.firmware, "Systems/node-0 'node-0'; power on")


class Clock:
    """Fake monotonic time that only moves when the backend sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def task(kind: OperationKind, *, forced: bool = False, target_version: str = "") -> Task:
    now = datetime.now(UTC)
    operation = Operation(kind, forced=forced, target_version=target_version)
    status = TaskStatus.RUNNING
    return Task(uuid.uuid4(), operation, uuid.uuid4(), (), "", status, "", None, now, now, None, now)


def make_component(bmc: Bmc | None = BMC) -> Component:
    return Component(
        uuid.uuid4(), uuid.uuid4(), ComponentType.COMPUTE, "node-0", "", "1.0", PowerState.UNKNOWN, bmc
    )


def stored(component: Component, change: ComponentChange | None) -> Component:
    """The component as the executor records it with what the step reported."""
    if change is None:
        return component
    assert change.component_id == component.id
    return replace(
        component,
        power_state=change.power_state or component.power_state,
        firmware_version=change.firmware_version or component.firmware_version,
    )


def backend(
    session: FakeSession, clock: Clock, *, wall: FakeClock | None = None, **config: Any
) -> RedfishBackend:
    settings = {"poll_interval": 1.0, "power_timeout": 10.0, "retry_delay": 0.5, **config}

    def connect(target: Target, credentials: Credentials, _config: RedfishConfig) -> FakeSession:
        assert (target.describe(), credentials) == (WHERE, Credentials("admin", "secret"))
        return session

    return RedfishBackend(
        RedfishConfig(**settings),
        connect=connect,
        env=ENV,
        sleep=clock.sleep,
        monotonic=clock.monotonic,
        clock=wall or FakeClock(WALL),
    )


async def test_a_component_without_a_bmc_fails_clearly() -> None:
    component = make_component(bmc=None)
    with pytest.raises(StepFailed, match=r"^component node-0 has no BMC endpoint"):
        await backend(FakeSession(), Clock()).run_step(task(OperationKind.POWER_ON), component, Kept())


async def test_power_on_sends_reset_then_waits_for_the_state_and_records_it() -> None:
    component, session, clock = make_component(), FakeSession(OFF, lag=3), Clock()
    change = await backend(session, clock).run_step(task(OperationKind.POWER_ON), component, Kept())
    assert session.resets == [PowerAction.ON]
    assert clock.slept == [1.0, 1.0]  # read 1 and 2 still off, read 3 on
    assert stored(component, change).power_state is ON
    assert session.closed


async def test_a_component_already_in_the_state_is_left_alone() -> None:
    component, session = make_component(), FakeSession(ON)
    change = await backend(session, Clock()).run_step(task(OperationKind.POWER_ON), component, Kept())
    assert session.resets == []
    assert stored(component, change).power_state is ON


@pytest.mark.parametrize(
    ("kind", "forced", "action"),
    [
        (OperationKind.POWER_OFF, False, PowerAction.GRACEFUL_OFF),
        (OperationKind.POWER_OFF, True, PowerAction.FORCE_OFF),
        (OperationKind.POWER_RESET, False, PowerAction.GRACEFUL_RESTART),
        (OperationKind.POWER_RESET, True, PowerAction.FORCE_RESTART),
    ],
)
async def test_forced_chooses_the_reset_type(kind: OperationKind, forced: bool, action: PowerAction) -> None:
    component, session = make_component(), FakeSession(ON)
    await backend(session, Clock()).run_step(task(kind, forced=forced), component, Kept())
    assert session.resets == [action]


async def test_a_state_never_reached_fails_after_the_step_timeout() -> None:
    component, session, clock = make_component(), FakeSession(ON, lag=1000), Clock()
    with pytest.raises(StepFailed) as caught:
        await backend(session, clock).run_step(task(OperationKind.POWER_OFF), component, Kept())
    assert str(caught.value) == (
        f"{WHERE}: power still on, not off, 10s after Reset GRACEFUL_OFF; a forced operation does not wait "
        "for the OS"
    )
    assert clock.now == 10.0  # and the step raised: it reports no change to record
    assert caught.value.retryable  # a timeout: a later attempt may get there


async def test_transient_errors_are_retried_and_the_step_still_succeeds() -> None:
    component, session, clock = make_component(), FakeSession(OFF, lag=1), Clock()
    refused = sushy_errors.ConnectionError(url=WHERE, error="[Errno 111] Connection refused")
    session.errors["read_power"] = [refused, refused]
    change = await backend(session, clock).run_step(task(OperationKind.POWER_ON), component, Kept())
    assert clock.slept[:2] == [0.5, 1.0]
    assert stored(component, change).power_state is ON


async def test_a_python_error_outside_sushy_is_a_bug_not_a_malformed_answer() -> None:
    """An answer sushy could not read is the BMC's fault (tests/integration/test_redfish_firmware); the same
    error raised by rackflow's own code is a bug, and stays one (the executor logs it with its traceback)."""
    component, session = make_component(), FakeSession(OFF)
    session.errors["read_power"] = [TypeError("a bug of rackflow's own")]
    with pytest.raises(TypeError):
        await backend(session, Clock()).run_step(task(OperationKind.POWER_ON), component, Kept())


async def test_unset_credentials_fail_without_connecting() -> None:
    component = make_component(Bmc("http://bmc:8000", "node-0", "env:BMC_OTHER"))
    with pytest.raises(StepFailed) as caught:
        await backend(FakeSession(), Clock()).run_step(task(OperationKind.POWER_ON), component, Kept())
    assert str(caught.value) == (
        f"connecting to {WHERE}: credentials env:BMC_OTHER: environment variable BMC_OTHER is not set"
    )


async def test_firmware_by_version_flashes_the_mapped_image_and_verifies() -> None:
    component, session, clock = make_component(), FakeSession(), Clock()
    session.flashes_to = "2.0"
    run = backend(session, clock, image_uri="http://img/{type}/{version}.bin")
    change = await run.run_step(task(OperationKind.UPGRADE_FIRMWARE, target_version="2.0"), component, Kept())
    assert session.updates == ["http://img/compute/2.0.bin"]
    assert clock.slept == [1.0, 1.0]
    assert stored(component, change).firmware_version == "2.0"


async def test_firmware_already_at_the_version_is_not_flashed_again() -> None:
    component, session = make_component(), FakeSession(firmware="2.0")
    run = backend(session, Clock(), image_uri="http://img/{version}.bin")
    change = await run.run_step(task(OperationKind.UPGRADE_FIRMWARE, target_version="2.0"), component, Kept())
    assert session.updates == []
    assert stored(component, change).firmware_version == "2.0"


async def test_firmware_that_reads_back_wrong_fails() -> None:
    component, session = make_component(), FakeSession()
    session.flashes_to = "1.9"
    run = backend(session, Clock(), image_uri="http://img/{version}.bin")
    with pytest.raises(StepFailed) as caught:
        await run.run_step(task(OperationKind.UPGRADE_FIRMWARE, target_version="2.0"), component, Kept())
    assert str(caught.value) == (
        f"{WHERE}: after the update the BMC reports firmware 1.9, expected 2.0 (some BMCs apply firmware "
        "only at the next reset)"
    )


async def test_a_failed_update_task_fails_the_step_in_the_bmcs_words() -> None:
    component, session = make_component(), FakeSession()
    session.update_doc = {"TaskState": "Exception", "Messages": [{"Message": "image signature invalid"}]}
    with pytest.raises(StepFailed, match=r"update task ended Exception: image signature invalid$"):
        await backend(session, Clock()).run_step(
            task(OperationKind.UPGRADE_FIRMWARE, target_version="https://img/fw.bin"), component, Kept()
        )


async def test_firmware_by_uri_records_what_the_bmc_reports() -> None:
    component, session = make_component(), FakeSession()
    session.flashes_to = "3.1.4"
    change = await backend(session, Clock()).run_step(
        task(OperationKind.UPGRADE_FIRMWARE, target_version="https://img/fw.bin"), component, Kept()
    )
    assert session.updates == ["https://img/fw.bin"]
    assert stored(component, change).firmware_version == "3.1.4"


async def test_a_version_without_an_image_mapping_fails_with_the_way_out() -> None:
    component = make_component()
    with pytest.raises(StepFailed, match="RACKFLOW_REDFISH_IMAGE_URI"):
        await backend(FakeSession(), Clock()).run_step(
            task(OperationKind.UPGRADE_FIRMWARE, target_version="2.0"), component, Kept()
        )


async def test_ingest_records_what_it_reads_and_changes_nothing() -> None:
    component, session = make_component(), FakeSession(OFF, firmware="1.7")
    change = await backend(session, Clock()).run_step(task(OperationKind.INGEST), component, Kept())
    found = stored(component, change)
    assert (found.power_state, found.firmware_version, session.resets) == (OFF, "1.7", [])


async def test_bring_up_reads_the_inventory_and_powers_on() -> None:
    component, session = make_component(), FakeSession(OFF, lag=1, firmware="1.7")
    change = await backend(session, Clock()).run_step(task(OperationKind.BRING_UP), component, Kept())
    found = stored(component, change)
    assert (found.power_state, found.firmware_version, session.resets) == (ON, "1.7", [PowerAction.ON])


# --- a restart must be seen to happen ------------------------------------------------------------


async def test_a_restart_that_never_shows_on_a_bmc_with_last_reset_time_is_not_reported_done() -> None:
    """The BMC keeps LastResetTime, accepted the restart, and neither it nor the power moved: had the restart
    happened, LastResetTime would say so. The step fails, however short the proof window."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.restart_reads, session.last_reset = [], "2025-06-01T11:00:00Z"
    with pytest.raises(StepFailed) as caught:
        await backend(session, clock, restart_proof_window=3.0).run_step(
            task(OperationKind.POWER_RESET), component, Kept()
        )
    assert str(caught.value) == (
        f"{WHERE}: no sign that Reset GRACEFUL_RESTART restarted it: power read On throughout 10s and its "
        "LastResetTime stayed 2025-06-01T11:00:00Z; not retried: a restart carried out unseen would be "
        "repeated"
    )
    assert not caught.value.retryable  # it may have happened unseen: a retry would restart it again
    assert (session.resets, clock.now) == ([PowerAction.GRACEFUL_RESTART], 10.0)


async def test_a_restart_that_never_shows_on_a_bmc_without_last_reset_time_is_done_unverified(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing on this BMC could prove a warm restart: after the proof window it is done, and says so."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.restart_reads = []
    run = task(OperationKind.POWER_RESET, forced=True)
    change = await backend(session, clock, restart_proof_window=3.0).run_step(run, component, Kept())
    assert stored(component, change).power_state is ON
    assert (session.resets, clock.now) == ([PowerAction.FORCE_RESTART], 3.0)  # the window, not the timeout
    note = (
        f"{WHERE}: restart unverified: Reset FORCE_RESTART accepted, but not observed: no Off, "
        "PoweringOff or PoweringOn read in 3s, and the BMC keeps no LastResetTime; counted done, not retried"
    )
    assert change is not None and change.note == note
    assert f"task {run.id} (rack {run.rack_id}), node-0: {note}" in [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING"
    ]


async def test_an_unobserved_restart_whose_answer_was_lost_is_not_called_accepted() -> None:
    component, session = make_component(), FakeSession(ON)
    session.restart_reads = []
    timed_out = sushy_errors.ConnectionError(url=WHERE, error="read timed out")
    session.errors["reset"] = [timed_out]  # whether the BMC took it is unknown: not "accepted"
    change = await backend(session, Clock(), restart_proof_window=3.0).run_step(
        task(OperationKind.POWER_RESET), component, Kept()
    )
    assert change is not None and change.note is not None
    assert "restart unverified: Reset graceful restart (its answer lost: " in change.note
    assert "sent, but not observed" in change.note


async def test_the_proof_window_is_at_most_the_power_timeout() -> None:
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.restart_reads = []
    change = await backend(session, clock, restart_proof_window=60.0).run_step(
        task(OperationKind.POWER_RESET), component, Kept()
    )
    assert clock.now == 10.0 and change is not None and "read in 10s" in (change.note or "")


async def test_a_restart_seen_on_a_bmc_without_last_reset_time_carries_no_note() -> None:
    component, session = make_component(), FakeSession(ON)  # its restart reads Off once, then On
    change = await backend(session, Clock()).run_step(task(OperationKind.POWER_RESET), component, Kept())
    assert change is not None and (change.power_state, change.note) == (ON, None)


async def test_an_unobserved_restart_waits_for_on_past_the_window() -> None:
    """Done unobserved needs the power On: a read without a PowerState after the window is waited out."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.restart_reads = [PowerReading(ON, "On"), *[PowerReading(UNKNOWN, None)] * 4]
    change = await backend(session, clock, restart_proof_window=2.0).run_step(
        task(OperationKind.POWER_RESET), component, Kept()
    )
    assert clock.now == 5.0 and change is not None and change.note is not None


async def test_a_restart_read_before_the_bmc_applies_it_is_waited_for() -> None:
    """On right after the Reset is the old state: the step waits until it has seen the power go."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.restart_reads = [PowerReading(ON, "On")] * 2 + [PowerReading(OFF, "Off"), POWERING_ON]
    change = await backend(session, clock).run_step(
        task(OperationKind.POWER_RESET, forced=True), component, Kept()
    )
    assert session.resets == [PowerAction.FORCE_RESTART]
    assert clock.slept == [1.0] * 4  # On, On, Off, PoweringOn, then On
    assert stored(component, change).power_state is ON


async def test_a_restart_that_keeps_the_power_on_is_proved_by_last_reset_time() -> None:
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.restart_reads, session.last_reset, session.stamps_resets = [], "2025-06-01T11:00:00Z", True
    change = await backend(session, clock).run_step(task(OperationKind.POWER_RESET), component, Kept())
    assert (clock.slept, stored(component, change).power_state) == ([], ON)


async def test_a_reset_of_a_component_in_transition_waits_for_it_to_settle() -> None:
    """Whether to restart or power on depends on where it settles: here Off, so it is powered on."""
    component, session, clock = make_component(), FakeSession(OFF, lag=1), Clock()
    session.reads = [POWERING_OFF, POWERING_OFF]
    change = await backend(session, clock).run_step(task(OperationKind.POWER_RESET), component, Kept())
    assert session.resets == [PowerAction.ON]
    assert stored(component, change).power_state is ON


# --- bring-up of a component whose power is in transition ------------------------------------------


async def test_bring_up_of_a_component_powering_off_waits_then_powers_it_on() -> None:
    component, session, clock = make_component(), FakeSession(OFF, lag=1), Clock()
    session.reads = [POWERING_OFF, POWERING_OFF]  # the first is the inventory read
    change = await backend(session, clock).run_step(task(OperationKind.BRING_UP), component, Kept())
    assert session.resets == [PowerAction.ON]
    assert clock.slept == [1.0, 1.0]  # PoweringOff twice, then Off: On sent, and read at once
    assert stored(component, change).power_state is ON


async def test_bring_up_of_a_component_powering_on_sends_nothing() -> None:
    component, session = make_component(), FakeSession(ON)
    session.reads = [POWERING_ON, POWERING_ON]
    change = await backend(session, Clock()).run_step(task(OperationKind.BRING_UP), component, Kept())
    assert (session.resets, stored(component, change).power_state) == ([], ON)


async def test_bring_up_of_a_component_that_never_settles_fails_having_sent_nothing() -> None:
    component, session, clock = make_component(), FakeSession(UNKNOWN), Clock()
    session.reported = "Paused"
    with pytest.raises(StepFailed) as caught:
        await backend(session, clock).run_step(task(OperationKind.BRING_UP), component, Kept())
    assert str(caught.value) == (
        f"{WHERE}: power still Paused after 10s, not On or Off; nothing sent: a bring_up acts only from "
        "On or Off"
    )
    assert caught.value.retryable and session.resets == []


async def test_bring_up_of_a_manager_reads_it_and_sends_nothing() -> None:
    component, session = make_component(), FakeSession(firmware="7.1")
    session.power_control = False
    change = await backend(session, Clock()).run_step(task(OperationKind.BRING_UP), component, Kept())
    found = stored(component, change)
    assert (session.resets, found.power_state, found.firmware_version) == ([], UNKNOWN, "7.1")


# --- a reset taken over: the restart its earlier run recorded is never sent again ----------------------


def recorded(last_reset: str | None = None, ago: float | None = 0.0) -> Kept:
    """A takeover's state: the run before it recorded a restart of a component that read On, `ago`
    seconds before WALL (None: a record from before records kept their time)."""
    record = restart_record(PowerReading(ON, "On", last_reset), WALL - timedelta(seconds=ago or 0))
    if ago is None:
        del record["recorded_at"]
    return Kept(record)


async def test_a_restart_is_recorded_with_its_reading_and_time_before_it_is_sent() -> None:
    component, session, state = make_component(), FakeSession(ON), Kept()
    session.last_reset, session.stamps_resets = "2025-06-01T11:00:00Z", True
    await backend(session, Clock()).run_step(task(OperationKind.POWER_RESET), component, state)
    assert state.records == [
        {"power": "On", "last_reset_time": "2025-06-01T11:00:00Z", "recorded_at": "2025-06-01T12:00:00Z"}
    ]


async def test_a_recorded_restart_not_seen_yet_is_watched_for_from_its_record_not_sent_again() -> None:
    """No LastResetTime; the restart is under way (a graceful one's OS shutting down): On twice, then Off
    and PoweringOn. The takeover sends nothing, and the state between proves it; no note."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.reads = [PowerReading(ON, "On")] * 2 + [PowerReading(OFF, "Off"), POWERING_ON]
    change = await backend(session, clock, restart_proof_window=5.0).run_step(
        task(OperationKind.POWER_RESET), component, recorded(ago=1.0)
    )
    assert session.resets == []
    assert change is not None and (change.power_state, change.note) == (ON, None)
    assert clock.slept == [1.0] * 3  # On (its watch's first read), Off, PoweringOn, then On


async def test_a_recorded_restart_seen_powering_on_after_a_pause_is_not_sent_again() -> None:
    """Paused proves nothing, the PoweringOn after it does, though the machine reads On at the end."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.reads = [PowerReading(UNKNOWN, "Paused"), POWERING_ON]
    change = await backend(session, clock, restart_proof_window=5.0).run_step(
        task(OperationKind.POWER_RESET), component, recorded(ago=1.0)
    )
    assert session.resets == []
    assert change is not None and (change.power_state, change.note) == (ON, None)


async def test_a_recorded_restart_whose_last_reset_time_stayed_fails_at_the_timeout_from_its_record() -> None:
    """LastResetTime stayed: the restart may have been lost, or never sent; sending it could restart a
    machine that restarted unrecorded. The step fails, not retried, at the power timeout from the record."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.last_reset = "2025-06-01T11:00:00Z"
    with pytest.raises(StepFailed) as caught:
        await backend(session, clock).run_step(
            task(OperationKind.POWER_RESET), component, recorded("2025-06-01T11:00:00Z", ago=4.0)
        )
    assert str(caught.value) == (
        f"{WHERE}: no sign that Reset graceful restart (recorded before a takeover) restarted it: power read "
        "On throughout 10s and its LastResetTime stayed 2025-06-01T11:00:00Z; not retried: a restart "
        "carried out unseen would be repeated"
    )
    assert not caught.value.retryable
    assert (session.resets, clock.now) == ([], 6.0)  # 4 s before the takeover, 6 s after


async def test_a_recorded_restart_without_its_time_is_watched_for_the_whole_timeout() -> None:
    """A record from before records kept their time: the watch starts at the takeover."""
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.last_reset = "2025-06-01T11:00:00Z"
    with pytest.raises(StepFailed, match="no sign that Reset forced restart"):
        await backend(session, clock).run_step(
            task(OperationKind.POWER_RESET, forced=True), component, recorded("2025-06-01T11:00:00Z", None)
        )
    assert (session.resets, clock.now) == ([], 10.0)


async def test_a_recorded_restart_never_seen_without_last_reset_time_is_done_unverified_later() -> None:
    component, session, clock = make_component(), FakeSession(ON), Clock()
    change = await backend(session, clock, restart_proof_window=3.0).run_step(
        task(OperationKind.POWER_RESET), component, recorded(ago=1.0)
    )
    assert (session.resets, clock.now) == ([], 2.0)  # the window counted from the record
    assert change is not None and change.power_state is ON
    assert change.note == (
        f"{WHERE}: restart unverified: Reset graceful restart (recorded before a takeover) perhaps sent, but "
        "not observed: no Off, PoweringOff or PoweringOn read in 3s, and the BMC keeps no LastResetTime; "
        "counted done, not retried"
    )


async def test_a_recorded_restart_already_seen_is_waited_for_on_not_sent_again() -> None:
    component, session, clock = make_component(), FakeSession(ON), Clock()
    session.reads = [PowerReading(OFF, "Off"), POWERING_ON]
    change = await backend(session, clock).run_step(
        task(OperationKind.POWER_RESET),
        component,
        recorded(ago=60.0),  # past the power timeout
    )
    assert session.resets == []
    assert change is not None and (change.power_state, change.note) == (ON, None)
