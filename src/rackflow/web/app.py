"""The Starlette application: the JSON API, the pages, the static files, the request guard
(`security.py`), the response headers, and errors in JSON for every path (an unknown path is 404 and a
method a path does not take is 405, in the API's error shape, not Starlette's plain text)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rackflow.api.audit import AuditInterceptor
from rackflow.api.servicer import FlowServicer
from rackflow.clock import Clock
from rackflow.security import TokenTable
from rackflow.services import Services
from rackflow.web.api import JsonApi
from rackflow.web.calls import RpcCaller
from rackflow.web.openapi import OPENAPI_PATH, document
from rackflow.web.pages import Site, audit, notifications, overview, racks, runs, schedules, tasks, windows
from rackflow.web.security import HttpSecurity, RequestGuard

# Starlette's own refusals as the API's codes: an unknown path, a method its path does not take.
_CODE_FOR_STATUS = {404: "NOT_FOUND", 405: "UNIMPLEMENTED"}

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


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"no such path: {request.url.path}"
    elif exc.status_code == 405:
        allow = (exc.headers or {}).get("Allow", "")  # Starlette's order varies: sorted, for a stable message
        allowed = ", ".join(sorted(m.strip() for m in allow.split(",") if m.strip()))
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    else:
        message = exc.detail
    code = _CODE_FOR_STATUS.get(exc.status_code, "INVALID_ARGUMENT" if exc.status_code < 500 else "INTERNAL")
    body = {"code": code, "message": message, "field": None}
    return JSONResponse(body, exc.status_code, headers=exc.headers)


def build_app(
    services: Services,
    audit_interceptor: AuditInterceptor,
    tokens: TokenTable | None,
    clock: Clock,
    security: HttpSecurity | None = None,
) -> Starlette:
    caller = RpcCaller(FlowServicer(services), audit_interceptor)
    site = Site(services, caller, tokens, clock)
    api = JsonApi(services, caller, tokens)
    openapi = JSONResponse(document(api.endpoints())).body  # made once: the table does not change

    async def serve_openapi(_request: Request) -> Response:
        # It describes the API and reads nothing: no credentials needed, like gRPC reflection.
        return Response(openapi, media_type="application/json")

    routes: list[BaseRoute] = [
        Route(OPENAPI_PATH, serve_openapi, methods=["GET"]),
        *api.routes(),
        *overview.routes(site),
        *schedules.routes(site),
        *runs.routes(site),
        *tasks.routes(site),
        *racks.routes(site),
        *windows.routes(site),
        *notifications.routes(site),
        *audit.routes(site),
        Mount("/static", StaticFiles(packages=[("rackflow.web", "static")]), name="static"),
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(_SecurityHeaders),
            Middleware(RequestGuard, security=security or HttpSecurity()),
        ],
        exception_handlers={HTTPException: _http_error},
    )
