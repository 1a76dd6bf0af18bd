"""Until one transaction waits for another's lock: for the tests of what happens then (who decides first,
what the waiter reads once its turn came, that two lock orders do not deadlock).

A sleep there only hopes the other side got as far as the lock: on a loaded machine it may not have
started yet, and then it runs after the holder committed, the race the test claims to test never happens
and the test passes whatever the product does. So the test waits for the wait itself, as the database (or
this process) shows it, and fails if the other side ends without waiting."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.db import Database

# Sessions that the holder's backend blocks: a row, advisory or table lock it holds (any database, but the
# holder's backend is this test's own).
_BLOCKED_BY = text(
    "SELECT count(*) FROM pg_stat_activity WHERE CAST(:holder AS integer) = ANY(pg_blocking_pids(pid))"
)


async def backend_pid(conn: AsyncConnection) -> int:
    """The PostgreSQL backend of `conn`, asked while it is free: a connection whose statement waits for a
    lock answers nothing else until that statement ends (for `waiting_for` on a holder that waits too)."""
    return int(await conn.scalar(text("SELECT pg_backend_pid()")))


async def waiting_for(db: Database, holder: AsyncConnection | int, waiter: asyncio.Future[Any]) -> None:
    """Until `waiter` waits for a lock that `holder`'s open transaction holds: on PostgreSQL a session that
    `pg_blocking_pids` says `holder`'s backend (or the backend `holder` names: `backend_pid`) blocks; on
    SQLite a writer queued on the lock this process's writers take in turn (`Database.transaction`), which
    `holder` holds. Fails if `waiter` ends first (it did not wait), with its error if it raised one."""
    holder_pid = None
    if db.is_postgres:
        holder_pid = holder if isinstance(holder, int) else await backend_pid(holder)
    async with asyncio.timeout(60):
        while True:
            if waiter.done():
                raise AssertionError(f"it ended without waiting for the lock: {waiter.result()!r}")
            if await _blocked(db, holder_pid):
                return
            await asyncio.sleep(0.02)


async def _blocked(db: Database, holder_pid: int | None) -> bool:
    if holder_pid is None:
        # The private queue of the asyncio.Lock in `Database.transaction`: nothing public says who waits.
        write_lock = db._write_lock
        assert write_lock is not None
        return bool(write_lock._waiters)
    async with db.read() as conn:
        return bool(await conn.scalar(_BLOCKED_BY, {"holder": holder_pid}))
