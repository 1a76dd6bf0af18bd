"""The checker's HTTP client keeps its connections (issue 26): a hook asked again and again is asked over
one connection, a kept connection the server closed meanwhile is replaced without the look failing, and an
answer that is not 2xx, or none at all, is an error as with `urllib`."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rackflow.checks.http import Connections, HTTPStatusError


@contextmanager
def hook(version: str, status: int = 200, delay: float = 0.0) -> Iterator[tuple[str, list[int]]]:
    """A hook on loopback speaking `version`; yields its URL and the client port of every request."""
    ports: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = version

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            ports.append(self.client_address[1])
            if delay:
                threading.Event().wait(delay)
            raw = b'{"ok": true}'
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            except OSError:
                pass

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/drain", ports
    finally:
        server.shutdown()
        server.server_close()


def _post(connections: Connections, url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    return connections.request(
        "POST", url, body=b"{}", headers={"Content-Type": "application/json"}, timeout=timeout
    )


def test_a_hook_asked_again_is_asked_over_the_same_connection() -> None:
    connections = Connections(4)
    with hook("HTTP/1.1") as (url, ports):
        answers = [_post(connections, url) for _ in range(5)]
    connections.close()
    assert answers == [(200, b'{"ok": true}')] * 5
    assert len(ports) == 5 and len(set(ports)) == 1
    assert connections.opened == 1


def test_a_hook_that_closes_each_connection_is_asked_on_a_new_one_each_time() -> None:
    connections = Connections(4)
    with hook("HTTP/1.0") as (url, ports):
        answers = [_post(connections, url) for _ in range(3)]
    assert answers == [(200, b'{"ok": true}')] * 3
    assert len(set(ports)) == 3 and connections.opened == 3


def test_a_kept_connection_the_server_closed_is_replaced_and_the_request_sent_once_more() -> None:
    """A server that keeps nothing but says nothing (HTTP/1.1, then closes the socket after one answer):
    the next request finds the kept connection closed and goes out on a new one, and succeeds."""
    listener = socket.create_server(("127.0.0.1", 0))
    served: list[int] = []

    def serve() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                served.append(1)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n" + b'{"ok": true}')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/drain"
    connections = Connections(4)
    assert _post(connections, url) == (200, b'{"ok": true}')
    assert _post(connections, url) == (200, b'{"ok": true}')  # the first connection was closed under it
    thread.join(5)
    listener.close()
    assert len(served) == 2 and connections.opened == 2


def test_an_answer_that_is_not_2xx_is_an_error_and_the_connection_is_kept() -> None:
    connections = Connections(4)
    with hook("HTTP/1.1", status=503) as (url, ports):
        for _ in range(2):
            with pytest.raises(HTTPStatusError) as raised:
                _post(connections, url)
            assert raised.value.code == 503
    assert len(set(ports)) == 1


def test_a_hook_slower_than_the_timeout_times_out_and_is_not_asked_again() -> None:
    connections = Connections(4)
    with hook("HTTP/1.1", delay=1.0) as (url, ports), pytest.raises(TimeoutError):
        _post(connections, url, timeout=0.2)
    assert len(ports) == 1  # a new connection's failure is the answer: no second request
