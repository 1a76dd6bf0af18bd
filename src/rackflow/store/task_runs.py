"""The executor's queries on task rows: claiming, progress, endings, and what steps changed.

Every write to a running task is fenced: it only applies while the task is RUNNING and owned by the writer,
and says which tasks it applied to, so an executor learns at once that a task was cancelled or taken over;
where nothing is to be written, the same fence locks the rows instead (`fence`). Each query handles many tasks
in one statement, so the executor's journal writes a whole round of tasks in a handful of statements.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import (
    Integer,
    Row,
    Select,
    Uuid,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import ColumnElement

from rackflow.domain.inventory import PowerState
from rackflow.domain.tasks import (
    RETRY_HOLD,
    ComponentChange,
    Fail,
    Hold,
    InLine,
    OperationKind,
    ReleasedHold,
    StepRecord,
    Task,
    TaskAttempt,
    TaskStatus,
)
from rackflow.store.db import Database, chunked
from rackflow.store.dialect import for_update, walking_in_order
from rackflow.store.instances import is_live, lease_cutoff, lease_params
from rackflow.store.streak_checks import mark_schedules_of_tasks
from rackflow.store.tables import components, task_attempt, task_step_state, tasks, window_decisions_owed
from rackflow.store.task_partitions import LIVE_FILING, filed_at, live_weeks, of_tasks
from rackflow.store.tasks import (
    NOT_HELD,
    OLDEST_FIRST,
    TASK_COLUMNS,
    hold_values,
    is_active,
    refusal_json,
    status_in,
    task_from_row,
    unclaimed,
)
from rackflow.store.types import UTCDateTime

# Tasks per UPDATE that writes a different value to each (two bound values per task and column).
_CASE_CHUNK = 200


async def pick(
    db: Database,
    conn: AsyncConnection,
    *,
    owner_id: uuid.UUID,
    lease_ttl: timedelta,
    running_here: Collection[uuid.UUID],
    now: datetime,
    limit: int,
) -> list[tuple[Task, int]]:
    """The first half of a claim: up to `limit` tasks this instance should run, oldest first, their rows
    locked until the caller commits (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite's write transaction
    holds its one writer's lock), so that no other claim takes them; `start` then makes them RUNNING.

    Those are PENDING tasks that nothing holds past `now` (`not_before`: their window's opening, or a
    start gate's hold), RUNNING tasks whose
    owner's lease (`lease_ttl`) has expired (takeover), and RUNNING tasks this instance owns but is not
    running (its run was interrupted, e.g. by a database outage) — never one in `running_here`, even if
    this instance's own lease lapsed. Rows other claimers hold are skipped.
    Each comes back as it is now, with the number its claim will be within its current attempt (a number
    above 1 is a takeover): `start` counts one more claim.
    """
    params = {
        "claimer": owner_id,
        "claimed_at": now,
        "running_here": list(running_here),
        "room": limit,
        **lease_params(db, lease_ttl),
    }
    params.update(await live_weeks(conn))
    async with walking_in_order(conn):  # the live queue in its order, whatever the statistics say
        picked = await conn.execute(_pick_statement(db), params)
    return [(task_from_row(r), r.attempts + 1) for r in picked]


async def start(
    conn: AsyncConnection,
    picked: Sequence[tuple[Task, int]],
    *,
    owner_id: uuid.UUID,
    now: datetime,
    messages: Mapping[uuid.UUID, str],
) -> list[tuple[Task, int]]:
    """The second half of a claim: make the tasks `pick` took in this transaction (whose rows it holds)
    RUNNING, owned by `owner_id`, with one more claim (`started_at` keeps the first start,
    `attempt_started_at` the current retry attempt's), and those in `messages` with their first progress
    message, in the same UPDATE: a task's claim and its first message are one version of its row (a
    statement of their own made a second one of every task's: docs/CAPACITY.md, "Racks of 36 components").
    Each comes back as it is now, with the number of its claim (`pick`'s)."""
    started: list[tuple[Task, int]] = []
    for chunk in chunked(picked, _CASE_CHUNK):
        values = dict(_RUNNING_VALUES)
        firsts = {task.id: messages[task.id] for task, _ in chunk if task.id in messages}
        if firsts:
            values["message"] = _per_task(firsts, else_=tasks.c.message)
        ids = [task.id for task, _ in chunk]
        named = of_tasks(conn.dialect.name, tasks.c.filed_at, ids)
        stmt = update(tasks).where(tasks.c.id.in_(ids), named).values(values)
        rows = await conn.execute(stmt.returning(*_STARTED), {"claimer": owner_id, "claimed_at": now})
        by_id = {row.id: row for row in rows}
        started.extend((_started(task, by_id[task.id]), number) for task, number in chunk)
    return started


async def claim(
    db: Database,
    conn: AsyncConnection,
    *,
    owner_id: uuid.UUID,
    lease_ttl: timedelta,
    running_here: Collection[uuid.UUID],
    now: datetime,
    limit: int,
) -> list[tuple[Task, int]]:
    """`pick`, then `start` with no progress message: a claim as the executor's, for tools, benches and
    tests (the executor plans the tasks' steps in between, for their first messages)."""
    picked = await pick(
        db, conn, owner_id=owner_id, lease_ttl=lease_ttl, running_here=running_here, now=now, limit=limit
    )
    return await start(conn, picked, owner_id=owner_id, now=now, messages={}) if picked else []


# What a claim writes: RUNNING, owned by the claimer, one more attempt; `started_at` keeps the first start.
_CLAIMER = bindparam("claimer", type_=Uuid())
_CLAIMED_AT = bindparam("claimed_at", type_=UTCDateTime())
# A start is never before the task was made: the claim reads its clock before its statement, which on
# PostgreSQL takes a task another instance submitted in between (committed, so made before the start),
# whose `created_at` is then after that reading.
_STARTED_AT = case((tasks.c.created_at > _CLAIMED_AT, tasks.c.created_at), else_=_CLAIMED_AT)
_RUNNING_VALUES = {
    "status": TaskStatus.RUNNING.value,
    "owner_id": _CLAIMER,
    "attempts": tasks.c.attempts + 1,
    "started_at": func.coalesce(tasks.c.started_at, _STARTED_AT),
    "attempt_started_at": func.coalesce(tasks.c.attempt_started_at, _STARTED_AT),
    "updated_at": _CLAIMED_AT,
}
# What of a task `start` changed, read back: `pick` read the rest.
_STARTED = (
    tasks.c.id,
    tasks.c.status,
    tasks.c.message,
    tasks.c.started_at,
    tasks.c.attempt_started_at,
    tasks.c.updated_at,
)


def _started(task: Task, row: Row[Any]) -> Task:
    return replace(
        task,
        status=TaskStatus(row.status),
        message=row.message,
        started_at=row.started_at,
        attempt_started_at=row.attempt_started_at,
        updated_at=row.updated_at,
    )


# Built once per database (building the statement costs more than running it), with bound parameters.
_PICK_STATEMENTS: WeakKeyDictionary[Database, Select[Any]] = WeakKeyDictionary()


def _pick_statement(db: Database) -> Select[Any]:
    stmt = _PICK_STATEMENTS.get(db)
    if stmt is not None:
        return stmt
    pending = status_in(tasks.c.status, TaskStatus.PENDING)
    running = status_in(tasks.c.status, TaskStatus.RUNNING)
    # The typed hold: its window's opening, or a start gate's hold (rackflow.tasks.gates); and no window's
    # change owes it a decision (`store.decisions_owed`): its `not_after` may be the end of a window the
    # operator has since shortened, so it waits for that decision (the change's instance makes it once the
    # claim that held the row committed; should it die, every executor's look again, within a lease period).
    undecided = exists().where(window_decisions_owed.c.task_id == tasks.c.id)
    due = and_(pending, or_(tasks.c.not_before.is_(None), tasks.c.not_before <= _CLAIMED_AT), ~undecided)
    orphaned = and_(running, or_(tasks.c.owner_id.is_(None), ~is_live(tasks.c.owner_id, lease_cutoff(db))))
    forgotten = and_(running, tasks.c.owner_id == _CLAIMER)
    # Never a task this instance is running now, whatever its lease looks like: a loaded instance whose
    # own heartbeat lapsed must not start a second run of its own task.
    not_running_here = tasks.c.id.not_in(bindparam("running_here", expanding=True, type_=tasks.c.id.type))
    # On PostgreSQL, the partitions that can hold a live task (`task_partitions.live_weeks`).
    filing = LIVE_FILING if db.is_postgres else true()
    stmt = db.skip_locked(
        select(*TASK_COLUMNS)
        # `is_active` adds nothing to the branches but the partial index's predicate, for SQLite to use it.
        .where(is_active(tasks.c.status), or_(due, orphaned, forgotten), not_running_here, filing)
        .order_by(*OLDEST_FIRST)
        .limit(bindparam("room", type_=Integer()))
    )
    _PICK_STATEMENTS[db] = stmt
    return stmt


async def mark_running(
    conn: AsyncConnection, task_id: uuid.UUID, *, owner_id: uuid.UUID, now: datetime
) -> None:
    """Make one task RUNNING under `owner_id` as a claim would (for tools and tests that stage a run)."""
    stmt = update(tasks).where(tasks.c.id == task_id).values(_RUNNING_VALUES)
    await conn.execute(stmt, {"claimer": owner_id, "claimed_at": now})


def _held_running(
    conn: AsyncConnection, task_ids: Sequence[uuid.UUID], owner_id: uuid.UUID
) -> ColumnElement[bool]:
    """These tasks, RUNNING under `owner_id`; named by their partitions (`task_partitions.of_tasks`)."""
    return and_(
        tasks.c.id.in_(task_ids),
        of_tasks(conn.dialect.name, tasks.c.filed_at, task_ids),
        tasks.c.owner_id == owner_id,
        tasks.c.status == TaskStatus.RUNNING.value,
    )


async def fence(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID], *, owner_id: uuid.UUID
) -> set[uuid.UUID]:
    """The tasks still RUNNING here (the others were cancelled or taken over), their rows locked until the
    caller commits, as a write of them would lock them, without writing them: the fence of a batch of steps
    whose progress message is not written (`record_progress` fences the others), and of what a step
    records before it acts (`record_steps`).

    On PostgreSQL the lock is `FOR NO KEY UPDATE`, the lock an UPDATE of those rows takes (their keys are
    not changed), so the lock order is the writes' (the design note atop `rackflow.tasks.executor`): a
    cancel (which locks the row `FOR UPDATE`) waits for the caller's commit, and one that holds the row
    first makes this wait and then leaves the task out (read again at READ COMMITTED once it committed); a
    takeover's claim (`FOR UPDATE SKIP LOCKED`) passes over it. SQLite's write transaction holds its one
    writer's lock from its `BEGIN IMMEDIATE` to its commit, so no other writer comes in between either."""
    held: set[uuid.UUID] = set()
    for chunk in chunked(task_ids):
        stmt = for_update(
            conn.dialect.name, select(tasks.c.id).where(_held_running(conn, chunk, owner_id)), keys_kept=True
        )
        held.update((await conn.execute(stmt)).scalars())
    return held


async def record_progress(
    conn: AsyncConnection, messages: Mapping[uuid.UUID, str], *, owner_id: uuid.UUID, now: datetime
) -> set[uuid.UUID]:
    """Write each task's progress message; returns the tasks still RUNNING here (the others were cancelled
    or taken over, and are left as they are), whose rows the UPDATE locks until commit."""
    held: set[uuid.UUID] = set()
    for chunk in chunked(messages, _CASE_CHUNK):
        result = await conn.execute(
            update(tasks)
            .where(_held_running(conn, chunk, owner_id))
            .values(message=_per_task({i: messages[i] for i in chunk}), updated_at=now)
            .returning(tasks.c.id)
        )
        held.update(result.scalars())
    return held


async def finish(
    conn: AsyncConnection,
    outcomes: Mapping[uuid.UUID, tuple[TaskStatus, str]],
    *,
    owner_id: uuid.UUID,
    now: datetime,
) -> set[uuid.UUID]:
    """End tasks this instance runs with their (status, message) and drop the hold; returns the tasks
    ended (the others were cancelled or taken over, and are left as they are). Their schedules' failing
    streaks are marked to be looked at again (`store.streak_checks`)."""
    ended: set[uuid.UUID] = set()
    for chunk in chunked(outcomes, _CASE_CHUNK):
        result = await conn.execute(
            update(tasks)
            .where(_held_running(conn, chunk, owner_id))
            .values(
                status=_per_task({i: outcomes[i][0].value for i in chunk}),
                message=_per_task({i: outcomes[i][1] for i in chunk}),
                finished_at=now,
                updated_at=now,
                owner_id=None,
            )
            .returning(tasks.c.id)
        )
        ended.update(result.scalars())
    await mark_schedules_of_tasks(conn, ended)
    return ended


async def retry_later(
    conn: AsyncConnection,
    retries: Mapping[uuid.UUID, tuple[datetime, str]],
    *,
    owner_id: uuid.UUID,
    now: datetime,
) -> set[uuid.UUID]:
    """Send tasks this instance runs, whose attempt failed retryably, back to PENDING for their next
    attempt (task id -> (when, why)): unowned, the next attempt number, no claim counted within it, held by
    "retry" until its back-off ends, so the executors' ordinary claim (and its gates) starts it again.
    Returns the tasks sent back (the others were cancelled or taken over, and are left as they are)."""
    sent: set[uuid.UUID] = set()
    for task_id, (at, reason) in retries.items():
        result = await conn.execute(
            update(tasks)
            .where(_held_running(conn, [task_id], owner_id))
            .values(
                status=TaskStatus.PENDING.value,
                owner_id=None,
                attempts=0,
                attempt=tasks.c.attempt + 1,
                attempt_started_at=None,
                not_before=at,
                held_by=RETRY_HOLD,
                held_reason=reason,
                held_since=now,
                message=reason,
                updated_at=now,
            )
            .returning(tasks.c.id)
        )
        sent.update(result.scalars())
    return sent


async def record_attempts(conn: AsyncConnection, attempts: Sequence[TaskAttempt]) -> None:
    """Keep the ended attempts of tasks with retries (one executemany); the primary key (task, attempt)
    refuses a second record of one attempt."""
    if not attempts:
        return
    await conn.execute(
        insert(task_attempt),
        [
            {
                "task_id": a.task_id,
                "task_filed_at": filed_at(a.task_id),
                "attempt": a.attempt,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
                "status": a.status.value,
                "message": a.message,
                "retryable": a.retryable,
            }
            for a in attempts
        ],
    )


async def held_not_running(
    conn: AsyncConnection, *, owner_id: uuid.UUID, running_here: Collection[uuid.UUID]
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """The tasks (id, rack) `owner_id` holds that are not RUNNING and that it does not run now: cancelled
    while a run of them was cut short (`ix_tasks_held`, only held rows)."""
    stmt = select(tasks.c.id, tasks.c.rack_id).where(
        tasks.c.owner_id == owner_id, tasks.c.status != TaskStatus.RUNNING.value
    )
    return [
        (task_id, rack_id) for task_id, rack_id in await conn.execute(stmt) if task_id not in running_here
    ]


async def release(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID], *, owner_id: uuid.UUID
) -> set[uuid.UUID]:
    """Drop this instance's hold on tasks that are no longer RUNNING (they were cancelled); returns those."""
    released: set[uuid.UUID] = set()
    for chunk in chunked(task_ids):
        result = await conn.execute(
            update(tasks)
            .where(
                tasks.c.id.in_(chunk),
                tasks.c.owner_id == owner_id,
                tasks.c.status != TaskStatus.RUNNING.value,
            )
            .values(owner_id=None)
            .returning(tasks.c.id)
        )
        released.update(result.scalars())
    return released


async def record_changes(conn: AsyncConnection, changes: Iterable[ComponentChange]) -> None:
    """Write what steps changed, one UPDATE per distinct state (the steps of one operation all leave the
    same). A component removed meanwhile is simply not updated, nor one already in that state: a power
    reset leaves its racks on as they were, and rewriting each unchanged row cost a row version and its
    WAL (docs/CAPACITY.md, "Racks of 36 components")."""
    by_state: dict[tuple[PowerState | None, str | None], list[uuid.UUID]] = defaultdict(list)
    for change in changes:
        by_state[change.power_state, change.firmware_version].append(change.component_id)
    for (power_state, firmware_version), component_ids in by_state.items():
        values: dict[str, str] = {}
        if power_state is not None:
            values["power_state"] = power_state.value
        if firmware_version is not None:
            values["firmware_version"] = firmware_version
        if not values:
            continue
        for chunk in chunked(component_ids):
            changed = or_(*(components.c[column] != value for column, value in values.items()))
            await conn.execute(update(components).where(components.c.id.in_(chunk), changed).values(values))


async def record_steps(
    conn: AsyncConnection, records: Sequence[StepRecord], *, owner_id: uuid.UUID
) -> set[uuid.UUID]:
    """Keep what steps recorded before acting, for the tasks still RUNNING here; returns those (a step of
    any other is not to act: its task was cancelled or taken over). A later record of the same step
    replaces the earlier. The fence locks each task's row until the round commits, so a takeover's
    claim, which reads the records in its own transaction (`steps_of`), either comes after and reads
    them, or before, and then nothing is kept here."""
    held = await fence(conn, {record.task_id for record in records}, owner_id=owner_id)
    kept = [record for record in records if record.task_id in held]
    for record in kept:
        await conn.execute(
            delete(task_step_state).where(
                task_step_state.c.task_id == record.task_id,
                of_tasks(conn.dialect.name, task_step_state.c.task_filed_at, [record.task_id]),
                task_step_state.c.attempt == record.attempt,
                task_step_state.c.component_id == record.component_id,
            )
        )
    if kept:
        await conn.execute(
            insert(task_step_state),
            [
                {
                    "task_id": r.task_id,
                    "task_filed_at": filed_at(r.task_id),
                    "attempt": r.attempt,
                    "component_id": r.component_id,
                    "recorded": dict(r.values),
                }
                for r in kept
            ],
        )
    return held


async def steps_of(
    conn: AsyncConnection, attempts: Mapping[uuid.UUID, int]
) -> dict[uuid.UUID, dict[uuid.UUID, Mapping[str, str]]]:
    """What the steps of these tasks' attempts (task id -> attempt) recorded, by task and component."""
    found: dict[uuid.UUID, dict[uuid.UUID, Mapping[str, str]]] = defaultdict(dict)
    for chunk in chunked(attempts):
        named = of_tasks(conn.dialect.name, task_step_state.c.task_filed_at, chunk)
        rows = await conn.execute(select(task_step_state).where(task_step_state.c.task_id.in_(chunk), named))
        for row in rows:
            if row.attempt == attempts[row.task_id]:
                found[row.task_id][row.component_id] = row.recorded
    return found


def _per_task(values: Mapping[uuid.UUID, str], else_: ColumnElement[str] | None = None) -> ColumnElement[str]:
    """SQL picking each task's own value by its id (so one UPDATE writes many different values); a task
    not in `values` gets `else_`."""
    return case(values, value=tasks.c.id, else_=else_)


# --- the typed hold's writes at claim time (rackflow.tasks.gates) ------------------------------------


async def hold_back(
    conn: AsyncConnection,
    gate: str,
    holds: Mapping[uuid.UUID, Hold],
    *,
    owner_id: uuid.UUID,
    now: datetime,
) -> None:
    """Undo this instance's claim of tasks `gate` holds (task id -> hold): PENDING again, unowned, the
    claim not counted and the attempt never started (a retry keeps its first attempt's `started_at`),
    held until the hold's end. The claim just made them RUNNING in
    this transaction, so nothing else saw them start. One statement per distinct hold: the held tasks of
    one claim mostly share it."""
    by_hold: dict[Hold, list[uuid.UUID]] = defaultdict(list)
    for task_id, hold in holds.items():
        by_hold[hold].append(task_id)
    for hold, task_ids in by_hold.items():
        for chunk in chunked(task_ids):
            await conn.execute(
                update(tasks)
                .where(_held_running(conn, chunk, owner_id))
                .values(
                    status=TaskStatus.PENDING.value,
                    owner_id=None,
                    attempts=tasks.c.attempts - 1,
                    started_at=case((tasks.c.attempt == 1, None), else_=tasks.c.started_at),
                    attempt_started_at=None,
                    **hold_values(gate, hold, now),
                )
            )


async def record_refusals(conn: AsyncConnection, refusals: Mapping[uuid.UUID, Fail]) -> None:
    """Record on the claimed tasks the start gates refused (task id -> refusal) why, in the claim's
    transaction, so that a takeover ends each as its gate said (`Task.refusal`) should its executor die
    before recording the end; and say it in the message, as the end will, over the first progress message
    the claim wrote (`start`: the task runs no step). Only the claim's own rows are written, which it holds
    locked already: one statement, run for each task (refused tasks are few)."""
    stmt = (
        update(tasks)
        .where(tasks.c.id == bindparam("refused_id", type_=Uuid()))
        .values(
            refusal=bindparam("refused", type_=tasks.c.refusal.type),
            message=bindparam("reason", type_=tasks.c.message.type),
        )
    )
    await conn.execute(
        stmt,
        [
            {"refused_id": task_id, "refused": refusal_json(fail), "reason": fail.reason}
            for task_id, fail in refusals.items()
        ],
    )


async def holds_of(
    conn: AsyncConnection, task_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, tuple[str, datetime]]:
    """Who holds each of these tasks that is still PENDING and held, and until when (`held_by`,
    `not_before`): the executor tells by it whether a hold it wrote is still the one in force, unanswered
    (any answer, a release or a new hold, rewrites `not_before`)."""
    found: dict[uuid.UUID, tuple[str, datetime]] = {}
    for chunk in chunked(task_ids):
        stmt = select(tasks.c.id, tasks.c.held_by, tasks.c.not_before).where(
            tasks.c.id.in_(chunk),
            status_in(tasks.c.status, TaskStatus.PENDING),
            tasks.c.held_by.is_not(None),
            tasks.c.not_before.is_not(None),
        )
        found.update((row.id, (row.held_by, row.not_before)) for row in await conn.execute(stmt))
    return found


async def clear_holds(conn: AsyncConnection, task_ids: Collection[uuid.UUID]) -> None:
    """The claimed tasks start: nothing holds them any more (only those that were held are written)."""
    for chunk in chunked(task_ids):
        await conn.execute(update(tasks).where(tasks.c.id.in_(chunk)).values(NOT_HELD))


def _held_by(gate: str) -> list[ColumnElement[bool]]:
    """The tasks `gate` holds until a time (PENDING, or WAITING in their rack's queue: a task the rollout
    gate holds may be, `store.rollouts.hold_unstarted`)."""
    return [
        status_in(tasks.c.status, TaskStatus.PENDING, TaskStatus.WAITING),
        tasks.c.held_by == gate,
        tasks.c.not_before.is_not(None),
    ]


async def release_held(
    conn: AsyncConnection,
    gate: str,
    *,
    run_id: uuid.UUID | None = None,
    task_id: uuid.UUID | None = None,
) -> list[ReleasedHold]:
    """Let every task `gate` holds (of the run `run_id`, or the task `task_id`, when given) be claimed
    again (and gated again), after what it decides by changed: a freeze shortened or deleted, a budget
    raised or deleted, or a halted rollout resumed must not keep its tasks waiting for the old end or
    back-off; those it let go (for the audit of a look again: `audit.decisions`). It waits for the rows
    another transaction holds, unless given `run_id`: a resume holds its run's row, so it skips the run's
    tasks a claim holds (`unclaimed`), and that claim's rollout gate lets them go."""
    held = _held_by(gate)
    if task_id is not None:
        held.append(tasks.c.id == task_id)
    if run_id is not None:
        held = [unclaimed(conn, *held, tasks.c.run_id == run_id)]
    stmt = update(tasks).where(*held).values(not_before=None)
    returned = stmt.returning(tasks.c.id, tasks.c.rack_id, tasks.c.run_id, tasks.c.held_reason)
    return [
        ReleasedHold(row.id, row.rack_id, row.run_id, row.held_reason or "")
        for row in await conn.execute(returned)
    ]


async def held_past(conn: AsyncConnection, gate: str, now: datetime) -> list[tuple[InLine, datetime]]:
    """The tasks `gate` holds past `now`, each as the gates' looks read a task (`InLine`) with its hold's
    end: what a gate asks again whether it still holds them so long (`rackflow.tasks.gates.LooksAgain`)."""
    stmt = select(
        tasks.c.id, tasks.c.rack_id, tasks.c.operation, tasks.c.ignore_windows, tasks.c.not_before
    ).where(*_held_by(gate), tasks.c.not_before > now)
    return [
        (InLine(row.id, row.rack_id, OperationKind(row.operation), row.ignore_windows), row.not_before)
        for row in await conn.execute(stmt)
    ]


async def release_unclaimed(conn: AsyncConnection, gate: str) -> list[uuid.UUID]:
    """`release_held` for a writer that must not wait for a task's row (it holds rows a claim may wait
    for: a window's change holds runs and racks, `rackflow.tasks.deferrals`): the rows another transaction
    holds are skipped (`unclaimed`); the ids of the tasks `gate` still holds, those it skipped (a claim's:
    its gate may hold the task again from what it read before the caller committed). The caller lets each
    go once it committed (`release_held` with `task_id`, a transaction of its own that holds nothing else
    while it waits for that row), and the executors' look again if it does not live to
    (`rackflow.windows.gate`). SQLite's one writer skips nothing."""
    held = _held_by(gate)
    await conn.execute(update(tasks).where(unclaimed(conn, *held)).values(not_before=None))
    return list((await conn.execute(select(tasks.c.id).where(*held))).scalars())
