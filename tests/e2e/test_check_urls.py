"""A check's URL with a token in its query, as an operator meets it through a real `rackflow serve` (SQLite),
a real drain hook and a real port nothing listens on for Alertmanager: the token is sent to the hook, and
shown nowhere — not in the API's answers (gRPC, the JSON API), the CLI, the console, the audit trail, the
held tasks' reasons or the server's log.

And a task a check held, then cancelled: it no longer shows the hold (`rackflow task show`, the API)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.protobuf import text_format
from google.protobuf.field_mask_pb2 import FieldMask

from rackflow.v1 import flow_pb2 as pb
from tests.checks_support import Answer, Receiver, receiving
from tests.conftest import sqlite_copy
from tests.e2e.cluster import ServerProcess, free_port, run_cli, start_server
from tests.e2e.fleet import create_racks, wait_until

pytestmark = pytest.mark.slow

HOOK_TOKEN = "hook-s3cret-41"
AM_TOKEN = "am-s3cret-42"


@pytest.fixture
def hook() -> Iterator[Receiver]:
    with receiving(Answer({"error": "drain service down"}, status=503)) as receiver:
        yield receiver


@pytest.fixture
def server(sqlite_template: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    url = sqlite_copy(sqlite_template, tmp_path)
    started = start_server(url, tmp_path, args=["--http-listen", "127.0.0.1:0"], name="checks")
    yield started
    started.stop()


def cli(server: ServerProcess, *args: str) -> str:
    result = run_cli(server.address, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def get_task(server: ServerProcess, task_id: str) -> pb.Task:
    (task,) = server.stub().GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=[pb.UUID(id=task_id)])).tasks
    return task


def held(server: ServerProcess, task_id: str, words: str) -> bool:
    task = get_task(server, task_id)
    return task.held_by == "preflight" and words in task.held_reason


def power_on(server: ServerProcess, rack: str) -> str:
    target = pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=rack)]))
    (task_id,) = server.stub().PowerOnRack(pb.PowerOnRackRequest(target_spec=target)).task_ids
    return str(task_id.id)


def http_get(server: ServerProcess, path: str) -> str:
    with urllib.request.urlopen(f"{server.http_url}{path}", timeout=10) as answer:
        return str(answer.read().decode())


def test_a_token_in_a_check_s_url_is_sent_and_shown_nowhere(server: ServerProcess, hook: Receiver) -> None:
    stub = server.stub()
    create_racks(stub, ["r-hook", "r-am"])
    hook_url = f"{hook.url}?token={HOOK_TOKEN}"
    am_url = f"http://127.0.0.1:{free_port()}/am?token={AM_TOKEN}"
    drained = stub.CreatePreflightCheck(
        pb.CreatePreflightCheckRequest(
            check=pb.PreflightCheck(
                name="drained",
                racks=[pb.WindowTarget(name="r-hook")],
                webhook=pb.WebhookCheck(url=hook_url, timeout="2s"),
                interval="1s",
            )
        )
    )
    stub.CreatePreflightCheck(
        pb.CreatePreflightCheckRequest(
            check=pb.PreflightCheck(
                name="no-alerts",
                racks=[pb.WindowTarget(name="r-am")],
                alertmanager=pb.AlertmanagerCheck(url=am_url, matchers=['rack="{rack.name}"']),
                interval="1s",
            )
        )
    )
    # Read, then written back with a new timeout: the URL as the API shows it keeps the stored one.
    shown = stub.GetPreflightCheck(pb.GetPreflightCheckRequest(id=drained.id))
    assert shown.webhook.url == f"{hook.url}?token=…"
    shown.webhook.timeout = "3s"
    stub.UpdatePreflightCheck(
        pb.UpdatePreflightCheckRequest(
            id=drained.id, check=shown, update_mask=FieldMask(paths=["check.kind"])
        )
    )
    hook_task = power_on(server, "r-hook")
    am_task = power_on(server, "r-am")
    wait_until(lambda: held(server, hook_task, "HTTP 503"), timeout=30, what="the hook's check held its task")
    wait_until(lambda: held(server, am_task, "cannot ask"), timeout=30, what="Alertmanager's held its task")
    wait_until(lambda: len(hook.paths) >= 2, timeout=30, what="a second round asked the hook")

    # The hook was asked with its whole URL, the token too, after the update as before it.
    assert all(path == f"/drain?token={HOOK_TOKEN}" for path in hook.paths), hook.paths
    tasks = [get_task(server, t) for t in (hook_task, am_task)]
    assert f"{hook.url}?token=…: HTTP 503" in tasks[0].held_reason
    assert "cannot ask http://127.0.0.1:" in tasks[1].held_reason and "/am?token=…" in tasks[1].held_reason
    checks = stub.ListPreflightChecks(pb.ListPreflightChecksRequest())
    events = stub.ListAuditEvents(pb.ListAuditEventsRequest())
    assert {e.method for e in events.events} >= {"CreatePreflightCheck", "UpdatePreflightCheck"}
    seen = {
        "GetTasksByIDs": "".join(text_format.MessageToString(t) for t in tasks),
        "ListPreflightChecks": text_format.MessageToString(checks),
        "ListAuditEvents": text_format.MessageToString(events),
        "check list": cli(server, "check", "list"),
        "check show": cli(server, "check", "show", "drained", "-o", "json"),
        "task show": cli(server, "task", "show", hook_task, am_task),
        "audit": cli(server, "audit", "-o", "json"),
        "/api/v1/checks": http_get(server, "/api/v1/checks"),
        f"/api/v1/tasks/{hook_task}": http_get(server, f"/api/v1/tasks/{hook_task}"),
        "/windows": http_get(server, "/windows"),
        f"/tasks/{am_task}": http_get(server, f"/tasks/{am_task}"),
        "/audit": http_get(server, "/audit"),
        "the server's log": server.output,
    }
    for where, text in seen.items():
        assert HOOK_TOKEN not in text and AM_TOKEN not in text, f"{where} shows a token:\n{text}"
    assert "?token=…" in seen["check list"] and "?token=…" in seen["/windows"]
    assert "pre-flight round" in server.output  # the log did report the holds
    assert json.loads(seen["check show"])["webhook"]["timeout"] == "3s"


def test_a_cancelled_task_a_check_held_no_longer_shows_the_hold(
    server: ServerProcess, hook: Receiver
) -> None:
    """`rackflow task show` of a task a check held, then cancelled, said "held by preflight since …" and
    "not before <its maximum wait>" though nothing held it any more; so did the API and the console."""
    stub = server.stub()
    create_racks(stub, ["r1"])
    check = pb.PreflightCheck(name="drained", webhook=pb.WebhookCheck(url=hook.url, timeout="2s"))
    stub.CreatePreflightCheck(pb.CreatePreflightCheckRequest(check=check))
    task_id = power_on(server, "r1")
    wait_until(lambda: held(server, task_id, "HTTP 503"), timeout=30, what="the check held the task")
    while_held = " ".join(cli(server, "task", "show", task_id).split())
    assert "held by" in while_held and "held at most until" in while_held, while_held
    assert "(asked again then; it fails once a check's maximum wait has run out)" in while_held
    cli(server, "task", "cancel", task_id)
    shown = cli(server, "task", "show", task_id)
    assert "TERMINATED" in shown and "cancelled by user" in shown
    assert "held by" not in shown and "held at most until" not in shown, shown
    task = get_task(server, task_id)
    assert (task.held_by, task.held_reason, task.HasField("not_before")) == ("", "", False)
    assert 'data-testid="task-held"' not in http_get(server, f"/tasks/{task_id}")
