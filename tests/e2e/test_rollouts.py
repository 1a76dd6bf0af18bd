"""Rollouts with real `rackflow serve` processes on one PostgreSQL: the caps hold while tasks run (the
active tasks sampled continuously from the database), SIGKILL of the instance driving a rollout leaves
another to finish it with no rack started twice, and the simulator's failure injection halts a rollout at
its threshold, with the reason and the schedule paused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.e2e.cluster import Sampler, servers, sql, start_server
from tests.e2e.fleet import create_racks, schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

DOMAINS = 3
PER_DOMAIN = 4
LEASE = {"RACKFLOW_LEASE_TTL": "3s"}


def _fleet(stub: flow_pb2_grpc.FlowStub) -> list[str]:
    names = [f"ro-{d}-{i}" for d in range(DOMAINS) for i in range(PER_DOMAIN)]
    racks = create_racks(stub, names)
    for d in range(DOMAINS):
        ids = [r.id for r in racks if r.name.startswith(f"ro-{d}-")]
        stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name=f"dom-{d}", rack_ids=ids))
    return names


def _rollout_schedule(
    stub: flow_pb2_grpc.FlowStub, names: list[str], policy: pb.RolloutPolicy, name: str = "fw"
) -> pb.TaskSchedule:
    request = schedule_request(name, names, spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h")
    request.schedule.rollout.CopyFrom(policy)
    return stub.CreateTaskSchedule(request)


class ActiveSampler(Sampler):
    """Samples the run's active tasks (and their domains)."""

    query = (
        "SELECT r.nvl_domain_id FROM tasks t JOIN racks r ON r.id = t.rack_id "
        "WHERE t.run_id IS NOT NULL AND t.status IN ('pending', 'running', 'waiting')"
    )
    max_active = 0
    max_per_domain = 0

    def observe(self, rows: list[tuple[object, ...]]) -> None:
        self.max_active = max(self.max_active, len(rows))
        self.max_per_domain = max(self.max_per_domain, max(Counter(rows).values(), default=0))


def test_caps_hold_and_another_instance_finishes_after_a_sigkill(pg_db: str, tmp_path: Path) -> None:
    env = {**LEASE, "RACKFLOW_SIM_STEP_SECONDS": "0.4"}
    victim = start_server(pg_db, tmp_path, name="victim", args=["--migrate"], env=env)
    try:
        stub = victim.stub()
        names = _fleet(stub)
        policy = pb.RolloutPolicy(max_concurrent_racks=3, max_per_domain=1, canary_racks=1)
        schedule = _rollout_schedule(stub, names, policy)
        with servers(pg_db, tmp_path, 1, env=env) as (survivor,), ActiveSampler(pg_db) as sampler:
            (canary,) = stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id)).task_ids
            started = "SELECT count(*) FROM tasks WHERE schedule_id = %s"
            wait_until(
                lambda: sql(pg_db, started, schedule.id.id)[0][0] >= 4, timeout=60, what="the 2nd wave"
            )
            victim.kill()
            run_state = "SELECT state FROM task_schedule_run WHERE schedule_id = %s"
            wait_until(
                lambda: sql(pg_db, run_state, schedule.id.id) == [("completed",)],
                timeout=120,
                what="the survivor completing the rollout",
            )
            runs = survivor.stub().ListTaskScheduleRuns(
                pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)
            )
    finally:
        victim.kill()
    assert sampler.samples > 20
    assert sampler.max_active <= 3 and sampler.max_per_domain <= 1, vars(sampler)
    assert sampler.max_active == 3  # the cap was reached, not just respected
    (run,) = runs.runs
    assert run.progress.succeeded == len(names) and run.progress.total == len(names)
    per_rack = sql(pg_db, "SELECT rack_id, count(*) FROM tasks WHERE run_id = %s GROUP BY rack_id", run.id.id)
    assert len(per_rack) == len(names) and {n for _, n in per_rack} == {1}, "a rack started twice or never"
    assert run.outcomes[0].task_id == canary and run.outcomes[0].canary


def test_injected_failures_halt_the_rollout_and_pause_the_schedule(pg_db: str, tmp_path: Path) -> None:
    # The racks' one component each is `<rack>-c0`; two of the first wave fail.
    env = {"RACKFLOW_SIM_STEP_SECONDS": "0.2", "RACKFLOW_SIM_FAIL_IDS": "ro-0-1-c0,ro-1-1-c0"}
    with servers(pg_db, tmp_path, 1, args=["--migrate"], env=env) as (server,):
        stub = server.stub()
        names = _fleet(stub)
        schedule = _rollout_schedule(
            stub, names, pb.RolloutPolicy(max_concurrent_racks=2, halt_after_failures=2)
        )
        stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))

        def halted() -> bool:
            runs = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs
            return runs[0].state == "halted" and runs[0].progress.active == 0

        wait_until(halted, timeout=60, what="the rollout halting")
        (run,) = stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)).runs
        assert run.reason == f"rollout halted: 2 of {len(names)} racks failed (limit 2)"
        assert run.progress.failed == 2 and run.progress.not_started > 0
        assert not stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id)).enabled
        failed = {o.rack_id.id for o in run.outcomes if o.task_status == pb.TASK_STATUS_FAILED}
        assert len(failed) == 2

        # Resume: failures count from zero again, the rest roll out (the 2 failed racks stay failed).
        resumed = stub.ResumeTaskScheduleRun(pb.ResumeTaskScheduleRunRequest(id=run.id))
        assert resumed.state == "rolling" and resumed.progress.failures_counted == 0
        wait_until(
            lambda: stub.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id)).state == "completed",
            timeout=60,
            what="the resumed rollout completing",
        )
        done = stub.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id))
        assert (done.progress.succeeded, done.progress.failed) == (len(names) - 2, 2)
