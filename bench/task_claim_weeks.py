"""task_claim_weeks: the executor's claim over the tasks' weeks (PostgreSQL, migration 0062).

On a loaded database (`bench/scale.py --phases none`, whose tasks are filed over a year of weeks), adds
`--live` pending tasks filed this week, then plans and runs the claim the executor sends
(`task_runs.pick`, captured as sent: within the walk's settings, with its values), `--repeat` times each:
as sent, bounded to the partition before the weeks and the weeks from the oldest live task's
(`task_partitions.live_floor`); and over every week (its floor moved back to the first week), as a claim
without the bound would plan. Prints the medians of PostgreSQL's planning and execution times (EXPLAIN
ANALYZE, in a transaction rolled back, so nothing is claimed), the partitions each reads, and the load.

    python bench/task_claim_weeks.py --url postgresql://postgres@127.0.0.1/scale_db [--live 300] [--repeat 20]

The live tasks are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import result
from sqlalchemy import delete, event, insert, select, text

from rackflow.ids import new_id
from rackflow.store import task_partitions, task_runs
from rackflow.store.db import Database
from rackflow.store.tables import racks, tasks

_TIMES = re.compile(r"(Planning|Execution) Time: ([\d.]+) ms")


async def _captured_claim(db: Database) -> tuple[str, Any]:
    """The claim's statement and parameters as `task_runs.pick` sends them."""
    sent: list[tuple[str, Any]] = []

    def capture(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if "FOR UPDATE" in statement and "FROM tasks" in statement:
            sent.append((statement, parameters))

    event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        async with db.transaction() as conn:
            await task_runs.pick(
                db,
                conn,
                owner_id=uuid.uuid4(),
                lease_ttl=timedelta(seconds=30),
                running_here=(),
                now=datetime.now(UTC),
                limit=10,
            )
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
    assert len(sent) == 1, sent
    return sent[0]


async def _explained(db: Database, statement: str, parameters: Any, repeat: int) -> dict[str, float]:
    planning, execution, partitions = [], [], 0
    for _ in range(repeat):
        async with db.engine.connect() as conn:
            transaction = await conn.begin()
            await conn.exec_driver_sql("SET LOCAL enable_sort = off")
            await conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            rows = (await conn.exec_driver_sql("EXPLAIN ANALYZE " + statement, parameters)).all()
            await transaction.rollback()
        plan = "\n".join(row[0] for row in rows)
        times = dict(_TIMES.findall(plan))
        planning.append(float(times["Planning"]))
        execution.append(float(times["Execution"]))
        partitions = len(re.findall(r" on tasks_\w+ ", plan))
    return {
        "planning_ms": statistics.median(planning),
        "execution_ms": statistics.median(execution),
        "partitions_read": float(partitions),
    }


async def main(args: argparse.Namespace) -> None:
    db = Database(args.url)
    made = [new_id() for _ in range(args.live)]
    try:
        async with db.transaction() as conn:
            rack = (await conn.execute(select(racks.c.id).limit(1))).scalar_one()
            now = datetime.now(UTC)
            base = {"operation": "power_on", "parameters": {"kind": "power_on"}, "rack_id": rack}
            await conn.execute(
                insert(tasks),
                [
                    {
                        **base,
                        "id": i,
                        "component_ids": [],
                        "status": "pending",
                        "created_at": now,
                        "updated_at": now,
                        "filed_at": task_partitions.filed_at(i),
                    }
                    for i in made
                ],
            )
            await conn.execute(text("ANALYZE tasks"))
            weeks = await conn.run_sync(task_partitions.weeks)
        statement, parameters = await _captured_claim(db)
        first = weeks[0].lower
        assert first is not None
        for name, values in (
            ("bounded", parameters),
            ("every_week", {**parameters, "live_since": first}),
        ):
            figures = await _explained(db, statement, values, args.repeat)
            result(
                "task_claim",
                claim=name,
                weeks=len(weeks),
                live=args.live,
                **figures,
                loadavg=os.getloadavg()[0],
            )
    finally:
        async with db.transaction() as conn:
            await conn.execute(delete(tasks).where(tasks.c.id.in_(made)))
        await db.dispose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="a loaded PostgreSQL database (bench/scale.py)")
    parser.add_argument("--live", type=int, default=300, help="pending tasks filed this week")
    parser.add_argument("--repeat", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
