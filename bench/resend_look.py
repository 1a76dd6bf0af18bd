"""resend_look: what the look for Alertmanager re-sends costs over a week of notification history.

Every instance with an enabled Alertmanager channel looks for alerts due to be sent again every 15 s
(`Deliverer._resends`: `outbox.next_resend`, and when one is due, `outbox.claim_resends` in a transaction).
The look reads the open conditions (`outbox._open`) and, since the clearings' one more resolved send, the
clearings delivered in the last few intervals. This loads `--events` events spread over the last week
(`--retention` is what `--notification-retention` keeps), each delivered to one Alertmanager channel:
mostly one-off failed tasks, a fifth halts (`--cleared-share` of them resumed: a halt and its clearing),
and `--open` halts still open (their runs halted), and `--open-past` more raised before the retention
(still halted: retention keeps them). Then ANALYZE, and the look `--repeats` times after a warm-up:
`next_resend` alone (what an idle look costs) and a claim of every due re-send, rolled back. Last, once,
the prune (`outbox.prune_delivered`) at half the retention: it deletes the older half of the week, and
passes by the open raises past it.

    python bench/resend_look.py --db postgres --sizes 10000,100000,500000 --repeats 30
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from _common import (
    LOAD_CHUNK,
    add_db_arguments,
    code_line,
    fresh_database,
    machine_line,
    median,
    percentile,
    result,
    sync_engine,
)
from sqlalchemy import func, insert, select, text

from rackflow.clock import SystemClock
from rackflow.config import DEFAULT_ALERT_RESEND_INTERVAL, NOTIFY_BATCH
from rackflow.ids import new_id
from rackflow.store import outbox
from rackflow.store.db import Database
from rackflow.store.tables import (
    notification_channel,
    notification_delivery,
    notification_event,
    task_schedule,
    task_schedule_run,
)

WARMUP = 3
HALT_SHARE = 5  # one event in five is a halt (or its clearing)


def _run(run_id: uuid.UUID, schedule_id: uuid.UUID, state: str, at: datetime) -> dict[str, Any]:
    """A manual run (no slot: the runs' DEFAULT partition on PostgreSQL) in `state`."""
    return {
        "id": run_id,
        "schedule_id": schedule_id,
        "fired_at": at,
        "trigger": "manual",
        "state": state,
        "outcomes": [],
    }


def load(
    url: str, events: int, open_halts: int, open_past: int, cleared_share: float, retention: timedelta
) -> uuid.UUID:
    """The history, and the Alertmanager channel every event was delivered to; returns the channel's id."""
    engine = sync_engine(url)
    now = datetime.now(UTC)
    channel_id = new_id()
    schedule_id = new_id()
    open_schedules = [new_id() for _ in range(open_halts + open_past)]
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(notification_channel).values(
                    id=channel_id,
                    name="am",
                    kind="alertmanager",
                    url="http://127.0.0.1:9093",
                    secret="",
                    enabled=True,
                    event_types=[],
                    schedules=[],
                    operations=[],
                    min_severity="info",
                    rate_per_minute=60,
                    max_attempts=10,
                    rate_tokens=60.0,
                    rate_at=now,
                    created_at=now,
                    updated_at=now,
                )
            )
            # A schedule has one live rollout at most (a halted run is one), so each open halt has its
            # own: on PostgreSQL the live-runs trigger dropped the second halted run of a schedule
            # silently (one open halt was loaded, not `open_halts`), and on SQLite its index refuses it.
            conn.execute(
                insert(task_schedule),
                [
                    {
                        "id": sid,
                        "name": f"fw-{k}",
                        "spec_type": "interval",
                        "spec": "1h",
                        "operation_template": {"operation": {"kind": "power_off"}},
                        "created_at": now,
                        "updated_at": now,
                    }
                    for k, sid in enumerate([schedule_id, *open_schedules])
                ],
            )
        events_rows: list[dict[str, Any]] = []
        deliveries: list[dict[str, Any]] = []
        runs: list[dict[str, Any]] = []

        def event(kind: str, at: datetime, **fields: Any) -> None:
            event_id = new_id()
            events_rows.append(
                {
                    "id": event_id,
                    "type": kind,
                    "severity": "critical" if kind.startswith("run.") else "warning",
                    "at": at,
                    "summary": kind,
                    "schedule_id": fields.get("schedule_id", schedule_id),
                    "schedule_name": "fw",
                    "run_id": fields.get("run_id"),
                    "task_id": fields.get("task_id"),
                    "principal": "rackflow",
                    "payload": {},
                    "fanned_out": True,
                    "cleared_at": fields.get("cleared_at"),
                }
            )
            resends = kind == "run.halted" and fields.get("cleared_at") is None
            deliveries.append(
                {
                    "id": new_id(),
                    "event_id": event_id,
                    "channel_id": channel_id,
                    "state": "delivered",
                    "attempts": 1,
                    "claims": 1,
                    "next_attempt_at": at + (DEFAULT_ALERT_RESEND_INTERVAL if resends else timedelta(0)),
                    "delivered_at": at,
                    "created_at": at,
                }
            )

        step = retention / max(events, 1)
        for k in range(events):
            at = now - retention + k * step
            if k % HALT_SHARE:
                event("task.failed", at, task_id=uuid.uuid4())
                continue
            run_id = new_id()
            runs.append(_run(run_id, schedule_id, "cancelled", at))
            if (k // HALT_SHARE) % 100 < cleared_share * 100:
                event("run.halted", at, run_id=run_id, cleared_at=at + timedelta(minutes=5))
                event("run.resumed", at + timedelta(minutes=5), run_id=run_id)
            else:  # a halt whose run was cancelled: it records no clearing, and its run no longer holds it
                event("run.halted", at, run_id=run_id)
        raised_ago = [timedelta(hours=k + 1) for k in range(open_halts)]
        raised_ago += [retention + timedelta(hours=k + 1) for k in range(open_past)]
        for ago, open_schedule in zip(raised_ago, open_schedules, strict=True):
            run_id = new_id()
            runs.append(_run(run_id, open_schedule, "halted", now - ago))
            event("run.halted", now - ago, run_id=run_id, schedule_id=open_schedule)
        with engine.begin() as conn:
            for table, rows in ((task_schedule_run, runs), (notification_event, events_rows)):
                for start in range(0, len(rows), LOAD_CHUNK):
                    conn.execute(insert(table), rows[start : start + LOAD_CHUNK])
            for start in range(0, len(deliveries), LOAD_CHUNK):
                conn.execute(insert(notification_delivery), deliveries[start : start + LOAD_CHUNK])
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("ANALYZE"))
        return channel_id
    finally:
        engine.dispose()


async def measure(url: str, channel_id: uuid.UUID, repeats: int) -> tuple[list[float], list[float], int]:
    """Milliseconds of each `next_resend`, and of each claim (rolled back), and how many a claim took."""
    db = Database(url, clock=SystemClock())
    interval = DEFAULT_ALERT_RESEND_INTERVAL
    # The look's signature before the clearings' one more send took no `now` and `interval` (A/B runs).
    takes_now = "now" in inspect.signature(outbox.next_resend).parameters
    looks: list[float] = []
    claims: list[float] = []
    claimed = 0
    try:
        for k in range(WARMUP + repeats):
            async with db.read() as conn:
                now = await db.now(conn)
                started = time.perf_counter()
                if takes_now:
                    await outbox.next_resend(conn, [channel_id], now, interval)
                else:
                    await outbox.next_resend(conn, [channel_id])  # type: ignore[call-arg]
                if k >= WARMUP:
                    looks.append((time.perf_counter() - started) * 1000)
            async with db.engine.connect() as conn:
                transaction = await conn.begin()
                now = await db.now(conn)
                started = time.perf_counter()
                found = await outbox.claim_resends(db, conn, [channel_id], now, NOTIFY_BATCH, interval)
                if k >= WARMUP:
                    claims.append((time.perf_counter() - started) * 1000)
                claimed = len(found)
                await transaction.rollback()
    finally:
        await db.dispose()
    return looks, claims, claimed


async def measure_prune(url: str, retention: timedelta) -> tuple[float, int, int]:
    """Milliseconds of one prune at half the retention, how many events it deleted, and how many it left
    older than its cutoff."""
    db = Database(url, clock=SystemClock())
    try:
        started = time.perf_counter()
        pruned = sum([n async for n in outbox.prune_delivered(db, retention / 2)])
        took = (time.perf_counter() - started) * 1000
        async with db.read() as conn:
            cutoff = await db.now(conn) - retention / 2
            stmt = select(func.count()).where(notification_event.c.at < cutoff)
            left: int = (await conn.execute(stmt)).scalar_one()
    finally:
        await db.dispose()
    return took, pruned, left


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--sizes", default="10000,100000", help="events in the week, comma-separated")
    parser.add_argument("--open", type=int, default=20, help="halts still open")
    parser.add_argument(
        "--open-past", type=int, default=0, help="halts still open, raised before the retention"
    )
    parser.add_argument("--cleared-share", type=float, default=0.8, help="halts resumed (a clearing)")
    parser.add_argument("--retention", type=float, default=7.0, help="days of events kept")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    for size in (int(s) for s in args.sizes.split(",")):
        with fresh_database(args.db, args.pg_admin) as workspace:
            retention = timedelta(days=args.retention)
            channel_id = load(workspace.url, size, args.open, args.open_past, args.cleared_share, retention)
            looks, claims, claimed = asyncio.run(measure(workspace.url, channel_id, args.repeats))
            prune_ms, pruned, left = asyncio.run(measure_prune(workspace.url, retention))
        result(
            "resend_look",
            db=args.db,
            events=size,
            open=args.open,
            look_p50_ms=median(looks),
            look_p95_ms=percentile(looks, 95),
            claim_p50_ms=median(claims),
            claim_p95_ms=percentile(claims, 95),
            claimed=claimed,
            open_past=args.open_past,
            prune_ms=prune_ms,
            pruned=pruned,
            prune_left=left,
        )


if __name__ == "__main__":
    main()
