"""audit_write: what the index of the audit trail by target (migration 0044) adds to writing an event.

On a fresh PostgreSQL database, events shaped as a TriggerTaskSchedule's (three target ids) are inserted
one a transaction, as each audited call writes its own, and the backend's CPU (utime + stime from /proc)
and the wall time are taken per event; then the GIN index over `target_ids` is dropped (the partitioned
index and its partitions') and the same is done again, alternately `--rounds` times each.

    python bench/audit_write.py --pg-admin postgresql://postgres@127.0.0.1:5432/postgres --events 20000
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from pathlib import Path

import psycopg
from _common import code_line, fresh_database, machine_line, result

TICKS = os.sysconf("SC_CLK_TCK")
INSERT = (
    "INSERT INTO audit_events (id, at, principal, method, target_ids, outcome, request) "
    "VALUES (%s, now(), 'bench', 'TriggerTaskSchedule', %s, 'OK', %s)"
)
TARGET_INDEX = "ix_audit_events_target_ids"


def backend_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def write(url: str, events: int) -> tuple[float, float]:
    """µs of the backend's CPU and of wall time an event, `events` inserted one a transaction."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        pid = row[0]
        cpu, start = backend_cpu(pid), time.perf_counter()
        for _ in range(events):
            ids = [str(uuid.uuid4()) for _ in range(3)]
            conn.execute(INSERT, (uuid.uuid4(), json.dumps(ids), json.dumps({"id": ids[0]})))
        return (backend_cpu(pid) - cpu) / events * 1e6, (time.perf_counter() - start) / events * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--events", type=int, default=20000, help="events a measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    with (
        fresh_database("postgres", args.pg_admin) as indexed,
        fresh_database("postgres", args.pg_admin) as plain,
    ):
        urls = {"indexed": indexed.url.replace("+psycopg", ""), "plain": plain.url.replace("+psycopg", "")}
        with psycopg.connect(urls["plain"], autocommit=True) as conn:
            conn.execute(f"DROP INDEX {TARGET_INDEX}")  # the partitioned index, with its partitions'
        for url in urls.values():
            write(url, args.events // 10)  # warm up: the first partition's pages, the plans
        for round_ in range(1, args.rounds + 1):
            for name, url in urls.items():
                cpu, wall = write(url, args.events)
                result(
                    "audit_write",
                    round=round_,
                    target_index=name == "indexed",
                    events=args.events,
                    postgres_cpu_us_per_event=cpu,
                    wall_us_per_event=wall,
                    loadavg=round(os.getloadavg()[0], 2),
                )


if __name__ == "__main__":
    main()
