"""Schedule RPCs: validate, convert, delegate, convert back."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from google.protobuf.empty_pb2 import Empty
from grpc.aio import ServicerContext as Context

from rackflow.api.convert import (
    next_page_token,
    page_from,
    page_token,
    required_uuid,
    target_spec_from,
    timestamp_from,
    total_to,
    uuid_from,
)
from rackflow.api.convert.policies import retry_policy_from, rollout_from
from rackflow.api.convert.schedules import (
    approval_from,
    basic_view_from,
    listed_scope_into,
    overlap_policy_from,
    planned_firing_to,
    preview_to,
    run_page_key,
    run_summary_to,
    run_to,
    schedule_to,
    scopes_into,
    spec_from,
    spec_type_from,
    triggered_to,
)
from rackflow.api.convert.tasks import operation_kind_from, scheduled_operation_from
from rackflow.api.convert.windows import window_policy_from
from rackflow.api.errors import rpc
from rackflow.errors import InvalidArgument, NotFound, PermissionDenied
from rackflow.schedules.service import (
    APPROVAL_PATH,
    OVERLAP_POLICY_PATH,
    RETRY_PATH,
    ROLLOUT_PATH,
    SPEC_PATH,
    START_DEADLINE_PATH,
    WINDOW_POLICY_PATH,
    Draft,
    parse_order,
)
from rackflow.security import Role, caller_holds, caller_name
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import check_request_id, preview_count, start_deadline

if TYPE_CHECKING:
    from rackflow.domain.schedules import Schedule
    from rackflow.services import Services


class ScheduleRpcs:
    """The task-schedule part of the `Flow` servicer."""

    services: Services

    @rpc
    async def CreateTaskSchedule(
        self, request: pb.CreateTaskScheduleRequest, context: Context
    ) -> pb.TaskSchedule:
        schedule = await self.services.schedules.create(**vars(draft_from(request)))
        return schedule_to(schedule)

    @rpc
    async def GetTaskSchedule(self, request: pb.GetTaskScheduleRequest, context: Context) -> pb.TaskSchedule:
        return schedule_to(await self.services.schedules.get(required_uuid(request.id, "id")))

    @rpc
    async def ListTaskSchedules(
        self, request: pb.ListTaskSchedulesRequest, context: Context
    ) -> pb.ListTaskSchedulesResponse:
        rack_id = uuid_from(request.rack_id, "rack_id") if request.HasField("rack_id") else None
        order = parse_order(request.order_by)
        # A token is of one order: the key it holds is a row's place in that order only.
        listing = f"ListTaskSchedules:{order.name}"
        page = page_from(request.pagination if request.HasField("pagination") else None, listing)
        response = pb.ListTaskSchedulesResponse()
        last: list[Schedule] = []

        def add(chunk: list[Schedule]) -> None:  # each chunk becomes messages before the next is read
            response.task_schedules.extend(schedule_to(s) for s in chunk)
            last[:] = chunk[-1:]

        listed = await self.services.schedules.each_schedule_chunk(
            add,
            rack_id=rack_id,
            enabled_only=request.enabled_only,
            paused_only=request.paused_only,
            name_contains=request.name_contains,
            operation=operation_kind_from(request.operation_type, "operation_type"),
            order=order,
            offset=page.offset,
            limit=page.limit,
            after=page.after,
        )
        response.total, response.total_capped = total_to(listed.total, bounded=listed.count_bounded)
        # The page's rows are messages by now: its last schedule gives the key (a short search's page,
        # short or empty, searches on from where its walk stopped).
        response.next_page_token = next_page_token(
            listing, page.limit, response.task_schedules, lambda _: order.key_of(last[0]), listed.searched_to
        )
        return response

    @rpc
    async def UpdateTaskSchedule(
        self, request: pb.UpdateTaskScheduleRequest, context: Context
    ) -> pb.TaskSchedule:
        schedule_id = required_uuid(request.id, "id")
        paths = list(request.update_mask.paths)
        config = request.schedule
        # Only masked fields are read, so an unset (zero) enum outside the mask is not an error.
        policy = overlap_policy_from(config.overlap_policy) if OVERLAP_POLICY_PATH in paths else None
        spec_type = spec_type_from(config.spec.type, f"{SPEC_PATH}.type") if SPEC_PATH in paths else None
        window_policy = window_policy_from(config.window_policy) if WINDOW_POLICY_PATH in paths else None
        rollout = (
            rollout_from(config.rollout) if ROLLOUT_PATH in paths and config.HasField("rollout") else None
        )
        retry = retry_policy_from(config.retry) if RETRY_PATH in paths and config.HasField("retry") else None
        schedule = await self.services.schedules.update(
            schedule_id,
            paths,
            name=config.name,
            overlap_policy=policy,
            spec_type=spec_type,
            spec=config.spec.spec,
            timezone=config.spec.timezone if config.HasField("spec") else None,
            window_policy=window_policy,
            rollout=rollout,
            approval=approval_from(config.approval) if APPROVAL_PATH in paths else None,
            start_deadline=start_deadline(config.start_deadline) if START_DEADLINE_PATH in paths else None,
            pause_after_failed_runs=config.pause_after_failed_runs,
            retry=retry,
        )
        return schedule_to(schedule)

    @rpc
    async def PauseTaskSchedule(
        self, request: pb.PauseTaskScheduleRequest, context: Context
    ) -> pb.TaskSchedule:
        resume_at = timestamp_from(request.resume_at, "resume_at") if request.HasField("resume_at") else None
        schedule = await self.services.schedules.pause(
            required_uuid(request.id, "id"), reason=request.reason, resume_at=resume_at, by=caller_name()
        )
        return schedule_to(schedule)

    @rpc
    async def ResumeTaskSchedule(
        self, request: pb.ResumeTaskScheduleRequest, context: Context
    ) -> pb.TaskSchedule:
        return schedule_to(await self.services.schedules.resume(required_uuid(request.id, "id")))

    @rpc
    async def DeleteTaskSchedule(self, request: pb.DeleteTaskScheduleRequest, context: Context) -> Empty:
        await self.services.schedules.delete(required_uuid(request.id, "id"))
        return Empty()

    @rpc
    async def TriggerTaskSchedule(
        self, request: pb.TriggerTaskScheduleRequest, context: Context
    ) -> pb.SubmitTaskResponse:
        schedule_id = required_uuid(request.id, "id")
        if request.approve and not caller_holds(Role.APPROVER):
            raise PermissionDenied(
                "approve: only the approver role may approve a firing as it triggers it "
                "(trigger without approve: the firing awaits approval)"
            )
        request_id = check_request_id(request.request_id)
        answer = await self.services.schedules.trigger_run(
            schedule_id, approve=request.approve, request_id=request_id
        )
        return triggered_to(answer)

    @rpc
    async def AddTaskScheduleScope(
        self, request: pb.AddTaskScheduleScopeRequest, context: Context
    ) -> pb.AddTaskScheduleScopeResponse:
        schedule_id = required_uuid(request.schedule_id, "schedule_id")
        target = target_spec_from(request.target_spec, "target_spec")
        scopes = await self.services.schedules.add_scope(schedule_id, target)
        response = pb.AddTaskScheduleScopeResponse()
        scopes_into(response.scopes, scopes)
        return response

    @rpc
    async def RemoveTaskScheduleScope(
        self, request: pb.RemoveTaskScheduleScopeRequest, context: Context
    ) -> Empty:
        await self.services.schedules.remove_scope(required_uuid(request.scope_id, "scope_id"))
        return Empty()

    @rpc
    async def UpdateTaskScheduleScope(
        self, request: pb.UpdateTaskScheduleScopeRequest, context: Context
    ) -> pb.UpdateTaskScheduleScopeResponse:
        schedule_id = required_uuid(request.schedule_id, "schedule_id")
        desired = target_spec_from(request.desired_scope, "desired_scope")
        scopes, changes = await self.services.schedules.update_scope(schedule_id, desired)
        response = pb.UpdateTaskScheduleScopeResponse(
            added=changes.added, removed=changes.removed, updated=changes.updated
        )
        scopes_into(response.scopes, scopes)
        return response

    @rpc
    async def ListTaskScheduleScopes(
        self, request: pb.ListTaskScheduleScopesRequest, context: Context
    ) -> pb.ListTaskScheduleScopesResponse:
        schedule_id = required_uuid(request.schedule_id, "schedule_id")
        page = page_from(
            request.pagination if request.HasField("pagination") else None, "ListTaskScheduleScopes"
        )
        listed, counted = await self.services.schedules.scope_list_page(
            schedule_id, offset=page.offset, limit=page.limit, after=page.after
        )
        response = pb.ListTaskScheduleScopesResponse(
            next_page_token=next_page_token(
                "ListTaskScheduleScopes", page.limit, listed, lambda entry: (uuid.UUID(entry.rack_id),)
            )
        )
        response.total, response.total_capped = total_to(counted)
        schedule_text = str(schedule_id)
        for entry in listed:
            listed_scope_into(response.scopes.add(rack_name=entry.rack_name), entry, schedule_text)
        return response

    @rpc
    async def CheckScheduleConflicts(
        self, request: pb.CheckScheduleConflictsRequest, context: Context
    ) -> pb.CheckScheduleConflictsResponse:
        operation, _queue, _description, target = scheduled_operation_from(request.operation)
        exclude = (
            uuid_from(request.exclude_schedule_id, "exclude_schedule_id")
            if request.HasField("exclude_schedule_id")
            else None
        )
        conflicts = await self.services.schedules.check_conflicts(operation, target, exclude)
        return pb.CheckScheduleConflictsResponse(conflicts=[schedule_to(s) for s in conflicts])

    @rpc
    async def PreviewScheduleSpec(
        self, request: pb.PreviewScheduleSpecRequest, context: Context
    ) -> pb.PreviewScheduleSpecResponse:
        spec = spec_from(request.spec, "spec")
        after = timestamp_from(request.after, "after") if request.HasField("after") else None
        times = self.services.schedules.preview(spec, after, request.count)
        return preview_to(times)

    @rpc
    async def ListTaskScheduleRuns(
        self, request: pb.ListTaskScheduleRunsRequest, context: Context
    ) -> pb.ListTaskScheduleRunsResponse:
        schedule_id = required_uuid(request.schedule_id, "schedule_id")
        page = page_from(
            request.pagination if request.HasField("pagination") else None, "ListTaskScheduleRuns"
        )
        basic = basic_view_from(request.view)
        after, within = run_page_key(page.after)
        if not basic and page.limit is not None:  # at most RUN_OUTCOMES_PER_PAGE outcomes a page
            reports, counted, next_key = await self.services.schedules.full_runs_page(
                schedule_id, offset=page.offset, limit=page.limit, after=after, within=within
            )
            total, capped = total_to(counted)
            return pb.ListTaskScheduleRunsResponse(
                runs=[run_to(r) for r in reports],
                total=total,
                total_capped=capped,
                next_page_token=page_token("ListTaskScheduleRuns", next_key) if next_key else "",
            )
        runs, counted = await self.services.schedules.list_runs(
            schedule_id, offset=page.offset, limit=page.limit, after=after, outcomes=not basic
        )
        if basic:
            converted = [run_summary_to(s) for s in await self.services.rollouts.summaries(runs)]
        else:
            converted = [run_to(r) for r in await self.services.rollouts.reports(runs)]
        total, capped = total_to(counted)
        return pb.ListTaskScheduleRunsResponse(
            runs=converted,
            total=total,
            total_capped=capped,
            next_page_token=next_page_token(
                "ListTaskScheduleRuns", page.limit, runs, lambda r: (r.fired_at, r.id)
            ),
        )

    @rpc
    async def GetTaskScheduleRun(
        self, request: pb.GetTaskScheduleRunRequest, context: Context
    ) -> pb.TaskScheduleRun:
        return run_to(await self.services.rollouts.get(required_uuid(request.id, "id")))

    @rpc
    async def ResumeTaskScheduleRun(
        self, request: pb.ResumeTaskScheduleRunRequest, context: Context
    ) -> pb.TaskScheduleRun:
        return run_to(await self.services.rollouts.resume(required_uuid(request.id, "id")))

    @rpc
    async def CancelTaskScheduleRun(
        self, request: pb.CancelTaskScheduleRunRequest, context: Context
    ) -> pb.TaskScheduleRun:
        return run_to(await self.services.rollouts.cancel(required_uuid(request.id, "id")))

    @rpc
    async def ApproveTaskScheduleRun(
        self, request: pb.ApproveTaskScheduleRunRequest, context: Context
    ) -> pb.TaskScheduleRun:
        run_id = required_uuid(request.id, "id")
        return run_to(await self.services.approvals.approve(run_id, request.comment))

    @rpc
    async def RejectTaskScheduleRun(
        self, request: pb.RejectTaskScheduleRunRequest, context: Context
    ) -> pb.TaskScheduleRun:
        run_id = required_uuid(request.id, "id")
        return run_to(await self.services.approvals.reject(run_id, request.comment))

    @rpc
    async def RetryTaskScheduleRun(
        self, request: pb.RetryTaskScheduleRunRequest, context: Context
    ) -> pb.TaskScheduleRun:
        only_failed = request.only_failed if request.HasField("only_failed") else True
        run_id = required_uuid(request.id, "id")
        request_id = check_request_id(request.request_id)
        return run_to(
            await self.services.schedules.retry_run(run_id, only_failed=only_failed, request_id=request_id)
        )

    @rpc
    async def PreviewTaskSchedule(
        self, request: pb.PreviewTaskScheduleRequest, context: Context
    ) -> pb.PreviewTaskScheduleResponse:
        after = timestamp_from(request.after, "after") if request.HasField("after") else None
        resume_at = timestamp_from(request.resume_at, "resume_at") if request.HasField("resume_at") else None
        if resume_at is not None and request.HasField("draft"):
            raise InvalidArgument("resume_at: previews a saved schedule as if resumed; not with draft")
        if not request.HasField("draft"):
            schedule_id = required_uuid(request.id, "id")
            planned = await self.services.schedules.preview_schedule(
                schedule_id, after, request.count, resume_at=resume_at
            )
            return pb.PreviewTaskScheduleResponse(firings=[planned_firing_to(p) for p in planned])
        # What is not the draft's is checked first, so an error under `draft.` is the draft's own.
        count = preview_count(request.count)
        editing = uuid_from(request.id, "id") if request.HasField("id") else None
        if editing is not None:
            await self.services.schedules.get(editing)
        try:
            draft = draft_from(request.draft)
            planned = await self.services.schedules.preview_draft(draft, editing, after, count)
        except (InvalidArgument, NotFound) as exc:  # the draft's fields, named as the request names them
            raise type(exc)(f"draft.{exc}") from None
        return pb.PreviewTaskScheduleResponse(firings=[planned_firing_to(p) for p in planned])


def draft_from(request: pb.CreateTaskScheduleRequest) -> Draft:
    """The schedule a CreateTaskSchedule request describes, its enums and rollout checked."""
    config = request.schedule
    spec = spec_from(config.spec)
    overlap_policy = overlap_policy_from(config.overlap_policy)
    operation, queue, description, target = scheduled_operation_from(request.operation)
    return Draft(
        name=config.name,
        spec=spec,
        overlap_policy=overlap_policy,
        operation=operation,
        queue=queue,
        description=description,
        target=target,
        window_policy=window_policy_from(config.window_policy),
        rollout=rollout_from(config.rollout) if config.HasField("rollout") else None,
        approval=approval_from(config.approval),
        start_deadline=start_deadline(config.start_deadline),
        pause_after_failed_runs=config.pause_after_failed_runs,
        retry=retry_policy_from(config.retry) if config.HasField("retry") else None,
    )
