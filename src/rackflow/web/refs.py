"""`{ref}` in a URL names a schedule, a rack, a maintenance window or an operation budget by id or by name;
an id wins when a name looks like one. An audit target may be a name of any kind (`audit_target_id`)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rackflow.domain.audit import target_lookups, target_named
from rackflow.errors import NotFound
from rackflow.ids import is_uuid
from rackflow.services import Services


async def schedule_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.schedules.id_by_name(ref, field)


async def rack_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.inventory.rack_id_by_name(ref, field)


async def window_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.windows.id_by_name(ref, field)


async def budget_id(services: Services, ref: str, field: str) -> uuid.UUID:
    """Budgets are few and have no name index: a name is looked for in the list (as the CLI does)."""
    if is_uuid(ref):
        return uuid.UUID(ref)
    for budget in await services.budgets.list_budgets():
        if budget.name == ref:
            return budget.id
    raise NotFound(f"{field}: no operation budget named {ref!r}")


async def check_id(services: Services, ref: str, field: str) -> uuid.UUID:
    return uuid.UUID(ref) if is_uuid(ref) else await services.checks.id_by_name(ref, field)


async def channel_id(services: Services, ref: str, field: str) -> uuid.UUID:
    """Notification channels are few and have no name index: a name is looked for in the list."""
    if is_uuid(ref):
        return uuid.UUID(ref)
    for shown in await services.notifications.list_channels():
        if shown.channel.name == ref:
            return shown.channel.id
    raise NotFound(f"{field}: no notification channel {ref!r}")


async def domain_id(services: Services, ref: str, field: str) -> uuid.UUID:
    """An NVLink domain by id, or by name (its unique index: a fleet may have 20,000 domains)."""
    if is_uuid(ref):
        return uuid.UUID(ref)
    return await services.inventory.domain_id_by_name(ref, field)


# What `{ref}` names under each collection of the JSON API (`/api/v1/schedules/{ref}`, …); runs and tasks
# have ids only.
BY_COLLECTION: dict[str, Callable[[Services, str, str], Awaitable[uuid.UUID]]] = {
    "schedules": schedule_id,
    "racks": rack_id,
    "windows": window_id,
    "budgets": budget_id,
    "checks": check_id,
    "notification-channels": channel_id,
}


@dataclass(frozen=True)
class _Lookups:
    """The dashboard's look-ups by name (`rackflow.domain.audit.TargetLookups`), each as its pages take a
    ref (`field`: the field a NotFound names)."""

    services: Services
    field: str

    def resolve_rack_id(self, name: str) -> Awaitable[uuid.UUID]:
        return rack_id(self.services, name, self.field)

    def resolve_schedule_id(self, name: str) -> Awaitable[uuid.UUID]:
        return schedule_id(self.services, name, self.field)

    def resolve_window_id(self, name: str) -> Awaitable[uuid.UUID]:
        return window_id(self.services, name, self.field)

    def resolve_domain_id(self, name: str) -> Awaitable[uuid.UUID]:
        return domain_id(self.services, name, self.field)

    def resolve_budget_id(self, name: str) -> Awaitable[uuid.UUID]:
        return budget_id(self.services, name, self.field)

    def resolve_check_id(self, name: str) -> Awaitable[uuid.UUID]:
        return check_id(self.services, name, self.field)

    def resolve_channel_id(self, name: str) -> Awaitable[uuid.UUID]:
        return channel_id(self.services, name, self.field)


async def audit_target_id(services: Services, ref: str, field: str) -> uuid.UUID:
    """The id an audit filter's target names: an id, or the name of one thing of any kind
    (`rackflow.domain.audit.target_lookups`; `target_named` refuses a name several kinds use)."""
    if is_uuid(ref):
        return uuid.UUID(ref)
    found: dict[str, str] = {}
    for kind, by_name in target_lookups(_Lookups(services, field)).items():
        try:
            found[kind] = str(await by_name(ref))
        except NotFound:
            continue
    return uuid.UUID(target_named(field, ref, found))
