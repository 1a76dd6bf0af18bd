"""What the audit trail keeps and sends is bounded in bytes, on both databases: a request of megabytes
(refused or accepted) is stored cut, still JSON, marked with its size; and a page of ListAuditEvents stays
within what a default gRPC client receives (4 MiB) whatever rows the trail holds: rows kept whole before
that cap end a page early, with a token that leads to the rest, nothing skipped or repeated.

An operator's few huge requests (a refused CreateTaskSchedule with a description of megabytes) had made a
page of 50 events answer RESOURCE_EXHAUSTED (74 MB past gRPC's 64 MiB send limit), and the trail could
not be paged past them by gRPC, the CLI, the JSON API or the dashboard."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert

from rackflow.api.servicer import FlowServicer
from rackflow.clock import FakeClock
from rackflow.domain.audit import OK
from rackflow.ids import new_id
from rackflow.services import Services
from rackflow.store import audit as audit_store
from rackflow.store import paging
from rackflow.store.db import Database
from rackflow.store.tables import audit_events
from rackflow.v1 import flow_pb2 as pb

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
MIB = 1024 * 1024
# What the trail keeps of one JSON document (config.AUDIT_JSON_MAX_BYTES), written out: the docs promise it.
KEPT_BYTES = 64 * 1024
# A default gRPC client's receive limit (the CLI's channel sets none).
CLIENT_RECEIVES = 4 * MIB
MARK = "rackflow_truncated"


def size(value: object) -> int:
    return len(json.dumps(value, sort_keys=True))


async def stored_events(db: Database) -> list[Any]:
    """The rows as the table holds them (the store's read, not the trail's, which bounds what it sends)."""
    async with db.read() as conn:
        events, _ = await audit_store.list_events(conn)
    return events


async def test_a_refused_request_of_megabytes_is_stored_cut_marked_with_its_size(db: Database) -> None:
    services = Services.build(db, FakeClock(T0))
    racks = [str(uuid.uuid4()) for _ in range(20_000)]
    request = {
        "schedule": {"name": "probe", "description": "x" * (5 * MIB)},
        "scopes": [{"rack_id": {"id": rack}} for rack in racks],
    }
    await services.audit.record(
        principal="oncall",
        method="CreateTaskSchedule",
        target_ids=racks,
        outcome="INVALID_ARGUMENT",
        error="schedule.description: at most 4096 characters",
        request=request,
    )
    (event,) = await stored_events(db)
    assert size(event.request) <= KEPT_BYTES
    assert event.request[MARK]["original_bytes"] == size(request)
    assert event.request[MARK]["target_ids"] == len(racks)
    assert event.request["schedule"]["name"] == "probe"
    description = event.request["schedule"]["description"]
    assert description.startswith("xxxx") and description.endswith("more characters]")
    scopes = event.request["scopes"]
    assert scopes[0] == {"rack_id": {"id": racks[0]}} and scopes[-1].endswith("more items]")
    assert event.target_ids == tuple(racks[:1000])  # a refused call's ids: the first thousand
    assert event.outcome == "INVALID_ARGUMENT"


async def test_an_accepted_call_keeps_its_ids_and_its_large_json_is_cut(db: Database) -> None:
    services = Services.build(db, FakeClock(T0))
    racks = [str(uuid.uuid4()) for _ in range(5_000)]
    before = {"name": "big", "scopes": [{"rack_id": rack, "component_filter": None} for rack in racks]}
    changes = [{"scope_entry": "removed", "rack_id": rack} for rack in racks]
    await services.audit.record(
        principal="oncall",
        method="DeleteRack",
        target_ids=racks,
        outcome=OK,
        request={"id": {"id": racks[0]}},
        before=before,
        changes=changes,
    )
    (event,) = await stored_events(db)
    assert event.target_ids == tuple(racks)  # what it touched: every thing's history finds it
    assert event.request == {"id": {"id": racks[0]}}  # small: kept as it came
    assert size(event.schedule_before) <= KEPT_BYTES
    assert event.schedule_before[MARK] == {"original_bytes": size(before), "limit_bytes": KEPT_BYTES}
    assert size(event.changes) <= KEPT_BYTES
    assert event.changes[0] == changes[0] and event.changes[-1][MARK]["original_bytes"] == size(changes)


def whole_row(at: datetime, description: str, target: uuid.UUID) -> dict[str, Any]:
    """An event as a release before the cap stored it: the request whole, however large."""
    return {
        "id": new_id(),
        "at": at,
        "principal": "oncall",
        "method": "CreateTaskSchedule",
        "target_ids": [str(target)],
        "outcome": "INVALID_ARGUMENT",
        "error": "schedule.description: at most 4096 characters",
        "request": {"schedule": {"name": "probe", "description": description}},
        "schedule_before": None,
        "schedule_after": None,
        "changes": None,
    }


async def test_a_page_of_rows_stored_whole_ends_early_with_a_token_to_the_rest(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    # By target, a page on SQLite walks at most SEARCH_WALK events (its token: where the walk stopped): a
    # walk of 4 here, so that pages ended by the walk and by bytes meet.
    monkeypatch.setattr(paging, "SEARCH_WALK", 4)
    services = Services.build(db, FakeClock(T0))
    target = uuid.uuid4()
    # Newest first: huge ones (1.5 MiB, and one of 6 MiB, more than a client receives alone) among small.
    descriptions = ["y" * (3 * MIB // 2) if i % 3 else "small" for i in range(9)]
    descriptions[4] = "z" * (6 * MIB)
    rows = [whole_row(T0 - timedelta(seconds=i), d, target) for i, d in enumerate(descriptions)]
    async with db.transaction() as conn:
        await conn.execute(insert(audit_events), rows)
    newest_first = [str(row["id"]) for row in rows]
    servicer = FlowServicer(services)
    sent: dict[str, pb.AuditEvent] = {}

    by_target = {"target": pb.UUID(id=str(target))}
    for filters, limit in (({}, 50), (by_target, 50), ({}, 0)):  # 0: no limit, the whole trail in one before
        seen: list[str] = []
        token = ""
        pages = 0
        while True:
            request = pb.ListAuditEventsRequest(
                pagination=pb.Pagination(limit=limit, page_token=token),
                **filters,  # type: ignore[arg-type]
            )
            page = await servicer.ListAuditEvents(request, None)  # type: ignore[arg-type]
            pages += 1
            assert page.ByteSize() <= CLIENT_RECEIVES, (filters, limit, pages, page.ByteSize())
            seen += [event.id.id for event in page.events]
            sent.update((event.id.id, event) for event in page.events)
            if pages == 1:
                assert 0 < len(page.events) < len(rows) and page.next_page_token
                assert filters or page.total == len(rows)
            token = page.next_page_token
            if not token:
                break
        assert seen == newest_first, (filters, limit)  # each once, in the trail's order
    # The 6 MiB row alone is past what a page sends: it comes as the trail keeps events now, marked.
    huge = json.loads(sent[newest_first[4]].request_json)
    assert size(huge) <= KEPT_BYTES
    assert huge[MARK]["original_bytes"] == size(rows[4]["request"])
    assert json.loads(sent[newest_first[1]].request_json) == rows[1]["request"]  # within a page: whole
