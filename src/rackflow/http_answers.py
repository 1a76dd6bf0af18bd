"""Reading an HTTP answer within a deadline: the notification senders and the pre-flight hooks.

`urlopen`'s timeout bounds each socket operation, not the whole answer: a receiver that trickles its
body a byte at a time held a worker thread for as long as it went on, long after the caller's own
timeout had given up on it, and the sends queued behind it in the same pool timed out unsent. The body
is read here in pieces, each no longer than a socket timeout, until it ends, the limit is read, or the
deadline passes.
"""

from __future__ import annotations

import time
from http.client import HTTPResponse

READ_PIECE = 8192


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
