"""Notification channel RPCs: validate, convert, delegate, convert back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf.empty_pb2 import Empty
from grpc.aio import ServicerContext as Context

from rackflow.api.convert import required_uuid, uuid_from
from rackflow.api.convert.notifications import channel_from, channel_to, delivery_to, states_from
from rackflow.api.errors import rpc
from rackflow.notify.service import DELIVERIES_SHOWN
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:
    from rackflow.services import Services


class NotificationRpcs:
    """The notification part of the `Flow` servicer."""

    services: Services

    @rpc
    async def CreateNotificationChannel(
        self, request: pb.CreateNotificationChannelRequest, context: Context
    ) -> pb.NotificationChannel:
        return channel_to(await self.services.notifications.create(channel_from(request.channel)))

    @rpc
    async def GetNotificationChannel(
        self, request: pb.GetNotificationChannelRequest, context: Context
    ) -> pb.NotificationChannel:
        return channel_to(await self.services.notifications.get(required_uuid(request.id, "id")))

    @rpc
    async def ListNotificationChannels(
        self, request: pb.ListNotificationChannelsRequest, context: Context
    ) -> pb.ListNotificationChannelsResponse:
        channels = await self.services.notifications.list_channels()
        return pb.ListNotificationChannelsResponse(channels=[channel_to(c) for c in channels])

    @rpc
    async def UpdateNotificationChannel(
        self, request: pb.UpdateNotificationChannelRequest, context: Context
    ) -> pb.NotificationChannel:
        channel_id = required_uuid(request.id, "id")
        given = channel_from(request.channel)
        paths = list(request.update_mask.paths)
        return channel_to(await self.services.notifications.update(channel_id, paths, given))

    @rpc
    async def DeleteNotificationChannel(
        self, request: pb.DeleteNotificationChannelRequest, context: Context
    ) -> Empty:
        await self.services.notifications.delete(required_uuid(request.id, "id"))
        return Empty()

    @rpc
    async def ListNotificationDeliveries(
        self, request: pb.ListNotificationDeliveriesRequest, context: Context
    ) -> pb.ListNotificationDeliveriesResponse:
        deliveries = await self.services.notifications.deliveries(
            states_from(list(request.states)),
            uuid_from(request.channel_id, "channel_id", required=False),
            request.limit or DELIVERIES_SHOWN,
        )
        return pb.ListNotificationDeliveriesResponse(deliveries=[delivery_to(d) for d in deliveries])

    @rpc
    async def RedeliverNotifications(
        self, request: pb.RedeliverNotificationsRequest, context: Context
    ) -> pb.RedeliverNotificationsResponse:
        ids = [required_uuid(d, f"delivery_ids[{i}]") for i, d in enumerate(request.delivery_ids)]
        channel_id = uuid_from(request.channel_id, "channel_id", required=False)
        count = await self.services.notifications.redeliver(ids, channel_id)
        return pb.RedeliverNotificationsResponse(redelivered=count)
