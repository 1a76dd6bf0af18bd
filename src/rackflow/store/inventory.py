"""Inventory queries: racks, components and NVLink domains.

The only inventory module that speaks SQL. A unique-constraint violation is translated here into
`AlreadyExists` (`db.unique_violation_as`), so no other layer imports `sqlalchemy.exc`; callers pre-check for
clear messages, and the translation covers the race a pre-check cannot. Lookups by many keys run in chunks
(`db.chunked`).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Row, Table, delete, insert, null, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.bmc import stored_resource_key, target_of
from rackflow.domain.inventory import (
    Bmc,
    Component,
    ComponentSpec,
    ComponentType,
    ListedDomain,
    NVLDomain,
    PowerState,
    Rack,
    short_search,
)
from rackflow.domain.schedules import ScopeChange
from rackflow.errors import AlreadyExists
from rackflow.ids import new_id
from rackflow.store import kept_counts, scope_removals
from rackflow.store.db import Database, chunked, in_id_order, some_of, unique_violation_as
from rackflow.store.dialect import by_keys, name_holds, uuid_text
from rackflow.store.paging import Key, Listed, keys_in_order, page_of, walk_end
from rackflow.store.tables import (
    components,
    domain_list_version,
    nvl_domains,
    racks,
    task_schedule,
    task_schedule_scope,
    tasks,
)
from rackflow.store.tasks import is_active

# --- rows to values ------------------------------------------------------------------------------


# A stored type and power state by their text: a dict's look-up, not an enum's call (twice its cost), for
# each of the 360,000 components a firing on 10,000 racks of 36 reads (docs/PERFORMANCE.md).
_TYPES = {t.value: t for t in ComponentType}
_POWER_STATES = {p.value: p for p in PowerState}


def _component_from(row: Sequence[Any]) -> Component:
    """The component of a row of `_COMPONENTS`, its values taken by position: by name (`Row._mapping`), as it
    was, reading the 36,000 components of a page of 1,000 racks took a third more CPU (docs/PERFORMANCE.md,
    "The 1,000-row pages at 36 components"); a submit reads every component of its racks too."""
    id_, rack_id, type_, name, external_id, firmware_version, power_state, url, resource, credentials = row
    return Component(
        id_,
        rack_id,
        _TYPES[type_],
        name,
        external_id or "",
        firmware_version,
        _POWER_STATES[power_state],
        None if url is None else Bmc(url, resource or "", credentials or ""),
    )


def _bmc_columns(bmc: Bmc | None) -> dict[str, str | None]:
    if bmc is None:
        return {"bmc_url": None, "bmc_resource": None, "bmc_credentials": None, "bmc_resource_key": None}
    return {
        "bmc_url": bmc.url,
        "bmc_resource": bmc.resource,
        "bmc_credentials": bmc.credentials,
        "bmc_resource_key": stored_resource_key(bmc),
    }


def _rack_from(row: Row[Any], rack_components: Sequence[Component] = ()) -> Rack:
    return Rack(
        id=row.id,
        name=row.name,
        external_id=row.external_id or "",
        nvl_domain_id=row.nvl_domain_id,
        created_at=row.created_at,
        components=tuple(rack_components),
    )


# A rack lists its components grouped by type, then by name: the order an operator reads them in.
_COMPONENT_ORDER = (components.c.type, components.c.name, components.c.id)
# A `Component`'s columns, in the order `_component_from` takes them: every column but `created_at` and
# `bmc_resource_key`, which it does not carry (converting that timestamp was 4 % of the server's time in a
# 10,000-rack fan-out, docs/PERFORMANCE.md).
_COMPONENTS = select(
    components.c.id,
    components.c.rack_id,
    components.c.type,
    components.c.name,
    components.c.external_id,
    components.c.firmware_version,
    components.c.power_state,
    components.c.bmc_url,
    components.c.bmc_resource,
    components.c.bmc_credentials,
)
# The rack list's order; a page token holds its values in the page's last row.
RACK_ORDER = (racks.c.created_at, racks.c.id)
# The domain list's order, an index's (migration 0055), as the racks' is.
DOMAIN_ORDER = (nvl_domains.c.created_at, nvl_domains.c.id)
# A rack's or a domain's id as a read gives it: itself, or its text (`uuid_text`).
_Id = TypeVar("_Id", uuid.UUID, str)


# --- racks ---------------------------------------------------------------------------------------


async def insert_rack(
    conn: AsyncConnection,
    *,
    name: str,
    external_id: str,
    nvl_domain_id: uuid.UUID | None,
    created_at: datetime,
) -> uuid.UUID:
    rack_id = new_id()
    values = {
        "id": rack_id,
        "name": name,
        "external_id": external_id or None,
        "nvl_domain_id": nvl_domain_id,
        "created_at": created_at,
    }
    with unique_violation_as(
        AlreadyExists("name", name, "a rack named"),
        AlreadyExists("external_id", external_id, "a rack with external_id"),
    ):
        await conn.execute(insert(racks).values(values))
    return rack_id


async def rack_exists(conn: AsyncConnection, rack_id: uuid.UUID) -> bool:
    """True when the rack exists (in this transaction's view)."""
    found = await conn.execute(select(racks.c.id).where(racks.c.id == rack_id))
    return found.first() is not None


async def get_rack(conn: AsyncConnection, rack_id: uuid.UUID) -> Rack | None:
    """The rack with its components, or None."""
    return await _rack_where(conn, racks.c.id == rack_id)


async def get_rack_by_name(conn: AsyncConnection, name: str) -> Rack | None:
    """The rack called `name` with its components, or None: one read of the unique index on the name,
    where finding it on the rack list read every rack (20 pages at 20,000 racks, issue 29)."""
    return await _rack_where(conn, racks.c.name == name)


async def _rack_where(conn: AsyncConnection, match: ColumnElement[bool]) -> Rack | None:
    """The one rack `match` selects (by a unique column), with its components, or None."""
    row = (await conn.execute(select(racks).where(match))).first()
    if row is None:
        return None
    rack_components = (await components_by_rack(conn, [row.id]))[row.id]
    return _rack_from(row, rack_components)


async def list_racks(
    conn: AsyncConnection,
    *,
    nvl_domain_id: uuid.UUID | None,
    offset: int,
    limit: int | None,
    after: Key | None = None,
    ids: Collection[uuid.UUID] | None = None,
    name_contains: str = "",
    with_components: bool = True,
) -> tuple[list[Rack], Listed]:
    """One page of racks (oldest first, with their components unless not `with_components`, after the key
    `after` of RACK_ORDER if given), of those among `ids` alone if given (a page's worth: one IN list) and
    of those whose name holds `name_contains` (`dialect.name_holds`: on PostgreSQL, from the names' trigram
    index) if given, and what the list says besides (`paging.Listed`: the total before paging,
    `paging.count_capped`).

    A page (`limit`) of a short search (`short_search`: no index answers it) walks at most SEARCH_WALK
    racks after `after`, of the domain's or the ids' if given (their indexes answer those), and may come
    back short or empty before the list's end (`paging.page_of`): a rare text read every name, 0.4-0.8 s
    a page at 100,000 racks (docs/PERFORMANCE.md). A request without a limit is not bounded."""
    where: list[ColumnElement[bool]] = []
    if nvl_domain_id is not None:
        where.append(racks.c.nvl_domain_id == nvl_domain_id)
    if ids is not None:
        where.append(racks.c.id.in_(set(ids)))
    unindexed: list[ColumnElement[bool]] = []
    if name_contains:
        holds = name_holds(racks.c.name, name_contains)
        (unindexed if short_search(name_contains) else where).append(holds)
    rows, listed = await page_of(
        conn, racks, RACK_ORDER, where, after=after, offset=offset, limit=limit, unindexed=unindexed
    )
    if not with_components:
        return [_rack_from(row, []) for row in rows], listed
    by_rack = await components_by_rack(conn, [row.id for row in rows])
    return [_rack_from(row, by_rack[row.id]) for row in rows], listed


# The lists whose names a picker searches (`names_holding`), by the name a request gives them.
NAMED_TABLES = {"racks": racks, "nvl_domains": nvl_domains}


async def names_holding(
    conn: AsyncConnection, table: Table, text: str, limit: int, after: str | None = None
) -> tuple[list[str], str | None]:
    """At most `limit` (> 1) names of `table` that hold `text` (`dialect.name_holds`): the name that is
    `text` itself first, if there is one (a picker offers the rack typed in full, however many others hold
    it), then the others in name order, after the name `after` if given (a page on, without the first);
    and the name the next page goes on after, None when no name is left to look at.

    On PostgreSQL a text of three characters or more that few names hold is found in the names' trigram
    index (migration 0056), where it read every name (0.2-0.4 s at 100,000 racks, docs/PERFORMANCE.md,
    "The schedule form's racks"); one that many hold is read along the names' unique index until `limit`
    are found. A shorter one (`short_search`: no index answers it) walks at most SEARCH_WALK names of that
    index (`paging.walk_end`), where a rare one read every name: its page may come back short or empty
    and still name where it stopped, the next page's `after`."""
    name = table.c.name
    exact = (
        [] if after is not None else list((await conn.execute(select(name).where(name == text))).scalars())
    )
    within = [] if after is None else [name > after]
    walk_to = None
    if short_search(text):
        walk_to = await walk_end(conn, keys_in_order((name,)), None if after is None else (after,))
        within += [] if walk_to is None else [name <= walk_to[0]]
    others = select(name).where(name_holds(name, text), name != text, *within).order_by(name)
    found = list((await conn.execute(others.limit(limit - len(exact)))).scalars())
    if len(found) == limit - len(exact):  # a full page: the rest from its last name
        return [*exact, *found], found[-1]
    return [*exact, *found], None if walk_to is None else walk_to[0]


async def racks_by_column(
    conn: AsyncConnection, column: str, values: Collection[Any]
) -> dict[Any, uuid.UUID]:
    """Map each found value of racks.<column> (id, name or external_id) to its rack id."""
    return await _ids_by_column(conn, racks, column, values)


async def names_by_id(
    conn: AsyncConnection, table: Table, ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, str]:
    """The name of each row of `table` (racks, schedules …) that exists among `ids`."""
    found: dict[uuid.UUID, str] = {}
    for chunk in chunked(set(ids)):
        stmt = select(table.c.id, table.c.name).where(table.c.id.in_(chunk))
        found.update({row.id: row.name for row in await conn.execute(stmt)})
    return found


async def rack_names(conn: AsyncConnection, rack_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
    return await names_by_id(conn, racks, rack_ids)


async def domain_names(conn: AsyncConnection, domain_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
    return await names_by_id(conn, nvl_domains, domain_ids)


async def racks_for_update(
    db: Database, conn: AsyncConnection, rack_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, uuid.UUID | None]:
    """Lock the racks that exist and map each to its current NVLink domain (None: in no domain)."""
    found: dict[uuid.UUID, uuid.UUID | None] = {}
    for chunk in chunked(in_id_order(rack_ids)):  # concurrent lockers take rows in one order
        stmt = select(racks.c.id, racks.c.nvl_domain_id).where(racks.c.id.in_(chunk)).order_by(racks.c.id)
        for row in await conn.execute(db.for_update(stmt)):
            found[row.id] = row.nvl_domain_id
    return found


async def has_active_tasks(conn: AsyncConnection, rack_id: uuid.UUID) -> bool:
    stmt = select(tasks.c.id).where(tasks.c.rack_id == rack_id, is_active(tasks.c.status))
    return (await conn.execute(stmt.limit(1))).first() is not None


async def active_task_component_ids(conn: AsyncConnection, rack_id: uuid.UUID) -> dict[uuid.UUID, set[str]]:
    """Each active task of the rack, with the component ids (as stored: strings) it works on."""
    stmt = select(tasks.c.id, tasks.c.component_ids).where(
        tasks.c.rack_id == rack_id, is_active(tasks.c.status)
    )
    return {row.id: {str(c) for c in row.component_ids} for row in await conn.execute(stmt)}


async def runs_of_tasks_on(conn: AsyncConnection, rack_id: uuid.UUID) -> set[uuid.UUID]:
    """The runs of the rack's tasks: the run rows `delete_rack` writes (their kept counts are not read
    again: `kept_counts.mark_deleted`)."""
    stmt = select(tasks.c.run_id).distinct().where(tasks.c.rack_id == rack_id, tasks.c.run_id.is_not(None))
    return set((await conn.execute(stmt)).scalars())


async def delete_rack(conn: AsyncConnection, rack_id: uuid.UUID) -> list[ScopeChange]:
    """Delete the rack; its components and finished tasks go with it (ON DELETE CASCADE), and so do its
    schedule scope entries, deleted first (their schedules stamped before, `scope_removals.stamp_racks`)
    so that what went is known: they are returned. The caller holds the rack, so no scope entry can be
    added for it meanwhile (its insert waits for the rack's key lock), and the rows of its tasks' runs and
    of its scopes' schedules, locked before the rack (`runs_of_tasks_on`, `scope_removals.stamp_racks`: the
    lock order atop `rackflow.tasks.executor`), which the stamp here then takes again without waiting."""
    await scope_removals.stamp_racks(conn, [rack_id])
    # Its tasks go too: their runs' kept counts are not read again (`kept_counts`).
    await kept_counts.mark_deleted(conn, await runs_of_tasks_on(conn, rack_id))
    removed = await _delete_scopes_of(conn, rack_id)
    await conn.execute(delete(racks).where(racks.c.id == rack_id))
    return removed


async def _delete_scopes_of(conn: AsyncConnection, rack_id: uuid.UUID) -> list[ScopeChange]:
    """Delete the rack's scope entries and return them as the statement deleted them, in scope id order.
    The caller has stamped their schedules and holds the rack, so they are all the rack had."""
    scope = task_schedule_scope.c
    deleting = delete(task_schedule_scope).where(scope.rack_id == rack_id)
    deleted = (await conn.execute(deleting.returning(scope.id, scope.schedule_id))).all()
    names = await names_by_id(conn, task_schedule, {row.schedule_id for row in deleted})
    return [
        ScopeChange(row.id, row.schedule_id, names[row.schedule_id], rack_id)
        for row in sorted(deleted, key=lambda row: row.id)
    ]


# --- components ----------------------------------------------------------------------------------


async def insert_components(
    conn: AsyncConnection, rack_id: uuid.UUID, specs: Sequence[ComponentSpec], created_at: datetime
) -> list[Component]:
    """Create the components with power state unknown; returns them in the order given."""
    created = [
        Component(
            id=new_id(),
            rack_id=rack_id,
            type=spec.type,
            name=spec.name,
            external_id=spec.external_id,
            firmware_version=spec.firmware_version,
            power_state=PowerState.UNKNOWN,
            bmc=spec.bmc,
        )
        for spec in specs
    ]
    if not created:
        return []
    rows = [
        {
            "id": c.id,
            "rack_id": rack_id,
            "type": c.type.value,
            "name": c.name,
            "external_id": c.external_id or None,
            "firmware_version": c.firmware_version,
            "power_state": c.power_state.value,
            "created_at": created_at,
            **_bmc_columns(c.bmc),
        }
        for c in created
    ]
    named = some_of(sorted({c.external_id for c in created if c.external_id}))
    resources = some_of([target_of(c.bmc).describe() for c in created if c.bmc is not None])
    # The BMC resource's error first: its field matches no column, so it is the one raised when the violated
    # index is not (type, external_id)'s.
    with unique_violation_as(
        AlreadyExists("components.bmc", resources, "a component acting on one of"),
        AlreadyExists("external_id", named, "a component of the same type with one of"),
    ):
        for chunk in chunked(rows):
            await conn.execute(insert(components), chunk)
    return created


async def components_by_rack(
    conn: AsyncConnection, rack_ids: Collection[uuid.UUID]
) -> dict[uuid.UUID, list[Component]]:
    """Every component of each given rack (grouped by type, then name); a rack without any maps to []."""
    by_rack: dict[uuid.UUID, list[Component]] = {rack_id: [] for rack_id in rack_ids}
    for chunk in chunked(by_rack):
        stmt = by_keys(conn.dialect.name, _COMPONENTS, components.c.rack_id, chunk, order_by=_COMPONENT_ORDER)
        for component in map(_component_from, await conn.execute(stmt)):
            by_rack[component.rack_id].append(component)
    return by_rack


async def components_by_ids(conn: AsyncConnection, ids: Collection[uuid.UUID]) -> dict[uuid.UUID, Component]:
    found: dict[uuid.UUID, Component] = {}
    for chunk in chunked(set(ids)):
        for row in await conn.execute(_COMPONENTS.where(components.c.id.in_(chunk))):
            found[row.id] = _component_from(row)
    return found


async def components_by_external_ids(
    conn: AsyncConnection, external_ids: Collection[str]
) -> dict[str, list[Component]]:
    """Components of any type with these external ids: one external id may name one component per type."""
    found: dict[str, list[Component]] = {}
    for chunk in chunked(set(external_ids)):
        stmt = _COMPONENTS.where(components.c.external_id.in_(chunk)).order_by(components.c.type)
        for component in map(_component_from, await conn.execute(stmt)):
            found.setdefault(component.external_id, []).append(component)
    return found


async def components_by_bmc_resources(conn: AsyncConnection, bmcs: Collection[Bmc]) -> dict[str, Component]:
    """The component acting on each of these BMC resources, if any, by the resource's stored key
    (`domain.bmc.stored_resource_key`): at most one each, the key being unique."""
    found: dict[str, Component] = {}
    for chunk in chunked({stored_resource_key(bmc) for bmc in bmcs}):
        stmt = _COMPONENTS.add_columns(components.c.bmc_resource_key)
        for *columns, key in await conn.execute(stmt.where(components.c.bmc_resource_key.in_(chunk))):
            found[key] = _component_from(columns)
    return found


async def delete_component(conn: AsyncConnection, component_id: uuid.UUID) -> None:
    await conn.execute(delete(components).where(components.c.id == component_id))


# --- NVLink domains ------------------------------------------------------------------------------


async def insert_domain(conn: AsyncConnection, *, name: str, created_at: datetime) -> uuid.UUID:
    domain_id = new_id()
    with unique_violation_as(AlreadyExists("name", name, "an NVLink domain named")):
        await conn.execute(insert(nvl_domains).values(id=domain_id, name=name, created_at=created_at))
    return domain_id


async def assign_domain(conn: AsyncConnection, domain_id: uuid.UUID, rack_ids: Collection[uuid.UUID]) -> None:
    for chunk in chunked(rack_ids):
        await conn.execute(update(racks).where(racks.c.id.in_(chunk)).values(nvl_domain_id=domain_id))


async def domains_by_column(
    conn: AsyncConnection, column: str, values: Collection[Any]
) -> dict[Any, uuid.UUID]:
    """Map each found value of nvl_domains.<column> (id or name) to its domain id."""
    return await _ids_by_column(conn, nvl_domains, column, values)


async def _ids_by_column(
    conn: AsyncConnection, table: Table, column: str, values: Collection[Any]
) -> dict[Any, uuid.UUID]:
    """One IN query per chunk of distinct values: value of table.<column> -> the row's id."""
    col = table.c[column]
    found: dict[Any, uuid.UUID] = {}
    for chunk in chunked(set(values)):
        for row in await conn.execute(select(col, table.c.id).where(col.in_(chunk))):
            found[row[0]] = row.id
    return found


async def rack_ids_by_domain(
    conn: AsyncConnection, domain_ids: Collection[uuid.UUID] | None
) -> defaultdict[uuid.UUID, list[uuid.UUID]]:
    """The racks of each domain, oldest first; a domain without racks maps to []. None: of every domain,
    in one read of the racks that have one (the whole list), not a statement per thousand domains."""
    return await _racks_by_domain(conn, domain_ids, racks.c.id, racks.c.nvl_domain_id)


async def _racks_by_domain(
    conn: AsyncConnection,
    domain_ids: Collection[uuid.UUID] | None,
    rack: ColumnElement[_Id],
    domain: ColumnElement[_Id],
) -> defaultdict[_Id, list[_Id]]:
    """`rack_ids_by_domain`, each id read as the column `rack` or `domain` gives it (the racks' and their
    domains' ids themselves, or their text: `uuid_text`)."""
    by_domain: defaultdict[_Id, list[_Id]] = defaultdict(list)
    in_domain = racks.c.nvl_domain_id
    reads = (
        [in_domain.is_not(None)]
        if domain_ids is None
        else [in_domain.in_(chunk) for chunk in chunked(set(domain_ids))]
    )
    stmt = select(rack, domain).order_by(*RACK_ORDER)
    for within in reads:
        for rack_id, domain_id in (await conn.execute(stmt.where(within))).all():
            by_domain[domain_id].append(rack_id)
    return by_domain


async def get_domain(conn: AsyncConnection, domain_id: uuid.UUID) -> NVLDomain | None:
    row = (await conn.execute(select(nvl_domains).where(nvl_domains.c.id == domain_id))).first()
    if row is None:
        return None
    rack_ids = (await rack_ids_by_domain(conn, [domain_id]))[domain_id]
    return NVLDomain(id=row.id, name=row.name, rack_ids=tuple(rack_ids), created_at=row.created_at)


def asks_every_domain(
    *,
    offset: int,
    limit: int | None,
    after: Key | None,
    ids: Collection[uuid.UUID] | None,
    names: Collection[str] | None,
) -> bool:
    """Whether a list of domains asks for every one: no page and no filter. Its racks are read in one
    statement, not by the page's domains, and `InventoryService` keeps it (migration 0059)."""
    return not offset and limit is None and after is None and ids is None and names is None


async def domain_list_token(conn: AsyncConnection) -> str | None:
    """The token the triggers of migration 0059 replace on every change to the domains or their racks'
    membership; None where its row was deleted by hand (the next change makes it again)."""
    token: str | None = (await conn.execute(select(domain_list_version.c.token))).scalar_one_or_none()
    return token


async def list_domains(
    conn: AsyncConnection,
    *,
    offset: int = 0,
    limit: int | None = None,
    after: Key | None = None,
    ids: Collection[uuid.UUID] | None = None,
    names: Collection[str] | None = None,
) -> tuple[list[ListedDomain], int]:
    """One page of domains with their racks (oldest domain first, after the key `after` of DOMAIN_ORDER if
    given), of those among `ids` or `names` alone if given (a page's worth each: one IN list), their ids
    and their racks' read as text (`uuid_text`), and the total before paging (`paging.count_capped`). A
    fleet of NVL72 racks has a domain a rack: 20,000 of them read whole took half a second and 2 MB
    (docs/PERFORMANCE.md, "NVLink domains at a fleet's size"), then 0.2 s of CPU to read as `uuid.UUID`s
    and `NVLDomain`s, a fifth of that as text ("Every NVLink domain at once")."""
    domain, dialect = nvl_domains.c, conn.dialect.name
    where: list[ColumnElement[bool]] = []
    if ids is not None:
        where.append(domain.id.in_(set(ids)))
    if names is not None:
        where.append(domain.name.in_(set(names)))
    rows, listed = await page_of(
        conn,
        nvl_domains,
        DOMAIN_ORDER,
        where,
        after=after,
        offset=offset,
        limit=limit,
        columns=(
            uuid_text(dialect, domain.id).label("id"),
            domain.name,
            # A page's last domain's key is the next page's token; a list of no limit has none, and
            # making 20,000 aware times was a fifth of the whole list's read.
            (null() if limit is None else domain.created_at).label("created_at"),
        ),
    )
    whole = asks_every_domain(offset=offset, limit=limit, after=after, ids=ids, names=names)
    by_domain = await _racks_by_domain(
        conn,
        None if whole else [uuid.UUID(row.id) for row in rows],
        uuid_text(dialect, racks.c.id),
        uuid_text(dialect, racks.c.nvl_domain_id),
    )
    found = [
        ListedDomain(domain_id, name, by_domain[domain_id], created_at)
        for domain_id, name, created_at in rows
    ]
    return found, listed.total
