"""Audit: the trail of changes, newest first, filtered by method and principal.

It reads through the `ListAuditEvents` RPC (which asks `Services.audit`), as the JSON API does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.api.auth import Principal
from rackflow.v1 import flow_pb2 as pb
from rackflow.web.pages import PAGE_SIZE, Site, offset_of, page_number, pages_of, query_url


def routes(site: Site) -> list[Route]:
    async def audit_list(request: Request) -> Response:
        return await site.page(request, "audit.html", "Audit", lambda p: _list(site, request, p))

    return [Route("/audit", audit_list)]


def _pretty(text: str) -> str:
    return json.dumps(json.loads(text), indent=2, sort_keys=True) if text else ""


async def _list(site: Site, request: Request, principal: Principal) -> Mapping[str, Any]:
    q = request.query_params
    page = page_number(request)
    request_message = pb.ListAuditEventsRequest(
        method=q.get("method", ""),
        principal=q.get("principal", ""),
        pagination=pb.Pagination(offset=offset_of(page), limit=PAGE_SIZE),
    )
    found = await site.caller("ListAuditEvents", request_message, principal)
    assert isinstance(found, pb.ListAuditEventsResponse)
    return {
        "events": found.events,
        "pretty": _pretty,
        "filters": {"method": q.get("method", ""), "principal": q.get("principal", "")},
        "methods": sorted(m for m in pb.DESCRIPTOR.services_by_name["Flow"].methods_by_name),
        "pager": pages_of(found.total, page),
        "url": lambda **changes: query_url(request, **changes),
    }
