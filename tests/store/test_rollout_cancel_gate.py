"""A cancelled rollout starts nothing more, on both databases, even a task an executor was claiming at the
very moment of the cancel (docs/ROLLOUTS.md, "Cancel").

The cancel skips a task a claim holds (it waits on no claim: `TaskManager.cancel_not_begun_in`) and counts
it as left to that claim's start gates. That claim starts it only if no gate holds it there: it began first,
and runs on as the cancel lets every started task. But another gate before the rollout's (a freeze, a
budget) may hand it back at that very claim, PENDING as if never claimed, before the rollout's gate would
look at it: it has not begun, so when that hold ends and it is claimed again, the rollout's gate ends it
(`rollouts.gate`, TERMINATED, `its rollout was cancelled before it began`) and its rack is `not_started`,
as the cancel ends every task of the run that has not begun. It never runs hours after the cancel.

On PostgreSQL the cancel runs beside the open claim; SQLite's single writer opens no claim beside the
cancel's transaction, so there the cancel comes after the claim's commit and ends the held task itself:
the same end, by the cancel's own message.

Three racks, `max_concurrent_racks` 3: the first wave is all three, claimed at once with nothing holding
them; at that claim a freeze on r00 holds r00, or a budget of one running task holds the two after the
first.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from rackflow.budgets.service import BudgetInput
from rackflow.domain.inventory import Rack
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.tasks import Fail, OperationKind, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.rollouts.gate import CANCELLED_REASON
from rackflow.rollouts.service import RunReport
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.tasks.gates import Gated, consult
from rackflow.windows.service import Ref, WindowInput
from tests.store.schedules_support import Env, make_env
from tests.store.test_approvals import caller
from tests.store.test_rollout_halt_gate import OWNER, claim_in, get
from tests.store.test_rollouts import _run
from tests.store.test_rollouts import _schedule as rollout_schedule

ENDED_BY_THE_GATE = Fail(CANCELLED_REASON, ends_as=TaskStatus.TERMINATED)


async def claim(env: Env, *, running: tuple[uuid.UUID, ...] = (), cancel: uuid.UUID | None = None) -> Gated:
    """One executor claim with the start gates (what the gates made of it). `cancel`: that run is cancelled
    (by oncall) once the claim took its tasks, before its gates ask about them, in another transaction
    (PostgreSQL only)."""
    async with env.db.transaction() as conn:
        claimed = await claim_in(env, conn, running=running)
        if cancel is not None:
            with caller("oncall"):
                await env.services.rollouts.cancel(cancel)
        return await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())


async def hold_source(env: Env, gate: str, r00: Rack) -> uuid.UUID | None:
    """What will hold tasks at the next claim: a freeze on r00 for an hour, or a budget of one running task
    (its id, to delete it)."""
    if gate == "freeze":
        now = env.clock.now()
        when = OneOff(now - timedelta(seconds=1), now + timedelta(hours=1))
        await env.services.windows.create(
            WindowInput(name="long", kind=WindowKind.FREEZE, when=when, racks=(Ref(id=r00.id),))
        )
        return None
    budget = await env.services.budgets.create(BudgetInput("power", (OperationKind.POWER_OFF,), 1))
    return budget.id


async def lift(env: Env, gate: str, budget: uuid.UUID | None) -> None:
    """The hold is over: the freeze ended, or the budget was deleted (which releases its held tasks)."""
    if gate == "freeze":
        env.clock.advance(timedelta(hours=2))
    else:
        assert budget is not None
        await env.services.budgets.delete(budget)


def outcome_of(report: RunReport, task_id: uuid.UUID) -> tuple[str, str]:
    [outcome] = [o for o in report.run.outcomes if o.task_id == task_id]
    return outcome.outcome, outcome.error


@pytest.mark.parametrize("gate", ["freeze", "budget"])
async def test_a_task_another_gate_held_at_the_claim_beside_the_cancel_never_runs(
    db: Database, gate: str
) -> None:
    """Its claim came first, but it has not begun: the rollout's gate ends it when it comes back, and the
    tasks that claim started run on."""
    env = make_env(db)
    racks = [await env.rack(f"r{i:02d}") for i in range(3)]
    schedule = await rollout_schedule(env, racks, RolloutPolicy(max_concurrent_racks=3))
    first_wave = await env.services.schedules.trigger(schedule.id)
    assert [(await get(env, t)).held_by for t in first_wave] == [None] * 3  # nothing held them
    budget = await hold_source(env, gate, racks[0])
    run_id = (await _run(env, schedule)).run.id

    beside = db.is_postgres
    if beside:
        gated = await claim(env, cancel=run_id)
    else:
        gated = await claim(env)
        with caller("oncall"):
            await env.services.rollouts.cancel(run_id)
    started = tuple(task.id for task, _ in gated.claimed)
    held = [t for t in first_wave if t not in started]
    assert (len(started), len(held)) == ((2, 1) if gate == "freeze" else (1, 2))
    assert gated.failed == {}  # nothing held them before: their claim came first, and they run
    for task_id in started:
        assert (await get(env, task_id)).status is TaskStatus.RUNNING

    report = await env.services.rollouts.get(run_id)
    assert report.run.state == "cancelled"
    if beside:  # left to the claim's gates, which handed it back: not begun, and not ended yet
        assert (
            "0 of them by ending a task that had not begun; 3 task(s) an executor was claiming left to "
            "its start gate;" in report.run.reason
        )
        for task_id in held:
            task = await get(env, task_id)
            assert (task.status, task.held_by, task.started_at) == (TaskStatus.PENDING, gate, None)
            assert outcome_of(report, task_id) == ("submitted", "")
        assert report.progress is not None
        assert (report.progress.not_started, report.progress.active) == (0, 3)
    else:  # the cancel came after the claim, and ended it itself
        assert f"{len(held)} of them by ending a task that had not begun" in report.run.reason

    await lift(env, gate, budget)
    again = await claim(env, running=started)
    nothing_starts = [task.id for task, _ in again.claimed if task.id not in again.failed]
    assert nothing_starts == [], "a task of the cancelled rollout started after its cancel"
    ends = CANCELLED_REASON if beside else "its rollout was cancelled by oncall"
    if beside:
        assert again.failed == dict.fromkeys(held, ENDED_BY_THE_GATE)
        async with env.db.transaction() as conn:  # as its executor ends a task a gate refused
            ending = dict.fromkeys(held, (TaskStatus.TERMINATED, CANCELLED_REASON))
            assert await task_runs.finish(conn, ending, owner_id=OWNER, now=env.clock.now()) == set(held)
    report = await env.services.rollouts.get(run_id)
    for task_id in held:
        task = await get(env, task_id)
        assert (task.status, task.message) == (TaskStatus.TERMINATED, ends)
        assert outcome_of(report, task_id) == ("not_started", ends)
    for task_id in started:
        assert (await get(env, task_id)).status is TaskStatus.RUNNING
        assert outcome_of(report, task_id) == ("submitted", "")
    assert report.progress is not None
    assert (report.progress.not_started, report.progress.active) == (len(held), len(started))
