"""Audit trail queries: write one event, list events, and read a schedule as JSON for before/after."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.tables import audit_events, task_schedule, task_schedule_scope

OK = "OK"


@dataclass(frozen=True)
class AuditEvent:
    """One mutating RPC: who called `method` on which ids, when, and how it ended (`OK` or a code name)."""

    id: uuid.UUID
    at: datetime
    principal: str
    method: str
    target_ids: tuple[str, ...]
    outcome: str
    error: str
    request: dict[str, Any]
    schedule_before: dict[str, Any] | None = None
    schedule_after: dict[str, Any] | None = None


async def insert_event(conn: AsyncConnection, event: AuditEvent) -> None:
    await conn.execute(
        insert(audit_events).values(
            id=event.id,
            at=event.at,
            principal=event.principal,
            method=event.method,
            target_ids=list(event.target_ids),
            outcome=event.outcome,
            error=event.error,
            request=event.request,
            schedule_before=event.schedule_before,
            schedule_after=event.schedule_after,
        )
    )


async def list_events(
    conn: AsyncConnection,
    *,
    since: datetime | None = None,
    method: str | None = None,
    principal: str | None = None,
    offset: int = 0,
    limit: int | None = None,
) -> tuple[list[AuditEvent], int]:
    """One page of events, newest first, and the total matching the filters before paging."""
    where: list[ColumnElement[bool]] = []
    if since is not None:
        where.append(audit_events.c.at >= since)
    if method:
        where.append(audit_events.c.method == method)
    if principal:
        where.append(audit_events.c.principal == principal)
    total = (await conn.execute(select(func.count()).select_from(audit_events).where(*where))).scalar_one()
    query = (
        select(audit_events)
        .where(*where)
        .order_by(audit_events.c.at.desc(), audit_events.c.id.desc())
        .offset(offset)
        .limit(limit)
    )
    rows = (await conn.execute(query)).all()
    events = [
        AuditEvent(
            id=row.id,
            at=row.at,
            principal=row.principal,
            method=row.method,
            target_ids=tuple(row.target_ids),
            outcome=row.outcome,
            error=row.error,
            request=row.request,
            schedule_before=row.schedule_before,
            schedule_after=row.schedule_after,
        )
        for row in rows
    ]
    return events, int(total)


def _jsonable(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


async def schedule_snapshot(conn: AsyncConnection, schedule_id: uuid.UUID) -> dict[str, Any] | None:
    """The schedule row and its scopes as plain JSON, or None when there is no such schedule."""
    row = (await conn.execute(select(task_schedule).where(task_schedule.c.id == schedule_id))).first()
    if row is None:
        return None
    scope = task_schedule_scope.c
    scopes = (
        await conn.execute(
            select(scope.id, scope.rack_id, scope.component_filter)
            .where(scope.schedule_id == schedule_id)
            .order_by(scope.rack_id)
        )
    ).all()
    snapshot = {key: _jsonable(value) for key, value in row._mapping.items()}
    snapshot["scopes"] = [{key: _jsonable(value) for key, value in s._mapping.items()} for s in scopes]
    return snapshot


async def schedule_of_scope(conn: AsyncConnection, scope_id: uuid.UUID) -> uuid.UUID | None:
    query = select(task_schedule_scope.c.schedule_id).where(task_schedule_scope.c.id == scope_id)
    found: uuid.UUID | None = (await conn.execute(query)).scalar_one_or_none()
    return found
