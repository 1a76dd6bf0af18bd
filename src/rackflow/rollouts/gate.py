"""The start gate of rollouts: a task of a rollout starts only while its rollout has room under its caps
(`max_concurrent_racks`, the per-domain cap), as the rollout step counts them, and never while its rollout
is halted (docs/ROLLOUTS.md).

The step submits a wave within the caps, so a task it just submitted always has room. One it did not
count may not: a rack its pre-flight checks held does not count against the caps (held, it is not in
flight), so the step may start another in its place. When the checks release it, whatever holds it next
(a freeze, a budget) or none, it reaches this gate, the last of the claim's (`Services.build`), and waits
here while the rollout is full, rather than start beside the rack that took its place (before this gate
the pre-flight gate counted the caps itself, only for the tasks it released at that claim: a freeze or a
budget holding the rack between its release and its start, or the check deleted, let it start past them).

A halted rollout starts nothing more, and that includes the racks whose tasks it submitted before the halt
but that have not begun: held by another gate (a freeze, a budget, a pre-flight check, their window's
opening), or not claimed yet. The halt holds those nothing held (`hold_stopped`), so each comes before
this gate when it would start, and stays held here, `held_by` "rollout", until the run is resumed (which
releases them at once: they keep their place, as the resume's rule counts them active) or cancelled (a
cancel ends them, `RolloutService.cancel_in`). A task that began before the halt (a retry's next attempt)
goes on: a halt stops nothing already started. The halt itself is the rollout's next step's to decide,
a second or so after the failure that reaches the limit; a failure frees the room a budget held another
of its tasks for, and a claim in between may come first: a task something held comes here then, and is
held until that step (`HALTING_REASON`), as the step's rule, asked here over the run as it stands, would
halt (`RolloutGate._halting`). The one thing that lets go of a task that has not begun
without this gate's look is a maintenance window's change (`tasks.deferrals`: a task waiting for its
window's opening, released when the windows open its rack now, held by nothing then); it locks the run's
row first, as a halt does, and a task it lets go of a halted or cancelled rollout is held here again in
its transaction (`hold_stopped`), so that a claim never starts it without asking this gate. The gate
need not look at every task of a rollout at every claim (a statement each) to keep that.

A cancelled rollout starts nothing more either: its cancel ends its tasks that have not begun, but skips
those a claim holds at that moment (it waits on no claim). A claim that took such a task before the cancel
committed starts it only if nothing held it before and no gate holds it at that claim (it began first).
One something held before comes here at that claim, which finds the run's row held by the cancel and
holds the task, held by this gate, until the next claim (`ROLLOUT_BUSY_WAIT`, below); one a gate before
this one hands back at that claim (a freeze, a budget: it has not begun, PENDING as if never claimed)
comes here at the claim that takes it once that hold ends. Either
is ended as the cancel would have ended it (`Fail`, TERMINATED), as is any task of a cancelled rollout at
its first attempt that comes here: letting the second run would start it after the cancel, hours after if
a freeze held it. Its scope in the run becomes "not_started", as the cancel's other not-begun racks did
(`settled_scopes`).

The claim never waits here for a run's row. It holds its tasks' rows, and in a round that ended tasks
their racks' (`tasks.manager.TaskManager.let_go_in`), while whoever holds a run's row may wait for a rack:
a rollout's step (its submission) or cancel, a window's change (`tasks.deferrals`) lock a run's row, then
its racks'. So the run rows are taken only if free (`store.rollouts.lock_rollouts`: `FOR UPDATE SKIP
LOCKED`), and a task of a run another transaction holds is held (`BUSY_REASON`) for `ROLLOUT_BUSY_WAIT`,
not decided: the claim after it decides it, by the run as that transaction left it (the lock order atop
`rackflow.tasks.executor`).

That end is the executor's to record, after the claim committed; if its instance dies first, the task
is RUNNING, ownerless, and taken over by another claim, which no gate's `check` looks at (it began).
The claim recorded the refusal on the task with the scope's "not_started" mark (`Task.refusal`, as for
every gate's refusal: `rackflow.tasks.gates`), so a takeover ends it as this gate did, rather than run it
beside a run that says it did not start. A task of a cancelled rollout that did begin (its scope
"submitted") goes on, as the cancel lets it. A halt ends nothing, and its holds are written by the claim
itself (PENDING): no takeover follows.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.checks.gate import GATE_NAME as PREFLIGHT_GATE
from rackflow.config import ROLLOUT_BUSY_WAIT, ROLLOUT_CAP_WAIT, ROLLOUT_HALT_WAIT
from rackflow.domain.rollouts import Phase, RackPlace, ScopeView, caps_reached, decide, limit_reached
from rackflow.domain.schedules import Outcome, Run, ScopeOutcome
from rackflow.domain.tasks import Fail, Hold, Task, TaskStatus
from rackflow.store import rollouts as store
from rackflow.store.db import Database, in_id_order
from rackflow.store.schedules import Tally
from rackflow.tasks.gates import Verdict

GATE_NAME = "rollout"


# Why a task of a cancelled rollout that a claim took while the cancel ended the others ends.
CANCELLED_REASON = "its rollout was cancelled before it began"
_CANCELLED = Fail(CANCELLED_REASON, ends_as=TaskStatus.TERMINATED)
# Why a task is held whose rollout's run another transaction held at its claim (ROLLOUT_BUSY_WAIT).
BUSY_REASON = "waits for its rollout: a step, a resume, a cancel or a window's change was deciding it"
# Why a task is held whose rollout reached its failure limit, before the step that halts it.
HALTING_REASON = "waits for its rollout to halt"


def halted_hold(reason: str, now: datetime) -> Hold:
    """How a halted rollout (halted for `reason`) holds a task of it that has not begun."""
    return Hold(now + ROLLOUT_HALT_WAIT, f"waits for its rollout to be resumed: {reason}")


async def hold_stopped(
    conn: AsyncConnection, runs: Mapping[uuid.UUID, store.LockedRun], now: datetime
) -> dict[uuid.UUID, str]:
    """Bring before this gate the tasks that have not begun and that nothing holds of those of `runs`
    (their rows locked by the caller, as the lock found them) that are halted or cancelled: held by it
    (`store.rollouts.hold_unstarted`), by a halted run until its resume (`halted_hold`), by a cancelled
    one until now, so that the next claim's gate here ends them, their racks "not_started"; which tasks
    it held, and by whom (this gate). A halt does this as it halts. So does a window's change that let go
    of a task of such a run, which its window held when the run halted or was cancelled: held, the task
    came before this gate when its window's opening came; let go, nothing held it, and the claim would
    start it without asking this gate (`tasks.deferrals`). Nothing else lets go of a task that has not
    begun without a gate's look (a resume or another gate's release keeps `held_by`)."""
    held: dict[uuid.UUID, str] = {}
    for run_id, run in runs.items():
        if run.state == "halted":
            hold = halted_hold(run.reason, now)
        elif run.state == "cancelled":
            hold = Hold(now, CANCELLED_REASON)
        else:
            continue
        held |= dict.fromkeys(await store.hold_unstarted(conn, run_id, GATE_NAME, hold, now), GATE_NAME)
    return held


# A task ended so counts against the failure limit.
FAILED_STATUSES = (TaskStatus.FAILED, TaskStatus.TERMINATED)


def scope_phase(outcome: ScopeOutcome, task: store.TaskState | None) -> Phase:
    """Where a scope stands, from its recorded outcome and (once submitted) its task."""
    if outcome.outcome == "pending":
        return Phase.PENDING
    if outcome.outcome == "not_started":
        return Phase.NOT_STARTED
    if outcome.outcome in ("skipped_overlap", "skipped_window", "missed"):  # settled without a task
        return Phase.SKIPPED
    if outcome.outcome == "failed" or task is None:  # not submitted, or its rack (and task) deleted
        return Phase.FAILED
    if task.status is TaskStatus.PENDING and task.held_by == PREFLIGHT_GATE:
        return Phase.HELD
    if task.status.is_active:
        return Phase.ACTIVE
    return Phase.FAILED if task.status in FAILED_STATUSES else Phase.SUCCEEDED


def unbegun(task: store.TaskState) -> bool:
    """Its task has not begun acting (as a halt finds it: `store.tasks.not_begun_of_run`)."""
    return task.status in (TaskStatus.PENDING, TaskStatus.WAITING) and task.attempt == 1


def scope_views(
    run: Run,
    tasks: Mapping[tuple[uuid.UUID, uuid.UUID], store.TaskState],
    places: Mapping[uuid.UUID, RackPlace],
) -> list[ScopeView]:
    """The run's scopes as the rollout rule sees them (`domain.rollouts.decide`), in its order: a rollout's
    step and this gate read them alike. `places` names the racks and their domains (without: the rack id,
    no domain)."""
    views = []
    for outcome in run.outcomes:
        task = tasks.get((run.id, outcome.rack_id))
        place = places.get(outcome.rack_id)
        phase = scope_phase(outcome, task)
        views.append(
            ScopeView(
                outcome.scope_id,
                outcome.rack_id,
                place.name if place else str(outcome.rack_id),
                place.domain_id if place else None,
                phase,
                outcome.canary,
                task.finished_at if task else None,
                unbegun=phase is Phase.ACTIVE and task is not None and unbegun(task),
            )
        )
    return views


def failures_at_most(tally: Tally, counts: store.RunTaskCounts) -> int:
    """How many of the run's scopes the rule could count failed (`scope_phase`), at most, from its tally
    by outcome (`LockedRollout.tally`) and its tasks' counts (`store.run_task_counts`), without its
    outcomes: those whose submission failed ("failed"), those submitted with no task named, its tasks that
    failed or were terminated, and its tasks that are gone (deleted with their rack, or pruned): a scope
    names its task (`task_id`) from the transaction that submitted it on, so the tasks its scopes name
    less the tasks it has (`present`) are the difference. A scope settled otherwise whose task failed (a
    window's change that ended it) is counted too, which only errs high."""
    named = sum(count for (_, has_task), count in tally.items() if has_task)
    unnamed_submitted = tally.get(("submitted", False), 0)
    return (
        tally.get(("failed", False), 0)
        + tally.get(("failed", True), 0)
        + unnamed_submitted
        + counts.failed
        + max(0, named - counts.present)
    )


def could_halt_counted(run: store.LockedRollout, counts: store.RunTaskCounts) -> bool:
    """Whether the rollout rule could halt the run now, by what the gate has read already (its locked row
    and its tasks' counts): only then is it read whole (`RolloutGate._halting`, its outcomes: one entry per
    rack, hundreds of ms at 10,000 racks, docs/PERFORMANCE.md). It could while the failures it could count
    reach its limit (`limit_reached`, asked with `failures_at_most`), or, for a run with canaries not
    resumed past their gate, while any scope could count failed (a failed canary halts it)."""
    if run.state != "rolling":
        return False  # the rule is asked of a rolling run only
    if run.tally is None:
        return True  # a run written before its tally was kept: read it whole
    most = failures_at_most(run.tally, counts)
    if run.policy.canary_racks and not run.resumed and most:
        return True
    total = sum(run.tally.values())
    return limit_reached(run.policy, max(0, most - run.failures_excused), total) is not None


class RolloutGate:
    """Holds a rollout's task while its rollout is halted or at a cap; ends one whose rollout was
    cancelled before it began."""

    name = GATE_NAME

    def __init__(self, db: Database) -> None:
        self.db = db

    async def check(
        self, conn: AsyncConnection, tasks: Sequence[Task], now: datetime
    ) -> dict[uuid.UUID, Verdict]:
        """Only a task something held before this claim is looked at (`held_by` as claimed): one the step
        submitted and nothing held was counted by the step itself, and a halt holds every one it finds
        not begun, so a fresh task, of a rollout or not, costs no statement. For the others, their runs'
        policies are read once, and each rollout run's row is locked (in id order, in one statement) until
        the claim commits, so two claims, or a claim and a rollout step (its halt), decide one after the
        other; plain firings' runs are not locked. A run whose row another transaction holds is not
        waited for: its tasks are held until the next claim (`ROLLOUT_BUSY_WAIT`). A halted run's tasks at
        their first attempt are held, a cancelled run's are ended, and their scopes marked "not_started"
        in the run, in this claim's transaction, as the cancel marks those it ended; the rest are counted
        against their caps."""
        of_runs = [task for task in tasks if task.run_id is not None and task.held_by is not None]
        if not of_runs:
            return {}
        runs, busy = await store.lock_rollouts(self.db, conn, {t.run_id for t in of_runs if t.run_id})
        holds: dict[uuid.UUID, Verdict] = {}
        starting: list[Task] = []
        cancelled: dict[uuid.UUID, list[uuid.UUID]] = defaultdict(list)
        for task in of_runs:
            assert task.run_id is not None
            run = runs.get(task.run_id)
            if task.run_id in busy:
                holds[task.id] = Hold(now + ROLLOUT_BUSY_WAIT, BUSY_REASON)
            elif run is not None and run.state == "halted" and task.attempt == 1:
                holds[task.id] = halted_hold(run.reason, now)
            elif run is not None and run.state == "cancelled" and task.attempt == 1:
                holds[task.id] = _CANCELLED
                cancelled[task.run_id].append(task.id)
            elif run is not None:
                starting.append(task)
        if cancelled:  # their racks did not start: the run says so, as the cancel says of the others
            not_started: tuple[Outcome, str] = ("not_started", CANCELLED_REASON)
            await store.settle_scopes(
                conn, {run_id: dict.fromkeys(ended, not_started) for run_id, ended in cancelled.items()}
            )
        if not starting:
            return holds
        # The run's tasks are counted in SQL, not read (10,000 states at 10,000 racks): how many it has and
        # how many failed for its failure limit, how many count against its caps. Only a rollout that may
        # halt (a failure limit, or canaries) or has a cap needs them.
        may_halt = {
            run_id
            for run_id in {t.run_id for t in starting if t.attempt == 1 and t.run_id is not None}
            if (policy := runs[run_id].policy).halt_after_failures
            or policy.halt_after_failure_percent
            or policy.canary_racks
        }
        capped = {
            t.run_id
            for t in starting
            if t.run_id
            and (runs[t.run_id].policy.max_concurrent_racks or runs[t.run_id].policy.max_per_domain)
        }
        counts = await self._counts(conn, may_halt | capped, starting)
        # Only a rollout that could be halting now by its tally and its tasks (`could_halt_counted`) is read
        # whole here.
        no_tasks = store.RunTaskCounts()
        halt_looks = {
            run_id for run_id in may_halt if could_halt_counted(runs[run_id], counts.get(run_id, no_tasks))
        }
        first = [t for t in starting if t.attempt == 1 and t.run_id in halt_looks]
        halting = await self._halting(conn, first, now) if first else {}
        for task in starting:
            if task.run_id in halting and task.attempt == 1:
                holds[task.id] = Hold(now + ROLLOUT_BUSY_WAIT, f"{HALTING_REASON}: {halting[task.run_id]}")
        if any(task.id in holds for task in starting):
            # Those held for the halt were claimed: they count against the caps as they stand, as before
            # this claim, so the rest are counted again without them among the claim's own.
            starting = [task for task in starting if task.id not in holds]
            counts = await self._counts(conn, capped, starting) if starting else {}
        if not starting:
            return holds
        # The racks' domains matter only under a per-domain cap, and then only those of the racks this
        # claim would start: the run's others are counted by domain in SQL (a rack with no place counts as
        # a domain of its own).
        per_domain = {t.run_id for t in starting if t.run_id and runs[t.run_id].policy.max_per_domain}
        placed = {t.rack_id for t in starting if t.run_id in per_domain}
        places = await store.rack_places(conn, placed) if placed else {}

        def domain(rack_id: uuid.UUID) -> uuid.UUID:
            place = places.get(rack_id)
            return place.domain_id if place is not None and place.domain_id is not None else rack_id

        # What counts against the caps, as the rollout step counts it: its tasks active and not held by
        # pre-flight checks, besides those this claim decides on (added one by one below, in claim order),
        # in all and in the domains of the racks this claim would start.
        in_domain: dict[tuple[uuid.UUID, uuid.UUID], int] = defaultdict(int)
        if per_domain:
            in_domain.update(
                await store.active_by_domain(
                    conn,
                    per_domain,
                    {domain(t.rack_id) for t in starting if t.run_id in per_domain},
                    uncounted_holder=PREFLIGHT_GATE,
                    deciding={task.id for task in starting},
                )
            )
        active = {run_id: counts.get(run_id, no_tasks).active for run_id in capped}
        for task in starting:
            assert task.run_id is not None
            if task.run_id not in capped:
                continue
            key = (task.run_id, domain(task.rack_id))
            full = caps_reached(runs[task.run_id].policy, active[task.run_id], in_domain[key])
            if full:
                holds[task.id] = Hold(
                    now + ROLLOUT_CAP_WAIT, f"waits for room under its rollout's caps: {full}"
                )
            else:
                active[task.run_id] += 1
                in_domain[key] += 1
        return holds

    async def _counts(
        self, conn: AsyncConnection, run_ids: Collection[uuid.UUID], starting: Collection[Task]
    ) -> dict[uuid.UUID, store.RunTaskCounts]:
        """`store.run_task_counts` of these runs as this gate counts: the caps leave out a task its
        pre-flight checks hold and the claim's own (`starting`, added one by one)."""
        if not run_ids:
            return {}
        return await store.run_task_counts(
            conn,
            run_ids,
            failed_statuses=FAILED_STATUSES,
            uncounted_holder=PREFLIGHT_GATE,
            deciding={task.id for task in starting},
        )

    async def _halting(
        self,
        conn: AsyncConnection,
        first: Collection[Task],
        now: datetime,
    ) -> dict[uuid.UUID, str]:
        """The runs of these tasks (at their first attempt, their rows locked by this claim) that the
        rollout rule would halt now, with why: a failure that reached the limit ended a task, which may
        free the room a budget held one of them for, and this claim may come before the rollout's next
        step, which halts the run; the task waits for it (`HALTING_REASON`) rather than start one rack
        after the limit. The tasks this claim decides count as not begun (the claim has marked them)."""
        deciding = {task.id for task in first}
        states = await store.task_states(conn, {task.run_id for task in first if task.run_id is not None})
        found: dict[uuid.UUID, str] = {}
        for run_id in in_id_order({task.run_id for task in first if task.run_id is not None}):
            run = await store.get_run(self.db, conn, run_id)
            if run is None or run.rollout is None or run.state != "rolling":
                continue
            seen = {
                key: replace(state, status=TaskStatus.PENDING) if state.task_id in deciding else state
                for key, state in states.items()
                if key[0] == run_id
            }
            decision = decide(
                run.rollout,
                scope_views(run, seen, {}),
                now=now,
                failures_excused=run.failures_excused,
                resumed=run.resumed,
            )
            if decision.halt is not None:
                found[run_id] = decision.halt
        return found
