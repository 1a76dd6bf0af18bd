"""The schedules' runs: a firing's run recorded, decided (approval) and written back; each schedule's
history capped, and old runs pruned; the reads of a schedule's runs and of their outcomes (the run list,
the runs grid, a run's page).

Apart from `store.schedules`, because the runs' history lives by rules of its own: it grows with every
firing, so each schedule keeps its newest RUNS_KEPT_PER_SCHEDULE (`cap_runs`, which looks only at
`prune_at`) and the retention prunes the rest; and on PostgreSQL it is partitioned by week of the slot
(`store.run_partitions`), so its reads are bounded to the partitions that can hold the runs, by their
slots or by their schedule's `runs_since` (`in_their_weeks`). It imports `store.schedules` for the row
conversions (`run_from_row`, the outcomes' JSON), never the reverse.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncGenerator, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    ARRAY,
    ColumnElement,
    Row,
    Select,
    Update,
    Uuid,
    and_,
    any_,
    bindparam,
    case,
    delete,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy import cast as cast_
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.selectable import TableValuedAlias

from rackflow.domain.approvals import RunApproval
from rackflow.domain.firing import NOT_COUNTED_STATES
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import (
    ROLLOUT_LIVE_STATES,
    Outcome,
    Run,
    RunState,
    Schedule,
    ScopeOutcome,
    Trigger,
    kept_settled,
)
from rackflow.domain.tasks import TaskStatus
from rackflow.frozen import quick_init
from rackflow.store import run_partitions, scope_removals
from rackflow.store.db import Database, chunked, in_id_order
from rackflow.store.dialect import (
    POSTGRESQL,
    for_update,
    insert_rows,
    keys_table,
    past_newest,
    skip_locked,
    some_element_holds,
    update_rows,
)
from rackflow.store.paging import Key, after_key, count_capped, up_to_key
from rackflow.store.retention import PRUNE_CHUNK, drop_past_weeks, prune_older
from rackflow.store.schedules import (
    Tally,
    micros_to,
    outcome_counts_to_json,
    outcome_from_json,
    outcomes_to_json,
    rollout_to,
    run_from_row,
    tally_from_json,
)
from rackflow.store.streak_checks import mark_schedules, mark_schedules_of_runs
from rackflow.store.tables import racks, task_schedule, task_schedule_run, task_schedule_scope, tasks
from rackflow.store.tasks import statuses as task_statuses

RUNS_KEPT_PER_SCHEDULE = 100
# A schedule's history is pruned back to RUNS_KEPT_PER_SCHEDULE once a firing takes its run count to its
# `prune_at`, from PRUNE_AT to CAP_MARGIN more, so one firing in 10 to 19 looks for its oldest runs, not
# each: on PostgreSQL that look opens the partitions of the runs it may be in (`store.run_partitions`).
# Every read shows the newest RUNS_KEPT_PER_SCHEDULE alone (`_within_the_cap`), so the runs kept past them
# until the next prune are never seen.
CAP_MARGIN = 10
PRUNE_AT = RUNS_KEPT_PER_SCHEDULE + CAP_MARGIN
# Runs never pruned however old, by the cap or the retention: a running one's firing may yet write its
# outcomes back (an approved run goes running however many firings were skipped while it waited), a live
# rollout's run drives it, and one awaiting approval may yet start.
OPEN_STATES: tuple[RunState, ...] = ("running", *ROLLOUT_LIVE_STATES, "awaiting_approval")


# --- firings recorded, decided and written back --------------------------------------------------


@quick_init
@dataclass(frozen=True)
class NewRun:
    """A firing to record in the transaction that claims it (phase 1): "running" until its write-back; a
    rollout's is recorded "rolling" with every scope's outcome (or "skipped", with the reason)."""

    run_id: uuid.UUID
    schedule_id: uuid.UUID
    fired_at: datetime
    trigger: Trigger
    scheduled_for: datetime | None = None
    owner_id: uuid.UUID | None = None
    state: RunState = "running"
    outcomes: Sequence[ScopeOutcome] = ()
    rollout: RolloutPolicy | None = None
    reason: str = ""
    approval: RunApproval | None = None
    late_by: timedelta | None = None  # a missed run's
    request_id: str | None = None  # a manual one's, from its caller (`run_of_request`)


def owned(state: RunState, owner_id: uuid.UUID | None) -> uuid.UUID | None:
    """The owner a run in `state` records of the instance `owner_id` that fires or starts it: that one for
    a "running" run, whose tasks it submits and which it writes back (the sweep interrupts the run once
    its heartbeat lapses, `dispatch.mark_abandoned_runs`); none for any other, a "rolling" one included:
    every instance's rollout driver steps a rollout, so no one instance's heartbeat vouches for it.

    So a run that leaves "running" leaves its owner too, in the write that moves it (`in_state`): nothing
    reads an owner then (the sweep looks only at running runs, by `ix_task_schedule_run_running`, and no
    API shows it), but a completed run naming an instance would tell an operator reading the rows that it
    still answers for it. Rows written by releases before this rule was kept may still carry an owner
    after they ended (docs/OPERATIONS.md, "Several instances on one database"); no migration rewrites them."""
    return owner_id if state == "running" else None


def in_state(state: RunState) -> dict[str, Any]:
    """The columns a write moving an existing run to `state` sets, whatever moves it (the write-back, the
    sweep, an approval's decision, a rollout's step, halt, resume or cancel): the state, and for any state
    but "running" no owner (`owned`). A write that leaves a run "running" (a scope settled before its
    write-back, `store.rollouts.settle_scopes`) keeps the owner the sweep reads; one that starts a run
    running with an owner sets it besides (`decide_awaiting`).

    The owner is cleared in the same statement, so the write-back costs no statement more; nor an index
    entry: the owner's one index, `ix_task_schedule_run_running`, holds only running runs, which a run
    leaving "running" leaves anyway (its state is in that index's predicate, so such an update is never
    HOT, owner or no owner)."""
    if state == "running":
        return {"state": state}
    return {"state": state, "owner_id": None}


async def insert_runs(db: Database, conn: AsyncConnection, runs: Sequence[NewRun]) -> set[uuid.UUID]:
    """Record firings (one statement); returns the ids of those recorded.

    A dispatched firing whose slot (schedule, `scheduled_for`) is recorded already is left out: the unique
    index `uq_task_schedule_run_slot_by_time` holds "once per tick" whatever code path tries a second time,
    and the caller fires only what was recorded. So is a second live rollout of one schedule
    (`uq_task_schedule_run_live_rollout`).
    """
    if not runs:
        return set()
    late = run_partitions.late_slots((r.scheduled_for for r in runs), runs[0].fired_at)
    if late and db.is_postgres:  # a late slot's week, should it have been dropped
        await conn.run_sync(run_partitions.ensure_weeks_for, late)
    insert, values = insert_rows(
        db.dialect,
        task_schedule_run,
        [
            {
                "id": r.run_id,
                "schedule_id": r.schedule_id,
                "fired_at": r.fired_at,
                "scheduled_for": r.scheduled_for,
                "trigger": r.trigger,
                "state": r.state,
                "outcomes": outcomes_to_json(r.outcomes),
                "outcome_counts": outcome_counts_to_json(r.outcomes),
                "owner_id": owned(r.state, r.owner_id),
                "rollout": rollout_to(r.rollout),
                "reason": r.reason,
                **_approval_columns(r.state, r.approval),
                "late_by_us": micros_to(r.late_by),
                "request_id": r.request_id,
            }
            for r in runs
        ],
        new_only=True,
    )
    result = await conn.execute(insert.returning(task_schedule_run.c.id), values)
    recorded = set(result.scalars())
    counted = {r.schedule_id for r in runs if r.run_id in recorded and r.state not in NOT_COUNTED_STATES}
    await mark_schedules(conn, counted)  # a run finished at birth (nothing submitted) may end a streak
    return recorded


async def run_of_request(conn: AsyncConnection, schedule_id: uuid.UUID, request_id: str) -> Run | None:
    """The run of `schedule_id` that a manual trigger or retry with `request_id` fired, if it is kept.

    Read with the unique index of (schedule, request id) (migration 0049). Only manual runs carry one, and
    they have no slot: `scheduled_for IS NULL` prunes the read to the DEFAULT partition on PostgreSQL."""
    run = task_schedule_run.c
    stmt = select(task_schedule_run).where(
        run.schedule_id == schedule_id, run.request_id == request_id, run.scheduled_for.is_(None)
    )
    row = (await conn.execute(stmt)).first()
    return run_from_row(row) if row is not None else None


def _approval_columns(state: RunState, approval: RunApproval | None) -> dict[str, object]:
    """A run's approval, and the time the expiry sweep looks for while (only while) it awaits approval."""
    return {
        "approval": approval.to_json() if approval is not None else None,
        "approval_expires_at": approval.expires_at
        if approval is not None and state == "awaiting_approval"
        else None,
    }


async def awaiting_runs(
    conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, uuid.UUID]:
    """Each schedule's run awaiting approval (at most one: `uq_task_schedule_run_awaiting`)."""
    run = task_schedule_run.c
    found: dict[uuid.UUID, uuid.UUID] = {}
    for chunk in chunked(list(schedule_ids)):
        stmt = select(run.schedule_id, run.id).where(
            run.schedule_id.in_(chunk), run.state == "awaiting_approval"
        )
        found.update({row.schedule_id: row.id for row in await conn.execute(stmt)})
    return found


async def decide_awaiting(
    conn: AsyncConnection,
    run: Run,
    state: RunState,
    approval: RunApproval,
    *,
    outcomes: Sequence[ScopeOutcome] | None = None,
    reason: str | None = None,
    started_at: datetime | None = None,
    owner_id: uuid.UUID | None = None,
) -> bool:
    """Move `run` (as read, awaiting approval) on: to `state` with `approval` (and, given, its outcomes and
    reason), or, with `state` "awaiting_approval", only record one more approver. Conditional on the run
    still awaiting approval, so of two instances or two approvers deciding at once exactly one does;
    False: the run no longer awaited approval, and nothing was written. The schedule's failing streak is
    marked to be looked at again. `started_at` (the database's clock), given for a run moved to "running"
    or "rolling": when it started, which the stuck-run sweep counts its age from, and `owner_id` with it,
    the instance that starts it (None: none), whose heartbeat the sweep checks
    (`dispatch.mark_abandoned_runs`) rather than the firing instance's, which may have died since;
    recorded on a "running" run only (`owned`). The UPDATE is bounded to the run's partition by its own
    slot (`run_partitions.of_slots`), so it finds the run whoever made its id."""
    values: dict[str, object] = {**in_state(state), **_approval_columns(state, approval)}
    if started_at is not None:
        values["started_at"] = started_at
        values["owner_id"] = owned(state, owner_id)
    if outcomes is not None:
        values["outcomes"] = outcomes_to_json(outcomes)
        values["outcome_counts"] = outcome_counts_to_json(outcomes)
    if reason is not None:
        values["reason"] = reason
    stored = task_schedule_run.c
    result = await conn.execute(
        update(task_schedule_run)
        .where(
            stored.id == run.id,
            stored.state == "awaiting_approval",
            await run_partitions.of_slots(conn, [run.scheduled_for]),
        )
        .values(values)
    )
    if not result.rowcount:
        return False
    await mark_schedules(conn, [run.schedule_id])  # store.streak_checks
    return True


async def claim_expired_approvals(
    db: Database, conn: AsyncConnection, now: datetime, limit: int
) -> list[Run]:
    """Up to `limit` runs awaiting approval past their expiry, locked (SKIP LOCKED on PostgreSQL, so
    instances share them) until the caller's transaction marks them expired; served by the partial index
    `ix_task_schedule_run_approval_expires_at`."""
    run = task_schedule_run.c
    stmt = (
        select(task_schedule_run)
        .where(run.state == "awaiting_approval", run.approval_expires_at <= now)
        .order_by(run.approval_expires_at, run.id)
        .limit(limit)
    )
    return [run_from_row(row) for row in (await conn.execute(db.skip_locked(stmt))).all()]


async def complete_runs(
    conn: AsyncConnection, outcomes_by_run: Mapping[uuid.UUID, Sequence[ScopeOutcome]]
) -> set[uuid.UUID]:
    """Mark runs completed with their per-scope outcomes (one statement, `update_rows`); the runs it
    completed, all but those deleted since with their schedule (a manual firing's caller answers with its
    run as it was last recorded, `schedules.service.ScheduleService.fired_report`). A run another
    instance's sweep marked "interrupted" meanwhile (its owner's heartbeat lapsed while the write-back was
    retried) is completed too: the firing did end, and its outcomes name the tasks it submitted.

    A scope settled since the submit keeps what settled it (`kept_settled`): a window's change or the
    rollout gate that ended its task wrote that into the run, naming the task (`store.rollouts.
    settle_scopes`), where phase 1 wrote no task. So the statement writes only runs whose outcomes name
    none; only when it wrote fewer than all (rare) are the batch's runs locked, read and merged again, so
    the drain's write-back costs no statement more (docs/PERFORMANCE.md).

    On PostgreSQL the statement is bounded to the runs' partitions (`run_partitions.of_runs`: planning the
    UPDATE over a year of weeks took the drain's write-back about 350 ms), and returns each run's
    schedule, whose failing streak is marked from that (`mark_schedules`) rather than by a look-up of the
    runs by id. A run the bound misses (an approved run an instance of the previous release recorded, its
    id not its slot's) is written by the second pass, which finds it unbounded."""
    if not outcomes_by_run:
        return set()
    run = task_schedule_run.c
    name_no_task = ~some_element_holds(conn.dialect.name, run.outcomes, "task_id")
    stmt, params = _completions(conn, outcomes_by_run)
    stmt = stmt.where(name_no_task, await run_partitions.of_runs(conn, outcomes_by_run))
    returning = conn.dialect.name == POSTGRESQL  # SQLite runs it as an executemany, which returns nothing
    result = await conn.execute(stmt.returning(run.id, run.schedule_id) if returning else stmt, params)
    written: dict[uuid.UUID, uuid.UUID] = {row.id: row.schedule_id for row in result} if returning else {}
    completed = set(outcomes_by_run)
    if (len(written) if returning else result.rowcount) < len(outcomes_by_run):
        settled, completed = await _complete_settled(conn, outcomes_by_run, written if returning else None)
        written |= settled
    if returning:
        await mark_schedules(conn, set(written.values()))  # store.streak_checks
    else:
        await mark_schedules_of_runs(conn, outcomes_by_run)
    return completed


def _completions(
    conn: AsyncConnection, outcomes_by_run: Mapping[uuid.UUID, Sequence[ScopeOutcome]]
) -> tuple[Update, Any]:
    rows = [
        {
            "id": run_id,
            "outcomes": outcomes_to_json(outcomes),
            "outcome_counts": outcome_counts_to_json(outcomes),
        }
        for run_id, outcomes in outcomes_by_run.items()
    ]
    return update_rows(conn.dialect.name, task_schedule_run, "id", rows, in_state("completed"))


async def _complete_settled(
    conn: AsyncConnection,
    outcomes_by_run: Mapping[uuid.UUID, Sequence[ScopeOutcome]],
    written: Collection[uuid.UUID] | None,
) -> tuple[dict[uuid.UUID, uuid.UUID], set[uuid.UUID]]:
    """`complete_runs` for the runs whose outcomes name tasks already, and for those its statement did not
    reach (not in `written`; None: it reached every run whose outcomes name none): under their rows'
    locks (id order, as `store.rollouts.lock_runs`), what was settled merged into the write-back
    (`kept_settled`), each run's partition bounded by its own slot. Returns the schedule of each run
    written here (PostgreSQL; empty on SQLite), and every run of `outcomes_by_run` found, which the two
    statements completed (the others were deleted)."""
    run = task_schedule_run.c
    returning = conn.dialect.name == POSTGRESQL
    completed: dict[uuid.UUID, uuid.UUID] = {}
    found: set[uuid.UUID] = set()
    for chunk in chunked(in_id_order(outcomes_by_run)):
        stmt = select(run.id, run.outcomes, run.scheduled_for).where(run.id.in_(chunk))
        stored = await run_partitions.read_runs(
            conn, chunk, stmt, lambda s: for_update(conn.dialect.name, s.order_by(run.id))
        )
        found.update(row.id for row in stored)
        merged = {
            row.id: kept_settled(outcomes_by_run[row.id], [outcome_from_json(o) for o in row.outcomes])
            for row in stored
            if any(o.get("task_id") for o in row.outcomes) or (written is not None and row.id not in written)
        }
        if not merged:
            continue
        update_merged, params = _completions(conn, merged)
        slots = [row.scheduled_for for row in stored if row.id in merged]
        update_merged = update_merged.where(await run_partitions.of_slots(conn, slots))
        if returning:
            result = await conn.execute(update_merged.returning(run.id, run.schedule_id), params)
            completed |= {row.id: row.schedule_id for row in result}
        else:
            await conn.execute(update_merged, params)
    return completed, found


# --- the cap and the retention -------------------------------------------------------------------


def counted_with_run(schedule: Schedule) -> int | None:
    """The schedule's run count once a firing has added its run, as the firing's advance writes it (None
    stays not known). The prune that follows at `prune_at` takes off what it deleted (`cap_runs`)."""
    if schedule.run_count is None:
        return None
    return schedule.run_count + 1


def since_with_run(schedule: Schedule, slot: datetime | None) -> datetime | None:
    """The schedule's `runs_since` once a firing has added its run of `slot` (None: a run without one, in
    the DEFAULT partition, which every look and read takes in): lowered to the slot if that is earlier,
    which a schedule's advancing slots never are. A schedule known to have no run yet (`run_count` 0: every
    schedule made since migration 0038, until it fires) takes its first slot, so its reads and looks are
    bounded from its first firing on. Not known stays not known: a schedule with runs from before
    migration 0047 may have earlier ones."""
    if slot is None:
        return schedule.runs_since
    if schedule.runs_since is None:
        return slot if schedule.run_count == 0 else None
    return min(schedule.runs_since, slot)


def prune_at(schedule_id: uuid.UUID) -> int:
    """The run count at which the schedule's firing looks for the runs past its newest 100: PRUNE_AT plus
    a part of CAP_MARGIN its id picks (the id's last bits are random). Staggered, because a fleet made at
    once fires in step: at one count for all, every firing of one day's burst would look (2 to 3 times a
    firing's cost); so a tenth to a nineteenth of them do, any day."""
    return PRUNE_AT + schedule_id.int % CAP_MARGIN


def may_pass_cap(schedule: Schedule) -> bool:
    """Whether a firing of the schedule, as claimed (before its run), takes it to its `prune_at` or may:
    its count with the firing's run is there, or is not known."""
    return schedule.run_count is None or schedule.run_count + 1 >= prune_at(schedule.id)


async def cap_runs(
    conn: AsyncConnection, fired: Collection[Schedule], *, spare: Collection[uuid.UUID] = ()
) -> None:
    """The run cap after firings of these schedules (each as claimed, before its firing's run): their
    history pruned to the newest RUNS_KEPT_PER_SCHEDULE (`prune_runs`, which leaves the runs of `spare`)
    where the firing took it to its `prune_at` or may have (`may_pass_cap`), each such count lowered by the
    runs deleted, and the runs of those whose count was not known counted.

    A firing short of `prune_at` looks at nothing: the look walked the schedule's index of runs at every
    firing, about a tenth of PostgreSQL's CPU a firing on an empty database (docs/PERFORMANCE.md, "The run
    cap's look skipped under the cap"), and with the runs partitioned it opens every partition. The count
    is never below the runs kept (a firing's claim locks the schedule's row before its advance writes the
    count, and the decrement here waits for that lock), so no schedule passes `prune_at` without the look,
    with one exception: the firings of an instance still running a release before migration 0038 (a
    rolling upgrade) add no count, so a schedule they fired may keep up to that many runs more until its
    count reaches `prune_at`. A count above the runs kept (the retention deletes runs without counting) only
    brings the look forward.
    """
    looked = [s for s in fired if may_pass_cap(s)]
    since = {s.id: s.runs_since for s in looked}
    pruned = await prune_runs(conn, [s.id for s in looked], spare=spare, since=since)
    if pruned:
        # Lowered, not written: the count and the bound are the rows' own (another firing of the schedule
        # may have advanced them since this one's claim). The count's value is what the look deleted.
        rows = [
            {
                "id": schedule_id,
                "run_count": pruned[schedule_id].deleted,
                "runs_since": pruned[schedule_id].since,
            }
            for schedule_id in in_id_order(pruned)
        ]
        await conn.execute(*update_rows(conn.dialect.name, task_schedule, "id", rows, combined=_LOOKED))
    # Counted anew: those whose count was not known, and those the look found at `prune_at` by count but with
    # nothing to delete (runs the retention deleted, or open ones), which would otherwise look every firing.
    recount = [s.id for s in fired if s.run_count is None] + [s.id for s in looked if s.id not in pruned]
    run = task_schedule_run.c
    for chunk in chunked(in_id_order(set(recount))):
        counted = (
            select(run.schedule_id, func.count()).where(run.schedule_id.in_(chunk)).group_by(run.schedule_id)
        )
        counts: dict[uuid.UUID, int] = {schedule_id: n for schedule_id, n in await conn.execute(counted)}
        rows = [{"id": i, "run_count": counts.get(i, 0)} for i in chunk]
        await conn.execute(*update_rows(conn.dialect.name, task_schedule, "id", rows))


async def prune_runs(
    conn: AsyncConnection,
    schedule_ids: Collection[uuid.UUID],
    keep: int = RUNS_KEPT_PER_SCHEDULE,
    *,
    spare: Collection[uuid.UUID] = (),
    since: Mapping[uuid.UUID, datetime | None] | None = None,
) -> dict[uuid.UUID, Pruned]:
    """Delete each schedule's runs beyond its newest `keep`, but never an open one (`OPEN_STATES`) nor one
    of `spare` (the runs a write-back has just completed: an approved run fired before the skipped firings
    that came while it waited, and would otherwise go in the write-back that records its outcomes): one
    query per chunk of schedules finds them, and only if there are any, one more deletes them by id.
    Returns what went, by schedule (those that lost none left out).

    A run another transaction holds is left for a later look (`FOR UPDATE SKIP LOCKED`; its schedule's count
    is lowered only by the runs deleted, so it still counts, and the bound stays below its slot): the
    firings that prune hold their schedules' rows, and a run's row comes before its schedule's (the lock
    order atop `rackflow.tasks.executor`), so a prune that waited for one could wait for a retry of that
    run, or a DeleteSchedule holding it, that waits for the schedule. Still one statement, whose locking
    subquery plans the runs' partitions once more: about 0.3 ms more a prune's DELETE (20 runs of a
    schedule, 2,800 runs a week's partition), paid only by the firings that look past the cap.

    `since`: each schedule's `runs_since` (missing or None: not known). On PostgreSQL the find reads only
    the runs' partitions from there on and the DEFAULT one (`run_partitions.from_slot`), not all of them:
    with a year of partitions the look opened each, about 30 µs apiece a schedule (docs/PERFORMANCE.md).

    The find is `dialect.past_newest`: on PostgreSQL it walks ix_task_schedule_run_schedule_id_fired_at
    once per schedule, and reads from the table only the runs past the newest `keep`, where a window over
    `schedule_id IN (…)` was planned as a full scan of the run table while it grew from empty, once per
    dispatched batch.
    """
    run = task_schedule_run.c
    found_since = since or {}
    pruned: dict[uuid.UUID, Pruned] = {}
    for chunk in chunked(list(schedule_ids)):
        bounds = [found_since.get(schedule_id) or SINCE_NOT_KNOWN for schedule_id in chunk]
        older = past_newest(
            conn.dialect.name,
            select(run.id, run.state, run.schedule_id, run.scheduled_for),
            run.schedule_id,
            chunk,
            newest=run.fired_at,
            tiebreak=run.id,
            keep=keep,
            bounded=(bounds, run.scheduled_for.type, run_partitions.from_slot),
        )
        candidates = (await conn.execute(select(older.subquery("candidates")))).all()
        doomed = [c for c in candidates if c.state not in OPEN_STATES and c.id not in spare]
        doomed_ids: set[uuid.UUID] = set()
        for rows in chunked(doomed):
            # Bounded to the partitions of the runs' own slots (`run_partitions.of_slots`), not every one.
            slots = await run_partitions.of_slots(conn, [row.scheduled_for for row in rows])
            free = skip_locked(
                conn.dialect.name, select(run.id).where(run.id.in_([row.id for row in rows]), slots)
            )
            deleting = delete(task_schedule_run).where(run.id.in_(free.scalar_subquery()), slots)
            doomed_ids.update((await conn.execute(deleting.returning(run.id))).scalars())
        for schedule_id, found in _by_schedule(candidates).items():
            runs = [c for c in found if c.id in doomed_ids]
            if runs:
                left = [c.scheduled_for for c in found if c.id not in doomed_ids]
                pruned[schedule_id] = Pruned(len(runs), _raised_since(runs, left))
    return pruned


# How the cap's look changes a schedule's count and bound (`update_rows`): the count lowered by the runs
# deleted (NULL stays, counted after), the bound raised to the look's, never lowered (None: kept).
_LOOKED: dict[str, Callable[[ColumnElement[Any], ColumnElement[Any]], ColumnElement[Any]]] = {
    "run_count": lambda count, deleted: count - deleted,
    "runs_since": lambda since, raised: case(
        (raised.is_(None), since), (or_(since.is_(None), since < raised), raised), else_=since
    ),
}


@dataclass(frozen=True)
class Pruned:
    """What the cap's look did to one schedule's runs: how many it deleted, and the schedule's new
    `runs_since` (None: none of those it deleted had a slot, so it stays)."""

    deleted: int
    since: datetime | None


# The bound of a schedule whose `runs_since` is not known: before any slot, so every partition is read.
SINCE_NOT_KNOWN = datetime.min.replace(tzinfo=UTC)


def _by_schedule(rows: Sequence[Row[Any]]) -> dict[uuid.UUID, list[Row[Any]]]:
    grouped: dict[uuid.UUID, list[Row[Any]]] = {}
    for row in rows:
        grouped.setdefault(row.schedule_id, []).append(row)
    return grouped


def _raised_since(deleted: Sequence[Row[Any]], left: Sequence[datetime | None]) -> datetime | None:
    """A schedule's `runs_since` after the cap's look deleted `deleted` and left `left` (the slots of the
    runs past its newest it may not delete): the newest slot deleted, as a schedule's runs fire in the order
    of their slots, so none it keeps has an earlier one; held down by an earlier slot left behind."""
    slots: list[datetime] = [row.scheduled_for for row in deleted if row.scheduled_for is not None]
    if not slots:
        return None
    return min([max(slots), *(slot for slot in left if slot is not None)])


async def prune_old_runs(
    db: Database, retention: timedelta, *, chunk: int = PRUNE_CHUNK
) -> AsyncGenerator[int, None]:
    """`--run-retention`: remove the runs (with their outcomes) fired longer than `retention` ago, yielding
    how many went at each step. A run still `running` stays: its firing may yet write its outcomes; so does a
    live (rolling or halted) rollout's: its run drives it; and one awaiting approval, which may yet start.
    The tasks a deleted run submitted stay, naming it (on SQLite unlinked: `tasks.run_id`, migration 0036).

    PostgreSQL (partitioned by week of the slot, `store.run_partitions`): drop each week all older than the
    retention that holds no kept run (one short transaction each), then delete in batches only the old runs
    before the weeks still kept (the DEFAULT partition's: manual runs and those the migration found; and a
    past week's that had to stay): a run in a kept week goes with its week, at most a week past the
    retention. SQLite: delete in batches, oldest first, by ix_task_schedule_run_fired_at_id (`prune_older`).
    """
    run = task_schedule_run.c
    kept: list[datetime | None] = [None]
    if db.is_postgres:
        weeks = drop_past_weeks(
            db,
            retention,
            recent=run_partitions.RECENT,
            past_weeks=run_partitions.past_weeks,
            drop=run_partitions.drop_partition,
            kept_floor=run_partitions.kept_floor,
            floor=kept,
        )
        async with contextlib.aclosing(weeks):
            async for dropped in weeks:
                yield dropped
    floor = kept[0]

    def older(cutoff: datetime) -> ColumnElement[bool]:
        conditions = [run.fired_at < cutoff, run.state.not_in(OPEN_STATES)]
        if floor is not None:  # before the weeks kept whole
            conditions.append(or_(run.scheduled_for.is_(None), run.scheduled_for < floor))
        return and_(*conditions)

    chunks = prune_older(
        db,
        task_schedule_run,
        retention,
        older=older,
        order_by=(run.fired_at, run.id),
        chunk=chunk,
        narrow=floor is not None,
    )
    async with contextlib.aclosing(chunks):
        async for deleted in chunks:
            yield deleted


# --- reads, within the cap and the schedule's weeks ----------------------------------------------


async def counted_runs(conn: AsyncConnection, schedules: Sequence[Schedule]) -> dict[uuid.UUID, list[Run]]:
    """Each schedule's newest `pause_after_failed_runs` runs that count towards it, newest first: fired
    after its `failures_counted_until`, in none of NOT_COUNTED_STATES (missed, skipped, or not approved:
    waiting, rejected, expired). One statement per chunk.

    SELECT * FROM (SELECT run.*, row_number() OVER (PARTITION BY run.schedule_id
                                                    ORDER BY run.fired_at DESC, run.id DESC) AS newer
                   FROM task_schedule_run run
                   JOIN task_schedule ON ... WHERE run.schedule_id IN (:ids)
                   AND run.state NOT IN (:not_counted) AND run.fired_at > failures_counted_until) r
    WHERE newer <= its schedule's pause_after_failed_runs
    """
    run = task_schedule_run.c
    owner = task_schedule.c
    found: dict[uuid.UUID, list[Run]] = {s.id: [] for s in schedules}
    for chunk in chunked(list(found)):
        newer = func.row_number().over(
            partition_by=run.schedule_id, order_by=(run.fired_at.desc(), run.id.desc())
        )
        ranked = (
            select(task_schedule_run, newer.label("newer"), owner.pause_after_failed_runs.label("counted"))
            .select_from(task_schedule_run.join(task_schedule, owner.id == run.schedule_id))
            .where(
                run.schedule_id.in_(chunk),
                *await in_their_weeks(conn, chunk),
                run.state.not_in(NOT_COUNTED_STATES),
                owner.failures_counted_until.is_(None) | (run.fired_at > owner.failures_counted_until),
            )
            .subquery()
        )
        stmt = (
            select(ranked)
            .where(ranked.c.newer <= ranked.c.counted)
            .order_by(ranked.c.schedule_id, ranked.c.newer)
        )
        for row in (await conn.execute(stmt)).all():
            found[row.schedule_id].append(run_from_row(row))
    return found


async def recent_runs(
    conn: AsyncConnection, schedule_ids: Collection[uuid.UUID], per_schedule: int
) -> dict[uuid.UUID, list[Run]]:
    """Each schedule's newest `per_schedule` runs without their outcomes (`Run.outcomes` empty, as
    `run_heads`), newest first, one statement per chunk of schedules: a page of the schedule list shows a
    strip of them per row, each pip's verdict counted from the run's `outcome_counts` and its tasks by
    status, not from 12 × 50 runs' outcomes (10,000 each for a schedule of 10,000 racks).

    PostgreSQL walks the schedule's index of runs for each schedule, newest first, in the weeks that can
    hold its runs (`in_their_weeks`), and stops at `per_schedule`:

        SELECT r.* FROM unnest(:ids) AS lookup(key)
        JOIN LATERAL (SELECT … FROM task_schedule_run WHERE schedule_id = lookup.key AND <weeks>
                      ORDER BY fired_at DESC, id DESC LIMIT :per_schedule) AS r ON true

    Ranking every run of the page's schedules with a window read all their runs (up to 119 each, the cap's
    margin): 11.5 ms against 4.5 for 50 schedules at a year of weeks (docs/PERFORMANCE.md). SQLite, which
    has no LATERAL, ranks them so:

        SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY schedule_id
                                                    ORDER BY fired_at DESC, id DESC) AS newer
                       FROM task_schedule_run WHERE schedule_id IN (:ids)) ranked
        WHERE newer <= :per_schedule
    """
    run = task_schedule_run.c
    found: dict[uuid.UUID, list[Run]] = {schedule_id: [] for schedule_id in schedule_ids}
    for chunk in chunked(list(found)):
        if conn.dialect.name == POSTGRESQL:
            lookup = keys_table(chunk, run.schedule_id, "lookup")
            newest = (
                select(*_RUN_HEAD)
                .where(run.schedule_id == lookup.c.key, *await in_their_weeks(conn, chunk))
                .order_by(*(column.desc() for column in RUN_ORDER))
                .limit(per_schedule)
                .lateral("newest")
            )
            stmt = select(newest).select_from(lookup.join(newest, true()))
        else:
            newer = func.row_number().over(
                partition_by=run.schedule_id, order_by=[c.desc() for c in RUN_ORDER]
            )
            ranked = select(*_RUN_HEAD, newer.label("newer")).where(run.schedule_id.in_(chunk)).subquery()
            stmt = select(ranked).where(ranked.c.newer <= per_schedule)
        for row in (await conn.execute(stmt)).all():
            found[row.schedule_id].append(run_from_row(row))
    for runs in found.values():
        runs.sort(key=lambda r: (r.fired_at, r.id), reverse=True)
    return found


# The run list's order, newest first (each column descending); a page token holds its values.
RUN_ORDER = (task_schedule_run.c.fired_at, task_schedule_run.c.id)


def _newest_runs_first(schedule_id: uuid.UUID) -> Select[Any]:
    return (
        select(task_schedule_run)
        .where(task_schedule_run.c.schedule_id == schedule_id)
        .order_by(task_schedule_run.c.fired_at.desc(), task_schedule_run.c.id.desc())
    )


async def list_runs(
    conn: AsyncConnection,
    schedule_id: uuid.UUID,
    *,
    offset: int = 0,
    limit: int | None = None,
    after: Key | None = None,
    outcomes: bool = True,
) -> tuple[list[Run], int]:
    """The schedule's runs, newest first (after the key `after` of RUN_ORDER if given), and how many
    there are before paging (`paging.count_capped`); without `outcomes`, each run without its outcomes
    (`Run.outcomes` empty), as `run_heads` reads them. Only the newest RUNS_KEPT_PER_SCHEDULE
    (`_within_the_cap`)."""
    total, within = await _within_the_cap(conn, schedule_id)
    page = _newest_runs_first(schedule_id).where(*after_key(RUN_ORDER, after, descending=True), *within)
    if not outcomes:
        page = page.with_only_columns(*_RUN_HEAD)
    rows = (await conn.execute(page.offset(offset).limit(limit))).all()
    return [run_from_row(row) for row in rows], total


async def run_heads(conn: AsyncConnection, schedule_id: uuid.UUID, limit: int) -> tuple[list[Run], int]:
    """The schedule's newest `limit` runs without their outcomes (`Run.outcomes` empty), newest first, and
    how many runs it has (`count_capped`): the runs grid's columns, whose outcomes it reads per page of
    racks (`grid_outcomes`) — a firing of 10,000 racks carries 10,000 outcomes."""
    total, within = await _within_the_cap(conn, schedule_id)
    page = _newest_runs_first(schedule_id).with_only_columns(*_RUN_HEAD).where(*within).limit(limit)
    return [run_from_row(row) for row in (await conn.execute(page)).all()], total


async def _within_the_cap(
    conn: AsyncConnection, schedule_id: uuid.UUID
) -> tuple[int, list[ColumnElement[bool]]]:
    """How many runs the schedule shows (at most RUNS_KEPT_PER_SCHEDULE), and the conditions that keep a
    read of them to its newest RUNS_KEPT_PER_SCHEDULE: the weeks that can hold its runs (`in_their_weeks`);
    and up to the last of them in RUN_ORDER, read by the schedule's index of runs, once it has more. The
    runs past them are the margin the cap lets a schedule keep until its next prune (`cap_runs`): deleted
    already, as far as anyone can see."""
    weeks = await in_their_weeks(conn, [schedule_id])
    of_schedule = [task_schedule_run.c.schedule_id == schedule_id, *weeks]
    total = await count_capped(conn, task_schedule_run, of_schedule)
    if total <= RUNS_KEPT_PER_SCHEDULE:
        return total, weeks
    last_kept = (
        _newest_runs_first(schedule_id)
        .with_only_columns(*RUN_ORDER)
        .where(*weeks)
        .offset(RUNS_KEPT_PER_SCHEDULE - 1)
    )
    edge = (await conn.execute(last_kept.limit(1))).one()
    return RUNS_KEPT_PER_SCHEDULE, [*weeks, *up_to_key(RUN_ORDER, tuple(edge), descending=True)]


async def in_their_weeks(
    conn: AsyncConnection, schedule_ids: Collection[uuid.UUID]
) -> list[ColumnElement[bool]]:
    """On PostgreSQL, the condition that keeps a read of these schedules' runs to the weeks that can hold
    them: the DEFAULT partition, and the weeks from the earliest of their `runs_since` on
    (`run_partitions.from_slot`), a value PostgreSQL prunes by as it plans. Without it a read by schedule
    plans every week's partition: about 10 ms more a read at a year of weeks (docs/PERFORMANCE.md). None
    where one of them has no `runs_since` (not known), and on SQLite. Their `runs_since` is read afresh, by
    key, in the caller's transaction: a `Schedule` read before may hold one a firing has lowered since."""
    if conn.dialect.name != POSTGRESQL or not schedule_ids:
        return []
    stmt = select(task_schedule.c.runs_since).where(task_schedule.c.id.in_(list(schedule_ids)))
    since = list((await conn.execute(stmt)).scalars())
    if not since or any(at is None for at in since):
        return []
    earliest = bindparam("runs_since", min(since), type_=task_schedule_run.c.scheduled_for.type)
    return [run_partitions.from_slot(earliest)]


async def runs_of_schedule(
    conn: AsyncConnection, schedule_id: uuid.UUID, *, lock: bool = False
) -> set[uuid.UUID]:
    """The ids of every run of the schedule (in its weeks: `in_their_weeks`); `lock` locks their rows
    until commit, in id order (`FOR UPDATE`), as DeleteSchedule does before it takes the schedule's row:
    a run's row comes before its schedule's (the lock order atop `rackflow.tasks.executor`). A schedule
    keeps few runs (`RUNS_KEPT_PER_SCHEDULE`, and the open ones past them)."""
    run = task_schedule_run.c
    stmt = (
        select(run.id)
        .where(run.schedule_id == schedule_id, *await in_their_weeks(conn, [schedule_id]))
        .order_by(run.id)
    )
    return set((await conn.execute(for_update(conn.dialect.name, stmt) if lock else stmt)).scalars())


async def run_head(conn: AsyncConnection, run_id: uuid.UUID) -> Run | None:
    """One run without its outcomes (`Run.outcomes` empty): a run's page counts them (`grid_outcomes`).
    Read in its partition (`run_partitions.run_rows`)."""
    stmt = select(*_RUN_HEAD).where(task_schedule_run.c.id == run_id)
    rows = await run_partitions.run_rows(conn, run_id, stmt)
    return run_from_row(rows[0]) if rows else None


# A run's columns but its outcomes (`run_heads`, `run_head`).
_RUN_HEAD = [c for c in task_schedule_run.c if c.key != "outcomes"]


# --- a run's outcomes, and the runs grid ---------------------------------------------------------


def _unnested_outcomes(dialect: str) -> tuple[TableValuedAlias, Callable[[str], ColumnElement[Any]]]:
    """A run's outcomes as rows (`o`, for a FROM beside task_schedule_run), and a field of one as text."""
    run = task_schedule_run.c
    if dialect == POSTGRESQL:
        each = func.jsonb_array_elements(run.outcomes).table_valued("value", name="o")
        return each, lambda key: each.c.value.op("->>")(key)
    each = func.json_each(run.outcomes).table_valued("value", name="o")
    return each, lambda key: func.json_extract(each.c.value, f"$.{key}")


@dataclass(frozen=True)
class OutcomeTask:
    """A run's outcome, and the status and hold of the task it names if that task still exists."""

    outcome: ScopeOutcome
    status: TaskStatus | None
    held_by: str | None
    held_reason: str | None


async def outcomes_with_tasks(
    conn: AsyncConnection, run_ids: Collection[uuid.UUID], start: int = 0, stop: int | None = None
) -> dict[uuid.UUID, list[OutcomeTask]]:
    """The outcomes of these runs in their stored order, each with its task's status and hold, in one
    statement: every outcome, or (one run) those from position `start` up to `stop` (excluded), cut in the
    database so that Python parses only them, and only their tasks read (by primary key): a part of a run
    of more racks than a page of ListTaskScheduleRuns' FULL view carries.

        SELECT run.id, o.value, tasks.status, tasks.held_by, tasks.held_reason
        FROM task_schedule_run run
        JOIN jsonb_array_elements(jsonb_path_query_array(run.outcomes, '$[$a to $b]', {a, b}))
             WITH ORDINALITY o ON true
        LEFT JOIN tasks ON tasks.id = (o.value->>'task_id')::uuid
        WHERE run.id IN (:run_ids) ORDER BY run.id, o.ordinality

    (SQLite: `json_each`, its `key` the position.) On PostgreSQL the path cuts the array before it is
    unnested: filtering the unnested rows by position took 21 ms for 1,000 of 10,000, the path 7 ms."""
    run = task_schedule_run.c
    found: dict[uuid.UUID, list[OutcomeTask]] = {run_id: [] for run_id in run_ids}
    cut = start > 0 or stop is not None
    if conn.dialect.name == POSTGRESQL:
        array: ColumnElement[Any] = run.outcomes
        if cut:
            last = (stop - 1) if stop is not None else 2**31 - 1
            path: ColumnElement[Any] = literal_column("'$[$a to $b]'::jsonpath")
            array = func.jsonb_path_query_array(
                run.outcomes, path, func.jsonb_build_object("a", start, "b", last)
            )
        each = func.jsonb_array_elements(array).table_valued("value", with_ordinality="ordinality", name="o")
        position: ColumnElement[Any] = each.c.ordinality
        task_id: ColumnElement[Any] = cast_(each.c.value.op("->>")("task_id"), Uuid)
        where = []
    else:
        each = func.json_each(run.outcomes).table_valued("value", "key", name="o")
        position = each.c.key
        task_id = func.replace(func.json_extract(each.c.value, "$.task_id"), "-", "")
        where = [position >= start, position < stop] if stop is not None else [position >= start]
    for chunk in chunked(list(run_ids)):
        stmt = (
            select(run.id, each.c.value, tasks.c.status, tasks.c.held_by, tasks.c.held_reason)
            .select_from(task_schedule_run.join(each, true()).outerjoin(tasks, tasks.c.id == task_id))
            .where(run.id.in_(chunk), *where)
            .order_by(run.id, position)
        )
        for row in await conn.execute(stmt):
            status = TaskStatus(row.status) if row.status is not None else None
            outcome = outcome_from_json(_json_object(row.value))
            found[row.id].append(OutcomeTask(outcome, status, row.held_by, row.held_reason))
    return found


def _outcome_rack_id(dialect: str, field: Callable[[str], ColumnElement[Any]]) -> ColumnElement[Any]:
    """An unnested outcome's rack id as the racks table keeps it (SQLite: its 32 hex digits)."""
    if dialect == POSTGRESQL:
        return cast_(field("rack_id"), Uuid)
    return func.replace(field("rack_id"), "-", "")


async def run_rack_page(
    conn: AsyncConnection, run: Run, offset: int, limit: int
) -> list[tuple[ScopeOutcome, str | None]]:
    """A page of the run's outcomes as its page lists them, a rollout's canaries first, then by rack name
    (a rack gone from the inventory by its id), each with its rack's name: the run is unnested and joined
    to the racks in the database, not parsed whole and named rack by rack.

        SELECT o, racks.name FROM task_schedule_run run, jsonb_array_elements(run.outcomes) o
        LEFT JOIN racks ON racks.id = (o->>'rack_id')::uuid WHERE run.id = :id
        ORDER BY o->>'canary' IS NULL, coalesce(racks.name, o->>'rack_id') LIMIT :limit OFFSET :offset

    `run`: the run as read (`run_head`), whose slot bounds the read to its partition
    (`run_partitions.of_slots`)."""
    each, field = _unnested_outcomes(conn.dialect.name)
    rack_id = _outcome_rack_id(conn.dialect.name, field)
    stmt = (
        select(each.c.value.label("outcome"), racks.c.name)
        .select_from(task_schedule_run.join(each, true()).outerjoin(racks, racks.c.id == rack_id))
        .where(task_schedule_run.c.id == run.id, await run_partitions.of_slots(conn, [run.scheduled_for]))
        .order_by(field("canary").is_(None), func.coalesce(racks.c.name, field("rack_id")))
        .offset(offset)
        .limit(limit)
    )
    rows = (await conn.execute(stmt)).all()
    return [(outcome_from_json(_json_object(row.outcome)), row.name) for row in rows]


def _json_object(value: Any) -> dict[str, Any]:
    """An unnested outcome: a dict from psycopg (jsonb), JSON text from SQLite's json_each."""
    return value if isinstance(value, dict) else cast(dict[str, Any], json.loads(value))


@dataclass(frozen=True)
class ShownOutcome:
    """One rack's outcome in one run as a cell of the runs grid shows it (its scope entry, canary mark and
    deadline are not shown)."""

    rack_id: uuid.UUID
    outcome: Outcome
    task_id: uuid.UUID | None
    error: str


@dataclass(frozen=True)
class GridOutcomes:
    """A page of the runs grid: per run, the `Tally` of all its racks (its column's verdict), and the
    outcomes of the page's racks and of racks no longer in scope; the status of each shown outcome's task
    that still exists; and which racks left the scope."""

    tallies: dict[uuid.UUID, Tally]
    shown: dict[uuid.UUID, list[ShownOutcome]]
    statuses: dict[uuid.UUID, TaskStatus]
    left: set[uuid.UUID]  # the racks of these runs no longer in the schedule's scope


async def run_tallies(conn: AsyncConnection, run_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Tally]:
    """Each run's `Tally`, from its `outcome_counts` column (written with its outcomes, migration 0024):
    a column's verdict and a run's bar read 20 small columns, not 20 × 10,000 outcomes.

    A run whose column is empty is counted from its outcomes: either it has none (nothing to read), or the
    release before 0024 wrote them while 0024 was applied under it (a rolling upgrade, docs/OPERATIONS.md,
    "Migrations applied online"), without counts, which would otherwise read as a run of no racks."""
    found: dict[uuid.UUID, Tally] = {run_id: {} for run_id in run_ids}
    uncounted: list[uuid.UUID] = []
    run = task_schedule_run.c
    for chunk in chunked(list(run_ids)):
        stmt = select(run.id, run.outcome_counts).where(run.id.in_(chunk))
        for row in await run_partitions.read_runs(conn, chunk, stmt):  # in their partitions
            found[row.id] = tally_from_json(row.outcome_counts)
            if not row.outcome_counts:
                uncounted.append(row.id)
    for chunk in chunked(uncounted):
        stmt = select(run.id, run.outcomes).where(run.id.in_(chunk))
        for row in await run_partitions.read_runs(conn, chunk, stmt):
            outcomes = [outcome_from_json(o) for o in row.outcomes]
            found[row.id] = tally_from_json(outcome_counts_to_json(outcomes))
    return found


def told_by_its_tasks(tally: Mapping[tuple[str, bool], int], task_counts: Mapping[TaskStatus, int]) -> bool:
    """Whether a run's outcomes are exactly its tasks, one per rack, so that a page of its racks can be
    read from `tasks` by (run_id, rack_id) instead of from its outcome JSON: every rack was submitted with
    a task, and as many tasks name the run as it has racks. A task is submitted with its run's id
    (`uq_tasks_run_id_rack_id`: one per rack) and recorded in the run's outcomes in the transaction that
    writes them back (a rollout step: in the same one); a submitted outcome carries no error
    (`ScopeOutcome`). So the two counts differ whenever the outcomes name a task that is gone (pruned, or
    deleted with its rack: "done" to the grid) or not yet written back — then the JSON is read."""
    return all_tasked(tally) and sum(task_counts.values()) == tally[("submitted", True)]


def all_tasked(tally: Mapping[tuple[str, bool], int]) -> bool:
    """Whether every rack of a run was submitted with a task: the runs `told_by_its_tasks` may find, before
    their tasks are counted."""
    return len(tally) == 1 and tally.get(("submitted", True), 0) > 0


# The cells of a page of the runs grid read from the tasks of some runs, and the racks that left the scope
# (`cells_from_tasks`).
TaskCells = tuple[list[tuple[uuid.UUID, ShownOutcome, TaskStatus]], set[uuid.UUID]]


async def grid_outcomes(
    conn: AsyncConnection,
    schedule_id: uuid.UUID,
    run_ids: Collection[uuid.UUID],
    page_racks: Collection[uuid.UUID],
    task_counts: Mapping[uuid.UUID, Mapping[TaskStatus, int]],
    *,
    tallies: dict[uuid.UUID, Tally] | None = None,
    read_ahead: tuple[Collection[uuid.UUID], TaskCells] | None = None,
    leaving: bool | None = None,
) -> GridOutcomes:
    """What a page of the runs grid shows of these runs of the schedule, given each run's tasks by status
    (`store.rollouts.task_status_counts`): each run's tally (`run_tallies`), and the outcomes of the page's
    racks and of racks no longer in its scope with their tasks' statuses. A run of 10,000 racks carries
    23 MB of outcome JSON a page of 20 runs would unnest (docs/PERFORMANCE.md, issue 29), so a run whose
    outcomes are exactly its tasks (`told_by_its_tasks`, the usual plain firing) is read from `tasks`
    (`cells_from_tasks`); only the others' outcomes are unnested and filtered (`_cells_from_outcomes`).
    Which racks left is asked of the scope table in the database: the scope's 10,000 rack ids are never
    read into Python (sent back as a parameter, and garbage with the page, they cost more than the
    statements).

    Which racks left is asked only when one of the runs may hold one (`scope_removals.may_have_left`: it
    fired at or before the schedule's last scope removal); otherwise none did, and only the page's racks
    are read.

    `tallies`, if read already; `read_ahead`: the cells `cells_from_tasks` read of some runs before their
    tasks were counted (those `all_tasked`), used for the runs among them `told_by_its_tasks`; `leaving`:
    `may_have_left`, if asked already."""
    tallies = tallies if tallies is not None else await run_tallies(conn, run_ids)
    if leaving is None:
        leaving = await scope_removals.may_have_left(conn, schedule_id, run_ids)
    by_tasks = {r for r in run_ids if told_by_its_tasks(tallies[r], task_counts.get(r, {}))}
    by_outcomes = [run_id for run_id in run_ids if run_id not in by_tasks]
    shown: dict[uuid.UUID, list[ShownOutcome]] = {run_id: [] for run_id in run_ids}
    found_statuses: dict[uuid.UUID, TaskStatus] = {}
    left: set[uuid.UUID] = set()
    if by_tasks:
        if read_ahead is not None and by_tasks <= set(read_ahead[0]):
            # A rack that left with a task of a run read ahead but not told by its tasks is among that run's
            # outcomes too, and found left there: the union below is the same.
            cells, left_by_tasks = read_ahead[1]
        else:
            cells, left_by_tasks = await cells_from_tasks(
                conn, schedule_id, by_tasks, page_racks, leaving=leaving
            )
        cells = [cell for cell in cells if cell[0] in by_tasks]
        left |= left_by_tasks
        for run_id, cell, status in cells:
            shown[run_id].append(cell)
            found_statuses[cast(uuid.UUID, cell.task_id)] = status
    if by_outcomes:
        unnested, left_by_outcomes = await _cells_from_outcomes(
            conn, schedule_id, by_outcomes, page_racks, leaving=leaving
        )
        left |= left_by_outcomes
        for run_id, cell in unnested:
            shown[run_id].append(cell)
        task_ids = {cell.task_id for _, cell in unnested if cell.task_id is not None}
        found_statuses |= await task_statuses(conn, task_ids)
    return GridOutcomes(tallies, shown, found_statuses, left)


async def cells_from_tasks(
    conn: AsyncConnection,
    schedule_id: uuid.UUID,
    run_ids: Collection[uuid.UUID],
    page_racks: Collection[uuid.UUID],
    *,
    leaving: bool = True,
) -> TaskCells:
    """The page's racks and the racks no longer in scope, of runs `told_by_its_tasks`, from their tasks:
    first the racks that left (every task's rack is in `racks`, which cascades a deleted rack's tasks
    away), then the tasks of those and of the page's racks, each by the index of UNIQUE (run_id, rack_id):

        SELECT racks.id FROM racks
        WHERE racks.id NOT IN (SELECT rack_id FROM task_schedule_scope WHERE schedule_id = :schedule_id)
          AND EXISTS (SELECT FROM tasks WHERE run_id IN (:runs) AND rack_id = racks.id)
        SELECT run_id, rack_id, id, status FROM tasks
        WHERE run_id IN (:runs) AND rack_id IN (:page_racks + the racks that left)

    The first costs what the smaller side does: PostgreSQL probes the index for each rack outside the
    scope (none, when a schedule covers the fleet: 11–16 ms at 10,000 racks), or reads the runs' 200,000
    index entries once when most racks are outside it (70 ms), never their heap rows. Not `leaving`
    (`scope_removals.may_have_left` says none of the runs can hold a rack that left), the first is not
    asked. Returns the cells with their tasks' statuses, and the racks that left."""
    run_ids = list(run_ids)
    left: set[uuid.UUID] = set()
    if leaving:
        has_task = exists().where(tasks.c.run_id.in_(run_ids), tasks.c.rack_id == racks.c.id)
        scope = task_schedule_scope.c
        outside = racks.c.id.not_in(select(scope.rack_id).where(scope.schedule_id == schedule_id))
        left_of_scope = select(racks.c.id).where(outside, has_task)
        left = set((await conn.execute(left_of_scope)).scalars())
    wanted = list(set(page_racks) | left)
    found: list[tuple[uuid.UUID, ShownOutcome, TaskStatus]] = []
    for chunk in chunked(wanted):
        stmt = select(tasks.c.run_id, tasks.c.rack_id, tasks.c.id, tasks.c.status).where(
            tasks.c.run_id.in_(run_ids), tasks.c.rack_id.in_(chunk)
        )
        for row in await conn.execute(stmt):
            cell = ShownOutcome(row.rack_id, "submitted", row.id, "")
            found.append((row.run_id, cell, TaskStatus(row.status)))
    return found, left


async def _cells_from_outcomes(
    conn: AsyncConnection,
    schedule_id: uuid.UUID,
    run_ids: Collection[uuid.UUID],
    page_racks: Collection[uuid.UUID],
    *,
    leaving: bool = True,
) -> tuple[list[tuple[uuid.UUID, ShownOutcome]], set[uuid.UUID]]:
    """The outcomes of the page's racks and of racks no longer in the schedule's scope, each run's outcomes
    unnested and filtered in the database (PostgreSQL `jsonb_array_elements`, SQLite `json_each`), so
    Python parses only the outcomes it shows; and the racks that left:

        SELECT run.id, o, (o->>'rack_id')::uuid NOT IN (SELECT rack_id FROM task_schedule_scope
                                                        WHERE schedule_id = :schedule_id) AS left
        FROM task_schedule_run run, jsonb_array_elements(run.outcomes) o
        WHERE run.id IN (:run_ids) AND ((o->>'rack_id')::uuid = ANY(:page_racks) OR left)

    The racks that left the scope are few unless the scope was replaced, and the grid lists them after
    the scope's (every page needs their number). Not `leaving`, only the page's racks are read."""
    run = task_schedule_run.c
    each, field = _unnested_outcomes(conn.dialect.name)
    rack_id = _outcome_rack_id(conn.dialect.name, field)
    scope = task_schedule_scope.c
    outside = rack_id.not_in(select(scope.rack_id).where(scope.schedule_id == schedule_id))
    left: ColumnElement[Any] = outside if leaving else literal(False)
    if conn.dialect.name == POSTGRESQL:
        page = rack_id == any_(bindparam("page_racks", list(page_racks), ARRAY(Uuid)))
    else:
        page = rack_id.in_([rack.hex for rack in page_racks])
    stmt = (
        select(run.id, each.c.value, left.label("left"))
        .select_from(task_schedule_run.join(each, true()))
        .where(run.id.in_(list(run_ids)), or_(page, left) if leaving else page)
    )
    found: list[tuple[uuid.UUID, ShownOutcome]] = []
    gone: set[uuid.UUID] = set()
    for run_id, value, has_left in (await conn.execute(stmt)).all():
        outcome = outcome_from_json(_json_object(value))
        found.append((run_id, ShownOutcome(outcome.rack_id, outcome.outcome, outcome.task_id, outcome.error)))
        if has_left:
            gone.add(outcome.rack_id)
    return found, gone
