"""Alertmanager checks at fleet scale, against a REAL Alertmanager (Debian's `prometheus-alertmanager`), on
both databases: one poll of the checker asks Alertmanager once per distinct query (a check's matchers
filled in with a rack), not once per held task, and every task's results are what asking for it alone
answers: tasks on one rack share the answer, each still not held by rackflow's own alert about itself
(`about_the_task`); an Alertmanager that cannot be asked holds each task of a `fail_closed` check and lets
each through a fail-open one, the reason's URL hidden, as before.

Without the binary these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rackflow.checks import kinds
from rackflow.checks.checker import PreflightChecker
from rackflow.checks.gate import GATE_NAME
from rackflow.checks.service import CheckInput
from rackflow.clock import FakeClock
from rackflow.domain.checks import AlertmanagerSettings, CheckResult
from rackflow.domain.inventory import ComponentsFilter, ComponentSpec, ComponentType, Rack, RackSelection
from rackflow.domain.tasks import Operation, OperationKind, Task
from rackflow.inventory.service import InventoryService
from rackflow.services import Services
from rackflow.store import checks as store
from rackflow.store.db import Database
from rackflow.tasks.manager import TaskManager
from tests.e2e.cluster import free_port
from tests.integration.alertmanager import QUIET_CONFIG, Alertmanager, counting, running_alertmanager
from tests.store.test_checks import _claim
from tests.store.test_executor import CLOCK, REJECT

FIRMWARE = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.0")
MATCHERS = ('rack="{rack.name}"', 'severity=~"critical|warning"')


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    with running_alertmanager(tmp_path, QUIET_CONFIG) as started:
        yield started


async def _racks(db: Database, *names: str) -> list[Rack]:
    """Racks of two compute trays each: two firmware upgrades on one rack, a tray each, do not conflict."""
    inventory = InventoryService(db, CLOCK)
    trays = [ComponentSpec(ComponentType.COMPUTE, f"tray-{i}") for i in range(2)]
    return [await inventory.create_rack(name, components=trays) for name in names]


async def _upgrades(db: Database, *racks: Rack) -> list[Task]:
    """A firmware upgrade of one tray of each of `racks`, the next tray on a rack named twice."""
    trays: dict[uuid.UUID, int] = {}
    upgrades = []
    for rack in racks:
        tray = rack.components[trays.setdefault(rack.id, 0)]
        trays[rack.id] += 1
        scope = RackSelection(rack.id, ComponentsFilter(frozenset({tray.id})))
        [task] = await TaskManager(db, CLOCK).submit(FIRMWARE, [scope], description="", queue=REJECT)
        upgrades.append(task)
    return upgrades


async def _held_for_a_round(db: Database, services: Services, clock: FakeClock, tasks: list[Task]) -> None:
    """Each task held by the pre-flight gate at its first claim, its first round due."""
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, clock.now()) == []
    held = await services.tasks.get_tasks([t.id for t in tasks])
    assert [t.held_by for t in held] == [GATE_NAME] * len(tasks)


async def _one_poll(db: Database, services: Services, clock: FakeClock, count: int) -> None:
    checker = PreflightChecker(db, clock, services.tasks)
    assert await checker.poll() == count
    await checker.settle()


def _shown(results: list[CheckResult]) -> list[tuple[str, bool, str]]:
    return sorted((r.check_name, r.passed, r.reason) for r in results)


async def test_a_poll_asks_once_per_rack_and_each_task_gets_its_own_answer(
    db: Database, alertmanager: Alertmanager
) -> None:
    """Five held tasks on three racks, two on each of rack-a (an alert fires) and rack-b (only rackflow's
    own alert that b1 is held too long, which holds b2 but not b1): three queries, where one per task sent
    five, and each task's result is what Alertmanager answers when asked for that task alone."""
    clock = FakeClock(CLOCK.now())
    services = Services.build(db, clock)
    a, b, c = await _racks(db, "rack-a", "rack-b", "rack-c")
    a1, a2, b1, b2, c1 = await _upgrades(db, a, a, b, b, c)
    alertmanager.post({"alertname": "RackOverheat", "rack": "rack-a", "severity": "critical"})
    alertmanager.post(
        {"alertname": "RackflowTaskHeldTooLong", "task": str(b1.id), "rack": "rack-b", "severity": "warning"}
    )
    alertmanager.post({"alertname": "Chatter", "rack": "rack-c", "severity": "info"})
    with counting(alertmanager.url) as proxy:
        settings = AlertmanagerSettings(proxy.url, MATCHERS, True)
        await services.checks.create(
            CheckInput(name="no-alerts", operations=(OperationKind.UPGRADE_FIRMWARE,), settings=settings)
        )
        tasks = [a1, a2, b1, b2, c1]
        await _held_for_a_round(db, services, clock, tasks)
        await _one_poll(db, services, clock, len(tasks))
        queries = proxy.queries()
        assert len(queries) == 3, queries
        assert len(set(queries)) == 3
        # What each task alone is answered: a look of its own, sharing nothing.
        async with db.read() as conn:
            facts = await store.rack_facts(conn, {a.id, b.id, c.id})
        with ThreadPoolExecutor(1) as pool:
            alone = {
                task.id: await kinds.alertmanager(
                    settings, facts[task.rack_id], kinds.Answers(kinds.Asked(pool)), task_id=task.id
                )
                for task in tasks
            }
    rounds = await services.checks.latest_rounds([t.id for t in tasks])
    assert {t: _shown(found) for t, found in rounds.items()} == {
        t: [("no-alerts", look.passed, f"pre-flight check 'no-alerts': {look.reason}")]
        for t, look in alone.items()
    }
    overheat = 'alertmanager: alert RackOverheat{rack="rack-a",severity="critical"} firing'
    labels = f'rack="rack-b",severity="warning",task={json.dumps(str(b1.id))}'
    held_too_long = f"alertmanager: alert RackflowTaskHeldTooLong{{{labels}}} firing"
    assert [(look.passed, look.reason) for look in alone.values()] == [
        (False, overheat),
        (False, overheat),
        (True, "alertmanager: no matching alert"),
        (False, held_too_long),
        (True, "alertmanager: no matching alert"),
    ]


async def test_an_alertmanager_that_cannot_be_asked_holds_each_task_fail_closed_and_lets_each_go_fail_open(
    db: Database,
) -> None:
    """No Alertmanager listens: every task of the three (two on one rack) gets the `fail_closed` check's
    hold and the fail-open check's pass on no answer, with the token in the URL's query hidden."""
    clock = FakeClock(CLOCK.now())
    services = Services.build(db, clock)
    a, b = await _racks(db, "rack-a", "rack-b")
    tasks = await _upgrades(db, a, a, b)
    url = f"http://127.0.0.1:{free_port()}/?token=t0k3n"
    for name, fail_closed in (("closed", True), ("open", False)):
        await services.checks.create(
            CheckInput(
                name=name,
                operations=(OperationKind.UPGRADE_FIRMWARE,),
                settings=AlertmanagerSettings(url, MATCHERS, fail_closed),
            )
        )
    await _held_for_a_round(db, services, clock, tasks)
    await _one_poll(db, services, clock, len(tasks))
    rounds = await services.checks.latest_rounds([t.id for t in tasks])
    shown = url.replace("t0k3n", "…")
    for task in tasks:
        (closed, closed_passed, closed_reason), (opened, open_passed, open_reason) = _shown(rounds[task.id])
        assert (closed, closed_passed, opened, open_passed) == ("closed", False, "open", True)
        cannot = f"alertmanager: cannot ask {shown}: "
        assert closed_reason.startswith(f"pre-flight check 'closed': {cannot}"), closed_reason
        assert open_reason.startswith(f"pre-flight check 'open': {cannot}"), open_reason
        assert open_reason.endswith("(fail_closed is off)") and "t0k3n" not in closed_reason + open_reason
        held = (await services.tasks.get_tasks([task.id]))[0]
        assert held.held_reason == closed_reason
