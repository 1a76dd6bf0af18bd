"""Racks: the list (components, power, firmware) and one rack (its components, tasks, schedules and the
maintenance windows covering it)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.domain.inventory import Rack
from rackflow.web import refs
from rackflow.web.pages import PAGE_SIZE, Site, offset_of, page_number, pages_of, query_url
from rackflow.web.pages.windows import current_or_next

RACK_TASKS = 20


def routes(site: Site) -> list[Route]:
    async def rack_list(request: Request) -> Response:
        return await site.page(request, "racks.html", "Racks", lambda _: _list(site, request))

    async def rack_page(request: Request) -> Response:
        ref = request.path_params["ref"]
        return await site.page(request, "rack.html", ref, lambda _: _one(site, ref))

    return [Route("/racks", rack_list), Route("/racks/{ref}", rack_page)]


def power_counts(rack: Rack) -> list[tuple[str, int]]:
    """("on", 6), ("off", 2): how many components are in each power state, most common first."""
    return Counter(c.power_state.value for c in rack.components).most_common()


def firmware_versions(rack: Rack) -> list[str]:
    return sorted({c.firmware_version for c in rack.components if c.firmware_version})


def component_types(rack: Rack) -> list[tuple[str, int]]:
    return sorted(Counter(c.type.value for c in rack.components).items())


async def _domain_names(site: Site, racks: Iterable[Rack]) -> dict[uuid.UUID, str]:
    """The names of these racks' domains, read for them alone (a fleet may have 20,000 domains)."""
    ids = {r.nvl_domain_id for r in racks if r.nvl_domain_id is not None}
    return await site.services.inventory.domain_names(ids)


async def _list(site: Site, request: Request) -> Mapping[str, Any]:
    page = page_number(request)
    racks, listed = await site.services.inventory.list_racks(offset=offset_of(page), limit=PAGE_SIZE)
    return {
        "racks": racks,
        "domains": await _domain_names(site, racks),
        "pager": pages_of(listed.total, page),
        "url": lambda **changes: query_url(request, **changes),
        "power_counts": power_counts,
        "firmware_versions": firmware_versions,
        "component_types": component_types,
    }


async def _one(site: Site, ref: str) -> Mapping[str, Any]:
    services = site.services
    rack = await services.inventory.get_rack(await refs.rack_id(services, ref, "id"))
    active, _ = await services.tasks.list_tasks(rack_id=rack.id, active_only=True)
    recent, total_tasks = await services.tasks.list_tasks(rack_id=rack.id, limit=RACK_TASKS)
    schedules, _ = await services.schedules.list_schedules(rack_id=rack.id)
    task_schedules = {t.schedule_id for t in [*active, *recent] if t.schedule_id is not None}
    return {
        "rack": rack,
        "domains": await _domain_names(site, [rack]),
        "active": active,
        "recent": [t for t in recent if not t.status.is_active],
        "total_tasks": total_tasks,
        "schedules": schedules,
        "live_rollouts": await services.rollouts.live([s.id for s in schedules]),
        "windows": await services.windows.list_windows(rack.id),
        "current_or_next": current_or_next,
        "schedule_names": await services.schedules.names(task_schedules),
        "rack_names": {rack.id: rack.name},
        "power_counts": power_counts,
        "firmware_versions": firmware_versions,
    }
