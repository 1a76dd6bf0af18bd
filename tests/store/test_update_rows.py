"""`update_rows`, the one-statement UPDATE of many rows that a firing's phase 1 and write-back use
(`advance`, `set_last_task_ids`, `complete_runs`): each stores exactly what the executemany of one
`UPDATE … WHERE id = :id` per row stored before it (the reference below, run on twin rows), leaves a row
whose key is gone alone, and on PostgreSQL its text is the same for any number of rows."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from sqlalchemy import JSON, Table, Text, bindparam, cast, insert, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.domain.schedules import ScopeOutcome
from rackflow.store import runs as run_history
from rackflow.store import schedules as store
from rackflow.store.db import Database
from rackflow.store.dialect import update_rows
from rackflow.store.tables import racks, task_schedule, task_schedule_run, task_schedule_scope, tasks

T0 = datetime(2026, 3, 1, tzinfo=UTC)
BERLIN = timezone(timedelta(hours=2))
# Values a text array must quote: quotes, backslashes, braces, commas, NULL-like words, non-ASCII.
AWKWARD = 'a "quoted" \\ {brace}, NULL, émoji ✓'
COUNT = 12


async def _per_row(
    conn: AsyncConnection,
    table: Table,
    rows: Sequence[Mapping[str, Any]],
    constants: Mapping[str, Any],
) -> None:
    """The reference: the executemany of one UPDATE per row these writes were before `update_rows`."""
    names = [name for name in rows[0] if name != "id"]
    stmt = (
        update(table)
        .where(table.c.id == bindparam("r_id"))
        .values({name: bindparam(f"r_{name}") for name in names} | dict(constants))
    )
    await conn.execute(stmt, [{f"r_{name}": value for name, value in row.items()} for row in rows])


async def _stored(
    db: Database, table: Table, ids: Sequence[uuid.UUID], leave_out: set[str]
) -> list[tuple[Any, ...]]:
    """Each row as stored, in the order of `ids`: every column but `leave_out`, JSON as its text and
    whether it is SQL NULL."""
    columns: list[Any] = []
    for column in table.c:
        if column.name in leave_out:
            continue
        if isinstance(column.type, JSON):
            columns += [cast(column, Text), column.is_(None)]
        else:
            columns.append(column)
    async with db.read() as conn:
        return [tuple((await conn.execute(select(*columns).where(table.c.id == i))).one()) for i in ids]


async def _schedules(conn: AsyncConnection, count: int, prefix: str) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(count)]
    await conn.execute(
        insert(task_schedule),
        [
            {
                "id": schedule_id,
                "name": f"{prefix}-{k}",
                "spec_type": "interval",
                "spec": "1h",
                "operation_template": {"kind": "power_on"},
                "next_run_at": T0,
                "created_at": T0,
                "updated_at": T0,
            }
            for k, schedule_id in enumerate(ids)
        ],
    )
    return ids


async def test_advance_stores_what_the_per_row_update_stores(db: Database) -> None:
    now = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)

    def timing(k: int) -> dict[str, Any]:
        # Disabled and without a next run (a consumed one-time schedule), and times given in another zone.
        return {
            "enabled": k % 3 != 0,
            "next_run_at": None if k % 3 == 0 else (now + timedelta(hours=k)).astimezone(BERLIN),
            "last_run_at": now if k % 2 else now.astimezone(BERLIN),
            "run_count": None if k % 4 == 0 else k,  # not known, or counted
            "runs_since": None if k % 5 == 0 else now - timedelta(days=k),
        }

    async with db.transaction() as conn:
        mine = await _schedules(conn, COUNT, "mine")
        twins = await _schedules(conn, COUNT, "twin")
        advances = [store.Advance(i, **timing(k)) for k, i in enumerate(mine)]
        await store.advance(conn, [*advances, store.Advance(uuid.uuid4(), True, now, now, 1, now)], now)
        await _per_row(
            conn, task_schedule, [{"id": i, **timing(k)} for k, i in enumerate(twins)], {"updated_at": now}
        )
    stored = await _stored(db, task_schedule, mine, {"id", "name"})
    assert stored == await _stored(db, task_schedule, twins, {"id", "name"})
    async with db.read() as conn:
        row = (await conn.execute(select(task_schedule).where(task_schedule.c.id == mine[1]))).one()
    assert (row.enabled, row.next_run_at, row.last_run_at, row.updated_at, row.run_count) == (
        True,
        now + timedelta(hours=1),
        now,
        now,
        1,
    )


async def test_complete_runs_stores_what_the_per_row_update_stores(db: Database) -> None:
    def outcomes(k: int) -> list[ScopeOutcome]:
        def ids(n: int) -> uuid.UUID:
            return uuid.UUID(int=100 * k + n)

        return [
            ScopeOutcome(ids(1), ids(2), "submitted", task_id=ids(3)),
            ScopeOutcome(ids(4), ids(5), "failed", error=f"{AWKWARD} {k}"),
            ScopeOutcome(ids(6), ids(7), "skipped_overlap"),
        ][: k % 4]

    async with db.transaction() as conn:
        (schedule_id,) = await _schedules(conn, 1, "runs")
        mine = [uuid.uuid4() for _ in range(COUNT)]
        twins = [uuid.uuid4() for _ in range(COUNT)]
        await conn.execute(
            insert(task_schedule_run),
            [
                {
                    "id": run_id,
                    "schedule_id": schedule_id,
                    "fired_at": T0 + timedelta(seconds=k),
                    "trigger": "manual",
                    "state": "running",
                    "outcomes": [],
                }
                for k, run_id in enumerate([*mine, *twins])
            ],
        )
        by_run = {run_id: outcomes(k) for k, run_id in enumerate(mine)}
        completed = await run_history.complete_runs(conn, {**by_run, uuid.uuid4(): outcomes(1)})
        assert completed == set(mine)  # a run that is not there (deleted) is not said completed
        reference = [
            {
                "id": twin,
                "outcomes": store.outcomes_to_json(outcomes(k)),
                "outcome_counts": store.outcome_counts_to_json(outcomes(k)),
            }
            for k, twin in enumerate(twins)
        ]
        await _per_row(conn, task_schedule_run, reference, {"state": "completed"})
    stored = await _stored(db, task_schedule_run, mine, {"id", "fired_at"})
    assert stored == await _stored(db, task_schedule_run, twins, {"id", "fired_at"})
    async with db.read() as conn:
        found = (await run_history.list_runs(conn, schedule_id))[0]
    runs = {r.id: r for r in found}
    for run_id, expected in by_run.items():
        assert runs[run_id].state == "completed"
        assert [(o.scope_id, o.outcome, o.error, o.task_id) for o in runs[run_id].outcomes] == [
            (o.scope_id, o.outcome, o.error, o.task_id) for o in expected
        ]


async def test_set_last_task_ids_stores_what_the_per_row_update_stores(db: Database) -> None:
    async with db.transaction() as conn:
        (schedule_id,) = await _schedules(conn, 1, "scopes")
        rack_ids = [uuid.uuid4() for _ in range(2 * COUNT)]
        await conn.execute(
            insert(racks), [{"id": r, "name": f"r{k}", "created_at": T0} for k, r in enumerate(rack_ids)]
        )
        task_ids = [uuid.uuid4() for _ in rack_ids]
        await conn.execute(
            insert(tasks),
            [
                {
                    "id": t,
                    "operation": "power_on",
                    "parameters": {"kind": "power_on"},
                    "rack_id": r,
                    "component_ids": [],
                    "status": "pending",
                    "created_at": T0,
                    "updated_at": T0,
                }
                for t, r in zip(task_ids, rack_ids, strict=True)
            ],
        )
        scope_ids = [uuid.uuid4() for _ in rack_ids]
        await conn.execute(
            insert(task_schedule_scope),
            [
                {"id": s, "schedule_id": schedule_id, "rack_id": r, "created_at": T0}
                for s, r in zip(scope_ids, rack_ids, strict=True)
            ],
        )
        mine, twins = scope_ids[:COUNT], scope_ids[COUNT:]
        mine_tasks, twin_tasks = task_ids[:COUNT], task_ids[COUNT:]
        await store.set_last_task_ids(
            conn, {**dict(zip(mine, mine_tasks, strict=True)), uuid.uuid4(): task_ids[0]}
        )
        # The twins point at the twin racks' tasks: compare the scopes' rows but for their own ids and racks.
        reference = [{"id": s, "last_task_id": t} for s, t in sorted(zip(twins, twin_tasks, strict=True))]
        await _per_row(conn, task_schedule_scope, reference, {})
    async with db.read() as conn:
        stored = dict(
            (await conn.execute(select(task_schedule_scope.c.id, task_schedule_scope.c.last_task_id))).all()
        )
    assert [stored[s] for s in mine] == mine_tasks
    assert [stored[s] for s in twins] == twin_tasks
    leave_out = {"id", "rack_id", "last_task_id"}
    assert await _stored(db, task_schedule_scope, mine, leave_out) == await _stored(
        db, task_schedule_scope, twins, leave_out
    )


def test_on_postgresql_the_statement_is_the_same_text_for_any_number_of_rows() -> None:
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]

    def compiled(count: int) -> tuple[str, int]:
        rows = [
            {"id": uuid.uuid4(), "outcomes": [{"error": AWKWARD, "n": k}], "owner_id": None}
            for k in range(count)
        ]
        stmt, params = update_rows("postgresql", task_schedule_run, "id", rows, {"state": "completed"})
        assert isinstance(params, dict)
        return str(stmt.compile(dialect=dialect)), len(params)

    two, many = compiled(2), compiled(300)
    assert two == many
    assert two[1] == 4  # an array per column that differs between rows, the shared owner, the constant
    assert "unnest" in two[0] and "WHERE task_schedule_run.id = new_values.id" in two[0]
    assert "owner_id=%(s_owner_id)s" in two[0]  # every row holds one owner: sent once
