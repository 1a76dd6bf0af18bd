"""Tokens, roles and the exposure rule as pure functions: no server, no database."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from rackflow.api.audit import target_ids
from rackflow.api.auth import authenticate, authorize, bearer_token, certificate_name, required_role, rpc_name
from rackflow.api.errors import status_of
from rackflow.config import ServeConfig
from rackflow.errors import InvalidArgument, PermissionDenied, Unauthenticated
from rackflow.security import (
    Principal,
    Role,
    ServerTls,
    TokenEntry,
    TokenTable,
    check_exposure,
    hash_token,
    is_loopback,
    load_tokens,
    parse_token_file,
    tokens_from_env,
)
from rackflow.v1 import flow_pb2 as pb

VIEWER_HASH = hash_token("v-token")
OPERATOR_HASH = hash_token("o-token")
TABLE = TokenTable(
    (TokenEntry("grafana", Role.VIEWER, VIEWER_HASH), TokenEntry("ci", Role.OPERATOR, OPERATOR_HASH))
)


def test_hash_is_hex_sha256_of_the_utf8_token() -> None:
    # printf %s 'abc' | sha256sum
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_verify_finds_the_matching_entry_only() -> None:
    assert TABLE.verify("v-token") == TABLE.entries[0]
    assert TABLE.verify("o-token") == TABLE.entries[1]
    assert TABLE.verify("o-token ") is None
    assert TABLE.verify("") is None


def test_token_file_accepts_yaml_and_json() -> None:
    yaml_text = f"- name: grafana\n  role: viewer\n  sha256: {VIEWER_HASH.upper()}\n"
    json_text = json.dumps([{"name": "ci", "role": "operator", "sha256": OPERATOR_HASH}])
    assert parse_token_file(yaml_text, "t.yaml") == (TokenEntry("grafana", Role.VIEWER, VIEWER_HASH),)
    assert parse_token_file(json_text, "t.json") == (TokenEntry("ci", Role.OPERATOR, OPERATOR_HASH),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{}", r"t\.yaml: expected a list"),
        ("[1]", r"t\.yaml\[0\]: expected a mapping"),
        ("- {name: a, role: admin, sha256: " + VIEWER_HASH + "}", r"t\.yaml\[0\]\.role: .*'admin'"),
        ("- {name: a, role: viewer, sha256: abc}", r"t\.yaml\[0\]\.sha256: expected 64 hexadecimal"),
        ("- {name: '', role: viewer, sha256: " + VIEWER_HASH + "}", r"t\.yaml\[0\]\.name"),
        ("- {name: a, role: viewer, token: hunter2}", r"t\.yaml\[0\]: plaintext 'token' is not accepted"),
        ("- {name: a, role: viewer, sha256: " + VIEWER_HASH + ", note: x}", r"unknown field\(s\) note"),
        ("- [unclosed", r"t\.yaml: not valid YAML or JSON"),
    ],
)
def test_token_file_errors_name_the_entry_and_field(text: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message) as info:
        parse_token_file(text, "t.yaml")
    assert "hunter2" not in str(info.value)


def test_duplicate_names_or_hashes_are_refused_without_showing_the_hash() -> None:
    with pytest.raises(InvalidArgument, match="duplicate name: a"):
        TokenTable((TokenEntry("a", Role.VIEWER, VIEWER_HASH), TokenEntry("a", Role.VIEWER, OPERATOR_HASH)))
    with pytest.raises(InvalidArgument, match="duplicate sha256") as info:
        TokenTable((TokenEntry("a", Role.VIEWER, VIEWER_HASH), TokenEntry("b", Role.OPERATOR, VIEWER_HASH)))
    assert VIEWER_HASH not in str(info.value)


def test_tokens_from_env_and_file_combine(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(f"- {{name: grafana, role: viewer, sha256: {VIEWER_HASH}}}\n")
    env = {"RACKFLOW_AUTH_TOKEN_CI_BOT": f"operator:{OPERATOR_HASH}", "RACKFLOW_AUTH_TOKENS": str(path)}
    assert tokens_from_env(env) == (TokenEntry("ci_bot", Role.OPERATOR, OPERATOR_HASH),)
    table = load_tokens(str(path), env)
    assert table is not None and [e.name for e in table.entries] == ["grafana", "ci_bot"]
    assert load_tokens(None, {}) is None
    with pytest.raises(InvalidArgument, match=r"RACKFLOW_AUTH_TOKEN_X\.role"):
        tokens_from_env({"RACKFLOW_AUTH_TOKEN_X": OPERATOR_HASH})
    with pytest.raises(InvalidArgument, match="--auth-tokens: cannot read"):
        load_tokens(str(tmp_path / "missing.yaml"), {})
    path.write_text("[]")
    with pytest.raises(InvalidArgument, match="no tokens configured"):
        load_tokens(str(path), {})


@pytest.mark.parametrize(
    ("metadata", "token"),
    [
        ((("authorization", "Bearer abc"),), "abc"),
        ((("authorization", "bearer  abc "),), "abc"),
        ((("x-other", "1"), ("authorization", "Bearer abc")), "abc"),
        ((("authorization", "Basic abc"),), None),
        ((("authorization", "Bearer"),), None),
        ((), None),
    ],
)
def test_bearer_token(metadata: tuple[tuple[str, str], ...], token: str | None) -> None:
    assert bearer_token(metadata) == token


def test_certificate_name() -> None:
    assert certificate_name({"x509_common_name": [b"ops-laptop"]}) == "ops-laptop"
    assert certificate_name({"transport_security_type": [b"ssl"]}) is None


def test_authenticate() -> None:
    assert authenticate(TABLE, "v-token", "laptop") == Principal("grafana", Role.VIEWER, "token")
    # Without tokens every caller may do everything: the approver role holds the operator's.
    assert authenticate(None, None, "laptop") == Principal("laptop", Role.APPROVER, "certificate")
    assert authenticate(None, "ignored", None) == Principal("anonymous", Role.APPROVER, "anonymous")
    for token in (None, "nope"):
        with pytest.raises(Unauthenticated) as refused:
            authenticate(TABLE, token, "laptop")
        assert status_of(refused.value).grpc == grpc.StatusCode.UNAUTHENTICATED
        assert status_of(refused.value).http == 401


def test_authorize_by_role() -> None:
    viewer, operator = Principal("g", Role.VIEWER, "token"), Principal("c", Role.OPERATOR, "token")
    for rpc in ("GetRack", "ListTasks", "PreviewScheduleSpec", "CheckScheduleConflicts", "ListAuditEvents"):
        assert required_role(rpc) is Role.VIEWER
        authorize(viewer, rpc)
    for rpc in ("CreateRack", "CancelTask", "TriggerTaskSchedule", "PowerOnRack", "UpdateTaskScheduleScope"):
        assert required_role(rpc) is Role.OPERATOR
        authorize(operator, rpc)
        with pytest.raises(PermissionDenied) as denied:
            authorize(viewer, rpc)
        assert status_of(denied.value).grpc == grpc.StatusCode.PERMISSION_DENIED
        assert status_of(denied.value).http == 403


def test_only_the_approver_role_approves_and_it_holds_the_operators() -> None:
    viewer, operator = Principal("g", Role.VIEWER, "token"), Principal("c", Role.OPERATOR, "token")
    approver = Principal("lead", Role.APPROVER, "token")
    for rpc in ("ApproveTaskScheduleRun", "RejectTaskScheduleRun"):
        assert required_role(rpc) is Role.APPROVER
        authorize(approver, rpc)
        for refused in (viewer, operator):
            with pytest.raises(PermissionDenied, match=f"{rpc}: .* needs the approver role"):
                authorize(refused, rpc)
    for rpc in ("TriggerTaskSchedule", "GetRack"):
        authorize(approver, rpc)
    entry = f"[{{name: lead, role: approver, sha256: {OPERATOR_HASH}}}]"
    assert parse_token_file(entry, "t.yaml") == (TokenEntry("lead", Role.APPROVER, OPERATOR_HASH),)


def test_rpc_name_only_for_the_flow_service() -> None:
    assert rpc_name("/rackflow.v1.Flow/GetRack") == "GetRack"
    assert rpc_name("/grpc.health.v1.Health/Check") is None
    assert rpc_name("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is None


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.1", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("rack-api.example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_exposure_rule() -> None:
    check_exposure("127.0.0.1", tls=False, auth=False, insecure=False)
    check_exposure("0.0.0.0", tls=True, auth=True, insecure=False)
    check_exposure("0.0.0.0", tls=False, auth=False, insecure=True)
    exposed = r"--listen: '0.0.0.0' .* TLS .* and authentication .*--insecure"
    with pytest.raises(InvalidArgument, match=exposed):
        check_exposure("0.0.0.0", tls=False, auth=False, insecure=False)
    with pytest.raises(InvalidArgument, match=r"but authentication \(--auth-tokens or --tls-client-ca\)"):
        check_exposure("10.0.0.1", tls=True, auth=False, insecure=False)


def test_serve_config_applies_the_exposure_rule() -> None:
    tls = ServerTls("server.pem", "server.key")
    mutual = ServerTls("server.pem", "server.key", "clients-ca.pem")
    ServeConfig(listen="0.0.0.0:50051", tls=tls, tokens=TABLE)
    ServeConfig(listen="0.0.0.0:50051", tls=mutual)
    ServeConfig(listen="0.0.0.0:50051", insecure=True)
    for kwargs in ({}, {"tls": tls}, {"tokens": TABLE}):
        with pytest.raises(InvalidArgument, match="--insecure"):
            ServeConfig(listen="0.0.0.0:50051", **kwargs)


def test_server_tls_from_flags() -> None:
    assert ServerTls.from_flags(None, None, None) is None
    assert ServerTls.from_flags("c", "k", None) == ServerTls("c", "k")
    assert ServerTls.from_flags("c", "k", "ca") == ServerTls("c", "k", "ca")
    for flags in (("c", None, None), (None, "k", None), (None, None, "ca")):
        with pytest.raises(InvalidArgument, match="--tls-cert, --tls-key"):
            ServerTls.from_flags(*flags)


def test_target_ids_take_request_ids_then_returned_ids() -> None:
    request = pb.PowerOnRackRequest(
        target_spec=pb.OperationTargetSpec(
            racks=pb.RackTargets(
                targets=[
                    pb.RackTarget(id=pb.UUID(id="r1")),
                    pb.RackTarget(name="by-name"),
                    pb.RackTarget(id=pb.UUID(id="r2")),
                ]
            )
        )
    )
    response = pb.SubmitTaskResponse(task_ids=[pb.UUID(id="t1"), pb.UUID(id="t2")])
    assert target_ids(request, response) == ("r1", "r2", "t1", "t2")
    rack = pb.Rack(
        id=pb.UUID(id="r9"),
        nvl_domain_id=pb.UUID(id="d1"),
        components=[pb.Component(id=pb.UUID(id="c1"), rack_id=pb.UUID(id="r9"))],
    )
    assert target_ids(pb.CreateRackRequest(name="x"), rack, "r9", "s1") == ("r9", "d1", "c1", "s1")


@pytest.mark.parametrize("name", ["rackflow", "anonymous", "Rackflow", " anonymous "])
def test_a_token_may_not_take_a_name_the_audit_trail_gives_others(name: str) -> None:
    """A token named `rackflow` was accepted, and its holder's changes were recorded as rackflow's own (an
    automatic pause, an expiry); one named `anonymous` as a caller without credentials (docs/SECURITY.md,
    "Audit trail")."""
    with pytest.raises(InvalidArgument, match=r"t\.yaml\[0\]\.name: .* is reserved") as refused:
        parse_token_file(f"- {{name: '{name}', role: operator, sha256: {OPERATOR_HASH}}}", "t.yaml")
    assert OPERATOR_HASH not in str(refused.value)
    variable = "RACKFLOW_AUTH_TOKEN_" + name.strip().upper()
    with pytest.raises(InvalidArgument, match=rf"{variable}\.name: .* is reserved"):
        tokens_from_env({variable: f"operator:{OPERATOR_HASH}"})


@pytest.mark.parametrize("name", ["rackflow", "anonymous"])
def test_a_client_certificate_may_not_take_a_name_the_audit_trail_gives_others(name: str) -> None:
    """Under mutual TLS without tokens the certificate's CN is the principal: a CN `rackflow` recorded its
    holder's changes as rackflow's own."""
    with pytest.raises(Unauthenticated, match=rf"the client certificate's CN {name!r} is reserved"):
        authenticate(None, None, name)
