"""docs/CHECKS.md's drain hook, run as written: the doc's own Python, served on loopback, verifies what
rackflow's webhook check really sends, and refuses the same request replayed outside the window."""

from __future__ import annotations

import asyncio
import io
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import HTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rackflow.checks.kinds import Asked, webhook, webhook_payload
from rackflow.domain.checks import RackFacts, WebhookSettings

DOC = Path(__file__).parents[2] / "docs" / "CHECKS.md"
SERVE = 'HTTPServer(("0.0.0.0", 8099), Hook).serve_forever()'


def _hook_code() -> str:
    """The doc's drain hook without its last line, which serves it on a fixed port: the test serves the
    same handler on loopback."""
    (snippet,) = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert snippet.rstrip().endswith(SERVE)
    return snippet.rstrip()[: -len(SERVE)]


@pytest.fixture
def hook(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[str, dict[str, Any], list[tuple[dict[str, str], bytes]]]]:
    monkeypatch.setenv("DRAIN_KEY", "s3cret")  # as the doc's `export` line sets it
    scope: dict[str, Any] = {}
    exec(_hook_code(), scope)  # the doc's own code
    seen: list[tuple[dict[str, str], bytes]] = []

    class Recording(scope["Hook"]):  # type: ignore[misc]
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((dict(self.headers), body))
            self.rfile = io.BytesIO(body)  # read again by the doc's handler
            super().do_POST()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/drain", scope, seen
    finally:
        server.shutdown()
        server.server_close()


def _post(url: str, headers: dict[str, str], body: bytes) -> int:
    wanted = {k: v for k, v in headers.items() if k.lower().startswith(("x-rackflow", "content-type"))}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=wanted), timeout=5) as a:
            return int(a.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_docs_drain_hook_verifies_rackflows_request_and_refuses_a_late_replay(
    hook: tuple[str, dict[str, Any], list[tuple[dict[str, str], bytes]]],
) -> None:
    url, scope, seen = hook
    rack = RackFacts(uuid.UUID(int=7), "rack-01", "SN-1001", uuid.UUID(int=9), "nvl-a")
    task = SimpleNamespace(
        id=uuid.UUID(int=1),
        operation=SimpleNamespace(kind=SimpleNamespace(value="upgrade_firmware")),
        schedule_id=None,
        run_id=None,
    )
    payload = webhook_payload("drained", task, 1, rack, [])  # type: ignore[arg-type]
    settings = WebhookSettings(url, "env:DRAIN_KEY", "5s")
    with ThreadPoolExecutor(1) as pool:
        look = asyncio.run(webhook(settings, payload, Asked(pool)))
    # Verified: the doc's hook answered its verdict (a 401 would hold with "HTTP 401").
    assert (look.passed, look.reason) == (False, "webhook: draining 3 jobs")
    ((headers, body),) = seen
    assert _post(url, headers, body) == 200  # within the window, the same request still verifies
    tampered = body.replace(b"rack-01", b"rack-02")
    assert _post(url, headers, tampered) == 401
    # Captured and sent again ten minutes later: the doc's hook refuses it.
    later = time.time() + 600
    scope["time"] = SimpleNamespace(time=lambda: later)
    assert _post(url, headers, body) == 401
