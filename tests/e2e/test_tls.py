"""TLS, mutual TLS and bearer tokens on real `rackflow serve` processes, with certificates made at test time.

Two servers per database: one with TLS and tokens listening on every interface (what the exposure rule
demands there), one with mutual TLS on loopback and no tokens (the client certificate is the principal).
Both also serve the dashboard and JSON API (--http-listen), which must be secured exactly as gRPC is.
"""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.message import Message

from rackflow.security import hash_token
from rackflow.v1 import flow_pb2 as pb
from rackflow.v1.flow_pb2_grpc import FlowStub
from tests.certs import KeyPair, Pki, make_pki
from tests.conftest import postgres_admin_url, sqlite_copy
from tests.e2e.cluster import ServerProcess, fresh_postgres_database, run_cli, start_server

pytestmark = pytest.mark.slow

OPERATOR_TOKEN = "e2e-operator-token-5b8e"
VIEWER_TOKEN = "e2e-viewer-token-c04d"
CALL_TIMEOUT_S = 10


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def database(kind: str, request: pytest.FixtureRequest, directory: Path, name: str) -> Iterator[str]:
    """A copy of the session's migrated template (`sqlite_template`, `pg_template`) for one server: the
    servers here test TLS and tokens, not migrating (a `--migrate` on an empty database took about two
    seconds of CPU, each of four servers)."""
    if kind == "sqlite":
        yield sqlite_copy(request.getfixturevalue("sqlite_template"), directory, f"{name}.db")
    else:
        template = request.getfixturevalue("pg_template")
        with fresh_postgres_database(postgres_admin_url(), template=template) as url:
            yield url


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_kind(request: pytest.FixtureRequest) -> str:
    if request.param == "postgres":
        request.getfixturevalue("postgres_url")  # fails under CI, skips elsewhere, when unreachable
    return str(request.param)


@pytest.fixture(scope="module")
def tls_server(
    db_kind: str, pki: Pki, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """TLS and tokens (one from a file, one from the environment), listening on 0.0.0.0."""
    log_dir = tmp_path_factory.mktemp("tls")
    tokens = log_dir / "tokens.yaml"
    tokens.write_text(f"- name: dashboard\n  role: viewer\n  sha256: {hash_token(VIEWER_TOKEN)}\n")
    with database(db_kind, request, log_dir, "tls") as url:
        server = start_server(
            url,
            log_dir,
            name="tls",
            args=[
                "--listen",
                "0.0.0.0:0",
                "--http-listen",
                "0.0.0.0:0",
                "--tls-cert",
                str(pki.server.cert),
                "--tls-key",
                str(pki.server.key),
                "--auth-tokens",
                str(tokens),
            ],
            env={"RACKFLOW_AUTH_TOKEN_ONCALL": f"operator:{hash_token(OPERATOR_TOKEN)}"},
        )
        server.address = server.address.replace("0.0.0.0", "127.0.0.1")
        yield server
        assert server.stop() == 0, server.output
    for secret in (OPERATOR_TOKEN, VIEWER_TOKEN):
        assert secret not in server.output


@pytest.fixture(scope="module")
def mtls_server(
    db_kind: str, pki: Pki, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    log_dir = tmp_path_factory.mktemp("mtls")
    with database(db_kind, request, log_dir, "mtls") as url:
        server = start_server(
            url,
            log_dir,
            name="mtls",
            args=[
                "--http-listen",
                "127.0.0.1:0",
                "--tls-cert",
                str(pki.server.cert),
                "--tls-key",
                str(pki.server.key),
                "--tls-client-ca",
                str(pki.ca.cert),
            ],
        )
        yield server
        assert server.stop() == 0, server.output


def tls_stub(server: ServerProcess, pki: Pki, client: KeyPair | None = None) -> FlowStub:
    cert, key = client.read() if client else (None, None)
    credentials = grpc.ssl_channel_credentials(pki.ca.cert.read_bytes(), key, cert)
    return FlowStub(grpc.secure_channel(server.address, credentials))


def call(method: Any, request: Message, token: str | None = None) -> Any:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    return method(request, metadata=metadata, timeout=CALL_TIMEOUT_S)


def refused(method: Any, request: Message, token: str | None = None) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call(method, request, token)
    code: grpc.StatusCode = info.value.code()
    return code


def test_tls_client_with_a_token_is_served(tls_server: ServerProcess, pki: Pki) -> None:
    flow = tls_stub(tls_server, pki)
    rack = call(flow.CreateRack, pb.CreateRackRequest(name="r1"), OPERATOR_TOKEN)
    listed = call(flow.ListRacks, pb.ListRacksRequest(), VIEWER_TOKEN)
    assert [r.id for r in listed.racks] == [rack.id]
    events = call(flow.ListAuditEvents, pb.ListAuditEventsRequest(method="CreateRack"), VIEWER_TOKEN)
    assert [(e.principal, e.outcome) for e in events.events] == [("oncall", "OK")]


def test_tls_server_refuses_missing_tokens_and_viewer_writes(tls_server: ServerProcess, pki: Pki) -> None:
    flow = tls_stub(tls_server, pki)
    assert refused(flow.ListRacks, pb.ListRacksRequest()) == grpc.StatusCode.UNAUTHENTICATED
    assert refused(flow.ListRacks, pb.ListRacksRequest(), "not-a-token") == grpc.StatusCode.UNAUTHENTICATED
    assert refused(flow.CreateRack, pb.CreateRackRequest(name="v"), VIEWER_TOKEN) == (
        grpc.StatusCode.PERMISSION_DENIED
    )


def test_plaintext_client_cannot_talk_to_a_tls_server(tls_server: ServerProcess) -> None:
    flow = FlowStub(grpc.insecure_channel(tls_server.address))
    assert refused(flow.ListRacks, pb.ListRacksRequest(), OPERATOR_TOKEN) == grpc.StatusCode.UNAVAILABLE
    # The failed handshake wrote no line of gRPC core's own (`I1206 07:11:56.005056 29596
    # ssl_transport_security.cc:2563] Handshake failed …`, written before the socket closed) into the
    # server's log, where a JSON log then had a line that is not JSON (docs/OPERATIONS.md, "Logs").
    assert not re.search(r"^[IWEF]\d{4} ", tls_server.output, re.MULTILINE), tls_server.output


def test_mutual_tls_serves_a_ca_signed_client_and_names_it_in_the_audit(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    flow = tls_stub(mtls_server, pki, pki.client)
    call(flow.CreateRack, pb.CreateRackRequest(name="r1"))
    events = call(flow.ListAuditEvents, pb.ListAuditEventsRequest())
    assert [(e.principal, e.method) for e in events.events] == [("ops-laptop", "CreateRack")]


@pytest.mark.parametrize("client", ["none", "rogue"])
def test_mutual_tls_refuses_clients_without_a_valid_certificate(
    mtls_server: ServerProcess, pki: Pki, client: str
) -> None:
    flow = tls_stub(mtls_server, pki, pki.rogue_client if client == "rogue" else None)
    assert refused(flow.ListRacks, pb.ListRacksRequest()) == grpc.StatusCode.UNAVAILABLE


def serve_exit(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "rackflow", "serve", "--db", f"sqlite:///{tmp_path}/unused.db", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_serve_refuses_an_exposed_listener_without_tls_and_auth(tmp_path: Path) -> None:
    result = serve_exit(tmp_path, "--listen", "0.0.0.0:0")
    assert result.returncode == 2, result.stderr
    assert "--listen: '0.0.0.0' is reachable beyond this machine" in result.stderr
    assert "--insecure" in result.stderr


def test_serve_refuses_a_bad_token_file_as_a_usage_error(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("- {name: ops, role: operator, token: plaintext-secret}\n")
    result = serve_exit(tmp_path, "--auth-tokens", str(tokens))
    assert result.returncode == 2
    assert "plaintext 'token' is not accepted" in result.stderr
    assert "plaintext-secret" not in result.stderr


def cli(server: ServerProcess, *args: str, token: str = "") -> subprocess.CompletedProcess[str]:
    """`rackflow --server ADDRESS ARGS…` (`run_cli`); `token` goes in RACKFLOW_TOKEN."""
    return run_cli(server.address, *args, env={"RACKFLOW_TOKEN": token})


def test_cli_reaches_a_tls_server_with_a_token(tls_server: ServerProcess, pki: Pki) -> None:
    ca = ("--tls-ca", str(pki.ca.cert))
    created = cli(tls_server, *ca, "rack", "create", "cli-rack", token=OPERATOR_TOKEN)
    assert created.returncode == 0, created.stderr
    result = cli(
        tls_server,
        *ca,
        "--token",
        VIEWER_TOKEN,
        "audit",
        "--method",
        "CreateRack",
        "--since",
        "1h",
        "-o",
        "json",
    )
    assert result.returncode == 0, result.stderr
    events = json.loads(result.stdout)["events"]
    assert json.loads(events[0]["request_json"])["name"] == "cli-rack"
    denied = cli(tls_server, *ca, "rack", "list")
    assert denied.returncode == 1
    assert "UNAUTHENTICATED" in denied.stderr


def test_cli_presents_a_client_certificate_for_mutual_tls(mtls_server: ServerProcess, pki: Pki) -> None:
    tls = ["--tls-ca", str(pki.ca.cert), "--tls-cert", str(pki.client.cert), "--tls-key", str(pki.client.key)]
    created = cli(mtls_server, *tls, "rack", "create", f"mtls-{uuid.uuid4().hex[:8]}")  # an audited change
    assert created.returncode == 0, created.stderr
    result = cli(mtls_server, *tls, "audit", "--principal", "ops-laptop")
    assert result.returncode == 0, result.stderr
    assert "ops-laptop" in result.stdout
    missing_key = cli(mtls_server, "--tls-ca", str(pki.ca.cert), "--tls-cert", str(pki.client.cert), "audit")
    assert missing_key.returncode == 2
    assert "--tls-cert, --tls-key" in missing_key.stderr


# --- the dashboard and JSON API on the same servers -------------------------------------------------


def https(server: ServerProcess, pki: Pki, client: KeyPair | None = None) -> httpx.Client:
    """A client that trusts the test CA (and presents `client`'s certificate), for the server's HTTP side."""
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    base = server.http_url.replace("0.0.0.0", "127.0.0.1")
    return httpx.Client(base_url=base, verify=context, timeout=CALL_TIMEOUT_S)


def test_https_uses_the_grpc_certificate_tokens_and_roles(tls_server: ServerProcess, pki: Pki) -> None:
    assert tls_server.http_url.startswith("https://0.0.0.0:")
    with https(tls_server, pki) as client:
        refused = client.get("/api/v1/racks")
        assert refused.status_code == 401 and refused.json()["code"] == "UNAUTHENTICATED"
        viewer = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
        assert client.get("/api/v1/racks", headers=viewer).status_code == 200
        denied = client.post(f"/api/v1/tasks/{uuid.uuid4()}:cancel", headers=viewer)
        assert denied.status_code == 403
        operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        missing = client.post(f"/api/v1/tasks/{uuid.uuid4()}:cancel", headers=operator)
        assert missing.status_code == 404 and missing.json()["field"] == "task_id"
        shell = client.get("/tasks")
        assert shell.status_code == 200 and "data-deferred" in shell.text  # no data without a token
    plain = tls_server.http_url.replace("https://0.0.0.0", "http://127.0.0.1")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/api/v1/racks", timeout=CALL_TIMEOUT_S)


def test_https_with_mutual_tls_names_the_client_certificate(mtls_server: ServerProcess, pki: Pki) -> None:
    with https(mtls_server, pki, pki.client) as client:
        missing = client.post(f"/api/v1/tasks/{uuid.uuid4()}:cancel")  # an audited (refused) action
        assert missing.status_code == 404
        events = client.get("/api/v1/audit", params={"method": "CancelTask"}).json()["events"]
        assert [(e["principal"], e["outcome"]) for e in events] == [("ops-laptop", "NOT_FOUND")]
    for client_pair in (None, pki.rogue_client):
        with https(mtls_server, pki, client_pair) as client, pytest.raises(httpx.HTTPError):
            client.get("/api/v1/racks")


def test_serve_refuses_an_exposed_http_listener_without_tls_and_auth(tmp_path: Path) -> None:
    result = serve_exit(tmp_path, "--http-listen", "0.0.0.0:0")
    assert result.returncode == 2, result.stderr
    assert "--http-listen: '0.0.0.0' is reachable beyond this machine" in result.stderr
