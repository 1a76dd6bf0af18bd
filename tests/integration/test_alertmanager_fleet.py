"""Alertmanager checks at fleet scale, against a REAL Alertmanager (Debian's `prometheus-alertmanager`), on
both databases: one poll of the checker asks Alertmanager once per check where the matchers filled in with
a rack are plain `=`/`!=` (`kinds.fleet_query`: applied to the answer here), else once per distinct query
(a check's matchers filled in with a rack), not once per held task; and every task's result is what asking
its own query alone answers: tasks on one rack share the answer, each still not held by rackflow's own
alert about itself (`about_the_task`), racks named apart only by case, a space, a comma or accents
told apart as Alertmanager tells them; a fleet answer too long to read makes each look ask its own query;
an Alertmanager that cannot be asked holds each task of a `fail_closed` check and lets each through a
fail-open one, the reason's URL hidden, as before.

Without the binary these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from rackflow.checks import kinds
from rackflow.checks.checker import PreflightChecker
from rackflow.checks.gate import GATE_NAME
from rackflow.checks.service import CheckInput
from rackflow.clock import FakeClock
from rackflow.domain.checks import AlertmanagerSettings, CheckResult, RackFacts
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


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    """One Alertmanager for the module (a start costs more than most of its tests): each test's alerts
    are kept apart from the others' by their racks' names, or alert names, no other test posts."""
    with running_alertmanager(tmp_path_factory.mktemp("alertmanager"), QUIET_CONFIG) as started:
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


def _alone(url: str, task_id: uuid.UUID) -> str:
    """What a look asking Alertmanager `url` (a task's own query, `kinds.alertmanager_url`) on its own
    finds for task `task_id`, as the look words it."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        alerts = [a for a in json.loads(answer.read()) if not kinds.about_the_task(a, task_id)]
    if not alerts:
        return "alertmanager: no matching alert"
    more = f" and {len(alerts) - 1} more" if len(alerts) > 1 else ""
    return f"alertmanager: alert {kinds.alert_text(alerts[0])} firing{more}"


@pytest.mark.parametrize(
    ("matchers", "queries"),
    [
        # The rack's matcher is a plain `=`: one query for the poll, its answer read here for each rack.
        (('rack="{rack.name}"', 'severity=~"critical|warning"'), 1),
        # And a plain `!=` (a missing label is "", which `!=` matches): still one.
        (('rack="{rack.name}"', 'severity=~"critical|warning"', 'excluded!="{rack.name}"'), 1),
        # A regex filled in with the rack is sent (Python's `re` is not RE2): one query per rack.
        (('rack=~"{rack.name}"', 'severity=~"critical|warning"'), 3),
    ],
)
async def test_a_poll_asks_once_per_check_or_rack_and_each_task_gets_its_own_answer(
    db: Database, alertmanager: Alertmanager, matchers: tuple[str, ...], queries: int
) -> None:
    """Five held tasks on three racks, two on each of rack-a (an alert fires) and rack-b (only rackflow's
    own alert that b1 is held too long, which holds b2 but not b1), one on rack-c (an alert labelled
    `excluded` with its rack, and one no matcher matches): one query for the poll, or one per rack where
    the rack's matcher is a regex, where one per task sent five; and each task's result is what
    Alertmanager answers its own query with, asked for it alone. The racks' names end with the test's
    own suffix: the module's Alertmanager holds the other parameters' alerts too."""
    clock = FakeClock(CLOCK.now())
    services = Services.build(db, clock)
    apart = uuid.uuid4().hex[:8]
    a, b, c = await _racks(db, f"rack-a-{apart}", f"rack-b-{apart}", f"rack-c-{apart}")
    a1, a2, b1, b2, c1 = tasks = await _upgrades(db, a, a, b, b, c)
    alertmanager.post({"alertname": "RackOverheat", "rack": a.name, "severity": "critical"})
    alertmanager.post({"alertname": "Overheat2", "rack": a.name, "severity": "warning"})
    alertmanager.post(
        {"alertname": "RackflowTaskHeldTooLong", "task": str(b1.id), "rack": b.name, "severity": "warning"}
    )
    alertmanager.post({"alertname": "Chatter", "rack": c.name, "severity": "info"})
    alertmanager.post({"alertname": "Drill", "rack": c.name, "severity": "critical", "excluded": c.name})
    with counting(alertmanager.url) as proxy:
        settings = AlertmanagerSettings(proxy.url, matchers, True)
        await services.checks.create(
            CheckInput(name="no-alerts", operations=(OperationKind.UPGRADE_FIRMWARE,), settings=settings)
        )
        await _held_for_a_round(db, services, clock, tasks)
        await _one_poll(db, services, clock, len(tasks))
        sent = proxy.queries()
    assert len(sent) == queries, sent
    async with db.read() as conn:
        facts = await store.rack_facts(conn, {a.id, b.id, c.id})
    alone = {
        t.id: "pre-flight check 'no-alerts': "
        + _alone(kinds.alertmanager_url(replace(settings, url=alertmanager.url), facts[t.rack_id]), t.id)
        for t in tasks
    }
    rounds = await services.checks.latest_rounds([t.id for t in tasks])
    assert {t: _shown(found) for t, found in rounds.items()} == {
        t: [("no-alerts", reason.endswith("no matching alert"), reason)] for t, reason in alone.items()
    }
    excluded = "excluded" in "".join(matchers)
    held = [t for t in tasks if not rounds[t.id][0].passed]
    assert held == ([a1, a2, b2] if excluded else [a1, a2, b2, c1])
    assert "and 1 more" in rounds[a1.id][0].reason and "RackflowTaskHeldTooLong" in rounds[b2.id][0].reason


# Names a rack may have (validation refuses only control characters), and alerts' labels near them.
NAMES = [
    "rack-01",
    "Rack-01",
    "rack-01 ",
    " rack-01",
    "r,1",
    "r=1",
    "r{1}",
    "r}1",
    "é-1",
    "日本",
    "r 1",
    "r'1",
]
ESCAPED = ['r"1', "r\\1"]  # sent as the rack's own query (a value with escapes)


async def test_each_rack_s_answer_from_the_fleet_answer_is_its_own_query_s_answer(
    alertmanager: Alertmanager,
) -> None:
    """Racks whose names differ by case, a space, a comma, braces, accents, or hold a quote: for each, a
    look through a shared fleet answer (`=` on the name, `!=` on the serial) says what Alertmanager answers
    the rack's own query, alerts missing the serial label counted by `!=` as Alertmanager counts them;
    one query for the plain names, and the names with escapes asked on their own."""
    racks = [RackFacts(uuid.uuid4(), name, f"SN-{i}", None, "") for i, name in enumerate(NAMES + ESCAPED)]
    for i, rack in enumerate(racks):
        alertmanager.post({"alertname": "Hot", "rack": rack.name, "severity": "critical"})
        if i % 2:  # the rack's own serial: `serial!=` leaves it out
            alertmanager.post({"alertname": "Own", "rack": rack.name, "serial": rack.external_id})
        if i % 3 == 0:  # another rack's serial: counted
            alertmanager.post({"alertname": "Near", "rack": rack.name, "serial": "SN-x"})
    matchers = ('rack="{rack.name}"', 'serial!="{rack.external_id}"', 'alertname=~"Hot|Own|Near"')
    with counting(alertmanager.url) as proxy, ThreadPoolExecutor(4) as pool:
        settings = AlertmanagerSettings(proxy.url, matchers, True)
        answers = kinds.Answers(kinds.Asked(pool))
        looks = await asyncio.gather(
            *(kinds.alertmanager(settings, rack, answers, task_id=rack.id) for rack in racks)
        )
        sent = proxy.queries()
    own = [_alone(kinds.alertmanager_url(replace(settings, url=alertmanager.url), r), r.id) for r in racks]
    assert [look.reason for look in looks] == own
    # Each rack's Hot, and Near where posted; Own never (`serial!=` its own serial).
    more = ["and 1 more" in look.reason for look in looks]
    assert more == [i % 3 == 0 for i in range(len(racks))] and "Own" not in "".join(own)
    assert len(sent) == 1 + len(ESCAPED), sent


async def test_a_fleet_answer_too_long_asks_each_rack_s_own_query(
    alertmanager: Alertmanager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer for every rack is longer than a look reads (ALERTS_BYTES, made small here) while each
    rack's own is not: each look asks its rack's query, as before, and is answered as before rather than
    held for an answer too long (the module's other tests' alerts only make the fleet answer longer)."""
    apart = uuid.uuid4().hex[:8]
    racks = [RackFacts(uuid.uuid4(), f"rack-{i}-{apart}", "", None, "") for i in range(3)]
    for rack in racks:
        alertmanager.post({"alertname": "RackOverheat", "rack": rack.name, "severity": "critical"})
    one = len(json.dumps(next(a for a in alertmanager.active() if a["labels"].get("rack") == racks[0].name)))
    monkeypatch.setattr(kinds, "ALERTS_BYTES", 2 * one)
    with counting(alertmanager.url) as proxy, ThreadPoolExecutor(2) as pool:
        settings = AlertmanagerSettings(proxy.url, MATCHERS, True)
        answers = kinds.Answers(kinds.Asked(pool))
        looks = await asyncio.gather(*(kinds.alertmanager(settings, rack, answers) for rack in racks))
        sent = proxy.queries()
    assert [look.reason for look in looks] == [
        f'alertmanager: alert RackOverheat{{rack="{rack.name}",severity="critical"}} firing' for rack in racks
    ]
    assert len(sent) == 1 + len(racks), sent


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
