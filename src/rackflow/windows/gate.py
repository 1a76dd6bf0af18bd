"""The start gate of maintenance windows: no task starts on a rack inside a FREEZE that applies to its
operation, whoever submitted it, unless it was submitted with `ignore_windows` (docs/WINDOWS.md).

A gate of the executor's claim (`rackflow.tasks.gates`): a frozen task is held until the freeze's end,
with a message saying what it waits for. ALLOW windows do not gate starts: they bind scheduled firings
(`domain.firing.window_decisions`), whose deferred tasks wait for their opening on their own.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.tasks import Hold, InLine, Task
from rackflow.domain.window_rules import freeze_at
from rackflow.domain.windows import WindowKind
from rackflow.store import windows as store


class FreezeGate:
    """Holds a task while a FREEZE applies to its rack and operation."""

    name = "freeze"

    async def check(
        self, conn: AsyncConnection, tasks: Sequence[Task], now: datetime
    ) -> dict[uuid.UUID, Hold]:
        return await self.look(conn, [InLine.of(task) for task in tasks], now)

    async def look(
        self, conn: AsyncConnection, tasks: Sequence[InLine], now: datetime
    ) -> dict[uuid.UUID, Hold]:
        """What `check` would answer (it only reads, so it is the check): a look ahead
        (`rackflow.tasks.gates.look`)."""
        fresh = [task for task in tasks if not task.ignore_windows]
        if not fresh:
            return {}
        freezes = [w for w in await store.all_windows(conn) if w.kind is WindowKind.FREEZE]
        if not freezes:
            return {}
        racks = await store.rack_refs(conn, {task.rack_id for task in fresh})
        held: dict[uuid.UUID, Hold] = {}
        for task in fresh:
            rack = racks.get(task.rack_id)
            frozen = freeze_at(freezes, rack, task.kind, now) if rack is not None else None
            if frozen is not None and frozen.until is not None:
                message = f"waits for freeze {frozen.window.name!r} to end at {frozen.until.isoformat()}"
                held[task.id] = Hold(frozen.until, message)
        return held
