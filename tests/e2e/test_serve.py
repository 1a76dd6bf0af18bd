"""`rackflow serve` as a user meets it: reflection for grpcurl, health, a rack powered off end to end."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from rackflow.v1 import flow_pb2 as pb
from tests.conftest import sqlite_copy
from tests.e2e.cluster import servers
from tests.e2e.fleet import create_racks, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    return sqlite_copy(sqlite_template, tmp_path)


def test_reflection_lists_the_flow_service_as_grpcurl_sees_it(sqlite_url: str, tmp_path: Path) -> None:
    with servers(sqlite_url, tmp_path, 1) as (server,):
        channel = grpc.insecure_channel(server.address)
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert "rackflow.v1.Flow" in services
        assert "grpc.health.v1.Health" in services
        methods = {
            m.name
            for m in ProtoReflectionDescriptorDatabase(channel)
            .FindFileContainingSymbol("rackflow.v1.Flow")
            .service[0]
            .method
        }
        assert {
            "CreateTaskSchedule",
            "PowerOffRack",
            "PreviewScheduleSpec",
            "ListTaskScheduleRuns",
        } <= methods
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="rackflow.v1.Flow")
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_a_rack_created_over_grpc_is_powered_off(sqlite_url: str, tmp_path: Path) -> None:
    with servers(sqlite_url, tmp_path, 1) as (server,):
        stub = server.stub()
        (rack,) = create_racks(stub, ["r1"], components_per_rack=3)
        target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="r1")]))
        (task_id,) = stub.PowerOffRack(pb.PowerOffRackRequest(target_spec=target)).task_ids

        def task() -> pb.Task:
            return stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[task_id])).tasks[0]

        wait_until(lambda: task().status == pb.TASK_STATUS_COMPLETED, timeout=20, what="the task to complete")
        after = stub.GetRack(pb.GetRackRequest(id=rack.id))
        assert [c.power_state for c in after.components] == ["off", "off", "off"]


def serve_until_exit(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`rackflow serve` on a port it picks itself, for a start-up that is expected to fail."""
    command = [
        sys.executable,
        "-m",
        "rackflow",
        "serve",
        "--db",
        db_url,
        "--listen",
        "127.0.0.1:0",
    ]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on, for as long as the block runs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_serve_refuses_an_unmigrated_database(tmp_path: Path) -> None:
    result = serve_until_exit(f"sqlite:///{tmp_path}/empty.db")
    assert result.returncode == 1
    assert "has no rackflow schema" in result.stderr
    assert "rackflow db migrate" in result.stderr


def test_serve_refuses_a_taken_http_port(sqlite_url: str) -> None:
    with taken_port() as port:
        result = serve_until_exit(sqlite_url, "--http-listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"error: --http-listen: cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_a_grpc_port_another_server_listens_on(
    sqlite_url: str, sqlite_template: Path, tmp_path: Path
) -> None:
    """gRPC binds with SO_REUSEPORT unless told not to: a second `rackflow serve` on a taken --listen (a
    forgotten instance, `make run` twice) started as if the port were its own, and the kernel split the
    clients' connections between the two servers and their databases."""
    other = sqlite_copy(sqlite_template, tmp_path, "other.db")
    with servers(sqlite_url, tmp_path, 1) as [first]:
        result = serve_until_exit(other, "--listen", first.address)
    assert result.returncode == 1, result.stderr
    assert f"error: --listen: cannot listen on {first.address}: the address is in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_a_taken_grpc_port(sqlite_url: str) -> None:
    with taken_port() as port:
        result = serve_until_exit(sqlite_url, "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert f"error: --listen: cannot listen on 127.0.0.1:{port}: the address is in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_refuses_a_taken_metrics_port_before_it_starts_anything(sqlite_url: str) -> None:
    """The metrics port was bound last, after the dispatcher had started; its error named neither the
    option nor the address ("[Errno 98] Address already in use") and the exit printed a traceback."""
    with taken_port() as port:
        result = serve_until_exit(sqlite_url, "--metrics-listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    taken_error = f"error: --metrics-listen: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert taken_error in result.stderr
    assert "Traceback" not in result.stderr
    assert "dispatcher started" not in result.stderr
