"""Schedule messages to domain values and back.

Enums are checked here (an UNSPECIFIED or unknown number is INVALID_ARGUMENT naming the field); the spec
text and timezone are checked by the service, which owns `parse_spec`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from rackflow.api.convert import (
    component_type_to,
    timestamp_from_micros_into,
    timestamp_into,
    timestamp_to,
    uuid_to,
)
from rackflow.api.convert.policies import retry_policy_to, rollout_to
from rackflow.api.convert.tasks import scheduled_operation_to, task_status_to
from rackflow.api.convert.windows import window_policy_to
from rackflow.domain.approvals import ApprovalPolicy, RunApproval
from rackflow.domain.inventory import ComponentFilter, ComponentsFilter, TypesFilter
from rackflow.domain.schedules import (
    ListedScope,
    OverlapPolicy,
    Pause,
    Run,
    Schedule,
    Scope,
    ScopeOutcome,
)
from rackflow.domain.tasks import QueueOptions, TaskStatus
from rackflow.errors import InvalidArgument
from rackflow.rollouts.service import Progress, RunReport, RunSummary
from rackflow.schedules.service import PlannedFiring, PlannedScope, Triggered
from rackflow.timespec import ScheduleSpec, SpecType, format_go_duration
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import approval_policy

_SPEC_TYPE_FROM_PB = {
    pb.SCHEDULE_SPEC_TYPE_INTERVAL: SpecType.INTERVAL,
    pb.SCHEDULE_SPEC_TYPE_CRON: SpecType.CRON,
    pb.SCHEDULE_SPEC_TYPE_ONE_TIME: SpecType.ONE_TIME,
}
_SPEC_TYPE_TO_PB = {v: k for k, v in _SPEC_TYPE_FROM_PB.items()}

_POLICY_FROM_PB = {
    pb.OVERLAP_POLICY_SKIP: OverlapPolicy.SKIP,
    pb.OVERLAP_POLICY_QUEUE: OverlapPolicy.QUEUE,
}
_POLICY_TO_PB = {v: k for k, v in _POLICY_FROM_PB.items()}


def spec_type_from(value: int, field: str) -> SpecType:
    try:
        return _SPEC_TYPE_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(
            f"{field}: schedule type {value} is not INTERVAL, CRON or ONE_TIME"
            if value
            else f"{field}: a schedule type is required (INTERVAL, CRON or ONE_TIME)"
        ) from None


def spec_from(msg: pb.ScheduleSpec, field: str = "schedule.spec") -> ScheduleSpec:
    return ScheduleSpec(spec_type_from(msg.type, f"{field}.type"), msg.spec, msg.timezone)


def overlap_policy_from(value: int, field: str = "schedule.overlap_policy") -> OverlapPolicy:
    try:
        return _POLICY_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"{field}: overlap policy {value} is not SKIP or QUEUE") from None


def approval_from(msg: pb.ApprovalPolicy, field: str = "schedule.approval") -> ApprovalPolicy | None:
    """The policy, checked (`validation.approval_policy`); None when not required (or unset)."""
    return approval_policy(msg.required, msg.timeout, msg.min_approvers, field)


def approval_to(policy: ApprovalPolicy | None) -> pb.ApprovalPolicy | None:
    if policy is None:
        return None
    return pb.ApprovalPolicy(
        required=True, timeout=format_go_duration(policy.timeout), min_approvers=policy.min_approvers
    )


def run_approval_to(approval: RunApproval | None) -> pb.RunApproval | None:
    if approval is None:
        return None
    return pb.RunApproval(
        expires_at=timestamp_to(approval.expires_at),
        min_approvers=approval.min_approvers,
        approvers=[
            pb.RunApprover(principal=a.principal, at=timestamp_to(a.at), comment=a.comment)
            for a in approval.approvers
        ],
        rejected_by=approval.rejected_by,
        comment=approval.comment,
        decided_at=timestamp_to(approval.decided_at),
    )


def spec_to(spec: ScheduleSpec) -> pb.ScheduleSpec:
    return pb.ScheduleSpec(type=_SPEC_TYPE_TO_PB[spec.type], spec=spec.spec, timezone=spec.timezone)


def schedule_to(schedule: Schedule) -> pb.TaskSchedule:
    return pb.TaskSchedule(
        id=uuid_to(schedule.id),
        name=schedule.name,
        spec=spec_to(schedule.spec),
        overlap_policy=_POLICY_TO_PB[schedule.overlap_policy],
        enabled=schedule.enabled,
        next_run_at=timestamp_to(schedule.next_run_at),
        last_run_at=timestamp_to(schedule.last_run_at),
        created_at=timestamp_to(schedule.created_at),
        updated_at=timestamp_to(schedule.updated_at),
        operation_type=schedule.operation.kind.value,
        description=schedule.description,
        operation=scheduled_operation_to(
            schedule.operation,
            QueueOptions(schedule.overlap_policy.conflict_strategy, schedule.queue_timeout),
            schedule.description,
        ),
        summary=schedule.operation.summary,
        **_pause_to(schedule.pause),
        window_policy=window_policy_to(schedule.window_policy),
        rollout=rollout_to(schedule.rollout),
        approval=approval_to(schedule.approval),
        last_edited_by=schedule.last_edited_by,
        start_deadline=_duration_to(schedule.start_deadline),
        pause_after_failed_runs=schedule.pause_after_failed_runs,
        retry=retry_policy_to(schedule.retry),
    )


def _duration_to(value: timedelta | None) -> str:
    """A Go duration; None is "" (unset), a zero "0s"."""
    return format_go_duration(value) if value is not None else ""


def _pause_to(pause: Pause | None) -> dict[str, Any]:
    if pause is None:
        return {}
    return {
        "pause_reason": pause.reason,
        "paused_by": pause.by,
        "paused_at": timestamp_to(pause.at),
        "resume_at": timestamp_to(pause.resume_at),
    }


def scopes_into(into: RepeatedCompositeFieldContainer[pb.TaskScheduleScope], scopes: Iterable[Scope]) -> None:
    """Append `scopes` to a response's repeated field, each made in place (`scope_into`)."""
    for scope in scopes:
        scope_into(into.add(), scope)


def scope_into(msg: pb.TaskScheduleScope, scope: Scope) -> pb.TaskScheduleScope:
    """Fill the empty `msg` with `scope`, made in its place in a response (its repeated field's `add`)
    rather than built and appended, which copies it: a 10,000-rack schedule's scopes took 0.3 s to convert
    the other way (docs/PERFORMANCE.md "The unpaged scopes")."""
    msg.id.id = str(scope.id)
    msg.schedule_id.id = str(scope.schedule_id)
    msg.rack_id.id = str(scope.rack_id)
    if scope.last_task_id is not None:
        msg.last_task_id.id = str(scope.last_task_id)
    timestamp_into(msg.created_at, scope.created_at)
    _filter_into(msg, scope.filter)
    return msg


def listed_scope_into(msg: pb.TaskScheduleScope, entry: ListedScope, schedule_id: str) -> None:
    """Fill the empty `msg` with a listed scope entry of the schedule `schedule_id` (as `scope_into`),
    its ids copied as the text they were read as."""
    msg.id.id = entry.id
    msg.schedule_id.id = schedule_id
    msg.rack_id.id = entry.rack_id
    if entry.last_task_id is not None:
        msg.last_task_id.id = entry.last_task_id
    timestamp_from_micros_into(msg.created_at, entry.created_at_us)
    _filter_into(msg, entry.filter)


def _filter_into(msg: pb.TaskScheduleScope, value: ComponentFilter | None) -> None:
    if isinstance(value, TypesFilter):
        msg.types.types.extend(component_type_to(t) for t in sorted(value.types))
    elif isinstance(value, ComponentsFilter):
        msg.components.targets.extend(
            pb.ComponentTarget(id=pb.UUID(id=str(i))) for i in sorted(value.ids, key=str)
        )


def preview_to(times: Sequence[datetime]) -> pb.PreviewScheduleSpecResponse:
    response = pb.PreviewScheduleSpecResponse()
    for moment in times:
        timestamp_into(response.times.add(), moment)
    return response


def outcomes_into(
    target: Any,
    outcomes: Iterable[ScopeOutcome],
    task_statuses: Mapping[uuid.UUID, TaskStatus],
    holds: Mapping[uuid.UUID, tuple[str, str]],
) -> None:
    """Append the outcomes to `target` (a repeated `pb.ScopeOutcome` field), each with its task's status and
    hold, made in place with its ids given as dicts, not made apart, with a `pb.UUID` made for each of its
    ids, and then copied into the run: a run of 1,000 racks' GetTaskScheduleRun took a sixth less CPU
    (docs/PERFORMANCE.md, "The 1,000-row pages at 36 components")."""
    add = target.add
    for o in outcomes:
        status = task_statuses.get(o.task_id) if o.task_id is not None else None
        held_by, held_reason = (holds.get(o.task_id) if o.task_id is not None else None) or ("", "")
        add(
            scope_id={"id": str(o.scope_id)},
            rack_id={"id": str(o.rack_id)},
            outcome=o.outcome,
            task_id={"id": str(o.task_id)} if o.task_id is not None else None,
            error=o.error,
            task_status=task_status_to(status) if status is not None else pb.TASK_STATUS_UNKNOWN,
            canary=o.canary,
            held_by=held_by,
            held_reason=held_reason,
        )


def progress_to(progress: Progress | None) -> pb.RolloutProgress | None:
    if progress is None:
        return None
    return pb.RolloutProgress(
        total=progress.total,
        pending=progress.pending,
        active=progress.active,
        succeeded=progress.succeeded,
        failed=progress.failed,
        not_started=progress.not_started,
        skipped=progress.skipped,
        wave=progress.wave,
        bake_until=timestamp_to(progress.bake_until),
        failures_counted=progress.failures_counted,
    )


def run_to(report: RunReport) -> pb.TaskScheduleRun:
    """The run whole (the FULL view): every outcome, with its task's status and hold."""
    run = report.run
    msg = _run_head_to(run, report.retried_by)
    outcomes_into(msg.outcomes, run.outcomes, report.task_statuses, report.holds)
    msg.first_outcome = report.first_outcome
    msg.outcome_count = len(run.outcomes) if report.outcome_count is None else report.outcome_count
    progress = progress_to(report.progress)
    if progress is not None:
        msg.progress.CopyFrom(progress)
    if report.replayed is not None:  # a retry's answer: whether an earlier retry with its id made the run
        msg.replayed = report.replayed
    return msg


def triggered_to(answer: Triggered) -> pb.SubmitTaskResponse:
    """A trigger's answer: its tasks, its run and when it fired, and whether an earlier call made them."""
    return pb.SubmitTaskResponse(
        task_ids=[pb.UUID(id=str(task_id)) for task_id in answer.task_ids],
        run_id=uuid_to(answer.run_id),
        fired_at=timestamp_to(answer.fired_at),
        replayed=answer.replayed,
    )


def run_summary_to(summary: RunSummary) -> pb.TaskScheduleRun:
    """The run's BASIC view: no outcomes, its racks by outcome and its tasks by status instead."""
    msg = _run_head_to(summary.run, summary.retried_by)
    by_outcome: dict[str, pb.OutcomeCount] = {}
    for (outcome, with_task), racks in sorted(summary.tally.items()):
        count = by_outcome.setdefault(outcome, pb.OutcomeCount(outcome=outcome))
        count.racks += racks
        count.with_task += racks if with_task else 0
    msg.outcome_counts.extend(by_outcome.values())
    msg.outcome_count = sum(summary.tally.values())
    msg.task_counts.extend(
        pb.TaskStatusCount(status=task_status_to(status), tasks=tasks)
        for status, tasks in sorted(summary.task_counts.items(), key=lambda item: item[0].value)
    )
    return msg


def _run_head_to(run: Run, retried_by: Sequence[uuid.UUID]) -> pb.TaskScheduleRun:
    """A run's own fields, which every view carries."""
    return pb.TaskScheduleRun(
        id=uuid_to(run.id),
        schedule_id=uuid_to(run.schedule_id),
        fired_at=timestamp_to(run.fired_at),
        trigger=run.trigger,
        state=run.state,
        rollout=rollout_to(run.rollout),
        reason=run.reason,
        approval=run_approval_to(run.approval),
        scheduled_for=timestamp_to(run.scheduled_for),
        late_by=_duration_to(run.late_by),
        retry_of=uuid_to(run.retry_of),
        retried_by=[pb.UUID(id=str(i)) for i in retried_by],
    )


_VIEWS = (
    pb.TASK_SCHEDULE_RUN_VIEW_UNSPECIFIED,
    pb.TASK_SCHEDULE_RUN_VIEW_BASIC,
    pb.TASK_SCHEDULE_RUN_VIEW_FULL,
)


def run_page_key(after: tuple[Any, ...] | None, field: str = "pagination.page_token") -> tuple[Any, int]:
    """A ListTaskScheduleRuns token's run key (fired_at, id), and the outcome of that run its page begins
    at (a FULL page that ended within a run: 0 otherwise, the page begins after the run)."""
    if after is None or len(after) == 2:
        return after, 0
    if len(after) == 3 and isinstance(after[2], int) and after[2] > 0:
        return after[:2], after[2]
    raise InvalidArgument(f"{field}: not a page token of 'ListTaskScheduleRuns'")


def basic_view_from(value: int, field: str = "view") -> bool:
    """Whether the request asks for the BASIC view of runs (unset: FULL, as before views existed)."""
    if value not in _VIEWS:
        raise InvalidArgument(f"{field}: run view {value} is not BASIC or FULL")
    return value == pb.TASK_SCHEDULE_RUN_VIEW_BASIC


def _scope_decision_to(planned: PlannedScope, resume_at: datetime | None) -> pb.ScopeDecision:
    msg = pb.ScopeDecision(
        scope_id=uuid_to(planned.scope.id),
        rack_id=uuid_to(planned.scope.rack_id),
        rack_name=planned.rack_name,
    )
    decision = planned.decision
    if decision is None:
        msg.MergeFrom(pb.ScopeDecision(decision="paused", until=timestamp_to(resume_at)))
        return msg
    msg.MergeFrom(
        pb.ScopeDecision(
            decision=decision.action,
            reason=planned.reason,
            window_name=decision.closed.window.name if decision.closed is not None else "",
            until=timestamp_to(decision.opens_at),
            closes_at=timestamp_to(decision.closes_at),
        )
    )
    return msg


def planned_firing_to(planned: PlannedFiring) -> pb.PreviewFiring:
    return pb.PreviewFiring(
        at=timestamp_to(planned.at),
        scopes=[_scope_decision_to(s, planned.resume_at) for s in planned.scopes],
        needs_approval=planned.needs_approval,
        would_be_missed=planned.would_be_missed,
    )
