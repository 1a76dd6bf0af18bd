"""Maintenance window queries.

The only window module that speaks SQL. Windows are few (tens), so readers load them all and the pure
rules of `rackflow.domain.window_rules` pick what covers a rack. Functions take an open connection, so the
caller decides what one transaction holds.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import Row, Uuid, delete, insert, literal, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.tasks import OperationKind
from rackflow.domain.windows import MaintenanceWindow, OneOff, RackRef, Recurring, WindowKind
from rackflow.errors import AlreadyExists
from rackflow.store.db import chunked, unique_violation_as
from rackflow.store.dialect import beside_turns, by_keys, take_turns
from rackflow.store.tables import (
    maintenance_window_domains,
    maintenance_window_racks,
    maintenance_windows,
    nvl_domains,
    racks,
)

# Taken by every window creation, update and deletion (`take_turns`): a number of its own.
_WINDOW_EDITS = 7_262_532_945


async def edits_in_turn(conn: AsyncConnection) -> None:
    """Wait for any other window edit's transaction to end, and hold the next turn until this one ends: an
    edit (a creation too) decides the tasks its window deferred from every window it reads
    (`rackflow.tasks.deferrals`), and skips a task another transaction holds, so two edits at once would
    each decide without the other's change, and neither decide the tasks the other was moving."""
    await take_turns(conn, _WINDOW_EDITS)


async def beside_edits(conn: AsyncConnection) -> None:
    """Wait for a window edit's transaction under way to end, and keep the next one from deciding until
    this transaction ended, without waiting for another that takes this too: a firing's submit, which
    reads the windows again beside the tasks it inserts (`rackflow.schedules.firing`), and a rollout's
    step, which reads them and inserts its wave's tasks (`rackflow.rollouts.service`), so that an edit
    either committed before that read or decides the tasks once they exist. Taken first in the caller's
    transaction, before any row lock (the step's: before its runs' rows), as an edit takes its turn: an
    edit waits for runs' rows and racks once it has its turn, so a transaction that waited for the turn
    while holding one would wait for an edit that waits for it."""
    await beside_turns(conn, _WINDOW_EDITS)


def name_taken_error(name: str) -> AlreadyExists:
    return AlreadyExists("window.name", name, "a maintenance window named")


def _values(window: MaintenanceWindow) -> dict[str, Any]:
    when = window.when
    recurring = when if isinstance(when, Recurring) else None
    one_off = when if isinstance(when, OneOff) else None
    return {
        "name": window.name,
        "reason": window.reason,
        "kind": window.kind.value,
        "cron": recurring.cron if recurring else None,
        "duration": recurring.duration if recurring else None,
        "timezone": recurring.timezone if recurring else None,
        "start_at": one_off.start if one_off else None,
        "end_at": one_off.end if one_off else None,
        "all_racks": window.all_racks,
        "operations": sorted(op.value for op in window.operations),
        "created_at": window.created_at,
        "updated_at": window.updated_at,
    }


def _window_from(
    row: Row[Any],
    rack_names: Mapping[uuid.UUID, list[tuple[uuid.UUID, str]]],
    domain_names: Mapping[uuid.UUID, list[tuple[uuid.UUID, str]]],
) -> MaintenanceWindow:
    when: Recurring | OneOff = (
        Recurring(row.cron, row.duration, row.timezone)
        if row.cron is not None
        else OneOff(row.start_at, row.end_at)
    )
    return MaintenanceWindow(
        id=row.id,
        name=row.name,
        reason=row.reason,
        kind=WindowKind(row.kind),
        when=when,
        all_racks=row.all_racks,
        racks=tuple(sorted(rack_names.get(row.id, []), key=lambda pair: pair[1])),
        domains=tuple(sorted(domain_names.get(row.id, []), key=lambda pair: pair[1])),
        operations=frozenset(OperationKind(op) for op in row.operations),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def _covered(
    conn: AsyncConnection, window_ids: Collection[uuid.UUID]
) -> tuple[dict[uuid.UUID, list[tuple[uuid.UUID, str]]], dict[uuid.UUID, list[tuple[uuid.UUID, str]]]]:
    """The (id, name) of the racks and of the domains each window names."""
    by_rack: dict[uuid.UUID, list[tuple[uuid.UUID, str]]] = {}
    by_domain: dict[uuid.UUID, list[tuple[uuid.UUID, str]]] = {}
    for link, column, named, found in (
        (maintenance_window_racks, "rack_id", racks, by_rack),
        (maintenance_window_domains, "domain_id", nvl_domains, by_domain),
    ):
        for chunk in chunked(window_ids):
            stmt = (
                select(link.c.window_id, named.c.id, named.c.name)
                .join(named, named.c.id == link.c[column])
                .where(link.c.window_id.in_(chunk))
            )
            for row in await conn.execute(stmt):
                found.setdefault(row.window_id, []).append((row.id, row.name))
    return by_rack, by_domain


async def _windows_where(conn: AsyncConnection, *conditions: Any) -> list[MaintenanceWindow]:
    stmt = select(maintenance_windows).where(*conditions).order_by(maintenance_windows.c.name)
    rows = (await conn.execute(stmt)).all()
    if not rows:
        return []
    by_rack, by_domain = await _covered(conn, [row.id for row in rows])
    return [_window_from(row, by_rack, by_domain) for row in rows]


async def all_windows(conn: AsyncConnection) -> list[MaintenanceWindow]:
    """Every window, by name."""
    return await _windows_where(conn)


async def get_window(conn: AsyncConnection, window_id: uuid.UUID) -> MaintenanceWindow | None:
    found = await _windows_where(conn, maintenance_windows.c.id == window_id)
    return found[0] if found else None


async def window_id_by_name(conn: AsyncConnection, name: str) -> uuid.UUID | None:
    stmt = select(maintenance_windows.c.id).where(maintenance_windows.c.name == name)
    return (await conn.execute(stmt)).scalar_one_or_none()


async def name_taken(conn: AsyncConnection, name: str, *, other_than: uuid.UUID | None = None) -> bool:
    stmt = select(maintenance_windows.c.id).where(maintenance_windows.c.name == name)
    if other_than is not None:
        stmt = stmt.where(maintenance_windows.c.id != other_than)
    return (await conn.execute(stmt)).first() is not None


async def _link(conn: AsyncConnection, window: MaintenanceWindow) -> None:
    """Write the window's links to its racks and domains. Only the racks that still exist are linked: the
    caller holds those (`store.tasks.lock_racks`, before the write), and one DeleteRack deleted since the
    request named it is left out, as the deletion would have taken its link had it come after the write
    (its foreign key would refuse it)."""
    if window.racks:
        named = select(literal(window.id, Uuid()), racks.c.id).where(
            racks.c.id.in_([i for i, _ in window.racks])
        )
        await conn.execute(insert(maintenance_window_racks).from_select(["window_id", "rack_id"], named))
    if window.domains:
        await conn.execute(
            insert(maintenance_window_domains),
            [{"window_id": window.id, "domain_id": i} for i, _ in window.domains],
        )


async def insert_window(conn: AsyncConnection, window: MaintenanceWindow) -> None:
    with unique_violation_as(name_taken_error(window.name)):
        await conn.execute(insert(maintenance_windows).values(id=window.id, **_values(window)))
    await _link(conn, window)


async def save_window(conn: AsyncConnection, window: MaintenanceWindow) -> None:
    """Write every field of an existing window, its racks and domains included."""
    with unique_violation_as(name_taken_error(window.name)):
        await conn.execute(
            update(maintenance_windows).where(maintenance_windows.c.id == window.id).values(_values(window))
        )
    for link in (maintenance_window_racks, maintenance_window_domains):
        await conn.execute(delete(link).where(link.c.window_id == window.id))
    await _link(conn, window)


async def delete_window(conn: AsyncConnection, window_id: uuid.UUID) -> bool:
    result = await conn.execute(delete(maintenance_windows).where(maintenance_windows.c.id == window_id))
    return bool(result.rowcount)


async def rack_refs(conn: AsyncConnection, rack_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, RackRef]:
    """What the window rules need to know of each rack that exists among `rack_ids`: its NVLink domain."""
    found: dict[uuid.UUID, RackRef] = {}
    for chunk in chunked(set(rack_ids)):
        stmt = by_keys(conn.dialect.name, select(racks.c.id, racks.c.nvl_domain_id), racks.c.id, chunk)
        found.update({row.id: RackRef(row.id, row.nvl_domain_id) for row in await conn.execute(stmt)})
    return found
