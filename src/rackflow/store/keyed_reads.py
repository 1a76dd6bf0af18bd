"""Keyed reads: concurrent one-row reads by key, answered together by one query per round.

Why: a GetTaskSchedule is one primary-key SELECT, and under many concurrent clients the query's own cost
(a pooled connection's checkout and return, the driver's send, an event-loop wake-up for its answer) was
most of the server's time per call, several times what the row's conversion costs (docs/PERFORMANCE.md,
"api"). Here a caller queues its key and awaits its row; one flusher at a time takes every key queued so
far and reads them with one `= ANY(:keys)` query. So the reads never hold more than one connection.

Rounds gather: requests from concurrent clients reach the server spread out, one every few hundred
microseconds, and a round is sent, answered and done before the next arrives, so sent at once a round
answered 1.15 callers on average under 16 clients, and each paid a whole query (about 300 µs of CPU on
this side and PostgreSQL's). So when readers are concurrent (callers came while the last round was out),
a round first waits up to `GATHER_WINDOW_S` for as many callers as the last round answered plus those that
came during it; callers that keep reading come back within that. Under 16 clients a round then answers
4–7 callers, and the server's CPU per Get fell from about 800 to about 500 µs (docs/PERFORMANCE.md, issue
17's third round). A lone caller, or callers one after another, never wait: nobody came while their round
was out, and after a pause longer than the window nobody is expected.

Read-your-writes holds: a key queued while a round is in flight waits for the next round, whose query is
sent after the key was queued, so it sees every write committed before the caller asked. A round that
fails gives its error to each of its callers; a caller that gives up (cancelled) leaves the others alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any

from rackflow.metrics import KEYED_READ_CALLERS, KEYED_READ_ROUNDS

# Reads the rows of these keys (at most one per key, in any order).
ReadMany = Callable[[list[Hashable]], Awaitable[Sequence[Any]]]

# The longest a round waits for the concurrent callers it expects. Under 16 clients a fixed wait of 1 ms
# gathered 2.7 callers a round and one of 2 ms 5.1 (bench/api.py); next to a Get's latency under that
# load (p50 9–12 ms unbatched, 5–7 ms batched) the wait is small, and only concurrent readers pay it.
GATHER_WINDOW_S = 0.002


class KeyedReads:
    """`get(key)` is the row whose `key_of(row)` is `key`, or None."""

    def __init__(
        self,
        read_many: ReadMany,
        key_of: Callable[[Any], Hashable],
        *,
        gather_window: float = GATHER_WINDOW_S,
    ) -> None:
        self._read_many = read_many
        self._key_of = key_of
        self._gather_window = gather_window
        self._queued: dict[Hashable, list[asyncio.Future[Any]]] = {}
        self._callers = 0  # callers waiting in `_queued`
        self._expected = 1  # callers the next round waits for, up to the window
        self._last_answered = 0.0  # the loop's time when the last round was answered
        self._gathered: asyncio.Future[None] | None = None  # set once `_expected` callers are queued
        self._flusher: asyncio.Task[None] | None = None

    async def get(self, key: Hashable) -> Any | None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queued.setdefault(key, []).append(future)
        self._callers += 1
        if self._gathered is not None and self._callers >= self._expected:
            _settle(self._gathered)
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        round_: dict[Hashable, list[asyncio.Future[Any]]] = {}
        try:
            while self._queued:
                await self._gather()
                round_, self._queued = self._queued, {}
                answering, self._callers = self._callers, 0
                KEYED_READ_ROUNDS.inc()
                KEYED_READ_CALLERS.inc(answering)
                try:
                    rows = await self._read_many(list(round_))
                except Exception as exc:
                    for future in _waiting(round_):
                        future.set_exception(exc)
                    continue
                finally:
                    # Those who came while the round was out read concurrently with its callers, who
                    # are likely to read again: the next round waits for them all.
                    self._expected = answering + self._callers
                self._last_answered = asyncio.get_running_loop().time()
                found = {self._key_of(row): row for row in rows}
                for key, futures in round_.items():
                    for future in futures:
                        if not future.done():
                            future.set_result(found.get(key))
        except asyncio.CancelledError:  # the loop is closing: nobody will answer these callers
            for future in [*_waiting(round_), *_waiting(self._queued)]:
                future.cancel()
            self._queued, self._callers = {}, 0
            raise
        finally:
            self._flusher = None

    async def _gather(self) -> None:
        """Wait until `_expected` callers are queued or the window has passed, whichever is first."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_answered > self._gather_window:
            self._expected = 1  # the readers went quiet: whoever reads now is not waited for
        if self._callers >= self._expected:
            return
        self._gathered = loop.create_future()
        timer = loop.call_later(self._gather_window, _settle, self._gathered)
        try:
            await self._gathered
        finally:
            timer.cancel()
            self._gathered = None


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _waiting(callers: dict[Hashable, list[asyncio.Future[Any]]]) -> list[asyncio.Future[Any]]:
    """The futures still to answer (a caller that was cancelled is not)."""
    return [future for futures in callers.values() for future in futures if not future.done()]
