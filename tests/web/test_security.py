"""Safe by default: the request guard refuses a foreign Host, a cross-origin write (with or without a
token), a body that is not JSON and a body over the limit — before anything runs, with a JSON error, and
logged at WARNING like a gRPC refusal. Errors of Starlette's own (unknown path, method) are JSON too."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from rackflow.api.audit import AuditInterceptor
from rackflow.services import Services
from rackflow.store.db import Database
from rackflow.web.app import build_app
from rackflow.web.security import HttpSecurity
from tests.api.secured import OPERATOR_TOKEN, TOKENS, VIEWER_TOKEN
from tests.conftest import table_counts
from tests.web.conftest import BASE_URL, make_racks, make_schedule

API = "/api/v1"
PAUSE = f"{API}/schedules/nightly:pause"
JSON = {"Content-Type": "application/json"}
SECURITY_LOG = "rackflow.web.security"


def refused(response: httpx.Response, status: int, code: str, words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["code"], body["field"]) == (code, None), body
    assert words in body["message"], body


@pytest.fixture
async def nightly(services: Services) -> None:
    await make_racks(services, "r1")
    await make_schedule(services, "nightly", "r1")


async def unchanged(http: httpx.AsyncClient) -> None:
    """The schedule still runs and no action reached the audit trail."""
    assert (await http.get(f"{API}/schedules/nightly")).json()["enabled"] is True
    assert (await http.get(f"{API}/audit")).json()["events"] == []


# --- Host ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:8080", "127.0.0.1.nip.io"])
async def test_a_host_not_served_is_refused_for_reads_and_writes(
    http: httpx.AsyncClient, nightly: None, host: str
) -> None:
    for method, path in (("GET", f"{API}/schedules"), ("GET", "/"), ("POST", PAUSE)):
        response = await http.request(method, path, headers={"Host": host})
        refused(response, 403, "PERMISSION_DENIED", f"Host {host!r} is not a name this server")
    await unchanged(http)


@pytest.mark.parametrize(
    "host", ["127.0.0.1:8080", "localhost:8080", "[::1]:8080", "LOCALHOST", "localhost."]
)
async def test_the_loopback_names_are_served(http: httpx.AsyncClient, nightly: None, host: str) -> None:
    assert (await http.get(f"{API}/schedules", headers={"Host": host})).status_code == 200


def test_the_names_served_follow_the_listen_address_and_the_allowed_list() -> None:
    named = HttpSecurity(listen_host="10.0.0.5", allowed_hosts=("rackflow.lab",))
    assert named.host_allowed("10.0.0.5:8080") and named.host_allowed("rackflow.lab:8080")
    assert named.host_allowed("localhost")
    assert not named.host_allowed("10.0.0.6:8080") and not named.host_allowed("evil.lab")
    wildcard = HttpSecurity(listen_host="0.0.0.0")
    assert wildcard.host_allowed("10.0.0.6:8080") and wildcard.host_allowed("[fe80::1]:8080")
    assert not wildcard.host_allowed("evil.lab")
    assert HttpSecurity(allowed_hosts=("*",)).host_allowed("anything.example")


# --- cross-origin writes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://attacker.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:9999"},  # another port is another origin
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://attacker.example", "Sec-Fetch-Site": "same-origin"},
    ],
    ids=["origin", "null-origin", "other-port", "cross-site", "same-site", "origin-wins"],
)
async def test_a_cross_origin_write_is_refused_and_changes_nothing(
    http: httpx.AsyncClient, nightly: None, db: Database, headers: dict[str, str]
) -> None:
    before = await table_counts(db)
    for path in (PAUSE, f"{API}/schedules/nightly:trigger"):
        response = await http.post(path, json={}, headers=headers)
        refused(response, 403, "PERMISSION_DENIED", "cross-origin request refused")
    assert await table_counts(db) == before
    await unchanged(http)


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": BASE_URL},
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
        {},  # curl, scripts: no page behind them
    ],
    ids=["same-origin", "fetch-same-origin", "fetch-none", "no-browser"],
)
async def test_a_same_origin_write_passes(
    http: httpx.AsyncClient, nightly: None, headers: dict[str, str]
) -> None:
    response = await http.post(PAUSE, json={"reason": "PSU swap"}, headers=headers)
    assert response.status_code == 200, response.text
    assert response.json()["enabled"] is False


@pytest.fixture
def security() -> HttpSecurity:
    return HttpSecurity(allowed_origins=("https://portal.lab:8443",))


async def test_an_allowed_origin_may_write(http: httpx.AsyncClient, nightly: None) -> None:
    headers = {"Origin": "https://portal.lab:8443", "Sec-Fetch-Site": "cross-site"}
    assert (await http.post(PAUSE, json={}, headers=headers)).status_code == 200


async def test_reads_are_not_origin_checked(http: httpx.AsyncClient, nightly: None) -> None:
    """A page elsewhere cannot read the answer anyway (no CORS headers); a link or an image may GET."""
    response = await http.get(f"{API}/schedules", headers={"Origin": "http://attacker.example"})
    assert response.status_code == 200


# --- content type ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/x-www-form-urlencoded", b"reason=x"),
        ("application/x-www-form-urlencoded", b""),  # a form with no fields
        ("multipart/form-data; boundary=x", b"--x--"),
        ("text/plain", b'{"reason": "x"}'),
        ("text/plain;charset=UTF-8", b""),
        (None, b'{"reason": "x"}'),
    ],
    ids=["form", "empty-form", "multipart", "text", "empty-text", "none-with-body"],
)
async def test_a_write_that_is_not_json_is_415(
    http: httpx.AsyncClient, nightly: None, content_type: str | None, body: bytes
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    response = await http.post(PAUSE, content=body, headers=headers)
    refused(response, 415, "INVALID_ARGUMENT", "Content-Type: application/json")
    await unchanged(http)


@pytest.mark.parametrize(
    ("headers", "body"),
    [({"Content-Type": "application/json; charset=utf-8"}, b'{"reason": "x"}'), ({}, b"")],
    ids=["json-with-charset", "no-body"],
)
async def test_json_or_no_body_passes(
    http: httpx.AsyncClient, nightly: None, headers: dict[str, str], body: bytes
) -> None:
    assert (await http.post(PAUSE, content=body, headers=headers)).status_code == 200


# --- with tokens ---------------------------------------------------------------------------------


@pytest.fixture
async def secured(services: Services) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(services, AuditInterceptor(services.audit), TOKENS, services.clock, HttpSecurity())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as client:
        yield client


async def test_a_token_does_not_make_a_cross_origin_write_pass(
    secured: httpx.AsyncClient, nightly: None, db: Database
) -> None:
    before = await table_counts(db)
    token = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    response = await secured.post(PAUSE, json={}, headers={**token, "Origin": "http://attacker.example"})
    refused(response, 403, "PERMISSION_DENIED", "cross-origin request refused")
    response = await secured.post(PAUSE, content=b"{}", headers={**token, "Content-Type": "text/plain"})
    refused(response, 415, "INVALID_ARGUMENT", "Content-Type")
    assert await table_counts(db) == before


# --- body limit -----------------------------------------------------------------------------------


async def test_a_body_over_the_limit_is_413_on_its_length(
    http: httpx.AsyncClient, nightly: None, security: HttpSecurity
) -> None:
    body = b'{"reason": "' + b"x" * security.max_body_bytes + b'"}'
    response = await http.post(PAUSE, content=body, headers=JSON)
    refused(response, 413, "RESOURCE_EXHAUSTED", f"larger than the limit of {security.max_body_bytes} bytes")
    await unchanged(http)


async def test_a_streamed_body_is_refused_while_it_is_read(
    http: httpx.AsyncClient, nightly: None, security: HttpSecurity
) -> None:
    """No Content-Length (chunked): the guard counts as the body arrives and stops reading past the limit,
    so a 60 MiB body is never held whole."""
    chunk, sent = b"x" * 64 * 1024, []

    async def body() -> AsyncIterator[bytes]:
        yield b'{"reason": "'
        for i in range(960):  # 60 MiB
            sent.append(i)
            yield chunk

    response = await http.post(PAUSE, content=body(), headers=JSON)
    refused(response, 413, "RESOURCE_EXHAUSTED", "larger than the limit")
    assert len(sent) <= security.max_body_bytes // len(chunk) + 1, len(sent)
    await unchanged(http)


async def test_a_body_under_the_limit_is_read_and_judged_by_the_rpc(
    http: httpx.AsyncClient, nightly: None, security: HttpSecurity
) -> None:
    body = b'{"reason": "' + b"x" * (security.max_body_bytes - 100) + b'"}'
    response = await http.post(PAUSE, content=body, headers=JSON)
    assert response.status_code == 400 and response.json()["field"] == "reason", response.text


# --- the refusal log ------------------------------------------------------------------------------


async def test_every_refusal_is_logged_at_warning(
    secured: httpx.AsyncClient, nightly: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=SECURITY_LOG)
    viewer, operator = ({"Authorization": f"Bearer {t}"} for t in (VIEWER_TOKEN, OPERATOR_TOKEN))
    attempts = [
        (401, {}, b"", "a bearer token is required"),
        (401, {"Authorization": "Bearer nope"}, b"", "the bearer token is not valid"),
        (403, viewer, b"", "the viewer role of 'dashboard'"),
        (403, {**operator, "Origin": "http://attacker.example"}, b"", "cross-origin request refused"),
        (403, {**operator, "Host": "attacker.example"}, b"", "Host 'attacker.example'"),
        (415, {**operator, "Content-Type": "text/plain"}, b"x", "Content-Type: application/json"),
        (413, {**operator, **JSON}, b"x" * (2 * 1024 * 1024), "larger than the limit"),
    ]
    for status, headers, body, words in attempts:
        caplog.clear()
        response = await secured.post(PAUSE, content=body, headers=headers)
        assert response.status_code == status, response.text
        (record,) = [r for r in caplog.records if r.name == SECURITY_LOG]
        assert record.levelno == logging.WARNING
        line = record.getMessage()
        assert line.startswith(f"refused POST {PAUSE} from 127.0.0.1:") and f": {status} " in line, line
        assert words in line, line
        for token in (VIEWER_TOKEN, OPERATOR_TOKEN):
            assert token not in line


async def test_a_success_is_not_logged(
    http: httpx.AsyncClient, nightly: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=SECURITY_LOG)
    assert (await http.post(PAUSE, json={})).status_code == 200
    assert [r for r in caplog.records if r.name == SECURITY_LOG] == []


# --- Starlette's own errors -----------------------------------------------------------------------


@pytest.mark.parametrize("path", [f"{API}/nope", "/nope", f"{API}/schedules/a/b/c", "/static/nope.js"])
async def test_an_unknown_path_is_a_json_404(http: httpx.AsyncClient, path: str) -> None:
    response = await http.get(path)
    refused(response, 404, "NOT_FOUND", f"no such path: {path}")


async def test_a_method_the_path_does_not_take_is_a_json_405(http: httpx.AsyncClient, nightly: None) -> None:
    response = await http.put(f"{API}/schedules/nightly:pause", json={})
    refused(response, 405, "UNIMPLEMENTED", "PUT is not allowed on /api/v1/schedules/nightly:pause")
    assert response.headers["allow"] == "POST"
    await unchanged(http)
