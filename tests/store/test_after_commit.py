"""`store.db.after_commit` on both databases: a transaction's hooks run once it committed, once per name
however often it asked, never for a rollback, and a rolled-back transaction's request does not leak into
the next transaction on the same pooled connection."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from rackflow.store.db import Database, after_commit

pytestmark = pytest.mark.asyncio


async def test_hooks_run_after_commit_once_and_never_for_a_rollback(db_url: str) -> None:
    db = Database(db_url, pool_size=1)  # one connection: the rolled-back request's and the next's
    try:
        heard: list[str] = []
        db.on_commit["a"] = [lambda: heard.append("a")]
        db.on_commit["b"] = [lambda: heard.append("b")]
        async with db.transaction() as conn:
            await conn.execute(text("SELECT 1"))
            after_commit(conn, "a")
            after_commit(conn, "a")
            assert heard == []  # not before the commit
        assert heard == ["a"]
        with pytest.raises(RuntimeError):
            async with db.transaction() as conn:
                after_commit(conn, "b")
                raise RuntimeError("rolled back")
        async with db.transaction() as conn:
            await conn.execute(text("SELECT 1"))
        assert heard == ["a"]
        async with db.transaction() as conn:
            after_commit(conn, "unheard")  # nobody listens: nothing happens
    finally:
        await db.dispose()
