"""rollout_gate: what the rollout's start gate adds to an executor claim of a large rollout's tasks.

In-process, on a fresh database: R racks (one COMPUTE component each, bulk-loaded) and one power-off
rollout over them with `halt_after_failures` L and `max_concurrent_racks` M (0: every rack at once, as
behind a budget). The rollout is triggered; of the tasks it submitted, `--running` are RUNNING under a live
instance, `--failed` of those failed (under the limit, so the rule runs and does not halt), and the rest
are PENDING, held by a budget whose hold is over (`held_by` "budget"), so each claim brings them before
the rollout's gate, as a budget's release does. Each measured round is one claim transaction of another
instance, as the executor's: `claim` takes C tasks, then the rollout gate runs alone (timed), then the
transaction is rolled back so every round sees the same state.

Figures, per size, in this order: `no_limit` (the run's policy without the limit, written in its row: the
gate's cost without the failure limit's look), `limit_no_failure` (the policy as fired, a failure limit,
no task failed), and `limit` (the same with `--failed` tasks failed, under the limit).
The gate's signature is the same before and after the failure-limit look, so the same script measures an
older tree put first on PYTHONPATH (the `# code` line names it).

    python bench/rollout_gate.py --db postgres --racks 1000 10000
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import timedelta

from _common import (
    add_db_arguments,
    code_line,
    fresh_database,
    machine_line,
    median,
    percentile,
    result,
    sync_engine,
)
from sqlalchemy import insert, select, text, update

from rackflow.clock import SystemClock
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackTarget, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.rollouts.gate import RolloutGate
from rackflow.services import Services
from rackflow.store import instances, task_runs
from rackflow.store.db import Database
from rackflow.store.tables import components, racks, task_schedule_run, tasks
from rackflow.tasks.gates import consult
from rackflow.timespec import ScheduleSpec, SpecType

LEASE = timedelta(hours=1)
ROUNDS = 40
WARM_UP = 5
CHUNK = 5_000
PENDING = tasks.c.status == TaskStatus.PENDING.value


def load_racks(url: str, template_id: uuid.UUID, prefix: str, count: int) -> list[uuid.UUID]:
    """`count` racks named `<prefix>-<i>`: clones of the rack `template_id` (and its component), inserted
    with executemany; their ids, the template's first."""
    engine = sync_engine(url)
    ids = [template_id]
    try:
        with engine.begin() as conn:
            rack = dict(conn.execute(select(racks).where(racks.c.id == template_id)).one()._mapping)
            part = dict(
                conn.execute(select(components).where(components.c.rack_id == template_id)).one()._mapping
            )
        for start in range(1, count, CHUNK):
            rack_rows, part_rows = [], []
            for i in range(start, min(start + CHUNK, count)):
                name, rack_id = f"{prefix}-{i:05d}", uuid.uuid4()
                ids.append(rack_id)
                rack_rows.append({**rack, "id": rack_id, "name": name, "external_id": name})
                part_rows.append(
                    {**part, "id": uuid.uuid4(), "rack_id": rack_id, "name": f"{name}-c", "external_id": None}
                )
            with engine.begin() as conn:
                conn.execute(insert(racks), rack_rows)
                conn.execute(insert(components), part_rows)
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE"))
    finally:
        engine.dispose()
    return ids


def vacuum(url: str) -> None:
    """On PostgreSQL, VACUUM ANALYZE the tasks just written, as autovacuum would soon: every round then
    reads the same table, not one full of the set-up's dead rows."""
    engine = sync_engine(url)
    try:
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM ANALYZE tasks"))
    finally:
        engine.dispose()


async def measure(
    url: str, sizes: list[int], max_concurrent: int, limit: int, running: int, failed: int, claim: int
) -> None:
    db = Database(url)
    clock = SystemClock()
    services = Services.build(db, clock)
    owner = uuid.uuid4()  # the live instance running `running` of each rollout's tasks
    await instances.register(db, owner, host="bench", pid=0)
    try:
        for size in sizes:
            prefix = f"s{size}"
            first = await services.inventory.create_rack(
                f"{prefix}-00000", components=[ComponentSpec(ComponentType.COMPUTE, f"{prefix}-00000-c")]
            )
            rack_ids = load_racks(url, first.id, prefix, size)
            policy = RolloutPolicy(max_concurrent_racks=max_concurrent, halt_after_failures=limit)
            schedule = await services.schedules.create(
                name=f"rollout-{size}",
                spec=ScheduleSpec(SpecType.INTERVAL, "24h", "UTC"),
                overlap_policy=OverlapPolicy.SKIP,
                operation=Operation(OperationKind.POWER_OFF),
                queue=QueueOptions(),
                description="",
                target=TargetSpec(racks=tuple(RackTarget(id=r) for r in rack_ids)),
                rollout=policy,
            )
            started = time.perf_counter()
            submitted = await services.schedules.trigger(schedule.id)
            trigger_s = time.perf_counter() - started
            async with db.transaction() as conn:
                [run_id] = {
                    row.run_id
                    for row in await conn.execute(select(tasks.c.run_id).where(tasks.c.id == submitted[0]))
                }
                ran = await task_runs.claim(
                    db, conn, owner_id=owner, lease_ttl=LEASE, running_here=(), now=clock.now(), limit=running
                )
                now = clock.now()
                # The rest wait behind a budget whose hold is over: the claim brings them to the gates.
                await conn.execute(
                    update(tasks)
                    .where(tasks.c.run_id == run_id, PENDING)
                    .values(held_by="budget", held_reason="bench", not_before=now - timedelta(seconds=1))
                )
            ran_ids = [task.id for task, _ in ran]

            async def fail(count: int, ran_ids: list[uuid.UUID] = ran_ids) -> None:
                async with db.transaction() as conn:
                    await conn.execute(
                        update(tasks)
                        .where(tasks.c.id.in_(ran_ids[:count]))
                        .values(status=TaskStatus.FAILED.value, finished_at=clock.now())
                    )

            async def set_policy(policy: RolloutPolicy, run_id: uuid.UUID = run_id) -> None:
                async with db.transaction() as conn:
                    await conn.execute(
                        update(task_schedule_run)
                        .where(task_schedule_run.c.id == run_id)
                        .values(rollout=policy.to_json())
                    )

            print(
                f"# rollout racks={size} submitted={len(submitted)} running={len(ran)} "
                f"trigger_ms={trigger_s * 1000:.0f}",
                flush=True,
            )
            vacuum(url)
            await set_policy(RolloutPolicy(max_concurrent_racks=max_concurrent))
            await measure_gate(db, clock, f"gate_{size}_no_limit", claim)
            await set_policy(policy)
            await measure_gate(db, clock, f"gate_{size}_limit_no_failure", claim)
            await fail(failed)
            await measure_gate(db, clock, f"gate_{size}_limit", claim)
            # This size's tasks leave the next size's claims alone.
            async with db.transaction() as conn:
                await conn.execute(
                    update(tasks)
                    .where(tasks.c.run_id == run_id, PENDING)
                    .values(status=TaskStatus.TERMINATED.value, finished_at=clock.now())
                )
    finally:
        await db.dispose()


async def measure_gate(db: Database, clock: SystemClock, figure: str, claim: int) -> None:
    gate = RolloutGate(db)

    async def round_trip() -> tuple[float, int, int]:
        claimer = uuid.uuid4()
        async with db.transaction() as conn:
            now = clock.now()
            claimed = await task_runs.claim(
                db, conn, owner_id=claimer, lease_ttl=LEASE, running_here=(), now=now, limit=claim
            )
            started = time.perf_counter()
            kept = (await consult([gate], conn, claimed, owner_id=claimer, now=now)).claimed
            elapsed = time.perf_counter() - started
            await conn.rollback()
        return elapsed, len(claimed), len(claimed) - len(kept)

    times: list[float] = []
    took = held = 0
    for _ in range(ROUNDS):
        elapsed, took, held = await round_trip()
        times.append(elapsed)
    times = times[WARM_UP:]
    result(
        figure,
        rounds=len(times),
        claimed=took,
        held=held,
        p50_ms=median(times) * 1000,
        p90_ms=percentile(times, 90) * 1000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--racks", type=int, nargs="+", default=[1_000, 10_000])
    parser.add_argument("--max-concurrent", type=int, default=0, help="0: every rack submitted at once")
    parser.add_argument("--limit", type=int, default=100, help="halt_after_failures")
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--failed", type=int, default=10, help="of the running, under --limit")
    parser.add_argument("--claim", type=int, default=50)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(
        f"# rollout_gate db={args.db} racks={args.racks} max_concurrent={args.max_concurrent} "
        f"limit={args.limit} running={args.running} failed={args.failed} claim={args.claim}"
    )
    with fresh_database(args.db, args.pg_admin) as ws:
        asyncio.run(
            measure(
                ws.url, args.racks, args.max_concurrent, args.limit, args.running, args.failed, args.claim
            )
        )


if __name__ == "__main__":
    main()
