"""Conversions shared by every RPC group: ids, times, paging, component types and target specs.

Converters validate shape (a UUID parses, an enum value is known, a oneof is set) and raise
`InvalidArgument` naming the field; meaning (does the rack exist?) is the services' business.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.config import LIST_COUNT_CAP
from rackflow.domain.inventory import (
    ComponentTarget,
    ComponentType,
    NVLDomainTarget,
    RackTarget,
    TargetSpec,
)
from rackflow.errors import InvalidArgument
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import MAX_TARGETS

MAX_PAGE_SIZE = 1000


def message_json(message: Message) -> dict[str, Any]:
    """The proto3 JSON form clients see (CLI `-o json`, the HTTP API): proto field names, enums by name,
    and fields at their default value included, so a script never has to know proto3's defaults."""
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


def uuid_from(msg: pb.UUID, field: str, *, required: bool = True) -> uuid.UUID | None:
    """Parse a `UUID` message; an empty id is None when not required."""
    if not msg.id:
        if required:
            raise InvalidArgument(f"{field}: an id is required")
        return None
    try:
        return uuid.UUID(msg.id)
    except ValueError:
        raise InvalidArgument(f"{field}: {msg.id!r} is not a UUID") from None


def required_uuid(msg: pb.UUID, field: str) -> uuid.UUID:
    value = uuid_from(msg, field, required=True)
    assert value is not None
    return value


def uuid_to(value: uuid.UUID | None) -> pb.UUID | None:
    return pb.UUID(id=str(value)) if value is not None else None


def timestamp_to(value: datetime | None) -> Timestamp | None:
    if value is None:
        return None
    ts = Timestamp()
    timestamp_into(ts, value)
    return ts


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp_into(ts: Timestamp, value: datetime) -> None:
    """Set `ts` (often a message's own field, so nothing is copied) to `value`, as `Timestamp.FromDatetime`
    of it in UTC would (a naive `value` read as local time), by integer arithmetic: FromDatetime's time
    tuple was a quarter of a 10,000-scope list's conversion (docs/PERFORMANCE.md "The unpaged scopes")."""
    since = (value if value.tzinfo is not None else value.astimezone(UTC)) - _EPOCH
    ts.seconds = since.days * 86_400 + since.seconds
    ts.nanos = since.microseconds * 1_000


def timestamp_from_micros_into(ts: Timestamp, micros: int) -> None:
    """Set `ts` to the time `micros` microseconds after the Unix epoch (UTC), as a list read it
    (`store.dialect.epoch_micros`): the nanos count forwards from the second below, as `timestamp_into`'s."""
    ts.seconds, rest = divmod(micros, 1_000_000)
    ts.nanos = rest * 1_000


def timestamp_from(ts: Timestamp, field: str) -> datetime:
    try:
        return ts.ToDatetime(tzinfo=UTC)
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument(f"{field}: invalid timestamp: {exc}") from None


@dataclass(frozen=True)
class PageAsked:
    """A list request's page: skip `offset` rows, or start after the keyset position `after` (a page
    token's), and return at most `limit` (None: no limit)."""

    offset: int = 0
    limit: int | None = None
    after: tuple[Any, ...] | None = None


def page_from(msg: pb.Pagination | None, listing: str, field: str = "pagination") -> PageAsked:
    """The page asked for a list named `listing` (its tokens name it: one list's token is refused by
    another); negative values, huge pages, a token of another list and a token with an offset are
    refused."""
    if msg is None:
        return PageAsked()
    if msg.offset < 0:
        raise InvalidArgument(f"{field}.offset: must be >= 0, got {msg.offset}")
    if msg.limit < 0:
        raise InvalidArgument(f"{field}.limit: must be >= 0, got {msg.limit}")
    if msg.limit > MAX_PAGE_SIZE:
        raise InvalidArgument(f"{field}.limit: at most {MAX_PAGE_SIZE}, got {msg.limit}")
    after = None
    if msg.page_token:
        if msg.offset:
            raise InvalidArgument(f"{field}.offset: not with a page_token, got {msg.offset}")
        after = _key_from_token(msg.page_token, listing, f"{field}.page_token")
    return PageAsked(msg.offset, msg.limit or None, after)


# A page token: the list's name and the order values of a page's last row, as URL-safe base64 of JSON,
# each value tagged with its type ("t" time, "u" UUID, "s" text, "i" integer; null stays null). Opaque to
# clients, and checked when it comes back, so a token of another list (or another order) is refused, not
# misread.
def next_page_token(
    listing: str,
    limit: int | None,
    rows: Sequence[Any],
    key: Callable[[Any], Iterable[Any]],
    searched_to: Iterable[Any] | None = None,
) -> str:
    """The token of the page after `rows`, or "" when `rows` is the last page (short of `limit`, or no
    limit was asked). A page that walked a bounded part of its list (`searched_to`, the key where its walk
    stopped: `store.paging.Listed`) may be short, even empty, and not the last: its token searches on from
    there."""
    if limit is not None and rows and len(rows) >= limit:
        return page_token(listing, key(rows[-1]))
    return "" if searched_to is None else page_token(listing, searched_to)


def page_token(listing: str, key: Iterable[Any]) -> str:
    """The token of the page after the row whose order values are `key` in the list `listing`."""
    values = [_tagged(value) for value in key]
    return base64.urlsafe_b64encode(json.dumps([listing, values]).encode()).decode().rstrip("=")


def _tagged(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, datetime):
        return {"t": value.astimezone(UTC).isoformat()}
    if isinstance(value, uuid.UUID):
        return {"u": str(value)}
    if isinstance(value, str):
        return {"s": value}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"i": str(value)}
    raise TypeError(f"a page token holds no {type(value).__name__}")


def _key_from_token(token: str, listing: str, field: str) -> tuple[Any, ...]:
    try:
        name, values = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if name != listing:
            raise InvalidArgument(f"{field}: a token of {name!r}, not of {listing!r}")
        return tuple(_untagged(value) for value in values)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise InvalidArgument(f"{field}: not a page token of {listing!r}: {token[:200]!r}") from exc


def _untagged(value: Any) -> Any:
    if value is None:
        return None
    ((tag, text),) = value.items()
    if not isinstance(text, str):
        raise TypeError(text)
    if tag == "t":
        return datetime.fromisoformat(text)
    if tag == "u":
        return uuid.UUID(text)
    if tag == "s":
        return text
    if tag == "i":
        return int(text)
    raise KeyError(tag)


def total_to(counted: int, *, bounded: bool = False) -> tuple[int, bool]:
    """A list response's (total, total_capped) from a count made up to LIST_COUNT_CAP + 1; `bounded`: a
    count of the matches among the first rows a bounded walk looked at (`store.paging.Listed.
    count_bounded`), which more rows may add to, is capped too."""
    return min(counted, LIST_COUNT_CAP), counted > LIST_COUNT_CAP or bounded


_TYPE_FROM_PB = {
    pb.COMPONENT_TYPE_UNKNOWN: ComponentType.UNKNOWN,
    pb.COMPONENT_TYPE_COMPUTE: ComponentType.COMPUTE,
    pb.COMPONENT_TYPE_NVSWITCH: ComponentType.NVSWITCH,
    pb.COMPONENT_TYPE_POWERSHELF: ComponentType.POWERSHELF,
    pb.COMPONENT_TYPE_TORSWITCH: ComponentType.TORSWITCH,
    pb.COMPONENT_TYPE_UMS: ComponentType.UMS,
    pb.COMPONENT_TYPE_CDU: ComponentType.CDU,
}
# A component type's number in the API, for the converters that look up many (`components_into`).
COMPONENT_TYPES_TO_PB = {v: k for k, v in _TYPE_FROM_PB.items()}


def component_type_from(value: int, field: str, *, allow_unknown: bool = False) -> ComponentType:
    try:
        ctype = _TYPE_FROM_PB[value]  # type: ignore[index]
    except KeyError:
        raise InvalidArgument(f"{field}: unknown component type {value}") from None
    if ctype is ComponentType.UNKNOWN and not allow_unknown:
        raise InvalidArgument(f"{field}: a component type is required (COMPUTE, NVSWITCH, …)")
    return ctype


def component_type_to(value: ComponentType) -> pb.ComponentType.ValueType:
    return COMPONENT_TYPES_TO_PB[value]


def component_types_from(values: Iterable[int], field: str) -> tuple[ComponentType, ...]:
    types = tuple(component_type_from(v, f"{field}[{i}]") for i, v in enumerate(values))
    if len(set(types)) != len(types):
        raise InvalidArgument(f"{field}: a component type is listed twice")
    return types


def target_spec_from(msg: pb.OperationTargetSpec, field: str = "target_spec") -> TargetSpec:
    """The typed target spec; exactly one kind of target, at least one and at most MAX_TARGETS."""
    kind = msg.WhichOneof("targets")
    if kind is None:
        raise InvalidArgument(f"{field}: no targets given (racks, components or nvl_domains)")
    targets = getattr(msg, kind).targets
    if not targets:
        raise InvalidArgument(f"{field}.{kind}: the target list is empty")
    if len(targets) > MAX_TARGETS:
        raise InvalidArgument(f"{field}.{kind}: at most {MAX_TARGETS} targets, got {len(targets)}")
    if kind == "racks":
        return TargetSpec(racks=tuple(_rack_target(t, f"{field}.racks[{i}]") for i, t in enumerate(targets)))
    if kind == "components":
        return TargetSpec(
            components=tuple(_component_target(t, f"{field}.components[{i}]") for i, t in enumerate(targets))
        )
    return TargetSpec(
        nvl_domains=tuple(_domain_target(t, f"{field}.nvl_domains[{i}]") for i, t in enumerate(targets))
    )


def _rack_target(msg: pb.RackTarget, field: str) -> RackTarget:
    types = component_types_from(msg.component_types, f"{field}.component_types")
    which = msg.WhichOneof("identifier")
    if which == "id":
        return RackTarget(id=required_uuid(msg.id, f"{field}.id"), component_types=types)
    if which == "name" and msg.name:
        return RackTarget(name=msg.name, component_types=types)
    if which == "external_id" and msg.external_id:
        return RackTarget(external_id=msg.external_id, component_types=types)
    raise InvalidArgument(f"{field}: a rack id, name or external_id is required")


def _component_target(msg: pb.ComponentTarget, field: str) -> ComponentTarget:
    which = msg.WhichOneof("identifier")
    if which == "id":
        return ComponentTarget(id=required_uuid(msg.id, f"{field}.id"))
    if which == "external" and msg.external.id:
        ctype = component_type_from(msg.external.type, f"{field}.external.type", allow_unknown=True)
        return ComponentTarget(external_type=ctype, external_id=msg.external.id)
    raise InvalidArgument(f"{field}: a component id or external reference is required")


def _domain_target(msg: pb.NVLDomainTarget, field: str) -> NVLDomainTarget:
    types = component_types_from(msg.component_types, f"{field}.component_types")
    which = msg.WhichOneof("identifier")
    if which == "id":
        return NVLDomainTarget(id=required_uuid(msg.id, f"{field}.id"), component_types=types)
    if which == "name" and msg.name:
        return NVLDomainTarget(name=msg.name, component_types=types)
    raise InvalidArgument(f"{field}: an NVLink domain id or name is required")
