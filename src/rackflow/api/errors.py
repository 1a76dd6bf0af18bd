"""The one table from domain errors to gRPC status codes, and the decorator every RPC wears.

Nothing else in rackflow chooses a status code. An unexpected exception is logged with its traceback and
answered INTERNAL without leaking details; bad input never reaches that branch (the fuzz tests assert it).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from rackflow import errors

log = logging.getLogger(__name__)

STATUS_FOR_ERROR: dict[type[errors.RackflowError], grpc.StatusCode] = {
    errors.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotFound: grpc.StatusCode.NOT_FOUND,
    errors.AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    errors.FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}


def status_for(exc: errors.RackflowError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_FOR_ERROR:
            return STATUS_FOR_ERROR[cls]
    return grpc.StatusCode.INTERNAL


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
            await context.abort(grpc.StatusCode.INTERNAL, "internal error (logged on the server)")
        raise AssertionError("unreachable: context.abort raises")

    return wrapper
