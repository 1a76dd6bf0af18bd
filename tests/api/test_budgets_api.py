"""The five operation budget RPCs through an in-process gRPC server: shapes, bad input naming the field
(and writing nothing), NOT_FOUND, ALREADY_EXISTS, updates by mask, the operator role and the audit rows."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from rackflow.domain.inventory import RackSelection
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.services import Services
from rackflow.store import task_runs
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN, bearer, secured_server
from tests.api.test_windows_api import expect
from tests.conftest import table_counts


def fw(name: str = "fw", **fields: Any) -> pb.OperationBudget:
    return pb.OperationBudget(
        **{"name": name, "operations": ["upgrade_firmware"], "max_running": 8, **fields}
    )


async def create(stub: FlowStub, budget: pb.OperationBudget) -> pb.OperationBudget:
    created: pb.OperationBudget = await stub.CreateOperationBudget(
        pb.CreateOperationBudgetRequest(budget=budget)
    )
    return created


async def test_create_get_list_and_delete(stub: FlowStub) -> None:
    created = await create(stub, fw(max_running_per_domain=2))
    assert (created.name, list(created.operations), created.max_running) == ("fw", ["upgrade_firmware"], 8)
    assert created.HasField("max_running_per_domain") and created.max_running_per_domain == 2
    power = await create(stub, fw("power", operations=["power_on", "power_off"], max_running=20))
    assert not power.HasField("max_running_per_domain")
    assert list(power.operations) == ["power_off", "power_on"]
    assert await stub.GetOperationBudget(pb.GetOperationBudgetRequest(id=created.id)) == created
    listed = await stub.ListOperationBudgets(pb.ListOperationBudgetsRequest())
    assert [b.name for b in listed.budgets] == ["fw", "power"]
    await stub.DeleteOperationBudget(pb.DeleteOperationBudgetRequest(id=created.id))
    listed = await stub.ListOperationBudgets(pb.ListOperationBudgetsRequest())
    assert [b.name for b in listed.budgets] == ["power"]


async def test_a_returned_budget_says_how_many_of_its_tasks_run_now(
    stub: FlowStub, services: Services
) -> None:
    """Counted fleet-wide and in its fullest NVLink domain (a rack in none is a domain of its own), only its
    operations, whoever's tasks; on every call that returns it."""
    racks = [(await services.inventory.create_rack(f"r{i}")).id for i in range(5)]
    await services.inventory.create_domain("d1", racks[:2])
    created = await create(
        stub, fw("power", operations=["power_off"], max_running=5, max_running_per_domain=2)
    )
    assert (created.running, created.running_in_fullest_domain) == (0, 0)
    power_off = await services.tasks.submit(
        Operation(OperationKind.POWER_OFF),
        [RackSelection(r) for r in racks[:4]],
        description="",
        queue=QueueOptions(),
    )
    (bring_up,) = await services.tasks.submit(
        Operation(OperationKind.BRING_UP), [RackSelection(racks[4])], description="", queue=QueueOptions()
    )
    async with services.db.transaction() as conn:
        for task in [*power_off[:3], bring_up]:
            await task_runs.mark_running(conn, task.id, owner_id=uuid.uuid4(), now=services.clock.now())
    got = await stub.GetOperationBudget(pb.GetOperationBudgetRequest(id=created.id))
    assert (got.running, got.running_in_fullest_domain) == (3, 2)
    (listed,) = (await stub.ListOperationBudgets(pb.ListOperationBudgetsRequest())).budgets
    assert listed == got
    mask = FieldMask(paths=["budget.max_running"])
    updated = await stub.UpdateOperationBudget(
        pb.UpdateOperationBudgetRequest(id=created.id, budget=fw(max_running=9), update_mask=mask)
    )
    assert (updated.max_running, updated.running, updated.running_in_fullest_domain) == (9, 3, 2)


@pytest.mark.parametrize(
    ("budget", "field"),
    [
        (fw(name=""), "budget.name"),
        (fw(operations=[]), "budget.operations"),
        (fw(operations=["reboot"]), "budget.operations[0]"),
        (fw(operations=["power_on", "power_on"]), "budget.operations[1]"),
        (fw(max_running=0), "budget.max_running"),
        (fw(max_running=-3), "budget.max_running"),
        (fw(max_running_per_domain=0), "budget.max_running_per_domain"),
    ],
)
async def test_bad_create_names_the_field_and_writes_nothing(
    stub: FlowStub, services: Services, budget: pb.OperationBudget, field: str
) -> None:
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, create(stub, budget))
    assert await table_counts(services.db) == before


async def test_duplicate_name_is_already_exists_and_writes_nothing(
    stub: FlowStub, services: Services
) -> None:
    await create(stub, fw())
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.ALREADY_EXISTS, "budget.name", create(stub, fw(max_running=2)))
    assert await table_counts(services.db) == before


async def test_unknown_ids_are_not_found(stub: FlowStub) -> None:
    missing = pb.UUID(id=str(uuid.uuid4()))
    await expect(
        grpc.StatusCode.NOT_FOUND, "id", stub.GetOperationBudget(pb.GetOperationBudgetRequest(id=missing))
    )
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "id",
        stub.DeleteOperationBudget(pb.DeleteOperationBudgetRequest(id=missing)),
    )
    request = pb.UpdateOperationBudgetRequest(
        id=missing, budget=fw(max_running=3), update_mask=FieldMask(paths=["budget.max_running"])
    )
    await expect(grpc.StatusCode.NOT_FOUND, "id", stub.UpdateOperationBudget(request))
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "id",
        stub.GetOperationBudget(pb.GetOperationBudgetRequest(id=pb.UUID(id="x"))),
    )


async def test_update_by_mask(stub: FlowStub, services: Services) -> None:
    created = await create(stub, fw(max_running_per_domain=2))

    async def update(paths: list[str], **fields: Any) -> pb.OperationBudget:
        request = pb.UpdateOperationBudgetRequest(
            id=created.id, budget=pb.OperationBudget(**fields), update_mask=FieldMask(paths=paths)
        )
        updated: pb.OperationBudget = await stub.UpdateOperationBudget(request)
        return updated

    raised = await update(["budget.max_running"], max_running=12)
    assert (raised.name, raised.max_running, raised.max_running_per_domain) == ("fw", 12, 2)
    unset = await update(["budget.max_running_per_domain"])
    assert not unset.HasField("max_running_per_domain") and unset.max_running == 12
    renamed = await update(
        ["budget.name", "budget.operations"], name="fw-and-power", operations=["power_off"]
    )
    assert (renamed.name, list(renamed.operations)) == ("fw-and-power", ["power_off"])
    await create(stub, fw("other"))
    before = await table_counts(services.db)
    request = pb.UpdateOperationBudgetRequest(
        id=created.id, budget=pb.OperationBudget(name="other"), update_mask=FieldMask(paths=["budget.name"])
    )
    await expect(grpc.StatusCode.ALREADY_EXISTS, "budget.name", stub.UpdateOperationBudget(request))
    for paths, budget, field in (
        ([], pb.OperationBudget(), "update_mask"),
        (["budget.color"], pb.OperationBudget(), "update_mask"),
        (["budget.max_running"], pb.OperationBudget(max_running=0), "budget.max_running"),
        (["budget.operations"], pb.OperationBudget(), "budget.operations"),
    ):
        request = pb.UpdateOperationBudgetRequest(
            id=created.id, budget=budget, update_mask=FieldMask(paths=paths)
        )
        await expect(grpc.StatusCode.INVALID_ARGUMENT, field, stub.UpdateOperationBudget(request))
    assert await table_counts(services.db) == before
    got = await stub.GetOperationBudget(pb.GetOperationBudgetRequest(id=created.id))
    assert (got.name, got.max_running) == ("fw-and-power", 12)


async def test_changes_need_the_operator_role_and_are_audited(services: Services) -> None:
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        secured = FlowStub(channel)
        request = pb.CreateOperationBudgetRequest(budget=fw())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await secured.CreateOperationBudget(request, metadata=bearer(VIEWER_TOKEN))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        created = await secured.CreateOperationBudget(request, metadata=bearer(OPERATOR_TOKEN))
        update = pb.UpdateOperationBudgetRequest(
            id=created.id, budget=fw(max_running=4), update_mask=FieldMask(paths=["budget.max_running"])
        )
        await secured.UpdateOperationBudget(update, metadata=bearer(OPERATOR_TOKEN))
        await secured.DeleteOperationBudget(
            pb.DeleteOperationBudgetRequest(id=created.id), metadata=bearer(OPERATOR_TOKEN)
        )
        await secured.ListOperationBudgets(pb.ListOperationBudgetsRequest(), metadata=bearer(VIEWER_TOKEN))
        listed = await secured.ListAuditEvents(pb.ListAuditEventsRequest(), metadata=bearer(VIEWER_TOKEN))
    budget_events = [e for e in listed.events if "OperationBudget" in e.method]
    assert sorted((e.method, e.principal, e.outcome) for e in budget_events) == [
        ("CreateOperationBudget", "dashboard", "PERMISSION_DENIED"),  # refused by role: in the trail too
        ("CreateOperationBudget", "oncall", "OK"),
        ("DeleteOperationBudget", "oncall", "OK"),
        ("UpdateOperationBudget", "oncall", "OK"),
    ]
    assert all(created.id in e.target_ids for e in budget_events if e.outcome == "OK")
