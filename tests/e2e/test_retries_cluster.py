"""Retries with two real `rackflow serve` processes on one PostgreSQL, both executors claiming: the tasks
of two schedules with a retry policy, whose steps fail retryably on some racks (every step, as a BMC that
keeps timing out), with a refusal on others and no failure on the rest. Every retryable failure is retried
until its last attempt and no further; a refusal is not retried; each attempt is started once (sampled
from the database while they run: one owner and one claim per attempt, and the recorded attempts follow
each other in time); "task failed" is notified once per failed task, for its last attempt; and a run's
failed racks are retried through the other instance as a new run."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import Sampler, servers, sql
from tests.e2e.fleet import create_racks, schedule_request, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

MAX_ATTEMPTS = 3
RACKS = 12  # per schedule: a third fail retryably, a sixth refuse, the rest succeed


class AttemptSampler(Sampler):
    """Samples the running tasks: who runs which attempt, with how many claims."""

    query = "SELECT id, attempt, attempts, owner_id FROM tasks WHERE status = 'running'"

    def __init__(self, db_url: str) -> None:
        super().__init__(db_url)
        self.owners: dict[tuple[object, object], set[object]] = defaultdict(set)
        self.max_attempt = 0
        self.max_claims = 0

    def observe(self, rows: list[tuple[object, ...]]) -> None:
        for task_id, attempt, claims, owner in rows:
            self.owners[(task_id, attempt)].add(owner)
            self.max_attempt = max(self.max_attempt, int(str(attempt)))
            self.max_claims = max(self.max_claims, int(str(claims)))


def _kind(name: str) -> str:
    index = int(name.rsplit("-", 1)[1])
    return "transient" if index % 3 == 0 else "refused" if index % 6 == 1 else "fine"


def test_retryable_failures_are_retried_up_to_the_limit_each_attempt_started_once(
    pg_db: str, tmp_path: Path
) -> None:
    groups = {g: [f"re{g}-{i}" for i in range(RACKS)] for g in ("a", "b")}
    names = [n for group in groups.values() for n in group]
    transient = ",".join(f"{n}-c0" for n in names if _kind(n) == "transient")
    refused = ",".join(f"{n}-c0" for n in names if _kind(n) == "refused")
    env = {
        "RACKFLOW_SIM_STEP_SECONDS": "0.05",
        "RACKFLOW_SIM_TRANSIENT_IDS": transient,
        "RACKFLOW_SIM_FAIL_IDS": refused,
    }
    with servers(pg_db, tmp_path, 2, env=env) as (a, b), AttemptSampler(pg_db) as sampler:
        stub_a, stub_b = a.stub(), b.stub()
        create_racks(stub_a, names)
        schedules = []
        for stub, group in ((stub_a, "a"), (stub_b, "b")):
            request = schedule_request(
                f"retry-{group}", groups[group], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="24h"
            )
            request.schedule.retry.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=MAX_ATTEMPTS, initial_backoff="200ms", multiplier=2, max_backoff="1s"
                )
            )
            schedules.append(stub.CreateTaskSchedule(request))
        for stub, schedule in zip((stub_a, stub_b), schedules, strict=True):
            stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
        ended = "SELECT count(*) FROM tasks WHERE status IN ('completed', 'failed')"
        wait_until(lambda: sql(pg_db, ended)[0][0] == len(names), timeout=240, what="every task ending")

        rows = sql(
            pg_db,
            "SELECT r.name, t.id, t.status, t.attempt FROM tasks t JOIN racks r ON r.id = t.rack_id",
        )
        attempts: dict[object, list[tuple[object, ...]]] = defaultdict(list)
        for row in sql(
            pg_db,
            "SELECT task_id, attempt, started_at, finished_at, status, retryable FROM task_attempt "
            "ORDER BY task_id, attempt",
        ):
            attempts[row[0]].append(row[1:])
        by_kind: dict[str, set[tuple[object, object]]] = defaultdict(set)
        for name, task_id, status, attempt in rows:
            kind = _kind(str(name))
            by_kind[kind].add((status, attempt))
            recorded = attempts[task_id]
            assert [r[0] for r in recorded] == list(range(1, int(str(attempt)) + 1)), (name, recorded)
            for earlier, later in itertools.pairwise(recorded):
                assert later[1] > earlier[2], (name, recorded)  # the next attempt starts after one ended
            if kind == "transient":
                assert all(r[3] == "failed" and r[4] for r in recorded), (name, recorded)
        assert by_kind == {
            "transient": {("failed", MAX_ATTEMPTS)},
            "refused": {("failed", 1)},
            "fine": {("completed", 1)},
        }
        failed_tasks = {task_id for _, task_id, status, _ in rows if status == "failed"}
        notified = sql(pg_db, "SELECT task_id FROM notification_event WHERE type = 'task.failed'")
        assert sorted(str(r[0]) for r in notified) == sorted(str(t) for t in failed_tasks)

        # The first schedule's run, retried through the other instance: its failed racks run again.
        (run,) = stub_b.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedules[0].id)).runs
        again = stub_b.RetryTaskScheduleRun(pb.RetryTaskScheduleRunRequest(id=run.id))
        assert again.retry_of == run.id
        retried = {o.rack_id.id for o in again.outcomes}
        failed_racks = {o.rack_id.id for o in run.outcomes if o.task_status == pb.TASK_STATUS_FAILED}
        assert retried == failed_racks and len(retried) == sum(_kind(n) != "fine" for n in groups["a"])
    assert sampler.samples > 20
    assert sampler.max_attempt == MAX_ATTEMPTS
    assert sampler.max_claims == 1, vars(sampler)  # no attempt was claimed twice
    assert all(len(owners) == 1 for owners in sampler.owners.values()), sampler.owners
