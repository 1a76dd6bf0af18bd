"""Safe by default: what every HTTP request must satisfy before the app sees it, and the refusal log.

Tokens travel in an `Authorization` header, never a cookie, but `make run` serves without tokens: there
every caller on the machine is an operator, so any web page the operator's browser opens could act for
them (a form POST, a `fetch` in `no-cors` mode) or read through a DNS-rebound name. The guard therefore
refuses, before any route runs:

- a `Host` that is not a name this server is served under (403): the listen address, the loopback names,
  `--http-allowed-hosts`; against DNS rebinding.
- a state-changing request (any method but GET, HEAD, OPTIONS) from another origin (403): its `Origin` must
  be this server's own (or one of `--http-allowed-origins`), and without an `Origin` its `Sec-Fetch-Site`
  may only be `same-origin` or `none`. Requests with neither header (curl, scripts) are not from a page.
- a state-changing request whose body is not `Content-Type: application/json` (415): a page can send a
  form or `text/plain` to any origin without asking, but not JSON.
- a body larger than `--http-max-body-bytes` (413): refused on its `Content-Length`, or while it is read,
  so a large body is never held whole.

Every refusal — these, and the 401s and 403s of authentication and roles — is logged at WARNING with the
method, path and peer, as the gRPC server logs its refusals (`rackflow.api.auth`). The refusal is a JSON
error in the API's shape (`{"code", "message", "field"}`), for pages as for the API.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rackflow.config import DEFAULT_HTTP_MAX_BODY_BYTES

log = logging.getLogger(__name__)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
ANY_HOST = "*"
JSON_MEDIA_TYPE = "application/json"
SAME_ORIGIN_FETCH = frozenset({"same-origin", "none"})
# Responses logged as refusals: authentication, authorization and the guard's own.
REFUSAL_STATUSES = frozenset({401, 403, 413, 415})
# A refusal's body is read back for the log line only up to this much (error bodies are small).
_LOGGED_BODY_BYTES = 4096


class BodyTooLarge(Exception):
    """Raised by the guarded `receive` when a body outgrows the limit; the guard answers it with 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is larger than the limit of {limit} bytes")


@dataclass(frozen=True)
class HttpSecurity:
    """The guard's settings (`rackflow serve --http-*`, docs/CONFIGURATION.md)."""

    # The host of --http-listen: a named or numbered address is itself a name served; a wildcard
    # (0.0.0.0, ::) serves any address of this machine, so any IP literal and the machine's name pass.
    listen_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_HTTP_MAX_BODY_BYTES
    _names: frozenset[str] = field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        names = {*LOOPBACK_NAMES, *(_host_name(h) for h in self.allowed_hosts)}
        if self.listen_host in WILDCARD_HOSTS:
            names.add(socket.gethostname().lower())
        else:
            names.add(_host_name(self.listen_host))
        object.__setattr__(self, "_names", frozenset(names))

    def host_allowed(self, host: str) -> bool:
        name = _host_name(host)
        if ANY_HOST in self._names or name in self._names:
            return True
        return self.listen_host in WILDCARD_HOSTS and _is_ip(name)

    def origin_allowed(self, origin: str, host: str) -> bool:
        """The request's `Origin` is this server (the host and port it was asked for) or an allowed one."""
        if origin.rstrip("/") in (o.rstrip("/") for o in self.allowed_origins):
            return True
        netloc = urlsplit(origin).netloc.lower()
        return bool(netloc) and netloc == host.lower()


def _host_name(host: str) -> str:
    """`Host` without its port, lower case, without brackets or a trailing dot: `[::1]:80` -> `::1`."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def peer_of(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown"


def error_body(code: str, message: str) -> bytes:
    return json.dumps({"code": code, "message": message, "field": None}, separators=(",", ":")).encode()


class RequestGuard:
    """ASGI middleware: the checks above, the body limit, and the refusal log."""

    def __init__(self, app: ASGIApp, security: HttpSecurity) -> None:
        self.app = app
        self.security = security

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        logged_send = _RefusalLog(scope, send)
        refusal = self._refusal(scope)
        if refusal is not None:
            await _refuse(logged_send, *refusal)
            return
        limited = _LimitedBody(receive, self.security.max_body_bytes)
        try:
            await self.app(scope, limited, logged_send)
        except BodyTooLarge as exc:
            if logged_send.started:
                raise
            await _refuse(logged_send, 413, "RESOURCE_EXHAUSTED", str(exc))

    def _refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, code, message) when the request is refused before it runs; None to let it in."""
        headers = _headers(scope)
        host = headers.get("host", "")
        if host and not self.security.host_allowed(host):
            return (
                403,
                "PERMISSION_DENIED",
                (f"Host {host!r} is not a name this server is served under (--http-allowed-hosts)"),
            )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.security.max_body_bytes:
            return 413, "RESOURCE_EXHAUSTED", str(BodyTooLarge(self.security.max_body_bytes))
        if scope["method"] in SAFE_METHODS:
            return None
        origin, fetch_site = headers.get("origin"), headers.get("sec-fetch-site")
        if origin is not None:
            if not self.security.origin_allowed(origin, host):
                return (
                    403,
                    "PERMISSION_DENIED",
                    (
                        f"cross-origin request refused: Origin {origin!r} is not this server "
                        "(--http-allowed-origins)"
                    ),
                )
        elif fetch_site is not None and fetch_site not in SAME_ORIGIN_FETCH:
            return 403, "PERMISSION_DENIED", f"cross-origin request refused (Sec-Fetch-Site: {fetch_site})"
        content_type = headers.get("content-type")
        has_body = (length.isdigit() and int(length) > 0) or "transfer-encoding" in headers
        if content_type is not None or has_body:
            media_type = (content_type or "").partition(";")[0].strip().lower()
            if media_type != JSON_MEDIA_TYPE:
                shown = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
                return (
                    415,
                    "INVALID_ARGUMENT",
                    (f"a request body must be sent as Content-Type: {JSON_MEDIA_TYPE} (got {shown})"),
                )
        return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = error_body(code, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _LimitedBody:
    """`receive` that counts the body's bytes and raises `BodyTooLarge` past the limit."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self.receive = receive
        self.limit = limit
        self.read = 0

    async def __call__(self) -> Message:
        message = await self.receive()
        if message["type"] == "http.request":
            self.read += len(message.get("body", b""))
            if self.read > self.limit:
                raise BodyTooLarge(self.limit)
        return message


class _RefusalLog:
    """`send` that logs a refusal (a status of REFUSAL_STATUSES) once its body, and so its reason, is sent."""

    def __init__(self, scope: Scope, send: Send) -> None:
        self.scope = scope
        self.send = send
        self.started = False
        self.status = 0
        self.body = b""

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            self.status = message["status"]
        elif message["type"] == "http.response.body" and self.status in REFUSAL_STATUSES:
            self.body = (self.body + message.get("body", b""))[:_LOGGED_BODY_BYTES]
            if not message.get("more_body", False):
                log.warning(
                    "refused %s %s from %s: %s %s",
                    self.scope["method"],
                    self.scope["path"],
                    peer_of(self.scope),
                    self.status,
                    _reason(self.body),
                )
        await self.send(message)


def _reason(body: bytes) -> str:
    """The message of a JSON error body (an API error or the guard's), else the body as text."""
    try:
        data: Any = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")
    return str(data.get("message", data)) if isinstance(data, dict) else str(data)
