"""Tasks: the live list with filters, and one task (rack, components in step order, message, timing)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.domain.tasks import TaskStatus
from rackflow.errors import InvalidArgument, NotFound
from rackflow.tasks.backends.base import plan
from rackflow.web import refs
from rackflow.web.pages import PAGE_SIZE, Site, offset_of, page_number, pages_of, query_url, short_id


def routes(site: Site) -> list[Route]:
    async def task_list(request: Request) -> Response:
        return await site.page(request, "tasks.html", "Tasks", lambda _: _list(site, request))

    async def task_page(request: Request) -> Response:
        ref = request.path_params["ref"]
        return await site.page(request, "task.html", f"Task {short_id(ref)}", lambda _: _one(site, ref))

    return [Route("/tasks", task_list), Route("/tasks/{ref}", task_page)]


def _status(value: str) -> TaskStatus | None:
    if not value:
        return None
    try:
        return TaskStatus(value)
    except ValueError:
        raise InvalidArgument(f"status: {value!r} is not a task status") from None


async def _list(site: Site, request: Request) -> Mapping[str, Any]:
    q = request.query_params
    services = site.services
    status = _status(q.get("status", ""))
    rack_id = await refs.rack_id(services, q["rack"], "rack") if q.get("rack") else None
    schedule_id = await refs.schedule_id(services, q["schedule"], "schedule") if q.get("schedule") else None
    page = page_number(request)
    tasks, total = await services.tasks.list_tasks(
        rack_id=rack_id,
        schedule_id=schedule_id,
        statuses=[status] if status else [],
        offset=offset_of(page),
        limit=PAGE_SIZE,
    )
    schedule_ids = {t.schedule_id for t in tasks if t.schedule_id is not None}
    return {
        "tasks": tasks,
        "rack_names": await services.inventory.rack_names({t.rack_id for t in tasks}),
        "schedule_names": await services.schedules.names(schedule_ids),
        "filters": {
            "status": q.get("status", ""),
            "rack": q.get("rack", ""),
            "schedule": q.get("schedule", ""),
        },
        "pager": pages_of(total, page),
        "url": lambda **changes: query_url(request, **changes),
    }


async def _one(site: Site, ref: str) -> Mapping[str, Any]:
    services = site.services
    try:
        task_id = uuid.UUID(ref)
    except ValueError:
        raise InvalidArgument(f"id: {ref!r} is not a task id") from None
    found = await services.tasks.get_tasks([task_id])
    if not found:
        raise NotFound(f"id: no task {task_id}")
    task = found[0]
    rack = await services.inventory.get_rack(task.rack_id)  # a rack's tasks go when it goes
    components = [c for c in rack.components if c.id in set(task.component_ids)]
    names = await services.schedules.names([task.schedule_id] if task.schedule_id else [])
    return {
        "task": task,
        "rack": rack,
        "steps": plan(task.operation.kind, components),
        "missing_components": len(task.component_ids) - len(components),
        "schedule_name": names.get(task.schedule_id) if task.schedule_id else None,
        "run_kept": task.run_id is not None and await services.schedules.has_run(task.run_id),
        "attempts": (await services.tasks.attempts([task.id])).get(task.id, []) if task.retry else [],
        "checks": (await services.checks.latest_rounds([task.id])).get(task.id, []),
    }
