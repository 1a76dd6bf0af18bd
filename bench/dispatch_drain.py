"""dispatch_drain: N single-scope schedules due at once; how fast do 1 or 2 servers fire them all?

The schedules (interval 24h, each on a rack of its own, due one minute ago) are bulk-loaded before any
dispatcher runs (see `_common.bulk_load`), then the dispatching `rackflow serve` process(es) start. Figures,
all from the database's own timestamps:

* drain_s: first run's `fired_at` to the last task's `created_at`; firings_per_s = n / drain_s;
* last_task_after_s: from spawning the server(s) to the last task (includes process start-up);
* server_cpu_us_per_firing: the server processes' CPU (user plus system, /proc/<pid>/stat) from the
  moment they listen until the drain ends, over the firings; postgres_cpu_us_per_firing: the same for
  the PostgreSQL backends of the bench's database (`DatabaseCpu`: not the machine's other databases), "-"
  on SQLite, whose work is the server's. Both include the executor's work on the tasks the drain made, as
  `rackflow serve` does it; CPU is what a shared machine moves least, so compare these before rates.

The executor runs beside the dispatcher with the simulator's default step time (0.2 s), as `rackflow serve`
does by default, so tasks start running while the drain goes on; `--sim-step 3600` keeps it idle instead
(it starts 32 tasks that never finish), which measures the dispatcher alone.

`--seq-scans` (PostgreSQL) prints, at every progress count (10 s) and for the whole wait, how often each
table a dispatch round reads or writes was read in full and how many rows those reads returned
(`pg_stat_user_tables`: `seq_scan`, `seq_tup_read`; the bench's own count of completed runs, every 10 s, is
one of `task_schedule_run`'s), and the rows each inserted and updated, and how many of those updates were
HOT (`n_tup_hot_upd`: the new version on the same page and no index entry written); the partitioned runs'
figures are their partitions' summed.

`--windows K` adds K maintenance windows over every rack that never close one, so every scope is decided
against K windows and still fires (the cost of docs/WINDOWS.md's per-scope decision).

`--passing-checks K` adds K pre-flight checks over every rack and operation that always pass (docs/CHECKS.md;
`_common.passing_checks`): with `--check-kind rack_idle` (busy only with power resets, which nothing runs)
the executor's claim asks them itself and every task starts at its first claim; with `--check-kind
webhook` (a local HTTP server answering ok) every task is held for a round of the checker, then released
and started (issue 26: fire lag and drain rate must not move). `--until-tasks-done` waits for every task
to end too, and adds tasks_per_s = tasks / (first firing to the last task's end), tasks_done_s (that
span) and server_cpu_us_per_task (the servers' CPU from listening until no task is active, over the tasks).

`--history N` gives each schedule N completed runs before the drain (from 100, the run cap, the reads show
the newest 100; a firing that takes a schedule to its `prune_at`, 110 to 119, looks and deletes back to
100: at 119 every firing does), and its run count says so; `--uncounted` leaves the counts unknown, as
migration 0038 leaves every schedule it finds, so each firing also counts its schedule's runs (once a
schedule).

    python bench/dispatch_drain.py --db postgres --instances 1 --n 10000 --dispatch-batch 10
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import (
    DatabaseCpu,
    ServerProcess,
    add_check_arguments,
    add_db_arguments,
    bulk_load,
    code_line,
    cpu_seconds,
    fresh_database,
    machine_line,
    passing_checks,
    py_spy,
    result,
    runs_partitioned_since,
    servers,
    slot_run_id,
    sync_engine,
)
from sqlalchemy import Connection, Engine, Select, bindparam, func, insert, select, text, update

from rackflow.domain.firing import run_id
from rackflow.domain.tasks import TaskStatus
from rackflow.store.tables import (
    maintenance_windows,
    task_schedule,
    task_schedule_run,
    task_schedule_scope,
    tasks,
)
from rackflow.timespec import ScheduleSpec, SpecType

SIM_STEP_SECONDS = 0.2  # the simulator's default step time
WAIT_POLL_SECONDS = 0.5
COMPLETED_RUNS = select(func.count()).where(task_schedule_run.c.state == "completed")
# While waiting, the drain is polled by two index lookups (the first schedule still due, by the due index;
# any run still firing, by ix_task_schedule_run_running): counting the completed runs at every poll read
# the whole run table twice a second, a cost that grew with N on the cores the server shares.
RUNNING_RUN = select(task_schedule_run.c.id).where(task_schedule_run.c.state == "running").limit(1)
PROGRESS_SECONDS = 10.0  # how often the completed runs are counted, to notice a stall
ROUND_TABLES = ("racks", "components", "task_schedule_scope", "task_schedule", "tasks", "task_schedule_run")
# Each table's counters summed over its partitions: the runs are partitioned from migration 0046, and their
# scans and writes are counted on the partitions, not on the partitioned table (whose own row stays 0). A
# plain table has no partitions (pg_partition_tree lists nothing), so it is its own row alone.
SEQ_SCANS = text(
    "SELECT t.relname, sum(s.seq_scan)::bigint, sum(s.seq_tup_read)::bigint, sum(s.n_tup_ins)::bigint,"
    " sum(s.n_tup_upd)::bigint, sum(s.n_tup_hot_upd)::bigint FROM pg_class t JOIN pg_stat_user_tables s"
    " ON s.relid = t.oid OR s.relid IN (SELECT relid FROM pg_partition_tree(t.oid))"
    " WHERE t.relname IN :tables AND pg_table_is_visible(t.oid) GROUP BY t.relname"
).bindparams(bindparam("tables", ROUND_TABLES, expanding=True))
STALL_SECONDS = 60.0  # no firing completed for this long: something is broken, stop waiting


def first_due(due: datetime) -> Select[Any]:
    s = task_schedule.c
    return (
        select(s.id)
        .where(s.enabled.is_(True), s.next_run_at.is_not(None), s.next_run_at <= due)
        .order_by(s.next_run_at, s.id)
        .limit(1)
    )


@dataclass(frozen=True)
class Drain:
    n: int
    load_s: float
    drain_s: float
    last_task_after_s: float
    tasks: int
    schedules_with_task: int
    runs_completed: int
    server_cpu_s: float
    postgres_cpu_s: float | None  # None on SQLite
    tasks_done_s: float | None = None  # first firing to the last task's end (--until-tasks-done)
    tasks_cpu_s: float | None = None  # the servers' CPU from listening until no task is active (the same)

    @property
    def firings_per_s(self) -> float:
        return self.runs_completed / self.drain_s if self.drain_s > 0 else float("nan")

    @property
    def server_cpu_us_per_firing(self) -> float:
        return self.server_cpu_s / max(self.runs_completed, 1) * 1e6

    @property
    def postgres_cpu_us_per_firing(self) -> float | None:
        if self.postgres_cpu_s is None:
            return None
        return self.postgres_cpu_s / max(self.runs_completed, 1) * 1e6


def measure_drain(
    kind: str,
    pg_admin: str,
    *,
    n: int,
    instances: int,
    batch: int,
    timeout: float = 900.0,
    profile: Path | None = None,
    sim_step: float = SIM_STEP_SECONDS,
    windows: int = 0,
    seq_scans: bool = False,
    checks: int = 0,
    check_kind: str = "rack_idle",
    until_tasks_done: bool = False,
    history: int = 0,
    uncounted: bool = False,
    run_weeks: int = 0,
) -> Drain:
    """Load `n` due schedules into a fresh database, start the dispatcher(s), wait until all fired."""
    with fresh_database(kind, pg_admin) as ws:
        due = datetime.now(UTC) - timedelta(minutes=1)
        started = time.perf_counter()
        bulk_load(ws.url, n, spec=ScheduleSpec(SpecType.INTERVAL, "24h", "UTC"), next_run_at=lambda _: due)
        load_s = time.perf_counter() - started

        engine = sync_engine(ws.url)
        _load_windows(engine, windows)
        add_run_weeks(engine, run_weeks)
        load_history(engine, history, due)
        if history or uncounted:  # a schedule the bench made has counted none of its runs: 0 already
            set_run_counts(engine, None if uncounted else history, due)
        spawned = datetime.now(UTC)
        args = ["--dispatch-batch", str(batch)]
        env = {"RACKFLOW_SIM_STEP_SECONDS": str(sim_step)}
        with (
            passing_checks(engine, checks, check_kind),
            servers(ws.url, ws.log_dir, instances, args=args, env=env) as procs,
            py_spy(procs[0].proc.pid, profile),
        ):
            server_cpu_before = sum(cpu_seconds(p.proc.pid) for p in procs)
            database_cpu = DatabaseCpu() if kind == "postgres" else None
            _wait_for_completed_runs(
                engine, procs, due, timeout, seq_scans=seq_scans, database_cpu=database_cpu
            )
            server_cpu_s = sum(cpu_seconds(p.proc.pid) for p in procs) - server_cpu_before
            tasks_cpu_s = None
            if until_tasks_done:
                _wait_for_tasks(engine, timeout)
                tasks_cpu_s = sum(cpu_seconds(p.proc.pid) for p in procs) - server_cpu_before
        with engine.connect() as conn:
            this_drain = task_schedule_run.c.fired_at > due  # not `--history`'s
            first_fired = conn.execute(
                select(func.min(task_schedule_run.c.fired_at)).where(this_drain)
            ).scalar_one()
            scheduled = select(tasks).where(tasks.c.schedule_id.is_not(None)).subquery()
            last_task, task_count, schedules_with_task = conn.execute(
                select(
                    func.max(scheduled.c.created_at),
                    func.count(),
                    func.count(scheduled.c.schedule_id.distinct()),
                )
            ).one()
            runs = conn.execute(COMPLETED_RUNS.where(this_drain)).scalar_one()
            if history:  # each firing pruned its schedule's oldest run: n × 100 at the cap
                kept = conn.execute(select(func.count()).select_from(task_schedule_run)).scalar_one()
                print(f"# history runs kept after the drain={kept}", flush=True)
            last_end = conn.execute(select(func.max(tasks.c.finished_at))).scalar_one()
        engine.dispose()
    return Drain(
        n=n,
        load_s=load_s,
        drain_s=(last_task - first_fired).total_seconds(),
        last_task_after_s=(last_task - spawned).total_seconds(),
        tasks=task_count,
        schedules_with_task=schedules_with_task,
        runs_completed=runs,
        server_cpu_s=server_cpu_s,
        postgres_cpu_s=database_cpu.seconds if database_cpu is not None else None,
        tasks_done_s=(last_end - first_fired).total_seconds() if until_tasks_done and last_end else None,
        tasks_cpu_s=tasks_cpu_s,
    )


ACTIVE_TASK = (
    select(tasks.c.id)
    .where(tasks.c.status.in_([TaskStatus.PENDING.value, TaskStatus.RUNNING.value]))
    .limit(1)
)


def _wait_for_tasks(engine: Engine, timeout: float) -> None:
    """Until no task is pending or running."""
    deadline = time.monotonic() + timeout
    with engine.connect() as conn:
        while conn.execute(ACTIVE_TASK).first() is not None:
            conn.commit()
            if time.monotonic() > deadline:
                raise TimeoutError("tasks still active; giving up")
            time.sleep(WAIT_POLL_SECONDS)


def _load_windows(engine: Engine, count: int) -> None:
    """`count` maintenance windows over every rack that never close one: ALLOW windows open all day every
    day, FREEZEs an hour on 1 January. Every scope of every firing is then decided against all of them
    (docs/WINDOWS.md), and every one fires."""
    now = datetime.now(UTC)
    rows = [
        {
            "id": uuid.uuid4(),
            "name": f"bench-window-{i}",
            "kind": "allow" if i % 2 == 0 else "freeze",
            "cron": "0 0 * * *" if i % 2 == 0 else "0 0 1 1 *",
            "duration": "24h" if i % 2 == 0 else "1h",
            "timezone": "Europe/Berlin",
            "all_racks": True,
            "operations": [],
            "created_at": now,
            "updated_at": now,
        }
        for i in range(count)
    ]
    if rows:
        with engine.begin() as conn:
            conn.execute(insert(maintenance_windows), rows)


# `--history N` (PostgreSQL): N completed runs of each schedule, one a day before `due` (one outcome each, its
# task not kept), written server-side as a fleet's history would stand, each named by its slot as rackflow
# names a dispatched run (`slot_run_id`).
HISTORY = text(
    f"""
    INSERT INTO task_schedule_run (id, schedule_id, fired_at, scheduled_for, trigger, state, outcomes,
                                   outcome_counts)
    SELECT {slot_run_id("(CAST(:due AS timestamptz) - k * interval '1 day')")}, s.id,
           CAST(:due AS timestamptz) - k * interval '1 day',
           CAST(:due AS timestamptz) - k * interval '1 day', 'dispatch', 'completed',
           jsonb_build_array(jsonb_build_object('scope_id', c.id, 'rack_id', c.rack_id, 'outcome',
                                                'submitted', 'task_id', gen_random_uuid(), 'error', '')),
           '{{"submitted": [0, 1]}}'
    FROM task_schedule s JOIN task_schedule_scope c ON c.schedule_id = s.id, generate_series(1, :n) k
    """
)


def load_history(engine: Engine, runs_each: int, due: datetime) -> None:
    """`--history N`: each schedule starts with N runs already, so with N past the cap each schedule keeps
    (`store.runs.RUNS_KEPT_PER_SCHEDULE`, 100) a firing may look for its oldest runs and delete them
    (at its `prune_at`, 110 to 119), as a fleet's do once its schedules have fired that often. Written
    server-side on PostgreSQL (`HISTORY`), from here on SQLite."""
    if not runs_each:
        return
    started = time.perf_counter()
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(HISTORY, {"due": due, "n": runs_each})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE task_schedule_run"))
    else:
        with engine.begin() as conn:
            scopes = conn.execute(
                select(
                    task_schedule_scope.c.id, task_schedule_scope.c.schedule_id, task_schedule_scope.c.rack_id
                )
            ).all()
            rows = [
                {
                    "id": run_id(due - timedelta(days=k)),
                    "schedule_id": scope.schedule_id,
                    "fired_at": due - timedelta(days=k),
                    "scheduled_for": due - timedelta(days=k),
                    "trigger": "dispatch",
                    "state": "completed",
                    "outcomes": [
                        {
                            "scope_id": str(scope.id),
                            "rack_id": str(scope.rack_id),
                            "outcome": "submitted",
                            "task_id": str(uuid.uuid4()),
                            "error": "",
                        }
                    ],
                    "outcome_counts": {"submitted": [0, 1]},
                }
                for scope in scopes
                for k in range(1, runs_each + 1)
            ]
            for first in range(0, len(rows), 50_000):
                conn.execute(insert(task_schedule_run), rows[first : first + 50_000])
            conn.execute(text("ANALYZE"))
    print(f"# history runs_each={runs_each} loaded in {time.perf_counter() - started:.1f}s", flush=True)


def set_run_counts(engine: Engine, count: int | None, due: datetime) -> None:
    """Each schedule's `run_count` (migration 0038) and `runs_since` (0047): the runs `--history` gave it
    and the oldest one's slot, as a fleet's firings keep them; or None (`--uncounted`, as every schedule
    is right after those migrations: its first firing counts its runs, its first look reads every
    partition)."""
    since = None if count is None else due - timedelta(days=count)
    with engine.begin() as conn:
        conn.execute(update(task_schedule).values(run_count=count, runs_since=since))


def _table_reads(conn: Connection) -> dict[str, tuple[int, ...]]:
    """Per table of ROUND_TABLES since the database was created: (full scans, rows they returned, rows
    inserted, rows updated, of which HOT: no index entry written)."""
    return {row.relname: tuple(row[1:]) for row in conn.execute(SEQ_SCANS)}


def _print_seq_scans(
    what: str, before: dict[str, tuple[int, ...]], after: dict[str, tuple[int, ...]]
) -> None:
    def change(table: str, column: int) -> int:
        return after[table][column] - before[table][column]

    counts = " ".join(f"{t}={change(t, 0)}/{change(t, 1)}" for t in ROUND_TABLES)
    print(f"# seq scans/rows read {what}: {counts}", flush=True)
    writes = " ".join(f"{t}={change(t, 2)}/{change(t, 3)}/{change(t, 4)}" for t in ROUND_TABLES)
    print(f"# rows inserted/updated/of which HOT {what}: {writes}", flush=True)


def _wait_for_completed_runs(
    engine: Engine,
    procs: list[ServerProcess],
    due: datetime,
    timeout: float,
    *,
    seq_scans: bool,
    database_cpu: DatabaseCpu | None = None,
) -> None:
    """Until no schedule is due any more and no run is still firing; `database_cpu` is sampled at every
    look."""
    deadline = time.monotonic() + timeout
    last_count, last_progress, counted_at = -1, time.monotonic(), 0.0
    with engine.connect() as conn:
        first_reads = reads = _table_reads(conn) if seq_scans else {}
        while True:
            if database_cpu is not None:
                database_cpu.sample(conn)
            if conn.execute(first_due(due)).first() is None and conn.execute(RUNNING_RUN).first() is None:
                break
            now = time.monotonic()
            if now - counted_at >= PROGRESS_SECONDS:
                count, counted_at = conn.execute(COMPLETED_RUNS).scalar_one(), now
                if seq_scans:
                    previous, reads = reads, _table_reads(conn)
                    _print_seq_scans(f"by {count} runs", previous, reads)
                if count != last_count:
                    last_count, last_progress = count, now
            conn.commit()  # a fresh snapshot for the next look
            for proc in procs:
                if proc.proc.poll() is not None:
                    raise RuntimeError(f"server exited:\n{proc.output[-4000:]}")
            if now > deadline or now - last_progress > STALL_SECONDS:
                tail = procs[0].output[-4000:]
                raise TimeoutError(f"{last_count} firings completed; giving up. Server log tail:\n{tail}")
            time.sleep(WAIT_POLL_SECONDS)
        if seq_scans:
            conn.commit()
            _print_seq_scans("over the drain", first_reads, _table_reads(conn))


def report(kind: str, instances: int, batch: int, drain: Drain) -> None:
    result(
        "dispatch_drain",
        db=kind,
        instances=instances,
        batch=batch,
        n=drain.n,
        firings_per_s=drain.firings_per_s,
        drain_s=drain.drain_s,
        last_task_after_s=drain.last_task_after_s,
        tasks=drain.tasks,
        schedules_with_task=drain.schedules_with_task,
        server_cpu_us_per_firing=drain.server_cpu_us_per_firing,
        postgres_cpu_us_per_firing=drain.postgres_cpu_us_per_firing
        if drain.postgres_cpu_us_per_firing is not None
        else "-",
        **(
            {
                "tasks_done_s": drain.tasks_done_s,
                "tasks_per_s": drain.tasks / drain.tasks_done_s,
                "server_cpu_us_per_task": (drain.tasks_cpu_s or 0.0) / max(drain.tasks, 1) * 1e6,
            }
            if drain.tasks_done_s
            else {}
        ),
    )


def add_run_weeks(engine: Engine, weeks: int) -> None:
    """`--run-weeks K` (PostgreSQL): the runs' partitions as K weeks after migration 0046
    (`_common.runs_partitioned_since`), `--history` in them rather than in the DEFAULT partition."""
    bound = runs_partitioned_since(engine, weeks)
    if bound is not None:
        print(f"# run_weeks made={weeks} from {bound:%Y-%m-%d}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--instances", type=int, choices=(1, 2), default=1)
    parser.add_argument("--n", type=int, default=10_000, help="schedules due at once")
    parser.add_argument("--dispatch-batch", type=int, default=10, help="serve --dispatch-batch")
    parser.add_argument(
        "--sim-step",
        type=float,
        default=SIM_STEP_SECONDS,
        help="simulator step seconds; 3600 keeps the executor idle (32 tasks start, none finishes)",
    )
    parser.add_argument("--profile", type=Path, help="py-spy the (first) server into this file (.svg or raw)")
    parser.add_argument(
        "--windows", type=int, default=0, help="maintenance windows over every rack that never close one"
    )
    parser.add_argument(
        "--seq-scans",
        action="store_true",
        help="print full scans (and rows they read) per table every 10 s and over the drain (PostgreSQL)",
    )
    add_check_arguments(parser)
    parser.add_argument(
        "--until-tasks-done", action="store_true", help="also wait for every task to end (tasks_per_s)"
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="completed runs each schedule has already, one a day (119: every firing looks past the cap)",
    )
    parser.add_argument(
        "--uncounted",
        action="store_true",
        help="leave each schedule's run count unknown, as migration 0038 leaves it (the first firing counts)",
    )
    parser.add_argument(
        "--run-weeks",
        type=int,
        default=0,
        help="the runs' week partitions start this many weeks before now, the history in them (PostgreSQL)",
    )
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(
        f"# dispatch_drain db={args.db} instances={args.instances} n={args.n} batch={args.dispatch_batch} "
        f"load=bulk-executemany spec=interval-24h sim_step_s={args.sim_step} windows={args.windows} "
        f"passing_checks={args.passing_checks} check_kind={args.check_kind} "
        f"until_tasks_done={args.until_tasks_done} history={args.history} uncounted={args.uncounted} "
        f"run_weeks={args.run_weeks}",
        flush=True,
    )
    drain = measure_drain(
        args.db,
        args.pg_admin,
        n=args.n,
        instances=args.instances,
        batch=args.dispatch_batch,
        profile=args.profile,
        sim_step=args.sim_step,
        windows=args.windows,
        seq_scans=args.seq_scans,
        checks=args.passing_checks,
        check_kind=args.check_kind,
        until_tasks_done=args.until_tasks_done,
        history=args.history,
        uncounted=args.uncounted,
        run_weeks=args.run_weeks,
    )
    print(f"# loaded {args.n} schedules in {drain.load_s:.1f}s", flush=True)
    report(args.db, args.instances, args.dispatch_batch, drain)


if __name__ == "__main__":
    main()
