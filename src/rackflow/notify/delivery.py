"""The delivery loop every `rackflow serve` runs: fan new events out to the channels they match, claim due
deliveries, send them, write the results (`store.outbox` says how instances share this without sending one
delivery twice at once).

At least once: a delivery is pending until a receiver answered 2xx and that was written; a send whose
instance died is claimed again once its lease has passed. A failed send is tried again after an exponential
back-off with jitter (`retry_delay`), and after the channel's `max_attempts` it is dead until `rackflow
notify redeliver`. Each channel is sent at most `rate_per_minute` a minute from all instances together: its
token bucket is its row, which a claim locks, draws from and writes in the claim's transaction
(`outbox.take_tokens`), so instances take turns and N instances do not send N times the rate.

An Alertmanager keeps alerts in memory and expects the firing ones again and again: an open condition's
delivered alert is sent again every `resend` (DEFAULT_ALERT_RESEND_INTERVAL) with `endsAt` a few intervals
on, claimed in the database like a delivery (`outbox.claim_resends`) so one instance sends each per
interval, until its clearing is recorded (`_resends`); the clearing's resolved alert is sent once more, after
any re-send under way at the clearing (`_resend_after`).

Channels do not wait for each other: a round does not wait for the sends it claimed. Each channel's sends
go on in a task of their own, which records their results when they are all answered (or timed out) and
wakes the loop; meanwhile later rounds claim and send the other channels' deliveries. (A round used to
wait for all its sends, so a receiver that took its whole timeout held every other channel's new events
back as long, each round.) A channel with sends under way is not claimed again until they are recorded,
and a round claims no more than the sends (`sends`) not already under way, so one instance has at most
`sends` at once, as its lease discipline assumes. `deliver_once` (the tests' round) and stopping wait for
the sends under way.

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
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from rackflow import metrics
from rackflow.clock import sleep_unless_woken
from rackflow.config import (
    ALERT_RESEND_LOOKS,
    DEFAULT_ALERT_RESEND_INTERVAL,
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
from rackflow.domain.notifications import CLEARS, CONDITION_SUBJECT, Channel, ChannelKind, Event
from rackflow.notify.senders import Request, SendFailed, post, request_for, resend_request
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
        resend: timedelta = DEFAULT_ALERT_RESEND_INTERVAL,
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
        self.resend = resend
        # A pool of the loop's own, one thread per send a round claims: a send never waits for a thread
        # (so never outlives its lease waiting), and takes none from the event loop's default executor.
        self._pool = ThreadPoolExecutor(sends, thread_name_prefix="rackflow-notify")
        self.sender = sender or self._post
        self.jitter = jitter
        self._rounds = 0
        self._sending: set[uuid.UUID] = set()  # channels whose claimed sends are under way
        self._tasks: set[asyncio.Task[None]] = set()  # the sends under way
        self._under_way = 0  # how many sends they are
        self._resend_look: datetime | None = None  # when to look for re-sends due next (None: now)
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
            await self._finish()  # the sends under way (each bounded by `timeout`) and their results
            self._pool.shutdown(wait=False)

    async def _post(self, request: Request, seconds: float) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, post, request, seconds)

    async def deliver_once(self) -> bool:
        """One round: fan out, claim, send, record; returns whether the round was full (more may wait).
        It returns once its sends are answered and recorded."""
        found = await self._round()
        await self._finish()
        return found.busy

    async def _finish(self) -> None:
        """Wait for the sends under way (their tasks log and record their own failures)."""
        while self._tasks:
            await asyncio.gather(*self._tasks)

    def _start(self, sending: Awaitable[None], sends: int) -> None:
        """Run `sends` sends in a task of their own, counted against `sends` until done; done, it wakes the
        loop (a channel may be claimed again, room was made)."""
        self._under_way += sends

        async def run() -> None:
            try:
                await sending
            finally:
                self._under_way -= sends
                self.wake()

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _room(self) -> int:
        """How many more sends this instance may start now."""
        return self.sends - self._under_way

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
        # A channel whose bucket holds no whole token has none to take now (the claim reads it again, locked);
        # one whose sends are under way is claimed again once they are recorded.
        due = [
            c
            for c in work.channels
            if c.enabled
            and (c.id in due_now or fanned)
            and work.tokens.get(c.id, 0.0) >= 1.0
            and c.id not in self._sending
        ]
        room = self._room()
        if due and room > 0:
            claims = await self._claim(due, room)
        for channel_id, sends in itertools.groupby(claims, key=lambda c: c.channel.id):
            self._sending.add(channel_id)
            sent = list(sends)
            self._start(self._deliver(sent), len(sent))
        resent = await self._resends(work)
        busy = fanned >= self.batch or (bool(claims) and len(claims) >= room) or resent >= self.batch
        if work.new_events or claims or any(c.enabled and c.id in due_now for c in work.channels):
            return _Round(busy, self.interval.total_seconds())
        pause = self.idle_interval.total_seconds()
        if (next_due := work.next_due()) is not None:
            pause = min(pause, (next_due - work.now).total_seconds())
        if self._resend_look is not None:
            pause = min(pause, (self._resend_look - work.now).total_seconds())
        return _Round(busy, max(0.0, pause))

    async def _claim(self, channels: list[Channel], room: int) -> list[_Claim]:
        """Claim what each channel's bucket allows, up to `room` in all, in one transaction. Each round
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
                if len(claims) >= room:
                    break
                tokens = buckets[channel.id]
                limit = min(int(tokens), room - len(claims))
                if limit <= 0:
                    continue
                claimed = await outbox.claim_deliveries(self.db, conn, channel.id, now, limit, self.lease)
                await outbox.spend_tokens(conn, channel.id, tokens - len(claimed), now)
                claims += [(channel, c) for c in claimed]
            alerts = [c.event for channel, c in claims if channel.kind is ChannelKind.ALERTMANAGER]
            current = await outbox.conditions_now(conn, alerts) if alerts else {}
        return [_Claim(channel, c, current.get(c.event.id)) for channel, c in claims]

    async def _deliver(self, claims: list[_Claim]) -> None:
        """Send one channel's claimed deliveries and record the results. A failure to record them (the
        database is down) is logged: their claims' lease passes and they are sent again (at least once)."""
        channel = claims[0].channel
        try:
            results = await asyncio.gather(*(self._send(c.channel, c.claimed, c.current) for c in claims))
            async with self.db.transaction() as conn:
                await outbox.record_results(conn, results, await self.db.now(conn))
        except Exception as exc:
            log.warning(
                "recording the sends to channel %r failed (%s); they are sent again after their lease",
                channel.name,
                exc,
                extra={"channel": channel.name},
            )
        finally:
            self._sending.discard(channel.id)

    async def _resends(self, work: outbox.Work) -> int:
        """With an enabled Alertmanager channel, look for open alerts due to be sent again, every
        `resend / ALERT_RESEND_LOOKS` (or when the first is due, if sooner), and send them. The look reads
        (`outbox.next_resend`); only when one is due does it claim, in a transaction. Returns how many
        alerts were claimed (`batch`: there may be more, look again at once)."""
        channels = [c for c in work.channels if c.enabled and c.kind is ChannelKind.ALERTMANAGER]
        if not channels:
            self._resend_look = None
            return 0
        if self._resend_look is not None and work.now < self._resend_look:
            return 0
        if self._room() < len(channels):  # one send each: look again in `interval`, or when one is done
            self._resend_look = work.now + self.interval
            return 0
        async with self.db.read() as conn:
            due_at = await outbox.next_resend(conn, [c.id for c in channels], work.now, self.resend)
        claimed = 0
        if due_at is not None and due_at <= work.now:
            claimed = await self._resend(channels)
            due_at = work.now if claimed >= self.batch else None
        look = work.now + self.resend / ALERT_RESEND_LOOKS
        self._resend_look = min(look, due_at) if due_at is not None else look
        return claimed

    async def _resend(self, channels: list[Channel]) -> int:
        """Send the open conditions' alerts that are due again to these Alertmanagers (up to `batch` a
        round), one POST per channel, each in a task of its own (`_start`): claimed in the database
        (`outbox.claim_resends`), so one instance sends each an interval. A failed re-send is logged and
        counted, and goes at the next interval. Returns how many alerts were claimed."""
        by_id = {c.id: c for c in channels}
        async with self.db.transaction() as conn:
            now = await self.db.now(conn)
            claimed = await outbox.claim_resends(self.db, conn, list(by_id), now, self.batch, self.resend)
        alerts: dict[uuid.UUID, list[Event]] = {}
        for channel_id, event in claimed:
            alerts.setdefault(channel_id, []).append(event)
        sent = self.db.clock.now()
        requests = [
            (
                by_id[channel_id],
                resend_request(
                    by_id[channel_id], events, now=sent, external_url=self.external_url, resend=self.resend
                ),
            )
            for channel_id, events in alerts.items()
        ]
        for channel, request in requests:
            self._start(self._resend_one(channel, request), 1)
        return len(claimed)

    async def _resend_one(self, channel: Channel, request: Request) -> None:
        try:
            async with asyncio.timeout(self.timeout.total_seconds()):
                await self.sender(request, self.timeout.total_seconds())
        except Exception as exc:  # the next interval sends it again; a sender's own bug is logged alike
            metrics.NOTIFICATIONS_FAILED.labels(channel.name).inc()
            log.warning(
                "sending open alerts again to channel %r failed: %s; again in %s",
                channel.name,
                str(exc) or type(exc).__name__,
                self.resend,
                extra={"channel": channel.name},
            )

    async def _send(self, channel: Channel, claimed: outbox.Claimed, current: Event | None) -> outbox.Result:
        request = request_for(
            channel,
            claimed.event,
            now=self.db.clock.now(),
            external_url=self.external_url,
            current=current,
            resend=self.resend,
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
        return outbox.Result(claimed, delivered=True, resend_after=self._resend_after(channel, claimed.event))

    def _resend_after(self, channel: Channel, event: Event) -> timedelta | None:
        """When a delivered alert to an Alertmanager is sent again: a raised condition's every `resend`
        while open; a clearing's resolved alert once, two send timeouts on, when a re-send claimed before it
        (by any instance) has been answered or timed out (`outbox.claim_resends`), so the resolved alert is
        the last Alertmanager got. None: not again."""
        if channel.kind is not ChannelKind.ALERTMANAGER:
            return None
        if event.type in CONDITION_SUBJECT:
            return self.resend
        return 2 * self.timeout if event.type in CLEARS else None

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
