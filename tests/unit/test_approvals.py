"""The approval rules (`rackflow.domain.approvals`) and what the planner does with a schedule that needs
approval (`rackflow.domain.firing`), table-driven over snapshots built in memory: no database.

The store tests prove the same end to end on both databases (tests/store/test_approvals.py).
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import timedelta

import pytest

from rackflow.domain.approvals import (
    UNCOUNTED,
    ApprovalPolicy,
    Approver,
    Approvers,
    RunApproval,
    check_approver,
    check_decider,
    check_may_weaken,
    describe_expiry,
    opened,
    unapprovable,
    with_approver,
)
from rackflow.domain.firing import LiveRollout, Snapshot, approved_firing, plan
from rackflow.domain.rollouts import RackPlace, RolloutPolicy
from rackflow.domain.schedules import Run, ScopeOutcome, Trigger
from rackflow.domain.windows import WindowKind, WindowPolicy
from rackflow.errors import FailedPrecondition, PermissionDenied
from rackflow.security import Principal, Role
from tests.unit.test_planner import HOUR, MINUTE, NOW, closing, racks_of, schedule, scopes_of

POLICY = ApprovalPolicy(timedelta(hours=4), min_approvers=2)


def test_a_run_is_approved_once_enough_distinct_approvers_approved() -> None:
    approval = opened(POLICY, NOW, None, "editor", None)
    assert approval.expires_at == NOW + timedelta(hours=4) and not approval.approved
    assert approval.edited_by == "editor"
    first = with_approver(approval, Approver("ann", NOW + HOUR))
    assert not first.approved and first.decided_at is None
    second = with_approver(first, Approver("bob", NOW + 2 * HOUR, "ok"))
    assert second.approved and second.decided_at == NOW + 2 * HOUR
    assert RunApproval.from_json(second.to_json()) == second
    # The expiry as every time in rackflow's words is (RFC 3339 in UTC, `Z`), not `…+00:00`.
    assert describe_expiry(first) == "not approved by 2030-01-01T16:00:00Z (1 of 2 approvers)"
    assert ApprovalPolicy.from_json(POLICY.to_json()) == POLICY
    assert POLICY.describe() == "2 approvers within 4h"


def test_a_firmware_upgrade_s_run_may_be_approved_only_until_its_window_ends() -> None:
    """Approved at or past its operation's end_time, each task the run started would fail unrun: its
    approval expires at that end when it comes before the policy's timeout, and its expiry says so; a
    window ending at or after the timeout changes nothing."""
    for end in (NOW + timedelta(hours=4), NOW + timedelta(hours=5)):
        assert opened(POLICY, NOW, None, "editor", end) == opened(POLICY, NOW, None, "editor", None)
    end = NOW + timedelta(minutes=90)
    approval = with_approver(opened(POLICY, NOW, None, "editor", end), Approver("ann", NOW + MINUTE))
    assert (approval.expires_at, approval.at_window_end) == (end, True)
    assert RunApproval.from_json(approval.to_json()) == approval
    assert describe_expiry(approval) == (
        "not approved by 2030-01-01T13:30:00Z, its firmware window's end (its upgrade's end_time) (1 of 2 "
        "approvers)"
    )


@pytest.mark.parametrize(
    ("principal", "approved_by", "identified", "edited_by", "needed", "refused"),
    [
        ("ann", (), True, "fired", 2, None),
        ("editor", (), True, "fired", 2, "^id: 'editor' last edited the schedule and"),
        ("fired", (), True, "fired", 2, "^id: 'fired' last edited the schedule this run fired from"),
        ("ann", ("ann",), True, "fired", 2, "^id: 'ann' has already approved this run"),
        # An anonymous caller is told from nobody: not from a named editor, nor from another anonymous one.
        ("anonymous", (), False, "", 1, None),
        (
            "anonymous",
            (),
            False,
            "fired",
            1,
            "^id: an anonymous caller may not approve or reject .* 'editor' edited",
        ),
        ("anonymous", (), False, "", 2, "^id: this run needs 2 distinct approvers, and anonymous callers"),
    ],
)
def test_who_may_approve(
    principal: str,
    approved_by: tuple[str, ...],
    identified: bool,
    edited_by: str,
    needed: int,
    refused: str | None,
) -> None:
    """The editors are `edited_by` (when the run fired) and, for a named one, "editor" (now)."""
    approvers = tuple(Approver(p, NOW) for p in approved_by)
    approval = RunApproval(NOW + HOUR, needed, approvers, edited_by=edited_by)
    last_editor = "editor" if edited_by else ""
    if refused is None:
        check_approver(approval, principal, last_editor, identified=identified)
        return
    with pytest.raises((PermissionDenied, FailedPrecondition), match=refused):
        check_approver(approval, principal, last_editor, identified=identified)


@pytest.mark.parametrize(
    ("principal", "refused"),
    [
        ("ann", False),  # she approved it: she may change her mind
        ("bob", False),
        ("editor", True),  # the schedule's last editor
        ("fired", True),  # its last editor when the run fired
    ],
)
def test_who_may_reject(principal: str, refused: bool) -> None:
    """Anyone who may approve may reject, one who approved earlier too; the two-person rule still binds."""
    approval = RunApproval(NOW + HOUR, 2, (Approver("ann", NOW),), edited_by="fired")
    if not refused:
        check_decider(approval, principal, "editor", identified=True)
        return
    with pytest.raises(PermissionDenied, match=f"^id: '{principal}' last edited"):
        check_decider(approval, principal, "editor", identified=True)


@pytest.mark.parametrize("trigger", ["dispatch", "manual"])
def test_a_firing_that_needs_approval_freezes_its_plan_and_starts_nothing(trigger: Trigger) -> None:
    owner = replace(schedule(), approval=POLICY)
    scopes = scopes_of(owner, 3)
    snapshot = Snapshot((owner,), {owner.id: scopes}, busy=frozenset({scopes[0].id}))

    (firing,) = plan(snapshot, NOW, trigger)

    assert firing.needs_approval and not firing.skipped
    assert firing.approval == RunApproval(NOW + timedelta(hours=4), 2)
    expected_first = "skipped_overlap" if trigger == "dispatch" else "pending"
    assert [o.outcome for o in firing.planned_outcomes] == [expected_first, "pending", "pending"]
    assert [o.scope_id for o in firing.planned_outcomes] == [sc.id for sc in scopes]
    # The schedule advances as for any firing: the tick is spent.
    assert firing.next_run_at == NOW + HOUR


def test_a_rollout_that_needs_approval_freezes_its_waves() -> None:
    owner = replace(schedule(rollout=RolloutPolicy(canary_racks=1)), approval=POLICY)
    scopes = scopes_of(owner, 2)
    places = {sc.rack_id: RackPlace(name, None) for sc, name in zip(scopes, ("b", "a"), strict=True)}

    (firing,) = plan(Snapshot((owner,), {owner.id: scopes}, places=places), NOW, "dispatch")

    assert firing.needs_approval and firing.rolls_out
    assert [(o.scope_id, o.outcome, o.canary) for o in firing.planned_outcomes] == [
        (scopes[1].id, "pending", True),
        (scopes[0].id, "pending", False),
    ]


@pytest.mark.parametrize(("trigger", "refused"), [("dispatch", False), ("manual", True)])
def test_a_firing_while_a_run_awaits_approval_is_skipped(trigger: Trigger, refused: bool) -> None:
    owner = replace(schedule(rollout=RolloutPolicy()), approval=POLICY)
    waiting = uuid.uuid4()
    snapshot = Snapshot(
        (owner,),
        {owner.id: scopes_of(owner, 1)},
        awaiting={owner.id: waiting},
        live_rollouts={owner.id: LiveRollout(uuid.uuid4(), "halted")},
    )

    (firing,) = plan(snapshot, NOW, trigger, approver=Approver("ann", NOW))

    assert firing.skipped == (
        f"the schedule's previous run (run {waiting}) is still awaiting approval (approve or reject it first)"
    )
    assert firing.refused is refused and not firing.needs_approval and firing.planned_outcomes == ()


@pytest.mark.parametrize(("needed", "awaits"), [(1, False), (2, True)])
def test_a_trigger_its_approver_approves_counts_their_approval(needed: int, awaits: bool) -> None:
    owner = replace(schedule(), approval=replace(POLICY, min_approvers=needed))
    snapshot = Snapshot((owner,), {owner.id: scopes_of(owner, 1)})

    (firing,) = plan(snapshot, NOW, "manual", approver=Approver("ann", NOW))

    assert firing.needs_approval is awaits
    assert firing.approval is not None and firing.approval.approvers == (Approver("ann", NOW),)


def test_a_schedule_without_approval_ignores_an_approver() -> None:
    owner = schedule()
    (firing,) = plan(
        Snapshot((owner,), {owner.id: scopes_of(owner, 1)}), NOW, "manual", approver=Approver("a", NOW)
    )
    assert firing.approval is None and not firing.needs_approval


def _approved_run(
    schedule_id: uuid.UUID, frozen: tuple[ScopeOutcome, ...], rollout: RolloutPolicy | None, trigger: Trigger
) -> Run:
    approval = RunApproval(NOW + HOUR, 1, (Approver("ann", NOW + HOUR / 2),), decided_at=NOW + HOUR / 2)
    return Run(uuid.uuid4(), schedule_id, NOW, trigger, "running", frozen, rollout, approval=approval)


def test_an_approved_plain_run_starts_its_frozen_pending_scopes_as_the_windows_allow_now() -> None:
    owner = replace(schedule(window_policy=WindowPolicy.DEFER), approval=POLICY)
    scopes = scopes_of(owner, 4)
    gone, skipped, deferred, fired = scopes
    frozen = (
        ScopeOutcome(gone.id, gone.rack_id, "pending"),
        ScopeOutcome(skipped.id, skipped.rack_id, "skipped_overlap"),
        ScopeOutcome(deferred.id, deferred.rack_id, "pending"),
        ScopeOutcome(fired.id, fired.rack_id, "pending"),
    )
    run = _approved_run(owner.id, frozen, None, "dispatch")
    later = NOW + 2 * HOUR
    # An ALLOW window of `deferred`'s rack opens an hour after the approval: that rack waits for it.
    # `gone` was removed from the schedule meanwhile.
    allow = closing(WindowKind.ALLOW, later + HOUR, later + 2 * HOUR)
    window = replace(allow, all_racks=False, racks=((deferred.rack_id, "r"),))
    snapshot = Snapshot(
        (owner,), {owner.id: (deferred, fired)}, windows=(window,), racks=racks_of((deferred, fired))
    )

    firing = approved_firing(run, snapshot, later)

    assert firing.run_id == run.id and firing.fired_at == later and not firing.needs_approval
    assert [sc.id for sc in firing.scopes] == [o.scope_id for o in frozen]
    assert firing.decided[gone.id].outcome == "not_started"
    assert firing.decided[skipped.id].outcome == "skipped_overlap"
    assert [sc.id for sc in firing.to_submit] == [deferred.id, fired.id]
    assert firing.deferral(deferred.id) is not None and firing.deferral(fired.id) is None


def test_an_approved_plain_runs_deferrals_are_bound_by_its_slots_start_deadline() -> None:
    """Fired at its slot (NOW - 5 s) with a deadline of an hour, awaiting approval: every pending scope
    keeps the deadline. Approved 10 minutes later, the rack whose window opens 20 minutes after the slot
    must start by slot + deadline (not the approval + deadline, nor its window's end); the one whose window
    opens past it is "missed", as a firing that needed no approval would have it."""
    owner = replace(schedule(window_policy=WindowPolicy.DEFER, deadline=HOUR), approval=POLICY)
    soon, late = scopes_of(owner, 2)
    (fired,) = plan(Snapshot((owner,), {owner.id: (soon, late)}), NOW, "dispatch")
    deadline_at = NOW - timedelta(seconds=5) + HOUR
    assert [(o.outcome, o.start_by) for o in fired.planned_outcomes] == [("pending", deadline_at)] * 2

    run = _approved_run(owner.id, fired.planned_outcomes, None, "dispatch")
    windows = (
        replace(
            closing(WindowKind.ALLOW, NOW + 20 * MINUTE, NOW + 3 * HOUR),
            all_racks=False,
            racks=((soon.rack_id, "a"),),
        ),
        replace(
            closing(WindowKind.ALLOW, NOW + 2 * HOUR, NOW + 3 * HOUR),
            all_racks=False,
            racks=((late.rack_id, "b"),),
        ),
    )
    snapshot = Snapshot((owner,), {owner.id: (soon, late)}, windows=windows, racks=racks_of((soon, late)))
    firing = approved_firing(run, snapshot, NOW + 10 * MINUTE)

    deferral = firing.deferral(soon.id)
    assert deferral is not None and deferral.closes_at == deadline_at
    assert firing.submitted(soon.id, soon.rack_id, uuid.uuid4()).start_by == deadline_at
    assert firing.decided[late.id].outcome == "missed"
    assert [sc.id for sc in firing.to_submit] == [soon.id]


def test_an_approved_rollout_starts_by_its_own_policy_as_fired() -> None:
    fired_with = RolloutPolicy(canary_racks=1)
    owner = replace(schedule(rollout=None), approval=POLICY)  # its rollout removed since it fired
    (scope,) = scopes_of(owner, 1)
    frozen = (ScopeOutcome(scope.id, scope.rack_id, "pending", canary=True),)
    run = _approved_run(owner.id, frozen, fired_with, "manual")

    firing = approved_firing(run, Snapshot((owner,), {owner.id: (scope,)}), NOW + HOUR)

    assert firing.rolls_out and firing.schedule.rollout == fired_with
    assert firing.rollout_outcomes == frozen


@pytest.mark.parametrize(
    ("approvers", "editor", "needed", "approvable"),
    [
        (Approvers(frozenset({"ann", "bob"})), "oncall", 2, True),
        (Approvers(frozenset({"ann", "bob"})), "oncall", 3, False),
        (Approvers(frozenset({"ann", "bob"})), "ann", 2, False),  # the two-person rule: bob alone is left
        (Approvers(frozenset({"ann", "bob"})), "ann", 1, True),
        (Approvers(frozenset()), "", 1, False),  # tokens, none of them an approver
        (Approvers(anonymous=True), "", 1, True),
        (Approvers(anonymous=True), "", 2, False),  # anonymous callers cannot be told apart
        (Approvers(anonymous=True), "ann", 1, False),  # nor may they approve what a named principal edited
        (UNCOUNTED, "ann", 10, True),  # mutual TLS without tokens: any certificate may approve
    ],
)
def test_a_policy_is_approvable_by_the_principals_the_server_counts(
    approvers: Approvers, editor: str, needed: int, approvable: bool
) -> None:
    why = unapprovable(ApprovalPolicy(timedelta(hours=4), needed), approvers, editor)
    assert (why is None) == approvable, why


FOUR_HOURS = timedelta(hours=4)
OPS_BOT = Principal("ops-bot", Role.OPERATOR, "token")


@pytest.mark.parametrize(
    ("before", "after", "weakened"),
    [
        (ApprovalPolicy(FOUR_HOURS, 2), None, True),  # removed
        (ApprovalPolicy(FOUR_HOURS, 2), ApprovalPolicy(FOUR_HOURS, 1), True),  # fewer approvers
        (ApprovalPolicy(FOUR_HOURS, 1), None, True),
        (ApprovalPolicy(FOUR_HOURS, 2), ApprovalPolicy(FOUR_HOURS, 2), False),  # unchanged
        (ApprovalPolicy(FOUR_HOURS, 2), ApprovalPolicy(FOUR_HOURS, 3), False),  # more approvers
        (ApprovalPolicy(FOUR_HOURS, 2), ApprovalPolicy(timedelta(hours=8), 2), False),  # a longer timeout
        (ApprovalPolicy(FOUR_HOURS, 2), ApprovalPolicy(timedelta(minutes=30), 2), False),  # a shorter one
        (None, ApprovalPolicy(FOUR_HOURS, 1), False),  # a policy added
        (None, None, False),  # none before, none after
    ],
)
@pytest.mark.parametrize("role", list(Role))
def test_only_the_approver_role_weakens_an_approval_gate(
    before: ApprovalPolicy | None, after: ApprovalPolicy | None, weakened: bool, role: Role
) -> None:
    """Removing a policy or lowering its min_approvers needs the approver role; any other change (the
    timeout either way, more approvers, a policy where none was) does not. Rackflow itself (no caller)
    holds every role."""
    caller = Principal("ops-bot", role, "token")
    check_may_weaken(before, after, None, schedule="fw", field="schedule.approval")
    if not weakened or role is Role.APPROVER:
        check_may_weaken(before, after, caller, schedule="fw", field="schedule.approval")
        return
    with pytest.raises(PermissionDenied, match=r"^schedule\.approval: .* needs the approver role"):
        check_may_weaken(before, after, caller, schedule="fw", field="schedule.approval")


@pytest.mark.parametrize(
    ("after", "deleting", "message"),
    [
        (
            None,
            False,
            "schedule.approval: removing the approval policy (2 approvers within 4h) of schedule 'fw' needs "
            "the approver role: the operator role of 'ops-bot' may not weaken the approval of runs it may "
            "not approve",
        ),
        (
            ApprovalPolicy(FOUR_HOURS, 1),
            False,
            "schedule.approval: lowering the approvers schedule 'fw' needs from 2 to 1 needs the approver "
            "role: the operator role of 'ops-bot' may not weaken the approval of runs it may not approve",
        ),
        (
            None,
            True,
            "id: deleting schedule 'fw', whose runs need approval (2 approvers within 4h), needs the "
            "approver role: the operator role of 'ops-bot' may not weaken the approval of runs it may not "
            "approve",
        ),
    ],
)
def test_a_refused_weakening_says_what_it_would_take_and_who_tried(
    after: ApprovalPolicy | None, deleting: bool, message: str
) -> None:
    field = "id" if deleting else "schedule.approval"
    with pytest.raises(PermissionDenied) as refused:
        check_may_weaken(
            ApprovalPolicy(FOUR_HOURS, 2), after, OPS_BOT, schedule="fw", field=field, deleting=deleting
        )
    assert str(refused.value) == message
