"""budget_gate: what the operation-budget gate adds to an executor claim.

In-process, on a fresh database: R racks (one COMPUTE component each) in D NVLink domains, a power-off
task on each, RUNNING already under one live instance, and P more PENDING. Each measured round is one
claim transaction of another instance, as the executor's: `claim` takes P tasks, then the budget gate
runs (timed alone), then the transaction is rolled back so every round sees the same state. First with no
budget (the gate's one unlocked read), then with a budget counting power-off whose caps let part of the
claim through (the rest is handed back): lock, count, decide, hand back.

    python bench/budget_gate.py --db postgres --running 200 --claim 50
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import timedelta

from _common import add_db_arguments, code_line, fresh_database, machine_line, median, percentile, result

from rackflow.budgets.gate import BudgetGate
from rackflow.budgets.service import BudgetInput
from rackflow.clock import SystemClock
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackSelection
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.services import Services
from rackflow.store import instances, task_runs
from rackflow.store.db import Database
from rackflow.tasks.gates import consult

LEASE = timedelta(hours=1)
ROUNDS = 60
WARM_UP = 10


async def measure(url: str, running: int, claim: int, domains: int) -> None:
    db = Database(url)
    clock = SystemClock()
    services = Services.build(db, clock)
    try:
        made = [
            await services.inventory.create_rack(
                f"r{i:05d}", components=[ComponentSpec(ComponentType.COMPUTE, f"c{i}")]
            )
            for i in range(running + claim)
        ]
        for d in range(domains):
            await services.inventory.create_domain(f"nvl-{d}", [r.id for r in made[d::domains]])
        await services.tasks.submit(
            Operation(OperationKind.POWER_OFF),
            [RackSelection(r.id) for r in made],
            description="",
            queue=QueueOptions(),
        )
        owner = uuid.uuid4()
        await instances.register(db, owner, host="bench", pid=0)
        async with db.transaction() as conn:
            await task_runs.claim(
                db, conn, owner_id=owner, lease_ttl=LEASE, running_here=(), now=clock.now(), limit=running
            )

        async def round_trip() -> tuple[float, int]:
            claimer = uuid.uuid4()
            async with db.transaction() as conn:
                now = clock.now()
                claimed = await task_runs.claim(
                    db, conn, owner_id=claimer, lease_ttl=LEASE, running_here=(), now=now, limit=claim
                )
                started = time.perf_counter()
                kept = (await consult([BudgetGate(db)], conn, claimed, owner_id=claimer, now=now)).claimed
                elapsed = time.perf_counter() - started
                await conn.rollback()
            return elapsed, claim - len(kept)

        for label in ("no_budget", "budget"):
            if label == "budget":
                cap = running + claim // 2
                await services.budgets.create(
                    BudgetInput(
                        "bench", (OperationKind.POWER_OFF,), cap, running // domains + claim // domains // 2
                    )
                )
            times, held = [], 0
            for _ in range(ROUNDS):
                elapsed, held = await round_trip()
                times.append(elapsed)
            times = times[WARM_UP:]
            result(
                f"gate_{label}",
                rounds=len(times),
                held=held,
                p50_ms=median(times) * 1000,
                p99_ms=percentile(times, 99) * 1000,
            )
    finally:
        await db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_db_arguments(parser)
    parser.add_argument("--running", type=int, default=200)
    parser.add_argument("--claim", type=int, default=50)
    parser.add_argument("--domains", type=int, default=5)
    args = parser.parse_args()
    print(machine_line())
    print(code_line())
    print(f"# budget_gate db={args.db} running={args.running} claim={args.claim} domains={args.domains}")
    with fresh_database(args.db, args.pg_admin) as ws:
        asyncio.run(measure(ws.url, args.running, args.claim, args.domains))


if __name__ == "__main__":
    main()
