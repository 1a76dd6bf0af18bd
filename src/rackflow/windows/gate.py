"""The start gate of maintenance windows: no task starts on a rack inside a FREEZE that applies to its
operation, whoever submitted it, unless it was submitted with `ignore_windows` (docs/WINDOWS.md).

The executor calls `hold_frozen` on what its claim just took, in the claim's transaction. A held task goes
back to PENDING as if never claimed (the attempt is not counted), with `not_before` at the freeze's end,
so the claim leaves it alone until then, and a message saying what it waits for. Only first attempts are
gated: a task already running when a freeze opens (or taken over from a dead instance) is not interrupted.
ALLOW windows do not gate starts: they bind scheduled firings (`domain.firing.window_decisions`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.tasks import Task
from rackflow.domain.window_rules import freeze_at
from rackflow.domain.windows import WindowKind
from rackflow.store import task_runs
from rackflow.store import windows as store

log = logging.getLogger(__name__)


async def hold_frozen(
    conn: AsyncConnection, claimed: Sequence[tuple[Task, int]], *, owner_id: uuid.UUID, now: datetime
) -> list[tuple[Task, int]]:
    """`claimed` (task, attempt) without the tasks a freeze holds at `now`, which are handed back."""
    fresh = [task for task, attempt in claimed if attempt == 1 and not task.ignore_windows]
    if not fresh:
        return list(claimed)
    freezes = [w for w in await store.all_windows(conn) if w.kind is WindowKind.FREEZE]
    if not freezes:
        return list(claimed)
    racks = await store.rack_refs(conn, {task.rack_id for task in fresh})
    held: dict[uuid.UUID, tuple[datetime, str]] = {}
    for task in fresh:
        rack = racks.get(task.rack_id)
        frozen = freeze_at(freezes, rack, task.operation.kind, now) if rack is not None else None
        if frozen is not None and frozen.until is not None:
            message = f"waits for freeze {frozen.window.name!r} to end at {frozen.until.isoformat()}"
            held[task.id] = (frozen.until, message)
    if not held:
        return list(claimed)
    await task_runs.hold_back(conn, held, owner_id=owner_id, now=now)
    log.info("%d task(s) held back by freezes", len(held), extra={"tasks_held": len(held)})
    return [(task, attempt) for task, attempt in claimed if task.id not in held]
