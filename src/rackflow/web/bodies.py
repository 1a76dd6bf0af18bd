"""A JSON request body into the RPC's request message, with errors in the API's own words.

`json_format.ParseDict` alone answers a typo with `Available Fields(except extensions): …` and a wrong
type with the parser's internals, naming no field a client knows. So the body is walked against the
message's descriptor first: every key must be a field (its proto name or its JSON name), nested messages
and lists are walked in turn, and each leaf is parsed on its own, so an error names the field by its path
in the request message (`schedule.spec.type`, `window.racks[2].name`) as the RPCs' own errors do, says what
the field takes (an enum's names, "an RFC 3339 time") and shows what it got. Fields the route fills from
the path (`id`) are refused in the body rather than silently overwritten.

A body that does not parse, sent with a call refused by role, is recorded in the audit trail as sent
(`unparsed_body`): bounded, and without what may be a secret.

A time the CLI takes as a duration (`rackflow schedule pause --for 2h`) is taken as one here too: the
fields of `RELATIVE_TIMES` accept `"2h"` for "two hours from now"; and a count of seconds the CLI takes
as a duration (`--queue-timeout 30m`) accepts one (`DURATION_SECONDS`).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from datetime import datetime, timedelta
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from rackflow.api.convert.notifications import REDACTED
from rackflow.api.errors import message_of
from rackflow.config import AUDIT_UNPARSED_BODY_MAX_BYTES
from rackflow.domain.notifications import ChannelKind
from rackflow.errors import InvalidArgument
from rackflow.notify.senders import redacted_url
from rackflow.timespec import parse_go_duration

# Request fields (by name, at any depth) that take a duration from now as well as a time.
RELATIVE_TIMES = frozenset({"resume_at"})
# Whole-second fields (by name) that take a duration as well as a number (`"30m"`: 1800).
DURATION_SECONDS = frozenset({"queue_timeout_seconds"})
# Well-known types: what a client sends for them in proto3 JSON.
WELL_KNOWN = {
    "google.protobuf.Timestamp": "an RFC 3339 time like 2026-06-01T04:00:00Z",
    "google.protobuf.Duration": 'a duration in seconds like "3600s"',
    "google.protobuf.FieldMask": 'field paths, comma-separated, like "name,spec"',
    "google.protobuf.Empty": "an empty object {}",
}
# Words that make a JSON key (any case, at any depth) a secret's in an unparsed body: a channel's `secret`,
# and what a typo of it or another credential would be called. `url` makes a key a URL's.
_SECRET_WORDS = ("secret", "token", "password")
_URL_WORD = "url"
_URL_SCHEMES = ("http://", "https://")
_SCALAR = {
    FieldDescriptor.TYPE_STRING: "a string",
    FieldDescriptor.TYPE_BOOL: "true or false",
    FieldDescriptor.TYPE_BYTES: "base64 text",
    FieldDescriptor.TYPE_DOUBLE: "a number",
    FieldDescriptor.TYPE_FLOAT: "a number",
}


def read_json(raw: bytes) -> dict[str, Any] | None:
    """The body as a JSON object; None for an empty body."""
    if not raw.strip():
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise InvalidArgument(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgument("the request body is not valid JSON: nested too deep") from None
    if not isinstance(data, dict):
        raise InvalidArgument(f"the request body must be a JSON object, got {_shown(data)}")
    return data


def parse_into(
    data: dict[str, Any], message: Message, now: datetime, *, path_fields: Collection[str] = ()
) -> Message:
    """Merge `data` (proto3 JSON of `message`'s type, less `path_fields`) into `message`."""
    for name in path_fields:
        field = _field(message.DESCRIPTOR, name)
        if field is not None and (field.name in data or field.json_name in data):
            raise InvalidArgument(f"{field.name}: set by the URL path; leave it out of the body")
    _merge(data, message, "", now, hidden=path_fields)
    return message


def unparsed_body(raw: bytes, error: InvalidArgument, rpc: str, request: Descriptor) -> dict[str, Any]:
    """What the audit trail records of `raw`, the body of a call to `rpc` refused by role that did not
    parse (`error`): `{"error": why, "body": the body as text}`, the text at most
    AUDIT_UNPARSED_BODY_MAX_BYTES of UTF-8, cut past it and marked `"truncated": {"original_bytes",
    "limit_bytes"}`.

    Why: the row is what an auditor has of what a token tried beyond its role, and a body that did not
    parse was left out of it. Never a secret, as the trail keeps none of a request that parses
    (`without_secrets`, `check_without_secrets`): a JSON body is recorded as JSON again with the value of
    every key naming a secret (`_SECRET_WORDS`, a typo's too: `secrett`, `webhook_token`) as "(redacted)",
    and, when `request` has a field that may hold a secret or a URL (a notification channel's), of every
    key that is no field where it stands (a misspelt `sceret`); every URL (under a key naming one, or any
    text starting http:// or https://) is shown as the API shows a Slack channel's, with no user,
    password, path or query. A body that is not JSON is recorded as sent only when `request` has no such
    field (else its size alone). `error` is the parser's reason (as the caller got it, `message_of`) less
    the value it quotes (", got …"), which the recorded body shows, redacted."""
    reason = message_of(error).partition(", got ")[0]
    strict = _may_hold_secret(request, set())
    try:
        text: str | None = json.dumps(_redacted(json.loads(raw), request, strict), ensure_ascii=False)
    except (ValueError, RecursionError):
        text = None if strict else raw.decode("utf-8", errors="replace")
    if text is None:
        withheld = f"({len(raw)} bytes, not JSON, not recorded: {rpc}'s request may hold a secret)"
        return {"error": reason, "body": withheld}
    encoded = text.encode("utf-8", errors="replace")  # a lone surrogate JSON escaped is no UTF-8
    if len(encoded) <= AUDIT_UNPARSED_BODY_MAX_BYTES:
        return {"error": reason, "body": encoded.decode()}
    return {
        "error": reason,
        "body": encoded[:AUDIT_UNPARSED_BODY_MAX_BYTES].decode(errors="ignore"),  # whole characters
        "truncated": {"original_bytes": len(encoded), "limit_bytes": AUDIT_UNPARSED_BODY_MAX_BYTES},
    }


def _redacted(value: Any, message: Descriptor | None, strict: bool, url: bool = False) -> Any:
    """`value` (parsed JSON, of `message` where it is one) without secrets (`unparsed_body`); `strict`:
    the value of a key that is no field of `message` too; `url`: its texts are URLs."""
    if isinstance(value, dict):
        kept = {}
        for key, item in value.items():
            lowered = key.lower()
            field = _field(message, key) if message is not None else None
            if any(word in lowered for word in _SECRET_WORDS) or (strict and field is None):
                kept[key] = REDACTED
            else:
                nested = field.message_type if field is not None else None
                kept[key] = _redacted(item, nested, strict, url or _URL_WORD in lowered)
        return kept
    if isinstance(value, list):
        return [_redacted(item, message, strict, url) for item in value]
    if isinstance(value, str) and (url or value.lower().startswith(_URL_SCHEMES)):
        return redacted_url(ChannelKind.SLACK, value)
    return value


def _may_hold_secret(message: Descriptor | Any, seen: set[str]) -> bool:
    """Whether a request of type `message` has a field, at any depth, that holds a secret or a URL."""
    seen.add(message.full_name)
    for field in message.fields:
        name = field.name.lower()
        if _URL_WORD in name or any(word in name for word in _SECRET_WORDS):
            return True
        nested = field.message_type
        if nested is not None and nested.full_name not in seen and _may_hold_secret(nested, seen):
            return True
    return False


def takes(field: FieldDescriptor) -> str:
    """What a field takes, in words: "a string", "one of WINDOW_KIND_ALLOW, WINDOW_KIND_DENY", …"""
    if field.message_type is not None:
        name = field.message_type.full_name
        if field.name in RELATIVE_TIMES and name == "google.protobuf.Timestamp":
            return f"{WELL_KNOWN[name]}, or a duration from now like 2h"
        return WELL_KNOWN.get(name, "an object")
    if field.enum_type is not None:
        return "one of " + ", ".join(v.name for v in field.enum_type.values)
    if field.name in DURATION_SECONDS:
        return "whole seconds, or a duration like 30m"
    return _SCALAR.get(field.type, "an integer")


def real_oneof(field: FieldDescriptor | Any) -> Any:
    """The oneof a field is a member of; None for none, and for the one-member oneof that proto3 makes of an
    `optional` field (`_max_running_per_domain`), which is no choice."""
    oneof = field.containing_oneof
    if oneof is None or (len(oneof.fields) == 1 and oneof.name == f"_{field.name}"):
        return None
    return oneof


def _field(descriptor: Descriptor | Any, key: str) -> FieldDescriptor | None:
    found = descriptor.fields_by_name.get(key)
    if found is not None:
        return found
    return next((f for f in descriptor.fields if f.json_name == key), None)


def _merge(
    data: dict[str, Any], message: Message, prefix: str, now: datetime, hidden: Collection[str] = ()
) -> None:
    descriptor = message.DESCRIPTOR
    oneofs: dict[str, str] = {}
    for key, value in data.items():
        field = _field(descriptor, key)
        path = prefix + (field.name if field is not None else key)
        if field is None:
            names = ", ".join(f.name for f in descriptor.fields if f.name not in hidden) or "nothing"
            raise InvalidArgument(f"{path}: unknown field ({_where(prefix)} takes: {names})")
        oneof = real_oneof(field)
        if oneof is not None and value is not None:
            if oneof.name in oneofs:
                raise InvalidArgument(
                    f"{path}: only one of {', '.join(f.name for f in oneof.fields)} may be set "
                    f"(also given: {oneofs[oneof.name]})"
                )
            oneofs[oneof.name] = field.name
        if value is None:
            continue  # null: the field's default, as proto3 JSON says
        _merge_field(field, value, message, path, now)


def _merge_field(field: FieldDescriptor, value: Any, message: Message, path: str, now: datetime) -> None:
    nested = field.message_type
    walked = (
        nested is not None
        and not nested.GetOptions().map_entry
        and nested.full_name not in WELL_KNOWN
        and not nested.full_name.startswith("google.protobuf.")
    )
    if field.is_repeated and not (nested is not None and nested.GetOptions().map_entry):
        if not isinstance(value, list):
            raise InvalidArgument(f"{path}: expected a list, got {_shown(value)}")
        for index, item in enumerate(value):
            item_path = f"{path}[{index}]"
            if walked:
                if not isinstance(item, dict):
                    raise InvalidArgument(f"{item_path}: expected an object, got {_shown(item)}")
                _merge(item, getattr(message, field.name).add(), item_path + ".", now)
            else:
                _leaf(field, [item], message, item_path)
        return
    if walked:
        if not isinstance(value, dict):
            raise InvalidArgument(f"{path}: expected an object, got {_shown(value)}")
        child = getattr(message, field.name)
        child.SetInParent()
        _merge(value, child, path + ".", now)
        return
    if field.name in DURATION_SECONDS and isinstance(value, str) and not value.strip().isdigit():
        seconds = _seconds(value)
        if seconds is None:
            raise InvalidArgument(f"{path}: expected {takes(field)}, got {_shown(value)}")
        value = seconds
    if field.name in RELATIVE_TIMES and isinstance(value, str) and value[:1].isdigit():
        relative = _from_now(value, now)
        if relative is not None:
            getattr(message, field.name).CopyFrom(relative)
            return
    _leaf(field, value, message, path)


def _leaf(field: FieldDescriptor, value: Any, message: Message, path: str) -> None:
    """Parse one scalar, enum, map or well-known field on its own, so its error is its own."""
    single = type(message)()
    try:
        json_format.ParseDict({field.name: value}, single)
    except json_format.ParseError:
        raise InvalidArgument(f"{path}: expected {takes(field)}, got {_shown(value)}") from None
    message.MergeFrom(single)


def _seconds(text: str) -> int | None:
    """`30m` as 1800; None for what is no duration of whole seconds."""
    try:
        nanoseconds = parse_go_duration(text)
    except ValueError:
        return None
    seconds, rest = divmod(nanoseconds, 1_000_000_000)
    return seconds if rest == 0 else None


def _from_now(text: str, now: datetime) -> Timestamp | None:
    """`2h` as the time two hours after `now`; None when `text` is no duration (then it is a time)."""
    try:
        nanoseconds = parse_go_duration(text)
    except ValueError:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(now + timedelta(microseconds=nanoseconds // 1000))
    return stamp


def _where(prefix: str) -> str:
    return prefix.rstrip(".") or "the request body"


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
