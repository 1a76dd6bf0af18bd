"""A claim whose COMMIT is lost with its connection, on both databases: the dispatcher finds out whether the
claim committed and fires its tick at once if it did, on the next claim if it did not, and never twice; a
manual trigger (and a run's retry, which takes its path) fires the run it committed and answers with it,
or says it fired nothing; an approval that started its run fires it, or says it approved nothing; a
rejection answers with the run it rejected, or says it rejected nothing.

PostgreSQL: the dispatcher's connections go through the fault proxy (tests/faults/tcp_proxy.py), which cuts
the connection that sends the claim's COMMIT, after the server got it (the answer is lost) or before (the
COMMIT is). SQLite has no connection to lose: its transaction commits, or rolls back, and then raises
`Unavailable`, as the firing tests lose a submit's (tests/store/test_schedules_firing.py).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.audit import SYSTEM_PRINCIPAL, EventFilter
from rackflow.domain.schedules import OverlapPolicy, Run, Schedule
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.errors import Unavailable
from rackflow.retry import Retry
from rackflow.schedules import firing
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.security import Principal, Role, current_principal
from rackflow.services import Services
from rackflow.store import instances
from rackflow.store import rollouts as run_store
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import tasks as task_table
from tests.faults.tcp_proxy import TcpProxy
from tests.store.schedules_support import HOURLY, POWER_OFF, START, Env, make_env, rack_target

HOUR = timedelta(hours=1)

LoseCommit = Callable[[bool], None]  # `delivered`: whether the database got the COMMIT (and committed)


@pytest.fixture
def proxy(db_url: str) -> Iterator[TcpProxy | None]:
    """PostgreSQL: a fault proxy in front of the test database's server; SQLite: None."""
    if not db_url.startswith("postgresql"):
        yield None
        return
    started = TcpProxy(make_url(db_url).port or 5432)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def env(db_url: str, proxy: TcpProxy | None) -> AsyncIterator[Env]:
    url = db_url if proxy is None else make_url(db_url).set(port=proxy.port).render_as_string(False)
    db = Database(url)
    try:
        yield make_env(db)
    finally:
        await db.dispose()


@pytest.fixture
def lose_next_commit(env: Env, proxy: TcpProxy | None, monkeypatch: pytest.MonkeyPatch) -> LoseCommit:
    """Arms a fault for the next transaction's COMMIT: it is lost with its connection, after the database
    committed (`delivered`) or before."""

    def arm(delivered: bool) -> None:
        if proxy is not None:
            # The statement, ended by its NUL: not a "BEGIN ISOLATION LEVEL READ COMMITTED", which a pooled
            # connection sends once a read (autocommit) has used it.
            proxy.cut_at(b"COMMIT\x00", delivered=delivered)
            return
        real_transaction = env.db.transaction

        @asynccontextmanager
        async def transaction() -> AsyncIterator[AsyncConnection]:
            monkeypatch.setattr(env.db, "transaction", real_transaction)  # once
            lost = Unavailable("database unavailable: server closed the connection unexpectedly")
            async with real_transaction() as conn:
                yield conn
                if not delivered:
                    raise lost  # rolls the transaction back
            raise lost

        monkeypatch.setattr(env.db, "transaction", transaction)

    return arm


async def _has_a_task(db: Database, schedule_id: uuid.UUID) -> bool:
    """Whether the schedule has a task, by an autocommit read: it sends no COMMIT for the armed fault to
    take instead of the claim's (the task list reads in a transaction)."""
    async with db.read() as conn:
        found = await conn.execute(
            select(task_table.c.id).where(task_table.c.schedule_id == schedule_id).limit(1)
        )
        return found.first() is not None


async def _dispatch_until_fired(
    env: Env, schedule_id: uuid.UUID, fault: Callable[[], None], within: float
) -> None:
    """Run a dispatcher of a live instance, its first transaction's COMMIT lost (`fault`), until the schedule
    has a task, or `within` seconds have passed."""
    instance_id = uuid.uuid4()
    await instances.register(env.db, instance_id, host="here", pid=1)  # so the sweep leaves its runs be
    fault()
    here = Services.build(env.db, env.clock, instance_id=instance_id)
    dispatcher = Dispatcher(here.schedules, here.audit, interval=timedelta(seconds=30))
    stop = asyncio.Event()
    loop = asyncio.create_task(dispatcher.run(stop))
    try:
        for _ in range(int(within / 0.05)):
            if await _has_a_task(env.db, schedule_id):
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await loop


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
async def test_a_claim_whose_commit_is_lost_fires_its_tick_once_at_once(
    env: Env, lose_next_commit: LoseCommit, delivered: bool
) -> None:
    """Answer lost: the claim committed, so its tick is spent and only this dispatcher can fire it (its run
    is "running", this instance's); it must find out and fire it, not leave the run to the sweep (ten
    minutes, then "interrupted"). COMMIT lost: the schedule is still due, and the next claim fires it."""
    schedule = await env.schedule(racks=[await env.rack("r1")])
    env.clock.advance(timedelta(hours=2))  # due, on either database's clock

    await _dispatch_until_fired(env, schedule.id, lambda: lose_next_commit(delivered), within=10.0)

    runs, _ = await env.services.schedules.list_runs(schedule.id)
    tasks, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    assert [run.state for run in runs] == ["completed"]
    assert [t.id for t in tasks] == [o.task_id for o in runs[0].outcomes]
    assert len(tasks) == 1


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
async def test_a_claim_whose_commit_is_lost_audits_the_pause_it_made_once(
    env: Env, lose_next_commit: LoseCommit, delivered: bool
) -> None:
    """A claim that only paused a schedule (its firmware window ended) fires nothing, but its pause is
    audited once it committed: answer lost, the dispatcher finds it committed and audits it; COMMIT lost,
    nothing was paused, and the next claim pauses it and audits that."""
    upgrade = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1", window_end=START + HOUR * 3 / 2)
    schedule = await env.schedule(racks=[await env.rack("r1")], operation=upgrade)  # first firing: START + 1h
    env.clock.advance(2 * HOUR)  # due, and past its end_time
    dispatcher = Dispatcher(env.services.schedules, env.services.audit)

    lose_next_commit(delivered)
    assert await dispatcher.poll_once() == 0
    paused = await env.services.schedules.get(schedule.id)
    assert paused.enabled is not delivered
    assert await dispatcher.poll_once() == 0

    paused = await env.services.schedules.get(schedule.id)
    assert paused.pause is not None and paused.pause.by == SYSTEM_PRINCIPAL
    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert (run.state, run.reason) == ("skipped", paused.pause.reason)
    (event,), _ = await env.services.audit.list_events(
        EventFilter(method="PauseTaskSchedule"), offset=0, limit=10
    )
    assert (event.principal, event.target_ids) == (SYSTEM_PRINCIPAL, (str(schedule.id), str(run.id)))


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
async def test_a_trigger_whose_commit_is_lost_fires_its_run_or_says_it_fired_nothing(
    env: Env, lose_next_commit: LoseCommit, delivered: bool
) -> None:
    """Answer lost: the run is recorded, "running" and no instance's, so only this trigger can fire it: it
    must, and answer with its task, not leave the run to the sweep and tell the client UNAVAILABLE (whose
    retry would fire a second run). COMMIT lost: nothing was recorded, and the trigger says so."""
    schedule = await env.schedule(racks=[await env.rack("r1")])

    lose_next_commit(delivered)
    if delivered:
        answered = await env.services.schedules.trigger(schedule.id)
    else:
        with pytest.raises(Unavailable, match="was not fired"):
            await env.services.schedules.trigger(schedule.id)
        answered = []

    runs, _ = await env.services.schedules.list_runs(schedule.id)
    tasks, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    assert [run.state for run in runs] == (["completed"] if delivered else [])
    assert [t.id for t in tasks] == answered == [o.task_id for run in runs for o in run.outcomes]
    assert len(answered) == (1 if delivered else 0)


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
async def test_a_run_retry_whose_commit_is_lost_fires_its_run_or_says_it_fired_nothing(
    env: Env, lose_next_commit: LoseCommit, delivered: bool
) -> None:
    """RetryTaskScheduleRun claims its run as a trigger does, and is answered for alike."""
    schedule = await env.schedule(racks=[await env.rack("r1")])
    (failed,) = await env.services.schedules.trigger(schedule.id)
    async with env.db.transaction() as conn:
        await task_store.set_status(conn, [failed], TaskStatus.FAILED, now=env.clock.now())
    (first,), _ = await env.services.schedules.list_runs(schedule.id)

    lose_next_commit(delivered)
    if delivered:
        report = await env.services.schedules.retry_run(first.id)
        assert report.run.retry_of == first.id
    else:
        with pytest.raises(Unavailable, match="was not fired"):
            await env.services.schedules.retry_run(first.id)

    runs, _ = await env.services.schedules.list_runs(schedule.id)
    tasks, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    assert sorted(run.state for run in runs) == ["completed"] * (2 if delivered else 1)
    assert len(tasks) == (2 if delivered else 1)


async def _awaiting_approval(env: Env, approvers: int = 1) -> tuple[Schedule, Run]:
    """A schedule that needs `approvers` approvers, and its run fired awaiting it."""
    schedule = await env.services.schedules.create(
        name="fw",
        spec=HOURLY,
        overlap_policy=OverlapPolicy.SKIP,
        operation=POWER_OFF,
        queue=QueueOptions(),
        description="",
        target=rack_target(await env.rack("r1")),
        approval=ApprovalPolicy(timedelta(hours=4), approvers),
    )
    assert await env.services.schedules.trigger(schedule.id) == []
    (waiting,), _ = await env.services.schedules.list_runs(schedule.id)
    return schedule, waiting


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
async def test_an_approval_whose_commit_is_lost_fires_its_run_or_says_it_approved_nothing(
    env: Env, lose_next_commit: LoseCommit, delivered: bool
) -> None:
    """Answer lost: the run is "running", approved, and only this approval would fire it: it must, not
    leave it to the sweep (which interrupts it ten minutes later) and tell the approver UNAVAILABLE (who
    could not approve it again: it no longer awaits approval). COMMIT lost: the run still awaits approval,
    the approver is told nothing was approved, and approving again starts it."""
    schedule, waiting = await _awaiting_approval(env)

    lose_next_commit(delivered)
    if delivered:
        report = await env.services.approvals.approve(waiting.id)
        assert report.run.state == "completed"
    else:
        with pytest.raises(Unavailable, match="nothing was approved"):
            await env.services.approvals.approve(waiting.id)
        (run,), _ = await env.services.schedules.list_runs(schedule.id)
        assert run.state == "awaiting_approval"
        assert run.approval is not None and run.approval.approvers == ()
        await env.services.approvals.approve(waiting.id)

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    tasks, _ = await env.services.tasks.list_tasks(schedule_id=schedule.id)
    assert run.state == "completed"
    assert [t.run_id for t in tasks] == [waiting.id]
    assert [o.task_id for o in run.outcomes] == [tasks[0].id]


async def test_an_approval_still_in_doubt_names_its_run(
    env: Env, lose_next_commit: LoseCommit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look-up cannot tell (the lost transaction holds the run's row past the look-up's deadline, as
    when the server has not yet noticed the lost connection): the approver is told which run to look at
    before approving it again."""
    _, waiting = await _awaiting_approval(env)
    get_run = run_store.get_run

    async def still_held(*args: Any, nowait: bool = False, **kwargs: Any) -> Run | None:
        if nowait:
            raise Unavailable("database unavailable: could not obtain lock on row")
        return await get_run(*args, **kwargs)

    monkeypatch.setattr(run_store, "get_run", still_held)
    monkeypatch.setattr(firing, "CLAIM_LOOKUP_RETRY", Retry(first_delay=0.01, max_delay=0.01, deadline=0.1))
    lose_next_commit(True)
    with pytest.raises(Unavailable, match=f"run {waiting.id} may have been approved"):
        await env.services.approvals.approve(waiting.id)


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
async def test_an_approval_of_many_whose_commit_is_lost_says_whether_it_counted(
    env: Env, lose_next_commit: LoseCommit, delivered: bool
) -> None:
    """An approval that does not yet start its run (it needs two): answered with the run, its approver
    on it, if it committed (told UNAVAILABLE, the approver could not approve again: one approval each),
    UNAVAILABLE saying nothing was approved if not."""
    _, waiting = await _awaiting_approval(env, approvers=2)

    lose_next_commit(delivered)
    ann = current_principal.set(Principal("ann", Role.APPROVER, "token"))
    try:
        if delivered:
            report = await env.services.approvals.approve(waiting.id)
        else:
            with pytest.raises(Unavailable, match="nothing was approved"):
                await env.services.approvals.approve(waiting.id)
            report = await env.services.rollouts.get(waiting.id)
    finally:
        current_principal.reset(ann)
    assert report.run.state == "awaiting_approval"
    assert report.run.approval is not None
    assert [a.principal for a in report.run.approval.approvers] == (["ann"] if delivered else [])


@pytest.mark.parametrize("delivered", [True, False], ids=["answer-lost", "commit-lost"])
async def test_a_rejection_whose_commit_is_lost_answers_the_rejected_run_or_says_it_rejected_nothing(
    env: Env, lose_next_commit: LoseCommit, delivered: bool
) -> None:
    """Answer lost: the run is "rejected" by this rejecter, and the rejection answers with it (told
    UNAVAILABLE, the rejecter could not tell whether the rejection stands). COMMIT lost: the run still
    awaits approval, the rejecter is told nothing was rejected, and rejecting again rejects it."""
    schedule, waiting = await _awaiting_approval(env)

    lose_next_commit(delivered)
    ann = current_principal.set(Principal("ann", Role.APPROVER, "token"))
    try:
        if delivered:
            report = await env.services.approvals.reject(waiting.id, "wrong racks")
        else:
            with pytest.raises(Unavailable, match=f"run {waiting.id} was not rejected: nothing was rejected"):
                await env.services.approvals.reject(waiting.id, "wrong racks")
            (run,), _ = await env.services.schedules.list_runs(schedule.id)
            assert run.state == "awaiting_approval"
            assert run.approval is not None and run.approval.rejected_by == ""
            report = await env.services.approvals.reject(waiting.id, "wrong racks")
    finally:
        current_principal.reset(ann)

    (run,), _ = await env.services.schedules.list_runs(schedule.id)
    assert report.run.state == run.state == "rejected"
    assert run.approval is not None
    assert (run.approval.rejected_by, run.approval.comment) == ("ann", "wrong racks")
    assert [o.outcome for o in run.outcomes] == ["not_started"]
    assert (await env.services.tasks.list_tasks(schedule_id=schedule.id))[0] == []


async def test_a_rejection_still_in_doubt_names_its_run(
    env: Env, lose_next_commit: LoseCommit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look-up cannot tell (the lost transaction holds the run's row past the look-up's deadline): the
    rejecter is told which run to look at, and that the same rejection may be asked again."""
    _, waiting = await _awaiting_approval(env)
    get_run = run_store.get_run

    async def still_held(*args: Any, nowait: bool = False, **kwargs: Any) -> Run | None:
        if nowait:
            raise Unavailable("database unavailable: could not obtain lock on row")
        return await get_run(*args, **kwargs)

    monkeypatch.setattr(run_store, "get_run", still_held)
    monkeypatch.setattr(firing, "CLAIM_LOOKUP_RETRY", Retry(first_delay=0.01, max_delay=0.01, deadline=0.1))
    lose_next_commit(True)
    with pytest.raises(Unavailable, match=f"run {waiting.id} may have been rejected by .* the same comment"):
        await env.services.approvals.reject(waiting.id, "wrong racks")
