"""The start gate of operation budgets: no task starts that would make more tasks of a budget's
operations run at once than the budget allows, in the fleet or in one NVLink domain, whoever submitted it
(a person, a schedule, a rollout; `ignore_windows` does not bypass a budget).

What counts as running: a task whose status is RUNNING in the database, whichever instance owns it, a
dead instance's included (until it is taken over and ends). That is from the claim that starts it to the
journal round that records its end; a task a freeze or a budget handed back never counted.

A gate of the executor's claim (`rackflow.tasks.gates`), after the freeze gate. A held task waits
BUDGET_RETRY_DELAY (config.py), and its message names
the budget: "waits for budget 'fw' (8 of 8 running)". Every other due PENDING task behind the same
full cap gets the same back-off and message (`store.budgets.push_back`): otherwise a long queue behind a
budget would fill every claim with tasks only to hand them back, and starve the tasks no budget holds.
So a queue behind a full budget costs one gated claim per back-off, whatever its length. Raising or
deleting a budget clears the back-off (`BudgetService`), so held tasks start at the next claim.

Only first attempts are gated (as every gate): a takeover was counted as running the whole time, so
starting it again does not add to the count.

Why two instances claiming at once never admit past a budget, together:

* PostgreSQL: each claim locks every budget row (`SELECT … FOR UPDATE`, in id order) in its transaction
  before it counts, and keeps the lock until it commits. So the claims that may start budgeted tasks run
  their count-and-admit one after another. The count is a new statement after the lock was granted, and
  at READ COMMITTED a statement sees everything committed before it started: the tasks the previous
  holder admitted, which it committed before releasing the lock. A claim's own tasks are claimed before
  the lock (`FOR UPDATE SKIP LOCKED`: never two claims of one task) and left out of its count.
* SQLite: a claim's transaction is the only writer (`BEGIN IMMEDIATE`) from its first statement to its
  commit, so no other claim can start tasks between its count and its commit.

A budget created, or lowered, below the number already running stops nothing that runs: it holds new
starts until the count drops below it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import failpoints
from rackflow.budgets.rules import Held, admit
from rackflow.config import BUDGET_RETRY_DELAY
from rackflow.domain.budgets import Started
from rackflow.domain.tasks import Hold, InLine, OperationKind, Task
from rackflow.domain.windows import RackRef
from rackflow.metrics import BUDGET_HOLDS
from rackflow.store import budgets as store
from rackflow.store.db import Database
from rackflow.store.windows import rack_refs


class BudgetGate:
    """Holds a task that would make more tasks of a budget's operations run at once than it allows."""

    name = "budget"

    def __init__(self, db: Database) -> None:
        self.db = db  # for its dialect: the row locks are spelled per database

    async def check(
        self, conn: AsyncConnection, tasks: Sequence[Task], now: datetime
    ) -> dict[uuid.UUID, Hold]:
        held = await self._held(conn, [InLine.of(task) for task in tasks], lock=True)
        if not held:
            return {}
        until = now + BUDGET_RETRY_DELAY
        full = {(h.budget.id, h.domain): h for h in held.values()}
        for cap in full.values():
            hold = Hold(until, cap.message)
            await store.push_back(self.db, conn, cap.budget, cap.domain, gate=self.name, hold=hold, now=now)
        for reason in held.values():
            BUDGET_HOLDS.labels(budget=reason.budget.name).inc()
        return {task_id: Hold(until, reason.message) for task_id, reason in held.items()}

    async def look(
        self, conn: AsyncConnection, tasks: Sequence[InLine], now: datetime
    ) -> dict[uuid.UUID, Hold]:
        """What `check` would hold now, counting `tasks` (not claimed, in claim order) as if each started
        in turn, with no lock taken and nothing written: a look ahead (`rackflow.tasks.gates.look`)."""
        held = await self._held(conn, tasks, lock=False)
        return {task_id: Hold(now + BUDGET_RETRY_DELAY, reason.message) for task_id, reason in held.items()}

    async def _held(
        self, conn: AsyncConnection, tasks: Sequence[InLine], *, lock: bool
    ) -> dict[uuid.UUID, Held]:
        """The tasks a budget holds, with why: the running tasks counted (the budgets locked first when
        `lock`), then `tasks` admitted in order."""
        kinds = {task.kind for task in tasks}
        # Unlocked first: a claim of tasks no budget counts takes no lock.
        budgets = await store.all_budgets(conn)
        if not any(budget.operations & kinds for budget in budgets):
            return {}
        if lock:
            budgets = await store.lock_budgets(self.db, conn)
        counted: frozenset[OperationKind] = frozenset().union(*(budget.operations for budget in budgets))
        candidates = [task for task in tasks if task.kind in counted]
        if not candidates:
            return {}
        racks = await rack_refs(conn, {task.rack_id for task in candidates})
        already = await store.running(conn, counted, besides=frozenset(task.id for task in tasks))
        if lock:
            # Widens the window between the count and the commit, for tests/e2e/test_budgets.py to show the
            # lock.
            await failpoints.pause("budget_counted")
        return admit(
            budgets,
            already,
            [
                (task.id, Started(task.kind, _domain(racks.get(task.rack_id), task.rack_id)))
                for task in candidates
            ],
        )


def _domain(rack: RackRef | None, rack_id: uuid.UUID) -> uuid.UUID:
    """What a budget's per-domain cap counts the task in: its rack's NVLink domain, else the rack."""
    return rack.domain_id if rack is not None and rack.domain_id is not None else rack_id
