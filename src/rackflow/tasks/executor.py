"""The executor: runs tasks in every rackflow process, and makes sure none is lost with a process.

Design note, why a task runs to an end exactly once at a time and never stays RUNNING forever:

* Claim. One statement picks several PENDING tasks at once and locks their rows (`SELECT … FOR UPDATE SKIP
  LOCKED` on PostgreSQL; SQLite's single writer needs no lock: `task_runs.pick`); once their steps are planned
  over their racks' components, one UPDATE marks them RUNNING with this instance as `owner_id`, with each
  one's first progress message (`task_runs.start`: a task's claim and that message are one version of its
  row), so no two instances take one. In the same transaction the start gates
  the executor was built with (`rackflow.tasks.gates`: freezes, operation budgets, …) hand back what they
  hold, as if never claimed, or fail what they refuse, recording each refusal on its task in that
  transaction (`Task.refusal`). A takeover is not gated again (it began), but a refused task stays
  refused: its takeover ends it with the recorded refusal instead of running it.
* Lease. The instance's heartbeat row (`store/instances.py`), renewed every `lease_ttl / 3` and compared on
  the database clock, is the lease on every task it owns. A RUNNING task whose owner's heartbeat is older
  than `lease_ttl`, or gone, is claimed by any instance (takeover, one more claim). Steps are idempotent,
  so repeating the ones a dead owner may have done is safe; after `MAX_ATTEMPTS` claims the task fails.
  A step that is not idempotent by itself (a redfish restart) records, before it acts, what lets its
  repeat tell whether it acted (`StepState`, kept per task, attempt and component: `task_step_state`);
  the claim that takes a task over reads the attempt's records back for its steps.
* Retries. A task with a retry policy whose attempt failed with only retryable step failures
  (`StepFailed.retryable`), and has attempts left, is not ended: the same fenced write that would end it
  sends it back to PENDING with the next attempt number, held by "retry" until its back-off ends
  (`task_runs.retry_later`). The ordinary claim then starts the next attempt, through the start gates
  (pre-flight checks run again for it), on whichever instance claims it first, so an attempt starts once.
  Each ended attempt is recorded (`task_attempt`); the task's final failure, and its "task failed"
  notification, come only with its last attempt.
* Slots kept for answers. A task a gate holds only until an answer it asked for comes (a first round of
  pre-flight checks: `Hold.awaits_answer`) keeps its slot in the executor that held it, as if it ran,
  until its hold is answered (released or held anew) or ends. Otherwise a held task would free its slot
  at once, and a burst of new tasks would be claimed, held and asked about as fast as the dispatcher
  made them, however few the executor could start (issue 26: its hooks' rounds took the event loop the
  dispatcher fires from). The checker of this process says which it answered (`answered`); an answer
  another instance's checker records is found by reading the holds back (`not_before` rewritten), at
  most once a poll interval, not at every wake (a burst wakes the executor at every batch fired). The
  count is this process's own, a bound on work, not a guarantee.
* Lock order: a run's row, then racks', then tasks' (and a run's before its schedule's, below). Whatever
  waits for a row lock waits in that order (a window's change: runs, racks, then task rows skipping held
  ones, `tasks.deferrals`; a rollout's cancel
  likewise; its step: the run, then the racks it submits to; CancelTask: its task's rack, then the task;
  DeleteRack: the runs of its tasks, whose rows it writes, then its rack, `InventoryService.delete_rack`). A
  journal round locks the racks of the tasks it ends (`FOR NO KEY UPDATE`, in id order, as every change to
  which tasks of a rack may run: a submit, CancelTask, a promotion; `store.tasks.lock_racks`), writes its own
  running tasks' rows or locks them as a write would (`FOR NO KEY UPDATE`, `task_runs.fence`), claims (`FOR
  UPDATE SKIP LOCKED`), and then its start gates lock what they decide by: the budget rows (in id order; only
  claims and budget changes take them, and neither waits for anything else while holding one), then the
  claimed tasks' rollout runs, out of order and so never waited for: taken only when free (`FOR UPDATE SKIP
  LOCKED`), a task of a run another transaction holds is held until the next claim
  (`rollouts.gate`). The claim may write its task rows again (a gate's hold or refusal, a hold cleared), and
  PostgreSQL checks a row's foreign key again whenever the transaction that wrote it writes it again, key
  changed or not: each such write takes `FOR KEY SHARE` on the task's rack, after the task's row. The
  racks' `FOR NO KEY UPDATE` never blocks that; only a rack an inventory change locks whole
  (`FOR UPDATE`: DeleteRack, RemoveComponent, a domain's or a scope's change) does, and none of those waits
  for a row a claim holds (DeleteRack refuses a rack with active tasks first). So CancelTask waits for the
  claim of its task to commit, never the reverse, and a run's holder that waits for a rack a round holds waits
  for a round that waits for no run. A writer that holds a run's row (a rollout step and its halt, a resume, a
  cancel, a window's creation, edit or deletion) never waits for a task's row: it skips the tasks a claim
  holds (`store.tasks.unclaimed`, `store.tasks.lock_not_begun`), and that claim's rollout gate decides them
  (at that claim if the writer committed first, else at the next; a window's change lets go of a freeze's hold
  on such a task after it committed, in a transaction that holds nothing else:
  `windows.gate.let_go_of_freezes`, and should it not live to, every executor's look again does,
  `FreezeGate.look_again`; and it decides again the end of a task it skipped once that claim committed,
  `tasks.deferrals`: the claim checks a task's `not_after` as stored on the row it took, `_prepare`, never
  the windows; it records that decision as owed in its transaction, and should it not live to make it,
  every executor's look again does, `Deferrals.look_again`, a `Backstop`, before its first claim). Before
  any row, a window's change takes the window edits' turn (`store.windows.edits_in_turn`, an advisory lock
  on PostgreSQL), and a firing's submit and a rollout's step its shared form (`store.windows.beside_edits`,
  the step before its runs' rows): only those take it, each first in its transaction, so none waits for it
  while holding a row. Any
  other way round, PostgreSQL would abort one of two such transactions as a deadlock
  (tests/store/test_claim_lock_order.py, test_rollout_lock_order.py, test_window_lock_order.py).
  A run's row comes before its schedule's, in every transaction that takes both: a retry of a run, a rollout's
  halt (which pauses the schedule), an approval, a resume or cancel, and a firing's write-back (its
  failing-streak marks check the schedule's key, `FOR KEY SHARE`; its run cap lowers the schedule's count)
  lock the run first; DeleteSchedule locks every run of the schedule, in id order, before the schedule its
  cascade deletes them with (`ScheduleService.delete`), and DeleteRack the runs of its tasks before the
  schedules it stamps (`scope_removals`). A firing's submit (a dispatched batch's, a trigger's, a retry's)
  holds its schedules' keys (`FOR KEY SHARE`, `store.schedules.hold_schedules`), before it locks racks, until
  it commits, so a DeleteSchedule comes wholly before it or after it; the dispatcher's sweep of abandoned runs
  locks them in id order too, before it marks them (`store.dispatch.mark_abandoned_runs`). Scope rows come
  after the schedule's, as the scope RPCs and DeleteSchedule's cascade take them: the write-back and a
  rollout's step write their scopes' last tasks last (`schedules.firing`, `rollouts.service`). What writes
  runs while it holds their schedule (a firing's claim, a manual trigger, a retry's new run) never waits for a
  run's row there: its cap deletes only the old runs no one holds (`store.runs.prune_runs`, `FOR UPDATE SKIP
  LOCKED`), and a run it records is new (tests/store/test_schedule_lock_order.py). A schedule's row comes
  before racks', and what holds a rack never waits for a schedule's row lock, only checks its key. The writers
  that may hold a schedule while they wait for a rack, or hold a rack when they lock a schedule, keep its key
  and lock it `FOR NO KEY UPDATE` (`store.schedules.key_kept`: the scope RPCs, and with them pause, resume,
  update, trigger and retry, `ScheduleService._load`; DeleteRack's and RemoveComponent's stamps,
  `scope_removals`; a halt's pause), which a row written that names the schedule (a failing-streak mark, `FOR
  KEY SHARE`) does not wait for. `FOR UPDATE` is left to DeleteSchedule (and a rename's UPDATE), the
  dispatcher's claim (`SKIP LOCKED`) and its look-up in doubt (`NOWAIT`): none takes a rack, or waits for a
  row a round holds. So a journal round, CancelTask, a window's change or a rollout's cancel, which lock
  racks, then mark the schedules of the tasks they end, never wait there. The scope RPCs lock the schedule,
  then the racks their component filters name (`FOR UPDATE`); DeleteRack and RemoveComponent stamp the
  schedules whose entries they remove, then lock the rack, and roll back and try again when an entry came
  meanwhile, rather than lock its schedule while holding the rack (`InventoryService`); a rollout's step
  pauses the schedules of the runs it halts before it starts any run's wave (`RolloutService.advance`)
  (tests/store/test_schedule_lock_order.py).
* Fencing. Every write while running is conditional on "still RUNNING and still mine": an executor whose
  task was cancelled, or taken over while it was cut off, finds out before its next step and stops. Each
  batch of steps is fenced so, in a journal round before it starts, though its progress message is not
  written then (a tick writes the messages owed every `progress_interval`): the round locks the task's
  row as the write would have (`task_runs.fence`), so a cancel or a takeover either committed before the
  round, and the batch does not start, or waits for (or passes over) the row until the round committed.
* Cut short. A run an error cuts short (a journal round that failed) leaves its task RUNNING and this
  instance's, for its next claim to take up again. One cancelled meanwhile is no longer RUNNING, so no
  claim takes it; at the dead-hold cadence (every `lease_ttl`) the instance lets go of the tasks it holds
  that it does not run and that are not RUNNING, as their runs would have, and their racks' waiting tasks
  are promoted.
* Shutdown. In-flight runs are cancelled and the instance unregisters, so other instances (or this one,
  restarted) take its tasks over at once instead of after the lease.

Design note, why the executor is cheap (it shares the event loop and the pool with the API and the
dispatcher): the running tasks' writes go through one journal (`store.group_commit`). Each round is one
transaction holding every write queued since the last: the endings (finish or let go, and promotion
when the rack has waiting tasks), the next steps' fences and the progress messages owed, what the steps
changed in the inventory (each backend step returns its `ComponentChange`: backends are drivers that touch no
database, and the executor is the only writer), and the claim of as many new tasks as there is room for, the
ending ones' slots included. So the executor never holds more than one connection for its tasks (plus one now
and then for its heartbeat and its sweep) however many it runs, and a task costs a fraction of a
transaction. The sweep for what nothing else catches (expired waiting tasks, dead instances' holds,
stuck racks, a gate's holds that outlasted what held them: `gates.LooksAgain`, and what an instance owed
and did not live to do: `Backstop`) runs on a timer, not on every poll; with nothing owed, a backstop's
look is one read (a window change's owed decisions: an empty table's primary key).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import logs
from rackflow.clock import Clock, sleep_unless_stopped, sleep_unless_woken
from rackflow.config import (
    DEFAULT_EXECUTOR_POLL_INTERVAL,
    DEFAULT_LEASE_TTL,
    DEFAULT_MAX_CONCURRENT_TASKS,
    DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_START_DEADLINE,
    DEFAULT_SWEEP_INTERVAL,
)
from rackflow.domain.inventory import Component
from rackflow.domain.tasks import (
    ComponentChange,
    Ending,
    Fail,
    OperationKind,
    StepRecord,
    Task,
    TaskAttempt,
    TaskStatus,
)
from rackflow.metrics import TASK_RETRIES
from rackflow.notify import events
from rackflow.retry import Retry, retrying
from rackflow.store import instances, outbox, task_runs
from rackflow.store import schedules as schedule_store
from rackflow.store.db import Database
from rackflow.store.group_commit import GroupCommit
from rackflow.store.inventory import components_by_rack
from rackflow.tasks.backends.base import DONE_VERB, STEP_VERB, Backend, StepFailed, StepState, plan
from rackflow.tasks.gates import Gate, LooksAgain, consult
from rackflow.tasks.manager import TaskManager, count_ended
from rackflow.timespec import format_rfc3339

log = logging.getLogger(__name__)

# A task whose runs keep ending with their process (say, a step that crashes it) fails after this many
# attempts rather than taking down every instance in turn.
MAX_ATTEMPTS = 3
# Recording a run's outcome is retried until it succeeds: the run only counts as over once it is recorded.
OUTCOME_WRITE_RETRY = Retry(first_delay=0.1, max_delay=5.0)

Outcome = tuple[TaskStatus, str]
Batch = list[tuple[int, Component]]


class Backstop(Protocol):
    """What finishes, from any instance, work that an instance owed once a transaction of its committed
    and may not have lived (or failed) to do: the decisions a window's change still owes
    (`tasks.deferrals.Deferrals.look_again`). The executor runs it with its gates' look again."""

    async def look_again(self) -> int:
        """Finish what is owed, in transactions of its own that hold nothing else; how much it did."""
        ...


@dataclass(frozen=True)
class _Failure:
    """Why one step failed, and whether its backend classed the failure as retryable."""

    reason: str
    retryable: bool


@dataclass(frozen=True)
class _Run:
    """A claimed task, ready to run: its steps in batches, or why it must end without running."""

    task: Task
    attempt: int
    batches: list[Batch]
    refusal: Fail | None
    recorded: Mapping[uuid.UUID, Mapping[str, str]]  # by component: what this attempt's steps recorded

    @property
    def step_count(self) -> int:
        return _step_count(self.batches)

    def progress(self, batch: Batch) -> str:
        return _progress(self.task, self.batches, batch)


@dataclass(frozen=True)
class _Entry:
    """One running task's write in a journal round: what its last steps changed, and then either the
    fence of its next batch of steps or its ending; or the progress message of its batch under way (the
    progress tick's); or what a step records before it acts (`steps`)."""

    task_id: uuid.UUID | None
    changes: tuple[ComponentChange, ...]
    message: str | None = None
    ending: Ending | None = None
    steps: tuple[StepRecord, ...] = ()  # what a step records before it acts (`_StepState`)


# An entry that writes nothing: it asks for a round, to claim tasks when there is room.
_CLAIM_ONLY = _Entry(None, ())


@dataclass(frozen=True)
class _Written:
    """A journal entry's result: the task is still ours (progress) or was ended as reported (ending);
    and whether recording the round's endings promoted waiting tasks."""

    ours: bool
    promoted: bool


class Executor:
    """Claims and runs tasks until `stop` is set. `wake()` makes it poll now (e.g. after a submit)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        backend: Backend,
        *,
        instance_id: uuid.UUID,
        manager: TaskManager | None = None,
        gates: Sequence[Gate] = (),
        backstops: Sequence[Backstop] = (),
        poll_interval: float = DEFAULT_EXECUTOR_POLL_INTERVAL.total_seconds(),
        lease_ttl: float = DEFAULT_LEASE_TTL.total_seconds(),
        max_concurrent: int = DEFAULT_MAX_CONCURRENT_TASKS,
        sweep_interval: float = DEFAULT_SWEEP_INTERVAL.total_seconds(),
        default_start_deadline: timedelta | None = DEFAULT_START_DEADLINE,
        progress_interval: float = DEFAULT_PROGRESS_INTERVAL.total_seconds(),
    ) -> None:
        """`default_start_deadline`: the server's, for a schedule without its own (as the planner's), so
        that a task found too late names its firing's deadline even before the write-back recorded it;
        `backstops`: run with the gates' look again (`_look_again`); `progress_interval`
        (positive): how often the running tasks' progress messages are written, and so how far at most they
        lag (`_tick_progress`)."""
        self.db = db
        self.clock = clock
        self.backend = backend
        self.instance_id = instance_id
        self.manager = manager or TaskManager(db, clock)
        self.manager.on_submit.append(self.wake)
        self.gates = tuple(gates)  # consulted in this order at each claim (`Services.gates`)
        self.backstops = tuple(backstops)
        self.poll_interval = poll_interval
        self.lease_ttl = timedelta(seconds=lease_ttl)
        self.max_concurrent = max_concurrent
        self.sweep_interval = sweep_interval
        self.default_start_deadline = default_start_deadline
        self.progress_interval = timedelta(seconds=progress_interval)
        self._wake = asyncio.Event()
        self._running: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._journal: GroupCommit[_Entry, _Written] = GroupCommit(
            db, self._write_round, after_commit=self._after_round
        )
        self._claimed: list[_Run] = []  # by the round being written; started once it commits
        # The progress messages of the batches under way that are not written yet, by task (`_tick_progress`).
        self._owed: dict[uuid.UUID, str] = {}
        # Tasks this executor's claims held for an answer, and the hold each got (gate, until): each keeps
        # a slot while that hold is in force (the design note's "slots kept for answers").
        self._awaiting: dict[uuid.UUID, tuple[str, datetime]] = {}
        self._next_holds_read = 0.0  # when those holds are next read back (the event loop's clock)
        self._ended: Mapping[TaskStatus, int] = {}  # by the round being written; counted once it commits
        self._retried = 0  # attempts the round being written sent back for another; counted so too
        self._stopping = False
        self._next_sweep = 0.0
        self._next_hold_check = 0.0
        # When rounds ended tasks, and how many (`ended_within`), and who wants to know at once (the
        # pre-flight checker, which then looks ahead at the tasks next in line).
        self._endings: collections.deque[tuple[float, int]] = collections.deque()
        self.on_ended: list[Callable[[], None]] = []

    def wake(self) -> None:
        self._wake.set()

    def answered(self, task_ids: Collection[uuid.UUID]) -> None:
        """The pre-flight checker of this process recorded these tasks' rounds: the slots those this
        executor held for an answer kept are free. No wake: the checker wakes the executors for the tasks
        it released, and a slot freed by a hold is for tasks that have their own first round to wait
        for (a wake per answer split the claims, and so the tasks' ends, into many small rounds)."""
        for task_id in task_ids:
            self._awaiting.pop(task_id, None)

    def ended_within(self, seconds: float) -> int:
        """How many tasks this executor ended (or sent back for a retry) in the last `seconds`: the pace its
        slots free at (it keeps the last minute)."""
        now = time.monotonic()
        while self._endings and self._endings[0][0] < now - 60:
            self._endings.popleft()
        return sum(count for at, count in self._endings if at >= now - seconds)

    async def run(self, stop: asyncio.Event) -> None:
        await self._register(stop)
        lease = asyncio.create_task(self._keep_lease(stop), name="executor lease")
        ticks = asyncio.create_task(self._tick_progress(stop), name="executor progress")
        try:
            while not stop.is_set():
                try:
                    await self.poll()
                except Exception:  # an outage or a bug: report it and try again next poll
                    logs.failed(log, "executor poll failed", then="; retrying")
                await self._nap(stop)
        finally:
            self._stopping = True
            lease.cancel()
            ticks.cancel()
            runs = list(self._running.values())
            for run in runs:
                run.cancel()
            await asyncio.gather(lease, ticks, *runs, return_exceptions=True)
            await self._journal.close()
            try:
                await instances.unregister(self.db, self.instance_id)
            except Exception:
                log.warning("could not unregister instance %s; its lease will expire", self.instance_id)

    async def poll(self) -> None:
        """Housekeeping when it is due (promotion, expiry, dead holds), then, if there is room for more
        tasks, a journal round (which claims them)."""
        await self._sweep_when_due()
        free = self.max_concurrent - len(self._running)
        if free > self._slots_kept() or (free > 0 and self._holds_read_due()):
            await self._journal.write(_CLAIM_ONLY)

    async def _sweep_when_due(self) -> None:
        now = asyncio.get_running_loop().time()
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.sweep_interval
        dead_holds = now >= self._next_hold_check
        if dead_holds:
            self._next_hold_check = now + self.lease_ttl.total_seconds()
            await self._let_go_of_forgotten()
            await self._look_again()
        await self.manager.sweep(lease_ttl=self.lease_ttl, dead_holds=dead_holds)

    async def _let_go_of_forgotten(self) -> None:
        """Drop the holds this instance keeps on tasks it no longer runs and no claim takes back. A run cut
        short by an error (a progress write that failed) leaves its task RUNNING and ours, for this
        instance's next claim to take up again; but a task cancelled meanwhile is not RUNNING, so no claim
        takes it, and the dead-hold sweep spares a live owner: its rack stayed busy, its waiting tasks
        unpromoted, until this process ended. Recorded as the run's own stop would be (`let_go_in`)."""
        async with self.db.read() as conn:
            forgotten = await task_runs.held_not_running(
                conn, owner_id=self.instance_id, running_here=set(self._running)
            )
        if forgotten:
            log.info("letting go of %d cancelled task(s) whose run was cut short", len(forgotten))
            stops = [
                _Entry(task_id, (), ending=Ending(task_id, rack_id, None)) for task_id, rack_id in forgotten
            ]
            await asyncio.gather(*(self._journal.write(entry) for entry in stops))

    async def _look_again(self) -> None:
        """Have the gates whose holds may outlast what they were decided by (`gates.LooksAgain`: a freeze
        shortened or deleted whose change did not live to let go of a hold a claim wrote meanwhile) let go
        of those, and claim them at once; and the backstops finish what an instance owed and did not live
        to do (`Backstop`: the decisions a window's change owes), before this process's first claim."""
        let_go = 0
        for gate in self.gates:
            if isinstance(gate, LooksAgain):
                let_go += await gate.look_again(self.clock.now())
        if let_go:
            log.info("let go of %d task hold(s) that outlasted what held them", let_go)
            self.wake()
        for backstop in self.backstops:  # (what it lets start, it wakes the executors for)
            if done := await backstop.look_again():
                log.info("finished %d decision(s) an instance owed", done)

    # --- claiming and the lease ------------------------------------------------------------------

    async def _claim_in(self, conn: AsyncConnection, room: int) -> list[_Run]:
        """Take tasks, in the round's transaction: pick them (their rows locked), plan their steps over
        their racks' components, then make them RUNNING with their first batch's progress message in the
        same UPDATE (a task's claim and its first message are one version of its row), and ask the start
        gates. A task the claim fails without running (`_refusal`) is given no message: its end says why.
        A gate's hold or refusal rewrites the message with its reason."""
        now = self.clock.now()
        picked = await task_runs.pick(
            self.db,
            conn,
            owner_id=self.instance_id,
            lease_ttl=self.lease_ttl,
            running_here=self._running.keys(),
            now=now,
            limit=room,
        )
        if not picked:
            return []
        plans = await self._plan(conn, [task for task, _ in picked])
        first = {
            task.id: _progress(task, batches, batches[0])
            for task, number in picked
            if (batches := plans[task.id]) and _refusal(task, number, now, None) is None
        }
        claimed = await task_runs.start(conn, picked, owner_id=self.instance_id, now=now, messages=first)
        gated = await consult(self.gates, conn, claimed, owner_id=self.instance_id, now=now)
        self._awaiting.update(gated.awaiting)
        if not gated.claimed:
            return []
        return await self._prepare(conn, gated.claimed, gated.failed, plans, now)

    async def _plan(self, conn: AsyncConnection, picked: Sequence[Task]) -> dict[uuid.UUID, list[Batch]]:
        """Each task's steps, in batches, over its components that still exist (one removed meanwhile is
        skipped)."""
        by_rack = await components_by_rack(conn, {task.rack_id for task in picked})
        width = max(1, self.backend.step_concurrency)
        plans = {}
        for task in picked:
            wanted = set(task.component_ids)
            steps = plan(task.operation.kind, [c for c in by_rack[task.rack_id] if c.id in wanted])
            plans[task.id] = step_batches(steps, width)
        return plans

    def _slots_kept(self) -> int:
        """How many slots the tasks this executor held for an answer keep, as far as it knows: those not
        answered by this process's checker whose hold has not ended."""
        if not self._awaiting:  # the common case, at every poll: nothing to read the clock for
            return 0
        now = self.clock.now()
        self._awaiting = {task_id: hold for task_id, hold in self._awaiting.items() if hold[1] > now}
        return len(self._awaiting)

    def _holds_read_due(self) -> bool:
        return bool(self._awaiting) and asyncio.get_running_loop().time() >= self._next_holds_read

    async def _kept_for_answers(self, conn: AsyncConnection) -> int:
        """`_slots_kept`, with the holds read back once a poll interval (in the round's transaction): a
        hold that is no longer the one this executor's claim wrote was answered by another instance."""
        kept = self._slots_kept()
        if kept and self._holds_read_due():
            self._next_holds_read = asyncio.get_running_loop().time() + self.poll_interval
            in_force = await task_runs.holds_of(conn, self._awaiting.keys())
            self._awaiting = {i: hold for i, hold in self._awaiting.items() if in_force.get(i) == hold}
            kept = len(self._awaiting)
        return kept

    def _after_round(self) -> None:
        """After a round committed: count the tasks it ended, and run what it claimed (unless stopping: a
        successor takes those over)."""
        ended, self._ended = self._ended, {}
        count_ended(ended)
        retried, self._retried = self._retried, 0
        TASK_RETRIES.inc(retried)
        if freed := sum(ended.values()) + retried:
            self._endings.append((time.monotonic(), freed))
            for callback in self.on_ended:
                callback()
        claimed, self._claimed = self._claimed, []
        for run in claimed if not self._stopping else ():
            if run.attempt > 1:
                log.info("task %s: taking over (attempt %d)", run.task.id, run.attempt)
            self._running[run.task.id] = asyncio.create_task(self._run(run), name=f"task {run.task.id}")

    async def _prepare(
        self,
        conn: AsyncConnection,
        claimed: list[tuple[Task, int]],
        failed: Mapping[uuid.UUID, Fail],
        plans: Mapping[uuid.UUID, list[Batch]],
        now: datetime,
    ) -> list[_Run]:
        """The claimed tasks' runs, each with its planned batches (`plans`); a task a gate failed (`failed`:
        why, and how it ends), or the claim refuses (`_refusal`), ends without running."""
        too_late = {task.run_id for task, _ in claimed if task.too_late(now) and task.run_id is not None}
        deadlines = await schedule_store.start_deadlines(conn, too_late) if too_late else None
        # Only a takeover (a claim after the first within an attempt) finds what steps recorded.
        taken_over = {task.id: task.attempt for task, attempt in claimed if attempt > 1}
        recorded = await task_runs.steps_of(conn, taken_over) if taken_over else {}
        runs = []
        for task, attempt in claimed:
            start_deadline = (
                deadlines.of(task.id, task.run_id, self.default_start_deadline)
                if deadlines is not None and task.run_id is not None
                else None
            )
            refused = _refusal(task, attempt, now, start_deadline)
            refusal = Fail(refused) if refused else failed.get(task.id)
            runs.append(_Run(task, attempt, plans[task.id], refusal, recorded.get(task.id, {})))
        return runs

    async def _register(self, stop: asyncio.Event) -> None:
        """Register this instance, trying again every poll interval; give up only when stopping."""

        async def register() -> None:
            await instances.register(self.db, self.instance_id, host=socket.gethostname(), pid=os.getpid())

        with contextlib.suppress(Exception):  # only raised once `stop` is set
            await retrying(
                register,
                Retry.every(self.poll_interval),
                what=f"registering instance {self.instance_id}",
                stop=stop,
            )

    async def _keep_lease(self, stop: asyncio.Event) -> None:
        while not await sleep_unless_stopped(stop, self.lease_ttl / 3):
            try:
                if not await instances.heartbeat(self.db, self.instance_id):
                    log.warning("instance %s was unregistered; registering again", self.instance_id)
                    await self._register(stop)
            except Exception:
                logs.failed(log, "heartbeat of instance %s failed", self.instance_id)

    async def _tick_progress(self, stop: asyncio.Event) -> None:
        """Every `progress_interval`, write the progress message of each batch under way whose message is
        not written yet (`_owed`), each task's fenced as every write of a running task is: so a task's
        message lags the batch under way by at most the interval (and a journal round), and its row is
        rewritten at most once an interval, not at every batch. Those of a tick whose write fails (an
        outage) are left to the next batches' messages."""
        while not await sleep_unless_stopped(stop, self.progress_interval):
            owed, self._owed = self._owed, {}
            try:
                await asyncio.gather(
                    *(self._journal.write(_Entry(i, (), message=m)) for i, m in owed.items())
                )
            except Exception:
                logs.failed(log, "writing the progress of %d task(s) failed", len(owed), then="; going on")

    async def _nap(self, stop: asyncio.Event) -> None:
        await sleep_unless_woken(stop, self._wake, self.poll_interval)
        self._wake.clear()

    # --- running one task ------------------------------------------------------------------------

    async def _run(self, run: _Run) -> None:
        task = run.task
        changes: list[ComponentChange] = []
        try:
            executed = await self._execute(run, changes)
            ending = _ending(task, executed, self.clock.now())
            entry = _Entry(task.id, tuple(changes), ending=ending)
            written = await retrying(
                lambda: self._journal.write(entry),
                OUTCOME_WRITE_RETRY,
                what=f"task {task.id}: recording the outcome",
            )
            if written.promoted:
                self.manager.wake_executors()
            if ending.outcome is None:
                log.info("task %s: stopped (cancelled or taken over)", task.id)
            elif ending.retry_at is not None:
                log.info("task %s: retrying: %s", task.id, ending.outcome[1])
            else:
                log.info("task %s: %s: %s", task.id, ending.outcome[0].value, ending.outcome[1])
        except Exception:  # it stays RUNNING and mine, so the next poll picks it up again
            logs.failed(log, "task %s: run interrupted", task.id, then="; it will be run again")
        finally:
            self._running.pop(task.id, None)
            self._owed.pop(task.id, None)
            self.wake()

    async def _execute(self, run: _Run, changes: list[ComponentChange]) -> tuple[Outcome, bool] | None:
        """Run the steps; the outcome to record and whether it is a retryable failure (every failed step's
        was), or None when the task stopped being ours. `changes` collects what the steps changed and the
        journal has not written yet.

        Each batch after the first is fenced before it starts, in a journal round with what the batch
        before changed: that is where a cancellation or a takeover is noticed, and the batch does not
        start. Its progress message is not written there: the first batch's was written with the claim,
        a later one's is owed to the progress tick (`_tick_progress`), so a task of many quick steps
        rewrites its row a few times, not at every step (docs/CAPACITY.md, "Racks of 36 components").
        """
        if run.refusal is not None:
            return (run.refusal.ends_as, run.refusal.reason), False
        task = run.task
        notes: list[tuple[int, str]] = []
        for index, batch in enumerate(run.batches):
            if index > 0:
                entry = _Entry(task.id, tuple(changes))
                changes.clear()
                if not (await self._journal.write(entry)).ours:
                    return None
                self._owed[task.id] = run.progress(batch)
            outcomes = await asyncio.gather(*(self._step(run, c, n, changes, notes) for n, c in batch))
            unrecorded = [outcome for outcome in outcomes if isinstance(outcome, _Unrecorded)]
            for outcome in unrecorded:
                if outcome.error is not None:  # as a progress write that failed: the run is cut short
                    raise outcome.error
            if unrecorded:
                return None
            failures = [failure for failure in outcomes if isinstance(failure, _Failure)]
            if failures:
                reason = "; ".join(failure.reason for failure in failures)
                return (TaskStatus.FAILED, _noted(reason, notes)), all(f.retryable for f in failures)
        return (TaskStatus.COMPLETED, _noted(_done(task, run.step_count), notes)), False

    async def _step(
        self,
        run: _Run,
        component: Component,
        number: int,
        changes: list[ComponentChange],
        notes: list[tuple[int, str]],
    ) -> _Failure | _Unrecorded | None:
        """Run one step, keeping what it changed for the next journal write (with the task's next progress
        message or its end, so a step costs no transaction of its own; if the instance dies first, the task
        is taken over and the step repeated, as any step whose outcome was not recorded), and its note for
        the task's message. Returns why it failed, None when it succeeded, or what kept the step from
        recording its state (it did not act). A backend bug is never retryable."""
        task, total = run.task, run.step_count
        state = _StepState(self._journal, task, component.id, run.recorded.get(component.id))
        try:
            if (change := await self.backend.run_step(task, component, state)) is not None:
                changes.append(change)
                if change.note is not None:
                    notes.append((number, f"{component.name} ({number}/{total}): {change.note}"))
        except _Unrecorded as unrecorded:
            return unrecorded
        except StepFailed as exc:
            return _Failure(f"{_failed(task, component, number, total)}: {exc}", exc.retryable)
        except Exception as exc:  # a backend bug must fail the task, not the executor
            log.exception("task %s: step on %s raised", task.id, component.name)
            return _Failure(f"{_failed(task, component, number, total)}: unexpected error: {exc!r}", False)
        return None

    async def _write_round(self, conn: AsyncConnection, entries: Sequence[_Entry]) -> list[_Written]:
        """One journal round, one transaction: the running tasks' endings first (they lock racks, in id
        order, before touching task rows, as every rack-changing transaction does), then the progress
        messages (written, fenced) and the next batches' fences (their tasks' rows locked alone), then
        what the steps changed (written whether or not the task is still ours: the hardware did change),
        then claims for the room there is, counting the slots the ending tasks free (holding those racks,
        the claim takes no run's row it would wait for: the lock order of the design note)."""
        endings = [entry.ending for entry in entries if entry.ending is not None]
        let_go = await self.manager.let_go_in(conn, self.instance_id, endings) if endings else None
        self._ended = let_go.ended if let_go else {}
        self._retried = len(let_go.retried) if let_go else 0
        messages = {e.task_id: e.message for e in entries if e.task_id is not None and e.message is not None}
        now = self.clock.now()
        await outbox.record_events(conn, events.tasks_failed(endings, let_go.finished if let_go else (), now))
        held = await task_runs.record_progress(conn, messages, owner_id=self.instance_id, now=now)
        fenced = {e.task_id for e in entries if e.task_id is not None and e.ending is None and not e.steps}
        held |= await task_runs.fence(conn, fenced - messages.keys(), owner_id=self.instance_id)
        steps = [record for entry in entries for record in entry.steps]
        held |= await task_runs.record_steps(conn, steps, owner_id=self.instance_id)
        await task_runs.record_changes(conn, (change for entry in entries for change in entry.changes))
        room = 0 if self._stopping else self.max_concurrent - len(self._running) + len(endings)
        if room > 0 and self._awaiting:
            room -= await self._kept_for_answers(conn)
        self._claimed = await self._claim_in(conn, room) if room > 0 else []
        finished = (let_go.finished | let_go.retried) if let_go else frozenset()
        promoted = bool(let_go and let_go.promoted)
        return [_Written(e.task_id in (finished if e.ending else held), promoted) for e in entries]


class _Unrecorded(Exception):
    """A step's state was not recorded, so the step must not act: its task is no longer this instance's
    (`error` None), or the journal round failed (`error`), which cuts the run short."""

    def __init__(self, error: Exception | None) -> None:
        super().__init__("the step's state was not recorded")
        self.error = error


class _StepState(StepState):
    """A step's `StepState`: what this attempt's run before a takeover recorded, and `record`, one journal
    entry of its own (a round with whatever else is queued) that commits before the step acts."""

    def __init__(
        self,
        journal: GroupCommit[_Entry, _Written],
        task: Task,
        component_id: uuid.UUID,
        recorded: Mapping[str, str] | None,
    ) -> None:
        self._journal = journal
        self._task = task
        self._component_id = component_id
        self._recorded = recorded

    @property
    def recorded(self) -> Mapping[str, str] | None:
        return self._recorded

    async def record(self, values: Mapping[str, str]) -> None:
        record = StepRecord(self._task.id, self._task.attempt, self._component_id, dict(values))
        try:
            written = await self._journal.write(_Entry(self._task.id, (), steps=(record,)))
        except Exception as exc:
            raise _Unrecorded(exc) from exc
        if not written.ours:
            raise _Unrecorded(None)


def _ending(task: Task, executed: tuple[Outcome, bool] | None, now: datetime) -> Ending:
    """What the executor reports for a run that ended at `now`: its outcome (None: the task stopped being
    ours); for a task with retries, the attempt's record, and when a retryable failure with attempts left
    is tried again (its outcome's message then says so, and becomes the task's held reason). A failed
    last attempt that was not the first says which it was."""
    if executed is None:
        return Ending(task.id, task.rack_id, None)
    (status, message), retryable = executed
    attempt = None
    if task.retry is not None:
        attempt = TaskAttempt(task.id, task.attempt, task.attempt_started_at, now, status, message, retryable)
    retry_at = task.retry_at(now) if retryable else None
    if retry_at is not None:
        return Ending(
            task.id, task.rack_id, (status, task.retry_reason(retry_at, message)), retry_at, attempt
        )
    if status is TaskStatus.FAILED and task.attempt > 1:
        message = f"attempt {task.attempt} of {task.max_attempts}: {message}"
    return Ending(task.id, task.rack_id, (status, message), attempt=attempt)


def _refusal(task: Task, attempt: int, now: datetime, start_deadline: datetime | None) -> str | None:
    """Why the task must fail without running, if it must. `start_deadline`: its firing's start deadline
    (its run's outcome keeps it; before the write-back, its slot + deadline: `StartDeadlines.of`), so that
    the deadline, not the maintenance window, is named when it is what ended the wait."""
    if attempt > MAX_ATTEMPTS:
        return f"gave up after {MAX_ATTEMPTS} attempts, each cut short with its rackflow instance"
    if task.not_after is not None and task.too_late(now):
        ended = format_rfc3339(task.not_after)
        # A task that ran before (a retry's next attempt, a takeover) did run: it is this attempt that
        # could not. (Not told by `started_at`: the claim that found it too late has just stamped it.)
        ran_before = task.attempt > 1 or attempt > 1
        what = f"attempt {task.attempt}" if ran_before else "the task"
        if start_deadline == task.not_after:
            return f"its firing's start deadline passed at {ended} before {what} could run"
        return f"the maintenance window ended at {ended} before {what} could run"
    return None


def step_batches(steps: Sequence[Component], width: int) -> list[Batch]:
    """The planned steps (numbered from 1) in batches run together: at most `width` consecutive steps of
    one component type. The order between types stays strict: a batch starts when the one before ended.

    `width` is the backend's `step_concurrency` (the redfish backend: RACKFLOW_REDFISH_CONCURRENCY); at
    the default of 1 every batch holds one step, so steps run one by one.
    """
    batches: list[Batch] = []
    for number, component in enumerate(steps, 1):
        last = batches[-1] if batches else None
        if last is not None and len(last) < width and last[-1][1].type is component.type:
            last.append((number, component))
        else:
            batches.append([(number, component)])
    return batches


def _progress(task: Task, batches: Sequence[Batch], batch: Batch) -> str:
    """The message of a task's batch of steps under way, e.g. "powering on 2/5: compute-0"."""
    first, last = batch[0][0], batch[-1][0]
    numbers = f"{first}" if first == last else f"{first}-{last}"
    names = ", ".join(component.name for _, component in batch)
    return f"{STEP_VERB[task.operation.kind]} {numbers}/{_step_count(batches)}: {names}"


def _step_count(batches: Sequence[Batch]) -> int:
    return sum(len(batch) for batch in batches)


def _failed(task: Task, component: Component, number: int, total: int) -> str:
    return f"{task.operation.kind.value} failed on {component.name} ({number}/{total})"


def _noted(message: str, notes: Sequence[tuple[int, str]]) -> str:
    """A task's outcome message with what its succeeded steps noted (`ComponentChange.note`, by step
    number), which the operator must see whether the task completed or failed later."""
    return "; ".join((message, *(note for _, note in sorted(notes))))


def _done(task: Task, count: int) -> str:
    kind = task.operation.kind
    text = f"{DONE_VERB[kind]} {count} component{'' if count == 1 else 's'}"
    if kind is OperationKind.UPGRADE_FIRMWARE:
        text += f" to {task.operation.target_version}"
    return text
