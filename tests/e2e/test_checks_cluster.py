"""Pre-flight checks with two real `rackflow serve` processes on one PostgreSQL: a drain hook (a real HTTP
receiver) that flips between "not ready" and "ready" while tasks are submitted through both instances.
Every task completes; none started twice (one attempt each); each started only after a round whose checks
all passed (its last round, stored in the database); and no round of any task was asked twice — the two
checkers never asked the same question at once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.checks_support import Answer, receiving
from tests.e2e.cluster import servers, sql
from tests.e2e.fleet import create_racks, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.xdist_group("heavy-postgres")]

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
