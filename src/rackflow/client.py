"""A small synchronous client for rackflow's `Flow` service, the one the `rackflow` CLI uses.

One method per RPC, taking plain Python values (names or ids, enum names as strings) and returning the
protobuf messages unchanged. Racks and schedules may be named by name or id: a name is resolved by
listing. Every gRPC failure becomes `RackflowClientError(code, message)`. No business logic lives
here: the server validates and decides.

    with RackflowClient("127.0.0.1:50051") as flow:
        flow.create_schedule("nightly", Spec.cron("0 2 * * *", "America/Los_Angeles"),
                             Operation("power_reset", Targets(racks=("rack-01",))))
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Protocol, Self, TypedDict, TypeVar, Unpack, cast

import grpc
from google.protobuf.empty_pb2 import Empty
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.api.errors import AnsweredFiring, answered_firing, status_for
from rackflow.config import GRPC_MESSAGE_BYTES
from rackflow.domain.audit import target_lookups, target_named
from rackflow.errors import RackflowError
from rackflow.ids import is_uuid
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
# Schedules a page of the look-up that finds one by its name asks for, and racks or domains a page of
# `all_racks` and `all_domains` (the API's largest page).
NAME_SEARCH_PAGE = 1000
M = TypeVar("M", bound=Message)

COMPONENT_TYPES: dict[str, pb.ComponentType.ValueType] = {
    "COMPUTE": pb.COMPONENT_TYPE_COMPUTE,
    "NVSWITCH": pb.COMPONENT_TYPE_NVSWITCH,
    "POWERSHELF": pb.COMPONENT_TYPE_POWERSHELF,
    "TORSWITCH": pb.COMPONENT_TYPE_TORSWITCH,
    "UMS": pb.COMPONENT_TYPE_UMS,
    "CDU": pb.COMPONENT_TYPE_CDU,
}
SPEC_TYPES: dict[str, pb.ScheduleSpecType.ValueType] = {
    "interval": pb.SCHEDULE_SPEC_TYPE_INTERVAL,
    "cron": pb.SCHEDULE_SPEC_TYPE_CRON,
    "one_time": pb.SCHEDULE_SPEC_TYPE_ONE_TIME,
}
OVERLAP_POLICIES: dict[str, pb.OverlapPolicy.ValueType] = {
    "skip": pb.OVERLAP_POLICY_SKIP,
    "queue": pb.OVERLAP_POLICY_QUEUE,
}
# Operation name (also the `ScheduledOperation` oneof field) -> the RPC that submits it now.
OPERATION_RPCS: dict[str, str] = {
    "power_on": "PowerOnRack",
    "power_off": "PowerOffRack",
    "power_reset": "PowerResetRack",
    "bring_up": "BringUpRack",
    "ingest": "IngestRack",
    "upgrade_firmware": "UpgradeFirmware",
}
_FORCEABLE = {"power_off", "power_reset"}
WINDOW_KINDS: dict[str, pb.WindowKind.ValueType] = {
    "allow": pb.WINDOW_KIND_ALLOW,
    "freeze": pb.WINDOW_KIND_FREEZE,
}
WINDOW_POLICIES: dict[str, pb.WindowPolicy.ValueType] = {
    "skip": pb.WINDOW_POLICY_SKIP,
    "defer": pb.WINDOW_POLICY_DEFER,
}


class RackflowClientError(Exception):
    """A failed call: the gRPC status code and the server's message, and the firing it answers when it
    answers one (a trigger that fired but submitted no task: `api.errors.answered_firing`)."""

    def __init__(self, code: grpc.StatusCode, message: str, firing: AnsweredFiring | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.firing = firing


# What a server of a release before GetRack by name answers a request naming a rack: it reads the id alone.
_NO_RACK_ID = (grpc.StatusCode.INVALID_ARGUMENT, "id: an id is required")

TASK_STATUSES = tuple(
    value.name.removeprefix("TASK_STATUS_")
    for value in pb.TaskStatus.DESCRIPTOR.values
    if value.number != pb.TASK_STATUS_UNKNOWN
)


def _key(value: str) -> str:
    return value.strip().lower().replace("-", "_")


def component_type(name: str) -> pb.ComponentType.ValueType:
    """`compute`, `COMPUTE` or `COMPONENT_TYPE_COMPUTE` -> the enum value."""
    key = name.strip().upper().removeprefix("COMPONENT_TYPE_")
    if key not in COMPONENT_TYPES:
        raise ValueError(f"unknown component type {name!r} (one of {', '.join(COMPONENT_TYPES)})")
    return COMPONENT_TYPES[key]


def operation_name(name: str) -> str:
    """`power-on` or `power_on` -> `power_on`."""
    key = _key(name)
    if key not in OPERATION_RPCS:
        choices = ", ".join(k.replace("_", "-") for k in OPERATION_RPCS)
        raise ValueError(f"unknown operation {name!r} (one of {choices})")
    return key


def task_status(name: str) -> pb.TaskStatus.ValueType:
    """`running`, `RUNNING` or `TASK_STATUS_RUNNING` -> the enum value."""
    key = name.strip().upper().removeprefix("TASK_STATUS_")
    if key not in TASK_STATUSES:
        raise ValueError(f"unknown task status {name!r} (one of {', '.join(TASK_STATUSES).lower()})")
    return pb.TaskStatus.Value(f"TASK_STATUS_{key}")


VIEWS = ("basic", "full")


def _view(name: str, prefix: str, what: str) -> str:
    """`basic`, `FULL` or `<PREFIX>BASIC` -> the enum value's name `<PREFIX>BASIC`: the views of the List RPCs
    that have one are named alike, and each is read by this one rule."""
    key = name.strip().lower().removeprefix(prefix.lower())
    if key not in VIEWS:
        raise ValueError(f"unknown {what} view {name!r} (basic or full)")
    return f"{prefix}{key.upper()}"


def run_view(name: str) -> pb.TaskScheduleRunView.ValueType:
    """`basic`, `FULL` or `TASK_SCHEDULE_RUN_VIEW_BASIC` -> the enum value (ListTaskScheduleRuns' view)."""
    return pb.TaskScheduleRunView.Value(_view(name, "TASK_SCHEDULE_RUN_VIEW_", "run"))


def rack_view(name: str) -> pb.RackView.ValueType:
    """`basic`, `FULL` or `RACK_VIEW_BASIC` -> the enum value (ListRacks' view: BASIC without components)."""
    return pb.RackView.Value(_view(name, "RACK_VIEW_", "rack"))


def overlap_policy(name: str) -> pb.OverlapPolicy.ValueType:
    key = _key(name)
    if key not in OVERLAP_POLICIES:
        raise ValueError(f"unknown overlap policy {name!r} (skip or queue)")
    return OVERLAP_POLICIES[key]


def _timestamp(value: datetime) -> Timestamp:
    if value.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


@dataclass(frozen=True)
class Targets:
    """What an operation acts on: racks, components or NVLink domains (exactly one kind).

    Racks and domains are names or ids; components are ids or `TYPE:EXTERNAL_ID`. `types` narrows racks
    and domains to those component types (empty = all components).
    """

    racks: Sequence[str] = ()
    components: Sequence[str] = ()
    domains: Sequence[str] = ()
    types: Sequence[str] = ()

    def to_proto(self) -> pb.OperationTargetSpec:
        kinds = [kind for kind in ("racks", "components", "domains") if getattr(self, kind)]
        if len(kinds) != 1:
            raise ValueError("give exactly one kind of target: racks, components or domains")
        types = [component_type(t) for t in self.types]
        if self.components:
            if types:
                raise ValueError("component types filter racks or domains, not explicit components")
            return pb.OperationTargetSpec(
                components=pb.ComponentTargets(targets=[_component_target(c) for c in self.components])
            )
        if self.racks:
            racks = [
                pb.RackTarget(id=pb.UUID(id=r), component_types=types)
                if is_uuid(r)
                else pb.RackTarget(name=r, component_types=types)
                for r in self.racks
            ]
            return pb.OperationTargetSpec(racks=pb.RackTargets(targets=racks))
        domains = [
            pb.NVLDomainTarget(id=pb.UUID(id=d), component_types=types)
            if is_uuid(d)
            else pb.NVLDomainTarget(name=d, component_types=types)
            for d in self.domains
        ]
        return pb.OperationTargetSpec(nvl_domains=pb.NVLDomainTargets(targets=domains))


def _component_target(value: str) -> pb.ComponentTarget:
    if is_uuid(value):
        return pb.ComponentTarget(id=pb.UUID(id=value))
    ctype, sep, external_id = value.partition(":")
    if not sep or not external_id:
        raise ValueError(f"component {value!r}: expected a UUID or TYPE:EXTERNAL_ID")
    return pb.ComponentTarget(external=pb.ExternalRef(type=component_type(ctype), id=external_id))


@dataclass(frozen=True)
class Spec:
    """When a schedule fires: `interval` (Go duration), `cron` (in `timezone`) or `one_time` (RFC 3339)."""

    type: str
    spec: str
    timezone: str = ""

    @classmethod
    def interval(cls, duration: str) -> Spec:
        return cls("interval", duration)

    @classmethod
    def cron(cls, expression: str, timezone: str = "") -> Spec:
        return cls("cron", expression, timezone)

    @classmethod
    def at(cls, rfc3339: str) -> Spec:
        return cls("one_time", rfc3339)

    def to_proto(self) -> pb.ScheduleSpec:
        key = _key(self.type)
        if key not in SPEC_TYPES:
            raise ValueError(f"unknown spec type {self.type!r} (interval, cron or one_time)")
        return pb.ScheduleSpec(type=SPEC_TYPES[key], spec=self.spec, timezone=self.timezone)


@dataclass(frozen=True)
class Operation:
    """An operation on targets: what a task command submits and what a schedule runs.

    `forced` applies to power_off and power_reset; `version`, `start` and `end` to upgrade_firmware.
    `queue` asks for the QUEUE conflict strategy (wait behind a conflicting task for `queue_timeout` s).
    `ignore_windows` starts the tasks even inside a FREEZE window (operator role; audited).
    """

    name: str
    targets: Targets
    description: str = ""
    forced: bool = False
    version: str = ""
    start: datetime | None = None
    end: datetime | None = None
    queue: bool = False
    queue_timeout: int = 0
    ignore_windows: bool = False

    def to_proto(self) -> pb.ScheduledOperation:
        name = operation_name(self.name)
        spelled = name.replace("_", "-")  # as the options and these messages spell operations
        if self.forced and name not in _FORCEABLE:
            raise ValueError(f"--forced applies to power-off and power-reset, not {spelled}")
        if (self.version or self.start or self.end) and name != "upgrade_firmware":
            raise ValueError(f"a version or maintenance window applies to upgrade-firmware, not {spelled}")
        queue = pb.QueueOptions(
            conflict_strategy=pb.CONFLICT_STRATEGY_QUEUE if self.queue else pb.CONFLICT_STRATEGY_REJECT,
            queue_timeout_seconds=self.queue_timeout,
            ignore_windows=self.ignore_windows,
        )
        request = pb.ScheduledOperation()
        body = getattr(request, name)
        body.target_spec.CopyFrom(self.targets.to_proto())
        body.description = self.description
        body.queue_options.CopyFrom(queue)
        if name in _FORCEABLE:
            body.forced = self.forced
        if name == "upgrade_firmware":
            body.target_version = self.version
            if self.start:
                body.start_time.CopyFrom(_timestamp(self.start))
            if self.end:
                body.end_time.CopyFrom(_timestamp(self.end))
        return request


def with_targets(operation: pb.ScheduledOperation, targets: Targets) -> pb.ScheduledOperation:
    """A copy of a schedule's stored operation (`TaskSchedule.operation`, no target) aimed at `targets`."""
    aimed = pb.ScheduledOperation()
    aimed.CopyFrom(operation)
    name = aimed.WhichOneof("operation")
    if name is None:
        raise ValueError("the schedule carries no operation (a server older than this client?)")
    getattr(aimed, name).target_spec.CopyFrom(targets.to_proto())
    return aimed


def _window_target(value: str) -> pb.WindowTarget:
    return pb.WindowTarget(id=pb.UUID(id=value)) if is_uuid(value) else pb.WindowTarget(name=value)


@dataclass(frozen=True)
class Recurrence:
    """A recurring window's timing: starts at `cron` in `timezone` ("" = UTC), lasting `duration`."""

    cron: str
    duration: str
    timezone: str = ""


@dataclass(frozen=True)
class Span:
    """A one-off window's timing."""

    start: datetime
    end: datetime


@dataclass(frozen=True)
class Window:
    """A maintenance window to create: racks and domains by name or id (none: every rack), operation
    names (none: every operation)."""

    kind: str  # "allow" or "freeze"
    when: Recurrence | Span
    racks: Sequence[str] = ()
    domains: Sequence[str] = ()
    operations: Sequence[str] = ()
    reason: str = ""

    def to_proto(self, name: str) -> pb.MaintenanceWindow:
        if self.kind not in WINDOW_KINDS:
            raise ValueError(f"unknown window kind {self.kind!r} (allow or freeze)")
        message = pb.MaintenanceWindow(
            name=name,
            reason=self.reason,
            kind=WINDOW_KINDS[self.kind],
            racks=[_window_target(r) for r in self.racks],
            nvl_domains=[_window_target(d) for d in self.domains],
            operations=list(self.operations),
        )
        set_window_when(message, self.when)
        return message


def set_window_when(message: pb.MaintenanceWindow, when: Recurrence | Span) -> None:
    if isinstance(when, Recurrence):
        message.recurring.CopyFrom(
            pb.RecurringWindow(cron=when.cron, duration=when.duration, timezone=when.timezone)
        )
    else:
        message.one_off.CopyFrom(pb.OneOffWindow(start=_timestamp(when.start), end=_timestamp(when.end)))


@dataclass(frozen=True)
class NewComponent:
    """A component to create in a rack."""

    type: str
    name: str
    external_id: str = ""
    firmware_version: str = ""

    def to_proto(self) -> pb.ComponentSpec:
        return pb.ComponentSpec(
            type=component_type(self.type),
            name=self.name,
            external_id=self.external_id,
            firmware_version=self.firmware_version,
        )


class SubmitOptions(TypedDict, total=False):
    """Keyword options of every operation method (see `Operation`)."""

    description: str
    queue: bool
    queue_timeout: int


class ForcedOptions(SubmitOptions, total=False):
    forced: bool


class FirmwareOptions(SubmitOptions, total=False):
    version: str
    start: datetime
    end: datetime


def _page(offset: int, limit: int, page_token: str) -> pb.Pagination | None:
    """The request's page: a `page_token` (a previous response's `next_page_token`) continues a list where
    that page ended; `offset` skips rows (not with a token)."""
    if not (offset or limit or page_token):
        return None
    return pb.Pagination(offset=offset, limit=limit, page_token=page_token)


class _Paged(Protocol):
    next_page_token: str


_P = TypeVar("_P", bound=_Paged)


def _pages(ask: Callable[[str], _P]) -> Iterator[_P]:
    """Each page of a list, `ask`ed with the token of the page before it (first ""), until one has none
    (an older server that answers a list whole answers it with none: one page)."""
    token = ""
    while True:
        page = ask(token)
        yield page
        token = page.next_page_token
        if not token:
            return


class RackflowClient:
    """Synchronous client; use as a context manager or call `close()`."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float = 30.0,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
    ) -> None:
        """`credentials` (TLS) selects a secure channel; without it the channel is plaintext.

        `token` is sent as `authorization: Bearer <token>` on every call.
        """
        self.target = target
        self.timeout = timeout
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        # As much as the server sends (a page of racks with their components may pass gRPC's 4 MiB).
        options = [("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES)]
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options)
        self._stub = flow_pb2_grpc.FlowStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, rpc: Callable[..., object], request: Message, returns: type[M]) -> M:
        try:
            response = rpc(request, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            trailing = exc.trailing_metadata() if isinstance(exc, grpc.Call) else None
            raise RackflowClientError(exc.code(), exc.details() or "", answered_firing(trailing)) from None
        return cast(M, response)

    # --- name or id ------------------------------------------------------------------------------

    def resolve_rack_id(self, rack: str) -> str:
        """The id of the rack named `rack` (or `rack` itself, an id): one GetRack by its name, which the
        server reads from the racks' unique name index. Finding it on the rack list a page at a time
        (`all_racks`) took 1.2-1.9 s at 20,000 racks (docs/PERFORMANCE.md, issue 29)."""
        if is_uuid(rack):
            return rack
        return self.get_rack(rack).id.id

    def resolve_schedule_id(self, schedule: str) -> str:
        """The id of the schedule named `schedule` (or `schedule` itself, an id). Asked of the name search
        (`name_contains`, the schedules' trigram index), page by page until the search says it is over,
        not of the whole list: at a million schedules every command naming one read them all."""
        if is_uuid(schedule):
            return schedule
        token = ""
        while True:
            page = self.list_schedules(name_contains=schedule, limit=NAME_SEARCH_PAGE, page_token=token)
            for found in page.task_schedules:
                if found.name == schedule:
                    return found.id.id
            token = page.next_page_token
            if not token:
                raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"schedule {schedule!r} not found")

    def resolve_domain_id(self, domain: str) -> str:
        if is_uuid(domain):
            return domain
        for found in self.domains_asked(names=[domain]):
            return found.id.id
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"NVLink domain {domain!r} not found")

    def resolve_target_id(self, target: str) -> str:
        """The id an audit filter's target names: an id, or the name of one thing of any kind, looked up
        as each kind's commands look up theirs (`rackflow.domain.audit.target_lookups`;
        `target_named` refuses a name several kinds use)."""
        if is_uuid(target):
            return target
        found: dict[str, str] = {}
        for kind, by_name in target_lookups(self).items():
            try:
                found[kind] = by_name(target)
            except RackflowClientError as exc:
                if exc.code != grpc.StatusCode.NOT_FOUND:
                    raise
        try:
            return target_named("target", target, found)
        except RackflowError as exc:
            raise RackflowClientError(status_for(exc), str(exc)) from None

    def _schedule_ref(self, schedule: str) -> pb.UUID:
        return pb.UUID(id=self.resolve_schedule_id(schedule))

    def _rack_ref(self, rack: str) -> pb.UUID:
        return pb.UUID(id=self.resolve_rack_id(rack))

    # --- inventory -------------------------------------------------------------------------------

    def create_rack(
        self,
        name: str,
        *,
        external_id: str = "",
        domain: str = "",
        components: Sequence[NewComponent] = (),
    ) -> pb.Rack:
        """`domain` (name or id) puts the rack in an existing NVLink domain."""
        request = pb.CreateRackRequest(
            name=name,
            external_id=external_id,
            nvl_domain_id=pb.UUID(id=self.resolve_domain_id(domain)) if domain else None,
            components=[c.to_proto() for c in components],
        )
        return self._call(self._stub.CreateRack, request, pb.Rack)

    def get_rack(self, rack: str) -> pb.Rack:
        """The rack of that id or name (an id wins when a name looks like one), in one GetRack. A server of
        a release before GetRack took a name reads the id alone and refuses the request for lacking one
        (`_NO_RACK_ID`): the name is then found on the rack list, a page at a time, as that release's
        clients did, so a CLI upgraded before its servers still works, slowly."""
        if is_uuid(rack):
            return self._call(self._stub.GetRack, pb.GetRackRequest(id=pb.UUID(id=rack)), pb.Rack)
        try:
            return self._call(self._stub.GetRack, pb.GetRackRequest(name=rack), pb.Rack)
        except RackflowClientError as err:
            if (err.code, err.message) != _NO_RACK_ID:
                raise
        for found in self.all_racks():
            if found.name == rack:
                return self.get_rack(found.id.id)
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"name: no rack named {rack!r}")

    def list_racks(
        self,
        *,
        domain: str = "",
        name_contains: str = "",
        offset: int = 0,
        limit: int = 0,
        page_token: str = "",
    ) -> pb.ListRacksResponse:
        request = pb.ListRacksRequest(
            nvl_domain_id=pb.UUID(id=self.resolve_domain_id(domain)) if domain else None,
            name_contains=name_contains,
            pagination=_page(offset, limit, page_token),
        )
        return self._call(self._stub.ListRacks, request, pb.ListRacksResponse)

    def racks_by_id(self, rack_ids: Sequence[str]) -> list[pb.Rack] | None:
        """Those of `rack_ids` (at most `MAX_PAGE_SIZE`) that exist, without their components (the BASIC
        view; an older server's answer has them), in one ListRacks by `ids`; None from a
        server of a release before that field, which ignores it and answers its first racks. Asked with a
        limit of as many racks, that answer is a page; one rack in it not asked for shows the field was
        ignored. When every rack it holds was asked for, they are the racks asked for that exist, or the
        whole list (shorter than the page): the answer is right either way."""
        if not rack_ids:  # no ids asks for every rack
            return []
        request = pb.ListRacksRequest(
            ids=[pb.UUID(id=r) for r in rack_ids],
            pagination=pb.Pagination(limit=len(rack_ids)),
            view=pb.RACK_VIEW_BASIC,  # names, not components (36 a rack of NVL72: 5 MB a thousand)
        )
        found = self._call(self._stub.ListRacks, request, pb.ListRacksResponse).racks
        asked = set(rack_ids)
        return list(found) if all(r.id.id in asked for r in found) else None

    def all_racks(self) -> Iterator[pb.Rack]:
        """Every rack, read a page at a time: the whole list in one answer passed gRPC's 4 MiB message
        limit at about 20,000 racks (RESOURCE_EXHAUSTED), and every command that showed racks by name
        failed there. A rack named on the command line is one GetRack by name (`resolve_rack_id`)."""
        for page in _pages(lambda token: self.list_racks(limit=NAME_SEARCH_PAGE, page_token=token)):
            yield from page.racks

    def delete_rack(self, rack: str) -> None:
        self._call(self._stub.DeleteRack, pb.DeleteRackRequest(id=self._rack_ref(rack)), Empty)

    def add_components(self, rack: str, components: Sequence[NewComponent]) -> pb.AddComponentsResponse:
        request = pb.AddComponentsRequest(
            rack_id=self._rack_ref(rack), components=[c.to_proto() for c in components]
        )
        return self._call(self._stub.AddComponents, request, pb.AddComponentsResponse)

    def remove_component(self, component_id: str) -> None:
        request = pb.RemoveComponentRequest(id=pb.UUID(id=component_id))
        self._call(self._stub.RemoveComponent, request, Empty)

    def create_domain(self, name: str, racks: Sequence[str] = ()) -> pb.NVLDomain:
        request = pb.CreateNVLDomainRequest(name=name, rack_ids=[self._rack_ref(r) for r in racks])
        return self._call(self._stub.CreateNVLDomain, request, pb.NVLDomain)

    def list_domains(
        self, *, offset: int = 0, limit: int = 0, page_token: str = ""
    ) -> pb.ListNVLDomainsResponse:
        request = pb.ListNVLDomainsRequest(pagination=_page(offset, limit, page_token))
        return self._call(self._stub.ListNVLDomains, request, pb.ListNVLDomainsResponse)

    def domains_asked(self, *, ids: Sequence[str] = (), names: Sequence[str] = ()) -> list[pb.NVLDomain]:
        """Those of the domains of `ids` or of `names` (at most `MAX_PAGE_SIZE`) that exist, in one
        ListNVLDomains. A server of a release before those fields ignores them and answers every domain,
        of which those asked for are kept: the answer is right either way, and costs the whole list only
        there."""
        if not ids and not names:  # neither asks for every domain
            return []
        request = pb.ListNVLDomainsRequest(ids=[pb.UUID(id=i) for i in ids], names=names)
        found = self._call(self._stub.ListNVLDomains, request, pb.ListNVLDomainsResponse).domains
        asked_ids, asked_names = set(ids), set(names)
        return [d for d in found if d.id.id in asked_ids or d.name in asked_names]

    def all_domains(self) -> Iterator[pb.NVLDomain]:
        """Every domain, read a page at a time (a fleet of NVL72 racks has a domain a rack: 40,000 of them
        in one answer pass gRPC's 4 MiB). A server of a release before pages answers them all at once."""
        for page in _pages(lambda token: self.list_domains(limit=NAME_SEARCH_PAGE, page_token=token)):
            yield from page.domains

    def get_domain(self, domain: str) -> pb.NVLDomain:
        """The NVLink domain of that id or name (an id wins when a name looks like one): the API has no
        GetNVLDomain, so ListNVLDomains is asked for that one. NOT_FOUND as the server words it for a
        domain."""
        by_id = is_uuid(domain)
        for found in self.domains_asked(ids=[domain]) if by_id else self.domains_asked(names=[domain]):
            return found
        missing = (
            f"id: no NVLink domain with id {domain}" if by_id else f"name: no NVLink domain named {domain!r}"
        )
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, missing)

    # --- operations: one task per targeted rack ----------------------------------------------------

    def submit(self, operation: Operation) -> pb.SubmitTaskResponse:
        """Submit `operation` now through its own RPC (PowerOnRack, …, UpgradeFirmware)."""
        request = operation.to_proto()
        name = request.WhichOneof("operation")
        assert name is not None
        rpc = getattr(self._stub, OPERATION_RPCS[name])
        return self._call(rpc, getattr(request, name), pb.SubmitTaskResponse)

    def power_on(self, targets: Targets, **options: Unpack[SubmitOptions]) -> pb.SubmitTaskResponse:
        return self.submit(Operation("power_on", targets, **options))

    def power_off(self, targets: Targets, **options: Unpack[ForcedOptions]) -> pb.SubmitTaskResponse:
        return self.submit(Operation("power_off", targets, **options))

    def power_reset(self, targets: Targets, **options: Unpack[ForcedOptions]) -> pb.SubmitTaskResponse:
        return self.submit(Operation("power_reset", targets, **options))

    def bring_up(self, targets: Targets, **options: Unpack[SubmitOptions]) -> pb.SubmitTaskResponse:
        return self.submit(Operation("bring_up", targets, **options))

    def ingest(self, targets: Targets, **options: Unpack[SubmitOptions]) -> pb.SubmitTaskResponse:
        return self.submit(Operation("ingest", targets, **options))

    def upgrade_firmware(self, targets: Targets, **options: Unpack[FirmwareOptions]) -> pb.SubmitTaskResponse:
        return self.submit(Operation("upgrade_firmware", targets, **options))

    # --- tasks -----------------------------------------------------------------------------------

    def list_tasks(
        self,
        *,
        rack: str = "",
        schedule: str = "",
        active_only: bool = False,
        statuses: Sequence[str] = (),
        offset: int = 0,
        limit: int = 0,
        page_token: str = "",
    ) -> pb.ListTasksResponse:
        request = pb.ListTasksRequest(
            rack_id=self._rack_ref(rack) if rack else None,
            schedule_id=self._schedule_ref(schedule) if schedule else None,
            active_only=active_only,
            statuses=[task_status(s) for s in statuses],
            pagination=_page(offset, limit, page_token),
        )
        return self._call(self._stub.ListTasks, request, pb.ListTasksResponse)

    def get_tasks(self, task_ids: Sequence[str]) -> pb.GetTasksByIDsResponse:
        request = pb.GetTasksByIDsRequest(task_ids=[pb.UUID(id=t) for t in task_ids])
        return self._call(self._stub.GetTasksByIDs, request, pb.GetTasksByIDsResponse)

    def get_task(self, task_id: str) -> pb.Task:
        """One task; NOT_FOUND when the server does not return it."""
        for task in self.get_tasks([task_id]).tasks:
            if task.id.id == task_id:
                return task
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"task {task_id!r} not found")

    def cancel_task(self, task_id: str) -> pb.CancelTaskResponse:
        request = pb.CancelTaskRequest(task_id=pb.UUID(id=task_id))
        return self._call(self._stub.CancelTask, request, pb.CancelTaskResponse)

    # --- schedules -------------------------------------------------------------------------------

    def create_schedule(
        self,
        name: str,
        spec: Spec,
        operation: Operation,
        *,
        overlap: str = "skip",
        window_policy: str = "skip",
        rollout: pb.RolloutPolicy | None = None,
        approval: pb.ApprovalPolicy | None = None,
        start_deadline: str = "",
        pause_after_failed_runs: int = 0,
        retry: pb.RetryPolicy | None = None,
    ) -> pb.TaskSchedule:
        """`start_deadline` (a Go duration; "" the server's default, "0s" none) and
        `pause_after_failed_runs` (0: never): docs/SAFETY.md."""
        config = pb.ScheduleConfig(
            name=name,
            spec=spec.to_proto(),
            overlap_policy=overlap_policy(overlap),
            window_policy=WINDOW_POLICIES[window_policy],
            rollout=rollout,
            approval=approval,
            start_deadline=start_deadline,
            pause_after_failed_runs=pause_after_failed_runs,
            retry=retry,
        )
        request = pb.CreateTaskScheduleRequest(schedule=config, operation=operation.to_proto())
        return self._call(self._stub.CreateTaskSchedule, request, pb.TaskSchedule)

    def get_schedule(self, schedule: str) -> pb.TaskSchedule:
        request = pb.GetTaskScheduleRequest(id=self._schedule_ref(schedule))
        return self._call(self._stub.GetTaskSchedule, request, pb.TaskSchedule)

    def list_schedules(
        self,
        *,
        rack: str = "",
        enabled_only: bool = False,
        paused_only: bool = False,
        name_contains: str = "",
        operation: str = "",
        order_by: str = "",
        offset: int = 0,
        limit: int = 0,
        page_token: str = "",
    ) -> pb.ListTaskSchedulesResponse:
        request = pb.ListTaskSchedulesRequest(
            rack_id=self._rack_ref(rack) if rack else None,
            enabled_only=True if enabled_only else None,
            paused_only=paused_only,
            name_contains=name_contains,
            operation_type=operation_name(operation) if operation else "",
            order_by=order_by,
            pagination=_page(offset, limit, page_token),
        )
        return self._call(self._stub.ListTaskSchedules, request, pb.ListTaskSchedulesResponse)

    def update_schedule(
        self,
        schedule: str,
        *,
        name: str | None = None,
        spec: Spec | None = None,
        timezone: str | None = None,
        overlap: str | None = None,
        window_policy: str | None = None,
        rollout: pb.RolloutPolicy | None = None,
        remove_rollout: bool = False,
        approval: pb.ApprovalPolicy | None = None,
        remove_approval: bool = False,
        start_deadline: str | None = None,
        pause_after_failed_runs: int | None = None,
        retry: pb.RetryPolicy | None = None,
        remove_retry: bool = False,
    ) -> pb.TaskSchedule:
        """Change only what is given; `timezone` alone keeps the spec and changes its zone. `rollout`
        replaces the rollout policy, `remove_rollout` removes it; `approval` and `remove_approval` alike.
        `start_deadline` "" goes back to the server's default; `retry` and `remove_retry` like rollout."""
        config = pb.ScheduleConfig()
        paths = []
        if approval is not None:
            config.approval.CopyFrom(approval)
        if approval is not None or remove_approval:
            paths.append("schedule.approval")
        if start_deadline is not None:
            config.start_deadline = start_deadline
            paths.append("schedule.start_deadline")
        if pause_after_failed_runs is not None:
            config.pause_after_failed_runs = pause_after_failed_runs
            paths.append("schedule.pause_after_failed_runs")
        if retry is not None:
            config.retry.CopyFrom(retry)
        if retry is not None or remove_retry:
            paths.append("schedule.retry")
        if window_policy is not None:
            config.window_policy = WINDOW_POLICIES[window_policy]
            paths.append("schedule.window_policy")
        if rollout is not None:
            config.rollout.CopyFrom(rollout)
        if rollout is not None or remove_rollout:
            paths.append("schedule.rollout")
        if name is not None:
            config.name = name
            paths.append("schedule.name")
        if overlap is not None:
            config.overlap_policy = overlap_policy(overlap)
            paths.append("schedule.overlap_policy")
        if spec is not None:
            config.spec.CopyFrom(spec.to_proto())
            paths.append("schedule.spec")
        elif timezone is not None:
            config.spec.timezone = timezone
            paths.append("schedule.spec.timezone")
        if not paths:
            raise ValueError(
                "nothing to update: give a name, spec, timezone, overlap, window, rollout, approval or "
                "retry policy, start deadline or pause after failed runs"
            )
        request = pb.UpdateTaskScheduleRequest(
            id=self._schedule_ref(schedule), schedule=config, update_mask=FieldMask(paths=paths)
        )
        return self._call(self._stub.UpdateTaskSchedule, request, pb.TaskSchedule)

    def pause_schedule(
        self, schedule: str, *, reason: str = "", resume_at: datetime | None = None
    ) -> pb.TaskSchedule:
        request = pb.PauseTaskScheduleRequest(id=self._schedule_ref(schedule), reason=reason)
        if resume_at is not None:
            request.resume_at.FromDatetime(resume_at.astimezone(UTC))
        return self._call(self._stub.PauseTaskSchedule, request, pb.TaskSchedule)

    def resume_schedule(self, schedule: str) -> pb.TaskSchedule:
        request = pb.ResumeTaskScheduleRequest(id=self._schedule_ref(schedule))
        return self._call(self._stub.ResumeTaskSchedule, request, pb.TaskSchedule)

    def delete_schedule(self, schedule: str) -> None:
        request = pb.DeleteTaskScheduleRequest(id=self._schedule_ref(schedule))
        self._call(self._stub.DeleteTaskSchedule, request, Empty)

    def trigger_schedule(
        self, schedule: str, *, approve: bool = False, request_id: str = ""
    ) -> pb.SubmitTaskResponse:
        """Fire now; `approve`: the caller (an approver) approves the firing of a schedule that needs it;
        `request_id`: sent again with it, the trigger answers the run it fired instead of firing again."""
        request = pb.TriggerTaskScheduleRequest(
            id=self._schedule_ref(schedule), approve=approve, request_id=request_id
        )
        return self._call(self._stub.TriggerTaskSchedule, request, pb.SubmitTaskResponse)

    def add_scope(self, schedule: str, targets: Targets) -> pb.AddTaskScheduleScopeResponse:
        request = pb.AddTaskScheduleScopeRequest(
            schedule_id=self._schedule_ref(schedule), target_spec=targets.to_proto()
        )
        return self._call(self._stub.AddTaskScheduleScope, request, pb.AddTaskScheduleScopeResponse)

    def update_scope(self, schedule: str, targets: Targets) -> pb.UpdateTaskScheduleScopeResponse:
        request = pb.UpdateTaskScheduleScopeRequest(
            schedule_id=self._schedule_ref(schedule), desired_scope=targets.to_proto()
        )
        return self._call(self._stub.UpdateTaskScheduleScope, request, pb.UpdateTaskScheduleScopeResponse)

    def remove_scope(self, scope_id: str) -> None:
        request = pb.RemoveTaskScheduleScopeRequest(scope_id=pb.UUID(id=scope_id))
        self._call(self._stub.RemoveTaskScheduleScope, request, Empty)

    def list_scopes(
        self, schedule: str, *, offset: int = 0, limit: int = 0, page_token: str = ""
    ) -> pb.ListTaskScheduleScopesResponse:
        """The schedule's scope entries by rack id; without a limit, all of them."""
        request = pb.ListTaskScheduleScopesRequest(
            schedule_id=self._schedule_ref(schedule), pagination=_page(offset, limit, page_token)
        )
        return self._call(self._stub.ListTaskScheduleScopes, request, pb.ListTaskScheduleScopesResponse)

    def check_conflicts(
        self, operation: Operation | pb.ScheduledOperation, *, exclude: str = ""
    ) -> pb.CheckScheduleConflictsResponse:
        """Enabled schedules that could collide with `operation` (one built here, or a schedule's own
        aimed at its scope with `with_targets`)."""
        request = pb.CheckScheduleConflictsRequest(
            operation=operation.to_proto() if isinstance(operation, Operation) else operation,
            exclude_schedule_id=self._schedule_ref(exclude) if exclude else None,
        )
        return self._call(self._stub.CheckScheduleConflicts, request, pb.CheckScheduleConflictsResponse)

    def preview(
        self, spec: Spec, *, count: int = 0, after: datetime | None = None
    ) -> pb.PreviewScheduleSpecResponse:
        """The next `count` firing times (server default 10) strictly after `after` (default now)."""
        request = pb.PreviewScheduleSpecRequest(
            spec=spec.to_proto(), count=count, after=_timestamp(after) if after else None
        )
        return self._call(self._stub.PreviewScheduleSpec, request, pb.PreviewScheduleSpecResponse)

    def preview_schedule(
        self,
        schedule: str,
        *,
        count: int = 0,
        after: datetime | None = None,
        resume_at: datetime | None = None,
    ) -> pb.PreviewTaskScheduleResponse:
        """The schedule's next `count` firings (server default 10) and what each does per rack;
        `resume_at`: as if paused until then (which slots a late resume would miss)."""
        request = pb.PreviewTaskScheduleRequest(
            id=self._schedule_ref(schedule),
            count=count,
            after=_timestamp(after) if after else None,
            resume_at=_timestamp(resume_at) if resume_at else None,
        )
        return self._call(self._stub.PreviewTaskSchedule, request, pb.PreviewTaskScheduleResponse)

    def list_runs(
        self, schedule: str, *, offset: int = 0, limit: int = 0, page_token: str = "", view: str = ""
    ) -> pb.ListTaskScheduleRunsResponse:
        """The schedule's runs, newest first; `view` "basic": each run's racks counted, not listed."""
        request = pb.ListTaskScheduleRunsRequest(
            schedule_id=self._schedule_ref(schedule),
            pagination=_page(offset, limit, page_token),
            view=run_view(view) if view else pb.TASK_SCHEDULE_RUN_VIEW_UNSPECIFIED,
        )
        return self._call(self._stub.ListTaskScheduleRuns, request, pb.ListTaskScheduleRunsResponse)

    def get_run(self, run_id: str) -> pb.TaskScheduleRun:
        request = pb.GetTaskScheduleRunRequest(id=pb.UUID(id=run_id))
        return self._call(self._stub.GetTaskScheduleRun, request, pb.TaskScheduleRun)

    def resume_run(self, run_id: str) -> pb.TaskScheduleRun:
        request = pb.ResumeTaskScheduleRunRequest(id=pb.UUID(id=run_id))
        return self._call(self._stub.ResumeTaskScheduleRun, request, pb.TaskScheduleRun)

    def cancel_run(self, run_id: str) -> pb.TaskScheduleRun:
        request = pb.CancelTaskScheduleRunRequest(id=pb.UUID(id=run_id))
        return self._call(self._stub.CancelTaskScheduleRun, request, pb.TaskScheduleRun)

    def approve_run(self, run_id: str, comment: str = "") -> pb.TaskScheduleRun:
        request = pb.ApproveTaskScheduleRunRequest(id=pb.UUID(id=run_id), comment=comment)
        return self._call(self._stub.ApproveTaskScheduleRun, request, pb.TaskScheduleRun)

    def reject_run(self, run_id: str, comment: str) -> pb.TaskScheduleRun:
        request = pb.RejectTaskScheduleRunRequest(id=pb.UUID(id=run_id), comment=comment)
        return self._call(self._stub.RejectTaskScheduleRun, request, pb.TaskScheduleRun)

    def retry_run(self, run_id: str, *, only_failed: bool = True, request_id: str = "") -> pb.TaskScheduleRun:
        """The new run re-running the run's failed and not-started racks (every rack without
        `only_failed`); `request_id`: sent again with it, the retry answers the run it made."""
        request = pb.RetryTaskScheduleRunRequest(
            id=pb.UUID(id=run_id), only_failed=only_failed, request_id=request_id
        )
        return self._call(self._stub.RetryTaskScheduleRun, request, pb.TaskScheduleRun)

    # --- maintenance windows -----------------------------------------------------------------------

    def resolve_window_id(self, window: str) -> str:
        if is_uuid(window):
            return window
        for found in self.list_windows().windows:
            if found.name == window:
                return found.id.id
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"maintenance window {window!r} not found")

    def _window_ref(self, window: str) -> pb.UUID:
        return pb.UUID(id=self.resolve_window_id(window))

    def create_window(self, name: str, window: Window) -> pb.MaintenanceWindow:
        request = pb.CreateMaintenanceWindowRequest(window=window.to_proto(name))
        return self._call(self._stub.CreateMaintenanceWindow, request, pb.MaintenanceWindow)

    def get_window(self, window: str) -> pb.MaintenanceWindow:
        request = pb.GetMaintenanceWindowRequest(id=self._window_ref(window))
        return self._call(self._stub.GetMaintenanceWindow, request, pb.MaintenanceWindow)

    def list_windows(self, *, rack: str = "") -> pb.ListMaintenanceWindowsResponse:
        request = pb.ListMaintenanceWindowsRequest(rack_id=self._rack_ref(rack) if rack else None)
        return self._call(self._stub.ListMaintenanceWindows, request, pb.ListMaintenanceWindowsResponse)

    def update_window(
        self,
        window: str,
        *,
        name: str | None = None,
        reason: str | None = None,
        kind: str | None = None,
        when: Recurrence | Span | None = None,
        racks: Sequence[str] | None = None,
        domains: Sequence[str] | None = None,
        operations: Sequence[str] | None = None,
    ) -> pb.MaintenanceWindow:
        """Change what is given (not None); the rest stays. Empty racks and domains: every rack."""
        message = pb.MaintenanceWindow(
            name=name or "",
            reason=reason or "",
            kind=WINDOW_KINDS[kind] if kind else pb.WINDOW_KIND_UNSPECIFIED,
            racks=[_window_target(r) for r in racks or ()],
            nvl_domains=[_window_target(d) for d in domains or ()],
            operations=list(operations or ()),
        )
        if when is not None:
            set_window_when(message, when)
        given = {
            "window.name": name,
            "window.reason": reason,
            "window.kind": kind,
            "window.when": when,
            "window.racks": racks,
            "window.nvl_domains": domains,
            "window.operations": operations,
        }
        request = pb.UpdateMaintenanceWindowRequest(
            id=self._window_ref(window),
            window=message,
            update_mask=FieldMask(paths=[path for path, value in given.items() if value is not None]),
        )
        return self._call(self._stub.UpdateMaintenanceWindow, request, pb.MaintenanceWindow)

    def delete_window(self, window: str) -> None:
        request = pb.DeleteMaintenanceWindowRequest(id=self._window_ref(window))
        self._call(self._stub.DeleteMaintenanceWindow, request, Empty)

    def preview_windows(
        self, rack: str, *, count: int = 0, after: datetime | None = None
    ) -> pb.PreviewMaintenanceWindowsResponse:
        """The next `count` openings and closings (server default 10) of the windows covering `rack`."""
        request = pb.PreviewMaintenanceWindowsRequest(
            rack_id=self._rack_ref(rack), count=count, after=_timestamp(after) if after else None
        )
        return self._call(self._stub.PreviewMaintenanceWindows, request, pb.PreviewMaintenanceWindowsResponse)

    # --- operation budgets -------------------------------------------------------------------------

    def resolve_budget_id(self, budget: str) -> str:
        if is_uuid(budget):
            return budget
        for found in self.list_budgets().budgets:
            if found.name == budget:
                return found.id.id
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"operation budget {budget!r} not found")

    def _budget_ref(self, budget: str) -> pb.UUID:
        return pb.UUID(id=self.resolve_budget_id(budget))

    def create_budget(
        self, name: str, operations: Sequence[str], max_running: int, max_per_domain: int | None = None
    ) -> pb.OperationBudget:
        """A budget of `operations` (`upgrade-firmware` or `upgrade_firmware`)."""
        budget = pb.OperationBudget(
            name=name,
            operations=[operation_name(o) for o in operations],
            max_running=max_running,
            max_running_per_domain=max_per_domain,
        )
        request = pb.CreateOperationBudgetRequest(budget=budget)
        return self._call(self._stub.CreateOperationBudget, request, pb.OperationBudget)

    def get_budget(self, budget: str) -> pb.OperationBudget:
        request = pb.GetOperationBudgetRequest(id=self._budget_ref(budget))
        return self._call(self._stub.GetOperationBudget, request, pb.OperationBudget)

    def list_budgets(self) -> pb.ListOperationBudgetsResponse:
        request = pb.ListOperationBudgetsRequest()
        return self._call(self._stub.ListOperationBudgets, request, pb.ListOperationBudgetsResponse)

    def update_budget(
        self,
        budget: str,
        *,
        name: str | None = None,
        operations: Sequence[str] | None = None,
        max_running: int | None = None,
        max_per_domain: int | None = None,
        no_per_domain_cap: bool = False,
    ) -> pb.OperationBudget:
        """Change what is given (not None); `no_per_domain_cap` removes the per-domain cap."""
        message = pb.OperationBudget(
            name=name or "",
            operations=[operation_name(o) for o in operations or ()],
            max_running=max_running or 0,
            max_running_per_domain=max_per_domain,
        )
        given = {
            "budget.name": name is not None,
            "budget.operations": operations is not None,
            "budget.max_running": max_running is not None,
            "budget.max_running_per_domain": max_per_domain is not None or no_per_domain_cap,
        }
        request = pb.UpdateOperationBudgetRequest(
            id=self._budget_ref(budget),
            budget=message,
            update_mask=FieldMask(paths=[path for path, present in given.items() if present]),
        )
        return self._call(self._stub.UpdateOperationBudget, request, pb.OperationBudget)

    def delete_budget(self, budget: str) -> None:
        request = pb.DeleteOperationBudgetRequest(id=self._budget_ref(budget))
        self._call(self._stub.DeleteOperationBudget, request, Empty)

    # --- notifications ---------------------------------------------------------------------------

    def resolve_channel_id(self, channel: str) -> str:
        if is_uuid(channel):
            return channel
        for found in self.list_channels().channels:
            if found.name == channel:
                return found.id.id
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"notification channel {channel!r} not found")

    def _channel_ref(self, channel: str) -> pb.UUID:
        return pb.UUID(id=self.resolve_channel_id(channel))

    def create_channel(self, channel: pb.NotificationChannel) -> pb.NotificationChannel:
        """A channel as given (operations as `power-on` or `power_on`)."""
        channel.operations[:] = [operation_name(o) for o in channel.operations]
        request = pb.CreateNotificationChannelRequest(channel=channel)
        return self._call(self._stub.CreateNotificationChannel, request, pb.NotificationChannel)

    def get_channel(self, channel: str) -> pb.NotificationChannel:
        request = pb.GetNotificationChannelRequest(id=self._channel_ref(channel))
        return self._call(self._stub.GetNotificationChannel, request, pb.NotificationChannel)

    def list_channels(self) -> pb.ListNotificationChannelsResponse:
        request = pb.ListNotificationChannelsRequest()
        return self._call(self._stub.ListNotificationChannels, request, pb.ListNotificationChannelsResponse)

    def update_channel(
        self, channel: str, changes: pb.NotificationChannel, fields: Sequence[str]
    ) -> pb.NotificationChannel:
        """Change the `fields` (`url`, `disabled`, `event_types`, …) of the channel to their value in
        `changes`."""
        changes.operations[:] = [operation_name(o) for o in changes.operations]
        request = pb.UpdateNotificationChannelRequest(
            id=self._channel_ref(channel),
            channel=changes,
            update_mask=FieldMask(paths=[f"channel.{name}" for name in fields]),
        )
        return self._call(self._stub.UpdateNotificationChannel, request, pb.NotificationChannel)

    def delete_channel(self, channel: str) -> None:
        request = pb.DeleteNotificationChannelRequest(id=self._channel_ref(channel))
        self._call(self._stub.DeleteNotificationChannel, request, Empty)

    def list_deliveries(
        self, *, states: Sequence[str] = (), channel: str | None = None, limit: int = 0
    ) -> pb.ListNotificationDeliveriesResponse:
        request = pb.ListNotificationDeliveriesRequest(
            states=list(states), channel_id=self._channel_ref(channel) if channel else None, limit=limit
        )
        return self._call(
            self._stub.ListNotificationDeliveries, request, pb.ListNotificationDeliveriesResponse
        )

    def redeliver(
        self, delivery_ids: Sequence[str] = (), channel: str | None = None
    ) -> pb.RedeliverNotificationsResponse:
        """Send dead deliveries again: these, or the channel's, or (neither) every dead one."""
        request = pb.RedeliverNotificationsRequest(
            delivery_ids=[pb.UUID(id=i) for i in delivery_ids],
            channel_id=self._channel_ref(channel) if channel else None,
        )
        return self._call(self._stub.RedeliverNotifications, request, pb.RedeliverNotificationsResponse)

    # --- pre-flight checks -------------------------------------------------------------------------

    def resolve_check_id(self, check: str) -> str:
        if is_uuid(check):
            return check
        for found in self.list_checks().checks:
            if found.name == check:
                return found.id.id
        raise RackflowClientError(grpc.StatusCode.NOT_FOUND, f"pre-flight check {check!r} not found")

    def _check_ref(self, check: str) -> pb.UUID:
        return pb.UUID(id=self.resolve_check_id(check))

    def create_check(self, check: pb.PreflightCheck) -> pb.PreflightCheck:
        """A check as the message says (`preflight_check` builds one)."""
        request = pb.CreatePreflightCheckRequest(check=check)
        return self._call(self._stub.CreatePreflightCheck, request, pb.PreflightCheck)

    def get_check(self, check: str) -> pb.PreflightCheck:
        request = pb.GetPreflightCheckRequest(id=self._check_ref(check))
        return self._call(self._stub.GetPreflightCheck, request, pb.PreflightCheck)

    def list_checks(self) -> pb.ListPreflightChecksResponse:
        request = pb.ListPreflightChecksRequest()
        return self._call(self._stub.ListPreflightChecks, request, pb.ListPreflightChecksResponse)

    def update_check(self, check: str, message: pb.PreflightCheck, paths: Sequence[str]) -> pb.PreflightCheck:
        """Change the fields `paths` name (`check.interval`, `check.kind`, …) to their values in `message`."""
        request = pb.UpdatePreflightCheckRequest(
            id=self._check_ref(check), check=message, update_mask=FieldMask(paths=list(paths))
        )
        return self._call(self._stub.UpdatePreflightCheck, request, pb.PreflightCheck)

    def delete_check(self, check: str) -> None:
        request = pb.DeletePreflightCheckRequest(id=self._check_ref(check))
        self._call(self._stub.DeletePreflightCheck, request, Empty)

    def override_checks(self, task_id: str, reason: str, checks: Sequence[str] = ()) -> pb.Task:
        """Let a pending task start whatever its pre-flight checks say, or only these `checks` (names or
        ids) say (operator role; audited)."""
        request = pb.OverridePreflightChecksRequest(
            task_id=pb.UUID(id=task_id), reason=reason, checks=list(checks)
        )
        return self._call(self._stub.OverridePreflightChecks, request, pb.Task)

    # --- audit -----------------------------------------------------------------------------------

    def list_audit_events(
        self,
        *,
        since: datetime | None = None,
        method: str = "",
        principal: str = "",
        target: str = "",
        offset: int = 0,
        limit: int = 0,
        page_token: str = "",
    ) -> pb.ListAuditEventsResponse:
        request = pb.ListAuditEventsRequest(
            since=_timestamp(since) if since else None,
            method=method,
            principal=principal,
            target=pb.UUID(id=target) if target else None,
            pagination=_page(offset, limit, page_token),
        )
        return self._call(self._stub.ListAuditEvents, request, pb.ListAuditEventsResponse)
