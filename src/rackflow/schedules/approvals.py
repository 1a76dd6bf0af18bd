"""Approval use cases: approve, reject, and expire a run awaiting approval (docs/SAFETY.md, "Approval").

A firing of a schedule with an approval policy is recorded "awaiting_approval" with its plan frozen
(`schedules.firing.claim`). Here it moves on, each move one transaction that locks the run row and ends with
a conditional UPDATE ... WHERE state = 'awaiting_approval' (`store.runs.decide_awaiting`), so of two
instances or two approvers deciding at once exactly one does:

- `approve`: refused once the run's firmware window (its upgrade's end_time) has ended, as a trigger then
  is (its expiry, for a run fired since that rule: `domain.approvals.opened`); else the caller's approval
  is added (the rules of `domain.approvals.check_approver`: the two-person
  rule, one approval per principal); with enough of them the run becomes "running" (or "rolling") and, once
  that committed, the firing rebuilt from its frozen plan (`domain.firing.approved_firing`) takes the same
  path as any other (`ScheduleService.fire`: phases 2 and 3, or the rollout's first step). Tasks carry the
  run's id, and UNIQUE (run_id, rack_id) refuses a second task for a rack of it whatever path tries. An
  approval whose COMMIT goes unanswered asks, as a manual trigger does (`schedules.firing`,
  `look_up_in_doubt`), whether it was recorded, and goes on if it was (`ApprovalService._in_doubt`).
- `reject`: "rejected" with the caller and the comment; nothing is submitted. Anyone who may approve may
  reject (`domain.approvals.check_decider`), one who approved it earlier too: they changed their mind. A
  rejection whose COMMIT goes unanswered asks alike whether it stands, and answers with the run if it
  does.
- `expire_overdue`: the dispatcher of every instance calls it each poll; a run past its `expires_at` (on the
  database's clock) becomes "expired" (SKIP LOCKED shares the runs out), audited as rackflow itself. A
  firmware upgrade's run expires at its window's end when that comes first, its reason saying so: no
  approval could start it after.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow import metrics
from rackflow.audit.changes import note_schedule_of_run
from rackflow.domain.approvals import (
    Approver,
    RunApproval,
    check_approver,
    check_decider,
    describe_expiry,
    expiry_text,
    with_approver,
)
from rackflow.domain.firing import Firing, approved_firing, window_ended_reason
from rackflow.domain.schedules import Run, RunState, Schedule, ScopeOutcome
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from rackflow.notify import events
from rackflow.rollouts.service import RolloutService, RunReport
from rackflow.schedules import firing
from rackflow.schedules.service import ScheduleService
from rackflow.security import ANONYMOUS, caller_identified, caller_name
from rackflow.store import firing as firing_store
from rackflow.store import outbox
from rackflow.store import rollouts as run_store
from rackflow.store import runs as run_history
from rackflow.store import schedules as store
from rackflow.validation import check_description

log = logging.getLogger(__name__)

EXPIRED_PER_POLL = 100  # runs expired per dispatcher poll; more wait for the next poll


@dataclass(frozen=True)
class Expired:
    """A run the expiry sweep marked expired, and why (for the audit trail)."""

    run: Run
    reason: str


def _not_started(run: Run, why: str) -> tuple[ScopeOutcome, ...]:
    """The run's frozen plan with every pending scope "not_started", saying why."""
    return tuple(
        replace(o, outcome="not_started", error=why) if o.outcome == "pending" else o for o in run.outcomes
    )


def _started_state(run: Run) -> RunState:
    """The state an approval that starts `run` records it in."""
    return "rolling" if run.rollout is not None else "running"


class ApprovalService:
    def __init__(self, schedules: ScheduleService, rollouts: RolloutService) -> None:
        self.schedules = schedules
        self.rollouts = rollouts
        self.db = schedules.db
        self.clock = schedules.clock

    async def _run(self, conn: AsyncConnection, run_id: uuid.UUID) -> Run:
        """The run, locked; its schedule noted on the call's audit event (`note_schedule_of_run`)."""
        run = await run_store.get_run(self.db, conn, run_id, lock=True)
        if run is None:
            raise NotFound(f"id: no task schedule run {run_id}")
        note_schedule_of_run(run.schedule_id)
        return run

    async def _awaiting(self, conn: AsyncConnection, run: Run, action: str) -> Schedule:
        """The locked run's schedule; refused unless the run awaits approval and has not expired."""
        run_id = run.id
        if run.state != "awaiting_approval" or run.approval is None:
            raise FailedPrecondition(
                f"id: run {run_id} is {run.state}; only a run awaiting approval can be {action}"
            )
        if run.approval.expires_at <= await self.db.now(conn):
            raise FailedPrecondition(
                f"id: run {run_id} expired at {expiry_text(run.approval)} and can no longer be {action}"
            )
        schedule = await store.get_schedule(conn, run.schedule_id)
        assert schedule is not None  # runs are deleted with their schedule
        return schedule

    async def _within_its_window(self, conn: AsyncConnection, run: Run, schedule: Schedule) -> None:
        """Refuse to approve a run once its operation's own window has ended (a firmware upgrade's
        end_time, on the database's clock): each task it started would fail unrun at its claim, a rollout's
        wave after wave, so it is refused as a trigger then is (`domain.firing.window_ended_reason`),
        writing nothing. A run fired since its approval expires at that end (`domain.approvals.opened`) is
        refused as expired first; this refuses one fired before (a release before that rule), which awaits
        a rejection or its own expiry."""
        end = schedule.operation.window_end
        if end is not None and schedule.operation.window_over(await self.db.now(conn)):
            raise FailedPrecondition(
                f"id: run {run.id} cannot be approved: {window_ended_reason(end)}; reject it (or let it "
                "expire)"
            )

    async def approve(self, run_id: uuid.UUID, comment: str = "") -> RunReport:
        """The caller approves the run; with enough approvers it starts, exactly once (see the module). Its
        schedule deleted between this approval's commit and the run's submit: NotFound saying so
        (`firing.RunGone`), nothing submitted, as for a trigger. Deleted once the run's tasks were
        submitted: the answer is the run as it was last recorded, with those tasks, as a retry's is
        (`ScheduleService.fired_report`)."""
        check_description(comment, "comment")
        principal = caller_name() or ANONYMOUS
        now = self.clock.now()
        started: Firing | None = None
        approved: Run | None = None
        deciding = False
        try:
            async with self.db.transaction() as conn:
                run = await self._run(conn, run_id)
                schedule = await self._awaiting(conn, run, "approved")
                await self._within_its_window(conn, run, schedule)
                assert run.approval is not None
                check_approver(
                    run.approval, principal, schedule.last_edited_by, identified=caller_identified()
                )
                approval = with_approver(run.approval, Approver(principal, now, comment))
                deciding = True
                started = await self._decide(conn, run, schedule, approval, principal, now)
                approved = replace(run, state=_started_state(run), approval=approval)
        except Unavailable as exc:
            if not deciding:
                raise
            await self._in_doubt(
                run_id,
                exc,
                lambda approval: any(a.principal == principal for a in approval.approvers),
                what=f"{principal}'s approval",
                not_done=f"run {run_id} was not approved: nothing was approved",
                unknown=f"run {run_id} may have been approved by {principal}: look at the run (rackflow run "
                f"show {run_id}: its state and approvers) before approving it again",
            )
        if started is None:
            log.info("run %s: approved by %s, awaiting more approvers", run_id, principal)
        else:
            metrics.APPROVAL_DECISIONS.labels("approved").inc()
            log.info("run %s: approved by %s; starting it", run_id, principal, extra={"run_id": str(run_id)})
            assert approved is not None
            results = await self.schedules.fire_one(started)
            return await self.schedules.fired_report(started, approved, results)
        return await self.rollouts.get(run_id)

    async def _decide(
        self,
        conn: AsyncConnection,
        run: Run,
        schedule: Schedule,
        approval: RunApproval,
        principal: str,
        now: datetime,
    ) -> Firing | None:
        """Record `approval` (one more approver) on the locked run; the firing to fire once this commits
        when that makes enough approvers (the run is then "running" or "rolling", this instance's, for the
        sweep's heartbeat check: this instance fires it and writes it back, not the one that fired it),
        else None."""
        if not approval.approved:
            await run_history.decide_awaiting(conn, run, "awaiting_approval", approval)
            return None
        await self._no_live_rollout(conn, run)
        state = _started_state(run)
        started_at = await self.db.now(conn)
        if not await run_history.decide_awaiting(
            conn, run, state, approval, started_at=started_at, owner_id=self.schedules.instance_id
        ):
            raise FailedPrecondition(f"id: run {run.id} no longer awaits approval")
        pending = [o.scope_id for o in run.outcomes if o.outcome == "pending"]
        snapshot = await firing_store.load_starts(conn, schedule.id, pending, run.trigger)
        await outbox.record_events(
            conn, events.approval_decided(run, "approved", f"approved by {principal}", now)
        )
        return approved_firing(replace(run, approval=approval), snapshot, now)

    async def _in_doubt(
        self,
        run_id: uuid.UUID,
        lost: Unavailable,
        recorded: Callable[[RunApproval], bool],
        *,
        what: str,
        not_done: str,
        unknown: str,
    ) -> None:
        """A decision (`what`: whose approval or rejection) whose transaction lost its connection (`lost`)
        once it wrote: its COMMIT may have reached the database before the answer was lost. Returns if the
        database recorded it (`recorded`, asked of the run's approval as it stands), for the caller to go
        on as the decision would have: left alone, a run an approval started would never fire (its tasks
        never submitted) until the sweep interrupted it, and the decider, told UNAVAILABLE, could not
        approve it again, nor tell whether a rejection stands. Raises Unavailable saying `not_done` if it
        did not commit, or `unknown` (the run to look at) if it cannot tell (`firing.look_up_in_doubt`,
        `firing.settle_in_doubt`)."""

        async def look_up() -> bool:
            run = await firing.look_up_in_doubt(
                self.db,
                lambda conn: run_store.get_run(self.db, conn, run_id, lock=True, nowait=True),
                f"{what} of run {run_id}",
            )
            return run is not None and run.approval is not None and recorded(run.approval)

        await firing.settle_in_doubt(lost, look_up(), not_done=not_done, unknown=unknown)
        log.warning(
            "run %s: the commit outcome of %s was unknown (%s); it was recorded: going on",
            run_id,
            what,
            lost,
            extra={"run_id": str(run_id)},
        )

    async def _no_live_rollout(self, conn: AsyncConnection, run: Run) -> None:
        """Refuse to start a rollout while another of its schedule is live (one live rollout per schedule:
        a unique index). The planner skips firings while a run awaits approval, but once the schedule's
        approval policy is removed its firings roll out again beside the run still waiting."""
        if run.rollout is None:
            return
        live = (await run_store.live_rollouts(conn, [run.schedule_id])).get(run.schedule_id)
        if live is not None:
            raise FailedPrecondition(
                f"id: run {run.id} cannot start: the schedule's rollout (run {live.run_id}) is still "
                f"{live.state} (let it finish, or cancel it, first)"
            )

    async def reject(self, run_id: uuid.UUID, comment: str) -> RunReport:
        """The caller rejects the run, saying why: "rejected", nothing submitted. The same rejection asked
        again (the same caller and comment: a retry of one whose answer was lost) answers the run as it
        stands and writes nothing (`RunApproval.rejected_as`). One whose COMMIT goes unanswered asks, as an
        approval does, whether it stands (`_in_doubt`): answered with the run if so, UNAVAILABLE saying
        nothing was rejected if not."""
        if not check_description(comment, "comment").strip():
            raise InvalidArgument("comment: required: say why the run is rejected")
        principal = caller_name() or ANONYMOUS
        now = self.clock.now()
        reason = f"rejected by {principal}: {comment}"
        repeated = deciding = False
        try:
            async with self.db.transaction() as conn:
                run = await self._run(conn, run_id)
                repeated = run.approval is not None and run.approval.rejected_as(principal, comment)
                if not repeated:
                    schedule = await self._awaiting(conn, run, "rejected")
                    assert run.approval is not None
                    check_decider(
                        run.approval, principal, schedule.last_edited_by, identified=caller_identified()
                    )
                    approval = replace(run.approval, rejected_by=principal, comment=comment, decided_at=now)
                    deciding = True
                    outcomes = _not_started(run, "rejected")
                    await run_history.decide_awaiting(
                        conn, run, "rejected", approval, outcomes=outcomes, reason=reason
                    )
                    await outbox.record_events(conn, events.approval_decided(run, "rejected", reason, now))
        except Unavailable as exc:
            if not deciding:
                raise
            await self._in_doubt(
                run_id,
                exc,
                lambda approval: approval.rejected_as(principal, comment),
                what=f"{principal}'s rejection",
                not_done=f"run {run_id} was not rejected: nothing was rejected",
                unknown=f"run {run_id} may have been rejected by {principal}: look at the run (rackflow run "
                f"show {run_id}: its state), or reject it again with the same comment (answered with the run "
                "if this rejection stands)",
            )
        if repeated:
            log.info("run %s: %s already; answering as before", run_id, reason, extra={"run_id": str(run_id)})
        else:
            metrics.APPROVAL_DECISIONS.labels("rejected").inc()
            log.info("run %s: %s", run_id, reason, extra={"run_id": str(run_id)})
        return await self.rollouts.get(run_id)

    async def expire_overdue(self) -> list[Expired]:
        """Mark every run awaiting approval past its expiry "expired" (up to EXPIRED_PER_POLL), on the
        database's clock; returns them for the audit trail. Any instance may; each run expires once. A
        firmware upgrade's run whose window ends before its policy's timeout expires at that end, its reason
        naming it (`domain.approvals.describe_expiry`)."""
        expired: list[Expired] = []
        async with self.db.transaction() as conn:
            now: datetime = await self.db.now(conn)
            for run in await run_history.claim_expired_approvals(self.db, conn, now, EXPIRED_PER_POLL):
                assert run.approval is not None
                reason = describe_expiry(run.approval)
                approval = replace(run.approval, decided_at=now)
                outcomes = _not_started(run, "not approved in time")
                if await run_history.decide_awaiting(
                    conn, run, "expired", approval, outcomes=outcomes, reason=reason
                ):
                    expired.append(Expired(run, reason))
                    await outbox.record_events(conn, events.approval_decided(run, "expired", reason, now))
        for item in expired:
            metrics.APPROVAL_DECISIONS.labels("expired").inc()
            log.warning("run %s: expired: %s", item.run.id, item.reason, extra={"run_id": str(item.run.id)})
        return expired
