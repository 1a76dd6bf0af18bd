"""A window's change owes a decision to each task it skipped (a claim held its row), and that decision is
not lost with the instance that made the change, nor does its failure fail the call, on both databases
(`rackflow.tasks.deferrals`, `store.decisions_owed`, migration 0048).

The change records the tasks it skipped in its transaction; the instance that made it decides them once it
committed (`Deferrals._again`), and every executor's look again (`Deferrals.look_again`, at its start and
at its dead-hold cadence) decides those still owed, should that instance have died, or the decision
failed, in between. The call answers once the change committed: what fails after is logged, never raised.

`shortened_beside_a_claim`: r1's task, fired inside the ALLOW window "nightly" (to 15:00:
tests/store/test_window_rebinds.py), is claimed as "nightly" is shortened to 13:30, and its budget gate
hands it back held, bound to 15:00 still, the change having skipped its row. On PostgreSQL a claim holds
the row while the change is written; SQLite's single writer lets no claim be open beside a change, so
there the change's write of the task leaves it out, as it leaves out a row a claim holds (`rewait`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.api.audit import AuditInterceptor
from rackflow.audit.changes import Changes, noting
from rackflow.domain.audit import OK, REDECIDE_WINDOW_TASK, SYSTEM_PRINCIPAL, AuditEvent, EventFilter
from rackflow.domain.schedules import Schedule
from rackflow.domain.tasks import Task, TaskStatus
from rackflow.domain.windows import MaintenanceWindow, OneOff, WindowPolicy
from rackflow.errors import Unavailable
from rackflow.security import Principal, Role, current_principal
from rackflow.store import decisions_owed
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.tables import window_decisions_owed
from rackflow.tasks.deferrals import OWED_BATCH
from rackflow.tasks.executor import Executor
from rackflow.tasks.gates import consult
from rackflow.timespec import format_rfc3339
from rackflow.v1 import flow_pb2 as pb
from rackflow.windows.service import WHEN_PATH, WindowInput, WindowService
from tests.store.query_plans import statements_sent
from tests.store.schedules_support import Env, make_env
from tests.store.test_executor import eventually
from tests.store.test_rollout_halt_gate import OWNER, Recording, claim_in
from tests.store.test_window_deferrals import deferred, get, outcome_of
from tests.store.test_window_rebinds import (
    AFTER_THE_NEW_END,
    MOVED_AWAY,
    NEW_END,
    SHORTENED,
    WINDOW_END,
    a_full_budget,
    claim,
    fired_inside,
)
from tests.store.test_windows_firing import TOMORROW_2AM


@pytest.fixture
def env(db: Database) -> Env:
    return make_env(db)


async def edit_when(windows: WindowService, when: OneOff) -> Changes:
    """Move "nightly" to `when` with `windows`, as an audited call: what its event notes."""
    window_id = await windows.id_by_name("nightly")
    changes = Changes()
    with noting(changes):
        await windows.update(window_id, [WHEN_PATH], WindowInput(when=when))
    return changes


def leaving_out(
    task_id: uuid.UUID,
    rewait: Callable[[AsyncConnection, Collection[uuid.UUID], Mapping[str, Any]], Awaitable[list[uuid.UUID]]],
) -> Callable[[AsyncConnection, Collection[uuid.UUID], Mapping[str, Any]], Awaitable[list[uuid.UUID]]]:
    """`rewait`, leaving out `task_id` as it leaves out a row another transaction holds."""

    async def without(
        conn: AsyncConnection, task_ids: Collection[uuid.UUID], values: Mapping[str, Any]
    ) -> list[uuid.UUID]:
        return await rewait(conn, [i for i in task_ids if i != task_id], values)

    return without


# How a test moves "nightly" (`edit_when`, `in_a_call`): what its call's event notes, when the test sees it.
Edit = Callable[[WindowService, OneOff], Awaitable[Changes | None]]


def in_a_call(env: Env, principal: Principal) -> Edit:
    """`edit_when` as the UpdateMaintenanceWindow RPC makes it: through the audit interceptor, by
    `principal`, which records the call's event in the trail (what it notes is the event's)."""
    interceptor = AuditInterceptor(env.services.audit)

    async def edit(windows: WindowService, when: OneOff) -> None:
        window_id = pb.UUID(id=str(await windows.id_by_name("nightly")))

        async def behavior(request: pb.UpdateMaintenanceWindowRequest, context: Any) -> pb.MaintenanceWindow:
            await windows.update(uuid.UUID(request.id.id), [WHEN_PATH], WindowInput(when=when))
            return pb.MaintenanceWindow(id=request.id)

        reset = current_principal.set(principal)
        try:
            rpc = interceptor.audited("UpdateMaintenanceWindow", behavior)
            await rpc(pb.UpdateMaintenanceWindowRequest(id=window_id), None)
        finally:
            current_principal.reset(reset)

    return edit


async def shortened_beside_a_claim(
    env: Env,
    monkeypatch: pytest.MonkeyPatch,
    windows: WindowService,
    edit: Edit = edit_when,
    policy: WindowPolicy = WindowPolicy.SKIP,
    when: OneOff = SHORTENED,
) -> tuple[Schedule, Task, Changes | None, uuid.UUID]:
    """The module's scenario, the change made by `windows` (by `edit`): the schedule (of window `policy`),
    and r1's task, held by the budget and bound to 15:00; what the change's audited call noted
    (`edit_when`'s); the budget's id. `when`: where the change moves "nightly" (else shortened)."""
    budget_id, running = await a_full_budget(env)
    schedule, task = await fired_inside(env, policy)
    if env.db.is_postgres:
        async with env.db.transaction() as conn:
            claimed = await claim_in(env, conn, running=(running,))
            assert [t.id for t, _ in claimed] == [task.id]
            # The change waits for no task's row: it commits, and answers, while the claim holds it.
            changes = await asyncio.wait_for(edit(windows, when), 60)
            gated = await consult(env.services.gates, conn, claimed, owner_id=OWNER, now=env.clock.now())
            assert gated.claimed == []  # the budget holds it
    else:
        assert await claim(env, (running,)) == []  # the budget holds it
        with monkeypatch.context() as patched:
            patched.setattr(task_store, "rewait", leaving_out(task.id, task_store.rewait))
            changes = await edit(windows, when)
    held = await get(env, task.id)
    assert (held.status, held.held_by, held.not_after) == (TaskStatus.PENDING, "budget", WINDOW_END)
    return schedule, held, changes, budget_id


class Dying:
    """The services' `Deferrals`, in an instance that dies once its change committed: what it was to do
    then is never done."""

    def __init__(self, env: Env) -> None:
        self.deferrals = env.services.deferrals

    async def redecide_in(
        self,
        conn: AsyncConnection,
        changed: Sequence[MaintenanceWindow],
        now: datetime,
        write: Callable[[], Awaitable[object]],
        change: str,
    ) -> Callable[[], Awaitable[None]]:
        await self.deferrals.redecide_in(conn, changed, now, write, change)

        async def died() -> None:
            pass

        return died


async def dropped(*_: object) -> None:
    raise Unavailable("the database connection was lost")


async def test_a_change_whose_decision_after_commit_fails_answers_and_the_look_again_decides_it(
    env: Env, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection drops as the change's instance waits for the claim to let go of r1's task: the call
    answers all the same (the window is shortened, and its event notes nothing it did not do), and logs
    the window and the task it owes; the executors' look again binds the task to 13:30."""
    monkeypatch.setattr(task_store, "wait_for_row", dropped)
    with caplog.at_level(logging.WARNING, logger="rackflow.tasks.deferrals"):
        _, held, changes, _ = await shortened_beside_a_claim(env, monkeypatch, env.services.windows)

    window = await env.services.windows.get(await env.services.windows.id_by_name("nightly"))
    assert window.when == SHORTENED
    assert changes is not None and changes.recorded == []  # the call's event: it decided none of its tasks
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(window.id) in warning.getMessage() and str(held.id) in warning.getMessage()

    assert await env.services.deferrals.look_again() == 1

    rebound = await get(env, held.id)
    assert (rebound.status, rebound.held_by, rebound.not_before, rebound.not_after) == (
        TaskStatus.PENDING,
        "budget",
        held.not_before,
        NEW_END,
    )
    assert await env.services.deferrals.look_again() == 0  # owed no more


async def test_a_change_whose_instance_died_after_commit_is_decided_by_an_executor_before_its_claim(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change's instance dies once it committed, r1's task bound to 15:00 still. At 13:45 the budget
    lets it go; an executor starting then decides it first (its look again, before its first claim): the
    window the operator now allows closed at 13:30, so it is ended as its firing would end it, skipped,
    and nothing runs on r1."""
    dying = WindowService(env.db, env.clock, Dying(env))
    schedule, held, _, budget_id = await shortened_beside_a_claim(env, monkeypatch, dying)
    await env.services.budgets.delete(budget_id)  # its next claim is not held by the budget
    env.clock.advance(AFTER_THE_NEW_END)
    backend = Recording()
    executor = Executor(
        env.db, env.clock, backend, poll_interval=0.05, lease_ttl=1.0, instance_id=uuid.uuid4(),
        gates=env.services.gates, backstops=(env.services.deferrals,),
    )  # fmt: skip
    stop = asyncio.Event()
    running = asyncio.create_task(executor.run(stop))
    try:

        async def ended() -> bool:
            return (await get(env, held.id)).status.is_final

        await eventually(ended)
    finally:
        stop.set()
        await asyncio.wait_for(running, 10)

    skipped = await get(env, held.id)
    assert (skipped.status, skipped.started_at) == (TaskStatus.TERMINATED, None)
    assert await outcome_of(env, schedule, held) == ("skipped_window", skipped.message)
    assert [step for step in backend.steps if step.startswith("r1-")] == []
    assert await env.services.deferrals.look_again() == 0


async def test_the_look_again_with_nothing_owed_reads_once_and_writes_nothing(env: Env) -> None:
    """Nothing owed (every change decided what it skipped): the look again reads one primary key, and
    neither writes nor takes the window edits' turn."""
    await fired_inside(env)
    with statements_sent(env.db) as sent:
        assert await env.services.deferrals.look_again() == 0
    # (SQLite's read is a transaction: its BEGIN takes no lock)
    statements = [statement for statement, _ in sent if statement != "BEGIN"]
    assert [statement.split()[0] for statement in statements] == ["SELECT"], sent
    assert "FROM window_decisions_owed" in statements[0]


async def test_a_task_owed_a_decision_is_not_claimed_before_it_is_decided(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change's instance dies once it committed, r1's task bound to 15:00 still; at 13:45 the budget
    has let it go, and an executor's claim comes before any executor's look again: it leaves the task, owed a
    decision, alone (else it would start it a quarter of an hour after the end the operator set). The look
    then ends it, skipped, as its firing would."""
    dying = WindowService(env.db, env.clock, Dying(env))
    schedule, held, _, budget_id = await shortened_beside_a_claim(env, monkeypatch, dying)
    await env.services.budgets.delete(budget_id)
    env.clock.advance(AFTER_THE_NEW_END)

    assert held.id not in await claim(env)  # (the task by hand on r0 it takes up again)
    assert (await get(env, held.id)).status == TaskStatus.PENDING

    assert await env.services.deferrals.look_again() == 1
    skipped = await get(env, held.id)
    assert (skipped.status, skipped.started_at) == (TaskStatus.TERMINATED, None)
    assert await outcome_of(env, schedule, held) == ("skipped_window", skipped.message)


# What rackflow decides by itself is in the audit trail (`rackflow.audit.decisions`): one event per task,
# written in the decision's transaction, by the principal "rackflow".


async def audited(env: Env, task: Task) -> list[AuditEvent]:
    """The task's history in the audit trail, oldest first."""
    events, _ = await env.services.audit.list_events(EventFilter(target=task.id))
    return events[::-1]


def owed_by_the_shortening(
    window_id: uuid.UUID, changes: Changes, changed_at: datetime
) -> dict[str, str | bool]:
    """What a look again's row says owed its decision: "nightly" shortened beside the claim
    (`shortened_beside_a_claim`), in the call whose event `changes` is, by the anonymous caller; that
    event not in the trail (`edit_when` notes the call, and no interceptor writes its event)."""
    return {
        "change": "window_updated",
        "window_id": str(window_id),
        "window_name": "nightly",
        "event_id": str(changes.event_id),
        "principal": "anonymous",
        "owed_since": format_rfc3339(changed_at),
        "event_found": False,
    }


async def test_a_look_again_s_rebinding_is_in_the_audit_trail(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look again binds r1's task to 13:30 (the change's own decision failed): the trail says so, by
    rackflow, naming the task, its run and its rack, in the look's transaction, and what owed it: "nightly"
    updated, in the call whose event is to carry the id the call was given (an anonymous caller's)."""
    monkeypatch.setattr(task_store, "wait_for_row", dropped)
    _, held, changes, _ = await shortened_beside_a_claim(env, monkeypatch, env.services.windows)
    changed_at = env.clock.now()
    window_id = await env.services.windows.id_by_name("nightly")
    assert await audited(env, held) == []  # (the change's call event is the interceptor's, not here)

    assert await env.services.deferrals.look_again() == 1

    [event] = await audited(env, held)
    assert (event.principal, event.method, event.outcome, event.at) == (
        SYSTEM_PRINCIPAL,
        REDECIDE_WINDOW_TASK,
        OK,
        env.clock.now(),
    )
    assert event.target_ids == (str(held.id), str(held.run_id), str(held.rack_id), str(window_id))
    assert event.changes == [
        {
            "deferred_task": "rebound",
            "task_id": str(held.id),
            "run_id": str(held.run_id),
            "rack_id": str(held.rack_id),
            "not_after": format_rfc3339(NEW_END),
        }
    ]
    assert changes is not None
    assert event.request == {
        "task_id": str(held.id),
        "decided_by": "look_again",
        "owed_by": owed_by_the_shortening(window_id, changes, changed_at),
    }


async def test_a_task_a_look_again_ends_is_in_the_audit_trail_with_its_outcome_and_window(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The change's instance died; at 13:45 the look again ends r1's task, skipped: the trail names the
    window that closed its rack ("nightly") and says why, as the task's message does, and what owed the
    decision (the change an hour ago, in the call the instance served)."""
    dying = WindowService(env.db, env.clock, Dying(env))
    schedule, held, changes, budget_id = await shortened_beside_a_claim(env, monkeypatch, dying)
    changed_at = env.clock.now()
    await env.services.budgets.delete(budget_id)
    env.clock.advance(AFTER_THE_NEW_END)

    assert await env.services.deferrals.look_again() == 1

    skipped = await get(env, held.id)
    assert skipped.status == TaskStatus.TERMINATED
    window_id = await env.services.windows.id_by_name("nightly")
    [event] = await audited(env, held)
    assert (event.principal, event.method) == (SYSTEM_PRINCIPAL, REDECIDE_WINDOW_TASK)
    assert event.target_ids == (str(held.id), str(held.run_id), str(held.rack_id), str(window_id))
    assert changes is not None
    assert event.changes == [
        {
            "deferred_task": "ended",
            "task_id": str(held.id),
            "run_id": str(held.run_id),
            "rack_id": str(held.rack_id),
            "outcome": "skipped_window",
        }
    ]
    assert event.request == {
        "task_id": str(held.id),
        "decided_by": "look_again",
        "window_id": str(window_id),
        "reason": skipped.message,
        "owed_by": owed_by_the_shortening(window_id, changes, changed_at),
    }
    assert await outcome_of(env, schedule, held) == ("skipped_window", skipped.message)


async def test_a_deferred_task_a_look_again_releases_is_in_the_audit_trail(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """r1's task waits for "nightly" to open; "nightly" is deleted by an instance that dies once it
    committed, the task's row held (left out): the look again releases it, and the trail says so."""
    _, task = await deferred(env)
    dying = WindowService(env.db, env.clock, Dying(env))
    with monkeypatch.context() as patched:
        patched.setattr(task_store, "rewait", leaving_out(task.id, task_store.rewait))
        await dying.delete(await env.services.windows.id_by_name("nightly"))
    assert (await get(env, task.id)).held_by == "window"  # owed its release

    assert await env.services.deferrals.look_again() == 1

    released = await get(env, task.id)
    assert (released.held_by, released.not_before, released.not_after) == (None, None, None)
    [event] = await audited(env, task)
    assert (event.principal, event.method) == (SYSTEM_PRINCIPAL, REDECIDE_WINDOW_TASK)
    assert event.changes == [
        {
            "deferred_task": "released",
            "task_id": str(task.id),
            "run_id": str(task.run_id),
            "rack_id": str(task.rack_id),
        }
    ]


async def test_a_look_again_s_row_names_the_change_that_owed_it_and_that_change_s_event(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "nightly" is shortened by alice's UpdateMaintenanceWindow call, beside a claim of r1's task, and the
    call's instance fails to decide the task once it committed: the look again's row says what owed it
    (that window, updated, by alice, when), names the call's event by its id, and is found in the
    window's history beside that event."""
    monkeypatch.setattr(task_store, "wait_for_row", dropped)
    alice = Principal("alice", Role.OPERATOR, "token")
    _, held, _, _ = await shortened_beside_a_claim(
        env, monkeypatch, env.services.windows, in_a_call(env, alice)
    )
    changed_at = env.clock.now()
    window_id = await env.services.windows.id_by_name("nightly")

    assert await env.services.deferrals.look_again() == 1

    [event] = await audited(env, held)
    [change], _ = await env.services.audit.list_events(EventFilter(method="UpdateMaintenanceWindow"))
    assert (change.principal, change.target_ids[0]) == ("alice", str(window_id))
    assert (event.principal, event.method) == (SYSTEM_PRINCIPAL, REDECIDE_WINDOW_TASK)
    assert event.request["owed_by"] == {
        "change": "window_updated",
        "window_id": str(window_id),
        "window_name": "nightly",
        "event_id": str(change.id),
        "principal": "alice",
        "owed_since": format_rfc3339(changed_at),
    }
    assert str(window_id) in event.target_ids
    history, _ = await env.services.audit.list_events(EventFilter(target=window_id))
    assert {e.id for e in history} >= {change.id, event.id}


async def test_a_look_again_s_row_says_the_change_s_event_was_not_in_the_trail(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """alice's UpdateMaintenanceWindow shortens "nightly" beside a claim of r1's task, and its instance dies
    once the change committed, before it wrote the call's event (or its spool was full): the look again's
    row names the call's event by the id it was to carry, and says the trail did not hold it then
    (`event_found` false), rather than point at it as if it were there."""
    monkeypatch.setattr(task_store, "wait_for_row", dropped)

    async def lost(**_: object) -> None:
        """The instance dies before the call's event is written."""

    monkeypatch.setattr(env.services.audit, "record", lost)
    alice = Principal("alice", Role.OPERATOR, "token")
    _, held, _, _ = await shortened_beside_a_claim(
        env, monkeypatch, env.services.windows, in_a_call(env, alice)
    )
    never_written, _ = await env.services.audit.list_events(EventFilter(method="UpdateMaintenanceWindow"))
    assert never_written == []

    assert await env.services.deferrals.look_again() == 1

    [event] = await audited(env, held)
    owed_by = event.request["owed_by"]
    assert (owed_by["principal"], owed_by["event_found"]) == ("alice", False)
    assert uuid.UUID(owed_by["event_id"])  # the id the call's event was to carry


async def test_a_look_again_s_row_names_a_deletion_outside_any_call_and_no_event(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "nightly" deleted by rackflow itself (no audited call listens: no event, no caller to name), by an
    instance that dies once it committed: the row names the window deleted, by id and name, and no event."""
    _, task = await deferred(env)
    window_id = await env.services.windows.id_by_name("nightly")
    dying = WindowService(env.db, env.clock, Dying(env))
    with monkeypatch.context() as patched:
        patched.setattr(task_store, "rewait", leaving_out(task.id, task_store.rewait))
        await dying.delete(window_id)
    deleted_at = env.clock.now()

    assert await env.services.deferrals.look_again() == 1

    [event] = await audited(env, task)
    assert event.request["owed_by"] == {
        "change": "window_deleted",
        "window_id": str(window_id),
        "window_name": "nightly",
        "owed_since": format_rfc3339(deleted_at),
    }
    assert event.target_ids == (str(task.id), str(task.run_id), str(task.rack_id), str(window_id))


async def test_a_look_again_s_row_says_an_older_release_did_not_record_the_cause(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release before migration 0050, serving beside this one during a rolling upgrade, records a task
    owed with no cause: the row says the cause was not recorded, and when the task was owed."""
    dying = WindowService(env.db, env.clock, Dying(env))
    _, held, _, _ = await shortened_beside_a_claim(env, monkeypatch, dying)
    async with env.db.transaction() as conn:  # as that release writes it: the task and when, nothing more
        await conn.execute(update(window_decisions_owed).values(cause=None))
        [owed_since] = (await conn.execute(select(window_decisions_owed.c.owed_since))).scalars()

    assert await env.services.deferrals.look_again() == 1

    [event] = await audited(env, held)
    assert event.request["owed_by"] == {"change": "not_recorded", "owed_since": format_rfc3339(owed_since)}
    assert event.target_ids == (str(held.id), str(held.run_id), str(held.rack_id))


async def test_a_decision_an_audited_call_makes_is_its_event_s_and_writes_no_row_of_its_own(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision made while an audited call listens (the change's own instance deciding what it skipped,
    in its call) is noted on that call's event, as the change's other decisions are; no second row."""
    monkeypatch.setattr(task_store, "wait_for_row", dropped)
    _, held, _, _ = await shortened_beside_a_claim(env, monkeypatch, env.services.windows)

    changes = Changes()
    with noting(changes):
        assert await env.services.deferrals.look_again() == 1

    assert [c["deferred_task"] for c in changes.recorded] == ["rebound"]
    assert await audited(env, held) == []


async def test_a_task_another_look_decided_first_is_decided_and_audited_once(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two executors look again at once, and both read r1's task owed ("nightly", which its DEFER schedule
    fired inside, moved to tomorrow night beside a claim, by an instance that died). The first decides it:
    it waits for the opening at 02:00, and the row says what owed it. The second's turn comes after the
    opening: the task is owed no more, so it decides nothing and writes no row (deciding from its read, it
    released the task, in a row that could name no cause), and the task's history holds one decision."""
    dying = WindowService(env.db, env.clock, Dying(env))
    _, held, _, _ = await shortened_beside_a_claim(
        env, monkeypatch, dying, policy=WindowPolicy.DEFER, when=MOVED_AWAY
    )
    async with env.db.read() as conn:
        both_read = await decisions_owed.owed(conn, OWED_BATCH)
    assert both_read == [held.id]

    assert await env.services.deferrals.look_again() == 1  # the first
    env.clock.advance(TOMORROW_2AM + timedelta(minutes=1) - env.clock.now())

    async def read_before_the_first_decided(conn: AsyncConnection, limit: int) -> list[uuid.UUID]:
        return both_read

    monkeypatch.setattr(decisions_owed, "owed", read_before_the_first_decided)
    assert await env.services.deferrals.look_again() == 0  # the second

    moved = await get(env, held.id)
    assert (moved.held_by, moved.not_before) == ("window", TOMORROW_2AM)  # as the first left it
    [event] = await audited(env, held)
    assert [c["deferred_task"] for c in event.changes] == ["moved"]
    owed_by = event.request["owed_by"]
    assert (event.request["decided_by"], owed_by["change"]) == ("look_again", "window_updated")
