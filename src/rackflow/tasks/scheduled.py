"""The task a schedule's firing submits for one scope, written once for a firing's phase 2
(`schedules.firing`) and a rollout's step (`rollouts.service`), which both sit above the task manager."""

from __future__ import annotations

import functools
import uuid
from datetime import datetime

from rackflow.domain.inventory import RackSelection
from rackflow.domain.schedules import Schedule, Scope
from rackflow.domain.tasks import QueueOptions
from rackflow.domain.window_rules import Decision
from rackflow.tasks.manager import Submission
from rackflow.timespec import format_rfc3339


def task_description(schedule: Schedule, fired_at: datetime) -> str:
    """`<schedule name> — <fired_at, RFC 3339>`, so an operator can tell which firing made a task."""
    return f"{schedule.name} — {_fired_at_text(fired_at)}"


@functools.lru_cache(maxsize=4)
def _fired_at_text(fired_at: datetime) -> str:
    """`fired_at` in RFC 3339, written once for the up to 1,000 firings of a batch, which share it."""
    return format_rfc3339(fired_at)


def scope_submission(
    schedule: Schedule,
    scope: Scope,
    fired_at: datetime,
    run_id: uuid.UUID,
    bound: Decision | None = None,
) -> Submission:
    """What a firing submits for one scope (phase 2, or a rollout's step): the schedule's operation on the
    scope's rack and components, under the overlap policy's conflict strategy, carrying the run's id and
    the schedule's retry policy. `bound`: what the windows bind its task to (`domain.firing.starts_bound`).
    A deferred scope's task is held until the opening it waits for, and says so; a deferred one, or one
    fired inside an ALLOW window, must start before that opening or window closes."""
    return Submission(
        schedule.operation,
        (RackSelection(scope.rack_id, scope.filter),),
        task_description(schedule, fired_at),
        QueueOptions(schedule.overlap_policy.conflict_strategy, schedule.queue_timeout),
        schedule.id,
        run_id,
        bound.reason if bound else "",
        opens_at=bound.opens_at if bound else None,
        closes_at=bound.closes_at if bound else None,
        retry=schedule.retry,
    )
