"""Approval through the API: bad input names the field and writes nothing; the approver role; the
two-person rule by token; a trigger its approver approves; the preview's `needs_approval`; the audit rows."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result
from google.protobuf.field_mask_pb2 import FieldMask

from rackflow.cli.main import main
from rackflow.domain.approvals import UNCOUNTED
from rackflow.domain.tasks import TaskStatus
from rackflow.security import (
    Role,
    ServerTls,
    TokenEntry,
    TokenTable,
    hash_token,
    server_credentials,
)
from rackflow.server import approvers_of
from rackflow.services import Services
from rackflow.store import tasks as task_store
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.api.secured import OPERATOR_TOKEN, VIEWER_TOKEN, bearer, secured_server
from tests.api.test_schedules_api import config, expect, make_rack, power_off, racks_spec
from tests.certs import KeyPair, make_cert, make_pki
from tests.conftest import table_counts
from tests.store.query_plans import statements_sent

pytestmark = pytest.mark.asyncio

LEAD_TOKEN = "lead-secret-55aa01"
SECOND_TOKEN = "second-secret-77bb02"
TOKENS = TokenTable(
    (
        TokenEntry("dashboard", Role.VIEWER, hash_token(VIEWER_TOKEN)),
        TokenEntry("oncall", Role.OPERATOR, hash_token(OPERATOR_TOKEN)),
        TokenEntry("lead", Role.APPROVER, hash_token(LEAD_TOKEN)),
        TokenEntry("second", Role.APPROVER, hash_token(SECOND_TOKEN)),
    )
)
APPROVAL = pb.ApprovalPolicy(required=True, timeout="4h")


async def _create(
    stub: FlowStub, approval: pb.ApprovalPolicy = APPROVAL, metadata: tuple[tuple[str, str], ...] = ()
) -> pb.TaskSchedule:
    schedule_config = config("fw")
    schedule_config.approval.CopyFrom(approval)
    request = pb.CreateTaskScheduleRequest(schedule=schedule_config, operation=power_off("r1"))
    schedule: pb.TaskSchedule = await stub.CreateTaskSchedule(request, metadata=metadata)
    return schedule


async def _runs(stub: FlowStub, schedule: pb.TaskSchedule) -> list[pb.TaskScheduleRun]:
    request = pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id)
    return list((await stub.ListTaskScheduleRuns(request, metadata=bearer(VIEWER_TOKEN))).runs)


@pytest.mark.parametrize(
    ("approval", "field"),
    [
        (pb.ApprovalPolicy(required=True), "schedule.approval.timeout: required"),
        (pb.ApprovalPolicy(required=True, timeout="0s"), "schedule.approval.timeout: must be positive"),
        (pb.ApprovalPolicy(required=True, timeout="soon"), "schedule.approval.timeout"),
        (pb.ApprovalPolicy(required=True, timeout="721h"), "schedule.approval.timeout: at most 720h"),
        (pb.ApprovalPolicy(required=True, timeout="1h", min_approvers=11), "schedule.approval.min_approvers"),
        (pb.ApprovalPolicy(required=True, timeout="1h", min_approvers=-1), "schedule.approval.min_approvers"),
        (pb.ApprovalPolicy(timeout="1h"), "schedule.approval.required: must be true"),
    ],
)
async def test_a_bad_approval_policy_names_its_field_and_writes_nothing(
    stub: FlowStub, services: Services, approval: pb.ApprovalPolicy, field: str
) -> None:
    await make_rack(services, "r1")
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, _create(stub, approval))
    schedule = await _create(stub, pb.ApprovalPolicy())  # none: as if unset
    assert not schedule.HasField("approval")
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        field,
        stub.UpdateTaskSchedule(
            pb.UpdateTaskScheduleRequest(
                id=schedule.id,
                schedule=pb.ScheduleConfig(approval=approval),
                update_mask=FieldMask(paths=["schedule.approval"]),
            )
        ),
    )
    assert (await table_counts(services.db))["task_schedule"] == before["task_schedule"] + 1


async def test_the_audit_trail_may_be_read_for_expiries(stub: FlowStub) -> None:
    """An expiry is recorded under a method that is no RPC's; the trail may still be filtered by it."""
    found = await stub.ListAuditEvents(pb.ListAuditEventsRequest(method="ExpireTaskScheduleRun"))
    assert found.total == 0
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "method: 'ExpireEverything'",
        stub.ListAuditEvents(pb.ListAuditEventsRequest(method="ExpireEverything")),
    )


async def test_the_policy_is_stored_updated_removed_and_previewed(stub: FlowStub, services: Services) -> None:
    await make_rack(services, "r1")
    schedule = await _create(stub, pb.ApprovalPolicy(required=True, timeout="90m", min_approvers=2))
    assert schedule.approval == pb.ApprovalPolicy(required=True, timeout="1h30m", min_approvers=2)
    preview = await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=schedule.id, count=2))
    assert [f.needs_approval for f in preview.firings] == [True, True]

    removed = await stub.UpdateTaskSchedule(
        pb.UpdateTaskScheduleRequest(id=schedule.id, update_mask=FieldMask(paths=["schedule.approval"]))
    )
    assert not removed.HasField("approval")
    preview = await stub.PreviewTaskSchedule(pb.PreviewTaskScheduleRequest(id=schedule.id, count=1))
    assert [f.needs_approval for f in preview.firings] == [False]


@pytest.mark.parametrize("rpc", ["ApproveTaskScheduleRun", "RejectTaskScheduleRun"])
async def test_approve_and_reject_refuse_bad_ids_runs_and_comments(
    stub: FlowStub, services: Services, rpc: str
) -> None:
    request_type = getattr(pb, f"{rpc}Request")
    call = getattr(stub, rpc)
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT, "id", call(request_type(id=pb.UUID(id="nope"), comment="x"))
    )
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "id", call(request_type(comment="x")))
    unknown = "00000000-0000-0000-0000-000000000003"
    await expect(
        grpc.StatusCode.NOT_FOUND,
        f"id: no task schedule run {unknown}",
        call(request_type(id=pb.UUID(id=unknown), comment="x")),
    )
    await make_rack(services, "r1")
    schedule = await _create(stub)
    assert (await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))).task_ids == []
    (run,) = (await stub.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))).runs
    assert run.state == "awaiting_approval"
    before = await table_counts(services.db)
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT, "comment", call(request_type(id=run.id, comment="x" * 1025))
    )
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "comment", call(request_type(id=run.id, comment="a\x00b")))
    if rpc == "RejectTaskScheduleRun":
        await expect(grpc.StatusCode.INVALID_ARGUMENT, "comment: required", call(request_type(id=run.id)))
    assert await table_counts(services.db) == before
    assert (
        await stub.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id))
    ).state == "awaiting_approval"

    decided = await call(request_type(id=run.id, comment="checked"))
    assert decided.state == ("completed" if rpc == "ApproveTaskScheduleRun" else "rejected")
    await expect(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"id: run {run.id.id} is {decided.state}; only a run awaiting approval",
        call(request_type(id=run.id, comment="again")),
    )


@pytest.fixture
async def secured(services: Services) -> AsyncIterator[FlowStub]:
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        yield FlowStub(channel)


async def test_roles_and_the_two_person_rule_by_token(secured: FlowStub, services: Services) -> None:
    stub = secured
    await make_rack(services, "r1")
    schedule = await _create(stub, metadata=bearer(LEAD_TOKEN))  # lead is its last editor
    assert schedule.last_edited_by == "lead"
    # An operator may trigger it (the firing awaits approval) but not approve it as it fires.
    await expect(
        grpc.StatusCode.PERMISSION_DENIED,
        "approve: only the approver role",
        stub.TriggerTaskSchedule(
            pb.TriggerTaskScheduleRequest(id=schedule.id, approve=True), metadata=bearer(OPERATOR_TOKEN)
        ),
    )
    assert await _runs(stub, schedule) == []
    await stub.TriggerTaskSchedule(
        pb.TriggerTaskScheduleRequest(id=schedule.id), metadata=bearer(OPERATOR_TOKEN)
    )
    (run,) = await _runs(stub, schedule)
    before = await table_counts(services.db)
    for token in (VIEWER_TOKEN, OPERATOR_TOKEN):
        await expect(
            grpc.StatusCode.PERMISSION_DENIED,
            "ApproveTaskScheduleRun: the",
            stub.ApproveTaskScheduleRun(pb.ApproveTaskScheduleRunRequest(id=run.id), metadata=bearer(token)),
        )
    await expect(
        grpc.StatusCode.PERMISSION_DENIED,
        "'lead' last edited the schedule",
        stub.ApproveTaskScheduleRun(pb.ApproveTaskScheduleRunRequest(id=run.id), metadata=bearer(LEAD_TOKEN)),
    )
    # Refused calls wrote nothing but their audit rows: the role's refusals (the auth interceptor's) and
    # the two-person rule's.
    after = await table_counts(services.db)
    assert {k: v for k, v in after.items() if v != before[k]} == {"audit_events": before["audit_events"] + 3}

    approved = await stub.ApproveTaskScheduleRun(
        pb.ApproveTaskScheduleRunRequest(id=run.id, comment="ok"), metadata=bearer(SECOND_TOKEN)
    )
    assert approved.state == "completed" and len(approved.outcomes) == 1 and approved.outcomes[0].task_id.id
    assert [(a.principal, a.comment) for a in approved.approval.approvers] == [("second", "ok")]
    events = await stub.ListAuditEvents(
        pb.ListAuditEventsRequest(method="ApproveTaskScheduleRun"), metadata=bearer(VIEWER_TOKEN)
    )
    tried = [
        ("dashboard", "PERMISSION_DENIED"),
        ("lead", "PERMISSION_DENIED"),
        ("oncall", "PERMISSION_DENIED"),
        ("second", "OK"),
    ]
    assert sorted((e.principal, e.outcome) for e in events.events) == tried
    # All are in the schedule's history too: the editor's refused approval is what an auditor of the
    # two-person rule looks for there (`rackflow audit --target SCHEDULE`), not only under the run, and so
    # are the approvals of those whose role may not approve.
    history = await stub.ListAuditEvents(
        pb.ListAuditEventsRequest(method="ApproveTaskScheduleRun", target=schedule.id),
        metadata=bearer(VIEWER_TOKEN),
    )
    assert sorted((e.principal, e.outcome) for e in history.events) == tried

    # The approver who is not the last editor may approve a trigger as it fires: it starts at once (once
    # the first task ended: the task manager's conflict rules still hold).
    async with services.db.transaction() as conn:
        await task_store.set_status(
            conn, [uuid.UUID(approved.outcomes[0].task_id.id)], TaskStatus.COMPLETED, now=services.clock.now()
        )
    started = await stub.TriggerTaskSchedule(
        pb.TriggerTaskScheduleRequest(id=schedule.id, approve=True), metadata=bearer(SECOND_TOKEN)
    )
    assert len(started.task_ids) == 1


async def test_one_who_approved_may_reject_audited_and_bad_input_refused(
    secured: FlowStub, services: Services
) -> None:
    """lead approved a run that needs two approvers and changes his mind: a rejection without a comment or
    with a bad one is refused and writes nothing but its audit row; with one it stands, audited by him."""
    stub = secured
    await make_rack(services, "r1")
    two = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)
    schedule = await _create(stub, two, metadata=bearer(OPERATOR_TOKEN))
    await stub.TriggerTaskSchedule(
        pb.TriggerTaskScheduleRequest(id=schedule.id, approve=True), metadata=bearer(LEAD_TOKEN)
    )
    (run,) = await _runs(stub, schedule)
    assert [a.principal for a in run.approval.approvers] == ["lead"]
    before = await table_counts(services.db)
    for comment, words in (("", "comment: required"), ("x" * 1025, "comment"), ("a\x00b", "comment")):
        await expect(
            grpc.StatusCode.INVALID_ARGUMENT,
            words,
            stub.RejectTaskScheduleRun(
                pb.RejectTaskScheduleRunRequest(id=run.id, comment=comment), metadata=bearer(LEAD_TOKEN)
            ),
        )
    after = await table_counts(services.db)
    assert {k: v for k, v in after.items() if v != before[k]} == {"audit_events": before["audit_events"] + 3}
    request = pb.GetTaskScheduleRunRequest(id=run.id)
    got = await stub.GetTaskScheduleRun(request, metadata=bearer(VIEWER_TOKEN))
    assert got.state == "awaiting_approval"

    rejected = await stub.RejectTaskScheduleRun(
        pb.RejectTaskScheduleRunRequest(id=run.id, comment="wrong version"), metadata=bearer(LEAD_TOKEN)
    )
    assert (rejected.state, rejected.approval.rejected_by) == ("rejected", "lead")
    events = await stub.ListAuditEvents(
        pb.ListAuditEventsRequest(method="RejectTaskScheduleRun"), metadata=bearer(VIEWER_TOKEN)
    )
    assert sorted((e.principal, e.outcome) for e in events.events) == [
        ("lead", "INVALID_ARGUMENT"),
        ("lead", "INVALID_ARGUMENT"),
        ("lead", "INVALID_ARGUMENT"),
        ("lead", "OK"),
    ]


async def test_a_rejection_asked_again_by_its_rejecter_answers_as_the_first(
    secured: FlowStub, services: Services
) -> None:
    """A client whose RejectTaskScheduleRun lost its answer (the COMMIT's, say) asks again: the same
    rejection by the same principal answers the run, rejected, as the first did, and writes nothing but its
    audit row; another principal's rejection, or one saying something else, is refused: the run is
    rejected already."""
    stub = secured
    await make_rack(services, "r1")
    schedule = await _create(stub, metadata=bearer(OPERATOR_TOKEN))
    trigger = pb.TriggerTaskScheduleRequest(id=schedule.id)
    await stub.TriggerTaskSchedule(trigger, metadata=bearer(OPERATOR_TOKEN))
    (run,) = await _runs(stub, schedule)
    request = pb.RejectTaskScheduleRunRequest(id=run.id, comment="wrong version")
    first = await stub.RejectTaskScheduleRun(request, metadata=bearer(LEAD_TOKEN))
    before = await table_counts(services.db)

    again = await stub.RejectTaskScheduleRun(request, metadata=bearer(LEAD_TOKEN))

    assert (again.state, again.approval.rejected_by) == ("rejected", "lead")
    assert again == first
    after = await table_counts(services.db)
    assert {k: v for k, v in after.items() if v != before[k]} == {"audit_events": before["audit_events"] + 1}
    for token, comment in ((SECOND_TOKEN, "wrong version"), (LEAD_TOKEN, "wrong rack")):
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "is rejected; only a run awaiting approval can be rejected",
            stub.RejectTaskScheduleRun(
                pb.RejectTaskScheduleRunRequest(id=run.id, comment=comment), metadata=bearer(token)
            ),
        )


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[grpc.ServerCredentials, KeyPair, KeyPair]:
    """A server under mutual TLS (no tokens), and the client certificates of alice and bob, signed by its
    CA (so they must present theirs and are named by its CN)."""
    directory: Path = tmp_path_factory.mktemp("pki")
    pki = make_pki(directory)
    alice, bob = (make_cert(directory, pki.ca, name, server=False) for name in ("alice", "bob"))
    server = server_credentials(ServerTls(str(pki.server.cert), str(pki.server.key), str(pki.ca.cert)))
    return server, alice, bob


async def test_the_two_person_rule_by_client_certificate(
    services: Services, certificates: tuple[grpc.ServerCredentials, KeyPair, KeyPair]
) -> None:
    """Under mutual TLS without tokens each certificate's CN is a principal the rule tells apart: alice,
    who created the schedule, may neither approve nor reject its run; bob's approval counts once."""
    server, alice, bob = certificates
    ca = (Path(alice.cert).parent / "rackflow-test-ca.pem").read_bytes()

    def as_(pair: KeyPair) -> grpc.ChannelCredentials:
        cert, key = pair.read()
        return grpc.ssl_channel_credentials(ca, private_key=key, certificate_chain=cert)

    await make_rack(services, "r1")
    async with (
        secured_server(services, None, server) as address,
        grpc.aio.secure_channel(address, as_(alice)) as alice_channel,
        grpc.aio.secure_channel(address, as_(bob)) as bob_channel,
    ):
        by_alice, by_bob = FlowStub(alice_channel), FlowStub(bob_channel)
        two = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)
        schedule = await _create(by_alice, two)
        assert schedule.last_edited_by == "alice"
        await expect(
            grpc.StatusCode.PERMISSION_DENIED,
            "approve: 'alice' last edited the schedule",
            by_alice.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id, approve=True)),
        )
        await by_alice.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
        (run,) = (
            await by_bob.ListTaskScheduleRuns(pb.ListTaskScheduleRunsRequest(schedule_id=schedule.id))
        ).runs
        for call in (
            by_alice.ApproveTaskScheduleRun(pb.ApproveTaskScheduleRunRequest(id=run.id)),
            by_alice.RejectTaskScheduleRun(pb.RejectTaskScheduleRunRequest(id=run.id, comment="mine")),
        ):
            await expect(grpc.StatusCode.PERMISSION_DENIED, "id: 'alice' last edited the schedule", call)
        await by_bob.ApproveTaskScheduleRun(pb.ApproveTaskScheduleRunRequest(id=run.id))
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "id: 'bob' has already approved this run",
            by_bob.ApproveTaskScheduleRun(pb.ApproveTaskScheduleRunRequest(id=run.id)),
        )
        waiting = await by_bob.GetTaskScheduleRun(pb.GetTaskScheduleRunRequest(id=run.id))
        assert waiting.state == "awaiting_approval"
        assert [a.principal for a in waiting.approval.approvers] == ["bob"]
        events = await by_bob.ListAuditEvents(pb.ListAuditEventsRequest(method="ApproveTaskScheduleRun"))
    assert sorted((e.principal, e.outcome) for e in events.events) == [
        ("alice", "PERMISSION_DENIED"),
        ("bob", "FAILED_PRECONDITION"),
        ("bob", "OK"),
    ]


async def test_anonymous_callers_cannot_be_told_apart(services: Services) -> None:
    """Without tokens or client certificates every caller is `anonymous`: an approval counts where one
    approver is enough, and a run that needs more is refused saying why (and writes nothing but its audit
    row); rejecting it is allowed."""
    await make_rack(services, "r1")
    async with secured_server(services, None) as address, grpc.aio.insecure_channel(address) as channel:
        stub = FlowStub(channel)
        schedule = await _create(stub, pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2))
        why = "this run needs 2 distinct approvers, and anonymous callers cannot be told apart"
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"approve: {why}",
            stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id, approve=True)),
        )
        await stub.TriggerTaskSchedule(pb.TriggerTaskScheduleRequest(id=schedule.id))
        (run,) = await _runs(stub, schedule)
        before = await table_counts(services.db)
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"id: {why}",
            stub.ApproveTaskScheduleRun(pb.ApproveTaskScheduleRunRequest(id=run.id)),
        )
        after = await table_counts(services.db)
        assert {k: v for k, v in after.items() if v != before[k]} == {
            "audit_events": before["audit_events"] + 1
        }
        rejected = await stub.RejectTaskScheduleRun(pb.RejectTaskScheduleRunRequest(id=run.id, comment="no"))
        assert (rejected.state, rejected.approval.rejected_by) == ("rejected", "anonymous")

        one_config = config("fw-one")
        one_config.approval.CopyFrom(APPROVAL)  # one approver is enough
        one = await stub.CreateTaskSchedule(
            pb.CreateTaskScheduleRequest(schedule=one_config, operation=power_off("r1"))
        )
        trigger = pb.TriggerTaskScheduleRequest(id=one.id, approve=True)
        assert len((await stub.TriggerTaskSchedule(trigger)).task_ids) == 1
        (started,) = await _runs(stub, one)
    assert started.state == "completed"
    assert [a.principal for a in started.approval.approvers] == ["anonymous"]


def counting(services: Services, tokens: TokenTable | None, *, mutual_tls: bool = False) -> Services:
    """The services as `rackflow serve` builds them beside these credentials: they know who may approve."""
    return Services.build(services.db, services.clock, approvers=approvers_of(tokens, mutual_tls=mutual_tls))


def with_approval(schedule_id: pb.UUID, approval: pb.ApprovalPolicy | None) -> pb.UpdateTaskScheduleRequest:
    return pb.UpdateTaskScheduleRequest(
        id=schedule_id,
        schedule=pb.ScheduleConfig(approval=approval),
        update_mask=FieldMask(paths=["schedule.approval"]),
    )


WEAKEN_WHY = (
    "needs the approver role: the operator role of 'oncall' may not weaken the approval of runs it may not "
    "approve"
)


async def test_only_an_approver_may_remove_lower_or_delete_a_schedule_s_approval_gate(
    secured: FlowStub, services: Services
) -> None:
    """oncall (operator) may not approve fw's runs, so may neither remove its policy, nor lower its
    min_approvers, nor delete it: each is refused naming the field, writes nothing but its audit row (the
    schedule's history shows who tried), and fw keeps its gate. lead (approver) may do all three."""
    stub = secured
    await make_rack(services, "r1")
    oncall, lead = bearer(OPERATOR_TOKEN), bearer(LEAD_TOKEN)
    two = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)
    one = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=1)
    schedule = await _create(stub, two, oncall)
    delete = pb.DeleteTaskScheduleRequest(id=schedule.id)
    refusals = [
        (
            "UpdateTaskSchedule",
            "schedule.approval: removing the approval policy (2 approvers within 4h) of schedule 'fw' "
            f"{WEAKEN_WHY}",
            stub.UpdateTaskSchedule(with_approval(schedule.id, None), metadata=oncall),
        ),
        (
            "UpdateTaskSchedule",
            f"schedule.approval: lowering the approvers schedule 'fw' needs from 2 to 1 {WEAKEN_WHY}",
            stub.UpdateTaskSchedule(with_approval(schedule.id, one), metadata=oncall),
        ),
        (
            "DeleteTaskSchedule",
            f"id: deleting schedule 'fw', whose runs need approval (2 approvers within 4h), {WEAKEN_WHY}",
            stub.DeleteTaskSchedule(delete, metadata=oncall),
        ),
    ]
    before = await table_counts(services.db)
    for _, message, call in refusals:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call
        assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.PERMISSION_DENIED, message)
    after = await table_counts(services.db)
    assert {k: v for k, v in after.items() if v != before[k]} == {"audit_events": before["audit_events"] + 3}
    kept = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id), metadata=oncall)
    assert kept.approval == two
    history = await stub.ListAuditEvents(
        pb.ListAuditEventsRequest(target=schedule.id), metadata=bearer(VIEWER_TOKEN)
    )
    assert sorted(
        (e.principal, e.method, e.outcome, e.error) for e in history.events if e.outcome != "OK"
    ) == sorted(("oncall", rpc, "PERMISSION_DENIED", message) for rpc, message, _ in refusals)

    lowered = await stub.UpdateTaskSchedule(with_approval(schedule.id, one), metadata=lead)
    assert lowered.approval.min_approvers == 1
    removed = await stub.UpdateTaskSchedule(with_approval(schedule.id, None), metadata=lead)
    assert not removed.HasField("approval")
    gated = pb.CreateTaskScheduleRequest(schedule=config("fw-2"), operation=power_off("r1"))
    gated.schedule.approval.CopyFrom(two)
    second = await stub.CreateTaskSchedule(gated, metadata=oncall)
    await stub.DeleteTaskSchedule(pb.DeleteTaskScheduleRequest(id=second.id), metadata=lead)
    listed = await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest(), metadata=oncall)
    assert [s.name for s in listed.task_schedules] == ["fw"]


async def test_an_edit_s_preview_refuses_what_its_save_would_weaken(
    secured: FlowStub, services: Services
) -> None:
    """The form's preview of fw's edit that lowers its min_approvers is refused to oncall (operator) as the
    save would be, with UpdateTaskSchedule's message and field, so the form says so as it is typed; lead's
    (approver) is answered, and so are oncall's of an edit that keeps the gate and of a new schedule."""
    stub = secured
    await make_rack(services, "r1")
    oncall, lead = bearer(OPERATOR_TOKEN), bearer(LEAD_TOKEN)
    two = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)
    one = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=1)
    schedule = await _create(stub, two, oncall)

    def preview(approval: pb.ApprovalPolicy, editing: pb.UUID | None) -> pb.PreviewTaskScheduleRequest:
        draft = pb.CreateTaskScheduleRequest(schedule=config("fw"), operation=power_off("r1"))
        draft.schedule.approval.CopyFrom(approval)
        return pb.PreviewTaskScheduleRequest(id=editing, draft=draft, count=1)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.PreviewTaskSchedule(preview(one, schedule.id), metadata=oncall)
    message = f"schedule.approval: lowering the approvers schedule 'fw' needs from 2 to 1 {WEAKEN_WHY}"
    assert (refused.value.code(), refused.value.details()) == (grpc.StatusCode.PERMISSION_DENIED, message)
    for request, metadata in (
        (preview(one, schedule.id), lead),
        (preview(two, schedule.id), oncall),
        (preview(one, None), oncall),
    ):
        answered = await stub.PreviewTaskSchedule(request, metadata=metadata)
        assert [f.needs_approval for f in answered.firings] == [True]


async def test_the_cli_says_an_operator_may_not_remove_the_approval_or_delete_the_schedule(
    services: Services,
) -> None:
    """`rackflow schedule update NAME --no-approval` and `rackflow schedule delete NAME` with an operator's
    token print the server's refusal and exit 1; fw keeps its gate."""
    await make_rack(services, "r1")

    async def rackflow(address: str, *args: str) -> Result:
        command = ["--server", address, "--token", OPERATOR_TOKEN, *args]
        return await asyncio.to_thread(CliRunner().invoke, main, command)

    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        stub = FlowStub(channel)
        schedule = await _create(stub, metadata=bearer(OPERATOR_TOKEN))
        removed = await rackflow(address, "schedule", "update", "fw", "--no-approval")
        deleted = await rackflow(address, "schedule", "delete", "fw")
        kept = await stub.GetTaskSchedule(
            pb.GetTaskScheduleRequest(id=schedule.id), metadata=bearer(OPERATOR_TOKEN)
        )
    assert (removed.exit_code, removed.stdout) == (1, "")
    assert removed.stderr == (
        "error: PERMISSION_DENIED: schedule.approval: removing the approval policy (1 approver within 4h) of "
        f"schedule 'fw' {WEAKEN_WHY}\n"
    )
    assert (deleted.exit_code, deleted.stdout) == (1, "")
    assert deleted.stderr == (
        "error: PERMISSION_DENIED: id: deleting schedule 'fw', whose runs need approval (1 approver within "
        f"4h), {WEAKEN_WHY}\n"
    )
    assert kept.approval == pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=1)


async def test_an_operator_may_add_raise_and_retime_an_approval_gate(
    secured: FlowStub, services: Services
) -> None:
    """What leaves a schedule's runs no easier to start is an operator's to change: a policy where there
    was none, more approvers, a longer or shorter timeout, any other field of a gated schedule; and a
    schedule without a policy is deleted as any."""
    stub = secured
    await make_rack(services, "r1")
    oncall = bearer(OPERATOR_TOKEN)
    schedule = await _create(stub, pb.ApprovalPolicy(), oncall)  # none
    for policy in (
        pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=1),
        pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2),
        pb.ApprovalPolicy(required=True, timeout="8h", min_approvers=2),
        pb.ApprovalPolicy(required=True, timeout="30m", min_approvers=2),
    ):
        updated = await stub.UpdateTaskSchedule(with_approval(schedule.id, policy), metadata=oncall)
        assert updated.approval == policy
    renamed = pb.UpdateTaskScheduleRequest(
        id=schedule.id,
        schedule=pb.ScheduleConfig(name="fw-2"),
        update_mask=FieldMask(paths=["schedule.name"]),
    )
    assert (await stub.UpdateTaskSchedule(renamed, metadata=oncall)).approval.min_approvers == 2
    plain = await stub.CreateTaskSchedule(
        pb.CreateTaskScheduleRequest(schedule=config("plain"), operation=power_off("r1")), metadata=oncall
    )
    await stub.DeleteTaskSchedule(pb.DeleteTaskScheduleRequest(id=plain.id), metadata=oncall)
    listed = await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest(), metadata=oncall)
    assert [s.name for s in listed.task_schedules] == ["fw-2"]


async def test_a_policy_needing_more_approvers_than_the_tokens_allow_is_refused(services: Services) -> None:
    """lead and second hold the approver role: a policy asking for three is never met (each firing awaits
    approval and expires), and one asking for two is not either once lead edits the schedule (the
    two-person rule keeps lead from approving it). Refused when set, by create, update, re-scope and the
    console's preview alike, naming the field and who may approve; nothing is written."""
    await make_rack(services, "r1")
    await make_rack(services, "r2")
    counted = counting(services, TOKENS)
    oncall, lead = bearer(OPERATOR_TOKEN), bearer(LEAD_TOKEN)
    three = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=3)
    two = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)
    async with secured_server(counted, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        stub = FlowStub(channel)
        before = await table_counts(services.db)
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "schedule.approval.min_approvers: 3 approvers needed, but only 2 principals may approve its runs "
            "with this server's tokens (lead, second); ask for at most 2, or give more tokens the approver "
            "role (--auth-tokens)",
            _create(stub, three, oncall),
        )
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "2 approvers needed, but only 1 principal may approve its runs with this server's tokens "
            "(second); 'lead' last edited it and may not (two-person rule); ask for at most 1",
            _create(stub, two, lead),
        )
        draft = config("fw")
        draft.approval.CopyFrom(two)
        preview = pb.PreviewTaskScheduleRequest(
            draft=pb.CreateTaskScheduleRequest(schedule=draft, operation=power_off("r1")), count=1
        )
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "schedule.approval.min_approvers: 2 approvers needed",
            stub.PreviewTaskSchedule(preview, metadata=lead),
        )
        after = await table_counts(services.db)
        assert {k: v for k, v in after.items() if v != before[k]} == {
            "audit_events": before["audit_events"] + 2
        }

        schedule = await _create(stub, two, oncall)
        assert (await stub.PreviewTaskSchedule(preview, metadata=oncall)).firings
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "schedule.approval.min_approvers: 3 approvers needed",
            stub.UpdateTaskSchedule(with_approval(schedule.id, three), metadata=oncall),
        )
        renamed = pb.UpdateTaskScheduleRequest(
            id=schedule.id,
            schedule=pb.ScheduleConfig(name="fw-2"),
            update_mask=FieldMask(paths=["schedule.name"]),
        )
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "'lead' last edited it and may not",
            stub.UpdateTaskSchedule(renamed, metadata=lead),
        )
        add = pb.AddTaskScheduleScopeRequest(schedule_id=schedule.id, target_spec=racks_spec("r2"))
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "'lead' last edited it and may not",
            stub.AddTaskScheduleScope(add, metadata=lead),
        )
        kept = await stub.GetTaskSchedule(pb.GetTaskScheduleRequest(id=schedule.id), metadata=oncall)
        assert (kept.name, kept.last_edited_by) == ("fw", "oncall")
        scopes = pb.ListTaskScheduleScopesRequest(schedule_id=schedule.id)
        assert (await stub.ListTaskScheduleScopes(scopes, metadata=oncall)).total == 1
        # lead may edit it once one approver other than lead is enough, and operators as they like.
        assert (await stub.AddTaskScheduleScope(add, metadata=oncall)).scopes
        one = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=1)
        edited = await stub.UpdateTaskSchedule(with_approval(schedule.id, one), metadata=lead)
        assert (edited.last_edited_by, edited.approval.min_approvers) == ("lead", 1)


async def test_the_schedules_the_tokens_no_longer_let_approve_are_named_at_start_up(
    services: Services, caplog: pytest.LogCaptureFixture
) -> None:
    """A tokens file is read at start-up: a schedule whose policy its approvers met before may need more
    than the new file lets approve. `name_unapprovable` (which `rackflow serve` runs as it starts) says so
    at WARNING for each; a schedule whose policy was removed, or that one approver can approve, is not
    named."""
    await make_rack(services, "r1")
    two = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)
    async with (
        secured_server(counting(services, TOKENS), TOKENS) as address,
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = FlowStub(channel)
        needs_two = await _create(stub, two, bearer(OPERATOR_TOKEN))
        removed = await stub.CreateTaskSchedule(
            pb.CreateTaskScheduleRequest(schedule=config("fw-removed"), operation=power_off("r1")),
            metadata=bearer(OPERATOR_TOKEN),
        )
        await stub.UpdateTaskSchedule(with_approval(removed.id, two), metadata=bearer(OPERATOR_TOKEN))
        await stub.UpdateTaskSchedule(with_approval(removed.id, None), metadata=bearer(LEAD_TOKEN))
        one_config = config("fw-one")
        one_config.approval.CopyFrom(APPROVAL)
        await stub.CreateTaskSchedule(
            pb.CreateTaskScheduleRequest(schedule=one_config, operation=power_off("r1")),
            metadata=bearer(OPERATOR_TOKEN),
        )
    lead_only = TokenTable(tuple(e for e in TOKENS.entries if e.name != "second"))
    # The look reads from the database the schedules with a policy alone, a chunk at a time: it read a
    # row of every schedule into a list (488 MiB at its peak at a million schedules, 237 MiB kept idle).
    with statements_sent(services.db) as sent:
        assert await counting(services, TOKENS).schedules.name_unapprovable() == 0
    ((statement, parameters),) = [(st, p) for st, p in sent if "approval" in st]
    async with services.db.read() as conn:
        counted_rows = f"SELECT count(*) FROM ({statement}) AS looked"
        assert (await conn.exec_driver_sql(counted_rows, parameters)).scalar_one() == 2  # of the 3 schedules
    caplog.set_level(logging.WARNING)
    assert await counting(services, lead_only).schedules.name_unapprovable() == 1
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == (
        f"schedule 'fw' ({needs_two.id.id}) cannot be approved: it needs 2 approvers, but only 1 principal "
        "may approve its runs with this server's tokens (lead); ask for at most 1, or give more tokens the "
        "approver role (--auth-tokens); until then each of its firings awaits approval and expires"
    )


async def test_without_tokens_anonymous_callers_count_once_and_certificates_are_not_counted(
    services: Services,
) -> None:
    """Without authentication every caller is one `anonymous`, whom rackflow cannot tell apart: a policy
    needing two is refused as it is set, saying so. Under mutual TLS without tokens any certificate its CA
    signs may approve: the server cannot count them, and takes the policy (the approvals then count
    distinct certificate names: test_two_person_rule_by_client_certificate)."""
    await make_rack(services, "r1")
    two = pb.ApprovalPolicy(required=True, timeout="4h", min_approvers=2)
    async with (
        secured_server(counting(services, None), None) as address,
        grpc.aio.insecure_channel(address) as channel,
    ):
        stub = FlowStub(channel)
        await expect(
            grpc.StatusCode.FAILED_PRECONDITION,
            "schedule.approval.min_approvers: 2 approvers needed, but only 1 principal may approve its "
            "runs on this server: without authentication every caller is 'anonymous', and anonymous "
            "callers cannot be told apart; ask for at most 1, or configure --auth-tokens (role: "
            "approver) or --tls-client-ca",
            _create(stub, two),
        )
        assert (await _create(stub)).approval.min_approvers == 1
    assert approvers_of(None, mutual_tls=True) == UNCOUNTED
    certified = counting(services, None, mutual_tls=True)
    assert await certified.schedules.name_unapprovable() == 0
