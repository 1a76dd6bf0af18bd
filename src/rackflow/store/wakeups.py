"""Telling dispatchers that a schedule became due sooner than they planned to look.

The dispatcher sleeps until the earliest `next_run_at` it read (capped by its poll interval). A request that
makes a schedule due sooner (create, update, resume) announces the new time, so no dispatcher sleeps past it:

* PostgreSQL: `NOTIFY rackflow_due, '<time>'` inside the request's transaction, which PostgreSQL delivers
  at commit (never for a rollback) to every instance's listener (`listen`: one dedicated connection per
  dispatching process, this one's included).
* SQLite: this process's subscribers at once. A dispatcher that wakes before the request commits waits for
  the write lock that transaction holds, so its claim sees the schedule. Another process on the same file
  learns at its next poll.

Notifications are a speed-up, never the guarantee: one lost (a listener reconnecting, another process on
SQLite) costs at most one poll interval, because the poll remains.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.retry import Retry, retrying
from rackflow.store.db import Database

log = logging.getLogger(__name__)

CHANNEL = "rackflow_due"

# A listener whose connection failed reconnects this often until it succeeds.
RECONNECT = Retry.every(1.0)


async def announce(db: Database, conn: AsyncConnection, at: datetime) -> None:
    """In the caller's transaction: a schedule is now due at `at` (see the module note for who hears)."""
    if db.is_postgres:
        await conn.execute(select(func.pg_notify(CHANNEL, at.isoformat())))
    else:
        db.wakeups.deliver(at)


async def listen(db: Database, stop: asyncio.Event) -> None:
    """PostgreSQL: pass every announcement to `db.wakeups` until `stop` is set, on a connection of its own.

    After each (re)connect it delivers None (look now), since announcements made while it was not
    listening are lost. SQLite announces in-process, so this returns at once.
    """
    if not db.is_postgres:
        return
    while not stop.is_set():
        try:
            conn = await retrying(lambda: _connect(db), RECONNECT, what="schedule listener", stop=stop)
        except psycopg.Error:  # only raised once `stop` is set
            return
        try:
            async with conn:
                db.wakeups.deliver(None)
                await _relay(db, conn, stop)
        except psycopg.Error as exc:  # the connection dropped, or the server refused a statement
            if not stop.is_set():
                log.warning("schedule listener lost its connection (%s); reconnecting", exc)


async def _connect(db: Database) -> psycopg.AsyncConnection[tuple[object, ...]]:
    _, params = db.engine.dialect.create_connect_args(make_url(db.url))
    conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
    await conn.execute(f"LISTEN {CHANNEL}")
    return conn


async def _relay(
    db: Database, conn: psycopg.AsyncConnection[tuple[object, ...]], stop: asyncio.Event
) -> None:
    """Deliver notifications until `stop` is set (returns) or the connection fails (raises)."""

    async def relay() -> None:
        async for notice in conn.notifies():
            db.wakeups.deliver(payload_time(notice.payload))

    relaying = asyncio.create_task(relay())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({relaying, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        relaying.cancel()
        stopping.cancel()
    if relaying.done() and not relaying.cancelled():
        relaying.result()  # the connection's error, if it ended on one


def payload_time(payload: str) -> datetime | None:
    """The announced time; None (look now) for a payload that is not an aware time (another client may
    NOTIFY on the channel too, and a naive time cannot be compared with the dispatcher's)."""
    try:
        at = datetime.fromisoformat(payload)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None
