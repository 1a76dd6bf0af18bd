"""What removing a component does to the schedules that name it: the one way inventory changes scopes.

A scope entry whose component filter names the component loses it, and goes when it named no other: an
emptied filter must never read as "all components", which would power-cycle the whole rack. (Deleting a
rack needs nothing here: its scope entries go with it by ON DELETE CASCADE.)
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.inventory import Component, ComponentsFilter
from rackflow.store import schedules as store
from rackflow.store.db import Database


async def drop_component_from_scopes(db: Database, conn: AsyncConnection, component: Component) -> list[str]:
    """Narrow the scope entries naming the component to their other components, remove emptied ones, in
    the caller's transaction (which holds the component's rack). Returns what changed, one line per scope
    entry, for the log.
    """
    changes: list[str] = []
    emptied: list[uuid.UUID] = []
    for scope in await store.component_scopes_for_update(db, conn, component.rack_id):
        if component.id not in scope.filter.ids:
            continue
        remaining = scope.filter.ids - {component.id}
        if remaining:
            await store.set_scope_filter(conn, scope.scope_id, ComponentsFilter(remaining))
            changes.append(f"narrowed scope {scope.scope_id} of schedule {scope.schedule_name!r}")
        else:
            emptied.append(scope.scope_id)
            changes.append(
                f"removed scope {scope.scope_id} of schedule {scope.schedule_name!r} (no component left)"
            )
    await store.delete_scopes(conn, emptied)
    return changes
