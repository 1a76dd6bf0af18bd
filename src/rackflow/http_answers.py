"""Reading an HTTP answer within a deadline, and not following redirects: the notification senders and
the pre-flight hooks.

`urlopen`'s timeout bounds each socket operation, not the whole answer: a receiver that trickles its
body a byte at a time held a worker thread for as long as it went on, long after the caller's own
timeout had given up on it, and the sends queued behind it in the same pool timed out unsent. The body
is read here in pieces, each no longer than a socket timeout, until it ends, the limit is read, or the
deadline passes.

A redirect is not followed (`NO_REDIRECTS`): urllib turned a redirected POST into a GET without the body,
carrying the headers (Basic credentials, the signature) along, to another host too, and a 2xx to that GET
counted: a notification recorded delivered that no receiver got (Alertmanager answers its GET
/api/v2/alerts), a drain hook's check passed by a page answering `{"ok": true}` that never saw the task.
"""

from __future__ import annotations

import time
import urllib.request
from http.client import HTTPResponse
from typing import Any

READ_PIECE = 8192


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


# Open requests with this rather than `urlopen`: a 3xx answer raises `HTTPError` (`not_followed`).
NO_REDIRECTS = urllib.request.build_opener(_NoRedirects)


def not_followed(code: int) -> str:
    """What a redirect answered to a POST says (its Location is not quoted: it may hold a token)."""
    return f"HTTP {code}: a redirect, not followed (set the URL to its target)"


def read_within(answer: HTTPResponse, deadline: float, limit: int) -> bytes:
    """Up to `limit` bytes of `answer`'s body, read by `deadline` (on `time.monotonic()`); `TimeoutError`
    past it. A body longer than `limit` is cut there (the caller says whether that is an error)."""
    pieces: list[bytes] = []
    size = 0
    while size < limit:
        if time.monotonic() > deadline:
            raise TimeoutError("the answer came too slowly")
        piece = answer.read1(min(READ_PIECE, limit - size))
        if not piece:
            break
        pieces.append(piece)
        size += len(piece)
    return b"".join(pieces)
