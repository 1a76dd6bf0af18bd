"""Pre-flight checks: what must hold on a rack before a task of an operation may start there (no alert
firing about it, a workload scheduler that says it drained it, no other disruptive task running on it), and
what one look at it found.

Pure values (no clock, no I/O). A check applies to a task when its operations include the task's (empty:
every operation) and it names the task's rack or the rack's NVLink domain (neither named: every rack). The
checker (`rackflow.checks.checker`) looks, the start gate (`rackflow.checks.gate`) reads what it found.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

from rackflow.domain.tasks import OperationKind
from rackflow.domain.windows import RackRef
from rackflow.timespec import parse_go_duration

# What stands for a hidden value in a shown URL (`shown_url`).
HIDDEN = "…"
# `Task.held_by` of a task its pre-flight checks hold (the start gate's name, `rackflow.checks.gate`).
HELD_BY_CHECKS = "preflight"
# The matcher that asks Alertmanager for any alert (every alert has a name): a check that is to hold on
# every alert says so with it.
ANY_ALERT = 'alertname=~".+"'
# How an Alertmanager check with no matcher is marked where it is listed (the console, the CLI), and why.
MATCHES_EVERY_ALERT = "matches every alert"
EVERY_ALERT_WHY = (
    "No matcher: Alertmanager answers a query with none with every alert it has, so any alert firing, "
    "about any rack, holds every task the check applies to. It was stored before a check with no matcher "
    "was refused, and would be refused today: give it the matchers of the alerts it means (rackflow check "
    f"update NAME --alertmanager URL --matcher …; every alert, if that is meant: {ANY_ALERT})."
)


def matches_every_alert(matchers: Sequence[str]) -> bool:
    """Whether an Alertmanager check asking with these matchers holds on every alert: Alertmanager's filter
    with no matcher is every alert. Refused when a check is stored (`checks.service.check_settings`), but a
    check stored before that still asks so, and is marked wherever checks are listed."""
    return not matchers


def shown_url(url: str) -> str:
    """A check's URL as rackflow shows it anywhere (the API, the CLI, the console, the audit trail, logs,
    a held task's reason): each query value and the fragment replaced by "…", a user and password dropped
    (`https://hooks.example/drain?token=…`). A hook or an Alertmanager proxy often takes its token in the
    query, and a check's URL is shown far and wide; the URL is stored and asked whole, and the keys and the
    path stay, so the shown one still tells which endpoint it is. A URL urlsplit cannot read is shown as
    "(not a valid URL)", never whole."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "(not a valid URL)"
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    query = "&".join(
        f"{key}={HIDDEN if value else ''}" if sep else (HIDDEN if key else "")
        for key, sep, value in (item.partition("=") for item in parts.query.split("&"))
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, HIDDEN if parts.fragment else ""))


class CheckKind(enum.StrEnum):
    """What a check asks. The value is the stored form."""

    ALERTMANAGER = "alertmanager"
    WEBHOOK = "webhook"
    RACK_IDLE = "rack_idle"


@dataclass(frozen=True)
class AlertmanagerSettings:
    """Any alert that Alertmanager at `url` reports active, not silenced and not inhibited, matching all of
    `matchers` (templated with the rack: `{rack.name}`, `{rack.id}`, `{rack.external_id}`,
    `{rack.domain}`), holds the task. `fail_closed`: an Alertmanager that cannot be asked holds it too."""

    url: str
    matchers: tuple[str, ...]
    fail_closed: bool

    @property
    def shown_url(self) -> str:
        return shown_url(self.url)

    @property
    def matches_every_alert(self) -> bool:
        return matches_every_alert(self.matchers)


@dataclass(frozen=True)
class WebhookSettings:
    """POST the task to `url`; a 2xx `{"ok": true}` within `timeout` passes. `secret` is a reference
    (`env:NAME` or `file:/path`, never the secret itself) to the HMAC-SHA256 key that signs the body; ""
    signs nothing."""

    url: str
    secret: str
    timeout: str

    @property
    def shown_url(self) -> str:
        return shown_url(self.url)


@dataclass(frozen=True)
class RackIdleSettings:
    """No other task of `busy_operations` RUNNING on the rack, and (unless `failed_within` is "") the
    rack's last finished task of the same operation did not fail within `failed_within` of now."""

    busy_operations: frozenset[OperationKind]
    failed_within: str


Settings = AlertmanagerSettings | WebhookSettings | RackIdleSettings

KIND_OF: dict[type, CheckKind] = {
    AlertmanagerSettings: CheckKind.ALERTMANAGER,
    WebhookSettings: CheckKind.WEBHOOK,
    RackIdleSettings: CheckKind.RACK_IDLE,
}


def duration_of(text: str) -> timedelta:
    """A Go duration as a timedelta (the text was checked when the check was stored)."""
    return timedelta(microseconds=parse_go_duration(text) // 1000)


@dataclass(frozen=True)
class PreflightCheck:
    """`racks` and `domains` as (id, name) pairs; `all_racks` when the check named neither (kept apart, so
    a check whose racks were all deleted covers nothing rather than everything). A failing check is asked
    again every `interval`; a task it has held for `max_wait` fails with its last reason."""

    id: uuid.UUID
    name: str
    operations: frozenset[OperationKind]
    all_racks: bool
    racks: tuple[tuple[uuid.UUID, str], ...]
    domains: tuple[tuple[uuid.UUID, str], ...]
    settings: Settings
    interval: str
    max_wait: str
    created_at: datetime
    updated_at: datetime

    @property
    def kind(self) -> CheckKind:
        return KIND_OF[type(self.settings)]

    @property
    def matches_every_alert(self) -> bool:
        """An Alertmanager check with no matcher, stored before such a check was refused
        (`matches_every_alert`)."""
        return isinstance(self.settings, AlertmanagerSettings) and self.settings.matches_every_alert

    @property
    def asks_only_the_database(self) -> bool:
        """`rack_idle`: its look is a read of the database, so the claim's gate can ask it itself, in the
        claim's transaction, rather than hold the task for the checker (an HTTP look cannot be made there)."""
        return self.kind is CheckKind.RACK_IDLE

    @property
    def interval_delta(self) -> timedelta:
        return duration_of(self.interval)

    @property
    def max_wait_delta(self) -> timedelta:
        return duration_of(self.max_wait)

    def applies(self, rack: RackRef, operation: OperationKind) -> bool:
        if self.operations and operation not in self.operations:
            return False
        if self.all_racks:
            return True
        return any(rack.rack_id == i for i, _ in self.racks) or (
            rack.domain_id is not None and any(rack.domain_id == i for i, _ in self.domains)
        )


@dataclass(frozen=True)
class RackFacts:
    """What a check may say about a rack: the matchers' template values and the webhook's payload."""

    id: uuid.UUID
    name: str
    external_id: str
    domain_id: uuid.UUID | None
    domain: str  # the NVLink domain's name; "" when the rack has none

    @property
    def ref(self) -> RackRef:
        return RackRef(self.id, self.domain_id)


@dataclass(frozen=True)
class OnRack:
    """A task running on a rack, as `rack_idle` sees it."""

    task_id: uuid.UUID
    operation: OperationKind


@dataclass(frozen=True)
class Look:
    """What one check found for one task: `passed`, or why not (`reason`, e.g. "alertmanager: alert
    RackOverheat{rack="r1"} firing"); `retry_after`, when the other side said when to ask again;
    `unanswered`, a pass only because the check is fail-open and the other side could not be asked."""

    passed: bool
    reason: str
    retry_after: timedelta | None = None
    unanswered: bool = False


@dataclass(frozen=True)
class CheckResult:
    """A stored look: round `attempt` of the task's checks, by check. `recheck_at`: when it is stale (a
    pass no longer lets the task start; a hold is asked again)."""

    task_id: uuid.UUID
    check_id: uuid.UUID
    check_name: str
    attempt: int
    passed: bool
    reason: str
    checked_at: datetime
    recheck_at: datetime


@dataclass(frozen=True)
class Waiting:
    """A task the pre-flight gate has held: how many rounds of checks it has had, when the next is due
    (None: at once), whether an operator overrode its checks (and why), and until when a checker holds
    the lease on its next round (None: no round under way)."""

    task_id: uuid.UUID
    attempt: int
    next_check_at: datetime | None
    override_reason: str | None
    checking_until: datetime | None = None
