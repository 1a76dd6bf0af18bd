"""One firing of a schedule (`/runs/{id}`): how it stands, each rack's outcome with its task, error and
wave, its progress as a segmented bar, Resume/Cancel for a rollout that is halted or rolling, and Retry
for a run that is over with racks that failed or never started (RetryTaskScheduleRun).

The rack list is paged (RACKS_PER_PAGE, canaries first, then by name): the verdict, the bar and Retry are
the whole run's, from its outcomes and its tasks' statuses, but only the page's racks have their tasks
read in full and rendered — a firing of 10,000 racks rendered every one (docs/PERFORMANCE.md, issue 29)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.domain.schedules import RETRIABLE_RUN_STATES, RETRIED_OUTCOMES, RETRIED_STATUSES, ScopeOutcome
from rackflow.domain.tasks import Task, TaskStatus
from rackflow.errors import InvalidArgument
from rackflow.rollouts.service import Progress
from rackflow.web.pages import Site, offset_of, page_number, pages_of, query_url, short_id
from rackflow.web.views import (
    LOOKS,
    OUTCOME_LOOKS,
    RUN_LOOKS,
    TASK_LOOKS,
    Bar,
    Look,
    bar_of,
    tallied_verdicts,
    verdict_of,
    verdicts_bar,
)

RACKS_PER_PAGE = 100  # rack rows of a run's page, and of a schedule's runs grid


def routes(site: Site) -> list[Route]:
    async def run_page(request: Request) -> Response:
        ref = request.path_params["ref"]
        return await site.page(
            request, "run.html", f"Run {short_id(ref)}", lambda _: _one(site, request, ref)
        )

    return [Route("/runs/{ref}", run_page)]


@dataclass(frozen=True)
class RackRow:
    """One rack of the firing: what the firing did for it, and its task as it stands now."""

    outcome: ScopeOutcome
    rack_name: str
    outcome_look: Look
    task: Task | None
    task_look: Look | None
    wave: str  # "canary" or "rest" in a rollout with canaries, else ""


def progress_bar(progress: Progress) -> Bar:
    """A rollout's bar, from the counters the server keeps (`RolloutService`)."""
    return bar_of(
        {
            "succeeded": progress.succeeded,
            "failed": progress.failed,
            "running": progress.active,
            "pending": progress.pending,
            "not_started": progress.not_started,
            "skipped": progress.skipped,
        }
    )


def rows_of(
    outcomes: list[ScopeOutcome],
    names: Mapping[uuid.UUID, str],
    tasks: Mapping[uuid.UUID, Task],
    statuses: Mapping[uuid.UUID, TaskStatus],
    *,
    canaries: bool,
) -> list[RackRow]:
    """The rows of `outcomes` (one page, in order); `canaries`: whether the run has any (a wave column)."""
    rows = []
    for outcome in outcomes:
        task = tasks.get(outcome.task_id) if outcome.task_id else None
        status = task.status if task else statuses.get(outcome.task_id) if outcome.task_id else None
        rows.append(
            RackRow(
                outcome,
                names.get(outcome.rack_id, str(outcome.rack_id)),
                OUTCOME_LOOKS[outcome.outcome],
                task,
                TASK_LOOKS[status] if status is not None else None,
                ("canary" if outcome.canary else "rest") if canaries else "",
            )
        )
    return rows


async def _one(site: Site, request: Request, ref: str) -> Mapping[str, Any]:
    services = site.services
    try:
        run_id = uuid.UUID(ref)
    except ValueError:
        raise InvalidArgument(f"id: {ref!r} is not a run id") from None
    summary = await services.rollouts.summary(run_id)
    run = summary.run  # without its outcomes: the page's are read below, the rest counted
    # A rollout's progress (its wave, the failures its budget counts) is RolloutService's, from the whole run.
    report = await services.rollouts.get(run_id) if run.rollout is not None else None
    page = page_number(request)
    shown_named = await services.schedules.run_rack_page(run, offset_of(page, RACKS_PER_PAGE), RACKS_PER_PAGE)
    shown = [outcome for outcome, _ in shown_named]
    names = {outcome.rack_id: name for outcome, name in shown_named if name is not None}
    task_ids = [o.task_id for o in shown if o.task_id is not None]
    tasks = {t.id: t for t in await services.tasks.get_tasks(task_ids)}
    schedule_names = await services.schedules.names([run.schedule_id])
    verdicts = tallied_verdicts(summary.tally, summary.task_counts)
    progress = report.progress if report else None
    failed_racks = any(
        racks for (outcome, _), racks in summary.tally.items() if outcome in RETRIED_OUTCOMES
    ) or any(summary.task_counts.get(status) for status in RETRIED_STATUSES)
    return {
        "run": run,
        "schedule_name": schedule_names.get(run.schedule_id),
        "verdict": LOOKS[verdict_of(run.state, verdicts)],
        "state": RUN_LOOKS[run.state],
        "progress": progress,
        "bar": progress_bar(progress) if progress else verdicts_bar(verdicts),
        "rows": rows_of(
            shown,
            names,
            tasks,
            {t.id: t.status for t in tasks.values()},
            canaries=report is not None and any(o.canary for o in report.run.outcomes),
        ),
        "rack_total": sum(summary.tally.values()),
        "rack_pager": pages_of(sum(summary.tally.values()), page, RACKS_PER_PAGE, exact=True),
        "url": lambda **changes: query_url(request, **changes),
        "retried_by": summary.retried_by,
        # RetryTaskScheduleRun takes a run that is over (its tasks ended) and had a rack fail or not start
        # (`racks_to_retry`).
        "retriable": run.state in RETRIABLE_RUN_STATES
        and not any(racks and status.is_active for status, racks in summary.task_counts.items())
        and failed_racks,
    }
