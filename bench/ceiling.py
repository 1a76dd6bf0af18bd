"""ceiling: PostgreSQL's write ceiling (`pgbench -b simple-update`) beside the dispatch_drain figure.

pgbench runs on a scratch database of the same server (scale 1, `-c 4 -j 2 -T 10` by default), then
dispatch_drain runs on PostgreSQL with one instance, so the two figures come from the same minutes of the
same machine. A firing costs several transactions (claim share, submit, write-back), so the ratio says how
much of the database's write capacity the dispatcher turns into firings.

    python bench/ceiling.py --clients 4 --seconds 10 --n 10000
"""

from __future__ import annotations

import argparse
import re
import subprocess
import uuid

import psycopg
from _common import add_db_arguments, code_line, machine_line, result
from dispatch_drain import measure_drain, report
from psycopg import sql
from sqlalchemy.engine import make_url

_TPS = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


def pgbench_tps(admin_url: str, clients: int, seconds: int) -> float:
    """TPS of the built-in simple-update script on a fresh scale-1 database (dropped afterwards)."""
    admin = make_url(admin_url).set(drivername="postgresql")
    name = f"rackflow_pgbench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        dsn = admin.set(database=name).render_as_string(False)
        subprocess.run(["pgbench", "-i", "-s", "1", "-q", dsn], check=True, capture_output=True)
        run = subprocess.run(
            ["pgbench", "-b", "simple-update", "-c", str(clients), "-j", "2", "-T", str(seconds), dsn],
            check=True,
            capture_output=True,
            text=True,
        )
    finally:
        with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    match = _TPS.search(run.stdout)
    if match is None:
        raise RuntimeError(f"no tps in pgbench output:\n{run.stdout}\n{run.stderr}")
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser, kinds=("postgres",))
    parser.add_argument("--clients", type=int, default=4, help="pgbench -c")
    parser.add_argument("--seconds", type=int, default=10, help="pgbench -T")
    parser.add_argument("--n", type=int, default=10_000, help="dispatch_drain schedules")
    parser.add_argument("--dispatch-batch", type=int, default=10)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(
        f"# ceiling pgbench=simple-update scale=1 clients={args.clients} seconds={args.seconds}", flush=True
    )
    tps = pgbench_tps(args.pg_admin, args.clients, args.seconds)
    result("ceiling", pgbench="simple-update", clients=args.clients, seconds=args.seconds, tps=tps)
    drain = measure_drain("postgres", args.pg_admin, n=args.n, instances=1, batch=args.dispatch_batch)
    report("postgres", 1, args.dispatch_batch, drain)
    result(
        "ceiling_ratio", firings_per_s=drain.firings_per_s, pgbench_tps=tps, ratio=drain.firings_per_s / tps
    )


if __name__ == "__main__":
    main()
