"""The JSON API's notification endpoints (docs/HTTP.md), as `JsonApi` handlers: each builds one RPC's request
and returns its response. `{ref}` names a channel by id or by name."""

from __future__ import annotations

from google.protobuf.message import Message

from rackflow.errors import NotFound
from rackflow.v1 import flow_pb2 as pb
from rackflow.web.api import Call, Handler, JsonApi
from rackflow.web.api import _body as read_body


async def _channel(api: JsonApi, ref: str, field: str) -> pb.UUID:
    """The channel's id, from its id or its name."""
    for shown in await api.services.notifications.list_channels():
        if ref in (str(shown.channel.id), shown.channel.name):
            return pb.UUID(id=str(shown.channel.id))
    raise NotFound(f"{field}: no notification channel {ref!r}")


async def list_channels(api: JsonApi, call: Call) -> Message:
    call.query.check()
    return await call.rpc("ListNotificationChannels", pb.ListNotificationChannelsRequest())


async def create_channel(api: JsonApi, call: Call) -> Message:
    call.query.check()
    channel = await read_body(call.request, pb.NotificationChannel())
    assert isinstance(channel, pb.NotificationChannel)
    return await call.rpc("CreateNotificationChannel", pb.CreateNotificationChannelRequest(channel=channel))


async def get_channel(api: JsonApi, call: Call) -> Message:
    call.query.check()
    channel_id = await _channel(api, call.request.path_params["ref"], "id")
    return await call.rpc("GetNotificationChannel", pb.GetNotificationChannelRequest(id=channel_id))


async def update_channel(api: JsonApi, call: Call) -> Message:
    """Body: `{"channel": {…}, "update_mask": "channel.url,channel.disabled"}`."""
    call.query.check()
    request = await read_body(call.request, pb.UpdateNotificationChannelRequest())
    assert isinstance(request, pb.UpdateNotificationChannelRequest)
    request.id.CopyFrom(await _channel(api, call.request.path_params["ref"], "id"))
    return await call.rpc("UpdateNotificationChannel", request)


async def delete_channel(api: JsonApi, call: Call) -> Message:
    call.query.check()
    channel_id = await _channel(api, call.request.path_params["ref"], "id")
    return await call.rpc("DeleteNotificationChannel", pb.DeleteNotificationChannelRequest(id=channel_id))


async def redeliver_channel(api: JsonApi, call: Call) -> Message:
    """The channel's dead deliveries, pending again."""
    call.query.check()
    channel_id = await _channel(api, call.request.path_params["ref"], "channel_id")
    return await call.rpc("RedeliverNotifications", pb.RedeliverNotificationsRequest(channel_id=channel_id))


async def list_deliveries(api: JsonApi, call: Call) -> Message:
    q = call.query
    request = pb.ListNotificationDeliveriesRequest(states=q.values("state"), limit=q.integer("limit") or 0)
    if channel := q.text("channel"):
        request.channel_id.CopyFrom(await _channel(api, channel, "channel_id"))
    q.check()
    return await call.rpc("ListNotificationDeliveries", request)


async def redeliver(api: JsonApi, call: Call) -> Message:
    """Body (optional): `{"delivery_ids": [{"id": "…"}]}`; none: every dead delivery."""
    call.query.check()
    request = await read_body(call.request, pb.RedeliverNotificationsRequest())
    return await call.rpc("RedeliverNotifications", request)


def routes() -> list[tuple[str, Handler, list[str]]]:
    get, post = ["GET"], ["POST"]
    return [
        ("/notification-channels", list_channels, get),
        ("/notification-channels", create_channel, post),
        ("/notification-channels/{ref}:update", update_channel, post),
        ("/notification-channels/{ref}:delete", delete_channel, post),
        ("/notification-channels/{ref}:redeliver", redeliver_channel, post),
        ("/notification-channels/{ref}", get_channel, get),
        ("/notification-deliveries", list_deliveries, get),
        ("/notification-deliveries:redeliver", redeliver, post),
    ]
