"""Keyed reads: concurrent one-row reads by key, answered together by one query per round.

Why: a GetTaskSchedule is one primary-key SELECT, and under many concurrent clients the query's own cost
(a pooled connection's checkout and return, the driver's send, an event-loop wake-up for its answer) was
most of the server's time per call, several times what the row's conversion costs (docs/PERFORMANCE.md,
"api"). Here a caller queues its key and awaits its row; one flusher at a time takes every key queued so
far and reads them with one `= ANY(:keys)` query. So the reads never hold more than one connection, and
the busier the server is, the more keys each round answers.

Read-your-writes holds: a key queued while a round is in flight waits for the next round, whose query is
sent after the key was queued, so it sees every write committed before the caller asked. A round that
fails gives its error to each of its callers; a caller that gives up (cancelled) leaves the others alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

# Reads the rows of these keys (at most one per key, in any order).
ReadMany = Callable[[list[Hashable]], Awaitable[Sequence[Any]]]


class KeyedReads:
    """`get(key)` is the row whose `key_of(row)` is `key`, or None."""

    def __init__(self, read_many: ReadMany, key_of: Callable[[Any], Hashable]) -> None:
        self._read_many = read_many
        self._key_of = key_of
        self._queued: dict[Hashable, list[asyncio.Future[Any]]] = {}
        self._flusher: asyncio.Task[None] | None = None

    async def get(self, key: Hashable) -> Any | None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(key, []).append(future)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        round_: dict[Hashable, list[asyncio.Future[Any]]] = {}
        try:
            while self._queued:
                round_, self._queued = self._queued, {}
                try:
                    rows = await self._read_many(list(round_))
                except Exception as exc:
                    for future in _waiting(round_):
                        future.set_exception(exc)
                    continue
                found = {self._key_of(row): row for row in rows}
                for key, futures in round_.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(found.get(key))
        except asyncio.CancelledError:  # the loop is closing: nobody will answer these callers
            for future in [*_waiting(round_), *_waiting(self._queued)]:
                future.cancel()
            self._queued = {}
            raise
        finally:
            self._flusher = None


def _waiting(callers: dict[Hashable, list[asyncio.Future[Any]]]) -> list[asyncio.Future[Any]]:
    """The futures still to answer (a caller that was cancelled is not)."""
    return [future for futures in callers.values() for future in futures if not future.done()]
