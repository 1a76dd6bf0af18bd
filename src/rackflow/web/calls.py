"""Run an RPC of the `Flow` servicer for an HTTP request: the JSON API's only way to do anything.

The servicer method is called exactly as gRPC calls it, with a context whose `abort` raises `RpcError`:
the `rpc` decorator has already turned a domain error into its status code and message, so the HTTP
status comes from the same table (`rackflow.api.errors`). The caller's role is checked by the gRPC rule
(`authorize`), and a mutating RPC is wrapped by the audit interceptor's own `audited`, so it writes the
same audit row as over gRPC, with the HTTP caller's principal; a call its role may not make is recorded
by the same `record_refusal` before it is refused, as over gRPC. The JSON API asks `authorize` for its
endpoint's RPC before it reads the body or looks up a name (`rackflow.web.api`), as gRPC checks the role
before it parses the request, so a refusal never depends on them. The console's buttons and forms post to
this API, so they are refused and recorded alike.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.api.audit import AuditInterceptor, WithUnparsedBody
from rackflow.api.auth import authorize, is_mutating
from rackflow.api.convert import timestamp_into
from rackflow.api.errors import HTTP_STATUS_FOR_CODE, AnsweredFiring, answered_firing, message_of, status_of
from rackflow.api.servicer import FlowServicer
from rackflow.errors import PermissionDenied, RackflowError
from rackflow.security import Principal, current_principal

# Messages name the field first: "schedule.spec.timezone: …", "task_ids[2]: …", "limit: …". Field names are
# snake_case; a message that starts with an RPC's name ("PauseTaskSchedule: the viewer role …") names none.
_FIELD_PREFIX = re.compile(r"^([a-z_][\w.\[\]]*): ")


class RpcError(Exception):
    """A refused or failed call, as the client sees it: status code, HTTP status, message, field, and the
    firing it answers when it answers one (what gRPC's trailing metadata carries, `api.errors`)."""

    def __init__(self, code: grpc.StatusCode, message: str, firing: AnsweredFiring | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.firing = firing

    @classmethod
    def of(cls, exc: RackflowError) -> RpcError:
        return cls(status_of(exc).grpc, message_of(exc))

    @property
    def http_status(self) -> int:
        return HTTP_STATUS_FOR_CODE.get(self.code, 500)

    @property
    def field(self) -> str | None:
        """The request field the message names first, if any."""
        match = _FIELD_PREFIX.match(self.message)
        return match.group(1) if match else None

    def to_json(self) -> dict[str, Any]:
        """The `Error` body; one that answers a firing names it as a trigger's success does (`run_id`,
        `fired_at`, `replayed`), so a page can say whether its request sent again had fired already."""
        body: dict[str, Any] = {"code": self.code.name, "message": self.message, "field": self.field}
        if self.firing is not None:
            fired_at = Timestamp()
            timestamp_into(fired_at, self.firing.fired_at)
            body["run_id"] = {"id": str(self.firing.run_id)}
            body["fired_at"] = fired_at.ToJsonString()  # as the success body writes it
            body["replayed"] = self.firing.replayed
        return body


class _HttpContext:
    """The part of `grpc.aio.ServicerContext` that servicers and the audit wrapper use."""

    def __init__(self) -> None:
        self._code: grpc.StatusCode | None = None
        self._details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> NoReturn:
        self._code, self._details = code, details
        raise RpcError(code, details, answered_firing(trailing_metadata))

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details


Behavior = Callable[[Message, Any], Awaitable[Message]]


class RpcCaller:
    def __init__(self, servicer: FlowServicer, audit: AuditInterceptor) -> None:
        self.servicer = servicer
        self.audit = audit

    async def authorize(
        self, rpc: str, principal: Principal, request: Callable[[], Awaitable[Message | WithUnparsedBody]]
    ) -> None:
        """`RpcError` (`PERMISSION_DENIED`) when the principal's role may not call `rpc`, recorded in the
        audit trail first with `request()` (made only then) as the call's request."""
        try:
            authorize(principal, rpc)
        except PermissionDenied as exc:
            refusal = RpcError.of(exc)
            await self.record_refused(rpc, await request(), principal, refusal)
            raise refusal from None

    async def record_refused(
        self, rpc: str, request: Message | WithUnparsedBody, principal: Principal, refusal: RpcError
    ) -> None:
        """Record in the audit trail a call to `rpc` refused before it ran (`record_refusal`)."""
        await self.audit.record_refusal(rpc, request, principal, refusal.code.name, refusal.message)

    async def __call__(self, rpc: str, request: Message, principal: Principal) -> Message:
        """The RPC's response; `RpcError` when it is refused (role, validation, state) or fails."""

        async def sent() -> Message:
            return request

        await self.authorize(rpc, principal, sent)
        behavior: Behavior = getattr(self.servicer, rpc)
        if is_mutating(rpc):
            behavior = self.audit.audited(rpc, behavior)
        reset = current_principal.set(principal)
        try:
            return await behavior(request, _HttpContext())
        finally:
            current_principal.reset(reset)
