"""Notifications with two real `rackflow serve` processes on one PostgreSQL: a channel created with the CLI
(its secret from the environment), tasks that fail through both instances, and both delivery loops
claiming at once against a slow receiver. Every failed task's event reaches the receiver exactly once,
signed, each delivery in one attempt."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, servers, sql
from tests.e2e.fleet import create_racks, wait_until
from tests.receiver import receiving

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.xdist_group("heavy-postgres")]

RACKS = 16
SECRET = "e2e-hmac-key"


def rackflow(server: ServerProcess, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "rackflow", "--server", server.address, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "E2E_SECRET": SECRET},
    )
    assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result.stdout


def test_two_instances_deliver_each_event_once(pg_db: str, tmp_path: Path) -> None:
    names = [f"nt-{i:02d}" for i in range(RACKS)]
    env = {"RACKFLOW_SIM_FAIL_IDS": ",".join(f"{n}-c0" for n in names)}
    with receiving() as receiver, servers(pg_db, tmp_path, 2, env=env) as (a, b):
        receiver.delay = 0.05
        created = json.loads(
            rackflow(
                a, "notify", "create", "e2e", "--kind", "webhook", "--url", receiver.url,
                "--secret-env", "E2E_SECRET", "--event", "task.failed", "--rate-per-minute", "6000",
                "-o", "json",
            )
        )  # fmt: skip
        assert (created["has_secret"], created["secret"]) == (True, "")
        create_racks(a.stub(), names)
        for i, name in enumerate(names):
            stub = (a if i % 2 else b).stub()
            target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=name)]))
            stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target), timeout=30)

        def all_delivered() -> bool:
            rows = sql(pg_db, "SELECT count(*) FROM notification_delivery WHERE state = 'delivered'")
            return rows[0][0] == RACKS

        wait_until(all_delivered, timeout=60, what="every failed task's event delivered")
    ids = [r.headers["X-Rackflow-Event-Id"] for r in receiver.received]
    assert len(ids) == RACKS and len(set(ids)) == RACKS, "an event was delivered twice"
    for got in receiver.received:
        signed = got.headers["X-Rackflow-Timestamp"].encode() + b"." + got.body
        expected = "sha256=" + hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
        assert got.headers["X-Rackflow-Signature"] == expected
        assert got.json()["type"] == "task.failed" and got.json()["rack"].startswith("nt-")
    assert sql(pg_db, "SELECT max(attempts) FROM notification_delivery") == [(1,)]  # no failure, no retry
    assert "Traceback" not in a.output + b.output
