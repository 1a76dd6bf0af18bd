"""`--audit-retention`: every instance deletes the audit events older than the retention, at start-up and
then hourly.

Each instance prunes on its own: deleting is idempotent and concurrent pruners skip each other's rows
(`store.audit.prune_events`), so no leader is needed, and the trail stays bounded while any instance runs.
A failed prune (say, the database is down) is logged and tried again at the next hour; it never stops the
server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from rackflow import metrics
from rackflow.clock import sleep_unless_stopped
from rackflow.config import DEFAULT_AUDIT_PRUNE_INTERVAL
from rackflow.store import audit as store
from rackflow.store.db import Database

log = logging.getLogger(__name__)


class AuditPruner:
    """Run with `run(stop)` beside the executor and the dispatcher."""

    def __init__(
        self,
        db: Database,
        retention: timedelta,
        *,
        every: timedelta = DEFAULT_AUDIT_PRUNE_INTERVAL,
        chunk: int = store.PRUNE_CHUNK,
    ) -> None:
        self.db = db
        self.retention = retention
        self.every = every
        self.chunk = chunk

    async def run(self, stop: asyncio.Event) -> None:
        """Prune at once, then every `every` until `stop` is set."""
        log.info("audit retention: deleting events older than %s, every %s", self.retention, self.every)
        while not stop.is_set():
            try:
                await self.prune_once(stop)
            except Exception as exc:
                log.warning("audit prune failed (%s); retrying in %s", exc, self.every)
            await sleep_unless_stopped(stop, self.every)

    async def prune_once(self, stop: asyncio.Event) -> int:
        """Delete the events past the retention, chunk by chunk; `stop` ends it after the current chunk, so a
        first prune of millions of rows does not hold up shutdown. Returns how many went."""
        pruned = 0
        chunks = store.prune_events(self.db, self.retention, chunk=self.chunk)
        async with contextlib.aclosing(chunks):
            async for deleted in chunks:
                pruned += deleted
                metrics.AUDIT_EVENTS_PRUNED.inc(deleted)
                if stop.is_set():
                    break
        log.info("audit retention: pruned %d events older than %s", pruned, self.retention)
        return pruned
