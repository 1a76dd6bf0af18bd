"""A manual trigger's and a run retry's request id, on both databases: a call again with the id of a run of
the same schedule fires nothing and answers as the first call did; another id, or the id on another
schedule, fires; a run of the id still being fired answers UNAVAILABLE; a refusal records nothing to
remember; the database itself refuses a second run of one (schedule, request id); and on PostgreSQL two
calls at once with one id fire one run."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.schedules import OverlapPolicy
from rackflow.domain.tasks import QueueOptions, TaskStatus
from rackflow.errors import FailedPrecondition, Unavailable
from rackflow.schedules import firing
from rackflow.schedules.service import Triggered
from rackflow.store import runs as run_history
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from tests.store.schedules_support import HOURLY, POWER_OFF, Env, make_env, rack_target

pytestmark = pytest.mark.asyncio


async def _run_ids(env: Env, schedule_id: uuid.UUID) -> list[uuid.UUID]:
    runs, _ = await env.services.schedules.list_runs(schedule_id)
    return [r.id for r in runs]


async def test_the_same_id_fires_once_and_answers_the_same(db: Database) -> None:
    env = make_env(db)
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.schedule("a", racks=[r1, r2])
    other = await env.schedule("b", racks=[await env.rack("r3")])

    first = await env.services.schedules.trigger(schedule.id, request_id="req-1")
    env.clock.advance(timedelta(seconds=1))
    again = await env.services.schedules.trigger(schedule.id, request_id="req-1")

    assert len(first) == 2 and again == first
    assert len(await _run_ids(env, schedule.id)) == 1
    # The same id on another schedule is its own.
    assert len(await env.services.schedules.trigger(other.id, request_id="req-1")) == 1
    # Another id fires (and, its racks busy with the first's tasks, fails each scope): its refusal is
    # answered again, from its run, without a second run.
    for _ in range(2):
        with pytest.raises(FailedPrecondition, match=r"fired but submitted no task, every scope failed"):
            await env.services.schedules.trigger(schedule.id, request_id="req-2")
        assert len(await _run_ids(env, schedule.id)) == 2
    # No id: every call fires.
    for count in (3, 4):
        with pytest.raises(FailedPrecondition):
            await env.services.schedules.trigger(schedule.id)
        assert len(await _run_ids(env, schedule.id)) == count


async def test_a_run_still_being_fired_answers_unavailable_and_fires_nothing(db: Database) -> None:
    env = make_env(db)
    schedule = await env.schedule(racks=[await env.rack("r1")])
    async with db.transaction() as conn:  # phase 1 of a first call, whose phases 2 and 3 are not done
        (loaded,) = await firing.claim(
            db, conn, [schedule], trigger="manual", now=env.clock.now(), request_id="req-1"
        )
    with pytest.raises(Unavailable, match=r"^request_id: the same request \(req-1\) is still being fired"):
        await env.services.schedules.trigger(schedule.id, request_id="req-1")
    assert await _run_ids(env, schedule.id) == [loaded.run_id]


async def test_awaiting_approval_is_answered_again_and_a_refusal_remembers_nothing(db: Database) -> None:
    env = make_env(db)
    schedule = await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(await env.rack("r1")),
        approval=ApprovalPolicy(timedelta(hours=4), 1),
    )
    assert await env.services.schedules.trigger(schedule.id, request_id="req-1") == []
    assert await env.services.schedules.trigger(schedule.id, request_id="req-1") == []
    (waiting,) = await _run_ids(env, schedule.id)
    # Refused (a run awaits approval): nothing recorded, so nothing remembered of "req-2".
    with pytest.raises(FailedPrecondition, match=r"is still awaiting approval"):
        await env.services.schedules.trigger(schedule.id, request_id="req-2")
    assert await _run_ids(env, schedule.id) == [waiting]
    async with db.read() as conn:
        assert await run_history.run_of_request(conn, schedule.id, "req-2") is None


async def test_a_retry_with_the_same_id_answers_its_run(db: Database) -> None:
    env = make_env(db)
    schedule = await env.schedule(racks=[await env.rack("r1")])
    (task_id,) = await env.services.schedules.trigger(schedule.id)
    (first,) = await _run_ids(env, schedule.id)
    async with db.transaction() as conn:
        await task_store.set_status(conn, [task_id], TaskStatus.FAILED, now=env.clock.now())

    retried = await env.services.schedules.retry_run(first, request_id="req-1")
    again = await env.services.schedules.retry_run(first, request_id="req-1")

    assert again.run.id == retried.run.id and again.run.retry_of == first
    assert len(await _run_ids(env, schedule.id)) == 2


async def test_an_id_another_kind_of_call_used_is_refused_and_fires_nothing(db: Database) -> None:
    """A request id names one request: a trigger with a retry's id, a retry with a trigger's, or a retry of
    one run with the id of another run's retry is not that request sent again. Answered as if it were, the
    operator would be told "nothing new fired" with a run that is not what they asked for (their failed
    racks not retried at all); refused, they learn to give it an id of its own."""
    env = make_env(db)
    schedule = await env.schedule(racks=[await env.rack("r1")])
    (task_id,) = await env.services.schedules.trigger(schedule.id, request_id="chg-1")
    (first,) = await _run_ids(env, schedule.id)
    async with db.transaction() as conn:
        await task_store.set_status(conn, [task_id], TaskStatus.FAILED, now=env.clock.now())

    by_trigger = r"^request_id: 'chg-1' was used by a trigger of the schedule "
    with pytest.raises(FailedPrecondition, match=by_trigger):
        await env.services.schedules.retry_run(first, request_id="chg-1")
    assert await _run_ids(env, schedule.id) == [first]

    retried = await env.services.schedules.retry_run(first, request_id="chg-2")
    by_retry = rf"^request_id: 'chg-2' was used by a retry of run {first} "
    with pytest.raises(FailedPrecondition, match=by_retry):
        await env.services.schedules.trigger(schedule.id, request_id="chg-2")
    async with db.transaction() as conn:
        retried_tasks = [o.task_id for o in retried.run.outcomes if o.task_id]
        await task_store.set_status(conn, retried_tasks, TaskStatus.FAILED, now=env.clock.now())
    with pytest.raises(FailedPrecondition, match=by_retry):
        await env.services.schedules.retry_run(retried.run.id, request_id="chg-2")
    assert len(await _run_ids(env, schedule.id)) == 2
    # Each sent again as itself is still answered as before.
    assert (await env.services.schedules.retry_run(first, request_id="chg-2")).run.id == retried.run.id
    assert await env.services.schedules.trigger(schedule.id, request_id="chg-1") == [task_id]


async def test_the_database_refuses_a_second_run_of_one_request_id(db: Database) -> None:
    env = make_env(db)
    schedule = await env.schedule("a", racks=[await env.rack("r1")])
    other = await env.schedule("b", racks=[await env.rack("r2")])

    def run(schedule_id: uuid.UUID, request_id: str | None) -> run_history.NewRun:
        return run_history.NewRun(
            uuid.uuid4(), schedule_id, env.clock.now(), "manual", state="completed", request_id=request_id
        )

    kept = [run(schedule.id, "req-1"), run(other.id, "req-1"), run(schedule.id, None), run(schedule.id, None)]
    async with db.transaction() as conn:
        assert await run_history.insert_runs(db, conn, kept) == {r.run_id for r in kept}
        assert await run_history.insert_runs(db, conn, [run(schedule.id, "req-1")]) == set()


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_two_calls_at_once_with_one_id_fire_one_run(db: Database) -> None:
    env = make_env(db)
    schedule = await env.schedule(racks=[await env.rack("r1"), await env.rack("r2")])

    async def call() -> list[uuid.UUID] | Unavailable:
        try:
            return await env.services.schedules.trigger(schedule.id, request_id="req-1")
        except Unavailable as exc:  # the second found the first's run still being fired
            return exc

    answers = await asyncio.gather(*(call() for _ in range(4)))

    (run,) = (await env.services.schedules.list_runs(schedule.id))[0]
    submitted = [o.task_id for o in run.outcomes]
    assert all(a == submitted or isinstance(a, Unavailable) for a in answers)
    assert submitted in answers
    assert await env.services.schedules.trigger(schedule.id, request_id="req-1") == submitted


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_of_calls_at_once_with_one_id_only_the_one_that_fired_is_not_replayed(db: Database) -> None:
    env = make_env(db)
    schedule = await env.schedule(racks=[await env.rack("r1")])

    async def call() -> Triggered | Unavailable:
        try:
            return await env.services.schedules.trigger_run(schedule.id, request_id="req-1")
        except Unavailable as exc:  # the first's run still being fired
            return exc

    answers = [a for a in await asyncio.gather(*(call() for _ in range(4))) if isinstance(a, Triggered)]

    (run,) = (await env.services.schedules.list_runs(schedule.id))[0]
    assert [a.replayed for a in answers].count(False) == 1
    assert {(a.run_id, a.fired_at) for a in answers} == {(run.id, run.fired_at)}
    again = await env.services.schedules.trigger_run(schedule.id, request_id="req-1")
    assert again.replayed and again.task_ids == [o.task_id for o in run.outcomes]
