"""The start gate of operation budgets: no task starts that would make more tasks of a budget's
operations run at once than the budget allows, in the fleet or in one NVLink domain, whoever submitted it
(a person, a schedule, a rollout; `ignore_windows` does not bypass a budget).

What counts as running: a task whose status is RUNNING in the database, whichever instance owns it, a
dead instance's included (until it is taken over and ends). That is from the claim that starts it to the
journal round that records its end; a task a freeze or a budget handed back never counted.

The executor calls `hold_over_budget` on what its claim just took, in the claim's transaction, after the
freeze gate. A held task goes back to PENDING as if never claimed (the attempt is not counted), with
`not_before` BUDGET_RETRY_DELAY ahead (config.py) so the claim leaves it alone that long, and a message
naming the budget: "waits for budget 'fw' (8 of 8 running)". Every other due PENDING task behind the same
full cap gets the same back-off and message (`store.budgets.push_back`): otherwise a long queue behind a
budget would fill every claim with tasks only to hand them back, and starve the tasks no budget holds.
So a queue behind a full budget costs one gated claim per back-off, whatever its length. Raising or
deleting a budget clears the back-off (`BudgetService`), so held tasks start at the next claim.

Only first attempts are gated. A later attempt is a takeover of a task that was RUNNING all along (its
owner died, or its run was interrupted): it was counted as running the whole time, so starting it again
does not add to the count, and handing it back would lose its place (and its `started_at`) for nothing.
(There is no other kind of retry: a failed task stays failed.)

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

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import failpoints
from rackflow.budgets.rules import admit
from rackflow.config import BUDGET_RETRY_DELAY
from rackflow.domain.budgets import Started
from rackflow.domain.tasks import OperationKind, Task
from rackflow.domain.windows import RackRef
from rackflow.metrics import BUDGET_HOLDS
from rackflow.store import budgets as store
from rackflow.store.db import Database
from rackflow.store.task_runs import hold_back
from rackflow.store.windows import rack_refs

log = logging.getLogger(__name__)


async def hold_over_budget(
    db: Database,
    conn: AsyncConnection,
    claimed: Sequence[tuple[Task, int]],
    *,
    owner_id: uuid.UUID,
    now: datetime,
) -> list[tuple[Task, int]]:
    """`claimed` (task, attempt) without the tasks a full budget holds, which are handed back."""
    fresh = [task for task, attempt in claimed if attempt == 1]
    kinds = {task.operation.kind for task in fresh}
    # Unlocked first: a claim of tasks no budget counts takes no lock.
    if not any(budget.operations & kinds for budget in await store.all_budgets(conn)):
        return list(claimed)
    budgets = await store.lock_budgets(db, conn)
    counted: frozenset[OperationKind] = frozenset().union(*(budget.operations for budget in budgets))
    candidates = [task for task in fresh if task.operation.kind in counted]
    if not candidates:
        return list(claimed)
    racks = await rack_refs(conn, {task.rack_id for task in candidates})
    already = await store.running(conn, counted, besides=frozenset(task.id for task in fresh))
    # Widens the window between the count and the commit, for tests/e2e/test_budgets.py to show the lock.
    await failpoints.pause("budget_counted")
    held = admit(
        budgets,
        already,
        [
            (task.id, Started(task.operation.kind, _domain(racks.get(task.rack_id), task.rack_id)))
            for task in candidates
        ],
    )
    if not held:
        return list(claimed)
    until = now + BUDGET_RETRY_DELAY
    await hold_back(conn, {i: (until, h.message) for i, h in held.items()}, owner_id=owner_id, now=now)
    full = {(h.budget.id, h.domain): h for h in held.values()}
    for cap in full.values():
        await store.push_back(db, conn, cap.budget, cap.domain, until=until, message=cap.message, now=now)
    for reason in held.values():
        BUDGET_HOLDS.labels(budget=reason.budget.name).inc()
    log.info("%d task(s) held back by budgets", len(held), extra={"tasks_held": len(held)})
    return [(task, attempt) for task, attempt in claimed if task.id not in held]


def _domain(rack: RackRef | None, rack_id: uuid.UUID) -> uuid.UUID:
    """What a budget's per-domain cap counts the task in: its rack's NVLink domain, else the rack."""
    return rack.domain_id if rack is not None and rack.domain_id is not None else rack_id
