"""A rollout's caps hold whatever held its rack in between (`rollouts.gate`), on both databases.

A rack its pre-flight checks hold does not count against its rollout's caps, so the rollout starts
another in its place. When the checks release it, it must wait for room: here with max_concurrent_racks
1, racks r00 (checked, held) and r01 (started in its place). Before the cap gate, the pre-flight gate
counted the caps only for the tasks it released at that claim, and three paths went around it (found by
review): a freeze or a budget holding r00 between its release and its start, and the check deleted while
it held r00. Each started r00 beside r01.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta

from rackflow.budgets.service import BudgetInput
from rackflow.checks.checker import PreflightChecker
from rackflow.checks.service import CheckInput
from rackflow.domain.checks import PreflightCheck, WebhookSettings
from rackflow.domain.inventory import RackSelection
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import OperationKind, QueueOptions, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.store.db import Database
from rackflow.store.tasks import set_status
from rackflow.windows.service import Ref, WindowInput
from tests.checks_support import Answer, receiving
from tests.store.schedules_support import POWER_OFF, Env, make_env
from tests.store.test_checks import _claim
from tests.store.test_rollouts import _schedule as rollout_schedule

ONE_AT_A_TIME = RolloutPolicy(max_concurrent_racks=1)


@dataclass
class Rollout:
    """r00 held by its check ("draining"), r01 started in its place; `claim` runs one executor claim."""

    env: Env
    check: PreflightCheck
    checker: PreflightChecker
    held: uuid.UUID
    in_its_place: uuid.UUID
    claim: Callable[[], Awaitable[list[uuid.UUID]]]

    async def look(self) -> None:
        assert await self.checker.poll() == 1
        await self.checker.settle()

    async def assert_one_running(self) -> None:
        statuses = {
            t.id: t.status for t in await self.env.services.tasks.get_tasks([self.held, self.in_its_place])
        }
        assert statuses[self.in_its_place] is TaskStatus.RUNNING
        assert statuses[self.held] is TaskStatus.PENDING, (
            "r00 started beside r01, past max_concurrent_racks 1"
        )


@asynccontextmanager
async def rollout_past_a_held_rack(
    db: Database, *answers: Answer, policy: RolloutPolicy = ONE_AT_A_TIME
) -> AsyncIterator[Rollout]:
    """r00 held by its check, and r01 (in r00's NVLink domain) started in its place under `policy`."""
    env = make_env(db)
    checked, free = await env.rack("r00"), await env.rack("r01")
    await env.services.inventory.create_domain("nvl-0", [checked.id, free.id])
    with receiving(Answer({"ok": False, "reason": "draining"}), *answers) as hook:
        check = await env.services.checks.create(
            CheckInput(
                name="drained",
                racks=(Ref(id=checked.id),),
                settings=WebhookSettings(hook.url, "", "2s"),
                interval="1h",
            )
        )
        schedule = await rollout_schedule(env, [checked, free], policy)
        running: set[uuid.UUID] = set()

        async def claim() -> list[uuid.UUID]:
            async with db.transaction() as conn:
                started = await _claim(db, conn, env.services, env.clock.now(), running)
            running.update(started)
            return started

        checker = PreflightChecker(db, env.clock, env.services.tasks)
        [held] = await env.services.schedules.trigger(schedule.id)
        assert await claim() == []
        assert await checker.poll() == 1
        await checker.settle()  # draining: held, so not counted against the cap
        [in_its_place] = (await env.services.rollouts.advance()).task_ids
        assert await claim() == [in_its_place]
        yield Rollout(env, check, checker, held, in_its_place, claim)


async def test_a_held_rollout_rack_whose_checks_pass_waits_for_room_under_the_caps(db: Database) -> None:
    """The plain case: its checks pass while the rack that took its place runs; it waits, saying why, and
    starts once that one has ended."""
    async with rollout_past_a_held_rack(db, Answer({"ok": True})) as rollout:
        env = rollout.env
        env.clock.advance(timedelta(hours=1, seconds=1))
        await rollout.look()  # r00's checks pass now
        assert await rollout.claim() == [], "the held rack started beside the running one, past the cap of 1"
        [waiting] = await env.services.tasks.get_tasks([rollout.held])
        assert waiting.status is TaskStatus.PENDING and waiting.held_by == "rollout"
        assert "rollout's caps: 1 of its racks active (max 1)" in (waiting.held_reason or "")
        async with db.transaction() as conn:
            await set_status(conn, [rollout.in_its_place], TaskStatus.COMPLETED, now=env.clock.now())
        env.clock.advance(timedelta(seconds=5))
        assert await rollout.claim() == [rollout.held]  # room again: it starts


async def test_a_released_rack_waits_for_room_in_its_domain(db: Database) -> None:
    """The per-domain cap holds it as the rollout's cap does: the gate reads the racks' domains for a
    rollout with a per-domain cap (and only for one: without, a rack of 10,000 needs none). (Read for
    none, each rack counted as a domain of its own, and r00 started beside r01 in their domain.)"""
    async with rollout_past_a_held_rack(
        db, Answer({"ok": True}), policy=RolloutPolicy(max_per_domain=1)
    ) as rollout:
        env = rollout.env
        env.clock.advance(timedelta(hours=1, seconds=1))
        await rollout.look()  # r00's checks pass now
        assert await rollout.claim() == [], (
            "the held rack started beside r01 in its domain, past 1 per domain"
        )
        [waiting] = await env.services.tasks.get_tasks([rollout.held])
        assert waiting.status is TaskStatus.PENDING and waiting.held_by == "rollout"
        assert "1 of its racks active in this rack's domain (max 1 per domain)" in (waiting.held_reason or "")


async def test_a_freeze_between_the_release_and_the_start(db: Database) -> None:
    async with rollout_past_a_held_rack(db, Answer({"ok": True})) as rollout:
        env = rollout.env
        env.clock.advance(timedelta(hours=1, seconds=1))
        await rollout.look()  # passes: released
        now = env.clock.now()
        freeze = OneOff(now - timedelta(seconds=1), now + timedelta(seconds=10))
        await env.services.windows.create(
            WindowInput(name="short", kind=WindowKind.FREEZE, when=freeze, racks=(Ref(name="r00"),))
        )
        assert await rollout.claim() == []  # held by the freeze now
        env.clock.advance(timedelta(seconds=11))
        assert await rollout.claim() == []  # the freeze is over; the rollout is still full
        await rollout.assert_one_running()


async def test_a_budget_between_the_release_and_the_start(db: Database) -> None:
    async with rollout_past_a_held_rack(db, Answer({"ok": True})) as rollout:
        env = rollout.env
        third = await env.rack("zz")
        [manual] = await env.services.tasks.submit(
            POWER_OFF, [RackSelection(third.id, None)], description="manual", queue=QueueOptions()
        )
        assert await rollout.claim() == [manual.id]
        await env.services.budgets.create(BudgetInput("po", (OperationKind.POWER_OFF,), 2))
        env.clock.advance(timedelta(hours=1, seconds=1))
        await rollout.look()  # passes: released
        assert await rollout.claim() == []  # the budget is full (r01 and the manual task): held by it
        async with db.transaction() as conn:
            await set_status(conn, [manual.id], TaskStatus.COMPLETED, now=env.clock.now())
        env.clock.advance(timedelta(seconds=3))
        assert await rollout.claim() == []  # the budget has room; the rollout has none
        await rollout.assert_one_running()


async def test_the_check_deleted_while_it_holds_the_rack(db: Database) -> None:
    async with rollout_past_a_held_rack(db) as rollout:
        await rollout.env.services.checks.delete(rollout.check.id)
        assert await rollout.claim() == []
        await rollout.assert_one_running()
        async with rollout.env.db.transaction() as conn:  # room again: it starts
            await set_status(conn, [rollout.in_its_place], TaskStatus.COMPLETED, now=rollout.env.clock.now())
        rollout.env.clock.advance(timedelta(seconds=3))
        assert await rollout.claim() == [rollout.held]
