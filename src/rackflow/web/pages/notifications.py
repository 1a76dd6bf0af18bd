"""Notifications: the channels (URLs as the API shows them, never a secret) and the deliveries that gave
up, each channel's with a button to send them again (docs/NOTIFICATIONS.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rackflow.domain.notifications import DeliveryState
from rackflow.web.pages import Site

DEAD_SHOWN = 100


def routes(site: Site) -> list[Route]:
    async def notifications(request: Request) -> Response:
        return await site.page(request, "notifications.html", "Notifications", lambda _: _load(site))

    return [Route("/notifications", notifications)]


async def _load(site: Site) -> Mapping[str, Any]:
    service = site.services.notifications
    dead = await service.deliveries([DeliveryState.DEAD], limit=DEAD_SHOWN)
    return {
        "channels": await service.list_channels(),
        "dead": dead,
        "dead_by_channel": Counter(d.channel_id for d in dead),
    }
