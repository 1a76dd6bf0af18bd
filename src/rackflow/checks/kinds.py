"""One look of each kind of check at one task's rack: what the checker runs, outside any transaction.

HTTP goes through the standard library (`urllib`) in the checker's own thread pool, so a slow
Alertmanager or hook never waits on the event loop, and each request has its timeout. Every answer that
is not a clear yes is a `Look` that holds the task with why (an Alertmanager that cannot be asked passes
only when its check is not `fail_closed`).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from rackflow.config import ALERTMANAGER_CONCURRENCY, ALERTMANAGER_TIMEOUT
from rackflow.domain.checks import (
    AlertmanagerSettings,
    Look,
    OnRack,
    RackFacts,
    RackIdleSettings,
    Settings,
    WebhookSettings,
    duration_of,
    shown_url,
)
from rackflow.domain.inventory import Component
from rackflow.domain.tasks import Task, TaskStatus
from rackflow.http_answers import NO_REDIRECTS, not_followed, read_within
from rackflow.notify.senders import ALERT_NAMES, sign
from rackflow.retry import Retry, retrying
from rackflow.tasks.backends.redfish.endpoint import CredentialsUnavailable, read_reference
from rackflow.timespec import parse_go_duration

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Rackflow-Signature"
TIMESTAMP_HEADER = "X-Rackflow-Timestamp"
# How much of an answer is read: a hook's verdict is small; Alertmanager's list of a rack's alerts is
# refused past this rather than read without end.
HOOK_ANSWER_BYTES = 64 * 1024
ALERTS_BYTES = 8 * 1024 * 1024
# A GET Alertmanager refuses as busy (503: past its `--web.get-concurrency`; 429 from a proxy in front of it)
# is asked again within the round after 0.1 s, doubling to 2 s, until the next wait would end past the
# look's timeout: then the look cannot ask, as for any failure. A refusal taken as the answer held a
# `fail_closed` check's task for no alert and let a fail-open check's through unasked.
BUSY_RETRY = Retry(0.1, 2.0, deadline=ALERTMANAGER_TIMEOUT.total_seconds())
BUSY = (429, 503)
_T = TypeVar("_T")


# A matcher's label side and operator, as Alertmanager reads them (`validation._MATCHER`), split from the
# template before it is filled in: what follows the operator is the value, where filled-in text is escaped.
_OPERATOR = re.compile(r"([^=!~]*?)(=~|!=|!~|=)(.*)", re.DOTALL)
# Go's `regexp.QuoteMeta`: the characters Alertmanager's RE2 reads as other than themselves.
_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


# What a matcher may be templated with, and what looks like a placeholder: braces around a word starting
# with `rack` (a regex's `{2}` or `{2,3}` is not one).
PLACEHOLDERS = ("{rack.name}", "{rack.id}", "{rack.external_id}", "{rack.domain}")
_PLACEHOLDER_LIKE = re.compile(r"\{\s*rack\b[^{}]*\}")
_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS))


def unknown_placeholder(matcher: str) -> str | None:
    """The first placeholder in `matcher` that `render` does not fill in (`{rack.nam}`, `{rack.serial}`),
    or None. Kept as text, it made a matcher no alert matches, so the check let every rack through."""
    return next((p for p in _PLACEHOLDER_LIKE.findall(matcher) if p not in PLACEHOLDERS), None)


def render(matcher: str, rack: RackFacts) -> str:
    r"""`matcher` with `{rack.name}`, `{rack.id}`, `{rack.external_id}` and `{rack.domain}` filled in (only
    these: a matcher's own braces, a regex's `{2}`, stay as they are).

    A name may hold `"` and `\` (validation refuses only control characters), so text filled into the
    matcher's value is escaped as Alertmanager unescapes a value (`\"`, `\\`, quoted or not): unescaped,
    the matcher did not parse, Alertmanager refused every ask, and a fail-open check let the rack through.
    Into a regex's value (`=~`, `!~`) it goes as a literal, its metacharacters escaped first (Go's
    `regexp.QuoteMeta`): unescaped, `rack=~"{rack.name}"` for `rack.1` matched `rackX1` too. Text filled
    into the label name is left as it is: a label name has no escapes."""
    found = _OPERATOR.fullmatch(matcher)
    label, operator, value = found.groups() if found else (matcher, "", "")
    fills = dict(zip(PLACEHOLDERS, (rack.name, str(rack.id), rack.external_id, rack.domain), strict=True))

    def in_value(placeholder: re.Match[str]) -> str:
        filled = fills[placeholder.group()]
        literal = _REGEX_META.sub(r"\\\1", filled) if operator in ("=~", "!~") else filled
        return literal.replace("\\", "\\\\").replace('"', '\\"')

    # One pass each: a filled-in name that holds a placeholder's text is not filled in again.
    label = _PLACEHOLDER.sub(lambda placeholder: fills[placeholder.group()], label)
    return label + operator + _PLACEHOLDER.sub(in_value, value)


def alert_text(alert: dict[str, Any]) -> str:
    """`RackOverheat{rack="r1",severity="critical"}`: the alert's name and its other labels, sorted."""
    labels = dict(alert.get("labels") or {})
    name = labels.pop("alertname", "alert")
    inner = ",".join(f"{key}={json.dumps(str(value))}" for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The value of `SIGNATURE_HEADER`: `sha256=` and the HMAC-SHA256 of `<timestamp>.<body>`, in hex, as
    a notification webhook is signed (`notify.senders.sign`, one rule): the timestamp signed with the body
    lets a hook refuse a captured request sent again later, which a signature of the body alone did not."""
    return "sha256=" + sign(secret, timestamp, body)


@dataclass(frozen=True)
class Asked:
    """The thread pool a look's blocking HTTP runs in (the checker's, of PREFLIGHT_CONCURRENCY threads), and
    how many GETs are in flight to each Alertmanager: at most ALERTMANAGER_CONCURRENCY, shared by every
    check and poll of the checker that asks it (`at`)."""

    pool: Executor
    _alertmanagers: dict[str, asyncio.Semaphore] = field(default_factory=dict, repr=False, compare=False)

    async def run(self, call: Callable[[], _T]) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, call)

    async def at(self, url: str, call: Callable[[], _T]) -> _T:
        """`run(call)`, a GET of `url` from Alertmanager, once fewer than ALERTMANAGER_CONCURRENCY GETs are in
        flight to that Alertmanager (its scheme, host and port): asked as many at once as the pool's
        threads, it refused about 4 in 10 past its own limit, 8 at its default (docs/PERFORMANCE.md)."""
        where = alertmanager_of(url)
        limit = self._alertmanagers.get(where)
        if limit is None:
            limit = self._alertmanagers[where] = asyncio.Semaphore(ALERTMANAGER_CONCURRENCY)
        async with limit:
            return await self.run(call)


_PORTS = {"http": 80, "https": 443}


def alertmanager_of(url: str) -> str:
    """The Alertmanager `url` asks, as `scheme://host:port` (no user, password, path or query: it names the
    server in a log line, and keys what is counted per server)."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{parts.port or _PORTS.get(parts.scheme)}"


@dataclass
class _Busy:
    """What one Alertmanager's refusals as busy came to in a poll: its queries asked again, the GETs asked
    again in all, and the queries that still failed after them (refused again, or another failure)."""

    queries: int = 0
    retries: int = 0
    failed: int = 0


def about_the_task(alert: Any, task_id: uuid.UUID) -> bool:
    """Whether `alert` is one rackflow sent about this very task (`RackflowTaskHeldTooLong`, labelled with
    the task's id and its rack, NOTIFICATIONS.md): it reports the hold, so it is no reason for it. Counted,
    it held the task until the check's maximum wait failed it, since it ends only when the hold does."""
    labels = alert.get("labels") if isinstance(alert, dict) else None
    return (
        isinstance(labels, dict)
        and labels.get("task") == str(task_id)
        and labels.get("alertname") in ALERT_NAMES.values()
    )


class Answers:
    """Alertmanager's answers for the rounds one poll of the checker took: one GET per URL, its answer or its
    failure shared by every look that asks that URL meanwhile. A look asks its check's `fleet_query` (one
    for every rack) where the check has one, else its own query (the matchers filled in with its rack,
    which the tasks on one rack share), so a poll costs Alertmanager about one query per check, not one per
    held task. Each look still reads the answer for its own rack and task (`about_the_task`)."""

    def __init__(self, asked: Asked) -> None:
        self.asked = asked
        self._asking: dict[str, asyncio.Future[list[dict[str, Any]]]] = {}
        # A fleet answer's alerts by the value of one label (url, label): each rack's look reads its own.
        self._by_label: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
        self._busy: dict[str, _Busy] = {}  # by Alertmanager (`alertmanager_of`), until `say_busy`

    async def alerts(self, url: str) -> list[dict[str, Any]]:
        """The alerts Alertmanager answers `url` with (asked once), or the failure to ask it, raised."""
        asking = self._asking.get(url)
        if asking is None:
            asking = self._asking[url] = asyncio.ensure_future(self._ask(url))
            # Read once it is done, should every look that asked it be cancelled (the checker stopping).
            asking.add_done_callback(lambda done: done.cancelled() or done.exception())
        # Shielded: a look cancelled does not cancel the query the other looks wait for.
        return await asyncio.shield(asking)

    async def _ask(self, url: str) -> list[dict[str, Any]]:
        """GET `url` (`Asked.at`), again while Alertmanager refuses it as busy (BUSY_RETRY), each wait
        outside its limit of GETs in flight. Each retry is a DEBUG line, and counted for `say_busy`: as a
        WARNING each, a busy Alertmanager's refusals made thousands of lines a poll."""
        tries = 0

        async def ask() -> list[dict[str, Any]]:
            nonlocal tries
            tries += 1
            return await self.asked.at(url, lambda: _alerts(url))

        failed = True
        try:
            alerts = await retrying(
                ask,
                BUSY_RETRY,
                what=f"alertmanager query {shown_url(url)}",
                retry_if=lambda exc: isinstance(exc, urllib.error.HTTPError) and exc.code in BUSY,
                explain=lambda exc: _error(exc, url),
                logger=log,
                level=logging.DEBUG,
            )
            failed = False
            return alerts
        finally:
            if tries > 1:
                busy = self._busy.setdefault(alertmanager_of(url), _Busy())
                busy.queries += 1
                busy.retries += tries - 1
                busy.failed += failed

    def say_busy(self) -> None:
        """One WARNING for the poll, once its rounds are over, for the Alertmanagers that refused its GETs
        as busy: which, how many queries were asked again and how often, and how many still failed (their
        looks could not ask, as `fail_closed` says). Nothing when none was busy; said once."""
        if not self._busy:
            return
        log.warning(
            "pre-flight checks: %s",
            "; ".join(
                f"Alertmanager {where} refused GETs as busy (HTTP 503 or 429): {busy.queries} "
                f"{'query' if busy.queries == 1 else 'queries'} asked again, {busy.retries} times in all; "
                f"{busy.failed} still failed"
                for where, busy in sorted(self._busy.items())
            ),
        )
        self._busy.clear()

    async def matching(self, fleet: FleetQuery) -> list[dict[str, Any]]:
        """The alerts of `fleet`'s answer that its rack's matchers match, in the answer's order: those
        whose label of its first `=` matcher has the value (indexed once a poll: with thousands of racks,
        filtering the whole answer for each was the checker's own cost), then all its matchers."""
        alerts = await self.alerts(fleet.url)
        equal = next(((name, value) for name, equal, value in fleet.matchers if equal), None)
        if equal is None:
            return [alert for alert in alerts if fleet.matches(alert)]
        index = self._by_label.get((fleet.url, equal[0]))
        if index is None:
            index = self._by_label[(fleet.url, equal[0])] = _by_label(alerts, equal[0])
        return [alert for alert in index.get(equal[1], ()) if fleet.matches(alert)]


def _by_label(alerts: list[dict[str, Any]], name: str) -> dict[str, list[dict[str, Any]]]:
    """`alerts` by the value of their label `name`, each value's in their order (those without it, or
    with a value that is not text, in none: no `=` matcher's value matches them)."""
    index: dict[str, list[dict[str, Any]]] = {}
    for alert in alerts:
        value = (alert.get("labels") or {}).get(name)
        if isinstance(value, str):
            index.setdefault(value, []).append(alert)
    return index


class TooLong(ValueError):
    """Alertmanager's answer is longer than ALERTS_BYTES."""


def _alerts(url: str) -> list[dict[str, Any]]:
    """GET `url` (Alertmanager's alerts, `alertmanager_url`): the list of alerts it answered, within
    ALERTMANAGER_TIMEOUT and ALERTS_BYTES; a ValueError if the answer is longer (TooLong) or not such a
    list."""
    timeout = ALERTMANAGER_TIMEOUT.total_seconds()
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        raw = read_within(answer, time.monotonic() + timeout, ALERTS_BYTES + 1)
    if len(raw) > ALERTS_BYTES:
        raise TooLong(f"the answer is longer than {ALERTS_BYTES} bytes")
    alerts = json.loads(raw)
    if not _a_list_of_alerts(alerts):
        raise ValueError("the answer is not a list of alerts")
    return cast(list[dict[str, Any]], alerts)


async def alertmanager(
    settings: AlertmanagerSettings, rack: RackFacts, answers: Answers, *, task_id: uuid.UUID | None = None
) -> Look:
    """Hold while an alert matching the matchers fires, but not one of rackflow's own about the task
    `task_id` being asked about (`about_the_task`). Alertmanager is asked through `answers`: once for all
    the looks of a poll that ask it the same."""
    url = alertmanager_url(settings, rack)
    fleet = fleet_query(settings, rack)
    try:
        found = await _matching(answers, url, fleet)
        alerts = [a for a in found if task_id is None or not about_the_task(a, task_id)]
    except (OSError, ValueError, http.client.HTTPException) as exc:
        urls = (url, fleet.url) if fleet else (url,)
        problem = f"alertmanager: cannot ask {settings.shown_url}: {_error(exc, *urls, settings.url)}"
        if settings.fail_closed:
            return Look(False, problem)
        return Look(True, f"{problem} (fail_closed is off)", unanswered=True)
    if not alerts:
        return Look(True, "alertmanager: no matching alert")
    named = [alert_text(a) for a in alerts]
    more = f" and {len(named) - 1} more" if len(named) > 1 else ""
    return Look(False, f"alertmanager: alert {named[0]} firing{more}")


async def _matching(answers: Answers, url: str, fleet: FleetQuery | None) -> list[dict[str, Any]]:
    """The alerts Alertmanager answers `url` with: those of the check's `fleet` answer that its rack's
    matchers match, where there is one (the same alerts in the same order: Alertmanager sorts an answer by
    fingerprint), unless that answer is longer than ALERTS_BYTES, when `url` is asked, as it was: a rack's
    own answer may be short enough."""
    if fleet is not None:
        try:
            return await answers.matching(fleet)
        except TooLong:
            pass
    return await answers.alerts(url)


def _a_list_of_alerts(answer: Any) -> bool:
    """Whether Alertmanager's answer is a list of alerts: objects whose labels, if any, are an object. Any
    other answer (a proxy's, a broken server's) is one that cannot be asked, as `fail_closed` says: it
    failed the look with an IndexError or a ValueError, logged as a bug, whatever `fail_closed` said."""
    return isinstance(answer, list) and all(
        isinstance(alert, dict) and isinstance(alert.get("labels") or {}, dict) for alert in answer
    )


def alertmanager_url(settings: AlertmanagerSettings, rack: RackFacts) -> str:
    """What `alertmanager` asks about `rack` alone: the active, unsilenced, uninhibited alerts matching the
    check's matchers filled in with the rack."""
    return _alerts_query(settings.url, [render(m, rack) for m in settings.matchers])


def _alerts_query(base: str, filters: Sequence[str]) -> str:
    query = urllib.parse.urlencode(
        [("active", "true"), ("silenced", "false"), ("inhibited", "false")] + [("filter", f) for f in filters]
    )
    return alerts_url(base, query)


# A matcher filled in with a rack that every Alertmanager reads alike (the classic parser of 0.25 and the
# UTF-8 one of 0.27 on): a plain label name, `=` or `!=`, and a value in quotes without a backslash, a quote
# or a control character, which is then the value as written, and not empty (Alertmanager's filter treats
# an empty value and a missing label apart). Such a matcher is applied here, to the answer to the check's
# other matchers (`fleet_query`): an alert's label equal to the value or not, a missing label read as "",
# as Alertmanager's filter reads it. Any other is sent: a regex (`=~`, `!~`) above all, since Python's `re`
# is not Go's RE2, and a value with escapes, which Alertmanager's versions unescape differently.
_PLAIN = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)(!=|=)"([^"\\\x00-\x1f\x7f]+)"')


@dataclass(frozen=True)
class FleetQuery:
    """One query for every rack of a check (`fleet_query`), and what of its answer is one rack's."""

    url: str
    matchers: tuple[tuple[str, bool, str], ...]  # the rack's plain matchers: label, `=` (or `!=`), value

    def matches(self, alert: dict[str, Any]) -> bool:
        labels = alert.get("labels") or {}
        return all((labels.get(name, "") == value) is equal for name, equal, value in self.matchers)


def fleet_query(settings: AlertmanagerSettings, rack: RackFacts) -> FleetQuery | None:
    """The query that asks Alertmanager about every rack at once for this check (its matchers without a
    placeholder) and `rack`'s matchers (those with one, filled in) to apply to the answer; None when the
    check's matchers have no placeholder (its one query is every rack's already) or one filled in is not
    plain (`_PLAIN`): that look sends its rack's own query (`alertmanager_url`), as every look did."""
    sent: list[str] = []
    applied: list[tuple[str, bool, str]] = []
    for matcher in settings.matchers:
        if not _PLACEHOLDER.search(matcher):
            sent.append(matcher)
            continue
        plain = _PLAIN.fullmatch(render(matcher, rack))
        if plain is None:
            return None
        name, operator, value = plain.groups()
        applied.append((name, operator == "=", value))
    if not applied:
        return None
    return FleetQuery(_alerts_query(settings.url, sent), tuple(applied))


def asked_urls(settings: Settings, rack: RackFacts) -> tuple[str, ...]:
    """The URLs a look of `settings` at `rack` asks (the check's own, and Alertmanager's queries under it:
    the rack's own and the check's `fleet_query`), which an error's words may quote: what `scrubbed` hides
    in them. Called on a look's failure, which may be the making of those queries: then only the check's
    URL, rather than a second failure."""
    if isinstance(settings, AlertmanagerSettings):
        try:
            fleet = fleet_query(settings, rack)
            return settings.url, alertmanager_url(settings, rack), *((fleet.url,) if fleet else ())
        except Exception:
            return (settings.url,)
    if isinstance(settings, WebhookSettings):
        return (settings.url,)
    return ()


def rack_idle(
    settings: RackIdleSettings, running: Sequence[OnRack], last: Task | None, now: datetime
) -> Look:
    """`rack_idle` on what the database says: `running`, the other tasks RUNNING on the rack (of any
    operation); `last`, the rack's last finished other task of the same operation (None when there is
    none, or the check has no `failed_within`). The checker and the claim's gate both decide here."""
    busy = [other for other in running if other.operation in settings.busy_operations]
    if busy:
        other = busy[0]
        return Look(False, f"rack_idle: {other.operation.value} task {other.task_id} is running on the rack")
    if (
        settings.failed_within
        and last is not None
        and last.status is TaskStatus.FAILED
        and last.finished_at is not None
        and now - last.finished_at < duration_of(settings.failed_within)
    ):
        return Look(
            False,
            f"rack_idle: the rack's last {last.operation.kind.value} failed at "
            f"{last.finished_at.isoformat()} (within {settings.failed_within}): {last.message}",
        )
    return Look(True, "rack_idle: idle")


def webhook_payload(
    check: str, task: Task, attempt: int, rack: RackFacts, components: Sequence[Component]
) -> dict[str, Any]:
    """What a hook is told: the task, its rack and the components in scope, who scheduled it, the round."""
    return {
        "check": check,
        "task_id": str(task.id),
        "attempt": attempt,
        "operation": task.operation.kind.value,
        "rack": {
            "id": str(rack.id),
            "name": rack.name,
            "external_id": rack.external_id,
            "domain": rack.domain,
        },
        "components": [
            {"id": str(c.id), "name": c.name, "type": c.type.value, "external_id": c.external_id or ""}
            for c in components
        ],
        "schedule_id": str(task.schedule_id) if task.schedule_id else None,
        "run_id": str(task.run_id) if task.run_id else None,
    }


async def webhook(settings: WebhookSettings, payload: dict[str, Any], asked: Asked) -> Look:
    body = json.dumps(payload, sort_keys=True).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "User-Agent": "rackflow", TIMESTAMP_HEADER: timestamp}
    if settings.secret:
        try:
            secret = read_reference(settings.secret, "webhook secret")
        except CredentialsUnavailable as exc:
            return Look(False, f"webhook: {exc}")
        headers[SIGNATURE_HEADER] = signature(secret.rstrip("\r\n"), timestamp, body)
    timeout = duration_of(settings.timeout).total_seconds()
    request = urllib.request.Request(settings.url, data=body, headers=headers, method="POST")

    def post() -> tuple[int, bytes]:
        with NO_REDIRECTS.open(request, timeout=timeout) as answer:
            return answer.status, read_within(answer, time.monotonic() + timeout, HOOK_ANSWER_BYTES)

    try:
        status, raw = await asked.run(post)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        return Look(False, f"webhook: {settings.shown_url}: {_error(exc, settings.url)}")
    try:
        answer = json.loads(raw)
    except ValueError:
        return Look(False, f"webhook: {settings.shown_url} answered HTTP {status} without JSON")
    if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
        return Look(False, f'webhook: {settings.shown_url} answered without "ok": true or false')
    if answer["ok"]:
        return Look(True, "webhook: ok")
    reason = str(answer.get("reason") or "not ready")
    return Look(False, f"webhook: {reason}", _retry_after(answer.get("retry_after")))


def _retry_after(value: object) -> timedelta | None:
    """A hook's `retry_after` (a Go duration, e.g. "30s"); None when absent or not one."""
    if not isinstance(value, str):
        return None
    try:
        nanos = parse_go_duration(value)
    except ValueError:
        return None
    return timedelta(microseconds=nanos // 1000) if nanos > 0 else None


def alerts_url(base: str, query: str) -> str:
    """Alertmanager's `/api/v2/alerts` under `base` (a check's URL, with any path prefix of a proxy in
    front of it), asked with `query` after the base's own query (a proxy's token: `?token=…`), which
    appending the path to the URL as text had put before the path, so such a check was never answered."""
    parts = urllib.parse.urlsplit(base)
    path = f"{parts.path.rstrip('/')}/api/v2/alerts"
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, path, "&".join(q for q in (parts.query, query) if q), "")
    )


def scrubbed(text: str, *urls: str) -> str:
    """`text` (an error's words, which urllib and http.client may write the URL into) with each of these
    URLs, as asked, replaced by how rackflow shows it (`shown_url`): a held task's reason and the logs
    must not quote a token in its query."""
    for url in sorted({url for url in urls if url}, key=len, reverse=True):
        text = text.replace(url, shown_url(url))
    return text


def _error(exc: BaseException, *urls: str) -> str:
    """An HTTP failure for people: the status, "timed out", or what refused the connection; the URLs
    asked, should the error quote them, as shown (`scrubbed`)."""
    if isinstance(exc, urllib.error.HTTPError):
        return not_followed(exc.code) if 300 <= exc.code < 400 else f"HTTP {exc.code}"
    if isinstance(exc, http.client.HTTPException):
        return f"the answer was not HTTP ({type(exc).__name__})"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, TimeoutError):
        return "timed out"
    return scrubbed(str(reason), *urls) or type(reason).__name__
