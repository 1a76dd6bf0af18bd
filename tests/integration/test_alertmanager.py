"""rackflow's alerts in a REAL Alertmanager (Debian's prometheus-alertmanager, on loopback, no cluster),
on both databases: a rollout's halt appears in Alertmanager's API with its labels, and resolves when the run
is resumed (the clearing event sends the same labels with `endsAt`); a task a freeze holds too long
appears, and resolves when the freeze is deleted and the task starts. docs/NOTIFICATIONS.md's Alertmanager
configuration passes `amtool check-config`."""

from __future__ import annotations

import asyncio
import re
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from rackflow.config import NOTIFY_SEND_TIMEOUT
from rackflow.domain.notifications import Channel, DeliveryState
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import Schedule
from rackflow.domain.tasks import TaskStatus
from rackflow.notify.delivery import Deliverer
from rackflow.notify.holds import HoldWatcher
from rackflow.notify.senders import Request, post
from rackflow.notify.service import ChannelInput
from rackflow.services import Services
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.tables import notification_delivery, tasks
from tests.debian_tools import AMTOOL, require
from tests.e2e.cluster import free_port
from tests.integration.alertmanager import Alertmanager, running_alertmanager
from tests.store.schedules_support import Env, make_env
from tests.store.test_executor import executing, finished, make_rack
from tests.store.test_rollouts import _active, _end, _racks, _run, _schedule
from tests.store.test_windows_gate import CLOCK, freeze, held, submit

CONFIG = """
route:
  receiver: nobody
receivers:
  - name: nobody
"""
DOC = Path(__file__).parents[2] / "docs" / "NOTIFICATIONS.md"


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    with running_alertmanager(tmp_path_factory.mktemp("alertmanager"), CONFIG) as started:
        yield started


def _rackflow_alerts(alertmanager: Alertmanager, run_id: str) -> list[dict[str, Any]]:
    return [a for a in alertmanager.alerts() if a["labels"].get("run") == run_id]


async def _halted(env: Env, url: str) -> tuple[Channel, Schedule, uuid.UUID]:
    """An Alertmanager channel at `url` for halts, and a rollout over three racks halted by its first
    failure: the channel, the schedule and the halted run's id (its halt recorded, not yet delivered)."""
    channel = await env.services.notifications.create(
        ChannelInput(name="am", kind="alertmanager", url=url, event_types=("run.halted",))
    )
    racks = await _racks(env, 3)
    schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1))
    await env.services.schedules.trigger(schedule.id)
    await _end(env, await _active(env, schedule), TaskStatus.FAILED)
    await env.services.rollouts.advance()
    return channel.channel, schedule, (await _run(env, schedule)).run.id


async def test_a_halt_alerts_in_alertmanager_and_resolves_when_the_run_resumes(
    db: Database, alertmanager: Alertmanager
) -> None:
    env = make_env(db)
    env.clock.advance(datetime.now(UTC) - env.clock.now())  # Alertmanager judges endsAt by its own clock
    _, _, run_id = await _halted(env, alertmanager.url)
    deliverer = Deliverer(db)
    await deliverer.deliver_once()

    (firing,) = await asyncio.to_thread(_rackflow_alerts, alertmanager, str(run_id))
    assert firing["labels"] == {
        "alertname": "RackflowRunHalted",
        "schedule": "fw",
        "severity": "critical",
        "operation": "power_off",
        "run": str(run_id),
    }
    assert firing["status"]["state"] == "active"
    assert firing["annotations"]["description"] == "rollout halted: 1 of 3 racks failed (limit 1)"

    await env.services.rollouts.resume(run_id)
    await deliverer.deliver_once()
    assert [d.state for d in await env.services.notifications.deliveries()] == [DeliveryState.DELIVERED] * 2
    # Alertmanager lists only alerts that have not ended: the clearing's endsAt resolved it.
    assert await asyncio.to_thread(_rackflow_alerts, alertmanager, str(run_id)) == []


async def test_a_halt_sent_after_its_clearing_leaves_the_alert_resolved(
    db: Database, alertmanager: Alertmanager
) -> None:
    """The halt's first send fails (Alertmanager was not reachable); the run is resumed and the clearing
    goes at once, while the halt waits for its back-off. The halt sent late must not fire the alert again
    (with `endsAt` seven days on): Alertmanager keeps what came last, so it is told the condition's state
    now, resolved."""
    env = make_env(db)
    env.clock.advance(datetime.now(UTC) - env.clock.now())
    channel, _, run_id = await _halted(env, f"http://127.0.0.1:{free_port()}")
    deliverer = Deliverer(db)
    await deliverer.deliver_once()
    (halt,) = await env.services.notifications.deliveries()
    assert halt.state is DeliveryState.PENDING and halt.last_error.startswith("unreachable")

    await env.services.notifications.update(channel.id, ["channel.url"], ChannelInput(url=alertmanager.url))
    await env.services.rollouts.resume(run_id)
    await deliverer.deliver_once()  # the clearing; the halt is not due yet
    assert await asyncio.to_thread(_rackflow_alerts, alertmanager, str(run_id)) == []
    env.clock.advance(timedelta(seconds=5))  # the halt's back-off (at most 2 s) has passed
    await deliverer.deliver_once()
    assert [d.state for d in await env.services.notifications.deliveries()] == [DeliveryState.DELIVERED] * 2
    assert await asyncio.to_thread(_rackflow_alerts, alertmanager, str(run_id)) == []


async def test_a_halt_resolves_though_its_schedule_was_renamed_meanwhile(
    db: Database, alertmanager: Alertmanager
) -> None:
    """The clearing took the schedule's name when it was written: renamed between the halt and the resume,
    its labels were not the halt's (`schedule="fw-old"`, not `"fw"`), and RackflowRunHalted{schedule="fw"}
    fired on for seven days. A clearing carries the names of what it clears."""
    env = make_env(db)
    env.clock.advance(datetime.now(UTC) - env.clock.now())
    _, schedule, run_id = await _halted(env, alertmanager.url)
    deliverer = Deliverer(db)
    await deliverer.deliver_once()
    (firing,) = await asyncio.to_thread(_rackflow_alerts, alertmanager, str(run_id))
    assert firing["labels"]["schedule"] == "fw"

    await env.services.schedules.update(schedule.id, ["schedule.name"], name="fw-old")
    await env.services.rollouts.resume(run_id)
    await deliverer.deliver_once()
    assert [d.state for d in await env.services.notifications.deliveries()] == [DeliveryState.DELIVERED] * 2
    assert await asyncio.to_thread(_rackflow_alerts, alertmanager, str(run_id)) == []


async def test_a_long_hold_alerts_and_resolves_when_the_task_starts(
    db: Database, alertmanager: Alertmanager
) -> None:
    services = Services.build(db, CLOCK)
    await services.notifications.create(
        ChannelInput(
            name="am", kind="alertmanager", url=alertmanager.url, event_types=("task.held_too_long",)
        )
    )
    rack = await make_rack(db)
    window_id = await freeze(services)
    task = await submit(services, rack.id)
    async with executing(db):
        await held(db, task)
    async with db.transaction() as conn:  # held for two hours, as time passing would have it
        since = CLOCK.now() - timedelta(hours=2)
        await conn.execute(update(tasks).where(tasks.c.id == task.id).values(held_since=since))
    watcher, deliverer = HoldWatcher(db), Deliverer(db)
    await watcher.watch_once()
    await deliverer.deliver_once()

    def alerts() -> list[dict[str, Any]]:
        return [a for a in alertmanager.alerts() if a["labels"].get("task") == str(task.id)]

    (firing,) = await asyncio.to_thread(alerts)
    assert firing["labels"] == {
        "alertname": "RackflowTaskHeldTooLong",
        "severity": "warning",
        "rack": rack.name,
        "operation": "power_on",
        "task": str(task.id),
    }
    assert firing["status"]["state"] == "active"
    assert firing["annotations"]["description"].startswith("waits for freeze 'launch-week' to end at ")

    async with executing(db):
        await services.windows.delete(window_id)
        await finished(db, task)
    await watcher.watch_once()
    await deliverer.deliver_once()
    assert [d.state for d in await services.notifications.deliveries()] == [DeliveryState.DELIVERED] * 2
    assert await asyncio.to_thread(alerts) == []


RESEND = timedelta(minutes=1)  # the documented default interval of re-sends


def _ends_in(alert: dict[str, Any], now: datetime) -> timedelta:
    return datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00")) - now


async def test_an_open_halt_is_sent_again_and_comes_back_after_alertmanager_restarts(
    db: Database, tmp_path: Path
) -> None:
    """Alertmanager keeps alerts in memory and expects its clients to send the firing ones again: a restart
    (no storage kept) or an HA peer that missed the post lost rackflow's open alert for good, which was sent
    once with `endsAt` seven days on. While the condition is open it is sent again every interval with
    `endsAt` a few intervals on (so a lost clearing, or rackflow gone, lets Alertmanager resolve it); once
    cleared it does not fire again."""
    env = make_env(db)
    env.clock.advance(datetime.now(UTC) - env.clock.now())
    with running_alertmanager(tmp_path, CONFIG) as alertmanager:
        _, _, run = await _halted(env, alertmanager.url)
        run_id = str(run)
        deliverer = Deliverer(db)
        await deliverer.deliver_once()
        (firing,) = await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id)
        assert 2 * RESEND <= _ends_in(firing, env.clock.now()) <= 5 * RESEND

        await asyncio.to_thread(alertmanager.restart)
        assert await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id) == []
        await deliverer.deliver_once()  # not due yet: sent an interval after the last send
        assert await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id) == []
        for _ in range(3):  # each interval, sent again with its end a few intervals on
            env.clock.advance(RESEND + timedelta(seconds=1))
            await deliverer.deliver_once()
            (again,) = await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id)
            assert again["labels"] == firing["labels"] and again["status"]["state"] == "active"
            assert 2 * RESEND <= _ends_in(again, env.clock.now()) <= 5 * RESEND

        # Back to Alertmanager's time: it ignores an end in its future, and the clearing ends the alert now.
        env.clock.advance(datetime.now(UTC) - env.clock.now())
        await env.services.rollouts.resume(run)
        await deliverer.deliver_once()
        assert await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id) == []
        await asyncio.to_thread(alertmanager.restart)
        for _ in range(3):  # cleared: its resolved alert once more, and never firing again
            env.clock.advance(RESEND + timedelta(seconds=1))
            await deliverer.deliver_once()
        assert await asyncio.to_thread(alertmanager.alerts) == []


async def test_a_resend_in_flight_when_the_condition_clears_does_not_leave_the_alert_firing(
    db: Database, alertmanager: Alertmanager
) -> None:
    """One instance's re-send of the open halt is under way (claimed before the resume) when another sends
    the clearing: the re-send reaches Alertmanager last, and Alertmanager keeps what came last, so the alert
    fired on for its `endsAt`, four minutes. The clearing's resolved alert is sent once more, after any send
    claimed before it has had its timeout."""
    env = make_env(db)
    env.clock.advance(datetime.now(UTC) - env.clock.now())
    _, _, run = await _halted(env, alertmanager.url)
    run_id = str(run)
    resend_under_way = asyncio.Event()
    posts: list[Request] = []

    async def slow_resends(request: Request, seconds: float) -> None:
        if "Idempotency-Key" not in request.headers:  # a re-send (`senders.resend_request`), held a while
            resend_under_way.set()
            await asyncio.sleep(1.0)
        posts.append(request)
        await asyncio.to_thread(post, request, seconds)

    resender, other = Deliverer(db, sender=slow_resends), Deliverer(db, sender=slow_resends)
    await other.deliver_once()
    (halt,) = await env.services.notifications.deliveries()
    async with db.transaction() as conn:  # the halt's re-send is due: an interval has passed
        await conn.execute(
            update(notification_delivery)
            .where(notification_delivery.c.id == halt.id)
            .values(next_attempt_at=env.clock.now())
        )
    resending = asyncio.create_task(resender.deliver_once())
    await asyncio.wait_for(resend_under_way.wait(), 10)
    await env.services.rollouts.resume(run)
    await other.deliver_once()  # the clearing, resolved, while the re-send is under way
    await resending
    # What reached Alertmanager last was the firing re-send: the race this guards against happened.
    (firing,) = await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id)
    assert firing["status"]["state"] == "active"

    sent = len(posts)
    env.clock.advance(2 * NOTIFY_SEND_TIMEOUT + timedelta(seconds=1))
    await other.deliver_once()  # the clearing's resolved alert once more
    assert await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id) == []
    assert len(posts) == sent + 1
    for _ in range(2):  # once only
        env.clock.advance(RESEND + timedelta(seconds=1))
        await other.deliver_once()
    assert len(posts) == sent + 1


async def test_a_halt_open_past_the_notification_retention_stays_firing_and_resolves_when_it_clears(
    db: Database, tmp_path: Path
) -> None:
    """A rollout halted for longer than `--notification-retention`: the prune deleted its delivered halt
    while the run stayed halted, so its alert was sent no more, and Alertmanager (which keeps alerts in
    memory, and resolves one by its `endsAt`) lost it though nothing was fixed. Retention keeps an open
    condition's raise: after the prune, an Alertmanager restarted without its storage shows the halt again
    at the next interval, and the resume resolves it."""
    env = make_env(db)
    env.clock.advance(datetime.now(UTC) - env.clock.now())
    retention = timedelta(days=7)
    with running_alertmanager(tmp_path, CONFIG) as alertmanager:
        _, _, run = await _halted(env, alertmanager.url)
        run_id = str(run)
        deliverer = Deliverer(db)
        await deliverer.deliver_once()
        (firing,) = await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id)

        env.clock.advance(retention + timedelta(days=1))  # the halt is now older than the retention
        async for _ in outbox.prune_delivered(db, retention):  # an hourly prune, chunk by chunk
            pass
        # Back to about Alertmanager's time (it judges `endsAt` by its own clock), an interval on.
        env.clock.advance(datetime.now(UTC) + RESEND + timedelta(seconds=1) - env.clock.now())
        await asyncio.to_thread(alertmanager.restart)
        await deliverer.deliver_once()
        (again,) = await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id)
        assert again["labels"] == firing["labels"] and again["status"]["state"] == "active"
        assert 2 * RESEND <= _ends_in(again, env.clock.now()) <= 5 * RESEND

        env.clock.advance(datetime.now(UTC) - env.clock.now())  # the clearing ends the alert now
        await env.services.rollouts.resume(run)
        await deliverer.deliver_once()
        assert await asyncio.to_thread(_rackflow_alerts, alertmanager, run_id) == []


def test_the_docs_alertmanager_configuration_is_valid(tmp_path: Path) -> None:
    (config,) = re.findall(r"```yaml\n(route:.*?)```", DOC.read_text(), flags=re.S)
    (tmp_path / "alertmanager.yml").write_text(config)
    checked = subprocess.run(
        [str(require(AMTOOL, "prometheus-alertmanager")), "check-config", str(tmp_path / "alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
