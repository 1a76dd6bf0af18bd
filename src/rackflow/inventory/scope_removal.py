"""What removing a component does to the schedules that name it: the one way inventory changes scopes.

A scope entry whose component filter names the component loses it, and goes when it named no other: an
emptied filter must never read as "all components", which would power-cycle the whole rack. (Deleting a
rack needs nothing here: its scope entries go with it, `store.inventory.delete_rack`.)
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.inventory import Component, ComponentsFilter
from rackflow.domain.schedules import ScopeChange
from rackflow.store import schedules as store
from rackflow.store.db import Database


async def drop_component_from_scopes(
    db: Database, conn: AsyncConnection, component: Component
) -> list[ScopeChange]:
    """Narrow the scope entries naming the component to their other components, remove emptied ones, in
    the caller's transaction (which holds the component's rack). Returns what it changed, one entry per
    scope entry, for the log and the audit event.
    """
    changes: list[ScopeChange] = []
    for scope in await store.component_scopes_for_update(db, conn, component.rack_id):
        if component.id not in scope.filter.ids:
            continue
        remaining = scope.filter.ids - {component.id}
        if remaining:
            await store.set_scope_filter(conn, scope.scope_id, ComponentsFilter(remaining))
        changes.append(
            ScopeChange(
                scope.scope_id,
                scope.schedule_id,
                scope.schedule_name,
                component.rack_id,
                components_left=remaining or None,
            )
        )
    await store.delete_scopes(conn, [change.scope_id for change in changes if change.removed])
    return changes
