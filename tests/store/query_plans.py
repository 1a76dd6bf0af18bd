"""EXPLAIN helpers for the index tests: the plan of a statement the code really sent, as PostgreSQL or
SQLite would run it with its values (custom plan), and as PostgreSQL may run it once psycopg has prepared
it (generic plan, where a partial index whose predicate depends on a parameter cannot be used)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.store import task_partitions
from rackflow.store.db import Database

PLACEHOLDER = re.compile(r"%\((\w+)\)s")
# The types psycopg sends these values as; text goes as `unknown`, for the server to infer from its use.
PG_TYPES: tuple[tuple[type, str], ...] = (
    (uuid.UUID, "uuid"),
    (datetime, "timestamptz"),
    (timedelta, "interval"),
    (int, "integer"),
)


@contextmanager
def statements_sent(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """Every statement (and its parameters) sent to the driver while the block runs, in order."""
    sent: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        sent.append((statement, parameters))

    event.listen(db.engine.sync_engine, "before_cursor_execute", capture)
    try:
        yield sent
    finally:
        event.remove(db.engine.sync_engine, "before_cursor_execute", capture)


def queries(sent: list[tuple[str, Any]]) -> list[str]:
    """The statements among `sent` (`statements_sent`) other than transaction control (SQLite's BEGIN)."""
    return [
        statement
        for statement, _ in sent
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK"))
    ]


# The statements that set a walk's planner settings and set them back (`store.dialect.walking_in_order`).
_WALK_SETTINGS = re.compile(r"\bset_config\(")
# The read of where the weeks that can hold a live task begin, before a read of the live tasks
# (`store.task_partitions.live_weeks`).
_LIVE_WEEKS = re.compile(r"\bFROM task_live_weeks\b")


async def _all_sent(
    db: Database, send: Callable[[AsyncConnection], Awaitable[object]]
) -> list[tuple[str, Any]]:
    """Every statement (and its parameters) that `send` sends, in a transaction rolled back after it (some
    of them write)."""
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        try:
            await task_partitions.live_weeks(conn)  # the tasks' first week, read once per engine
            with statements_sent(db) as sent:
                await send(conn)
        finally:
            await transaction.rollback()
    return sent


async def statement_sent(
    db: Database, send: Callable[[AsyncConnection], Awaitable[object]]
) -> tuple[str, Any]:
    """The one statement (and its parameters) that `send` sends to the driver, the planner settings of a
    walk in order aside (`explain_walked` plans a statement with them), and the read of the live tasks'
    weeks (`task_partitions.live_weeks`), whose values the statement's parameters hold."""
    sent = [
        s
        for s in await _all_sent(db, send)
        if not _WALK_SETTINGS.search(s[0]) and not _LIVE_WEEKS.search(s[0])
    ]
    assert len(sent) == 1, f"expected one statement, got {[s for s, _ in sent]}"
    return sent[0]


async def explain_walked(db: Database, send: Callable[[AsyncConnection], Awaitable[object]]) -> str:
    """PostgreSQL's plan of the one statement `send` sends within a walk in order, as it runs it: after the
    walk's settings, in their transaction. Fails unless `send` sends that statement between the settings
    and their reset, so a test of it proves the code walks."""
    sent = [s for s in await _all_sent(db, send) if not _LIVE_WEEKS.search(s[0])]
    assert len(sent) == 3, f"expected a statement within the walk's settings, got {[s for s, _ in sent]}"
    (settings, _), (statement, _), (reset, _) = sent
    assert _WALK_SETTINGS.search(settings) and _WALK_SETTINGS.search(reset), [s for s, _ in sent]
    return await explain_after_settings(db, sent, statement)


async def explain_after_settings(db: Database, sent: list[tuple[str, Any]], holding: str) -> str:
    """PostgreSQL's plan of the statement among `sent` (`statements_sent`) that holds the text `holding`,
    after every planner setting sent before it (`store.dialect`'s `set_config` calls), in one transaction:
    as the code had it planned. A code that sent no setting has it planned with none."""
    at = next(n for n, (statement, _) in enumerate(sent) if holding in statement)
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        try:
            for statement, parameters in sent[:at]:
                if _WALK_SETTINGS.search(statement):
                    await conn.exec_driver_sql(statement, parameters)
            plan = _text((await conn.exec_driver_sql("EXPLAIN " + sent[at][0], sent[at][1])).all())
            return await by_parent_index(conn, plan)
        finally:
            await transaction.rollback()


async def explain(db: Database, statement: str, parameters: Any) -> str:
    """The plan of `statement` with its parameters bound (PostgreSQL or SQLite), each partition's index
    named by its partitioned index (`by_parent_index`)."""
    prefix = "EXPLAIN " if db.is_postgres else "EXPLAIN QUERY PLAN "
    async with db.read() as conn:
        plan = _text((await conn.exec_driver_sql(prefix + statement, parameters)).all())
        return await by_parent_index(conn, plan)


async def explain_analyzed(db: Database, statement: str, parameters: Any) -> str:
    """PostgreSQL's plan of `statement` as run (EXPLAIN ANALYZE, in a transaction rolled back): each node
    with the rows it really read, for a test that a read is bounded whatever the planner's estimates."""
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        try:
            plan = _text((await conn.exec_driver_sql("EXPLAIN ANALYZE " + statement, parameters)).all())
            return await by_parent_index(conn, plan)
        finally:
            await transaction.rollback()


async def explain_without_scans(db: Database, statement: str, parameters: Any) -> str:
    """PostgreSQL's plan of a statement a list sent (its leading comment left out), the full and bitmap
    scans forbidden: a test's small table costs nothing to scan, so the plan takes one only if the index
    cannot answer a part."""
    async with db.transaction() as conn:
        await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        await conn.exec_driver_sql("SET LOCAL enable_bitmapscan = off")
        explained = statement.removeprefix(statement[: statement.index("SELECT")])
        plan = _text((await conn.exec_driver_sql("EXPLAIN " + explained, parameters)).all())
        return await by_parent_index(conn, plan)


async def plan_with_one_index(db: Database, statement: str, parameters: Any, table: str, index: str) -> str:
    """PostgreSQL's plan of `statement` with every index of `table` but `index` dropped (in a transaction
    rolled back) and its scan forbidden: a plan that could read `index` would, so one that does not shows
    that its condition is one `index` cannot answer (whatever the statistics)."""
    async with db.engine.connect() as conn:
        transaction = await conn.begin()
        others = await conn.exec_driver_sql(
            "SELECT indexname FROM pg_indexes WHERE tablename = %(table)s AND indexname <> %(index)s",
            {"table": table, "index": index},
        )
        for (other,) in others.all():
            await conn.exec_driver_sql(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {other} CASCADE")
            await conn.exec_driver_sql(f"DROP INDEX IF EXISTS {other}")
        await conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        plan = _text((await conn.exec_driver_sql("EXPLAIN " + statement, parameters)).all())
        await transaction.rollback()
    return plan


# Each index of a partition and the partitioned table's index it is part of.
_PARTITION_INDEXES = text(
    "SELECT c.relname, p.relname FROM pg_inherits i"
    " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent WHERE c.relkind = 'i'"
)


async def by_parent_index(conn: AsyncConnection, plan: str) -> str:
    """`plan` with each partition's index named by the partitioned table's index it is part of: a plan of a
    partitioned table (the runs, the tasks and the audit trail on PostgreSQL) names the partitions' own
    indexes, one a partition, where the tests name the index they mean by the table's."""
    if conn.dialect.name != "postgresql":
        return plan
    for child, parent in (await conn.execute(_PARTITION_INDEXES)).all():
        plan = re.sub(rf"\b{child}\b", parent, plan)
    return plan


async def explain_generic(
    db: Database, statement: str, parameters: dict[str, Any], *, walking: bool = False
) -> str:
    """PostgreSQL's generic plan of `statement`: prepared with typed `$n` parameters, planned with
    `plan_cache_mode = force_generic_plan`; `walking`: with the walk's settings too (`walking_in_order`)."""
    names = list(dict.fromkeys(PLACEHOLDER.findall(statement)))
    numbered = PLACEHOLDER.sub(lambda m: f"${names.index(m.group(1)) + 1}", statement)
    types = ", ".join(_pg_type(parameters[name]) for name in names)
    arguments = ", ".join(_literal(parameters[name]) for name in names)
    async with db.transaction() as conn:
        await conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_generic_plan")
        if walking:
            for setting in ("enable_sort", "enable_bitmapscan"):
                await conn.exec_driver_sql(f"SET LOCAL {setting} = off")
        await conn.exec_driver_sql(f"PREPARE explained ({types}) AS {numbered}")
        plan = _text((await conn.exec_driver_sql(f"EXPLAIN EXECUTE explained({arguments})")).all())
        # VERBOSE shows the parameters the short form hides (a function's arguments, an OFFSET)
        verbose = _text((await conn.exec_driver_sql(f"EXPLAIN VERBOSE EXECUTE explained({arguments})")).all())
        await conn.exec_driver_sql("DEALLOCATE explained")
        plan = await by_parent_index(conn, plan)
    assert re.search(r"\$\d", verbose), f"not a generic plan:\n{verbose}"
    return plan


def _text(rows: Any) -> str:
    return "\n".join(" ".join(str(col) for col in row) for row in rows)


def _literal(value: object) -> str:
    if isinstance(value, list):  # an array parameter (`keys_table`): '{a,b}'
        return "'{" + ",".join(_literal(v).strip("'") for v in value) + "}'"
    text = value.isoformat() if isinstance(value, datetime) else str(value)
    return "'" + text.replace("'", "''") + "'"


def _pg_type(value: object) -> str:
    if isinstance(value, list) and value:
        return _pg_type(value[0]) + "[]"
    return next((pg_type for python_type, pg_type in PG_TYPES if isinstance(value, python_type)), "unknown")
