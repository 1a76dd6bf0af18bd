"""The audit RPC: read the trail that `rackflow.api.audit.AuditInterceptor` writes."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from grpc.aio import ServicerContext as Context

from rackflow.api.convert import page_from, timestamp_from, timestamp_to
from rackflow.api.errors import rpc
from rackflow.errors import InvalidArgument
from rackflow.store.audit import AuditEvent, list_events
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import check_text

if TYPE_CHECKING:
    from rackflow.services import Services

RPC_NAMES = frozenset(pb.DESCRIPTOR.services_by_name["Flow"].methods_by_name)


def _json_or_empty(value: dict[str, Any] | None) -> str:
    return "" if value is None else json.dumps(value, sort_keys=True)


def audit_event_to(event: AuditEvent) -> pb.AuditEvent:
    return pb.AuditEvent(
        id=pb.UUID(id=str(event.id)),
        at=timestamp_to(event.at),
        principal=event.principal,
        method=event.method,
        target_ids=[pb.UUID(id=i) for i in event.target_ids],
        outcome=event.outcome,
        error=event.error,
        request_json=json.dumps(event.request, sort_keys=True),
        schedule_before_json=_json_or_empty(event.schedule_before),
        schedule_after_json=_json_or_empty(event.schedule_after),
    )


class AuditRpcs:
    """The audit part of the `Flow` servicer."""

    services: Services

    @rpc
    async def ListAuditEvents(
        self, request: pb.ListAuditEventsRequest, context: Context
    ) -> pb.ListAuditEventsResponse:
        if request.method and request.method not in RPC_NAMES:
            raise InvalidArgument(f"method: {request.method!r} is not an RPC of the Flow service")
        check_text(request.principal, "principal")  # no row can hold a longer or control-character name
        since = timestamp_from(request.since, "since") if request.HasField("since") else None
        offset, limit = page_from(request.pagination if request.HasField("pagination") else None)
        async with self.services.db.read() as conn:
            events, total = await list_events(
                conn,
                since=since,
                method=request.method or None,
                principal=request.principal or None,
                offset=offset,
                limit=limit,
            )
        return pb.ListAuditEventsResponse(events=[audit_event_to(e) for e in events], total=total)
