"""The dispatcher's loop on both databases: a pipelined drain fires every due schedule once, and stopping
fires what was already claimed instead of dropping it."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from rackflow.domain.firing import Firing
from rackflow.domain.schedules import Schedule
from rackflow.schedules.dispatcher import Claim, Dispatcher
from rackflow.store import dispatch
from rackflow.store.db import Database
from tests.store.schedules_support import START, Env, make_env
from tests.store.test_executor import eventually

BATCH = 4


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def _due_schedules(env: Env, count: int) -> list[Schedule]:
    """`count` hourly schedules, each on a rack of its own, all due (on either database's clock)."""
    made = [await env.schedule(f"s{i:02d}", racks=[await env.rack(f"r{i:02d}")]) for i in range(count)]
    env.clock.advance(timedelta(hours=2))
    return made


def _dispatcher(env: Env) -> Dispatcher:
    return Dispatcher(
        env.services.schedules,
        env.services.audit,
        interval=timedelta(seconds=30),
        batch=BATCH,
    )


async def _runs_by_schedule(env: Env, made: list[Schedule]) -> dict[str, list[str]]:
    return {s.name: [run.state for run in (await env.services.schedules.list_runs(s.id))[0]] for s in made}


async def test_a_pipelined_drain_fires_every_due_schedule_exactly_once(env: Env) -> None:
    made = await _due_schedules(env, 4 * BATCH + 3)
    dispatcher, stop = _dispatcher(env), asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        for _ in range(600):  # up to 30 s
            if len((await env.services.tasks.list_tasks())[0]) == len(made):
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await loop
    tasks, _ = await env.services.tasks.list_tasks()
    assert sorted(str(t.schedule_id) for t in tasks) == sorted(str(s.id) for s in made)  # one task each
    assert await _runs_by_schedule(env, made) == {s.name: ["completed"] for s in made}
    assert dispatcher._in_flight == set()


async def test_stopping_fires_the_batches_already_claimed(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    made = await _due_schedules(env, 2 * BATCH)
    dispatcher, stop = _dispatcher(env), asyncio.Event()
    claim = dispatcher._claim

    async def claim_then_stop() -> Claim:
        claimed = await claim()
        stop.set()  # the operator stops the server right after this claim committed
        return claimed

    monkeypatch.setattr(dispatcher, "_claim", claim_then_stop)
    await asyncio.wait_for(dispatcher.run(stop), 30)
    runs = await _runs_by_schedule(env, made)
    fired = [name for name, states in runs.items() if states]
    assert len(fired) == BATCH  # one batch claimed, then the loop stopped claiming
    assert all(runs[name] == ["completed"] for name in fired)  # and that batch was fired, not dropped
    assert len((await env.services.tasks.list_tasks())[0]) == BATCH


async def test_a_claim_skips_the_schedules_this_process_is_still_firing(env: Env) -> None:
    made = await _due_schedules(env, 3)
    now = START + timedelta(hours=3)
    async with env.db.transaction() as conn:
        claimed = await dispatch.claim_due(env.db, conn, now, batch=10, exclude={made[0].id, made[2].id})
    assert [s.name for s in claimed] == [made[1].name]


async def test_firing_says_whether_a_firing_pass_is_under_way(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pre-flight checker of the same process yields to the pass while `firing()` (issue 26): true from
    the first claim until the last batch is written back, false while the loop sleeps."""
    made = await _due_schedules(env, 2 * BATCH + 1)
    dispatcher, stop = _dispatcher(env), asyncio.Event()
    assert not dispatcher.firing()
    fire = env.services.schedules.fire
    seen: list[bool] = []

    async def fire_and_look(claimed: list[Firing]) -> None:
        seen.append(dispatcher.firing())
        await fire(claimed)

    monkeypatch.setattr(env.services.schedules, "fire", fire_and_look)

    async def not_firing() -> bool:
        return not dispatcher.firing()

    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        for _ in range(600):  # up to 30 s
            runs = await _runs_by_schedule(env, made)
            if all(states == ["completed"] for states in runs.values()):
                break
            await asyncio.sleep(0.05)
        await eventually(not_firing)  # the last batch written back, the last claim (not full) made
    finally:
        stop.set()
        await loop
    assert seen and all(seen)
