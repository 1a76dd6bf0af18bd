"""The JSON API, `/api/v1/…`: each endpoint builds one RPC's request message and returns its response.

Responses are the RPC's response message in proto3 JSON (`message_json`: proto field names, enums by
name, defaults included). Errors are `{"code", "message", "field"}` with the HTTP status of the code
(`rackflow.api.errors`); `field` is the request field the message names (or the query parameter, for a
malformed one), null when none is named. Query parameters are explicit per endpoint (docs/HTTP.md) and an
unknown one is refused, so a typo never silently widens a filter. `{ref}` and the `rack`/`schedule`
filters take an id or a name.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from google.protobuf import json_format
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rackflow.api.auth import Principal
from rackflow.api.convert import message_json
from rackflow.api.errors import INTERNAL_MESSAGE
from rackflow.client import task_status
from rackflow.errors import InvalidArgument, NotFound, RackflowError
from rackflow.security import TokenTable
from rackflow.services import Services
from rackflow.v1 import flow_pb2 as pb
from rackflow.web import refs
from rackflow.web.auth import principal_of
from rackflow.web.calls import RpcCaller, RpcError

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
INT32_MAX = 2**31 - 1
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


class Query:
    """A request's query parameters. Each read names the parameter it reads; `check` then refuses any
    parameter the endpoint does not take."""

    def __init__(self, request: Request) -> None:
        self._params = request.query_params
        self._known: list[str] = []

    def _raw(self, name: str) -> str | None:
        self._known.append(name)
        return self._params.get(name)

    def text(self, name: str) -> str:
        return self._raw(name) or ""

    def values(self, name: str) -> list[str]:
        """A repeated parameter: `?status=a&status=b` or `?status=a,b`."""
        self._known.append(name)
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

    def pagination(self) -> pb.Pagination | None:
        """`offset` and `limit`, as the list RPCs take them (limit 0 or absent: no limit)."""
        offset, limit = self.integer("offset"), self.integer("limit")
        if offset is None and limit is None:
            return None
        return pb.Pagination(offset=offset or 0, limit=limit or 0)

    def check(self) -> None:
        unknown = sorted(set(self._params) - set(self._known))
        if unknown:
            takes = ", ".join(sorted(set(self._known))) or "none"
            raise InvalidArgument(f"{unknown[0]}: unknown query parameter (this endpoint takes: {takes})")


async def _body(request: Request, message: Message) -> Message:
    """Merge the JSON body (proto3 JSON of the request message; may be empty) into `message`."""
    raw = await request.body()
    if not raw.strip():
        return message
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(f"body: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("body: expected a JSON object")
    try:
        json_format.ParseDict(data, message, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise InvalidArgument(f"body: {exc}") from None
    return message


@dataclass
class Call:
    """One API request: its query, its caller, and a way to run RPCs as that caller."""

    request: Request
    query: Query
    principal: Principal
    caller: RpcCaller

    async def rpc(self, name: str, message: Message) -> Message:
        return await self.caller(name, message, self.principal)


Handler = Callable[["JsonApi", Call], Awaitable[Message]]


class JsonApi:
    def __init__(self, services: Services, caller: RpcCaller, tokens: TokenTable | None) -> None:
        self.services = services
        self.caller = caller
        self.tokens = tokens

    def routes(self) -> list[Route]:
        get, post = ["GET"], ["POST"]
        table: list[tuple[str, Handler, list[str]]] = [
            ("/schedules", JsonApi.list_schedules, get),
            ("/schedules/{ref}:pause", JsonApi.pause_schedule, post),
            ("/schedules/{ref}:resume", JsonApi.resume_schedule, post),
            ("/schedules/{ref}:trigger", JsonApi.trigger_schedule, post),
            ("/schedules/{ref}", JsonApi.get_schedule, get),
            ("/schedules/{ref}/runs", JsonApi.list_runs, get),
            ("/schedules/{ref}/scopes", JsonApi.list_scopes, get),
            ("/schedules/{ref}/preview", JsonApi.preview, get),
            ("/schedules/{ref}/decisions", JsonApi.preview_decisions, get),
            ("/runs/{ref}:resume", JsonApi.resume_run, post),
            ("/runs/{ref}:cancel", JsonApi.cancel_run, post),
            ("/runs/{ref}", JsonApi.get_run, get),
            ("/tasks", JsonApi.list_tasks, get),
            ("/tasks/{ref}:cancel", JsonApi.cancel_task, post),
            ("/tasks/{ref}:override-checks", JsonApi.override_checks, post),
            ("/tasks/{ref}", JsonApi.get_task, get),
            ("/racks", JsonApi.list_racks, get),
            ("/racks/{ref}", JsonApi.get_rack, get),
            ("/racks/{ref}/windows", JsonApi.preview_windows, get),
            ("/windows", JsonApi.list_windows, get),
            ("/windows/{ref}", JsonApi.get_window, get),
            ("/checks", JsonApi.list_checks, get),
            ("/checks/{ref}", JsonApi.get_check, get),
            ("/audit", JsonApi.list_audit_events, get),
        ]
        return [Route(PREFIX + path, self._serve(h), methods=methods) for path, h, methods in table]

    def _serve(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def respond(request: Request) -> Response:
            try:
                principal = principal_of(request, self.tokens)
                call = Call(request, Query(request), principal, self.caller)
                message = await handler(self, call)
            except RpcError as exc:
                return error_response(exc)
            except RackflowError as exc:
                return error_response(RpcError.of(exc))
            except Exception:
                log.exception("unexpected error in %s %s", request.method, request.url.path)
                return JSONResponse({"code": "INTERNAL", "message": INTERNAL_MESSAGE, "field": None}, 500)
            return JSONResponse(message_json(message))

        return respond

    # --- names -----------------------------------------------------------------------------------

    async def _schedule(self, ref: str, field: str) -> pb.UUID:
        return pb.UUID(id=str(await refs.schedule_id(self.services, ref, field)))

    async def _rack(self, ref: str, field: str) -> pb.UUID:
        return pb.UUID(id=str(await refs.rack_id(self.services, ref, field)))

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
        q.check()
        return await call.rpc("ListTaskSchedules", request)

    async def get_schedule(self, call: Call) -> Message:
        call.query.check()
        schedule_id = await self._schedule(call.request.path_params["ref"], "id")
        return await call.rpc("GetTaskSchedule", pb.GetTaskScheduleRequest(id=schedule_id))

    async def list_runs(self, call: Call) -> Message:
        request = pb.ListTaskScheduleRunsRequest(pagination=call.query.pagination())
        call.query.check()
        request.schedule_id.CopyFrom(await self._schedule(call.request.path_params["ref"], "schedule_id"))
        return await call.rpc("ListTaskScheduleRuns", request)

    async def list_scopes(self, call: Call) -> Message:
        call.query.check()
        schedule_id = await self._schedule(call.request.path_params["ref"], "schedule_id")
        return await call.rpc(
            "ListTaskScheduleScopes", pb.ListTaskScheduleScopesRequest(schedule_id=schedule_id)
        )

    async def preview(self, call: Call) -> Message:
        """The schedule's next firings: PreviewScheduleSpec of its own spec."""
        count, after = call.query.integer("count"), call.query.timestamp("after")
        call.query.check()
        schedule_id = await self._schedule(call.request.path_params["ref"], "id")
        schedule = await call.rpc("GetTaskSchedule", pb.GetTaskScheduleRequest(id=schedule_id))
        assert isinstance(schedule, pb.TaskSchedule)
        request = pb.PreviewScheduleSpecRequest(spec=schedule.spec, count=count or 0, after=after)
        return await call.rpc("PreviewScheduleSpec", request)

    async def preview_decisions(self, call: Call) -> Message:
        """The schedule's next firings and each scope's decision under the maintenance windows."""
        count, after = call.query.integer("count"), call.query.timestamp("after")
        call.query.check()
        schedule_id = await self._schedule(call.request.path_params["ref"], "id")
        request = pb.PreviewTaskScheduleRequest(id=schedule_id, count=count or 0, after=after)
        return await call.rpc("PreviewTaskSchedule", request)

    async def _schedule_action(self, call: Call, rpc: str, message: Message) -> Message:
        call.query.check()
        await _body(call.request, message)
        message.id.CopyFrom(await self._schedule(call.request.path_params["ref"], "id"))  # type: ignore[attr-defined]
        return await call.rpc(rpc, message)

    async def pause_schedule(self, call: Call) -> Message:
        return await self._schedule_action(call, "PauseTaskSchedule", pb.PauseTaskScheduleRequest())

    async def resume_schedule(self, call: Call) -> Message:
        return await self._schedule_action(call, "ResumeTaskSchedule", pb.ResumeTaskScheduleRequest())

    async def trigger_schedule(self, call: Call) -> Message:
        return await self._schedule_action(call, "TriggerTaskSchedule", pb.TriggerTaskScheduleRequest())

    # --- runs (rollouts) --------------------------------------------------------------------------

    async def get_run(self, call: Call) -> Message:
        call.query.check()
        request = pb.GetTaskScheduleRunRequest(id=pb.UUID(id=call.request.path_params["ref"]))
        return await call.rpc("GetTaskScheduleRun", request)

    async def _run_action(self, call: Call, rpc: str, message: Message) -> Message:
        call.query.check()
        await _body(call.request, message)
        message.id.id = call.request.path_params["ref"]  # type: ignore[attr-defined]
        return await call.rpc(rpc, message)

    async def resume_run(self, call: Call) -> Message:
        return await self._run_action(call, "ResumeTaskScheduleRun", pb.ResumeTaskScheduleRunRequest())

    async def cancel_run(self, call: Call) -> Message:
        return await self._run_action(call, "CancelTaskScheduleRun", pb.CancelTaskScheduleRunRequest())

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
        q.check()
        return await call.rpc("ListTasks", request)

    async def get_task(self, call: Call) -> Message:
        call.query.check()
        ref = call.request.path_params["ref"]
        found = await call.rpc("GetTasksByIDs", pb.GetTasksByIDsRequest(task_ids=[pb.UUID(id=ref)]))
        assert isinstance(found, pb.GetTasksByIDsResponse)
        if not found.tasks:
            raise NotFound(f"task_ids[0]: task {ref} not found")
        return found.tasks[0]

    async def cancel_task(self, call: Call) -> Message:
        call.query.check()
        request = await _body(call.request, pb.CancelTaskRequest())
        assert isinstance(request, pb.CancelTaskRequest)
        request.task_id.id = call.request.path_params["ref"]
        return await call.rpc("CancelTask", request)

    async def override_checks(self, call: Call) -> Message:
        call.query.check()
        request = await _body(call.request, pb.OverridePreflightChecksRequest())
        assert isinstance(request, pb.OverridePreflightChecksRequest)
        request.task_id.id = call.request.path_params["ref"]
        return await call.rpc("OverridePreflightChecks", request)

    # --- racks and audit -------------------------------------------------------------------------

    async def list_racks(self, call: Call) -> Message:
        request = pb.ListRacksRequest(pagination=call.query.pagination())
        if domain := call.query.text("nvl_domain_id"):
            request.nvl_domain_id.id = domain
        call.query.check()
        return await call.rpc("ListRacks", request)

    async def get_rack(self, call: Call) -> Message:
        call.query.check()
        rack_id = await self._rack(call.request.path_params["ref"], "id")
        return await call.rpc("GetRack", pb.GetRackRequest(id=rack_id))

    async def preview_windows(self, call: Call) -> Message:
        count, after = call.query.integer("count"), call.query.timestamp("after")
        call.query.check()
        rack_id = await self._rack(call.request.path_params["ref"], "rack_id")
        request = pb.PreviewMaintenanceWindowsRequest(rack_id=rack_id, count=count or 0, after=after)
        return await call.rpc("PreviewMaintenanceWindows", request)

    # --- maintenance windows ---------------------------------------------------------------------

    async def list_windows(self, call: Call) -> Message:
        request = pb.ListMaintenanceWindowsRequest()
        if rack := call.query.text("rack"):
            request.rack_id.CopyFrom(await self._rack(rack, "rack_id"))
        call.query.check()
        return await call.rpc("ListMaintenanceWindows", request)

    async def get_window(self, call: Call) -> Message:
        call.query.check()
        window_id = await refs.window_id(self.services, call.request.path_params["ref"], "id")
        return await call.rpc(
            "GetMaintenanceWindow", pb.GetMaintenanceWindowRequest(id=pb.UUID(id=str(window_id)))
        )

    # --- pre-flight checks -----------------------------------------------------------------------

    async def list_checks(self, call: Call) -> Message:
        call.query.check()
        return await call.rpc("ListPreflightChecks", pb.ListPreflightChecksRequest())

    async def get_check(self, call: Call) -> Message:
        call.query.check()
        check_id = await refs.check_id(self.services, call.request.path_params["ref"], "id")
        return await call.rpc("GetPreflightCheck", pb.GetPreflightCheckRequest(id=pb.UUID(id=str(check_id))))

    async def list_audit_events(self, call: Call) -> Message:
        q = call.query
        request = pb.ListAuditEventsRequest(
            since=q.timestamp("since"),
            method=q.text("method"),
            principal=q.text("principal"),
            pagination=q.pagination(),
        )
        q.check()
        return await call.rpc("ListAuditEvents", request)


def error_response(error: RpcError) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if error.http_status == 401 else None
    return JSONResponse(error.to_json(), status_code=error.http_status, headers=headers)
