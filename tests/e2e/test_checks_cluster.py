"""Pre-flight checks with two real `rackflow serve` processes on one PostgreSQL: a drain hook (a real HTTP
receiver) that flips between "not ready" and "ready" while tasks are submitted through both instances.
Every task completes; none started twice (one attempt each); each started only after a round whose checks
all passed (its last round, stored in the database); and no round of any task was asked twice — the two
checkers never asked the same question at once.

And a `rack_idle` check, which the claims ask themselves (issue 26), flipping as each rack's other task
runs and ends: the same, and no round of a task stored after it started."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.checks_support import Answer, receiving
from tests.e2e.cluster import servers, sql
from tests.e2e.fleet import create_racks, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

RACKS = 12
NOT_READY = Answer({"ok": False, "reason": "draining", "retry_after": "150ms"})
READY = Answer({"ok": True})
# Flips: each rack is told "not ready" a few times, interleaved with other racks' "ready"s.
FLAPPING = [NOT_READY, READY, NOT_READY, NOT_READY, READY] * 12 + [READY]


def test_no_task_starts_twice_or_on_a_failing_check_with_two_instances(pg_db: str, tmp_path: Path) -> None:
    with receiving(*FLAPPING) as hook, servers(pg_db, tmp_path, 2) as (a, b):
        stub_a, stub_b = a.stub(), b.stub()
        racks = create_racks(stub_a, [f"ck-{i}" for i in range(RACKS)], components_per_rack=2)
        check = pb.PreflightCheck(
            name="drained",
            operations=["power_on"],
            webhook=pb.WebhookCheck(url=hook.url, timeout="5s"),
            interval="1s",
            max_wait="5m",
        )
        stub_b.CreatePreflightCheck(pb.CreatePreflightCheckRequest(check=check))
        for index, rack in enumerate(racks):
            stub = stub_a if index % 2 else stub_b
            target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(id=rack.id)]))
            stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target))

        def all_completed() -> bool:
            rows = sql(pg_db, "SELECT count(*) FROM tasks WHERE status = 'completed'")
            return rows[0][0] == RACKS

        wait_until(all_completed, timeout=120, what="every task completed")
        posts = hook.payloads()
    tasks = sql(pg_db, "SELECT id, attempts, started_at FROM tasks")
    assert len(tasks) == RACKS and all(attempts == 1 for _, attempts, _ in tasks)
    asked = Counter((p["task_id"], p["attempt"]) for p in posts)
    assert asked and max(asked.values()) == 1, asked.most_common(3)
    last_rounds = sql(
        pg_db,
        "SELECT r.task_id, bool_and(r.passed) FROM preflight_results r "
        "JOIN preflight_tasks w ON w.task_id = r.task_id AND w.attempt = r.attempt GROUP BY r.task_id",
    )
    assert len(last_rounds) == RACKS and all(passed for _, passed in last_rounds)
    held = sql(pg_db, "SELECT count(*) FROM preflight_results WHERE NOT passed")
    assert held[0][0] > 0  # the hook did hold some of them
    assert "pre-flight round" in a.output + b.output


def test_no_task_starts_twice_or_on_a_failing_rack_idle_check_with_two_instances(
    pg_db: str, tmp_path: Path
) -> None:
    """On each rack a power-on of the compute trays and a power reset of the NVLink switch, which the
    conflict rules let run together, but a `rack_idle` check holds either while the other runs (steps of
    0.5 s): the claims of both instances ask it, and hold one of each pair with the reason, the checkers
    release it when the other ends."""
    env = {"RACKFLOW_SIM_STEP_SECONDS": "0.5"}
    with servers(pg_db, tmp_path, 2, env=env) as (a, b):
        stub_a, stub_b = a.stub(), b.stub()
        names = [f"idle-{i}" for i in range(RACKS)]
        racks = create_racks(stub_a, names, components_per_rack=1, switches_per_rack=1)
        check = pb.PreflightCheck(
            name="one-at-a-time",
            operations=["power_on", "power_reset"],
            rack_idle=pb.RackIdleCheck(busy_operations=["power_on", "power_reset"]),
            interval="200ms",
            max_wait="5m",
        )
        stub_b.CreatePreflightCheck(pb.CreatePreflightCheckRequest(check=check))
        for index, rack in enumerate(racks):
            first, second = (stub_a, stub_b) if index % 2 else (stub_b, stub_a)

            def on(types: list[int], rack: pb.Rack = rack) -> pb.OperationTargetSpec:
                target = pb.RackTarget(id=rack.id, component_types=types)
                return pb.OperationTargetSpec(racks=pb.RackTargets(targets=[target]))

            first.PowerOnRack(pb.PowerOnRackRequest(target_spec=on([pb.COMPONENT_TYPE_COMPUTE])))
            second.PowerResetRack(pb.PowerResetRackRequest(target_spec=on([pb.COMPONENT_TYPE_NVSWITCH])))

        def all_completed() -> bool:
            rows = sql(pg_db, "SELECT count(*) FROM tasks WHERE status = 'completed'")
            return rows[0][0] == 2 * RACKS

        wait_until(all_completed, timeout=120, what="every task completed")
    tasks = sql(pg_db, "SELECT id, attempts FROM tasks")
    assert len(tasks) == 2 * RACKS and all(attempts == 1 for _, attempts in tasks)
    last_rounds = sql(
        pg_db,
        "SELECT r.task_id, bool_and(r.passed) FROM preflight_results r "
        "JOIN preflight_tasks w ON w.task_id = r.task_id AND w.attempt = r.attempt GROUP BY r.task_id",
    )
    assert len(last_rounds) == 2 * RACKS and all(passed for _, passed in last_rounds)
    late = sql(
        pg_db,
        "SELECT r.task_id, r.attempt FROM preflight_results r JOIN tasks t ON t.id = r.task_id "
        "WHERE r.checked_at > t.started_at",
    )
    assert late == [], "a round was stored after its task started"
    held = sql(pg_db, "SELECT count(DISTINCT task_id) FROM preflight_results WHERE NOT passed")
    assert held != [(0,)], "no claim held a task: the check never flipped"
    asked_by_claims = sql(
        pg_db,
        "SELECT count(*) FROM preflight_results r JOIN tasks t ON t.id = r.task_id "
        "WHERE r.passed AND r.checked_at = t.started_at",
    )
    assert asked_by_claims != [(0,)], "no task started on a round its claim asked"
