"""The APScheduler 3 side of `versus_apscheduler3.py`: N one-shot jobs due at once, each inserting one row.

Runs in the peer's own virtual environment (APScheduler 3, SQLAlchemy, psycopg; not rackflow). The setup
mirrors rackflow's drain at its defaults: the jobs live in a `SQLAlchemyJobStore` on the same PostgreSQL
server, APScheduler's default executor (a thread pool of 10 workers) runs them, and each job writes one
row in its own transaction, as each rackflow firing creates one task. The scheduler is started paused,
the jobs are added (each due a minute ago; no misfire grace limit, so none is dropped), then it is
resumed. Every setting not named here is APScheduler's default. Figures, from the database's own timestamps:

* drain_s: first row to last row; jobs_per_s = n / drain_s (rackflow's firings_per_s is the same ratio);
* after_resume_s: from resume() to the last row;
* store_remove_s: the time the scheduler thread spent in the job store's `remove_job`, and remove_share,
  its share of after_resume_s.

What bounds the peer: `BaseScheduler._process_jobs` reads every due job in one query, then, for each one,
hands it to the executor and, since a date trigger has no next run, calls `remove_job`, which
`SQLAlchemyJobStore` does as a DELETE in a transaction of its own (BEGIN, DELETE, COMMIT: three round trips
and a WAL flush), one after the other in the scheduler thread. The workers cannot run a job before it has
been handed over, so jobs_per_s is at most 1 / (one such transaction's latency); remove_share near 1 says
the run was at that bound (docs/PERFORMANCE.md, "the APScheduler 3 peer").

    python apscheduler3_drain.py --url postgresql+psycopg://postgres@127.0.0.1/scratch --n 10000
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime, timedelta

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import create_engine, text

WORKERS = 10  # APScheduler 3's default thread pool size
engine = None


class TimedJobStore(SQLAlchemyJobStore):
    """`SQLAlchemyJobStore` unchanged, but counting the time its `remove_job` takes (the peer's bound)."""

    remove_s = 0.0

    def remove_job(self, job_id: str) -> None:
        started = time.perf_counter()
        try:
            super().remove_job(job_id)
        finally:
            TimedJobStore.remove_s += time.perf_counter() - started


def make_row(job: int) -> None:
    """The job: one row, in a transaction of its own."""
    assert engine is not None
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO peer_rows (job) VALUES (:job)"), {"job": job})


def main() -> None:
    global engine
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of an empty PostgreSQL database")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    engine = create_engine(args.url, pool_size=WORKERS, max_overflow=0)
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE TABLE peer_rows (id serial PRIMARY KEY, job int NOT NULL UNIQUE, "
                "created_at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )
        )
    scheduler = BackgroundScheduler(
        jobstores={"default": TimedJobStore(url=args.url)},
        executors={"default": ThreadPoolExecutor(WORKERS)},
        job_defaults={"misfire_grace_time": None, "coalesce": False},
        timezone="UTC",
    )
    scheduler.start(paused=True)
    due = datetime.now(UTC) - timedelta(minutes=1)
    started = time.perf_counter()
    for i in range(args.n):
        scheduler.add_job(make_row, "date", run_date=due, args=[i], id=f"job-{i}")
    print(f"# added {args.n} jobs in {time.perf_counter() - started:.1f}s", flush=True)
    with engine.connect() as conn:
        resumed_at = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    TimedJobStore.remove_s = 0.0
    scheduler.resume()
    deadline = time.monotonic() + args.timeout
    with engine.connect() as conn:
        while conn.execute(text("SELECT count(*) FROM peer_rows")).scalar_one() < args.n:
            conn.commit()
            if time.monotonic() > deadline:
                raise TimeoutError("the jobs did not all run")
            time.sleep(0.2)
        first, last, rows = conn.execute(
            text("SELECT min(created_at), max(created_at), count(*) FROM peer_rows")
        ).one()
    scheduler.shutdown(wait=True)
    drain_s = (last - first).total_seconds()
    after_resume_s = (last - resumed_at).total_seconds()
    print(
        f"apscheduler3_drain n={args.n} workers={WORKERS} rows={rows} jobs_per_s={rows / drain_s:.2f} "
        f"drain_s={drain_s:.2f} after_resume_s={after_resume_s:.2f} "
        f"store_remove_s={TimedJobStore.remove_s:.2f} "
        f"remove_share={TimedJobStore.remove_s / after_resume_s:.2f}",
        flush=True,
    )


if __name__ == "__main__":
    main()
