"""Approval values and their rules: a schedule's approval policy, and a run's approval as it goes.

A schedule with an approval policy does not start what a firing planned: the run is recorded
"awaiting_approval" with its plan frozen in its outcomes (which racks, in which waves), and it starts only
once `min_approvers` distinct approvers approved it, none of them the schedule's last editor (the two-person
rule, which tells callers apart by token or client certificate; an anonymous caller is told from nobody).
Past `expires_at` it is "expired"; rejected, "rejected". A firmware upgrade's run may be approved only until
its operation's own window ends (its `end_time`), as nothing it started after could run: that end is its
`expires_at` when it comes before the policy's timeout (`opened`).
Only the approver role may weaken a schedule's gate (`check_may_weaken`): otherwise an operator, who may not
approve its runs, could remove the policy, lower it or delete the schedule, and trigger what it held.
These are pure rules, no I/O and no clock (tests/unit/test_approvals.py), so every instance and the API
decide alike; the database holds "starts once" (a conditional UPDATE ... WHERE state = 'awaiting_approval').
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from rackflow.errors import FailedPrecondition, PermissionDenied
from rackflow.security import Principal, Role
from rackflow.timespec import format_go_duration, format_rfc3339
from rackflow.words import counted


@dataclass(frozen=True)
class ApprovalPolicy:
    """A schedule's firings wait for `min_approvers` approvals, for at most `timeout` after firing."""

    timeout: timedelta
    min_approvers: int = 1

    def describe(self) -> str:
        """For people: `2 approvers within 4h`."""
        who = f"{self.min_approvers} approver{'s' if self.min_approvers != 1 else ''}"
        return f"{who} within {format_go_duration(self.timeout)}"

    def to_json(self) -> dict[str, Any]:
        return {"timeout_seconds": self.timeout.total_seconds(), "min_approvers": self.min_approvers}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ApprovalPolicy:
        return cls(timedelta(seconds=float(data["timeout_seconds"])), int(data["min_approvers"]))


@dataclass(frozen=True)
class Approver:
    """One approval of a run: who, when, and what they said."""

    principal: str
    at: datetime
    comment: str = ""


@dataclass(frozen=True)
class RunApproval:
    """A run's approval: until when it may be approved, how many approvers it needs, who approved so far;
    once decided, when (`decided_at`) and, rejected, by whom and why. `edited_by`: who had last edited the
    schedule when the run fired (the two-person rule keeps them from deciding it, whoever edits since).
    `at_window_end`: `expires_at` is its operation's window end (a firmware upgrade's end_time), which came
    before its policy's timeout (`opened`)."""

    expires_at: datetime
    min_approvers: int
    approvers: tuple[Approver, ...] = ()
    rejected_by: str = ""
    comment: str = ""
    decided_at: datetime | None = None
    edited_by: str = ""
    at_window_end: bool = False

    @property
    def approved(self) -> bool:
        return len(self.approvers) >= self.min_approvers

    def rejected_as(self, principal: str, comment: str) -> bool:
        """Whether this is the rejection `principal` asks for, saying `comment`: asked again (a client that
        lost the first answer retries), it is answered as the first was rather than refused, which would
        read as a failure to the operator whose rejection stands."""
        return bool(self.rejected_by) and (self.rejected_by, self.comment) == (principal, comment)

    def to_json(self) -> dict[str, Any]:
        return {
            "expires_at": self.expires_at.isoformat(),
            "min_approvers": self.min_approvers,
            "approvers": [
                {"principal": a.principal, "at": a.at.isoformat(), "comment": a.comment}
                for a in self.approvers
            ],
            "rejected_by": self.rejected_by,
            "comment": self.comment,
            "decided_at": self.decided_at.isoformat() if self.decided_at else None,
            "edited_by": self.edited_by,
            "at_window_end": self.at_window_end,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunApproval:
        return cls(
            expires_at=datetime.fromisoformat(data["expires_at"]),
            min_approvers=int(data["min_approvers"]),
            approvers=tuple(
                Approver(a["principal"], datetime.fromisoformat(a["at"]), a.get("comment") or "")
                for a in data.get("approvers") or ()
            ),
            rejected_by=data.get("rejected_by") or "",
            comment=data.get("comment") or "",
            decided_at=datetime.fromisoformat(data["decided_at"]) if data.get("decided_at") else None,
            edited_by=data.get("edited_by") or "",
            at_window_end=bool(data.get("at_window_end")),
        )


def opened(
    policy: ApprovalPolicy,
    fired_at: datetime,
    approver: Approver | None,
    edited_by: str,
    window_end: datetime | None,
) -> RunApproval:
    """The approval of a run fired at `fired_at` from a schedule `edited_by` last edited; `approver`: a
    manual trigger's caller who approved it as it fired (`approve = true`), counted as the first approver
    (decided at once when that is enough). `window_end`: its operation's own window end (a firmware
    upgrade's end_time; None: none), its expiry when that comes before the policy's timeout: approved at or
    past it, each task the run started would fail unrun at its claim, so the expiry sweep ends it then as
    any run not approved in time (`schedules.approvals`), rather than leave it awaiting a rejection."""
    timed_out = fired_at + policy.timeout
    expires_at = min(timed_out, window_end) if window_end is not None else timed_out
    approval = RunApproval(
        expires_at, policy.min_approvers, edited_by=edited_by, at_window_end=expires_at != timed_out
    )
    return with_approver(approval, approver) if approver is not None else approval


def with_approver(approval: RunApproval, approver: Approver) -> RunApproval:
    """The approval with one more approver, decided when that makes enough."""
    added = replace(approval, approvers=(*approval.approvers, approver))
    return replace(added, decided_at=approver.at) if added.approved else added


def check_decider(
    approval: RunApproval, principal: str, last_editor: str, *, identified: bool, field: str = "id"
) -> None:
    """Refuse a decision, approval or rejection, `principal` may not make (PermissionDenied): the
    two-person rule.

    The schedule's last editor, now (`last_editor`) or when the run fired (`approval.edited_by`: another's
    edit since does not make it someone else's work), may neither approve nor reject its firings. Anyone
    else the approver role admits may reject, one who approved it earlier too (a change of mind).
    `identified`: the caller is named by a token or a client certificate. An anonymous caller cannot be
    told from anyone, so it may not decide a run of a schedule a named principal edited; a schedule only
    anonymous callers edited (no authentication configured) has no editor to tell it from.
    """
    editors = [e for e in (last_editor, approval.edited_by) if e]
    if identified and principal in editors:
        when = "" if principal == last_editor else " this run fired from"
        raise PermissionDenied(
            f"{field}: {principal!r} last edited the schedule{when} and may not approve or reject its runs "
            "(two-person rule: another approver must)"
        )
    if not identified and editors:
        raise PermissionDenied(
            f"{field}: an anonymous caller may not approve or reject the runs of a schedule {editors[0]!r} "
            "edited: rackflow cannot tell it from them (two-person rule); call with a bearer token or a "
            "client certificate"
        )


def check_approver(
    approval: RunApproval, principal: str, last_editor: str, *, identified: bool, field: str = "id"
) -> None:
    """Refuse an approval `principal` may not give: the decider's rule (`check_decider`), and each
    principal counts once towards `min_approvers` (FailedPrecondition). Anonymous callers cannot be told
    apart, so their approval can count only where one approver is enough."""
    check_decider(approval, principal, last_editor, identified=identified, field=field)
    if not identified and approval.min_approvers > 1:
        raise FailedPrecondition(
            f"{field}: this run needs {approval.min_approvers} distinct approvers, and anonymous callers "
            "cannot be told apart (no bearer tokens or client certificates are configured), so an anonymous "
            "approval cannot count towards them; approve with a bearer token or a client certificate "
            "(--auth-tokens or --tls-client-ca), or reject the run"
        )
    if any(a.principal == principal for a in approval.approvers):
        raise FailedPrecondition(
            f"{field}: {principal!r} has already approved this run; another approver must"
        )


def weakens(before: ApprovalPolicy | None, after: ApprovalPolicy | None) -> bool:
    """Whether a schedule whose approval policy was `before` is left a weaker approval gate by `after`
    (None: no policy, as a deleted schedule has none): no policy where there was one, or fewer
    `min_approvers`. A timeout, longer or shorter, is not weaker: a run approved in time starts either way,
    and one not approved never does."""
    return before is not None and (after is None or after.min_approvers < before.min_approvers)


def may_weaken(caller: Principal) -> bool:
    """Whether `caller` may weaken a schedule's approval gate (`check_may_weaken`): the approver role. The
    console asks it too, to offer an operator no weaker gate than a schedule has rather than a choice the
    service would refuse on save."""
    return caller.role.holds(Role.APPROVER)


def check_may_weaken(
    before: ApprovalPolicy | None,
    after: ApprovalPolicy | None,
    caller: Principal | None,
    *,
    schedule: str,
    field: str,
    deleting: bool = False,
) -> None:
    """Refuse (PermissionDenied, naming `field` and the caller's role) a change of schedule `schedule`'s
    approval policy from `before` to `after` that `weakens` it, or its delete (`deleting`, `after` None),
    unless `caller` holds the approver role. `caller` None: rackflow itself, which holds every role.

    Why: an operator, who may not approve a run, could otherwise remove the policy, lower its
    `min_approvers` or delete the schedule, then trigger what it held (or make it again without one), and
    the approval gate were for show. Without authentication every caller holds the approver role, so
    nothing changes there."""
    if before is None or caller is None or may_weaken(caller) or not weakens(before, after):
        return
    if deleting:
        doing = f"deleting schedule {schedule!r}, whose runs need approval ({before.describe()}),"
    elif after is None:
        doing = f"removing the approval policy ({before.describe()}) of schedule {schedule!r}"
    else:
        doing = (
            f"lowering the approvers schedule {schedule!r} needs from {before.min_approvers} to "
            f"{after.min_approvers}"
        )
    raise PermissionDenied(
        f"{field}: {doing} needs the approver role: the {caller.role.value} role of {caller.name!r} may not "
        "weaken the approval of runs it may not approve"
    )


@dataclass(frozen=True)
class Approvers:
    """Who this server lets approve, as far as it can count them: the names of its approver-role tokens
    (`names`); without authentication (`anonymous`), every caller, as one `anonymous` (`check_approver`:
    anonymous callers cannot be told apart). Under mutual TLS without tokens they are not `counted`: any
    certificate its CA signs may approve, and the server cannot know how many there are.

    Why: an approval policy that asks for more approvers than may approve is never met: each firing
    awaits approval and expires. The server reads its tokens at start-up, so it can refuse such a policy
    when it is set and name the schedules a change of its tokens left so (`unapprovable`)."""

    names: frozenset[str] = frozenset()
    anonymous: bool = False
    counted: bool = True


# A process that does not know its callers' credentials (services built without a server): nothing counted.
UNCOUNTED = Approvers(counted=False)


def check_approvable(
    policy: ApprovalPolicy | None, approvers: Approvers, last_editor: str, field: str
) -> None:
    """Refuse (FailedPrecondition, naming `field`, the policy's `min_approvers`) an edit after which no run
    of the schedule could be approved: `policy` is its approval policy then, `last_editor` its last
    editor (the edit's caller)."""
    if policy is None:
        return
    why = unapprovable(policy, approvers, last_editor)
    if why is not None:
        raise FailedPrecondition(f"{field}: {counted(policy.min_approvers, 'approver')} needed, {why}")


def unapprovable(policy: ApprovalPolicy, approvers: Approvers, last_editor: str) -> str | None:
    """Why no run of a schedule with `policy`, last edited by `last_editor` ("" when rackflow or an
    anonymous caller did), can ever be approved by `approvers`, as words that follow "N approvers
    needed, "; None when one can (or the approvers are not counted).

    The one rule for a policy's create and update, a re-scope (its caller becomes the last editor) and the
    start-up look at the stored schedules. It is the two-person rule counted (`check_decider`): the last
    editor may not approve, and an anonymous caller counts once and not for a schedule a named principal
    edited (`check_approver`)."""
    if not approvers.counted:
        return None
    needed = policy.min_approvers
    if approvers.anonymous:
        if not last_editor:
            able = 1
            who = "and anonymous callers cannot be told apart"
        else:
            able = 0
            who = (
                f"and an anonymous caller may not approve the runs of a schedule {last_editor!r} last "
                "edited (two-person rule)"
            )
        if needed <= able:
            return None
        return (
            f"but {_only(able)} may approve its runs on this server: without authentication every caller "
            f"is 'anonymous', {who}; {_ask_for(able)}configure --auth-tokens (role: approver) or "
            "--tls-client-ca"
        )
    able_names = sorted(approvers.names - {last_editor})
    if needed <= len(able_names):
        return None
    shown = f" ({', '.join(able_names)})" if able_names else ""
    editor = (
        f"; {last_editor!r} last edited it and may not (two-person rule)"
        if last_editor in approvers.names
        else ""
    )
    return (
        f"but {_only(len(able_names))} may approve its runs with this server's tokens{shown}{editor}; "
        f"{_ask_for(len(able_names))}give more tokens the approver role (--auth-tokens)"
    )


def _only(able: int) -> str:
    return f"only {counted(able, 'principal')}" if able else "no principal"


def _ask_for(able: int) -> str:
    return f"ask for at most {able}, or " if able else ""


def expiry_text(approval: RunApproval) -> str:
    """Its `expires_at` as people read it: `2026-…Z`, and, when that is its firmware window's end,
    `2026-…Z, its firmware window's end (its upgrade's end_time)`."""
    window = ", its firmware window's end (its upgrade's end_time)" if approval.at_window_end else ""
    return f"{format_rfc3339(approval.expires_at)}{window}"


def describe_expiry(approval: RunApproval) -> str:
    """The reason an expired run records."""
    got = len(approval.approvers)
    return (
        f"not approved by {expiry_text(approval)} "
        f"({got} of {approval.min_approvers} approver{'s' if approval.min_approvers != 1 else ''})"
    )
