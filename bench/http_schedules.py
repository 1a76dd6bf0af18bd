"""http_schedules: the dashboard's schedules page and its JSON with many schedules (default 10,000).

One `rackflow serve --http-listen` (dispatcher on, nothing due) on a fresh database with `--schedules`
bulk-loaded schedules, each on a rack of its own and each with `--runs` recorded firings (so every row's
strip of recent firings has something to show). One client, one keep-alive connection, loads each URL
`--loads` times in a row after 5 warm-up loads, and reports time to first byte (request sent -> status
line and headers read) and total time (-> whole body read), p50 and p99:

* page: GET /schedules, the first 50 by name: the document a browser navigates to;
* fragment: the same with `X-Rackflow-Fragment: 1`, what the open page asks every 5 s;
* next-run: sorted by next run; deep: page 100 (rows 4,951-5,000); search: a name filter;
* json: GET /api/v1/schedules?limit=50; json-all: every schedule in one answer.

    python bench/http_schedules.py --db postgres --schedules 10000 --loads 100
"""

from __future__ import annotations

import argparse
import http.client
import time
import uuid
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
from sqlalchemy import insert, select

from rackflow.ids import id_at_time
from rackflow.store.tables import task_schedule, task_schedule_run, task_schedule_scope
from rackflow.timespec import ScheduleSpec, SpecType

WARMUP = 5
CASES = (
    ("page", "/schedules", {}),
    ("fragment", "/schedules", {"X-Rackflow-Fragment": "1"}),
    ("next-run", "/schedules?sort=next_run_at", {}),
    ("deep", "/schedules?page=100", {}),
    ("search", "/schedules?search=bench-00042", {}),
    ("json", "/api/v1/schedules?limit=50", {}),
    ("json-all", "/api/v1/schedules", {}),
)


def add_runs(url: str, per_schedule: int) -> int:
    """`per_schedule` completed firings of every schedule, an hour apart, each with one submitted scope."""
    engine = sync_engine(url)
    now = datetime.now(UTC)
    rows = []
    with engine.connect() as conn:
        scopes = conn.execute(
            select(task_schedule_scope.c.schedule_id, task_schedule_scope.c.id, task_schedule_scope.c.rack_id)
        ).all()
    for schedule_id, scope_id, rack_id in scopes:
        for n in range(per_schedule):
            outcome = {
                "scope_id": str(scope_id),
                "rack_id": str(rack_id),
                "outcome": "submitted",
                "task_id": str(uuid.uuid4()),
                "error": "",
            }
            rows.append(
                {
                    "id": id_at_time(now - timedelta(hours=n + 1)),  # no slot: named as it fired
                    "schedule_id": schedule_id,
                    "fired_at": now - timedelta(hours=n + 1),
                    "scheduled_for": None,
                    "trigger": "dispatch",
                    "state": "completed",
                    "outcomes": [outcome],
                    "owner_id": None,
                }
            )
    with engine.begin() as conn:
        for start in range(0, len(rows), 5000):
            conn.execute(insert(task_schedule_run), rows[start : start + 5000])
        count = conn.execute(select(task_schedule.c.id)).all()
    engine.dispose()
    return len(count)


def measure(
    host: str, port: int, path: str, headers: dict[str, str], loads: int
) -> tuple[list[float], list[float], int]:
    connection = http.client.HTTPConnection(host, port, timeout=60)
    ttfb, total, size = [], [], 0
    try:
        for i in range(WARMUP + loads):
            started = time.perf_counter()
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            first = time.perf_counter()
            body = response.read()
            done = time.perf_counter()
            if response.status != 200:
                raise RuntimeError(f"{path}: HTTP {response.status}: {body[:300]!r}")
            if i >= WARMUP:
                ttfb.append(first - started)
                total.append(done - started)
                size = len(body)
    finally:
        connection.close()
    return ttfb, total, size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3, help="recorded firings per schedule")
    parser.add_argument("--loads", type=int, default=100)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(f"# http_schedules db={args.db} schedules={args.schedules} runs={args.runs} loads={args.loads}")
    later = datetime.now(UTC) + timedelta(days=365)
    with fresh_database(args.db, args.pg_admin) as ws:
        spec = ScheduleSpec(SpecType.CRON, "0 2 * * *", "Europe/Berlin")
        bulk_load(ws.url, args.schedules, spec=spec, next_run_at=lambda i: later + timedelta(minutes=i % 997))
        loaded = add_runs(ws.url, args.runs)
        print(f"# loaded schedules={loaded} runs={loaded * args.runs}")
        with servers(ws.url, ws.log_dir, 1, args=["--http-listen", "127.0.0.1:0"]) as (server,):
            host, _, port = server.http_url.removeprefix("http://").rpartition(":")
            for name, path, headers in CASES:
                ttfb, total, size = measure(host, int(port), path, headers, args.loads)
                result(
                    "http_schedules",
                    db=args.db,
                    case=name,
                    bytes=size,
                    ttfb_p50_ms=percentile(ttfb, 50) * 1000,
                    ttfb_p99_ms=percentile(ttfb, 99) * 1000,
                    total_p50_ms=percentile(total, 50) * 1000,
                    total_p99_ms=percentile(total, 99) * 1000,
                )


if __name__ == "__main__":
    main()
