"""An operation budget with two real `rackflow serve` processes on one PostgreSQL: tasks of two schedules
and manual tasks, submitted through both instances at once, with both executors claiming and slow simulated
steps, never run more than the budget allows, in the fleet or in one domain (the running tasks sampled
continuously from the database), while the ones waiting say which budget they wait for; all of them
complete."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import Sampler, servers, sql
from tests.e2e.fleet import create_racks, schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

MAX_RUNNING = 4
PER_DOMAIN = 2
DOMAINS = 3
RACKS_PER_DOMAIN = 6


class RunningSampler(Sampler):
    """Samples the RUNNING power-on tasks (their domains) and the waiting ones' messages."""

    query = (
        "SELECT t.status, t.message, r.nvl_domain_id FROM tasks t "
        "JOIN racks r ON r.id = t.rack_id "
        "WHERE t.operation = 'power_on' AND t.status IN ('pending', 'running')"
    )

    def __init__(self, db_url: str) -> None:
        super().__init__(db_url)
        self.max_running = 0
        self.max_per_domain = 0
        self.waiting_messages: set[str] = set()

    def observe(self, rows: list[tuple[object, ...]]) -> None:
        running = [row for row in rows if row[0] == "running"]
        self.max_running = max(self.max_running, len(running))
        domains = Counter(row[2] for row in running)
        self.max_per_domain = max(self.max_per_domain, max(domains.values(), default=0))
        self.waiting_messages |= {str(row[1]) for row in rows if row[0] == "pending" and row[1]}


def test_a_budget_holds_across_two_instances_for_schedules_and_manual_tasks(
    pg_db: str, tmp_path: Path
) -> None:
    # The failpoint stretches each claim's count-to-commit: without the budget rows' lock, two instances
    # would both count the same running tasks and both admit up to the cap.
    env = {"RACKFLOW_SIM_STEP_SECONDS": "0.15", "RACKFLOW_FAILPOINT_BUDGET_COUNTED": "300ms"}
    with servers(pg_db, tmp_path, 2, env=env) as (a, b), RunningSampler(pg_db) as sampler:
        stub_a, stub_b = a.stub(), b.stub()
        names = [f"bu-{d}-{i}" for d in range(DOMAINS) for i in range(RACKS_PER_DOMAIN)]
        racks = create_racks(stub_a, names, components_per_rack=2)
        for d in range(DOMAINS):
            ids = [r.id for r in racks if r.name.startswith(f"bu-{d}-")]
            stub_a.CreateNVLDomain(pb.CreateNVLDomainRequest(name=f"dom-{d}", rack_ids=ids))
        stub_b.CreateOperationBudget(
            pb.CreateOperationBudgetRequest(
                budget=pb.OperationBudget(
                    name="power",
                    operations=["power_on"],
                    max_running=MAX_RUNNING,
                    max_running_per_domain=PER_DOMAIN,
                )
            )
        )
        # Each schedule and the manual tasks take two racks of every domain.
        groups = [[n for n in names if int(n.rsplit("-", 1)[1]) // 2 == g] for g in range(3)]
        nightly, weekly = (
            stub.CreateTaskSchedule(
                schedule_request(name, group, spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
            )
            for stub, name, group in ((stub_a, "nightly", groups[0]), (stub_b, "weekly", groups[1]))
        )
        submitted = [
            *stub_a.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=nightly.id)).task_ids,
            *stub_b.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=weekly.id)).task_ids,
        ]
        for stub, half in ((stub_a, groups[2][::2]), (stub_b, groups[2][1::2])):
            target = pb.OperationTargetSpec(
                racks=pb.RackTargets(targets=[pb.RackTarget(name=n) for n in half])
            )
            submitted += stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target)).task_ids
        assert len(submitted) == len(names)
        done = "SELECT count(*) FROM tasks WHERE operation = 'power_on' AND status = 'completed'"
        wait_until(lambda: sql(pg_db, done)[0][0] == len(names), timeout=240, what="every task completing")
    assert sampler.samples > 20
    assert sampler.max_running <= MAX_RUNNING and sampler.max_per_domain <= PER_DOMAIN, vars(sampler)
    assert sampler.max_running == MAX_RUNNING  # the cap was reached, not just respected
    assert any(m.startswith("waits for budget 'power' (") for m in sampler.waiting_messages), vars(sampler)
