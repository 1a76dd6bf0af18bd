"""Who is calling, and may they? The authentication interceptor and the role of every RPC.

The principal is a bearer token's name (`authorization: Bearer <token>`) when tokens are configured; else
the client certificate's subject CN under mutual TLS; else `anonymous` (only possible on loopback or with
`--insecure`, see `rackflow.security.check_exposure`). Without tokens every caller may do everything (the
approver role, which holds the operator's): the listener itself (loopback, or a CA-signed client
certificate) is then the access control. A token gets the approver role from its entry's `role: approver`
(docs/SECURITY.md); only it may approve or reject a run awaiting approval. The two-person rule tells a
token's and a certificate's principals apart, never anonymous ones (`rackflow.security.caller_identified`).

Health and reflection are not intercepted, so load balancers and grpcurl work without a token. The
principal is published in `current_principal` for the audit interceptor, which runs inside this one. A call
the principal's role may not make never reaches it, and is recorded in the audit trail here, before it is
refused (docs/SECURITY.md, "Audit trail").
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import grpc

from rackflow.api.errors import message_of, status_for
from rackflow.errors import PermissionDenied, Unauthenticated
from rackflow.security import (
    ANONYMOUS,
    RESERVED_WHY,
    Principal,
    Role,
    TokenTable,
    current_principal,
    reserved_name,
)
from rackflow.v1 import flow_pb2

log = logging.getLogger(__name__)

FLOW_PREFIX = f"/{flow_pb2.DESCRIPTOR.services_by_name['Flow'].full_name}/"
READ_PREFIXES = ("Get", "List", "Preview", "Check")
# The RPCs only the approver role may call (docs/SAFETY.md, "Approval").
APPROVER_RPCS = frozenset({"ApproveTaskScheduleRun", "RejectTaskScheduleRun"})

Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
# Records in the audit trail a call (rpc, request, principal, outcome, error) refused before it runs: its
# role may not make it, or its request does not parse (`rackflow.api.audit.AuditInterceptor.record_refusal`).
RecordRefusal = Callable[[str, Any, Principal | None, str, str], Awaitable[None]]


def rpc_name(method: str) -> str | None:
    """`/rackflow.v1.Flow/GetRack` -> `GetRack`; None for other services (health, reflection)."""
    return method.removeprefix(FLOW_PREFIX) if method.startswith(FLOW_PREFIX) else None


def is_mutating(rpc: str) -> bool:
    return not rpc.startswith(READ_PREFIXES)


def required_role(rpc: str) -> Role:
    if rpc in APPROVER_RPCS:
        return Role.APPROVER
    return Role.OPERATOR if is_mutating(rpc) else Role.VIEWER


def bearer_token(metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
    """The token of the `authorization: Bearer …` header, or None when there is no such header."""
    for key, value in metadata:
        if key.lower() == "authorization" and isinstance(value, str):
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def certificate_name(auth_context: Mapping[str, Sequence[bytes]]) -> str | None:
    """The subject CN of the verified client certificate, if the connection presented one."""
    names = auth_context.get("x509_common_name") or []
    return names[0].decode(errors="replace") if names else None


def authenticate(tokens: TokenTable | None, token: str | None, cert_name: str | None) -> Principal:
    """The caller's principal, or `Unauthenticated` when tokens are required and not valid.

    Messages never contain the token. The HTTP API (`rackflow.web.auth`) authenticates with this too.
    """
    if tokens is None:
        if cert_name is not None:
            if reserved_name(cert_name):
                raise Unauthenticated(
                    f"the client certificate's CN {cert_name!r} is reserved: {RESERVED_WHY}"
                )
            return Principal(cert_name, Role.APPROVER, "certificate")
        return Principal(ANONYMOUS, Role.APPROVER, "anonymous")
    if token is None:
        raise Unauthenticated("a bearer token is required (authorization: Bearer)")
    entry = tokens.verify(token)
    if entry is None:
        raise Unauthenticated("the bearer token is not valid")
    return Principal(entry.name, entry.role, "token")


def authorize(principal: Principal, rpc: str) -> None:
    """`PermissionDenied` when the principal's role may not call `rpc`."""
    needed = required_role(rpc)
    if principal.role.holds(needed):
        return
    if needed is Role.APPROVER:
        raise PermissionDenied(
            f"{rpc}: the {principal.role.value} role of {principal.name!r} may not approve or reject runs; "
            "this one needs the approver role"
        )
    raise PermissionDenied(
        f"{rpc}: the {principal.role.value} role of {principal.name!r} may only call "
        f"{'/'.join(READ_PREFIXES)} RPCs; this one needs the operator role",
    )


def with_behavior(handler: grpc.RpcMethodHandler, behavior: Behavior) -> grpc.RpcMethodHandler:
    """The same unary-unary handler with a new behavior (every Flow RPC is unary-unary)."""
    return grpc.unary_unary_rpc_method_handler(
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class FlowInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """An interceptor of the Flow RPCs (all unary-unary): `wrap` returns the handler that serves `rpc`;
    anything else (health, reflection) passes untouched."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        rpc = rpc_name(handler_call_details.method)
        if handler is None or rpc is None or handler.unary_unary is None:
            return handler
        return self.wrap(rpc, handler)

    def wrap(self, rpc: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        raise NotImplementedError


class AuthInterceptor(FlowInterceptor):
    """Refuses a caller without valid credentials (logged only: anyone can send those, and recording them
    would let anyone fill the audit trail) and a caller whose role may not call the RPC (logged, and
    recorded by `record_refusal`: every such RPC is a mutating one, audited had it been allowed)."""

    def __init__(self, tokens: TokenTable | None, record_refusal: RecordRefusal) -> None:
        self.tokens = tokens
        self.record_refusal = record_refusal

    def wrap(self, rpc: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if self.tokens is None and not is_mutating(rpc):
            return handler  # any caller may read, and only mutations are audited: nothing to check
        return with_behavior(handler, self._guarded(rpc, handler.unary_unary))

    def _guarded(self, rpc: str, behavior: Behavior) -> Behavior:
        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                principal = authenticate(
                    self.tokens,
                    bearer_token(context.invocation_metadata() or ()),
                    certificate_name(context.auth_context()),
                )
            except Unauthenticated as exc:
                log.warning("refused %s from %s: %s", rpc, context.peer(), exc)
                await context.abort(status_for(exc), message_of(exc))
            try:
                authorize(principal, rpc)
            except PermissionDenied as exc:
                log.warning("refused %s from %s: %s", rpc, context.peer(), exc)
                await self.record_refusal(rpc, request, principal, status_for(exc).name, message_of(exc))
                await context.abort(status_for(exc), message_of(exc))
            reset = current_principal.set(principal)
            try:
                return await behavior(request, context)
            finally:
                current_principal.reset(reset)

        return guarded
