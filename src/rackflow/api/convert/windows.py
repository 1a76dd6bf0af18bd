"""Maintenance window messages to domain values and back.

Shape is checked here (a known kind, a oneof set, a UUID, an operation name); meaning (does the rack
exist, is the duration shorter than the cron period) is the service's.
"""

from __future__ import annotations

from collections.abc import Sequence

from rackflow.api.convert import timestamp_from, timestamp_to, uuid_from, uuid_to
from rackflow.domain.tasks import OperationKind
from rackflow.domain.window_rules import WindowEvent
from rackflow.domain.windows import (
    MaintenanceWindow,
    OneOff,
    Recurring,
    When,
    WindowKind,
    WindowPolicy,
    covers_no_rack,
)
from rackflow.errors import InvalidArgument
from rackflow.v1 import flow_pb2 as pb
from rackflow.windows.service import Ref, WindowInput

_KIND_FROM_PB = {pb.WINDOW_KIND_ALLOW: WindowKind.ALLOW, pb.WINDOW_KIND_FREEZE: WindowKind.FREEZE}
_KIND_TO_PB = {v: k for k, v in _KIND_FROM_PB.items()}
_POLICY_FROM_PB = {pb.WINDOW_POLICY_SKIP: WindowPolicy.SKIP, pb.WINDOW_POLICY_DEFER: WindowPolicy.DEFER}
_POLICY_TO_PB = {v: k for k, v in _POLICY_FROM_PB.items()}


def kind_from(value: int, field: str = "window.kind") -> WindowKind | None:
    """The kind; None for UNSPECIFIED (the service says it is required where it is)."""
    if value == pb.WINDOW_KIND_UNSPECIFIED:
        return None
    try:
        return _KIND_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"{field}: window kind {value} is not ALLOW or FREEZE") from None


def window_policy_from(value: int, field: str = "schedule.window_policy") -> WindowPolicy:
    try:
        return _POLICY_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"{field}: window policy {value} is not SKIP or DEFER") from None


def window_policy_to(policy: WindowPolicy) -> pb.WindowPolicy.ValueType:
    return _POLICY_TO_PB[policy]


def _when_from(msg: pb.MaintenanceWindow, field: str) -> When | None:
    which = msg.WhichOneof("when")
    if which == "recurring":
        r = msg.recurring
        return Recurring(r.cron, r.duration, r.timezone)
    if which == "one_off":
        for end in ("start", "end"):
            if not msg.one_off.HasField(end):
                raise InvalidArgument(f"{field}.one_off.{end}: a time is required")
        return OneOff(
            timestamp_from(msg.one_off.start, f"{field}.one_off.start"),
            timestamp_from(msg.one_off.end, f"{field}.one_off.end"),
        )
    return None


def refs_from(targets: Sequence[pb.WindowTarget], field: str) -> tuple[Ref, ...]:
    refs = []
    for index, target in enumerate(targets):
        ref_id = uuid_from(target.id, f"{field}[{index}].id", required=False)
        if ref_id is None and not target.name:
            raise InvalidArgument(f"{field}[{index}]: an id or a name is required")
        refs.append(Ref(ref_id, target.name))
    return tuple(refs)


def operations_from(names: Sequence[str], field: str) -> tuple[OperationKind, ...]:
    operations = []
    for index, name in enumerate(names):
        try:
            operations.append(OperationKind(name))
        except ValueError:
            known = ", ".join(op.value for op in OperationKind)
            raise InvalidArgument(f"{field}[{index}]: unknown operation {name!r} (one of {known})") from None
    return tuple(operations)


def window_from(msg: pb.MaintenanceWindow, field: str = "window") -> WindowInput:
    return WindowInput(
        name=msg.name,
        reason=msg.reason,
        kind=kind_from(msg.kind, f"{field}.kind"),
        when=_when_from(msg, field),
        racks=refs_from(msg.racks, f"{field}.racks"),
        domains=refs_from(msg.nvl_domains, f"{field}.nvl_domains"),
        operations=operations_from(msg.operations, f"{field}.operations"),
    )


def window_to(window: MaintenanceWindow) -> pb.MaintenanceWindow:
    msg = pb.MaintenanceWindow(
        id=uuid_to(window.id),
        name=window.name,
        reason=window.reason,
        kind=_KIND_TO_PB[window.kind],
        racks=[pb.WindowTarget(id=uuid_to(i), name=n) for i, n in window.racks],
        nvl_domains=[pb.WindowTarget(id=uuid_to(i), name=n) for i, n in window.domains],
        operations=sorted(op.value for op in window.operations),
        created_at=timestamp_to(window.created_at),
        updated_at=timestamp_to(window.updated_at),
        covers_no_rack=covers_no_rack(window),
    )
    when = window.when
    if isinstance(when, Recurring):
        msg.recurring.CopyFrom(
            pb.RecurringWindow(cron=when.cron, duration=when.duration, timezone=when.timezone)
        )
    else:
        msg.one_off.CopyFrom(pb.OneOffWindow(start=timestamp_to(when.start), end=timestamp_to(when.end)))
    return msg


def event_to(event: WindowEvent) -> pb.WindowEvent:
    return pb.WindowEvent(
        at=timestamp_to(event.at),
        window_id=uuid_to(event.window.id),
        window_name=event.window.name,
        kind=_KIND_TO_PB[event.window.kind],
        change="opens" if event.opens else "closes",
        operations=sorted(op.value for op in event.window.operations),
    )
