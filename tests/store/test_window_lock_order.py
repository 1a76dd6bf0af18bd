"""A maintenance window's creation, update or deletion beside an executor's claim, a rollout's cancel or a
claim's freeze hold does not deadlock, and lets go of what the freeze held (PostgreSQL: SQLite's single
writer runs them one after the other).

The edit's transaction takes its locks in one order (`rackflow.tasks.deferrals`): its turn, the rows of the
runs of the tasks it decides, then of their racks and of the racks the window names (in id order, before
the window's write checks its racks' keys), then writes the window, and takes task rows last and only as
`FOR UPDATE SKIP LOCKED` (`store.tasks.unclaimed`): the claim locks a task's row before its run's (which
it takes only when free), a
rollout's cancel a run's before its racks', CancelTask a rack's before its task's. A freeze hold on a row
a claim held is let go after the edit committed, one row to a transaction that holds nothing else.

`deferred_in_a_rollout` (tests/store/test_window_deferrals.py): a DEFER rollout of r0, r1 and r2, two at
once; r0's task submitted, r1's waiting for "nightly"'s opening at 02:00, r2 not submitted yet.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from rackflow.domain.tasks import Hold, TaskStatus
from rackflow.domain.windows import MaintenanceWindow, OneOff, WindowKind
from rackflow.errors import NotFound
from rackflow.ids import id_beside
from rackflow.store import inventory as inventory_store
from rackflow.store import rollouts as run_store
from rackflow.store import tasks as task_store
from rackflow.store import windows as window_store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule_run, tasks
from rackflow.store.tasks import hold_values, set_status
from rackflow.tasks.gates import consult
from rackflow.windows import service as window_service
from rackflow.windows.gate import FreezeGate
from rackflow.windows.service import RACKS_PATH, WHEN_PATH, Ref, WindowInput
from tests.store.query_plans import statements_sent
from tests.store.schedules_support import Env, make_env
from tests.store.test_approvals import caller
from tests.store.test_executor import eventually
from tests.store.test_rollout_halt_gate import OWNER, claim_in
from tests.store.test_rollout_lock_order import done_or_waiting_on_a_lock, open_claim_then_gate
from tests.store.test_rollouts import _run as rollout_run
from tests.store.test_window_deferrals import (
    deferred_in_a_rollout,
    get,
    halted_with_a_deferred_rack,
    open_now,
    outcome_of,
)

pytestmark = pytest.mark.postgres


async def hold_by_a_freeze_that_ran_out(env: Env, task_id: uuid.UUID) -> None:
    """Hold the task as the freeze gate holds it, for ten seconds, and let them pass: the next claim takes
    it, and its gates decide it again (the rollout's, for a task of a rollout, under its run's lock)."""
    async with env.db.transaction() as conn:
        hold = Hold(env.clock.now() + timedelta(seconds=10), "waits for freeze 'short' to end")
        held = update(tasks).where(tasks.c.id == task_id)
        await conn.execute(held.values(hold_values("freeze", hold, env.clock.now())))
    env.clock.advance(timedelta(seconds=11))


async def test_a_window_change_beside_a_claim_of_a_freeze_held_task_of_its_rollout(pg_db: str) -> None:
    """The claim holds r0's task, which a freeze held (its rollout gate locks the run), and the window's
    deletion lets r1's task of that run go: the deletion locks the run and lets go of the freezes' holds.
    Were it to wait for r0's row (a claim holds it) while holding the run's, which that claim's gate waits
    for, PostgreSQL would abort one of the two as a deadlock."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, _, deferred = await deferred_in_a_rollout(env)
        [r0_task] = [
            o.task_id
            for o in (await rollout_run(env, schedule)).run.outcomes
            if o.task_id is not None and o.task_id != deferred.id
        ]
        await hold_by_a_freeze_that_ran_out(env, r0_task)

        changes, gated = await open_claim_then_gate(env, [r0_task], open_now(env, "delete", deferred.rack_id))

        assert [task.id for task, _ in gated.claimed] == [r0_task]  # the run is rolling, with room
        assert [c["deferred_task"] for c in changes.recorded] == ["released"]
        released = await get(env, deferred.id)
        assert (released.status, released.held_by, released.not_before) == (TaskStatus.PENDING, None, None)
    finally:
        await db.dispose()


class PausedAfterTheWindowsWrite:
    """The first window update (`store.windows.save_window`) pauses once written, its transaction open,
    until `go` is set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paused = asyncio.Event()
        self.go = asyncio.Event()
        save_window = window_store.save_window

        async def pausing(*args: Any, **kwargs: Any) -> None:
            await save_window(*args, **kwargs)
            if not self.paused.is_set():
                self.paused.set()
                await self.go.wait()

        monkeypatch.setattr(window_store, "save_window", pausing)


async def test_a_rollout_s_cancel_beside_a_window_edit_naming_its_deferred_rack(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "nightly", which names r1, is moved to open now, and before the edit commits the rollout is
    cancelled. The window's write checks r1's key (`FOR KEY SHARE` on r1's row); the cancel locks the run,
    then its racks (r0, r1). Had the edit written the window before it locked the run, each would wait for
    the other: the edit locks the run and r1 first, so the cancel waits for it, then ends r1's task."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        schedule, run_id, deferred = await deferred_in_a_rollout(env)
        pause = PausedAfterTheWindowsWrite(monkeypatch)
        edit = asyncio.ensure_future(open_now(env, "edit", deferred.rack_id))
        async with asyncio.timeout(60):
            await pause.paused.wait()
        with caller("oncall"):
            cancel = asyncio.ensure_future(env.services.rollouts.cancel(run_id))
        await done_or_waiting_on_a_lock(env, cancel)
        pause.go.set()
        changes = await asyncio.wait_for(edit, 60)
        report = await asyncio.wait_for(cancel, 60)

        assert [c["deferred_task"] for c in changes.recorded] == ["released"]
        assert report.run.state == "cancelled"
        ended = await get(env, deferred.id)
        assert (ended.status, ended.message) == (TaskStatus.TERMINATED, "its rollout was cancelled by oncall")
        assert await outcome_of(env, schedule, ended) == (
            "not_started",
            "its rollout was cancelled by oncall",
        )
    finally:
        await db.dispose()


async def test_a_freeze_hold_a_claim_wrote_beside_the_freeze_s_deletion_is_let_go(pg_db: str) -> None:
    """A claim took r1's task, which a freeze held, and its freeze gate held it again until the end of
    "late", a freeze of every rack (read before "late" was deleted); the deletion skips the task's row,
    which the claim holds, and lets go of that hold once the claim committed: a deleted freeze keeps no
    task waiting."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r1 = await env.rack("r1")
        late = OneOff(env.clock.now() - timedelta(hours=1), env.clock.now() + timedelta(days=1))
        await env.services.windows.create(WindowInput(name="late", kind=WindowKind.FREEZE, when=late))
        [task_id] = await env.services.schedules.trigger((await env.schedule("plain", racks=[r1])).id)
        await hold_by_a_freeze_that_ran_out(env, task_id)

        async with env.db.transaction() as conn:
            claimed = await claim_in(env, conn)
            assert [task.id for task, _ in claimed] == [task_id]
            gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
            assert gated.claimed == []  # held again until "late" ends, as the claim read the windows
            deletion = asyncio.ensure_future(
                env.services.windows.delete(await env.services.windows.id_by_name("late"))
            )
            await done_or_waiting_on_a_lock(env, deletion)
        await asyncio.wait_for(deletion, 60)

        let_go = await get(env, task_id)
        assert (let_go.status, let_go.held_by, let_go.not_before) == (TaskStatus.PENDING, "freeze", None)
    finally:
        await db.dispose()


def lock_taken(statement: str) -> str:
    """What row locks a statement of a window edit takes, by kind ("" for none)."""
    sql = " ".join(statement.split()).upper()
    if "PG_ADVISORY_XACT_LOCK" in sql:
        return "turn"
    if sql.startswith(
        ("INSERT INTO MAINTENANCE_WINDOW", "UPDATE MAINTENANCE_WINDOW", "DELETE FROM MAINTENANCE")
    ):
        return "window"  # (its racks' keys, checked by the links' foreign key)
    if sql.startswith("UPDATE TASKS") or ("FROM TASKS" in sql and " FOR UPDATE" in sql):
        return "tasks"
    if " FOR UPDATE" in sql and "FROM TASK_SCHEDULE_RUN" in sql:
        return "runs"
    if (" FOR UPDATE" in sql or " FOR NO KEY UPDATE" in sql) and "FROM RACKS" in sql:
        return "racks"
    return ""


async def test_a_window_edit_locks_its_turn_runs_racks_window_then_tasks_skipping_those_held(
    pg_db: str,
) -> None:
    """The statements of an edit that lets go of a halted rollout's deferred task (held by the rollout
    instead) while a freeze holds another task, in the order sent: its turn, the run, the racks, the
    window, then task rows, each statement that locks one skipping rows another transaction holds."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        _, _, deferred = await halted_with_a_deferred_rack(env)
        [frozen] = await env.services.schedules.trigger(
            (await env.schedule("frozen", racks=[await env.rack("r9")])).id
        )
        await hold_by_a_freeze_that_ran_out(env, frozen)
        window_id = await env.services.windows.id_by_name("nightly")
        now = env.clock.now()
        when = OneOff(now - timedelta(hours=1), now + timedelta(hours=2))

        with statements_sent(env.db) as sent:
            await env.services.windows.update(window_id, [WHEN_PATH], WindowInput(when=when))

        locks = [(kind, statement) for statement, _ in sent if (kind := lock_taken(statement))]
        order = [kind for i, (kind, _) in enumerate(locks) if i == 0 or locks[i - 1][0] != kind]
        assert order == ["turn", "runs", "racks", "window", "tasks"], [s for _, s in locks]
        waiting = [s for kind, s in locks if kind == "tasks" and "SKIP LOCKED" not in s.upper()]
        assert waiting == [], "a statement of the edit waits for a task's row"
        # The racks' lock never waits for a claim's check of their keys (`store.tasks.lock_racks`).
        assert all("FOR NO KEY UPDATE" in s.upper() for kind, s in locks if kind == "racks")
        assert (await get(env, deferred.id)).held_by == "rollout"
        assert (await get(env, frozen)).not_before is None
    finally:
        await db.dispose()


class PausedHoldingTheRack:
    """The first DeleteRack pauses once it holds its rack (`FOR UPDATE`, and the runs it will write before
    it), its transaction open and nothing of it written, until `go` is set: it has just asked whether the
    rack has active tasks (`store.inventory.has_active_tasks`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paused = asyncio.Event()
        self.go = asyncio.Event()
        has_active_tasks = inventory_store.has_active_tasks

        async def pausing(*args: Any, **kwargs: Any) -> bool:
            found = await has_active_tasks(*args, **kwargs)
            if not self.paused.is_set():
                self.paused.set()
                await self.go.wait()
            return found

        monkeypatch.setattr(inventory_store, "has_active_tasks", pausing)


async def name_r0_and_r1(env: Env, r0: uuid.UUID, r1: uuid.UUID) -> MaintenanceWindow:
    """ "nightly" (which names r1, whose task of the halted rollout waits for its opening) names r0 too."""
    window_id = await env.services.windows.id_by_name("nightly")
    return await env.services.windows.update(window_id, [RACKS_PATH], WindowInput(racks=(Ref(r0), Ref(r1))))


async def test_delete_rack_beside_a_window_edit_naming_that_rack(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r0's task of the run ended (failed) and r1's waits for "nightly"'s opening; r0 is deleted while
    "nightly" is edited to name r0 too. DeleteRack writes the run's row (its kept counts are not read
    again: `kept_counts.mark_deleted`); the edit locks that run (it decides r1's task), then r0 (named).
    DeleteRack takes its rack first here: had it locked the run only after its rack, each would wait for
    the other and PostgreSQL would abort one as a deadlock. It locks the run first, so the edit waits for
    it, then links the window to r1 alone: as if it had come first and the deletion taken r0's link."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        _, run_id, deferred = await halted_with_a_deferred_rack(env)
        r0 = (await env.services.inventory.get_rack_by_name("r0")).id
        pause = PausedHoldingTheRack(monkeypatch)
        deletion = asyncio.ensure_future(env.services.inventory.delete_rack(r0))
        async with asyncio.timeout(60):
            await pause.paused.wait()
        edit = asyncio.ensure_future(name_r0_and_r1(env, r0, deferred.rack_id))
        await done_or_waiting_on_a_lock(env, edit)
        assert not edit.done()  # it waits for the run's row
        pause.go.set()
        await asyncio.wait_for(deletion, 60)
        edited = await asyncio.wait_for(edit, 60)

        assert {rack_id for rack_id, _ in edited.racks} == {r0, deferred.rack_id}
        with pytest.raises(NotFound):
            await env.services.inventory.get_rack(r0)
        nightly = await env.services.windows.get(edited.id)
        assert [rack_id for rack_id, _ in nightly.racks] == [deferred.rack_id]
        assert (await get(env, deferred.id)) == deferred  # still waits for "nightly"'s opening
        async with env.db.read() as conn:
            marked = select(task_schedule_run.c.tasks_deleted).where(task_schedule_run.c.id == run_id)
            assert (await conn.execute(marked)).scalar_one() is True
    finally:
        await db.dispose()


async def test_a_window_edit_naming_a_rack_beside_its_delete_rack(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other way round: the edit naming r0 holds the run and r0 (its window written) when DeleteRack
    starts; DeleteRack waits for it, then deletes r0, and the window with it loses r0."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        _, _, deferred = await halted_with_a_deferred_rack(env)
        r0 = (await env.services.inventory.get_rack_by_name("r0")).id
        pause = PausedAfterTheWindowsWrite(monkeypatch)
        edit = asyncio.ensure_future(name_r0_and_r1(env, r0, deferred.rack_id))
        async with asyncio.timeout(60):
            await pause.paused.wait()
        deletion = asyncio.ensure_future(env.services.inventory.delete_rack(r0))
        await done_or_waiting_on_a_lock(env, deletion)
        pause.go.set()
        edited = await asyncio.wait_for(edit, 60)
        await asyncio.wait_for(deletion, 60)

        assert {rack_id for rack_id, _ in edited.racks} == {r0, deferred.rack_id}
        nightly = await env.services.windows.get(edited.id)
        assert [rack_id for rack_id, _ in nightly.racks] == [deferred.rack_id]
        with pytest.raises(NotFound):
            await env.services.inventory.get_rack(r0)
    finally:
        await db.dispose()


async def test_delete_rack_tries_again_when_a_task_ran_on_it_before_its_lock(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between DeleteRack's read of its tasks' runs (and their locks) and its lock of the rack, r0 gets a
    task of another run (here: an ended task of "plain"'s run, as a task submitted and ended meanwhile
    would be). That run's row is not locked, and DeleteRack, holding the rack, must not wait for
    it: it rolls back and tries again, locking that run first, and deletes the rack."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r0, r9 = await env.rack("r0"), await env.rack("r9")
        [ended] = await env.services.schedules.trigger((await env.schedule("on r0", racks=[r0])).id)
        ended_task = await get(env, ended)
        its_run = ended_task.run_id
        async with env.db.transaction() as conn:
            await set_status(conn, [ended], TaskStatus.COMPLETED, now=env.clock.now())
        [other_task] = await env.services.schedules.trigger((await env.schedule("plain", racks=[r9])).id)
        other_run = (await get(env, other_task)).run_id
        locked: list[set[uuid.UUID]] = []
        lock_runs = run_store.lock_runs

        async def meanwhile(conn: Any, run_ids: Any) -> Any:
            found = await lock_runs(conn, run_ids)
            locked.append(set(run_ids))
            if len(locked) == 1:
                async with env.db.transaction() as other:  # filed with its run, as every task is
                    made = replace(ended_task, id=id_beside(other_run), run_id=other_run)
                    await task_store.insert_tasks(other, [made])
                    await set_status(other, [made.id], TaskStatus.COMPLETED, now=env.clock.now())
            return found

        monkeypatch.setattr(run_store, "lock_runs", meanwhile)
        await asyncio.wait_for(env.services.inventory.delete_rack(r0.id), 60)

        assert locked == [{its_run}, {its_run, other_run}]
        with pytest.raises(NotFound):
            await env.services.inventory.get_rack(r0.id)
        async with env.db.read() as conn:
            marked = select(task_schedule_run.c.tasks_deleted).where(task_schedule_run.c.id == other_run)
            assert (await conn.execute(marked)).scalar_one() is True
    finally:
        await db.dispose()


async def test_a_freeze_hold_a_claim_wrote_beside_the_freeze_s_deletion_that_died_is_let_go_by_a_look_again(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the deletion's process dies once it committed, before it lets go of the hold the
    claim wrote (the claim still holds the row). An executor's look again, which had read the freezes
    before, sees "late" gone while the claim is still open, and finds nothing held past now; once that
    claim (a write transaction under way when it looked) has committed, it looks again and lets go of
    the task, held by a freeze that is no more."""
    db = Database(pg_db)
    try:
        env = make_env(db)
        r1 = await env.rack("r1")
        late = OneOff(env.clock.now() - timedelta(hours=1), env.clock.now() + timedelta(days=1))
        await env.services.windows.create(WindowInput(name="late", kind=WindowKind.FREEZE, when=late))
        [task_id] = await env.services.schedules.trigger((await env.schedule("plain", racks=[r1])).id)
        await hold_by_a_freeze_that_ran_out(env, task_id)
        look = FreezeGate(env.db)  # another instance's executor's
        assert await look.look_again(env.clock.now()) == 0

        async def dies(*_: object) -> None:
            raise RuntimeError("the process died after the deletion committed")

        monkeypatch.setattr(window_service, "let_go_of_freezes", dies)
        async with env.db.transaction() as conn:
            claimed = await claim_in(env, conn)
            assert [task.id for task, _ in claimed] == [task_id]
            gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
            assert gated.claimed == []  # held again until "late" ends, as the claim read the windows
            # It answers all the same (the deletion committed), its failure logged, not raised.
            await env.services.windows.delete(await env.services.windows.id_by_name("late"))
            assert await env.services.windows.list_windows() == []
            assert await look.look_again(env.clock.now()) == 0  # the claim's hold is not committed
            assert await look.look_again(env.clock.now()) == 0  # nor is it yet: it waits for the claim
        assert (await get(env, task_id)).not_before == late.end  # held by a freeze that is gone

        async def let_go() -> bool:
            return await look.look_again(env.clock.now()) == 1

        await eventually(let_go)
        let_go_of = await get(env, task_id)
        assert (let_go_of.status, let_go_of.held_by, let_go_of.not_before) == (
            TaskStatus.PENDING,
            "freeze",
            None,
        )
    finally:
        await db.dispose()
