"""Audit over gRPC: the interceptor that records every mutating RPC, and ListAuditEvents.

A mutating RPC refused before it runs is recorded too (`AuditInterceptor.record_refusal`): one the
caller's role may not make (the auth interceptor and the HTTP API call it before they refuse it, as
`PERMISSION_DENIED`), one whose request does not parse (the decoding interceptor; over HTTP, its body), and
an HTTP call refused before its RPC ran (a name in its path that names nothing, a query parameter).

The servicers know nothing about auditing. The interceptor wraps every Flow RPC that is not a read (see
`rackflow.api.auth.is_mutating`), runs it, and records one event in the audit trail (`rackflow.audit`):
the principal (set by the auth interceptor, which runs outside this one), the RPC name, the ids it touched
(every UUID in the request, the ids of what the response returned: a created rack, schedule or the
submitted tasks, the schedule a scope RPC changed, and the schedules whose scope DeleteRack or
RemoveComponent changed), the outcome (`OK` or the status code name) and the request as JSON. For schedule
RPCs the event also holds the schedule as read just before the call and just after it, so it shows what
changed; a create has no "before" and reads nothing before the call. What a service changed that the
request does not name (those scope entries) it notes itself, from its transaction's result, while the
interceptor listens (`rackflow.audit.changes`). How the
trail writes, and what an audit failure does (nothing to the RPC), is `rackflow.audit.trail`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import text_format
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from grpc.aio import ServicerContext as Context

from rackflow.api.auth import Behavior, FlowInterceptor, is_mutating, with_behavior
from rackflow.api.convert import (
    next_page_token,
    page_from,
    required_uuid,
    timestamp_from,
    total_to,
)
from rackflow.api.convert.audit import audit_event_to
from rackflow.api.convert.checks import check_without_secrets
from rackflow.api.convert.notifications import without_secrets
from rackflow.api.decoding import Unparsed
from rackflow.api.errors import rpc
from rackflow.audit.changes import Changes, noting
from rackflow.audit.trail import AuditTrail
from rackflow.domain.audit import OK, SYSTEM_METHODS, EventFilter
from rackflow.errors import InvalidArgument
from rackflow.security import Principal, audited_name, current_principal
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:
    from rackflow.services import Services

RPC_NAMES = frozenset(pb.DESCRIPTOR.services_by_name["Flow"].methods_by_name)

# Schedule RPCs whose request names the schedule, and the field that does.
_SCHEDULE_ID_FIELD = {
    "UpdateTaskSchedule": "id",
    "PauseTaskSchedule": "id",
    "ResumeTaskSchedule": "id",
    "DeleteTaskSchedule": "id",
    "TriggerTaskSchedule": "id",
    "AddTaskScheduleScope": "schedule_id",
    "UpdateTaskScheduleScope": "schedule_id",
}
# RPCs on a run whose event names the run's schedule, as their services note it once they read the run
# (`audit.changes.note_schedule_of_run`); a call refused before it ran reads it for its event
# (`record_refusal`).
_RUN_RPCS = frozenset({"ApproveTaskScheduleRun", "RejectTaskScheduleRun", "RetryTaskScheduleRun"})
_SCOPE_RPC = "RemoveTaskScheduleScope"
_CREATE_SCHEDULE_RPC = "CreateTaskSchedule"


@dataclass(frozen=True)
class WithUnparsedBody:
    """A JSON API call refused before it ran whose path parsed and whose body did not: recorded as the
    request its path gives (the ids it names), with `unparsed_body` (`rackflow.web.bodies.unparsed_body`:
    why, and the body as sent, bounded and without secrets) beside its fields."""

    request: Message
    unparsed_body: dict[str, Any]


def _ids_in(message: Message, *, deep: bool) -> Iterator[str]:
    """UUIDs in `message`: all of them (`deep`), or its own fields' and their children's `id` only."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in value if field.is_repeated else (value,):
            if isinstance(item, pb.UUID):
                if item.id:
                    yield _canonical(item.id)
            elif deep:
                yield from _ids_in(item, deep=True)
            elif isinstance(own_id := getattr(item, "id", None), pb.UUID) and own_id.id:
                yield _canonical(own_id.id)


def _canonical(raw: str) -> str:
    """The id as rackflow writes it: the API takes any spelling `uuid.UUID` reads (upper case, braces,
    `urn:uuid:`, no hyphens), and a spelling kept as sent would name the same thing twice in one event and
    match no id anywhere else (the dashboard showed it as gone). What is not a UUID is kept as sent: the
    refused call's row shows what was asked."""
    parsed = _parse_uuid(raw)
    return str(parsed) if parsed is not None else raw


def target_ids(request: Message, response: Message | None, *also: str) -> tuple[str, ...]:
    """Every id in the request, then the ids of what the response returned, then `also`; each once."""
    found = list(_ids_in(request, deep=True))
    if response is not None:
        found += _ids_in(response, deep=False)
    return tuple(dict.fromkeys([*found, *also]))


def _parse_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


class AuditInterceptor(FlowInterceptor):
    """Records every mutating RPC in `trail` (the process's `Services.audit`)."""

    def __init__(self, trail: AuditTrail) -> None:
        self.trail = trail

    def wrap(self, rpc: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if not is_mutating(rpc):
            return handler
        return with_behavior(handler, self.audited(rpc, handler.unary_unary))

    def audited(self, rpc: str, behavior: Behavior) -> Behavior:
        """`behavior` (a servicer method) recording its event; the HTTP API's actions go through this
        too (`rackflow.web.calls`), so they write the same rows as the same RPC over gRPC."""

        async def audited(request: Any, context: grpc.aio.ServicerContext) -> Any:
            schedule_id = await self._schedule_id_before(rpc, request)
            call = _AuditedCall(
                self, rpc, request, schedule_id, await self.trail.schedule_before(schedule_id)
            )
            try:
                with noting(call.changes):
                    response = await behavior(request, _RecordingContext(context, call))
            except asyncio.CancelledError:
                await asyncio.shield(call.finish(None, "CANCELLED", ""))
                raise
            except Exception:
                code = context.code() or grpc.StatusCode.UNKNOWN
                await call.finish(None, code.name, context.details() or "")
                raise
            if rpc == _CREATE_SCHEDULE_RPC:
                call.schedule_id = _parse_uuid(response.id.id)
            await call.finish(response, OK, "")
            return response

        return audited

    async def record_refusal(
        self, rpc: str, request: Any, principal: Principal | None, outcome: str, error: str
    ) -> None:
        """Record a call refused before it runs, as a call refused by its service is recorded: the
        principal (None: anonymous), the RPC, its ids, the refusal's status (`outcome`, its code's name)
        with the message the caller gets (`error`), a schedule RPC's schedule as it stands (before and
        after alike: nothing ran), and an approval's, a rejection's or a retry's run's schedule among its
        ids. Refused so: a call `principal`'s role may not make (`api.auth.authorize`: over gRPC by the
        auth interceptor, over HTTP by `rackflow.web.calls`); a request whose bytes do not parse
        (`rackflow.api.decoding`); a JSON API call refused before its RPC ran (`rackflow.web.api`: its
        body, a name in its path that names nothing, a query parameter).

        Why: such refusals were only logged, or not even that, so the trail never showed that a viewer's
        token tried to delete a schedule, or that an operator's script sent a pause the server could not
        read. A request whose bytes do not parse is recorded as the parser's reason, naming no id; a JSON
        API request whose body does not parse (`WithUnparsedBody`), as its path's request with the body as
        sent beside it (`unparsed_body`). Returns once the event is committed or spooled; never raises
        (`AuditTrail.record`).
        """
        reset = current_principal.set(principal)
        try:
            if isinstance(request, Unparsed):
                await self.trail.record(
                    principal=audited_name(),
                    method=rpc,
                    target_ids=(),
                    outcome=outcome,
                    error=error,
                    request={"unparsed": f"the bytes sent do not parse: {request.error}"},
                )
                return
            sent_body = None
            if isinstance(request, WithUnparsedBody):
                request, sent_body = request.request, request.unparsed_body
            schedule_id = await self._schedule_id_before(rpc, request)
            call = _AuditedCall(
                self, rpc, request, schedule_id, await self.trail.schedule_before(schedule_id)
            )
            call.unparsed_body = sent_body
            run_id = _parse_uuid(request.id.id) if rpc in _RUN_RPCS else None
            if run_id is not None and (of_run := await self.trail.schedule_of_run(run_id)) is not None:
                call.changes.target_ids.append(str(of_run))
            await call.finish(None, outcome, error)
        finally:
            current_principal.reset(reset)

    async def _schedule_id_before(self, rpc: str, request: Any) -> uuid.UUID | None:
        if rpc in _SCHEDULE_ID_FIELD:
            return _parse_uuid(getattr(request, _SCHEDULE_ID_FIELD[rpc]).id)
        if rpc == _SCOPE_RPC and (scope_id := _parse_uuid(request.scope_id.id)) is not None:
            return await self.trail.schedule_of_scope(scope_id)
        return None

    async def record(
        self,
        rpc: str,
        request: Message,
        response: Message | None,
        outcome: str,
        error: str,
        schedule_id: uuid.UUID | None,
        before: dict[str, Any] | None,
        changes: Changes | None = None,
        unparsed_body: dict[str, Any] | None = None,
    ) -> None:
        """Record the RPC in the trail: the gRPC request and response converted, the caller's principal,
        what its service noted it changed (and, for a refused HTTP call, the body that did not parse).

        Returns once the event is committed, so an RPC that returns has its event in the trail; never
        raises (`AuditTrail.record`).
        """
        noted = changes or Changes()
        await self.trail.record(
            event_id=noted.event_id,
            principal=audited_name(),
            method=rpc,
            target_ids=target_ids(
                request, response, *noted.target_ids, *([str(schedule_id)] if schedule_id else [])
            ),
            outcome=outcome,
            error=error,
            request=_as_dict(check_without_secrets(without_secrets(request)))
            | ({"unparsed_body": unparsed_body} if unparsed_body is not None else {}),
            schedule_id=schedule_id,
            before=before,
            changes=noted.recorded or None,
        )


def _as_dict(request: Message) -> dict[str, Any]:
    """The request as the trail keeps it (JSON names as in the proto). A request JSON cannot render (a
    Timestamp out of its range in a field the handler does not read, which the change went through with)
    is kept as protobuf text instead: the change is in the trail either way, and the call answers as it
    would have (the rendering's error had turned it into UNKNOWN, with no row)."""
    try:
        return dict(MessageToDict(request, preserving_proto_field_name=True))
    except Exception as exc:
        text = text_format.MessageToString(request, as_one_line=True)
        return {"unrendered": f"not JSON ({type(exc).__name__}): {text}"}


class _AuditedCall:
    """One audited RPC in flight; `finish` records it once, however the call ends."""

    def __init__(
        self,
        interceptor: AuditInterceptor,
        rpc: str,
        request: Message,
        schedule_id: uuid.UUID | None,
        before: dict[str, Any] | None,
    ) -> None:
        self.interceptor = interceptor
        self.rpc = rpc
        self.request = request
        self.schedule_id = schedule_id
        self.before = before
        self.changes = Changes()
        self.unparsed_body: dict[str, Any] | None = None  # a refused HTTP call's (`WithUnparsedBody`)
        self.recorded = False

    async def finish(self, response: Message | None, outcome: str, error: str) -> None:
        if not self.recorded:
            self.recorded = True
            await self.interceptor.record(
                self.rpc,
                self.request,
                response,
                outcome,
                error,
                self.schedule_id,
                self.before,
                self.changes,
                self.unparsed_body,
            )


class _RecordingContext:
    """The servicer's context, except that `abort` records the event first.

    `abort` sends the status to the client at once; recording afterwards would let a client see its error
    before the audit trail holds it.
    """

    def __init__(self, context: grpc.aio.ServicerContext, call: _AuditedCall) -> None:
        self._context = context
        self._call = call

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def abort(self, code: grpc.StatusCode, details: str = "", *args: Any, **kwargs: Any) -> None:
        await self._call.finish(None, code.name, details)
        await self._context.abort(code, details, *args, **kwargs)


# --- ListAuditEvents -------------------------------------------------------------------------------------


class AuditRpcs:
    """The audit part of the `Flow` servicer."""

    services: Services

    @rpc
    async def ListAuditEvents(
        self, request: pb.ListAuditEventsRequest, context: Context
    ) -> pb.ListAuditEventsResponse:
        if request.method and request.method not in RPC_NAMES | SYSTEM_METHODS:
            raise InvalidArgument(f"method: {request.method!r} is not an RPC of the Flow service")
        since = timestamp_from(request.since, "since") if request.HasField("since") else None
        page = page_from(request.pagination if request.HasField("pagination") else None, "ListAuditEvents")
        target = required_uuid(request.target, "target") if request.HasField("target") else None
        matching = EventFilter(since, request.method or None, request.principal or None, target)
        events, listed = await self.services.audit.list_events(
            matching, offset=page.offset, limit=page.limit, after=page.after
        )
        total, capped = total_to(listed.total, bounded=listed.count_bounded)
        # A walked page, short or empty, searches on; a page that ended early, its bytes full, goes on.
        token = next_page_token(
            "ListAuditEvents", page.limit, events, lambda e: (e.at, e.id), listed.searched_to
        )
        return pb.ListAuditEventsResponse(
            events=[audit_event_to(e) for e in events],
            total=total,
            total_capped=capped,
            next_page_token=token,
        )
