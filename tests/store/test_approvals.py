"""Approval on both databases (docs/SAFETY.md, "Approval"): a firing awaits approval with its plan frozen
and submits nothing; approved, it starts once through the firing path; rejected or expired, never; the
two-person rule and min_approvers; the next firing while one awaits. tests/e2e/test_approval.py proves
"starts once" with two real instances on PostgreSQL.

The fake clock starts at the real time here: on PostgreSQL the expiry is decided on the database's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from rackflow.clock import FakeClock
from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.audit import EXPIRE_RUN, EventFilter
from rackflow.domain.firing import Firing
from rackflow.domain.inventory import Rack
from rackflow.domain.notifications import Event, EventType
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy, Schedule
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind, WindowPolicy
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from rackflow.rollouts.service import RunReport
from rackflow.schedules import firing
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.security import Principal, Role, current_principal
from rackflow.services import Services
from rackflow.store import outbox
from rackflow.store import runs as run_history
from rackflow.store import schedules as schedule_store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule, task_schedule_run
from rackflow.timespec import format_rfc3339
from rackflow.windows.service import Ref, WindowInput
from tests.store.schedules_support import HOURLY, POWER_OFF, Env, rack_target

pytestmark = pytest.mark.asyncio

FOUR_HOURS = timedelta(hours=4)
SECOND = timedelta(seconds=1)


def _env(db: Database, start: datetime | None = None) -> Env:
    clock = FakeClock(start or datetime.now(UTC))
    return Env(db, clock, Services.build(db, clock))


@contextlib.contextmanager
def caller(name: str, role: Role = Role.APPROVER) -> Iterator[None]:
    """Calls made inside come from `name`, known by its token (as the API's interceptor publishes it)."""
    reset = current_principal.set(Principal(name, role, "token"))
    try:
        yield
    finally:
        current_principal.reset(reset)


async def _schedule(
    env: Env, racks: Sequence[Rack], approvers: int = 1, rollout: RolloutPolicy | None = None
) -> Schedule:
    return await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(*racks),
        rollout=rollout,
        approval=ApprovalPolicy(FOUR_HOURS, approvers),
    )


async def _runs(env: Env, schedule: Schedule) -> list[RunReport]:
    runs, _ = await env.services.schedules.list_runs(schedule.id)
    return await env.services.rollouts.reports(runs)


async def _tasks(env: Env, schedule: Schedule) -> list[Task]:
    found, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    return found


async def test_a_firing_awaits_approval_then_starts_its_frozen_plan_once(db: Database) -> None:
    env = _env(db)
    racks = [await env.rack("r1"), await env.rack("r2")]
    schedule = await _schedule(env, racks)

    assert await env.services.schedules.trigger(schedule.id) == []
    (waiting,) = await _runs(env, schedule)
    assert waiting.run.state == "awaiting_approval"
    assert sorted(o.rack_id for o in waiting.run.outcomes) == sorted(r.id for r in racks)
    assert {o.outcome for o in waiting.run.outcomes} == {"pending"}
    assert waiting.run.approval is not None
    assert waiting.run.approval.expires_at == waiting.run.fired_at + FOUR_HOURS
    assert await _tasks(env, schedule) == []
    # Another trigger meanwhile is refused, naming the run, and records nothing.
    with pytest.raises(FailedPrecondition, match=f"run {waiting.run.id}\\) is still awaiting approval"):
        await env.services.schedules.trigger(schedule.id)
    assert len(await _runs(env, schedule)) == 1

    env.clock.advance(timedelta(minutes=5))
    approved = await env.services.approvals.approve(waiting.run.id, "looks right")

    assert approved.run.state == "completed"
    assert approved.run.approval is not None and [a.principal for a in approved.run.approval.approvers] == [
        "anonymous"
    ]
    tasks = await _tasks(env, schedule)
    assert sorted(t.rack_id for t in tasks) == sorted(r.id for r in racks)
    assert {t.run_id for t in tasks} == {waiting.run.id}
    assert {o.outcome for o in approved.run.outcomes} == {"submitted"}
    with pytest.raises(
        FailedPrecondition, match="is completed; only a run awaiting approval can be approved"
    ):
        await env.services.approvals.approve(waiting.run.id)
    assert len(await _tasks(env, schedule)) == 2
    assert [(e.type, e.run_id) for e in await _events(env)] == [
        (EventType.RUN_AWAITING_APPROVAL, waiting.run.id),
        (EventType.RUN_APPROVED, waiting.run.id),
    ]


async def _events(env: Env) -> list[Event]:
    """The notification events recorded, oldest first (each in the transaction of its change)."""
    async with env.db.read() as conn:
        return list(reversed(await outbox.list_events(conn, 100)))


async def test_two_approvals_at_once_start_the_run_once(db: Database) -> None:
    env = _env(db)
    schedule = await _schedule(env, [await env.rack("r1")])
    await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)

    async def approve(name: str) -> RunReport | Exception:
        with caller(name):
            try:
                return await env.services.approvals.approve(waiting.run.id)
            except FailedPrecondition as exc:
                return exc

    results = await asyncio.gather(approve("ann"), approve("bob"))

    assert sum(isinstance(r, FailedPrecondition) for r in results) == 1
    assert len(await _tasks(env, schedule)) == 1


async def test_the_two_person_rule_and_min_approvers(db: Database) -> None:
    env = _env(db)
    with caller("editor", Role.OPERATOR):
        schedule = await _schedule(env, [await env.rack("r1")], approvers=2)
        await env.services.schedules.trigger(schedule.id)
    assert schedule.last_edited_by == "editor"
    (waiting,) = await _runs(env, schedule)
    run_id = waiting.run.id

    with caller("editor"), pytest.raises(PermissionDenied, match="'editor' last edited the schedule"):
        await env.services.approvals.approve(run_id)
    with caller("ann"):
        report = await env.services.approvals.approve(run_id, "one")
    assert report.run.state == "awaiting_approval" and await _tasks(env, schedule) == []
    with caller("ann"), pytest.raises(FailedPrecondition, match="'ann' has already approved this run"):
        await env.services.approvals.approve(run_id)
    # Editing the scope makes its editor the last editor: bob may no longer approve.
    with caller("bob", Role.OPERATOR):
        await env.services.schedules.add_scope(schedule.id, rack_target(await env.rack("r2")))
    with caller("bob"), pytest.raises(PermissionDenied, match="'bob' last edited"):
        await env.services.approvals.approve(run_id)
    with caller("cat"):
        report = await env.services.approvals.approve(run_id, "two")
    assert report.run.state == "completed"
    assert report.run.approval is not None
    assert [(a.principal, a.comment) for a in report.run.approval.approvers] == [
        ("ann", "one"),
        ("cat", "two"),
    ]
    # The frozen plan was r1 alone; r2 joined the scope after the firing and is not in it.
    assert len(await _tasks(env, schedule)) == 1


async def test_the_editor_a_run_fired_from_may_not_approve_it_after_someone_else_edits(db: Database) -> None:
    """The two-person rule binds the run to whoever last edited the schedule when it fired: another's edit
    since (a new name, say) does not let that editor approve what they set up themselves."""
    env = _env(db)
    with caller("editor", Role.OPERATOR):
        schedule = await _schedule(env, [await env.rack("r1")])
        await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)
    with caller("bob", Role.OPERATOR):
        await env.services.schedules.update(schedule.id, ["schedule.name"], name="fw-tidied")

    with caller("editor"), pytest.raises(PermissionDenied, match="'editor' last edited the schedule"):
        await env.services.approvals.approve(waiting.run.id)
    with caller("editor"), pytest.raises(PermissionDenied, match="'editor' last edited the schedule"):
        await env.services.approvals.reject(waiting.run.id, "mine")
    with caller("bob"), pytest.raises(PermissionDenied, match="'bob' last edited the schedule"):
        await env.services.approvals.approve(waiting.run.id)
    assert await _tasks(env, schedule) == []
    with caller("ann"):
        assert (await env.services.approvals.approve(waiting.run.id)).run.state == "completed"


async def test_a_rejected_run_never_starts(db: Database) -> None:
    env = _env(db)
    schedule = await _schedule(env, [await env.rack("r1")])
    await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)

    with pytest.raises(InvalidArgument, match=r"^comment: required"):
        await env.services.approvals.reject(waiting.run.id, " ")
    with caller("ann"):
        report = await env.services.approvals.reject(waiting.run.id, "not during the freeze")

    assert report.run.state == "rejected"
    assert report.run.reason == "rejected by ann: not during the freeze"
    assert [(o.outcome, o.error) for o in report.run.outcomes] == [("not_started", "rejected")]
    assert report.run.approval is not None and report.run.approval.rejected_by == "ann"
    with pytest.raises(FailedPrecondition, match="is rejected; only a run awaiting approval can be approved"):
        await env.services.approvals.approve(waiting.run.id)
    assert await _tasks(env, schedule) == []
    # The schedule fires again: the next firing awaits approval anew.
    env.clock.advance(timedelta(minutes=1))
    assert await env.services.schedules.trigger(schedule.id) == []
    assert [r.run.state for r in await _runs(env, schedule)] == ["awaiting_approval", "rejected"]


async def test_one_who_approved_may_still_reject(db: Database) -> None:
    """ann approved a run that needs two approvers, then changed her mind: her rejection stands, and the
    run never starts; her approval stays on its record."""
    env = _env(db)
    with caller("editor", Role.OPERATOR):
        schedule = await _schedule(env, [await env.rack("r1")], approvers=2)
        await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)
    with caller("ann"):
        await env.services.approvals.approve(waiting.run.id, "looks right")
        report = await env.services.approvals.reject(waiting.run.id, "wrong firmware after all")

    assert report.run.state == "rejected"
    assert report.run.reason == "rejected by ann: wrong firmware after all"
    assert report.run.approval is not None and report.run.approval.rejected_by == "ann"
    assert [a.principal for a in report.run.approval.approvers] == ["ann"]
    assert await _tasks(env, schedule) == []
    assert [e.type for e in await _events(env)] == [EventType.RUN_AWAITING_APPROVAL, EventType.RUN_REJECTED]


async def test_a_run_past_its_timeout_expires_once_audited_as_rackflow(db: Database) -> None:
    env = _env(db, datetime.now(UTC) - FOUR_HOURS - timedelta(minutes=1))
    schedule = await _schedule(env, [await env.rack("r1")])
    await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)
    env.clock.advance(FOUR_HOURS + timedelta(minutes=1))

    with pytest.raises(FailedPrecondition, match=r"expired at .* and can no longer be approved"):
        await env.services.approvals.approve(waiting.run.id)
    dispatchers = [
        Dispatcher(env.services.schedules, env.services.audit, approvals=approvals)
        for approvals in (env.services.approvals, _env(db).services.approvals)
    ]
    for dispatcher in dispatchers:
        await dispatcher.expire_approvals()

    (expired,) = await _runs(env, schedule)
    assert expired.run.state == "expired"
    assert expired.run.reason.startswith("not approved by ") and expired.run.reason.endswith(
        "(0 of 1 approver)"
    )
    assert [o.outcome for o in expired.run.outcomes] == ["not_started"]
    (event,), _ = await env.services.audit.list_events(EventFilter(method=EXPIRE_RUN))
    assert event.principal == "rackflow" and event.target_ids == (str(schedule.id), str(waiting.run.id))
    assert await _tasks(env, schedule) == []
    assert [(e.type, e.principal, e.run_id) for e in await _events(env)] == [
        (EventType.RUN_AWAITING_APPROVAL, "rackflow", waiting.run.id),
        (EventType.RUN_EXPIRED, "rackflow", waiting.run.id),
    ]


async def _due_now(env: Env, schedule: Schedule) -> None:
    """Make the schedule due on both databases' clocks (PostgreSQL's is the real one)."""
    current = await env.services.schedules.get(schedule.id)
    async with env.db.transaction() as conn:
        await schedule_store.save_schedule(conn, replace(current, next_run_at=env.clock.now() - SECOND))


async def _dispatched_awaiting(env: Env) -> tuple[Schedule, Dispatcher, RunReport]:
    """A schedule over one rack that needs approval, its dispatcher, and the run a dispatch left awaiting."""
    schedule = await _schedule(env, [await env.rack("r1")])
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)
    await _due_now(env, schedule)
    assert await dispatcher.poll_once() == 1
    (waiting,) = await _runs(env, schedule)
    return schedule, dispatcher, waiting


async def test_a_dispatched_firing_while_one_awaits_is_skipped_and_the_awaiting_run_is_kept(
    db: Database,
) -> None:
    env = _env(db)
    schedule, dispatcher, waiting = await _dispatched_awaiting(env)
    assert waiting.run.state == "awaiting_approval" and waiting.run.trigger == "dispatch"

    env.clock.advance(SECOND)
    await _due_now(env, schedule)
    await dispatcher.poll_once()

    skipped, first = await _runs(env, schedule)
    assert first.run.id == waiting.run.id and first.run.state == "awaiting_approval"
    assert skipped.run.state == "skipped"
    assert f"run {waiting.run.id}) is still awaiting approval" in skipped.run.reason
    # History pruning keeps the run that awaits approval however many firings were skipped since.
    async with db.transaction() as conn:
        await run_history.prune_runs(conn, {schedule.id}, keep=1)
    assert {r.run.id for r in await _runs(env, schedule)} == {skipped.run.id, waiting.run.id}
    report = await env.services.approvals.approve(waiting.run.id)
    assert report.run.state == "completed" and len(await _tasks(env, schedule)) == 1


async def test_a_run_approved_after_the_cap_passed_it_is_kept_by_its_own_write_back(db: Database) -> None:
    """The firings skipped while a run awaited approval are newer than it: once a cap's worth of them came,
    the approved run (running, then completed by its write-back) is past the newest RUNS_KEPT_PER_SCHEDULE.
    Its write-back must not prune it: the approval would start its tasks and then answer NOT_FOUND."""
    env = _env(db)
    schedule, _, waiting = await _dispatched_awaiting(env)
    skipped = [
        {
            "id": uuid.uuid4(),
            "schedule_id": schedule.id,
            "fired_at": waiting.run.fired_at + k * SECOND,
            "scheduled_for": waiting.run.fired_at + k * SECOND,
            "trigger": "dispatch",
            "state": "skipped",
            "outcomes": [],
        }
        for k in range(1, run_history.RUNS_KEPT_PER_SCHEDULE + 1)
    ]
    async with db.transaction() as conn:
        await conn.execute(insert(task_schedule_run), skipped)
        counted = update(task_schedule).where(task_schedule.c.id == schedule.id)
        await conn.execute(counted.values(run_count=run_history.prune_at(schedule.id)))  # it looks

    env.clock.advance(timedelta(minutes=5))
    report = await env.services.approvals.approve(waiting.run.id)

    assert report.run.state == "completed" and len(await _tasks(env, schedule)) == 1
    async with db.read() as conn:
        runs = set((await conn.execute(select(task_schedule_run.c.id))).scalars())
    assert runs == {waiting.run.id, *(run["id"] for run in skipped)}


async def test_an_approved_rollout_starts_by_its_waves(db: Database) -> None:
    env = _env(db)
    racks = [await env.rack(f"r{i}") for i in range(3)]
    schedule = await _schedule(env, racks, rollout=RolloutPolicy(canary_racks=1))
    await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)
    assert waiting.run.state == "awaiting_approval"
    assert [o.canary for o in waiting.run.outcomes] == [True, False, False]

    report = await env.services.approvals.approve(waiting.run.id)

    assert report.run.state == "rolling"
    (task,) = await _tasks(env, schedule)
    assert task.rack_id == racks[0].id  # the canary, first by rack name


async def test_a_firing_skipped_for_a_live_rollout_asks_for_no_approval(db: Database) -> None:
    """A dispatched firing while the approved rollout still rolls is skipped: no approval is opened on it
    and no one is told it awaits one (an alert that approving, rejecting or expiring could never clear)."""
    env = _env(db)
    schedule = await _schedule(env, [await env.rack("r1"), await env.rack("r2")], rollout=RolloutPolicy(1))
    assert await env.services.schedules.trigger(schedule.id) == []
    (waiting,) = await _runs(env, schedule)
    env.clock.advance(SECOND)
    assert (await env.services.approvals.approve(waiting.run.id)).run.state == "rolling"

    await _due_now(env, schedule)
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)
    assert await dispatcher.poll_once() == 0  # recorded skipped, nothing to fire

    skipped, rolling = await _runs(env, schedule)
    assert rolling.run.id == waiting.run.id and rolling.run.state == "rolling"
    assert skipped.run.state == "skipped" and skipped.run.approval is None
    assert [(e.type, e.run_id) for e in await _events(env)] == [
        (EventType.RUN_AWAITING_APPROVAL, waiting.run.id),
        (EventType.RUN_APPROVED, waiting.run.id),
    ]


async def test_a_trigger_its_approver_approves_starts_at_once(db: Database) -> None:
    env = _env(db)
    with caller("editor", Role.OPERATOR):
        schedule = await _schedule(env, [await env.rack("r1")])
    with caller("editor"), pytest.raises(PermissionDenied, match=r"^approve: 'editor' last edited"):
        await env.services.schedules.trigger(schedule.id, approve=True)
    assert await _runs(env, schedule) == []
    with caller("ann"):
        (task_id,) = await env.services.schedules.trigger(schedule.id, approve=True)
    (run,) = await _runs(env, schedule)
    assert run.run.state == "completed" and run.run.approval is not None
    assert [a.principal for a in run.run.approval.approvers] == ["ann"]
    assert [t.id for t in await _tasks(env, schedule)] == [task_id]


async def test_a_waiting_rollout_does_not_start_beside_a_live_one(db: Database) -> None:
    """Its schedule's approval policy was removed while it waited: the next firing rolls out at once, and
    approving the waiting one is refused until that rollout ends (one live rollout per schedule)."""
    env = _env(db)
    racks = [await env.rack("r1"), await env.rack("r2")]
    schedule = await _schedule(env, racks, rollout=RolloutPolicy(max_concurrent_racks=1))
    await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)
    await env.services.schedules.update(schedule.id, ["schedule.approval"], approval=None)
    env.clock.advance(SECOND)
    await env.services.schedules.trigger(schedule.id)
    rolling, _ = await _runs(env, schedule)
    assert rolling.run.state == "rolling"

    with pytest.raises(
        FailedPrecondition, match=f"the schedule's rollout \\(run {rolling.run.id}\\) is still rolling"
    ):
        await env.services.approvals.approve(waiting.run.id)
    assert (await env.services.rollouts.get(waiting.run.id)).run.state == "awaiting_approval"
    await env.services.rollouts.cancel(rolling.run.id)
    assert (await env.services.approvals.approve(waiting.run.id)).run.state == "rolling"


@pytest.mark.parametrize("rollout", [None, RolloutPolicy(max_concurrent_racks=2)], ids=["plain", "rollout"])
async def test_an_approved_runs_deferrals_are_bound_by_its_slots_start_deadline(
    db: Database, rollout: RolloutPolicy | None
) -> None:
    """A dispatched firing for slot S with a start deadline of an hour awaits approval; meanwhile r1's
    window comes to open at S + 20 min and r2's at S + 2 h. Approved at S + 10 min, the run is bound as a
    firing of S that needed no approval: r1's task must start by S + 1 h (its outcome keeps `start_by`),
    not by its window's end nor an hour after the approval, and r2, whose opening is past the deadline, is
    "missed". A rollout's first wave (both racks here) is bound alike."""
    env = _env(db)
    claimed, slot, (r1, r2) = await _awaiting_with_deferrals(env, rollout)
    env.clock.advance(timedelta(minutes=10))
    with caller("ann"):
        report = await env.services.approvals.approve(claimed.run_id)

    deadline_at = slot + timedelta(hours=1)
    by_rack = {o.rack_id: o for o in report.run.outcomes}
    assert (by_rack[r1.id].outcome, by_rack[r1.id].start_by) == ("submitted", deadline_at)
    assert by_rack[r2.id].outcome == "missed", by_rack[r2.id]
    assert "start deadline" in by_rack[r2.id].error
    (task,) = await _tasks(env, claimed.schedule)
    assert task.rack_id == r1.id
    assert (task.not_before, task.not_after) == (slot + timedelta(minutes=20), deadline_at)
    assert task.message.endswith(f"until {format_rfc3339(deadline_at)}, its start deadline"), task.message


@pytest.mark.parametrize("rollout", [None, RolloutPolicy(max_concurrent_racks=2)], ids=["plain", "rollout"])
async def test_an_approval_whose_schedule_is_deleted_once_its_run_started_answers_it_as_last_recorded(
    db: Database, monkeypatch: pytest.MonkeyPatch, rollout: RolloutPolicy | None
) -> None:
    """The approved run of the test above starts (r1's task submitted, bound by the start deadline; r2
    missed), then DeleteSchedule commits: a plain run's before its write-back, a rollout's after its first
    step. The approval answers with its run as it was last recorded, as a retry does: the plain run
    "running" (its write-back found no run to complete), the rollout "rolling", r1 "submitted" keeping its
    `start_by`, r2 "missed". Before, it answered NotFound ("no task schedule run") while r1's task was
    submitted."""
    env = _env(db)
    claimed, slot, (r1, r2) = await _awaiting_with_deferrals(env, rollout)
    schedules, rollouts = env.services.schedules, env.services.rollouts
    if rollout is None:
        write_back = firing._write_back

        async def deleted_first(*args: Any, **kwargs: Any) -> Any:
            await schedules.delete(claimed.schedule.id)
            return await write_back(*args, **kwargs)

        monkeypatch.setattr(firing, "_write_back", deleted_first)
    else:
        advance = rollouts.advance

        async def deleted_after(*args: Any, **kwargs: Any) -> Any:
            step = await advance(*args, **kwargs)
            await schedules.delete(claimed.schedule.id)
            return step

        monkeypatch.setattr(rollouts, "advance", deleted_after)
    env.clock.advance(timedelta(minutes=10))
    with caller("ann"):
        report = await env.services.approvals.approve(claimed.run_id)

    assert report.run.state == ("running" if rollout is None else "rolling")
    assert report.run.approval is not None and report.run.approval.approved
    by_rack = {o.rack_id: o for o in report.run.outcomes}
    assert (by_rack[r1.id].outcome, by_rack[r1.id].start_by) == ("submitted", slot + timedelta(hours=1))
    assert by_rack[r2.id].outcome == "missed", by_rack[r2.id]
    (task,) = await _tasks(env, claimed.schedule)
    assert report.task_statuses == {task.id: TaskStatus.PENDING}
    with pytest.raises(NotFound):
        await schedules.get(claimed.schedule.id)


async def _awaiting_with_deferrals(
    env: Env, rollout: RolloutPolicy | None
) -> tuple[Firing, datetime, tuple[Rack, Rack]]:
    """A dispatched firing of r1 and r2 for its slot S, with a start deadline of an hour, awaiting approval
    at S; r1's window opens at S + 20 min, r2's at S + 2 h (past the deadline)."""
    r1, r2 = await env.rack("r1"), await env.rack("r2")
    schedule = await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(r1, r2),
        window_policy=WindowPolicy.DEFER,
        rollout=rollout,
        approval=ApprovalPolicy(FOUR_HOURS),
    )
    path = ["schedule.start_deadline"]
    schedule = await env.services.schedules.update(schedule.id, path, start_deadline=timedelta(hours=1))
    slot = schedule.next_run_at
    assert slot is not None
    env.clock.advance(slot - env.clock.now())
    async with env.db.transaction() as conn:  # the dispatcher's claim of the slot
        (claimed,) = await firing.claim(
            env.db, conn, [schedule], trigger="dispatch", now=slot, owner_id=uuid.uuid4()
        )
    assert claimed.needs_approval
    for rack, opens in ((r1, timedelta(minutes=20)), (r2, timedelta(hours=2))):
        await env.services.windows.create(
            WindowInput(
                name=f"allow-{rack.name}",
                kind=WindowKind.ALLOW,
                when=OneOff(slot + opens, slot + timedelta(hours=3)),
                racks=(Ref(rack.id),),
            )
        )
    return claimed, slot, (r1, r2)


async def test_an_approval_whose_schedule_is_deleted_before_its_submit_says_so_and_submits_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DeleteSchedule commits between the approval that starts the run (committed: the run "running") and
    its submit: the approval answers NotFound saying the schedule was deleted with the run it started,
    and nothing was submitted, as a trigger's and a retry's do. Before, it answered "no task schedule run"
    and left the operator to guess."""
    env = _env(db)
    rack = await env.rack("r1")
    schedule = await _schedule(env, [rack])
    await env.services.schedules.trigger(schedule.id)
    (waiting,) = await _runs(env, schedule)
    env.delete_before_its_submit(monkeypatch, schedule)

    with pytest.raises(NotFound) as gone:
        await env.services.approvals.approve(waiting.run.id)

    assert gone.match(f"schedule 'fw' \\({schedule.id}\\) was deleted, with run {waiting.run.id} that fired")
    assert gone.match("nothing was submitted")
    found, _ = await env.services.tasks.list_tasks(rack_id=rack.id)
    assert found == []


async def test_runs_no_one_approved_neither_count_towards_nor_break_a_failing_streak(db: Database) -> None:
    """A rejected, expired or still waiting run starts nothing, as a missed or skipped one: counted as a
    success it would break the streak of the runs that did start and fail (docs/SAFETY.md, "Pause after
    failing runs"), so a schedule whose approved runs all failed would go on firing."""
    env = _env(db)
    schedule = await _schedule(env, [await env.rack("r1")])
    await env.services.schedules.update(
        schedule.id, ["schedule.pause_after_failed_runs"], pause_after_failed_runs=2
    )

    async def fire() -> uuid.UUID:
        env.clock.advance(timedelta(minutes=1))
        assert await env.services.schedules.trigger(schedule.id) == []
        return (await _runs(env, schedule))[0].run.id

    async def approve_and_fail(run_id: uuid.UUID) -> None:
        (task_id,) = [o.task_id for o in (await env.services.approvals.approve(run_id)).run.outcomes]
        assert task_id is not None
        async with db.transaction() as conn:
            await task_store.set_status(conn, [task_id], TaskStatus.FAILED, now=env.clock.now())

    first = await fire()
    await approve_and_fail(first)
    await env.services.approvals.reject(await fire(), "not tonight")
    last = await fire()
    assert await env.services.schedules.pause_failing() == []  # one failed run; the newest still waits
    await approve_and_fail(last)

    ((paused, runs),) = await env.services.schedules.pause_failing()
    assert paused.id == schedule.id and not paused.enabled
    assert sorted(r.run_id for r in runs) == sorted([first, last])


async def _firmware(env: Env, end: datetime) -> Schedule:
    """A schedule upgrading two racks' firmware until `end`, each firing awaiting one approver for 4 h."""
    return await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=end),
        queue=QueueOptions(),
        description="",
        target=rack_target(await env.rack("r1"), await env.rack("r2")),
        approval=ApprovalPolicy(FOUR_HOURS, 1),
    )


async def test_a_run_awaiting_approval_expires_at_its_firmware_window_s_end(db: Database) -> None:
    """Approved at or past its end_time, each of its tasks could only fail unrun at its claim (a
    rollout's, wave after wave): its approval expires then, before its policy's timeout, so the expiry
    sweep of any instance ends it once, as any run not approved in time, its reason naming the end_time,
    audited as rackflow and notified once; an approval or a rejection then is refused as for any expired
    run."""
    env = _env(db)
    end = env.clock.now() + timedelta(minutes=90)
    schedule = await _firmware(env, end)
    assert await env.services.schedules.trigger(schedule.id) == []
    (waiting,) = await _runs(env, schedule)
    assert waiting.run.approval is not None
    assert waiting.run.approval.expires_at == end  # not its policy's 4 h
    assert waiting.run.approval.at_window_end
    dispatchers = [  # two instances' (on one clock: `Services.build` sets the database's)
        Dispatcher(env.services.schedules, env.services.audit, approvals=approvals)
        for approvals in (env.services.approvals, Services.build(db, env.clock).approvals)
    ]
    env.clock.advance(timedelta(minutes=90) - SECOND)
    await dispatchers[0].expire_approvals()
    assert [r.run for r in await _runs(env, schedule)] == [waiting.run]  # within the window: it waits
    env.clock.advance(SECOND)  # the end itself: the window is half-open

    deadline = f"{format_rfc3339(end)}, its firmware window's end \\(its upgrade's end_time\\)"
    with pytest.raises(
        FailedPrecondition,
        match=f"^id: run {waiting.run.id} expired at {deadline} and can no longer be approved",
    ):
        await env.services.approvals.approve(waiting.run.id, "go")
    with caller("ann"), pytest.raises(FailedPrecondition, match="and can no longer be rejected"):
        await env.services.approvals.reject(waiting.run.id, "too late")
    for dispatcher in dispatchers:
        await dispatcher.expire_approvals()

    (expired,) = await _runs(env, schedule)
    assert expired.run.state == "expired"
    assert expired.run.reason == (
        f"not approved by {format_rfc3339(end)}, its firmware window's end (its upgrade's end_time) (0 of 1 "
        "approver)"
    )
    assert [o.outcome for o in expired.run.outcomes] == ["not_started"] * 2
    (event,), _ = await env.services.audit.list_events(EventFilter(method=EXPIRE_RUN))
    assert (event.principal, event.request["reason"]) == ("rackflow", expired.run.reason)
    assert event.target_ids == (str(schedule.id), str(waiting.run.id))
    assert await _tasks(env, schedule) == []
    awaiting, ended = await _events(env)
    assert (awaiting.type, awaiting.reason) == (
        EventType.RUN_AWAITING_APPROVAL,
        f"needs 1 approver(s) by {format_rfc3339(end)}, its firmware window's end (its upgrade's end_time)",
    )
    assert (ended.type, ended.principal, ended.reason) == (
        EventType.RUN_EXPIRED,
        "rackflow",
        expired.run.reason,
    )


async def test_a_run_fired_before_its_approval_expired_at_its_window_is_not_approved_past_it(
    db: Database,
) -> None:
    """A run an earlier release recorded awaits approval until its policy's timeout, past its window's
    end: approved then, each of its tasks could only fail unrun at its claim, so the approval is refused as
    a trigger then is, writing nothing; a rejection still ends the run."""
    env = _env(db)
    end = env.clock.now() + timedelta(minutes=90)
    schedule = await _firmware(env, end)
    assert await env.services.schedules.trigger(schedule.id) == []
    (fired,) = await _runs(env, schedule)
    assert fired.run.approval is not None
    earlier = replace(fired.run.approval, expires_at=fired.run.fired_at + FOUR_HOURS, at_window_end=False)
    async with env.db.transaction() as conn:  # as a release before the window bound its expiry wrote it
        await conn.execute(
            update(task_schedule_run)
            .where(task_schedule_run.c.id == fired.run.id)
            .values(approval=earlier.to_json(), approval_expires_at=earlier.expires_at)
        )
    (waiting,) = await _runs(env, schedule)
    env.clock.advance(timedelta(minutes=90))

    with pytest.raises(
        FailedPrecondition,
        match=f"^id: run {waiting.run.id} cannot be approved: its firmware window ended at "
        f"{format_rfc3339(end)} \\(its upgrade's end_time\\)",
    ):
        await env.services.approvals.approve(waiting.run.id, "go")

    (still,) = await _runs(env, schedule)
    assert still.run == waiting.run
    assert await _tasks(env, schedule) == []
    assert [e.type for e in await _events(env)] == [EventType.RUN_AWAITING_APPROVAL]
    with caller("ann"):
        rejected = await env.services.approvals.reject(waiting.run.id, "too late")
    assert rejected.run.state == "rejected"
