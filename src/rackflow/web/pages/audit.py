"""Audit: the trail of changes, newest first, filtered by method, principal and target (an id, or the name
of a rack, schedule, window, domain, budget, check or channel: that thing's history;
`refs.audit_target_id`). By target the page goes on by the list's page tokens (`after`), not page
numbers: on SQLite a page of it walks a bounded range of the trail and may come back short before its end
(`rackflow.store.audit.list_events`), so a page number would not say which events it shows. So does a
page that ended early, its bytes full (rows holding megabytes: `rackflow.audit.trail`), and every page
after it.

It reads through the `ListAuditEvents` RPC (which asks `Services.audit`), as the JSON API does. An event's
targets are ids; the page names each (schedule, rack, task, run, window, budget, domain) and links it to
its page, and an id that names nothing any more (deleted) is shown as it is.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.errors import NotFound
from rackflow.ids import is_uuid
from rackflow.security import Principal
from rackflow.v1 import flow_pb2 as pb
from rackflow.web import refs
from rackflow.web.pages import PAGE_SIZE, Site, offset_of, page_number, pages_of, query_url, short_id


def routes(site: Site) -> list[Route]:
    async def audit_list(request: Request) -> Response:
        return await site.page(request, "audit.html", "Audit", lambda p: _list(site, request, p))

    return [Route("/audit", audit_list)]


@dataclass(frozen=True)
class Target:
    kind: str
    name: str
    href: str | None


async def targets_of(site: Site, raw_ids: Collection[str]) -> dict[str, Target]:
    """What each id names now, by kind, with a link to its page; ids that name nothing are left out."""
    services = site.services
    ids = {uuid.UUID(raw) for raw in raw_ids if is_uuid(raw)}
    found: dict[uuid.UUID, Target] = {}
    for i, name in (await services.schedules.names(ids)).items():
        found[i] = Target("schedule", name, f"/schedules/{i}")
    for i, name in (await services.inventory.rack_names(ids - found.keys())).items():
        found[i] = Target("rack", name, f"/racks/{i}")
    tasks = await services.tasks.get_tasks(list(ids - found.keys()))
    racks = await services.inventory.rack_names({t.rack_id for t in tasks})
    for t in tasks:
        label = f"{t.operation.kind.display_name} on {racks.get(t.rack_id, short_id(t.rack_id))}"
        found[t.id] = Target("task", label, f"/tasks/{t.id}")
    for w in await services.windows.list_windows():
        if w.id in ids:
            found[w.id] = Target("window", w.name, "/windows")
    for budget in await services.budgets.list_budgets():
        if budget.id in ids:
            found[budget.id] = Target("budget", budget.name, "/windows")
    for i, name in (await services.inventory.domain_names(ids - found.keys())).items():
        found[i] = Target("domain", name, None)
    for i in sorted(ids - found.keys()):  # what is left may be a run (one read each; a page has few)
        try:
            report = await services.rollouts.get(i)
        except NotFound:
            continue
        names = await services.schedules.names([report.run.schedule_id])
        found[i] = Target("run", f"of {names.get(report.run.schedule_id, '(deleted)')}", f"/runs/{i}")
    return {str(i): target for i, target in found.items()}


def _pretty(text: str) -> str:
    return json.dumps(json.loads(text), indent=2, sort_keys=True) if text else ""


async def _list(site: Site, request: Request, principal: Principal) -> Mapping[str, Any]:
    q = request.query_params
    target = q.get("target", "").strip()
    after = q.get("after", "")
    page = 1 if target or after else page_number(request)
    target_id = await refs.audit_target_id(site.services, target, "target") if target else None
    request_message = pb.ListAuditEventsRequest(
        method=q.get("method", ""),
        principal=q.get("principal", ""),
        target=pb.UUID(id=str(target_id)) if target_id else None,
        pagination=pb.Pagination(offset=offset_of(page), limit=PAGE_SIZE, page_token=after),
    )
    found = await site.caller("ListAuditEvents", request_message, principal)
    assert isinstance(found, pb.ListAuditEventsResponse)
    # A page short of PAGE_SIZE with a token ended early, its bytes full (`rackflow.audit.trail`): the next
    # page number's offset would skip the events between, so from there the page goes on by token too.
    ended_early = bool(found.next_page_token) and len(found.events) < PAGE_SIZE
    by_token = bool(target or after or ended_early)
    return {
        "events": found.events,
        "targets": await targets_of(site, {t.id for e in found.events for t in e.target_ids}),
        "pretty": _pretty,
        "filters": {"method": q.get("method", ""), "principal": q.get("principal", ""), "target": target},
        "methods": sorted(m for m in pb.DESCRIPTOR.services_by_name["Flow"].methods_by_name),
        "pager": pages_of(found.total, page, capped=found.total_capped),
        # Paged by token: the next page's token ("" at the end), and whether this is the first page.
        "by_token": {"next": found.next_page_token, "first": not after} if by_token else None,
        "url": lambda **changes: query_url(request, **changes),
    }
