"""Notifications over HTTP (both databases): the JSON API's channel and delivery endpoints (secrets never
returned, bad input naming the field) and the dashboard's Notifications page with its dead deliveries."""

from __future__ import annotations

import httpx

from rackflow.domain.notifications import Event, EventType, Severity
from rackflow.notify.delivery import Deliverer
from rackflow.services import Services
from rackflow.store import outbox

API = "/api/v1"
HOOK = {
    "name": "ops",
    "kind": "webhook",
    "url": "http://127.0.0.1:9/hook",
    "secret": "k3y",
    "max_attempts": 1,
}


async def test_json_api_manages_channels_without_returning_secrets(http: httpx.AsyncClient) -> None:
    created = await http.post(f"{API}/notification-channels", json={"channel": HOOK})
    assert created.status_code == 200, created.text
    body = created.json()
    assert (body["name"], body["has_secret"], body["secret"]) == ("ops", True, "")
    assert (await http.get(f"{API}/notification-channels/ops")).json()["id"] == body["id"]
    listed = (await http.get(f"{API}/notification-channels")).json()
    assert [c["name"] for c in listed["channels"]] == ["ops"] and "k3y" not in str(listed)
    updated = await http.patch(f"{API}/notification-channels/ops", json={"channel": {"disabled": True}})
    assert updated.status_code == 200, updated.text
    assert updated.json()["disabled"] is True
    refused = await http.post(
        f"{API}/notification-channels", json={"channel": {**HOOK, "name": "b", "kind": "email"}}
    )
    assert (refused.status_code, refused.json()["field"]) == (400, "channel.kind")
    too_many = {"channel": {"schedules": [f"s{i}" for i in range(1001)]}}
    refused = await http.patch(f"{API}/notification-channels/ops", json=too_many)
    assert (refused.status_code, refused.json()["field"]) == (400, "channel.schedules")
    assert refused.json()["message"] == "channel.schedules: at most 1000 schedules, got 1001"
    missing = await http.get(f"{API}/notification-channels/nope")
    assert (missing.status_code, missing.json()["field"]) == (404, "id")
    assert (await http.delete(f"{API}/notification-channels/ops")).status_code == 200
    assert (await http.get(f"{API}/notification-channels")).json()["channels"] == []


async def test_dead_deliveries_are_listed_shown_and_redelivered(
    http: httpx.AsyncClient, services: Services
) -> None:
    assert (await http.post(f"{API}/notification-channels", json={"channel": HOOK})).status_code == 200
    event = Event(EventType.RUN_HALTED, Severity.CRITICAL, services.clock.now(), "rollout halted")
    async with services.db.transaction() as conn:
        await outbox.record_events(conn, [event])
    await Deliverer(services.db).deliver_once()  # nothing listens on port 9: dead after one attempt

    dead = (
        await http.get(f"{API}/notification-deliveries", params={"state": "dead", "channel": "ops"})
    ).json()
    (delivery,) = dead["deliveries"]
    assert (delivery["event"]["type"], delivery["attempts"]) == ("run.halted", 1)
    bad = await http.get(f"{API}/notification-deliveries", params={"state": "lost"})
    assert (bad.status_code, bad.json()["field"]) == (400, "states[0]")

    page = await http.get("/notifications")
    assert page.status_code == 200
    assert 'data-testid="dead-row"' in page.text and "rollout halted" in page.text
    assert "k3y" not in page.text and "/notification-channels/" in page.text  # the Redeliver button

    again = await http.post(f"{API}/notification-channels/ops:redeliver")
    assert again.json() == {"redelivered": 1}
    assert (await http.post(f"{API}/notification-deliveries:redeliver")).json() == {"redelivered": 0}
    page = await http.get("/notifications")
    assert "No dead deliveries." in page.text
