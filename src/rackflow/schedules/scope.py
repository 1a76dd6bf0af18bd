"""Scope arithmetic for the scope RPCs, without I/O: what to add, change and remove.

`merge` is AddTaskScheduleScope (additive: filters widen, racks are never removed); `reconcile` is
UpdateTaskScheduleScope (the scope becomes exactly the desired one). Both decide everything before the
caller writes anything, so a refused request changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from rackflow.domain.inventory import ComponentFilter, ComponentsFilter, RackSelection, TypesFilter
from rackflow.domain.schedules import Scope
from rackflow.errors import FailedPrecondition


def merge_filters(
    existing: ComponentFilter | None, incoming: ComponentFilter | None, rack_id: uuid.UUID
) -> ComponentFilter | None:
    """The seeds' merge table: all-components absorbs and widens; same kinds unite; mixed kinds fail."""
    if existing is None or incoming is None:
        return None
    if isinstance(existing, TypesFilter) and isinstance(incoming, TypesFilter):
        return TypesFilter(existing.types | incoming.types)
    if isinstance(existing, ComponentsFilter) and isinstance(incoming, ComponentsFilter):
        return ComponentsFilter(existing.ids | incoming.ids)
    raise FailedPrecondition(
        f"target_spec: rack {rack_id} is in scope with a {_kind(existing)} filter and cannot merge a "
        f"{_kind(incoming)} filter; use UpdateTaskScheduleScope or remove the scope entry first"
    )


def _kind(value: ComponentFilter) -> str:
    return "component-types" if isinstance(value, TypesFilter) else "component-ids"


@dataclass(frozen=True)
class ScopeChanges:
    """Writes that turn the current scope into the wanted one."""

    to_add: tuple[RackSelection, ...] = ()
    to_update: tuple[tuple[Scope, ComponentFilter | None], ...] = ()
    to_remove: tuple[Scope, ...] = ()

    @property
    def added(self) -> int:
        return len(self.to_add)

    @property
    def updated(self) -> int:
        return len(self.to_update)

    @property
    def removed(self) -> int:
        return len(self.to_remove)


def merge(existing: Sequence[Scope], incoming: Sequence[RackSelection]) -> ScopeChanges:
    """AddTaskScheduleScope: new racks are added as given, racks in scope get merged filters.

    Raises FailedPrecondition for the first rack whose filters cannot merge; nothing is to be written then.
    """
    current = {scope.rack_id: scope for scope in existing}
    added: dict[uuid.UUID, ComponentFilter | None] = {}
    merged: dict[uuid.UUID, ComponentFilter | None] = {}
    for selection in incoming:
        rack_id = selection.rack_id
        if rack_id in current:
            base = merged.get(rack_id, current[rack_id].filter)
            merged[rack_id] = merge_filters(base, selection.filter, rack_id)
        elif rack_id in added:
            added[rack_id] = merge_filters(added[rack_id], selection.filter, rack_id)
        else:
            added[rack_id] = selection.filter
    return ScopeChanges(
        to_add=tuple(RackSelection(rack_id, value) for rack_id, value in added.items()),
        to_update=tuple(
            (current[rack_id], value) for rack_id, value in merged.items() if value != current[rack_id].filter
        ),
    )


def reconcile(current: Sequence[Scope], desired: Sequence[RackSelection]) -> ScopeChanges:
    """UpdateTaskScheduleScope: make the scope exactly `desired` (one selection per rack).

    Raises FailedPrecondition for an empty desired scope: a schedule without scope is a deleted schedule.
    """
    if not desired:
        raise FailedPrecondition(
            "desired_scope: a schedule needs at least one rack; delete the schedule instead"
        )
    wanted = {selection.rack_id: selection.filter for selection in desired}
    have = {scope.rack_id: scope for scope in current}
    return ScopeChanges(
        to_add=tuple(
            RackSelection(rack_id, value) for rack_id, value in wanted.items() if rack_id not in have
        ),
        to_update=tuple(
            (have[rack_id], value)
            for rack_id, value in wanted.items()
            if rack_id in have and have[rack_id].filter != value
        ),
        to_remove=tuple(scope for scope in current if scope.rack_id not in wanted),
    )
