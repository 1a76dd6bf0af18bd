"""Keyset pages (`Pagination.page_token`, issue 29): walking a list by its tokens gives every row once, in
the order of the unpaged list, whatever the ties and NULLs of its order; a bad token, another list's token
and a token with an offset are refused; `total` stops at LIST_COUNT_CAP and says so."""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from sqlalchemy import update

from rackflow.api import convert
from rackflow.domain.audit import AuditEvent
from rackflow.domain.inventory import ComponentSpec, ComponentType, RackTarget, TargetSpec
from rackflow.domain.tasks import Operation, OperationKind, QueueOptions
from rackflow.errors import FailedPrecondition
from rackflow.services import Services
from rackflow.store import audit as audit_store
from rackflow.store import paging
from rackflow.store.db import Database
from rackflow.store.tables import task_schedule
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.api.test_schedules_api import power_off
from tests.conftest import stored_rows, write_back_rows

Stub = flow_pb2_grpc.FlowStub
List = Callable[[pb.Pagination], Awaitable[Any]]
T0 = datetime(2026, 6, 1, tzinfo=UTC)
NAMES = ("delta", "alpha", "golf", "echo", "bravo", "foxtrot", "charlie")
# Each schedule's next (and last) run, hours after T0: ties, and NULLs (no next run) in the middle.
HOURS = (2, 2, None, 1, 1, None, 3)


async def walk(call: List, rows: str, limit: int) -> list[str]:
    """The ids of every page's rows, page after page by token: each page full but the last, and only a
    full page has a token."""
    ids: list[str] = []
    token = ""
    while True:
        page = await call(pb.Pagination(limit=limit, page_token=token))
        found = [row.id.id for row in getattr(page, rows)]
        ids.extend(found)
        if not page.next_page_token:
            assert len(found) < limit, "a full page without a token"
            return ids
        assert len(found) == limit
        token = page.next_page_token


async def unpaged(call: List, rows: str) -> list[str]:
    page = await call(pb.Pagination())
    assert not page.next_page_token  # no limit: one page, nothing after it
    return [row.id.id for row in getattr(page, rows)]


@pytest.fixture(scope="module")
def seeded() -> dict[str, tuple[list[uuid.UUID], dict[str, Any]]]:
    """`schedule_ids`' schedules and every table's rows (`stored_rows`) by dialect, once per module and
    worker: each later test's empty database gets the same rows written back, where seeding it through the
    services and gRPC cost each test about 0.3 s of CPU (docs/PERFORMANCE.md)."""
    return {}


@pytest.fixture
async def schedule_ids(
    stub: Stub,
    services: Services,
    db: Database,
    seeded: dict[str, tuple[list[uuid.UUID], dict[str, Any]]],
) -> list[uuid.UUID]:
    if (done := seeded.get(db.dialect)) is None:
        ids = await seed(stub, services, db)
        seeded[db.dialect] = (ids, await stored_rows(db))
        return ids
    await write_back_rows(db, done[1])
    return list(done[0])


async def seed(stub: Stub, services: Services, db: Database) -> list[uuid.UUID]:
    """Seven racks with a schedule each, with tied and NULL next and last runs and creation times in
    ties of three; five firings of the first; a task per rack; nine audit events, three at each time."""
    ids = []
    for i, name in enumerate(NAMES):
        rack = await services.inventory.create_rack(
            f"r{i}", components=[ComponentSpec(ComponentType.COMPUTE, f"r{i}-c0")]
        )
        await services.tasks.submit(
            Operation(OperationKind.POWER_ON),
            TargetSpec(racks=(RackTarget(id=rack.id),)),
            description="",
            queue=QueueOptions(),
        )
        request = pb.CreateTaskScheduleRequest(
            schedule=pb.ScheduleConfig(
                name=name, spec=pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h")
            ),
            operation=power_off(rack.name),
        )
        ids.append(uuid.UUID((await stub.CreateTaskSchedule(request)).id.id))
    async with db.transaction() as conn:
        for i, schedule_id in enumerate(ids):
            at = None if HOURS[i] is None else T0 + timedelta(hours=HOURS[i])
            created = T0 + timedelta(minutes=i // 3)
            await conn.execute(
                update(task_schedule)
                .where(task_schedule.c.id == schedule_id)
                .values(next_run_at=at, last_run_at=at, created_at=created)
            )
        events = [
            AuditEvent(
                uuid.uuid4(),
                T0 + timedelta(seconds=i // 3),
                f"p{i % 2}",
                "PauseTaskSchedule",
                (),
                "OK",
                "",
                {},
            )
            for i in range(9)
        ]
        await audit_store.insert_events(conn, events)
    for _ in range(5):  # each a run, though its power_off conflicts with the rack's pending power_on
        with contextlib.suppress(FailedPrecondition):
            await services.schedules.trigger(ids[0])
    # The second schedule on every rack: a scope of seven entries, added at once (one creation time).
    every_rack = pb.OperationTargetSpec(
        racks=pb.RackTargets(targets=[pb.RackTarget(name=f"r{i}") for i in range(len(NAMES))])
    )
    await stub.AddTaskScheduleScope(
        pb.AddTaskScheduleScopeRequest(schedule_id=pb.UUID(id=str(ids[1])), target_spec=every_rack)
    )
    return ids


def lists(stub: Stub, schedule_id: uuid.UUID, scoped: uuid.UUID) -> dict[str, tuple[List, str]]:
    """Every paged List RPC (and each order of ListTaskSchedules), by name: (call, rows field); the runs
    are `schedule_id`'s, the scope entries `scoped`'s."""
    found: dict[str, tuple[List, str]] = {
        "ListTaskScheduleScopes": (
            lambda p: stub.ListTaskScheduleScopes(
                pb.ListTaskScheduleScopesRequest(schedule_id=pb.UUID(id=str(scoped)), pagination=p)
            ),
            "scopes",
        ),
        "ListRacks": (lambda p: stub.ListRacks(pb.ListRacksRequest(pagination=p)), "racks"),
        "ListTasks": (lambda p: stub.ListTasks(pb.ListTasksRequest(pagination=p)), "tasks"),
        "ListTaskScheduleRuns": (
            lambda p: stub.ListTaskScheduleRuns(
                pb.ListTaskScheduleRunsRequest(schedule_id=pb.UUID(id=str(schedule_id)), pagination=p)
            ),
            "runs",
        ),
        "ListTaskScheduleRuns[basic]": (
            lambda p: stub.ListTaskScheduleRuns(
                pb.ListTaskScheduleRunsRequest(
                    schedule_id=pb.UUID(id=str(schedule_id)),
                    pagination=p,
                    view=pb.TASK_SCHEDULE_RUN_VIEW_BASIC,
                )
            ),
            "runs",
        ),
        "ListAuditEvents": (
            lambda p: stub.ListAuditEvents(pb.ListAuditEventsRequest(pagination=p)),
            "events",
        ),
        "ListAuditEvents[principal]": (
            lambda p: stub.ListAuditEvents(pb.ListAuditEventsRequest(principal="p1", pagination=p)),
            "events",
        ),
    }
    for field in ("created_at", "name", "next_run_at", "last_run_at"):
        for order in (field, f"{field} desc"):
            found[f"ListTaskSchedules[{order}]"] = (
                lambda p, order=order: stub.ListTaskSchedules(
                    pb.ListTaskSchedulesRequest(order_by=order, pagination=p)
                ),
                "task_schedules",
            )
    return found


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_walking_by_token_gives_the_unpaged_list(
    stub: Stub, schedule_ids: list[uuid.UUID], limit: int
) -> None:
    for name, (call, rows) in lists(stub, schedule_ids[0], schedule_ids[1]).items():
        everything = await unpaged(call, rows)
        assert len(everything) >= 4, name
        try:
            walked = await walk(call, rows, limit)
        except AssertionError as exc:
            raise AssertionError(name) from exc
        assert walked == everything, name


async def test_offset_pages_still_work_beside_tokens(stub: Stub, schedule_ids: list[uuid.UUID]) -> None:
    everything = await unpaged(
        *lists(stub, schedule_ids[0], schedule_ids[1])["ListTaskSchedules[next_run_at desc]"]
    )
    page = await stub.ListTaskSchedules(
        pb.ListTaskSchedulesRequest(order_by="next_run_at desc", pagination=pb.Pagination(offset=2, limit=2))
    )
    assert [s.id.id for s in page.task_schedules] == everything[2:4]
    assert page.total == len(NAMES) and not page.total_capped


async def refused(call: Awaitable[Any], field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert field in (info.value.details() or ""), info.value.details()


async def test_bad_tokens_are_refused(stub: Stub, schedule_ids: list[uuid.UUID]) -> None:
    first = await stub.ListTasks(pb.ListTasksRequest(pagination=pb.Pagination(limit=2)))
    token = first.next_page_token
    assert token
    for bad in ("not a token", "W10", token[:-3], "WyJMaXN0VGFza3MiLCBbeyJ4IjogIjEifV1d"):
        await refused(
            stub.ListTasks(pb.ListTasksRequest(pagination=pb.Pagination(limit=2, page_token=bad))),
            "pagination.page_token",
        )
    # Another list's token, and another order's.
    await refused(
        stub.ListRacks(pb.ListRacksRequest(pagination=pb.Pagination(limit=2, page_token=token))),
        "pagination.page_token",
    )
    by_name = await stub.ListTaskSchedules(
        pb.ListTaskSchedulesRequest(order_by="name", pagination=pb.Pagination(limit=2))
    )
    await refused(
        stub.ListTaskSchedules(
            pb.ListTaskSchedulesRequest(
                order_by="name desc", pagination=pb.Pagination(limit=2, page_token=by_name.next_page_token)
            )
        ),
        "pagination.page_token",
    )
    await refused(
        stub.ListTasks(pb.ListTasksRequest(pagination=pb.Pagination(offset=1, limit=2, page_token=token))),
        "pagination.offset",
    )
    # A runs token names a run, and may name where within it a FULL page ended: a whole number past 0.
    run_id = uuid.uuid4()
    for within in ("5", 0, -1, None):
        bad = convert.page_token("ListTaskScheduleRuns", [datetime.now(UTC), run_id, within])
        runs = pb.ListTaskScheduleRunsRequest(
            schedule_id=pb.UUID(id=str(schedule_ids[0])), pagination=pb.Pagination(limit=2, page_token=bad)
        )
        await refused(stub.ListTaskScheduleRuns(runs), "pagination.page_token")


def _edited(listing: str, values: list[object]) -> str:
    """A token of `listing` whose key the client edited (tagged values as `convert.page_token` writes)."""
    return base64.urlsafe_b64encode(json.dumps([listing, values]).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    ("listing", "values"),
    [
        ("ListRacks", [{"s": "x"}, {"s": "y"}]),  # the wrong types
        ("ListRacks", [{"t": "2026-01-01T00:00:00+00:00"}]),  # the wrong number of values
        ("ListTasks", [{"t": "2026-01-01T00:00:00"}, {"u": str(uuid.UUID(int=1))}]),  # a time with no zone
        ("ListTasks", [{"i": "9" * 40}, {"u": str(uuid.UUID(int=1))}]),  # an integer past 64 bits
        ("ListTaskSchedules", [{"s": "a"}]),  # too short for the list's three
    ],
)
async def test_an_edited_token_is_refused_not_an_internal_error(
    stub: Stub, schedule_ids: list[uuid.UUID], listing: str, values: list[object]
) -> None:
    """A page token comes back from the client, who may edit it: a key that does not fit the list's order
    failed as INTERNAL when the statement was built from it."""
    request = getattr(pb, f"{listing}Request")(
        pagination=pb.Pagination(limit=2, page_token=_edited(listing, values))
    )
    await refused(getattr(stub, listing)(request), "pagination.page_token")


async def test_a_token_nested_past_any_depth_is_refused(stub: Stub) -> None:
    deep = base64.urlsafe_b64encode(b"[" * 100_000).decode()
    request = pb.ListRacksRequest(pagination=pb.Pagination(limit=2, page_token=deep))
    await refused(stub.ListRacks(request), "pagination.page_token")


async def test_scope_pages_are_in_rack_id_order_and_refuse_bad_pages(
    stub: Stub, schedule_ids: list[uuid.UUID]
) -> None:
    """ListTaskScheduleScopes pages by rack id (its unique index's order), counts its entries, and refuses
    a bad token, another list's token, a token with an offset and a page over MAX_PAGE_SIZE, naming the
    field."""
    scoped = pb.UUID(id=str(schedule_ids[1]))

    def scopes(pagination: pb.Pagination) -> Any:
        return stub.ListTaskScheduleScopes(
            pb.ListTaskScheduleScopesRequest(schedule_id=scoped, pagination=pagination)
        )

    everything = await scopes(pb.Pagination())
    rack_ids = [s.rack_id.id for s in everything.scopes]
    assert len(rack_ids) == len(NAMES) and rack_ids == sorted(rack_ids)
    racks = {r.id.id: r.name for r in (await stub.ListRacks(pb.ListRacksRequest())).racks}
    assert [s.rack_name for s in everything.scopes] == [racks[i] for i in rack_ids]  # each page names them
    first = await scopes(pb.Pagination(limit=3))
    assert (first.total, first.total_capped) == (len(NAMES), False)
    assert [s.rack_id.id for s in first.scopes] == rack_ids[:3] and first.next_page_token
    runs = await stub.ListTaskScheduleRuns(
        pb.ListTaskScheduleRunsRequest(
            schedule_id=pb.UUID(id=str(schedule_ids[0])), pagination=pb.Pagination(limit=1)
        )
    )
    assert runs.next_page_token
    for bad in ("not a token", "W10", first.next_page_token[:-3], runs.next_page_token):
        await refused(scopes(pb.Pagination(limit=3, page_token=bad)), "pagination.page_token")
    await refused(
        scopes(pb.Pagination(offset=1, limit=3, page_token=first.next_page_token)), "pagination.offset"
    )
    await refused(scopes(pb.Pagination(limit=1001)), "pagination.limit")
    await refused(scopes(pb.Pagination(limit=-1)), "pagination.limit")
    await refused(scopes(pb.Pagination(offset=-1)), "pagination.offset")


async def test_total_is_counted_up_to_the_cap(
    stub: Stub, schedule_ids: list[uuid.UUID], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(paging, "LIST_COUNT_CAP", 4)
    monkeypatch.setattr(convert, "LIST_COUNT_CAP", 4)
    over = await stub.ListTaskSchedules(pb.ListTaskSchedulesRequest(pagination=pb.Pagination(limit=2)))
    assert (over.total, over.total_capped) == (4, True)
    under = await stub.ListAuditEvents(pb.ListAuditEventsRequest(principal="p1"))
    assert (under.total, under.total_capped) == (4, False)


@pytest.mark.parametrize("order", ["created_at", "name desc", "next_run_at", "last_run_at desc"])
async def test_a_short_search_pages_on_past_pages_that_found_nothing(
    stub: Stub, schedule_ids: list[uuid.UUID], monkeypatch: pytest.MonkeyPatch, order: str
) -> None:
    """A search of one or two characters walks SEARCH_WALK schedules a page (here 2): a page may come back
    short, even empty, with a token that searches on from where its walk stopped; walking the tokens gives
    the unpaged search, every match once. `total` counts the matches of the first walk only, so it says
    it is capped. Its tokens are the list's: another order's, or a broken one, is refused."""
    monkeypatch.setattr(paging, "SEARCH_WALK", 2)

    def search(pagination: pb.Pagination) -> Any:
        return stub.ListTaskSchedules(
            pb.ListTaskSchedulesRequest(name_contains="LF", order_by=order, pagination=pagination)
        )

    everything = await search(pb.Pagination())  # no limit: every match, no bound, no token
    assert [s.name for s in everything.task_schedules] == ["golf"] and not everything.next_page_token
    assert (everything.total, everything.total_capped) == (1, False)
    pages: list[list[str]] = []
    token = ""
    while True:
        page = await search(pb.Pagination(limit=5, page_token=token))
        pages.append([s.name for s in page.task_schedules])
        assert page.total_capped  # seven schedules: the count covers the first two
        if not page.next_page_token:
            break
        token = page.next_page_token
        assert len(pages) <= len(NAMES)
    assert [name for found in pages for name in found] == ["golf"]
    assert len(pages) > 1 and [] in pages  # a page that found nothing said that the search goes on
    first = await search(pb.Pagination(limit=5))
    first_token = first.next_page_token
    assert first_token
    other = "name" if order != "name" else "created_at"
    await refused(
        stub.ListTaskSchedules(
            pb.ListTaskSchedulesRequest(
                name_contains="LF",
                order_by=other,
                pagination=pb.Pagination(limit=5, page_token=first_token),
            )
        ),
        "pagination.page_token",
    )
    await refused(search(pb.Pagination(limit=5, page_token=first_token[:-3])), "pagination.page_token")
    await refused(search(pb.Pagination(offset=1, limit=5, page_token=first_token)), "pagination.offset")


@pytest.mark.parametrize("domain", [False, True], ids=["every-rack", "a-domain"])
async def test_a_short_rack_search_pages_on_past_pages_that_found_nothing(
    stub: Stub, schedule_ids: list[uuid.UUID], monkeypatch: pytest.MonkeyPatch, domain: bool
) -> None:
    """ListRacks' `name_contains` of one or two characters walks SEARCH_WALK racks a page (here 2), as
    ListTaskSchedules' does: a page may come back short, even empty, with a token that searches on from
    where its walk stopped; walking the tokens gives the unpaged search, every match once. `total` counts
    the matches of the first walk only, so it says it is capped. Its tokens are the list's: another list's,
    a broken one, or one with an offset, is refused."""
    monkeypatch.setattr(paging, "SEARCH_WALK", 2)
    rack_ids = [r.id for r in (await stub.ListRacks(pb.ListRacksRequest())).racks]  # r0 … r6, made in order
    domain_id = None
    if domain:  # r1 … r6 in a domain: its racks are walked alone
        made = await stub.CreateNVLDomain(pb.CreateNVLDomainRequest(name="d", rack_ids=rack_ids[1:]))
        domain_id = made.id

    def search(pagination: pb.Pagination, text: str = "5") -> Any:
        return stub.ListRacks(
            pb.ListRacksRequest(name_contains=text, nvl_domain_id=domain_id, pagination=pagination)
        )

    everything = await search(pb.Pagination())  # no limit: every match, no bound, no token
    assert [r.name for r in everything.racks] == ["r5"] and not everything.next_page_token
    assert (everything.total, everything.total_capped) == (1, False)
    pages: list[list[str]] = []
    token = ""
    while True:
        page = await search(pb.Pagination(limit=5, page_token=token))
        pages.append([r.name for r in page.racks])
        assert (page.total, page.total_capped) == (0, True)  # the first walk's count, more to search
        if not page.next_page_token:
            break
        token = page.next_page_token
        assert len(pages) <= len(NAMES)
    assert [name for found in pages for name in found] == ["r5"]
    assert len(pages) > 1 and [] in pages  # a page that found nothing said that the search goes on
    full = await search(pb.Pagination(limit=1), "r")  # every rack holds it: a full page's token, as ever
    assert [r.name for r in full.racks] == ["r0" if not domain else "r1"] and full.next_page_token
    first_token = (await search(pb.Pagination(limit=5))).next_page_token
    assert first_token
    tasks_token = (
        await stub.ListTasks(pb.ListTasksRequest(pagination=pb.Pagination(limit=1)))
    ).next_page_token
    for bad in (tasks_token, first_token[:-3], "not a token"):
        await refused(search(pb.Pagination(limit=5, page_token=bad)), "pagination.page_token")
    await refused(search(pb.Pagination(offset=1, limit=5, page_token=first_token)), "pagination.offset")
    await refused(search(pb.Pagination(limit=1001)), "pagination.limit")
    await refused(search(pb.Pagination(limit=5), "r\x00"), "name_contains")
