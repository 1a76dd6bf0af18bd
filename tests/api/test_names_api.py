"""A name that would not show as itself (an invisible, format or control character, a space at either end,
not in NFC) is refused on every create and rename of racks, NVLink domains, schedules, windows, budgets,
pre-flight checks and notification channels, naming the field and the character's code point, and writes
nothing; a name stored before the rule keeps working: it is found, shown and kept by an edit that sends it
back unchanged, as the console's forms do, and it can be renamed to one that is visible."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from rackflow import validation
from rackflow.services import Services
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.conftest import table_counts

INVISIBLE = "r12\u200b"  # prints as "r12"
REVERSED = "r\u202e21"  # prints as "r12" in a terminal that honours the override
BAD_NAMES = [
    (INVISIBLE, "U+200B ZERO WIDTH SPACE at position 4"),
    (REVERSED, "U+202E RIGHT-TO-LEFT OVERRIDE at position 2"),
    ("r1\u00a02", "U+00A0 NO-BREAK SPACE at position 3"),
    ("cafe\u0301", "not in Unicode normal form NFC"),
]


@dataclass(frozen=True)
class Kind:
    """One kind of named object: how to create one named so, and how to send an update that gives it a
    name together with another field (`None`: it has no update)."""

    field: str
    create: Callable[[FlowStub, str], Awaitable[Any]]
    update: Callable[[FlowStub, Any, str], Awaitable[Any]] | None = None


def _schedule_config(name: str) -> pb.ScheduleConfig:
    return pb.ScheduleConfig(
        name=name,
        spec=pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h"),
        overlap_policy=pb.OVERLAP_POLICY_SKIP,
    )


def _window(name: str) -> pb.MaintenanceWindow:
    recurring = pb.RecurringWindow(cron="0 22 * * 6", duration="6h", timezone="Europe/Berlin")
    return pb.MaintenanceWindow(name=name, kind=pb.WINDOW_KIND_ALLOW, recurring=recurring, reason="agreed")


def _budget(name: str) -> pb.OperationBudget:
    return pb.OperationBudget(name=name, operations=["upgrade_firmware"], max_running=4)


def _check(name: str) -> pb.PreflightCheck:
    return pb.PreflightCheck(name=name, rack_idle=pb.RackIdleCheck(failed_within="1h"))


def _channel(name: str) -> pb.NotificationChannel:
    return pb.NotificationChannel(
        name=name, kind="webhook", url="https://hooks.example.com/rf", min_severity="info"
    )


KINDS = {
    "rack": Kind("name", lambda stub, name: stub.CreateRack(pb.CreateRackRequest(name=name))),
    "rack external_id": Kind(
        "external_id",
        lambda stub, name: stub.CreateRack(pb.CreateRackRequest(name="r9", external_id=name)),
    ),
    "component": Kind(
        "components[0].name",
        lambda stub, name: stub.CreateRack(
            pb.CreateRackRequest(
                name="r9", components=[pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name=name)]
            )
        ),
    ),
    "NVLink domain": Kind(
        "name", lambda stub, name: stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name=name))
    ),
    "schedule": Kind(
        "schedule.name",
        lambda stub, name: stub.CreateTaskSchedule(
            pb.CreateTaskScheduleRequest(
                schedule=_schedule_config(name),
                operation=pb.ScheduledOperation(
                    power_on=pb.PowerOnRackRequest(
                        target_spec=pb.OperationTargetSpec(
                            racks=pb.RackTargets(targets=[pb.RackTarget(name="r1")])
                        )
                    )
                ),
            )
        ),
        lambda stub, made, name: stub.UpdateTaskSchedule(
            pb.UpdateTaskScheduleRequest(
                id=made.id,
                schedule=_schedule_config(name),
                update_mask=FieldMask(paths=["schedule.name", "schedule.spec"]),
            )
        ),
    ),
    "window": Kind(
        "window.name",
        lambda stub, name: stub.CreateMaintenanceWindow(
            pb.CreateMaintenanceWindowRequest(window=_window(name))
        ),
        lambda stub, made, name: stub.UpdateMaintenanceWindow(
            pb.UpdateMaintenanceWindowRequest(
                id=made.id,
                window=_window(name),
                update_mask=FieldMask(paths=["window.name", "window.reason"]),
            )
        ),
    ),
    "budget": Kind(
        "budget.name",
        lambda stub, name: stub.CreateOperationBudget(pb.CreateOperationBudgetRequest(budget=_budget(name))),
        lambda stub, made, name: stub.UpdateOperationBudget(
            pb.UpdateOperationBudgetRequest(
                id=made.id,
                budget=_budget(name),
                update_mask=FieldMask(paths=["budget.name", "budget.max_running"]),
            )
        ),
    ),
    "pre-flight check": Kind(
        "check.name",
        lambda stub, name: stub.CreatePreflightCheck(pb.CreatePreflightCheckRequest(check=_check(name))),
        lambda stub, made, name: stub.UpdatePreflightCheck(
            pb.UpdatePreflightCheckRequest(
                id=made.id, check=_check(name), update_mask=FieldMask(paths=["check.name", "check.kind"])
            )
        ),
    ),
    "notification channel": Kind(
        "channel.name",
        lambda stub, name: stub.CreateNotificationChannel(
            pb.CreateNotificationChannelRequest(channel=_channel(name))
        ),
        lambda stub, made, name: stub.UpdateNotificationChannel(
            pb.UpdateNotificationChannelRequest(
                id=made.id,
                channel=_channel(name),
                update_mask=FieldMask(paths=["channel.name", "channel.min_severity"]),
            )
        ),
    ),
}
UPDATED = {kind: KINDS[kind] for kind in KINDS if KINDS[kind].update is not None}


@pytest.fixture
async def rack(services: Services) -> None:
    await services.inventory.create_rack("r1")  # the schedules' target


async def refused(call: Awaitable[Any], field: str, words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    details = info.value.details() or ""
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith(f"{field}: ") and words in details, details


@contextmanager
def before_the_rule(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Names taken as a release before the rule took them (only no whitespace at either end)."""
    with monkeypatch.context() as patched:
        patched.setattr(validation, "check_identifier", lambda value, _field: value)
        yield


@pytest.mark.parametrize(("name", "words"), BAD_NAMES, ids=[words for _, words in BAD_NAMES])
@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
async def test_a_create_with_a_name_that_does_not_show_as_itself_is_refused_and_writes_nothing(
    stub: FlowStub, services: Services, rack: None, kind: str, name: str, words: str
) -> None:
    before = await table_counts(services.db)
    await refused(KINDS[kind].create(stub, name), KINDS[kind].field, words)
    assert await table_counts(services.db) == before


@pytest.mark.parametrize(("name", "words"), BAD_NAMES[:2], ids=[words for _, words in BAD_NAMES[:2]])
@pytest.mark.parametrize("kind", UPDATED, ids=list(UPDATED))
async def test_a_rename_to_a_name_that_does_not_show_as_itself_is_refused_and_changes_nothing(
    stub: FlowStub, services: Services, rack: None, kind: str, name: str, words: str
) -> None:
    made = await KINDS[kind].create(stub, "visible")
    update = KINDS[kind].update
    assert update is not None
    before = await table_counts(services.db)
    await refused(update(stub, made, name), KINDS[kind].field, words)
    assert await table_counts(services.db) == before
    assert (await update(stub, made, "visible")).name == "visible"  # what it had: nothing was renamed


@pytest.mark.parametrize("kind", UPDATED, ids=list(UPDATED))
async def test_a_name_stored_before_the_rule_is_kept_by_an_edit_and_can_be_renamed(
    stub: FlowStub, rack: None, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    with before_the_rule(monkeypatch):
        made = await KINDS[kind].create(stub, INVISIBLE)
    update = KINDS[kind].update
    assert update is not None
    assert (await update(stub, made, INVISIBLE)).name == INVISIBLE  # the form sends it back unchanged
    await refused(update(stub, made, REVERSED), KINDS[kind].field, "U+202E")
    assert (await update(stub, made, "r12")).name == "r12"


async def test_a_rack_named_before_the_rule_is_found_by_its_name_and_listed(
    stub: FlowStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    with before_the_rule(monkeypatch):
        made = await stub.CreateRack(pb.CreateRackRequest(name=INVISIBLE))
    assert (await stub.GetRack(pb.GetRackRequest(name=INVISIBLE))).id == made.id
    await stub.CreateRack(pb.CreateRackRequest(name="r12"))  # the visible one it looks like: another rack
    listed = await stub.ListRacks(pb.ListRacksRequest())
    assert [r.name for r in listed.racks] == [INVISIBLE, "r12"]
    task = await stub.PowerOnRack(
        pb.PowerOnRackRequest(
            target_spec=pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=INVISIBLE)]))
        )
    )
    assert len(task.task_ids) == 1
