"""The one table from domain errors to status codes (gRPC and HTTP), and the decorator every RPC wears.

Nothing else in rackflow chooses a status code: the gRPC servicers abort with the code of this table, and
the HTTP API (`rackflow.web.api`) answers with the HTTP status of the same row. An unexpected exception is
logged with its traceback and answered INTERNAL (HTTP 500) without leaking details; bad input never
reaches that branch (the fuzz tests assert it).

An error that answers a firing (`errors.SubmittedNothing`: a trigger that fired but submitted no task) names
its run as a trigger's success does, in its trailing metadata (`trailing_metadata`): the run, when it
fired, and whether the error is an earlier call's answer again (`replayed`). Written here alone, and read
here alone (`answered_firing`), by the client and by the HTTP API's error body.

An answer heavier than a gRPC message may be (`config.GRPC_MESSAGE_BYTES`: a `ListRacks` with no limit over
20,000 racks of 36 components is about 95 MB) is refused RESOURCE_EXHAUSTED naming the RPC, its size and
how to ask for less (`too_large`), where gRPC would answer only "Sent message larger than max". Weighing
an answer costs about what serializing it does (4–8 ms of CPU for a 3 MB page of 1,000 racks of 36
components, about 1 % of that answer's time; microseconds for the usual answer).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from rackflow import errors
from rackflow.config import GRPC_MESSAGE_BYTES
from rackflow.timespec import format_rfc3339, parse_rfc3339

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
# An answer heavier than a message may be (`too_large`); 413 as the JSON API answers a body too large.
ANSWER_TOO_LARGE = Status(grpc.StatusCode.RESOURCE_EXHAUSTED, 413)

# The HTTP status of every code the servicers can abort with (the rows above, read by code).
HTTP_STATUS_FOR_CODE: dict[grpc.StatusCode, int] = {
    status.grpc: status.http for status in (*STATUS_FOR_ERROR.values(), INTERNAL, ANSWER_TOO_LARGE)
}


# What a status message may weigh, in UTF-8 bytes. gRPC carries it in a trailer, percent-encoding each
# byte outside printable ASCII as three characters, and a client refuses a trailer past its metadata limit
# (8 KiB soft, 16 KiB hard in gRPC core): it then sees RESOURCE_EXHAUSTED "Stream removed" instead of the
# code and the field. 2,000 bytes stay under the soft limit even when every byte is encoded.
MAX_MESSAGE_BYTES = 2000
_KEPT_TAIL_BYTES = 500  # of a longer message: its end, which says what was expected ("(one of …)")


def message_of(exc: errors.RackflowError) -> str:
    """`exc`'s message as gRPC and the JSON API send it: whole, or, past `MAX_MESSAGE_BYTES` (a refusal
    quoting a huge value), its start (the field) and its end with the middle left out and counted."""
    text = str(exc)
    data = text.encode()
    if len(data) <= MAX_MESSAGE_BYTES:
        return text
    marker_room = 60
    head = data[: MAX_MESSAGE_BYTES - _KEPT_TAIL_BYTES - marker_room].decode(errors="ignore")
    tail = data[-_KEPT_TAIL_BYTES:].decode(errors="ignore")
    left_out = len(text) - len(head) - len(tail)
    return f"{head}… ({left_out} characters left out) …{tail}"


def status_of(exc: errors.RackflowError) -> Status:
    for cls in type(exc).__mro__:
        if cls in STATUS_FOR_ERROR:
            return STATUS_FOR_ERROR[cls]
    return INTERNAL


def status_for(exc: errors.RackflowError) -> grpc.StatusCode:
    return status_of(exc).grpc


# The trailing metadata of an error that answers a firing: its run's id, when it fired (RFC 3339, UTC),
# and "true" when it is the answer of an earlier call with the same request id (this call fired nothing).
RUN_ID_KEY = "rackflow-run-id"
FIRED_AT_KEY = "rackflow-fired-at"
REPLAYED_KEY = "rackflow-replayed"


@dataclass(frozen=True)
class AnsweredFiring:
    """The firing an error answers, as its client reads it from the trailing metadata."""

    run_id: uuid.UUID
    fired_at: datetime
    replayed: bool


def trailing_metadata(exc: errors.RackflowError) -> tuple[tuple[str, str], ...]:
    """What `exc`'s status carries beside its code and message: the firing it answers, if it answers one."""
    if not isinstance(exc, errors.SubmittedNothing):
        return ()
    return (
        (RUN_ID_KEY, str(exc.run_id)),
        (FIRED_AT_KEY, format_rfc3339(exc.fired_at)),
        (REPLAYED_KEY, "true" if exc.replayed else "false"),
    )


def answered_firing(metadata: Iterable[tuple[str, str | bytes]] | None) -> AnsweredFiring | None:
    """The firing an error's trailing metadata names, or None: an error that answers none, or from a
    server too old to name it (then a client cannot say whether its call fired, and says nothing)."""
    found = {key: value for key, value in metadata or () if isinstance(value, str)}
    if not {RUN_ID_KEY, FIRED_AT_KEY} <= found.keys() or found.get(REPLAYED_KEY) not in ("true", "false"):
        return None
    try:
        return AnsweredFiring(
            uuid.UUID(found[RUN_ID_KEY]), parse_rfc3339(found[FIRED_AT_KEY]), found[REPLAYED_KEY] == "true"
        )
    except ValueError:
        return None


_R = TypeVar("_R")
Handler = Callable[[Any, Any, grpc.aio.ServicerContext], Awaitable[_R]]


def too_large(method: str, size: int) -> str | None:
    """Why an answer of `size` bytes to `method` cannot be sent, or None when it can."""
    if size <= GRPC_MESSAGE_BYTES:
        return None
    mib = 1024 * 1024
    return (
        f"{method}'s answer is {size / mib:.1f} MiB, past the {GRPC_MESSAGE_BYTES // mib} MiB a gRPC message"
        " may carry: ask for less (pages of at most 1,000 with pagination.limit, fewer ids, or the basic view"
        " where the RPC has one)"
    )


def rpc(handler: Handler[_R]) -> Handler[_R]:
    """Wrap a servicer method: domain errors become their status code, anything else INTERNAL, and an
    answer too large to send RESOURCE_EXHAUSTED saying how to ask for less."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> _R:
        try:
            answer = await handler(self, request, context)
        except errors.RackflowError as exc:
            await context.abort(status_for(exc), message_of(exc), trailing_metadata(exc))
        except Exception:
            log.exception("unexpected error in %s", handler.__name__)
            await context.abort(INTERNAL.grpc, INTERNAL_MESSAGE)
        else:
            refusal = too_large(handler.__name__, answer.ByteSize()) if isinstance(answer, Message) else None
            if refusal is None:
                return answer
            log.warning("refused to send an answer: %s", refusal)
            await context.abort(ANSWER_TOO_LARGE.grpc, refusal)
        raise AssertionError("unreachable: context.abort raises")

    return wrapper
