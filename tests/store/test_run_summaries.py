"""A run's kept summary is what counting it from scratch finds, on both databases (migration 0024,
docs/PERFORMANCE.md "The runs grid and a big run's page"): its `outcome_counts` column against its
outcomes, its tasks by status (`task_status_counts`, from `ix_tasks_run_id_status`) against its tasks,
and the runs grid's page (`grid_outcomes`: cells of the page's racks and of racks that left the scope,
read from `tasks` for a run `told_by_its_tasks`, else from its outcome JSON) against the outcomes
themselves — after firing, task completion, attempt retries, holds, RetryTaskScheduleRun, rollout steps,
a halt and its retry, approval, a missed firing, a rack leaving the scope or the inventory, and pruning of
tasks and of runs."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update

from rackflow.clock import FakeClock
from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.inventory import ComponentTarget, Rack, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Run, Schedule
from rackflow.domain.tasks import QueueOptions, Task, TaskStatus
from rackflow.schedules import firing
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store import inventory as inventory_store
from rackflow.store import kept_counts, scope_removals, task_partitions, task_runs
from rackflow.store import rollouts as rollout_store
from rackflow.store import runs as run_history
from rackflow.store import schedules as schedule_store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import (
    task_prune_horizon,
    task_schedule,
    task_schedule_run,
    task_schedule_scope,
    tasks,
)
from tests.store.lock_waits import waiting_for
from tests.store.schedules_support import HOURLY, POWER_OFF, Env, make_env, rack_target
from tests.store.test_executor import start_running

pytestmark = pytest.mark.asyncio


async def _schedule(
    env: Env,
    racks: Sequence[Rack],
    name: str = "fw",
    *,
    rollout: RolloutPolicy | None = None,
    approval: ApprovalPolicy | None = None,
    target: TargetSpec | None = None,
) -> Schedule:
    return await env.services.schedules.create(
        name=name,
        spec=HOURLY,
        overlap_policy=OverlapPolicy.QUEUE,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=target or rack_target(*racks),
        rollout=rollout,
        approval=approval,
    )


async def _runs(env: Env, schedule: Schedule) -> list[Run]:
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    return list(runs)


async def _tasks(env: Env, run_id: uuid.UUID) -> list[Task]:
    """The run's tasks by their racks' names."""
    found, _ = await env.services.tasks.list_tasks()
    names = await env.services.inventory.rack_names({t.rack_id for t in found})
    return sorted((t for t in found if t.run_id == run_id), key=lambda t: names[t.rack_id])


async def _end(env: Env, ended: Sequence[Task], status: TaskStatus) -> None:
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [t.id for t in ended], status, now=env.clock.now())


async def summaries_match(env: Env, schedule: Schedule, only: Sequence[Run] | None = None) -> tuple[int, int]:
    """Assert every run of `schedule` (or those `only`) is summarised as counting it from scratch finds, and
    its grid page (of every other scope rack) shows what its outcomes say, the racks that left the scope
    included (asked only when `scope_removals.may_have_left`, which a removal that forgot its stamp makes
    say no wrongly); returns how many runs were read from their tasks and how many from their outcomes, so
    a test can say both ways were taken."""
    runs = list(only) if only is not None else await _runs(env, schedule)
    run_ids = [run.id for run in runs]
    async with env.db.read() as conn:
        tallies = await run_history.run_tallies(conn, run_ids)
        counts = await rollout_store.task_status_counts(conn, run_ids)
        rows = (await conn.execute(select(tasks.c.id, tasks.c.run_id, tasks.c.status))).all()
        scope_of = select(task_schedule_scope.c.rack_id).where(
            task_schedule_scope.c.schedule_id == schedule.id
        )
        scope_racks = sorted((await conn.execute(scope_of)).scalars(), key=str)
        page_racks = scope_racks[::2]
        found = await run_history.grid_outcomes(conn, schedule.id, run_ids, page_racks, counts)
    # The service reads the cells of the runs whose every rack got a task while it counts their tasks, on
    # another connection, and keeps those the counts confirm: the same page.
    served, served_counts = await env.services.schedules.grid_outcomes(schedule.id, run_ids, page_racks)
    assert served_counts == counts
    assert (served.tallies, served.statuses, served.left) == (found.tallies, found.statuses, found.left)

    def by_rack(grid: run_history.GridOutcomes) -> dict[uuid.UUID, list[run_history.ShownOutcome]]:
        return {run_id: sorted(cells, key=lambda o: str(o.rack_id)) for run_id, cells in grid.shown.items()}

    assert by_rack(served) == by_rack(found)
    status_of = {row.id: TaskStatus(row.status) for row in rows}
    by_tasks = 0
    for run in runs:
        assert tallies[run.id] == dict(Counter((o.outcome, o.task_id is not None) for o in run.outcomes))
        assert counts[run.id] == dict(Counter(TaskStatus(row.status) for row in rows if row.run_id == run.id))
        shown = [
            run_history.ShownOutcome(o.rack_id, o.outcome, o.task_id, o.error)
            for o in run.outcomes
            if o.rack_id in page_racks or o.rack_id not in scope_racks
        ]
        assert sorted(found.shown[run.id], key=lambda o: str(o.rack_id)) == sorted(
            shown, key=lambda o: str(o.rack_id)
        ), run.state
        by_tasks += run_history.told_by_its_tasks(tallies[run.id], counts[run.id])
    assert found.left == {o.rack_id for run in runs for o in run.outcomes if o.rack_id not in scope_racks}
    shown_tasks = {o.task_id for cells in found.shown.values() for o in cells if o.task_id is not None}
    assert found.statuses == {task_id: status_of[task_id] for task_id in shown_tasks if task_id in status_of}
    return by_tasks, len(runs) - by_tasks


@pytest.fixture
def prune_row_by_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The task prune as on a database without weeks: every ended task past the retention deleted by
    itself. On PostgreSQL a task filed this week (a manual run's, whose id tells the wall clock) would
    otherwise go with its week, a week past the retention at most (tests/store/test_task_partitions.py);
    these tests are about the counts a prune leaves, not which rows the weeks keep."""
    monkeypatch.setattr(task_partitions, "kept_floor", lambda _conn, _cutoff: None)


async def test_plain_firings_through_completion_retries_holds_leaving_racks_and_pruning(
    db: Database, prune_row_by_row: None
) -> None:
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(5)]
    schedule = await _schedule(env, racks)
    await env.services.schedules.trigger(schedule.id)
    (first,) = await _runs(env, schedule)
    assert await summaries_match(env, schedule) == (1, 0)  # every task pending
    ran = await _tasks(env, first.id)
    await _end(env, ran[:2], TaskStatus.COMPLETED)
    await _end(env, ran[2:3], TaskStatus.FAILED)
    await _end(env, ran[3:4], TaskStatus.TERMINATED)
    owner = uuid.uuid4()
    await start_running(db, ran[4], owner)
    assert await summaries_match(env, schedule) == (1, 0)
    # An attempt that failed retryably goes back to PENDING, held until its next attempt.
    async with db.transaction() as conn:
        later = env.clock.now() + timedelta(minutes=1)
        assert await task_runs.retry_later(conn, {ran[4].id: (later, "flaky")}, owner_id=owner, now=later)
    (retried,) = await env.services.tasks.get_tasks([ran[4].id])
    assert retried.status is TaskStatus.PENDING and retried.attempt == 2
    assert await summaries_match(env, schedule) == (1, 0)
    await _end(env, [retried], TaskStatus.COMPLETED)
    # RetryTaskScheduleRun: a new run of the failed and terminated racks.
    env.clock.advance(timedelta(seconds=1))
    again = await env.services.schedules.retry_run(first.id)
    assert len(again.run.outcomes) == 2
    assert await summaries_match(env, schedule) == (2, 0)
    await _end(env, await _tasks(env, again.run.id), TaskStatus.COMPLETED)
    env.clock.advance(timedelta(seconds=1))
    await env.services.schedules.trigger(schedule.id)
    assert await summaries_match(env, schedule) == (3, 0)
    # A rack leaves the scope: its cells are shown after the scope's, read from its tasks.
    scopes = await env.services.schedules.list_scopes(schedule.id)
    (gone_scope,) = [sc for sc in scopes if sc.rack_id == racks[0].id]
    await env.services.schedules.remove_scope(gone_scope.id)
    assert await summaries_match(env, schedule) == (3, 0)
    # A rack deleted from the inventory takes its tasks along: runs that had one are read from outcomes.
    newest = (await _runs(env, schedule))[0]
    await _end(env, await _tasks(env, newest.id), TaskStatus.COMPLETED)
    await env.services.inventory.delete_rack(racks[1].id)
    assert await summaries_match(env, schedule) == (1, 2)  # the retry (of r2 and r3) did not run on r1
    # Ended tasks pruned (--task-retention) once past it: every run's outcomes name tasks that are gone.
    env.clock.advance(timedelta(hours=2))
    async for _ in task_store.prune_finished_tasks(db, timedelta(hours=1)):
        pass
    assert await summaries_match(env, schedule) == (0, 3)
    # Runs pruned beyond the newest (RUNS_KEPT_PER_SCHEDULE, here 1).
    async with db.transaction() as conn:
        await run_history.prune_runs(conn, [schedule.id], keep=1)
    assert len(await _runs(env, schedule)) == 1
    await summaries_match(env, schedule)


async def test_rollouts_approvals_and_missed_firings(db: Database) -> None:
    clock = FakeClock(datetime.now(UTC))  # an approval expires by the database's clock
    env = Env(db, clock, Services.build(db, clock))
    racks = [await env.rack(f"r{i}") for i in range(4)]
    # A rollout: pending racks become submitted step by step (`store.rollouts.save_run`), then it halts.
    policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=2, pause_on_halt=False)
    rolling = await _schedule(env, racks, "rolling", rollout=policy)
    await env.services.schedules.trigger(rolling.id)
    (run,) = await _runs(env, rolling)
    assert await summaries_match(env, rolling) == (0, 1)  # pending racks have no task
    await _end(env, await _tasks(env, run.id), TaskStatus.COMPLETED)
    await env.services.rollouts.advance()
    assert await summaries_match(env, rolling) == (0, 1)
    for _ in range(2):
        await _end(env, [t for t in await _tasks(env, run.id) if t.status.is_active], TaskStatus.FAILED)
        await env.services.rollouts.advance()
    assert (await env.services.rollouts.get(run.id)).run.state == "halted"
    assert await summaries_match(env, rolling) == (0, 1)  # one rack not started
    env.clock.advance(timedelta(seconds=1))
    await env.services.schedules.retry_run(run.id)  # cancels the halted run, rolls its racks out again
    assert await summaries_match(env, rolling) == (0, 2)
    # Approval: the planned racks wait ("pending"), then the approval writes them submitted.
    approving = await _schedule(env, racks, "approving", approval=ApprovalPolicy(timedelta(hours=4), 1))
    await env.services.schedules.trigger(approving.id)
    (waiting,) = await _runs(env, approving)
    assert await summaries_match(env, approving) == (0, 1)
    await env.services.approvals.approve(waiting.id, "fine")
    assert await summaries_match(env, approving) == (1, 0)
    env.clock.advance(timedelta(seconds=1))
    await env.services.schedules.trigger(approving.id)
    newest = (await _runs(env, approving))[0]
    await env.services.approvals.reject(newest.id, "not today")
    assert await summaries_match(env, approving) == (1, 1)
    # A dispatched firing past its start deadline: every rack "missed", no task.
    missing = await _schedule(env, racks, "missing")
    async with db.transaction() as conn:
        slot = await db.now(conn) - timedelta(hours=2)
        await schedule_store.save_schedule(
            conn, replace(missing, next_run_at=slot, start_deadline=timedelta(minutes=15))
        )
    await Dispatcher(env.services.schedules, env.services.audit).poll_once()
    (missed,) = await _runs(env, missing)
    assert missed.state == "missed"
    assert await summaries_match(env, missing) == (0, 1)


async def test_the_summary_is_written_with_the_outcomes_it_counts(db: Database) -> None:
    """The column's shape: per outcome, [racks without a task, racks with one]; a run with no outcomes
    (a plain firing before its write-back) counts nothing."""
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(3)]
    schedule = await _schedule(env, racks, rollout=RolloutPolicy(max_concurrent_racks=1))
    await env.services.schedules.trigger(schedule.id)
    (run,) = await _runs(env, schedule)
    async with db.read() as conn:
        stmt = select(task_schedule_run.c.outcome_counts).where(task_schedule_run.c.id == run.id)
        assert (await conn.execute(stmt)).scalar_one() == {"submitted": [0, 1], "pending": [2, 0]}
    assert schedule_store.outcome_counts_to_json(()) == {}
    assert schedule_store.tally_from_json({"failed": [2, 0], "submitted": [0, 3]}) == {
        ("failed", False): 2,
        ("submitted", True): 3,
    }


async def test_a_run_written_without_its_counts_is_counted_from_its_outcomes(db: Database) -> None:
    """The release before 0024 goes on writing runs, without `outcome_counts`, while 0024 is applied under
    it (a rolling upgrade, docs/OPERATIONS.md): such a run (the column at its default, its outcomes not
    empty) is summarised, and its grid page read, as counting its outcomes finds, not as a run of no racks
    (whose grid page would be read from its outcomes, not its tasks)."""
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(3)]
    schedule = await _schedule(env, racks)
    await env.services.schedules.trigger(schedule.id)
    (run,) = await _runs(env, schedule)
    async with db.transaction() as conn:
        await conn.execute(
            update(task_schedule_run).where(task_schedule_run.c.id == run.id).values(outcome_counts={})
        )
    assert await summaries_match(env, schedule) == (1, 0)


# Every way a scope entry is removed (docs/SCHEDULES.md, "Scope"; `store.scope_removals`): the scope RPCs
# (the API, the dashboard's form and the CLI call them), RemoveComponent emptying a component filter, and
# DeleteRack (the service, and the store's function under it, which stamps by itself).
REMOVALS = ("remove_scope", "update_scope", "remove_component", "delete_rack", "store_delete_rack")


async def _remove(env: Env, schedule: Schedule, gone: Rack, removal: str) -> None:
    services = env.services
    if removal == "remove_scope":
        (entry,) = [sc for sc in await services.schedules.list_scopes(schedule.id) if sc.rack_id == gone.id]
        await services.schedules.remove_scope(entry.id)
    elif removal == "update_scope":
        kept = [
            sc.rack_id for sc in await services.schedules.list_scopes(schedule.id) if sc.rack_id != gone.id
        ]
        await services.schedules.update_scope(
            schedule.id, rack_target(*[await services.inventory.get_rack(r) for r in kept])
        )
    elif removal == "remove_component":
        await services.inventory.remove_component(gone.components[0].id)
    elif removal == "delete_rack":
        await services.inventory.delete_rack(gone.id)
    else:
        async with env.db.transaction() as conn:
            assert await inventory_store.racks_for_update(env.db, conn, [gone.id])
            await inventory_store.delete_rack(conn, gone.id)


async def _may_have_left(env: Env, schedule: Schedule, runs: Sequence[Run]) -> bool:
    async with env.db.read() as conn:
        return await scope_removals.may_have_left(conn, schedule.id, [run.id for run in runs])


async def _stamp(env: Env, schedule: Schedule) -> datetime | None:
    async with env.db.read() as conn:
        stmt = select(task_schedule.c.scope_removed_after).where(task_schedule.c.id == schedule.id)
        stamp: datetime | None = (await conn.execute(stmt)).scalar_one()
        return stamp


@pytest.mark.parametrize("removal", REMOVALS)
async def test_every_scope_removal_stamps_its_schedule(db: Database, removal: str) -> None:
    """A rack taken out of the scope by any path is found "left" on a page of a run that fired before: the
    removal stamped the schedule with its newest run's `fired_at` in its transaction. A path that forgot
    the stamp leaves the page's runs fired "after" it (no stamp at all here), the read of who left is
    skipped, and `summaries_match` finds the rack missing. A run fired after the removal cannot hold the
    rack: its page skips the read, and finds what reading would have."""
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(4)]
    gone = racks[0]
    # The removed rack's entry names one of its components (RemoveComponent then empties it), the others
    # every component by id: the same racks as a schedule of whole racks.
    named = [gone.components[0], *(c for rack in racks[1:] for c in rack.components)]
    target = TargetSpec(components=tuple(ComponentTarget(id=c.id) for c in named))
    schedule = await _schedule(env, racks, target=target if removal == "remove_component" else None)
    await env.services.schedules.trigger(schedule.id)
    (before,) = await _runs(env, schedule)
    await _end(env, await _tasks(env, before.id), TaskStatus.COMPLETED)  # DeleteRack waits for none
    assert await _stamp(env, schedule) is None
    assert not await _may_have_left(env, schedule, [before])
    env.clock.advance(timedelta(minutes=1))

    await _remove(env, schedule, gone, removal)

    await summaries_match(env, schedule)
    served, _ = await env.services.schedules.grid_outcomes(schedule.id, [before.id], [])
    assert served.left == {gone.id}
    assert await _stamp(env, schedule) == before.fired_at
    assert await _may_have_left(env, schedule, [before])
    # A firing after the removal: its racks are the scope's, and its page reads nobody leaving.
    env.clock.advance(timedelta(minutes=1))
    await env.services.schedules.trigger(schedule.id)
    after, _ = await _runs(env, schedule)
    assert {o.rack_id for o in after.outcomes} == {r.id for r in racks[1:]}
    assert not await _may_have_left(env, schedule, [after])
    assert await _may_have_left(env, schedule, [after, before])
    await summaries_match(env, schedule, only=[after])
    await summaries_match(env, schedule)


async def test_a_retry_run_holds_only_racks_still_in_scope_and_a_removal_without_runs_stamps_nothing(
    db: Database,
) -> None:
    """RetryTaskScheduleRun re-runs only the scope entries that still exist (read under the schedule's
    lock, as a firing reads its scope): a retry of a run whose failed rack has left since is a run like
    any other, fired after the stamp, and its page skips the read. A scope entry removed while the schedule
    has no run leaves no stamp: no run can hold it."""
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(4)]
    schedule = await _schedule(env, racks)
    await _remove(env, schedule, racks[3], "remove_scope")
    assert await _stamp(env, schedule) is None
    await env.services.schedules.trigger(schedule.id)
    (first,) = await _runs(env, schedule)
    await _end(env, await _tasks(env, first.id), TaskStatus.FAILED)
    env.clock.advance(timedelta(minutes=1))
    await _remove(env, schedule, racks[0], "remove_scope")
    env.clock.advance(timedelta(minutes=1))
    retry = (await env.services.schedules.retry_run(first.id)).run
    assert {o.rack_id for o in retry.outcomes} == {racks[1].id, racks[2].id}
    assert retry.fired_at > first.fired_at == await _stamp(env, schedule)
    assert not await _may_have_left(env, schedule, [retry])
    await summaries_match(env, schedule, only=[retry])
    assert await summaries_match(env, schedule) == (2, 0)  # both read from their tasks


@pytest.mark.postgres
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)  # PostgreSQL's row locks
async def test_a_removal_waiting_for_a_firing_stamps_its_run(db: Database) -> None:
    """PostgreSQL: a firing holds its schedule's row from before it reads the scope until it commits its
    run; a removal meanwhile waits for that row, then reads the runs anew: its stamp is the new run's
    `fired_at`, so the run, which took the removed rack, reads who left. (SQLite has one writer: the
    removal runs before or after the firing, never during it.)"""
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(3)]
    schedule = await _schedule(env, racks)
    (entry,) = [
        sc for sc in await env.services.schedules.list_scopes(schedule.id) if sc.rack_id == racks[0].id
    ]
    async with db.transaction() as conn:
        locked = select(task_schedule.c.id).where(task_schedule.c.id == schedule.id)
        await conn.execute(db.for_update(locked))
        claimed = await firing.claim(db, conn, [schedule], trigger="manual", now=env.clock.now())
        removal = asyncio.create_task(env.services.schedules.remove_scope(entry.id))
        await waiting_for(db, conn, removal)
    await removal
    await env.services.schedules.fire(claimed)
    (run,) = await _runs(env, schedule)
    assert racks[0].id in {o.rack_id for o in run.outcomes}
    assert await _stamp(env, schedule) == run.fired_at
    assert await _may_have_left(env, schedule, [run])
    await summaries_match(env, schedule)


async def _kept(env: Env, run: Run) -> tuple[object, object]:
    async with env.db.read() as conn:
        stmt = select(task_schedule_run.c.task_counts, task_schedule_run.c.tasks_deleted).where(
            task_schedule_run.c.id == run.id
        )
        row = (await conn.execute(stmt)).one()
        return row.task_counts, row.tasks_deleted


@pytest.mark.parametrize("deletion", ["prune", "delete_rack"])
async def test_a_count_kept_once_final_is_read_from_its_run_until_a_task_of_it_is_deleted(
    db: Database, deletion: str, prune_row_by_row: None
) -> None:
    """The grid keeps a run's tasks by status in its row once the run is completed and every task ended
    (`store.kept_counts`), and reads it from there; never while a task is active; and after a deletion of
    one of its tasks it is counted again: by retention, whose horizon passes the run, or with its rack,
    which marks the run."""
    env = make_env(db)
    racks = [await env.rack(f"r{i}") for i in range(3)]
    schedule = await _schedule(env, racks)
    await env.services.schedules.trigger(schedule.id)
    (run,) = await _runs(env, schedule)
    ran = await _tasks(env, run.id)
    await _end(env, ran[:2], TaskStatus.COMPLETED)
    assert await summaries_match(env, schedule) == (1, 0)
    assert await _kept(env, run) == (None, None)  # a task still pending: not final
    await _end(env, ran[2:], TaskStatus.FAILED)
    assert await summaries_match(env, schedule) == (1, 0)
    assert await _kept(env, run) == ({"completed": 2, "failed": 1}, None)
    # Read from the row from now on (a value no count would give shows it).
    async with db.transaction() as conn:
        marked = update(task_schedule_run).where(task_schedule_run.c.id == run.id)
        await conn.execute(marked.values(task_counts={"completed": 7}))
    _, served = await env.services.schedules.grid_outcomes(schedule.id, [run.id], [])
    assert served == {run.id: {TaskStatus.COMPLETED: 7}}
    async with db.transaction() as conn:
        await conn.execute(marked.values(task_counts={"completed": 2, "failed": 1}))
    assert await summaries_match(env, schedule) == (1, 0)

    if deletion == "prune":
        env.clock.advance(timedelta(hours=2))  # past the retention
        async for _ in task_store.prune_finished_tasks(db, timedelta(hours=1)):
            pass
        assert (await _kept(env, run))[1] is None  # not marked: the horizon tells
        async with db.read() as conn:
            horizon = (await conn.execute(select(task_prune_horizon.c.pruned_before))).scalar_one()
        assert run.fired_at < horizon
    else:
        await env.services.inventory.delete_rack(racks[0].id)
        assert (await _kept(env, run))[1] is True
    await summaries_match(env, schedule)  # the service's counts are the live count again
    _, served = await env.services.schedules.grid_outcomes(schedule.id, [run.id], [])
    assert sum(served[run.id].values()) < 3


async def test_a_count_is_not_kept_on_a_run_marked_by_a_deletion(db: Database) -> None:
    """A deletion that committed before the count is kept wins: `keep` writes only on a row not marked
    (whatever the order of the two, the row ends marked, and a marked row's count is never read)."""
    env = make_env(db)
    schedule = await _schedule(env, [await env.rack("r0")])
    await env.services.schedules.trigger(schedule.id)
    (run,) = await _runs(env, schedule)
    async with db.transaction() as conn:
        await kept_counts.mark_deleted(conn, [run.id, None])
        await kept_counts.keep(conn, {run.id: {TaskStatus.COMPLETED: 1}})
    assert await _kept(env, run) == (None, True)
    async with db.read() as conn:
        assert await kept_counts.kept(conn, [run.id]) == ({}, {run.id: "completed"})


async def test_the_task_prune_raises_its_horizon_before_it_deletes_and_spares_the_counts_of_newer_runs(
    db: Database, prune_row_by_row: None
) -> None:
    """Retention marks no run: it raises `task_prune_horizon` to its cutoff, committed before it deletes
    anything (so a count kept meanwhile is not read past the deletion), and only a run fired before the
    horizon, by `HORIZON_MARGIN`, is counted again; a newer run's kept count is still read."""
    env = make_env(db)
    schedule = await _schedule(env, [await env.rack("r0")])
    await env.services.schedules.trigger(schedule.id)
    env.clock.advance(timedelta(minutes=1))
    await env.services.schedules.trigger(schedule.id)
    old_run, new_run = sorted(await _runs(env, schedule), key=lambda r: r.fired_at)
    for run in (old_run, new_run):
        await _end(env, await _tasks(env, run.id), TaskStatus.COMPLETED)
    # Dated by the clock the prune reads: the old run and its task 10 h ago, the new one 30 min ago.
    async with db.transaction() as conn:
        now = await db.now(conn)
        fired = {old_run.id: now - timedelta(hours=10), new_run.id: now - timedelta(minutes=30)}
        for run in (old_run, new_run):
            at = fired[run.id]
            await conn.execute(
                update(task_schedule_run).where(task_schedule_run.c.id == run.id).values(fired_at=at)
            )
            await conn.execute(
                update(tasks).where(tasks.c.run_id == run.id).values(created_at=at, finished_at=at)
            )
    assert await summaries_match(env, schedule) == (2, 0)
    assert (await _kept(env, old_run))[0] == (await _kept(env, new_run))[0] == {"completed": 1}

    # The horizon is committed before the first chunk is deleted; the prune's first chunk deletes the
    # old run's task only (the new one is younger than the retention of 2 h).
    prune = task_store.prune_finished_tasks(db, timedelta(hours=2))
    assert await anext(prune) == 1
    await prune.aclose()
    async with db.read() as conn:
        horizon = (await conn.execute(select(task_prune_horizon.c.pruned_before))).scalar_one()
        found, states = await kept_counts.kept(conn, [old_run.id, new_run.id])
    assert fired[old_run.id] < horizon < fired[new_run.id] - kept_counts.HORIZON_MARGIN
    assert found == {new_run.id: {TaskStatus.COMPLETED: 1}}  # still read from its row
    assert states == {old_run.id: "completed"}  # counted again
    assert (await _kept(env, old_run))[1] is None  # and not marked
    await summaries_match(env, schedule)

    # A run that fired less than HORIZON_MARGIN after the horizon is counted again too (clocks apart).
    async with db.transaction() as conn:
        await kept_counts.raise_horizon(conn, fired[new_run.id] - kept_counts.HORIZON_MARGIN / 2)
    async with db.read() as conn:
        assert (await kept_counts.kept(conn, [new_run.id]))[0] == {}
