"""Task RPCs: the six operation submitters, ListTasks, GetTasksByIDs and CancelTask.

Each handler converts the request, delegates to the task manager and converts the answer back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from grpc.aio import ServicerContext as Context

from rackflow.api.convert import next_page_token, page_from, required_uuid, target_spec_from, total_to
from rackflow.api.convert.tasks import (
    OperationRequest,
    operation_from_request,
    task_statuses_from,
    task_to,
    tasks_into,
)
from rackflow.api.errors import rpc
from rackflow.domain.tasks import OperationKind
from rackflow.errors import InvalidArgument
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:
    from rackflow.services import Services

MAX_TASK_IDS = 1000


class TaskRpcs:
    """The task part of the `Flow` servicer."""

    services: Services

    async def _submit(self, kind: OperationKind, request: OperationRequest) -> pb.SubmitTaskResponse:
        operation, queue, description = operation_from_request(kind, request)
        spec = target_spec_from(request.target_spec)
        made = await self.services.tasks.submit(operation, spec, description=description, queue=queue)
        return pb.SubmitTaskResponse(task_ids=[pb.UUID(id=str(t.id)) for t in made])

    @rpc
    async def PowerOnRack(self, request: pb.PowerOnRackRequest, context: Context) -> pb.SubmitTaskResponse:
        return await self._submit(OperationKind.POWER_ON, request)

    @rpc
    async def PowerOffRack(self, request: pb.PowerOffRackRequest, context: Context) -> pb.SubmitTaskResponse:
        return await self._submit(OperationKind.POWER_OFF, request)

    @rpc
    async def PowerResetRack(
        self, request: pb.PowerResetRackRequest, context: Context
    ) -> pb.SubmitTaskResponse:
        return await self._submit(OperationKind.POWER_RESET, request)

    @rpc
    async def BringUpRack(self, request: pb.BringUpRackRequest, context: Context) -> pb.SubmitTaskResponse:
        return await self._submit(OperationKind.BRING_UP, request)

    @rpc
    async def IngestRack(self, request: pb.IngestRackRequest, context: Context) -> pb.SubmitTaskResponse:
        return await self._submit(OperationKind.INGEST, request)

    @rpc
    async def UpgradeFirmware(
        self, request: pb.UpgradeFirmwareRequest, context: Context
    ) -> pb.SubmitTaskResponse:
        return await self._submit(OperationKind.UPGRADE_FIRMWARE, request)

    @rpc
    async def ListTasks(self, request: pb.ListTasksRequest, context: Context) -> pb.ListTasksResponse:
        rack_id = required_uuid(request.rack_id, "rack_id") if request.HasField("rack_id") else None
        schedule_id = (
            required_uuid(request.schedule_id, "schedule_id") if request.HasField("schedule_id") else None
        )
        page = page_from(request.pagination if request.HasField("pagination") else None, "ListTasks")
        found, counted = await self.services.tasks.list_tasks(
            rack_id=rack_id,
            schedule_id=schedule_id,
            active_only=request.active_only,
            statuses=task_statuses_from(request.statuses, "statuses"),
            offset=page.offset,
            limit=page.limit,
            after=page.after,
        )
        total, capped = total_to(counted)
        response = pb.ListTasksResponse(
            total=total,
            total_capped=capped,
            next_page_token=next_page_token("ListTasks", page.limit, found, lambda t: (t.created_at, t.id)),
        )
        tasks_into(response.tasks, found)
        return response

    @rpc
    async def GetTasksByIDs(
        self, request: pb.GetTasksByIDsRequest, context: Context
    ) -> pb.GetTasksByIDsResponse:
        if len(request.task_ids) > MAX_TASK_IDS:
            raise InvalidArgument(f"task_ids: at most {MAX_TASK_IDS} ids, got {len(request.task_ids)}")
        ids = [required_uuid(msg, f"task_ids[{i}]") for i, msg in enumerate(request.task_ids)]
        found = await self.services.tasks.get_tasks(ids)
        attempts = await self.services.tasks.attempts([t.id for t in found if t.retry is not None])
        checks = await self.services.checks.latest_rounds([t.id for t in found])
        response = pb.GetTasksByIDsResponse()
        tasks_into(response.tasks, found, attempts, checks)
        return response

    @rpc
    async def CancelTask(self, request: pb.CancelTaskRequest, context: Context) -> pb.CancelTaskResponse:
        task = await self.services.tasks.cancel(required_uuid(request.task_id, "task_id"))
        return pb.CancelTaskResponse(task=task_to(task))
