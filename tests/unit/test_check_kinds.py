"""The pure parts of the pre-flight checks: matcher templates, how an alert is named, the webhook
signature, and which checks apply to a task's rack and operation."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import http.server
import logging
import threading
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from rackflow.checks import kinds
from rackflow.checks.kinds import (
    BUSY_RETRY,
    Answers,
    Asked,
    alert_text,
    alertmanager,
    alertmanager_url,
    alerts_url,
    asked_urls,
    fleet_query,
    render,
    scrubbed,
    signature,
    webhook,
)
from rackflow.config import ALERTMANAGER_CONCURRENCY, ALERTMANAGER_TIMEOUT, PREFLIGHT_CONCURRENCY
from rackflow.domain.checks import (
    AlertmanagerSettings,
    PreflightCheck,
    RackFacts,
    RackIdleSettings,
    WebhookSettings,
    shown_url,
)
from rackflow.domain.tasks import OperationKind
from rackflow.domain.windows import RackRef
from rackflow.retry import Retry
from tests.checks_support import busy_alertmanager, serving

RACK = RackFacts(uuid.UUID(int=7), "rack-01", "SN-1001", uuid.UUID(int=9), "nvl-a")
NOW = datetime(2026, 12, 2, tzinfo=UTC)


def test_matchers_are_templated_with_the_rack_only() -> None:
    assert render('rack="{rack.name}"', RACK) == 'rack="rack-01"'
    assert render("serial={rack.external_id},id={rack.id}", RACK) == f"serial=SN-1001,id={RACK.id}"
    assert render('domain=~"{rack.domain}|none"', RACK) == 'domain=~"nvl-a|none"'
    assert render('pdu=~"p[0-9]{2}"', RACK) == 'pdu=~"p[0-9]{2}"'  # a regex's braces stay
    assert render("{rack.__class__}", RACK) == "{rack.__class__}"


def test_an_alert_is_named_with_its_sorted_labels() -> None:
    alert = {"labels": {"severity": "critical", "alertname": "RackOverheat", "rack": 'r"1'}}
    assert alert_text(alert) == 'RackOverheat{rack="r\\"1",severity="critical"}'
    assert alert_text({"labels": {}}) == "alert{}"


def test_the_signature_is_the_hmac_sha256_of_the_timestamp_and_the_body() -> None:
    body = b'{"ok": true}'
    expected = hmac.new(b"k", b"1764900000." + body, hashlib.sha256).hexdigest()
    assert signature("k", "1764900000", body) == "sha256=" + expected


def _check(
    operations: frozenset[OperationKind], racks: tuple[uuid.UUID, ...], domains: tuple[uuid.UUID, ...]
) -> PreflightCheck:
    return PreflightCheck(
        id=uuid.uuid4(),
        name="c",
        operations=operations,
        all_racks=not racks and not domains,
        racks=tuple((i, str(i)) for i in racks),
        domains=tuple((i, str(i)) for i in domains),
        settings=RackIdleSettings(frozenset(), "1h"),
        interval="30s",
        max_wait="1h",
        created_at=NOW,
        updated_at=NOW,
    )


def test_a_check_applies_by_operation_rack_and_domain() -> None:
    fw = OperationKind.UPGRADE_FIRMWARE
    in_domain, alone = RackRef(uuid.uuid4(), uuid.UUID(int=9)), RackRef(uuid.uuid4(), None)
    everywhere = _check(frozenset(), (), ())
    assert everywhere.applies(alone, OperationKind.POWER_ON) and everywhere.kind.value == "rack_idle"
    firmware_only = _check(frozenset({fw}), (), ())
    assert firmware_only.applies(alone, fw) and not firmware_only.applies(alone, OperationKind.POWER_ON)
    by_domain = _check(frozenset(), (), (uuid.UUID(int=9),))
    assert by_domain.applies(in_domain, fw) and not by_domain.applies(alone, fw)
    by_rack = _check(frozenset(), (alone.rack_id,), ())
    assert by_rack.applies(alone, fw) and not by_rack.applies(in_domain, fw)
    assert (
        everywhere.interval_delta.total_seconds() == 30 and everywhere.max_wait_delta.total_seconds() == 3600
    )


async def test_a_hook_that_redirects_holds_the_task_and_is_not_followed() -> None:
    """urllib followed a 301 to the hook's POST with a GET without the body: a page there answering
    `{"ok": true}` (a status page, the drain service's own summary) passed the check though no hook was
    ever told of the task. A redirect now holds the task, saying so."""
    gets: list[str] = []

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            gets.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "12")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *_args: object) -> None:
            pass

    with serving(Ready) as target:

        class Moved(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(301)
                self.send_header("Location", f"{target}/drain/")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        with serving(Moved) as url, ThreadPoolExecutor(1) as pool:
            look = await webhook(WebhookSettings(f"{url}/drain", "", "5s"), {"check": "drained"}, Asked(pool))
    assert gets == []
    assert not look.passed
    assert (
        look.reason == f"webhook: {url}/drain: HTTP 301: a redirect, not followed (set the URL to its target)"
    )


def test_a_url_is_shown_with_its_query_values_and_fragment_hidden() -> None:
    """One rule for every place that shows a check's URL: the keys and the path tell which endpoint it
    is; a value, a bare item (`?abc123`), the fragment, a user and password could be a token."""
    assert shown_url("https://hooks.example/drain?token=abc123") == "https://hooks.example/drain?token=…"
    assert shown_url("http://u:pw@h:8080/x?a=1&b=&c#frag") == "http://h:8080/x?a=…&b=&…#…"
    assert shown_url("http://[::1]:9093/") == "http://[::1]:9093/"
    assert shown_url("http://[::1") == "(not a valid URL)"
    assert alerts_url("http://am/prefix/?token=t", "active=true") == (
        "http://am/prefix/api/v2/alerts?token=t&active=true"
    )
    error = "unknown url type: 'htp://h/?token=t'"
    assert scrubbed(error, "htp://h/?token=t", "") == "unknown url type: 'htp://h/?token=…'"


def test_a_rendered_value_is_escaped_for_its_place_in_the_matcher() -> None:
    """A rack name may hold `"` and `\\` (only control characters are refused): inside a value they are
    escaped as Alertmanager unescapes them, and in a regex's value every regex metacharacter is escaped
    too (Go's `regexp.QuoteMeta`), since a name is a literal: `rack.1` must not match `rackX1`."""
    rack = RackFacts(uuid.UUID(int=7), 'r"1\\b', "SN.1*", uuid.UUID(int=9), "a|b")
    assert render('rack="{rack.name}"', rack) == 'rack="r\\"1\\\\b"'
    assert render("serial!={rack.external_id}", rack) == "serial!=SN.1*"
    assert render('serial=~"{rack.external_id}"', rack) == 'serial=~"SN\\\\.1\\\\*"'
    assert render('domain!~"{rack.domain}|none"', rack) == 'domain!~"a\\\\|b|none"'
    assert render('rack=~"{rack.name}"', rack) == 'rack=~"r\\"1\\\\\\\\b"'
    assert render('{rack.domain}="x"', rack) == 'a|b="x"'  # a label name is not a value: left as it is


def test_a_name_that_holds_a_placeholder_is_filled_in_as_it_is() -> None:
    """The placeholders were filled in one after another, so a name filled in earlier that held a later
    one's text was filled in again: a rack named `r{rack.domain}` asked `rack="rnvl-a"`, another rack's
    alerts, and not its own. Each is filled in once, in one pass over the matcher."""
    rack = RackFacts(uuid.UUID(int=7), "r{rack.domain}", "{rack.name}", None, "nvl-a")
    assert render('rack="{rack.name}"', rack) == 'rack="r{rack.domain}"'
    assert render('serial="{rack.external_id}"', rack) == 'serial="{rack.name}"'
    assert render('rack=~"{rack.name}|{rack.domain}"', rack) == 'rack=~"r\\\\{rack\\\\.domain\\\\}|nvl-a"'
    assert render('{rack.name}="x"', rack) == 'r{rack.domain}="x"'


def test_only_plain_equality_matchers_filled_in_with_a_rack_are_applied_to_the_fleet_answer() -> None:
    """A check's matchers without a placeholder are sent once for every rack; those with one are applied
    to that answer only when every Alertmanager reads them alike once filled in: a plain label, `=` or
    `!=`, a quoted value without escapes, not empty. Any other makes the look send its rack's own query."""
    settings = AlertmanagerSettings(
        "http://am", ('rack="{rack.name}"', 'severity=~"critical"', 'serial!="{rack.external_id}"'), True
    )
    fleet = fleet_query(settings, RACK)
    assert fleet is not None
    assert urllib.parse.parse_qs(urllib.parse.urlsplit(fleet.url).query)["filter"] == ['severity=~"critical"']
    assert fleet.matchers == (("rack", True, "rack-01"), ("serial", False, "SN-1001"))
    alert = {"labels": {"rack": "rack-01", "serial": "SN-2"}}
    assert fleet.matches(alert) and fleet.matches({"labels": {"rack": "rack-01"}})  # no serial: "" != SN
    assert not fleet.matches({"labels": {"rack": "rack-01", "serial": "SN-1001"}})
    assert not fleet.matches({"labels": {"rack": "rack-02"}}) and not fleet.matches({})
    odd = RackFacts(uuid.UUID(int=7), 'r"1', "", None, "a\\b")
    for matcher, rack in [
        ('rack=~"{rack.name}"', RACK),  # a regex: RE2's to read
        ('rack!~"{rack.name}"', RACK),
        ('rack="{rack.name}"', odd),  # an escaped quote
        ('domain="{rack.domain}"', odd),  # an escaped backslash
        ('serial="{rack.external_id}"', odd),  # empty: a missing label and "" are told apart
        ("rack={rack.name}", RACK),  # unquoted
        ('rack = "{rack.name}"', RACK),  # spaced
        ('rack="{rack.name}",x="y"', RACK),
    ]:
        assert fleet_query(AlertmanagerSettings("http://am", (matcher,), True), rack) is None, matcher
    assert fleet_query(AlertmanagerSettings("http://am", ('severity="critical"',), True), RACK) is None


def test_an_alertmanager_look_s_asked_url_is_hidden_in_an_error_s_words() -> None:
    """Alertmanager is asked its alerts under the check's URL, the token before the API's query: an error
    quoting that URL is scrubbed of the token too, not only one quoting the check's URL as stored."""
    settings = AlertmanagerSettings("http://am.example/p?token=abc123", ('rack="{rack.name}"',), True)
    asked = alertmanager_url(settings, RACK)
    assert asked.startswith("http://am.example/p/api/v2/alerts?token=abc123&active=true")
    fleet = fleet_query(settings, RACK)
    assert fleet is not None and fleet.url.startswith("http://am.example/p/api/v2/alerts?token=abc123&")
    assert asked_urls(settings, RACK) == (settings.url, asked, fleet.url)
    assert "abc123" not in scrubbed(
        f"ValueError: bad {asked}; from {settings.url}", *asked_urls(settings, RACK)
    )
    assert asked_urls(RackIdleSettings(frozenset(), ""), RACK) == ()


async def test_an_alertmanager_answer_that_is_not_a_list_of_alerts_cannot_be_asked() -> None:
    """A list whose items are not alerts (a proxy's or a broken Alertmanager's answer) failed the look with
    an IndexError or a ValueError of `dict()`, logged as a bug with its traceback, and held the task whatever
    `fail_closed` said. It is an Alertmanager that cannot be asked now, as an answer that is not a list is."""
    answers = [b"[1]", b'[{"labels": "x"}]', b'[{"labels": {"rack": "rack-01"}}, "x"]', b"{}"]

    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers[int(self.path.split("/")[1])]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    with serving(Garbage) as url, ThreadPoolExecutor(1) as pool:
        for index in range(len(answers)):
            for fail_closed in (True, False):
                settings = AlertmanagerSettings(f"{url}/{index}", ('rack="{rack.name}"',), fail_closed)
                look = await alertmanager(settings, RACK, Answers(Asked(pool)))
                assert look.passed is not fail_closed, (answers[index], look)
                assert look.reason.startswith(
                    f"alertmanager: cannot ask {url}/{index}: the answer is not a list of alerts"
                ), (answers[index], look)


def _refusing(refusals: list[int], asked: list[str]) -> type[http.server.BaseHTTPRequestHandler]:
    """An Alertmanager that answers each GET with the next status of `refusals` (taken), then, once they are
    all taken, with one alert firing on rack-01; each path it is asked appended to `asked`."""

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            status = refusals.pop(0) if refusals else 200
            body = b'[{"labels": {"alertname": "Hot", "rack": "rack-01"}}]' if status == 200 else b"busy\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    return Refusing


async def test_an_alertmanager_that_refuses_a_get_as_busy_is_asked_again_within_the_round() -> None:
    """Alertmanager refuses GETs past its `--web.get-concurrency` with 503 (a proxy in front of it may say
    429): the look is asked again after a short wait, and answered, where it was "cannot ask …: HTTP 503",
    a `fail_closed` check's hold for no alert and a fail-open check's pass unasked."""
    for refusals in ([503], [503, 429, 503], [429]):
        asked: list[str] = []
        with serving(_refusing(list(refusals), asked)) as url, ThreadPoolExecutor(1) as pool:
            settings = AlertmanagerSettings(url, ('rack=~"{rack.name}"',), False)
            look = await alertmanager(settings, RACK, Answers(Asked(pool)))
        assert (look.passed, look.reason) == (False, 'alertmanager: alert Hot{rack="rack-01"} firing'), (
            refusals
        )
        assert len(asked) == len(refusals) + 1


async def test_an_alertmanager_still_refusing_within_its_timeout_cannot_be_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused again and again, the look gives up once its next wait would end past the look's timeout
    (ALERTMANAGER_TIMEOUT, made short here), and then cannot ask, as `fail_closed` says; any other failing
    status (500) is not asked again."""
    assert BUSY_RETRY.deadline == ALERTMANAGER_TIMEOUT.total_seconds()
    # A deadline of 1 s: at 0.5 s, a first GET slower than 0.45 s on a loaded machine was never asked again.
    monkeypatch.setattr(kinds, "BUSY_RETRY", Retry(0.05, 0.1, deadline=1.0))
    for status, fail_closed in ((503, True), (503, False), (429, True), (500, False)):
        asked: list[str] = []
        with serving(_refusing([status] * 100, asked)) as url, ThreadPoolExecutor(1) as pool:
            settings = AlertmanagerSettings(url, ('rack=~"{rack.name}"',), fail_closed)
            look = await alertmanager(settings, RACK, Answers(Asked(pool)))
        assert look.passed is not fail_closed
        assert look.reason.startswith(f"alertmanager: cannot ask {url}: HTTP {status}"), look
        if status == 500:
            assert len(asked) == 1
        else:
            # Asked again, but no more than waits of 0.05, 0.1, 0.1, … s fit in 1 s: at most 11 GETs.
            assert 2 <= len(asked) <= 11, asked


async def test_a_busy_alertmanager_s_retries_are_debug_lines_and_the_poll_says_them_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each GET asked again after a 503 was a WARNING: 4,751 lines for two rounds against a busy
    Alertmanager. Each is now a DEBUG line, and the poll's answers say once, at WARNING, which Alertmanager
    was busy, how many of its queries were asked again, how often, and how many it still refused."""
    # Counted in tries, not a deadline: on a loaded machine a first GET slower than the deadline was never
    # asked again (`test_a_poll_against_a_busy_alertmanager_logs_one_warning_not_one_per_retry`).
    monkeypatch.setattr(kinds, "BUSY_RETRY", Retry(0.01, 0.02, attempts=6))
    caplog.set_level(logging.DEBUG)
    racks = [RackFacts(uuid.UUID(int=i), f"rack-0{i}", "", None, "") for i in range(1, 5)]
    with busy_alertmanager(2, always_refused="rack-03") as url, ThreadPoolExecutor(2) as pool:
        answers = Answers(Asked(pool))
        settings = AlertmanagerSettings(url, ('rack=~"{rack.name}"',), True)
        looks = await asyncio.gather(*(alertmanager(settings, rack, answers) for rack in racks))
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []  # none a retry
        answers.say_busy()
    assert [look.passed for look in looks] == [True, True, False, True]
    retries = [r for r in caplog.records if "again in" in r.getMessage()]
    assert {r.levelno for r in retries} == {logging.DEBUG}
    assert len(retries) == 3 * 2 + 5  # two for each rack answered, and five for rack-03 (six tries)
    (summary,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert summary.getMessage() == (
        f"pre-flight checks: Alertmanager {url} refused GETs as busy (HTTP 503 or 429): 4 queries asked "
        f"again, {len(retries)} times in all; 1 still failed"
    )
    caplog.clear()
    answers.say_busy()  # said once
    Answers(Asked(pool)).say_busy()  # a poll whose Alertmanagers were not busy says nothing
    assert caplog.records == []


async def test_webhooks_are_asked_as_many_at_once_as_the_pool_has_threads() -> None:
    """The cap of GETs to one Alertmanager is Alertmanager's alone: 20 looks at a hook that keeps each POST
    0.3 s have PREFLIGHT_CONCURRENCY in flight at once, not ALERTMANAGER_CONCURRENCY."""
    lock = threading.Lock()
    flight = [0, 0]  # in flight now, most at once

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                flight[0] += 1
                flight[1] = max(flight[1], flight[0])
            time.sleep(0.3)
            with lock:
                flight[0] -= 1
            self.send_response(200)
            self.send_header("Content-Length", "12")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *_args: object) -> None:
            pass

    with serving(Slow) as url, ThreadPoolExecutor(PREFLIGHT_CONCURRENCY) as pool:
        asked = Asked(pool)
        looks = await asyncio.gather(
            *(webhook(WebhookSettings(url, "", "5s"), {"check": "drained"}, asked) for _ in range(20))
        )
    assert [look.reason for look in looks] == ["webhook: ok"] * 20
    assert flight[1] == PREFLIGHT_CONCURRENCY > ALERTMANAGER_CONCURRENCY
