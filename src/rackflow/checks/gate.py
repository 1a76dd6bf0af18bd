"""The start gate of pre-flight checks: a task starts only when every check that applies to it passed in
its last round, and that round is fresh (docs/CHECKS.md).

A gate of the executor's claim (`rackflow.tasks.gates`), after the freeze and budget gates, so checks are
asked only about tasks the windows and budgets admit. It runs inside the claim's transaction, so it asks
nothing outside the database: it reads what the checker (`rackflow.checks.checker`, a loop of every
`rackflow serve`) stored, or asks a check that only reads the database itself, and

* a task no check applies to starts (when no check exists, the gate's whole cost is one indexed read);
* a task whose checks all only read the database (`rack_idle`) and that needs a fresh look is asked here,
  in the claim, under its row's lock (issue 26: no second claim and no checker round per task): the
  answers are stored as its next round, as the checker stores its own, and it starts if all pass, or is
  held with the failing check's reason (the checker asks the next round after the interval), or fails
  past that check's maximum wait;
* any other task held for the first time is recorded as waiting (`preflight_tasks`), its first round due
  at once, and held "until re-check" with the reason "waits for pre-flight checks: …"; the checker
  releases it when the round passes, or holds it with the failing check's reason until the check's
  maximum wait ends (its next round, after the interval, releases it if the checks pass by then);
* a task whose last round all passed, still fresh, starts, unless a checker is asking its next round
  (that round is under way: the task waits for it) or that round was asked after the claim's `now` (it
  waits a moment: below); an operator's override of all its checks starts it too, and a check overridden
  for it alone counts as passed;
* a task whose checks still hold it after a check's `max_wait` (since the gate first held it,
  `Task.held_since`) fails, with that check's last reason.

Only first attempts are gated (as every gate), and two instances never start a task twice: the claim
already takes each task once. A claim and a checker's round of the same task happen one after the other
(a round the claim asks itself is written in the claim, with the start, and only when no checker's round
is under way): the checker takes and records a round only under the lock of the task's row while it is
still held (`store.take_rounds`, `store.record_rounds`), and the claim holds that lock from before this
gate reads the last round until it commits, so no round is asked about a task that a claim is starting,
and none is written after it started.
Each attempt of a task with retries (docs/SAFETY.md, "Retries") is checked anew: a round counts for
attempt n > 1 only if it was made since the gate first held that attempt, so the rounds that let an
earlier attempt start never start a later one.

A task never starts before the round that let it start: its start (`started_at`, and `attempt_started_at` for
a retry) is the claim's `now`, and a round from after that `now` does not start it (`_after_its_round`). The
claim reads its clock before its statement runs, and on PostgreSQL (READ COMMITTED) that statement sees
whatever committed before it began: a round the checker stamped (`checked_at`, when it asked) after that
reading and committed meanwhile (a slow round trip: the chaos soak's 132 ms delays) would otherwise start the
task, stamped before the round that let it (24 ms in the soak). The gate holds such a task until the round's
`checked_at` instead, and the next claim, whose `now` is at or after it (the claim takes no task held past its
`now`), starts it on the same round while fresh. That costs a comparison of what the gate read anyway, no
statement, in the common case; a hold and one more claim only in the race. Stamping the start at the round's
time instead would cost a write of the start (both columns, and the task the executor runs keeps its own for
the attempt's record) and, with another instance's checker whose clock runs ahead, record a start after the
executor's own clock, and so after a quick task's `finished_at`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.checks import kinds
from rackflow.config import PREFLIGHT_ANSWER_WAIT
from rackflow.domain.checks import (
    HELD_BY_CHECKS,
    CheckResult,
    Look,
    PreflightCheck,
    RackIdleSettings,
    Waiting,
)
from rackflow.domain.tasks import Fail, Hold, OperationKind, Task
from rackflow.domain.windows import RackRef
from rackflow.metrics import CHECK_HOLDS, CHECK_RESULTS, CHECK_WAIT
from rackflow.store import checks as store
from rackflow.store.db import Database
from rackflow.store.windows import rack_refs
from rackflow.tasks.gates import Verdict
from rackflow.validation import controls_escaped

log = logging.getLogger(__name__)

GATE_NAME = HELD_BY_CHECKS
# A task's reason while its last round's pass lets it be claimed (the checker's release).
PASSED = "pre-flight checks passed"


class PreflightGate:
    """Holds a task until the checks that apply to it pass; fails it when one gives up."""

    name = GATE_NAME

    def __init__(self, db: Database) -> None:
        self.db = db
        # Called (in the claim, before it commits) when tasks need a look: the checker of this process
        # polls at once rather than at its next interval.
        self.on_hold: list[Callable[[], None]] = []

    async def check(
        self, conn: AsyncConnection, tasks: Sequence[Task], now: datetime
    ) -> dict[uuid.UUID, Verdict]:
        checks = await store.all_checks(conn)  # one query, and the gate's whole cost when there is none
        if not checks:
            return {}
        # A check over every rack needs nothing of the rack: racks are read only for checks that name some.
        named = any(not c.all_racks for c in checks)
        racks = await rack_refs(conn, {task.rack_id for task in tasks}) if named else {}
        mine = {
            task.id: applies
            for task in tasks
            if (
                applies := [
                    c
                    for c in checks
                    if c.applies(racks.get(task.rack_id, RackRef(task.rack_id, None)), task.operation.kind)
                ]
            )
        }
        if not mine:
            return {}
        # One read of their rounds, and of what runs on their racks for the checks asked below (`_ask_here`).
        busy = _busy_operations(c for applying in mine.values() for c in applying)
        read = await store.gate_read(conn, mine.keys(), busy)
        waiting, found = read.waiting, read.results
        # Checks an operator overrode for one task count as passed for it.
        overridden = await store.overridden_checks(conn, read.with_overrides) if read.with_overrides else {}
        verdicts: dict[uuid.UUID, Verdict] = {}
        starting: list[tuple[Task, timedelta]] = []
        asking: list[tuple[Task, list[PreflightCheck], timedelta]] = []  # asked here, in claim order
        new: list[uuid.UUID] = []
        stale: list[uuid.UUID] = []
        for task in tasks:
            covering = mine.get(task.id)
            if covering is None:
                continue
            state = waiting.get(task.id)
            waited = now - task.held_since if task.held_by == self.name and task.held_since else timedelta(0)
            skipped = overridden.get(task.id, frozenset())
            applying = [c for c in covering if c.id not in skipped]
            if (state is not None and state.override_reason is not None) or not applying:
                starting.append((task, waited))
                continue
            if state is not None and state.checking_until is not None and state.checking_until > now:
                # A checker is asking its next round: the last one's pass may be about to turn into a hold.
                names = ", ".join(repr(c.name) for c in applying)
                reason = f"waits for pre-flight checks {names}: a round is under way"
                verdicts[task.id] = Hold(state.checking_until, reason, awaits_answer=True)
                continue
            by_check = {r.check_id: r for r in found.get(task.id, [])}
            # A look from before the check last changed, or before this attempt, does not count: the
            # check is asked again.
            since = _attempt_since(task, now)
            results = [(c, _current(by_check.get(c.id), c, since)) for c in applying]
            passed = [r for _, r in results if r is not None and r.passed and r.recheck_at > now]
            if state is not None and len(passed) == len(results):
                if (moment := _after_its_round(passed, now)) is not None:
                    verdicts[task.id] = moment
                else:
                    starting.append((task, waited))
                continue
            verdict = _hold_or_fail(task, results, waited, now)
            failing = [c for c, r in results if r is not None and not r.passed]
            if isinstance(verdict, Hold) and not failing and all(c.asks_only_the_database for c in applying):
                asking.append((task, applying, waited))  # its next round is asked below, not by the checker
                continue
            verdicts[task.id] = verdict
            if isinstance(verdict, Fail):
                CHECK_WAIT.observe(waited.total_seconds())
                continue
            if state is None:
                new.append(task.id)
            elif not failing:  # its last round is stale or incomplete: look again now
                stale.append(task.id)
        asked: set[uuid.UUID] = set()
        if asking:
            going = {t.id for t in tasks if t.id not in mine} | {t.id for t, _ in starting}
            decided = await self._ask_here(conn, asking, read, {t.id for t in tasks}, going, now)
            for task, _, waited in asking:
                if task.id in decided:
                    verdicts[task.id] = decided[task.id]
                else:
                    starting.append((task, waited))
                    asked.add(task.id)
        for task, waited in starting:
            if task.id not in verdicts and (task.held_by == GATE_NAME or task.id in asked):
                CHECK_WAIT.observe(waited.total_seconds())
        await store.start_waiting(conn, new)
        await store.check_again(conn, stale)
        if new or stale:
            for callback in self.on_hold:
                callback()
        return verdicts

    async def _ask_here(
        self,
        conn: AsyncConnection,
        asking: Sequence[tuple[Task, list[PreflightCheck], timedelta]],
        read: store.GateRead,
        claimed: Collection[uuid.UUID],
        going: Collection[uuid.UUID],
        now: datetime,
    ) -> dict[uuid.UUID, Verdict]:
        """Ask checks that only read the database (`rack_idle`) about these tasks now, in the claim, and
        record each task's answers as its next round, as the checker would have: a task whose checks all
        pass starts at this claim; one that fails is held with the failing check's reason (the checker asks
        its next round after the interval), or fails past the check's maximum wait. The verdicts of those
        that do not start.

        The claim already made every task it took RUNNING, so what runs on a rack is read with care: of
        the tasks this claim took (`claimed`), only those that start count, the ones no check stops
        (`going`) and those asked here before (claim order: as if it started them one by one), so two
        tasks that each are "busy" for the other never start together in one claim (one the rollout caps
        then hold back still counted: the mistake is a hold, asked again after the interval, never a
        start). Tasks other claims started count once those committed, as for the checker. What runs on
        the racks was read with their rounds (`store.gate_read`)."""
        wanted = {
            (task.rack_id, task.operation.kind)
            for task, applying, _ in asking
            if any(isinstance(c.settings, RackIdleSettings) and c.settings.failed_within for c in applying)
        }
        last = await store.last_finished_of(conn, wanted, besides=claimed) if wanted else {}
        started = set(going)
        verdicts: dict[uuid.UUID, Verdict] = {}
        rounds: list[tuple[Waiting | None, list[CheckResult]]] = []
        for task, applying, waited in asking:
            others = [
                other
                for other in read.running.get(task.rack_id, [])
                if other.task_id != task.id and (other.task_id not in claimed or other.task_id in started)
            ]
            state = read.waiting.get(task.id)
            attempt = (state.attempt if state is not None else 0) + 1
            results = []
            for check in applying:
                assert isinstance(check.settings, RackIdleSettings)  # `asks_only_the_database`
                look = kinds.rack_idle(
                    check.settings, others, last.get((task.rack_id, task.operation.kind)), now
                )
                results.append(round_result(task, check, attempt, look, now))
                CHECK_RESULTS.labels(check=check.name, result="pass" if look.passed else "hold").inc()
            rounds.append((state, results))
            if all(r.passed for r in results):
                started.add(task.id)
                continue
            verdicts[task.id] = verdict = _hold_or_fail(
                task, list(zip(applying, results, strict=True)), waited, now
            )
            if isinstance(verdict, Fail):
                CHECK_WAIT.observe(waited.total_seconds())
            else:
                CHECK_HOLDS.labels(check=next(r for r in results if not r.passed).check_name).inc()
        await store.record_rounds_in_claim(conn, rounds)
        if verdicts:
            log.info("pre-flight checks asked in the claim held or failed %d task(s)", len(verdicts))
        return verdicts


def _busy_operations(checks: Iterable[PreflightCheck]) -> set[OperationKind]:
    """The operations `rack_idle` checks among `checks` look for on a rack."""
    return {
        op for c in checks if isinstance(c.settings, RackIdleSettings) for op in c.settings.busy_operations
    }


def round_result(task: Task, check: PreflightCheck, attempt: int, look: Look, now: datetime) -> CheckResult:
    """A look as round `attempt`'s stored result: stale after the interval (or the other side's
    `retry_after`). The checker's rounds and the claim's are stored alike."""
    return CheckResult(
        task_id=task.id,
        check_id=check.id,
        check_name=check.name,
        attempt=attempt,
        passed=look.passed,
        # A hook's reason and an alert's labels come from outside: stored and shown with controls escaped.
        reason=controls_escaped(f"pre-flight check {check.name!r}: {look.reason}"),
        checked_at=now,
        recheck_at=now + (look.retry_after or check.interval_delta),
    )


def first_hold(task: Task, applying: Sequence[PreflightCheck], now: datetime) -> Verdict:
    """How a task is held for its first round of checks that ask over HTTP, whoever holds it (a claim's
    gate, or the checker's look ahead): "waits for pre-flight checks 'a', 'b'" until an answer comes, or
    PREFLIGHT_ANSWER_WAIT (then the claim asks the gate again)."""
    return _hold_or_fail(task, [(c, None) for c in applying], timedelta(0), now)


def _after_its_round(passed: Sequence[CheckResult], now: datetime) -> Hold | None:
    """The hold of a task whose fresh, passing last round (`passed`) was asked after the claim's `now`
    (the module's docstring): until that round's time, a moment; None when it may start at `now`."""
    latest = max(r.checked_at for r in passed)
    return Hold(latest, PASSED) if latest > now else None


def _current(result: CheckResult | None, check: PreflightCheck, since: datetime | None) -> CheckResult | None:
    if result is None or result.checked_at < check.updated_at:
        return None
    return result if since is None or result.checked_at >= since else None


def _attempt_since(task: Task, now: datetime) -> datetime | None:
    """Since when a round counts for the task's current attempt: any round for its first; for a retry, a
    round made since the gate first held this attempt (`held_since` while the gate holds it), and none yet
    at the attempt's first claim (it still says what held it last: its back-off)."""
    if task.attempt == 1:
        return None
    return task.held_since if task.held_by == GATE_NAME and task.held_since is not None else now


def _hold_or_fail(
    task: Task,
    results: Sequence[tuple[PreflightCheck, CheckResult | None]],
    waited: timedelta,
    now: datetime,
) -> Verdict:
    """Hold until the next look (or the first maximum wait to run out, whichever is first), or fail with
    the reason of the first failing check that gave up."""
    failing = [(c, r) for c, r in results if r is not None and not r.passed]
    for check, result in failing:
        if waited >= check.max_wait_delta:
            return Fail(f"{result.reason} (pre-flight check {check.name!r} gave up after {check.max_wait})")
    if not failing:
        patience = min(results, key=lambda pair: pair[0].max_wait_delta)[0]
        if waited >= patience.max_wait_delta:
            last = task.held_reason or "no answer"
            return Fail(f"{last} (pre-flight check {patience.name!r} gave up after {patience.max_wait})")
        names = ", ".join(repr(c.name) for c, _ in results)
        until = now + min(PREFLIGHT_ANSWER_WAIT, patience.max_wait_delta - waited)
        reason = (
            task.held_reason
            if task.held_by == GATE_NAME and task.held_reason
            else f"waits for pre-flight checks {names}"
        )
        return Hold(until, reason, awaits_answer=True)  # the executor keeps the task's slot meanwhile
    # The checker's next round releases it if the checks pass; else the first maximum wait fails it.
    deadline = min(now + (c.max_wait_delta - waited) for c, _ in failing)
    return Hold(deadline, failing[0][1].reason)
