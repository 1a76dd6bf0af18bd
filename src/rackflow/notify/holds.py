"""The hold watcher every `rackflow serve` runs: it reports a task that a start gate (a freeze, a budget, a
pre-flight check) has held longer than the threshold (`task.held_too_long`, --notification-hold-
threshold), once per hold, and the end of that hold (`task.hold_cleared`: Alertmanager ends the alert).

No write site can record these: a hold grows long by time passing, and ends in many ways (the task starts,
is cancelled, fails its checks, expires, is deleted with its rack, another gate holds it). So a loop looks,
and the database keeps it to once: the event is keyed by the task, its gate and the hold's start
(`held_since`, kept while the same gate holds the task), and the outbox holds one event per key (a unique
index), however many instances find the hold at once; a clearing is written only by the transaction whose
`clear_condition` marked the raised event cleared (`… WHERE cleared_at IS NULL`).

A look that races the task's start may report a hold that just ended; the next look then clears it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping
from datetime import timedelta

from rackflow.clock import sleep_unless_stopped
from rackflow.config import DEFAULT_NOTIFICATION_HOLD_THRESHOLD, NOTIFY_BATCH, NOTIFY_HOLD_WATCH_INTERVAL
from rackflow.domain.notifications import Event, EventType
from rackflow.domain.tasks import RETRY_HOLD, WINDOW_HOLD
from rackflow.notify import events
from rackflow.store import outbox
from rackflow.store.db import Database

log = logging.getLogger(__name__)
# Waits the task asked for, not a gate holding it: its maintenance window's opening, its retry's back-off
# (up to --retry-max-backoff; reported, every retried task whose back-off outlasted the threshold paged).
NOT_GATES = (WINDOW_HOLD, RETRY_HOLD)


class HoldWatcher:
    """Run with `run(stop)`; `watch_once()` is one look (tests call it directly)."""

    def __init__(
        self,
        db: Database,
        *,
        threshold: timedelta = DEFAULT_NOTIFICATION_HOLD_THRESHOLD,
        interval: timedelta | None = None,
        batch: int = NOTIFY_BATCH,
    ) -> None:
        self.db = db
        self.threshold = threshold
        self.interval = interval or min(NOTIFY_HOLD_WATCH_INTERVAL, threshold / 4)
        self.batch = batch

    async def run(self, stop: asyncio.Event) -> None:
        """Looks until `stop`, every `interval`; a failed look (say, the database is down) is logged."""
        while not stop.is_set():
            try:
                await self.watch_once()
            except Exception as exc:
                log.warning("looking for tasks held too long failed (%s); trying again", exc)
            await sleep_unless_stopped(stop, self.interval)

    async def watch_once(self) -> tuple[int, int]:
        """Clear the reported holds that ended, report the long ones not reported yet; returns how many of
        each this instance wrote. Reads only, unless there is something to write."""
        async with self.db.read() as conn:
            now = await self.db.now(conn)
            raised = await outbox.open_conditions(conn, EventType.TASK_HELD_TOO_LONG)
            current = await outbox.held_now(conn, [e.task_id for e in raised if e.task_id is not None])
            long = await outbox.long_holds(
                conn,
                now - self.threshold,
                exclude=NOT_GATES,
                reported={e.task_id for e in raised if e.task_id is not None},
                limit=self.batch,
            )
            taken = await outbox.keys_taken(conn, [events.hold_key(held) for held in long])
        ended = [(event, why) for event in raised if (why := _ended(event, current))]
        new = [held for held in long if events.hold_key(held) not in taken]
        if not ended and not new:
            return 0, 0
        async with self.db.transaction() as conn:
            now = await self.db.now(conn)
            cleared = [
                events.hold_cleared(event, why, now)
                for event, why in ended
                if await outbox.clear_condition(conn, event.id, now)
            ]
            await outbox.record_events(
                conn, cleared + [events.held_too_long(held, self.threshold, now) for held in new]
            )
        if new or cleared:
            log.info("%d long hold(s) reported, %d cleared", len(new), len(cleared))
        return len(new), len(cleared)


def _ended(raised: Event, current: Mapping[uuid.UUID, outbox.Held | None]) -> str:
    """Why the hold `raised` reported is over, or empty while it lasts."""
    if raised.task_id is None or raised.task_id not in current:
        return "the task was deleted"
    held = current[raised.task_id]
    if held is None:
        return "the task is no longer waiting (started or ended)"
    if events.hold_key(held) == raised.key:
        return ""
    if held.held_by != raised.payload.get("held_by"):
        return f"{held.held_by} holds it now"
    return "it was let go and held again"
