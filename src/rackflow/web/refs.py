"""`{ref}` in a URL names a schedule, a rack or a maintenance window by id or by name; an id wins when a
name looks like one."""

from __future__ import annotations

import uuid

from rackflow.client import is_uuid
from rackflow.services import Services


async def schedule_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.schedules.id_by_name(ref, field)


async def rack_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.inventory.rack_id_by_name(ref, field)


async def window_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.windows.id_by_name(ref, field)


async def check_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.checks.id_by_name(ref, field)
