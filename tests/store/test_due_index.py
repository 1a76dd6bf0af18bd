"""The dispatcher's claim is answered by the partial index `ix_task_schedule_due`, in index order.

Both databases match a partial index's predicate by its spelling, so a harmless-looking change to the due
filter (`enabled` for `enabled IS true`) silently turns every poll into a full table scan; bench/poll_cost.py
measured exactly that before migration 0004. This test EXPLAINs the statement the dispatcher really sends.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from rackflow.clock import SystemClock
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store.db import Database

DUE_INDEX = "ix_task_schedule_due"


async def _claim_statement(db: Database) -> tuple[str, Any]:
    """The SELECT on task_schedule filtering on next_run_at that one poll sends to the driver."""
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        if "FROM task_schedule" in statement and "next_run_at <=" in statement:
            sent.append((statement, parameters))

    services = Services.build(db, SystemClock())
    event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        await Dispatcher(services.schedules, services.audit, batch=10).poll_once()
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", capture)
    claims = [s for s in sent if s[0].lstrip().upper().startswith("SELECT")]
    assert claims, f"no claim query among {[s for s, _ in sent]}"
    return claims[0]


async def test_the_claim_reads_the_due_index_in_order(db: Database) -> None:
    statement, parameters = await _claim_statement(db)
    async with db.transaction() as conn:
        if db.is_postgres:
            # A small table without statistics costs nothing to scan and sort; forbid the alternatives, so
            # the plan falls back to them only if the index cannot answer the claim in order.
            await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
            await conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
            await conn.exec_driver_sql("SET LOCAL enable_sort = off")
            prefix = "EXPLAIN "
        else:
            prefix = "EXPLAIN QUERY PLAN "
        rows = (await conn.exec_driver_sql(prefix + statement, parameters)).all()
    plan = "\n".join(" ".join(str(col) for col in row) for row in rows)
    assert DUE_INDEX in plan, plan
    assert "Sort" not in plan, f"the claim sorts instead of reading the index in order:\n{plan}"
    assert "TEMP B-TREE" not in plan, f"the claim sorts instead of reading the index in order:\n{plan}"
