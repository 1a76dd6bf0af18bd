"""Maintenance window RPCs: validate, convert, delegate, convert back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf.empty_pb2 import Empty
from grpc.aio import ServicerContext as Context

from rackflow.api.convert import required_uuid, timestamp_from, uuid_from
from rackflow.api.convert.windows import event_to, window_from, window_to
from rackflow.api.errors import rpc
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:
    from rackflow.services import Services


class WindowRpcs:
    """The maintenance-window part of the `Flow` servicer."""

    services: Services

    @rpc
    async def CreateMaintenanceWindow(
        self, request: pb.CreateMaintenanceWindowRequest, context: Context
    ) -> pb.MaintenanceWindow:
        return window_to(await self.services.windows.create(window_from(request.window)))

    @rpc
    async def GetMaintenanceWindow(
        self, request: pb.GetMaintenanceWindowRequest, context: Context
    ) -> pb.MaintenanceWindow:
        return window_to(await self.services.windows.get(required_uuid(request.id, "id")))

    @rpc
    async def ListMaintenanceWindows(
        self, request: pb.ListMaintenanceWindowsRequest, context: Context
    ) -> pb.ListMaintenanceWindowsResponse:
        rack_id = uuid_from(request.rack_id, "rack_id") if request.HasField("rack_id") else None
        windows = await self.services.windows.list_windows(rack_id)
        return pb.ListMaintenanceWindowsResponse(windows=[window_to(w) for w in windows])

    @rpc
    async def UpdateMaintenanceWindow(
        self, request: pb.UpdateMaintenanceWindowRequest, context: Context
    ) -> pb.MaintenanceWindow:
        window_id = required_uuid(request.id, "id")
        given = window_from(request.window)
        updated = await self.services.windows.update(window_id, list(request.update_mask.paths), given)
        return window_to(updated)

    @rpc
    async def DeleteMaintenanceWindow(
        self, request: pb.DeleteMaintenanceWindowRequest, context: Context
    ) -> Empty:
        await self.services.windows.delete(required_uuid(request.id, "id"))
        return Empty()

    @rpc
    async def PreviewMaintenanceWindows(
        self, request: pb.PreviewMaintenanceWindowsRequest, context: Context
    ) -> pb.PreviewMaintenanceWindowsResponse:
        after = timestamp_from(request.after, "after") if request.HasField("after") else None
        found = await self.services.windows.preview(
            required_uuid(request.rack_id, "rack_id"), after, request.count
        )
        return pb.PreviewMaintenanceWindowsResponse(events=[event_to(e) for e in found])
