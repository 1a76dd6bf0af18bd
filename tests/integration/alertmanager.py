"""A real Alertmanager (Debian's `prometheus-alertmanager`) for the integration tests: started on a free
loopback port with a given config and no cluster, stopped afterwards.

Alertmanager cannot pick its own port and say which, so a port is found free here and passed in; another
test's process may take it first, and Alertmanager then exits at once ("address already in use"). The
start is tried again on another port then, a few times, rather than failing the test.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.checks_support import serving
from tests.debian_tools import ALERTMANAGER, require
from tests.e2e.cluster import free_port

# A config that routes every alert to a receiver that sends nothing: the tests read the alerts back.
# What Alertmanager answers a GET past its `--web.get-concurrency` (api/v2's limit), with 503.
BUSY = b"Limit of concurrent GET requests reached (2), try again later.\n"
QUIET_CONFIG = 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'
READY_WITHIN_S = 30
PORT_TRIES = 3


@dataclass
class Alertmanager:
    url: str
    process: subprocess.Popen[bytes]
    home: Path
    restarts: int = 0
    args: tuple[str, ...] = ()  # flags of its own (`running_alertmanager`), kept by a restart

    def post(self, labels: dict[str, str], *, resolved: bool = False) -> None:
        alert: dict[str, Any] = {"labels": labels}
        if resolved:
            alert["endsAt"] = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps([alert]).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert Alertmanager holds, active or not."""
        return self._alerts("")

    def active(self) -> list[dict[str, Any]]:
        return self._alerts("?active=true")

    def _alerts(self, query: str) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts{query}", timeout=10) as answer:
            found: list[dict[str, Any]] = json.loads(answer.read() or b"[]")
            return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def restart(self) -> None:
        """Stop this Alertmanager and start a new one on the same address with fresh storage, as a restart
        without its data (or a new HA peer) is: it holds no alert until its clients send them again."""
        self.stop()
        self.restarts += 1
        log_path = self.home / "alertmanager.log"
        with log_path.open("ab") as log:
            self.process = _start(self.home, self.url, self.home / f"data-{self.restarts}", log, self.args)
        deadline = time.monotonic() + READY_WITHIN_S
        while not _ready(self.url) and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _ready(self.url):
            pytest.fail(f"Alertmanager did not get ready again: {log_path.read_text()[-2000:]}")


def _start(home: Path, url: str, data: Path, log: Any, args: tuple[str, ...]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            str(require(ALERTMANAGER, "prometheus-alertmanager")),
            f"--config.file={home / 'alertmanager.yml'}",
            f"--storage.path={data}",
            f"--web.listen-address={url.removeprefix('http://')}",
            "--cluster.listen-address=",
            *args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@contextmanager
def running_alertmanager(home: Path, config: str, *args: str) -> Iterator[Alertmanager]:
    """Alertmanager serving `config` from `home` (its storage and log), ready; stopped on exit. `args`: its
    own flags besides (`--web.get-concurrency=2`)."""
    require(ALERTMANAGER, "prometheus-alertmanager")
    (home / "alertmanager.yml").write_text(config)
    log_path = home / "alertmanager.log"
    log_path.touch()
    for _ in range(PORT_TRIES):
        url = f"http://127.0.0.1:{free_port()}"
        tried_from = log_path.stat().st_size
        with log_path.open("ab") as log:  # every try's output kept, for a failure's message
            process = _start(home, url, home / "data", log, args)
        started = Alertmanager(url, process, home, args=args)
        deadline = time.monotonic() + READY_WITHIN_S
        while not _ready(url) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if process.poll() is None and _ready(url):
            try:
                yield started
            finally:
                started.stop()
            return
        process.kill()
        process.wait(10)
        with log_path.open("rb") as log:
            log.seek(tried_from)
            if b"address already in use" not in log.read():
                break
    pytest.fail(f"Alertmanager did not get ready: {log_path.read_text()[-2000:]}")


@dataclass
class Counted:
    """A loopback proxy in front of an Alertmanager (`counting`): its URL, the path and query of each GET it
    forwarded, in order, how many were in flight at most at once, and the answers Alertmanager refused
    (503: past its `--web.get-concurrency`)."""

    url: str = ""
    gets: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    most_in_flight: int = 0
    refused: int = 0

    def queries(self) -> list[str]:
        with self.lock:
            return list(self.gets)


@contextmanager
def counting(target: str, *, hold: float = 0.0, refuse_every: int = 0) -> Iterator[Counted]:
    """A proxy that forwards each GET to the Alertmanager at `target` and records it: how many queries
    rackflow sends it, and which (Alertmanager 0.25 counts none of its API's GETs in /metrics), and how
    many at once. `hold`: seconds each GET is kept in flight before it is forwarded, so that GETs sent at
    once are seen at once. `refuse_every` N: every Nth GET is answered 503 as a busy Alertmanager answers
    it, not forwarded (a real one refuses only when GETs reach it together, which a quiet machine may
    never make happen)."""
    counted = Counted()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with counted.lock:
                counted.gets.append(self.path)
                nth = len(counted.gets)
                counted.in_flight += 1
                counted.most_in_flight = max(counted.most_in_flight, counted.in_flight)
            try:
                time.sleep(hold)
                if refuse_every and nth % refuse_every == 0:
                    status, body = 503, BUSY
                else:
                    with urllib.request.urlopen(f"{target}{self.path}", timeout=10) as answer:
                        status, body = answer.status, answer.read()
            except urllib.error.HTTPError as refused:
                status, body = refused.code, refused.read()
            finally:
                # Out of flight before the answer is sent: the client may send its next GET once it has it.
                with counted.lock:
                    counted.in_flight -= 1
            if status == 503:
                with counted.lock:
                    counted.refused += 1
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    with serving(Handler) as url:
        counted.url = url
        yield counted
