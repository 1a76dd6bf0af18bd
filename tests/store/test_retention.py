"""Run and task retention (`--run-retention`, `--task-retention`): old schedule runs and ended tasks go, in
chunks, by an index; running runs and active tasks stay however old; what pointed at a deleted row forgets
it; the shared `Pruner` loop counts them. On both databases. (The audit trail's retention, the same loop:
tests/store/test_audit_retention.py.)"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncGenerator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Table, event, insert, select

from rackflow import metrics
from rackflow.retention import Pruner, run_in_order
from rackflow.store import runs as run_history
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.retention import PRUNE_CHUNK
from rackflow.store.tables import racks, task_schedule, task_schedule_run, task_schedule_scope, tasks
from tests.store.query_plans import by_parent_index
from tests.store.test_executor import eventually

RETENTION = timedelta(hours=1)
RACK, SCHEDULE, SCOPE = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()


def _ago(**kwargs: float) -> datetime:
    return datetime.now(UTC) - timedelta(**kwargs)


async def _fleet(db: Database) -> None:
    """One rack and one schedule over it (whose scope's last task is set by the tests)."""
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=RACK, name="r1", created_at=now))
        await conn.execute(
            insert(task_schedule).values(
                id=SCHEDULE,
                name="nightly",
                spec_type="interval",
                spec="1h",
                operation_template={"operation": {"kind": "power_off"}, "queue_timeout_seconds": 3600},
                created_at=now,
                updated_at=now,
            )
        )
        await conn.execute(
            insert(task_schedule_scope).values(id=SCOPE, schedule_id=SCHEDULE, rack_id=RACK, created_at=now)
        )


def _run(fired: datetime, state: str = "completed") -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "schedule_id": SCHEDULE,
        "fired_at": fired,
        "scheduled_for": fired,
        "trigger": "dispatch",
        "state": state,
        "outcomes": [{"rack_id": str(RACK), "outcome": "submitted"}],
    }


def _task(
    status: str,
    created: datetime,
    finished: datetime | None,
    run_id: uuid.UUID | None = None,
    owner_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "operation": "power_off",
        "parameters": {"kind": "power_off", "forced": False},
        "rack_id": RACK,
        "component_ids": [],
        "status": status,
        "created_at": created,
        "updated_at": finished or created,
        "finished_at": finished,
        "schedule_id": SCHEDULE,
        "run_id": run_id,
        "owner_id": owner_id,
    }


async def _insert(db: Database, table: Table, rows: list[dict[str, Any]]) -> list[uuid.UUID]:
    async with db.transaction() as conn:
        await conn.execute(insert(table), rows)
    return [row["id"] for row in rows]


async def _ids(db: Database, table: Table) -> set[uuid.UUID]:
    async with db.read() as conn:
        return set((await conn.execute(select(table.c.id))).scalars())


Prune = Callable[..., AsyncGenerator[int, None]]


async def _prune(db: Database, prune: Prune, chunk: int) -> list[int]:
    return [deleted async for deleted in prune(db, RETENTION, chunk=chunk)]


async def test_old_runs_go_in_chunks_running_and_recent_ones_stay_and_their_tasks_too(
    db: Database,
) -> None:
    await _fleet(db)
    old = [_run(_ago(hours=2)), _run(_ago(hours=3), "interrupted"), _run(_ago(days=40))]
    kept = await _insert(
        db,
        task_schedule_run,
        # A live (here halted) rollout's run stays however old, as a running one does.
        [_run(_ago(hours=5), "running"), _run(_ago(hours=6), "halted"), _run(_ago(minutes=10))],
    )
    await _insert(db, task_schedule_run, old)
    (task,) = await _insert(
        db, tasks, [_task("completed", _ago(hours=2), _ago(hours=2), run_id=old[0]["id"])]
    )

    assert await _prune(db, run_history.prune_old_runs, chunk=2) == [2, 1]
    assert await _ids(db, task_schedule_run) == set(kept)
    async with db.read() as conn:
        run_of_task = (await conn.execute(select(tasks.c.run_id).where(tasks.c.id == task))).scalar_one()
    # The task stays: on PostgreSQL naming the pruned run (no key to it, migration 0036); SQLite's key
    # unlinks it.
    assert run_of_task == (old[0]["id"] if db.is_postgres else None)
    assert await _prune(db, run_history.prune_old_runs, chunk=2) == [0]


async def test_ended_tasks_go_active_and_recently_ended_ones_stay_and_scopes_keep_their_ids(
    db: Database,
) -> None:
    """A scope whose last task is pruned keeps its id (migration 0034: no key to set it NULL, so the
    firings' write-back is a HOT update); the SKIP check finds no such task: nothing to overlap."""
    await _fleet(db)
    old = await _insert(
        db,
        tasks,
        [
            _task("completed", _ago(hours=3), _ago(hours=2)),
            _task("failed", _ago(hours=30), _ago(hours=29)),
            _task("terminated", _ago(days=100), _ago(days=100)),
        ],
    )
    kept = await _insert(
        db,
        tasks,
        [
            _task("running", _ago(hours=5), None),
            _task("waiting", _ago(hours=5), None),
            _task("pending", _ago(hours=5), None),
            _task("completed", _ago(hours=5), _ago(minutes=10)),  # created long ago, ended recently
            _task("completed", _ago(minutes=20), _ago(minutes=10)),
        ],
    )
    async with db.transaction() as conn:
        await conn.execute(task_schedule_scope.update().values(last_task_id=old[0]))

    assert await _prune(db, task_store.prune_finished_tasks, chunk=2) == [2, 1]
    assert await _ids(db, tasks) == set(kept)
    async with db.read() as conn:
        assert (await conn.execute(select(task_schedule_scope.c.last_task_id))).scalar_one() == old[0]


async def test_ended_tasks_still_in_use_stay_however_old(db: Database) -> None:
    """A task cancelled mid-step that its executor still holds keeps its rack (deleted, the rack would look
    free while the step still drives it), and the tasks of a live rollout are what its driver reads (a
    started rack without its task reads as failed): both stay past the retention, and go once released
    or once the rollout has ended (rolling, then halted, are live; completed is not)."""
    await _fleet(db)
    rollout, finished = _run(_ago(days=2), "rolling"), _run(_ago(days=4), "completed")
    await _insert(db, task_schedule_run, [rollout, finished])
    held = _task("terminated", _ago(hours=5), _ago(hours=4), owner_id=uuid.uuid4())
    canary = _task("completed", _ago(days=2), _ago(days=2), run_id=rollout["id"])
    done = _task("completed", _ago(days=4), _ago(days=4), run_id=finished["id"])
    await _insert(db, tasks, [held, canary, done])

    async def run_state(state: str) -> None:
        async with db.transaction() as conn:
            rows = task_schedule_run.update().where(task_schedule_run.c.id == rollout["id"])
            await conn.execute(rows.values(state=state))

    assert await _prune(db, task_store.prune_finished_tasks, chunk=10) == [1]
    assert await _ids(db, tasks) == {held["id"], canary["id"]}
    async with db.transaction() as conn:
        await conn.execute(tasks.update().where(tasks.c.id == held["id"]).values(owner_id=None))
    await run_state("halted")
    assert await _prune(db, task_store.prune_finished_tasks, chunk=10) == [1]
    assert await _ids(db, tasks) == {canary["id"]}
    await run_state("completed")
    assert await _prune(db, task_store.prune_finished_tasks, chunk=10) == [1]
    assert await _ids(db, tasks) == set()


async def test_concurrent_pruners_delete_each_run_once(db: Database) -> None:
    """Every instance prunes; on PostgreSQL they skip each other's rows, on SQLite they take turns."""
    await _fleet(db)
    await _insert(db, task_schedule_run, [_run(_ago(hours=2, seconds=i)) for i in range(25)])

    results = await asyncio.gather(*(_prune(db, run_history.prune_old_runs, chunk=4) for _ in range(3)))

    assert sum(sum(chunks) for chunks in results) == 25
    assert await _ids(db, task_schedule_run) == set()


async def test_the_pruner_counts_runs_and_tasks_in_their_metrics(db: Database) -> None:
    await _fleet(db)
    await _insert(db, task_schedule_run, [_run(_ago(hours=2, seconds=i)) for i in range(3)])
    await _insert(db, tasks, [_task("completed", _ago(hours=3), _ago(hours=2)) for _ in range(2)])
    runs_before = metrics.SCHEDULE_RUNS_PRUNED._value.get()
    tasks_before = metrics.TASKS_PRUNED._value.get()
    runs = Pruner(
        db,
        RETENTION,
        name="run",
        what="runs",
        prune=run_history.prune_old_runs,
        counter=metrics.SCHEDULE_RUNS_PRUNED,
    )
    ended = Pruner(
        db,
        RETENTION,
        name="task",
        what="tasks",
        prune=task_store.prune_finished_tasks,
        counter=metrics.TASKS_PRUNED,
    )

    assert (await runs.prune_once(asyncio.Event()), await ended.prune_once(asyncio.Event())) == (3, 2)
    assert metrics.SCHEDULE_RUNS_PRUNED._value.get() - runs_before == 3
    assert metrics.TASKS_PRUNED._value.get() - tasks_before == 2


async def test_pruners_in_order_take_turns_each_round_and_one_failing_stops_none(db: Database) -> None:
    """The server prunes tasks, then runs, in one loop: a run deleted after its tasks unlinks nothing."""
    calls: list[str] = []

    def recording(name: str) -> Any:
        async def prune(_db: Database, _retention: timedelta, *, chunk: int = 1) -> AsyncGenerator[int]:
            calls.append(name)
            if name == "broken":
                raise RuntimeError("database down")
            yield 1

        return prune

    every = timedelta(seconds=0.01)
    pruners = [
        Pruner(db, RETENTION, name=n, what=n, prune=recording(n), counter=metrics.TASKS_PRUNED, every=every)
        for n in ("tasks", "broken", "runs")
    ]
    stop = asyncio.Event()
    looping = asyncio.create_task(run_in_order(pruners, stop))

    async def two_rounds() -> bool:
        return len(calls) >= 6

    await eventually(two_rounds)
    stop.set()
    await asyncio.wait_for(looping, 10)

    assert calls[:6] == ["tasks", "broken", "runs"] * 2


@pytest.mark.parametrize(
    ("table", "prune", "index"),
    [
        (task_schedule_run, run_history.prune_old_runs, "ix_task_schedule_run_fired_at_id"),
        (tasks, task_store.prune_finished_tasks, "ix_tasks_created_at"),
    ],
    ids=["runs", "tasks"],
)
async def test_a_chunk_reads_an_index_not_the_table(
    db: Database, table: Table, prune: Prune, index: str
) -> None:
    """Each chunk finds its rows by an index in prune order and deletes them by id, so a first prune of a
    large table costs each chunk its own rows, not a read of the whole table."""
    await _fleet(db)
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if statement.startswith(f"DELETE FROM {table.name}"):
            sent.append((statement, parameters))

    event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        await _prune(db, prune, chunk=PRUNE_CHUNK)
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
    statement, parameters = sent[0]
    if table is tasks:
        rows = [_task("completed", _ago(hours=3, seconds=i), _ago(hours=2)) for i in range(20_000)]
    else:
        rows = [_run(_ago(hours=2, seconds=i)) for i in range(20_000)]
    await _insert(db, table, rows)
    async with db.transaction() as conn:
        await conn.exec_driver_sql(f"ANALYZE {table.name}" if db.is_postgres else "ANALYZE")
        prefix = "EXPLAIN " if db.is_postgres else "EXPLAIN QUERY PLAN "
        plan_rows = (await conn.exec_driver_sql(prefix + statement, parameters)).all()
        plan = await by_parent_index(conn, "\n".join(" ".join(str(col) for col in row) for row in plan_rows))
    assert index in plan, plan
    # The runs' weeks' partitions (PostgreSQL) start weeks ahead: they hold none of these rows.
    assert not re.search(rf"Seq Scan on {table.name}(_default)?\b", plan), plan
    assert f"SCAN {table.name}" not in plan, plan
