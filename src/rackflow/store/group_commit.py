"""Group commit: many coroutines' small writes, done together in one transaction per round.

Why: a task executor runs dozens of tasks at once, and each wants a few one-row writes (progress, component
state, its end). Done one transaction each, they cost a pooled connection and several round trips apiece,
and starve everything else sharing the event loop and the pool. Here a caller queues its item and awaits
the result; one flusher at a time takes everything queued so far and writes it in one transaction. So a
`GroupCommit` never uses more than one connection, and the more callers there are, the bigger (and
cheaper per item) each round gets.

A round that fails is retried one item per transaction, so an item that cannot be written fails alone and
its neighbours still land; during an outage every caller gets the error and decides (retry, give up).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.db import Database

log = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")

# Writes the items in the caller's transaction; returns one result per item, in order.
WriteMany = Callable[[AsyncConnection, Sequence[Item]], Awaitable[Sequence[Result]]]


class GroupCommit(Generic[Item, Result]):
    """Queue items with `write`; `close` waits for the writes already queued. `after_commit` runs after
    each round that committed, before its callers hear of it."""

    def __init__(
        self,
        db: Database,
        write_many: WriteMany[Item, Result],
        *,
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        self.db = db
        self.write_many = write_many
        self.after_commit = after_commit
        self._queued: list[tuple[Item, asyncio.Future[Result]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def write(self, item: Item) -> Result:
        """Write `item` with whatever else is queued; its result once committed (or the error)."""
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queued.append((item, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name="group commit")
        # A caller cancelled while it waits cancels only its wait: the write goes ahead all the same.
        return await future

    async def close(self) -> None:
        if self._flusher is not None:
            await asyncio.gather(self._flusher, return_exceptions=True)

    async def _flush(self) -> None:
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                await self._write_batch(batch)
        finally:
            self._flusher = None
            # Only when the flusher itself was cancelled is anything left: its callers must not wait forever.
            batch, self._queued = batch + self._queued, []
            for _, future in batch:
                future.cancel()

    async def _write_batch(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        try:
            async with self.db.transaction() as conn:
                results = await self.write_many(conn, [item for item, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0][1].done():
                    batch[0][1].set_exception(exc)
                return
            log.warning("a group of %d writes failed; writing them one by one", len(batch), exc_info=True)
            for one in batch:
                await self._write_batch([one])
            return
        if self.after_commit is not None:
            self.after_commit()
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():  # done: its waiter was cancelled
                future.set_result(result)
