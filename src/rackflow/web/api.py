"""The JSON API, `/api/v1/…`: each endpoint builds one RPC's request message and returns its response.

One table (`JsonApi.endpoints`) says, per endpoint, its method and path, the RPC it runs, its query
parameters and whether it takes a body; the server's routes and the OpenAPI document
(`rackflow.web.openapi`, `GET /api/v1/openapi.json`) are both made from it, so neither can drift.

Responses are the RPC's response message in proto3 JSON (`message_json`: proto field names, enums by
name, defaults included). Errors are `{"code", "message", "field"}` with the HTTP status of the code
(`rackflow.api.errors`); `field` is the request field the message names (or the query parameter, for a
malformed one), null when none is named; an error that answers a firing (a trigger that submitted no task)
names it as a trigger's success does (`run_id`, `fired_at`, `replayed`: `RpcError.to_json`). Query
parameters are explicit per endpoint (docs/HTTP.md) and an unknown one is refused, so a typo never silently
widens a filter. A body is the request message in proto3 JSON less what the path sets
(`rackflow.web.bodies`); a PATCH derives the update mask from the fields it gives. `{ref}` and the
`rack`/`schedule` filters take an id or a name.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from google.protobuf.descriptor import Descriptor
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from google.protobuf.timestamp_pb2 import Timestamp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rackflow.api.audit import WithUnparsedBody
from rackflow.api.auth import is_mutating
from rackflow.api.convert import message_json
from rackflow.api.errors import INTERNAL_MESSAGE
from rackflow.client import rack_view, run_view, task_status
from rackflow.errors import InvalidArgument, NotFound, RackflowError
from rackflow.schedules.service import TIMEZONE_PATH
from rackflow.security import Principal, TokenTable
from rackflow.services import Services
from rackflow.timespec import parse_go_duration
from rackflow.v1 import flow_pb2 as pb
from rackflow.web import refs
from rackflow.web.auth import principal_of
from rackflow.web.bodies import parse_into, read_json, real_oneof, unparsed_body
from rackflow.web.calls import RpcCaller, RpcError
from rackflow.web.security import BodyTooLarge

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
INT32_MAX = 2**31 - 1
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
FLOW = pb.DESCRIPTOR.services_by_name["Flow"]


@dataclass(frozen=True)
class Param:
    """A query parameter: its name, what it takes (`kind`: string, integer, boolean, time, since, list)
    and what it does, for the OpenAPI document."""

    name: str
    kind: str
    doc: str


OFFSET = Param("offset", "integer", "skip this many (with limit)")
LIMIT = Param("limit", "integer", "at most this many (1-1000; absent: all)")
PAGE_TOKEN = Param(
    "page_token", "string", "the next page: next_page_token of the previous one (not with offset)"
)
PAGE = (OFFSET, LIMIT, PAGE_TOKEN)
COUNT = Param("count", "integer", "how many (1-100, default 10)")
AFTER = Param("after", "time", "from this time (RFC 3339, default now)")


@dataclass(frozen=True)
class Endpoint:
    """One method on one path, and the RPC it runs."""

    method: str
    path: str  # below PREFIX
    rpc: str
    handler: Handler
    summary: str
    params: tuple[Param, ...] = ()
    # Takes a JSON body: the RPC's request message less `path_fields`.
    body: bool = False
    # The request fields the path sets: a path parameter the field of its own name (`{scope_id}`), `{ref}`
    # the first id (`rackflow.v1.UUID`) field no parameter names (with the id its name resolves to).
    path_fields: tuple[str, ...] = ()
    # What it answers when not the RPC's own response (GET /tasks/{id} answers the one Task).
    answers: Descriptor | None = None

    @property
    def request_type(self) -> Descriptor:
        return FLOW.methods_by_name[self.rpc].input_type

    @property
    def response_type(self) -> Descriptor:
        return self.answers or FLOW.methods_by_name[self.rpc].output_type


class Query:
    """A request's query parameters, as the endpoint declares them: a read names the parameter it reads,
    and `check` refuses any parameter the endpoint does not take."""

    def __init__(self, request: Request, params: tuple[Param, ...], now: datetime) -> None:
        self._params = request.query_params
        self._declared = {p.name for p in params}
        self._now = now

    def _raw(self, name: str) -> str | None:
        assert name in self._declared, f"query parameter {name!r} is read but not declared"
        return self._params.get(name)

    def text(self, name: str) -> str:
        return self._raw(name) or ""

    def values(self, name: str) -> list[str]:
        """A repeated parameter: `?status=a&status=b` or `?status=a,b`."""
        self._raw(name)
        return [v.strip() for item in self._params.getlist(name) for v in item.split(",") if v.strip()]

    def integer(self, name: str) -> int | None:
        raw = self._raw(name)
        if raw is None or raw == "":
            return None
        try:
            value = int(raw)
        except ValueError:
            raise InvalidArgument(f"{name}: {raw!r} is not an integer") from None
        if not -INT32_MAX <= value <= INT32_MAX:
            raise InvalidArgument(f"{name}: {value} is out of range")
        return value

    def boolean(self, name: str) -> bool:
        raw = (self._raw(name) or "").lower()
        if raw in _TRUE:
            return True
        if raw in _FALSE or raw == "":
            return False
        raise InvalidArgument(f"{name}: {raw!r} is not true or false")

    def timestamp(self, name: str) -> Timestamp | None:
        raw = self._raw(name)
        if not raw:
            return None
        stamp = Timestamp()
        try:
            stamp.FromJsonString(raw)
        except ValueError:
            raise InvalidArgument(f"{name}: {raw!r} is not an RFC 3339 time (2026-06-01T04:00:00Z)") from None
        return stamp

    def since(self, name: str) -> Timestamp | None:
        """A time, or a duration back from now (`24h`, `30m`), as `rackflow audit --since` takes it."""
        raw = self._raw(name)
        if not raw:
            return None
        stamp = Timestamp()
        try:
            nanoseconds = parse_go_duration(raw)
        except ValueError:
            try:
                stamp.FromJsonString(raw)
            except ValueError:
                raise InvalidArgument(
                    f"{name}: {raw!r} is neither a duration like 24h nor an RFC 3339 time like "
                    "2026-06-01T04:00:00Z"
                ) from None
            return stamp
        if nanoseconds <= 0:
            raise InvalidArgument(f"{name}: a duration back from now must be positive, got {raw!r}")
        stamp.FromDatetime(self._now - timedelta(microseconds=nanoseconds // 1000))
        return stamp

    def pagination(self) -> pb.Pagination | None:
        """`offset`, `limit` and `page_token`, as the list RPCs take them (limit 0 or absent: no limit)."""
        offset, limit, token = self.integer("offset"), self.integer("limit"), self.text("page_token")
        if offset is None and limit is None and not token:
            return None
        return pb.Pagination(offset=offset or 0, limit=limit or 0, page_token=token)

    def check(self) -> None:
        unknown = sorted(set(self._params) - self._declared)
        if unknown:
            takes = ", ".join(sorted(self._declared)) or "none"
            raise InvalidArgument(f"{unknown[0]}: unknown query parameter (this endpoint takes: {takes})")


@dataclass
class Call:
    """One API request: its endpoint, query, caller, and a way to run RPCs as that caller."""

    request: Request
    endpoint: Endpoint
    query: Query
    principal: Principal
    caller: RpcCaller
    now: datetime
    # Whether the endpoint's own RPC was called: its audit records it however it ends (`JsonApi._answer`).
    ran: bool = False

    def ref(self, name: str = "ref") -> str:
        return str(self.request.path_params[name])

    async def body(self, message: Message) -> Any:
        """`message` with the JSON body merged in (an empty body leaves it as it is)."""
        data = read_json(await self.request.body())
        if data is not None:
            parse_into(data, message, self.now, path_fields=self.endpoint.path_fields)
        return message

    async def patch(self, message: Message, wrapper: str) -> Any:
        """The body of a PATCH, with the update mask of the fields it gives under `wrapper`."""
        data = read_json(await self.request.body()) or {}
        parse_into(data, message, self.now, path_fields=self.endpoint.path_fields)
        message.update_mask.CopyFrom(update_mask(data, getattr(message, wrapper), wrapper))  # type: ignore[attr-defined]
        return message

    async def rpc(self, name: str, message: Message) -> Message:
        self.ran = self.ran or name == self.endpoint.rpc
        return await self.caller(name, message, self.principal)


def update_mask(data: dict[str, Any], message: Message, wrapper: str) -> FieldMask:
    """The paths of the fields a PATCH body gives under `wrapper` (`{"window": {"name": …}}` ->
    `window.name`): a member of a oneof is its oneof (`window.when`), and a schedule's `spec` that gives
    only its `timezone` is `schedule.spec.timezone`, as UpdateTaskSchedule takes it."""
    given = data.get(wrapper)
    if not isinstance(given, dict) or not given:
        names = ", ".join(f.name for f in message.DESCRIPTOR.fields)
        raise InvalidArgument(f"{wrapper}: give the fields to change (one or more of {names})")
    paths = []
    for key, value in given.items():
        field = next(f for f in message.DESCRIPTOR.fields if key in (f.name, f.json_name))
        oneof = real_oneof(field)
        path = f"{wrapper}.{oneof.name if oneof is not None else field.name}"
        if isinstance(value, dict) and set(value) == {"timezone"} and f"{path}.timezone" == TIMEZONE_PATH:
            path = TIMEZONE_PATH
        paths.append(path)
    return FieldMask(paths=sorted(set(paths)))


Handler = Callable[["JsonApi", Call], Awaitable[Message]]


class JsonApi:
    def __init__(self, services: Services, caller: RpcCaller, tokens: TokenTable | None) -> None:
        self.services = services
        self.caller = caller
        self.tokens = tokens

    @staticmethod
    def endpoints() -> list[Endpoint]:
        """Every endpoint, in the order the routes match (an action path before the `{ref}` it extends)."""
        api, get, post, patch, put, delete = JsonApi, "GET", "POST", "PATCH", "PUT", "DELETE"
        schedules = (
            Endpoint(
                get,
                "/schedules",
                "ListTaskSchedules",
                api.list_schedules,
                "List schedules",
                (
                    Param("rack", "string", "only schedules that target this rack (id or name)"),
                    Param("enabled_only", "boolean", "only enabled schedules"),
                    Param("paused_only", "boolean", "only paused schedules"),
                    Param("name_contains", "string", "only names containing this, ignoring case"),
                    Param("operation_type", "string", "only this operation (power_on, ...)"),
                    Param(
                        "order_by",
                        "string",
                        "created_at (default), name, next_run_at or last_run_at, "
                        "optionally followed by ' desc'",
                    ),
                    *PAGE,
                ),
            ),
            Endpoint(
                post, "/schedules", "CreateTaskSchedule", api.create_schedule, "Create a schedule", body=True
            ),
            Endpoint(
                post,
                "/schedules:preview",
                "PreviewTaskSchedule",
                api.preview_draft,
                "The next firings of an unsaved schedule (`draft`, as create takes it; with `id`, that "
                "schedule's edit) and each rack's decision under the windows and overlap (validates it)",
                body=True,
            ),
            Endpoint(
                post,
                "/schedules/{ref}:pause",
                "PauseTaskSchedule",
                api.pause_schedule,
                "Pause a schedule",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(
                post,
                "/schedules/{ref}:resume",
                "ResumeTaskSchedule",
                api.resume_schedule,
                "Resume a paused schedule",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(
                post,
                "/schedules/{ref}:trigger",
                "TriggerTaskSchedule",
                api.trigger_schedule,
                "Fire a schedule now",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(get, "/schedules/{ref}", "GetTaskSchedule", api.get_schedule, "One schedule"),
            Endpoint(
                patch,
                "/schedules/{ref}",
                "UpdateTaskSchedule",
                api.update_schedule,
                "Change a schedule: the fields given under `schedule` (the update mask is theirs)",
                body=True,
                path_fields=("id", "update_mask"),
            ),
            Endpoint(
                delete,
                "/schedules/{ref}",
                "DeleteTaskSchedule",
                api.delete_schedule,
                "Delete a schedule",
                path_fields=("id",),
            ),
            Endpoint(
                get,
                "/schedules/{ref}/runs",
                "ListTaskScheduleRuns",
                api.list_runs,
                "A schedule's runs, newest first",
                (*PAGE, Param("view", "string", "basic: each run's racks counted, not listed; full: listed")),
            ),
            Endpoint(
                get,
                "/schedules/{ref}/scopes",
                "ListTaskScheduleScopes",
                api.list_scopes,
                "A schedule's scopes (its racks), by rack id",
                PAGE,
            ),
            Endpoint(
                post,
                "/schedules/{ref}/scopes",
                "AddTaskScheduleScope",
                api.add_scope,
                "Add racks to a schedule",
                body=True,
                path_fields=("schedule_id",),
            ),
            Endpoint(
                put,
                "/schedules/{ref}/scopes",
                "UpdateTaskScheduleScope",
                api.replace_scopes,
                "Replace a schedule's racks by the desired scope",
                body=True,
                path_fields=("schedule_id",),
            ),
            Endpoint(
                delete,
                "/schedules/{ref}/scopes/{scope_id}",
                "RemoveTaskScheduleScope",
                api.remove_scope,
                "Remove one scope from a schedule",
                path_fields=("scope_id",),
            ),
            Endpoint(
                get,
                "/schedules/{ref}/preview",
                "PreviewScheduleSpec",
                api.preview,
                "A schedule's next firing times",
                (COUNT, AFTER),
            ),
            Endpoint(
                get,
                "/schedules/{ref}/decisions",
                "PreviewTaskSchedule",
                api.preview_decisions,
                "A schedule's next firings and each scope's decision under the windows",
                (COUNT, AFTER),
            ),
        )
        runs = (
            Endpoint(
                post,
                "/runs/{ref}:resume",
                "ResumeTaskScheduleRun",
                api.resume_run,
                "Resume a halted rollout",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(
                post,
                "/runs/{ref}:cancel",
                "CancelTaskScheduleRun",
                api.cancel_run,
                "Cancel a rollout",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(
                post,
                "/runs/{ref}:approve",
                "ApproveTaskScheduleRun",
                api.approve_run,
                "Approve a run awaiting approval (approver role)",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(
                post,
                "/runs/{ref}:reject",
                "RejectTaskScheduleRun",
                api.reject_run,
                "Reject a run awaiting approval, saying why (approver role)",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(
                post,
                "/runs/{ref}:retry",
                "RetryTaskScheduleRun",
                api.retry_run,
                "Re-run a finished or halted run's failed racks (all with only_failed false) as a new run",
                body=True,
                path_fields=("id",),
            ),
            Endpoint(
                get,
                "/runs/{ref}",
                "GetTaskScheduleRun",
                api.get_run,
                "One run (a rollout's with its progress)",
            ),
        )
        tasks = (
            Endpoint(
                get,
                "/tasks",
                "ListTasks",
                api.list_tasks,
                "List tasks, newest first",
                (
                    Param("status", "list", "only these statuses (repeat it, or comma-separate)"),
                    Param("rack", "string", "only this rack's (id or name)"),
                    Param("schedule", "string", "only this schedule's (id or name)"),
                    Param("active_only", "boolean", "only pending, waiting and running tasks"),
                    *PAGE,
                ),
            ),
            Endpoint(
                post,
                "/tasks/{ref}:cancel",
                "CancelTask",
                api.cancel_task,
                "Cancel a task",
                body=True,
                path_fields=("task_id",),
            ),
            Endpoint(
                post,
                "/tasks/{ref}:override-checks",
                "OverridePreflightChecks",
                api.override_checks,
                "Let a held task start without its pre-flight checks (audited)",
                body=True,
                path_fields=("task_id",),
            ),
            Endpoint(
                get, "/tasks/{ref}", "GetTasksByIDs", api.get_task, "One task", answers=pb.Task.DESCRIPTOR
            ),
        )
        racks = (
            Endpoint(
                get,
                "/racks",
                "ListRacks",
                api.list_racks,
                "List racks",
                (
                    Param("nvl_domain_id", "string", "only the racks of this NVLink domain"),
                    Param("name_contains", "string", "only names containing this, ignoring case"),
                    *PAGE,
                    Param("view", "string", "basic: racks without components; full (default): with them"),
                ),
            ),
            Endpoint(get, "/racks/{ref}", "GetRack", api.get_rack, "One rack"),
            Endpoint(
                get,
                "/racks/{ref}/windows",
                "PreviewMaintenanceWindows",
                api.preview_windows,
                "The next openings and closings of the windows covering a rack",
                (COUNT, AFTER),
            ),
        )
        windows = (
            Endpoint(
                get,
                "/windows",
                "ListMaintenanceWindows",
                api.list_windows,
                "List maintenance windows",
                (Param("rack", "string", "only the windows covering this rack (id or name)"),),
            ),
            Endpoint(
                post,
                "/windows",
                "CreateMaintenanceWindow",
                api.create_window,
                "Create a maintenance window",
                body=True,
            ),
            Endpoint(get, "/windows/{ref}", "GetMaintenanceWindow", api.get_window, "One maintenance window"),
            Endpoint(
                patch,
                "/windows/{ref}",
                "UpdateMaintenanceWindow",
                api.update_window,
                "Change a window: the fields given under `window`",
                body=True,
                path_fields=("id", "update_mask"),
            ),
            Endpoint(
                delete,
                "/windows/{ref}",
                "DeleteMaintenanceWindow",
                api.delete_window,
                "Delete a maintenance window",
                path_fields=("id",),
            ),
        )
        budgets = (
            Endpoint(get, "/budgets", "ListOperationBudgets", api.list_budgets, "List operation budgets"),
            Endpoint(
                post,
                "/budgets",
                "CreateOperationBudget",
                api.create_budget,
                "Create an operation budget",
                body=True,
            ),
            Endpoint(get, "/budgets/{ref}", "GetOperationBudget", api.get_budget, "One operation budget"),
            Endpoint(
                patch,
                "/budgets/{ref}",
                "UpdateOperationBudget",
                api.update_budget,
                "Change a budget: the fields given under `budget`",
                body=True,
                path_fields=("id", "update_mask"),
            ),
            Endpoint(
                delete,
                "/budgets/{ref}",
                "DeleteOperationBudget",
                api.delete_budget,
                "Delete an operation budget",
                path_fields=("id",),
            ),
        )
        audit = (
            Endpoint(
                get,
                "/audit",
                "ListAuditEvents",
                api.list_audit_events,
                "The audit trail, newest first",
                (
                    Param("since", "since", "only events since this time, or this long ago (24h)"),
                    Param("method", "string", "only this RPC"),
                    Param("principal", "string", "only this caller"),
                    Param(
                        "target",
                        "string",
                        "only the events naming this id: a rack's, schedule's, task's history",
                    ),
                    *PAGE,
                ),
            ),
        )
        channels, deliveries = "/notification-channels", "/notification-deliveries"
        notifications = (
            Endpoint(
                get, channels, "ListNotificationChannels", api.list_channels, "List notification channels"
            ),
            Endpoint(
                post,
                channels,
                "CreateNotificationChannel",
                api.create_channel,
                "Create a notification channel",
                body=True,
            ),
            Endpoint(
                post,
                channels + "/{ref}:redeliver",
                "RedeliverNotifications",
                api.redeliver_channel,
                "Send a channel's dead deliveries again",
                path_fields=("channel_id",),
            ),
            Endpoint(
                get,
                channels + "/{ref}",
                "GetNotificationChannel",
                api.get_channel,
                "One notification channel",
            ),
            Endpoint(
                patch,
                channels + "/{ref}",
                "UpdateNotificationChannel",
                api.update_channel,
                "Change a channel: the fields given under `channel`",
                body=True,
                path_fields=("id", "update_mask"),
            ),
            Endpoint(
                delete,
                channels + "/{ref}",
                "DeleteNotificationChannel",
                api.delete_channel,
                "Delete a notification channel",
                path_fields=("id",),
            ),
            Endpoint(
                get,
                deliveries,
                "ListNotificationDeliveries",
                api.list_deliveries,
                "Notification deliveries, newest first",
                (
                    Param("state", "list", "only deliveries in these states (pending, delivered, dead)"),
                    Param("channel", "string", "only this channel's (id or name)"),
                    Param("limit", "integer", "at most this many"),
                ),
            ),
            Endpoint(
                post,
                deliveries + ":redeliver",
                "RedeliverNotifications",
                api.redeliver,
                "Send dead deliveries again (those named, or every one)",
                body=True,
            ),
        )
        checks = (
            Endpoint(get, "/checks", "ListPreflightChecks", api.list_checks, "List pre-flight checks"),
            Endpoint(get, "/checks/{ref}", "GetPreflightCheck", api.get_check, "One pre-flight check"),
        )
        return [*schedules, *runs, *tasks, *racks, *windows, *budgets, *checks, *audit, *notifications]

    def routes(self) -> list[Route]:
        """One route per path, serving each of its methods by its endpoint."""
        by_path: dict[str, dict[str, Endpoint]] = {}
        for endpoint in self.endpoints():
            by_path.setdefault(endpoint.path, {})[endpoint.method] = endpoint
        return [
            Route(PREFIX + path, self._serve(methods), methods=list(methods))
            for path, methods in by_path.items()
        ]

    def _serve(self, endpoints: dict[str, Endpoint]) -> Callable[[Request], Awaitable[Response]]:
        async def respond(request: Request) -> Response:
            endpoint = endpoints["GET" if request.method == "HEAD" else request.method]
            try:
                principal = principal_of(request, self.tokens)
                now = self.services.clock.now()
                query = Query(request, endpoint.params, now)
                call = Call(request, endpoint, query, principal, self.caller, now)
                # The role first, as over gRPC: a refused call looks nothing up, so its answer and its
                # audit row never depend on whether the names it gives exist.
                await self.caller.authorize(endpoint.rpc, principal, lambda: self._as_sent(call))
                message = await self._answer(call)
            except RpcError as exc:
                return error_response(exc)
            except RackflowError as exc:
                return error_response(RpcError.of(exc))
            except BodyTooLarge:
                raise  # the request guard answers it (413)
            except Exception:
                log.exception("unexpected error in %s %s", request.method, request.url.path)
                return JSONResponse({"code": "INTERNAL", "message": INTERNAL_MESSAGE, "field": None}, 500)
            return JSONResponse(message_json(message))

        return respond

    async def _answer(self, call: Call) -> Message:
        """The endpoint's answer. A mutating endpoint refused before its RPC ran (a body that does not
        parse, a name in its path that names nothing, a query parameter) is recorded as its RPC refused,
        with the request as sent (`_as_sent`): over gRPC such a call is refused by the RPC, or by its
        decoding, and recorded, so every call that could have changed something has its row."""
        try:
            call.query.check()
            return await call.endpoint.handler(self, call)
        except (RpcError, RackflowError) as exc:
            if is_mutating(call.endpoint.rpc) and not call.ran:
                refusal = exc if isinstance(exc, RpcError) else RpcError.of(exc)
                await self.caller.record_refused(
                    call.endpoint.rpc, await self._as_sent(call), call.principal, refusal
                )
            raise

    async def _as_sent(self, call: Call) -> Message | WithUnparsedBody:
        """The endpoint's request as the path and body give it: what a call refused by role is recorded with
        (`RpcCaller.authorize`). `{ref}` stands in its id field as the id it names, or as sent when it names
        nothing (as gRPC records an id that is not one); a body that does not parse is recorded beside the
        path's request as sent, bounded and without secrets (`bodies.unparsed_body`)."""
        endpoint = call.endpoint
        message = GetMessageClass(endpoint.request_type)()
        unparsed = None
        if endpoint.body:
            raw = await call.request.body()
            parsed = GetMessageClass(endpoint.request_type)()
            try:
                data = read_json(raw) or {}
                parse_into(data, parsed, call.now, path_fields=endpoint.path_fields)
            except InvalidArgument as exc:
                unparsed = unparsed_body(raw, exc, endpoint.rpc, endpoint.request_type)
            else:
                message.CopyFrom(parsed)
        params = dict(call.request.path_params)
        for name in endpoint.path_fields:
            if message.DESCRIPTOR.fields_by_name[name].message_type is not pb.UUID.DESCRIPTOR:
                continue
            if name in params:
                getattr(message, name).id = str(params.pop(name))
            elif "ref" in params:
                getattr(message, name).id = await self._ref_id(endpoint, str(params.pop("ref")))
        return message if unparsed is None else WithUnparsedBody(message, unparsed)

    async def _ref_id(self, endpoint: Endpoint, ref: str) -> str:
        """The id `ref` names under the endpoint's collection; `ref` itself when it names nothing, or is
        no name at all (too long, a control character: the refusal is the role's all the same)."""
        resolve = refs.BY_COLLECTION.get(endpoint.path.split("/")[1].split(":")[0])
        if resolve is None:
            return ref
        try:
            return str(await resolve(self.services, ref, "ref"))
        except RackflowError:
            return ref

    # --- names -----------------------------------------------------------------------------------

    async def _schedule(self, ref: str, field: str) -> pb.UUID:
        return pb.UUID(id=str(await refs.schedule_id(self.services, ref, field)))

    async def _rack(self, ref: str, field: str) -> pb.UUID:
        return pb.UUID(id=str(await refs.rack_id(self.services, ref, field)))

    async def _window(self, ref: str, field: str) -> pb.UUID:
        return pb.UUID(id=str(await refs.window_id(self.services, ref, field)))

    async def _budget(self, ref: str, field: str) -> pb.UUID:
        return pb.UUID(id=str(await refs.budget_id(self.services, ref, field)))

    # --- schedules -------------------------------------------------------------------------------

    async def list_schedules(self, call: Call) -> Message:
        q = call.query
        request = pb.ListTaskSchedulesRequest(
            enabled_only=q.boolean("enabled_only") or None,
            paused_only=q.boolean("paused_only"),
            name_contains=q.text("name_contains"),
            operation_type=q.text("operation_type"),
            order_by=q.text("order_by"),
            pagination=q.pagination(),
        )
        if rack := q.text("rack"):
            request.rack_id.CopyFrom(await self._rack(rack, "rack_id"))
        return await call.rpc("ListTaskSchedules", request)

    async def create_schedule(self, call: Call) -> Message:
        return await call.rpc("CreateTaskSchedule", await call.body(pb.CreateTaskScheduleRequest()))

    async def preview_draft(self, call: Call) -> Message:
        request = await call.body(pb.PreviewTaskScheduleRequest())
        if not request.HasField("draft"):
            raise InvalidArgument("draft: the schedule to preview is required, as create takes it")
        return await call.rpc("PreviewTaskSchedule", request)

    async def get_schedule(self, call: Call) -> Message:
        schedule_id = await self._schedule(call.ref(), "id")
        return await call.rpc("GetTaskSchedule", pb.GetTaskScheduleRequest(id=schedule_id))

    async def update_schedule(self, call: Call) -> Message:
        request = await call.patch(pb.UpdateTaskScheduleRequest(), "schedule")
        request.id.CopyFrom(await self._schedule(call.ref(), "id"))
        return await call.rpc("UpdateTaskSchedule", request)

    async def delete_schedule(self, call: Call) -> Message:
        schedule_id = await self._schedule(call.ref(), "id")
        return await call.rpc("DeleteTaskSchedule", pb.DeleteTaskScheduleRequest(id=schedule_id))

    async def list_runs(self, call: Call) -> Message:
        view = _view_of(call, run_view)
        request = pb.ListTaskScheduleRunsRequest(pagination=call.query.pagination(), view=view)
        request.schedule_id.CopyFrom(await self._schedule(call.ref(), "schedule_id"))
        return await call.rpc("ListTaskScheduleRuns", request)

    async def list_scopes(self, call: Call) -> Message:
        request = pb.ListTaskScheduleScopesRequest(pagination=call.query.pagination())
        request.schedule_id.CopyFrom(await self._schedule(call.ref(), "schedule_id"))
        return await call.rpc("ListTaskScheduleScopes", request)

    async def add_scope(self, call: Call) -> Message:
        request = await call.body(pb.AddTaskScheduleScopeRequest())
        request.schedule_id.CopyFrom(await self._schedule(call.ref(), "schedule_id"))
        return await call.rpc("AddTaskScheduleScope", request)

    async def replace_scopes(self, call: Call) -> Message:
        request = await call.body(pb.UpdateTaskScheduleScopeRequest())
        request.schedule_id.CopyFrom(await self._schedule(call.ref(), "schedule_id"))
        return await call.rpc("UpdateTaskScheduleScope", request)

    async def remove_scope(self, call: Call) -> Message:
        """RemoveTaskScheduleScope takes the scope alone; the path's schedule must be the scope's."""
        schedule_id = await self._schedule(call.ref(), "schedule_id")
        scope_id = call.ref("scope_id")
        scopes = await call.rpc(
            "ListTaskScheduleScopes", pb.ListTaskScheduleScopesRequest(schedule_id=schedule_id)
        )
        assert isinstance(scopes, pb.ListTaskScheduleScopesResponse)
        if scope_id not in {s.id.id for s in scopes.scopes}:
            raise NotFound(f"scope_id: {scope_id} is not a scope of schedule {call.ref()!r}")
        return await call.rpc(
            "RemoveTaskScheduleScope", pb.RemoveTaskScheduleScopeRequest(scope_id=pb.UUID(id=scope_id))
        )

    async def preview(self, call: Call) -> Message:
        """The schedule's next firings: PreviewScheduleSpec of its own spec."""
        count, after = call.query.integer("count"), call.query.timestamp("after")
        schedule_id = await self._schedule(call.ref(), "id")
        schedule = await call.rpc("GetTaskSchedule", pb.GetTaskScheduleRequest(id=schedule_id))
        assert isinstance(schedule, pb.TaskSchedule)
        request = pb.PreviewScheduleSpecRequest(spec=schedule.spec, count=count or 0, after=after)
        return await call.rpc("PreviewScheduleSpec", request)

    async def preview_decisions(self, call: Call) -> Message:
        """The schedule's next firings and each scope's decision under the maintenance windows."""
        count, after = call.query.integer("count"), call.query.timestamp("after")
        schedule_id = await self._schedule(call.ref(), "id")
        request = pb.PreviewTaskScheduleRequest(id=schedule_id, count=count or 0, after=after)
        return await call.rpc("PreviewTaskSchedule", request)

    async def _schedule_action(self, call: Call, rpc: str, message: Message) -> Message:
        request = await call.body(message)
        request.id.CopyFrom(await self._schedule(call.ref(), "id"))
        return await call.rpc(rpc, request)

    async def pause_schedule(self, call: Call) -> Message:
        return await self._schedule_action(call, "PauseTaskSchedule", pb.PauseTaskScheduleRequest())

    async def resume_schedule(self, call: Call) -> Message:
        return await self._schedule_action(call, "ResumeTaskSchedule", pb.ResumeTaskScheduleRequest())

    async def trigger_schedule(self, call: Call) -> Message:
        return await self._schedule_action(call, "TriggerTaskSchedule", pb.TriggerTaskScheduleRequest())

    # --- runs (rollouts) --------------------------------------------------------------------------

    async def get_run(self, call: Call) -> Message:
        return await call.rpc("GetTaskScheduleRun", pb.GetTaskScheduleRunRequest(id=pb.UUID(id=call.ref())))

    async def _run_action(self, call: Call, rpc: str, message: Message) -> Message:
        request = await call.body(message)
        request.id.id = call.ref()
        return await call.rpc(rpc, request)

    async def resume_run(self, call: Call) -> Message:
        return await self._run_action(call, "ResumeTaskScheduleRun", pb.ResumeTaskScheduleRunRequest())

    async def cancel_run(self, call: Call) -> Message:
        return await self._run_action(call, "CancelTaskScheduleRun", pb.CancelTaskScheduleRunRequest())

    async def approve_run(self, call: Call) -> Message:
        return await self._run_action(call, "ApproveTaskScheduleRun", pb.ApproveTaskScheduleRunRequest())

    async def reject_run(self, call: Call) -> Message:
        return await self._run_action(call, "RejectTaskScheduleRun", pb.RejectTaskScheduleRunRequest())

    async def retry_run(self, call: Call) -> Message:
        return await self._run_action(call, "RetryTaskScheduleRun", pb.RetryTaskScheduleRunRequest())

    # --- tasks -----------------------------------------------------------------------------------

    async def list_tasks(self, call: Call) -> Message:
        q = call.query
        try:
            statuses = [task_status(name) for name in q.values("status")]
        except ValueError as exc:
            raise InvalidArgument(f"status: {exc}") from None
        request = pb.ListTasksRequest(
            active_only=q.boolean("active_only"), statuses=statuses, pagination=q.pagination()
        )
        if rack := q.text("rack"):
            request.rack_id.CopyFrom(await self._rack(rack, "rack_id"))
        if schedule := q.text("schedule"):
            request.schedule_id.CopyFrom(await self._schedule(schedule, "schedule_id"))
        return await call.rpc("ListTasks", request)

    async def get_task(self, call: Call) -> Message:
        ref = call.ref()
        found = await call.rpc("GetTasksByIDs", pb.GetTasksByIDsRequest(task_ids=[pb.UUID(id=ref)]))
        assert isinstance(found, pb.GetTasksByIDsResponse)
        if not found.tasks:
            raise NotFound(f"task_ids[0]: task {ref} not found")
        return found.tasks[0]

    async def cancel_task(self, call: Call) -> Message:
        request = await call.body(pb.CancelTaskRequest())
        request.task_id.id = call.ref()
        return await call.rpc("CancelTask", request)

    # --- racks -----------------------------------------------------------------------------------

    async def list_racks(self, call: Call) -> Message:
        request = pb.ListRacksRequest(
            pagination=call.query.pagination(),
            name_contains=call.query.text("name_contains"),
            view=_view_of(call, rack_view),
        )
        if domain := call.query.text("nvl_domain_id"):
            request.nvl_domain_id.id = domain
        return await call.rpc("ListRacks", request)

    async def get_rack(self, call: Call) -> Message:
        rack_id = await self._rack(call.ref(), "id")
        return await call.rpc("GetRack", pb.GetRackRequest(id=rack_id))

    async def preview_windows(self, call: Call) -> Message:
        count, after = call.query.integer("count"), call.query.timestamp("after")
        rack_id = await self._rack(call.ref(), "rack_id")
        request = pb.PreviewMaintenanceWindowsRequest(rack_id=rack_id, count=count or 0, after=after)
        return await call.rpc("PreviewMaintenanceWindows", request)

    # --- maintenance windows ---------------------------------------------------------------------

    async def list_windows(self, call: Call) -> Message:
        request = pb.ListMaintenanceWindowsRequest()
        if rack := call.query.text("rack"):
            request.rack_id.CopyFrom(await self._rack(rack, "rack_id"))
        return await call.rpc("ListMaintenanceWindows", request)

    async def create_window(self, call: Call) -> Message:
        return await call.rpc("CreateMaintenanceWindow", await call.body(pb.CreateMaintenanceWindowRequest()))

    async def get_window(self, call: Call) -> Message:
        window_id = await self._window(call.ref(), "id")
        return await call.rpc("GetMaintenanceWindow", pb.GetMaintenanceWindowRequest(id=window_id))

    async def update_window(self, call: Call) -> Message:
        request = await call.patch(pb.UpdateMaintenanceWindowRequest(), "window")
        request.id.CopyFrom(await self._window(call.ref(), "id"))
        return await call.rpc("UpdateMaintenanceWindow", request)

    async def delete_window(self, call: Call) -> Message:
        window_id = await self._window(call.ref(), "id")
        return await call.rpc("DeleteMaintenanceWindow", pb.DeleteMaintenanceWindowRequest(id=window_id))

    # --- operation budgets -----------------------------------------------------------------------

    async def list_budgets(self, call: Call) -> Message:
        return await call.rpc("ListOperationBudgets", pb.ListOperationBudgetsRequest())

    async def create_budget(self, call: Call) -> Message:
        return await call.rpc("CreateOperationBudget", await call.body(pb.CreateOperationBudgetRequest()))

    async def get_budget(self, call: Call) -> Message:
        budget_id = await self._budget(call.ref(), "id")
        return await call.rpc("GetOperationBudget", pb.GetOperationBudgetRequest(id=budget_id))

    async def update_budget(self, call: Call) -> Message:
        request = await call.patch(pb.UpdateOperationBudgetRequest(), "budget")
        request.id.CopyFrom(await self._budget(call.ref(), "id"))
        return await call.rpc("UpdateOperationBudget", request)

    async def delete_budget(self, call: Call) -> Message:
        budget_id = await self._budget(call.ref(), "id")
        return await call.rpc("DeleteOperationBudget", pb.DeleteOperationBudgetRequest(id=budget_id))

    # --- pre-flight checks -----------------------------------------------------------------------

    async def list_checks(self, call: Call) -> Message:
        return await call.rpc("ListPreflightChecks", pb.ListPreflightChecksRequest())

    async def get_check(self, call: Call) -> Message:
        check_id = pb.UUID(id=str(await refs.check_id(self.services, call.ref(), "id")))
        return await call.rpc("GetPreflightCheck", pb.GetPreflightCheckRequest(id=check_id))

    async def override_checks(self, call: Call) -> Message:
        request = await call.body(pb.OverridePreflightChecksRequest())
        request.task_id.id = call.ref()
        return await call.rpc("OverridePreflightChecks", request)

    # --- audit -----------------------------------------------------------------------------------

    async def list_audit_events(self, call: Call) -> Message:
        q = call.query
        request = pb.ListAuditEventsRequest(
            since=q.since("since"),
            method=q.text("method"),
            principal=q.text("principal"),
            target=pb.UUID(id=target) if (target := q.text("target")) else None,
            pagination=q.pagination(),
        )
        return await call.rpc("ListAuditEvents", request)

    # --- notification channels and deliveries ----------------------------------------------------

    async def _channel(self, ref: str, field: str) -> pb.UUID:
        return pb.UUID(id=str(await refs.channel_id(self.services, ref, field)))

    async def list_channels(self, call: Call) -> Message:
        return await call.rpc("ListNotificationChannels", pb.ListNotificationChannelsRequest())

    async def create_channel(self, call: Call) -> Message:
        request = await call.body(pb.CreateNotificationChannelRequest())
        return await call.rpc("CreateNotificationChannel", request)

    async def get_channel(self, call: Call) -> Message:
        channel_id = await self._channel(call.ref(), "id")
        return await call.rpc("GetNotificationChannel", pb.GetNotificationChannelRequest(id=channel_id))

    async def update_channel(self, call: Call) -> Message:
        request = await call.patch(pb.UpdateNotificationChannelRequest(), "channel")
        request.id.CopyFrom(await self._channel(call.ref(), "id"))
        return await call.rpc("UpdateNotificationChannel", request)

    async def delete_channel(self, call: Call) -> Message:
        channel_id = await self._channel(call.ref(), "id")
        return await call.rpc("DeleteNotificationChannel", pb.DeleteNotificationChannelRequest(id=channel_id))

    async def redeliver_channel(self, call: Call) -> Message:
        """The channel's dead deliveries, pending again."""
        channel_id = await self._channel(call.ref(), "channel_id")
        request = pb.RedeliverNotificationsRequest(channel_id=channel_id)
        return await call.rpc("RedeliverNotifications", request)

    async def list_deliveries(self, call: Call) -> Message:
        q = call.query
        request = pb.ListNotificationDeliveriesRequest(
            states=q.values("state"), limit=q.integer("limit") or 0
        )
        if channel := q.text("channel"):
            request.channel_id.CopyFrom(await self._channel(channel, "channel_id"))
        return await call.rpc("ListNotificationDeliveries", request)

    async def redeliver(self, call: Call) -> Message:
        """Body (optional): `{"delivery_ids": [{"id": "…"}]}`; none: every dead delivery."""
        return await call.rpc("RedeliverNotifications", await call.body(pb.RedeliverNotificationsRequest()))


_V = TypeVar("_V")


def _view_of(call: Call, parse: Callable[[str], _V]) -> _V:
    """The `view` query parameter (`basic` or `full`; absent: `full`, as the RPCs take none) as the RPC's
    enum, refused with the field named when it is neither."""
    try:
        return parse(call.query.text("view") or "full")
    except ValueError as exc:
        raise InvalidArgument(f"view: {exc}") from None


def error_response(error: RpcError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.http_status == 401 else None
    return JSONResponse(error.to_json(), status_code=error.http_status, headers=headers)
