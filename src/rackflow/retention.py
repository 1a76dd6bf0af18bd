"""Retention: every instance deletes the rows older than a retention, at start-up and then hourly.

One loop for every kind of row (`--audit-retention`, `--run-retention`, `--task-retention`): each instance
prunes on its own, because deleting is idempotent and concurrent pruners skip each other's rows
(`store.retention.prune_older`), so no leader is needed and the tables stay bounded while any instance
runs. A failed prune (say, the database is down) is logged and tried again at the next round; it never
stops the server.

Tasks are pruned before runs, in one loop (`run_in_order`). On SQLite deleting a run unlinks the tasks it
submitted (`tasks.run_id` is ON DELETE SET NULL there), which rewrites each task row; after its tasks are
gone, a run's delete has nothing to unlink (docs/PERFORMANCE.md, "The prune at ten million rows"). On
PostgreSQL the tasks keep the pruned run's id and a run's delete never visits them (migration 0036).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from datetime import timedelta
from typing import Protocol

from prometheus_client import Counter

from rackflow.clock import sleep_unless_stopped
from rackflow.config import DEFAULT_PRUNE_INTERVAL
from rackflow.store import run_partitions, task_partitions
from rackflow.store.db import Database
from rackflow.store.retention import PRUNE_CHUNK
from rackflow.timespec.duration import format_go_duration

log = logging.getLogger(__name__)

# How often every instance makes sure the runs' and the tasks' coming weeks have partitions (PostgreSQL).
KEEP_AHEAD_EVERY = DEFAULT_PRUNE_INTERVAL


class PruneChunks(Protocol):
    """A store function deleting the rows older than `retention`, yielding each committed chunk's count."""

    def __call__(
        self, db: Database, retention: timedelta, *, chunk: int = ...
    ) -> AsyncGenerator[int, None]: ...


class Pruner:
    """Run with `run(stop)` beside the executor and the dispatcher. Its log lines read `{name} retention:
    pruned N {what} older than …`, durations as the flags take them (`2160h`; a `timedelta` printed itself
    as `90 days, 0:00:00`)."""

    def __init__(
        self,
        db: Database,
        retention: timedelta,
        *,
        name: str,
        what: str,
        prune: PruneChunks,
        counter: Counter,
        every: timedelta = DEFAULT_PRUNE_INTERVAL,
        chunk: int = PRUNE_CHUNK,
    ) -> None:
        self.db = db
        self.retention = retention
        self.name = name
        self.what = what
        self.prune = prune
        self.counter = counter
        self.every = every
        self.chunk = chunk

    async def run(self, stop: asyncio.Event) -> None:
        """Prune at once, then every `every` until `stop` is set."""
        await run_in_order((self,), stop)

    async def prune_once(self, stop: asyncio.Event) -> int:
        """Delete the rows past the retention, chunk by chunk; `stop` ends it after the current chunk, so a
        first prune of millions of rows does not hold up shutdown. Returns how many went."""
        pruned = 0
        chunks = self.prune(self.db, self.retention, chunk=self.chunk)
        async with contextlib.aclosing(chunks):
            async for deleted in chunks:
                pruned += deleted
                self.counter.inc(deleted)
                if stop.is_set():
                    break
        log.info(
            "%s retention: pruned %d %s older than %s",
            self.name,
            pruned,
            self.what,
            format_go_duration(self.retention),
        )
        return pruned


async def run_in_order(pruners: Sequence[Pruner], stop: asyncio.Event) -> None:
    """Run each of `pruners` in turn, at once and then every round (the shortest of their `every`), until
    `stop` is set. One failing pruner is logged and the next still runs."""
    for pruner in pruners:
        log.info(
            "%s retention: deleting %s older than %s, every %s",
            pruner.name,
            pruner.what,
            format_go_duration(pruner.retention),
            format_go_duration(pruner.every),
        )
    every = min(pruner.every for pruner in pruners)
    while not stop.is_set():
        for pruner in pruners:
            if stop.is_set():
                break
            try:
                await pruner.prune_once(stop)
            except Exception as exc:
                log.warning(
                    "%s prune failed (%s); retrying in %s", pruner.name, exc, format_go_duration(every)
                )
        await sleep_unless_stopped(stop, every)


async def ensure_weeks(db: Database) -> None:
    """Make the coming weeks' partitions of the runs and of the tasks (PostgreSQL, `store.run_partitions`,
    `store.task_partitions`): a slot whose week has none cannot be recorded, and a task's week would be
    made in its firing's transaction; then drop the past weeks of runs the run cap has emptied, and raise
    where the weeks that can hold a live task begin (`task_partitions.raise_live_since`). A failure (a
    lock wait given up, the database down) is logged; the next round tries again, weeks before a slot
    would need them."""
    steps = (
        ("run", run_partitions.keep_ahead, "coming weeks not made", "made %s"),
        (
            "run",
            run_partitions.drop_emptied,
            "emptied weeks not dropped",
            "dropped %s, emptied by the run cap",
        ),
        ("task", task_partitions.keep_ahead, "coming weeks not made", "made %s"),
        ("task", _live_weeks_raised, "the weeks of the live tasks not raised", "live tasks' weeks from %s"),
    )
    for kind, step, failed, done in steps:
        try:
            names = await step(db)
        except Exception as exc:
            log.warning(
                "%s partitions: %s (%s); retrying in %s",
                kind,
                failed,
                exc,
                format_go_duration(KEEP_AHEAD_EVERY),
            )
            continue
        if names:
            log.info(f"{kind} partitions: " + done, ", ".join(names))


async def _live_weeks_raised(db: Database) -> list[str]:
    """`task_partitions.raise_live_since` as a step of `ensure_weeks`: the week it wrote, if any."""
    since = await task_partitions.raise_live_since(db)
    return [since.date().isoformat()] if since is not None else []


async def keep_weeks(db: Database, stop: asyncio.Event) -> None:
    """`ensure_weeks` every KEEP_AHEAD_EVERY until `stop` is set (the server does a first round itself at
    start-up, before its dispatcher fires)."""
    while not await sleep_unless_stopped(stop, KEEP_AHEAD_EVERY):
        await ensure_weeks(db)
