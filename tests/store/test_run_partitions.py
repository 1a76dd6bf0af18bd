"""The runs partitioned by week of their slot on PostgreSQL (migration 0046, store/run_partitions.py), and the
guarantees that moved with them: once per tick, one live rollout and one run awaiting approval per schedule
(held on SQLite by unique indexes, on PostgreSQL by the slot's index and the live-runs trigger), the weeks
made ahead, and the prune that drops a week whole."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from rackflow.domain.firing import run_id as slot_run_id
from rackflow.domain.schedules import RunState, Schedule
from rackflow.schedules import firing
from rackflow.store import run_partitions
from rackflow.store import runs as store
from rackflow.store import schedules as schedule_store
from rackflow.store.audit_partitions import period_start
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule, task_schedule_run
from tests.conftest import schedule_row
from tests.store.query_plans import statements_sent
from tests.store.schedules_support import Env, make_env

pytestmark = pytest.mark.asyncio

PAST_WEEK = datetime(2025, 6, 2, tzinfo=UTC)  # a Monday, long past any retention below


async def _schedule(db: Database, *, next_run_at: datetime | None = None) -> uuid.UUID:
    schedule_id = uuid.uuid4()
    async with db.transaction() as conn:
        row = schedule_row(schedule_id, f"s-{schedule_id}", datetime(2025, 1, 1, tzinfo=UTC))
        await conn.execute(insert(task_schedule).values({**row, "next_run_at": next_run_at}))
    return schedule_id


async def _record(
    db: Database,
    schedule_id: uuid.UUID,
    state: RunState,
    *,
    slot: datetime | None = None,
    fired_at: datetime | None = None,
) -> uuid.UUID | None:
    """A run recorded as the firing records it (`insert_runs`): its id, or None when it was left out."""
    run = store.NewRun(
        run_id=slot_run_id(slot),
        schedule_id=schedule_id,
        fired_at=fired_at or slot or datetime.now(UTC),
        trigger="dispatch" if slot else "manual",
        scheduled_for=slot,
        state=state,
    )
    async with db.transaction() as conn:
        recorded = await store.insert_runs(db, conn, [run])
    return run.run_id if recorded else None


async def _set_state(db: Database, run_id: uuid.UUID, state: RunState) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            update(task_schedule_run).where(task_schedule_run.c.id == run_id).values(state=state)
        )


async def _first_week(db: Database) -> datetime:
    """The start of the first week's partition the migration made (weeks ahead of now)."""
    async with db.read() as conn:
        weeks = await conn.run_sync(run_partitions.weeks)
    ahead = [p.lower for p in weeks if p.lower is not None and p.lower > datetime.now(UTC)]
    return ahead[0]


async def _slot(db: Database, hours: int = 1) -> datetime:
    """A slot in a week's partition on PostgreSQL (the first week starts weeks ahead); any slot on SQLite."""
    base = await _first_week(db) if db.is_postgres else datetime(2026, 12, 1, tzinfo=UTC)
    return base + timedelta(hours=hours)


@pytest.fixture
async def pg(pg_db: str) -> AsyncIterator[Database]:
    database = Database(pg_db)
    yield database
    await database.dispose()


@pytest.mark.postgres
async def test_runs_go_to_the_week_of_their_slot_and_manual_ones_to_the_default_partition(
    pg: Database,
) -> None:
    schedule_id = await _schedule(pg)
    week = await _first_week(pg)
    assert week.weekday() == 0 and week == period_start(week)
    in_week = await _record(pg, schedule_id, "completed", slot=week + timedelta(days=2))
    manual = await _record(pg, schedule_id, "completed")
    old_slot = await _record(pg, schedule_id, "completed", slot=datetime(2026, 1, 5, tzinfo=UTC))
    async with pg.read() as conn:
        rows = await conn.execute(text("SELECT id, tableoid::regclass::text AS home FROM task_schedule_run"))
        homes = {row.id: row.home for row in rows}
        default_checks = (
            await conn.execute(
                text("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = :c"),
                {"c": run_partitions.BEFORE},
            )
        ).scalar_one()
    assert homes == {
        in_week: run_partitions.partition_name(week),
        manual: run_partitions.DEFAULT_PARTITION,
        old_slot: run_partitions.DEFAULT_PARTITION,
    }
    assert "scheduled_for IS NULL" in default_checks


async def test_a_slot_fires_once_in_its_partition(db: Database) -> None:
    schedule_id = await _schedule(db)
    slot = await _slot(db)
    assert await _record(db, schedule_id, "running", slot=slot) is not None
    assert await _record(db, schedule_id, "running", slot=slot) is None
    assert await _record(db, schedule_id, "running") is not None  # manual runs are not limited
    assert await _record(db, schedule_id, "running") is not None


@pytest.mark.parametrize(
    ("live", "other"), [("rolling", "halted"), ("awaiting_approval", "awaiting_approval")]
)
async def test_one_live_rollout_and_one_awaiting_run_a_schedule(
    db: Database, live: RunState, other: RunState
) -> None:
    """A second live run's insert is left out (the firing records it "skipped"), one made by an update is
    refused; once the first ends, the next is recorded. Another schedule is not limited by it."""
    schedule_id, neighbour = await _schedule(db), await _schedule(db)
    first = await _record(db, schedule_id, live, slot=await _slot(db, 1))
    assert first is not None
    assert await _record(db, schedule_id, live, slot=await _slot(db, 2)) is None
    assert await _record(db, neighbour, live, slot=await _slot(db, 2)) is not None
    running = await _record(db, schedule_id, "running", slot=await _slot(db, 3))
    assert running is not None
    with pytest.raises(IntegrityError):
        await _set_state(db, running, other)
    await _set_state(db, first, "completed")
    await _set_state(db, running, other)
    assert await _record(db, schedule_id, live, slot=await _slot(db, 4)) is None  # `running` is live now


async def test_a_live_run_refused_by_its_slot_does_not_block_the_next(db: Database) -> None:
    """A live run left out because its slot was recorded already (a rollout's slot fired twice): the trigger
    had taken the schedule's live row for it before the slot's index refused it, and the next live run of the
    schedule takes that row over instead of being left out."""
    schedule_id = await _schedule(db)
    slot = await _slot(db)
    assert await _record(db, schedule_id, "completed", slot=slot) is not None
    assert await _record(db, schedule_id, "rolling", slot=slot) is None
    assert await _record(db, schedule_id, "rolling", slot=await _slot(db, 2)) is not None


@pytest.mark.postgres
async def test_a_live_row_naming_a_run_gone_is_taken_over(pg: Database) -> None:
    schedule_id = await _schedule(pg)
    async with pg.transaction() as conn:
        await conn.execute(
            text(f"INSERT INTO {run_partitions.LIVE} VALUES (:s, 'rollout', :r)"),
            {"s": schedule_id, "r": uuid.uuid4()},
        )
    run_id = await _record(pg, schedule_id, "rolling", slot=await _slot(pg))
    assert run_id is not None
    async with pg.read() as conn:
        holder = (
            await conn.execute(
                text(f"SELECT run_id FROM {run_partitions.LIVE} WHERE schedule_id = :s"), {"s": schedule_id}
            )
        ).scalar_one()
    assert holder == run_id
    await _set_state(pg, run_id, "completed")
    async with pg.read() as conn:
        assert (await conn.execute(text(f"SELECT count(*) FROM {run_partitions.LIVE}"))).scalar_one() == 0


@pytest.mark.postgres
async def test_the_weeks_are_made_ahead_contiguous_and_once(pg: Database) -> None:
    """After weeks of no instance running, the keeper fills every week from the newest it made to LOOKAHEAD
    past now, so a late firing of any slot since finds its week."""
    later = datetime.now(UTC) + timedelta(days=90)
    async with pg.transaction() as conn:
        made = await conn.run_sync(run_partitions.ensure_partitions, later)
        again = await conn.run_sync(run_partitions.ensure_partitions, later)
        weeks = await conn.run_sync(run_partitions.weeks)
    assert made and again == []
    assert all(a.upper == b.lower for a, b in itertools.pairwise(weeks))
    assert weeks[-1].upper is not None and weeks[-1].upper > later + run_partitions.LOOKAHEAD
    schedule_id = await _schedule(pg)
    assert await _record(pg, schedule_id, "completed", slot=later + timedelta(days=10)) is not None


@pytest.mark.postgres
async def test_a_slot_whose_week_has_no_partition_is_refused_not_lost_silently(pg: Database) -> None:
    """Why the weeks are made ahead: the DEFAULT partition's CHECK refuses a slot past the weeks made."""
    async with pg.read() as conn:
        newest = (await conn.run_sync(run_partitions.weeks))[-1].upper
    assert newest is not None
    schedule_id = await _schedule(pg)
    with pytest.raises(IntegrityError, match=run_partitions.BEFORE):
        await _record(pg, schedule_id, "completed", slot=newest + timedelta(days=1))


async def _past_week_with_runs(
    db: Database, schedule_id: uuid.UUID, states: list[RunState]
) -> list[uuid.UUID]:
    async with db.transaction() as conn:
        await conn.run_sync(run_partitions.add_week, PAST_WEEK)
    ids = []
    for n, state in enumerate(states):
        run_id = await _record(db, schedule_id, state, slot=PAST_WEEK + timedelta(hours=n + 1))
        assert run_id is not None
        ids.append(run_id)
    return ids


async def _prune(db: Database, retention: timedelta) -> list[int]:
    return [n async for n in store.prune_old_runs(db, retention)]


async def _run_ids(db: Database) -> set[uuid.UUID]:
    async with db.read() as conn:
        return set((await conn.execute(select(task_schedule_run.c.id))).scalars())


async def _week_names(db: Database) -> set[str]:
    async with db.read() as conn:
        return {p.name for p in await conn.run_sync(run_partitions.weeks)}


@pytest.mark.postgres
async def test_the_prune_drops_a_week_all_past_the_retention(pg: Database) -> None:
    schedule_id = await _schedule(pg)
    await _past_week_with_runs(pg, schedule_id, ["completed"] * 5)
    kept = await _record(pg, schedule_id, "completed", slot=await _slot(pg))
    name = run_partitions.partition_name(PAST_WEEK)
    assert name in await _week_names(pg)
    assert sum(await _prune(pg, timedelta(days=30))) == 5
    assert name not in await _week_names(pg)
    assert await _run_ids(pg) == {kept}


@pytest.mark.postgres
@pytest.mark.parametrize("why", ["running", "rolling"])
async def test_a_past_week_holding_a_kept_run_stays_and_is_pruned_by_row(pg: Database, why: RunState) -> None:
    """A week holding a run the prune keeps (still running, a live rollout) is not dropped; its other runs
    are deleted one by one, as before partitions."""
    schedule_id = await _schedule(pg)
    ids = await _past_week_with_runs(pg, schedule_id, [why, "completed", "completed"])
    await _prune(pg, timedelta(days=30))
    assert run_partitions.partition_name(PAST_WEEK) in await _week_names(pg)
    assert await _run_ids(pg) == {ids[0]}


@pytest.mark.postgres
async def test_a_schedules_next_slot_in_a_past_week_does_not_keep_it(pg: Database) -> None:
    """A paused schedule keeps its next slot while paused: kept, it would keep every week from there on. The
    week goes; should that slot fire late, its run is recorded all the same (its week made again, or, before
    the first week, in the DEFAULT partition)."""
    due = PAST_WEEK + timedelta(days=3)
    schedule_id = await _schedule(pg, next_run_at=due)
    await _past_week_with_runs(pg, schedule_id, ["completed", "completed"])
    await _prune(pg, timedelta(days=30))
    assert run_partitions.partition_name(PAST_WEEK) not in await _week_names(pg)
    assert await _record(pg, schedule_id, "completed", slot=due, fired_at=datetime.now(UTC)) is not None


@pytest.mark.postgres
async def test_a_run_in_a_week_not_all_past_the_retention_stays_with_its_week(pg: Database) -> None:
    """The retention keeps a run at least as long as configured and at most a week longer: a week's runs go
    together once all of the week is past it."""
    now = datetime.now(UTC)
    this_week = period_start(now)
    async with pg.transaction() as conn:
        await conn.run_sync(run_partitions.add_week, this_week)
    schedule_id = await _schedule(pg)
    slot = max(this_week, now - timedelta(hours=3))
    old = await _record(pg, schedule_id, "completed", slot=slot, fired_at=slot)
    assert await _record(pg, schedule_id, "completed", fired_at=now - timedelta(hours=3)) is not None
    await _prune(pg, timedelta(hours=1))
    assert await _run_ids(pg) == {old}  # the manual run, in the DEFAULT partition, went by itself


# --- the run cap's look, narrowed to the weeks from `runs_since` (migration 0047) ---------------------


async def _weeks_of_runs(db: Database, schedule_id: uuid.UUID, weeks: int, each: int) -> list[datetime]:
    """`each` completed runs a week in `weeks` past weeks from PAST_WEEK, one a day, as a daily schedule's;
    their slots, oldest first."""
    slots = [PAST_WEEK + timedelta(weeks=w, days=d) for w in range(weeks) for d in range(each)]
    if db.is_postgres:
        async with db.transaction() as conn:
            for w in range(weeks):
                await conn.run_sync(run_partitions.add_week, PAST_WEEK + timedelta(weeks=w))
    for slot in slots:
        assert await _record(db, schedule_id, "completed", slot=slot) is not None
    return slots


@pytest.mark.postgres
async def test_the_cap_look_opens_only_the_weeks_from_runs_since(pg: Database) -> None:
    """With a year of weeks, the look for a schedule's oldest runs opened each; narrowed to the weeks from its
    `runs_since` (and the DEFAULT partition, for runs without a slot), it leaves the others unread."""
    schedule_id = await _schedule(pg)
    slots = await _weeks_of_runs(pg, schedule_id, weeks=3, each=4)
    since = slots[4]  # the second week's first run: a bound no later than any run it could delete
    async with pg.engine.connect() as conn:  # rolled back: the look as it finds the runs
        transaction = await conn.begin()
        with statements_sent(pg) as sent:
            await store.prune_runs(conn, [schedule_id], keep=2, since={schedule_id: since})
        await transaction.rollback()
    statement, parameters = sent[0]  # the look; the delete follows
    async with pg.read() as conn:
        analyzed = await conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + statement, parameters)
    plan = "\n".join(line for (line,) in analyzed.all())
    first, second = (run_partitions.partition_name(PAST_WEEK + timedelta(weeks=w)) for w in (0, 1))
    scans = [line for line in plan.splitlines() if " on task_schedule_run_p" in line]
    assert scans and all("(never executed)" in line for line in scans if f" on {first} " in line), plan
    assert any(f" on {second} " in line and "(never executed)" not in line for line in scans), plan
    assert "Index Only Scan" in plan, plan  # the slot is in the schedule's index of runs (0046)


async def test_the_cap_look_raises_runs_since_to_the_newest_slot_it_deleted(db: Database) -> None:
    """A schedule's runs fire in the order of their slots, so none the look keeps has a slot before the newest
    it deleted; a run it may not delete (still open) holds the bound down at its own slot."""
    schedule_id = await _schedule(db)
    slots = await _weeks_of_runs(db, schedule_id, weeks=2, each=4)
    async with db.transaction() as conn:
        pruned = await store.prune_runs(conn, [schedule_id], keep=5, since={schedule_id: None})
    assert pruned == {schedule_id: store.Pruned(3, slots[2])}
    other = await _schedule(db)
    open_slot = PAST_WEEK + timedelta(days=1, hours=1)
    for slot in [PAST_WEEK + timedelta(hours=1), open_slot, PAST_WEEK + timedelta(days=2, hours=1)]:
        await _record(db, other, "running" if slot == open_slot else "completed", slot=slot)
    async with db.transaction() as conn:
        held = await store.prune_runs(conn, [other], keep=0, since={other: PAST_WEEK})
    assert held == {other: store.Pruned(2, open_slot)}


async def test_a_firing_lowers_runs_since_only_to_an_earlier_slot_and_keeps_it_not_known() -> None:
    """The advance's rule (`since_with_run`): a firing's slot lowers a known bound only if earlier; a run
    without a slot, or a bound not known, leaves it; a schedule known to have no run takes its first slot."""
    known = Schedule.__new__(Schedule)  # only `runs_since` and `run_count` are read
    object.__setattr__(known, "runs_since", PAST_WEEK)
    object.__setattr__(known, "run_count", 5)
    assert store.since_with_run(known, PAST_WEEK + timedelta(days=1)) == PAST_WEEK
    assert store.since_with_run(known, PAST_WEEK - timedelta(days=1)) == PAST_WEEK - timedelta(days=1)
    assert store.since_with_run(known, None) == PAST_WEEK
    object.__setattr__(known, "runs_since", None)
    assert store.since_with_run(known, PAST_WEEK) is None  # runs from before 0047 may be older
    object.__setattr__(known, "run_count", None)
    assert store.since_with_run(known, PAST_WEEK) is None
    object.__setattr__(known, "run_count", 0)
    assert store.since_with_run(known, PAST_WEEK) == PAST_WEEK
    assert store.since_with_run(known, None) is None  # a manual run: the DEFAULT partition, read always


async def test_a_new_schedule_knows_its_runs_since_from_its_first_firing(db: Database) -> None:
    """A schedule made today has no run (`run_count` 0), so its first dispatched firing sets `runs_since` to
    its slot, and its reads and looks are bounded from then on, not only after its first look (at 110 runs);
    a later firing leaves it."""
    env = make_env(db)
    schedule = await env.schedule(racks=[await env.rack("r1")])
    assert (schedule.run_count, schedule.runs_since) == (0, None)
    slot = schedule.next_run_at
    assert slot is not None
    await _fire(env, schedule)
    after = await env.services.schedules.get(schedule.id)
    assert (after.run_count, after.runs_since) == (1, slot)
    env.clock.advance(timedelta(hours=1))
    await _fire(env, after)
    again = await env.services.schedules.get(schedule.id)
    assert (again.run_count, again.runs_since) == (2, slot)


async def _fire(env: Env, schedule: Schedule) -> None:
    """The dispatcher's firing of `schedule` (as `test_schedules_firing._fire_by_hand`)."""
    async with env.db.transaction() as conn:
        locked = await schedule_store.get_schedule(conn, schedule.id, lock=env.db.for_update)
        assert locked is not None
        claimed = await firing.claim(env.db, conn, [locked], trigger="dispatch", now=env.clock.now())
    await firing.fire(env.db, env.services.tasks, env.clock, claimed)


@pytest.mark.postgres
async def test_the_reads_of_a_schedules_runs_plan_only_the_weeks_from_its_runs_since(pg: Database) -> None:
    """A page of a schedule's runs, the grid's columns and the schedule list's strips read by schedule, which
    planned every week's partition (a year of weeks: about 3 ms a statement, three statements a page).
    Bounded by the schedules' `runs_since`, a week before it is not even planned, and what they show is the
    same."""
    schedule_id = await _schedule(pg)
    slots = await _weeks_of_runs(pg, schedule_id, weeks=3, each=2)
    async with pg.transaction() as conn:  # as its firings keep it: its first run's slot
        await conn.execute(
            update(task_schedule).where(task_schedule.c.id == schedule_id).values(runs_since=slots[2])
        )
        slot = task_schedule_run.c.scheduled_for
        await conn.execute(delete(task_schedule_run).where(slot < slots[2]))  # the cap took the first week's
    other = await _schedule(pg)  # another schedule's runs keep the first week
    await _record(pg, other, "completed", slot=slots[0] + timedelta(hours=1))
    first_week = run_partitions.partition_name(PAST_WEEK)
    reads = {
        "list_runs": lambda conn: store.list_runs(conn, schedule_id, limit=3),
        "run_heads": lambda conn: store.run_heads(conn, schedule_id, 3),
        "recent_runs": lambda conn: store.recent_runs(conn, [schedule_id], 3),
    }
    for name, read in reads.items():
        async with pg.read() as conn:
            with statements_sent(pg) as sent:
                await read(conn)
            for statement, parameters in sent:
                if "task_schedule_run" not in statement or "FROM task_schedule " in statement:
                    continue
                explained = await conn.exec_driver_sql("EXPLAIN (COSTS OFF) " + statement, parameters)
                plan = "\n".join(line for (line,) in explained.all())
                assert first_week not in plan, (name, plan)
                assert run_partitions.partition_name(PAST_WEEK + timedelta(weeks=1)) in plan, (name, plan)
    async with pg.read() as conn:
        runs, total = await store.list_runs(conn, schedule_id)
        strips = await store.recent_runs(conn, [schedule_id, other], 10)
    assert total == 4 and [r.scheduled_for for r in runs] == slots[:1:-1]
    assert [r.scheduled_for for r in strips[schedule_id]] == slots[:1:-1]
    assert [r.scheduled_for for r in strips[other]] == [slots[0] + timedelta(hours=1)]


# --- weeks the cap has emptied, dropped; a late slot's week made again -------------------------------


@pytest.mark.postgres
async def test_a_past_week_the_cap_emptied_is_dropped_and_one_in_use_stays(pg: Database) -> None:
    schedule_id = await _schedule(pg)
    await _weeks_of_runs(pg, schedule_id, weeks=3, each=2)
    emptied, held, due = (PAST_WEEK + timedelta(weeks=w) for w in range(3))
    async with pg.transaction() as conn:  # the cap's deletions, week by week
        slot = task_schedule_run.c.scheduled_for
        await conn.execute(delete(task_schedule_run).where(slot < held))
        await conn.execute(delete(task_schedule_run).where(slot >= due))
    await _schedule(pg, next_run_at=due + timedelta(days=1))  # a paused one's slot keeps no week
    recent = period_start(datetime.now(UTC) - timedelta(days=3))  # all past, but within RECENT
    async with pg.transaction() as conn:
        await conn.run_sync(run_partitions.add_week, recent)
    dropped = await run_partitions.drop_emptied(pg)
    assert dropped == [run_partitions.partition_name(w) for w in (emptied, due)]
    names = await _week_names(pg)
    assert {run_partitions.partition_name(w) for w in (held, recent)} <= names
    assert await run_partitions.drop_emptied(pg) == []


@pytest.mark.postgres
async def test_a_late_slot_whose_week_was_dropped_has_it_made_again(pg: Database) -> None:
    """A one-time schedule set at a past time, or a firing late by weeks: its slot's week may have been
    dropped (emptied by the cap, or by the retention), and the DEFAULT partition's CHECK would refuse the
    run. Its week is made again before the run is recorded."""
    later = datetime.now(UTC) + timedelta(days=120)
    async with pg.transaction() as conn:
        await conn.run_sync(run_partitions.ensure_partitions, later)
        week = next(p for p in await conn.run_sync(run_partitions.weeks) if p.lower and p.lower > later)
        await conn.execute(text(f"DROP TABLE {week.name}"))
    assert week.name not in await _week_names(pg)
    assert week.lower is not None
    slot = week.lower + timedelta(days=2)
    schedule_id = await _schedule(pg)
    fired = await _record(pg, schedule_id, "completed", slot=slot, fired_at=slot + timedelta(days=30))
    assert fired is not None
    assert week.name in await _week_names(pg)
