"""Notification delivery on both databases, to a real HTTP receiver on loopback (tests/receiver.py): a
signed webhook gets each event once with its id as idempotency key; Slack's message says what, where and
why with the run's link; a failing receiver is retried with back-off, then the delivery is dead until
redelivered; a channel's rate holds across instances; two instances on one database never send a delivery
twice; a send that outlived its claim cannot overwrite the newer attempt; retention keeps what is not
delivered; the loop, idle, reads nothing until a write wakes it or a retry comes due; the outbox gauges are
read when scraped."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import http.server
import re
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select, update

from rackflow import metrics
from rackflow.clock import FakeClock
from rackflow.domain.notifications import DeliveryState, Event, EventType, Severity
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import TaskStatus
from rackflow.notify.delivery import Deliverer
from rackflow.notify.service import ChannelInput, ChannelView
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.tables import notification_channel, notification_delivery, notification_event
from rackflow.timespec import format_rfc3339
from tests.receiver import Receiver, receiving
from tests.store.query_plans import explain_without_scans, statement_sent, statements_sent
from tests.store.schedules_support import Env, MovingClock
from tests.store.schedules_support import make_env as make_env_at
from tests.store.test_executor import eventually
from tests.store.test_rollouts import _active, _end, _racks, _run, _schedule

pytestmark = pytest.mark.asyncio

SECRET = "s3cret-key"


async def _channel(env: Env, receiver: Receiver, kind: str = "webhook", **fields: object) -> ChannelView:
    secret = SECRET if kind == "webhook" else ""  # only a webhook takes one
    given = ChannelInput(name=f"{kind}-1", kind=kind, url=receiver.url, secret=secret, **fields)  # type: ignore[arg-type]
    return await env.services.notifications.create(given)


async def _record(env: Env, count: int = 1, **fields: object) -> list[Event]:
    made = [
        Event(EventType.TASK_FAILED, Severity.WARNING, env.clock.now(), f"task {i} failed", **fields)  # type: ignore[arg-type]
        for i in range(count)
    ]
    async with env.db.transaction() as conn:
        await outbox.record_events(conn, made)
    return made


def make_env(db: Database) -> Env:
    """Services on a clock that moves with real time: the deliverer's retries and its channels' rates fall
    due as the loops wait."""
    return make_env_at(db, MovingClock())


def _deliverer(db: Database, **options: object) -> Deliverer:
    return Deliverer(db, jitter=lambda: 0.0, timeout=timedelta(seconds=5), **options)  # type: ignore[arg-type]


async def _states(env: Env) -> list[DeliveryState]:
    return [d.state for d in await env.services.notifications.deliveries()]


async def _scraped(deliverer: Deliverer, name: str) -> float | None:
    """A gauge as a scrape of /metrics reads it: from another thread, with the deliverer as the reader."""
    metrics.NOTIFICATION_OUTBOX.read_with(asyncio.get_running_loop(), deliverer.observe)
    try:
        return await asyncio.to_thread(REGISTRY.get_sample_value, name)
    finally:
        metrics.NOTIFICATION_OUTBOX.read_with(None, None)


@contextlib.asynccontextmanager
async def _running(deliverer: Deliverer) -> AsyncIterator[None]:
    stop = asyncio.Event()
    loop = asyncio.create_task(deliverer.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)


async def _until(condition: Callable[[], bool], seconds: float = 15.0) -> float:
    """Wait until `condition` holds (at most `seconds`); how long that took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < seconds, "timed out"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_a_webhook_gets_each_event_once_signed_with_its_id_as_key(db: Database) -> None:
    env = make_env(db)
    with receiving() as receiver:
        await _channel(env, receiver)
        (event,) = await _record(env, reason="power_on failed on compute-1")
        deliverer = _deliverer(db)
        await deliverer.deliver_once()
        await deliverer.deliver_once()
    (got,) = receiver.received
    assert got.headers["Idempotency-Key"] == got.headers["X-Rackflow-Event-Id"] == str(event.id)
    timestamp = got.headers["X-Rackflow-Timestamp"]
    expected = hmac.new(SECRET.encode(), f"{timestamp}.".encode() + got.body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(got.headers["X-Rackflow-Signature"], f"sha256={expected}")
    body = got.json()
    assert (body["id"], body["type"], body["reason"]) == (str(event.id), "task.failed", event.reason)
    assert await _states(env) == [DeliveryState.DELIVERED]


async def test_slack_says_what_where_and_why_with_the_runs_link(db: Database) -> None:
    env = make_env(db)
    rack = await env.rack("r7")
    schedule = await env.schedule("fw-nightly", racks=[rack])
    run_id = uuid.uuid4()
    with receiving() as receiver:
        await _channel(env, receiver, kind="slack")
        (event,) = await _record(
            env, schedule_id=schedule.id, rack_id=rack.id, run_id=run_id, reason="BMC timed out"
        )
        await _deliverer(db, external_url="https://rackflow.example.com/").deliver_once()
    (got,) = receiver.received
    assert set(got.json()) == {"text"}
    assert got.json()["text"].splitlines() == [
        ":warning: *task 0 failed*",
        "where: schedule `fw-nightly`, rack `r7`, operation `power_off`",
        "why: BMC timed out",
        f"when: {format_rfc3339(event.at.replace(microsecond=0))}",  # sent at once: not said late
        f"<https://rackflow.example.com/runs/{run_id}|open the run>",
    ]


async def test_slack_says_when_an_event_that_is_sent_late_happened(db: Database) -> None:
    """An event sent long after it happened (a retry after its back-off, a receiver down for a while) says
    when it happened and how late it is, so it does not read as new."""
    env = make_env(db)
    happened = env.clock.now().replace(microsecond=0) - timedelta(minutes=12, seconds=30)
    late = Event(EventType.RUN_HALTED, Severity.CRITICAL, happened, "rollout halted", reason="2 of 10 failed")
    with receiving() as receiver:
        await _channel(env, receiver, kind="slack")
        async with env.db.transaction() as conn:
            await outbox.record_events(conn, [late])
        await _deliverer(db).deliver_once()
    (got,) = receiver.received
    *_, when = got.json()["text"].splitlines()
    # 12m30s late, and as long as the test took to send it: whole seconds
    assert re.fullmatch(rf"when: {re.escape(format_rfc3339(happened))}, sent 12m3[0-9]s late", when), when


async def test_a_failing_receiver_is_retried_then_dead_then_redelivered(db: Database) -> None:
    env = make_env(db)
    dead_total = ("rackflow_notifications_dead_total", {"channel": "webhook-1"})
    before = REGISTRY.get_sample_value(*dead_total) or 0.0
    with receiving() as receiver:
        channel = await _channel(env, receiver, max_attempts=2)
        receiver.failures = [500, 503, 500]
        await _record(env)
        deliverer = _deliverer(db)
        await deliverer.deliver_once()
        (pending,) = await env.services.notifications.deliveries()
        assert (pending.state, pending.attempts, pending.last_error) == (
            DeliveryState.PENDING,
            1,
            "HTTP 500: ok",
        )
        await deliverer.deliver_once()  # jitter 0: due again at once
        (dead,) = await env.services.notifications.deliveries([DeliveryState.DEAD])
        assert (dead.attempts, dead.last_error) == (2, "HTTP 503: ok")
        await deliverer.deliver_once()
        assert len(receiver.received) == 2  # dead: not tried again
        assert (
            REGISTRY.get_sample_value("rackflow_notifications_dead_total", {"channel": "webhook-1"})
            == before + 1
        )
        assert await _scraped(deliverer, "rackflow_notification_dead_deliveries") == 1
        assert await env.services.notifications.redeliver(channel_id=channel.channel.id) == 1
        await deliverer.deliver_once()  # one more failure (the third status), then a success
        await deliverer.deliver_once()
    assert len(receiver.received) == 4
    assert len({r.headers["X-Rackflow-Event-Id"] for r in receiver.received}) == 1
    assert await _states(env) == [DeliveryState.DELIVERED]


async def _refill(db: Database, seconds: float) -> None:
    """Move the channel's bucket back `seconds`, as time passing would refill it."""
    async with db.transaction() as conn:
        at = (await conn.execute(select(notification_channel.c.rate_at))).scalar_one()
        await conn.execute(update(notification_channel).values(rate_at=at - timedelta(seconds=seconds)))


async def test_a_channels_rate_holds_across_instances_and_refills(db_url: str) -> None:
    clock = MovingClock()  # one clock for both instances, as the database's is on PostgreSQL
    first, second = Database(db_url, clock=clock), Database(db_url, clock=clock)
    try:
        env = make_env_at(first, clock)
        with receiving() as receiver:
            await _channel(env, receiver, rate_per_minute=6)  # a burst of one, then one every 10 s
            await _record(env, 4)
            a, b = _deliverer(first), _deliverer(second)
            for _ in range(2):
                await asyncio.gather(a.deliver_once(), b.deliver_once())
            assert len(receiver.received) == 1  # one bucket for both instances, not one each
            await _refill(first, 10)
            await asyncio.gather(a.deliver_once(), b.deliver_once())
            assert len(receiver.received) == 2
            await _refill(first, 3600)  # a long quiet spell refills no more than the burst
            for _ in range(2):
                await asyncio.gather(a.deliver_once(), b.deliver_once())
            assert len(receiver.received) == 3
    finally:
        await first.dispose()
        await second.dispose()


async def test_a_round_claims_at_most_its_sends_and_says_it_was_full(db: Database) -> None:
    env = make_env(db)
    with receiving() as receiver:
        await _channel(env, receiver, rate_per_minute=6000)
        await _record(env, 5)
        deliverer = _deliverer(db, sends=2)
        assert await deliverer.deliver_once() is True
        assert len(receiver.received) == 2
        assert await deliverer.deliver_once() is True
        assert await deliverer.deliver_once() is False  # the last one: room was left
        assert len(receiver.received) == 5


async def test_a_busy_channel_does_not_starve_the_others(db: Database) -> None:
    env = make_env(db)
    with receiving() as busy, receiving() as quiet:
        await env.services.notifications.create(ChannelInput(name="a-busy", kind="webhook", url=busy.url))
        await env.services.notifications.create(ChannelInput(name="b-quiet", kind="webhook", url=quiet.url))
        await _record(env, 6)  # both channels get all six
        deliverer = _deliverer(db, sends=3)
        for _ in range(2):
            await deliverer.deliver_once()
        assert quiet.received and busy.received


async def test_subscriptions_choose_the_events_a_channel_gets(db: Database) -> None:
    env = make_env(db)
    with receiving() as receiver:
        await _channel(env, receiver, event_types=("run.halted",), min_severity="critical")
        await _record(env)  # a failed task: not subscribed
        halted = Event(EventType.RUN_HALTED, Severity.CRITICAL, env.clock.now(), "rollout halted")
        cleared = Event(EventType.RUN_HALT_CLEARED, Severity.CRITICAL, env.clock.now(), "resumed")
        async with db.transaction() as conn:
            await outbox.record_events(conn, [halted, cleared])
        await _deliverer(db).deliver_once()
    assert sorted(r.json()["type"] for r in receiver.received) == ["run.halt_cleared", "run.halted"]


async def test_two_instances_never_send_one_delivery_twice(db_url: str) -> None:
    clock = MovingClock()  # one clock for both instances, as the database's is on PostgreSQL
    first, second = Database(db_url, clock=clock), Database(db_url, clock=clock)
    try:
        env = make_env_at(first, clock)
        with receiving() as receiver:
            await _channel(env, receiver, rate_per_minute=6000)
            await _record(env, 60)
            a, b = _deliverer(first, sends=7), _deliverer(second, sends=7)
            for _ in range(30):
                await asyncio.gather(a.deliver_once(), b.deliver_once())
                if len(receiver.received) >= 60:
                    break
        ids = [r.headers["X-Rackflow-Event-Id"] for r in receiver.received]
        assert len(ids) == 60 and len(set(ids)) == 60
    finally:
        await first.dispose()
        await second.dispose()


async def test_a_send_that_outlived_its_claim_does_not_overwrite_the_next(db: Database) -> None:
    env = make_env(db)
    with receiving() as receiver:
        channel = (await _channel(env, receiver)).channel
    await _record(env)
    async with db.transaction() as conn:
        await outbox.fan_out(db, conn, env.clock.now(), 10)
    claims = []
    for _ in range(2):  # a lease of zero: the second claim takes it over at once
        async with db.transaction() as conn:
            now = await db.now(conn)
            claims += await outbox.claim_deliveries(db, conn, channel.id, now, 10, timedelta(0))
    old, new = claims
    async with db.transaction() as conn:
        assert await outbox.record_results(conn, [outbox.Result(old, delivered=True)], env.clock.now()) == 0
        assert await outbox.record_results(conn, [outbox.Result(new, delivered=True)], env.clock.now()) == 1


async def test_a_send_from_before_a_redelivery_does_not_overwrite_the_attempt_of_the_same_number_after_it(
    db: Database,
) -> None:
    """Redelivery counts attempts from zero again, so the claim after it has the attempt number of a claim
    before it, whose sender may still be at work (it outlived its lease): that sender's result must not be
    written over the new claim's, nor make the delivery due again while the new claim sends it."""
    env = make_env(db)
    with receiving() as receiver:
        channel = (await _channel(env, receiver, max_attempts=1)).channel
    await _record(env)
    async with db.transaction() as conn:
        await outbox.fan_out(db, conn, env.clock.now(), 10)

    async def claim() -> outbox.Claimed:
        async with db.transaction() as conn:  # a lease of zero: the next claim takes it over at once
            (claimed,) = await outbox.claim_deliveries(
                db, conn, channel.id, await db.now(conn), 10, timedelta(0)
            )
        return claimed

    stale = await claim()  # attempt 1; its sender stalls past its lease
    taken_over = await claim()  # attempt 2, the last: it fails and the delivery is dead
    async with db.transaction() as conn:
        dead = outbox.Result(taken_over, delivered=False, error="refused")
        assert await outbox.record_results(conn, [dead], env.clock.now()) == 1
    assert await env.services.notifications.redeliver(channel_id=channel.id) == 1
    fresh = await claim()  # attempt 1 again, after the redelivery
    assert fresh.attempt == stale.attempt

    async with db.transaction() as conn:
        late = outbox.Result(stale, delivered=False, error="late", retry_after=timedelta(0))
        assert await outbox.record_results(conn, [late], env.clock.now()) == 0
        assert await outbox.record_results(conn, [outbox.Result(fresh, delivered=True)], env.clock.now()) == 1
    assert await _states(env) == [DeliveryState.DELIVERED]


async def test_retention_deletes_only_events_delivered_everywhere(db: Database) -> None:
    env = make_env(db)
    with receiving() as receiver:
        await _channel(env, receiver, max_attempts=1)
        receiver.failures = [500]
        env.clock.advance(timedelta(days=-30))
        old = await _record(env, 2)
        env.clock.advance(timedelta(days=30))
        deliverer = _deliverer(db)
        await deliverer.deliver_once()  # one dead, one delivered
    assert await _scraped(deliverer, "rackflow_notification_outbox_age_seconds") == 0.0
    async with db.read() as conn:
        assert len(await outbox.list_events(conn, 10)) == 2
    pruned = [n async for n in outbox.prune_delivered(db, timedelta(days=7))]
    assert sum(pruned) == 1
    (kept,) = await env.services.notifications.deliveries()
    assert kept.state is DeliveryState.DEAD and kept.event.id in {e.id for e in old}


async def test_the_outbox_gauges_are_read_when_scraped_not_by_the_rounds(db: Database) -> None:
    env = make_env(db)
    with receiving() as receiver:
        await _channel(env, receiver, max_attempts=1)
        receiver.failures = [500]
        await _record(env)
        deliverer = _deliverer(db)
        with statements_sent(db) as sent:
            await deliverer.deliver_once()
        assert not any("count(" in statement.lower() for statement, _ in sent)  # no gauge read in the round
    assert await _scraped(deliverer, "rackflow_notification_dead_deliveries") == 1
    await env.services.notifications.redeliver(delivery_ids=[(await _deliveries(env))[0]])
    assert await _scraped(deliverer, "rackflow_notification_dead_deliveries") == 0
    # On the event loop's own thread (nothing can wait for the loop there): the values last read.
    metrics.NOTIFICATION_OUTBOX.read_with(asyncio.get_running_loop(), deliverer.observe)
    try:
        assert REGISTRY.get_sample_value("rackflow_notification_dead_deliveries") == 0
    finally:
        metrics.NOTIFICATION_OUTBOX.read_with(None, None)


async def _deliveries(env: Env) -> list[uuid.UUID]:
    return [d.id for d in await env.services.notifications.deliveries()]


def _looked(sent: list[tuple[str, object]]) -> bool:
    """Whether the loop sent its look at when the pending deliveries come due (`outbox.work`), the last
    statement of an idle round before its nap."""
    return any("min(notification_delivery.next_attempt_at)" in text for text, _ in sent)


async def test_an_idle_loop_reads_nothing_until_an_event_wakes_it(db: Database) -> None:
    """Idle, the loop sleeps (here up to a minute); an event recorded in this process wakes it once its
    transaction committed, and is sent at once. The old loop read the outbox every second."""
    env = make_env(db)
    with receiving() as receiver:
        await _channel(env, receiver)
        deliverer = _deliverer(db, idle_interval=timedelta(minutes=1))
        async with _running(deliverer):
            with statements_sent(db) as first:  # its first round: nothing to do
                await _until(lambda: _looked(first))
            with statements_sent(db) as sent:
                await asyncio.sleep(2.5)
            assert sent == []
            await _record(env)
            took = await _until(lambda: len(receiver.received) == 1)
    assert took < 30  # woken: not the idle minute (no timing asserted beyond that)


async def test_an_idle_loop_wakes_for_a_redelivery_and_when_a_retry_is_due(db: Database) -> None:
    env = make_env(db)
    with receiving() as receiver:
        channel = await _channel(env, receiver, max_attempts=2)
        receiver.failures = [500, 500]
        # Retries due 1 s after each failure (the back-off's 2 s times the jitter), the idle look a minute.
        deliverer = Deliverer(db, jitter=lambda: 0.5, idle_interval=timedelta(minutes=1))
        async with _running(deliverer):
            await _record(env)
            await _until(lambda: len(receiver.received) == 2)  # the retry, at its due time
            await _until(lambda: receiver.failures == [])  # answered; its result is recorded after

            async def dead() -> bool:
                return await _states(env) == [DeliveryState.DEAD]

            await eventually(dead)
            assert await env.services.notifications.redeliver(channel_id=channel.channel.id) == 1
            await _until(lambda: len(receiver.received) == 3)
    assert await _states(env) == [DeliveryState.DELIVERED]


@contextlib.contextmanager
def _listening(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A raw TCP receiver on 127.0.0.1 that answers each connection with `answer` (in a thread of its own);
    its URL."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    finally:
        listener.close()


def not_http() -> contextlib.AbstractContextManager[str]:
    """A receiver that answers anything with an SSH banner: no HTTP status line."""

    def banner(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

    return _listening(banner)


async def test_an_answer_that_is_not_http_fails_its_delivery_and_no_other(db: Database) -> None:
    """A receiver whose answer is not HTTP raised out of the round (http.client's errors are neither OSError
    nor ValueError): no result of the round was recorded, so the good channel's delivered event was sent
    again at every round, and the bad one's attempts never ran out."""
    env = make_env(db)
    with not_http() as url, receiving() as receiver:
        await env.services.notifications.create(
            ChannelInput(name="bad", kind="webhook", url=url, max_attempts=1)
        )
        await _channel(env, receiver)
        await _record(env)
        await _deliverer(db).deliver_once()
    assert len(receiver.received) == 1
    states = {d.channel_name: (d.state, d.last_error) for d in await env.services.notifications.deliveries()}
    assert states["webhook-1"][0] is DeliveryState.DELIVERED
    assert states["bad"] == (DeliveryState.DEAD, "the answer was not HTTP (BadStatusLine)")


async def test_a_url_with_a_user_and_password_is_sent_with_basic_authorization(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """urllib reads `user:password@host` as a bad port, and said so with the password in its message; the
    credentials now go as HTTP Basic authorization, and never into a log line or an error."""
    env = make_env(db)
    with receiving() as receiver:
        url = receiver.url.replace("http://", "http://alice:s3cret%40pw@")
        await env.services.notifications.create(ChannelInput(name="basic", kind="webhook", url=url))
        await _record(env)
        await _deliverer(db).deliver_once()
    (got,) = receiver.received
    assert got.headers["Authorization"] == "Basic " + base64.b64encode(b"alice:s3cret@pw").decode()
    assert await _states(env) == [DeliveryState.DELIVERED]
    assert not [r for r in caplog.records if "s3cret" in r.getMessage()]


@contextlib.contextmanager
def _trickling() -> Iterator[str]:
    """A receiver that answers 200 and then its body a byte every 0.3 s, each within a socket timeout."""
    stopping = threading.Event()

    def trickle(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            while not stopping.wait(0.3):
                conn.sendall(b"x")

    try:
        with _listening(trickle) as url:
            yield url
    finally:
        stopping.set()


async def test_a_trickling_receiver_frees_its_sends_threads_at_the_timeout(db: Database) -> None:
    """urlopen's timeout bounds each socket operation: a body trickled a byte at a time kept the sending
    threads (as many as `sends`) long after the round gave up on them, and a healthy channel's sends,
    queued behind, timed out unsent round after round. The answer is now read within the timeout."""
    env = make_env(db)
    with _trickling() as url, receiving() as receiver:
        slow = ChannelInput(name="slow", kind="webhook", url=url, event_types=("task.failed",))
        await env.services.notifications.create(slow)
        await _channel(env, receiver, event_types=("run.halted",))
        deliverer = Deliverer(db, jitter=lambda: 1.0, timeout=timedelta(seconds=1), sends=2)
        await _record(env, count=2)  # both threads go to the slow receiver
        await deliverer.deliver_once()
        async with env.db.transaction() as conn:
            halted = Event(EventType.RUN_HALTED, Severity.CRITICAL, env.clock.now(), "halted")
            await outbox.record_events(conn, [halted])
        for _ in range(3):
            await deliverer.deliver_once()
            if receiver.received:
                break
    assert len(receiver.received) == 1


@contextlib.contextmanager
def _redirecting(location: str) -> Iterator[str]:
    """A receiver (a proxy, an http:// to https:// rule) that answers every POST `301` to `location`."""

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(301)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _answering_gets() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """Where the redirect points, on another host (127.0.0.2): it answers any GET 200, as Alertmanager's
    `GET /api/v2/alerts` does, and keeps the headers of each."""
    got: list[dict[str, str]] = []

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            got.append(dict(self.headers.items()))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}", got
    finally:
        server.shutdown()
        server.server_close()


async def test_a_redirect_fails_the_delivery_and_is_not_followed(db: Database) -> None:
    """urllib followed a 301 to a POST with a GET without the body, taking the channel's Basic credentials
    and signature along, even to another host: a 200 there (Alertmanager's list of alerts, a web page)
    recorded the event delivered though no receiver ever got it. A redirect now fails the send, saying so."""
    env = make_env(db)
    with _answering_gets() as (elsewhere, gets), _redirecting(f"{elsewhere}/api/v2/alerts") as url:
        basic = url.replace("http://", "http://alice:s3cret@")
        await env.services.notifications.create(
            ChannelInput(name="moved", kind="alertmanager", url=basic, max_attempts=1)
        )
        await _record(env)
        await _deliverer(db).deliver_once()
    assert gets == []
    ((state, error),) = [(d.state, d.last_error) for d in await env.services.notifications.deliveries()]
    assert state is DeliveryState.DEAD
    assert error.startswith("HTTP 301")


async def _rows(db: Database) -> tuple[int, int]:
    async with db.read() as conn:
        events = (await conn.execute(select(func.count()).select_from(notification_event))).scalar_one()
        deliveries = (
            await conn.execute(select(func.count()).select_from(notification_delivery))
        ).scalar_one()
    return events, deliveries


async def test_one_instance_sends_an_open_alert_again_each_interval_and_none_once_cleared(
    db_url: str,
) -> None:
    """Two instances share the re-sends of an open condition's alert as they share deliveries (a claim in
    the database): one POST an interval, not one per instance; no row is added per re-send; a disabled
    channel gets none; a cleared condition's resolved alert is sent once more, then nothing."""
    clock = FakeClock(datetime.now(UTC))  # one clock for both instances, as the database's is on PostgreSQL
    first, second = Database(db_url, clock=clock), Database(db_url, clock=clock)
    try:
        env = make_env_at(first, clock)
        with receiving() as receiver:
            channel = await env.services.notifications.create(
                ChannelInput(name="am", kind="alertmanager", url=receiver.url)
            )
            racks = await _racks(env, 3)
            policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1, pause_on_halt=False)
            schedule = await _schedule(env, racks, policy)
            await env.services.schedules.trigger(schedule.id)
            await _end(env, await _active(env, schedule), TaskStatus.FAILED)
            await env.services.rollouts.advance()
            run_id = (await _run(env, schedule)).run.id
            await _record(env)  # a failed task: a one-off, not sent again
            a, b = _deliverer(first), _deliverer(second)
            await asyncio.gather(a.deliver_once(), b.deliver_once())
            sent = sorted(r.json()[0]["labels"]["alertname"] for r in receiver.received)
            assert sent == ["RackflowRunHalted", "RackflowTaskFailed"]  # the failed task's is a one-off
            rows = await _rows(first)
            for interval in range(1, 4):
                clock.advance(timedelta(minutes=1, seconds=1))
                for _ in range(2):
                    await asyncio.gather(a.deliver_once(), b.deliver_once())
                assert len(receiver.received) == 2 + interval
                (resent,) = receiver.received[-1].json()
                assert resent["labels"]["run"] == str(run_id)
                ends = datetime.fromisoformat(resent["endsAt"]) - clock.now()
                assert timedelta(minutes=2) <= ends <= timedelta(minutes=5)
            assert await _rows(first) == rows

            await env.services.notifications.update(
                channel.channel.id, ["channel.disabled"], ChannelInput(disabled=True)
            )
            clock.advance(timedelta(minutes=1, seconds=1))
            await asyncio.gather(a.deliver_once(), b.deliver_once())
            assert len(receiver.received) == 5
            await env.services.notifications.update(
                channel.channel.id, ["channel.disabled"], ChannelInput(disabled=False)
            )
            await asyncio.gather(a.deliver_once(), b.deliver_once())
            assert len(receiver.received) == 6

            await env.services.rollouts.resume(run_id)
            await asyncio.gather(a.deliver_once(), b.deliver_once())
            assert len(receiver.received) == 7  # the clearing, resolving the alert
            for _ in range(3):
                clock.advance(timedelta(minutes=1, seconds=1))
                await asyncio.gather(a.deliver_once(), b.deliver_once())
            # The resolved alert once more (after any re-send under way at the clearing), by one instance.
            assert len(receiver.received) == 8
            (resolved,) = receiver.received[-1].json()
            assert resolved["labels"]["run"] == str(run_id)
            assert datetime.fromisoformat(resolved["endsAt"]) <= clock.now()
            async with first.transaction() as conn:  # as events recorded before clearings marked them
                await conn.execute(update(notification_event).values(cleared_at=None))
            clock.advance(timedelta(minutes=1, seconds=1))
            await asyncio.gather(a.deliver_once(), b.deliver_once())
            assert len(receiver.received) == 8
    finally:
        await first.dispose()
        await second.dispose()


async def test_a_task_held_anew_as_its_last_hold_clears_is_sent_again(db: Database) -> None:
    """A long hold is keyed, and open until `clear_condition` marks it: the hold watcher records the end
    of a task's hold and its new hold (another gate) in one transaction, at one time, so which of the two
    comes later cannot be told from their events; the new one is still sent again, the old one not."""
    clock = FakeClock(datetime.now(UTC))
    env = make_env_at(db, clock)
    task_id = uuid.uuid4()
    with receiving() as receiver:
        await env.services.notifications.create(
            ChannelInput(name="am", kind="alertmanager", url=receiver.url)
        )

        def hold(gate: str) -> Event:
            return Event(
                EventType.TASK_HELD_TOO_LONG,
                Severity.WARNING,
                clock.now(),
                f"held by {gate}",
                task_id=task_id,
                payload={"held_by": gate},
                key=f"task.held_too_long:{task_id}:{gate}",
            )

        first = hold("freeze")
        async with db.transaction() as conn:
            await outbox.record_events(conn, [first])
        deliverer = _deliverer(db)
        await deliverer.deliver_once()
        clock.advance(timedelta(minutes=5))
        second = hold("budget")
        async with db.transaction() as conn:
            assert await outbox.clear_condition(conn, first.id, clock.now())
            cleared = Event(
                EventType.TASK_HOLD_CLEARED, Severity.WARNING, clock.now(), "budget holds it", task_id=task_id
            )
            await outbox.record_events(conn, [cleared, second])
        await deliverer.deliver_once()
        assert len(receiver.received) == 3
        for sent in range(1, 3):
            clock.advance(timedelta(minutes=1, seconds=1))
            await deliverer.deliver_once()
            assert len(receiver.received) == 3 + sent
            (resent,) = receiver.received[-1].json()
            assert resent["annotations"]["event_id"] == str(second.id)


async def test_a_disabled_channels_deliveries_are_no_backlog(db: Database) -> None:
    """Disabling a noisy channel leaves its deliveries waiting, unsent: they counted in the outbox's age,
    which then grew until RackflowNotificationOutboxOld fired, and its dead ones in the dead gauge."""
    env = make_env(db)
    with receiving() as noisy, receiving() as quiet:
        channel = await env.services.notifications.create(
            ChannelInput(name="noisy", kind="webhook", url=noisy.url, max_attempts=1)
        )
        await env.services.notifications.create(ChannelInput(name="quiet", kind="webhook", url=quiet.url))
        noisy.failures = [500]
        await _record(env)  # dead at noisy, delivered at quiet
        deliverer = _deliverer(db)
        await deliverer.deliver_once()
        noisy.failures = [500]
        await _record(env)  # pending at noisy (its retry), delivered at quiet
        await env.services.notifications.update(
            channel.channel.id, ["channel.max_attempts"], ChannelInput(max_attempts=5)
        )
        await deliverer.deliver_once()
        env.clock.advance(timedelta(minutes=15))
        assert (await _scraped(deliverer, "rackflow_notification_outbox_age_seconds") or 0) > 600
        assert await _scraped(deliverer, "rackflow_notification_dead_deliveries") == 1
        await env.services.notifications.update(
            channel.channel.id, ["channel.disabled"], ChannelInput(disabled=True)
        )
        assert await _scraped(deliverer, "rackflow_notification_outbox_age_seconds") == 0
        assert await _scraped(deliverer, "rackflow_notification_dead_deliveries") == 0
        assert sorted(await _states(env)) == [
            DeliveryState.DEAD,
            *[DeliveryState.DELIVERED] * 2,
            DeliveryState.PENDING,
        ]


async def test_an_alert_is_not_sent_again_once_its_condition_ended_without_a_clearing(db: Database) -> None:
    """Some ends record no clearing: an operator resuming a schedule rackflow paused (ResumeTaskSchedule),
    a schedule deleted with its halted run. Their alerts were sent again until retention deleted the events,
    a week of a paused schedule that was not; a re-send now needs the condition to hold."""
    clock = FakeClock(datetime.now(UTC))
    env = make_env_at(db, clock)
    with receiving() as receiver:
        await env.services.notifications.create(
            ChannelInput(name="am", kind="alertmanager", url=receiver.url)
        )
        racks = await _racks(env, 3)
        schedule = await _schedule(env, racks, RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1))
        await env.services.schedules.trigger(schedule.id)
        await _end(env, await _active(env, schedule), TaskStatus.FAILED)
        await env.services.rollouts.advance()
        deliverer = _deliverer(db)
        await deliverer.deliver_once()
        sent = sorted(r.json()[0]["labels"]["alertname"] for r in receiver.received)
        assert sent[-2:] == ["RackflowRunHalted", "RackflowSchedulePaused"]

        async def again() -> list[str]:
            before = len(receiver.received)
            clock.advance(timedelta(minutes=1, seconds=1))
            await deliverer.deliver_once()
            return sorted(a["labels"]["alertname"] for r in receiver.received[before:] for a in r.json())

        assert await again() == ["RackflowRunHalted", "RackflowSchedulePaused"]
        await env.services.schedules.resume(schedule.id)  # by hand: no schedule.resumed is recorded
        assert await again() == ["RackflowRunHalted"]
        await env.services.schedules.delete(schedule.id)  # its halted run with it
        assert await again() == []


async def test_a_slow_receiver_does_not_delay_another_channels_events(db: Database) -> None:
    """One channel's receiver answers after seconds: another channel's new event still goes at once, while
    the slow send is in flight (not after it, as when a round waited for all its sends)."""
    env = make_env(db)
    with receiving() as slow, receiving() as fast:
        slow.delay = 4.0  # within the send timeout (5 s): it answers, late
        await env.services.notifications.create(ChannelInput(name="a-slow", kind="webhook", url=slow.url))
        await env.services.notifications.create(ChannelInput(name="b-fast", kind="webhook", url=fast.url))
        deliverer = _deliverer(db)
        async with _running(deliverer):
            (first,) = await _record(env)
            await _until(lambda: str(first.id) in slow.sending() and len(fast.received) == 1)
            (second,) = await _record(env)
            deliverer.wake()  # as the service that records an event does, once it committed
            await _until(lambda: len(fast.received) == 2)
            still_sending = slow.sending()
            await _until(lambda: len(slow.received) == 2, seconds=30)
    assert str(first.id) in still_sending  # the fast channel's event did not wait for the slow send
    assert fast.received[1].headers["X-Rackflow-Event-Id"] == str(second.id)
    assert await _states(env) == [DeliveryState.DELIVERED] * 4


@pytest.mark.parametrize("db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
async def test_the_look_for_resends_reads_two_ranges_of_indexes_never_the_weeks_events(
    db: Database,
) -> None:
    """The look ran every 15 s on every instance, and read every event of the retention's week to find the
    raises not marked cleared (and, for a raise never marked, every later event too: quadratic, 8.4 s a
    look at 50,000 events), and every delivery to find the clearings owing one more resolved alert
    (`bench/resend_look.py`). It reads the uncleared raises of the conditions' types and the channel's
    deliveries of the last few intervals from their indexes (migration 0054), each raise asked by key
    whether its condition still holds: five of the six halts here, their schedules deleted with their
    halted runs, record no clearing and are never marked cleared."""
    env = make_env(db)
    with receiving() as receiver:
        channel = await env.services.notifications.create(
            ChannelInput(name="am", kind="alertmanager", url=receiver.url, event_types=("run.halted",))
        )
        policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1, pause_on_halt=False)
        schedules = []
        for k in range(6):
            schedule = await _schedule(env, await _racks(env, 2, prefix=f"r{k}-"), policy, name=f"fw-{k}")
            await env.services.schedules.trigger(schedule.id)
            await _end(env, await _active(env, schedule), TaskStatus.FAILED)
            await env.services.rollouts.advance()
            schedules.append(schedule)
        await _deliverer(db).deliver_once()
        for schedule in schedules[1:]:  # deleted with its halted run: no clearing is recorded
            await env.services.schedules.delete(schedule.id)
    assert len(receiver.received) == 6  # the six halts, delivered

    statement, parameters = await statement_sent(
        db, lambda conn: outbox.next_resend(conn, [channel.channel.id], env.clock.now(), timedelta(minutes=1))
    )
    plan = await explain_without_scans(db, statement, parameters)
    assert "notification_event later" not in plan, plan  # no raise reads the events after it
    uncleared = (
        r"ix_notification_event_type_cleared_at on notification_event .*\n.*Index Cond: .*cleared_at IS NULL"
    )
    assert re.search(uncleared, plan), plan
    assert re.search(r"Index Cond: \(\(channel_id = .*\) AND \(delivered_at >= ", plan), plan
    async with db.read() as conn:
        assert await outbox.next_resend(conn, [channel.channel.id], env.clock.now(), timedelta(minutes=1))


async def test_retention_keeps_an_open_conditions_raise_and_it_is_sent_until_it_clears(db: Database) -> None:
    """A rollout halted (and its schedule paused) for longer than `--notification-retention`: the prune
    deleted the delivered halt and pause with their deliveries while both still held, so their alerts were
    sent no more and Alertmanager resolved them by their `endsAt`, nothing fixed. The prune keeps what the
    look for re-sends finds open (`outbox._open`); a one-off event, a cleared condition's raise and a
    deleted schedule's halt go as before. Once the halt clears, its resolved alert carries the raise's
    labels, and the next prune deletes the raise."""
    clock = FakeClock(datetime.now(UTC))
    env = make_env_at(db, clock)
    retention = timedelta(days=7)
    with receiving() as receiver:
        await env.services.notifications.create(
            ChannelInput(name="am", kind="alertmanager", url=receiver.url)
        )
        halted = {}
        for name in ("fw-open", "fw-resumed", "fw-deleted"):
            racks = await _racks(env, 3, prefix=f"{name}-")
            policy = RolloutPolicy(max_concurrent_racks=1, halt_after_failures=1)
            schedule = await _schedule(env, racks, policy, name=name)
            await env.services.schedules.trigger(schedule.id)
            await _end(env, await _active(env, schedule), TaskStatus.FAILED)
            await env.services.rollouts.advance()
            halted[name] = (schedule, (await _run(env, schedule)).run.id)
        await _record(env)  # a one-off
        deliverer = _deliverer(db)
        await deliverer.deliver_once()
        await env.services.rollouts.resume(halted["fw-resumed"][1])  # cleared: a halt_cleared
        await env.services.schedules.resume(halted["fw-resumed"][0].id)  # by hand: no clearing
        await env.services.schedules.delete(halted["fw-deleted"][0].id)  # with its halted run
        await deliverer.deliver_once()
        open_run = str(halted["fw-open"][1])

        clock.advance(retention + timedelta(days=1))  # the open halt's raise is now past the retention
        assert sum([n async for n in outbox.prune_delivered(db, retention)]) > 0
        before = len(receiver.received)
        await deliverer.deliver_once()
        resent = sorted(
            (a["labels"]["alertname"], a["labels"]["schedule"])
            for r in receiver.received[before:]
            for a in r.json()
        )
        assert resent == [("RackflowRunHalted", "fw-open"), ("RackflowSchedulePaused", "fw-open")]
        async with db.read() as conn:
            kept = sorted((e.type.value, e.schedule_name) for e in await outbox.list_events(conn, 100))
        assert kept == [("run.halted", "fw-open"), ("schedule.paused", "fw-open")]

        await env.services.schedules.update(halted["fw-open"][0].id, ["schedule.name"], name="fw-renamed")
        await env.services.rollouts.resume(halted["fw-open"][1])
        before = len(receiver.received)
        await deliverer.deliver_once()
        (resolved,) = [
            a for r in receiver.received[before:] for a in r.json() if a["labels"].get("run") == open_run
        ]
        assert resolved["labels"]["schedule"] == "fw-open"  # the raise's labels, which Alertmanager holds
        assert datetime.fromisoformat(resolved["endsAt"]) <= clock.now()
        clock.advance(retention + timedelta(days=1))
        assert sum([n async for n in outbox.prune_delivered(db, retention)]) > 0
        async with db.read() as conn:
            kept = sorted((e.type.value, e.schedule_name) for e in await outbox.list_events(conn, 100))
        assert kept == [("schedule.paused", "fw-open")]  # its schedule still paused, as rackflow paused it
