"""The dispatcher: the background loop in every `rackflow serve` that fires due schedules.

Delivery guarantee — at most once per tick, on any number of instances:

* Phase 1 (one transaction) claims up to `batch` due rows with `FOR UPDATE SKIP LOCKED` (SQLite: inside its
  single-writer transaction), runs the SKIP overlap check per scope, advances every claimed row's
  `next_run_at` (interval: dispatch time + duration; cron: next time after the dispatch time; one-time:
  consumed) and inserts a "running" run row per firing. When this commits, the tick is spent: no instance
  can claim it again, because the row is locked until then and not due afterwards.
* Phase 2 (no transaction) submits one task per eligible scope through the task manager; phase 3 writes
  `last_task_id` back and completes the run (`rackflow.schedules.firing`). A crash between phases loses the
  tick's remaining submissions rather than repeating them; its run row stays "running" until another
  instance sees the owner's heartbeat has stopped and marks it "interrupted", so the operator sees it.
* "Now" is the database's clock on PostgreSQL, so instances with skewed clocks agree on what is due.

A full batch means more may be due: the loop polls again at once (draining) instead of sleeping, so
thousands of schedules due at the same minute fire in seconds, not in thousands of poll intervals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from datetime import timedelta

from rackflow import failpoints, metrics
from rackflow.schedules.firing import Firing, advance_after_firing, fire_batch
from rackflow.schedules.model import OverlapPolicy
from rackflow.services import Services
from rackflow.store import dispatch, schedules
from rackflow.store.instances import LEASE_TTL

log = logging.getLogger(__name__)

# After an unexpected error (e.g. the database restarting) wait this long before polling again.
ERROR_BACKOFF = timedelta(seconds=1)


class Dispatcher:
    def __init__(
        self,
        services: Services,
        *,
        instance_id: uuid.UUID,
        interval: timedelta = timedelta(seconds=10),
        batch: int = 10,
        lease_ttl: timedelta = LEASE_TTL,
    ) -> None:
        self.services = services
        self.db = services.db
        self.instance_id = instance_id
        self.interval = interval
        self.batch = batch
        self.lease_ttl = lease_ttl

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set. The first poll happens at once; a full batch polls again at once."""
        log.info("dispatcher started: every %ss, batch %d", self.interval.total_seconds(), self.batch)
        while not stop.is_set():
            try:
                claimed = await self.poll_once()
            except Exception as exc:
                log.warning("dispatch poll failed (%s); retrying in %ss", exc, ERROR_BACKOFF.total_seconds())
                await _sleep(stop, ERROR_BACKOFF)
                continue
            if claimed >= self.batch:
                continue  # draining: more are probably due
            with contextlib.suppress(Exception):
                await self.sweep_abandoned_runs()
            await _sleep(stop, self.interval)
        log.info("dispatcher stopped")

    async def poll_once(self) -> int:
        """Claim, advance and fire one batch; returns how many schedules were claimed."""
        started = time.perf_counter()
        claimed = await self._claim()
        if claimed:
            await failpoints.pause("pause_after_claim")
            await self._fire(claimed)
        if len(claimed) < self.batch:
            metrics.DUE_BACKLOG.set(0)
        else:
            async with self.db.read() as conn:
                metrics.DUE_BACKLOG.set(await dispatch.count_due(conn, await self.db.now(conn)))
        metrics.POLL_SECONDS.observe(time.perf_counter() - started)
        return len(claimed)

    async def _claim(self) -> list[Firing]:
        """Phase 1 for a whole batch, in one transaction."""
        async with self.db.transaction() as conn:
            now = await self.db.now(conn)
            due = await dispatch.claim_due(self.db, conn, now, self.batch)
            if not due:
                return []
            scopes = await dispatch.scopes_by_schedule(conn, [s.id for s in due])
            skip_candidates = [
                sc for s in due if s.overlap_policy is OverlapPolicy.SKIP for sc in scopes[s.id]
            ]
            busy = await schedules.overlapping_scope_ids(conn, skip_candidates)
            claimed: list[Firing] = []
            advances: list[dispatch.Advance] = []
            runs: list[schedules.NewRun] = []
            for schedule in due:
                assert schedule.next_run_at is not None
                metrics.DISPATCH_LAG.observe(max(0.0, (now - schedule.next_run_at).total_seconds()))
                enabled, next_run_at = advance_after_firing(schedule, now)
                advances.append(dispatch.Advance(schedule.id, enabled, next_run_at, now))
                run_id = uuid.uuid4()
                runs.append(
                    schedules.NewRun(
                        run_id, schedule.id, now, "dispatch", schedule.next_run_at, self.instance_id
                    )
                )
                own = scopes[schedule.id]
                skip = frozenset(sc.id for sc in own if sc.id in busy)
                claimed.append(Firing(schedule, own, "dispatch", now, run_id, skip, schedule.next_run_at))
            await dispatch.advance(conn, advances, now)
            await schedules.insert_runs(conn, runs)
        return claimed

    async def _fire(self, claimed: list[Firing]) -> None:
        """Phases 2 and 3 for the whole batch; never raises, so a bad batch cannot stop the loop."""
        try:
            await fire_batch(self.db, self.services.tasks, self.services.clock, claimed)
        except Exception:
            log.exception("firing a batch of %d schedule(s) failed", len(claimed))

    async def sweep_abandoned_runs(self) -> None:
        async with self.db.transaction() as conn:
            marked = await dispatch.mark_abandoned_runs(conn, await self.db.now(conn), self.lease_ttl)
        if marked:
            log.warning("marked %d run(s) of stopped instances as interrupted", marked)


async def _sleep(stop: asyncio.Event, delay: timedelta) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay.total_seconds())
