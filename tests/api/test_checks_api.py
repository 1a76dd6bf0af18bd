"""The pre-flight check RPCs through an in-process gRPC server: shapes of the three kinds, defaults, bad
input naming the field (and writing nothing), NOT_FOUND, ALREADY_EXISTS, updates by mask, the override of
one task's checks, the operator role and the audit rows."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from google.protobuf.field_mask_pb2 import FieldMask

from rackflow.cli.main import main as cli_main
from rackflow.domain.checks import CheckResult
from rackflow.domain.inventory import Rack
from rackflow.services import Services
from rackflow.store import checks as check_store
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN, bearer, secured_server
from tests.api.test_windows_api import expect
from tests.conftest import table_counts


@pytest.fixture
async def racks(services: Services) -> list[Rack]:
    r1 = await services.inventory.create_rack("r1")
    r2 = await services.inventory.create_rack("r2")
    await services.inventory.create_domain("nvl-a", [r2.id])
    return [r1, r2]


def alerts(name: str = "no-alerts", **fields: Any) -> pb.PreflightCheck:
    kind = pb.AlertmanagerCheck(url="http://127.0.0.1:9093", matchers=['rack="{rack.name}"'])
    return pb.PreflightCheck(**{"name": name, "alertmanager": kind, **fields})


def hook(**settings: Any) -> pb.PreflightCheck:
    return pb.PreflightCheck(
        name="drained", webhook=pb.WebhookCheck(**{"url": "http://127.0.0.1:1/", **settings})
    )


def idle(**settings: Any) -> pb.PreflightCheck:
    return pb.PreflightCheck(name="idle", rack_idle=pb.RackIdleCheck(**settings))


async def create(stub: FlowStub, check: pb.PreflightCheck) -> pb.PreflightCheck:
    created: pb.PreflightCheck = await stub.CreatePreflightCheck(pb.CreatePreflightCheckRequest(check=check))
    return created


async def test_create_get_list_and_delete(stub: FlowStub, racks: list[Rack]) -> None:
    am = await create(
        stub,
        alerts(
            operations=["upgrade_firmware"],
            racks=[pb.WindowTarget(name="r1")],
            nvl_domains=[pb.WindowTarget(name="nvl-a")],
        ),
    )
    assert am.alertmanager.fail_closed and list(am.alertmanager.matchers) == ['rack="{rack.name}"']
    assert (am.interval, am.max_wait) == ("30s", "1h")  # the defaults
    assert [t.name for t in am.racks] == ["r1"] and [t.name for t in am.nvl_domains] == ["nvl-a"]
    drained = await create(stub, hook(secret="env:DRAIN_KEY"))
    assert (drained.webhook.timeout, drained.webhook.secret) == ("10s", "env:DRAIN_KEY")
    busy = await create(stub, idle(busy_operations=["power_reset"], failed_within="1h"))
    assert list(busy.rack_idle.busy_operations) == ["power_reset"] and not busy.racks
    assert await stub.GetPreflightCheck(pb.GetPreflightCheckRequest(id=am.id)) == am
    listed = await stub.ListPreflightChecks(pb.ListPreflightChecksRequest())
    assert [c.name for c in listed.checks] == ["drained", "idle", "no-alerts"]
    await stub.DeletePreflightCheck(pb.DeletePreflightCheckRequest(id=am.id))
    listed = await stub.ListPreflightChecks(pb.ListPreflightChecksRequest())
    assert [c.name for c in listed.checks] == ["drained", "idle"]


@pytest.mark.parametrize(
    ("check", "field"),
    [
        (alerts(name=""), "check.name"),
        (pb.PreflightCheck(name="x"), "check.kind"),
        (alerts(operations=["reboot"]), "check.operations[0]"),
        (alerts(operations=["power_on", "power_on"]), "check.operations[1]"),
        (alerts(racks=[pb.WindowTarget()]), "check.racks[0]"),
        (alerts(nvl_domains=[pb.WindowTarget(id=pb.UUID(id="nope"))]), "check.nvl_domains[0].id"),
        (alerts(interval="soon"), "check.interval"),
        (alerts(interval="1ms"), "check.interval"),
        (alerts(max_wait="-1m"), "check.max_wait"),
        (pb.PreflightCheck(name="x", alertmanager=pb.AlertmanagerCheck(url="")), "check.alertmanager.url"),
        (
            pb.PreflightCheck(name="x", alertmanager=pb.AlertmanagerCheck(url="ftp://h")),
            "check.alertmanager.url",
        ),
        (
            pb.PreflightCheck(name="x", alertmanager=pb.AlertmanagerCheck(url="http://[::1")),
            "check.alertmanager.url",
        ),
        (
            pb.PreflightCheck(name="x", alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=[""])),
            "check.alertmanager.matchers[0]",
        ),
        (
            pb.PreflightCheck(
                name="x", alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=['a="1"', "bad"])
            ),
            "check.alertmanager.matchers[1]",
        ),
        (
            pb.PreflightCheck(
                name="x",
                alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=['rack=~"(r{rack.name}"']),
            ),
            "check.alertmanager.matchers[0]",
        ),
        (
            # A misspelled placeholder was kept as text: the check asked for `rack="{rack.nam}"`, which no
            # alert matches, and let every rack through.
            pb.PreflightCheck(
                name="x",
                alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=['a="1"', 'rack="{rack.nam}"']),
            ),
            "check.alertmanager.matchers[1]",
        ),
        (
            pb.PreflightCheck(
                name="x", alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=["serial={rack.serial}"])
            ),
            "check.alertmanager.matchers[0]",
        ),
        (
            # No matchers: every alert in Alertmanager held every task (a log server's DiskFull too).
            pb.PreflightCheck(name="x", alertmanager=pb.AlertmanagerCheck(url="http://h")),
            'check.alertmanager.matchers: give at least one matcher; for any alert, say so: alertname=~".+"',
        ),
        (hook(url="localhost:80"), "check.webhook.url"),
        (hook(secret="hunter2"), "check.webhook.secret"),
        (hook(timeout="2m"), "check.webhook.timeout"),
        (hook(timeout="0s"), "check.webhook.timeout"),
        (idle(), "check.rack_idle"),
        (idle(busy_operations=["reboot"]), "check.rack_idle.busy_operations[0]"),
        (idle(busy_operations=["power_on", "power_on"]), "check.rack_idle.busy_operations[1]"),
        (idle(failed_within="often"), "check.rack_idle.failed_within"),
        # Evaluated at every claim of a task: lists without end were stored and walked for each one.
        (
            pb.PreflightCheck(
                name="x", alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=['a="1"'] * 33)
            ),
            "check.alertmanager.matchers: at most 32 matchers, got 33",
        ),
        (
            alerts(racks=[pb.WindowTarget(name=f"r{i}") for i in range(10_001)]),
            "check.racks: at most 10000 racks, got 10001",
        ),
        (
            alerts(nvl_domains=[pb.WindowTarget(name=f"d{i}") for i in range(10_001)]),
            "check.nvl_domains: at most 10000 NVLink domains, got 10001",
        ),
    ],
)
async def test_bad_create_names_the_field_and_writes_nothing(
    stub: FlowStub, services: Services, check: pb.PreflightCheck, field: str
) -> None:
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, create(stub, check))
    assert await table_counts(services.db) == before


async def test_unknown_racks_names_and_ids(stub: FlowStub, services: Services, racks: list[Rack]) -> None:
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "check.racks[1]",
        create(stub, alerts(racks=[pb.WindowTarget(name="r1"), pb.WindowTarget(name="r9")])),
    )
    await create(stub, alerts())
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.ALREADY_EXISTS, "check.name", create(stub, alerts()))
    assert await table_counts(services.db) == before
    missing = pb.UUID(id=str(uuid.uuid4()))
    await expect(
        grpc.StatusCode.NOT_FOUND, "id", stub.GetPreflightCheck(pb.GetPreflightCheckRequest(id=missing))
    )
    await expect(
        grpc.StatusCode.NOT_FOUND, "id", stub.DeletePreflightCheck(pb.DeletePreflightCheckRequest(id=missing))
    )
    request = pb.UpdatePreflightCheckRequest(
        id=missing, check=alerts(interval="1m"), update_mask=FieldMask(paths=["check.interval"])
    )
    await expect(grpc.StatusCode.NOT_FOUND, "id", stub.UpdatePreflightCheck(request))


async def test_update_by_mask(stub: FlowStub, services: Services, racks: list[Rack]) -> None:
    created = await create(stub, alerts(racks=[pb.WindowTarget(name="r1")]))

    async def update(paths: list[str], check: pb.PreflightCheck) -> pb.PreflightCheck:
        request = pb.UpdatePreflightCheckRequest(
            id=created.id, check=check, update_mask=FieldMask(paths=paths)
        )
        updated: pb.PreflightCheck = await stub.UpdatePreflightCheck(request)
        return updated

    slower = await update(
        ["check.interval", "check.max_wait"], pb.PreflightCheck(interval="1m", max_wait="2h")
    )
    assert (slower.interval, slower.max_wait, slower.name) == ("1m", "2h", "no-alerts")
    assert slower.WhichOneof("kind") == "alertmanager" and [t.name for t in slower.racks] == ["r1"]
    hooked = await update(["check.kind", "check.racks"], hook(url="http://127.0.0.1:2/"))
    assert hooked.WhichOneof("kind") == "webhook" and not hooked.racks
    await create(stub, alerts("other"))
    before = await table_counts(services.db)
    for paths, check, code, field in (
        ([], pb.PreflightCheck(), grpc.StatusCode.INVALID_ARGUMENT, "update_mask"),
        (["check.color"], pb.PreflightCheck(), grpc.StatusCode.INVALID_ARGUMENT, "update_mask"),
        (["check.kind"], pb.PreflightCheck(), grpc.StatusCode.INVALID_ARGUMENT, "check.kind"),
        (
            ["check.kind"],
            pb.PreflightCheck(alertmanager=pb.AlertmanagerCheck(url="http://h")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "check.alertmanager.matchers",
        ),
        (
            ["check.interval"],
            pb.PreflightCheck(interval="x"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "check.interval",
        ),
        (["check.name"], pb.PreflightCheck(name="other"), grpc.StatusCode.ALREADY_EXISTS, "check.name"),
        (
            ["check.kind"],
            pb.PreflightCheck(alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=["severity"])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "check.alertmanager.matchers[0]",
        ),
        (
            ["check.racks"],
            pb.PreflightCheck(racks=[pb.WindowTarget(name="r1")] * 10_001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "check.racks: at most 10000 racks, got 10001",
        ),
        (
            ["check.nvl_domains"],
            pb.PreflightCheck(nvl_domains=[pb.WindowTarget(name="nvl-a")] * 10_001),
            grpc.StatusCode.INVALID_ARGUMENT,
            "check.nvl_domains: at most 10000 NVLink domains, got 10001",
        ),
        (
            ["check.kind"],
            pb.PreflightCheck(alertmanager=pb.AlertmanagerCheck(url="http://h", matchers=['a="1"'] * 33)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "check.alertmanager.matchers: at most 32 matchers, got 33",
        ),
    ):
        request = pb.UpdatePreflightCheckRequest(
            id=created.id, check=check, update_mask=FieldMask(paths=paths)
        )
        await expect(code, field, stub.UpdatePreflightCheck(request))
    assert await table_counts(services.db) == before


async def test_override_of_a_task_s_checks(stub: FlowStub, services: Services, racks: list[Rack]) -> None:
    submitted = await stub.PowerOnRack(
        pb.PowerOnRackRequest(
            target_spec=pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="r1")]))
        )
    )
    task_id = submitted.task_ids[0]
    hook = pb.WebhookCheck(url="http://127.0.0.1:9/drain")
    drained = await stub.CreatePreflightCheck(
        pb.CreatePreflightCheckRequest(check=pb.PreflightCheck(name="drained", webhook=hook))
    )
    before = await table_counts(services.db)
    for request, code, field in (
        (pb.OverridePreflightChecksRequest(task_id=task_id), grpc.StatusCode.INVALID_ARGUMENT, "reason"),
        (pb.OverridePreflightChecksRequest(reason="x"), grpc.StatusCode.INVALID_ARGUMENT, "task_id"),
        (
            pb.OverridePreflightChecksRequest(task_id=pb.UUID(id=str(uuid.uuid4())), reason="x"),
            grpc.StatusCode.NOT_FOUND,
            "task_id",
        ),
        (
            pb.OverridePreflightChecksRequest(task_id=task_id, reason="x", checks=["no-such-check"]),
            grpc.StatusCode.NOT_FOUND,
            "checks[0]",
        ),
        (
            pb.OverridePreflightChecksRequest(task_id=task_id, reason="x", checks=["drained", ""]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "checks[1]",
        ),
        (
            pb.OverridePreflightChecksRequest(task_id=task_id, reason="x", checks=["drained", "drained"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "checks",
        ),
    ):
        await expect(code, field, stub.OverridePreflightChecks(request))
    assert await table_counts(services.db) == before
    one = await stub.OverridePreflightChecks(
        pb.OverridePreflightChecksRequest(task_id=task_id, reason="INC-1: hook down", checks=[drained.id.id])
    )
    assert one.status == pb.TASK_STATUS_PENDING
    assert (await table_counts(services.db))["preflight_overrides"] == 1
    task = await stub.OverridePreflightChecks(
        pb.OverridePreflightChecksRequest(task_id=task_id, reason="INC-1: stale")
    )
    assert task.id == task_id and task.status == pb.TASK_STATUS_PENDING
    await stub.CancelTask(pb.CancelTaskRequest(task_id=task_id))
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        "task_id",
        stub.OverridePreflightChecks(pb.OverridePreflightChecksRequest(task_id=task_id, reason="again")),
    )


async def test_a_check_whose_racks_were_all_deleted_says_it_covers_no_rack(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    hook = pb.WebhookCheck(url="http://127.0.0.1:9/drain")
    made = await stub.CreatePreflightCheck(
        pb.CreatePreflightCheckRequest(
            check=pb.PreflightCheck(name="drained", webhook=hook, racks=[pb.WindowTarget(name="r1")])
        )
    )
    everywhere = await stub.CreatePreflightCheck(
        pb.CreatePreflightCheckRequest(check=pb.PreflightCheck(name="everywhere", webhook=hook))
    )
    assert not made.covers_no_rack and not everywhere.covers_no_rack
    await services.inventory.delete_rack(racks[0].id)
    got = await stub.GetPreflightCheck(pb.GetPreflightCheckRequest(id=made.id))
    assert list(got.racks) == [] and list(got.nvl_domains) == [] and got.covers_no_rack
    assert not (await stub.GetPreflightCheck(pb.GetPreflightCheckRequest(id=everywhere.id))).covers_no_rack


async def test_a_task_s_view_lists_its_checks_answers_in_their_last_round(
    stub: FlowStub, services: Services, racks: list[Rack]
) -> None:
    """GetTasksByIDs (what `rackflow task show` and the console's task page read) lists each check's answer
    in the task's last round, by check name: the held reason alone said only the first failing check's,
    and a fail-open pass on an Alertmanager that could not be asked said "passed"."""
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name="r1")]))
    (task_id,) = (await stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=target))).task_ids
    task = uuid.UUID(task_id.id)
    (listed,) = (await stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[task_id]))).tasks
    assert list(listed.checks) == []  # no check applies: none asked
    now = services.clock.now()
    first = [
        round_result(task, "drained", 1, passed=False, reason="webhook: not drained yet", at=now),
        round_result(task, "alerts", 1, passed=True, reason="alertmanager: no matching alert", at=now),
    ]
    later = now + timedelta(seconds=30)
    second = [
        round_result(task, "drained", 2, passed=True, reason="webhook: ready", at=later),
        round_result(
            task, "alerts", 2, passed=True, reason="alertmanager: cannot ask (fail_closed is off)", at=later
        ),
    ]
    async with services.db.transaction() as conn:
        await check_store.record_rounds_in_claim(conn, [(None, first)])
        waiting = (await check_store.gate_read(conn, [task], ())).waiting[task]
        await check_store.record_rounds_in_claim(conn, [(waiting, second)])
    (shown,) = (await stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[task_id]))).tasks
    assert [(c.check, c.round, c.passed, c.reason) for c in shown.checks] == [
        ("alerts", 2, True, "pre-flight check 'alerts': alertmanager: cannot ask (fail_closed is off)"),
        ("drained", 2, True, "pre-flight check 'drained': webhook: ready"),
    ]
    assert shown.checks[0].checked_at.ToDatetime(tzinfo=UTC) == later
    (in_list,) = (await stub.ListTasks(pb.ListTasksRequest())).tasks  # lists leave them out
    assert list(in_list.checks) == []


def round_result(
    task: uuid.UUID, check: str, round_: int, *, passed: bool, reason: str, at: datetime
) -> CheckResult:
    """A stored answer of `check` (its id derived from its name) in round `round_` of `task`'s checks."""
    return CheckResult(
        task_id=task,
        check_id=uuid.uuid5(uuid.NAMESPACE_DNS, check),
        check_name=check,
        attempt=round_,
        passed=passed,
        reason=f"pre-flight check {check!r}: {reason}",
        checked_at=at,
        recheck_at=at + timedelta(seconds=30),
    )


async def test_changes_need_the_operator_role_and_are_audited(services: Services) -> None:
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        secured = FlowStub(channel)
        request = pb.CreatePreflightCheckRequest(check=alerts())
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await secured.CreatePreflightCheck(request, metadata=bearer(VIEWER_TOKEN))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        created = await secured.CreatePreflightCheck(request, metadata=bearer(OPERATOR_TOKEN))
        update = pb.UpdatePreflightCheckRequest(
            id=created.id, check=alerts(interval="5s"), update_mask=FieldMask(paths=["check.interval"])
        )
        await secured.UpdatePreflightCheck(update, metadata=bearer(OPERATOR_TOKEN))
        await secured.DeletePreflightCheck(
            pb.DeletePreflightCheckRequest(id=created.id), metadata=bearer(OPERATOR_TOKEN)
        )
        await secured.ListPreflightChecks(pb.ListPreflightChecksRequest(), metadata=bearer(VIEWER_TOKEN))
        override = pb.OverridePreflightChecksRequest(task_id=pb.UUID(id=str(uuid.uuid4())), reason="x")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await secured.OverridePreflightChecks(override, metadata=bearer(VIEWER_TOKEN))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        listed = await secured.ListAuditEvents(pb.ListAuditEventsRequest(), metadata=bearer(VIEWER_TOKEN))
    events = [e for e in listed.events if "PreflightCheck" in e.method]
    assert sorted((e.method, e.principal, e.outcome) for e in events) == [
        ("CreatePreflightCheck", "dashboard", "PERMISSION_DENIED"),  # refused by role: in the trail too
        ("CreatePreflightCheck", "oncall", "OK"),
        ("DeletePreflightCheck", "oncall", "OK"),
        ("OverridePreflightChecks", "dashboard", "PERMISSION_DENIED"),
        ("UpdatePreflightCheck", "oncall", "OK"),
    ]
    assert all(created.id in e.target_ids for e in events if e.outcome == "OK")


@pytest.mark.parametrize(
    ("check", "field"),
    [
        (hook(url="http://drain:hunter2@127.0.0.1:1/"), "check.webhook.url"),
        (
            pb.PreflightCheck(
                name="x", alertmanager=pb.AlertmanagerCheck(url="http://am:hunter2@127.0.0.1:1")
            ),
            "check.alertmanager.url",
        ),
    ],
)
async def test_a_url_with_a_user_and_password_is_refused_without_quoting_it(
    stub: FlowStub, services: Services, check: pb.PreflightCheck, field: str
) -> None:
    """A check sends no credentials from its URL: urllib read `user:password@host` as a host it could not
    resolve, so every task the check applied to was held, with the password in its reason (the task's
    message, the logs), until the maximum wait failed it; and the API, the audit trail and the reason
    showed it. It is refused, and the refusal does not quote it."""
    before = await table_counts(services.db)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await create(stub, check)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.value.details() or "").startswith(field)
    assert "hunter2" not in (info.value.details() or "")
    assert await table_counts(services.db) == before


async def test_a_url_s_query_values_are_shown_hidden_and_kept_whole(services: Services) -> None:
    """A hook or an Alertmanager proxy often takes its token in the query. The API, and the audit trail of
    the create and the update, showed it whole; they show the URL with the query's values hidden now, and
    the check keeps (and asks) it whole. Written back as shown (an API client that read the check and
    changes its timeout), it keeps the stored URL; a shown URL given anew is refused, not stored with "…"
    for a token."""
    secret_url = "http://127.0.0.1:1/drain?token=abc123&region=eu"
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        secured = FlowStub(channel)
        created = await secured.CreatePreflightCheck(
            pb.CreatePreflightCheckRequest(check=hook(url=secret_url)), metadata=bearer(OPERATOR_TOKEN)
        )
        assert created.webhook.url == "http://127.0.0.1:1/drain?token=…&region=…"
        got = await secured.GetPreflightCheck(
            pb.GetPreflightCheckRequest(id=created.id), metadata=bearer(VIEWER_TOKEN)
        )
        got.webhook.timeout = "3s"
        update = pb.UpdatePreflightCheckRequest(
            id=created.id, check=got, update_mask=FieldMask(paths=["check.kind"])
        )
        updated = await secured.UpdatePreflightCheck(update, metadata=bearer(OPERATOR_TOKEN))
        assert (updated.webhook.url, updated.webhook.timeout) == (created.webhook.url, "3s")
        stored = await services.checks.get(uuid.UUID(created.id.id))
        assert stored.settings.url == secret_url  # type: ignore[union-attr]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await secured.CreatePreflightCheck(
                pb.CreatePreflightCheckRequest(
                    check=pb.PreflightCheck(name="copy", webhook=pb.WebhookCheck(url=created.webhook.url))
                ),
                metadata=bearer(OPERATOR_TOKEN),
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (info.value.details() or "").startswith("check.webhook.url: ")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            bad = pb.PreflightCheck(name="x", webhook=pb.WebhookCheck(url="ftp://h/?token=abc123"))
            await secured.CreatePreflightCheck(
                pb.CreatePreflightCheckRequest(check=bad), metadata=bearer(OPERATOR_TOKEN)
            )
        assert "abc123" not in (info.value.details() or "")
        listed = await secured.ListAuditEvents(pb.ListAuditEventsRequest(), metadata=bearer(VIEWER_TOKEN))
    events = [e for e in listed.events if "PreflightCheck" in e.method]
    assert sorted(e.method for e in events) == ["CreatePreflightCheck"] * 3 + ["UpdatePreflightCheck"]
    assert "abc123" not in text_format.MessageToString(listed, as_utf8=True)
    assert "token=…" in text_format.MessageToString(listed, as_utf8=True)


async def test_the_cli_says_how_to_ask_for_any_alert_when_a_check_has_no_matcher(
    grpc_server: str, services: Services
) -> None:
    """`rackflow check create --alertmanager URL` without `--matcher` made a check every alert in that
    Alertmanager held every task with; it is refused, saying how to ask for that on purpose, which works."""
    runner = CliRunner()
    base = ["--server", grpc_server, "check", "create", "quiet", "--alertmanager", "http://am:9093"]
    refused = await asyncio.to_thread(runner.invoke, cli_main, base)
    assert refused.exit_code == 1, refused.output
    assert (
        'check.alertmanager.matchers: give at least one matcher; for any alert, say so: alertname=~".+"'
        in refused.stderr
    )
    assert await services.checks.list_checks() == []
    created = await asyncio.to_thread(runner.invoke, cli_main, [*base, "--matcher", 'alertname=~".+"'])
    assert created.exit_code == 0, created.output
    assert [c.settings.matchers for c in await services.checks.list_checks()] == [('alertname=~".+"',)]
