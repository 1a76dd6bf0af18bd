"""Operation budget queries, and what the budget gate reads in the claim's transaction.

The only budget module that speaks SQL. Budgets are few (tens), so readers load them all. Functions take
an open connection, so the caller decides what one transaction holds.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import Row, delete, func, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.budgets import OperationBudget, Started
from rackflow.domain.tasks import Hold, OperationKind, TaskStatus
from rackflow.errors import AlreadyExists
from rackflow.store.db import Database, unique_violation_as
from rackflow.store.tables import operation_budgets, racks, tasks
from rackflow.store.tasks import hold_values, is_active, status_in


def name_taken_error(name: str) -> AlreadyExists:
    return AlreadyExists("budget.name", name, "an operation budget named")


def _values(budget: OperationBudget) -> dict[str, Any]:
    return {
        "name": budget.name,
        "operations": sorted(op.value for op in budget.operations),
        "max_running": budget.max_running,
        "max_running_per_domain": budget.max_running_per_domain,
        "created_at": budget.created_at,
        "updated_at": budget.updated_at,
    }


def _budget_from(row: Row[Any]) -> OperationBudget:
    return OperationBudget(
        id=row.id,
        name=row.name,
        operations=frozenset(OperationKind(op) for op in row.operations),
        max_running=row.max_running,
        max_running_per_domain=row.max_running_per_domain,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def all_budgets(conn: AsyncConnection) -> list[OperationBudget]:
    """Every budget, by name."""
    rows = await conn.execute(select(operation_budgets).order_by(operation_budgets.c.name))
    return [_budget_from(row) for row in rows]


async def get_budget(conn: AsyncConnection, budget_id: uuid.UUID) -> OperationBudget | None:
    stmt = select(operation_budgets).where(operation_budgets.c.id == budget_id)
    row = (await conn.execute(stmt)).first()
    return _budget_from(row) if row is not None else None


async def insert_budget(conn: AsyncConnection, budget: OperationBudget) -> None:
    with unique_violation_as(name_taken_error(budget.name)):
        await conn.execute(insert(operation_budgets).values(id=budget.id, **_values(budget)))


async def save_budget(conn: AsyncConnection, budget: OperationBudget) -> None:
    """Write every field of an existing budget."""
    with unique_violation_as(name_taken_error(budget.name)):
        await conn.execute(
            update(operation_budgets).where(operation_budgets.c.id == budget.id).values(_values(budget))
        )


async def delete_budget(conn: AsyncConnection, budget_id: uuid.UUID) -> bool:
    result = await conn.execute(delete(operation_budgets).where(operation_budgets.c.id == budget_id))
    return bool(result.rowcount)


# --- what the gate reads ------------------------------------------------------------------------


async def lock_budgets(db: Database, conn: AsyncConnection) -> list[OperationBudget]:
    """Every budget, its row locked until the transaction ends (PostgreSQL; SQLite's single writer
    already excludes other claims), in id order so that two claims never wait on each other in a circle."""
    stmt = select(operation_budgets).order_by(operation_budgets.c.id)
    return [_budget_from(row) for row in await conn.execute(db.for_update(stmt))]


async def running(
    conn: AsyncConnection, operations: frozenset[OperationKind], *, besides: frozenset[uuid.UUID]
) -> list[Started]:
    """The RUNNING tasks of `operations`, whoever owns them (a dead instance's too, until taken over and
    ended), except `besides`: one entry per task, its domain the rack's NVLink domain or else its id."""
    if not operations:
        return []
    stmt = (
        select(tasks.c.operation, tasks.c.rack_id, racks.c.nvl_domain_id, func.count().label("n"))
        .join(racks, racks.c.id == tasks.c.rack_id)
        .where(
            # `is_active` adds nothing but the partial index's predicate, for SQLite to use it.
            is_active(tasks.c.status),
            status_in(tasks.c.status, TaskStatus.RUNNING),
            tasks.c.operation.in_(sorted(op.value for op in operations)),
        )
        .group_by(tasks.c.operation, tasks.c.rack_id, racks.c.nvl_domain_id)
    )
    if besides:
        stmt = stmt.where(tasks.c.id.not_in(besides))
    found: list[Started] = []
    for row in await conn.execute(stmt):
        found += [Started(OperationKind(row.operation), row.nvl_domain_id or row.rack_id)] * row.n
    return found


async def push_back(
    db: Database,
    conn: AsyncConnection,
    budget: OperationBudget,
    domain: uuid.UUID | None,
    *,
    gate: str,
    hold: Hold,
    now: datetime,
) -> None:
    """Every PENDING task of `budget`'s operations that is due by `now` (in `domain`, a domain's or a
    rack's id, when given) is held by `gate` as `hold` says: the cap is full, so claiming them before
    then would only hand them back, and a long queue behind a budget would crowd everything else out of the
    claims. Rows another claim holds are skipped (that claim gates them), so this never waits on a row
    lock while the budget rows are locked."""
    due = select(tasks.c.id).where(
        is_active(tasks.c.status),
        status_in(tasks.c.status, TaskStatus.PENDING),
        tasks.c.operation.in_(sorted(op.value for op in budget.operations)),
        or_(tasks.c.not_before.is_(None), tasks.c.not_before <= now),
    )
    if domain is not None:
        in_domain = select(racks.c.id).where(racks.c.nvl_domain_id == domain)
        due = due.where(or_(tasks.c.rack_id == domain, tasks.c.rack_id.in_(in_domain)))
    await conn.execute(
        update(tasks).where(tasks.c.id.in_(db.skip_locked(due))).values(hold_values(gate, hold, now))
    )
