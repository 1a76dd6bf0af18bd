"""fanout: how long one firing of a schedule over many racks takes, once due.

Issue 17, target 5: a schedule over 1,000 racks has all its tasks ≤ 0.2 s after it fired, and 100
schedules over 100 racks each (10,000 tasks) ≤ 2 s. `--schedules S --racks K`: S schedules, each over K
racks of its own (S × K racks, so no task waits for another), all due at the same moment a few seconds
after `rackflow serve` (defaults) starts; the dispatcher sleeps until then. Printed, from the database's
timestamps: `fired_to_last_task_s` (first run's `fired_at` to the last task's `created_at`: the firing
itself, the figure the target names) and `due_to_last_task_s` (the due time to the last task).

    python bench/fanout.py --db postgres --schedules 1 --racks 1000
    python bench/fanout.py --db postgres --schedules 100 --racks 100

`--profile FILE` samples the server with py-spy from its start until the last task (`.svg`: a flame graph).
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import (
    add_db_arguments,
    bulk_load,
    code_line,
    fresh_database,
    machine_line,
    py_spy,
    result,
    servers,
    sync_engine,
)
from sqlalchemy import bindparam, func, select, text, update

from rackflow.store.tables import task_schedule, task_schedule_run, task_schedule_scope, tasks
from rackflow.timespec import ScheduleSpec, SpecType

LEAD_SECONDS = 8.0  # from loading to due: time for the server to start and go to sleep
WAIT_POLL_SECONDS = 0.2


def measure(
    kind: str, pg_admin: str, schedules: int, racks_each: int, timeout: float, profile: Path | None
) -> None:
    total = schedules * racks_each
    with fresh_database(kind, pg_admin) as ws:
        # Every rack comes with a disabled single-scope schedule; the first S schedules then take over the
        # scopes of K racks each, and become due.
        spec = ScheduleSpec(SpecType.INTERVAL, "24h", "UTC")
        bulk_load(ws.url, total, spec=spec, next_run_at=lambda _: None, enabled=lambda _: False)
        engine = sync_engine(ws.url)
        with engine.begin() as conn:
            scope_ids = list(
                conn.execute(select(task_schedule_scope.c.id).order_by(task_schedule_scope.c.id)).scalars()
            )
            owners = list(conn.execute(select(task_schedule.c.id).order_by(task_schedule.c.id)).scalars())
            owners = owners[:schedules]
            conn.execute(
                update(task_schedule_scope)
                .where(task_schedule_scope.c.id == bindparam("b_id"))
                .values(schedule_id=bindparam("b_schedule")),
                [{"b_id": s, "b_schedule": owners[j // racks_each]} for j, s in enumerate(scope_ids)],
            )
            due = datetime.now(UTC) + timedelta(seconds=LEAD_SECONDS)
            conn.execute(
                update(task_schedule)
                .where(task_schedule.c.id.in_(owners))
                .values(enabled=True, next_run_at=due)
            )
        if kind == "postgres":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE"))
        with servers(ws.url, ws.log_dir, 1) as (server,):
            ready = datetime.now(UTC)
            deadline = time.monotonic() + timeout
            count_tasks = select(func.count()).select_from(tasks).where(tasks.c.schedule_id.is_not(None))
            with py_spy(server.proc.pid, profile), engine.connect() as conn:
                while conn.execute(count_tasks).scalar_one() < total:
                    conn.commit()
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"not all {total} tasks were created:\n{server.output[-4000:]}")
                    time.sleep(WAIT_POLL_SECONDS)
                fired = conn.execute(select(func.min(task_schedule_run.c.fired_at))).scalar_one()
                first_task, last_task = conn.execute(
                    select(func.min(tasks.c.created_at), func.max(tasks.c.created_at))
                ).one()
        engine.dispose()
    if ready > due:
        print(
            f"# the server was ready {(ready - due).total_seconds():.1f}s after due: "
            "due_to_last_task_s includes its start"
        )
    result(
        "fanout",
        db=kind,
        schedules=schedules,
        racks_each=racks_each,
        tasks=total,
        fired_to_last_task_s=(last_task - fired).total_seconds(),
        fired_to_first_task_s=(first_task - fired).total_seconds(),
        due_to_last_task_s=(last_task - due).total_seconds(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--schedules", type=int, default=1)
    parser.add_argument("--racks", type=int, default=1_000, help="racks per schedule")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--profile", type=Path, help="py-spy the server into FILE")
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(f"# fanout db={args.db} schedules={args.schedules} racks_each={args.racks}", flush=True)
    measure(args.db, args.pg_admin, args.schedules, args.racks, args.timeout, args.profile)
    print(machine_line())


if __name__ == "__main__":
    main()
