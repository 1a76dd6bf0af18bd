"""A schedule's row and its runs' rows are locked in one order, a run's before its schedule's (the design
note atop `rackflow.tasks.executor`), so no two transactions that take both wait for each other and
PostgreSQL never ends one of them as a deadlock (SQLite's single writer runs them one after the other).

A retry of a run, a rollout's halt (which pauses the schedule) and a firing's write-back (whose marks for
the failing-streak look check the schedule's key, `FOR KEY SHARE`) hold a run, then ask for its schedule.
DeleteSchedule and DeleteRack's stamp took the schedule first, then waited for a run: each test here holds
one side at the point where it has what it takes first, runs the other until it is done or waits for a
lock, then lets the first go on. Both must end as they would one after the other, neither answering
UNAVAILABLE ("try again: the database ended this call's wait …"). A firing's submit (a retry's, a
dispatched batch's) holds its schedules' keys until it commits, so DeleteSchedule beside it comes wholly
before or after it; the sweep of abandoned runs locks them in DeleteSchedule's order, by id.

A schedule's row comes before racks' (below): the scope RPCs, DeleteRack's and RemoveComponent's stamps
and a rollout step's pause of a schedule whose run it halts lock it `FOR NO KEY UPDATE`, which the key check
of a failing-streak mark written by one holding racks (a journal round ending a task) does not wait for; a
step pauses before it starts a wave; DeleteRack and RemoveComponent try again rather than lock a schedule
once they hold the rack.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select

from rackflow.domain.inventory import ComponentsFilter, ComponentTarget, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import TaskStatus
from rackflow.errors import NotFound
from rackflow.ids import new_id
from rackflow.schedules import firing
from rackflow.schedules.service import PAUSE_AFTER_FAILED_RUNS_PATH
from rackflow.store import dispatch, scope_removals, streak_checks
from rackflow.store import inventory as inventory_store
from rackflow.store import rollouts as run_store
from rackflow.store import runs as run_history
from rackflow.store import schedules as schedule_store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule, task_schedule_run, tasks
from rackflow.store.tasks import set_status
from tests.conftest import schedule_row
from tests.store.lock_waits import backend_pid, waiting_for
from tests.store.schedules_support import Env, make_env, rack_target
from tests.store.test_approvals import caller
from tests.store.test_rollout_halt_gate import HALTING
from tests.store.test_rollout_lock_order import done_or_waiting_on_a_lock
from tests.store.test_rollouts import _run as rollout_run
from tests.store.test_rollouts import _schedule as rollout_schedule

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 1, tzinfo=UTC)


class PausedAfter:
    """The first call of `module.name` for which `when(*args, **kwargs)` holds pauses once it returned,
    its transaction open, until `go` is set."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        module: object,
        name: str,
        when: Callable[..., bool] = lambda *args, **kwargs: True,
    ) -> None:
        self.paused = asyncio.Event()
        self.go = asyncio.Event()
        self.args: tuple[Any, ...] = ()  # the paused call's (a store function's first is its connection)
        original = getattr(module, name)

        async def pausing(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            if not self.paused.is_set() and when(*args, **kwargs):
                self.args = args
                self.paused.set()
                await self.go.wait()
            return result

        monkeypatch.setattr(module, name, pausing)

    async def reached(self) -> None:
        async with asyncio.timeout(60):
            await self.paused.wait()


class PausedBefore:
    """The first call of `module.name` made while `within` is set pauses before it runs, until `go` is
    set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
        self.within = False
        self.paused = asyncio.Event()
        self.go = asyncio.Event()
        original = getattr(module, name)

        async def pausing(*args: Any, **kwargs: Any) -> Any:
            if self.within and not self.paused.is_set():
                self.paused.set()
                await self.go.wait()
            return await original(*args, **kwargs)

        monkeypatch.setattr(module, name, pausing)


async def failed_run(env: Env, rack_names: list[str]) -> tuple[Any, Any, list[Any]]:
    """A plain schedule on these racks, fired once, its tasks failed: its run is over and may be retried."""
    racks = [await env.rack(name) for name in rack_names]
    schedule = await env.schedule("on " + " ".join(rack_names), racks=racks)
    task_ids = await env.services.schedules.trigger(schedule.id)
    async with env.db.transaction() as conn:
        await set_status(conn, task_ids, TaskStatus.FAILED, now=env.clock.now())
    runs, _ = await env.services.schedules.list_runs(schedule.id, limit=1)
    assert runs[0].state == "completed"
    return schedule, runs[0], racks


async def schedule_exists(env: Env, schedule_id: Any) -> bool:
    async with env.db.read() as conn:
        return bool(await conn.scalar(select(task_schedule.c.id).where(task_schedule.c.id == schedule_id)))


async def tasks_on(env: Env, racks: list[Any]) -> set[Any]:
    async with env.db.read() as conn:
        stmt = select(tasks.c.id).where(tasks.c.rack_id.in_([r.id for r in racks]))
        return set((await conn.execute(stmt)).scalars())


async def tasks_of_runs(env: Env, run_ids: list[Any]) -> set[Any]:
    async with env.db.read() as conn:
        return set((await conn.execute(select(tasks.c.id).where(tasks.c.run_id.in_(run_ids)))).scalars())


async def runs_of(env: Env, schedule_id: Any) -> list[Any]:
    async with env.db.read() as conn:
        stmt = select(task_schedule_run.c.id).where(task_schedule_run.c.schedule_id == schedule_id)
        return list((await conn.execute(stmt)).scalars())


async def test_delete_schedule_beside_a_retry_holding_its_run(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry holds the run it retries, then asks for the schedule; DeleteSchedule, started meanwhile,
    waits for that run before it takes the schedule, and deletes the schedule once the retry committed,
    with the run the retry fired (it tries again: that run was not there when it locked the runs)."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, run, [r0] = await failed_run(env, ["r0"])
        pause = PausedAfter(monkeypatch, run_store, "get_run", lambda *a, **kw: kw.get("lock", False))
        schedules = env.services.schedules
        deletion: asyncio.Future[None] | None = None
        fire = schedules.fire

        async def fire_once_deleted(claimed: Any, **kwargs: Any) -> Any:
            assert deletion is not None
            await asyncio.wait([deletion], timeout=60)  # its phases 2 and 3 after the deletion, always
            return await fire(claimed, **kwargs)

        monkeypatch.setattr(schedules, "fire", fire_once_deleted)
        retry = asyncio.ensure_future(schedules.retry_run(run.id))
        await pause.reached()  # the retry holds the run
        deletion = asyncio.ensure_future(schedules.delete(schedule.id))
        await done_or_waiting_on_a_lock(env, deletion)
        assert not deletion.done()
        pause.go.set()  # the retry asks for the schedule

        await asyncio.wait_for(deletion, 60)
        with pytest.raises(NotFound):  # its new run went with the schedule
            await asyncio.wait_for(retry, 60)
        assert not await schedule_exists(env, schedule.id)
        assert await runs_of(env, schedule.id) == []
        assert await tasks_of_runs(env, [run.id]) == await tasks_on(env, [r0])  # it submitted nothing
    finally:
        await db.dispose()


def deleting_holds_the_schedule(monkeypatch: pytest.MonkeyPatch, db: Database) -> PausedAfter:
    """DeleteSchedule paused once it holds the schedule's row (`FOR UPDATE`), its runs' before it."""
    return PausedAfter(
        monkeypatch, schedule_store, "get_schedule", lambda *a, **kw: kw.get("lock") == db.for_update
    )


async def test_a_retry_s_submit_beside_delete_schedule_holding_the_schedule(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry's claim committed its new run; DeleteSchedule then holds every run of the schedule, the new
    one with them, and the schedule, and the retry's submit, beside it, waits for the schedule (`FOR KEY
    SHARE`), then finds it gone: the retry answers NotFound having submitted nothing. Before the retry's
    submit held the schedule, it submitted r0's task while the deletion was under way: the retry answered
    NotFound for a run whose rack was being acted on."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, run, [r0] = await failed_run(env, ["r0"])
        schedules = env.services.schedules
        claimed, submit = asyncio.Event(), asyncio.Event()
        fire = schedules.fire

        async def fire_when_told(firings: Any, **kwargs: Any) -> Any:
            claimed.set()
            await submit.wait()
            return await fire(firings, **kwargs)

        monkeypatch.setattr(schedules, "fire", fire_when_told)
        retry = asyncio.ensure_future(schedules.retry_run(run.id))
        async with asyncio.timeout(60):
            await claimed.wait()  # its new run committed
        locked = deleting_holds_the_schedule(monkeypatch, db)
        deletion = asyncio.ensure_future(schedules.delete(schedule.id))
        await locked.reached()  # DeleteSchedule holds the runs, the retry's among them, and the schedule
        submit.set()
        await waiting_for(db, locked.args[0], retry)  # fails if it submits without waiting
        locked.go.set()

        await asyncio.wait_for(deletion, 60)
        with pytest.raises(NotFound) as gone:
            await asyncio.wait_for(retry, 60)
        assert await tasks_of_runs(env, [run.id]) == await tasks_on(env, [r0])  # its first task alone
        assert gone.match(r"was deleted, with run .* nothing was submitted")
        assert not await schedule_exists(env, schedule.id)
    finally:
        await db.dispose()


async def test_a_dispatched_batch_s_submit_beside_delete_schedule_of_one_of_its_firings(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dispatched batch of two firings claimed; DeleteSchedule of one's schedule holds it (and its runs),
    and the batch's submit, beside it, waits for the schedule, then finds it gone: that firing submits
    nothing, and the other fires. Before, the submit held nothing of the firings and submitted the deleted
    schedule's task beside its deletion, and it ran."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r0, r1 = await env.rack("r0"), await env.rack("r1")
        kept, gone = await env.schedule("on r0", racks=[r0]), await env.schedule("on r1", racks=[r1])
        async with db.transaction() as conn:
            locked_rows = [
                await schedule_store.get_schedule(conn, s.id, lock=db.for_update) for s in (kept, gone)
            ]
            claimed = await firing.claim(
                db, conn, [s for s in locked_rows if s is not None], trigger="dispatch", now=env.clock.now()
            )
        locked = deleting_holds_the_schedule(monkeypatch, db)
        deletion = asyncio.ensure_future(env.services.schedules.delete(gone.id))
        await locked.reached()
        fired = asyncio.ensure_future(firing.fire(db, env.services.tasks, env.clock, claimed))
        await waiting_for(db, locked.args[0], fired)  # fails if it ends without waiting
        locked.go.set()

        await asyncio.wait_for(deletion, 60)
        kept_result, gone_result = await asyncio.wait_for(fired, 60)
        assert await tasks_on(env, [r0, r1]) == set(kept_result.task_ids)  # none on r1
        assert [o.outcome for o in kept_result.outcomes] == ["submitted"]
        assert (kept_result.deleted, gone_result.deleted) == (False, True)
        assert not await schedule_exists(env, gone.id)
    finally:
        await db.dispose()


async def test_delete_schedule_beside_a_retry_s_submit(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The retry's submit holds the schedule's key from before it submits (r0's task inserted, not
    committed); DeleteSchedule, beside it, holds the schedule's runs, waits for the schedule, and deletes it
    once the submit committed. The retry came first: it answers with its run, naming its task, which goes on
    as every task of a deleted schedule does. Before, DeleteSchedule did not wait: it committed under the
    submit, which then committed r0's task for a retry that answered NotFound."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, run, [r0] = await failed_run(env, ["r0"])
        schedules = env.services.schedules
        submitting = PausedAfter(monkeypatch, schedules.tasks, "submit_each_in")
        retry = asyncio.ensure_future(schedules.retry_run(run.id))
        await submitting.reached()
        deletion = asyncio.ensure_future(schedules.delete(schedule.id))
        await waiting_for(db, submitting.args[0], deletion)  # fails if it deletes without waiting
        submitting.go.set()

        report = await asyncio.wait_for(retry, 60)
        await asyncio.wait_for(deletion, 60)
        assert not await schedule_exists(env, schedule.id)
        assert report.run.retry_of == run.id
        [task_id] = [o.task_id for o in report.run.outcomes]
        assert report.task_statuses == {task_id: TaskStatus.PENDING}
        assert task_id in await tasks_on(env, [r0])
    finally:
        await db.dispose()


async def test_delete_schedule_beside_a_write_back_holding_its_run(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write-back of a schedule that pauses after failures completes its run, then marks the
    schedule for the streak's look (its insert checks the schedule's key: `FOR KEY SHARE`); DeleteSchedule,
    started between the two, waits for the run before it takes the schedule."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        racks = [await env.rack("r0")]
        schedule = await env.schedule("on r0", racks=racks)
        schedules = env.services.schedules
        await schedules.update(schedule.id, [PAUSE_AFTER_FAILED_RUNS_PATH], pause_after_failed_runs=2)
        pause = PausedBefore(monkeypatch, run_history, "mark_schedules")
        complete_runs = run_history.complete_runs

        async def writing_back(*args: Any, **kwargs: Any) -> set[uuid.UUID]:
            pause.within = True
            return await complete_runs(*args, **kwargs)

        monkeypatch.setattr(run_history, "complete_runs", writing_back)
        trigger = asyncio.ensure_future(schedules.trigger(schedule.id))
        async with asyncio.timeout(60):
            await pause.paused.wait()  # the write-back holds its run, before it marks the schedule
        deletion = asyncio.ensure_future(schedules.delete(schedule.id))
        await done_or_waiting_on_a_lock(env, deletion)
        assert not deletion.done()
        pause.go.set()

        [task_id] = await asyncio.wait_for(trigger, 60)
        await asyncio.wait_for(deletion, 60)
        assert not await schedule_exists(env, schedule.id)
        assert task_id  # the firing ended as it would have alone: its task submitted, its run written back
    finally:
        await db.dispose()


async def test_delete_schedule_beside_a_write_back_writing_its_scopes(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write-back writes each scope's last task (locking the scope rows) after its runs and their
    schedules, as DeleteSchedule's cascade deletes the scope rows after it locked the runs and the
    schedule. Written first, DeleteSchedule could take the run and the schedule while the write-back held
    a scope row, and wait for it there while the write-back waited for the run."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        racks = [await env.rack("r0")]
        schedule = await env.schedule("on r0", racks=racks)
        schedules = env.services.schedules
        pause = PausedAfter(monkeypatch, schedule_store, "set_last_task_ids")
        trigger = asyncio.ensure_future(schedules.trigger(schedule.id))
        await pause.reached()  # the write-back holds the scope row of its task
        deletion = asyncio.ensure_future(schedules.delete(schedule.id))
        await done_or_waiting_on_a_lock(env, deletion)
        assert not deletion.done()
        pause.go.set()

        [task_id] = await asyncio.wait_for(trigger, 60)
        await asyncio.wait_for(deletion, 60)
        assert not await schedule_exists(env, schedule.id)
        assert task_id
    finally:
        await db.dispose()


async def test_a_scope_update_beside_a_rollout_step_starting_a_wave(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollout's step starts r02 and r03 (their scopes' last tasks written) and saves its run, whose
    failing-streak mark checks the schedule's key; the scope update that takes r03 out locks the schedule,
    then r03's scope row. The step writes the scope rows after its run and the schedule's mark, so the
    update waits for the step to commit: written before, the update would have held the schedule while it
    waited for r03's scope row, and the step that held it would have waited for the schedule."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        racks = [await env.rack(f"r{i:02d}") for i in range(4)]
        schedule = await rollout_schedule(env, racks, RolloutPolicy(max_concurrent_racks=2))
        schedules = env.services.schedules
        await schedules.update(schedule.id, [PAUSE_AFTER_FAILED_RUNS_PATH], pause_after_failed_runs=2)
        first_wave = await schedules.trigger(schedule.id)
        async with env.db.transaction() as conn:
            await set_status(conn, first_wave, TaskStatus.COMPLETED, now=env.clock.now())
        pause = PausedAfter(monkeypatch, schedule_store, "set_last_task_ids")
        step = asyncio.ensure_future(env.services.rollouts.advance())
        await pause.reached()  # the step started r02 and r03
        with caller("oncall"):
            update = asyncio.ensure_future(schedules.update_scope(schedule.id, rack_target(*racks[:3])))
        await done_or_waiting_on_a_lock(env, update)
        assert not update.done()
        pause.go.set()

        assert len((await asyncio.wait_for(step, 60)).task_ids) == 2
        scopes, changes = await asyncio.wait_for(update, 60)
        assert len(changes.to_remove) == 1
        assert sorted(sc.rack_id for sc in scopes) == sorted(r.id for r in racks[:3])
    finally:
        await db.dispose()


def _first_stamp(*args: Any, **kwargs: Any) -> bool:
    return True


async def _delete_rack_paused_after_its_stamp(
    env: Env, monkeypatch: pytest.MonkeyPatch, rack_id: Any, beside: Callable[[], Awaitable[Any]]
) -> tuple[asyncio.Future[None], asyncio.Future[Any]]:
    """DeleteRack paused once its stamp locked the rack's schedules; `beside` run until it is done or
    waits for a lock; then DeleteRack goes on. Both futures, to be awaited."""
    pause = PausedAfter(monkeypatch, scope_removals, "stamp_racks", _first_stamp)
    deletion = asyncio.ensure_future(env.services.inventory.delete_rack(rack_id))
    await pause.reached()
    other = asyncio.ensure_future(beside())
    await done_or_waiting_on_a_lock(env, other)
    pause.go.set()
    return deletion, other


async def test_delete_rack_beside_a_rollout_s_halt(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """r00's task failed: the next step halts the rollout and pauses its schedule. DeleteRack of r00 holds
    the run of r00's task and the schedule its stamp locks; the step, beside it, leaves that run for a
    later step (it takes a run only when free) instead of holding the run while it waits for the
    schedule, which DeleteRack's wait for the run would have made a deadlock that PostgreSQL ended by
    failing the step."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        racks = [await env.rack(f"r{i:02d}") for i in range(4)]
        schedule = await rollout_schedule(env, racks, HALTING)
        first_wave = await env.services.schedules.trigger(schedule.id)
        [on_r00] = [t for t in await env.services.tasks.get_tasks(first_wave) if t.rack_id == racks[0].id]
        async with env.db.transaction() as conn:
            await set_status(conn, [on_r00.id], TaskStatus.FAILED, now=env.clock.now())

        deletion, step = await _delete_rack_paused_after_its_stamp(
            env, monkeypatch, racks[0].id, env.services.rollouts.advance
        )
        await asyncio.wait_for(deletion, 60)
        await asyncio.wait_for(step, 60)
        await env.services.rollouts.advance()  # the run, free again, halts

        assert (await rollout_run(env, schedule)).run.state == "halted"
        assert not (await env.services.schedules.get(schedule.id)).enabled
        with pytest.raises(NotFound):
            await env.services.inventory.get_rack(racks[0].id)
    finally:
        await db.dispose()


async def test_delete_rack_beside_a_retry_of_its_task_s_run(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteRack of r0 holds the run of r0's task and the schedule its stamp locks; the retry of that run,
    beside it, waits for the run, and once DeleteRack committed retries the rack left (r1). Before, the
    retry took the run and waited for the schedule, DeleteRack then waited for the run, and PostgreSQL
    ended the retry as a deadlock: UNAVAILABLE."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        _, run, racks = await failed_run(env, ["r0", "r1"])

        deletion, retry = await _delete_rack_paused_after_its_stamp(
            env, monkeypatch, racks[0].id, lambda: env.services.schedules.retry_run(run.id)
        )
        await asyncio.wait_for(deletion, 60)
        report = await asyncio.wait_for(retry, 60)

        assert report.run.retry_of == run.id
        assert [o.rack_id for o in report.run.outcomes] == [racks[1].id]
        with pytest.raises(NotFound):
            await env.services.inventory.get_rack(racks[0].id)
    finally:
        await db.dispose()


async def test_a_prune_leaves_a_run_another_transaction_holds(pg_db: str) -> None:
    """A firing's cap prunes its schedule's oldest runs while it holds the schedule's row: it deletes
    those free now and leaves one another transaction holds (a retry of it, a DeleteSchedule, which then
    wait for the schedule) to a later look, instead of waiting for it."""
    db = Database(pg_db)
    try:
        schedule_id = uuid.uuid4()
        runs = [uuid.uuid4() for _ in range(5)]  # oldest first
        async with db.transaction() as conn:
            await conn.execute(insert(task_schedule), [schedule_row(schedule_id, "s", T0)])
            await conn.execute(
                insert(task_schedule_run),
                [
                    {
                        "id": run_id,
                        "schedule_id": schedule_id,
                        "fired_at": T0 + timedelta(minutes=k),
                        "scheduled_for": T0 + timedelta(minutes=k),
                        "trigger": "dispatch",
                        "state": "completed",
                        "outcomes": [],
                    }
                    for k, run_id in enumerate(runs)
                ],
            )
        async with db.engine.connect() as other:
            await other.begin()
            held = select(task_schedule_run.c.id).where(task_schedule_run.c.id == runs[1])
            await other.execute(held.with_for_update())

            async def prune() -> dict[uuid.UUID, run_history.Pruned]:
                async with db.transaction() as conn:
                    return await run_history.prune_runs(conn, [schedule_id], keep=2)

            pruning = asyncio.ensure_future(prune())
            await done_or_waiting_on_a_lock(make_env(db), pruning)
            assert pruning.done()  # it did not wait for the run held
            await other.rollback()
        pruned = await pruning
        assert pruned[schedule_id].deleted == 2
        assert sorted(await runs_of(make_env(db), schedule_id)) == sorted([runs[1], runs[3], runs[4]])
    finally:
        await db.dispose()


async def test_the_sweep_beside_delete_schedule_of_two_abandoned_runs(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs of a schedule left "running" by a dead instance, the higher id first in the table (the
    order the sweep's UPDATE finds them in). DeleteSchedule locks the schedule's runs in id order: it holds
    the lower and waits for the higher, whose key a reader holds (`FOR KEY SHARE`, which an UPDATE of its
    state does not wait for). The sweep, beside it, locks its runs in id order too: it waits for the lower
    holding nothing, and finds both gone once the deletion committed. In its UPDATE's order it marked the
    higher, then waited for the lower: once the reader let go, DeleteSchedule waited for the sweep, and
    PostgreSQL ended one of the two as a deadlock."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule = await env.schedule("abandoned", racks=[await env.rack("r0")])
        low, high = sorted([new_id(), new_id()])
        gone = uuid.uuid4()  # their instance, one: its index on the running runs' owners keeps table order
        async with db.transaction() as conn:
            for run_id in (high, low):  # a statement each: the higher first in the table
                await conn.execute(insert(task_schedule_run).values(**_running(run_id, schedule.id, gone)))
        deleting: list[int] = []  # DeleteSchedule's backend, asked before it waits
        runs_of_schedule = run_history.runs_of_schedule

        async def locking(conn: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("lock"):
                deleting.append(await backend_pid(conn))
            return await runs_of_schedule(conn, *args, **kwargs)

        async def sweep() -> int:
            async with db.transaction() as conn:
                return await dispatch.mark_abandoned_runs(conn, await db.now(conn), timedelta(seconds=15))

        monkeypatch.setattr(run_history, "runs_of_schedule", locking)
        async with db.engine.connect() as reader:
            await reader.begin()
            held = select(task_schedule_run.c.id).where(task_schedule_run.c.id == high)
            await reader.execute(held.with_for_update(read=True, key_share=True))
            deletion = asyncio.ensure_future(env.services.schedules.delete(schedule.id))
            await waiting_for(db, reader, deletion)  # it holds the lower run, and waits for the higher
            sweeping = asyncio.ensure_future(sweep())
            await waiting_for(db, deleting[0], sweeping)
            await reader.rollback()

        await asyncio.wait_for(deletion, 60)
        assert await asyncio.wait_for(sweeping, 60) == 0  # both went with their schedule
        assert not await schedule_exists(env, schedule.id)
    finally:
        await db.dispose()


def _running(run_id: uuid.UUID, schedule_id: uuid.UUID, owner_id: uuid.UUID) -> dict[str, Any]:
    """A manual run left "running" by `owner_id`, an instance that is gone."""
    return {
        "id": run_id,
        "schedule_id": schedule_id,
        "fired_at": T0,
        "trigger": "manual",
        "state": "running",
        "outcomes": [],
        "owner_id": owner_id,
    }


# --- a schedule's row and racks' ---------------------------------------------------------------------


async def _round_ending_a_task_beside(
    env: Env, rack: Any, schedule: Any, other: Callable[[], Awaitable[Any]]
) -> asyncio.Future[Any]:
    """A journal round's locks, as it ends a task of `schedule` on `rack`: the rack (`lock_racks`, `FOR NO
    KEY UPDATE`), then the streak's mark, whose insert checks the schedule's key (`FOR KEY SHARE`).
    `other` starts once the round holds the rack, and runs until it waits for a lock (the rack); the mark
    must then be written without waiting for `other`, which goes on once the round committed. `other`'s
    future, to be awaited."""
    async with env.db.engine.connect() as round_:
        await round_.begin()
        await task_store.lock_racks(env.db, round_, [rack.id])
        beside = asyncio.ensure_future(other())
        await done_or_waiting_on_a_lock(env, beside)
        assert not beside.done()  # it holds the schedule and waits for the rack
        await asyncio.wait_for(streak_checks.mark_schedules(round_, [schedule.id]), 60)
        assert not beside.done()  # still waiting for the rack: not ended as a deadlock
        await round_.commit()
    return beside


async def _pausing_after_failures(env: Env, rack_names: list[str]) -> tuple[Any, list[Any]]:
    racks = [await env.rack(name) for name in rack_names]
    schedule = await env.schedule("on " + " ".join(rack_names), racks=racks)
    await env.services.schedules.update(
        schedule.id, [PAUSE_AFTER_FAILED_RUNS_PATH], pause_after_failed_runs=2
    )
    return schedule, racks


async def test_a_streak_mark_beside_a_scope_update_naming_components(pg_db: str) -> None:
    """The scope update locks its schedule, then the racks its component filters name; a journal round
    ending a task of that schedule holds such a rack, then marks the schedule for its failing streak's
    look. The update keeps the schedule's key (`FOR NO KEY UPDATE`), which the mark's key check does not
    wait for: the round commits, then the update goes on. Under `FOR UPDATE` each waited for the other, and
    PostgreSQL ended the update as a deadlock: UNAVAILABLE."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, [r0] = await _pausing_after_failures(env, ["r0"])
        compute = r0.components[0]
        desired = TargetSpec(components=(ComponentTarget(id=compute.id),))

        with caller("oncall"):
            update = await _round_ending_a_task_beside(
                env, r0, schedule, lambda: env.services.schedules.update_scope(schedule.id, desired)
            )
        scopes, _ = await asyncio.wait_for(update, 60)
        assert [(sc.rack_id, sc.filter) for sc in scopes] == [
            (r0.id, ComponentsFilter(frozenset({compute.id})))
        ]
    finally:
        await db.dispose()


async def test_a_streak_mark_beside_delete_rack_s_stamp(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteRack stamps the schedules of its rack's scope entries (their rows locked), then locks the
    rack; a journal round ending a task on the rack holds it, then marks the task's schedule. The stamp
    keeps the schedule's key (`FOR NO KEY UPDATE`), so the mark does not wait for it, and DeleteRack
    deletes the rack once the round committed, at its first try. Under `FOR UPDATE` PostgreSQL ended
    DeleteRack as a deadlock, which it then tried again."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, [r0] = await _pausing_after_failures(env, ["r0"])
        [ended] = await env.services.schedules.trigger(schedule.id)
        async with env.db.transaction() as conn:
            await set_status(conn, [ended], TaskStatus.COMPLETED, now=env.clock.now())
        inventory = env.services.inventory
        tries: list[None] = []
        delete_once = inventory._delete_rack

        async def counted(rack_id: Any) -> Any:
            tries.append(None)
            return await delete_once(rack_id)

        monkeypatch.setattr(inventory, "_delete_rack", counted)
        deletion = await _round_ending_a_task_beside(env, r0, schedule, lambda: inventory.delete_rack(r0.id))
        await asyncio.wait_for(deletion, 60)
        assert len(tries) == 1
        with pytest.raises(NotFound):
            await inventory.get_rack(r0.id)
    finally:
        await db.dispose()


async def _a_halt_and_a_wave(env: Env) -> tuple[Any, Any, list[Any], list[Any]]:
    """Two rolling runs, both for the next step to take: "second"'s next wave (b02, b03), and "first"'s
    halt (a00 failed), which pauses its schedule. "second" fired first: its run is stepped first, and
    "first" pauses after failures too (its tasks' endings mark it)."""
    b = [await env.rack(f"b{i:02d}") for i in range(4)]
    a = [await env.rack(f"a{i:02d}") for i in range(4)]
    second = await rollout_schedule(env, b, RolloutPolicy(max_concurrent_racks=2), name="second")
    first = await rollout_schedule(env, a, HALTING, name="first")
    schedules = env.services.schedules
    await schedules.update(first.id, [PAUSE_AFTER_FAILED_RUNS_PATH], pause_after_failed_runs=2)
    second_wave = await schedules.trigger(second.id)
    first_wave = await schedules.trigger(first.id)
    [on_a00] = [t for t in await env.services.tasks.get_tasks(first_wave) if t.rack_id == a[0].id]
    async with env.db.transaction() as conn:
        await set_status(conn, second_wave, TaskStatus.COMPLETED, now=env.clock.now())
        await set_status(conn, [on_a00.id], TaskStatus.FAILED, now=env.clock.now())
    return first, second, a, b


async def _halted_and_paused(env: Env, schedule: Any) -> bool:
    return (await rollout_run(env, schedule)).run.state == "halted" and not (
        await env.services.schedules.get(schedule.id)
    ).enabled


async def test_a_scope_update_beside_a_step_halting_a_run_after_another_s_wave(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scope update of "first" naming a component of b02 locks that schedule, then b02. The step pauses
    the schedules of the runs it halts before it locks any wave's racks, so the update waits for the step,
    which waits for nothing of it. Paused after "second"'s wave, the step held b02 while it asked for the
    schedule the update held, the update waited for b02, and PostgreSQL ended the update as a deadlock:
    UNAVAILABLE."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        first, _, _, b = await _a_halt_and_a_wave(env)
        pause = PausedAfter(monkeypatch, schedule_store, "set_last_task_ids")
        step = asyncio.ensure_future(env.services.rollouts.advance())
        await pause.reached()  # the step started b02 and b03
        desired = TargetSpec(components=(ComponentTarget(id=b[2].components[0].id),))
        with caller("oncall"):
            update = asyncio.ensure_future(env.services.schedules.update_scope(first.id, desired))
        await done_or_waiting_on_a_lock(env, update)
        assert not update.done()
        pause.go.set()

        assert len((await asyncio.wait_for(step, 60)).task_ids) == 2
        scopes, _ = await asyncio.wait_for(update, 60)
        assert [sc.rack_id for sc in scopes] == [b[2].id]
        assert await _halted_and_paused(env, first)
    finally:
        await db.dispose()


async def test_a_streak_mark_beside_a_step_that_paused_its_schedule(pg_db: str) -> None:
    """A journal round holds b02 (ending a task there) and then marks "first" (ending one of its tasks);
    the step, beside it, pauses "first" for its halt, then waits for b02 to start "second"'s wave. The
    pause keeps the schedule's key (`FOR NO KEY UPDATE`), so the mark does not wait for it, and the step
    goes on once the round committed. Under `FOR UPDATE` each waited for the other, and PostgreSQL ended
    the step as a deadlock."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        first, _, _, b = await _a_halt_and_a_wave(env)
        step = await _round_ending_a_task_beside(env, b[2], first, env.services.rollouts.advance)
        assert len((await asyncio.wait_for(step, 60)).task_ids) == 2
        assert await _halted_and_paused(env, first)
    finally:
        await db.dispose()


async def test_delete_rack_beside_a_scope_entry_added_for_its_rack(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteRack stamps its rack's schedules (none: r0 is in no scope yet), then an AddScope of r0 to
    "other" commits, then DeleteRack locks r0, and a scope update of "other" naming a component of r0 locks
    "other", then waits for r0. DeleteRack finds the entry it did not stamp and tries again rather than
    lock "other" while it holds r0: the update goes on, then DeleteRack. Locking it there, each waited for
    the other, and PostgreSQL ended the update as a deadlock: UNAVAILABLE."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r0, r1 = await env.rack("r0"), await env.rack("r1")
        other = await env.schedule("other", racks=[r1])
        schedules, inventory = env.services.schedules, env.services.inventory
        stamped = PausedAfter(monkeypatch, scope_removals, "stamp_racks", _first_stamp)
        locked = PausedAfter(monkeypatch, inventory_store, "racks_for_update")
        deletion = asyncio.ensure_future(inventory.delete_rack(r0.id))
        await stamped.reached()
        with caller("oncall"):
            await schedules.add_scope(other.id, rack_target(r0))
        stamped.go.set()
        await locked.reached()  # DeleteRack holds r0
        desired = TargetSpec(components=(ComponentTarget(id=r0.components[0].id),))
        with caller("oncall"):
            update = asyncio.ensure_future(schedules.update_scope(other.id, desired))
        await done_or_waiting_on_a_lock(env, update)
        assert not update.done()
        locked.go.set()

        scopes, _ = await asyncio.wait_for(update, 60)
        assert [sc.rack_id for sc in scopes] == [r0.id]
        await asyncio.wait_for(deletion, 60)
        with pytest.raises(NotFound):
            await inventory.get_rack(r0.id)
        assert await schedules.list_scopes(other.id) == []  # its last entry went with the rack
    finally:
        await db.dispose()


async def test_remove_component_beside_a_scope_entry_narrowed_to_it(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RemoveComponent stamps the schedules whose entry names its component alone (none yet), then a scope
    update narrows "other"'s entry on r0 to that component, then RemoveComponent locks r0, and a second
    update of "other", naming it and another component of r0, locks "other", then waits for r0.
    RemoveComponent finds the entry it would empty unstamped and tries again rather than lock "other"
    while it holds r0: the second update goes on, then RemoveComponent narrows its entry. Locking it there,
    each waited for the other, and PostgreSQL ended the update as a deadlock: UNAVAILABLE."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r0 = await env.rack("r0")
        gone, kept = r0.components[0], r0.components[1]
        other = await env.schedule("other", racks=[r0])
        schedules, inventory = env.services.schedules, env.services.inventory
        stamped = PausedAfter(monkeypatch, scope_removals, "stamp_emptied_by")
        armed = False  # the narrowing update locks r0 too: the pause is RemoveComponent's lock of it
        locked = PausedAfter(monkeypatch, inventory_store, "racks_for_update", lambda *a, **kw: armed)

        removal = asyncio.ensure_future(inventory.remove_component(gone.id))
        await stamped.reached()
        with caller("oncall"):
            await schedules.update_scope(other.id, TargetSpec(components=(ComponentTarget(id=gone.id),)))
        armed = True
        stamped.go.set()
        await locked.reached()  # RemoveComponent holds r0
        both = TargetSpec(components=(ComponentTarget(id=gone.id), ComponentTarget(id=kept.id)))
        with caller("oncall"):
            update = asyncio.ensure_future(schedules.update_scope(other.id, both))
        await done_or_waiting_on_a_lock(env, update)
        assert not update.done()
        locked.go.set()

        await asyncio.wait_for(update, 60)
        await asyncio.wait_for(removal, 60)
        [entry] = await schedules.list_scopes(other.id)
        assert entry.filter == ComponentsFilter(frozenset({kept.id}))
    finally:
        await db.dispose()
