"""Pre-flight check use cases, and an operator's override of one task's checks. Each change is one
transaction, so a refused request writes nothing.

Validation happens before any write and names the request's field (`check.webhook.timeout`,
`check.racks[1]`); racks and domains named by id or name are resolved as windows resolve them.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.checks.gate import GATE_NAME, PreflightGate
from rackflow.checks.kinds import PLACEHOLDERS, render, unknown_placeholder
from rackflow.clock import Clock
from rackflow.config import (
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_CHECK_MAX_WAIT,
    DEFAULT_WEBHOOK_TIMEOUT,
    MAX_WEBHOOK_TIMEOUT,
    MIN_CHECK_INTERVAL,
)
from rackflow.domain.checks import (
    ANY_ALERT,
    HIDDEN,
    AlertmanagerSettings,
    CheckResult,
    PreflightCheck,
    RackFacts,
    RackIdleSettings,
    Settings,
    WebhookSettings,
    duration_of,
    matches_every_alert,
    shown_url,
)
from rackflow.domain.tasks import OperationKind, Task, TaskStatus
from rackflow.errors import FailedPrecondition, InvalidArgument, NotFound
from rackflow.ids import new_id
from rackflow.inventory.bmc import check_credentials_ref
from rackflow.store import checks as store
from rackflow.store import task_runs
from rackflow.store.db import Database
from rackflow.store.tasks import get_task
from rackflow.tasks.manager import TaskManager
from rackflow.validation import (
    alertmanager_matcher,
    at_most,
    check_description,
    check_mask,
    check_name,
    check_rename,
    check_text,
    distinct_operations,
    http_url,
)
from rackflow.windows.service import Ref, resolve_refs

NAME_PATH = "check.name"
OPERATIONS_PATH = "check.operations"
RACKS_PATH = "check.racks"
DOMAINS_PATH = "check.nvl_domains"
KIND_PATH = "check.kind"
INTERVAL_PATH = "check.interval"
MAX_WAIT_PATH = "check.max_wait"
# A rack to fill a matcher's placeholders with before it is parsed: a placeholder stands for a value.
SAMPLE_RACK = RackFacts(uuid.UUID(int=1), "rack-01", "SN-1001", None, "nvl-a")
UPDATE_PATHS = (NAME_PATH, OPERATIONS_PATH, RACKS_PATH, DOMAINS_PATH, KIND_PATH, INTERVAL_PATH, MAX_WAIT_PATH)
# What a check's lists may hold: every claim of a task asks which checks apply to its rack, and every round
# of an Alertmanager check sends each matcher, rendered for the rack, as a `filter` of its query. A check
# names at most as many racks (and domains) as one request may target (`MAX_TARGETS`); real selectors are
# a few matchers.
MAX_ALERTMANAGER_MATCHERS = 32


@dataclass(frozen=True)
class CheckInput:
    """A check as a request gives it (create, or the masked fields of an update); "" durations take the
    defaults of config.py."""

    name: str = ""
    operations: tuple[OperationKind, ...] = ()
    racks: tuple[Ref, ...] = ()
    domains: tuple[Ref, ...] = ()
    settings: Settings | None = None
    interval: str = ""
    max_wait: str = ""


def _duration(text: str, field: str, *, minimum: str = "") -> str:
    try:
        value = duration_of(text)
    except ValueError as exc:
        raise InvalidArgument(f"{field}: {exc}") from None
    if value <= duration_of("0s") or (minimum and value < duration_of(minimum)):
        least = f"at least {minimum}" if minimum else "more than 0"
        raise InvalidArgument(f"{field}: {text!r} must be {least}")
    return text


def _url(url: str, field: str) -> str:
    """An http(s) URL without a user or password: a check sends none (urllib took `user:password@host` for a
    host it could not resolve, so the check never answered, and its reason quoted the password). A refusal
    quotes it as shown (`shown_url`: its query may hold a token), and one holding the "…" that stands for a
    hidden value is refused: it is a shown URL copied back, which would ask the hook with "…" for a token."""
    check_text(url, field, required=True)
    parts = http_url(url)
    if parts is None:
        raise InvalidArgument(f"{field}: {shown_url(url)!r} is not an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        why = "a check sends none; sign a webhook's body with a secret"
        raise InvalidArgument(f"{field}: must not hold a user or password ({why})")
    if HIDDEN in url:
        raise InvalidArgument(
            f"{field}: {shown_url(url)!r} holds {HIDDEN!r}, which stands for a value rackflow does not show:"
            " give the whole URL"
        )
    return url


def _keeping_url(given: Settings | None, current: Settings) -> Settings | None:
    """An update's settings with the current URL kept where they give it as shown (`shown_url`): an API
    client that reads a check and writes its kind back, to change a matcher, gets its URL with the query's
    values hidden, and must not turn the stored token into "…"."""
    if (
        isinstance(given, AlertmanagerSettings | WebhookSettings)
        and type(given) is type(current)
        and isinstance(current, AlertmanagerSettings | WebhookSettings)
        and given.url != current.url
        and given.url == current.shown_url
    ):
        return replace(given, url=current.url)
    return given


def check_settings(settings: Settings | None) -> Settings:
    """The kind's settings with their defaults filled in; InvalidArgument naming the field."""
    if settings is None:
        raise InvalidArgument(f"{KIND_PATH}: give alertmanager {{…}}, webhook {{…}} or rack_idle {{…}}")
    if isinstance(settings, AlertmanagerSettings):
        field = "check.alertmanager"
        _url(settings.url, f"{field}.url")
        if matches_every_alert(settings.matchers):
            # A log server's DiskFull would hold every task. Never by omission: "any alert" is asked for by
            # a matcher every alert has.
            raise InvalidArgument(
                f"{field}.matchers: give at least one matcher; for any alert, say so: {ANY_ALERT}"
            )
        at_most(settings.matchers, MAX_ALERTMANAGER_MATCHERS, f"{field}.matchers", "matchers")
        for index, matcher in enumerate(settings.matchers):
            where = f"{field}.matchers[{index}]"
            if (unknown := unknown_placeholder(matcher)) is not None:
                raise InvalidArgument(
                    f"{where}: {matcher!r} holds {unknown!r}, which is not a placeholder; a matcher is"
                    f" templated with {', '.join(PLACEHOLDERS)} only"
                )
            alertmanager_matcher(matcher, where, rendered=render(matcher, SAMPLE_RACK))
        return settings
    if isinstance(settings, WebhookSettings):
        field = "check.webhook"
        _url(settings.url, f"{field}.url")
        if settings.secret:
            check_credentials_ref(settings.secret, f"{field}.secret")
        timeout = _duration(settings.timeout or DEFAULT_WEBHOOK_TIMEOUT, f"{field}.timeout")
        if duration_of(timeout) > MAX_WEBHOOK_TIMEOUT:
            raise InvalidArgument(f"{field}.timeout: {timeout!r} is longer than {MAX_WEBHOOK_TIMEOUT}")
        return replace(settings, timeout=timeout)
    field = "check.rack_idle"
    busy = settings.busy_operations
    if settings.failed_within:
        _duration(settings.failed_within, f"{field}.failed_within")
    elif not busy:
        raise InvalidArgument(f"{field}: give busy_operations, failed_within, or both")
    return RackIdleSettings(busy, settings.failed_within)


async def _racks(conn: AsyncConnection, refs: Sequence[Ref]) -> tuple[tuple[uuid.UUID, str], ...]:
    return await resolve_refs(conn, refs, RACKS_PATH, "rack", "racks")


async def _domains(conn: AsyncConnection, refs: Sequence[Ref]) -> tuple[tuple[uuid.UUID, str], ...]:
    return await resolve_refs(conn, refs, DOMAINS_PATH, "NVLink domain", "domains")


def _timing(interval: str, max_wait: str) -> tuple[str, str]:
    minimum = f"{int(MIN_CHECK_INTERVAL.total_seconds() * 1000)}ms"
    interval = _duration(interval or DEFAULT_CHECK_INTERVAL, INTERVAL_PATH, minimum=minimum)
    max_wait = _duration(max_wait or DEFAULT_CHECK_MAX_WAIT, MAX_WAIT_PATH)
    return interval, max_wait


class CheckService:
    def __init__(self, db: Database, clock: Clock, manager: TaskManager) -> None:
        self.db = db
        self.clock = clock
        self.manager = manager
        # The start gate of these checks (registered in `Services.gates`, after budgets).
        self.gate = PreflightGate(db)

    async def create(self, given: CheckInput) -> PreflightCheck:
        check_name(given.name, NAME_PATH)
        operations = distinct_operations(given.operations, OPERATIONS_PATH)
        settings = check_settings(given.settings)
        interval, max_wait = _timing(given.interval, given.max_wait)
        now = self.clock.now()
        async with self.db.transaction() as conn:
            covered = await _racks(conn, given.racks)
            domains = await _domains(conn, given.domains)
            check = PreflightCheck(
                id=new_id(),
                name=given.name,
                operations=operations,
                all_racks=not covered and not domains,
                racks=covered,
                domains=domains,
                settings=settings,
                interval=interval,
                max_wait=max_wait,
                created_at=now,
                updated_at=now,
            )
            await store.insert_check(conn, check)
        return check

    async def get(self, check_id: uuid.UUID) -> PreflightCheck:
        async with self.db.read() as conn:
            return await self._load(conn, check_id)

    async def list_checks(self) -> list[PreflightCheck]:
        """Every check, by name."""
        async with self.db.read() as conn:
            return await store.all_checks(conn)

    async def latest_rounds(self, task_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, list[CheckResult]]:
        """Each of these tasks' answers of its checks in its last round, by check name (none: no check
        applied to it, or it has not been asked yet)."""
        if not task_ids:
            return {}
        async with self.db.read() as conn:
            return await store.latest_rounds(conn, task_ids)

    async def id_by_name(self, name: str, field: str = "name") -> uuid.UUID:
        check_text(name, field, required=True)
        async with self.db.read() as conn:
            found = await store.check_id_by_name(conn, name)
        if found is None:
            raise NotFound(f"{field}: no pre-flight check named {name!r}")
        return found

    async def update(self, check_id: uuid.UUID, paths: Collection[str], given: CheckInput) -> PreflightCheck:
        """Apply the masked fields; the tasks checks hold are looked at again at once, by what now applies."""
        mask = check_mask(paths, UPDATE_PATHS)
        if NAME_PATH in mask:
            check_text(given.name, NAME_PATH, required=True)  # a new one is checked as on create, below
        operations = (
            distinct_operations(given.operations, OPERATIONS_PATH) if OPERATIONS_PATH in mask else None
        )
        now = self.clock.now()
        async with self.db.transaction() as conn:
            current = await self._load(conn, check_id)
            settings = (
                check_settings(_keeping_url(given.settings, current.settings)) if KIND_PATH in mask else None
            )
            updated = replace(
                current,
                name=check_rename(given.name, NAME_PATH, current.name) if NAME_PATH in mask else current.name,
                operations=operations if operations is not None else current.operations,
                settings=settings if settings is not None else current.settings,
                updated_at=now,
            )
            interval, max_wait = _timing(
                given.interval if INTERVAL_PATH in mask else current.interval,
                given.max_wait if MAX_WAIT_PATH in mask else current.max_wait,
            )
            updated = replace(updated, interval=interval, max_wait=max_wait)
            if RACKS_PATH in mask:
                updated = replace(updated, racks=await _racks(conn, given.racks))
            if DOMAINS_PATH in mask:
                updated = replace(updated, domains=await _domains(conn, given.domains))
            if RACKS_PATH in mask or DOMAINS_PATH in mask:
                updated = replace(updated, all_racks=not updated.racks and not updated.domains)
            await store.save_check(conn, updated)
            await self._look_again(conn)
        return updated

    async def delete(self, check_id: uuid.UUID) -> None:
        async with self.db.transaction() as conn:
            if not await store.delete_check(conn, check_id):
                raise NotFound(f"id: no pre-flight check {check_id}")
            await self._look_again(conn)

    async def override(self, task_id: uuid.UUID, reason: str, checks: Sequence[str] = ()) -> Task:
        """Let one pending task start whatever its checks say (audited as every mutating RPC), or only
        these `checks` (names or ids; the others still count); the reason shows on the task."""
        check_description(reason, "reason")
        if not reason.strip():
            raise InvalidArgument("reason: say why the checks may be skipped")
        for index, ref in enumerate(checks):
            check_text(ref, f"checks[{index}]", required=True)
        if len(set(checks)) != len(checks):
            raise InvalidArgument(f"checks: {list(checks)!r} names a check twice")
        now = self.clock.now()
        async with self.db.transaction() as conn:
            overridden = await self._resolve(conn, checks)
            task = await get_task(conn, task_id)
            if task is None:
                raise NotFound(f"task_id: no task {task_id}")
            if task.status is not TaskStatus.PENDING:
                raise FailedPrecondition(
                    f"task_id: task {task_id} is {task.status.value}; only a pending task's checks"
                    " can be overridden"
                )
            if overridden:
                await store.override_checks(self.db, conn, task_id, overridden.values(), reason, now=now)
                names = ", ".join(repr(name) for name in overridden)
                said = f"pre-flight check{'s' if len(overridden) > 1 else ''} {names} overridden: {reason}"
            else:
                await store.override(self.db, conn, task_id, reason, now=now)
                said = f"pre-flight checks overridden: {reason}"
            await store.release(conn, GATE_NAME, [task_id], said, now=now)
            task = await get_task(conn, task_id)
        self.manager.wake_executors()
        assert task is not None
        return task

    @staticmethod
    async def _resolve(conn: AsyncConnection, refs: Sequence[str]) -> dict[str, uuid.UUID]:
        """Each check named by id or name, by its name; NotFound naming `checks[i]`."""
        if not refs:
            return {}
        checks = await store.all_checks(conn)
        by_ref = {str(c.id): c for c in checks} | {c.name: c for c in checks}
        found: dict[str, uuid.UUID] = {}
        for index, ref in enumerate(refs):
            check = by_ref.get(ref)
            if check is None:
                raise NotFound(f"checks[{index}]: no pre-flight check {ref!r}")
            found[check.name] = check.id
        return found

    async def _load(self, conn: AsyncConnection, check_id: uuid.UUID) -> PreflightCheck:
        check = await store.get_check(conn, check_id)
        if check is None:
            raise NotFound(f"id: no pre-flight check {check_id}")
        return check

    @staticmethod
    async def _look_again(conn: AsyncConnection) -> None:
        """After a change, the tasks the checks hold are claimed (and gated) again at once, their next
        round due now: a deleted check must not keep them waiting, a changed one must be asked. The tasks'
        rows first, then their rounds', the order in which the checker locks them."""
        await task_runs.release_held(conn, GATE_NAME)
        await store.check_all_again(conn)
