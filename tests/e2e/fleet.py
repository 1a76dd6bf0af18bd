"""Helpers that set up racks and schedules over the real gRPC API, for end-to-end tests."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from rackflow.store.tables import components, racks, task_schedule, task_schedule_scope
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.e2e.cluster import kept_connection

_T = TypeVar("_T")
PARALLEL_RPCS = 64


def create_racks(
    stub: flow_pb2_grpc.FlowStub,
    names: Sequence[str],
    *,
    components_per_rack: int = 1,
    switches_per_rack: int = 0,
) -> list[pb.Rack]:
    """Create racks (each with COMPUTE components, and NVSWITCHes if asked), many RPCs in flight at once."""
    requests = [
        pb.CreateRackRequest(
            name=name,
            components=[
                pb.ComponentSpec(
                    type=pb.COMPONENT_TYPE_COMPUTE, name=f"{name}-c{i}", external_id=f"{name}-c{i}"
                )
                for i in range(components_per_rack)
            ]
            + [
                pb.ComponentSpec(
                    type=pb.COMPONENT_TYPE_NVSWITCH, name=f"{name}-s{i}", external_id=f"{name}-s{i}"
                )
                for i in range(switches_per_rack)
            ],
        )
        for name in names
    ]
    return _parallel(stub.CreateRack.future, requests)


def schedule_request(
    name: str,
    rack_names: Sequence[str],
    *,
    spec_type: int,
    spec: str,
    timezone: str = "",
    overlap: int = pb.OVERLAP_POLICY_SKIP,
    operation: str = "power_on",
) -> pb.CreateTaskScheduleRequest:
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=n) for n in rack_names]))
    op = pb.ScheduledOperation(**{operation: _operation_request(operation, target)})
    return pb.CreateTaskScheduleRequest(
        schedule=pb.ScheduleConfig(
            name=name,
            spec=pb.ScheduleSpec(type=spec_type, spec=spec, timezone=timezone),
            overlap_policy=overlap,
        ),
        operation=op,
    )


def _operation_request(operation: str, target: pb.OperationTargetSpec) -> object:
    classes = {
        "power_on": pb.PowerOnRackRequest,
        "power_off": pb.PowerOffRackRequest,
        "power_reset": pb.PowerResetRackRequest,
        "bring_up": pb.BringUpRackRequest,
        "ingest": pb.IngestRackRequest,
    }
    return classes[operation](target_spec=target)


def create_schedules(
    stub: flow_pb2_grpc.FlowStub, requests: Sequence[pb.CreateTaskScheduleRequest]
) -> list[pb.TaskSchedule]:
    return _parallel(stub.CreateTaskSchedule.future, requests)


def clone_schedule(db_url: str, template: str, names: Sequence[str]) -> None:
    """A schedule named after each of `names` on a rack of its own of the same name, copied row by row in
    PostgreSQL from the schedule `template` and its one rack, its rack's one component and its one scope
    entry (the template made through the API), as the benches' bulk load does (bench/_common.py): four
    statements, where making a thousand through the API cost 19 s of CPU, mostly its server's
    (docs/PERFORMANCE.md). Everything but their ids, names and external ids is the template's."""
    rack_ids = [uuid.uuid4() for _ in names]
    schedule_ids = [uuid.uuid4() for _ in names]
    new = "unnest(%(names)s::text[], %(racks)s::uuid[], %(schedules)s::uuid[]) AS n(name, rack, schedule)"
    copies = {
        racks: ({"id": "n.rack", "name": "n.name", "external_id": "n.name"}, "racks.name = %(template)s"),
        components: (
            {
                "id": "gen_random_uuid()",
                "rack_id": "n.rack",
                "name": "n.name || '-c0'",
                "external_id": "n.name || '-c0'",
            },
            "components.rack_id = (SELECT id FROM racks WHERE name = %(template)s)",
        ),
        task_schedule: ({"id": "n.schedule", "name": "n.name"}, "task_schedule.name = %(template)s"),
        task_schedule_scope: (
            {"id": "gen_random_uuid()", "schedule_id": "n.schedule", "rack_id": "n.rack"},
            "task_schedule_scope.schedule_id = (SELECT id FROM task_schedule WHERE name = %(template)s)",
        ),
    }
    params = {"names": list(names), "racks": rack_ids, "schedules": schedule_ids, "template": template}
    conn = kept_connection(db_url)
    with conn.transaction():
        for table, (replaced, where) in copies.items():
            columns = [column.name for column in table.columns]
            values = ", ".join(replaced.get(c, f'{table.name}."{c}"') for c in columns)
            quoted = ", ".join(f'"{c}"' for c in columns)
            conn.execute(
                f'INSERT INTO "{table.name}" ({quoted}) SELECT {values} FROM "{table.name}", {new} '
                f"WHERE {where}",
                params,
            )


def _parallel(call: Callable[[object], object], requests: Sequence[object]) -> list[_T]:
    results: list[_T] = []
    for start in range(0, len(requests), PARALLEL_RPCS):
        futures = [call(r) for r in requests[start : start + PARALLEL_RPCS]]
        results.extend(f.result(timeout=60) for f in futures)  # type: ignore[attr-defined]
    return results


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2, what: str = "") -> float:
    """Poll until `predicate()`; returns the seconds it took, or fails the test with `what`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
