"""A busy Alertmanager, a REAL one (Debian's `prometheus-alertmanager`): it refuses GETs past its
`--web.get-concurrency` with 503, and a check whose rack's matcher is a regex sends one query per rack. The
checker asks each Alertmanager (scheme, host and port) at most ALERTMANAGER_CONCURRENCY GETs at once, shared
by every check and poll that asks it, and asks again within the round when it is refused (503, 429), so a
refusal is neither a `fail_closed` check's needless hold nor a fail-open check's pass unasked.

Without the binary these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rackflow.checks import kinds
from rackflow.checks.service import CheckInput
from rackflow.clock import FakeClock
from rackflow.config import ALERTMANAGER_CONCURRENCY, PREFLIGHT_CONCURRENCY
from rackflow.domain.checks import AlertmanagerSettings, RackFacts
from rackflow.domain.tasks import OperationKind
from rackflow.services import Services
from rackflow.store import checks as store
from rackflow.store.db import Database
from tests.integration.alertmanager import QUIET_CONFIG, Alertmanager, counting, running_alertmanager
from tests.integration.test_alertmanager_fleet import _alone, _held_for_a_round, _one_poll, _racks, _upgrades
from tests.store.test_checks import _claim
from tests.store.test_executor import CLOCK

# Each rack's matcher a regex: one query per rack, as many as the poll has racks.
CLOSED = ('rack=~"{rack.name}"', 'severity=~"critical|warning"')
OPEN = ('rack=~"{rack.name}"', 'severity="info"')
CLAIMED = 10  # tasks a claim takes (`_claim`)


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    """An Alertmanager that answers 2 GETs at once and refuses the rest with 503, one for the module: its
    one test posts the same alerts on each database, which Alertmanager keeps as one."""
    with running_alertmanager(
        tmp_path_factory.mktemp("alertmanager"), QUIET_CONFIG, "--web.get-concurrency=2"
    ) as started:
        yield started


async def test_a_busy_alertmanager_neither_holds_a_task_nor_lets_one_through_unasked(
    db: Database, refusing: Alertmanager
) -> None:
    """100 held tasks on 50 racks, a `fail_closed` check and a fail-open one, each rack's matcher a regex:
    100 queries in one poll against an Alertmanager that answers 2 at once. Asked 16 at once, about 4 in 10
    were refused, so a fail-closed look held its task for no alert ("cannot ask …: HTTP 503") and a
    fail-open one passed unasked. Now every look is answered, as asking its own query alone answers, the
    refused GETs asked again within the round, never more than 8 in flight."""
    clock = FakeClock(CLOCK.now())
    services = Services.build(db, clock)
    racks = await _racks(db, *(f"rack-{i:02d}" for i in range(50)))
    tasks = await _upgrades(db, *racks, *racks)
    for i, rack in enumerate(racks):
        if i % 3 == 0:
            refusing.post({"alertname": "RackOverheat", "rack": rack.name, "severity": "critical"})
        if i % 5 == 0:
            refusing.post({"alertname": "Chatter", "rack": rack.name, "severity": "info"})
    for n in range(300):  # alerts on no rack of the 50: each query costs Alertmanager a little more
        refusing.post({"alertname": "Elsewhere", "rack": f"other-{n}", "severity": "critical"})
    # Alertmanager refuses only the GETs that reach it together, which a quiet machine may never make
    # happen (CI's did not: none refused): the proxy refuses every third as a busy one does, besides.
    with counting(refusing.url, refuse_every=3) as proxy:
        for name, matchers, fail_closed in (("closed", CLOSED, True), ("open", OPEN, False)):
            await services.checks.create(
                CheckInput(
                    name=name,
                    operations=(OperationKind.UPGRADE_FIRMWARE,),
                    settings=AlertmanagerSettings(proxy.url, matchers, fail_closed),
                )
            )
        for _ in range(len(tasks) // CLAIMED - 1):  # a claim takes CLAIMED tasks: the last is checked
            async with db.transaction() as conn:
                assert await _claim(db, conn, services, clock.now()) == []
        await _held_for_a_round(db, services, clock, tasks)
        await _one_poll(db, services, clock, len(tasks))
    rounds = await services.checks.latest_rounds([t.id for t in tasks])
    async with db.read() as conn:
        facts = await store.rack_facts(conn, {r.id for r in racks})
    for task in tasks:
        found = {r.check_name: r.reason for r in rounds[task.id]}
        for name, matchers in (("closed", CLOSED), ("open", OPEN)):
            settings = AlertmanagerSettings(refusing.url, matchers, True)
            alone = _alone(kinds.alertmanager_url(settings, facts[task.rack_id]), task.id)
            assert found[name] == f"pre-flight check '{name}': {alone}", (task.id, found)
    assert proxy.refused > 0  # Alertmanager did refuse GETs: each was asked again
    assert proxy.most_in_flight <= ALERTMANAGER_CONCURRENCY


async def test_at_most_8_gets_are_in_flight_to_one_alertmanager(tmp_path: Path) -> None:
    """Two checks each asking 40 racks' own queries (a regex) of one Alertmanager, through a proxy that
    keeps each GET 0.2 s: 16 were in flight at once (PREFLIGHT_CONCURRENCY), 8 now, shared by both checks
    and by two polls at once; and the same Alertmanager named by another host (`localhost`) counts as
    another, with 8 of its own (16 in flight to the proxy, all the pool's threads)."""
    racks = [RackFacts(uuid.uuid4(), f"rack-{i:02d}", "", None, "") for i in range(40)]
    severities = ('severity="critical"', 'severity="warning"')
    with (
        running_alertmanager(tmp_path, QUIET_CONFIG) as started,
        counting(started.url, hold=0.2) as proxy,
        ThreadPoolExecutor(PREFLIGHT_CONCURRENCY) as pool,
    ):
        asked = kinds.Asked(pool)

        async def poll(url: str) -> list[str]:
            answers = kinds.Answers(asked)
            looks = await asyncio.gather(
                *(
                    kinds.alertmanager(
                        AlertmanagerSettings(url, ('rack=~"{rack.name}"', severity), True), r, answers
                    )
                    for r in racks
                    for severity in severities
                )
            )
            return [look.reason for look in looks]

        one = await asyncio.gather(poll(proxy.url), poll(proxy.url))
        most_for_one, proxy.most_in_flight = proxy.most_in_flight, 0
        two = await asyncio.gather(poll(proxy.url), poll(proxy.url.replace("127.0.0.1", "localhost")))
    assert {reason for reasons in one + two for reason in reasons} == {"alertmanager: no matching alert"}
    assert len(proxy.queries()) == 4 * len(racks) * len(severities)
    assert most_for_one == ALERTMANAGER_CONCURRENCY
    assert proxy.most_in_flight == 2 * ALERTMANAGER_CONCURRENCY == PREFLIGHT_CONCURRENCY
