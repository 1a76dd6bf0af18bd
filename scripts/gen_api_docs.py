"""Generate docs/API.md from proto/rackflow/v1/flow.proto, so the reference cannot drift from the API.

Usage: python scripts/gen_api_docs.py [OUT] (default docs/API.md; `make docs`). tests/unit/test_api_docs.py
runs it into a temp file and fails when the committed page differs.

protoc compiles the proto with its source info (comments and line spans); the page is rendered from that
descriptor alone, in file order, so the output depends on nothing but the proto. Two layout conventions of
the proto become the page's sections:

* In the service, an RPC whose leading comment follows a blank line starts a group; that comment (e.g.
  "Tasks." or "Operations: each submits one task per targeted rack.") is the group's title and text.
* Among the types, a detached comment block before a message or enum (a `// ----` rule, then a title such
  as "Inventory") starts a types section.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.descriptor_pb2 import (
    DescriptorProto,
    EnumDescriptorProto,
    FieldDescriptorProto,
    FileDescriptorProto,
    FileDescriptorSet,
    MethodDescriptorProto,
    ServiceDescriptorProto,
    SourceCodeInfo,
)

from rackflow.api.errors import (
    FIRED_AT_KEY,
    HTTP_STATUS_FOR_CODE,
    REPLAYED_KEY,
    RUN_ID_KEY,
    STATUS_FOR_ERROR,
)
from rackflow.config import GRPC_MESSAGE_BYTES

ROOT = Path(__file__).resolve().parents[1]
PROTO = "rackflow/v1/flow.proto"
DEFAULT_OUT = ROOT / "docs" / "API.md"
WELL_KNOWN_DOCS = "https://protobuf.dev/reference/protobuf/google.protobuf/"

# FileDescriptorProto / DescriptorProto field numbers that source-info paths are made of.
_MESSAGE_TYPE, _ENUM_TYPE, _SERVICE = 4, 5, 6
_FIELD, _NESTED_TYPE, _NESTED_ENUM, _ONEOF = 2, 3, 4, 8
_ENUM_VALUE, _METHOD = 2, 2

SCALAR_NAMES = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in FieldDescriptorProto.Type.items()
    if value not in (FieldDescriptorProto.TYPE_MESSAGE, FieldDescriptorProto.TYPE_ENUM)
}

# When each status code is returned. Every code that rackflow.api.errors maps a domain error to must be
# here (the generator refuses to run otherwise); the last four come from the interceptors, the answer's
# size and the catch-all.
ERROR_ROWS = {
    "INVALID_ARGUMENT": "Malformed input: a bad spec, timezone, name, filter, mask path, target or UUID; "
    "a name that reads as a UUID (a reference that does is taken as an id, so such a name would name "
    "another rack or schedule to the CLI and the dashboard); a new name or external id that would not show "
    "as itself (`name: 'r12\\u200b': U+200B ZERO WIDTH SPACE at position 4 is not allowed; …`, or not in "
    "NFC: see Names above); "
    "a duplicate rack or component in one target spec; a target that resolves to no rack; a request whose "
    "bytes do not parse, such as a string field that is not valid UTF-8 (`request: the bytes sent do not "
    "parse: …`; a mutating RPC's refusal is in the audit trail, its request the parser's reason).",
    "NOT_FOUND": "An id (or name) that does not exist.",
    "ALREADY_EXISTS": "A duplicate rack or schedule name, on create and on rename (nothing in that request "
    "is applied); a component's external id, or BMC resource, that another component has (in any rack).",
    "FAILED_PRECONDITION": "The current state forbids the request: pausing, resuming or triggering a "
    "consumed one-time schedule; a new spec for, a resume of or a trigger of a schedule whose firmware "
    "upgrade's end_time has passed, an approval of its run awaiting approval then, or a resume of its "
    "rollout halted then; a pause's resume_at at or past that end_time (or whose next firing once resumed "
    "then would be); "
    "an operation this server's backend cannot carry out on any rack (an upgrade by version on the redfish "
    "backend without RACKFLOW_REDFISH_IMAGE_URI, [REDFISH.md](REDFISH.md)), submitted or in a new schedule; "
    "removing a schedule's last scope; merging component filters of different "
    "kinds; a task conflict under the REJECT strategy; a full waiting queue (5 per rack); cancelling a "
    "COMPLETED or FAILED task. A trigger that fired but submitted no task, every scope failed, is the one "
    "refusal that changes something (its run is recorded): its trailing metadata names that run as the "
    f"trigger's success does, `{RUN_ID_KEY}`, `{FIRED_AT_KEY}` (RFC 3339, UTC) and `{REPLAYED_KEY}` "
    "(`true`: the answer of an earlier trigger with the same request_id, so this call fired nothing) "
    "([SCHEDULES.md](SCHEDULES.md#a-trigger-whose-commit-goes-unanswered)).",
    "UNAVAILABLE": "The server cannot reach its database right now; retry.",
    "UNAUTHENTICATED": "Tokens are configured and the call has no valid `authorization: Bearer` token "
    "([SECURITY.md](SECURITY.md)).",
    "PERMISSION_DENIED": "A `viewer` token called an RPC that changes something.",
    "RESOURCE_EXHAUSTED": "An answer heavier than a gRPC message may be "
    f"({GRPC_MESSAGE_BYTES // 2**20} MiB; a `ListRacks` with no limit over 20,000 racks of 36 components "
    "is about 95 MB): the message names the RPC and its size; ask "
    "for pages (`pagination.limit`), fewer ids, or the basic view. Logged on the server at WARNING.",
    "INTERNAL": "A bug: the details are logged on the server, never sent. Bad input never gets this code.",
}

HEADER = """\
# API reference

<!-- Generated by scripts/gen_api_docs.py from proto/rackflow/v1/flow.proto: do not edit, run `make docs`. -->

rackflow serves one gRPC service, `rackflow.v1.Flow` ([flow.proto](../proto/rackflow/v1/flow.proto)), next to
the standard health service (`grpc.health.v1.Health`) and server reflection, so tools such as
[grpcurl](https://github.com/fullstorydev/grpcurl) need no `.proto` file. The `rackflow` command line covers
every RPC ([CONFIGURATION.md](CONFIGURATION.md) lists its options); this page is for other clients.

Conventions: ids are UUID strings wrapped in `UUID` (`{"id": "…"}` in JSON); times are UTC
`google.protobuf.Timestamp`s (RFC 3339 strings in JSON); `Pagination.limit` 0 means no limit; enum values are
written by name in JSON (`"COMPONENT_TYPE_COMPUTE"`). Schedule semantics are in [SCHEDULES.md](SCHEDULES.md).

Names: the name of a rack, component, NVLink domain, schedule, maintenance window, operation budget,
pre-flight check or notification channel, and a rack's or component's external id, is at most 255 characters;
a name must not read as a UUID. Operators pick what they act on by what a name looks like, so a new name (on
create, and on an update that changes it) must show as itself: it may not hold a control character (Cc), a
format character (Cf: zero-width spaces and joiners U+200B..U+200D, U+2060, U+FEFF, bidi embeddings, overrides
and isolates U+202A..U+202E and U+2066..U+2069, the soft hyphen, tag characters), a line or paragraph
separator (U+2028, U+2029), an unassigned code point, a space other than U+0020 (a no-break space looks like
one), or another character that draws nothing (variation selectors, Hangul fillers); nor begin or end with a
space; and it must be in Unicode normal form NFC ("é" as one character, not "e" and a combining accent: both
look the same). The refusal is `INVALID_ARGUMENT` naming the field, the name escaped, the character's code
point and its position (from 1): `name: 'r12\\u200b': U+200B ZERO WIDTH SPACE at position 4 is not allowed;
names and external ids may not hold control, format or invisible characters, nor begin or end with
whitespace`. A non-NFC name is refused, not normalised, so lookups stay exact. A name stored by an earlier
release keeps working: it is found by itself (`GetRack`, a `RackTarget`'s name), and an update that sends it
back unchanged keeps it; renaming it is the way out
([OPERATIONS.md](OPERATIONS.md#names-that-do-not-show-as-themselves)).

## Calling the API with grpcurl

```console
$ grpcurl -plaintext 127.0.0.1:50051 list
grpc.health.v1.Health
grpc.reflection.v1alpha.ServerReflection
rackflow.v1.Flow
$ grpcurl -plaintext 127.0.0.1:50051 describe rackflow.v1.CreateRackRequest
rackflow.v1.CreateRackRequest is a message:
message CreateRackRequest {
  string name = 1;
  string external_id = 2;
  .rackflow.v1.UUID nvl_domain_id = 3;
  repeated .rackflow.v1.ComponentSpec components = 4;
}
$ grpcurl -plaintext -d '{"name":"r1"}' 127.0.0.1:50051 rackflow.v1.Flow/CreateRack
{
  "id": {
    "id": "17058c7b-72d0-4fcf-9ed1-b54867b621c4"
  },
  "name": "r1",
  "created_at": "2026-11-30T01:10:19.587593Z"
}
$ grpcurl -plaintext -d '{"name":"r1"}' 127.0.0.1:50051 rackflow.v1.Flow/CreateRack
ERROR:
  Code: AlreadyExists
  Message: name: a rack named 'r1' already exists
$ grpcurl -plaintext -d '{"target_spec":{"racks":{"targets":[{"name":"r1"}]}}}' \\
    127.0.0.1:50051 rackflow.v1.Flow/PowerOnRack
{
  "task_ids": [
    {
      "id": "5d8fbc4e-a1ee-47eb-a8e5-3e7cb35f6d91"
    }
  ]
}
$ grpcurl -plaintext -d '{"spec": {"type": "SCHEDULE_SPEC_TYPE_CRON", "spec": "0 2 * * *",
                          "timezone": "Europe/Berlin"}, "count": 2}' \\
    127.0.0.1:50051 rackflow.v1.Flow/PreviewScheduleSpec
{
  "times": [
    "2026-12-01T01:00:00Z",
    "2026-12-02T01:00:00Z"
  ]
}
```

Against a server with TLS and tokens ([SECURITY.md](SECURITY.md)), replace `-plaintext` with
`-cacert ca.pem` and add `-H "authorization: Bearer $RACKFLOW_TOKEN"`. grpcurl exits with 64 plus the status
code's number when a call fails (67 for INVALID_ARGUMENT, 70 for ALREADY_EXISTS).

## Errors

Every error carries one of these codes and a message naming the field and the bad value. A message is at most
2,000 bytes (UTF-8): one quoting a huge value keeps its start (the field) and its end (what was expected) and
says how many characters it left out between them, so it fits any gRPC client's metadata limit, which would
otherwise turn it into RESOURCE_EXHAUSTED. A refused request changes nothing. The JSON API
([HTTP.md](HTTP.md)) answers the same errors with the HTTP status beside each.

| code | HTTP | when |
|---|---|---|
"""


@dataclass(frozen=True)
class Located:
    """A descriptor element with its source position and comments."""

    line: int
    leading: str
    trailing: str
    detached: tuple[str, ...]
    starts_after_blank: bool


def compile_descriptor(proto_root: Path) -> FileDescriptorProto:
    """Run protoc (from grpcio-tools) with source info and return flow.proto's descriptor."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "flow.pb"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{proto_root}",
                "--include_imports",
                "--include_source_info",
                f"--descriptor_set_out={out}",
                PROTO,
            ],
            check=True,
        )
        descriptors = FileDescriptorSet.FromString(out.read_bytes())
    return next(f for f in descriptors.file if f.name == PROTO)


class Source:
    """Source positions and comments of one file, by descriptor path."""

    def __init__(self, info: SourceCodeInfo) -> None:
        self._by_path = {tuple(loc.path): loc for loc in info.location}

    def at(self, *path: int, previous_end: int | None = None) -> Located:
        loc = self._by_path[path]
        comment_lines = loc.leading_comments.count("\n")
        # A blank line lies between the previous element and this one (with its comment).
        gap = previous_end is not None and loc.span[0] - comment_lines > previous_end + 1
        return Located(
            line=loc.span[0],
            leading=loc.leading_comments,
            trailing=loc.trailing_comments,
            detached=tuple(loc.leading_detached_comments),
            starts_after_blank=gap,
        )

    def comment(self, *path: int) -> str:
        """The leading and trailing comment of `path`; "" where there is no source (synthetic oneofs)."""
        return comment_of(self.at(*path)) if path in self._by_path else ""

    def end_line(self, *path: int) -> int:
        span = self._by_path[path].span
        return span[2] if len(span) == 4 else span[0]


def text_of(comment: str) -> str:
    """A comment as one Markdown line: lines joined, `<`, `>` and `|` escaped outside code spans (a
    table cell would swallow `<id>` as HTML), docs/X.md references made links."""
    joined = " ".join(line.strip() for line in comment.strip().splitlines() if line.strip())
    pieces = joined.split("`")
    for i in range(0, len(pieces), 2):  # even pieces lie outside code spans
        escaped = pieces[i].replace("<", "&lt;").replace(">", "&gt;")
        pieces[i] = re.sub(r"\bdocs/([A-Z_]+\.md)\b", r"[\1](\1)", escaped)
    return "`".join(pieces).replace("|", "\\|")


def comment_of(located: Located) -> str:
    return " ".join(part for part in (text_of(located.leading), text_of(located.trailing)) if part)


def anchor(name: str) -> str:
    """The anchor GitHub gives a heading made of `name`."""
    return re.sub(r"[^a-z0-9_-]", "", name.lower().replace(" ", "-"))


def type_link(type_name: str, package: str) -> str:
    """A field or RPC type as Markdown: a link to its section, or to the well-known types' page."""
    name = type_name.lstrip(".")
    if name.startswith("google.protobuf."):
        short = name.removeprefix("google.protobuf.")
        return f"[`{name}`]({WELL_KNOWN_DOCS}#{re.sub(r'(?<!^)(?=[A-Z])', '-', short).lower()})"
    local = name.removeprefix(package + ".")
    return f"[`{local}`](#{anchor(local)})"


def field_type(field: FieldDescriptorProto, package: str) -> str:
    if field.type_name:
        return type_link(field.type_name, package)
    return f"`{SCALAR_NAMES[field.type]}`"


def field_label(field: FieldDescriptorProto, message: DescriptorProto) -> str:
    if field.label == FieldDescriptorProto.LABEL_REPEATED:
        return "repeated"
    if field.proto3_optional:
        return "optional"
    if field.HasField("oneof_index"):
        return f"oneof `{message.oneof_decl[field.oneof_index].name}`"
    return ""


def section_title(comment: str) -> tuple[str, str]:
    """Split a section comment into a title and the text after it.

    "Operations: each submits one task …" -> ("Operations", "Each submits one task …");
    "Audit trail (docs/SECURITY.md)" -> ("Audit trail", "See [SECURITY.md](SECURITY.md).").
    """
    lines = [line.strip() for line in comment.strip().splitlines()]
    text_lines = [line for line in lines if line and not set(line) <= {"-"}]
    if not text_lines:
        return "", ""
    first, *more = text_lines
    match = re.fullmatch(r"([^:.(]+)(?:[:.]\s*|\s*\((.*)\)\s*$|$)(.*)", first)
    assert match is not None  # every non-empty line matches
    title, reference, rest = match.group(1).strip(), match.group(2), match.group(3)
    if reference:
        rest = f"See {reference}."
    text = text_of("\n".join([rest, *more]))
    return title, text[:1].upper() + text[1:]


@dataclass
class RpcGroup:
    title: str
    text: str
    rpcs: list[tuple[MethodDescriptorProto, str]]


def rpc_groups(service: ServiceDescriptorProto, s: int, source: Source) -> list[RpcGroup]:
    """The service's RPCs split where a blank line and a comment start a new group."""
    groups: list[RpcGroup] = []
    previous_end: int | None = None
    for m, method in enumerate(service.method):
        located = source.at(_SERVICE, s, _METHOD, m, previous_end=previous_end)
        own_comment = comment_of(located)
        if previous_end is None or located.starts_after_blank:
            title, text = "", ""
            if located.detached:
                title, text = section_title(located.detached[-1])
            elif located.leading:
                title, text = section_title(located.leading)
                own_comment = text_of(located.trailing)
            groups.append(RpcGroup(title, text, []))
        groups[-1].rpcs.append((method, own_comment))
        previous_end = source.end_line(_SERVICE, s, _METHOD, m)
    return groups


def render_service(file: FileDescriptorProto, source: Source) -> Iterator[str]:
    for s, service in enumerate(file.service):
        yield f"## Service `{file.package}.{service.name}`\n"
        service_comment = text_of(source.at(_SERVICE, s).leading)
        if service_comment:
            yield f"{service_comment}\n"
        for group in rpc_groups(service, s, source):
            if group.title:
                yield f"### {group.title}\n"
            if group.text:
                yield f"{group.text}\n"
            with_notes = any(comment for _, comment in group.rpcs)
            yield "| RPC | request | response |" + (" notes |" if with_notes else "")
            yield "|---|---|---|" + ("---|" if with_notes else "")
            for method, comment in group.rpcs:
                row = (
                    f"| `{method.name}` | {type_link(method.input_type, file.package)} | "
                    f"{type_link(method.output_type, file.package)} |"
                )
                yield row + (f" {comment} |" if with_notes else "")
            yield ""


def render_message(
    message: DescriptorProto, path: Sequence[int], prefix: str, file: FileDescriptorProto, source: Source
) -> Iterator[str]:
    name = prefix + message.name
    yield f"#### {name}\n"
    comment = text_of(source.at(*path).leading)
    if comment:
        yield f"{comment}\n"
    if not message.field:
        yield "No fields.\n"
    else:
        yield "| field | type | number | label | comment |\n|---|---|---|---|---|"
        for f, field in enumerate(message.field):
            yield (
                f"| `{field.name}` | {field_type(field, file.package)} | {field.number} | "
                f"{field_label(field, message)} | {comment_of(source.at(*path, _FIELD, f))} |"
            )
        yield ""
    for o, oneof in enumerate(message.oneof_decl):
        oneof_comment = source.comment(*path, _ONEOF, o)
        if oneof_comment:
            yield f"oneof `{oneof.name}`: {oneof_comment}\n"
    for n, nested in enumerate(message.nested_type):
        yield from render_message(nested, (*path, _NESTED_TYPE, n), name + ".", file, source)
    for e, enum in enumerate(message.enum_type):
        yield from render_enum(enum, (*path, _NESTED_ENUM, e), name + ".", source)


def render_enum(enum: EnumDescriptorProto, path: Sequence[int], prefix: str, source: Source) -> Iterator[str]:
    yield f"#### {prefix}{enum.name}\n"
    comment = text_of(source.at(*path).leading)
    if comment:
        yield f"{comment}\n"
    yield "| value | number | comment |\n|---|---|---|"
    for v, value in enumerate(enum.value):
        yield f"| `{value.name}` | {value.number} | {comment_of(source.at(*path, _ENUM_VALUE, v))} |"
    yield ""


def render_types(file: FileDescriptorProto, source: Source) -> Iterator[str]:
    """Messages and enums in file order, under the proto's section comments."""
    paths = [(_MESSAGE_TYPE, i) for i in range(len(file.message_type))]
    paths += [(_ENUM_TYPE, i) for i in range(len(file.enum_type))]
    yield "## Types\n"
    for path in sorted(paths, key=lambda path: source.at(*path).line):
        detached = source.at(*path).detached
        if detached:
            title, text = section_title(detached[-1])
            yield f"### {title}\n"
            if text:
                yield f"{text}\n"
        kind, index = path
        if kind == _MESSAGE_TYPE:
            yield from render_message(file.message_type[index], path, "", file, source)
        else:
            yield from render_enum(file.enum_type[index], path, "", source)


def render_errors() -> Iterator[str]:
    mapped = {status.grpc.name for status in STATUS_FOR_ERROR.values()}
    undocumented = sorted(mapped - ERROR_ROWS.keys())
    if undocumented:
        raise SystemExit(f"gen_api_docs: add {', '.join(undocumented)} to ERROR_ROWS")
    http = {code.name: status for code, status in HTTP_STATUS_FOR_CODE.items()}
    for code, when in ERROR_ROWS.items():
        yield f"| `{code}` | {http[code]} | {when} |"
    yield ""


def render(file: FileDescriptorProto) -> str:
    source = Source(file.source_code_info)
    lines = [*render_errors(), *render_service(file, source), *render_types(file, source)]
    return HEADER + "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str]) -> None:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    out.write_text(render(compile_descriptor(ROOT / "proto")))


if __name__ == "__main__":
    main(sys.argv[1:])
