"""The delivery loop every `rackflow serve` runs: fan new events out to the channels they match, claim due
deliveries, send them, write the results (`store.outbox` says how instances share this without sending one
delivery twice at once).

At least once: a delivery is pending until a receiver answered 2xx and that was written; a send whose
instance died is claimed again once its lease has passed. A failed send is tried again after an exponential
back-off with jitter (`retry_delay`), and after the channel's `max_attempts` it is dead until `rackflow
notify redeliver`. Each channel is sent at most `rate_per_minute` a minute from all instances together: its
token bucket is its row, which a claim locks, draws from and writes in the claim's transaction
(`outbox.take_tokens`), so instances take turns and N instances do not send N times the rate.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from rackflow import metrics
from rackflow.clock import sleep_unless_stopped
from rackflow.config import (
    DEFAULT_NOTIFY_SEND_LEASE,
    NOTIFY_BATCH,
    NOTIFY_INTERVAL,
    NOTIFY_RATE_BURST,
    NOTIFY_RETRY_FIRST,
    NOTIFY_RETRY_MAX,
    NOTIFY_SEND_TIMEOUT,
    NOTIFY_SENDS,
)
from rackflow.domain.notifications import Channel
from rackflow.notify.senders import Request, SendFailed, post, request_for
from rackflow.retry import Retry
from rackflow.store import outbox
from rackflow.store.db import Database

log = logging.getLogger(__name__)

Send = Callable[[Request, float], Awaitable[None]]  # the request, and the seconds it may take
RETRY = Retry(NOTIFY_RETRY_FIRST.total_seconds(), NOTIFY_RETRY_MAX.total_seconds())


def retry_delay(attempt: int, jitter: float) -> timedelta:
    """How long after failed attempt number `attempt` (from 1) the next one is due: the doubling of `RETRY`,
    times `jitter` (drawn from 0.5–1.0), so that instances and channels retrying together spread out."""
    delay = next(itertools.islice(RETRY.delays(), attempt - 1, None))
    return timedelta(seconds=delay * jitter)


class Deliverer:
    """Run with `run(stop)`; `deliver_once()` is one round (tests call it directly)."""

    def __init__(
        self,
        db: Database,
        *,
        external_url: str = "",
        interval: timedelta = NOTIFY_INTERVAL,
        batch: int = NOTIFY_BATCH,
        sends: int = NOTIFY_SENDS,
        timeout: timedelta = NOTIFY_SEND_TIMEOUT,
        lease: timedelta = DEFAULT_NOTIFY_SEND_LEASE,
        sender: Send | None = None,
        jitter: Callable[[], float] = lambda: random.uniform(0.5, 1.0),
    ) -> None:
        self.db = db
        self.external_url = external_url
        self.interval = interval
        self.batch = batch
        self.sends = sends
        self.timeout = timeout
        self.lease = lease
        # A pool of the loop's own, one thread per send a round claims: a send never waits for a thread
        # (so never outlives its lease waiting), and takes none from the event loop's default executor.
        self._pool = ThreadPoolExecutor(sends, thread_name_prefix="rackflow-notify")
        self.sender = sender or self._post
        self.jitter = jitter
        self._rounds = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until `stop`: at once again after a busy one, else after `interval`. A failed round (say,
        the database is down) is logged and tried again."""
        try:
            while not stop.is_set():
                busy = False
                try:
                    busy = await self.deliver_once()
                except Exception as exc:
                    log.warning("notification delivery round failed (%s); trying again", exc)
                if not busy:
                    await sleep_unless_stopped(stop, self.interval)
        finally:
            self._pool.shutdown(wait=False)

    async def _post(self, request: Request, seconds: float) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, post, request, seconds)

    async def deliver_once(self) -> bool:
        """Fan out, claim, send, record; returns whether the round was full (more may wait). With nothing
        to do (the usual case) it only reads: no write transaction (on SQLite, the one writer's lock)."""
        async with self.db.read() as conn:
            work = await outbox.work(conn, await self.db.now(conn), NOTIFY_RATE_BURST)
        fanned = 0
        if work.new_events:
            async with self.db.transaction() as conn:
                fanned = await outbox.fan_out(self.db, conn, await self.db.now(conn), self.batch)
        claims: list[tuple[Channel, outbox.Claimed]] = []
        # A channel whose bucket holds no whole token has none to take now (the claim reads it again, locked).
        due = [
            c
            for c in work.channels
            if c.enabled and (c.id in work.due or fanned) and work.tokens.get(c.id, 0.0) >= 1.0
        ]
        if due:
            claims = await self._claim(due)
        if claims:
            results = await asyncio.gather(*(self._send(channel, claimed) for channel, claimed in claims))
            async with self.db.transaction() as conn:
                await outbox.record_results(conn, results, await self.db.now(conn))
        await self._observe()
        return fanned >= self.batch or len(claims) >= self.sends

    async def _claim(self, channels: list[Channel]) -> list[tuple[Channel, outbox.Claimed]]:
        """Claim what each channel's bucket allows, up to `sends` in all, in one transaction. Each round
        starts one channel further on, so a busy channel cannot starve the rest."""
        self._rounds += 1
        start = self._rounds % len(channels)
        channels = channels[start:] + channels[:start]
        claims: list[tuple[Channel, outbox.Claimed]] = []
        async with self.db.transaction() as conn:
            now = await self.db.now(conn)
            buckets = await outbox.take_tokens(self.db, conn, channels, now, NOTIFY_RATE_BURST)
            for channel in (c for c in channels if c.id in buckets):
                if len(claims) >= self.sends:
                    break
                tokens = buckets[channel.id]
                room = min(int(tokens), self.sends - len(claims))
                if room <= 0:
                    continue
                claimed = await outbox.claim_deliveries(self.db, conn, channel.id, now, room, self.lease)
                await outbox.spend_tokens(conn, channel.id, tokens - len(claimed), now)
                claims += [(channel, c) for c in claimed]
        return claims

    async def _send(self, channel: Channel, claimed: outbox.Claimed) -> outbox.Result:
        request = request_for(channel, claimed.event, now=self.db.clock.now(), external_url=self.external_url)
        try:
            async with asyncio.timeout(self.timeout.total_seconds()):
                await self.sender(request, self.timeout.total_seconds())
        except (SendFailed, TimeoutError) as exc:
            return self._failed(channel, claimed, str(exc) or "timed out")
        metrics.NOTIFICATIONS_DELIVERED.labels(channel.name).inc()
        return outbox.Result(claimed, delivered=True)

    def _failed(self, channel: Channel, claimed: outbox.Claimed, error: str) -> outbox.Result:
        metrics.NOTIFICATIONS_FAILED.labels(channel.name).inc()
        if claimed.attempt >= channel.max_attempts:
            metrics.NOTIFICATIONS_DEAD.labels(channel.name).inc()
            log.error(
                "notification %s to channel %r is dead after %d attempts: %s",
                claimed.event.id,
                channel.name,
                claimed.attempt,
                error,
                extra={"event_id": str(claimed.event.id), "channel": channel.name},
            )
            return outbox.Result(claimed, delivered=False, error=error)
        delay = retry_delay(claimed.attempt, self.jitter())
        log.warning(
            "notification %s to channel %r failed (attempt %d): %s; again in %.1fs",
            claimed.event.id,
            channel.name,
            claimed.attempt,
            error,
            delay.total_seconds(),
            extra={"event_id": str(claimed.event.id), "channel": channel.name},
        )
        return outbox.Result(claimed, delivered=False, error=error, retry_after=delay)

    async def _observe(self) -> None:
        async with self.db.read() as conn:
            backlog = await outbox.backlog(conn)
            now = await self.db.now(conn)
        age = (now - backlog.oldest).total_seconds() if backlog.oldest is not None else 0.0
        metrics.NOTIFICATION_OUTBOX_AGE.set(max(0.0, age))
        metrics.NOTIFICATION_DEAD_DELIVERIES.set(backlog.dead)
