"""Pre-flight check RPCs, and the override of one task's checks: validate, convert, delegate, convert back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf.empty_pb2 import Empty
from grpc.aio import ServicerContext as Context

from rackflow.api.convert import required_uuid
from rackflow.api.convert.checks import check_from, check_to
from rackflow.api.convert.tasks import task_to
from rackflow.api.errors import rpc
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:
    from rackflow.services import Services


class CheckRpcs:
    """The pre-flight check part of the `Flow` servicer."""

    services: Services

    @rpc
    async def CreatePreflightCheck(
        self, request: pb.CreatePreflightCheckRequest, context: Context
    ) -> pb.PreflightCheck:
        return check_to(await self.services.checks.create(check_from(request.check)))

    @rpc
    async def GetPreflightCheck(
        self, request: pb.GetPreflightCheckRequest, context: Context
    ) -> pb.PreflightCheck:
        return check_to(await self.services.checks.get(required_uuid(request.id, "id")))

    @rpc
    async def ListPreflightChecks(
        self, request: pb.ListPreflightChecksRequest, context: Context
    ) -> pb.ListPreflightChecksResponse:
        checks = await self.services.checks.list_checks()
        return pb.ListPreflightChecksResponse(checks=[check_to(c) for c in checks])

    @rpc
    async def UpdatePreflightCheck(
        self, request: pb.UpdatePreflightCheckRequest, context: Context
    ) -> pb.PreflightCheck:
        check_id = required_uuid(request.id, "id")
        given = check_from(request.check)
        return check_to(await self.services.checks.update(check_id, list(request.update_mask.paths), given))

    @rpc
    async def DeletePreflightCheck(self, request: pb.DeletePreflightCheckRequest, context: Context) -> Empty:
        await self.services.checks.delete(required_uuid(request.id, "id"))
        return Empty()

    @rpc
    async def OverridePreflightChecks(
        self, request: pb.OverridePreflightChecksRequest, context: Context
    ) -> pb.Task:
        task_id = required_uuid(request.task_id, "task_id")
        return task_to(await self.services.checks.override(task_id, request.reason, list(request.checks)))
