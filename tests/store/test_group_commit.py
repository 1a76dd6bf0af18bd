"""GroupCommit on SQLite and PostgreSQL: many callers' writes in few transactions, failures kept apart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store.db import Database
from rackflow.store.group_commit import GroupCommit
from rackflow.store.tables import instances


class Recorder:
    """Writes each item as an instance row (pid = the item); refuses negative items."""

    def __init__(self) -> None:
        self.rounds: list[list[int]] = []
        self.began = asyncio.Event()

    async def write_many(self, conn: AsyncConnection, items: Sequence[int]) -> list[str]:
        self.rounds.append(list(items))
        self.began.set()
        if any(item < 0 for item in items):
            raise ValueError(f"item {min(items)} is negative")
        for item in items:
            now = datetime.now(UTC)
            await conn.execute(
                insert(instances).values(
                    id=uuid.UUID(int=item + 1), host="h", pid=item, started_at=now, heartbeat_at=now
                )
            )
        return [f"wrote {item}" for item in items]


async def written(db: Database) -> set[int]:
    async with db.read() as conn:
        return set((await conn.execute(select(instances.c.pid))).scalars())


async def test_concurrent_writes_share_transactions(db: Database) -> None:
    recorder = Recorder()
    commits: list[int] = []
    group = GroupCommit(db, recorder.write_many, after_commit=lambda: commits.append(1))
    results = await asyncio.gather(*(group.write(i) for i in range(20)))
    assert results == [f"wrote {i}" for i in range(20)]
    assert await written(db) == set(range(20))
    # All were queued before the round began: one transaction for the twenty.
    assert recorder.rounds == [list(range(20))] and commits == [1]


async def test_writes_queued_during_a_round_go_into_the_next(db: Database) -> None:
    recorder = Recorder()
    group = GroupCommit(db, recorder.write_many)
    first = asyncio.create_task(group.write(0))
    await recorder.began.wait()  # the round with 0 has begun
    results = await asyncio.gather(group.write(1), group.write(2), first)
    assert list(results) == ["wrote 1", "wrote 2", "wrote 0"]
    assert recorder.rounds == [[0], [1, 2]]


async def test_a_failing_item_fails_alone(db: Database) -> None:
    recorder = Recorder()
    commits: list[int] = []
    group = GroupCommit(db, recorder.write_many, after_commit=lambda: commits.append(1))
    outcomes = await asyncio.gather(*(group.write(i) for i in (1, -2, 3)), return_exceptions=True)
    assert outcomes[0] == "wrote 1" and outcomes[2] == "wrote 3"
    assert isinstance(outcomes[1], ValueError) and "-2" in str(outcomes[1])
    assert await written(db) == {1, 3}  # the failed round wrote nothing; the retries one each
    assert recorder.rounds == [[1, -2, 3], [1], [-2], [3]] and len(commits) == 2


async def test_a_cancelled_caller_does_not_stop_the_write(db: Database) -> None:
    recorder = Recorder()
    group = GroupCommit(db, recorder.write_many)
    caller = asyncio.create_task(group.write(7))
    await asyncio.sleep(0)  # queued, the round not yet written
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await group.close()
    assert await written(db) == {7}


async def test_close_waits_for_queued_writes(db: Database) -> None:
    recorder = Recorder()
    group = GroupCommit(db, recorder.write_many)
    pending = [asyncio.create_task(group.write(i)) for i in range(3)]
    await asyncio.sleep(0)
    await group.close()
    assert all(p.done() for p in pending) and await written(db) == {0, 1, 2}
