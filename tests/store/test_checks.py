"""Pre-flight checks end to end in one process, on both databases: the executor's claim with the
pre-flight gate, and the checker beside it asking a real HTTP receiver (webhooks) or the database
(rack_idle).

A task no check applies to is not touched; a drain hook that says "not ready" twice then "ready" holds the
task (reason on it) and then lets it start, its posts signed with HMAC-SHA256; a hook that times out holds
it, and the maximum wait fails it with the reason; rack_idle holds a task on a rack whose last same task
failed recently; an operator's override starts a held task; a deleted check lets its tasks go. The look
ahead (issue 26) asks about tasks next in line before a claim takes them, only those windows and budgets
admit, and its rounds count as any. Idle, the checker sleeps until a round comes due or a claim holds a
task."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import threading
import time
import uuid
from collections.abc import Collection
from datetime import datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.budgets.service import BudgetInput
from rackflow.checks import kinds
from rackflow.checks.checker import PreflightChecker
from rackflow.checks.gate import GATE_NAME
from rackflow.checks.service import KIND_PATH, CheckInput
from rackflow.clock import FakeClock, SystemClock
from rackflow.domain.checks import AlertmanagerSettings, CheckResult, RackIdleSettings, WebhookSettings
from rackflow.domain.inventory import ComponentsFilter, ComponentSpec, ComponentType, Rack, RackSelection
from rackflow.domain.tasks import Hold, Operation, OperationKind, Task, TaskStatus
from rackflow.domain.windows import OneOff, WindowKind
from rackflow.inventory.service import InventoryService
from rackflow.retry import Retry
from rackflow.services import Services
from rackflow.store import checks as store
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.tables import preflight_results, preflight_tasks, tasks
from rackflow.store.tasks import set_status
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from rackflow.tasks.executor import Executor
from rackflow.tasks.gates import consult
from rackflow.windows.service import Ref, WindowInput
from tests.checks_support import Answer, Receiver, busy_alertmanager, checking, receiving
from tests.store.lock_waits import waiting_for
from tests.store.query_plans import statement_sent, statements_sent
from tests.store.schedules_support import POWER_OFF, make_env
from tests.store.test_executor import (
    CLOCK,
    REJECT,
    counting_polls,
    eventually,
    executing,
    finished,
    get,
    make_rack,
    start_running,
    submit,
)
from tests.store.test_notify_delivery import not_http
from tests.store.test_task_retries import QUICK
from tests.store.test_task_retries import submit as submit_retrying

POWER_ON = Operation(OperationKind.POWER_ON)
SECRET_ENV = "RACKFLOW_TEST_DRAIN_KEY"
OWNER = uuid.uuid4()


async def _count(db: Database, table: object) -> int:
    async with db.read() as conn:
        return (await conn.execute(select(func.count()).select_from(table))).scalar_one()  # type: ignore[arg-type]


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _results(check: str, result: str) -> float:
    return _sample("rackflow_check_results_total", {"check": check, "result": result})


async def _rack(db: Database, name: str) -> Rack:
    spec = ComponentSpec(ComponentType.COMPUTE, "compute-0", external_id=f"{name}-gpu-0")
    return await InventoryService(db, CLOCK).create_rack(name, components=[spec])


async def _held_with(db: Database, task: Task, words: str) -> Task:
    async def held() -> bool:
        found = await get(db, task)
        return found.held_by == "preflight" and words in (found.held_reason or "")

    await eventually(held)
    return await get(db, task)


async def test_a_task_no_check_applies_to_is_not_touched(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    services = Services.build(db, CLOCK)
    only_firmware = CheckInput(
        name="fw-only",
        operations=(OperationKind.UPGRADE_FIRMWARE,),
        settings=WebhookSettings("http://127.0.0.1:9/", "", ""),
    )
    await services.checks.create(only_firmware)
    task = await submit(db, rack, POWER_ON)
    async with checking(db):
        done = await finished(db, task)
    assert done.status is TaskStatus.COMPLETED
    assert await _count(db, preflight_tasks) == 0 and await _count(db, preflight_results) == 0


async def test_a_drain_hook_holds_the_task_until_it_says_ready(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SECRET_ENV, "s3cret\n")
    rack = await make_rack(db, computes=2)
    draining = Answer({"ok": False, "reason": "draining 3 jobs", "retry_after": "100ms"})
    with receiving(draining, draining, Answer({"ok": True})) as hook:
        services = Services.build(db, CLOCK)
        await services.checks.create(
            CheckInput(
                name="drained",
                settings=WebhookSettings(hook.url, f"env:{SECRET_ENV}", "2s"),
                interval="10s",  # retry_after answers sooner
            )
        )
        before = _results("drained", "hold")
        holds = _sample("rackflow_check_holds_total", {"check": "drained"})
        waits = _sample("rackflow_check_wait_seconds_count", {})
        task = await submit(db, rack, POWER_ON)
        async with checking(db):
            held = await _held_with(db, task, "draining 3 jobs")
            assert held.status is TaskStatus.PENDING and held.started_at is None
            assert held.held_reason == "pre-flight check 'drained': webhook: draining 3 jobs"
            assert held.message == held.held_reason
            done = await finished(db, task)
        payloads = hook.payloads()
    assert done.status is TaskStatus.COMPLETED
    assert [p["attempt"] for p in payloads] == [1, 2, 3]
    assert {p["task_id"] for p in payloads} == {str(task.id)}
    assert payloads[0]["rack"]["name"] == rack.name and payloads[0]["operation"] == "power_on"
    assert len(payloads[0]["components"]) == len(task.component_ids)
    for headers, body in hook.posts:
        signed = headers["X-Rackflow-Timestamp"].encode() + b"." + body
        assert abs(time.time() - int(headers["X-Rackflow-Timestamp"])) < 60
        expected = "sha256=" + hmac.new(b"s3cret", signed, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["X-Rackflow-Signature"], expected)
    assert _results("drained", "hold") - before == 2
    assert _sample("rackflow_check_holds_total", {"check": "drained"}) - holds == 2
    assert _sample("rackflow_check_wait_seconds_count", {}) - waits == 1  # once, when it started
    assert await _count(db, preflight_results) == 3


async def test_a_hook_that_times_out_holds_and_the_maximum_wait_fails_the_task(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    with receiving(Answer(delay=2.0)) as hook:
        services = Services.build(db, CLOCK)
        await services.checks.create(
            CheckInput(
                name="slow",
                settings=WebhookSettings(hook.url, "", "200ms"),
                interval="100ms",
                max_wait="1500ms",
            )
        )
        task = await submit(db, rack, POWER_ON)
        async with checking(db):
            held = await _held_with(db, task, "timed out")
            assert held.status is TaskStatus.PENDING
            done = await finished(db, task)
    assert done.status is TaskStatus.FAILED
    assert "webhook" in done.message and "timed out" in done.message
    assert done.message.endswith("(pre-flight check 'slow' gave up after 1500ms)")


async def test_rack_idle_holds_a_rack_whose_last_same_task_failed_recently(db: Database) -> None:
    rack = await make_rack(db, computes=1)
    services = Services.build(db, CLOCK)
    earlier = await submit(db, rack, POWER_ON)
    async with db.transaction() as conn:
        await set_status(conn, [earlier.id], TaskStatus.FAILED, now=CLOCK.now(), message="PSU fault")
    await services.checks.create(
        CheckInput(
            name="not-flapping",
            settings=RackIdleSettings(frozenset({OperationKind.POWER_RESET}), "1h"),
            interval="100ms",
            max_wait="800ms",
        )
    )
    task = await submit(db, rack, POWER_ON)
    async with checking(db):
        held = await _held_with(db, task, "PSU fault")
        assert "rack_idle: the rack's last power_on failed at" in (held.held_reason or "")
        done = await finished(db, task)
    assert done.status is TaskStatus.FAILED and "PSU fault" in done.message and "gave up" in done.message


async def test_an_override_starts_a_held_task_and_a_deleted_check_lets_its_tasks_go(db: Database) -> None:
    first, second = await _rack(db, "r1"), await _rack(db, "r2")
    with receiving(Answer({"ok": False, "reason": "jobs running"})) as hook:
        services = Services.build(db, CLOCK)
        check = await services.checks.create(
            CheckInput(name="never", settings=WebhookSettings(hook.url, "", "2s"), interval="10s")
        )
        a, b = await submit(db, first, POWER_ON), await submit(db, second, POWER_ON)
        async with checking(db) as running:
            await _held_with(db, a, "jobs running")
            await _held_with(db, b, "jobs running")
            overridden = await running.checks.override(a.id, "INC-7: hook is wrong")
            assert overridden.held_reason == "pre-flight checks overridden: INC-7: hook is wrong"
            assert (await finished(db, a)).status is TaskStatus.COMPLETED
            assert (await get(db, b)).status is TaskStatus.PENDING
            await running.checks.delete(check.id)
            assert (await finished(db, b)).status is TaskStatus.COMPLETED


async def test_a_cancelled_task_a_check_held_no_longer_shows_the_hold(db: Database) -> None:
    """A task a check held, then cancelled, still said "held by preflight … / not before <its maximum
    wait>" (`rackflow task show`, the API, the console): its hold stayed on the row, as if something still
    held it. A task that ends holds nothing, as one that starts (and as migration 0014 made the ended
    tasks): the hold's four fields are cleared with the end, in the same statement; the message says why
    it ended. The checker asks nothing more about it."""
    rack = await _rack(db, "r1")
    with receiving(Answer({"ok": False, "reason": "jobs running"})) as hook:
        services = Services.build(db, CLOCK)
        await services.checks.create(
            CheckInput(name="never", settings=WebhookSettings(hook.url, "", "2s"), interval="100ms")
        )
        task = await submit(db, rack, POWER_ON)
        async with checking(db) as running:
            held = await _held_with(db, task, "jobs running")
            assert held.not_before is not None and held.held_since is not None
            cancelled = await running.tasks.cancel(task.id)
            asked = len(hook.posts)
            await asyncio.sleep(0.5)  # five intervals
            assert len(hook.posts) == asked
    ended = await get(db, task)
    assert cancelled == ended
    assert (ended.status, ended.message) == (TaskStatus.TERMINATED, "cancelled by user")
    assert (ended.held_by, ended.held_reason, ended.held_since, ended.not_before) == (None, None, None, None)


async def test_an_override_of_one_check_leaves_the_others_counting(db: Database) -> None:
    rack = await _rack(db, "r1")
    with (
        receiving(Answer({"ok": False, "reason": "jobs running"})) as jobs,
        receiving(Answer({"ok": False, "reason": "cooling fault"})) as cooling,
    ):
        services = Services.build(db, CLOCK)
        for name, hook in (("jobs", jobs), ("cooling", cooling)):
            await services.checks.create(
                CheckInput(name=name, settings=WebhookSettings(hook.url, "", "2s"), interval="100ms")
            )
        task = await submit(db, rack, POWER_ON)
        async with checking(db) as running:
            await _held_with(db, task, "pre-flight check 'cooling'")
            once = await running.checks.override(
                task.id, "INC-8: the cooling alarm is a false one", ["cooling"]
            )
            assert (
                once.held_reason
                == "pre-flight check 'cooling' overridden: INC-8: the cooling alarm is a false one"
            )
            jobs_at_override = len(jobs.posts)
            held = await _held_with(db, task, "jobs running")  # the other check still holds it
            assert held.status is TaskStatus.PENDING

            # A round taken before the override may still be asking both hooks: a task's rounds come one
            # after another, so once two more have asked `jobs`, none taken before it is left.
            async def two_more_rounds() -> bool:
                return len(jobs.posts) >= jobs_at_override + 2

            await eventually(two_more_rounds)
            asked_cooling = len(cooling.posts)
            await _held_with(db, task, "jobs running")
            await running.checks.override(task.id, "INC-8: drained by hand", ["jobs"])
            assert (await finished(db, task)).status is TaskStatus.COMPLETED
        assert len(cooling.posts) == asked_cooling  # an overridden check is not asked again


async def test_rack_idle_holds_while_a_busy_operation_runs_on_the_rack(db: Database) -> None:
    rack, other = await _rack(db, "r1"), await _rack(db, "r2")
    task = await submit(db, rack, POWER_ON)
    # A power reset RUNNING on the rack under a live instance (moved there after its submission, which
    # the conflict rules would have refused: the check must see it whatever let it run).
    busy = await submit(db, other, Operation(OperationKind.POWER_RESET))
    await start_running(db, busy, uuid.uuid4(), heartbeat_age=-timedelta(hours=1))
    async with db.transaction() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == busy.id).values(rack_id=rack.id))
    services = Services.build(db, CLOCK)
    idle = RackIdleSettings(frozenset({OperationKind.POWER_RESET}), "")
    await services.checks.create(CheckInput(name="idle", settings=idle, interval="100ms"))
    async with checking(db):
        held = await _held_with(db, task, "is running on the rack")
        assert (
            held.held_reason
            == f"pre-flight check 'idle': rack_idle: power_reset task {busy.id} is running on the rack"
        )
        async with db.transaction() as conn:
            await set_status(conn, [busy.id], TaskStatus.COMPLETED, now=CLOCK.now())
        assert (await finished(db, task)).status is TaskStatus.COMPLETED


# --- a claim deciding on a round, and the next round, one after the other (issue 26's soak finding) ---


async def _claim(
    db: Database,
    conn: AsyncConnection,
    services: Services,
    now: datetime,
    running: Collection[uuid.UUID] = (),
) -> list[uuid.UUID]:
    """One claim with the gates, in `conn`'s transaction, as the executor makes it (`running`: the tasks
    it runs already): the tasks that start."""
    claimed = await task_runs.claim(
        db, conn, owner_id=OWNER, lease_ttl=timedelta(seconds=30), running_here=running, now=now, limit=10
    )
    gated = await consult(services.gates, conn, claimed, owner_id=OWNER, now=now)
    return [task.id for task, _ in gated.claimed]


async def _passed_once(db: Database, hook_url: str) -> tuple[Services, PreflightChecker, FakeClock, Task]:
    """A task held by a drain hook (interval 2s) whose first round passed: released, not yet claimed."""
    clock = FakeClock(CLOCK.now())
    services = Services.build(db, clock)
    await services.checks.create(
        # A timeout well past the hooks' one-second answers: on a loaded machine a 2 s one ran out once.
        CheckInput(name="drained", settings=WebhookSettings(hook_url, "", "5s"), interval="2s")
    )
    task = await submit(db, await make_rack(db, computes=1), POWER_ON)
    checker = PreflightChecker(db, clock, services.tasks)
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, clock.now()) == []  # held for its first round
    assert await checker.poll() == 1
    await checker.settle()
    assert (await get(db, task)).not_before is None  # released: the next claim starts it
    return services, checker, clock, task


async def test_a_round_due_while_a_claim_starts_the_task_is_not_taken(db: Database) -> None:
    """The claim decides on the last round (passed, fresh at its `now`) and, before it commits, the next
    round falls due: the checker must not ask about the task and record a failing round for a task that
    then starts (the soak found one started beside such a round). The checker reads the round as due
    before the claim commits, and waits for the claim's lock to take it (SQLite: for the write lock)."""
    with receiving(Answer({"ok": True}), Answer({"ok": False, "reason": "jobs came back"})) as hook:
        services, checker, clock, task = await _passed_once(db, hook.url)
        deciding_at = clock.now() + timedelta(seconds=1.9)  # the round that passed is fresh until +2s
        async with db.transaction() as conn:
            assert await _claim(db, conn, services, deciding_at) == [task.id]
            clock.advance(timedelta(seconds=2.5))  # the next round is due; the claim has not committed
            polling = asyncio.create_task(checker.poll())
            await waiting_for(db, conn, polling)
        await polling
        await checker.settle()
        asked = len(hook.posts)
    assert (await get(db, task)).status is not TaskStatus.PENDING
    async with db.read() as conn:
        rounds = (await conn.execute(select(preflight_results.c.attempt, preflight_results.c.passed))).all()
    assert [tuple(r) for r in rounds] == [(1, True)], "a round was recorded for a task that started"
    assert asked == 1


async def test_a_claim_while_a_round_is_under_way_holds_the_task(db: Database) -> None:
    """A claim whose `now` is still before the last pass went stale (its clock read before a slow
    statement, or another instance's) while a checker is asking the next round: the task waits for it."""
    slow_no = Answer({"ok": False, "reason": "jobs came back"}, delay=1.0)
    with receiving(Answer({"ok": True}), slow_no) as hook:
        services, checker, clock, task = await _passed_once(db, hook.url)
        deciding_at = clock.now() + timedelta(seconds=1.9)
        clock.advance(timedelta(seconds=2.5))
        assert await checker.poll() == 1  # its round asks the hook, which takes a second to say no

        async def taken() -> bool:
            async with db.read() as conn:
                found = select(preflight_tasks.c.checking_until).where(preflight_tasks.c.task_id == task.id)
                return (await conn.execute(found)).scalar_one() is not None

        await eventually(taken)
        async with db.transaction() as conn:
            started = await _claim(db, conn, services, deciding_at)
        await checker.settle()
    assert started == [], "the task started while a round of its checks was under way"
    held = await get(db, task)
    assert held.status is TaskStatus.PENDING and "jobs came back" in (held.held_reason or "")


async def test_a_late_round_is_not_recorded_for_a_task_that_no_longer_waits(db: Database) -> None:
    """A checker whose lease ran out (a stopped instance) comes back after the task started: its round is
    neither taken nor recorded, by a conditional write in the database."""
    with receiving(Answer({"ok": True})) as hook:
        services, _, clock, task = await _passed_once(db, hook.url)
        async with db.read() as conn:
            [waiting] = (await store.gate_read(conn, [task.id], ())).waiting.values()
        async with db.transaction() as conn:
            assert await _claim(db, conn, services, clock.now()) == [task.id]
        late = clock.now() + timedelta(seconds=3)
        async with db.transaction() as conn:
            assert not await store.take_rounds(db, conn, GATE_NAME, [(waiting, late)], now=late)
        failing = CheckResult(task.id, uuid.uuid4(), "drained", 2, False, "no", late, late)
        async with db.transaction() as conn:
            recorded = await store.record_rounds(
                db, conn, GATE_NAME, [store.Round(task.id, 2, [failing], late, late)]
            )
    assert not recorded
    assert await _count(db, preflight_results) == 1


async def test_a_checker_whose_round_was_taken_over_records_nothing(db: Database) -> None:
    """A checker that stalled past its lease comes back with its answer after another took the round over
    (same round number, a new lease): its pass was recorded, released the task, and the claim started it
    while the other checker was still asking. The round's fence is its lease's end too."""
    clock = FakeClock(CLOCK.now())
    services = Services.build(db, clock)
    check = await services.checks.create(
        CheckInput(name="drained", settings=WebhookSettings("http://127.0.0.1:9/", "", "5s"), interval="2s")
    )
    task = await submit(db, await make_rack(db, computes=1), POWER_ON)
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, clock.now()) == []  # held for its first round

    async def take(lease: timedelta) -> datetime:
        async with db.read() as conn:
            [(_, waiting)] = await store.due(conn, GATE_NAME, now=clock.now(), limit=10)
        until = clock.now() + lease
        async with db.transaction() as conn:
            assert await store.take_rounds(db, conn, GATE_NAME, [(waiting, until)], now=clock.now()) == {
                task.id
            }
        return until

    first_lease = await take(timedelta(seconds=35))
    clock.advance(timedelta(seconds=36))  # the first checker stalls past its lease
    await take(timedelta(seconds=35))  # another takes the round over
    now = clock.now()
    passed = CheckResult(task.id, check.id, "drained", 1, True, "ok", now, now + timedelta(seconds=2))
    async with db.transaction() as conn:
        late = [store.Round(task.id, 1, [passed], passed.recheck_at, first_lease)]
        assert await store.record_rounds(db, conn, GATE_NAME, late) == set()
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, clock.now()) == []  # the round under way decides


@pytest.mark.parametrize("retried", [False, True], ids=["first attempt", "a retry"])
async def test_a_task_never_starts_before_the_round_that_let_it_start(db: Database, retried: bool) -> None:
    """The claim reads its clock (its `now`, which its statement stamps as the start) before its statement
    runs, and on PostgreSQL (READ COMMITTED) that statement sees every commit from before it began: a
    passing round the checker stamped after that reading, and committed before the statement, released the
    task, and the claim started it 24 ms before the round that let it (the chaos soak, seed 7, under a
    132 ms delay on the database's connections). A round from after the claim's time holds the task until
    that time; the next claim starts it. For a retry, its attempt's start (`attempt_started_at`)."""
    with receiving(Answer({"ok": True})) as hook:
        # Ahead of the task's making (`submit_retrying` stamps it by the system's clock), as a claim's
        # clock is: a start is never before its task was made (`store.task_runs`).
        clock = FakeClock(CLOCK.now() + timedelta(minutes=1))
        services = Services.build(db, clock)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "5s"), interval="2s")
        )
        task = await submit_retrying(db, await make_rack(db, computes=1), QUICK)
        checker = PreflightChecker(db, clock, services.tasks)
        first_start = clock.now()
        if retried:  # its first attempt started on its round, failed, and its back-off ended
            async with db.transaction() as conn:
                assert await _claim(db, conn, services, clock.now()) == []
            assert await checker.poll() == 1
            await checker.settle()
            async with db.transaction() as conn:
                assert await _claim(db, conn, services, clock.now()) == [task.id]
                back_off = {task.id: (clock.now() + timedelta(seconds=1), "retrying")}
                assert await task_runs.retry_later(conn, back_off, owner_id=OWNER, now=clock.now())
            clock.advance(timedelta(seconds=1))
        async with db.transaction() as conn:
            assert await _claim(db, conn, services, clock.now()) == []  # held for its attempt's round
        claims_now = clock.now()  # the claim reads its clock ...
        clock.advance(timedelta(milliseconds=24))
        assert await checker.poll() == 1  # ... and the checker stamps a round later, which passes
        await checker.settle()
        async with db.read() as conn:
            last = select(func.max(preflight_results.c.checked_at))
            checked_at = (await conn.execute(last.where(preflight_results.c.task_id == task.id))).scalar_one()
        async with db.transaction() as conn:  # ... and its statement runs after the round committed
            on_the_later_round = await _claim(db, conn, services, claims_now)
        held = await get(db, task)
        async with db.transaction() as conn:
            next_claim = await _claim(db, conn, services, clock.now())
    started = await get(db, task)
    assert checked_at == claims_now + timedelta(milliseconds=24)
    assert on_the_later_round == [], "the task started before the round that let it start"
    assert (held.status, held.held_by, held.not_before) == (TaskStatus.PENDING, GATE_NAME, checked_at)
    assert next_claim == [task.id]
    assert started.attempt_started_at == clock.now() and started.attempt_started_at >= checked_at
    assert started.started_at == (first_start if retried else started.attempt_started_at)


async def test_a_plain_firings_task_starts_when_its_checks_pass(db: Database) -> None:
    """Not a rollout: its run has no caps (its policy a JSON null), and nothing holds it back. Held by its
    checks before, it is counted by the rollouts' cap gate (`rollouts.gate`), which reads its run's policy
    once and locks no run (a plain firing's task that nothing held reads no run at all)."""
    env = make_env(db)
    rack = await env.rack("r00")
    with receiving(Answer({"ok": True})) as hook:
        await env.services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="1h")
        )
        schedule = await env.schedule(racks=[rack])
        checker = PreflightChecker(db, env.clock, env.services.tasks)
        [task_id] = await env.services.schedules.trigger(schedule.id)
        async with db.transaction() as conn:
            assert await _claim(db, conn, env.services, env.clock.now()) == []
        assert await checker.poll() == 1
        await checker.settle()
        async with db.transaction() as conn:
            with statements_sent(db) as sent:
                assert await _claim(db, conn, env.services, env.clock.now()) == [task_id]
        runs_read = [s for s, _ in sent if s.lstrip().startswith("SELECT task_schedule_run.id")]
        assert len(runs_read) == 1 and "FOR UPDATE" not in runs_read[0], sent


# --- checks that only read the database, asked in the claim itself (issue 26: the drain) ---------


async def _rounds(db: Database, task: Task) -> list[tuple[int, bool, str]]:
    async with db.read() as conn:
        found = select(preflight_results.c.attempt, preflight_results.c.passed, preflight_results.c.reason)
        rows = await conn.execute(found.where(preflight_results.c.task_id == task.id))
        return [(r.attempt, r.passed, r.reason) for r in rows]


async def test_a_rack_idle_check_that_passes_starts_the_task_at_its_first_claim_with_its_round_recorded(
    db: Database,
) -> None:
    """No hold and no second claim: the gate asks a check that only reads the database itself, and the
    task starts at once, its round stored as the checker would have (`task show`, the metrics)."""
    services = Services.build(db, CLOCK)
    idle = RackIdleSettings(frozenset({OperationKind.POWER_RESET}), "1h")
    await services.checks.create(CheckInput(name="quiet-rack", settings=idle))
    task = await submit(db, await make_rack(db, computes=1), POWER_ON)
    passes = _results("quiet-rack", "pass")
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, CLOCK.now()) == [task.id]
    assert await _rounds(db, task) == [(1, True, "pre-flight check 'quiet-rack': rack_idle: idle")]
    async with db.read() as conn:
        assert (await store.gate_read(conn, [task.id], ())).waiting[task.id].attempt == 1
    assert _results("quiet-rack", "pass") == passes + 1
    started = await get(db, task)
    assert started.status is TaskStatus.RUNNING and started.held_by is None


async def test_passing_rack_idle_checks_cost_a_claim_two_round_trips_on_postgresql(db: Database) -> None:
    """The drain's cost (issue 26): the executor's journal waits for each round trip of a claim, so the
    gate that asks rack_idle checks in the claim reads the checks (as with none), then the tasks' rounds
    and what runs on their racks in one statement, and writes their rounds in one (PostgreSQL; SQLite's
    executemany per table has no round trips), however many tasks and checks."""
    services = Services.build(db, CLOCK)
    for name in ("quiet-a", "quiet-b", "quiet-c"):
        idle = RackIdleSettings(frozenset({OperationKind.POWER_RESET}), "")
        await services.checks.create(CheckInput(name=name, settings=idle))
    for i in range(4):
        await submit(db, await _rack(db, f"r{i}"), POWER_ON)
    async with db.transaction() as conn:
        claimed = await task_runs.claim(
            db,
            conn,
            owner_id=OWNER,
            lease_ttl=timedelta(seconds=30),
            running_here=(),
            now=CLOCK.now(),
            limit=10,
        )
        with statements_sent(db) as sent:
            gated = await consult(services.gates, conn, claimed, owner_id=OWNER, now=CLOCK.now())
    assert len(gated.claimed) == 4 and not gated.failed
    gate = [statement for statement, _ in sent if "preflight" in statement]
    assert len(gate) == (3 if db.is_postgres else 4), gate
    assert "preflight_checks" in gate[0] and "preflight_results" in gate[-1]


async def test_a_rack_idle_check_that_fails_holds_the_task_at_its_first_claim_with_the_reason(
    db: Database,
) -> None:
    """The reason is on the task from its first claim; the checker asks the next round after the interval
    and releases the task once the rack is idle."""
    clock = FakeClock(CLOCK.now())
    rack = await make_rack(db, computes=1)
    task = await submit(db, rack, POWER_ON)
    busy = await submit(db, await _rack(db, "r2"), Operation(OperationKind.POWER_RESET))
    await start_running(db, busy, uuid.uuid4(), heartbeat_age=-timedelta(hours=1))
    async with db.transaction() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == busy.id).values(rack_id=rack.id))
    services = Services.build(db, clock)
    idle = RackIdleSettings(frozenset({OperationKind.POWER_RESET}), "")
    await services.checks.create(CheckInput(name="idle", settings=idle, interval="2s"))
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, clock.now(), running=[busy.id]) == []
    reason = f"pre-flight check 'idle': rack_idle: power_reset task {busy.id} is running on the rack"
    held = await get(db, task)
    assert held.status is TaskStatus.PENDING and held.held_by == GATE_NAME and held.held_reason == reason
    assert await _rounds(db, task) == [(1, False, reason)]
    (shown,) = (await services.checks.latest_rounds([task.id, busy.id]))[task.id]  # what `task show` lists
    assert (shown.check_name, shown.attempt, shown.passed, shown.reason) == ("idle", 1, False, reason)
    checker = PreflightChecker(db, clock, services.tasks)
    assert await checker.poll() == 0  # its next round is due after the interval
    async with db.transaction() as conn:
        await set_status(conn, [busy.id], TaskStatus.COMPLETED, now=clock.now())
    clock.advance(timedelta(seconds=2))
    assert await checker.poll() == 1
    await checker.settle()
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, clock.now()) == [task.id]
    assert [(attempt, passed) for attempt, passed, _ in await _rounds(db, task)] == [(1, False), (2, True)]
    latest = await services.checks.latest_rounds([task.id, busy.id])
    assert [(r.attempt, r.passed) for r in latest[task.id]] == [(2, True)] and busy.id not in latest


async def test_two_tasks_each_busy_for_the_other_never_start_together_in_one_claim(db: Database) -> None:
    """The claim made both RUNNING before its gate asks: the older starts, the other is held because of
    it (not both held by each other, not both started)."""
    rack = await make_rack(db, computes=2)
    compute = [c.id for c in rack.components if c.type is ComponentType.COMPUTE]
    services = Services.build(db, CLOCK)
    each_other = RackIdleSettings(frozenset({OperationKind.POWER_ON, OperationKind.POWER_RESET}), "")
    await services.checks.create(CheckInput(name="one-at-a-time", settings=each_other))
    manager = services.tasks
    [first] = await manager.submit(
        POWER_ON,
        [RackSelection(rack.id, ComponentsFilter(frozenset(compute[:1])))],
        description="",
        queue=REJECT,
    )
    [second] = await manager.submit(
        Operation(OperationKind.POWER_RESET),
        [RackSelection(rack.id, ComponentsFilter(frozenset(compute[1:])))],
        description="",
        queue=REJECT,
    )
    async with db.transaction() as conn:
        assert await _claim(db, conn, services, CLOCK.now()) == [first.id]
    held = await get(db, second)
    assert held.held_reason == (
        f"pre-flight check 'one-at-a-time': rack_idle: power_on task {first.id} is running on the rack"
    )


# --- the look ahead (issue 26) ------------------------------------------------------------------


def _looking(db: Database, services: Services, clock: FakeClock, ahead: list[int]) -> PreflightChecker:
    """A checker that looks ahead at `ahead[0]` tasks (as if its executor ended so many in the last
    second), behind the gates before the pre-flight gate, as `rackflow serve` wires it."""
    return PreflightChecker(
        db, clock, services.tasks, ahead=lambda: ahead[0], gates=services.gates_before_checks
    )


async def _rounds_of(db: Database, task: Task) -> list[tuple[int, bool]]:
    async with db.read() as conn:
        stmt = (
            select(preflight_results.c.attempt, preflight_results.c.passed)
            .where(preflight_results.c.task_id == task.id)
            .order_by(preflight_results.c.attempt)
        )
        return [(row.attempt, row.passed) for row in await conn.execute(stmt)]


async def test_tasks_next_in_line_are_asked_ahead_of_their_claim_and_start_at_it(db: Database) -> None:
    """With no room in any executor (no claim took them), the checker asks about as many tasks next in
    line as it is told are about to be claimed, oldest first, counting those asked and not started: each
    is held as a first claim holds it, its round passes and releases it, and its first claim starts it on
    that round, asking nothing more."""
    clock = FakeClock(CLOCK.now())
    with receiving(Answer({"ok": True})) as hook:
        services = Services.build(db, clock)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="30s")
        )
        first = await submit(db, await _rack(db, "r1"), POWER_ON)
        second = await submit(db, await _rack(db, "r2"), POWER_ON)
        third = await submit(db, await _rack(db, "r3"), POWER_ON)
        ahead = [0]
        checker = _looking(db, services, clock, ahead)
        assert await checker.poll() == 0  # nothing ends, nothing is about to be claimed: nothing asked
        ahead[0] = 1
        assert await checker.poll() == 1
        await checker.settle()
        assert [p["task_id"] for p in hook.payloads()] == [str(first.id)]
        released = await get(db, first)
        assert released.held_by == GATE_NAME and released.not_before is None and released.started_at is None
        ahead[0] = 2  # the first, asked and not started, counts: one more
        assert await checker.poll() == 1
        await checker.settle()
        assert await checker.poll() == 0
        async with db.transaction() as conn:
            started = await _claim(db, conn, services, clock.now())
        payloads = hook.payloads()
    assert set(started) == {first.id, second.id}
    later = await get(db, third)  # not asked ahead: its first claim held it, as without a look ahead
    assert later.held_by == GATE_NAME and later.held_reason == "waits for pre-flight checks 'drained'"
    assert [(p["task_id"], p["attempt"]) for p in payloads] == [(str(first.id), 1), (str(second.id), 1)]
    assert await _rounds_of(db, first) == [(1, True)] and await _rounds_of(db, second) == [(1, True)]


async def test_one_poll_takes_the_due_rounds_and_looks_ahead_on_one_read_of_the_checks(db: Database) -> None:
    """A poll with a due round (a task a claim held) and a task next in line takes both rounds, and reads
    the checks, the racks and their components once for the two: the event loop's work per poll (issue
    26). Each hook is told its own task's rack."""
    clock = FakeClock(CLOCK.now())
    with receiving(Answer({"ok": True})) as hook:
        services = Services.build(db, clock)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="30s")
        )
        held = await submit(db, await _rack(db, "r1"), POWER_ON)
        async with db.transaction() as conn:
            assert await _claim(db, conn, services, clock.now()) == []  # held for its first round, due
        ahead = await submit(db, await _rack(db, "r2"), POWER_ON)
        checker = _looking(db, services, clock, [2])  # `held`, asked and not started, counts: one more
        with statements_sent(db) as sent:
            assert await checker.poll() == 2
        await checker.settle()
        payloads = hook.payloads()
    reads = [s for s, _ in sent if s.lstrip().startswith("SELECT")]
    assert len([s for s in reads if "FROM preflight_checks" in s]) == 1, reads
    assert len([s for s in reads if "FROM racks" in s]) == 1, reads
    assert len([s for s in reads if "FROM components" in s]) == 1, reads
    told = {(p["task_id"], p["rack"]["name"], p["attempt"]) for p in payloads}
    assert told == {(str(held.id), "r1", 1), (str(ahead.id), "r2", 1)}
    assert await _rounds_of(db, held) == [(1, True)] and await _rounds_of(db, ahead) == [(1, True)]


async def test_the_queue_head_reads_what_the_gates_look_at_not_whole_rows(db: Database) -> None:
    """`store.queue_head` reads of the tasks next in line only what the gates' looks count (id, rack,
    operation, `ignore_windows`) and whether each was asked: the look ahead reads whole only the few it
    asks about (issue 26: some 100 whole rows a look were the event loop's work)."""
    asked, fresh = (
        await submit(db, await _rack(db, "r1"), POWER_ON),
        await submit(db, await _rack(db, "r2"), POWER_OFF),
    )
    async with db.transaction() as conn:
        await store.start_waiting(conn, [asked.id])
        await conn.execute(update(tasks).where(tasks.c.id == asked.id).values(held_by=GATE_NAME))
    statement, _ = await statement_sent(
        db, lambda conn: store.queue_head(conn, GATE_NAME, now=CLOCK.now(), limit=10)
    )
    async with db.read(in_transaction=True) as conn:
        head = await store.queue_head(conn, GATE_NAME, now=CLOCK.now(), limit=10)
    assert "parameters" not in statement and "component_ids" not in statement, statement
    assert {(t.id, t.kind, t.ignore_windows, was_asked) for t, was_asked in head} == {
        (asked.id, OperationKind.POWER_ON, False, True),
        (fresh.id, OperationKind.POWER_OFF, False, False),
    }


async def test_the_look_ahead_asks_only_what_windows_and_budgets_admit(db: Database) -> None:
    """A task a FREEZE holds is not asked ahead, nor one a full budget would hold, counting the tasks
    before it in line as started: the checks are asked only about tasks the windows and budgets admit."""
    clock = FakeClock(CLOCK.now())
    with receiving(Answer({"ok": True})) as hook:
        services = Services.build(db, clock)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="30s")
        )
        frozen_rack, r2, r3 = await _rack(db, "frozen"), await _rack(db, "r2"), await _rack(db, "r3")
        await services.windows.create(
            WindowInput(
                name="launch",
                kind=WindowKind.FREEZE,
                when=OneOff(clock.now() - timedelta(hours=1), clock.now() + timedelta(days=1)),
                racks=(Ref(name=frozen_rack.name),),
            )
        )
        await services.budgets.create(BudgetInput("one-reset", (OperationKind.POWER_ON,), 1))
        frozen = await submit(db, frozen_rack, POWER_ON)
        admitted = await submit(db, r2, POWER_ON)
        over_budget = await submit(db, r3, POWER_ON)
        checker = _looking(db, services, clock, [10])
        assert await checker.poll() == 1
        await checker.settle()
        payloads = hook.payloads()
    assert [p["task_id"] for p in payloads] == [str(admitted.id)]
    assert (await get(db, frozen)).held_by is None and (await get(db, over_budget)).held_by is None


async def test_a_pass_asked_ahead_counts_for_one_interval(db: Database) -> None:
    """A task asked ahead whose claim comes after its round went stale is asked again, as any task claimed
    late: a round's freshness does not depend on who asked it."""
    clock = FakeClock(CLOCK.now())
    with receiving(Answer({"ok": True})) as hook:
        services = Services.build(db, clock)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="2s")
        )
        task = await submit(db, await _rack(db, "r1"), POWER_ON)
        checker = _looking(db, services, clock, [1])
        assert await checker.poll() == 1
        await checker.settle()
        clock.advance(timedelta(seconds=3))
        async with db.transaction() as conn:
            assert await _claim(db, conn, services, clock.now()) == []  # stale: held for a new round
        assert await checker.poll() == 1
        await checker.settle()
        async with db.transaction() as conn:
            assert await _claim(db, conn, services, clock.now()) == [task.id]
        asked = len(hook.posts)
    assert asked == 2 and await _rounds_of(db, task) == [(1, True), (2, True)]


async def test_the_look_ahead_takes_no_task_a_claim_took_or_held(db: Database) -> None:
    """`store.ask_ahead` reads its conditions under the tasks' locks: a task a claim started (RUNNING) or
    held for its first round (its row added, not due) meanwhile is not taken, and nothing is written."""
    clock = FakeClock(CLOCK.now())
    with receiving(Answer({"ok": True})) as hook:
        services = Services.build(db, clock)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="30s")
        )
        running = await submit(db, await _rack(db, "r1"), POWER_ON)
        held = await submit(db, await _rack(db, "r2"), POWER_ON)
        await start_running(db, running, OWNER)
        async with db.transaction() as conn:
            assert await _claim(db, conn, services, clock.now(), running=[running.id]) == []  # holds `held`
        now = clock.now()
        hold = Hold(now + timedelta(seconds=30), "waits")
        async with db.transaction() as conn:
            taken = await store.ask_ahead(
                db, conn, GATE_NAME, {running.id: (hold, now), held.id: (hold, now)}, now=now
            )
        asked = len(hook.posts)
    assert taken == set() and asked == 0
    assert (await get(db, running)).status is TaskStatus.RUNNING
    assert await _count(db, preflight_tasks) == 1  # `held`'s, from its claim


# --- a burst held for its first rounds no faster than the executor could start it (issue 26) ---

LONG_STEPS = SimulatorBackend(SimulatorConfig(step_seconds=3600))


async def _burst(db: Database, hook_url: str, count: int) -> list[Task]:
    services = Services.build(db, CLOCK)
    await services.checks.create(
        # A timeout that outlasts a test's wait for the executor's polls while it keeps an answer back.
        CheckInput(name="drained", settings=WebhookSettings(hook_url, "", "30s"), interval="1h")
    )
    return [await submit(db, await _rack(db, f"burst-{i}"), POWER_ON) for i in range(count)]


async def _statuses(db: Database, burst: Collection[Task]) -> list[TaskStatus]:
    return [(await get(db, task)).status for task in burst]


async def _polled(executor: Executor, more: int) -> None:
    """Until `executor` has finished `more` polls from now on: each would have claimed what room it saw."""
    polls = counting_polls(executor)

    async def done() -> bool:
        return len(polls) >= more

    await eventually(done)


async def test_tasks_held_for_their_first_round_keep_their_slots_until_it_is_answered(db: Database) -> None:
    """Two slots, steps that outlast the test, eight new tasks, a hook that passes each once the test lets
    it: two are held and asked, and keep their slots over the executor's next polls (each of which would
    claim two more into free slots); answered, they start, and the other six are never claimed, so the
    hook is asked twice, not eight times. (Before, a held task freed its slot at once: every claim held two
    more, and all eight were asked while two could run.)"""
    answering = threading.Event()
    executors: list[Executor] = []
    with receiving(Answer(after=answering)) as hook:
        try:
            burst = await _burst(db, hook.url, 8)
            async with checking(db, backend=LONG_STEPS, max_concurrent=2, executors=executors):
                await eventually(lambda: _asked(hook, 2))
                await _polled(executors[0], 3)
                held = [t.id for t in burst if (await get(db, t)).held_by == GATE_NAME]
                assert held == [t.id for t in burst[:2]], "a claim held more tasks than it had slots for"
                assert len(hook.posts) == 2

                async def two_running() -> bool:
                    return (await _statuses(db, burst)).count(TaskStatus.RUNNING) == 2

                answering.set()
                await eventually(two_running)
                await _polled(executors[0], 3)  # its slots full, it claims nothing
                assert (await _statuses(db, burst)).count(TaskStatus.RUNNING) == 2
        finally:
            answering.set()  # for the receiver's threads to end
        assert len(hook.posts) == 2


@pytest.mark.parametrize("told", [True, False], ids=["told", "read-back"])
async def test_a_hold_answered_frees_the_slot_the_task_kept(db: Database, told: bool) -> None:
    """The same burst with a hook that says "not ready" to every task: each answer holds its task until
    the retry, which frees its slot, so all eight are asked in turn, two at a time, and none starts;
    also when the checker does not tell the executor (as another instance's would not): the executor
    then finds the answers by reading its holds back."""
    draining = Answer({"ok": False, "reason": "draining", "retry_after": "1h"}, delay=0.1)
    with receiving(draining) as hook:
        burst = await _burst(db, hook.url, 8)
        async with checking(db, told=told, backend=LONG_STEPS, max_concurrent=2):

            async def all_asked() -> bool:
                return len(hook.posts) == 8

            await eventually(all_asked)
            assert set(await _statuses(db, burst)) == {TaskStatus.PENDING}
            for task in burst:
                await _held_with(db, task, "draining")


async def test_a_slot_kept_for_an_answer_frees_when_the_hold_ends(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No checker answers (none runs): the two tasks held for their first round keep the two slots only
    until their holds end (`PREFLIGHT_ANSWER_WAIT`, 0.5 s here); then a claim takes them again (oldest
    first) and holds them anew, and the two younger tasks are never claimed meanwhile."""
    monkeypatch.setattr("rackflow.checks.gate.PREFLIGHT_ANSWER_WAIT", timedelta(milliseconds=500))
    with receiving() as hook:
        burst = await _burst(db, hook.url, 4)
        services = Services.build(db, CLOCK)
        async with executing(db, gates=services.gates, backend=LONG_STEPS, max_concurrent=2):

            async def held() -> dict[uuid.UUID, datetime | None]:
                found = [await get(db, task) for task in burst]
                return {t.id: t.not_before for t in found if t.held_by == GATE_NAME}

            async def two_held() -> bool:
                return len(await held()) == 2

            await eventually(two_held)
            first = await held()
            assert set(first) == {burst[0].id, burst[1].id}

            async def held_anew() -> bool:
                now = await held()
                return set(now) == set(first) and all(now[i] != first[i] for i in first)

            await eventually(held_anew)
        assert hook.posts == []


# --- the checker idle: asleep until a round is due or a claim holds a task ------------------------------


async def test_an_idle_checker_sleeps_until_a_claim_holds_a_task_or_a_round_comes_due(db: Database) -> None:
    """With no task held, the checker reads nothing for its idle interval (here a minute; the old checker
    polled every second). A claim whose gate holds a task wakes it once the claim committed (the gate's own
    wake, before the commit, is not wired here), and a held task's next round, due later than the poll
    interval, is taken at its time, not at the idle minute."""
    clock = SystemClock()
    services = Services.build(db, clock)
    no, ok = Answer({"ok": False, "reason": "jobs running"}), Answer({"ok": True})
    with receiving(no, ok) as hook:
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "5s"), interval="3s")
        )
        task = await submit(db, await make_rack(db, computes=1), POWER_ON)
        checker = PreflightChecker(db, clock, services.tasks, idle_interval=timedelta(minutes=1))
        stop = asyncio.Event()
        running = asyncio.create_task(checker.run(stop))
        try:
            with statements_sent(db) as first:  # its first poll, then its look: nothing held
                await eventually(lambda: _looked(first))
            with statements_sent(db) as sent:
                await asyncio.sleep(2.5)
            assert sent == []
            async with db.transaction() as conn:
                assert await _claim(db, conn, services, clock.now()) == []  # held for its first round
            await eventually(lambda: _asked(hook, 1))  # woken after the claim's commit
            await _held_with(db, task, "jobs running")
            await eventually(lambda: _asked(hook, 2))  # the next round, 3 s later: at its time
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)
    assert db.on_commit[store.ROUND_DUE] == []


async def _asked(hook: Receiver, count: int) -> bool:
    return len(hook.posts) >= count


async def _looked(sent: list[tuple[str, object]]) -> bool:
    """Whether the checker sent its look at when the first held round comes due (`store.next_round_at`),
    the last statement before its nap."""
    return any(text.startswith("SELECT min(") and "preflight_tasks" in text for text, _ in sent)


async def test_next_round_at_is_when_the_first_held_round_comes_due(db: Database) -> None:
    """None with no task held; a round due now (no time yet) is due at `now`; a round under way is due when
    its lease ends; else its next check's time."""
    env = make_env(db)
    now = env.clock.now()
    first, second = [await submit(db, await _rack(db, f"r{i}"), POWER_ON) for i in range(2)]
    async with db.read() as conn:
        assert await store.next_round_at(conn, GATE_NAME, now=now) is None
    async with db.transaction() as conn:
        await conn.execute(update(tasks).values(held_by=GATE_NAME, not_before=now + timedelta(hours=1)))
        await store.start_waiting(conn, [first.id, second.id])
    async with db.read() as conn:
        assert await store.next_round_at(conn, GATE_NAME, now=now) == now
    later, lease = now + timedelta(seconds=30), now + timedelta(seconds=50)
    async with db.transaction() as conn:
        waiting = preflight_tasks.c.task_id
        await conn.execute(update(preflight_tasks).where(waiting == first.id).values(next_check_at=later))
        under_way = {"next_check_at": now, "checking_until": lease}
        await conn.execute(update(preflight_tasks).where(waiting == second.id).values(**under_way))
    async with db.read() as conn:
        assert await store.next_round_at(conn, GATE_NAME, now=now) == later
    async with db.transaction() as conn:
        await conn.execute(
            update(preflight_tasks).where(waiting == first.id).values(next_check_at=lease + timedelta(1))
        )
    async with db.read() as conn:
        assert await store.next_round_at(conn, GATE_NAME, now=now) == lease


async def test_a_round_asked_before_its_check_changed_does_not_release_the_task(db: Database) -> None:
    """A round under way when the check is changed answers for the old settings: stamped when it was
    answered, it read as newer than the change and released the task, and the new hook was never asked.
    Stamped when asked, it counts for nothing, and the check is asked again as it is now."""
    rack = await _rack(db, "r1")
    slow_ok = Answer({"ok": True}, delay=1.5)
    with (
        receiving(slow_ok) as old_hook,
        receiving(Answer({"ok": False, "reason": "not drained"})) as new_hook,
    ):
        services = Services.build(db, CLOCK)
        check = await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(old_hook.url, "", "5s"), interval="10s")
        )
        task = await submit(db, rack, POWER_ON)
        async with checking(db) as running:

            async def asked() -> bool:
                return len(old_hook.posts) >= 1

            await eventually(asked)  # the round under the old settings is under way
            changed = CheckInput(settings=WebhookSettings(new_hook.url, "", "5s"))
            await running.checks.update(check.id, [KIND_PATH], changed)
            held = await _held_with(db, task, "not drained")
    assert held.status is TaskStatus.PENDING and len(new_hook.posts) >= 1


async def test_a_hook_whose_answer_is_not_http_holds_the_task_saying_so(db: Database) -> None:
    """http.client's errors are neither OSError nor ValueError: one escaped the look, the round was never
    recorded, and the task waited with no reason given. Now it is a failing look like any other."""
    rack = await _rack(db, "r1")
    with not_http() as url:
        services = Services.build(db, CLOCK)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(url, "", "2s"), interval="10s")
        )
        task = await submit(db, rack, POWER_ON)
        async with checking(db):
            held = await _held_with(db, task, "the answer was not HTTP (BadStatusLine)")
    assert held.status is TaskStatus.PENDING


async def test_a_bug_in_a_look_is_logged_with_its_traceback_and_without_the_url_s_token(
    db: Database, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A look that raises what it does not expect holds the task, and the checker logs the traceback: the
    exception's words, and those of the one it was raised from, may quote the check's URL whole, token and
    all, which `log.exception` wrote into the log as it was (docs/CHECKS.md: the log shows it hidden)."""
    from rackflow.checks import kinds

    rack = await _rack(db, "r1")
    url = "http://127.0.0.1:9/drain?token=t0ps3cret"

    async def broken(settings: WebhookSettings, payload: object, asked: object) -> object:
        try:
            raise KeyError(f"no route for {settings.url}")
        except KeyError as exc:
            raise RuntimeError(f"cannot post to {settings.url}") from exc

    monkeypatch.setattr(kinds, "webhook", broken)
    services = Services.build(db, CLOCK)
    await services.checks.create(
        CheckInput(name="drained", settings=WebhookSettings(url, "", "2s"), interval="10s")
    )
    task = await submit(db, rack, POWER_ON)
    with caplog.at_level(logging.ERROR, logger="rackflow.checks.checker"):
        async with checking(db):
            held = await _held_with(db, task, "RuntimeError")
    assert held.held_reason.endswith("webhook: RuntimeError: cannot post to http://127.0.0.1:9/drain?token=…")
    logged = caplog.text  # the records and their tracebacks, as a log handler writes them
    assert "t0ps3cret" not in logged
    # Still a traceback: the exception, its cause, and where it was raised.
    assert "pre-flight check drained failed on task" in logged
    assert "Traceback (most recent call last)" in logged and "in broken" in logged
    assert "KeyError: 'no route for http://127.0.0.1:9/drain?token=…'" in logged
    assert "RuntimeError: cannot post to http://127.0.0.1:9/drain?token=…" in logged


async def test_a_hook_s_reason_with_control_characters_holds_the_task_with_them_shown(db: Database) -> None:
    """A hook's `reason` (and an alert's labels) is text from outside, written into the task's hold reason,
    its message and the round's result: a NUL in it (`"\\u0000"` in the JSON) failed the transaction that
    records the rounds on PostgreSQL, so the round was never recorded and the task waited with no reason;
    an escape sequence or a newline was shown as it was by `rackflow task show` (the terminal obeying it).
    Control characters are shown escaped, as Python writes them in a string."""
    rack = await _rack(db, "r1")
    with receiving(Answer({"ok": False, "reason": "draining\u0000 3 jobs\n\x1b[2Jrack ready"})) as hook:
        services = Services.build(db, CLOCK)
        await services.checks.create(
            CheckInput(name="drained", settings=WebhookSettings(hook.url, "", "2s"), interval="10s")
        )
        task = await submit(db, rack, POWER_ON)
        async with checking(db):
            held = await _held_with(db, task, "draining")
    shown = "draining\\x00 3 jobs\\n\\x1b[2Jrack ready"
    assert held.held_reason == f"pre-flight check 'drained': webhook: {shown}"
    assert held.message == held.held_reason
    async with db.read() as conn:
        reasons = (await conn.execute(select(preflight_results.c.reason))).scalars().all()
    assert reasons == [held.held_reason]


async def test_a_fail_open_pass_on_an_alertmanager_that_cannot_be_asked_is_logged_as_a_warning(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A `--fail-open` check whose Alertmanager is down lets the task start, as it says; but the checker
    logged that round as `passed` at INFO, and the task said "pre-flight checks passed": an Alertmanager
    down for an hour let every rack through with nothing an operator would notice. It is a warning now,
    naming the check and why it could not ask."""
    rack = await _rack(db, "r1")
    services = Services.build(db, CLOCK)
    settings = AlertmanagerSettings("http://127.0.0.1:9", ('rack="{rack.name}"',), False)
    await services.checks.create(CheckInput(name="no-alerts", settings=settings, interval="10s"))
    task = await submit(db, rack, POWER_ON)
    with caplog.at_level(logging.WARNING, logger="rackflow.checks.checker"):
        async with checking(db):
            assert (await finished(db, task)).status is TaskStatus.COMPLETED
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        f"task {task.id}: pre-flight round 1 passed without an answer: pre-flight check 'no-alerts':"
        " alertmanager: cannot ask http://127.0.0.1:9: [Errno 111] Connection refused (fail_closed is off)"
    )


async def test_a_poll_against_a_busy_alertmanager_logs_one_warning_not_one_per_retry(
    db: Database, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three held tasks on three racks, each rack's matcher a regex (a query a rack), against an
    Alertmanager that refuses each query twice and rack-c's always: each GET asked again was a WARNING
    (4,751 lines for two polls in the field). Each is a DEBUG line now, and the poll's rounds end with one
    WARNING naming the Alertmanager and what its refusals came to."""
    # Counted in tries, not a deadline: on a loaded machine a first GET slower than the deadline was
    # never asked again, and the count of queries asked again came out short.
    monkeypatch.setattr(kinds, "BUSY_RETRY", Retry(0.01, 0.02, attempts=6))
    services = Services.build(db, CLOCK)
    racks = [await _rack(db, name) for name in ("rack-a", "rack-b", "rack-c")]
    with busy_alertmanager(2, always_refused="rack-c") as url:
        settings = AlertmanagerSettings(url, ('rack=~"{rack.name}"',), True)
        await services.checks.create(CheckInput(name="quiet", settings=settings))
        held = [await submit(db, rack, POWER_ON) for rack in racks]
        async with db.transaction() as conn:  # the first claim holds each task for its first round
            assert await _claim(db, conn, services, CLOCK.now()) == []
        caplog.set_level(logging.DEBUG)
        checker = PreflightChecker(db, CLOCK, services.tasks)
        assert await checker.poll() == len(held)
        await checker.settle()
    retries = [r for r in caplog.records if "again in" in r.getMessage()]
    assert len(retries) == 2 * 2 + 5 and {r.levelno for r in retries} == {logging.DEBUG}  # rack-c: 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        f"pre-flight checks: Alertmanager {url} refused GETs as busy (HTTP 503 or 429): 3 queries asked "
        f"again, {len(retries)} times in all; 1 still failed"
    ]
