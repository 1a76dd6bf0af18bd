"""A reset taken over in the middle, through the executor on both databases and the real sushy path
against the fake BMC of test_redfish_firmware: the machine is restarted once, never twice.

The first instance sends the restart and stops before it has seen it done (its runs cancelled, its
registration gone: a successor takes the task over at once, as after a crash and the lease). The second
repeats the step, and never sends the restart its predecessor recorded before sending it
(`task_step_state`): proved by the LastResetTime that moved, or by Off or PoweringOn, it waits for On;
not proved yet (a graceful restart whose OS is still shutting down reads On, its LastResetTime as it
was), it watches for the proof as its predecessor would have, until the power timeout (or, on a BMC
without LastResetTime, the proof window) counted from the record.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import replace

import pytest

from rackflow.clock import SystemClock
from rackflow.domain.inventory import Bmc, ComponentSpec, ComponentType, Rack
from rackflow.domain.tasks import Operation, OperationKind, Task, TaskStatus
from rackflow.inventory.service import InventoryService
from rackflow.store.db import Database
from rackflow.tasks.backends.redfish.backend import RedfishBackend
from rackflow.tasks.backends.redfish.config import RedfishConfig
from tests.integration.test_redfish_firmware import ENV, ROOT, FakeBmc, fake_bmc  # noqa: F401 (fixture)
from tests.store.test_executor import eventually, executing, finished, row, submit

RESET = f"{ROOT}/Systems/node-0/Actions/Reset"
BACKEND_CONFIG = RedfishConfig(
    poll_interval=0.01, retry_delay=0.01, power_timeout=60.0, restart_proof_window=0.2
)
PATIENT = replace(BACKEND_CONFIG, restart_proof_window=30.0)  # longer than any test waits for proof
MID_RESTART = 10**9  # reads of the system that say Off after a restart: until the test lets it come back
GRACEFUL, FORCED = Operation(OperationKind.POWER_RESET), Operation(OperationKind.POWER_RESET, forced=True)


async def rack_of(db: Database, url: str) -> Rack:
    node = ComponentSpec(ComponentType.COMPUTE, "node-0", bmc=Bmc(url, "Systems/node-0", "env:BMC"))
    return await InventoryService(db, SystemClock()).create_rack(
        f"r-{uuid.uuid4().hex[:8]}", components=[node]
    )


async def reset_cut_short(db: Database, bmc: FakeBmc, url: str) -> Task:
    """Submit a forced reset, let an instance send the restart, and stop that instance mid-restart."""
    bmc.restart_off_reads = MID_RESTART

    async def mid_restart() -> bool:
        return bmc.posts == [RESET] and bmc.off_reads_left < MID_RESTART  # sent, and read Off since

    return await cut_short(db, url, FORCED, mid_restart)


async def cut_short(
    db: Database,
    url: str,
    operation: Operation,
    until: Callable[[], Awaitable[bool]],
    config: RedfishConfig = BACKEND_CONFIG,
) -> Task:
    """Submit `operation` to a rack of the fake's node-0, and stop the instance running it once `until`."""
    rack = await rack_of(db, url)
    async with executing(db, RedfishBackend(config, env=ENV), lease_ttl=60.0) as first:
        task = await submit(db, rack, operation)
        await eventually(until)
        assert (await row(db, task)).owner_id == first.instance_id
    assert (await row(db, task)).status == TaskStatus.RUNNING.value  # left for a successor
    return task


async def graceful_restart_cut_short(db: Database, bmc: FakeBmc, url: str) -> Task:
    """Submit a graceful reset, and stop the instance that sent it while the OS is still shutting down."""
    bmc.slow_shutdowns, bmc.restart_off_reads = True, 2

    async def sent() -> bool:
        return bmc.posts == [RESET]

    task = await cut_short(db, url, GRACEFUL, sent, PATIENT)
    assert bmc.shutting_down and bmc.system_power == "On"  # nothing shows yet
    return task


async def take_over(db: Database, task: Task, config: RedfishConfig = BACKEND_CONFIG) -> Task:
    async with executing(db, RedfishBackend(config, env=ENV), lease_ttl=60.0):
        done = await finished(db, task)
    assert (await row(db, task)).attempts == 2  # taken over, not run again from the start by its owner
    return done


async def test_a_restart_proved_by_last_reset_time_is_not_sent_again(
    db: Database,
    fake_bmc: tuple[FakeBmc, str],  # noqa: F811
) -> None:
    bmc, url = fake_bmc
    bmc.last_reset_time = "2025-06-01T11:00:00Z"
    task = await reset_cut_short(db, bmc, url)
    bmc.restart_off_reads, bmc.off_reads_left = 0, 0  # back On before the successor reads it
    done = await take_over(db, task)
    assert (done.status, done.message) == (TaskStatus.COMPLETED, "reset 1 component")
    assert bmc.posts == [RESET]  # restarted once
    assert bmc.last_reset_time == "2025-06-01T11:00:00Z+"


async def test_a_restart_still_under_way_is_waited_for_not_sent_again(
    db: Database,
    fake_bmc: tuple[FakeBmc, str],  # noqa: F811
) -> None:
    """No LastResetTime: the Off the successor reads proves the restart; it waits for On."""
    bmc, url = fake_bmc
    task = await reset_cut_short(db, bmc, url)
    bmc.restart_off_reads, bmc.off_reads_left = 0, 5  # Off for the successor's first reads, then On
    done = await take_over(db, task)
    assert (done.status, done.message) == (TaskStatus.COMPLETED, "reset 1 component")
    assert bmc.posts == [RESET] and bmc.system_power == "On"


async def test_without_last_reset_time_a_machine_back_on_is_not_restarted_again_and_the_task_says_so(
    db: Database,
    fake_bmc: tuple[FakeBmc, str],  # noqa: F811
) -> None:
    """Back On, and no LastResetTime: nothing tells whether the recorded restart was carried out. It is
    not sent again: past the proof window from the record it counts done, unverified, as a restart that
    never shows does without a takeover, and the task's message says so."""
    bmc, url = fake_bmc
    task = await reset_cut_short(db, bmc, url)
    bmc.restart_off_reads, bmc.off_reads_left = 2, 0  # a second restart would be seen going Off
    done = await take_over(db, task)
    assert done.status is TaskStatus.COMPLETED
    assert done.message == (
        f"reset 1 component; node-0 (1/1): {url}{ROOT}/Systems/node-0: restart unverified: Reset forced "
        "restart (recorded before a takeover) perhaps sent, but not observed: no Off, PoweringOff or "
        "PoweringOn read in 0.2s, and the BMC keeps no LastResetTime; counted done, not retried"
    )
    assert bmc.posts == [RESET]


@pytest.mark.parametrize("last_reset_time", ["2025-06-01T11:00:00Z", None])
async def test_a_graceful_restart_still_shutting_down_at_takeover_is_waited_for_not_sent_again(
    db: Database,
    fake_bmc: tuple[FakeBmc, str],  # noqa: F811
    last_reset_time: str | None,
) -> None:
    """The OS is still shutting down when the successor reads the machine: On, LastResetTime (where the BMC
    keeps one) as recorded. It watches, sends nothing, and sees the restart once the OS is down."""
    bmc, url = fake_bmc
    bmc.last_reset_time = last_reset_time
    task = await graceful_restart_cut_short(db, bmc, url)
    reads = bmc.system_reads
    async with executing(db, RedfishBackend(PATIENT, env=ENV), lease_ttl=60.0):

        async def watched() -> bool:  # the successor has read it On, as recorded, a few times
            return bmc.system_reads >= reads + 3

        await eventually(watched)
        assert bmc.posts == [RESET]
        bmc.shutdown_done()  # Off for two reads, then On; LastResetTime moves
        done = await finished(db, task)
    assert (done.status, done.message) == (TaskStatus.COMPLETED, "reset 1 component")
    assert bmc.posts == [RESET]  # restarted once
    assert bmc.last_reset_time == (f"{last_reset_time}+" if last_reset_time else None)


async def test_a_recorded_restart_never_seen_fails_after_the_power_timeout_and_is_not_sent_again(
    db: Database,
    fake_bmc: tuple[FakeBmc, str],  # noqa: F811
) -> None:
    """The BMC keeps LastResetTime, and it never moves: the restart was lost (here the BMC ignored it; the
    instance may also have died between its record and its Reset). Sending it now might restart a machine
    that did restart unrecorded: the step fails, as without a takeover, once the power timeout from the
    record has passed."""
    bmc, url = fake_bmc
    bmc.last_reset_time, bmc.ignores_restarts = "2025-06-01T11:00:00Z", True

    async def sent() -> bool:
        return bmc.posts == [RESET]

    task = await cut_short(db, url, GRACEFUL, sent)
    done = await take_over(db, task, replace(BACKEND_CONFIG, power_timeout=2.0))
    assert done.status is TaskStatus.FAILED
    assert done.message == (
        f"power_reset failed on node-0 (1/1): {url}{ROOT}/Systems/node-0: no sign that Reset graceful "
        "restart (recorded before a takeover) restarted it: power read On throughout 2s and its "
        "LastResetTime stayed 2025-06-01T11:00:00Z; not retried: a restart carried out unseen would be "
        "repeated"
    )
    assert bmc.posts == [RESET]


async def test_a_restart_seen_powering_on_after_a_pause_is_not_sent_again(
    db: Database,
    fake_bmc: tuple[FakeBmc, str],  # noqa: F811
) -> None:
    """No LastResetTime; the successor reads Paused, then PoweringOn, then On: the PoweringOn proves the
    restart, though it came after a state that proves nothing."""
    bmc, url = fake_bmc
    task = await graceful_restart_cut_short(db, bmc, url)
    bmc.slow_shutdowns, bmc.shutting_down = False, False  # a restart sent again would show at once
    bmc.power_script = ["Paused", "PoweringOn"]
    done = await take_over(db, task, PATIENT)
    assert (done.status, done.message) == (TaskStatus.COMPLETED, "reset 1 component")
    assert bmc.posts == [RESET]
