"""Pre-flight check messages to domain values and back. Shape is checked here (operation names, ids, a
kind set); meaning (URLs, durations, secret references) is the service's."""

from __future__ import annotations

from google.protobuf.message import Message

from rackflow.api.convert import timestamp_to, uuid_to
from rackflow.api.convert.windows import operations_from, refs_from
from rackflow.checks.service import CheckInput
from rackflow.domain.checks import (
    AlertmanagerSettings,
    PreflightCheck,
    RackIdleSettings,
    Settings,
    WebhookSettings,
    shown_url,
)
from rackflow.domain.windows import covers_no_rack
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import distinct_operations


def _settings_from(msg: pb.PreflightCheck, field: str) -> Settings | None:
    which = msg.WhichOneof("kind")
    if which == "alertmanager":
        am = msg.alertmanager
        return AlertmanagerSettings(
            am.url, tuple(am.matchers), am.fail_closed if am.HasField("fail_closed") else True
        )
    if which == "webhook":
        return WebhookSettings(msg.webhook.url, msg.webhook.secret, msg.webhook.timeout)
    if which == "rack_idle":
        path = f"{field}.rack_idle.busy_operations"
        busy = distinct_operations(operations_from(msg.rack_idle.busy_operations, path), path)
        return RackIdleSettings(busy, msg.rack_idle.failed_within)
    return None


def check_from(msg: pb.PreflightCheck, field: str = "check") -> CheckInput:
    return CheckInput(
        name=msg.name,
        operations=operations_from(msg.operations, f"{field}.operations"),
        racks=refs_from(msg.racks, f"{field}.racks"),
        domains=refs_from(msg.nvl_domains, f"{field}.nvl_domains"),
        settings=_settings_from(msg, field),
        interval=msg.interval,
        max_wait=msg.max_wait,
    )


def check_to(check: PreflightCheck) -> pb.PreflightCheck:
    """The check as the API shows it: its URL as shown everywhere (`shown_url`, the query's values
    hidden); `secret` is a reference (`env:NAME`), never the key."""
    msg = pb.PreflightCheck(
        id=uuid_to(check.id),
        name=check.name,
        operations=sorted(op.value for op in check.operations),
        racks=[pb.WindowTarget(id=uuid_to(i), name=n) for i, n in check.racks],
        nvl_domains=[pb.WindowTarget(id=uuid_to(i), name=n) for i, n in check.domains],
        interval=check.interval,
        max_wait=check.max_wait,
        created_at=timestamp_to(check.created_at),
        updated_at=timestamp_to(check.updated_at),
        covers_no_rack=covers_no_rack(check),
    )
    settings = check.settings
    if isinstance(settings, AlertmanagerSettings):
        msg.alertmanager.CopyFrom(
            pb.AlertmanagerCheck(
                url=settings.shown_url, matchers=settings.matchers, fail_closed=settings.fail_closed
            )
        )
    elif isinstance(settings, WebhookSettings):
        msg.webhook.CopyFrom(
            pb.WebhookCheck(url=settings.shown_url, secret=settings.secret, timeout=settings.timeout)
        )
    else:
        msg.rack_idle.CopyFrom(
            pb.RackIdleCheck(
                busy_operations=sorted(op.value for op in settings.busy_operations),
                failed_within=settings.failed_within,
            )
        )
    return msg


def check_without_secrets(request: Message) -> Message:
    """The request as the audit trail records it: a check's URL as shown (`shown_url`); any other request
    as it is."""
    check = getattr(request, "check", None)
    which = check.WhichOneof("kind") if isinstance(check, pb.PreflightCheck) else None
    if which not in ("alertmanager", "webhook"):
        return request
    copy = type(request)()
    copy.CopyFrom(request)
    kept: pb.PreflightCheck = copy.check  # type: ignore[attr-defined]
    kind = kept.alertmanager if which == "alertmanager" else kept.webhook
    if kind.url:
        kind.url = shown_url(kind.url)
    return copy
