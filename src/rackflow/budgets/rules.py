"""The admission rule of operation budgets, as one pure function (no clock, no I/O).

Given the budgets, the tasks already running (each as its operation and its domain) and the tasks that
would start, in order: each candidate starts if every budget counting its operation has room, in the fleet
(`max_running`) and in its domain (`max_running_per_domain`); a started candidate then counts for the
ones after it. A candidate held back does not hold back later ones another budget or another domain lets
through. A rack without an NVLink domain is a domain of its own (as the rollouts' `max_per_domain`), so
the caller passes its rack id as its domain.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rackflow.domain.budgets import OperationBudget, Started

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Held:
    """Why a task may not start: `budget` has `running` of its `cap`, in the fleet (`domain` None) or in
    the task's `domain`."""

    budget: OperationBudget
    running: int
    cap: int
    domain: uuid.UUID | None

    @property
    def message(self) -> str:
        """The words the held task carries, e.g. "waits for budget 'fw' (8 of 8 running)"."""
        where = " in its NVLink domain" if self.domain is not None else ""
        return f"waits for budget {self.budget.name!r} ({self.running} of {self.cap} running{where})"


def admit(
    budgets: Sequence[OperationBudget], running: Iterable[Started], candidates: Sequence[tuple[K, Started]]
) -> dict[K, Held]:
    """The candidates (key, task) that may not start now, each with the first full budget by name; the
    others start, in order."""
    ordered = sorted(budgets, key=lambda b: b.name)
    fleet: Counter[uuid.UUID] = Counter()
    domain: Counter[tuple[uuid.UUID, uuid.UUID]] = Counter()

    def count(task: Started) -> None:
        for budget in ordered:
            if budget.counts(task.operation):
                fleet[budget.id] += 1
                domain[budget.id, task.domain] += 1

    for task in running:
        count(task)
    held: dict[K, Held] = {}
    for key, task in candidates:
        full = next(
            (h for b in ordered if b.counts(task.operation) and (h := _full(b, task, fleet, domain))), None
        )
        if full is not None:
            held[key] = full
        else:
            count(task)
    return held


def _full(
    budget: OperationBudget,
    task: Started,
    fleet: Counter[uuid.UUID],
    domain: Counter[tuple[uuid.UUID, uuid.UUID]],
) -> Held | None:
    if fleet[budget.id] >= budget.max_running:
        return Held(budget, fleet[budget.id], budget.max_running, None)
    cap = budget.max_running_per_domain
    if cap is not None and domain[budget.id, task.domain] >= cap:
        return Held(budget, domain[budget.id, task.domain], cap, task.domain)
    return None
