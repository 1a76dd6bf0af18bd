"""A real HTTP receiver on 127.0.0.1 for the notification tests: it records every POST (path, headers,
body) and answers 200 (after `delay` seconds, to let concurrent senders overlap), or the statuses it is
told to fail with first. `in_flight` are the event ids of the POSTs it is still answering (during the
delay): a sender killed meanwhile never learns the answer, yet its POST is recorded, as a real receiver
would have taken it."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(self) -> None:
        self.received: list[Received] = []
        self.failures: list[int] = []  # statuses to answer, in order, before 200s
        self.delay = 0.0
        self.in_flight: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def sending(self) -> set[str]:
        """The event ids of the POSTs being answered now."""
        with self.lock:
            return {event_id for event_id, count in self.in_flight.items() if count > 0}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                event_id = self.headers.get("X-Rackflow-Event-Id", "")
                with receiver.lock:
                    receiver.in_flight[event_id] += 1
                time.sleep(receiver.delay)
                with receiver.lock:
                    receiver.in_flight[event_id] -= 1
                    receiver.received.append(Received(self.path, dict(self.headers.items()), body))
                    status = receiver.failures.pop(0) if receiver.failures else 200
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the sender is gone (killed): what it sent is recorded all the same

            def log_message(self, *_args: Any) -> None:
                pass

        return Handler


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
