"""A request whose bytes do not parse is INVALID_ARGUMENT, for every RPC, in one place.

gRPC parses a request before any handler runs, so the `rpc` decorator of `rackflow.api.errors` never sees
a parse that fails (a string field that is not valid UTF-8, as an operator's tool may send): the error
escaped from grpc's own code, which answered UNKNOWN ("Unexpected <class 'DecodeError'>") and logged a
traceback. This interceptor gives every unary request a deserializer that keeps such a failure as an
`Unparsed` request, and answers it, before the handler (or the audit interceptor, which has no request to
convert) sees it, with the table's code for `InvalidArgument` and the parser's reason. A mutating RPC's is
recorded in the audit trail first, as the parser's reason (`AuditInterceptor.record_refusal`): every call
that could have changed something has its row, whether it ran or was refused, and why.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from rackflow.api.auth import Behavior, RecordRefusal, is_mutating, rpc_name
from rackflow.api.errors import message_of, status_for
from rackflow.errors import InvalidArgument
from rackflow.security import current_principal

Deserializer = Callable[[bytes], Any]


class Unparsed:
    """A request that did not parse, held as the parser's reason, e.g. `Error parsing message with type
    'rackflow.v1.CreateRackRequest': String field had bad UTF-8`."""

    def __init__(self, error: DecodeError) -> None:
        self.error = error


def _keeping_failures(deserializer: Deserializer) -> Deserializer:
    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            return Unparsed(exc)

    return deserialize


def _refusing_unparsed(behavior: Behavior, rpc: str | None, record_refusal: RecordRefusal) -> Behavior:
    """`behavior`, refusing an `Unparsed` request; `rpc` (a Flow RPC's name) recorded when it mutates."""

    async def refusing(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, Unparsed):
            refusal = InvalidArgument(f"request: the bytes sent do not parse: {request.error}")
            status, message = status_for(refusal), message_of(refusal)
            if rpc is not None and is_mutating(rpc):
                await record_refusal(rpc, request, current_principal.get(), status.name, message)
            await context.abort(status, message)
        return await behavior(request, context)

    return refusing


class DecodeInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses an unparsable request to any unary-unary RPC (every Flow RPC, and health's Check), a mutating
    RPC's recorded by `record_refusal` (the auth interceptor, outside this one, has set its principal)."""

    def __init__(self, record_refusal: RecordRefusal) -> None:
        self.record_refusal = record_refusal

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        return grpc.unary_unary_rpc_method_handler(
            _refusing_unparsed(
                handler.unary_unary, rpc_name(handler_call_details.method), self.record_refusal
            ),
            request_deserializer=_keeping_failures(handler.request_deserializer),
            response_serializer=handler.response_serializer,
        )
