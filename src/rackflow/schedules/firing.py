"""Firing a schedule: what happens after its row has been claimed and advanced.

A firing has three phases, so that no transaction is held while the task manager opens its own:

1. (caller, one transaction) lock the schedule row, advance it with `advance_after_firing`, set
   `last_run_at`, and record the run as "running" (`store.schedules.insert_run`). Once this commits, the
   tick is spent: whatever happens next, it is not fired again (at most once per tick).
2. (`fire`, no transaction) submit one task per eligible scope. A scope that fails is logged and recorded
   as "failed"; the other scopes still fire.
3. (`fire`, a new transaction) write each scope's new `last_task_id` (the SKIP overlap check reads it) and
   complete the run with its outcomes. Retried briefly: if it still fails, the tasks exist but the overlap
   check may see stale state until the next successful firing.

Manual triggers (`ScheduleService.trigger`) and the dispatcher share this module.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rackflow.clock import Clock
from rackflow.inventory.model import RackSelection
from rackflow.schedules.model import Schedule, Scope, ScopeOutcome, Trigger
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.tasks.manager import TaskManager
from rackflow.tasks.model import QueueOptions
from rackflow.timespec import SpecType, parse_spec

log = logging.getLogger(__name__)

WRITEBACK_MAX_ATTEMPTS = 3
WRITEBACK_RETRY_DELAY_SECONDS = 0.2


@dataclass(frozen=True)
class RunResult:
    run_id: uuid.UUID
    outcomes: tuple[ScopeOutcome, ...]

    @property
    def task_ids(self) -> list[uuid.UUID]:
        return [outcome.task_id for outcome in self.outcomes if outcome.task_id is not None]


def advance_after_firing(schedule: Schedule, fired_at: datetime) -> tuple[bool, datetime | None]:
    """(enabled, next_run_at) once the schedule has fired at `fired_at`.

    One-time: consumed (disabled, no next run). Interval: `fired_at` + duration, so missed intervals are
    not replayed. Cron: the next calendar time after `fired_at`. `enabled` is otherwise kept, so a paused
    schedule fired by hand stays paused.
    """
    if schedule.spec.type is SpecType.ONE_TIME:
        return False, None
    return schedule.enabled, parse_spec(schedule.spec).next_after(fired_at)


def task_description(schedule: Schedule, fired_at: datetime) -> str:
    """`<schedule name> — <fired_at, RFC 3339>`, so an operator can tell which firing made a task."""
    return f"{schedule.name} — {fired_at.isoformat().replace('+00:00', 'Z')}"


async def fire(
    db: Database,
    tasks: TaskManager,
    clock: Clock,
    schedule: Schedule,
    scopes: Sequence[Scope],
    *,
    trigger: Trigger,
    fired_at: datetime,
    skip_scope_ids: set[uuid.UUID],
    run_id: uuid.UUID,
) -> RunResult:
    """Phases 2 and 3 of a firing whose run row `run_id` phase 1 inserted.

    `skip_scope_ids` are the scopes the overlap check left out (empty for manual triggers).
    """
    started = clock.now()
    outcomes = tuple(
        [
            await _submit(tasks, schedule, scope, fired_at)
            if scope.id not in skip_scope_ids
            else ScopeOutcome(scope.id, scope.rack_id, "skipped_overlap")
            for scope in scopes
        ]
    )
    await _write_back(db, schedule.id, run_id, outcomes)
    log.info(
        "schedule %s (%s) fired (%s): %d submitted, %d skipped, %d failed in %.3fs",
        schedule.name,
        schedule.id,
        trigger,
        sum(o.outcome == "submitted" for o in outcomes),
        sum(o.outcome == "skipped_overlap" for o in outcomes),
        sum(o.outcome == "failed" for o in outcomes),
        (clock.now() - started).total_seconds(),
    )
    return RunResult(run_id, outcomes)


async def _submit(tasks: TaskManager, schedule: Schedule, scope: Scope, fired_at: datetime) -> ScopeOutcome:
    """Submit the scope's task; any failure becomes this scope's outcome, never the whole firing's."""
    try:
        submitted = await tasks.submit(
            schedule.operation,
            [RackSelection(scope.rack_id, scope.filter)],
            description=task_description(schedule, fired_at),
            queue=QueueOptions(schedule.overlap_policy.conflict_strategy, schedule.queue_timeout),
            schedule_id=schedule.id,
        )
    except Exception as exc:
        log.warning(
            "schedule %s: scope %s (rack %s) not submitted: %s", schedule.id, scope.id, scope.rack_id, exc
        )
        return ScopeOutcome(scope.id, scope.rack_id, "failed", error=str(exc) or type(exc).__name__)
    return ScopeOutcome(scope.id, scope.rack_id, "submitted", task_id=submitted[0].id)


async def _write_back(
    db: Database, schedule_id: uuid.UUID, run_id: uuid.UUID, outcomes: Sequence[ScopeOutcome]
) -> None:
    """Phase 3, retried: last_task_id per submitted scope, the completed run, and run-history retention."""
    task_by_scope = {o.scope_id: o.task_id for o in outcomes if o.task_id is not None}
    for attempt in range(1, WRITEBACK_MAX_ATTEMPTS + 1):
        try:
            async with db.transaction() as conn:
                await store.set_last_task_ids(conn, task_by_scope)
                await store.complete_run(conn, run_id, outcomes)
                await store.prune_runs(conn, schedule_id)
            return
        except Exception:
            if attempt == WRITEBACK_MAX_ATTEMPTS:
                log.exception("schedule %s: run %s write-back failed %d times", schedule_id, run_id, attempt)
                return
            await asyncio.sleep(WRITEBACK_RETRY_DELAY_SECONDS * attempt)
