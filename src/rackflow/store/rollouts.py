"""Rollout queries: the rolling runs a driver advances, their tasks' states, and their racks' domains.

A run's per-scope state is its `outcomes` (one JSON list in the run row): a rollout step locks the run row,
reads its tasks, decides, submits, and writes the row back in one transaction, so every instance may step
any run (`FOR UPDATE SKIP LOCKED`) and none can start a scope twice (the row lock, and UNIQUE
(run_id, rack_id) on tasks behind it). Before the run rows, the step takes the window edits' turn in its
shared form (`store.windows.beside_edits`; the lock order atop `rackflow.rollouts.service`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy import ColumnElement, and_, case, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.firing import LiveRollout
from rackflow.domain.rollouts import RackPlace, RolloutPolicy
from rackflow.domain.schedules import ROLLOUT_LIVE_STATES, Outcome, Run, RunState, settled_scopes
from rackflow.domain.tasks import Hold, Operation, TaskStatus
from rackflow.store import run_partitions
from rackflow.store.db import Database, chunked, in_id_order
from rackflow.store.dialect import by_keys, for_update, keeps_deleted_runs_on_tasks
from rackflow.store.runs import in_state
from rackflow.store.schedules import (
    Tally,
    outcome_counts_to_json,
    outcomes_to_json,
    run_from_row,
    tally_from_json,
)
from rackflow.store.streak_checks import mark_schedules
from rackflow.store.tables import racks, task_schedule, task_schedule_run, task_schedule_scope, tasks
from rackflow.store.tasks import hold_values, is_active, not_begun_of_run, status_in, unclaimed

_run = task_schedule_run.c
# Manual runs: no slot, so all in the DEFAULT partition on PostgreSQL (`store.run_partitions`).
_MANUAL = _run.scheduled_for.is_(None)


@dataclass(frozen=True)
class TaskState:
    """A rollout scope's task as a rollout step reads it."""

    task_id: uuid.UUID
    status: TaskStatus
    finished_at: datetime | None
    held_by: str | None = None
    held_reason: str | None = None
    attempt: int = 1  # 1 until a retry's next attempt: with PENDING or WAITING, the task has not begun


async def live_rollouts(
    conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, LiveRollout]:
    """Each schedule's rolling or halted run; at most one each (a unique index)."""
    found: dict[uuid.UUID, LiveRollout] = {}
    for chunk in chunked(list(schedule_ids)):
        stmt = select(_run.schedule_id, _run.id, _run.state).where(
            _run.schedule_id.in_(chunk), _run.state.in_(ROLLOUT_LIVE_STATES)
        )
        found.update({row.schedule_id: LiveRollout(row.id, row.state) for row in await conn.execute(stmt)})
    return found


async def halted_runs(conn: AsyncConnection, limit: int) -> list[Run]:
    """Halted rollouts, newest first, at most `limit` (the overview flags them: each waits for a person)."""
    stmt = (
        select(task_schedule_run)
        .where(_run.state == "halted")
        .order_by(_run.fired_at.desc(), _run.id.desc())
        .limit(limit)
    )
    return [run_from_row(row) for row in await conn.execute(stmt)]


async def any_rolling(conn: AsyncConnection) -> bool:
    """Whether any run is rolling (one read of the partial index `ix_task_schedule_run_rolling`)."""
    stmt = select(_run.id).where(_run.state == "rolling").limit(1)
    return (await conn.execute(stmt)).first() is not None


async def claim_rolling(
    db: Database, conn: AsyncConnection, limit: int, run_ids: Collection[uuid.UUID] | None = None
) -> list[Run]:
    """Up to `limit` rolling runs (of `run_ids`, if given), locked until commit; runs another instance is
    stepping are skipped, not waited for. Runs named are looked for in the partitions their ids tell
    (`run_partitions.of_runs`): a rollout's first step as it fires, or as it is approved or resumed; one an
    instance of the previous release recorded in a week (its id not its slot's) is not found there, and
    takes its step at the rollout driver's next round instead, which names no runs."""
    stmt = select(task_schedule_run).where(_run.state == "rolling")
    if run_ids is not None:
        stmt = stmt.where(_run.id.in_(list(run_ids)), await run_partitions.of_runs(conn, run_ids))
    stmt = stmt.order_by(_run.id).limit(limit)
    return [run_from_row(row) for row in await conn.execute(db.skip_locked(stmt))]


async def get_run(
    db: Database, conn: AsyncConnection, run_id: uuid.UUID, *, lock: bool = False, nowait: bool = False
) -> Run | None:
    """One run; `lock` holds it until commit (waiting for a rollout step that holds it). `nowait` (with
    `lock`): fail at once while another transaction holds it (a look-up in doubt, for the reason
    `dispatch.claimed_runs` gives). Read in its partition (`run_partitions.run_rows`)."""
    stmt = select(task_schedule_run).where(_run.id == run_id)
    rows = await run_partitions.run_rows(conn, run_id, db.for_update(stmt, nowait=nowait) if lock else stmt)
    return run_from_row(rows[0]) if rows else None


@dataclass(frozen=True)
class LockedRollout:
    """A rollout run as its start gate reads it, under the lock of its row: its policy, its state and
    why it is in it (a halt's reason); and, for the failure limit, its scopes' tally by outcome (its
    `outcome_counts`, written with its outcomes: None for a run written before migration 0024, none
    kept), the failures its last resume excused and whether it was resumed, without its outcomes."""

    policy: RolloutPolicy
    state: RunState
    reason: str
    tally: Tally | None = None
    failures_excused: int = 0
    resumed: bool = False


async def lock_rollouts(
    db: Database, conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> tuple[dict[uuid.UUID, LockedRollout], set[uuid.UUID]]:
    """Each rollout among these runs whose row no other transaction holds, its row locked until commit,
    in id order; and the rollouts among them another transaction holds (a rollout step, resume or cancel,
    a window's change, another claim's rollout gate), skipped, not waited for (`FOR UPDATE SKIP LOCKED`).
    Plain firings (their `rollout` a JSON null) are neither returned nor locked. One read of the
    policies, then one locking statement when there are rollouts among them, which reads the state and
    reason, and the failure limit's inputs (`LockedRollout`): as they are once the lock is had, not as a
    step writing them left them before.

    The caller, an executor's claim, holds its tasks' rows and, in a round that ended tasks, their racks'
    (`tasks.manager.TaskManager.let_go_in`); a holder of a run's row may be waiting for one of those racks
    (a window's change, a rollout's step or cancel lock a run's row before its racks'), so the claim
    never waits for a run's row (the lock order atop `rackflow.tasks.executor`)."""
    policies: dict[uuid.UUID, RolloutPolicy] = {}
    for chunk in chunked(in_id_order(run_ids)):
        stmt = select(_run.id, _run.rollout).where(_run.id.in_(chunk))
        for row in await conn.execute(stmt):
            if row.rollout is not None:
                policies[row.id] = RolloutPolicy.from_json(row.rollout)
    found: dict[uuid.UUID, LockedRollout] = {}
    for chunk in chunked(in_id_order(policies)):
        locking = (
            select(_run.id, _run.state, _run.reason, _run.outcome_counts, _run.failures_excused, _run.resumed)
            .where(_run.id.in_(chunk))
            .order_by(_run.id)
        )
        for locked in await conn.execute(db.skip_locked(locking)):
            found[locked.id] = LockedRollout(
                policies[locked.id],
                locked.state,
                locked.reason,
                tally_from_json(locked.outcome_counts) if locked.outcome_counts else None,
                locked.failures_excused,
                locked.resumed,
            )
    return found, set(policies) - set(found)


async def hold_unstarted(
    conn: AsyncConnection, run_id: uuid.UUID, gate: str, hold: Hold, now: datetime
) -> list[uuid.UUID]:
    """Hold by `gate` the run's tasks that never started (`not_begun_of_run`: their first attempt PENDING
    and not claimed yet, or WAITING in their rack's queue) and that nothing holds; their ids. The rollout
    gate looks only at tasks something held before, so this is what brings them before it. Tasks another
    gate (or their window) holds keep that hold, and come before this gate when it ends. The caller holds
    the run's row (a halt, or a window's change that let a task go: `rollouts.gate.hold_stopped`), so it
    skips the tasks a claim holds (`unclaimed`): nothing held them, so that claim starts them (they began
    first), unless a gate before the rollout's hands them back there: they come before this gate when
    that hold ends."""
    stmt = (
        update(tasks)
        .where(unclaimed(conn, not_begun_of_run(run_id), tasks.c.held_by.is_(None)))
        .values(hold_values(gate, hold, now))
    )
    return list((await conn.execute(stmt.returning(tasks.c.id))).scalars())


async def save_run(conn: AsyncConnection, run: Run) -> None:
    """Write what a rollout step, resume or cancel changed: state (and the owner a run leaves with
    "running", `runs.in_state`), outcomes, reason, what was excused (and mark the schedule's failing streak
    to be looked at again, `store.streak_checks`). Bounded to the run's partition by its own slot
    (`run_partitions.of_slots`)."""
    await conn.execute(
        update(task_schedule_run)
        .where(_run.id == run.id, await run_partitions.of_slots(conn, [run.scheduled_for]))
        .values(
            # a rollout has no owner; a running run whose scopes are settled keeps its own (`in_state`)
            in_state(run.state)
            | {
                "outcomes": outcomes_to_json(run.outcomes),
                "outcome_counts": outcome_counts_to_json(run.outcomes),
                "reason": run.reason,
                "failures_excused": run.failures_excused,
                "resumed": run.resumed,
            }
        )
    )
    await mark_schedules(conn, [run.schedule_id])


@dataclass(frozen=True)
class LockedRun:
    """A run's state, and why it is in it (a halt's reason), as they are once its row is locked."""

    state: RunState
    reason: str


async def lock_runs(conn: AsyncConnection, run_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, LockedRun]:
    """Lock these runs' rows until commit, in id order (waiting for a rollout step, resume or cancel, or a
    claim's rollout gate, that holds one); each run's state and reason as the lock found them."""
    found: dict[uuid.UUID, LockedRun] = {}
    for chunk in chunked(in_id_order(run_ids)):
        stmt = select(_run.id, _run.state, _run.reason).where(_run.id.in_(chunk)).order_by(_run.id)
        for row in await conn.execute(for_update(conn.dialect.name, stmt)):
            found[row.id] = LockedRun(row.state, row.reason)
    return found


async def settle_scopes(
    conn: AsyncConnection, settled: Mapping[uuid.UUID, Mapping[uuid.UUID, tuple[Outcome, str]]]
) -> None:
    """Give the scopes of each run whose task is in `settled[run id]` its (outcome, error)
    (`settled_scopes`), the runs locked by the caller (`lock_runs`, or the rollout gate's lock): one read
    and one write per run, and one read of their scopes for the tasks a run's outcomes do not name yet (its
    write-back is to come). Rare: a task a claim held while its rollout was cancelled, a deferred task a
    window's change ended."""
    for chunk in chunked(in_id_order(settled)):
        stmt = select(task_schedule_run).where(_run.id.in_(chunk))
        runs = [run_from_row(row) for row in (await conn.execute(stmt)).all()]
        named = {o.task_id for run in runs for o in run.outcomes}
        unnamed = await _scopes_of_tasks(conn, [i for run in runs for i in settled[run.id] if i not in named])
        for run in runs:
            outcomes = settled_scopes(run.outcomes, settled[run.id], unnamed)
            await save_run(conn, replace(run, outcomes=outcomes))


async def _scopes_of_tasks(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, tuple[uuid.UUID | None, uuid.UUID]]:
    """Each of these tasks' scope in its schedule, as (scope id, rack id); a task whose scope was removed
    since has no scope id (None), and its rack."""
    found: dict[uuid.UUID, tuple[uuid.UUID | None, uuid.UUID]] = {}
    scope = task_schedule_scope.c
    of_task = (scope.schedule_id == tasks.c.schedule_id) & (scope.rack_id == tasks.c.rack_id)
    for chunk in chunked(list(task_ids)):
        stmt = (
            select(tasks.c.id, scope.id.label("scope_id"), tasks.c.rack_id)
            .select_from(tasks.outerjoin(task_schedule_scope, of_task))
            .where(tasks.c.id.in_(chunk))
        )
        found |= {row.id: (row.scope_id, row.rack_id) for row in await conn.execute(stmt)}
    return found


async def link_retry(conn: AsyncConnection, run_id: uuid.UUID, retry_of: uuid.UUID) -> None:
    """Record that `run_id` (a manual run this instance has just recorded) re-runs `retry_of`
    (RetryTaskScheduleRun)."""
    in_partition = await run_partitions.of_runs(conn, [run_id])
    linked = update(task_schedule_run).where(_run.id == run_id, in_partition).values(retry_of=retry_of)
    await conn.execute(linked)


async def retried_by(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, list[uuid.UUID]]:
    """The runs that re-ran each of these runs, oldest first (by the index on `retry_of`). A retry is a
    manual run (`ScheduleService.retry_run`), which has no slot: read in the DEFAULT partition alone on
    PostgreSQL (`_MANUAL`), not in every week's."""
    found: dict[uuid.UUID, list[uuid.UUID]] = {}
    for chunk in chunked(list(run_ids)):
        stmt = (
            select(_run.retry_of, _run.id)
            .where(_run.retry_of.in_(chunk), _MANUAL)
            .order_by(_run.fired_at, _run.id)
        )
        for row in await conn.execute(stmt):
            found.setdefault(row.retry_of, []).append(row.id)
    return found


async def task_states(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> dict[tuple[uuid.UUID, uuid.UUID], TaskState]:
    """The tasks of these runs, keyed by (run id, rack id) (the index of UNIQUE (run_id, rack_id))."""
    found: dict[tuple[uuid.UUID, uuid.UUID], TaskState] = {}
    for chunk in chunked(list(run_ids)):
        stmt = select(
            tasks.c.run_id,
            tasks.c.rack_id,
            tasks.c.id,
            tasks.c.status,
            tasks.c.finished_at,
            tasks.c.held_by,
            tasks.c.held_reason,
            tasks.c.attempt,
        ).where(tasks.c.run_id.in_(chunk))
        for row in await conn.execute(stmt):
            state = TaskState(
                row.id, TaskStatus(row.status), row.finished_at, row.held_by, row.held_reason, row.attempt
            )
            found[(row.run_id, row.rack_id)] = state
    return found


@dataclass(frozen=True)
class RunTaskCounts:
    """What the rollout gate needs of a run's tasks, counted in SQL rather than read one by one (10,000
    task states at 10,000 racks were most of a claim's cost, docs/PERFORMANCE.md): how many it has
    (`present`), how many ended among `failed_statuses` (`failed`), and how many count against its caps
    (`active`: active, not held by the holder the caps leave out, not among the claim's own tasks)."""

    present: int = 0
    failed: int = 0
    active: int = 0


def _counted_active(uncounted_holder: str, deciding: Collection[uuid.UUID]) -> ColumnElement[bool]:
    """A task that counts against its rollout's caps, as the gate counts them: active, not held by
    `uncounted_holder` (its pre-flight checks: held, it is not in flight), and not one of `deciding` (the
    claim's tasks, which the gate adds one by one)."""
    counted = and_(
        is_active(tasks.c.status), or_(tasks.c.held_by.is_(None), tasks.c.held_by != uncounted_holder)
    )
    return and_(counted, tasks.c.id.not_in(list(deciding))) if deciding else counted


async def run_task_counts(
    conn: AsyncConnection,
    run_ids: Collection[uuid.UUID],
    *,
    failed_statuses: Collection[TaskStatus],
    uncounted_holder: str,
    deciding: Collection[uuid.UUID],
) -> dict[uuid.UUID, RunTaskCounts]:
    """Each run's `RunTaskCounts`, one grouped statement (by the index of UNIQUE (run_id, rack_id)); a run
    with no task left is absent (all zero)."""
    found: dict[uuid.UUID, RunTaskCounts] = {}
    active = _counted_active(uncounted_holder, deciding)
    for chunk in chunked(list(run_ids)):
        stmt = (
            select(
                tasks.c.run_id,
                func.count().label("present"),
                func.sum(case((status_in(tasks.c.status, *failed_statuses), 1), else_=0)).label("failed"),
                func.sum(case((active, 1), else_=0)).label("active"),
            )
            .where(tasks.c.run_id.in_(chunk))
            .group_by(tasks.c.run_id)
        )
        for row in await conn.execute(stmt):
            found[row.run_id] = RunTaskCounts(row.present, int(row.failed or 0), int(row.active or 0))
    return found


async def active_by_domain(
    conn: AsyncConnection,
    run_ids: Collection[uuid.UUID],
    domains: Collection[uuid.UUID],
    *,
    uncounted_holder: str,
    deciding: Collection[uuid.UUID],
) -> dict[tuple[uuid.UUID, uuid.UUID], int]:
    """How many of these runs' tasks count against their caps (`RunTaskCounts.active`) in each of these
    domains, keyed by (run id, domain): a rack's domain is its NVL domain, or, without one (or with its
    rack row gone), its own id, a domain of its own (`domain.rollouts.caps_reached`). Only the domains
    asked for are counted: those of the racks a claim would start."""
    if not domains:
        return {}
    key = func.coalesce(racks.c.nvl_domain_id, tasks.c.rack_id)
    found: dict[tuple[uuid.UUID, uuid.UUID], int] = {}
    active = _counted_active(uncounted_holder, deciding)
    for chunk in chunked(list(run_ids)):
        stmt = (
            select(tasks.c.run_id, key.label("domain"), func.count().label("active"))
            .select_from(tasks.outerjoin(racks, racks.c.id == tasks.c.rack_id))
            .where(tasks.c.run_id.in_(chunk), active, key.in_(list(domains)))
            .group_by(tasks.c.run_id, key)
        )
        for row in await conn.execute(stmt):
            found[(row.run_id, row.domain)] = row.active
    return found


async def tasks_of_deleted_runs(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> dict[tuple[uuid.UUID, uuid.UUID], TaskState] | None:
    """The tasks that still name these runs, deleted with their schedule, keyed as `task_states` keys
    them: what the runs' steps started before the deletion, as tasks outlive their run. None where the
    deletion cleared the runs' ids from their tasks (SQLite, `dialect.keeps_deleted_runs_on_tasks`):
    what those runs started cannot be told."""
    if not keeps_deleted_runs_on_tasks(conn.dialect.name):
        return None
    return await task_states(conn, run_ids)


async def tasks_by_id(
    conn: AsyncConnection, run_id: uuid.UUID, task_ids: Collection[uuid.UUID]
) -> dict[tuple[uuid.UUID, uuid.UUID], TaskState]:
    """These tasks of the run `run_id`, keyed as `task_states` keys a run's, read by their ids: the tasks of
    a run deleted since with its schedule, which outlive it (SQLite clears their `run_id`)."""
    found: dict[tuple[uuid.UUID, uuid.UUID], TaskState] = {}
    for chunk in chunked(list(task_ids)):
        task = tasks.c
        stmt = select(
            task.rack_id, task.id, task.status, task.finished_at, task.held_by, task.held_reason, task.attempt
        ).where(task.id.in_(chunk))
        for row in await conn.execute(stmt):
            state = TaskState(
                row.id, TaskStatus(row.status), row.finished_at, row.held_by, row.held_reason, row.attempt
            )
            found[(run_id, row.rack_id)] = state
    return found


async def task_status_counts(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, dict[TaskStatus, int]]:
    """How many of each run's tasks (`task_states`' tasks) are in each status, counted in the database
    from the index `ix_tasks_run_id_status` alone (migration 0024): the runs grid's column verdicts need
    no more of a firing of 10,000 racks. Counted, not kept while it can change: a count kept in the run's
    row would be updated, and its row locked, by every one of its 10,000 tasks' status changes (the grid
    keeps it once final, `store.kept_counts`)."""
    found: dict[uuid.UUID, dict[TaskStatus, int]] = {run_id: {} for run_id in run_ids}
    for chunk in chunked(list(run_ids)):
        stmt = (
            select(tasks.c.run_id, tasks.c.status, func.count())
            .where(tasks.c.run_id.in_(chunk))
            .group_by(tasks.c.run_id, tasks.c.status)
        )
        for run_id, status, count in await conn.execute(stmt):
            found[run_id][TaskStatus(status)] = count
    return found


async def window_ends(
    conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, datetime]:
    """The end of the own window (a firmware upgrade's end_time) of each of these schedules' operation that
    has one: the rollout rule halts a run at it (`domain.rollouts.decide`). An update cannot change a
    schedule's operation, so it is the one its runs fired with."""
    found: dict[uuid.UUID, datetime] = {}
    columns = select(task_schedule.c.id, task_schedule.c.operation_template)
    for chunk in chunked(list(schedule_ids)):
        stmt = by_keys(conn.dialect.name, columns, task_schedule.c.id, chunk)
        for row in await conn.execute(stmt):
            end = Operation.from_json(row.operation_template["operation"]).window_end
            if end is not None:
                found[row.id] = end
    return found


async def rack_places(conn: AsyncConnection, rack_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, RackPlace]:
    found: dict[uuid.UUID, RackPlace] = {}
    for chunk in chunked(list(rack_ids)):
        stmt = by_keys(
            conn.dialect.name, select(racks.c.id, racks.c.name, racks.c.nvl_domain_id), racks.c.id, chunk
        )
        found.update({row.id: RackPlace(row.name, row.nvl_domain_id) for row in await conn.execute(stmt)})
    return found
