"""Roles over the JSON API of a real `rackflow serve` (SQLite, real HTTP), as gRPC answers them: the role is
checked before anything else, so a viewer's action on a misspelled name is refused and audited as over gRPC
(`PERMISSION_DENIED`), never a `404` the trail does not show; an operator, who may act, is told the name is
unknown; an approval is the approver role's, whatever the body holds."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest

from rackflow.security import hash_token
from rackflow.v1 import flow_pb2 as pb
from tests.conftest import served_sqlite_copy
from tests.e2e.cluster import ServerProcess, start_server

pytestmark = pytest.mark.slow

VIEWER, OPERATOR, APPROVER = "roles-viewer-5e1d", "roles-operator-0b7c", "roles-approver-93fa"


@pytest.fixture(scope="module")
def server(sqlite_template: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    started = start_server(
        served_sqlite_copy(sqlite_template, tmp_path_factory),
        tmp_path_factory.mktemp("roles"),
        args=["--http-listen", "127.0.0.1:0"],
        env={
            "RACKFLOW_AUTH_TOKEN_WALLBOARD": f"viewer:{hash_token(VIEWER)}",
            "RACKFLOW_AUTH_TOKEN_ONCALL": f"operator:{hash_token(OPERATOR)}",
            "RACKFLOW_AUTH_TOKEN_ALICE": f"approver:{hash_token(APPROVER)}",
        },
        name="roles",
    )
    yield started
    assert started.stop() == 0, started.output


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{server.http_url}/api/v1", timeout=10) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def newest_event(http: httpx.Client) -> dict[str, Any]:
    events = http.get("/audit", params={"limit": 1}, headers=bearer(VIEWER)).json()["events"]
    return dict(events[0]) if events else {}


RACK_R1 = {"racks": {"targets": [{"name": "r1"}]}}
# (method, path, JSON body or None, the RPC): actions on names that name nothing.
MISSPELLED = [
    ("POST", "/schedules/nightly-rset:pause", None, "PauseTaskSchedule"),
    ("DELETE", "/schedules/nightly-rset", None, "DeleteTaskSchedule"),
    ("PATCH", "/windows/sat-nite", {"window": {"reason": "moved"}}, "UpdateMaintenanceWindow"),
    ("POST", "/schedules/nightly-rset/scopes", {"target_spec": RACK_R1}, "AddTaskScheduleScope"),
    ("DELETE", "/budgets/no-such-budget", None, "DeleteOperationBudget"),
]


@pytest.mark.parametrize(("method", "path", "body", "rpc"), MISSPELLED, ids=[m[3] for m in MISSPELLED])
def test_a_viewer_acting_on_a_misspelled_name_is_refused_and_audited(
    http: httpx.Client, method: str, path: str, body: Any, rpc: str
) -> None:
    before = newest_event(http)
    response = http.request(method, path, json=body, headers=bearer(VIEWER))
    assert response.status_code == 403, response.text
    error = response.json()
    assert error["code"] == "PERMISSION_DENIED"
    assert error["message"].startswith(f"{rpc}: the viewer role of 'wallboard' may only call")
    event = newest_event(http)
    assert event != before, "the refusal has its row in the audit trail"
    assert (event["principal"], event["method"], event["outcome"], event["error"]) == (
        "wallboard",
        rpc,
        "PERMISSION_DENIED",
        error["message"],
    )
    misspelled = path.split("/")[2].split(":")[0]
    assert [t["id"] for t in event["target_ids"]] == [misspelled]  # what was asked, as over gRPC


def test_grpc_refuses_a_viewer_the_same_call_alike(server: ServerProcess, http: httpx.Client) -> None:
    response = http.delete("/schedules/nightly-rset", headers=bearer(VIEWER))
    with pytest.raises(grpc.RpcError) as refused:
        server.stub().DeleteTaskSchedule(
            pb.DeleteTaskScheduleRequest(id=pb.UUID(id="nightly-rset")),
            metadata=(("authorization", f"Bearer {VIEWER}"),),
        )
    assert (refused.value.code().name, refused.value.details()) == (
        response.json()["code"],
        response.json()["message"],
    )


def test_an_operator_may_act_so_is_told_the_name_is_unknown(http: httpx.Client) -> None:
    before = newest_event(http)
    response = http.post("/schedules/nightly-rset:pause", headers=bearer(OPERATOR))
    assert response.status_code == 404, response.text
    assert response.json()["code"] == "NOT_FOUND" and response.json()["field"] == "id"
    # Nothing ran, and the trail says who tried what, as over gRPC a pause of an id that names nothing is.
    event = newest_event(http)
    assert event != before
    assert (event["principal"], event["method"], event["outcome"], event["error"]) == (
        "oncall",
        "PauseTaskSchedule",
        "NOT_FOUND",
        response.json()["message"],
    )
    assert [t["id"] for t in event["target_ids"]] == ["nightly-rset"]


def test_an_approval_is_refused_to_an_operator_before_its_body_is_read(http: httpx.Client) -> None:
    """The body is wrong too (an unknown field): the role is what an operator is told, and it is recorded."""
    run_id = str(uuid.uuid4())
    for token, status, code in ((OPERATOR, 403, "PERMISSION_DENIED"), (APPROVER, 400, "INVALID_ARGUMENT")):
        response = http.post(f"/runs/{run_id}:approve", json={"coment": "ok"}, headers=bearer(token))
        assert (response.status_code, response.json()["code"]) == (status, code), response.text
    refused = http.post(f"/runs/{run_id}:approve", json={"coment": "ok"}, headers=bearer(OPERATOR)).json()
    event = newest_event(http)
    assert (event["principal"], event["method"], event["outcome"], event["error"]) == (
        "oncall",
        "ApproveTaskScheduleRun",
        "PERMISSION_DENIED",
        refused["message"],
    )
    assert [t["id"] for t in event["target_ids"]] == [run_id]
