"""The start gate of maintenance windows: no task starts on a rack inside a FREEZE that applies to its
operation, whoever submitted it, unless it was submitted with `ignore_windows` (docs/WINDOWS.md).

A gate of the executor's claim (`rackflow.tasks.gates`): a frozen task is held until the freeze's end,
with a message saying what it waits for. ALLOW windows do not gate starts: they bind scheduled firings
(`domain.firing.window_decisions`), whose deferred tasks wait for their opening on their own.

A freeze shortened or deleted keeps no task waiting for its old end. The window's change lets go of
every freeze hold in its transaction, but skips the rows another transaction holds (it holds runs and
racks, and waits for no task's row: the lock order atop `rackflow.tasks.executor`), and lets go of those
once it committed (`let_go_of_freezes`), which a crash, an outage or an error may keep it from. So every
executor looks again (`FreezeGate.look_again`, at its dead-hold cadence): once its process starts, and
whenever the freezes differ from those it last read, it lets go of every hold the freezes as they are
would not hold so long. A claim that read the freezes before a change may commit its hold after the
look that saw the change: the look is made again once every write transaction under way then has ended
(`Database.writers_ended`). Such a hold is committed before that second look, and found by it.

A hold let go of outside any audited call (a look again's) is in the audit trail, a `ReleaseFreezeHold`
event by rackflow per task, written in the transaction that lets it go (`rackflow.audit.decisions`).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit import decisions as audit
from rackflow.domain.tasks import Hold, InLine, Task
from rackflow.domain.window_rules import freeze_at
from rackflow.domain.windows import MaintenanceWindow, WindowKind
from rackflow.store import task_runs
from rackflow.store import windows as store
from rackflow.store.db import Database
from rackflow.timespec import format_rfc3339


class FreezeGate:
    """Holds a task while a FREEZE applies to its rack and operation."""

    name = "freeze"

    def __init__(self, db: Database) -> None:
        self.db = db
        # What this process's last look again read: the freezes (None: it has not looked), and, while a
        # claim that read the freezes before may commit a hold after it, the writers under way then.
        self._seen: tuple[MaintenanceWindow, ...] | None = None
        self._settling: frozenset[str] | None = None

    async def check(
        self, conn: AsyncConnection, tasks: Sequence[Task], now: datetime
    ) -> dict[uuid.UUID, Hold]:
        return await self.look(conn, [InLine.of(task) for task in tasks], now)

    async def look(
        self, conn: AsyncConnection, tasks: Sequence[InLine], now: datetime
    ) -> dict[uuid.UUID, Hold]:
        """What `check` would answer (it only reads, so it is the check): a look ahead
        (`rackflow.tasks.gates.look`)."""
        if all(task.ignore_windows for task in tasks):
            return {}
        return await _holds(conn, _freezes(await store.all_windows(conn)), tasks, now)

    async def look_again(self, now: datetime) -> int:
        """Let go of the holds of this gate that the freezes as they are would end before theirs, if the
        freezes changed since this process last looked (or it never did), and once more when every write
        transaction under way then has ended (the module's docstring); returns how many it let go."""
        async with self.db.read() as conn:
            freezes = _freezes(await store.all_windows(conn))
            if freezes != self._seen:
                self._seen = freezes
                self._settling = await self.db.writers_under_way(conn)
            elif self._settling is not None and await self.db.writers_ended(conn, self._settling):
                self._settling = None
            else:
                return 0
            held = await task_runs.held_past(conn, self.name, now)
            holds = await _holds(conn, freezes, [task for task, _ in held], now) if held else {}
        outlasting = [
            task.id for task, until in held if (hold := holds.get(task.id)) is None or hold.until < until
        ]
        await let_go_of_freezes(self.db, outlasting, now, audit.LOOK_AGAIN)
        return len(outlasting)


def _freezes(windows: Sequence[MaintenanceWindow]) -> tuple[MaintenanceWindow, ...]:
    return tuple(w for w in windows if w.kind is WindowKind.FREEZE)


async def _holds(
    conn: AsyncConnection, freezes: Sequence[MaintenanceWindow], tasks: Sequence[InLine], now: datetime
) -> dict[uuid.UUID, Hold]:
    """The hold of each task a freeze of `freezes` holds at `now`: until the end of the covering one that
    ends last."""
    fresh = [task for task in tasks if not task.ignore_windows]
    if not fresh or not freezes:
        return {}
    racks = await store.rack_refs(conn, {task.rack_id for task in fresh})
    held: dict[uuid.UUID, Hold] = {}
    for task in fresh:
        rack = racks.get(task.rack_id)
        frozen = freeze_at(freezes, rack, task.kind, now) if rack is not None else None
        if frozen is not None and frozen.until is not None:
            message = f"waits for freeze {frozen.window.name!r} to end at {format_rfc3339(frozen.until)}"
            held[task.id] = Hold(frozen.until, message)
    return held


async def let_go_of_freezes(
    db: Database, task_ids: Collection[uuid.UUID], now: datetime, decided_by: str
) -> None:
    """Let go of the freeze's hold on each of these tasks, to be claimed and gated again by the windows as
    they are then, each in a transaction of its own, which waits for that task's row alone and holds
    nothing else meanwhile: whatever holds the row (a claim, which may have held it again by the windows
    it read before a change committed) never waits for it. A task that started meanwhile is left as it
    is. Outside an audited call, each hold let go of is recorded in that transaction, at `now`, as
    `decided_by`'s (`audit.decisions`)."""
    for task_id in task_ids:
        async with db.transaction() as conn:
            released = await task_runs.release_held(conn, FreezeGate.name, task_id=task_id)
            await audit.record_freeze_releases(conn, released, now, decided_by)
