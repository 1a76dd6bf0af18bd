"""idle_cost: what an idle `rackflow serve` costs: its CPU and the database work its loops do with nothing
to do (no schedule due, no task, no check, no rollout, no notification).

One server on a fresh database (SQLite, PostgreSQL or both, `--db`), left alone `--warmup` seconds (its
start-up looks: the first full streak look, the first sweep, …), then measured over `--seconds`:

* `cpu_pct`: the server's CPU (utime + stime from /proc, its threads included) per second of wall time, as a
  percentage of one core;
* `units_s`: connections the server took from its pool per second (each `Database.read()` or
  `transaction()` is one: on SQLite one transaction, on PostgreSQL a read is autocommit statements), and
  `statements_s`, both counted in the server by SQLAlchemy's pool and cursor events, and by loop: the name of
  the asyncio task that took the connection (`rackflow.server` names each loop it starts; an unnamed task by
  its coroutine);
* PostgreSQL: `xact_s`, the transactions PostgreSQL counted for the database (`pg_stat_database`
  `xact_commit + xact_rollback` delta; each autocommit statement is one), less the bench's own two reads.

The server is `bench/_idle_child.py`: it installs the counters and runs `rackflow serve` (the same `main` as
the `rackflow` command), and writes its counts to a file when sent SIGUSR1, so the counting costs nothing
between the two samples but the events themselves (a few µs a statement).

    python bench/idle_cost.py --db both --seconds 60 --rounds 3
    PYTHONPATH=/tmp/old/src python bench/idle_cost.py --db sqlite     # another tree (the `# code` line)

`--scrape S` also serves `--metrics-listen` and scrapes /metrics every S seconds during the measurement, as
a Prometheus would (the outbox gauges are computed on scrape).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from _common import DEFAULT_POSTGRES_ADMIN, code_line, cpu_seconds, machine_line, result
from sqlalchemy.engine import make_url

from tests.e2e.cluster import free_port

STARTUP_TIMEOUT_S = 60.0


def _migrate(url: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "rackflow", "db", "migrate", "--db", url], check=True, capture_output=True
    )


@contextlib.contextmanager
def _postgres_database(admin_url: str) -> Iterator[str]:
    """A new migrated database `idle_cost_<hex>`, dropped afterwards."""
    import psycopg

    admin = make_url(admin_url).set(drivername="postgresql")
    name = f"idle_cost_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.set(database=name).render_as_string(hide_password=False)
    try:
        _migrate(url)
        yield url
    finally:
        with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _database(kind: str, admin_url: str, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        url = f"sqlite:///{tmp / 'idle.db'}"
        _migrate(url)
        yield url
    else:
        with _postgres_database(admin_url) as url:
            yield url


class _Server:
    def __init__(self, url: str, tmp: Path, metrics_port: int | None) -> None:
        self.counts_path = tmp / "counts.json"
        self.log_path = tmp / "server.log"
        args = ["--db", url, "--listen", f"127.0.0.1:{free_port()}"]
        if metrics_port is not None:
            args += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
        env = {**os.environ, "RACKFLOW_AUDIT_SPOOL": str(tmp / "audit.spool")}
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("_idle_child.py")), str(self.counts_path), *args],
            stdout=self.log_path.open("w"),
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while "listening on" not in self.log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"the server did not start:\n{self.log_path.read_text()}")
            time.sleep(0.1)

    def counts(self) -> collections.Counter[str]:
        """The server's counters now (SIGUSR1, then its file)."""
        before = self.counts_path.stat().st_mtime_ns if self.counts_path.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.counts_path.exists() or self.counts_path.stat().st_mtime_ns == before:
            if time.monotonic() > deadline:
                raise RuntimeError("the server wrote no counts")
            time.sleep(0.01)
        return collections.Counter(json.loads(self.counts_path.read_text())["counts"])

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _pg_xacts(url: str) -> int:
    import psycopg

    plain = make_url(url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(plain, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _scraping(port: int, every: float, stop: threading.Event) -> None:
    while not stop.wait(every):
        with contextlib.suppress(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()


def measure(kind: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="idle-cost-") as tmp_name:
        tmp = Path(tmp_name)
        with _database(kind, args.pg_admin, tmp) as url:
            metrics_port = free_port() if args.scrape else None
            server = _Server(url, tmp, metrics_port)
            try:
                time.sleep(args.warmup)
                stop = threading.Event()
                scraper = None
                if metrics_port is not None:
                    scraper = threading.Thread(target=_scraping, args=(metrics_port, args.scrape, stop))
                    scraper.start()
                load = os.getloadavg()[0]
                counts0, cpu0 = server.counts(), cpu_seconds(server.proc.pid)
                xacts0 = _pg_xacts(url) if kind == "postgres" else 0
                started = time.monotonic()
                time.sleep(args.seconds)
                counts1, cpu1 = server.counts(), cpu_seconds(server.proc.pid)
                elapsed = time.monotonic() - started
                # PostgreSQL's statistics lag a transaction's end by up to a second or so: read them late.
                time.sleep(2 if kind == "postgres" else 0)
                xacts1 = _pg_xacts(url) if kind == "postgres" else 0
                stop.set()
                if scraper is not None:
                    scraper.join()
            finally:
                server.stop()
    delta = counts1 - counts0
    units = sum(v for k, v in delta.items() if k.startswith("units|"))
    statements = sum(v for k, v in delta.items() if k.startswith("statements|"))
    fields: dict[str, object] = {
        "db": kind,
        "seconds": round(elapsed),
        "cpu_pct": 100 * (cpu1 - cpu0) / elapsed,
        "units_s": units / elapsed,
        "statements_s": statements / elapsed,
    }
    if kind == "postgres":
        fields["xact_s"] = (xacts1 - xacts0 - 1) / elapsed  # less the bench's first read
    result("idle", **fields, loadavg_1m=load, scrape=args.scrape or "off")
    loops = sorted({k.split("|", 1)[1] for k in delta})
    for loop in sorted(loops, key=lambda name: -delta[f"units|{name}"]):
        result(
            "idle_loop",
            db=kind,
            loop=loop.replace(" ", "_"),
            units_s=delta[f"units|{loop}"] / elapsed,
            statements_s=delta[f"statements|{loop}"] / elapsed,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument(
        "--pg-admin", default=os.environ.get("RACKFLOW_BENCH_POSTGRES_URL", DEFAULT_POSTGRES_ADMIN)
    )
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--scrape", type=float, default=0.0, help="scrape /metrics every S seconds")
    args = parser.parse_args()
    print(code_line(), flush=True)
    print(machine_line(), flush=True)
    print(f"# idle_cost db={args.db} seconds={args.seconds} warmup={args.warmup} rounds={args.rounds}")
    kinds = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    for _ in range(args.rounds):
        for kind in kinds:
            measure(kind, args)
    print(machine_line(), flush=True)


if __name__ == "__main__":
    main()
