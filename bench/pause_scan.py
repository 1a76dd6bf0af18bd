"""pause_scan: the cost of the `pause_after_failed_runs` check (issue 27) that every dispatcher runs after
each idle poll, for K schedules using it and for one schedule of many racks.

In-process: `ScheduleService.pause_failing()` on a fresh database, exactly what `Dispatcher.run` calls after
each poll that is not draining. Each shape lives in a database of its own, bulk-loaded (schedules and racks
by `_common.bulk_load`, then runs and tasks by executemany): K schedules with `pause_after_failed_runs = 3`,
each with `--runs` finished runs (state completed) whose outcomes point at ended tasks, one task in seven
FAILED but none in a schedule's newest run, so no streak is complete and nothing is paused; and "wide": one
such schedule whose runs each have `--racks` racks. The databases are ANALYZEd, then measured in turn:
`pause_failing()` (`--repeats` calls after a warm-up: with nothing changed since the last look, and after
one schedule was marked, `store.streak_checks`), the look at everything (`--full-repeats`, what a dispatcher
does first and hourly: every schedule is marked and the first batch looked at; "full polls" counts the
looks until none is marked), the same call with the feature off (`pause_after_failed_runs = 0`, what a
fleet not using it pays), and poll_cost's measure, the empty dispatcher poll (`poll_once()`), so the share
of the check in an idle poll is visible.

    python bench/pause_scan.py --db postgres --sizes 100,1000,10000 --racks 10000 --repeats 30
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import (
    LOAD_CHUNK,
    add_db_arguments,
    bulk_load,
    code_line,
    fresh_database,
    machine_line,
    median,
    percentile,
    result,
    sync_engine,
)
from sqlalchemy import insert, select, text, update

from rackflow.clock import SystemClock
from rackflow.domain import firing as planner
from rackflow.ids import id_beside
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.services import Services
from rackflow.store import streak_checks, task_partitions
from rackflow.store.db import Database
from rackflow.store.tables import racks, task_schedule, task_schedule_run, task_schedule_scope, tasks
from rackflow.timespec import ScheduleSpec, SpecType

PAUSE_AFTER = 3
FAILING_EVERY = 7  # one task in seven fails; with runs of one rack, never three runs of a schedule in a row
WARMUP = 3


def load_history(url: str, *, runs_per_schedule: int, racks_per_run: int, only_first: bool) -> int:
    """Give the loaded schedules `pause_after_failed_runs = 3` and `runs_per_schedule` finished runs,
    each with one ended task per rack: the schedule's own rack, or with `racks_per_run` > 1 (the wide
    shape) the first that many racks. `only_first`: only the first schedule (by name) uses the feature.
    Returns the number of tasks written."""
    engine = sync_engine(url)
    now = datetime.now(UTC)
    written = 0
    try:
        with engine.begin() as conn:
            scopes = conn.execute(
                select(
                    task_schedule.c.id, task_schedule_scope.c.id.label("scope_id"), racks.c.id.label("rack")
                )
                .join(task_schedule_scope, task_schedule_scope.c.schedule_id == task_schedule.c.id)
                .join(racks, racks.c.id == task_schedule_scope.c.rack_id)
                .order_by(task_schedule.c.name)
            ).all()
            using = scopes[:1] if only_first else scopes
        set_feature(url, PAUSE_AFTER, [s.id for s in using])
        targets = [(s.scope_id, s.rack) for s in scopes[:racks_per_run]] if racks_per_run > 1 else None
        run_rows: list[dict[str, Any]] = []
        task_rows: list[dict[str, Any]] = []

        def flush() -> None:
            with engine.begin() as conn:
                if run_rows:
                    conn.execute(insert(task_schedule_run), run_rows)
                if task_rows:
                    conn.execute(insert(tasks), task_rows)
            run_rows.clear()
            task_rows.clear()

        for i, schedule in enumerate(using):
            for j in range(runs_per_schedule):
                fired_at = now - timedelta(hours=runs_per_schedule - j)
                run_id = planner.run_id(fired_at)  # as rackflow names a dispatched run: by its slot
                outcomes = []
                run_tasks = []
                for k, (scope_id, rack_id) in enumerate(targets or [(schedule.scope_id, schedule.rack)]):
                    # As rackflow mints a run's task (at its run's millisecond) and files it (migration 0062:
                    # the CHECK `tasks_filed_by_id` refuses a task filed otherwise).
                    task_id = id_beside(run_id)
                    failed = (i + j + k) % FAILING_EVERY == 0 and j < runs_per_schedule - 1
                    outcomes.append(
                        {
                            "scope_id": str(scope_id),
                            "rack_id": str(rack_id),
                            "outcome": "submitted",
                            "task_id": str(task_id),
                            "error": "",
                        }
                    )
                    run_tasks.append(
                        {
                            "id": task_id,
                            "operation": "power_on",
                            "parameters": {},
                            "rack_id": rack_id,
                            "component_ids": [],
                            "status": "failed" if failed else "completed",
                            "created_at": fired_at,
                            "started_at": fired_at,
                            "finished_at": fired_at + timedelta(minutes=5),
                            "updated_at": fired_at + timedelta(minutes=5),
                            "schedule_id": schedule.id,
                            "run_id": run_id,
                            "filed_at": task_partitions.filed_at(task_id),
                        }
                    )
                run_rows.append(
                    {
                        "id": run_id,
                        "schedule_id": schedule.id,
                        "fired_at": fired_at,
                        "scheduled_for": fired_at,
                        "trigger": "dispatch",
                        "state": "completed",
                        "outcomes": outcomes,
                    }
                )
                task_rows.extend(run_tasks)
                written += len(run_tasks)
                if len(task_rows) >= LOAD_CHUNK:
                    flush()
        flush()
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE"))
        else:
            with engine.begin() as conn:
                conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()
    return written


def set_feature(url: str, count: int, schedule_ids: Sequence[uuid.UUID] | None = None) -> None:
    """`pause_after_failed_runs = count` on the schedules (None: those with runs); 0 turns the check off."""
    engine = sync_engine(url)
    try:
        with engine.begin() as conn:
            if schedule_ids is None:
                schedule_ids = list(
                    conn.execute(select(task_schedule_run.c.schedule_id).distinct()).scalars()
                )
            for start in range(0, len(schedule_ids), LOAD_CHUNK):
                chunk = schedule_ids[start : start + LOAD_CHUNK]
                conn.execute(
                    update(task_schedule)
                    .where(task_schedule.c.id.in_(chunk))
                    .values(pause_after_failed_runs=count)
                )
    finally:
        engine.dispose()


async def measure(url: str, repeats: int, full_repeats: int) -> dict[str, list[float]]:
    """Seconds per `pause_failing()` call with nothing changed since the last look ("scan"), after one
    schedule's streak was marked ("one": a task of one of its runs ended), with `everything` (the look at
    every schedule a dispatcher makes first and hourly), and per empty dispatcher poll, on one database."""
    db = Database(url)
    try:
        services = Services.build(db, SystemClock())
        dispatcher = Dispatcher(services.schedules, services.audit, batch=10)
        async with db.read() as conn:
            first = (
                await conn.execute(
                    select(task_schedule.c.id).where(task_schedule.c.pause_after_failed_runs > 0)
                )
            ).first()
        times: dict[str, list[float]] = {"scan": [], "one": [], "full": [], "poll": [], "full_polls": []}

        async def timed(figure: str, **kwargs: bool) -> None:
            started = time.perf_counter()
            paused = await services.schedules.pause_failing(**kwargs)
            times[figure].append(time.perf_counter() - started)
            if paused:
                raise RuntimeError(f"{len(paused)} schedules paused; the load has no complete streak")

        for _ in range(WARMUP):
            await services.schedules.pause_failing()
            await dispatcher.poll_once()
        for _ in range(repeats):
            await timed("scan")
            if first is not None:
                async with db.transaction() as conn:
                    await streak_checks.mark_schedules(conn, [first.id])
                await timed("one")
            started = time.perf_counter()
            if await dispatcher.poll_once():
                raise RuntimeError("a poll claimed schedules; none should be due")
            times["poll"].append(time.perf_counter() - started)
        for _ in range(full_repeats):
            await timed("full", everything=True)
            looks = 1
            while not await streak_checks_idle(db):
                await services.schedules.pause_failing()
                looks += 1
            times["full_polls"].append(looks)
        return times
    finally:
        await db.dispose()


async def streak_checks_idle(db: Database) -> bool:
    async with db.read() as conn:
        return not await streak_checks.any_marked(conn)


def report(shape: str, args: argparse.Namespace, schedules: int, racks_per_run: int, url: str) -> None:
    on = asyncio.run(measure(url, args.repeats, args.full_repeats))
    set_feature(url, 0)
    off = asyncio.run(measure(url, args.repeats, 0))
    set_feature(url, PAUSE_AFTER)
    scan, poll = median(on["scan"]), median(on["poll"])
    result(
        "pause_scan",
        db=args.db,
        shape=shape,
        schedules=schedules,
        runs=args.runs,
        racks_per_run=racks_per_run,
        repeats=args.repeats,
        scan_p50_ms=scan * 1000,
        scan_p95_ms=percentile(on["scan"], 95) * 1000,
        one_marked_p50_ms=median(on["one"]) * 1000,
        one_marked_p95_ms=percentile(on["one"], 95) * 1000,
        full_p50_ms=median(on["full"]) * 1000,
        full_polls=max(on["full_polls"], default=0),
        scan_off_p50_ms=median(off["scan"]) * 1000,
        poll_p50_ms=poll * 1000,
        scan_share_of_idle_poll=scan / (scan + poll),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--sizes", default="100,1000,10000", help="schedules using it, comma-separated")
    parser.add_argument("--racks", type=int, default=10_000, help="racks per wide run (0: none)")
    parser.add_argument("--runs", type=int, default=4, help="finished runs per schedule")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per database")
    parser.add_argument("--full-repeats", type=int, default=3, help="timed looks at everything")
    args = parser.parse_args()
    sizes: Sequence[int] = [int(s) for s in args.sizes.split(",") if s]
    print(machine_line())
    print(code_line())
    print(
        f"# pause_scan db={args.db} sizes={args.sizes} racks={args.racks} runs={args.runs} "
        f"repeats={args.repeats} full_repeats={args.full_repeats} pause_after={PAUSE_AFTER} "
        f"failing=1/{FAILING_EVERY}",
        flush=True,
    )
    far = datetime.now(UTC) + timedelta(days=30)
    spec = ScheduleSpec(SpecType.INTERVAL, "24h", "UTC")
    shapes = [("many", size, 1) for size in sizes] + ([("wide", 1, args.racks)] if args.racks else [])
    with ExitStack() as stack:
        for shape, schedules, racks_per_run in shapes:
            ws = stack.enter_context(fresh_database(args.db, args.pg_admin))
            started = time.perf_counter()
            bulk_load(
                ws.url, max(schedules, racks_per_run), spec=spec, next_run_at=lambda _: far, prefix="pause"
            )
            written = load_history(
                ws.url, runs_per_schedule=args.runs, racks_per_run=racks_per_run, only_first=shape == "wide"
            )
            print(
                f"# loaded {shape}: {schedules} schedules, {written} tasks "
                f"({time.perf_counter() - started:.1f}s)",
                flush=True,
            )
            report(shape, args, schedules, racks_per_run, ws.url)


if __name__ == "__main__":
    main()
