"""Resolving a target spec to the racks it selects, and which components of each.

Shared by task submission and schedule scopes. Every lookup is batched (one IN query per kind of key and
chunk), so a 10,000-target spec costs a few dozen queries rather than 10,000. Errors name the target by its
position under the request's field that holds the spec (`target_spec.racks[3]`, or UpdateTaskScheduleScope's
`desired_scope.racks[3]`) and the value that failed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.inventory import (
    Component,
    ComponentsFilter,
    ComponentTarget,
    ComponentType,
    NVLDomainTarget,
    RackSelection,
    RackTarget,
    TargetSpec,
    TypesFilter,
)
from rackflow.errors import InvalidArgument, NotFound
from rackflow.store import inventory as store
from rackflow.validation import check_text

FIELD = "target_spec"


async def resolve_targets(conn: AsyncConnection, spec: TargetSpec, field: str = FIELD) -> list[RackSelection]:
    """One selection per rack, in the order the spec reaches the racks; errors name the target under
    `field`, the request's field that holds the spec.

    Unknown racks, components and domains are NOT_FOUND; a rack or component reached twice, an ambiguous
    external reference, or a spec that selects no rack at all is INVALID_ARGUMENT.
    """
    kinds = [kind for kind in ("racks", "components", "nvl_domains") if getattr(spec, kind)]
    if not kinds:
        raise InvalidArgument(f"{field}: no targets given (racks, components or nvl_domains)")
    if len(kinds) > 1:
        raise InvalidArgument(f"{field}: give one kind of target, not {' and '.join(kinds)}")
    _check_lookup_text(spec, field)
    if spec.racks:
        selections = await _resolve_racks(conn, spec.racks, field)
    elif spec.components:
        selections = await _resolve_components(conn, spec.components, field)
    else:
        selections = await _resolve_domains(conn, spec.nvl_domains, field)
    if not selections:
        raise InvalidArgument(f"{field}: the targets select no rack")
    return selections


def _check_lookup_text(spec: TargetSpec, field: str) -> None:
    """Refuse, before any lookup, a name or external id no row can have (too long, control characters):
    PostgreSQL cannot even compare text that holds a NUL, and a 10,000-target spec of huge names is
    a slow way to find nothing."""
    for index, rack in enumerate(spec.racks):
        check_text(rack.name or "", f"{field}.racks[{index}].name")
        check_text(rack.external_id or "", f"{field}.racks[{index}].external_id")
    for index, component in enumerate(spec.components):
        check_text(component.external_id or "", f"{field}.components[{index}].external.id")
    for index, domain in enumerate(spec.nvl_domains):
        check_text(domain.name or "", f"{field}.nvl_domains[{index}].name")


def _listed_twice(spec_field: str, kind: str, index: int, what: str, first_index: int) -> InvalidArgument:
    return InvalidArgument(
        f"{spec_field}.{kind}[{index}]: {what} is listed twice (also {spec_field}.{kind}[{first_index}])"
    )


def _types_filter(types: Sequence[ComponentType], field: str) -> TypesFilter | None:
    if ComponentType.UNKNOWN in types:
        raise InvalidArgument(f"{field}.component_types: UNKNOWN is not a component type")
    return TypesFilter(frozenset(types)) if types else None


async def _resolve_racks(
    conn: AsyncConnection, targets: Sequence[RackTarget], spec_field: str
) -> list[RackSelection]:
    by_id = await store.racks_by_column(conn, "id", [t.id for t in targets if t.id is not None])
    by_name = await store.racks_by_column(conn, "name", [t.name for t in targets if t.name])
    by_external = await store.racks_by_column(
        conn, "external_id", [t.external_id for t in targets if t.external_id]
    )
    selections: list[RackSelection] = []
    first_seen: dict[uuid.UUID, int] = {}
    for index, target in enumerate(targets):
        field = f"{spec_field}.racks[{index}]"
        if target.id is not None:
            rack_id, label = by_id.get(target.id), f"id {target.id}"
        elif target.name:
            rack_id, label = by_name.get(target.name), f"name {target.name!r}"
        elif target.external_id:
            rack_id, label = by_external.get(target.external_id), f"external_id {target.external_id!r}"
        else:
            raise InvalidArgument(f"{field}: a rack id, name or external_id is required")
        if rack_id is None:
            raise NotFound(f"{field}: no rack with {label}")
        if rack_id in first_seen:
            raise _listed_twice(spec_field, "racks", index, f"rack with {label}", first_seen[rack_id])
        first_seen[rack_id] = index
        selections.append(RackSelection(rack_id, _types_filter(target.component_types, field)))
    return selections


async def _resolve_components(
    conn: AsyncConnection, targets: Sequence[ComponentTarget], spec_field: str
) -> list[RackSelection]:
    by_id = await store.components_by_ids(conn, [t.id for t in targets if t.id is not None])
    by_external = await store.components_by_external_ids(
        conn, [t.external_id for t in targets if t.id is None and t.external_id]
    )
    per_rack: dict[uuid.UUID, set[uuid.UUID]] = {}  # insertion order: the order racks are first reached
    first_seen: dict[uuid.UUID, int] = {}
    for index, target in enumerate(targets):
        field = f"{spec_field}.components[{index}]"
        component = _find_component(target, by_id, by_external, field)
        if component.id in first_seen:
            raise _listed_twice(
                spec_field, "components", index, f"component {component.id}", first_seen[component.id]
            )
        first_seen[component.id] = index
        per_rack.setdefault(component.rack_id, set()).add(component.id)
    return [RackSelection(rack_id, ComponentsFilter(frozenset(ids))) for rack_id, ids in per_rack.items()]


def _find_component(
    target: ComponentTarget,
    by_id: dict[uuid.UUID, Component],
    by_external: dict[str, list[Component]],
    field: str,
) -> Component:
    if target.id is not None:
        found = by_id.get(target.id)
        if found is None:
            raise NotFound(f"{field}: no component with id {target.id}")
        return found
    if not target.external_id:
        raise InvalidArgument(f"{field}: a component id or external reference is required")
    wanted = target.external_type or ComponentType.UNKNOWN
    candidates = [
        c
        for c in by_external.get(target.external_id, [])
        if wanted is ComponentType.UNKNOWN or c.type is wanted
    ]
    if not candidates:
        kind = "component" if wanted is ComponentType.UNKNOWN else f"{wanted.value} component"
        raise NotFound(f"{field}: no {kind} with external_id {target.external_id!r}")
    if len(candidates) > 1:
        types = ", ".join(c.type.value for c in candidates)
        raise InvalidArgument(
            f"{field}: external_id {target.external_id!r} is ambiguous (components of types {types}); "
            "give the type"
        )
    return candidates[0]


async def _resolve_domains(
    conn: AsyncConnection, targets: Sequence[NVLDomainTarget], spec_field: str
) -> list[RackSelection]:
    by_id = await store.domains_by_column(conn, "id", [t.id for t in targets if t.id is not None])
    by_name = await store.domains_by_column(conn, "name", [t.name for t in targets if t.name])
    racks_of = await store.rack_ids_by_domain(conn, set(by_id.values()) | set(by_name.values()))
    selections: list[RackSelection] = []
    domain_seen: dict[uuid.UUID, int] = {}
    for index, target in enumerate(targets):
        field = f"{spec_field}.nvl_domains[{index}]"
        if target.id is not None:
            domain_id, label = by_id.get(target.id), f"id {target.id}"
        elif target.name:
            domain_id, label = by_name.get(target.name), f"name {target.name!r}"
        else:
            raise InvalidArgument(f"{field}: an NVLink domain id or name is required")
        if domain_id is None:
            raise NotFound(f"{field}: no NVLink domain with {label}")
        if domain_id in domain_seen:
            raise _listed_twice(
                spec_field, "nvl_domains", index, f"NVLink domain with {label}", domain_seen[domain_id]
            )
        domain_seen[domain_id] = index
        types = _types_filter(target.component_types, field)
        selections.extend(RackSelection(rack_id, types) for rack_id in racks_of[domain_id])
    return selections
