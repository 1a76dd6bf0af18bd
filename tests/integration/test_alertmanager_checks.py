"""The alertmanager pre-flight check against a REAL Alertmanager (Debian's `prometheus-alertmanager`, which
`make tools` installs), started per test on a free loopback port with a temporary config, on both
databases:

* an alert firing for rack A holds A's firmware task, the reason naming the alert, while B's runs;
* the alert resolved (posted again with `endsAt` in the past), A's task starts;
* Alertmanager stopped, a new task on A is held (fail closed), and once the maximum wait is exceeded it
  fails with that reason.

Without the binary these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from rackflow.checks import kinds
from rackflow.checks.service import CheckInput
from rackflow.domain.checks import ANY_ALERT, AlertmanagerSettings, RackFacts
from rackflow.domain.inventory import ComponentSpec, ComponentType, Rack
from rackflow.domain.tasks import Operation, OperationKind, Task, TaskStatus
from rackflow.inventory.service import InventoryService
from rackflow.notify.delivery import Deliverer
from rackflow.notify.holds import HoldWatcher
from rackflow.notify.service import ChannelInput
from rackflow.services import Services
from rackflow.store.db import Database
from tests.checks_support import checking
from tests.integration.alertmanager import QUIET_CONFIG, Alertmanager, running_alertmanager
from tests.store.test_executor import CLOCK, eventually, finished, get, submit

FIRMWARE = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.0")


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    with running_alertmanager(tmp_path, QUIET_CONFIG) as started:
        yield started


async def _rack(db: Database, name: str) -> Rack:
    spec = ComponentSpec(
        ComponentType.COMPUTE, "compute-0", external_id=f"{name}-gpu-0", firmware_version="1"
    )
    return await InventoryService(db, CLOCK).create_rack(name, components=[spec])


async def _held_with(db: Database, task: Task, words: str) -> Task:
    async def held() -> bool:
        found = await get(db, task)
        return found.held_by == "preflight" and words in (found.held_reason or "")

    await eventually(held)
    return await get(db, task)


def _no_alerts(url: str) -> CheckInput:
    """CHECKS.md's check: no critical or warning alert on the rack before a firmware upgrade (fail closed),
    asked every 200 ms."""
    return CheckInput(
        name="no-alerts",
        operations=(OperationKind.UPGRADE_FIRMWARE,),
        settings=AlertmanagerSettings(url, ('rack="{rack.name}"', 'severity=~"critical|warning"'), True),
        interval="200ms",
    )


async def test_an_alert_holds_its_rack_until_resolved_and_a_silent_alertmanager_fails_closed(
    db: Database, alertmanager: Alertmanager
) -> None:
    a, b = await _rack(db, "rack-a"), await _rack(db, "rack-b")
    services = Services.build(db, CLOCK)
    check = await services.checks.create(_no_alerts(alertmanager.url))
    overheat = {"alertname": "RackOverheat", "rack": "rack-a", "severity": "critical"}
    alertmanager.post(overheat)
    alertmanager.post({"alertname": "Chatter", "rack": "rack-b", "severity": "info"})  # matches no matcher
    assert len(alertmanager.active()) == 2
    first_a, first_b = await submit(db, a, FIRMWARE), await submit(db, b, FIRMWARE)
    async with checking(db):
        held = await _held_with(db, first_a, "RackOverheat")
        assert held.held_reason == (
            "pre-flight check 'no-alerts': alertmanager: alert "
            'RackOverheat{rack="rack-a",severity="critical"} firing'
        )
        assert (await finished(db, first_b)).status is TaskStatus.COMPLETED
        assert (await get(db, first_a)).status is TaskStatus.PENDING

        alertmanager.post(overheat, resolved=True)
        assert (await finished(db, first_a)).status is TaskStatus.COMPLETED

        alertmanager.stop()
        second_a = await submit(db, a, FIRMWARE)
        await _held_with(db, second_a, "alertmanager: cannot ask")
        assert (await get(db, second_a)).status is TaskStatus.PENDING
        await services.checks.update(check.id, ["check.max_wait"], CheckInput(max_wait="1s"))
        gave_up = await finished(db, second_a)
    assert gave_up.status is TaskStatus.FAILED
    assert gave_up.message.startswith(
        f"pre-flight check 'no-alerts': alertmanager: cannot ask {alertmanager.url}"
    )
    assert gave_up.message.endswith("(pre-flight check 'no-alerts' gave up after 1s)")


async def test_a_check_asking_for_any_alert_is_held_by_an_alert_about_another_host(
    db: Database, alertmanager: Alertmanager
) -> None:
    """A check of no matcher is refused (it held every task on every alert, by omission); the matcher its
    refusal offers, `alertname=~".+"`, asks for any alert on purpose, and a real Alertmanager answers so."""
    a = await _rack(db, "rack-a")
    services = Services.build(db, CLOCK)
    settings = AlertmanagerSettings(alertmanager.url, (ANY_ALERT,), True)
    await services.checks.create(CheckInput(name="quiet", settings=settings, interval="200ms"))
    alertmanager.post({"alertname": "DiskFull", "instance": "logs-1"})
    task = await submit(db, a, FIRMWARE)
    async with checking(db):
        held = await _held_with(db, task, "DiskFull")
    assert held.status is TaskStatus.PENDING


async def test_rackflows_own_alert_that_the_task_is_held_does_not_keep_holding_it(
    db: Database, alertmanager: Alertmanager
) -> None:
    """CHECKS.md's check and NOTIFICATIONS.md's Alertmanager channel on one Alertmanager: the task held too
    long raises RackflowTaskHeldTooLong, labelled with its rack and `severity=warning`, which the check's
    matchers match. Once the rack's own alert resolves, that alert about the hold must not hold the task
    (it would until the maximum wait failed it: the alert ends only when the hold does)."""
    a = await _rack(db, "rack-a")
    services = Services.build(db, CLOCK)
    await services.checks.create(_no_alerts(alertmanager.url))
    await services.notifications.create(ChannelInput(name="am", kind="alertmanager", url=alertmanager.url))
    overheat = {"alertname": "RackOverheat", "rack": "rack-a", "severity": "critical"}
    alertmanager.post(overheat)
    task = await submit(db, a, FIRMWARE)
    watcher, deliverer = HoldWatcher(db, threshold=timedelta(milliseconds=100)), Deliverer(db)
    async with checking(db):
        await _held_with(db, task, "RackOverheat")
        await asyncio.sleep(0.2)
        await watcher.watch_once()
        await deliverer.deliver_once()
        assert sorted(a["labels"]["alertname"] for a in alertmanager.active()) == [
            "RackOverheat",
            "RackflowTaskHeldTooLong",
        ]

        alertmanager.post(overheat, resolved=True)
        assert (await finished(db, task)).status is TaskStatus.COMPLETED
    await watcher.watch_once()
    await deliverer.deliver_once()
    assert alertmanager.active() == []


async def test_an_alertmanager_behind_a_proxy_asked_with_a_token_in_its_query(
    alertmanager: Alertmanager,
) -> None:
    """A proxy in front of Alertmanager may take a token in the query (`…/am/?token=…`). The path of the
    API was appended to the URL as text, after that query (`?token=t0k3n/api/v2/alerts?…`), so Alertmanager
    answered its UI's page, not JSON, and the check held every task; and the reason quoted the token. The
    query comes before the API's own now, and the reason shows the URL with its values hidden."""
    rack = RackFacts(uuid.uuid4(), "rack-a", "", None, "")
    alertmanager.post({"alertname": "RackOverheat", "rack": "rack-a", "severity": "critical"})
    with ThreadPoolExecutor(1) as pool:
        firing = await kinds.alertmanager(
            AlertmanagerSettings(f"{alertmanager.url}/?token=t0k3n", ('rack="{rack.name}"',), True),
            rack,
            kinds.Answers(kinds.Asked(pool)),
        )
        alertmanager.stop()
        down = await kinds.alertmanager(
            AlertmanagerSettings(f"{alertmanager.url}?token=t0k3n", ('rack="{rack.name}"',), True),
            rack,
            kinds.Answers(kinds.Asked(pool)),
        )
    assert (firing.passed, firing.reason) == (
        False,
        'alertmanager: alert RackOverheat{rack="rack-a",severity="critical"} firing',
    )
    assert not down.passed and "t0k3n" not in down.reason
    assert down.reason.startswith(f"alertmanager: cannot ask {alertmanager.url}?token=…: ")
