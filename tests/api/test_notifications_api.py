"""The notification RPCs through an in-process gRPC server: shapes, secrets never coming back (nor into the
audit trail), bad input naming the field and writing nothing, NOT_FOUND, ALREADY_EXISTS, updates by mask,
the operator role, and listing and redelivering dead deliveries."""

from __future__ import annotations

import json
import uuid
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

from rackflow.domain.notifications import Event, EventType, Severity
from rackflow.notify.delivery import Deliverer
from rackflow.services import Services
from rackflow.store import outbox
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN, bearer, secured_server
from tests.api.test_windows_api import expect
from tests.conftest import table_counts

SLACK_URL = "https://hooks.slack.com/services/T000/B000/XXXXSECRET"


def hook(name: str = "ops", **fields: Any) -> pb.NotificationChannel:
    given = {
        "name": name,
        "kind": "webhook",
        "url": "https://hooks.example.com/rf",
        "secret": "k3y",
        **fields,
    }
    return pb.NotificationChannel(**given)


async def create(stub: FlowStub, channel: pb.NotificationChannel, **call: Any) -> pb.NotificationChannel:
    created: pb.NotificationChannel = await stub.CreateNotificationChannel(
        pb.CreateNotificationChannelRequest(channel=channel), **call
    )
    return created


async def test_create_get_list_update_and_delete_never_return_secrets(stub: FlowStub) -> None:
    created = await create(stub, hook(event_types=["run.halted"], operations=["upgrade_firmware"]))
    assert (created.kind, created.has_secret, created.secret, created.disabled) == (
        "webhook",
        True,
        "",
        False,
    )
    assert (list(created.event_types), list(created.operations)) == (["run.halted"], ["upgrade_firmware"])
    assert (created.min_severity, created.rate_per_minute, created.max_attempts) == ("info", 60, 10)
    slack = await create(stub, pb.NotificationChannel(name="slack", kind="slack", url=SLACK_URL))
    assert slack.url == "https://hooks.slack.com/…" and not slack.has_secret
    assert await stub.GetNotificationChannel(pb.GetNotificationChannelRequest(id=created.id)) == created
    listed = await stub.ListNotificationChannels(pb.ListNotificationChannelsRequest())
    assert [c.name for c in listed.channels] == ["ops", "slack"]
    assert "XXXXSECRET" not in str(listed) and "k3y" not in str(listed)

    changes = pb.NotificationChannel(disabled=True, min_severity="critical", event_types=[])
    paths = ["channel.disabled", "channel.min_severity", "channel.event_types", "channel.secret"]
    updated = await stub.UpdateNotificationChannel(
        pb.UpdateNotificationChannelRequest(
            id=created.id, channel=changes, update_mask=FieldMask(paths=paths)
        )
    )
    assert (updated.disabled, updated.min_severity, list(updated.event_types)) == (True, "critical", [])
    assert not updated.has_secret and list(updated.operations) == ["upgrade_firmware"]
    await stub.DeleteNotificationChannel(pb.DeleteNotificationChannelRequest(id=created.id))
    listed = await stub.ListNotificationChannels(pb.ListNotificationChannelsRequest())
    assert [c.name for c in listed.channels] == ["slack"]


@pytest.mark.parametrize(
    ("channel", "field"),
    [
        (hook(name=""), "channel.name"),
        (hook(kind="email"), "channel.kind"),
        (hook(url="ftp://x/y"), "channel.url"),
        (hook(url="not a url"), "channel.url"),
        (hook(url="http://[::1"), "channel.url"),  # urlsplit raises on it: a refusal, not INTERNAL
        # Stored, these broke every listing of the channels (`port` raised when each was shown).
        (hook(url="http://example.com:99999/"), "channel.url"),
        (hook(url="http://example.com:-1/"), "channel.url"),
        (hook(url="http://ex\x00ample.com/"), "channel.url"),
        (hook(url="http://user:pa ss@example.com/"), "channel.url"),
        (hook(event_types=["run.halted", "run.exploded"]), "channel.event_types[1]"),
        (hook(operations=["reboot"]), "channel.operations[0]"),
        (hook(operations=["power_on", "power_on"]), "channel.operations[1]"),
        (hook(schedules=[" padded"]), "channel.schedules[0]"),
        (hook(min_severity="loud"), "channel.min_severity"),
        (hook(rate_per_minute=-1), "channel.rate_per_minute"),
        (hook(max_attempts=101), "channel.max_attempts"),
        (hook(secret="x" * 1025), "channel.secret"),
        (hook(secret="s3cret\x00"), "channel.secret"),  # PostgreSQL cannot store a NUL
        # Only a webhook is signed: a Slack or Alertmanager channel stored the secret and never used it.
        (hook(kind="slack", url=SLACK_URL), "channel.secret"),
        (hook(kind="alertmanager", url="http://am.example:9093"), "channel.secret"),
        # Matched against every event: a list without end was stored and walked for each one.
        (
            hook(schedules=[f"s{i}" for i in range(1001)]),
            "channel.schedules: at most 1000 schedules, got 1001",
        ),
        (hook(event_types=["run.halted"] * 101), "channel.event_types: at most 100 event types, got 101"),
    ],
)
async def test_bad_create_names_the_field_and_writes_nothing(
    stub: FlowStub, services: Services, channel: pb.NotificationChannel, field: str
) -> None:
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.INVALID_ARGUMENT, field, create(stub, channel))
    assert await table_counts(services.db) == before


async def test_an_update_past_a_list_s_cap_is_refused_and_changes_nothing(
    stub: FlowStub, services: Services
) -> None:
    created = await create(stub, hook(schedules=[f"s{i}" for i in range(1000)]))  # the cap itself is kept
    before = await table_counts(services.db)
    too_many = pb.UpdateNotificationChannelRequest(
        id=created.id,
        channel=pb.NotificationChannel(schedules=[f"s{i}" for i in range(1001)]),
        update_mask=FieldMask(paths=["channel.schedules"]),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "channel.schedules: at most 1000 schedules, got 1001",
        stub.UpdateNotificationChannel(too_many),
    )
    assert await table_counts(services.db) == before
    assert await stub.GetNotificationChannel(pb.GetNotificationChannelRequest(id=created.id)) == created


async def test_a_secret_is_refused_for_a_channel_that_is_not_a_webhook(
    stub: FlowStub, services: Services
) -> None:
    slack = await create(stub, hook(kind="slack", url=SLACK_URL, secret=""))
    given = pb.UpdateNotificationChannelRequest(
        id=slack.id, channel=hook(secret="k3y"), update_mask=FieldMask(paths=["channel.secret"])
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.UpdateNotificationChannel(given)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "channel.secret" in (info.value.details() or "") and "webhook" in (info.value.details() or "")
    assert not (await services.notifications.get(uuid.UUID(slack.id.id))).has_secret
    removed = pb.UpdateNotificationChannelRequest(
        id=slack.id, channel=hook(secret=""), update_mask=FieldMask(paths=["channel.secret"])
    )
    await stub.UpdateNotificationChannel(removed)  # clearing one (stored before this check) is fine


async def test_a_refused_url_is_not_quoted_whole(stub: FlowStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await create(stub, hook(url="gopher://hooks.example.com/token-XYZ"))
    assert "token-XYZ" not in (info.value.details() or "")


async def test_duplicates_unknown_ids_and_bad_masks(stub: FlowStub, services: Services) -> None:
    created = await create(stub, hook())
    before = await table_counts(services.db)
    await expect(grpc.StatusCode.ALREADY_EXISTS, "channel.name", create(stub, hook(url="https://b.example/")))
    assert await table_counts(services.db) == before
    missing = pb.UUID(id=str(uuid.uuid4()))
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "id",
        stub.GetNotificationChannel(pb.GetNotificationChannelRequest(id=missing)),
    )
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "id",
        stub.DeleteNotificationChannel(pb.DeleteNotificationChannelRequest(id=missing)),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "id",
        stub.GetNotificationChannel(pb.GetNotificationChannelRequest(id=pb.UUID(id="nope"))),
    )
    bad_mask = pb.UpdateNotificationChannelRequest(
        id=created.id, channel=hook(), update_mask=FieldMask(paths=["channel.kind"])
    )
    await expect(grpc.StatusCode.INVALID_ARGUMENT, "update_mask", stub.UpdateNotificationChannel(bad_mask))
    await expect(
        grpc.StatusCode.NOT_FOUND,
        "channel_id",
        stub.RedeliverNotifications(pb.RedeliverNotificationsRequest(channel_id=missing)),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "states[0]",
        stub.ListNotificationDeliveries(pb.ListNotificationDeliveriesRequest(states=["lost"])),
    )
    await expect(
        grpc.StatusCode.INVALID_ARGUMENT,
        "limit",
        stub.ListNotificationDeliveries(pb.ListNotificationDeliveriesRequest(limit=5000)),
    )


async def test_dead_deliveries_are_listed_and_redelivered(stub: FlowStub, services: Services) -> None:
    # Nothing listens on port 9 of loopback: every send fails at once.
    created = await create(stub, hook(url="http://127.0.0.1:9/", max_attempts=1))
    event = Event(EventType.TASK_FAILED, Severity.WARNING, services.clock.now(), "task failed")
    async with services.db.transaction() as conn:
        await outbox.record_events(conn, [event])
    await Deliverer(services.db).deliver_once()
    listed = await stub.ListNotificationDeliveries(pb.ListNotificationDeliveriesRequest(states=["dead"]))
    (dead,) = listed.deliveries
    assert (dead.channel, dead.state, dead.attempts, dead.event.id.id) == ("ops", "dead", 1, str(event.id))
    assert dead.last_error.startswith("unreachable")
    request = pb.RedeliverNotificationsRequest(delivery_ids=[dead.id], channel_id=created.id)
    assert (await stub.RedeliverNotifications(request)).redelivered == 1
    assert (await stub.RedeliverNotifications(request)).redelivered == 0  # pending now, not dead
    listed = await stub.ListNotificationDeliveries(pb.ListNotificationDeliveriesRequest(states=["pending"]))
    assert [(d.id, d.attempts) for d in listed.deliveries] == [(dead.id, 0)]


async def test_channels_need_the_operator_role_and_the_audit_keeps_no_secret(services: Services) -> None:
    async with secured_server(services, TOKENS) as address, grpc.aio.insecure_channel(address) as channel:
        stub = FlowStub(channel)
        await expect(
            grpc.StatusCode.PERMISSION_DENIED, "", create(stub, hook(), metadata=bearer(VIEWER_TOKEN))
        )
        await create(stub, hook(), metadata=bearer(OPERATOR_TOKEN))
        await create(
            stub,
            pb.NotificationChannel(name="slack", kind="slack", url=SLACK_URL),
            metadata=bearer(OPERATOR_TOKEN),
        )
        events, _ = await services.audit.list_events()
    requests = [json.loads(json.dumps(e.request)) for e in events if e.method == "CreateNotificationChannel"]
    assert len(requests) == 3  # the viewer's, refused by role, is recorded without its secret too
    text = json.dumps(requests)
    assert "k3y" not in text and "XXXXSECRET" not in text
    assert {r["channel"]["url"] for r in requests} == {
        "https://hooks.example.com/rf",
        "https://hooks.slack.com/…",
    }
