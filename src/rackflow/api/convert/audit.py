"""Audit events to protobuf messages."""

from __future__ import annotations

import json
from typing import Any

from rackflow.api.convert import timestamp_to
from rackflow.domain.audit import AuditEvent
from rackflow.v1 import flow_pb2 as pb


def _json_or_empty(value: dict[str, Any] | list[dict[str, Any]] | None) -> str:
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
        changes_json=_json_or_empty(event.changes),
    )
