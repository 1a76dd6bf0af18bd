"""dispatch_lag: N cron schedules due at the same minute; how late are their tasks?

N daily cron schedules (`M H * * *`, UTC, each on a rack of its own) are bulk-loaded, all due at the same
whole minute T (the next minute at least `--lead` seconds away). A dispatching `rackflow serve` starts before
T; once every schedule has fired, the lag of each task is `created_at - T`. The poll phase is whatever the
server's start gave it, so the first task waits up to one poll interval (`first_s`); the target is p99
within the interval plus 2 s, checked for this run's phase (`met`) and for the worst phase, a whole
interval before the dispatcher's own spread (`worst_phase_p99_s`, `met_worst_phase`).

    python bench/dispatch_lag.py --db postgres --n 1000 --dispatch-interval 10s
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from _common import (
    add_db_arguments,
    bulk_load,
    code_line,
    fresh_database,
    machine_line,
    percentile,
    result,
    servers,
    sync_engine,
)
from sqlalchemy import select

from rackflow.config import parse_interval
from rackflow.store.tables import task_schedule_run, tasks
from rackflow.timespec import ScheduleSpec, SpecType

SIM_STEP_SECONDS = "0.2"  # the simulator's default step time
TARGET_OVER_INTERVAL_S = 2.0


def next_minute(after: datetime) -> datetime:
    return after.replace(second=0, microsecond=0) + timedelta(minutes=1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--n", type=int, default=1_000, help="cron schedules due at the same minute")
    parser.add_argument("--dispatch-interval", default="10s", help="serve --dispatch-interval (Go duration)")
    parser.add_argument("--dispatch-batch", type=int, default=10, help="serve --dispatch-batch")
    parser.add_argument("--lead", type=float, default=20.0, help="least seconds between loading and T")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    interval = parse_interval(args.dispatch_interval, "--dispatch-interval")
    print(machine_line())
    print(code_line())
    print(
        f"# dispatch_lag db={args.db} n={args.n} interval={args.dispatch_interval} "
        f"batch={args.dispatch_batch} load=bulk-executemany sim_step_s={SIM_STEP_SECONDS}",
        flush=True,
    )

    with fresh_database(args.db, args.pg_admin) as ws:
        due = next_minute(datetime.now(UTC) + timedelta(seconds=args.lead))
        spec = ScheduleSpec(SpecType.CRON, f"{due.minute} {due.hour} * * *", "UTC")
        bulk_load(ws.url, args.n, spec=spec, next_run_at=lambda _: due)
        print(f"# {args.n} schedules due at {due.isoformat()}", flush=True)
        engine = sync_engine(ws.url)
        server_args = [
            "--dispatch-interval",
            args.dispatch_interval,
            "--dispatch-batch",
            str(args.dispatch_batch),
        ]
        env = {"RACKFLOW_SIM_STEP_SECONDS": SIM_STEP_SECONDS}
        with servers(ws.url, ws.log_dir, 1, args=server_args, env=env) as (server,):
            deadline = time.monotonic() + max(0.0, (due - datetime.now(UTC)).total_seconds()) + args.timeout
            done = select(task_schedule_run.c.id).where(task_schedule_run.c.state == "completed")
            with engine.connect() as conn:
                while len(conn.execute(done).all()) < args.n:
                    conn.commit()
                    if server.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"not all fired; server log tail:\n{server.output[-4000:]}")
                    time.sleep(0.5)
        with engine.connect() as conn:
            created = conn.execute(
                select(tasks.c.created_at).where(tasks.c.schedule_id.is_not(None))
            ).scalars()
            lags = [(moment - due).total_seconds() for moment in created]
        engine.dispose()

    p99 = percentile(lags, 99)
    first = min(lags, default=float("nan"))
    allowed = interval.total_seconds() + TARGET_OVER_INTERVAL_S
    # The first task waits for the poll phase this run happened to get (0 to one interval); what follows is
    # the dispatcher's own work. The worst phase adds a whole interval to that.
    worst_case_p99 = interval.total_seconds() + (p99 - first)
    result(
        "dispatch_lag",
        db=args.db,
        n=args.n,
        interval_s=interval.total_seconds(),
        batch=args.dispatch_batch,
        tasks=len(lags),
        first_s=first,
        p50_s=percentile(lags, 50),
        p99_s=p99,
        max_s=max(lags, default=float("nan")),
        worst_phase_p99_s=worst_case_p99,
        target_p99_s=allowed,
        met="yes" if p99 <= allowed else "no",
        met_worst_phase="yes" if worst_case_p99 <= allowed else "no",
    )


if __name__ == "__main__":
    main()
