"""A reset taken over in the middle, through the executor on both databases and the real sushy path
against the fake BMC of test_redfish_firmware: the machine is restarted once.

The first instance sends the ForceRestart and, while the fake still reads the system Off (mid-restart),
stops (its runs cancelled, its registration gone: a successor takes the task over at once, as after a
crash and the lease). The second repeats the step: the restart its predecessor recorded before sending it
(`task_step_state`) is proved by the LastResetTime that moved, or by the Off it still reads, so it is not
sent again; only a BMC that keeps no LastResetTime and already reads On again leaves it unable to tell.
"""

from __future__ import annotations

import uuid

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
MID_RESTART = 10**9  # reads of the system that say Off after a restart: until the test lets it come back


async def rack_of(db: Database, url: str) -> Rack:
    node = ComponentSpec(ComponentType.COMPUTE, "node-0", bmc=Bmc(url, "Systems/node-0", "env:BMC"))
    return await InventoryService(db, SystemClock()).create_rack(
        f"r-{uuid.uuid4().hex[:8]}", components=[node]
    )


async def reset_cut_short(db: Database, bmc: FakeBmc, url: str) -> Task:
    """Submit a forced reset, let an instance send the restart, and stop that instance mid-restart."""
    bmc.restart_off_reads = MID_RESTART
    rack = await rack_of(db, url)
    async with executing(db, RedfishBackend(BACKEND_CONFIG, env=ENV), lease_ttl=60.0) as first:
        task = await submit(db, rack, Operation(OperationKind.POWER_RESET, forced=True))

        async def mid_restart() -> bool:
            return bmc.posts == [RESET] and bmc.off_reads_left < MID_RESTART  # sent, and read Off since

        await eventually(mid_restart)
        assert (await row(db, task)).owner_id == first.instance_id
    assert (await row(db, task)).status == TaskStatus.RUNNING.value  # left for a successor
    return task


async def take_over(db: Database, task: Task) -> Task:
    async with executing(db, RedfishBackend(BACKEND_CONFIG, env=ENV), lease_ttl=60.0):
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


async def test_without_last_reset_time_a_machine_back_on_may_be_restarted_again_and_the_task_says_so(
    db: Database,
    fake_bmc: tuple[FakeBmc, str],  # noqa: F811
) -> None:
    """Back On, and no LastResetTime: nothing tells whether the recorded restart was carried out. It is
    sent again, and the task's message says the restart may have been repeated."""
    bmc, url = fake_bmc
    task = await reset_cut_short(db, bmc, url)
    bmc.restart_off_reads, bmc.off_reads_left = 2, 0  # the second restart is seen going Off
    done = await take_over(db, task)
    assert done.status is TaskStatus.COMPLETED
    assert done.message == (
        f"reset 1 component; node-0 (1/1): {url}{ROOT}/Systems/node-0: restart may have been repeated: the "
        "run before this task was taken over was about to send it, and the BMC keeps no LastResetTime to "
        "tell whether it did; sent again"
    )
    assert bmc.posts == [RESET, RESET]
