"""A firing's reads and writes around the planner (`rackflow.domain.firing`): `load` reads the snapshot a
batch of firings is planned from, `record` writes what the plan decided, and `load_starts` reads what a
rollout's step plans its starts from.

Each takes the caller's connection: the dispatcher and a manual trigger load and record in the
transaction that holds the schedule rows locked, so what the plan saw is what it writes over. Reads are
set-based, one query per chunk of the batch whatever its size, and skip what the plan will not ask
(`checks_scopes`, `overlap_checked`: a manual firing reads neither tasks nor windows).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.firing import Firing, LiveRollout, Snapshot, checks_scopes, overlap_checked
from rackflow.domain.rollouts import RackPlace
from rackflow.domain.schedules import RunState, Schedule, Scope, ScopeOutcome, Trigger
from rackflow.domain.windows import RackRef
from rackflow.store import rollouts, schedules, windows
from rackflow.store import runs as run_history
from rackflow.store.db import Database


async def load(
    conn: AsyncConnection,
    batch: Sequence[Schedule],
    trigger: Trigger,
    scopes: Mapping[uuid.UUID, Sequence[Scope]] | None = None,
) -> Snapshot:
    """What `plan` needs to fire `batch` by `trigger`: the scopes; where the overlap check runs, which
    scopes' last task is still active; where windows are obeyed, the windows and the racks they may close
    (only if there are any windows); for rollouts, each schedule's live rollout and its racks' names; for
    the schedules that need approval, each one's run awaiting it. `scopes` given (an unsaved schedule's
    preview) stand for the saved ones."""
    if scopes is None:
        scopes = await schedules.scopes_by_schedule(conn, [s.id for s in batch])
    checked = [sc for s in batch if overlap_checked(s, trigger) for sc in scopes[s.id]]
    busy = frozenset(await schedules.overlapping_scope_ids(conn, checked))
    found = await windows.all_windows(conn) if checks_scopes(trigger) else []
    racks: dict[uuid.UUID, RackRef] = {}
    if found:  # the racks of the scopes the windows may still close
        open_racks = {sc.rack_id for s in batch for sc in scopes[s.id] if sc.id not in busy}
        racks = await windows.rack_refs(conn, open_racks)
    rolling = [s.id for s in batch if s.rollout is not None]
    live: dict[uuid.UUID, LiveRollout] = {}
    places: dict[uuid.UUID, RackPlace] = {}
    if rolling:
        live = await rollouts.live_rollouts(conn, rolling)
        places = await rollouts.rack_places(conn, {sc.rack_id for sid in rolling for sc in scopes[sid]})
    approving = [s.id for s in batch if s.approval is not None]
    awaiting = await run_history.awaiting_runs(conn, approving) if approving else {}
    return Snapshot(tuple(batch), scopes, busy, tuple(found), racks, live, places, awaiting)


async def load_starts(
    conn: AsyncConnection, schedule_id: uuid.UUID, scope_ids: Sequence[uuid.UUID], trigger: Trigger
) -> Snapshot:
    """What `plan_starts` needs for a rollout's step to start `scope_ids`: the schedule, those of the
    scopes still in it, and (where windows are obeyed, and there are any) the windows and the racks."""
    schedule = await schedules.get_schedule(conn, schedule_id)
    assert schedule is not None  # runs are deleted with their schedule
    present = await schedules.scopes_by_ids(conn, scope_ids)
    found = await windows.all_windows(conn) if checks_scopes(trigger) else []
    racks = await windows.rack_refs(conn, {sc.rack_id for sc in present}) if found else {}
    return Snapshot((schedule,), {schedule.id: present}, windows=tuple(found), racks=racks)


async def record(
    db: Database,
    conn: AsyncConnection,
    planned: Sequence[Firing],
    owner_id: uuid.UUID | None = None,
    request_id: str | None = None,
) -> set[uuid.UUID]:
    """Write the plan in one go: every schedule's new timing, one run per firing (`_new_run`), and the
    history of the runs phase 3 will not write back pruned (a rollout's, a skipped one's, a missed one's,
    one awaiting approval). Returns the ids of the runs recorded: a dispatched firing whose
    slot is recorded already is left out (`runs.insert_runs`), and must not be fired again; so is a manual
    one whose `request_id` (its caller's, a single firing's) a run of its schedule already carries."""
    if not planned:
        return set()
    advances = [
        schedules.Advance(
            f.schedule.id,
            f.enabled,
            f.next_run_at,
            f.fired_at,
            run_history.counted_with_run(f.schedule),
            run_history.since_with_run(f.schedule, f.scheduled_for),
        )
        for f in planned
    ]
    await schedules.advance(conn, advances, planned[0].fired_at)
    runs = [_new_run(f, owner_id, request_id) for f in planned]
    recorded = await run_history.insert_runs(db, conn, runs)
    unwritten = [f.schedule for f in planned if f.rolls_out or f.skipped or f.needs_approval or f.missed]
    await run_history.cap_runs(conn, unwritten)
    return recorded


def _new_run(f: Firing, owner_id: uuid.UUID | None, request_id: str | None) -> run_history.NewRun:
    """A plain firing's run "running", owned by the firing instance `owner_id` (`runs.owned`); a missed
    one "missed" with every scope's outcome, its reason and how late; a rollout's "rolling" with its scopes
    in order; "skipped" with the reason; one that needs approval "awaiting_approval" with its plan frozen."""
    if f.missed:
        state: RunState = "missed"
        outcomes: Sequence[ScopeOutcome] = tuple(f.decided[sc.id] for sc in f.scopes)
        reason = f.missed_reason
    else:
        state = _state(f)
        outcomes = f.planned_outcomes if f.rolls_out or f.needs_approval else ()
        reason = f.skipped
    return run_history.NewRun(
        f.run_id,
        f.schedule.id,
        f.fired_at,
        f.trigger,
        f.scheduled_for,
        owner_id,
        state=state,
        outcomes=outcomes,
        rollout=None if f.missed else f.schedule.rollout,
        reason=reason,
        approval=f.approval,
        late_by=f.late_by,
        request_id=request_id,
    )


def _state(firing: Firing) -> RunState:
    if firing.skipped:
        return "skipped"
    if firing.needs_approval:
        return "awaiting_approval"
    return "rolling" if firing.rolls_out else "running"
