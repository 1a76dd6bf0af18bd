"""Fuzzing every RPC with hypothesis: bad input gets a proper status code, is refused quickly, writes nothing.

For each RPC of the `Flow` service, on SQLite and on PostgreSQL, hypothesis sends requests drawn by
`tests.api.fuzz_requests` to an in-process server over a small seeded inventory, and checks each answer:

* the status is never INTERNAL or UNKNOWN (a bug), nor RESOURCE_EXHAUSTED (a message too long for the
  client), nor DEADLINE_EXCEEDED (bad input must be refused quickly, not after a slow query);
* a refused request leaves every table exactly as it was: row by row, not just the counts, so a partial
  update is caught as well as a partial insert.

Requests that succeed change the database as they should, and the next request starts from there.
Separately, requests over a documented limit are refused as INVALID_ARGUMENT without one SQL statement.
"""

from __future__ import annotations

import functools
import hashlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Table, update

from rackflow.domain.tasks import TaskStatus
from rackflow.store.db import Database
from rackflow.store.tables import components, metadata, tasks
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.api.fuzz_requests import Known, requests_by_rpc
from tests.conftest import stored_rows, write_back_rows
from tests.store.query_plans import statements_sent

RPCS = sorted(pb.DESCRIPTOR.services_by_name["Flow"].methods_by_name)
# x 64 RPCs x 2 databases: about 2,000 requests a run, drawn anew each run (no example database), so the
# runs add up; RACKFLOW_FUZZ_EXAMPLES asks for a deeper pass (30 a RPC until the suite's time needed it).
EXAMPLES_PER_RPC = int(os.environ.get("RACKFLOW_FUZZ_EXAMPLES", "16"))
CALL_TIMEOUT_S = 10.0
ACTIVE = [s.value for s in (TaskStatus.WAITING, TaskStatus.PENDING, TaskStatus.RUNNING)]
BUGS = {
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # a message the client refused (tests/api/test_long_messages)
}


@functools.cache
def _table_digests(dialect: str) -> str:
    """One statement answering, for every table, a text that changes when any of its rows does: each row
    as text (PostgreSQL: its md5; SQLite: its columns quoted), sorted and joined. One round trip per
    fingerprint, where a SELECT of each table took ten times as long (11 against 1.2 ms on PostgreSQL)."""

    def rows_text(table: Table) -> str:
        if dialect == "postgresql":
            row = "md5(x::text)"
            return f"SELECT coalesce(string_agg({row}, '' ORDER BY {row}), '') FROM \"{table.name}\" x"
        row = " || ',' || ".join(f'quote("{c.name}")' for c in table.columns)
        ordered = f'SELECT {row} AS r FROM "{table.name}" ORDER BY r'
        return f"SELECT coalesce(group_concat(r, char(30)), '') FROM ({ordered})"

    return " UNION ALL ".join(f"SELECT '{t.name}', ({rows_text(t)})" for t in metadata.sorted_tables)


async def fingerprint(db: Database) -> str:
    """A digest of every row of every table: equal digests mean nothing was written."""
    digest = hashlib.sha256()
    async with db.read() as conn:
        for name, rows in (await conn.exec_driver_sql(_table_digests(db.dialect))).all():
            digest.update(name.encode())
            digest.update(rows.encode())
    return digest.hexdigest()


async def call(stub: flow_pb2_grpc.FlowStub, rpc: str, request: Message) -> tuple[grpc.StatusCode, str]:
    try:
        await getattr(stub, rpc)(request, timeout=CALL_TIMEOUT_S)
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


def _rack_spec(name: str, *types: int) -> pb.CreateRackRequest:
    components = [
        pb.ComponentSpec(type=t, name=f"{name}-{i}", external_id=f"{name}-ext-{i}", firmware_version="1.0")
        for i, t in enumerate(types)
    ]
    return pb.CreateRackRequest(name=name, external_id=f"{name}-ext", components=components)


async def seed(stub: flow_pb2_grpc.FlowStub) -> Known:
    """Three racks (one in a domain), two schedules with scopes, and a pending task."""
    known = Known()
    types = (pb.COMPONENT_TYPE_COMPUTE, pb.COMPONENT_TYPE_NVSWITCH, pb.COMPONENT_TYPE_POWERSHELF)
    for i in range(3):
        rack = await stub.CreateRack(_rack_spec(f"fz-{i}", *types))
        known.rack_ids.append(rack.id.id)
        known.rack_names.append(rack.name)
        known.rack_external_ids.append(rack.external_id)
        known.component_ids += [c.id.id for c in rack.components]
        known.component_external_ids += [c.external_id for c in rack.components]
    domain = await stub.CreateNVLDomain(
        pb.CreateNVLDomainRequest(name="fz-dom", rack_ids=[pb.UUID(id=known.rack_ids[0])])
    )
    known.domain_ids.append(domain.id.id)
    known.domain_names.append(domain.name)

    def on_racks(*names: str, types: tuple[int, ...] = ()) -> pb.OperationTargetSpec:
        targets = [pb.RackTarget(name=n, component_types=types) for n in names]
        return pb.OperationTargetSpec(racks=pb.RackTargets(targets=targets))

    specs = [
        (
            "fz-interval",
            pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h"),
            on_racks("fz-0", "fz-1"),
        ),
        (
            "fz-cron",
            pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 3 * * *", timezone="Europe/Paris"),
            on_racks("fz-2", types=(pb.COMPONENT_TYPE_COMPUTE,)),
        ),
    ]
    for name, spec, target in specs:
        schedule = await stub.CreateTaskSchedule(
            pb.CreateTaskScheduleRequest(
                schedule=pb.ScheduleConfig(name=name, spec=spec),
                operation=pb.ScheduledOperation(power_reset=pb.PowerResetRackRequest(target_spec=target)),
            )
        )
        known.schedule_ids.append(schedule.id.id)
        known.schedule_names.append(name)
        scopes = await stub.ListTaskScheduleScopes(pb.ListTaskScheduleScopesRequest(schedule_id=schedule.id))
        known.scope_ids += [s.id.id for s in scopes.scopes]
    submitted = await stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=on_racks("fz-1")))
    known.task_ids += [t.id for t in submitted.task_ids]
    window = await stub.CreateMaintenanceWindow(
        pb.CreateMaintenanceWindowRequest(
            window=pb.MaintenanceWindow(
                name="fz-window",
                kind=pb.WINDOW_KIND_ALLOW,
                recurring=pb.RecurringWindow(cron="0 22 * * 6", duration="6h", timezone="Europe/Berlin"),
                racks=[pb.WindowTarget(name="fz-0")],
            )
        )
    )
    known.window_ids.append(window.id.id)
    known.window_names.append(window.name)
    budget = await stub.CreateOperationBudget(
        pb.CreateOperationBudgetRequest(
            budget=pb.OperationBudget(name="fz-budget", operations=["upgrade_firmware"], max_running=8)
        )
    )
    known.budget_ids.append(budget.id.id)
    known.budget_names.append(budget.name)
    channel = await stub.CreateNotificationChannel(
        pb.CreateNotificationChannelRequest(
            channel=pb.NotificationChannel(name="fz-channel", kind="webhook", url="http://127.0.0.1:9/")
        )
    )
    known.channel_ids.append(channel.id.id)
    known.channel_names.append(channel.name)
    check = await stub.CreatePreflightCheck(
        pb.CreatePreflightCheckRequest(
            check=pb.PreflightCheck(
                name="fz-check", rack_idle=pb.RackIdleCheck(busy_operations=["power_reset"])
            )
        )
    )
    known.check_ids.append(check.id.id)
    known.check_names.append(check.name)
    return known


@dataclass
class Seeded:
    """What `seed` left in one database: its names and ids, every table's rows as `stored_rows` read them,
    and the request strategies over them (building every RPC's strategies is not cheap)."""

    known: Known
    rows: dict[str, Any]
    requests: dict[str, st.SearchStrategy[Message]]


@pytest.fixture(scope="module")
def seeded() -> dict[str, Seeded]:
    """The seeded database by dialect, once per module and worker: each test's empty database gets the same
    rows written back (a few milliseconds), where seeding it through gRPC took 0.135 s of CPU and building
    the strategies 0.08 s, paid by each of 128 tests. The same rows keep the same ids, so one `Known`."""
    return {}


@pytest.fixture
async def known(stub: flow_pb2_grpc.FlowStub, db: Database, seeded: dict[str, Seeded]) -> Known:
    if (done := seeded.get(db.dialect)) is None:
        known = await seed(stub)
        seeded[db.dialect] = Seeded(known, await stored_rows(db), requests_by_rpc(known))
        return known
    await write_back_rows(db, done.rows)
    return done.known


class Fuzzing:
    """One test's state across its examples: the request strategies over the seeded database, and the
    fingerprint the last refusal left (still current, since a refusal writes nothing), so most examples
    read the database once rather than twice."""

    def __init__(self, requests: dict[str, st.SearchStrategy[Message]]) -> None:
        self.requests = requests
        self.fingerprint: str | None = None

    def __repr__(self) -> str:  # hypothesis prints it with every failing example
        return "<fuzzing over the seeded database>"


@pytest.fixture
def fuzzing(known: Known, db: Database, seeded: dict[str, Seeded]) -> Fuzzing:
    return Fuzzing(seeded[db.dialect].requests)


async def test_the_fingerprint_changes_with_any_row_and_only_then(
    stub: flow_pb2_grpc.FlowStub, db: Database
) -> None:
    empty = await fingerprint(db)
    assert await fingerprint(db) == empty
    await stub.CreateRack(_rack_spec("fp-0", pb.COMPONENT_TYPE_COMPUTE))
    created = await fingerprint(db)
    assert created != empty
    async with db.transaction() as conn:  # one column of one row, as a partial update would leave it
        await conn.execute(update(components).values(firmware_version="1.1"))
    assert await fingerprint(db) not in {empty, created}


def test_every_rpc_has_a_request_strategy() -> None:
    assert sorted(requests_by_rpc(Known())) == RPCS


@pytest.mark.parametrize("rpc", RPCS)
@settings(
    max_examples=EXAMPLES_PER_RPC,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(data=st.data())
async def test_fuzzed_requests_are_answered_properly_and_refusals_write_nothing(
    rpc: str,
    data: st.DataObject,
    stub: flow_pb2_grpc.FlowStub,
    db: Database,
    fuzzing: Fuzzing,
) -> None:
    request = data.draw(fuzzing.requests[rpc], label="request")
    before = fuzzing.fingerprint or await fingerprint(db)
    fuzzing.fingerprint = None
    code, details = await call(stub, rpc, request)
    assert code not in BUGS, f"{rpc} answered {code.name} ({details}) to {request!r}"
    if code is not grpc.StatusCode.OK:
        after = await fingerprint(db)
        assert after == before, f"refused {rpc} ({code.name}: {details}) wrote to the database"
        fuzzing.fingerprint = after
    else:
        await end_active_tasks(db)


async def end_active_tasks(db: Database) -> None:
    """Free the racks again, as an executor finishing its tasks would: with no executor here, every
    submitted task would hold its rack for good, and every later submission would stop at the conflict
    check instead of reaching the deeper paths."""
    async with db.transaction() as conn:
        await conn.execute(
            update(tasks).where(tasks.c.status.in_(ACTIVE)).values(status=TaskStatus.COMPLETED.value)
        )


# --- what the fuzzing found, pinned down --------------------------------------------------------


def _on_racks(*names: str) -> pb.OperationTargetSpec:
    return pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=n) for n in names]))


FOUND: list[tuple[str, str, Callable[[Known], Message]]] = [
    # PostgreSQL cannot store or even compare text holding a NUL: each of these was INTERNAL there.
    (
        "PowerOffRack",
        "description",
        lambda k: pb.PowerOffRackRequest(target_spec=_on_racks("fz-0"), description="\x00"),
    ),
    (
        "UpgradeFirmware",
        "target_version",
        lambda k: pb.UpgradeFirmwareRequest(target_spec=_on_racks("fz-0"), target_version="2.0\x00"),
    ),
    ("PowerOnRack", "rack name", lambda k: pb.PowerOnRackRequest(target_spec=_on_racks("\x00"))),
    (
        "AddTaskScheduleScope",
        "rack name",
        lambda k: pb.AddTaskScheduleScopeRequest(
            schedule_id=pb.UUID(id=k.schedule_ids[0]), target_spec=_on_racks("fz-0\x00")
        ),
    ),
    (
        "CheckScheduleConflicts",
        "component external id",
        lambda k: pb.CheckScheduleConflictsRequest(
            operation=pb.ScheduledOperation(
                power_on=pb.PowerOnRackRequest(
                    target_spec=pb.OperationTargetSpec(
                        components=pb.ComponentTargets(
                            targets=[pb.ComponentTarget(external=pb.ExternalRef(id="\x00"))]
                        )
                    )
                )
            )
        ),
    ),
    (
        "UpdateTaskScheduleScope",
        "domain name",
        lambda k: pb.UpdateTaskScheduleScopeRequest(
            schedule_id=pb.UUID(id=k.schedule_ids[0]),
            desired_scope=pb.OperationTargetSpec(
                nvl_domains=pb.NVLDomainTargets(targets=[pb.NVLDomainTarget(name="a\x00b")])
            ),
        ),
    ),
    ("ListAuditEvents", "principal", lambda k: pb.ListAuditEventsRequest(principal="\x00")),
    # urlsplit raises ValueError on an unclosed IPv6 bracket: INTERNAL on both databases.
    (
        "CreateRack",
        "BMC url",
        lambda k: pb.CreateRackRequest(
            name="bmc-rack",
            components=[
                pb.ComponentSpec(
                    type=pb.COMPONENT_TYPE_COMPUTE,
                    name="c",
                    bmc=pb.BmcEndpoint(url="https://[::1", resource="Systems/1", credentials="env:BMC"),
                )
            ],
        ),
    ),
    # Not a crash, but a lookup no rack can answer: refused before the query, like a name on create.
    ("PowerOnRack", "over-long rack name", lambda k: pb.PowerOnRackRequest(target_spec=_on_racks("r" * 256))),
]


@pytest.mark.parametrize(("rpc", "what", "make"), FOUND, ids=[f"{r}-{w}" for r, w, _ in FOUND])
async def test_found_by_fuzzing_is_now_invalid_argument(
    rpc: str,
    what: str,
    make: Callable[[Known], Message],
    stub: flow_pb2_grpc.FlowStub,
    db: Database,
    known: Known,
) -> None:
    before = await fingerprint(db)
    code, details = await call(stub, rpc, make(known))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert await fingerprint(db) == before


# --- over the limits: refused before the database is asked -----------------------------------------


def _racks(count: int) -> pb.OperationTargetSpec:
    return pb.OperationTargetSpec(
        racks=pb.RackTargets(targets=[pb.RackTarget(name=f"r{i}") for i in range(count)])
    )


def _spec(text: str) -> pb.ScheduleSpec:
    return pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec=text)


def _schedule(name: str = "s", spec: str = "1h", targets: int = 1) -> pb.CreateTaskScheduleRequest:
    return pb.CreateTaskScheduleRequest(
        schedule=pb.ScheduleConfig(name=name, spec=_spec(spec)),
        operation=pb.ScheduledOperation(power_on=pb.PowerOnRackRequest(target_spec=_racks(targets))),
    )


SOME_ID = pb.UUID(id=str(uuid.UUID(int=7)))
TOO_MANY_SPECS = [pb.ComponentSpec()] * 10_001
PAGE_1001 = pb.Pagination(limit=1001)
OVER_LIMIT: list[tuple[str, str, Callable[[], Message]]] = [
    ("CreateRack", "name", lambda: pb.CreateRackRequest(name="r" * 256)),
    ("CreateRack", "components", lambda: pb.CreateRackRequest(name="r", components=TOO_MANY_SPECS)),
    (
        "AddComponents",
        "components",
        lambda: pb.AddComponentsRequest(rack_id=SOME_ID, components=TOO_MANY_SPECS),
    ),
    ("CreateNVLDomain", "name", lambda: pb.CreateNVLDomainRequest(name="d" * 256)),
    ("CreateNVLDomain", "rack_ids", lambda: pb.CreateNVLDomainRequest(name="d", rack_ids=[SOME_ID] * 10_001)),
    ("CreateTaskSchedule", "name", lambda: _schedule(name="s" * 256)),
    ("CreateTaskSchedule", "spec", lambda: _schedule(spec="1" * 256 + "s")),
    ("CreateTaskSchedule", "targets", lambda: _schedule(targets=10_001)),
    ("PreviewScheduleSpec", "spec", lambda: pb.PreviewScheduleSpecRequest(spec=_spec("1" * 256 + "s"))),
    ("PreviewScheduleSpec", "count", lambda: pb.PreviewScheduleSpecRequest(spec=_spec("1h"), count=101)),
    ("PowerOnRack", "targets", lambda: pb.PowerOnRackRequest(target_spec=_racks(10_001))),
    (
        "AddTaskScheduleScope",
        "targets",
        lambda: pb.AddTaskScheduleScopeRequest(schedule_id=SOME_ID, target_spec=_racks(10_001)),
    ),
    (
        "UpdateTaskScheduleScope",
        "targets",
        lambda: pb.UpdateTaskScheduleScopeRequest(schedule_id=SOME_ID, desired_scope=_racks(10_001)),
    ),
    (
        "CheckScheduleConflicts",
        "targets",
        lambda: pb.CheckScheduleConflictsRequest(operation=_schedule(targets=10_001).operation),
    ),
    ("GetTasksByIDs", "task_ids", lambda: pb.GetTasksByIDsRequest(task_ids=[SOME_ID] * 1001)),
    ("ListRacks", "pagination", lambda: pb.ListRacksRequest(pagination=PAGE_1001)),
    ("ListRacks", "ids", lambda: pb.ListRacksRequest(ids=[SOME_ID] * 1001)),
    ("ListTasks", "pagination", lambda: pb.ListTasksRequest(pagination=PAGE_1001)),
    ("ListTaskSchedules", "pagination", lambda: pb.ListTaskSchedulesRequest(pagination=PAGE_1001)),
    (
        "ListTaskScheduleRuns",
        "pagination",
        lambda: pb.ListTaskScheduleRunsRequest(schedule_id=SOME_ID, pagination=PAGE_1001),
    ),
    (
        "ListTaskScheduleScopes",
        "pagination",
        lambda: pb.ListTaskScheduleScopesRequest(schedule_id=SOME_ID, pagination=PAGE_1001),
    ),
    ("ListAuditEvents", "pagination", lambda: pb.ListAuditEventsRequest(pagination=PAGE_1001)),
    # Unbounded, 70,000 ids were one statement past PostgreSQL's 65,535 parameters: UNAVAILABLE ("database
    # unavailable: … number of parameters must be between 0 and 65535"), a retry that could never succeed.
    (
        "RedeliverNotifications",
        "delivery_ids",
        lambda: pb.RedeliverNotificationsRequest(delivery_ids=[SOME_ID] * 1001),
    ),
]


@pytest.mark.parametrize(("rpc", "limit", "make"), OVER_LIMIT, ids=[f"{r}-{f}" for r, f, _ in OVER_LIMIT])
async def test_over_a_limit_is_invalid_argument_without_touching_the_database(
    rpc: str, limit: str, make: Callable[[], Message], stub: flow_pb2_grpc.FlowStub, db: Database
) -> None:
    request = make()
    with statements_sent(db) as sent:
        code, details = await call(stub, rpc, request)
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert sent == [], f"{rpc} over its {limit} limit reached the database: {sent[:3]}"
