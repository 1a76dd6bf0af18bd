"""The Starlette application: the JSON API, the pages, the static files, and the response headers."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rackflow.api.audit import AuditInterceptor
from rackflow.api.servicer import FlowServicer
from rackflow.clock import Clock
from rackflow.security import TokenTable
from rackflow.services import Services
from rackflow.web.api import JsonApi
from rackflow.web.calls import RpcCaller
from rackflow.web.pages import Site, audit, notifications, overview, racks, schedules, tasks, windows

# No inline script or style, nothing from elsewhere, never framed: a page can only run the package's script.
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; "
        b"form-action 'self'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


class _SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def build_app(
    services: Services, audit_interceptor: AuditInterceptor, tokens: TokenTable | None, clock: Clock
) -> Starlette:
    caller = RpcCaller(FlowServicer(services), audit_interceptor)
    site = Site(services, caller, tokens, clock)
    routes: list[BaseRoute] = [
        *JsonApi(services, caller, tokens).routes(),
        *overview.routes(site),
        *schedules.routes(site),
        *tasks.routes(site),
        *racks.routes(site),
        *windows.routes(site),
        *notifications.routes(site),
        *audit.routes(site),
        Mount("/static", StaticFiles(packages=[("rackflow.web", "static")]), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(_SecurityHeaders)])
