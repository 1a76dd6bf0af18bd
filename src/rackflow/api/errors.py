"""The one table from domain errors to status codes (gRPC and HTTP), and the decorator every RPC wears.

Nothing else in rackflow chooses a status code: the gRPC servicers abort with the code of this table, and
the HTTP API (`rackflow.web.api`) answers with the HTTP status of the same row. An unexpected exception is
logged with its traceback and answered INTERNAL (HTTP 500) without leaking details; bad input never
reaches that branch (the fuzz tests assert it).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from rackflow import errors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Status:
    grpc: grpc.StatusCode
    http: int


STATUS_FOR_ERROR: dict[type[errors.RackflowError], Status] = {
    errors.InvalidArgument: Status(grpc.StatusCode.INVALID_ARGUMENT, 400),
    errors.NotFound: Status(grpc.StatusCode.NOT_FOUND, 404),
    errors.AlreadyExists: Status(grpc.StatusCode.ALREADY_EXISTS, 409),
    errors.FailedPrecondition: Status(grpc.StatusCode.FAILED_PRECONDITION, 412),
    errors.Unauthenticated: Status(grpc.StatusCode.UNAUTHENTICATED, 401),
    errors.PermissionDenied: Status(grpc.StatusCode.PERMISSION_DENIED, 403),
    errors.Unavailable: Status(grpc.StatusCode.UNAVAILABLE, 503),
}
INTERNAL = Status(grpc.StatusCode.INTERNAL, 500)
INTERNAL_MESSAGE = "internal error (logged on the server)"

# The HTTP status of every code the servicers can abort with (the rows above, read by code).
HTTP_STATUS_FOR_CODE: dict[grpc.StatusCode, int] = {
    status.grpc: status.http for status in (*STATUS_FOR_ERROR.values(), INTERNAL)
}


def status_of(exc: errors.RackflowError) -> Status:
    for cls in type(exc).__mro__:
        if cls in STATUS_FOR_ERROR:
            return STATUS_FOR_ERROR[cls]
    return INTERNAL


def status_for(exc: errors.RackflowError) -> grpc.StatusCode:
    return status_of(exc).grpc


_R = TypeVar("_R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[_R]]


def rpc(handler: Handler[_R]) -> Handler[_R]:
    """Wrap a servicer method: domain errors become their status code, anything else INTERNAL."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> _R:
        try:
            return await handler(self, request, context)
        except errors.RackflowError as exc:
            await context.abort(status_for(exc), str(exc))
        except Exception:
            log.exception("unexpected error in %s", handler.__name__)
            await context.abort(INTERNAL.grpc, INTERNAL_MESSAGE)
        raise AssertionError("unreachable: context.abort raises")

    return wrapper
