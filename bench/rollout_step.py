"""rollout_step: what a rollout costs per rack it starts, against a plain firing of the same racks.

In-process, on a fresh database: N racks (one COMPUTE component each) in D NVLink domains, and two
firmware schedules on all of them: one plain, one with `max_concurrent_racks` (default 50). The plain one
is triggered once (every rack submitted in one firing): its time per rack is the baseline. The rollout
is triggered, and then, until it completes, every active task of it is ended (as an executor would, not
timed) and one rollout step (`RolloutService.advance`, exactly what the driver loop runs each second) is
timed: lock the run, read its tasks and racks, decide, submit the next wave, write the run back.

    python bench/rollout_step.py --db postgres --racks 1000 --max-concurrent 50
"""

from __future__ import annotations

import argparse
import asyncio
import time

from _common import add_db_arguments, code_line, fresh_database, machine_line, median, percentile, result
from sqlalchemy import update

from rackflow.clock import SystemClock
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackTarget, TargetSpec
from rackflow.domain.rollouts import RolloutPolicy
from rackflow.domain.schedules import OverlapPolicy
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions, TaskStatus
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.store.tables import tasks
from rackflow.timespec import ScheduleSpec, SpecType

FIRMWARE = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.1.0")


async def measure(url: str, racks: int, domains: int, max_concurrent: int) -> None:
    db = Database(url)
    services = Services.build(db, SystemClock())
    try:
        names = [f"rack-{i:05d}" for i in range(racks)]
        made = [
            await services.inventory.create_rack(
                n, components=[ComponentSpec(ComponentType.COMPUTE, f"{n}-c")]
            )
            for n in names
        ]
        for d in range(domains):
            await services.inventory.create_domain(f"nvl-{d}", [r.id for r in made[d::domains]])
        target = TargetSpec(racks=tuple(RackTarget(name=n) for n in names))

        async def schedule(name: str, rollout: RolloutPolicy | None) -> object:
            return await services.schedules.create(
                name=name,
                spec=ScheduleSpec(SpecType.INTERVAL, "24h", "UTC"),
                overlap_policy=OverlapPolicy.QUEUE,
                operation=FIRMWARE,
                queue=QueueOptions(),
                description="",
                target=target,
                rollout=rollout,
            )

        async def end_all() -> None:
            async with db.transaction() as conn:
                await conn.execute(
                    update(tasks)
                    .where(tasks.c.status.in_(["pending", "waiting", "running"]))
                    .values(status=TaskStatus.COMPLETED.value, finished_at=services.clock.now())
                )

        plain = await schedule("plain", None)
        started = time.perf_counter()
        submitted = await services.schedules.trigger(plain.id)  # type: ignore[attr-defined]
        plain_s = time.perf_counter() - started
        result(
            "plain_firing", racks=len(submitted), total_ms=plain_s * 1000, per_rack_us=plain_s / racks * 1e6
        )
        await end_all()

        rollout = await schedule("rollout", RolloutPolicy(max_concurrent_racks=max_concurrent))
        started = time.perf_counter()
        first = await services.schedules.trigger(rollout.id)  # type: ignore[attr-defined]
        first_s = time.perf_counter() - started
        steps: list[float] = []
        per_rack: list[float] = []
        total = len(first)
        while True:
            await end_all()
            started = time.perf_counter()
            step = await services.rollouts.advance()
            elapsed = time.perf_counter() - started
            if not step.task_ids:
                break
            steps.append(elapsed)
            per_rack.append(elapsed / len(step.task_ids))
            total += len(step.task_ids)
        result(
            "rollout_first_wave",
            racks=len(first),
            total_ms=first_s * 1000,
            per_rack_us=first_s / len(first) * 1e6,
        )
        result(
            "rollout_step",
            steps=len(steps),
            racks_started=total,
            step_p50_ms=median(steps) * 1000,
            step_p99_ms=percentile(steps, 99) * 1000,
            per_rack_p50_us=median(per_rack) * 1e6,
            overhead_per_rack_us=(median(per_rack) - plain_s / racks) * 1e6,
        )
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--racks", type=int, default=1_000)
    parser.add_argument("--domains", type=int, default=25)
    parser.add_argument("--max-concurrent", type=int, default=50)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(f"# rollout_step db={args.db} racks={args.racks} domains={args.domains}", end=" ")
    print(f"max_concurrent={args.max_concurrent}")
    with fresh_database(args.db, args.pg_admin) as ws:
        asyncio.run(measure(ws.url, args.racks, args.domains, args.max_concurrent))


if __name__ == "__main__":
    main()
