"""The audit interceptor: every mutating RPC is recorded once, outside the servicers.

Design: the servicers know nothing about auditing. This interceptor wraps every Flow RPC that is not a
read (see `rackflow.api.auth.is_mutating`), runs it, and then writes one `audit_events` row: the principal
(set by the auth interceptor, which runs outside this one), the RPC name, the ids it touched (every UUID in
the request, the ids of what the response returned: a created rack, schedule or the submitted tasks, and
the schedule a scope RPC changed),
the outcome (`OK` or the status code name) and the request as JSON. For schedule RPCs the row also holds
the schedule (row and scopes) as read just before the call and just after it, so it shows what changed.
A create has no "before" and reads nothing before the call.

The rows of concurrent RPCs are written together (`GroupCommit`, one writer per process): one transaction
reads all their "after" snapshots (two queries) and inserts all their rows (one INSERT), after the RPCs'
own transactions committed. The "after" snapshot is read there, not taken from the RPC's response,
because a `TaskSchedule` message lacks what the snapshot holds (the operation template, the timezone, the
scopes). `record` returns only once its row is committed, so an RPC that returned has its event in the
trail. What that saves: docs/PERFORMANCE.md, "api".

An audit failure cannot roll back or fail a mutation that succeeded: it is logged at ERROR and counted in
`rackflow_audit_write_failures_total` instead (a failed group is retried one row per transaction, so one
bad row does not lose its neighbours). The price is that a crash between the RPC's commit and the audit
commit loses those events, and a concurrent change to the same schedule can fall between a before and an
after snapshot (the after is read when its group is written, at most one round after the RPC committed).
`close` waits for queued rows, so a clean shutdown loses none.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from prometheus_client import Counter

from rackflow.api.auth import ANONYMOUS, Behavior, current_principal, is_mutating, rpc_name, with_behavior
from rackflow.clock import Clock
from rackflow.store import audit as store
from rackflow.store.db import Database
from rackflow.store.group_commit import GroupCommit
from rackflow.v1 import flow_pb2 as pb

log = logging.getLogger(__name__)

AUDIT_WRITE_FAILURES = Counter(
    "rackflow_audit_write_failures_total", "Audit events that could not be written (the RPC's result stands)."
)

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
_SCOPE_RPC = "RemoveTaskScheduleScope"
_CREATE_SCHEDULE_RPC = "CreateTaskSchedule"


def _ids_in(message: Message, *, deep: bool) -> Iterator[str]:
    """UUIDs in `message`: all of them (`deep`), or its own fields' and their children's `id` only."""
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        for item in value if field.is_repeated else (value,):
            if isinstance(item, pb.UUID):
                if item.id:
                    yield item.id
            elif deep:
                yield from _ids_in(item, deep=True)
            elif isinstance(own_id := getattr(item, "id", None), pb.UUID) and own_id.id:
                yield own_id.id


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


class AuditInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        # Concurrent RPCs' events share one transaction: one after-snapshot read and one INSERT per round.
        self._writer: GroupCommit[store.PendingEvent, None] = GroupCommit(db, store.write_events)

    async def close(self) -> None:
        """Wait for the events already queued to be written (before the database is closed)."""
        await self._writer.close()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        rpc = rpc_name(handler_call_details.method)
        if handler is None or rpc is None or handler.unary_unary is None or not is_mutating(rpc):
            return handler
        return with_behavior(handler, self.audited(rpc, handler.unary_unary))

    def audited(self, rpc: str, behavior: Behavior) -> Behavior:
        """`behavior` (a servicer method) recording its event; the HTTP API's actions go through this
        too (`rackflow.web.calls`), so they write the same rows as the same RPC over gRPC."""

        async def audited(request: Any, context: grpc.aio.ServicerContext) -> Any:
            schedule_id = await self._schedule_id_before(rpc, request)
            call = _AuditedCall(self, rpc, request, schedule_id, await self._before(schedule_id))
            try:
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
            await call.finish(response, store.OK, "")
            return response

        return audited

    async def _schedule_id_before(self, rpc: str, request: Any) -> uuid.UUID | None:
        if rpc in _SCHEDULE_ID_FIELD:
            return _parse_uuid(getattr(request, _SCHEDULE_ID_FIELD[rpc]).id)
        if rpc == _SCOPE_RPC and (scope_id := _parse_uuid(request.scope_id.id)) is not None:
            try:
                async with self.db.read() as conn:
                    return await store.schedule_of_scope(conn, scope_id)
            except Exception:
                log.exception("audit: cannot look up the schedule of scope %s", scope_id)
        return None

    async def _before(self, schedule_id: uuid.UUID | None) -> dict[str, Any] | None:
        if schedule_id is None:
            return None
        try:
            async with self.db.read() as conn:
                return await store.schedule_snapshot(conn, schedule_id)
        except Exception:
            log.exception("audit: cannot read schedule %s for its before record", schedule_id)
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
    ) -> None:
        """Write the event; on failure log loudly and carry on, so the RPC's own result stands.

        Returns once the event is committed, so an RPC that returns has its event in the trail.
        """
        principal = current_principal.get()
        try:
            event = store.AuditEvent(
                id=uuid.uuid4(),
                at=self.clock.now(),
                principal=principal.name if principal else ANONYMOUS,
                method=rpc,
                target_ids=target_ids(request, response, *([str(schedule_id)] if schedule_id else [])),
                outcome=outcome,
                error=error,
                request=MessageToDict(request, preserving_proto_field_name=True),
                schedule_before=before,
            )
            await self._writer.write(store.PendingEvent(event, after_of=schedule_id))
        except Exception:
            AUDIT_WRITE_FAILURES.inc()
            log.exception(
                "AUDIT WRITE FAILED: %s by %s (outcome %s) is not in the audit trail",
                rpc,
                principal.name if principal else ANONYMOUS,
                outcome,
            )


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
        self.recorded = False

    async def finish(self, response: Message | None, outcome: str, error: str) -> None:
        if not self.recorded:
            self.recorded = True
            await self.interceptor.record(
                self.rpc, self.request, response, outcome, error, self.schedule_id, self.before
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
