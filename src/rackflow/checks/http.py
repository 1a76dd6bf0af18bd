"""The checker's HTTP client: kept-alive connections per host, standard library only (issue 26).

`urllib` opens a connection for every request and closes it after the answer, so three webhook checks
over 300 tasks cost 900 TCP connects (and, on the hook's side, 900 accepts and, for a threading server, 900
threads). A pre-flight round asks the same few hooks over and over, so this keeps each connection open
after its answer and hands it to the next request to the same host, as any HTTP/1.1 client does.

* Connections are kept per (scheme, host, port), at most `per_host` idle ones (the checker's concurrency:
  each of its threads holds at most one at a time), and dropped after `IDLE_FOR` unused, before a hook's
  server is likely to close them itself.
* A kept connection the server has closed meanwhile fails at once, when the request is sent or its answer
  read begins (`RemoteDisconnected`, a reset, a broken pipe): the request is sent once more, on a new
  connection. A round's request carries its round number (`attempt`), so a hook that did see the first
  one sees a repeat, not a new round. A new connection is never retried: its error is the answer.
* A URL this client does not keep connections for (another scheme, user info in it, or a proxy set in
  the environment for it, which `urllib` honours) goes through `urllib` as before.
* Every answer, whatever its status, is read to its end (at most `limit` bytes, else the connection is
  closed), so the connection can carry the next request; redirects are not followed (`urllib` followed a
  POST's 301/302/303 as a GET, without its body, which a hook never wants).

Timeouts are as `urllib`'s: each connect, send and read waits at most the request's timeout.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Mapping

# A kept connection unused this long is closed rather than reused (common servers close theirs after 5 s
# to a few minutes; the checker's rounds come much closer together while tasks are due).
IDLE_FOR = 4.0

_Key = tuple[str, str, int]
# What a kept connection that the server closed meanwhile fails with, before any answer came.
_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class HTTPStatusError(OSError):
    """An answer that is not 2xx (as `urllib.error.HTTPError`: the look holds with "HTTP <code>")."""

    def __init__(self, code: int, body: bytes) -> None:
        super().__init__(f"HTTP {code}")
        self.code = code
        self.body = body


class Connections:
    """Kept-alive HTTP(S) connections by host, shared by the checker's threads (thread-safe)."""

    def __init__(self, per_host: int) -> None:
        self.per_host = per_host
        self._idle: defaultdict[_Key, list[tuple[float, http.client.HTTPConnection]]] = defaultdict(list)
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self.opened = 0  # connections made (the tests and the bench read it)

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float,
        limit: int = 64 * 1024,
    ) -> tuple[int, bytes]:
        """Send one request; its 2xx answer's status and body (at most `limit` bytes). Blocks: call it
        in the checker's thread pool. Raises `HTTPStatusError` for any other status, `OSError` (a
        timeout, a refused connect, …) and `http.client.HTTPException` as the connection failed."""
        parts = urllib.parse.urlsplit(url)
        if not _keeps(parts):
            return _urllib(method, url, body, dict(headers or {}), timeout, limit)
        assert parts.hostname is not None  # `_keeps`
        scheme = parts.scheme.lower()
        key = (scheme, parts.hostname, parts.port or (443 if scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        while True:
            conn, kept = self._take(key, timeout)
            try:
                conn.request(method, target, body=body, headers=dict(headers or {}))
                answer = conn.getresponse()
                raw = answer.read(limit)
            except _STALE:
                conn.close()
                if kept:
                    # The server closed it while it was idle, and likely the others it kept too: once more,
                    # on a new connection.
                    self._drop(key)
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            if answer.will_close or not answer.isclosed():  # closing, or more body than `limit`
                conn.close()
            else:
                self._give_back(key, conn)
            if not 200 <= answer.status < 300:
                raise HTTPStatusError(answer.status, raw)
            return answer.status, raw

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, defaultdict(list)
        for kept in idle.values():
            for _, conn in kept:
                conn.close()

    def _take(self, key: _Key, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """A kept connection to `key` (the most recently used), or a new one; and whether it was kept."""
        now = time.monotonic()
        with self._lock:
            kept = self._idle[key]
            fresh = [(since, conn) for since, conn in kept if now - since < IDLE_FOR]
            stale = [conn for since, conn in kept if now - since >= IDLE_FOR]
            found = fresh.pop()[1] if fresh else None
            kept[:] = fresh
        for old in stale:
            old.close()
        if found is not None:
            found.timeout = timeout
            if found.sock is not None:
                found.sock.settimeout(timeout)
            return found, True
        scheme, host, port = key
        if scheme == "https":
            if self._context is None:
                self._context = ssl.create_default_context()
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout, context=self._context
            )
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
        with self._lock:
            self.opened += 1
        return conn, False

    def _drop(self, key: _Key) -> None:
        with self._lock:
            kept = self._idle.pop(key, [])
        for _, conn in kept:
            conn.close()

    def _give_back(self, key: _Key, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            kept = self._idle[key]
            if len(kept) < self.per_host:
                kept.append((time.monotonic(), conn))
                return
        conn.close()


def _keeps(parts: urllib.parse.SplitResult) -> bool:
    """Whether this client keeps connections for the URL: plain HTTP(S) to a host, with no user info and
    no proxy from the environment (`urllib` would use it)."""
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname or parts.username is not None:
        return False
    proxies = urllib.request.getproxies()
    return parts.scheme.lower() not in proxies or bool(urllib.request.proxy_bypass(parts.hostname))


def _urllib(
    method: str, url: str, body: bytes | None, headers: dict[str, str], timeout: float, limit: int
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read(limit)
    except urllib.error.HTTPError as exc:
        raise HTTPStatusError(exc.code, b"") from exc
