"""An operation budget: at most `max_running` tasks of its operations running across the fleet at once
(and at most `max_running_per_domain` in one NVLink domain), whoever submitted them."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from rackflow.domain.tasks import OperationKind


@dataclass(frozen=True)
class OperationBudget:
    id: uuid.UUID
    name: str
    operations: frozenset[OperationKind]
    max_running: int
    max_running_per_domain: int | None
    created_at: datetime
    updated_at: datetime

    def counts(self, operation: OperationKind) -> bool:
        return operation in self.operations


@dataclass(frozen=True)
class Started:
    """A task that counts (running, or about to start): its operation and its domain (or its rack's id
    when the rack has none)."""

    operation: OperationKind
    domain: uuid.UUID


@dataclass(frozen=True)
class BudgetUsage:
    """How full a budget is now: its tasks running across the fleet, and the most of them in one domain
    (what its two caps are held against)."""

    running: int
    running_in_fullest_domain: int

    @classmethod
    def of(cls, budget: OperationBudget, started: Iterable[Started]) -> BudgetUsage:
        """`budget`'s usage among `started` (every counted task, of any budget's operations)."""
        by_domain = Counter(task.domain for task in started if budget.counts(task.operation))
        return cls(sum(by_domain.values()), max(by_domain.values(), default=0))
