"""An operation budget: at most `max_running` tasks of its operations running across the fleet at once
(and at most `max_running_per_domain` in one NVLink domain), whoever submitted them."""

from __future__ import annotations

import uuid
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
