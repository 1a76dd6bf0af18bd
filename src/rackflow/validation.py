"""The input rules, each written once: stored text (names, external ids, versions), descriptions, what an
operation needs, and queue timeouts.

The API converters apply them at the door, naming the field as the client wrote it
(`operation.upgrade_firmware.target_version`); the services apply the same functions to what reaches them
by other paths (the task manager to every submission, the schedule service before it stores what each
firing will submit), so no caller can store what an RPC would refuse. Every function raises
`InvalidArgument` naming the field and the value, and returns what it accepted.

PostgreSQL cannot store, or even compare, text that holds a NUL: that is why every free-text field is
checked here before any query sees it.
"""

from __future__ import annotations

import enum
import re
import unicodedata
from collections.abc import Collection, Sequence, Sized
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TypeVar
from urllib.parse import SplitResult, urlsplit

from rackflow.config import (
    DEFAULT_RETRY_INITIAL_BACKOFF,
    DEFAULT_RETRY_MAX_BACKOFF,
    DEFAULT_RETRY_MULTIPLIER,
    MAX_RETRY_ATTEMPTS,
    MAX_RETRY_BACKOFF,
    MAX_RETRY_MULTIPLIER,
    MIN_START_DEADLINE,
    parse_interval,
)
from rackflow.domain.approvals import ApprovalPolicy
from rackflow.domain.rollouts import RolloutPolicy, bakes_without_canaries
from rackflow.domain.tasks import DEFAULT_QUEUE_TIMEOUT, Operation, OperationKind, QueueOptions, RetryPolicy
from rackflow.errors import InvalidArgument
from rackflow.ids import is_uuid
from rackflow.timespec import format_go_duration, format_rfc3339, parse_go_duration

MAX_TEXT_LENGTH = 255  # the width of every inventory and schedule name column
MAX_DESCRIPTION_LENGTH = 1024
MAX_QUEUE_TIMEOUT = timedelta(hours=24)
DEFAULT_PREVIEW_COUNT = 10  # what a preview (of a spec, a schedule or windows) lists when asked for 0
MAX_PREVIEW_COUNT = 100
MAX_APPROVERS = 10  # an approval policy's min_approvers
MAX_APPROVAL_TIMEOUT = timedelta(days=30)

# Alertmanager's matcher, as its API v2 `filter` parses one (pkg/labels ParseMatcher, the syntax every
# release accepts): a label name, an operator, and the value, quoted or not. Go's `\s` is these five.
_MATCHER = re.compile(
    r"[ \t\n\f\r]*([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t\n\f\r]*(=~|!=|!~|=)[ \t\n\f\r]*(.*?)[ \t\n\f\r]*", re.DOTALL
)
MATCHER_FORMS = 'name="value", name!="value", name=~"regex" or name!~"regex"'

# Control characters break terminals and logs (and NUL breaks PostgreSQL); surrogates are not text.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cs"})

# What a name or external id may not hold, beyond those, because an operator acts on what it looks like
# (`unseen_character`): format characters (Cf: zero-width spaces and joiners, bidi overrides and isolates
# that show what follows reversed, the byte-order mark, tag characters), line and paragraph separators
# (Zl, Zp) and unassigned code points (Cn), which draw nothing, move text or draw as anything; and a space
# other than U+0020 SPACE (Zs: a no-break or ideographic space looks like it). "r12" and "r12\u200b" would
# print alike and be two racks.
_UNSEEN_CATEGORIES = _FORBIDDEN_CATEGORIES | {"Cf", "Cn", "Zl", "Zp"}
# Unicode's Default_Ignorable_Code_Point characters that are not format characters, which draw nothing
# either: the combining grapheme joiner, the Hangul fillers, Khmer's inherent vowels, Mongolian's free
# variation selectors and the variation selectors.
_DRAWN_AS_NOTHING = frozenset(
    chr(code)
    for first, last in (
        (0x034F, 0x034F),
        (0x115F, 0x1160),
        (0x17B4, 0x17B5),
        (0x180B, 0x180F),
        (0x3164, 0x3164),
        (0xFE00, 0xFE0F),
        (0xFFA0, 0xFFA0),
        (0xE0100, 0xE01EF),
    )
    for code in range(first, last + 1)
)
# The names Unicode gives no name to, by their category (as its charts write them).
_UNNAMED = {"Cc": "<control>", "Cs": "<surrogate>", "Cn": "<unassigned>"}
NAME_RULE = (
    "names and external ids may not hold control, format or invisible characters, "
    "nor begin or end with whitespace"
)


def field_path(prefix: str, name: str) -> str:
    """`name` inside the message at `prefix` ("" for the request itself)."""
    return f"{prefix}.{name}" if prefix else name


def check_text(value: str, field: str, *, required: bool = False, identifier: bool = False) -> str:
    """A stored name, external id, version or principal: at most MAX_TEXT_LENGTH characters, no control
    characters; `required`: not empty.

    `identifier`: a new name or external id, which an operator picks by what it looks like: it must look
    like nothing else (`check_identifier`). Lookups check text without it, so that a name stored before
    that rule still finds its rack.
    """
    if not value:
        if required:
            raise InvalidArgument(f"{field}: must not be empty")
        return value
    if len(value) > MAX_TEXT_LENGTH:
        raise InvalidArgument(f"{field}: at most {MAX_TEXT_LENGTH} characters, got {len(value)}")
    if identifier:
        return check_identifier(value, field)
    if has_control_characters(value):
        raise InvalidArgument(f"{field}: {value!r} contains control characters")
    return value


def check_identifier(value: str, field: str) -> str:
    """A name or external id that shows as what it is: no character `unseen_character` finds, no
    whitespace at either end ("r1" and "r1 " would look like one name to an operator but be two to the
    database), and in Unicode's normal form NFC: "é" written as one character or as "e" and a combining
    accent looks the same, and the database would hold two names. A name not in NFC is refused rather than
    normalised, so that what is stored is what was sent and every lookup stays exact."""
    found = unseen_character(value)
    if found is None and value != value.strip():
        found = 0 if value[0].isspace() else len(value) - 1
    if found is not None:
        where = f"position {found + 1}"
        if value[found].isspace() and found in (0, len(value) - 1):
            where += " (the start)" if found == 0 else " (the end)"
        raise InvalidArgument(
            f"{field}: {value!r}: {code_point(value[found])} at {where} is not allowed; {NAME_RULE}"
        )
    if not unicodedata.is_normalized("NFC", value):
        normal = unicodedata.normalize("NFC", value)
        raise InvalidArgument(  # !a: the two differ only in code points that look alike
            f"{field}: {value!a} is not in Unicode normal form NFC; {normal!a} looks the same and "
            "is: send that (an accented letter as one character, not a letter and a combining accent)"
        )
    return value


def unseen_character(value: str) -> int | None:
    """The index of the first character in `value` that is not seen as itself (`is_unseen`), or None."""
    return next((index for index, char in enumerate(value) if is_unseen(char)), None)


def is_unseen(char: str) -> bool:
    """Whether a terminal or a browser does not show `char` as itself: a control, format, surrogate or
    unassigned code point, a line or paragraph separator, a space other than U+0020, or a character
    Unicode says draws nothing."""
    category = unicodedata.category(char)
    return category in _UNSEEN_CATEGORIES or char in _DRAWN_AS_NOTHING or (category == "Zs" and char != " ")


# What is laid out, not escaped, where free text is shown (a description): a newline, a tab.
_LAID_OUT = frozenset("\n\t")


def escaped_when_shown(char: str) -> bool:
    """Whether `shown` escapes `char`: it does not show as itself, and is not laid out."""
    return char not in _LAID_OUT and is_unseen(char)


def shown(text: str) -> str:
    """`text` with each character that would not show as itself (`is_unseen`) written as Python writes it
    in a string ("\\u200b"): a name stored before names were refused such characters then neither shows as
    another ("r12\\u200b" as "r12") nor turns what follows it around (U+202E). The CLI's tables and the
    console's pages (its `shown` filter) show text so."""
    return "".join(ascii(char)[1:-1] if escaped_when_shown(char) else char for char in text)


def code_point(char: str) -> str:
    """`char` as Unicode writes it: "U+200B ZERO WIDTH SPACE", "U+0007 <control>"."""
    name = unicodedata.name(char, "") or _UNNAMED.get(unicodedata.category(char), "<unnamed>")
    return f"U+{ord(char):04X} {name}"


def has_control_characters(value: str) -> bool:
    """Whether `value` holds a control character or a lone surrogate: refused in every text rackflow stores
    (PostgreSQL cannot store a NUL, and no name or URL needs one)."""
    return any(unicodedata.category(ch) in _FORBIDDEN_CATEGORIES for ch in value)


def controls_escaped(value: str) -> str:
    """`value` with each control character or lone surrogate written as Python writes it in a string (`\\n`,
    `\\x00`, `\\x1b`): text from outside that rackflow stores and shows without refusing it (a pre-flight
    hook's reason, an alert's labels), which PostgreSQL could not store (a NUL) and a terminal would obey (an
    escape sequence)."""
    if not has_control_characters(value):
        return value
    forbidden = _FORBIDDEN_CATEGORIES
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch) in forbidden else ch for ch in value)


def http_url(url: str) -> SplitResult | None:
    """`url`'s parts when it is an http:// or https:// URL with a host (and a port, if any, in range), with
    no control character or space, else None: also for what urlsplit cannot parse at all (it raises
    ValueError for "http://[::1", and `port` for ":99999", which must be refusals, not errors, and never
    stored: every read of the URL would fail)."""
    if has_control_characters(url) or any(ch.isspace() for ch in url):
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    return parts if parts.scheme in ("http", "https") and host and port != 0 else None


def check_name(name: str, field: str) -> str:
    """A rack, domain, component or schedule name: required, an identifier (`check_text`), and not a UUID:
    a reference that reads as one is taken as an id (`ids.is_uuid`), so a rack named after another's id
    would have the CLI act on that other rack."""
    check_text(name, field, required=True, identifier=True)
    if is_uuid(name):
        raise InvalidArgument(
            f"{field}: {name!r} reads as an id (a UUID), and a reference that does is taken as one; "
            "choose a name that does not"
        )
    return name


def check_rename(name: str, field: str, current: str) -> str:
    """The name an update gives an object named `current`: a new one is checked as on create
    (`check_name`); the one it has is kept as it is, so that a name stored before a rule was added still
    lets its object be edited, by a form that sends every field back too."""
    return name if name == current else check_name(name, field)


def check_description(description: str, field: str = "description") -> str:
    """Free text for people (newlines and tabs welcome), at most MAX_DESCRIPTION_LENGTH characters, no NUL."""
    if len(description) > MAX_DESCRIPTION_LENGTH:
        raise InvalidArgument(f"{field}: at most {MAX_DESCRIPTION_LENGTH} characters, got {len(description)}")
    if "\x00" in description:
        raise InvalidArgument(f"{field}: must not contain NUL characters")
    return description


MAX_REQUEST_ID_LENGTH = 64
_REQUEST_ID_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def check_request_id(value: str, field: str = "request_id") -> str | None:
    """A client's id of one trigger or retry, so that sending it again does not fire again
    (docs/SCHEDULES.md): at most MAX_REQUEST_ID_LENGTH characters of [A-Za-z0-9._:-] (a UUID fits, and
    nothing that needs quoting in a log line or a CLI argument); empty is none."""
    if not value:
        return None
    if len(value) > MAX_REQUEST_ID_LENGTH:
        raise InvalidArgument(f"{field}: at most {MAX_REQUEST_ID_LENGTH} characters, got {len(value)}")
    if not set(value) <= _REQUEST_ID_CHARACTERS:
        raise InvalidArgument(f"{field}: {value!r} may hold only letters, digits and . _ : -")
    return value


def check_target_version(version: str, field: str = "target_version") -> str:
    """A firmware upgrade's target: required, and stored text (it becomes components' firmware_version)."""
    if not version.strip():
        raise InvalidArgument(f"{field}: a firmware upgrade needs a target version")
    return check_text(version, field)


def check_window(
    start: datetime | None, end: datetime | None, start_field: str = "start_time", end_field: str = "end_time"
) -> None:
    """A maintenance window, when both ends are given, ends after it starts."""
    if start is not None and end is not None and end <= start:
        raise InvalidArgument(
            f"{end_field}: {end.isoformat()} is not after {start_field} {start.isoformat()}"
        )


def check_window_not_over(operation: Operation, now: datetime, field: str, too_late: str) -> Operation:
    """A firmware upgrade whose window (`end_time`) has ended by `now` is refused, saying what would be
    `too_late`: its task would fail unrun at its first claim (`Operation.window_over`). No tolerance for a
    client's clock: what is refused here is what the executor's claim, later still, would fail."""
    if operation.window_end is not None and operation.window_over(now):
        raise InvalidArgument(
            f"{field_path(field, 'end_time')}: {format_rfc3339(operation.window_end)} has passed "
            f"(now {format_rfc3339(now)}): {too_late}"
        )
    return operation


def check_operation(operation: Operation, field: str = "") -> Operation:
    """What an operation needs beyond its kind: a firmware upgrade's target version and window order."""
    if operation.kind is OperationKind.UPGRADE_FIRMWARE:
        check_target_version(operation.target_version, field_path(field, "target_version"))
    check_window(
        operation.window_start,
        operation.window_end,
        field_path(field, "start_time"),
        field_path(field, "end_time"),
    )
    return operation


# The most racks (or components, or domains) one request may name: a target spec's, and the racks and domains
# a window or a pre-flight check covers, which every claim of a task asks about its rack.
MAX_TARGETS = 10_000


def at_most(values: Sized, limit: int, field: str, what: str) -> None:
    """A list a request gives that rackflow stores and walks again and again (at each event, at each
    claim) is bounded: more than `limit` is refused as `field: at most <limit> <what>, got <n>`."""
    if len(values) > limit:
        raise InvalidArgument(f"{field}: at most {limit} {what}, got {len(values)}")


def distinct_operations(operations: Sequence[OperationKind], field: str) -> frozenset[OperationKind]:
    """A list of operations (a window's, a budget's) naming none twice; `field[i]` names the repeat."""
    seen: set[OperationKind] = set()
    for index, operation in enumerate(operations):
        if operation in seen:
            raise InvalidArgument(f"{field}[{index}]: {operation.value} is listed twice")
        seen.add(operation)
    return frozenset(seen)


def queue_timeout(seconds: float, field: str = "queue_options.queue_timeout_seconds") -> timedelta:
    """How long a queued task may wait: 0 means the default (DEFAULT_QUEUE_TIMEOUT), otherwise more than 0
    and at most MAX_QUEUE_TIMEOUT."""
    limit = int(MAX_QUEUE_TIMEOUT.total_seconds())
    if seconds == 0:
        return DEFAULT_QUEUE_TIMEOUT
    if not 0 < seconds <= limit:
        raise InvalidArgument(
            f"{field}: must be between 0 (the default, {int(DEFAULT_QUEUE_TIMEOUT.total_seconds())}) "
            f"and {limit}, got {seconds:g}"
        )
    return timedelta(seconds=seconds)


def check_queue(queue: QueueOptions, field: str = "queue_options") -> QueueOptions:
    """The queue options with their timeout checked, and a zero timeout made the default (the same
    options when that changes nothing)."""
    timeout = queue_timeout(queue.timeout.total_seconds(), f"{field}.queue_timeout_seconds")
    return queue if timeout == queue.timeout else replace(queue, timeout=timeout)


def preview_count(count: int, field: str = "count") -> int:
    """How many entries a preview lists: 1..MAX_PREVIEW_COUNT, and 0 means DEFAULT_PREVIEW_COUNT."""
    if count < 0 or count > MAX_PREVIEW_COUNT:
        raise InvalidArgument(
            f"{field}: must be 1..{MAX_PREVIEW_COUNT} (0 means {DEFAULT_PREVIEW_COUNT}), got {count}"
        )
    return count or DEFAULT_PREVIEW_COUNT


def check_mask(paths: Collection[str], allowed: Sequence[str], field: str = "update_mask") -> set[str]:
    """An update's field mask: at least one path, each one of `allowed`."""
    if not paths:
        raise InvalidArgument(f"{field}: at least one path is required ({', '.join(allowed)})")
    for path in paths:
        if path not in allowed:
            raise InvalidArgument(f"{field}: unknown path {path!r} (allowed: {', '.join(allowed)})")
    return set(paths)


def bake_time(text: str, field: str = "schedule.rollout.bake_time") -> timedelta:
    """A rollout's bake time: a positive Go duration (as every duration flag takes), or "" for none."""
    return parse_interval(text, field) if text else timedelta(0)


def check_rollout(policy: RolloutPolicy, field: str = "schedule.rollout") -> RolloutPolicy:
    """Counts are not negative (0: no limit), the failure percentage is 0..100 (0: none), the bake time
    is not negative (a zero from the API means none: `bake_time` refuses a written zero), and there is no
    bake without canaries (`bakes_without_canaries`)."""
    for name in ("max_concurrent_racks", "max_per_domain", "canary_racks", "halt_after_failures"):
        value = getattr(policy, name)
        if value < 0:
            raise InvalidArgument(f"{field_path(field, name)}: must not be negative, got {value}")
    percent = policy.halt_after_failure_percent
    if not 0 <= percent <= 100:
        raise InvalidArgument(
            f"{field_path(field, 'halt_after_failure_percent')}: must be 0..100, got {percent:g}"
        )
    if policy.bake_time < timedelta(0):
        raise InvalidArgument(f"{field_path(field, 'bake_time')}: must be positive")
    if bakes_without_canaries(policy.canary_racks, bool(policy.bake_time)):
        raise InvalidArgument(
            f"{field_path(field, 'bake_time')}: applies with canary_racks: the bake is the wait after the "
            f"canaries, and this policy has none; set {field_path(field, 'canary_racks')}, "
            "or drop the bake time"
        )
    return policy


def approval_policy(
    required: bool, timeout: str, min_approvers: int, field: str = "schedule.approval"
) -> ApprovalPolicy | None:
    """A schedule's approval policy as a request gives it: None when not `required`; else a positive Go
    duration of at most MAX_APPROVAL_TIMEOUT, and 1..MAX_APPROVERS approvers (0 means 1)."""
    if not required:
        if timeout or min_approvers:
            raise InvalidArgument(
                f"{field_path(field, 'required')}: must be true when a timeout or min_approvers is given"
            )
        return None
    if not timeout:
        raise InvalidArgument(f"{field_path(field, 'timeout')}: required (a Go duration such as 4h)")
    waits = parse_interval(timeout, field_path(field, "timeout"))
    if waits > MAX_APPROVAL_TIMEOUT:
        raise InvalidArgument(f"{field_path(field, 'timeout')}: at most 720h (30 days), got {timeout!r}")
    if not 0 <= min_approvers <= MAX_APPROVERS:
        where = field_path(field, "min_approvers")
        raise InvalidArgument(f"{where}: must be 1..{MAX_APPROVERS} (0 means 1), got {min_approvers}")
    return ApprovalPolicy(waits, min_approvers or 1)


def retry_from(
    max_attempts: int,
    initial_backoff: str,
    multiplier: float,
    max_backoff: str,
    field: str = "schedule.retry",
) -> RetryPolicy:
    """A retry policy as the API and the CLI give it (Go durations; "" and 0 take config.py's defaults),
    checked."""
    policy = RetryPolicy(
        max_attempts=max_attempts,
        initial_backoff=(
            parse_interval(initial_backoff, field_path(field, "initial_backoff"))
            if initial_backoff
            else DEFAULT_RETRY_INITIAL_BACKOFF
        ),
        multiplier=multiplier or DEFAULT_RETRY_MULTIPLIER,
        max_backoff=(
            parse_interval(max_backoff, field_path(field, "max_backoff"))
            if max_backoff
            else DEFAULT_RETRY_MAX_BACKOFF
        ),
    )
    return check_retry(policy, field)


def check_retry(policy: RetryPolicy, field: str = "schedule.retry") -> RetryPolicy:
    """2..MAX_RETRY_ATTEMPTS attempts (one attempt is no policy at all), back-offs positive with the
    initial one at most the maximum and the maximum at most MAX_RETRY_BACKOFF, a multiplier of
    1..MAX_RETRY_MULTIPLIER. Attempts left out (0: a back-off given alone) are "required", not "got 0"."""
    if policy.max_attempts == 0:
        raise InvalidArgument(
            f"{field_path(field, 'max_attempts')}: required (attempts in all, the first included: "
            f"2..{MAX_RETRY_ATTEMPTS})"
        )
    if not 2 <= policy.max_attempts <= MAX_RETRY_ATTEMPTS:
        raise InvalidArgument(
            f"{field_path(field, 'max_attempts')}: must be 2..{MAX_RETRY_ATTEMPTS}, got {policy.max_attempts}"
        )
    if not 1 <= policy.multiplier <= MAX_RETRY_MULTIPLIER:
        raise InvalidArgument(
            f"{field_path(field, 'multiplier')}: must be 1..{MAX_RETRY_MULTIPLIER:g}, "
            f"got {policy.multiplier:g}"
        )
    for name in ("initial_backoff", "max_backoff"):
        value: timedelta = getattr(policy, name)
        if not timedelta(0) < value <= MAX_RETRY_BACKOFF:
            raise InvalidArgument(
                f"{field_path(field, name)}: must be positive and at most "
                f"{format_go_duration(MAX_RETRY_BACKOFF)}, got {format_go_duration(value)}"
            )
    if policy.initial_backoff > policy.max_backoff:
        raise InvalidArgument(
            f"{field_path(field, 'initial_backoff')}: {format_go_duration(policy.initial_backoff)} is "
            f"longer than max_backoff {format_go_duration(policy.max_backoff)}"
        )
    return policy


_E = TypeVar("_E", bound=enum.StrEnum)


def enum_values(kind: type[_E], names: Sequence[str], field: str, what: str) -> tuple[_E, ...]:
    """Each name as a member of `kind`; an unknown one is refused as `field[i]: unknown <what> …` with the
    names known."""
    found = []
    for index, name in enumerate(names):
        try:
            found.append(kind(name))
        except ValueError:
            known = ", ".join(member.value for member in kind)
            raise InvalidArgument(f"{field}[{index}]: unknown {what} {name!r} (one of {known})") from None
    return tuple(found)


MAX_PAUSE_AFTER_FAILED_RUNS = 100  # a schedule keeps its newest 100 runs: a longer streak cannot be seen


def start_deadline(text: str, field: str = "schedule.start_deadline") -> timedelta | None:
    """A start deadline: "" for none of its own (the server's default applies), a Go duration of at least
    MIN_START_DEADLINE, or a zero ("0", "0s") for none at all, whatever the server's default."""
    if not text:
        return None
    try:
        ns = parse_go_duration(text)
    except ValueError as exc:
        raise InvalidArgument(f"{field}: {exc}") from None
    if ns == 0:
        return timedelta(0)
    deadline = timedelta(microseconds=ns // 1000)
    if deadline < MIN_START_DEADLINE:
        raise InvalidArgument(
            f"{field}: must be at least {format_go_duration(MIN_START_DEADLINE)}, or 0 for none, got {text!r}"
        )
    return deadline


def check_pause_after_failed_runs(count: int, field: str = "schedule.pause_after_failed_runs") -> int:
    """0 (never) .. MAX_PAUSE_AFTER_FAILED_RUNS."""
    if not 0 <= count <= MAX_PAUSE_AFTER_FAILED_RUNS:
        raise InvalidArgument(f"{field}: must be 0..{MAX_PAUSE_AFTER_FAILED_RUNS} (0: never), got {count}")
    return count


def alertmanager_matcher(matcher: str, field: str, *, rendered: str | None = None) -> str:
    """A matcher Alertmanager's API v2 accepts as a `filter`; `rendered`: the matcher with its placeholders
    filled in, as it will be sent (the error names `matcher`, as the operator wrote it).

    Alertmanager answers a matcher it cannot parse with 400, so a check that stored one could never ask:
    fail-closed it held every task it applied to until the maximum wait failed them, fail-open it let every
    rack through. The value is unquoted and unescaped as Alertmanager does (`\\"` a quote, `\\n` a newline); a
    regex must compile. Alertmanager compiles it with Go's RE2, here Python's `re` compiles it, and what
    Python has and RE2 lacks (a lookahead such as `(?!Rackflow)`, a backreference, …) is refused as well;
    what only RE2 takes (`\\pL`, a flag group mid-pattern) is refused too (docs/CHECKS.md)."""
    check_text(matcher, field, required=True)
    text = matcher if rendered is None else rendered
    found = _MATCHER.fullmatch(text)
    if found is None:
        raise InvalidArgument(f"{field}: {matcher!r} is not an Alertmanager matcher ({MATCHER_FORMS})")
    operator, raw = found.group(2), found.group(3)
    quoted = raw.startswith('"')
    if quoted:
        raw = raw[1:]
    value: list[str] = []
    escaped = False
    for index, char in enumerate(raw):
        if escaped:
            value.append("\n" if char == "n" else char)
            escaped = False
        elif char == "\\" and index < len(raw) - 1:
            escaped = True
        elif char == '"':
            if not quoted or index < len(raw) - 1:
                why = 'a quote inside the value must be escaped as \\"'
                raise InvalidArgument(f"{field}: {matcher!r} is not an Alertmanager matcher ({why})")
            quoted = False
        else:
            value.append(char)
    if quoted:
        raise InvalidArgument(
            f"{field}: {matcher!r} is not an Alertmanager matcher (its value lacks the closing quote)"
        )
    if operator in ("=~", "!~"):
        pattern = "".join(value)
        try:
            re.compile(pattern)  # Alertmanager anchors it in a group, where Python refuses `(?i)`
        except re.error as exc:
            raise InvalidArgument(f"{field}: {matcher!r}: the regex does not compile ({exc})") from None
        lacking = _not_in_re2(pattern)
        if lacking:
            why = f"{lacking}, which Alertmanager's regexes (Go RE2) do not have"
            raise InvalidArgument(f"{field}: {matcher!r}: the regex uses {why}")
    return matcher


# What Python's `re` compiles and RE2 refuses, as each group opens: `(?!Rackflow)` is the likely one.
_RE2_LACKS = (
    ("(?=", "a lookahead"),
    ("(?!", "a lookahead"),
    ("(?<=", "a lookbehind"),
    ("(?<!", "a lookbehind"),
    ("(?P=", "a backreference"),
    ("(?(", "a conditional"),
    ("(?>", "an atomic group"),
    ("(?#", "a comment"),
)


def _not_in_re2(pattern: str) -> str:
    """The first construct of `pattern` (which Python compiled) that RE2 lacks, or "": the groups above, a
    backreference `\\1`, a possessive quantifier `a*+`. Escapes and character classes are skipped."""
    index, in_class, after_quantifier = 0, False, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            if not in_class and pattern[index + 1 : index + 2] in tuple("123456789"):
                return "a backreference"
            index, after_quantifier = index + 2, False
            continue
        if in_class:
            in_class = char != "]"
            index += 1
            continue
        if char == "[":
            index += 2 if pattern.startswith("[^", index) else 1
            index += 1 if pattern[index : index + 1] == "]" else 0  # a leading ] is a member
            in_class, after_quantifier = True, False
            continue
        for opening, name in _RE2_LACKS:
            if pattern.startswith(opening, index):
                return name
        if char == "+" and after_quantifier:
            return "a possessive quantifier"
        # `a*?` is lazy, which RE2 has: after a `?` that follows a quantifier, no `+` is possessive.
        counted = char == "}" and re.search(r"\{\d+(,\d*)?\}\Z", pattern[: index + 1]) is not None
        after_quantifier = (char in "*+?" or counted) and not (char == "?" and after_quantifier)
        index += 1
    return ""
