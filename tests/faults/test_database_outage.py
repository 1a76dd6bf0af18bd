"""PostgreSQL goes away under two busy rackflow instances, then comes back.

While schedules fire every second and their tasks run, the test database's connections are first killed
repeatedly (connections flap), then refused outright for a few seconds (the database is down), then
allowed again. Throughout, clients keep calling both instances. What must hold:

* both processes stay up, and every RPC that fails meanwhile says UNAVAILABLE ("database unavailable"),
  never INTERNAL or UNKNOWN;
* dispatching resumes within two polls of the database's return;
* no schedule loses its timing: every enabled recurring schedule still has a next_run_at, due or within
  one period, and no tick was fired twice;
* no task is lost or left RUNNING: once the schedules are paused, every task reaches a final state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import grpc
import pytest

from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.e2e.cluster import ServerProcess, servers, sql
from tests.e2e.fleet import create_racks, create_schedules, schedule_request, wait_until
from tests.faults.conftest import database_down, terminating

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

POLL = timedelta(seconds=2)
LEASE = "3s"
FLAPPING_S = 2.0
DOWN_S = 4.0
INTERVAL_SCHEDULES = 4
ACTIVE = ("waiting", "pending", "running")


@dataclass
class Traffic:
    """Clients calling every instance in a loop (two reads and a write); every answer is recorded."""

    stubs: list[flow_pb2_grpc.FlowStub]
    answers: list[tuple[grpc.StatusCode, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        made = 0
        while not self.stop.is_set():
            for stub in self.stubs:
                made += 1
                self._call(stub.ListTaskSchedules, pb.ListTaskSchedulesRequest())
                self._call(stub.ListTasks, pb.ListTasksRequest(active_only=True))
                self._call(stub.CreateRack, pb.CreateRackRequest(name=f"traffic-{made}"))
            time.sleep(0.05)

    def _call(self, method: Callable[..., object], request: object) -> None:
        try:
            method(request, timeout=10)
        except grpc.RpcError as exc:
            self.answers.append((exc.code(), exc.details() or ""))
        else:
            self.answers.append((grpc.StatusCode.OK, ""))


@pytest.fixture
def cluster(pg_db: str, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    args = ["--dispatch-interval", f"{POLL.total_seconds():g}s", "--lease-ttl", LEASE]
    with servers(pg_db, tmp_path, 2, args=args, env={"RACKFLOW_SIM_STEP_SECONDS": "0.3"}) as started:
        yield started


def _db_now(db_url: str) -> datetime:
    now = sql(db_url, "SELECT clock_timestamp()")[0][0]
    assert isinstance(now, datetime)
    return now


def test_instances_ride_out_a_database_outage(pg_db: str, cluster: list[ServerProcess]) -> None:
    stub = cluster[0].stub()
    racks = [f"rack-{i}" for i in range(INTERVAL_SCHEDULES + 1)]
    create_racks(stub, racks, components_per_rack=3)
    interval, cron = pb.SCHEDULE_SPEC_TYPE_INTERVAL, pb.SCHEDULE_SPEC_TYPE_CRON
    requests = [
        schedule_request(f"every-second-{i}", [rack], spec_type=interval, spec="1s")
        for i, rack in enumerate(racks[:-1])
    ]
    requests.append(
        schedule_request(
            "queued", [racks[-1]], spec_type=interval, spec="1s", overlap=pb.OVERLAP_POLICY_QUEUE
        )
    )
    requests.append(schedule_request("minutely", racks[:2], spec_type=cron, spec="* * * * *"))
    schedules = create_schedules(stub, requests)
    wait_until(
        lambda: sql(pg_db, "SELECT count(*) FROM tasks WHERE status = 'running'")[0][0] > 0,
        timeout=20,
        what="scheduled tasks running",
    )

    traffic = Traffic([server.stub() for server in cluster])
    clients = threading.Thread(target=traffic.run, name="traffic", daemon=True)
    clients.start()
    try:
        with terminating(pg_db) as killed:
            time.sleep(FLAPPING_S)
        with database_down(pg_db):
            time.sleep(DOWN_S)
        back = _db_now(pg_db)
        resumed_s = wait_until(
            lambda: sql(pg_db, "SELECT count(*) FROM task_schedule_run WHERE fired_at > %s", back)[0][0] > 0,
            timeout=30,
            interval=0.1,
            what="a firing after the database came back",
        )
        wait_until(
            lambda: traffic.answers[-1][0] == grpc.StatusCode.OK, timeout=10, what="RPCs answered again"
        )
    finally:
        traffic.stop.set()
        clients.join(15)

    for server in cluster:
        assert server.proc.poll() is None, f"rackflow died in the outage:\n{server.output[-5000:]}"
    assert sum(killed) > 0, "the terminator never found a connection to kill"
    failures = [(code, details) for code, details in traffic.answers if code != grpc.StatusCode.OK]
    assert failures, "no RPC felt the outage: the test did not test anything"
    wrong = [(code.name, details) for code, details in failures if code != grpc.StatusCode.UNAVAILABLE]
    assert not wrong, f"RPCs failed with other codes than UNAVAILABLE: {wrong[:5]}"
    assert all("database unavailable" in details for _, details in failures), failures[:5]
    assert resumed_s <= 2 * POLL.total_seconds(), f"dispatching resumed {resumed_s:.1f}s after the database"

    _assert_timings_kept(pg_db)
    _assert_no_tick_fired_twice(pg_db)

    for schedule in schedules:
        stub.PauseTaskSchedule(pb.PauseTaskScheduleRequest(id=schedule.id))
    wait_until(
        lambda: sql(pg_db, "SELECT count(*) FROM tasks WHERE status = ANY(%s)", list(ACTIVE))[0][0] == 0,
        timeout=60,
        what="every task to reach a final state",
    )


def _assert_timings_kept(db_url: str) -> None:
    """Every enabled recurring schedule is due, or due within one period: none lost, none pushed away."""
    now = _db_now(db_url)
    rows = sql(db_url, "SELECT name, spec_type, next_run_at FROM task_schedule WHERE enabled")
    assert len(rows) == INTERVAL_SCHEDULES + 2
    for name, spec_type, next_run_at in rows:
        assert isinstance(next_run_at, datetime), f"{name} lost its next_run_at"
        period = timedelta(seconds=1) if spec_type == "interval" else timedelta(minutes=1)
        assert next_run_at <= now + period + POLL, (
            f"{name}: next_run_at {next_run_at} is past {now} + {period}"
        )


def _assert_no_tick_fired_twice(db_url: str) -> None:
    twice = sql(
        db_url,
        """SELECT schedule_id, scheduled_for, count(*) FROM task_schedule_run WHERE trigger = 'dispatch'
           GROUP BY schedule_id, scheduled_for HAVING count(*) > 1""",
    )
    assert twice == [], f"ticks fired more than once: {twice}"


# What the firing logs as its submission, then its write-back, fail for the outage (`schedules.firing`).
MET_THE_OUTAGE = ("firing batch of 1 scope(s): submit outcome unknown", "write-back of 1 run(s) failed")


def test_a_firing_cut_off_by_the_outage_does_not_stay_running(pg_db: str, tmp_path: Path) -> None:
    """The database goes down between a firing's claim (phase 1) and its submissions and write-back
    (phases 2-3). The tick is spent, as designed (at most once); but once the database is back, its run
    must not claim to be "running" forever: the operator has to see what became of it."""
    env = {"RACKFLOW_FAILPOINT_PAUSE_AFTER_CLAIM": "2s"}
    args = ["--dispatch-interval", "1s", "--lease-ttl", "15s"]
    with servers(pg_db, tmp_path, 1, args=args, env=env) as (server,):
        stub = server.stub()
        create_racks(stub, ["cut-off"])
        create_schedules(
            stub,
            [schedule_request("cut-off", ["cut-off"], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h")],
        )
        sql(pg_db, "UPDATE task_schedule SET next_run_at = clock_timestamp()")  # due now
        wait_until(
            lambda: "failpoint pause_after_claim: pausing" in server.output, timeout=10, what="the claim"
        )
        with database_down(pg_db):  # until the pause has ended, and submission and write-back met it
            wait_until(
                lambda: all(line in server.output for line in MET_THE_OUTAGE),
                timeout=30,
                what="the firing's submission and write-back to meet the outage",
            )
        wait_until(
            lambda: server.proc.poll() is not None or _runs_settled(pg_db),
            timeout=10,
            what="the cut-off run to be completed or marked interrupted",
        )
        assert server.proc.poll() is None, server.output[-5000:]
        (next_run_at,) = sql(pg_db, "SELECT next_run_at FROM task_schedule")[0]
        assert isinstance(next_run_at, datetime) and next_run_at > _db_now(pg_db) + timedelta(minutes=50)


def _runs_settled(db_url: str) -> bool:
    return sql(db_url, "SELECT count(*) FROM task_schedule_run WHERE state = 'running'")[0][0] == 0
