"""The pre-flight checker: a loop in every `rackflow serve` that asks the checks about the tasks their gate
holds, and stores what they answered for the gate to read (docs/CHECKS.md).

Each poll (every PREFLIGHT_POLL_INTERVAL, or at once when this process's gate held a task for a first look)
finds the held tasks whose next round is due and starts a round for each, in the background, so a slow
hook delays no other rack and never the dispatcher or the executor. A round:

1. takes a lease on the task's next round (`store.take_round`, a conditional UPDATE): of several
   instances, one asks; a checker that dies mid-round is replaced when its lease runs out;
2. asks every check that applies, at once, outside any transaction (at most PREFLIGHT_CONCURRENCY HTTP
   requests at once in the process, each with its timeout);
3. stores the results as round `attempt` and, in the same transaction, lets the task be claimed at once if
   all passed (the claim's gate then starts it), or holds it with the first failing check's reason
   (written on the task: `held_reason`, its message, `rackflow task show`, the pages) until that check's
   maximum wait runs out; the next round, due after the interval (or the hook's `retry_after`), releases
   it if the checks pass by then. So a held task costs no claims while it waits.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from rackflow.checks import kinds
from rackflow.checks.gate import GATE_NAME, round_result
from rackflow.clock import Clock
from rackflow.config import (
    ALERTMANAGER_TIMEOUT,
    PREFLIGHT_BATCH,
    PREFLIGHT_CONCURRENCY,
    PREFLIGHT_LEASE_SLACK,
    PREFLIGHT_POLL_INTERVAL,
)
from rackflow.domain.checks import (
    AlertmanagerSettings,
    CheckResult,
    Look,
    PreflightCheck,
    RackFacts,
    RackIdleSettings,
    Waiting,
    WebhookSettings,
    duration_of,
)
from rackflow.domain.tasks import Hold, Task
from rackflow.metrics import CHECK_HOLDS, CHECK_RESULTS
from rackflow.store import checks as store
from rackflow.store.db import Database
from rackflow.store.inventory import components_by_rack
from rackflow.tasks.manager import TaskManager

log = logging.getLogger(__name__)

# The gate wakes the checker from inside the claim, before the claim commits the task's hold, so the poll
# right after a wake may not see it yet: it polls again after 25, 50, 100 … ms (up to EAGER_UNTIL) until
# it finds one, so a task whose checks pass waits a round trip, not a poll interval.
EAGER_FIRST = 0.025
EAGER_UNTIL = 0.8


class PreflightChecker:
    """Runs rounds of checks until `stop` is set; `wake()` makes it poll now."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        manager: TaskManager,
        *,
        poll_interval: timedelta = PREFLIGHT_POLL_INTERVAL,
        concurrency: int = PREFLIGHT_CONCURRENCY,
        batch: int = PREFLIGHT_BATCH,
    ) -> None:
        self.db = db
        self.clock = clock
        self.manager = manager
        self.poll_interval = poll_interval
        self.batch = batch
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="preflight")
        self._asked = kinds.Asked(self._pool)
        self._wake = asyncio.Event()
        self._rounds: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            eager = 0.0  # after a wake: the next nap's length, doubling, while polls find nothing
            while not stop.is_set():
                started = 0
                try:
                    started = await self.poll()
                except Exception:  # an outage or a bug: report it and try again next poll
                    log.exception("pre-flight checker poll failed")
                if started or eager > EAGER_UNTIL:
                    eager = 0.0
                if await self._nap(stop, eager or self.poll_interval.total_seconds()):
                    eager = EAGER_FIRST
                elif eager:
                    eager *= 2
        finally:
            for running in self._rounds:
                running.cancel()
            await asyncio.gather(*self._rounds, return_exceptions=True)
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def poll(self) -> int:
        """Start a round for each due task (in the background); how many were started."""
        now = self.clock.now()
        async with self.db.read() as conn:
            due = await store.due(conn, GATE_NAME, now=now, limit=self.batch)
            if not due:
                return 0
            checks = await store.all_checks(conn)
            facts = await store.rack_facts(conn, {task.rack_id for task, _ in due})
            overridden = await store.overridden_checks(conn, {task.id for task, _ in due})
        for task, waiting in due:
            asked = [c for c in checks if c.id not in overridden.get(task.id, frozenset())]
            running = asyncio.create_task(self.round(task, waiting, asked, facts.get(task.rack_id)))
            self._rounds.add(running)
            running.add_done_callback(self._rounds.discard)
        return len(due)

    async def settle(self) -> None:
        """Wait for the rounds under way (tests)."""
        while self._rounds:
            await asyncio.gather(*list(self._rounds), return_exceptions=True)

    async def _nap(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep `seconds`, or until woken or stopped; whether it was woken."""
        waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        woken = self._wake.is_set()
        self._wake.clear()
        return woken

    async def round(
        self, task: Task, waiting: Waiting, checks: list[PreflightCheck], rack: RackFacts | None
    ) -> None:
        try:
            await self._round(task, waiting, checks, rack)
        except Exception:
            log.exception("task %s: pre-flight round failed; it is tried again when its lease ends", task.id)

    async def _round(
        self, task: Task, waiting: Waiting, checks: list[PreflightCheck], rack: RackFacts | None
    ) -> None:
        applying = [c for c in checks if rack is not None and c.applies(rack.ref, task.operation.kind)]
        longest = max((_timeout(c) for c in applying), default=timedelta(0))
        now = self.clock.now()
        async with self.db.transaction() as conn:
            if not await store.take_round(
                self.db, conn, GATE_NAME, waiting, now=now, until=now + longest + PREFLIGHT_LEASE_SLACK
            ):
                return  # it started meanwhile, or another instance's checker has it
        attempt = waiting.attempt + 1
        looks = await asyncio.gather(*(self._look(c, task, attempt, rack) for c in applying if rack))
        checked_at = self.clock.now()
        results = [
            round_result(task, check, attempt, look, checked_at)
            for check, look in zip(applying, looks, strict=True)
        ]
        for check, look in zip(applying, looks, strict=True):
            CHECK_RESULTS.labels(check=check.name, result="pass" if look.passed else "hold").inc()
        failing = [(c, r) for c, r in zip(applying, results, strict=True) if not r.passed]
        next_check_at = min((r.recheck_at for r in results), default=checked_at)
        async with self.db.transaction() as conn:
            if not await store.record_round(
                self.db, conn, GATE_NAME, task.id, attempt, results, next_check_at=next_check_at
            ):
                return  # no longer ours: the task started or was overridden, or our lease ran out
            if failing:
                # Until the first maximum wait runs out, when the claim's gate fails it: the next round
                # (this checker's, at `next_check_at`) releases it as soon as the checks pass.
                check, first = failing[0]
                hold = Hold(_deadline(task, failing, checked_at), first.reason)
                await store.hold_until(conn, GATE_NAME, task.id, hold, now=checked_at)
            else:
                await store.release(conn, GATE_NAME, task.id, "pre-flight checks passed", now=checked_at)
        if failing:
            CHECK_HOLDS.labels(check=failing[0][0].name).inc()
        else:
            self.manager.wake_executors()
        log.info(
            "task %s: pre-flight round %d: %s",
            task.id,
            attempt,
            failing[0][1].reason if failing else "passed",
            extra={"task_id": str(task.id)},
        )

    async def _look(self, check: PreflightCheck, task: Task, attempt: int, rack: RackFacts) -> Look:
        settings = check.settings
        try:
            if isinstance(settings, AlertmanagerSettings):
                return await kinds.alertmanager(settings, rack, self._asked)
            if isinstance(settings, WebhookSettings):
                async with self.db.read() as conn:
                    components = (await components_by_rack(conn, {task.rack_id}))[task.rack_id]
                wanted = set(task.component_ids)
                payload = kinds.webhook_payload(
                    check.name, task, attempt, rack, [c for c in components if c.id in wanted]
                )
                return await kinds.webhook(settings, payload, self._asked)
            return await self._rack_idle(settings, task)
        except Exception as exc:  # a bug in a look must hold the task, not start it
            log.exception("pre-flight check %s failed on task %s", check.name, task.id)
            return Look(False, f"{check.kind.value}: {type(exc).__name__}: {exc}")

    async def _rack_idle(self, settings: RackIdleSettings, task: Task) -> Look:
        async with self.db.read() as conn:
            busy = await store.busy_with(conn, task.rack_id, settings.busy_operations, besides=task.id)
            last = None
            if settings.failed_within:
                last = await store.last_finished(conn, task.rack_id, task.operation.kind, besides=task.id)
        return kinds.rack_idle(settings, busy, last, self.clock.now())


def _timeout(check: PreflightCheck) -> timedelta:
    if isinstance(check.settings, WebhookSettings):
        return duration_of(check.settings.timeout)
    if isinstance(check.settings, AlertmanagerSettings):
        return ALERTMANAGER_TIMEOUT
    return timedelta(0)


def _deadline(task: Task, failing: list[tuple[PreflightCheck, CheckResult]], now: datetime) -> datetime:
    """When the first failing check's maximum wait runs out (the gate fails the task at that claim)."""
    since = task.held_since if task.held_by == GATE_NAME and task.held_since is not None else now
    return min(since + check.max_wait_delta for check, _ in failing)
