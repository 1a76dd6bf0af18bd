"""The hold watcher on both databases (rackflow.notify.holds): a task a freeze holds longer than the
threshold is reported once, however many instances look at once; the end of the hold (the freeze deleted,
the task started) is reported once too, with the labels Alertmanager needs to end that alert; a task that
only waits for its own window is not reported; and an open condition's event outlives retention."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import update

from rackflow.domain.notifications import Event, EventType, Severity
from rackflow.domain.tasks import RETRY_HOLD, RetryPolicy
from rackflow.notify.holds import HoldWatcher
from rackflow.notify.senders import alert
from rackflow.services import Services
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.tables import notification_event, tasks
from tests.store.test_checks import _rack
from tests.store.test_executor import eventually, executing, finished, get, make_rack
from tests.store.test_task_retries import backend as retry_backend
from tests.store.test_task_retries import submit as submit_retried
from tests.store.test_windows_gate import CLOCK, freeze, held, submit

pytestmark = pytest.mark.asyncio

THRESHOLD = timedelta(minutes=30)


async def _events(db: Database) -> list[Event]:
    async with db.read() as conn:
        return list(reversed(await outbox.list_events(conn, 100)))


async def _held_for(db: Database, task_id: object, age: timedelta) -> None:
    """Move the hold's start back by `age`, as time passing would."""
    async with db.transaction() as conn:
        since = CLOCK.now() - age
        await conn.execute(update(tasks).where(tasks.c.id == task_id).values(held_since=since))


def _watcher(db: Database) -> HoldWatcher:
    return HoldWatcher(db, threshold=THRESHOLD)


async def test_a_long_freeze_hold_is_reported_once_and_its_end_once(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    window_id = await freeze(services)
    task = await submit(services, rack.id)
    async with executing(db):
        await held(db, task)
    assert await _watcher(db).watch_once() == (0, 0)  # held, not for long yet
    await _held_for(db, task.id, THRESHOLD + timedelta(minutes=1))

    other = Database(db.url)  # a second instance, looking at the same moment
    try:
        await asyncio.gather(_watcher(db).watch_once(), _watcher(other).watch_once())
        await asyncio.gather(_watcher(db).watch_once(), _watcher(other).watch_once())
        (raised,) = await _events(db)
        assert raised.type is EventType.TASK_HELD_TOO_LONG and raised.severity is Severity.WARNING
        assert (raised.task_id, raised.rack_id, raised.rack_name) == (task.id, rack.id, rack.name)
        assert raised.operation == "power_on" and raised.payload["held_by"] == "freeze"
        assert raised.reason.startswith("waits for freeze 'launch-week' to end at ")
        assert raised.summary == "task held by freeze for more than 30m"

        async with executing(db):
            await services.windows.delete(window_id)
            await finished(db, task)
        await asyncio.gather(_watcher(db).watch_once(), _watcher(other).watch_once())
        assert await _watcher(other).watch_once() == (0, 0)
    finally:
        await other.dispose()
    first, cleared = await _events(db)
    assert first == raised
    assert cleared.type is EventType.TASK_HOLD_CLEARED and cleared.task_id == task.id
    assert cleared.summary.endswith("freeze: the task is no longer waiting (started or ended)")
    raised_alert, cleared_alert = alert(raised, "", now=raised.at), alert(cleared, "", now=cleared.at)
    assert raised_alert["labels"] == cleared_alert["labels"]
    assert raised_alert["labels"]["alertname"] == "RackflowTaskHeldTooLong"
    assert raised_alert["labels"]["task"] == str(task.id)
    assert cleared_alert["endsAt"] == cleared.at.isoformat()
    assert raised_alert["endsAt"] > cleared_alert["endsAt"]


async def test_another_gate_taking_the_hold_over_clears_it_and_is_a_new_hold(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    await freeze(services)
    task = await submit(services, rack.id)
    async with executing(db):
        await held(db, task)
    await _held_for(db, task.id, THRESHOLD * 2)
    assert await _watcher(db).watch_once() == (1, 0)
    async with db.transaction() as conn:  # as the budget gate's hold_back writes it: since now
        values = {"held_by": "budget", "held_since": CLOCK.now(), "held_reason": "waits for budget 'b'"}
        await conn.execute(update(tasks).where(tasks.c.id == task.id).values(values))
    assert await _watcher(db).watch_once() == (0, 1)
    (_, cleared) = await _events(db)
    assert cleared.summary == "task no longer held by freeze: budget holds it now"
    await _held_for(db, task.id, THRESHOLD * 2)
    assert await _watcher(db).watch_once() == (1, 0)
    assert (await _events(db))[-1].payload["held_by"] == "budget"


async def test_a_task_waiting_for_its_own_window_is_not_reported(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    await freeze(services)
    task = await submit(services, rack.id)
    async with executing(db):
        await held(db, task)
    async with db.transaction() as conn:
        values = {"held_by": "window", "held_since": CLOCK.now() - THRESHOLD * 2}
        await conn.execute(update(tasks).where(tasks.c.id == task.id).values(values))
    assert await _watcher(db).watch_once() == (0, 0)
    assert await _events(db) == []


async def test_an_open_condition_outlives_retention_until_it_is_cleared(db: Database) -> None:
    services = Services.build(db, CLOCK)
    rack = await make_rack(db)
    window_id = await freeze(services)
    task = await submit(services, rack.id)
    async with executing(db):
        await held(db, task)
    await _held_for(db, task.id, THRESHOLD * 2)
    await _watcher(db).watch_once()
    async with db.transaction() as conn:  # no channel: fanned out to nobody, nothing pending
        await outbox.fan_out(db, conn, CLOCK.now(), 10)
        old = CLOCK.now() - timedelta(days=30)
        await conn.execute(update(notification_event).values(at=old))

    async def prune() -> int:
        return sum([n async for n in outbox.prune_delivered(db, timedelta(days=7))])

    assert await prune() == 0
    async with executing(db):
        await services.windows.delete(window_id)
        await finished(db, task)
    await _watcher(db).watch_once()
    async with db.transaction() as conn:
        await outbox.fan_out(db, conn, CLOCK.now(), 10)
        await conn.execute(update(notification_event).values(at=CLOCK.now() - timedelta(days=30)))
    assert await prune() == 2


async def test_holds_past_a_batch_are_reported_at_the_next_looks(db: Database) -> None:
    """A look reports at most a batch of the longest holds; the ones it reported stay held and stay the
    longest, so the next look must go past them (it read them again, and reported nothing more, ever)."""
    services = Services.build(db, CLOCK)
    await freeze(services)
    made = [await submit(services, (await _rack(db, f"rk{i}")).id) for i in range(3)]
    async with executing(db):
        for task in made:
            await held(db, task)
    for i, task in enumerate(made):
        await _held_for(db, task.id, THRESHOLD + timedelta(minutes=10 - i))
    watcher = HoldWatcher(db, threshold=THRESHOLD, batch=2)
    assert [await watcher.watch_once() for _ in range(3)] == [(2, 0), (1, 0), (0, 0)]
    reported = [e.task_id for e in await _events(db) if e.type is EventType.TASK_HELD_TOO_LONG]
    assert sorted(map(str, reported)) == sorted(str(task.id) for task in made)


async def test_a_task_waiting_out_its_retry_back_off_is_not_reported(db: Database) -> None:
    """A retry's back-off is a wait its task asked for (up to --retry-max-backoff, 24 h), as a window's is,
    not a gate holding it: it was reported "task held by retry for more than 30m", and paged through
    Alertmanager, for every retried task whose back-off outlasted the threshold."""
    rack = await make_rack(db)
    task = await submit_retried(db, rack, RetryPolicy(2, timedelta(hours=1), 2.0, timedelta(hours=2)))
    async with executing(db, retry_backend(transient_external_ids={"gpu-0": None})):

        async def sent_back() -> bool:
            return (await get(db, task)).held_by == RETRY_HOLD

        await eventually(sent_back)
    await _held_for(db, task.id, THRESHOLD * 2)
    assert await _watcher(db).watch_once() == (0, 0)
    assert await _events(db) == []
