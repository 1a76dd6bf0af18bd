"""The chaos soak's notification part (bench/soak.py; docs/RELIABILITY.md, "The chaos soak"): a webhook
receiver that fails and delays, a channel subscribed to everything, and the checker of what it got.

The receiver answers 500 to a fifth of the POSTs, holds a tenth for longer than a send's timeout (the sender
gives up: a failure, though the POST is recorded, as a real receiver that was slow would have it), and
every POST a random 0–1 s, so sends are in flight when the soak SIGKILLs an instance or restarts
PostgreSQL. It records every POST by event id, whatever it answered.

The checker, once the tasks have drained and the outbox with them: every event in the outbox was fanned
out to the channel and delivered (none left pending or dead), reached the receiver at least once (none
lost across the kills and restarts), and nothing else did (none invented); de-duplicating by event id gives
exactly one of each; and no event was received more often than it was attempted (a second send always
followed a failure: a 500, a timeout, a kill, the database gone before the result was written); and every
long hold reported (`task.held_too_long`) was cleared exactly once, the tasks having all ended.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import psycopg

from rackflow.config import NOTIFY_SEND_TIMEOUT
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:  # soak.py puts the repository on the path only after importing this
    from tests.e2e.cluster import ServerProcess

# The instances' settings for the soak: a killed instance's sends are made again 15 s on (not 60), and a
# task held for half a minute (by the pre-flight check's flapping hook) is reported, and its end.
SERVE_ARGS = ("--notification-send-lease", "15s", "--notification-hold-threshold", "30s")
FAIL_SHARE = 0.2
SLOW_SHARE = 0.1
DRAIN_TIMEOUT_S = 180.0

Add = Callable[..., None]  # the soak's Verdict.add(check, value, ok=True, note="")


@dataclass
class FailingReceiver:
    rng: random.Random
    received: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""
    _server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    receiver.received[self.headers.get("X-Rackflow-Event-Id", "")] += 1
                    draw = receiver.rng.random()
                    pause = receiver.rng.uniform(0, 1)
                if draw < SLOW_SHARE:
                    pause = NOTIFY_SEND_TIMEOUT.total_seconds() + 2
                time.sleep(pause)
                status = 500 if SLOW_SHARE <= draw < SLOW_SHARE + FAIL_SHARE else 200
                with receiver.lock:
                    receiver.answers["too slow" if draw < SLOW_SHARE else str(status)] += 1
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender gave up or was killed

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hook"
        threading.Thread(target=self._server.serve_forever, name="notification receiver", daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def subscribe(
    server: ServerProcess, receiver: FailingReceiver, metadata: tuple[tuple[str, str], ...]
) -> None:
    """A webhook channel for every event, before the load starts (so every event is fanned out to it),
    with room for the soak's bursts and attempts enough that none dies of the receiver's failures."""
    channel = pb.NotificationChannel(
        name="soak-receiver", kind="webhook", url=receiver.url, rate_per_minute=6000, max_attempts=100
    )
    request = pb.CreateNotificationChannelRequest(channel=channel)
    server.stub().CreateNotificationChannel(request, timeout=30, metadata=metadata)


def _rows(conn: psycopg.Connection[Any], statement: str) -> list[tuple[Any, ...]]:
    return conn.execute(statement).fetchall()  # type: ignore[arg-type]


# What the drain waits for: events to fan out, deliveries to make, and long holds to clear (every task has
# ended by then, so every hold reported has ended too).
UNFINISHED = (
    "SELECT (SELECT count(*) FROM notification_event WHERE NOT fanned_out)"
    " + (SELECT count(*) FROM notification_delivery WHERE state = 'pending')"
    " + (SELECT count(*) FROM notification_event WHERE dedupe_key IS NOT NULL AND cleared_at IS NULL)"
)


# A delivery's back-off doubles from 2 s, so one the receiver failed many times in a row is next tried
# minutes on: the drain waits for the latest pending retry (plus a send's time), up to this bound.
LATEST_RETRY = "SELECT max(next_attempt_at) - now() FROM notification_delivery WHERE state = 'pending'"
DRAIN_BOUND_S = 900.0


def drain(conn: psycopg.Connection[Any]) -> float:
    """Wait until nothing is UNFINISHED, for DRAIN_TIMEOUT_S or until just after the latest pending
    delivery's next try (never past DRAIN_BOUND_S); the seconds it took. So a delivery that is still
    being retried as the soak ends is given its retry, and only one that is stuck counts as pending."""
    started = time.time()
    while _rows(conn, UNFINISHED)[0][0]:
        waited = time.time() - started
        retry_in = _rows(conn, LATEST_RETRY)[0][0]
        latest = waited + retry_in.total_seconds() + NOTIFY_SEND_TIMEOUT.total_seconds() if retry_in else 0.0
        if waited >= min(DRAIN_BOUND_S, max(DRAIN_TIMEOUT_S, latest)):
            break
        time.sleep(1)
    return time.time() - started


def check(conn: psycopg.Connection[Any], receiver: FailingReceiver, add: Add) -> None:
    waited = drain(conn)
    events = {str(row[0]) for row in _rows(conn, "SELECT id FROM notification_event")}
    deliveries = {
        str(event): (state, attempts)
        for event, state, attempts in _rows(
            conn,
            "SELECT d.event_id, d.state, d.attempts FROM notification_delivery d"
            " JOIN notification_channel c ON c.id = d.channel_id WHERE c.name = 'soak-receiver'",
        )
    }
    by_state = Counter(state for state, _ in deliveries.values())
    unfanned = events - set(deliveries)
    add(
        "notification events / fanned out to the receiver's channel",
        f"{len(events)} / {len(deliveries)}",
        not unfanned,
        f"(not fanned out: {len(unfanned)})" if unfanned else "",
    )
    add(
        "notification deliveries by state at the end",
        dict(sorted(by_state.items())),
        set(by_state) <= {"delivered"},
        f"(drained {waited:.0f} s after the tasks)",
    )
    with receiver.lock:
        received = Counter(receiver.received)
        answers = dict(sorted(receiver.answers.items()))
    lost, invented = events - set(received), set(received) - events
    add(
        "notification events that never reached the receiver (lost)",
        len(lost),
        not lost,
        ", ".join(sorted(lost)[:3]),
    )
    add("notification ids received that are in no event (invented)", len(invented), not invented)
    add(
        "notification POSTs received / distinct ids (exactly once after de-dup)",
        f"{sum(received.values())} / {len(received)}",
        len(received) == len(events),
    )
    extra = {e: n for e, n in received.items() if e in deliveries and n > deliveries[e][1]}
    add(
        "notification events received more often than attempted",
        len(extra),
        not extra,
        ", ".join(f"{e}: {n}" for e, n in list(extra.items())[:3]),
    )
    add("notification receiver answers (too slow: after the sender gave up)", answers)
    holds = dict(
        _rows(
            conn,
            "SELECT type, count(*) FROM notification_event"
            " WHERE type IN ('task.held_too_long', 'task.hold_cleared') GROUP BY type",
        )
    )
    add(
        "long holds reported / cleared (every task ended: each once)",
        f"{holds.get('task.held_too_long', 0)} / {holds.get('task.hold_cleared', 0)}",
        holds.get("task.hold_cleared", 0) == holds.get("task.held_too_long", 0),
    )
