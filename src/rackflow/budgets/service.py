"""Operation budget use cases. Each change is one transaction, so a refused request writes nothing.

Validation happens before any write and names the request's field (`budget.max_running`,
`budget.operations[1]`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.budgets.gate import BudgetGate
from rackflow.clock import Clock
from rackflow.domain.budgets import BudgetUsage, OperationBudget
from rackflow.domain.tasks import OperationKind
from rackflow.errors import InvalidArgument, NotFound
from rackflow.ids import new_id
from rackflow.store import budgets as store
from rackflow.store.db import Database
from rackflow.store.task_runs import release_held
from rackflow.validation import check_mask, check_name, check_rename, check_text, distinct_operations

NAME_PATH = "budget.name"
OPERATIONS_PATH = "budget.operations"
MAX_RUNNING_PATH = "budget.max_running"
PER_DOMAIN_PATH = "budget.max_running_per_domain"
UPDATE_PATHS = (NAME_PATH, OPERATIONS_PATH, MAX_RUNNING_PATH, PER_DOMAIN_PATH)


@dataclass(frozen=True)
class BudgetInput:
    """A budget as a request gives it (create, or the masked fields of an update)."""

    name: str = ""
    operations: tuple[OperationKind, ...] = ()
    max_running: int = 0
    max_running_per_domain: int | None = None


def _check_operations(operations: Sequence[OperationKind]) -> frozenset[OperationKind]:
    if not operations:
        raise InvalidArgument(f"{OPERATIONS_PATH}: at least one operation is required")
    return distinct_operations(operations, OPERATIONS_PATH)


def _check_max_running(value: int) -> int:
    if value < 1:
        raise InvalidArgument(f"{MAX_RUNNING_PATH}: must be at least 1, got {value}")
    return value


def _check_per_domain(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise InvalidArgument(
            f"{PER_DOMAIN_PATH}: must be at least 1 (leave it unset for no cap), got {value}"
        )
    return value


class BudgetService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    async def create(self, given: BudgetInput) -> OperationBudget:
        check_name(given.name, NAME_PATH)
        operations = _check_operations(given.operations)
        now = self.clock.now()
        budget = OperationBudget(
            id=new_id(),
            name=given.name,
            operations=operations,
            max_running=_check_max_running(given.max_running),
            max_running_per_domain=_check_per_domain(given.max_running_per_domain),
            created_at=now,
            updated_at=now,
        )
        async with self.db.transaction() as conn:
            await store.insert_budget(conn, budget)
        return budget

    async def get(self, budget_id: uuid.UUID) -> OperationBudget:
        async with self.db.read() as conn:
            budget = await store.get_budget(conn, budget_id)
        if budget is None:
            raise NotFound(f"id: no operation budget {budget_id}")
        return budget

    async def list_budgets(self) -> list[OperationBudget]:
        """Every budget, by name."""
        async with self.db.read() as conn:
            return await store.all_budgets(conn)

    async def with_usage(self) -> list[tuple[OperationBudget, BudgetUsage]]:
        """Every budget by name, with how full it is now (the console's and ListOperationBudgets' view)."""
        async with self.db.read() as conn:
            budgets = await store.all_budgets(conn)
            return list(zip(budgets, await _usage(conn, budgets), strict=True))

    async def usage(self, budget: OperationBudget) -> BudgetUsage:
        """How full `budget` is now (a returned budget's running counts)."""
        async with self.db.read() as conn:
            (found,) = await _usage(conn, [budget])
        return found

    async def update(
        self, budget_id: uuid.UUID, paths: Collection[str], given: BudgetInput
    ) -> OperationBudget:
        """Apply the masked fields (an unset `max_running_per_domain` in the mask removes that cap), then
        let the tasks budgets hold be claimed at once, to be held again by what now applies."""
        mask = check_mask(paths, UPDATE_PATHS)
        if NAME_PATH in mask:
            check_text(given.name, NAME_PATH, required=True)  # a new one is checked as on create, below
        operations = _check_operations(given.operations) if OPERATIONS_PATH in mask else None
        if MAX_RUNNING_PATH in mask:
            _check_max_running(given.max_running)
        if PER_DOMAIN_PATH in mask:
            _check_per_domain(given.max_running_per_domain)
        now = self.clock.now()
        async with self.db.transaction() as conn:
            current = await store.get_budget(conn, budget_id)
            if current is None:
                raise NotFound(f"id: no operation budget {budget_id}")
            updated = replace(
                current,
                name=check_rename(given.name, NAME_PATH, current.name) if NAME_PATH in mask else current.name,
                operations=operations if operations is not None else current.operations,
                max_running=given.max_running if MAX_RUNNING_PATH in mask else current.max_running,
                max_running_per_domain=(
                    given.max_running_per_domain
                    if PER_DOMAIN_PATH in mask
                    else current.max_running_per_domain
                ),
                updated_at=now,
            )
            await store.save_budget(conn, updated)
        await self._release()
        return updated

    async def delete(self, budget_id: uuid.UUID) -> None:
        async with self.db.transaction() as conn:
            if not await store.delete_budget(conn, budget_id):
                raise NotFound(f"id: no operation budget {budget_id}")
        await self._release()

    async def _release(self) -> None:
        """Clear the back-off of held tasks, in a transaction of its own after the budget's: a claim that
        counted under the old budget held the budget's row lock, so it committed before the change did,
        and its held tasks are released here too. (Releasing inside the change's transaction would wait
        on tasks a claim holds while holding the row lock that claim waits for.)"""
        async with self.db.transaction() as conn:
            await release_held(conn, BudgetGate.name)


async def _usage(conn: AsyncConnection, budgets: Sequence[OperationBudget]) -> list[BudgetUsage]:
    """Each budget's usage, from one read of the running tasks any of them counts."""
    counted: frozenset[OperationKind] = frozenset().union(*(b.operations for b in budgets))
    running = await store.running(conn, counted, besides=frozenset())
    return [BudgetUsage.of(budget, running) for budget in budgets]
