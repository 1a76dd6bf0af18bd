"""The pre-flight checker: a loop in every `rackflow serve` that asks the checks about the tasks their gate
holds, and stores what they answered for the gate to read (docs/CHECKS.md).

Each poll (every PREFLIGHT_POLL_INTERVAL, at once when this process's gate held a task for a first look, and
at most every NUDGE_GAP while its executor ends tasks; later, bounded, while its dispatcher fires: below)
finds the held tasks whose next round is due and starts a round for each, in the background, so a slow hook
delays no other rack and never the dispatcher or the executor, and looks ahead (below): one read for both
(the checks, racks and components read once) and one transaction that takes every round it found. A round:

1. takes a lease on the task's next round (`store.take_rounds`: only if the round read under the task row's
   lock is still the one due and no other lease holds it; one transaction, and one UPDATE, for all the
   rounds a poll found due): of several instances, one asks; a checker that dies mid-round is replaced
   when its lease runs out;
2. asks every check that applies, at once, outside any transaction (at most PREFLIGHT_CONCURRENCY HTTP
   requests at once in the process, each with its timeout, and of those at most ALERTMANAGER_CONCURRENCY
   GETs to one Alertmanager, for every check that asks it); an Alertmanager check asks once for all the
   rounds of its poll where it can, else once per distinct query (`kinds.Answers`, docs/CHECKS.md), and
   asks again within the round a GET Alertmanager refuses as busy (`kinds.BUSY_RETRY`);
3. stores the results as round `attempt` and, in the same transaction, lets the task be claimed at once if
   all passed (the claim's gate then starts it), or holds it with the first failing check's reason
   (written on the task: `held_reason`, its message, `rackflow task show`, the pages) until that check's
   maximum wait runs out; the next round, due after the interval (or the hook's `retry_after`), releases
   it if the checks pass by then. So a held task costs no claims while it waits. The rounds that end
   while one such transaction is under way are stored together in the next (`GroupCommit`), which wakes
   the executors once for all the tasks it released: many tasks due at once cost a few transactions, not
   two each (issue 26).

Checks that only read the database (`rack_idle`) are mostly asked by the claim's gate itself, at the
task's first claim (`rackflow.checks.gate`); the checker asks them for a task they held, at its next round.

**The look ahead** (issue 26). A task's first claim needs a free slot of the executor like the claim that
starts it, so with a full executor every slot that freed would go to a task not asked yet, held there, and
sit empty for a round trip of the checker. So each poll also takes the first round of the tasks next in
line that no claim has taken yet (`_next_in_line`): of the next tasks the claims will take
(`store.queue_head`, those asked and not started counted), as many as the executor of this process ended in
the last PREFLIGHT_LOOK_AHEAD (the slots about to free, at the pace tasks end; none while nothing ends, so a
queue behind long tasks is not asked hours early), those whose checks ask over HTTP and that the gates
before this one would let start now (`rackflow.tasks.gates.look`: no freeze, room in the budgets, counting
the tasks before them as started). The gate then holds each as its first claim would (`first_hold`), with
its round taken in the same transaction (`store.ask_ahead`, in the poll's one with the due rounds); the
round is asked and recorded as any. Its pass counts for one interval, as every round's; the claim that
finds it stale asks again, and a claim still asks every gate, so nothing starts that the gates or a fresh
round would not start.

**Yielding to the firing pass** (issue 26). The checker shares the event loop with its process's
dispatcher. When many schedules fire at once (300 crons at one minute), the executor's first claims hold
every new task for a round, and the checker's polls, rounds (their payloads, signatures and HTTP in the
thread pool) and records took a third of the loop while the dispatcher was still firing: fire lag moved.
So while the dispatcher of this process fires (`firing`: schedules claimed and not yet written back, or
more due), a poll waits for the pass to end, at most PREFLIGHT_YIELD past when it would have polled, then
polls anyway: during a long drain the checker still polls about once per PREFLIGHT_YIELD (up to
PREFLIGHT_BATCH rounds each), so no check starves. Nothing else changes: the rounds are taken, asked and
recorded as before, under the same locks; a task held meanwhile only waits a little longer for its round.

**Idle** (docs/PERFORMANCE.md, "An idle server"). A poll that takes nothing is followed by a look at when
the first held task's round comes due (`store.next_round_at`), and the checker sleeps until then (never
less than the poll interval, so no round is taken later than a poll every interval would take it), at most
PREFLIGHT_IDLE_INTERVAL, which is also its pause while no task is held at all. A round becomes due sooner
only by a write that holds a task for its first round or asks for a round now (a claim's gate, a check
changed: `store.ROUND_DUE`), which wakes the checker of the process that wrote it once it committed, as the
gate's own wake did before it committed. While tasks end (the look ahead) or rounds are taken it polls
every interval, as before. Other instances' checkers find a round at their next look: what bounds taking
over a round whose instance stopped (its lease, PREFLIGHT_LEASE_SLACK, is longer anyway).
"""

from __future__ import annotations

import asyncio
import logging
import traceback
import uuid
from collections.abc import Callable, Collection, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import logs
from rackflow.checks import kinds
from rackflow.checks.gate import GATE_NAME, PASSED, first_hold, round_result
from rackflow.clock import Clock
from rackflow.config import (
    ALERTMANAGER_TIMEOUT,
    PREFLIGHT_BATCH,
    PREFLIGHT_CONCURRENCY,
    PREFLIGHT_IDLE_INTERVAL,
    PREFLIGHT_LEASE_SLACK,
    PREFLIGHT_POLL_INTERVAL,
    PREFLIGHT_YIELD,
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
from rackflow.domain.inventory import Component
from rackflow.domain.tasks import Hold, Task
from rackflow.metrics import CHECK_HOLDS, CHECK_RESULTS
from rackflow.store import checks as store
from rackflow.store.db import Database
from rackflow.store.group_commit import GroupCommit
from rackflow.store.inventory import components_by_rack
from rackflow.store.tasks import get_tasks
from rackflow.tasks import gates as start_gates
from rackflow.tasks.gates import Gate
from rackflow.tasks.manager import TaskManager

log = logging.getLogger(__name__)

# The gate wakes the checker from inside the claim, before the claim commits the task's hold, so the poll
# right after a wake may not see it yet: it polls again after 25, 50, 100 … ms (up to EAGER_UNTIL) until
# it finds one, so a task whose checks pass waits a round trip, not a poll interval.
EAGER_FIRST = 0.025
EAGER_UNTIL = 0.8
# The executor's endings nudge the checker to look ahead: at most one poll this often for them.
NUDGE_GAP = 0.1
# While yielding to the firing pass, the checker looks this often whether it ended.
YIELD_STEP = 0.01


class PreflightChecker:
    """Runs rounds of checks until `stop` is set; `wake()` makes it poll now."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        manager: TaskManager,
        *,
        poll_interval: timedelta = PREFLIGHT_POLL_INTERVAL,
        idle_interval: timedelta = PREFLIGHT_IDLE_INTERVAL,
        concurrency: int = PREFLIGHT_CONCURRENCY,
        batch: int = PREFLIGHT_BATCH,
        ahead: Callable[[], int] | None = None,
        gates: Sequence[Gate] = (),
        firing: Callable[[], bool] | None = None,
        yield_for: timedelta = PREFLIGHT_YIELD,
    ) -> None:
        """`ahead`: how many tasks the executor of this process is about to claim (the look ahead asks
        about so many next in line; None: no look ahead); `gates`: the executor's start gates before the
        pre-flight gate, which must let a task start for it to be asked ahead; `firing`: whether the
        dispatcher of this process is firing (a poll waits for it, at most `yield_for`; None: never)."""
        self.db = db
        self.clock = clock
        self.manager = manager
        self.poll_interval = poll_interval
        self.idle_interval = idle_interval
        self.batch = batch
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="preflight")
        self._asked = kinds.Asked(self._pool)
        self._wake = asyncio.Event()
        self._nudge = asyncio.Event()  # `tasks_ended`
        self._polled_at = 0.0  # when the last poll began (the event loop's clock)
        self._rounds: set[asyncio.Task[None]] = set()
        # The rounds' records, written together: those that end while one transaction is under way go in
        # the next, one transaction (and one wake of the executors) for many.
        self._records: GroupCommit[_Record, bool] = GroupCommit(
            db, self._write_records, after_commit=self._after_records
        )
        self._released = False  # by the records being written
        self._answered: list[uuid.UUID] = []  # the tasks whose rounds the records being written recorded
        # Told, once records committed, which tasks' rounds they recorded (the executor of this process:
        # a task it held for its first round keeps a slot until then).
        self.on_answered: list[Callable[[Collection[uuid.UUID]], None]] = []
        self.ahead = ahead
        self.gates = tuple(gates)
        self._hooks = True  # whether the last look ahead found checks that ask over HTTP
        self.firing = firing
        self.yield_for = yield_for

    def wake(self) -> None:
        self._wake.set()

    def tasks_ended(self) -> None:
        """The executor ended tasks (slots free): poll soon, for a look ahead, if there are checks to ask.
        A nudge, not a wake: its transaction committed, so one poll sees what it freed (no eager polls
        after it), and nudges poll at most every NUDGE_GAP (an executor ends tasks many times a second)."""
        if self.ahead is not None and self._hooks:
            self._nudge.set()

    async def run(self, stop: asyncio.Event) -> None:
        woken_by = self.db.on_commit.setdefault(store.ROUND_DUE, [])
        woken_by.append(self.wake)
        try:
            eager = 0.0  # after a wake: the next nap's length, doubling, while polls find nothing
            while not stop.is_set():
                started = 0
                await self._yield_to_firing(stop)
                if stop.is_set():
                    break
                self._polled_at = asyncio.get_running_loop().time()
                try:
                    started = await self.poll()
                except Exception:  # an outage or a bug: report it and try again next poll
                    logs.failed(log, "pre-flight checker poll failed", then="; retrying")
                if started or eager > EAGER_UNTIL:
                    eager = 0.0
                if await self._nap(stop, eager or await self._pause(started)):
                    eager = EAGER_FIRST
                elif eager:
                    eager *= 2
        finally:
            woken_by.remove(self.wake)
            for running in self._rounds:
                running.cancel()
            await asyncio.gather(*self._rounds, return_exceptions=True)
            await self._records.close()
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def poll(self) -> int:
        """Take the next round of each due task and, looking ahead, the first round of the tasks next in
        line, all in one transaction, and ask each (in the background): how many rounds were taken. One
        read for both, with the checks, the racks and their components read once (issue 26: the loop's
        own work for the checks, a poll every few ticks while tasks end, was what slowed a drain)."""
        now = self.clock.now()
        # In a transaction: the look at the queue's head walks it in its order with planner settings local
        # to one (`store.queue_head`), which an autocommit read would drop after their own statement.
        async with self.db.read(in_transaction=True) as conn:
            due = await store.due(conn, GATE_NAME, now=now, limit=self.batch)
            wanted = min(self.ahead(), self.batch) if self.ahead is not None else 0
            if not due and wanted <= 0:
                return 0
            checks = await store.all_checks(conn)
            fresh = await self._next_in_line(conn, checks, wanted, now)
            facts = await store.rack_facts(
                conn, {task.rack_id for task, _ in due} | {t.rack_id for t in fresh}
            )
            overridden = await store.overridden_checks(conn, {task.id for task, _ in due})
            # The due rounds (their waiting row), then the first rounds the look ahead takes (None).
            rounds: list[tuple[Task, Waiting | None, list[PreflightCheck]]] = [
                (task, waiting, _applying(checks, task, facts.get(task.rack_id), overridden.get(task.id, ())))
                for task, waiting in due
            ]
            for task in fresh:
                rack = facts.get(task.rack_id)
                applying = _applying(checks, task, rack)
                # Checks that only read the database are asked by the claim itself, at once: not ahead.
                if rack is not None and any(not c.asks_only_the_database for c in applying):
                    rounds.append((task, None, applying))
            if not rounds:
                return 0
            components = await _components(conn, [(task, applying) for task, _, applying in rounds])
        now = self.clock.now()
        leases: list[tuple[Waiting, datetime]] = []
        asks: dict[uuid.UUID, tuple[Hold, datetime]] = {}
        taken: list[_Round] = []
        answers = kinds.Answers(self._asked)  # the poll's: one query of Alertmanager per URL for its rounds
        for task, waiting, applying in rounds:
            each = _Round(
                task,
                waiting or Waiting(task.id, 0, None, None, None),
                applying,
                facts.get(task.rack_id),
                components.get(task.rack_id, []),
                _lease_end(applying, now),
                answers,
            )
            if waiting is not None:
                leases.append((waiting, each.leased_until))
            else:
                hold = first_hold(task, applying, now)
                if not isinstance(hold, Hold):
                    continue  # a check that waits for nothing: its claim fails the task
                asks[task.id] = (hold, each.leased_until)
            taken.append(each)
        if not taken:
            return 0
        async with self.db.transaction() as conn:
            ids = await store.take_rounds(self.db, conn, GATE_NAME, leases, now=now) if leases else set()
            ahead = await store.ask_ahead(self.db, conn, GATE_NAME, asks, now=now) if asks else set()
        self._start([r for r in taken if r.task.id in ids | ahead], answers)
        if ahead:
            log.info("pre-flight checks asked ahead of the claim for %d task(s)", len(ahead))
        return len(ids) + len(ahead)

    async def _next_in_line(
        self, conn: AsyncConnection, checks: Sequence[PreflightCheck], wanted: int, now: datetime
    ) -> list[Task]:
        """The look ahead's tasks (the module's docstring): of the next `wanted` in line, those not asked
        yet that the gates before this one would let start now."""
        self._hooks = any(not c.asks_only_the_database for c in checks)
        if wanted <= 0 or not self._hooks:
            return []
        head = await store.queue_head(conn, GATE_NAME, now=now, limit=wanted)
        if all(asked for _, asked in head):
            return []
        # In claim order, the ones asked before counted too: a budget's room is counted as if each task
        # started in turn.
        admitted = {t.id for t in await start_gates.look(self.gates, conn, [t for t, _ in head], now)}
        fresh = [t.id for t, asked in head if not asked and t.id in admitted]
        found = {task.id: task for task in await get_tasks(conn, fresh)}
        return [found[task_id] for task_id in fresh if task_id in found]  # in the head's (claim) order

    def _start(self, rounds: Sequence[_Round], answers: kinds.Answers) -> None:
        """Ask the rounds taken, each in the background; once they are all over, say what a busy
        Alertmanager's refusals came to in them, once for the poll (`Answers.say_busy`)."""
        started = [self._background(self.round(each)) for each in rounds]

        async def then_say_busy() -> None:
            await asyncio.gather(*started, return_exceptions=True)
            answers.say_busy()

        self._background(then_say_busy())

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """`work` run as a task the checker waits for (`settle`) and cancels when it stops."""
        running = asyncio.create_task(work)
        self._rounds.add(running)
        running.add_done_callback(self._rounds.discard)
        return running

    async def settle(self) -> None:
        """Wait for the rounds under way (tests)."""
        while self._rounds:
            await asyncio.gather(*list(self._rounds), return_exceptions=True)

    async def _yield_to_firing(self, stop: asyncio.Event) -> None:
        """Wait while this process's dispatcher fires, at most `yield_for` (the module's docstring)."""
        if self.firing is None or not self.firing():
            return
        loop = asyncio.get_running_loop()
        until = loop.time() + self.yield_for.total_seconds()
        while self.firing() and not stop.is_set():
            left = until - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(YIELD_STEP, left))

    async def _pause(self, started: int) -> float:
        """How long to sleep after a poll that took `started` rounds, unless woken or nudged: the poll
        interval while rounds were taken, tasks end (the look ahead) or a round comes due within it; else
        until the first round comes due, at most `idle_interval`, which is also the pause while no task is
        held at all (the module's docstring, "Idle")."""
        interval = self.poll_interval.total_seconds()
        if started or (self.ahead is not None and self.ahead() > 0):
            return interval
        try:
            async with self.db.read() as conn:
                at = await store.next_round_at(conn, GATE_NAME, now=self.clock.now())
        except Exception:  # an outage: the poll reports it
            return interval
        if at is None:
            return self.idle_interval.total_seconds()
        until = (at - self.clock.now()).total_seconds()
        return interval if until <= interval else min(until, self.idle_interval.total_seconds())

    async def _nap(self, stop: asyncio.Event, seconds: float) -> bool:
        """Sleep `seconds`, or until woken or stopped, or nudged (`tasks_ended`) once NUDGE_GAP has passed
        since the last poll began; whether it was woken (not nudged)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while not stop.is_set() and not self._wake.is_set():
            if self._nudge.is_set():
                until = min(until, self._polled_at + NUDGE_GAP)
            left = until - loop.time()
            if left <= 0:
                break
            waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
            if not self._nudge.is_set():
                waiters.append(asyncio.ensure_future(self._nudge.wait()))
            try:
                await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
        woken = self._wake.is_set()
        self._wake.clear()
        self._nudge.clear()
        return woken

    async def round(self, taken: _Round) -> None:
        try:
            await self._round(taken)
        except Exception:
            log.exception(
                "task %s: pre-flight round failed; it is tried again when its lease ends", taken.task.id
            )

    async def _round(self, taken: _Round) -> None:
        """Ask the round taken (its lease held) and record what it found with the other rounds that end
        meanwhile (one transaction for them all)."""
        task, rack = taken.task, taken.rack
        attempt = taken.waiting.attempt + 1
        # Stamped when asked, not when answered: a look asked under a check's old settings must read as
        # older than the check's change (the gate counts no result from before it), however long it took.
        checked_at = self.clock.now()
        looks = await asyncio.gather(
            *(self._look(c, task, attempt, rack, taken) for c in taken.checks if rack)
        )
        results = [
            round_result(task, check, attempt, look, checked_at)
            for check, look in zip(taken.checks, looks, strict=True)
        ]
        for check, look in zip(taken.checks, looks, strict=True):
            CHECK_RESULTS.labels(check=check.name, result="pass" if look.passed else "hold").inc()
        failing = [(c, r) for c, r in zip(taken.checks, results, strict=True) if not r.passed]
        hold = Hold(_deadline(task, failing, checked_at), failing[0][1].reason) if failing else None
        record = _Record(task.id, attempt, results, hold, checked_at, taken.leased_until)
        if not await self._records.write(record):
            return  # no longer ours: the task started or was overridden, or our lease ran out
        if failing:
            CHECK_HOLDS.labels(check=failing[0][0].name).inc()
        unanswered = [r.reason for r, look in zip(results, looks, strict=True) if look.unanswered]
        if unanswered and not failing:
            # A fail-open check let the rack through on no answer: what an operator must hear of.
            log.warning(
                "task %s: pre-flight round %d passed without an answer: %s",
                task.id,
                attempt,
                "; ".join(unanswered),
                extra={"task_id": str(task.id)},
            )
        else:
            log.info(
                "task %s: pre-flight round %d: %s",
                task.id,
                attempt,
                failing[0][1].reason if failing else "passed",
                extra={"task_id": str(task.id)},
            )

    async def _write_records(self, conn: AsyncConnection, records: Sequence[_Record]) -> list[bool]:
        """Store each round's results and, in the same transaction, release its task if all passed or hold
        it with the first failing check's reason until the first maximum wait runs out (when the claim's
        gate fails it; the next round, at its first result's `recheck_at`, releases it as soon as the
        checks pass). Whether each was still ours. A few statements for all the records (`record_rounds`
        moves every round's row on in one), but one per hold."""
        ours = await store.record_rounds(
            self.db,
            conn,
            GATE_NAME,
            [
                store.Round(
                    r.task_id,
                    r.attempt,
                    r.results,
                    min((found.recheck_at for found in r.results), default=r.checked_at),
                    r.leased_until,
                )
                for r in records
            ],
        )
        self._answered = list(ours)
        passed = [r for r in records if r.task_id in ours and r.hold is None]
        for record in sorted(records, key=lambda r: r.task_id):
            if record.task_id in ours and record.hold is not None:
                await store.hold_until(conn, GATE_NAME, record.task_id, record.hold, now=record.checked_at)
        if passed:
            latest = max(r.checked_at for r in passed)
            await store.release(conn, GATE_NAME, [r.task_id for r in passed], PASSED, now=latest)
            self._released = True
        return [r.task_id in ours for r in records]

    def _after_records(self) -> None:
        """Once a transaction of records committed: say which tasks were answered, and one wake of the
        executors for all it released."""
        answered, self._answered = self._answered, []
        for callback in self.on_answered:
            callback(answered)
        if self._released:
            self._released = False
            self.manager.wake_executors()

    async def _look(
        self,
        check: PreflightCheck,
        task: Task,
        attempt: int,
        rack: RackFacts,
        taken: _Round,
    ) -> Look:
        settings = check.settings
        try:
            if isinstance(settings, AlertmanagerSettings):
                return await kinds.alertmanager(settings, rack, taken.answers, task_id=task.id)
            if isinstance(settings, WebhookSettings):
                wanted = set(task.component_ids)
                payload = kinds.webhook_payload(
                    check.name, task, attempt, rack, [c for c in taken.components if c.id in wanted]
                )
                return await kinds.webhook(settings, payload, self._asked)
            return await self._rack_idle(settings, task)
        except Exception as exc:  # a bug in a look must hold the task, not start it
            # The traceback as `log.exception` writes it, but its exceptions' words (a cause's too) may
            # quote the URL asked, token and all: they are logged as a held task's reason is, hidden.
            urls = kinds.asked_urls(settings, rack)
            trace = kinds.scrubbed("".join(traceback.format_exception(exc)).rstrip("\n"), *urls)
            log.error("pre-flight check %s failed on task %s\n%s", check.name, task.id, trace)
            return Look(False, f"{check.kind.value}: {type(exc).__name__}: {kinds.scrubbed(str(exc), *urls)}")

    async def _rack_idle(self, settings: RackIdleSettings, task: Task) -> Look:
        async with self.db.read() as conn:
            running = await store.running_on(conn, {task.rack_id}, settings.busy_operations)
            busy = [other for other in running.get(task.rack_id, []) if other.task_id != task.id]
            last = None
            if settings.failed_within:
                last = await store.last_finished(conn, task.rack_id, task.operation.kind, besides=task.id)
        return kinds.rack_idle(settings, busy, last, self.clock.now())


@dataclass(frozen=True)
class _Round:
    """A due task's next round: the checks that apply to it (but those overridden for it), its rack, its
    rack's components when a hook is asked (the hook is told those in the task's scope), and the answers of
    Alertmanager its poll's rounds share (`kinds.Answers`)."""

    task: Task
    waiting: Waiting
    checks: list[PreflightCheck]
    rack: RackFacts | None
    components: Sequence[Component]
    leased_until: datetime  # the lease this checker takes on the round (`_lease_end`), its fence
    answers: kinds.Answers


def _lease_end(checks: Sequence[PreflightCheck], now: datetime) -> datetime:
    """Until when a checker that takes a round of `checks` at `now` holds it: the longest timeout, and
    some. The end is also the round's fence: a checker whose lease ran out, and was taken over (a new
    end), records nothing (`store.record_rounds`)."""
    return now + max((_timeout(c) for c in checks), default=timedelta(0)) + PREFLIGHT_LEASE_SLACK


@dataclass(frozen=True)
class _Record:
    """What a round found, to store: its results, and the hold if one failed (None: release the task)."""

    task_id: uuid.UUID
    attempt: int
    results: list[CheckResult]
    hold: Hold | None
    checked_at: datetime
    leased_until: datetime


def _applying(
    checks: Sequence[PreflightCheck],
    task: Task,
    rack: RackFacts | None,
    overridden: Collection[uuid.UUID] = frozenset(),
) -> list[PreflightCheck]:
    """The checks that apply to `task` on its rack (none if the rack is gone), but those overridden."""
    if rack is None:
        return []
    return [c for c in checks if c.id not in overridden and c.applies(rack.ref, task.operation.kind)]


async def _components(
    conn: AsyncConnection, rounds: Sequence[tuple[Task, Sequence[PreflightCheck]]]
) -> dict[uuid.UUID, list[Component]]:
    """The components of the racks of the rounds that ask a hook (a hook is told them): one query for
    every round, not once per hook and task (building that statement cost the event loop more than the
    HTTP)."""
    hooked = {
        task.rack_id
        for task, checks in rounds
        if any(isinstance(c.settings, WebhookSettings) for c in checks)
    }
    return await components_by_rack(conn, hooked) if hooked else {}


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
