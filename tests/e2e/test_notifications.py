"""Notifications with real `rackflow serve` processes on one PostgreSQL: a channel created with the CLI
(its secret from the environment), tasks that fail through both instances, and both delivery loops
claiming at once against a slow receiver: every failed task's event reaches the receiver exactly once,
signed, each delivery in one attempt. And an instance SIGKILLed mid-send: its sends are made again by the
instances after it, none lost, none received more often than attempted."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections import Counter
from pathlib import Path

import pytest

from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, run_cli, servers, sql, start_server
from tests.e2e.fleet import create_racks, wait_until
from tests.receiver import receiving

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

RACKS = 16
SECRET = "e2e-hmac-key"


def rackflow(server: ServerProcess, *args: str) -> str:
    result = run_cli(server.address, *args, env={"E2E_SECRET": SECRET})
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


def _count(db_url: str, rows: str) -> int:
    return int(sql(db_url, f"SELECT count(*) FROM {rows}")[0][0])  # type: ignore[call-overload]


def test_a_killed_instances_sends_are_redelivered_and_none_is_lost(pg_db: str, tmp_path: Path) -> None:
    """SIGKILL the only instance while its sends wait on a slow receiver that also fails some: once the
    claims' lease passes, two instances started after it (sharing the work) send them again. Every event
    reaches the receiver, de-duplicating by id gives each once, and no event was received more often than
    it was attempted (a second send always follows a failure: here the kill, or a 5xx)."""
    names = [f"nk-{i:02d}" for i in range(RACKS // 2)]
    env = {"RACKFLOW_SIM_FAIL_IDS": ",".join(f"{n}-c0" for n in names)}
    args = ["--notification-send-lease", "12s"]
    with receiving() as receiver:
        receiver.delay = 3.0
        receiver.failures = [500, 503]
        first = start_server(pg_db, tmp_path, args=args, env=env, name="first")
        try:
            rackflow(
                first, "notify", "create", "kill", "--kind", "webhook", "--url", receiver.url,
                "--secret-env", "E2E_SECRET", "--event", "task.failed", "--rate-per-minute", "6000",
            )  # fmt: skip
            create_racks(first.stub(), names)
            for name in names:
                target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=name)]))
                first.stub().PowerOnRack(pb.PowerOnRackRequest(target_spec=target), timeout=30)
            wait_until(lambda: _count(pg_db, "notification_event") == len(names), timeout=60, what="events")
            wait_until(lambda: bool(receiver.sending()), timeout=30, what="a send in flight")
            first.kill()
            cut = receiver.sending()  # the killed instance never records these sends' results
        finally:
            first.kill()
        with servers(pg_db, tmp_path, 2, args=args, env=env) as (again, other):

            def all_delivered() -> bool:
                return _count(pg_db, "notification_delivery WHERE state = 'delivered'") == len(names)

            wait_until(all_delivered, timeout=90, what="every event delivered after the kill")
    events = {str(row[0]) for row in sql(pg_db, "SELECT id FROM notification_event")}
    attempts = dict(sql(pg_db, "SELECT event_id::text, attempts FROM notification_delivery"))
    received = Counter(r.headers["X-Rackflow-Event-Id"] for r in receiver.received)
    assert len(events) == len(names) and set(received) == events, "an event was lost (or invented)"
    assert cut and all(received[event] >= 2 for event in cut), "a send cut by the kill was not made again"
    for event, count in received.items():
        assert count <= attempts[event], f"{event} received {count} times in {attempts[event]} attempts"
    assert "Traceback" not in again.output + other.output
