"""`store.dialect.walking_in_order` and `newest_from_own_index`: their planner settings hold for the block's
statements only, a statement of the block that fails keeps its own error, and a connection that autocommits,
on which a setting local to a transaction would change no plan, is refused (tests/store/test_task_indexes.py
holds the claim's plan with them, tests/store/test_task_list_plans.py a schedule's page of tasks)."""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import text

from rackflow.store.db import Database
from rackflow.store.dialect import newest_from_own_index, walking_in_order

SETTINGS = text("SELECT current_setting('enable_bitmapscan'), current_setting('enable_sort')")


async def _settings_within_and_after_a_walk(url: str, *set_first: str) -> tuple[tuple[str, ...], ...]:
    """The two settings within a walk and after it, in a transaction that first runs `set_first`."""
    db = Database(url)
    try:
        async with db.transaction() as conn:
            for statement in set_first:
                await conn.execute(text(statement))
            async with walking_in_order(conn):
                within = (await conn.execute(SETTINGS)).one()
            after = (await conn.execute(SETTINGS)).one()
    finally:
        await db.dispose()
    return tuple(within), tuple(after)


@pytest.mark.postgres
async def test_a_walk_turns_bitmaps_and_sorts_off_for_its_block_only(postgres_url: str) -> None:
    assert await _settings_within_and_after_a_walk(postgres_url) == (("off", "off"), ("on", "on"))


@pytest.mark.postgres
async def test_a_walk_sets_each_setting_back_to_its_value_before_it(postgres_url: str) -> None:
    """Back to what the transaction had, not to the server's or the role's defaults (`pg_settings`'
    reset values, which the walk read until it kept the values it found)."""
    found = await _settings_within_and_after_a_walk(postgres_url, "SET LOCAL enable_bitmapscan = off")
    assert found == (("off", "off"), ("off", "on"))


async def test_a_statement_that_fails_in_a_walk_keeps_its_own_error(db_url: str) -> None:
    # Setting the planner back after a failed statement was a second statement in an aborted transaction
    # ("current transaction is aborted"), which replaced the error the callers tell outages and lock
    # timeouts by.
    db = Database(db_url)
    try:
        with pytest.raises(Exception) as raised:
            async with db.transaction() as conn, walking_in_order(conn):
                await conn.execute(text("SELECT id FROM no_such_table"))
    finally:
        await db.dispose()
    assert "no_such_table" in str(raised.value)
    assert "aborted" not in str(raised.value)


@pytest.mark.postgres
async def test_a_schedules_page_turns_incremental_sort_off_for_its_block_only(postgres_url: str) -> None:
    db = Database(postgres_url)
    setting = text("SELECT current_setting('enable_incremental_sort')")
    try:
        async with db.read(in_transaction=True) as conn:
            async with newest_from_own_index(conn):
                within = await conn.scalar(setting)
            after = await conn.scalar(setting)
    finally:
        await db.dispose()
    assert (within, after) == ("off", "on")


async def test_planner_settings_refuse_a_connection_that_autocommits(db_url: str) -> None:
    """`Database.read` autocommits on PostgreSQL: a setting local to a transaction would last its own
    statement and change no plan, so it is refused rather than ignored. SQLite plans as it does."""
    db = Database(db_url)
    refused = (
        pytest.raises(AssertionError, match="in_transaction") if db.is_postgres else contextlib.nullcontext()
    )
    try:
        async with db.read() as conn:
            with refused:
                async with newest_from_own_index(conn):
                    await conn.execute(text("SELECT 1"))
    finally:
        await db.dispose()
