"""What the pre-flight check tests share: a real HTTP receiver for webhooks (the standard library's server
in a thread, on loopback) that answers from a script and records what it was sent, and an executor with
the checker beside it, wired as `rackflow serve` wires them."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from rackflow.checks.checker import PreflightChecker
from rackflow.config import PREFLIGHT_LOOK_AHEAD
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.tasks.executor import Executor
from tests.store.test_executor import CLOCK, executing


@dataclass(frozen=True)
class Answer:
    """One scripted answer: HTTP status, a JSON body, after `delay` seconds, and once `after` is set (if
    given: a test that looks at what happens while an answer is awaited, however long that takes it)."""

    body: Any = field(default_factory=lambda: {"ok": True})
    status: int = 200
    delay: float = 0.0
    after: threading.Event | None = None


@dataclass
class Receiver:
    """Answers each POST with the next scripted answer (the last one repeats), and records the posts."""

    script: list[Answer]
    url: str = ""
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)  # each post's path and query, as asked
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_answer(self, headers: dict[str, str], body: bytes) -> Answer:
        with self.lock:
            self.posts.append((headers, body))
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def payloads(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(body) for _, body in self.posts]


class _Server(ThreadingHTTPServer):
    """A receiver that keeps up with a checker's PREFLIGHT_CONCURRENCY connections at once: socketserver's
    listen backlog of 5 drops the rest of a burst's connects, which the client's TCP then retries after a
    second, so a bench (`_common.passing_checks`) would measure the receiver rather than rackflow."""

    daemon_threads = True
    request_queue_size = 128


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A server of `handler` in a thread on a loopback port (its base URL), stopped afterwards."""
    server = _Server(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def receiving(*script: Answer) -> Iterator[Receiver]:
    receiver = Receiver(list(script) or [Answer()])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.paths.append(self.path)
            answer = receiver.next_answer(dict(self.headers.items()), body)
            if answer.after is not None:
                answer.after.wait(60)
            time.sleep(answer.delay)
            raw = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body).encode()
            try:
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            except OSError:  # the client gave up (a timeout test)
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        receiver.url = f"{url}/drain"
        yield receiver


@contextmanager
def busy_alertmanager(refusals: int, always_refused: str) -> Iterator[str]:
    """An Alertmanager (its base URL) that refuses the first `refusals` GETs of each query with 503, and
    every GET of a query naming `always_refused` (a rack's name), answering the rest with no alert."""
    seen: dict[str, int] = {}
    lock = threading.Lock()

    class Busy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with lock:
                seen[self.path] = seen.get(self.path, 0) + 1
                busy = seen[self.path] <= refusals or always_refused in urllib.parse.unquote(self.path)
            body = b"busy\n" if busy else b"[]"
            self.send_response(503 if busy else 200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Busy) as url:
        yield url


@asynccontextmanager
async def checking(
    db: Database, *, told: bool = True, executors: list[Executor] | None = None, **options: Any
) -> AsyncIterator[Services]:
    """An executor and a pre-flight checker over `db`, wired as `rackflow serve` wires them (`told`
    False: the checker does not tell the executor which rounds it answered, as another instance's would
    not). The executor is appended to `executors`, if given, for a test that counts its polls."""
    services = Services.build(db, CLOCK)
    executors = [] if executors is None else executors
    checker = PreflightChecker(
        db,
        CLOCK,
        services.tasks,
        poll_interval=timedelta(milliseconds=50),
        ahead=lambda: executors[0].ended_within(PREFLIGHT_LOOK_AHEAD.total_seconds()) if executors else 0,
        gates=services.gates_before_checks,
    )
    services.checks.gate.on_hold.append(checker.wake)
    stop = asyncio.Event()
    runner = asyncio.create_task(checker.run(stop))
    try:
        async with executing(db, gates=services.gates, manager=services.tasks, **options) as executor:
            executors.append(executor)
            executor.on_ended.append(checker.tasks_ended)
            if told:
                checker.on_answered.append(executor.answered)
            yield services
    finally:
        stop.set()
        await asyncio.wait_for(runner, 10)
