"""The dispatcher: the background loop in every `rackflow serve` that fires due schedules.

Delivery guarantee — at most once per tick, on any number of instances:

* Phase 1 (one transaction) locks up to `batch` due rows with `FOR UPDATE SKIP LOCKED` (SQLite: inside its
  single-writer transaction) and claims them (`firing.claim`: load the batch's snapshot, plan it with the
  pure planner — the SKIP overlap check and the windows per scope, every row's `next_run_at` advanced
  (interval: dispatch time + duration; cron: next time after the dispatch time; one-time: consumed) — and
  write it: the advances and a "running" run row per firing). When this commits, the tick is spent: no
  instance can claim it again, because the row is locked until then and not due afterwards; and should
  any path try, the run table's unique (schedule, slot) index refuses a second run of the tick.
* Phases 2 and 3 (`ScheduleService.fire`, as for a manual trigger) submit one task per eligible scope
  through the task manager, then write `last_task_id` back and complete the run. A crash between phases
  loses the tick's remaining submissions rather than repeating them; its run row stays "running" until
  another instance sees the owner's heartbeat has stopped and marks it "interrupted", so the operator
  sees it.
* A claim whose COMMIT goes unanswered (the connection lost, `Unavailable`) may have committed: its tick is
  then spent, and its runs are "running" and this instance's, so no one else would fire them. The
  dispatcher asks on a new connection, once the claim's transaction is over (`firing.committed`, retried
  for up to its deadline), which of its runs the database recorded, and fires
  those through phases 2 and 3 as any claim's; a claim that did not commit recorded none, and its
  schedules, still due, are claimed again. So the tick fires late only by the look-up, and never twice;
  if the database stays away past the look-up's deadline, the firings are given up, and if they committed
  the sweep marks their runs "interrupted" (as for a crash between phases).
* A schedule with a rollout policy is recorded "rolling" in phase 1 and its first wave starts at once
  (`ScheduleService.fire` takes its first `RolloutService.advance`); the rollout driver (`rollouts/driver.py`)
  takes it from there.
* "Now" is the database's clock on PostgreSQL, so instances with skewed clocks agree on what is due.

When to look — on time, with the poll as the safety net:

* A claim that is not full also reads the earliest `next_run_at`, and the loop sleeps until then, never
  longer than the poll interval. A request that makes a schedule due sooner announces it
  (`store.wakeups`: NOTIFY on PostgreSQL, heard by every instance; in-process on SQLite), which ends the
  sleep of any dispatcher planning to look later. A lost announcement costs at most one poll interval.
* A full batch means more may be due: the loop polls again at once (draining) instead of sleeping, and
  doubles its batch (up to DISPATCH_BATCH_CAP) so a large backlog pays a claim's round trips for more
  firings; the first claim that is not full returns to the configured batch. While draining, the next
  batch is claimed while earlier ones are still in phases 2-3 (up to PIPELINE_DEPTH at once), so one
  instance overlaps its round trips as two instances would.
* `firing()` says whether a firing pass is under way (batches claimed and not yet written back, or the last
  claim full): the pre-flight checker of the same process holds its polls back meanwhile, for a bounded
  time (`rackflow.checks.checker`, issue 26), so the pass has the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from rackflow import failpoints, metrics
from rackflow.audit.trail import AuditTrail
from rackflow.config import (
    DEFAULT_DISPATCH_BATCH,
    DEFAULT_DISPATCH_INTERVAL,
    DEFAULT_LEASE_TTL,
    DISPATCH_BATCH_CAP,
    FAILING_STREAK_FULL_LOOK,
)
from rackflow.domain.audit import EXPIRE_RUN, OK, SYSTEM_PRINCIPAL
from rackflow.domain.firing import Firing
from rackflow.domain.schedules import pause_to_json
from rackflow.errors import Unavailable
from rackflow.retry import Retry, retrying
from rackflow.schedules.approvals import ApprovalService
from rackflow.schedules.firing import claim, committed
from rackflow.schedules.service import ScheduleService
from rackflow.store import dispatch, wakeups

log = logging.getLogger(__name__)

# Claimed batches in phases 2-3 at once while draining: enough to hide the claims' round trips behind the
# submits. Measured at batch 10 (docs/PERFORMANCE.md): 3 drained faster than 2, and 4 no faster than 3.
PIPELINE_DEPTH = 3

# While draining, the backlog gauge is refreshed at most this often: counting walks up to DUE_COUNT_CAP due
# index entries, so counting on each batch of a drain would cost the database more than the claims do.
BACKLOG_REFRESH = timedelta(seconds=1)

# After an unexpected error (e.g. the database restarting) poll again this often until a poll succeeds.
POLL_RETRY = Retry.every(1.0)


@dataclass(frozen=True)
class Claim:
    """What one claim took, and whether its batch came back full (more is probably due). `in_doubt`: its
    COMMIT went unanswered, and its firings are to be fired only if it committed (`Dispatcher._committed`).
    `paused`: its firings past their operation's window, which paused their schedules and fire nothing,
    to be audited (if it committed)."""

    firings: list[Firing]
    full: bool
    in_doubt: bool = False
    paused: list[Firing] = field(default_factory=list)

    @property
    def took(self) -> bool:
        """Whether it leaves anything to do after it: firings to fire, or pauses to audit."""
        return bool(self.firings or self.paused)


class Dispatcher:
    def __init__(
        self,
        schedules: ScheduleService,
        audit: AuditTrail,
        *,
        approvals: ApprovalService | None = None,
        interval: timedelta = DEFAULT_DISPATCH_INTERVAL,
        batch: int = DEFAULT_DISPATCH_BATCH,
        lease_ttl: timedelta = DEFAULT_LEASE_TTL,
    ) -> None:
        self.schedules = schedules
        self.audit = audit
        self.approvals = approvals  # None: this dispatcher expires no approvals (a test of the loop alone)
        self.db = schedules.db
        self.interval = interval
        self.batch = batch  # the starting batch; `claim_batch` grows from it while draining
        self.claim_batch = batch
        self.lease_ttl = lease_ttl
        # How long the loop sleeps after the last claim that was not full: until the earliest next run it
        # read, at most `interval`, counted from the claim's clock reading (`_read_at`, time.monotonic()).
        self.wake_after = interval
        self._read_at = 0.0
        self._in_flight: set[uuid.UUID] = set()  # schedules claimed here and not yet written back
        self._draining = False  # the last claim was full: more is probably due
        self._next_backlog_count = 0.0  # time.monotonic() after which a full batch counts the backlog
        # The time (the claim's clock) the loop means to look again; None while awake, when any
        # announcement counts, as the claim running now may have read the due index before it committed.
        self._wake_at: datetime | None = None
        self._woken = asyncio.Event()  # an announcement of something due before `_wake_at`
        self._next_full_streak_look = 0.0  # time.monotonic() after which pause_failing looks at everything

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set. The first poll happens at once; a full batch polls again at once.

        While draining, up to PIPELINE_DEPTH claimed batches are in phases 2-3 at once, so the next claim's
        round trips overlap the current batch's submit instead of waiting for it. On stop, batches
        already claimed are fired before this returns: their ticks are spent, so dropping them would lose
        them.
        """
        log.info("dispatcher started: every %ss, batch %d", self.interval.total_seconds(), self.batch)
        unsubscribe = self.db.wakeups.subscribe(self._hear)
        listener = asyncio.create_task(wakeups.listen(self.db, stop))
        slots = asyncio.Semaphore(PIPELINE_DEPTH)
        firing: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                await slots.acquire()
                if stop.is_set():
                    slots.release()
                    break
                started = time.perf_counter()
                try:
                    claim = await retrying(self._claim, POLL_RETRY, what="dispatch poll", stop=stop)
                except Exception:  # only raised once `stop` is set
                    slots.release()
                    break
                if claim.took:
                    task = asyncio.create_task(self._fire_then_release(claim, started, slots))
                    firing.add(task)
                    task.add_done_callback(firing.discard)
                else:
                    slots.release()
                    metrics.POLL_SECONDS.observe(time.perf_counter() - started)
                if claim.full or claim.in_doubt:
                    continue  # draining: more are probably due; in doubt: claim again, as after any error
                with contextlib.suppress(Exception):
                    await self.sweep_abandoned_runs()
                with contextlib.suppress(Exception):
                    await self.resume_ended_pauses()
                with contextlib.suppress(Exception):
                    await self.expire_approvals()
                with contextlib.suppress(Exception):
                    await self.pause_failing_schedules()
                await self._sleep(stop)
            if firing:
                await asyncio.gather(*firing)
        finally:
            unsubscribe()
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        log.info("dispatcher stopped")

    def firing(self) -> bool:
        """Whether a firing pass is under way: batches claimed here not yet written back, or the last claim
        came back full (more is probably due)."""
        return self._draining or bool(self._in_flight)

    def _hear(self, at: datetime | None) -> None:
        """An announcement (`store.wakeups`): wake if it is due before the planned look, or unknown."""
        if at is None or self._wake_at is None or at < self._wake_at:
            self._woken.set()

    async def _sleep(self, stop: asyncio.Event) -> None:
        """Until `wake_after` has passed since the claim read the clock, an announcement of something
        sooner, or `stop`."""
        remaining = self._read_at + self.wake_after.total_seconds() - time.monotonic()
        if self._woken.is_set() or remaining <= 0:
            return
        wait = asyncio.create_task(self._woken.wait())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({wait, stopping}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            wait.cancel()
            stopping.cancel()

    async def poll_once(self) -> int:
        """Claim, advance and fire one batch, waiting for it; returns how many schedules were claimed."""
        started = time.perf_counter()
        claim = await self._claim()
        if claim.took:
            await self._fire(claim)
        metrics.POLL_SECONDS.observe(time.perf_counter() - started)
        return len(claim.firings)

    async def _fire_then_release(self, claim: Claim, started: float, slot: asyncio.Semaphore) -> None:
        try:
            await self._fire(claim)
        finally:
            slot.release()
            metrics.POLL_SECONDS.observe(time.perf_counter() - started)

    async def _claim(self) -> Claim:
        """Phase 1 for a whole batch, in one transaction, skipping schedules this process is still firing.

        A schedule whose previous firing is still in phase 2 is left for the next claim, so its SKIP
        overlap check sees that firing's task (an interval shorter than a busy drain could otherwise let
        a pipelined claim miss it). A full claim doubles the next batch (up to DISPATCH_BATCH_CAP); one
        that is not full returns to the starting batch and sets `wake_after` from the earliest next run.
        A claim that lost its connection (`Unavailable`) after writing firings may have committed: it is
        returned in doubt, for `_fire` to fire what it committed; one that lost it before raises.
        """
        self._wake_at = None  # awake: announcements from now on end the next sleep
        self._woken.clear()
        batch = self.claim_batch
        may_count = time.monotonic() >= self._next_backlog_count  # see BACKLOG_REFRESH
        claimed: list[Firing] = []
        paused: list[Firing] = []
        try:
            async with self.db.transaction() as conn:
                now = await self.db.now(conn)
                read_at = time.monotonic()
                due = await dispatch.claim_due(self.db, conn, now, batch, exclude=self._in_flight)
                for schedule in due:
                    assert schedule.next_run_at is not None
                    metrics.DISPATCH_LAG.observe(max(0.0, (now - schedule.next_run_at).total_seconds()))
                claimed = await claim(
                    self.db,
                    conn,
                    due,
                    trigger="dispatch",
                    now=now,
                    owner_id=self.schedules.instance_id,
                    default_start_deadline=self.schedules.default_start_deadline,
                    paused=paused,
                )
                full = len(due) >= batch
                # What is still due after a full batch (None: counted too recently), or when to look next.
                backlog: int | None = 0
                earliest: datetime | None = None
                if full:
                    backlog = await dispatch.count_due(conn, now) if may_count else None
                else:
                    earliest = await dispatch.next_due_at(conn, now)
        except Unavailable as exc:
            if not claimed and not paused:
                raise
            log.warning(
                "claim of %d schedule(s): commit outcome unknown (%s); looking up whether it committed",
                len(claimed) + len(paused),
                exc,
            )
            self._in_flight.update(f.schedule.id for f in claimed)
            return Claim(claimed, full=False, in_doubt=True, paused=paused)
        if full and may_count:
            self._next_backlog_count = time.monotonic() + BACKLOG_REFRESH.total_seconds()
        if backlog is not None:
            metrics.DUE_BACKLOG.set(backlog)
        self._in_flight.update(f.schedule.id for f in claimed)
        self._draining = full
        if full:
            self.claim_batch = min(batch * 2, max(DISPATCH_BATCH_CAP, self.batch))
        else:
            # Look again at the earliest next run to come, or after the interval if that is sooner (or none
            # is known). A schedule in flight here that is due again wakes the loop when its firing is
            # written back (`_fire`).
            wake_at = now + self.interval
            if earliest is not None and now < earliest < wake_at:
                wake_at = earliest
            self.claim_batch, self._read_at = self.batch, read_at
            self.wake_after, self._wake_at = wake_at - now, wake_at
        return Claim(claimed, full, paused=paused)

    async def _fire(self, taken: Claim) -> None:
        """Phases 2 and 3 for the whole batch, after the audit rows of the pauses it made (of a claim in
        doubt, for what it committed); never raises, so a bad batch cannot stop the loop."""
        claimed = taken.firings
        fired: list[Firing] = []
        try:
            recorded = taken.firings + taken.paused
            if taken.in_doubt:
                recorded = await self._committed(recorded)
            paused = {f.run_id for f in taken.paused}
            for f in recorded:
                if f.run_id in paused:
                    await self.audit.record_rackflow_pause(f.schedule.id, f.skipped, run_id=f.run_id)
            fired = [f for f in recorded if f.run_id not in paused]
            await failpoints.pause("pause_after_claim")
            await self.schedules.fire(fired)
        except Exception:
            log.exception("firing a batch of %d schedule(s) failed", len(claimed))
        finally:
            self._in_flight.difference_update(f.schedule.id for f in claimed)
            if len(fired) < len(claimed):
                self._hear(None)  # a claim in doubt that did not commit: its schedules are due still
            # Their next runs were left out of the planned look: wake for the soonest, if before it.
            soonest = min((f.next_run_at for f in fired if f.next_run_at is not None), default=None)
            if soonest is not None:
                self._hear(soonest)

    async def _committed(self, claimed: list[Firing]) -> list[Firing]:
        """The firings of a claim in doubt that the database recorded (`firing.committed`); none if it is
        still in doubt past the look-up's deadline."""
        try:
            recorded = await committed(self.db, claimed)
        except Exception:
            log.exception(
                "claim of %d schedule(s) still in doubt; not fired: if it committed, the sweep marks its "
                "runs interrupted",
                len(claimed),
            )
            return []
        log.warning(
            "claim of %d schedule(s) with an unknown commit outcome %s",
            len(claimed),
            "committed after all: firing them" if recorded else "did not commit: they are claimed again",
        )
        return recorded

    async def resume_ended_pauses(self) -> None:
        """Resume the schedules whose pause has reached its `resume_at`, each recorded in the audit trail
        as a ResumeTaskSchedule by rackflow itself, with the pause that ended; one kept paused instead (its
        firmware window: `domain.schedules.kept_paused`) as a PauseTaskSchedule by rackflow, with its
        reason and the pause that ended."""
        ended = await self.schedules.resume_ended_pauses()
        for schedule, pause in ended.resumed:
            log.info("resumed schedule %r: its pause ended at %s", schedule.name, pause.resume_at)
            await self.audit.record(
                principal=SYSTEM_PRINCIPAL,
                method="ResumeTaskSchedule",
                target_ids=[str(schedule.id)],
                outcome=OK,
                request={"id": str(schedule.id), "pause_ended": pause_to_json(pause)},
                schedule_id=schedule.id,
            )
        for schedule, pause in ended.kept:
            assert schedule.pause is not None  # kept paused, saying why
            log.warning(
                "schedule %s: not resumed at its pause's end: %s",
                schedule.name,
                schedule.pause.reason,
                extra={"schedule_id": str(schedule.id)},
            )
            await self.audit.record_rackflow_pause(
                schedule.id, schedule.pause.reason, pause_ended=pause_to_json(pause)
            )

    async def expire_approvals(self) -> None:
        """Expire the runs awaiting approval past their timeout, each recorded in the audit trail as an
        ExpireTaskScheduleRun by rackflow itself, with the reason."""
        if self.approvals is None:
            return
        for item in await self.approvals.expire_overdue():
            await self.audit.record_rackflow_run_end(
                EXPIRE_RUN, item.run.id, item.run.schedule_id, item.reason
            )

    async def pause_failing_schedules(self) -> None:
        """Pause the schedules whose `pause_after_failed_runs` streak is complete
        (`ScheduleService.pause_failing`), each recorded in the audit trail as a PauseTaskSchedule by
        rackflow itself, naming the runs. Looks at the schedules marked since the last look; at the first
        look and every FAILING_STREAK_FULL_LOOK after it, at all of them."""
        everything = time.monotonic() >= self._next_full_streak_look
        paused = await self.schedules.pause_failing(everything=everything)
        if everything:
            self._next_full_streak_look = time.monotonic() + FAILING_STREAK_FULL_LOOK.total_seconds()
        for schedule, streak in paused:
            assert schedule.pause is not None
            metrics.SCHEDULES_PAUSED_AFTER_FAILURES.inc()
            log.warning("paused schedule %r: %s", schedule.name, schedule.pause.reason)
            await self.audit.record_rackflow_pause(
                schedule.id, schedule.pause.reason, failed_runs=[str(t.run_id) for t in reversed(streak)]
            )

    async def sweep_abandoned_runs(self) -> None:
        async with self.db.transaction() as conn:
            marked = await dispatch.mark_abandoned_runs(conn, await self.db.now(conn), self.lease_ttl)
        if marked:
            log.warning("marked %d run(s) of stopped instances as interrupted", marked)
