"""The delivery loop every `rackflow serve` runs: fan new events out to the channels they match, claim due
deliveries, send them, write the results (`store.outbox` says how instances share this without sending one
delivery twice at once).

At least once: a delivery is pending until a receiver answered 2xx and that was written; a send whose
instance died is claimed again once its lease has passed. A failed send is tried again after an exponential
back-off with jitter (`retry_delay`), and after the channel's `max_attempts` it is dead until `rackflow
notify redeliver`. Each channel is sent at most `rate_per_minute` a minute from all instances together: its
token bucket is its row, which a claim locks, draws from and writes in the claim's transaction
(`outbox.take_tokens`), so instances take turns and N instances do not send N times the rate.

Idle, the loop sleeps (it polled every second, and was the largest share of an idle server's database work
and CPU: docs/PERFORMANCE.md, "An idle server"). What gives it work either is written (an event, a
redelivery, a channel made, enabled or given a higher rate: `outbox.CHANGED`, which wakes the loop of the
process that wrote it once the write committed; that instance delivers it as at once as before) or comes
due with time (a retry's back-off, a send's lease running out: the round read when). So after a round with
nothing to send it sleeps until the next known due time, woken sooner by a write, and looks at least every
NOTIFY_IDLE_INTERVAL: the safety net for work another instance wrote and could not deliver (it stopped), as
before when every instance polled. While deliveries are due that a round could not send (its channel has no
token yet) it looks again every `interval`, as before. The outbox gauges are read when /metrics is scraped
(`observe`), not each round.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

from rackflow import metrics
from rackflow.clock import sleep_unless_woken
from rackflow.config import (
    DEFAULT_NOTIFY_SEND_LEASE,
    NOTIFY_BATCH,
    NOTIFY_IDLE_INTERVAL,
    NOTIFY_INTERVAL,
    NOTIFY_RATE_BURST,
    NOTIFY_RETRY_FIRST,
    NOTIFY_RETRY_MAX,
    NOTIFY_SEND_TIMEOUT,
    NOTIFY_SENDS,
)
from rackflow.domain.notifications import Channel, ChannelKind, Event
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


@dataclass(frozen=True)
class _Claim:
    """A claimed delivery, its channel, and (to an Alertmanager) its condition's latest event, if any."""

    channel: Channel
    claimed: outbox.Claimed
    current: Event | None


@dataclass(frozen=True)
class _Round:
    """What a round found: whether it was full (look again at once), and otherwise how long until the
    next look, unless woken."""

    busy: bool
    pause: float


class Deliverer:
    """Run with `run(stop)`; `deliver_once()` is one round (tests call it directly); `wake()` makes an idle
    loop look now."""

    def __init__(
        self,
        db: Database,
        *,
        external_url: str = "",
        interval: timedelta = NOTIFY_INTERVAL,
        idle_interval: timedelta = NOTIFY_IDLE_INTERVAL,
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
        self.idle_interval = idle_interval
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
        self._woken = asyncio.Event()

    def wake(self) -> None:
        self._woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until `stop`: at once again after a busy one, after `interval` while deliveries wait for
        tokens, else when woken or the next delivery is due (the module's docstring). A failed round (say,
        the database is down) is logged and tried again after `interval`."""
        woken_by = self.db.on_commit.setdefault(outbox.CHANGED, [])
        woken_by.append(self.wake)
        metrics.NOTIFICATION_OUTBOX.read_with(asyncio.get_running_loop(), self.observe)
        try:
            while not stop.is_set():
                self._woken.clear()  # what commits from now on is seen by this round or wakes the nap
                pause = self.interval.total_seconds()
                try:
                    found = await self._round()
                    if found.busy:
                        continue
                    pause = found.pause
                except Exception as exc:
                    log.warning("notification delivery round failed (%s); trying again", exc)
                await sleep_unless_woken(stop, self._woken, pause)
        finally:
            metrics.NOTIFICATION_OUTBOX.read_with(None, None)
            woken_by.remove(self.wake)
            self._pool.shutdown(wait=False)

    async def _post(self, request: Request, seconds: float) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, post, request, seconds)

    async def deliver_once(self) -> bool:
        """One round: fan out, claim, send, record; returns whether the round was full (more may wait)."""
        return (await self._round()).busy

    async def _round(self) -> _Round:
        """`deliver_once`, and when to look next. With nothing to do (the usual case) it only reads: no
        write transaction (on SQLite, the one writer's lock)."""
        async with self.db.read() as conn:
            work = await outbox.work(conn, await self.db.now(conn), NOTIFY_RATE_BURST)
        due_now = work.due
        fanned = 0
        if work.new_events:
            async with self.db.transaction() as conn:
                fanned = await outbox.fan_out(self.db, conn, await self.db.now(conn), self.batch)
        claims: list[_Claim] = []
        # A channel whose bucket holds no whole token has none to take now (the claim reads it again, locked).
        due = [
            c
            for c in work.channels
            if c.enabled and (c.id in due_now or fanned) and work.tokens.get(c.id, 0.0) >= 1.0
        ]
        if due:
            claims = await self._claim(due)
        if claims:
            results = await asyncio.gather(*(self._send(c.channel, c.claimed, c.current) for c in claims))
            async with self.db.transaction() as conn:
                await outbox.record_results(conn, results, await self.db.now(conn))
        busy = fanned >= self.batch or len(claims) >= self.sends
        if work.new_events or claims or any(c.enabled and c.id in due_now for c in work.channels):
            return _Round(busy, self.interval.total_seconds())
        pause = self.idle_interval.total_seconds()
        if (next_due := work.next_due()) is not None:
            pause = min(pause, (next_due - work.now).total_seconds())
        return _Round(busy, max(0.0, pause))

    async def _claim(self, channels: list[Channel]) -> list[_Claim]:
        """Claim what each channel's bucket allows, up to `sends` in all, in one transaction. Each round
        starts one channel further on, so a busy channel cannot starve the rest. An Alertmanager's claims
        come with their conditions' latest events, read in the same transaction (`outbox.conditions_now`)."""
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
            alerts = [c.event for channel, c in claims if channel.kind is ChannelKind.ALERTMANAGER]
            current = await outbox.conditions_now(conn, alerts) if alerts else {}
        return [_Claim(channel, c, current.get(c.event.id)) for channel, c in claims]

    async def _send(self, channel: Channel, claimed: outbox.Claimed, current: Event | None) -> outbox.Result:
        request = request_for(
            channel, claimed.event, now=self.db.clock.now(), external_url=self.external_url, current=current
        )
        try:
            async with asyncio.timeout(self.timeout.total_seconds()):
                await self.sender(request, self.timeout.total_seconds())
        except (SendFailed, TimeoutError) as exc:
            return self._failed(channel, claimed, str(exc) or "timed out")
        except Exception as exc:  # a sender's own bug: this delivery fails; the round's others are recorded
            log.warning("notification send to channel %r raised %s", channel.name, type(exc).__name__)
            return self._failed(channel, claimed, f"send failed ({type(exc).__name__})")
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

    async def observe(self) -> dict[str, float]:
        """The outbox gauges now (`metrics.NOTIFICATION_OUTBOX` asks, when /metrics is scraped)."""
        async with self.db.read() as conn:
            backlog = await outbox.backlog(conn)
            now = await self.db.now(conn)
        age = (now - backlog.oldest).total_seconds() if backlog.oldest is not None else 0.0
        return {metrics.OUTBOX_AGE: max(0.0, age), metrics.DEAD_DELIVERIES: float(backlog.dead)}
