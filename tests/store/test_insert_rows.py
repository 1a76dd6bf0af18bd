"""`insert_rows`, the one-statement INSERT of many rows that records a batch's firings (`insert_runs`) and
tasks (`insert_tasks`): it stores exactly what a row-by-row INSERT stores, leaves out rows a unique index
holds already, and on PostgreSQL its text is the same for any number of rows (so the driver parses it
once)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import JSON, Text, cast, insert, select
from sqlalchemy.dialects import postgresql

from rackflow.domain.tasks import Operation, OperationKind, Task, TaskStatus
from rackflow.store import runs as store
from rackflow.store import tasks as tasks_store
from rackflow.store.db import Database
from rackflow.store.dialect import insert_rows, insert_rows_together
from rackflow.store.tables import racks, task_schedule, task_schedule_run, tasks
from tests.store.query_plans import statements_sent

T0 = datetime(2026, 3, 1, tzinfo=UTC)
# Values a text array must quote: quotes, backslashes, braces, commas, NULL-like words, non-ASCII.
AWKWARD = 'a "quoted" \\ {brace}, NULL, émoji ✓'


async def _schedule(db: Database) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(
            insert(task_schedule).values(
                id=schedule_id,
                name="nightly",
                spec_type="interval",
                spec="1h",
                operation_template={"kind": "power_on"},
                created_at=T0,
                updated_at=T0,
            )
        )
    return schedule_id


def _run_values(schedule_id: uuid.UUID, k: int) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "schedule_id": schedule_id,
        "fired_at": T0 + timedelta(seconds=k),
        "scheduled_for": T0 + timedelta(hours=k) if k % 2 else None,
        "trigger": "dispatch" if k % 2 else "manual",
        "state": "running",
        "outcomes": [{"scope_id": str(uuid.uuid4()), "error": AWKWARD, "n": k}] if k % 3 else [],
        "owner_id": uuid.uuid4() if k % 2 else None,
        "rollout": {"max_concurrent_racks": k, "note": AWKWARD} if k % 4 == 1 else None,
        "reason": AWKWARD if k % 2 else "",
    }


async def _stored(db: Database, ids: list[uuid.UUID]) -> list[tuple[Any, ...]]:
    """Each row as stored, JSON as its text and whether it is SQL NULL, in the order of `ids`."""
    run = task_schedule_run.c
    stmt = select(
        run.schedule_id,
        run.fired_at,
        run.scheduled_for,
        run.trigger,
        run.state,
        run.owner_id,
        run.reason,
        cast(run.outcomes, Text),
        run.rollout.is_(None),
        cast(run.rollout, Text),
    )
    async with db.read() as conn:
        return [tuple((await conn.execute(stmt.where(run.id == i))).one()) for i in ids]


async def test_rows_are_stored_as_a_row_by_row_insert_stores_them(db: Database) -> None:
    schedule_id = await _schedule(db)
    rows = [_run_values(schedule_id, k) for k in range(1, 13)]
    twins = [{**row, "id": uuid.uuid4(), "scheduled_for": None} for row in rows]
    async with db.transaction() as conn:
        await conn.execute(*insert_rows(db.dialect, task_schedule_run, rows))
        await conn.execute(insert(task_schedule_run), twins)  # the reference: SQLAlchemy, row by row
    stored = await _stored(db, [r["id"] for r in rows])
    reference = await _stored(db, [t["id"] for t in twins])
    for row, mine, theirs in zip(rows, stored, reference, strict=True):
        assert mine[:2] == theirs[:2] and mine[3:] == theirs[3:]  # all but the slot, which twins leave out
        assert mine[2] == row["scheduled_for"]


async def test_insert_runs_leaves_out_a_slot_recorded_already(db: Database) -> None:
    schedule_id = await _schedule(db)
    slot = T0 + timedelta(hours=1)

    def run(scheduled_for: datetime) -> store.NewRun:
        return store.NewRun(uuid.uuid4(), schedule_id, T0, "dispatch", scheduled_for)

    first, again, later = run(slot), run(slot), run(slot + timedelta(hours=1))
    async with db.transaction() as conn:
        assert await store.insert_runs(db, conn, [first]) == {first.run_id}
        assert await store.insert_runs(db, conn, [again, later]) == {later.run_id}
    async with db.read() as conn:
        recorded = set((await conn.execute(select(task_schedule_run.c.id))).scalars())
    assert recorded == {first.run_id, later.run_id}


async def test_insert_rows_together_stores_each_tables_rows_in_one_statement_on_postgresql(
    db: Database,
) -> None:
    """A parent's rows and its children's (a schedule and its runs, the runs' key on the schedule), as the
    claim's gate writes a pre-flight round (a waiting row and its results): what a row-by-row INSERT
    stores, in one statement on PostgreSQL (a data-modifying CTE), one per table on SQLite; an empty batch
    is left out."""
    schedule_id = uuid.uuid4()
    schedule = {
        "id": schedule_id,
        "name": "nightly",
        "spec_type": "interval",
        "spec": "1h",
        "operation_template": {"kind": "power_on"},
        "created_at": T0,
        "updated_at": T0,
    }
    rows = [_run_values(schedule_id, k) for k in range(1, 7)]
    twins = [{**row, "id": uuid.uuid4(), "scheduled_for": None} for row in rows]
    async with db.transaction() as conn:
        with statements_sent(db) as sent:
            await insert_rows_together(
                conn, [(racks, []), (task_schedule, [schedule]), (task_schedule_run, rows)]
            )
        await conn.execute(insert(task_schedule_run), twins)  # the reference: SQLAlchemy, row by row
    assert len(sent) == (1 if db.is_postgres else 2)
    stored = await _stored(db, [r["id"] for r in rows])
    reference = await _stored(db, [t["id"] for t in twins])
    for row, mine, theirs in zip(rows, stored, reference, strict=True):
        assert mine[:2] == theirs[:2] and mine[3:] == theirs[3:]  # all but the slot, which twins leave out
        assert mine[2] == row["scheduled_for"]
    async with db.read() as conn:
        assert (await conn.execute(select(task_schedule.c.name))).scalars().all() == ["nightly"]


def test_on_postgresql_the_statement_is_the_same_text_for_any_number_of_rows() -> None:
    schedule_id = uuid.uuid4()
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]

    def compiled(count: int) -> tuple[str, dict[str, Any]]:
        rows = [_run_values(schedule_id, k) for k in range(count)]
        stmt, params = insert_rows("postgresql", task_schedule_run, rows, new_only=True)
        assert isinstance(params, dict)
        return str(stmt.compile(dialect=dialect)), params

    (two, _), (many, many_params) = compiled(2), compiled(300)
    assert two == many
    # A column every row holds one value of goes as that value; the others as one array each.
    assert {name for name, value in many_params.items() if not isinstance(value, list)} == {
        "s_schedule_id",
        "s_state",
    }
    assert many_params["s_state"] == "running" and len(many_params["b_id"]) == 300
    assert len(many_params) == 10


def test_on_postgresql_rows_alike_but_for_the_first_column_are_each_inserted() -> None:
    # The first column always goes as an array, so the SELECT has a row for each row.
    schedule_id = uuid.uuid4()
    rows = [{**_run_values(schedule_id, 0), "id": uuid.uuid4()} for _ in range(3)]
    stmt, params = insert_rows("postgresql", task_schedule_run, rows)
    assert isinstance(params, dict) and [name for name in params if name.startswith("b_")] == ["b_id"]
    assert "FROM unnest" in str(stmt.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]


async def test_insert_tasks_stores_what_a_row_by_row_insert_stores(db: Database) -> None:
    """A batch's tasks (`insert_tasks`, one statement) against twins inserted by SQLAlchemy row by row."""
    schedule_id = await _schedule(db)
    rack_id = uuid.uuid4()
    async with db.transaction() as conn:
        await conn.execute(insert(racks).values(id=rack_id, name="r1", created_at=T0))

    def task(k: int) -> Task:
        held = k % 2 == 1
        return Task(
            id=uuid.uuid4(),
            operation=Operation(
                OperationKind.UPGRADE_FIRMWARE if k % 3 == 0 else OperationKind.POWER_OFF,
                forced=k % 2 == 0,
                target_version=AWKWARD if k % 3 == 0 else "",
                window_start=T0 + timedelta(hours=k) if k % 3 == 0 else None,
            ),
            rack_id=rack_id,
            component_ids=tuple(uuid.UUID(int=k * 10 + n) for n in range(k % 3)),
            description=f"{AWKWARD} {k}",
            status=TaskStatus.PENDING if k % 2 else TaskStatus.WAITING,
            message=AWKWARD if k % 4 == 0 else "",
            queue_expires_at=T0 + timedelta(minutes=k) if k % 2 else None,
            created_at=T0 + timedelta(microseconds=k),
            started_at=None,
            finished_at=None,
            updated_at=T0,
            schedule_id=schedule_id if k % 2 else None,
            run_id=None,
            ignore_windows=k % 5 == 0,
            not_before=T0 + timedelta(hours=1) if held else None,
            not_after=T0 + timedelta(hours=2) if k % 3 == 1 else None,
            held_by="window" if held else None,
            held_reason=AWKWARD if held else None,
            held_since=T0 if held else None,
        )

    mine = [task(k) for k in range(1, 10)]
    twins = [replace(t, id=uuid.uuid4()) for t in mine]
    async with db.transaction() as conn:
        await tasks_store.insert_tasks(conn, mine)
        await conn.execute(insert(tasks), [tasks_store._task_values(t) for t in twins])  # the reference

    async def stored(ids: list[uuid.UUID]) -> list[tuple[Any, ...]]:
        columns = [cast(c, Text) if isinstance(c.type, JSON) else c for c in tasks.c if c.name != "id"]
        async with db.read() as conn:
            return [tuple((await conn.execute(select(*columns).where(tasks.c.id == i))).one()) for i in ids]

    assert await stored([t.id for t in mine]) == await stored([t.id for t in twins])
    async with db.read() as conn:
        assert await tasks_store.get_tasks(conn, [mine[2].id]) == [mine[2]]
