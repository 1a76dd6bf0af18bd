"""retention_sizing: bytes a schedule run and its tasks take in PostgreSQL, per rack, for sizing
`--run-retention` and `--task-retention` (docs/OPERATIONS.md).

One `rackflow serve` (simulator backend, fast steps) with the example fleet (`examples/fleet.yaml`: four
racks of eight components in one NVLink domain) and `--schedules` interval schedules over the domain, each
firing every `--every` for `--seconds`: each firing records a run with one outcome per rack and submits one
task per rack, which the simulator runs to completion. Then the server stops, `VACUUM FULL ANALYZE`
compacts the two tables, and their total size (rows, TOAST and indexes) is divided by the rows they hold.

    python bench/retention_sizing.py --schedules 20 --seconds 60
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psycopg
from _common import REPO, add_db_arguments, code_line, fresh_database, machine_line, result, servers
from sqlalchemy.engine import make_url


def cli(server: str, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "rackflow", "--server", server, *args], check=True, capture_output=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser, kinds=("postgres",))
    parser.add_argument("--schedules", type=int, default=20)
    parser.add_argument("--every", default="2s")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(f"# retention_sizing schedules={args.schedules} every={args.every} seconds={args.seconds}")
    with fresh_database(args.db, args.pg_admin) as ws:
        env = {"RACKFLOW_SIM_STEP_SECONDS": "0.01"}
        with servers(ws.url, ws.log_dir, 1, args=["--dispatch-interval", "1s"], env=env) as (server,):
            cli(server.address, "inventory", "import", str(REPO / "examples" / "fleet.yaml"))
            for i in range(args.schedules):
                schedule = ["schedule", "create", f"s{i}", "--interval", args.every, "--domain", "nvl-a"]
                cli(server.address, *schedule, "--op", "power-on")
            time.sleep(args.seconds)
        url = make_url(ws.url).set(drivername="postgresql").render_as_string(False)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM FULL ANALYZE task_schedule_run")  # partitioned: each of its partitions
            conn.execute("VACUUM FULL ANALYZE tasks")
            # The runs are partitioned (migration 0046): the partitioned table and its indexes have no
            # storage (its pg_total_relation_size is 0), the partitions hold it all.
            runs, outcomes, run_bytes = conn.execute(
                "SELECT count(*), coalesce(sum(jsonb_array_length(outcomes)), 0), (SELECT"
                " sum(pg_total_relation_size(relid))::bigint FROM pg_partition_tree('task_schedule_run'))"
                " FROM task_schedule_run"
            ).fetchone() or (0, 0, 0)
            task_rows, task_bytes = conn.execute(
                "SELECT count(*), pg_total_relation_size('tasks') FROM tasks"
            ).fetchone() or (0, 0)
    per_outcome = run_bytes / max(outcomes, 1)
    per_task = task_bytes / max(task_rows, 1)
    result(
        "retention_sizing",
        runs=runs,
        rack_outcomes=outcomes,
        run_table_bytes=run_bytes,
        tasks=task_rows,
        task_table_bytes=task_bytes,
        run_bytes_per_rack=per_outcome,
        task_bytes=per_task,
        bytes_per_run_per_rack=per_outcome + per_task,
    )


if __name__ == "__main__":
    main()
