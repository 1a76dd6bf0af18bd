"""`rackflow.client` over a real gRPC channel to a recording fake servicer: what goes on the wire."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.protobuf.empty_pb2 import Empty
from google.protobuf.message import Message

from rackflow.client import Operation, RackflowClient, RackflowClientError, Spec, Targets, task_status
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc

SCHEDULE_ID = "0c9d8e7f-6a5b-4c3d-2e1f-0a9b8c7d6e5f"
OTHER_ID = "1d0e9f8a-7b6c-4d5e-8f70-1a2b3c4d5e6f"
RACK_ID = "2e1f0a9b-8c7d-4e6f-9a81-2b3c4d5e6f70"


class RecordingFlow(flow_pb2_grpc.FlowServicer):
    """Answers a few RPCs and records every request it receives, in order."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, Message]] = []
        self.knows_rack_names = True  # False: as a release before GetRack took a name
        self.knows_rack_ids = True  # False: as a release before ListRacks took ids (it ignores them)
        self.knows_domain_pages = True  # False: as a release before ListNVLDomains took any field
        self.racks_answer: pb.ListRacksResponse | None = None  # a ListRacks answer given whatever was asked

    def _record(self, name: str, request: Message) -> None:
        self.requests.append((name, request))

    def ListTaskSchedules(self, request: Any, context: Any) -> pb.ListTaskSchedulesResponse:
        """Two pages: a name that only contains the one looked for, then the one."""
        self._record("ListTaskSchedules", request)
        if not request.pagination.page_token:
            near = pb.TaskSchedule(id=pb.UUID(id=OTHER_ID), name="nightly-old")
            return pb.ListTaskSchedulesResponse(task_schedules=[near], total=2, next_page_token="p2")
        schedule = pb.TaskSchedule(id=pb.UUID(id=SCHEDULE_ID), name="nightly")
        return pb.ListTaskSchedulesResponse(task_schedules=[schedule], total=2)

    def ListRacks(self, request: Any, context: Any) -> pb.ListRacksResponse:
        """Two pages of one rack each (a page holds at most what was asked: the whole list in one answer
        passes gRPC's message limit at about 20,000 racks); with ids, those of the two racks asked."""
        self._record("ListRacks", request)
        if self.racks_answer is not None:
            return self.racks_answer
        if request.ids and self.knows_rack_ids:
            racks = (
                pb.Rack(id=pb.UUID(id=OTHER_ID), name="rack-01"),
                pb.Rack(id=pb.UUID(id=RACK_ID), name="rack-02"),
            )
            asked = [r for r in racks if r.id in request.ids]
            return pb.ListRacksResponse(racks=asked, total=len(asked))
        if not request.pagination.page_token:
            first = pb.Rack(id=pb.UUID(id=OTHER_ID), name="rack-01")
            return pb.ListRacksResponse(racks=[first], total=2, next_page_token="p2")
        return pb.ListRacksResponse(racks=[pb.Rack(id=pb.UUID(id=RACK_ID), name="rack-02")], total=2)

    def ListNVLDomains(self, request: Any, context: Any) -> pb.ListNVLDomainsResponse:
        """Two domains, nvl-a and nvl-b: those asked for by id or name, or a page of one each; a release
        before the fields answers both, whatever was asked."""
        self._record("ListNVLDomains", request)
        domains = (
            pb.NVLDomain(id=pb.UUID(id=OTHER_ID), name="nvl-a"),
            pb.NVLDomain(id=pb.UUID(id=RACK_ID), name="nvl-b"),
        )
        if not self.knows_domain_pages:
            return pb.ListNVLDomainsResponse(domains=domains)
        if request.ids or request.names:
            asked = [d for d in domains if d.id in request.ids or d.name in request.names]
            return pb.ListNVLDomainsResponse(domains=asked, total=len(asked))
        if not request.pagination.page_token:
            return pb.ListNVLDomainsResponse(domains=domains[:1], total=2, next_page_token="p2")
        return pb.ListNVLDomainsResponse(domains=domains[1:], total=2)

    def GetRack(self, request: Any, context: Any) -> pb.Rack:
        """rack-02, by its id or its name; NOT_FOUND for any other name."""
        self._record("GetRack", request)
        if not self.knows_rack_names and not request.HasField("id"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "id: an id is required")
        if request.HasField("name") and request.name != "rack-02":
            context.abort(grpc.StatusCode.NOT_FOUND, f"name: no rack named {request.name!r}")
        return pb.Rack(id=request.id if request.HasField("id") else pb.UUID(id=RACK_ID), name="rack-02")

    def DeleteRack(self, request: Any, context: Any) -> Empty:
        self._record("DeleteRack", request)
        return Empty()

    def UpdateTaskSchedule(self, request: Any, context: Any) -> pb.TaskSchedule:
        self._record("UpdateTaskSchedule", request)
        return pb.TaskSchedule(id=request.id, name="nightly")

    def UpgradeFirmware(self, request: Any, context: Any) -> pb.SubmitTaskResponse:
        self._record("UpgradeFirmware", request)
        return pb.SubmitTaskResponse(task_ids=[pb.UUID(id="t1")])

    def PauseTaskSchedule(self, request: Any, context: Any) -> pb.TaskSchedule:
        self._record("PauseTaskSchedule", request)
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "schedule nightly: a consumed one-time schedule")
        raise AssertionError("abort raises")

    def DeleteTaskSchedule(self, request: Any, context: Any) -> Empty:
        self._record("DeleteTaskSchedule", request)
        return Empty()


@pytest.fixture
def flow() -> Iterator[tuple[RecordingFlow, RackflowClient]]:
    servicer = RecordingFlow()  # type: ignore[abstract]  # the RPCs it lacks answer UNIMPLEMENTED
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    flow_pb2_grpc.add_FlowServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = RackflowClient(f"127.0.0.1:{port}", timeout=5)
    try:
        yield servicer, client
    finally:
        client.close()
        server.stop(grace=None)


def test_a_schedule_name_is_resolved_by_the_name_search_page_by_page(
    flow: tuple[RecordingFlow, RackflowClient],
) -> None:
    """Not by listing every schedule (a million, at scale): the search for the name, its pages followed
    until one holds the name exactly."""
    servicer, client = flow
    client.delete_schedule("nightly")
    assert [name for name, _ in servicer.requests] == [
        "ListTaskSchedules",
        "ListTaskSchedules",
        "DeleteTaskSchedule",
    ]
    searches = [request for name, request in servicer.requests if name == "ListTaskSchedules"]
    assert [(s.name_contains, s.pagination.limit, s.pagination.page_token) for s in searches] == [
        ("nightly", 1000, ""),
        ("nightly", 1000, "p2"),
    ]
    assert servicer.requests[2][1] == pb.DeleteTaskScheduleRequest(id=pb.UUID(id=SCHEDULE_ID))


def test_a_rack_name_is_one_get_rack_by_name(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    """Not the rack list read a page at a time (1.2-1.9 s at 20,000 racks): one GetRack asking for the
    name, whose answer is the rack (`get_rack`) or carries its id (every command naming a rack)."""
    servicer, client = flow
    assert client.get_rack("rack-02").id.id == RACK_ID
    assert servicer.requests == [("GetRack", pb.GetRackRequest(name="rack-02"))]
    servicer.requests.clear()
    client.delete_rack("rack-02")
    assert servicer.requests == [
        ("GetRack", pb.GetRackRequest(name="rack-02")),
        ("DeleteRack", pb.DeleteRackRequest(id=pb.UUID(id=RACK_ID))),
    ]
    servicer.requests.clear()
    client.get_rack(RACK_ID)  # an id is sent as one
    assert servicer.requests == [("GetRack", pb.GetRackRequest(id=pb.UUID(id=RACK_ID)))]
    with pytest.raises(RackflowClientError) as caught:
        client.resolve_rack_id("rack-99")
    assert (caught.value.code, caught.value.message) == (
        grpc.StatusCode.NOT_FOUND,
        "name: no rack named 'rack-99'",
    )


def test_a_server_that_reads_no_rack_name_is_asked_by_the_rack_list(
    flow: tuple[RecordingFlow, RackflowClient],
) -> None:
    """A CLI upgraded before its servers: the old GetRack reads the id alone and refuses the name. The
    name is then found on the rack list a page at a time, as that release's clients did."""
    servicer, client = flow
    servicer.knows_rack_names = False
    assert client.resolve_rack_id("rack-02") == RACK_ID
    assert [name for name, _ in servicer.requests] == ["GetRack", "ListRacks", "ListRacks", "GetRack"]
    with pytest.raises(RackflowClientError) as caught:
        client.get_rack("rack-99")
    assert (caught.value.code, caught.value.message) == (
        grpc.StatusCode.NOT_FOUND,
        "name: no rack named 'rack-99'",
    )


def test_every_rack_is_read_a_page_at_a_time(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    servicer, client = flow
    assert [r.name for r in client.all_racks()] == ["rack-01", "rack-02"]
    lists = [request for name, request in servicer.requests if name == "ListRacks"]
    assert [(r.pagination.limit, r.pagination.page_token) for r in lists] == [(1000, ""), (1000, "p2")]


def test_racks_are_read_by_id_in_one_list_racks(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    """The racks a table names, in one call that asks for them alone, with a page as long as the ids: a
    server of a release before those ids, which answers every rack, then answers one page."""
    servicer, client = flow
    assert [r.name for r in client.racks_by_id([RACK_ID, SCHEDULE_ID]) or ()] == ["rack-02"]  # no such rack
    assert servicer.requests == [
        (
            "ListRacks",
            pb.ListRacksRequest(
                ids=[pb.UUID(id=RACK_ID), pb.UUID(id=SCHEDULE_ID)],
                pagination=pb.Pagination(limit=2),
                view=pb.RACK_VIEW_BASIC,  # names: not each rack's components
            ),
        )
    ]
    servicer.requests.clear()
    assert client.racks_by_id([]) == [] and servicer.requests == []  # no ids would be every rack


def test_a_server_that_takes_no_rack_ids_is_told_by_a_rack_not_asked_for(
    flow: tuple[RecordingFlow, RackflowClient],
) -> None:
    """A CLI upgraded before its servers: the old ListRacks ignores the ids and answers its first racks.
    A rack not asked for among them says so (None: the caller reads names as that release's CLI did);
    when each was asked for, the answer is right as it is."""
    servicer, client = flow
    servicer.knows_rack_ids = False
    assert client.racks_by_id([RACK_ID]) is None  # answered rack-01, the first
    assert [r.name for r in client.racks_by_id([OTHER_ID]) or ()] == ["rack-01"]
    assert [name for name, _ in servicer.requests] == ["ListRacks", "ListRacks"]


def test_an_id_is_used_as_is(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    servicer, client = flow
    client.delete_schedule(SCHEDULE_ID)
    assert [name for name, _ in servicer.requests] == ["DeleteTaskSchedule"]


def test_an_unknown_name_is_not_found_without_calling_the_rpc(
    flow: tuple[RecordingFlow, RackflowClient],
) -> None:
    servicer, client = flow
    with pytest.raises(RackflowClientError) as caught:
        client.delete_schedule("weekly")
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert caught.value.message == "schedule 'weekly' not found"
    assert [name for name, _ in servicer.requests] == ["ListTaskSchedules", "ListTaskSchedules"]


@pytest.mark.parametrize(
    ("changes", "paths"),
    [
        ({"timezone": "Europe/Berlin"}, ["schedule.spec.timezone"]),
        ({"name": "n2", "spec": Spec.interval("1h")}, ["schedule.name", "schedule.spec"]),
        ({"spec": Spec.cron("0 2 * * *"), "timezone": "Asia/Tokyo"}, ["schedule.spec"]),
        ({"overlap": "queue"}, ["schedule.overlap_policy"]),
    ],
)
def test_update_sends_only_the_given_fields_in_the_mask(
    flow: tuple[RecordingFlow, RackflowClient], changes: dict[str, Any], paths: list[str]
) -> None:
    servicer, client = flow
    client.update_schedule(SCHEDULE_ID, **changes)
    [(_, request)] = servicer.requests
    assert isinstance(request, pb.UpdateTaskScheduleRequest)
    assert list(request.update_mask.paths) == paths
    if "overlap" in changes:
        assert request.schedule.overlap_policy == pb.OVERLAP_POLICY_QUEUE


def test_update_with_nothing_to_change_sends_nothing(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    servicer, client = flow
    with pytest.raises(ValueError, match="nothing to update"):
        client.update_schedule(SCHEDULE_ID)
    assert servicer.requests == []


def test_an_operation_goes_to_its_own_rpc(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    servicer, client = flow
    response = client.upgrade_firmware(Targets(racks=("rack-01",)), version="2.4.1", queue=True)
    assert [t.id for t in response.task_ids] == ["t1"]
    [(name, request)] = servicer.requests
    assert name == "UpgradeFirmware"
    assert isinstance(request, pb.UpgradeFirmwareRequest)
    assert request.target_version == "2.4.1"
    assert request.queue_options.conflict_strategy == pb.CONFLICT_STRATEGY_QUEUE
    assert request.target_spec.racks.targets[0].name == "rack-01"
    assert client.submit(Operation("upgrade_firmware", Targets(racks=("r",)))) == response


def test_a_server_error_keeps_its_code_and_message(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    _, client = flow
    with pytest.raises(RackflowClientError) as caught:
        client.pause_schedule(SCHEDULE_ID)
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert caught.value.message == "schedule nightly: a consumed one-time schedule"


def test_an_unimplemented_rpc_is_a_client_error_too(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    _, client = flow
    with pytest.raises(RackflowClientError) as caught:
        client.list_windows()
    assert caught.value.code == grpc.StatusCode.UNIMPLEMENTED


def test_no_server_is_unavailable() -> None:
    with RackflowClient("127.0.0.1:1", timeout=5) as client, pytest.raises(RackflowClientError) as caught:
        client.list_racks()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE


def test_list_filters_become_the_request_fields(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    servicer, client = flow
    client.list_schedules(
        paused_only=True, name_contains="night", operation="power-reset", order_by="next_run_at desc", limit=5
    )
    assert servicer.requests[-1][1] == pb.ListTaskSchedulesRequest(
        paused_only=True,
        name_contains="night",
        operation_type="power_reset",
        order_by="next_run_at desc",
        pagination=pb.Pagination(limit=5),
    )
    client.list_racks(name_contains="gb200", limit=20)
    assert servicer.requests[-1][1] == pb.ListRacksRequest(
        name_contains="gb200", pagination=pb.Pagination(limit=20)
    )


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("failed", pb.TASK_STATUS_FAILED),
        ("RUNNING", pb.TASK_STATUS_RUNNING),
        ("TASK_STATUS_WAITING", pb.TASK_STATUS_WAITING),
    ],
)
def test_task_status_names(name: str, status: int) -> None:
    assert task_status(name) == status


@pytest.mark.parametrize("name", ["unknown", "TASK_STATUS_UNKNOWN", "done", ""])
def test_unknown_task_status_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="unknown task status"):
        task_status(name)


@pytest.mark.parametrize("knows_fields", [True, False], ids=["server", "older server"])
def test_a_domain_is_found_by_asking_for_it_alone(
    flow: tuple[RecordingFlow, RackflowClient], knows_fields: bool
) -> None:
    """By id or by name, in one ListNVLDomains that asks for that domain (a fleet of NVL72 racks has
    20,000): a server of a release before those fields answers every domain, of which the one asked for
    is kept, so the answer is the same."""
    servicer, client = flow
    servicer.knows_domain_pages = knows_fields
    assert client.resolve_domain_id("nvl-b") == RACK_ID
    assert client.get_domain(OTHER_ID).name == "nvl-a"
    assert client.get_domain("nvl-b").id.id == RACK_ID
    assert [d.name for d in client.domains_asked(ids=[RACK_ID, SCHEDULE_ID])] == ["nvl-b"]
    assert client.domains_asked() == []  # nothing asked would be every domain: not sent
    asked = [request for _, request in servicer.requests]
    assert asked == [
        pb.ListNVLDomainsRequest(names=["nvl-b"]),
        pb.ListNVLDomainsRequest(ids=[pb.UUID(id=OTHER_ID)]),
        pb.ListNVLDomainsRequest(names=["nvl-b"]),
        pb.ListNVLDomainsRequest(ids=[pb.UUID(id=RACK_ID), pb.UUID(id=SCHEDULE_ID)]),
    ]
    with pytest.raises(RackflowClientError) as caught:
        client.get_domain("nvl-z")
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    assert caught.value.message == "name: no NVLink domain named 'nvl-z'"


def test_every_domain_is_read_a_page_at_a_time(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    servicer, client = flow
    assert [d.name for d in client.all_domains()] == ["nvl-a", "nvl-b"]
    lists = [request for name, request in servicer.requests if name == "ListNVLDomains"]
    assert [(r.pagination.limit, r.pagination.page_token) for r in lists] == [(1000, ""), (1000, "p2")]
    servicer.requests.clear()
    servicer.knows_domain_pages = False  # an older server answers every domain at once, with no token
    assert [d.name for d in client.all_domains()] == ["nvl-a", "nvl-b"]
    assert len(servicer.requests) == 1


def test_a_page_of_racks_past_grpcs_default_4_mib_is_read(flow: tuple[RecordingFlow, RackflowClient]) -> None:
    """A page of 1,000 GB200 NVL72 racks with their 36 components each is 5 MB, which the server sends (up
    to GRPC_MESSAGE_BYTES): the client took gRPC's default 4 MiB, and `inventory export`, `rack list
    --limit 1000` and a table naming a thousand racks failed RESOURCE_EXHAUSTED."""
    servicer, client = flow
    kinds = {pb.COMPONENT_TYPE_COMPUTE: 18, pb.COMPONENT_TYPE_NVSWITCH: 9, pb.COMPONENT_TYPE_POWERSHELF: 8}
    kinds[pb.COMPONENT_TYPE_TORSWITCH] = 1
    racks = []
    for r in range(1000):
        rack_id = pb.UUID(id=str(uuid.UUID(int=r + 1)))
        components = [
            pb.Component(
                id=pb.UUID(id=str(uuid.uuid4())),
                rack_id=rack_id,
                type=kind,
                name=f"tray-{kind}-{n:02}",
                external_id=f"SN-{r:05}-{kind}-{n:02}",
                firmware_version="1.2.3",
            )
            for kind, count in kinds.items()
            for n in range(count)
        ]
        racks.append(
            pb.Rack(id=rack_id, name=f"rack-{r:05}", external_id=f"SN-{r:05}", components=components)
        )
    servicer.racks_answer = pb.ListRacksResponse(racks=racks, total=1000)
    assert servicer.racks_answer.ByteSize() > 4 * 1024 * 1024
    assert len(client.list_racks(limit=1000).racks) == 1000
