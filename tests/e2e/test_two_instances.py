"""Two real `rackflow serve` processes on one PostgreSQL database: conflicts and takeover across processes.

* Both processes take conflicting submissions for the same racks at the same moment: the per-rack lock
  lets exactly one through (REJECT), or queues exactly one behind the other (QUEUE).
* A process SIGKILLed while its task is RUNNING: the other process's executor takes the task over once the
  dead one's lease (15 s) has expired, and completes it.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from rackflow.config import DEFAULT_LEASE_TTL as LEASE_TTL
from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, servers, sql, start_server
from tests.e2e.fleet import create_racks, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

RACKS = 8
SLOW_STEPS = {"RACKFLOW_SIM_STEP_SECONDS": "2"}  # tasks stay active while the test looks at them
LEASE_TTL_S = LEASE_TTL.total_seconds()


def on_rack(name: str) -> pb.OperationTargetSpec:
    return pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=name)]))


def race(
    first: ServerProcess, second: ServerProcess, racks: list[str], strategy: int
) -> list[tuple[object, object]]:
    """For every rack, power it off through `first` and on through `second`, all calls released at once.

    Returns per rack the two outcomes: the task id, or the gRPC status code of the refusal.
    """
    queue = pb.QueueOptions(conflict_strategy=strategy)
    start = threading.Barrier(2 * len(racks))
    stubs = {id(first): first.stub(), id(second): second.stub()}

    def power_off(name: str) -> object:
        request = pb.PowerOffRackRequest(target_spec=on_rack(name), queue_options=queue)
        start.wait()
        try:
            return stubs[id(first)].PowerOffRack(request, timeout=30).task_ids[0].id
        except grpc.RpcError as exc:
            return exc.code()

    def power_on(name: str) -> object:
        request = pb.PowerOnRackRequest(target_spec=on_rack(name), queue_options=queue)
        start.wait()
        try:
            return stubs[id(second)].PowerOnRack(request, timeout=30).task_ids[0].id
        except grpc.RpcError as exc:
            return exc.code()

    with ThreadPoolExecutor(2 * len(racks)) as pool:
        offs = [pool.submit(power_off, name) for name in racks]
        ons = [pool.submit(power_on, name) for name in racks]
        return [(off.result(), on.result()) for off, on in zip(offs, ons, strict=True)]


def statuses_by_rack(db_url: str, prefix: str) -> dict[str, list[str]]:
    rows = sql(
        db_url,
        "SELECT r.name, t.status FROM tasks t JOIN racks r ON r.id = t.rack_id "
        "WHERE r.name LIKE %s ORDER BY r.name, t.status",
        f"{prefix}%",
    )
    found: dict[str, list[str]] = {}
    for name, status in rows:
        found.setdefault(str(name), []).append(str(status))
    return found


def test_simultaneous_conflicting_submits_let_exactly_one_through(pg_db: str, tmp_path: Path) -> None:
    with servers(pg_db, tmp_path, 2, args=["--no-dispatcher"], env=SLOW_STEPS) as (a, b):
        names = [f"reject-{i}" for i in range(RACKS)]
        create_racks(a.stub(), names, components_per_rack=2)
        for name, outcomes in zip(names, race(a, b, names, pb.CONFLICT_STRATEGY_REJECT), strict=True):
            refused = [o for o in outcomes if o == grpc.StatusCode.FAILED_PRECONDITION]
            assert len(refused) == 1, (name, outcomes)
        by_rack = statuses_by_rack(pg_db, "reject-")
        assert sorted(by_rack) == names
        assert all(len(statuses) == 1 for statuses in by_rack.values()), by_rack


def test_simultaneous_conflicting_submits_queue_exactly_one(pg_db: str, tmp_path: Path) -> None:
    with servers(pg_db, tmp_path, 2, args=["--no-dispatcher"], env=SLOW_STEPS) as (a, b):
        names = [f"queue-{i}" for i in range(RACKS)]
        create_racks(a.stub(), names, components_per_rack=2)
        for name, outcomes in zip(names, race(a, b, names, pb.CONFLICT_STRATEGY_QUEUE), strict=True):
            assert all(isinstance(o, str) for o in outcomes), (name, outcomes)
        by_rack = statuses_by_rack(pg_db, "queue-")
        assert sorted(by_rack) == names
        for statuses in by_rack.values():
            assert "waiting" in statuses and len(statuses) == 2, by_rack
            assert {s for s in statuses if s != "waiting"} <= {"pending", "running"}, by_rack


def test_a_killed_instance_task_is_completed_by_another(pg_db: str, tmp_path: Path) -> None:
    doomed = start_server(pg_db, tmp_path, args=["--no-dispatcher"], env=SLOW_STEPS, name="doomed")
    survivor: ServerProcess | None = None
    try:
        stub = doomed.stub()
        create_racks(stub, ["victim"], components_per_rack=6)
        task_id = stub.PowerOffRack(pb.PowerOffRackRequest(target_spec=on_rack("victim"))).task_ids[0].id

        def running_on_doomed() -> bool:
            rows = sql(
                pg_db,
                "SELECT i.pid FROM tasks t JOIN instances i ON i.id = t.owner_id "
                "WHERE t.id = %s AND t.status = 'running'",
                task_id,
            )
            return bool(rows) and rows[0][0] == doomed.proc.pid

        wait_until(running_on_doomed, timeout=30, what="the task to run on the doomed instance")

        survivor = start_server(pg_db, tmp_path, args=["--no-dispatcher"], name="survivor")
        doomed.kill()
        [(status, message, attempts)] = sql(
            pg_db, "SELECT status, message, attempts FROM tasks WHERE id = %s", task_id
        )
        assert (status, attempts) == ("running", 1) and str(message).startswith("powering off")

        def completed() -> bool:
            return sql(pg_db, "SELECT status FROM tasks WHERE id = %s", task_id)[0][0] == "completed"

        wait_until(completed, timeout=LEASE_TTL_S + 30, what="another instance to complete the task")

        [(attempts, owner)] = sql(pg_db, "SELECT attempts, owner_id FROM tasks WHERE id = %s", task_id)
        assert attempts == 2 and owner is None
        states = sql(
            pg_db,
            "SELECT DISTINCT c.power_state FROM components c "
            "JOIN racks r ON r.id = c.rack_id WHERE r.name = 'victim'",
        )
        assert states == [("off",)]
        assert "taking over" in survivor.output
    finally:
        doomed.kill()
        if survivor is not None:
            survivor.stop()


def test_each_instance_lists_every_domain_as_another_left_it(pg_db: str, tmp_path: Path) -> None:
    """Each server keeps the whole domain list it read (`ListNVLDomains` of no fields) until the database's
    token says it changed (migration 0059): a change made through the other server, or by SQL, is in the
    next whole list each one answers."""

    def every_domain(server: ServerProcess) -> dict[str, list[str]]:
        listed = server.stub().ListNVLDomains(pb.ListNVLDomainsRequest(), timeout=30)
        return {domain.name: [rack_id.id for rack_id in domain.rack_ids] for domain in listed.domains}

    with servers(pg_db, tmp_path, 2, args=["--no-dispatcher"]) as (a, b):
        racks = create_racks(a.stub(), ["dom-0", "dom-1"])
        assert every_domain(a) == every_domain(b) == {}
        b.stub().CreateNVLDomain(pb.CreateNVLDomainRequest(name="d-one", rack_ids=[racks[0].id]), timeout=30)
        assert every_domain(a) == every_domain(a) == {"d-one": [racks[0].id.id]}
        a.stub().CreateNVLDomain(pb.CreateNVLDomainRequest(name="d-two", rack_ids=[racks[1].id]), timeout=30)
        b.stub().DeleteRack(pb.DeleteRackRequest(id=racks[0].id), timeout=30)
        assert every_domain(a) == every_domain(b) == {"d-one": [], "d-two": [racks[1].id.id]}
        sql(pg_db, "UPDATE racks SET nvl_domain_id = NULL")
        assert every_domain(a) == every_domain(b) == {"d-one": [], "d-two": []}
