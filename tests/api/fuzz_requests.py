"""Hypothesis strategies for a request to every RPC of the `Flow` service, for the fuzz tests.

Each value is drawn from a mix of garbage (random text with NUL and other control characters, strings
around the length limits, huge and negative numbers, unknown enum numbers, malformed UUIDs, timestamps
outside any calendar) and values that exist in the seeded database (`Known`: rack names, schedule ids, …),
so that requests get past the first converter and reach the services and the store too.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import strategies as st

from rackflow.v1 import flow_pb2 as pb

_M = TypeVar("_M", bound=Message)
Strategy = st.SearchStrategy

# fmt: off
INT32 = (-(2**31), 2**31 - 1)
TRICKY_TEXT = (
    "", " ", "\x00", "a\x00b", "\t", "\n", "x ", " x", "\u202e", "\U0001f600", "%", "_", "\\", "'", '"',
    "'; DROP TABLE racks; --", "Local", "UTC", "../../etc/passwd", "null", "*", "0", "-1",
)
SPEC_TEXT = (
    "1s", "1h", "0", "-1s", "1.5h", "1us", "1ns", "2562047h", "2562048h", "9223372036854775807ns",
    "9223372036854775808ns", "1d", "+5m", "* * * * *", "*/5 * * * *", "0 0 30 2 *", "0 0 29 2 *",
    "@every 1h", "CRON_TZ=UTC * * * *", "TZ=UTC * * * *", "@daily", "@hourly", "@reboot", "61 * * * *",
    "0 0 * * 7", "0-59/0 * * * *", "99999999999999999999 * * * *", "2030-01-01T00:00:00Z",
    "2030-01-01T00:00:00", "2000-01-01T00:00:00+01:00", "0001-01-01T00:00:00Z",
    "9999-12-31T23:59:59.999999999Z", "2030-02-30T00:00:00Z", "2030-01-01t00:00:00z",
)
ZONES = ("", "UTC", "Europe/Paris", "America/New_York", "EST", "US/Eastern", "Local", "Mars/Olympus")
MASK_PATHS = (
    "schedule.name", "schedule.overlap_policy", "schedule.spec", "schedule.spec.timezone", "schedule.rollout",
    "schedule.retry",
    "schedule", "schedule.window_policy", "name", "schedule.enabled", "schedule.spec.type", "*", "",
)
# fmt: on
TIMESTAMP_SECONDS = (0, -1, -62135596800, -62135596801, 253402300799, 253402300800, 1_900_000_000)
OPERATIONS = ("power_on", "power_off", "power_reset", "bring_up", "upgrade_firmware", "ingest")


@dataclass
class Known:
    """Names and ids that exist in the seeded database (some may be deleted by the fuzzing itself)."""

    rack_ids: list[str] = field(default_factory=list)
    rack_names: list[str] = field(default_factory=list)
    rack_external_ids: list[str] = field(default_factory=list)
    component_ids: list[str] = field(default_factory=list)
    component_external_ids: list[str] = field(default_factory=list)
    domain_ids: list[str] = field(default_factory=list)
    domain_names: list[str] = field(default_factory=list)
    schedule_ids: list[str] = field(default_factory=list)
    schedule_names: list[str] = field(default_factory=list)
    scope_ids: list[str] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    window_ids: list[str] = field(default_factory=list)
    window_names: list[str] = field(default_factory=list)
    budget_ids: list[str] = field(default_factory=list)
    budget_names: list[str] = field(default_factory=list)
    channel_ids: list[str] = field(default_factory=list)
    channel_names: list[str] = field(default_factory=list)
    check_ids: list[str] = field(default_factory=list)
    check_names: list[str] = field(default_factory=list)


def build(cls: type[_M], **fields: Strategy[Any]) -> Strategy[_M]:
    """`cls(**drawn)` with the fields drawn as None left unset (absent optional fields)."""
    return st.fixed_dictionaries(fields).map(lambda kw: cls(**{k: v for k, v in kw.items() if v is not None}))


def maybe(strategy: Strategy[Any]) -> Strategy[Any]:
    """An optional field: absent half the time."""
    return st.none() | strategy


def present(strategy: Strategy[Any]) -> Strategy[Any]:
    """A field the request needs: absent only one time in four."""
    return usually(strategy, st.none())


def usually(valid: Strategy[Any], otherwise: Strategy[Any]) -> Strategy[Any]:
    """`valid` three times in four, so one bad field at a time gets past the others to where it matters.

    (Not `st.one_of(valid, valid, valid, otherwise)`: one_of drops repeated branches.)
    """
    return st.sampled_from((valid, valid, valid, otherwise)).flatmap(lambda chosen: chosen)


def garbage_text() -> Strategy[str]:
    """Tricky text (NUL and other control characters most of all), random text, and strings around
    the 255/256 limits."""
    around_limits = st.tuples(st.sampled_from("xé\U0001f600"), st.integers(250, 260)).map(
        lambda cn: cn[0] * cn[1]
    )
    nul = st.sampled_from(("\x00", "a\x00b", "fz-0\x00"))  # PostgreSQL refuses NUL in any text
    controls = st.text(alphabet=st.sampled_from("\x00\x01\x1b\x7f\t\n a"), min_size=1, max_size=4)
    return st.one_of(nul, st.sampled_from(TRICKY_TEXT), controls, st.text(max_size=24), around_limits)


def texts(known: Sequence[str] = (), *, plain: Sequence[str] = ("nightly", "fw-2.1")) -> Strategy[str]:
    """Mostly a known value (or a plain one), otherwise garbage."""
    return usually(st.sampled_from(list(known) or list(plain)), garbage_text())


def ids(known: Sequence[str] = ()) -> Strategy[pb.UUID]:
    sample = str(uuid.UUID(int=12345))
    malformed = st.sampled_from(
        (
            sample.upper(),
            "{" + sample + "}",
            "urn:uuid:" + sample,
            sample.replace("-", ""),
            " " + sample,
            sample + "\x00",
            str(uuid.UUID(int=0)),
            str(uuid.UUID(int=2**128 - 1)),
        )
    )
    other = st.one_of(st.uuids().map(str), malformed, garbage_text())
    value = usually(st.sampled_from(known), other) if known else other
    return value.map(lambda text: pb.UUID(id=text))


def int32s(*interesting: int) -> Strategy[int]:
    return usually(
        st.sampled_from((0, 1, 10, *interesting)), st.sampled_from((-1, *INT32)) | st.integers(*INT32)
    )


def enums(values: Sequence[int]) -> Strategy[int]:
    """Defined numbers, or any other int32 (proto3 enums are open: unknown numbers reach the server)."""
    return usually(st.sampled_from(values), st.integers(*INT32))


def timestamps() -> Strategy[Timestamp]:
    seconds = usually(
        st.integers(1_700_000_000, 2_000_000_000),
        st.sampled_from(TIMESTAMP_SECONDS) | st.integers(-(2**63), 2**63 - 1),
    )
    nanos = usually(st.just(0), st.integers(*INT32))
    return st.builds(Timestamp, seconds=seconds, nanos=nanos)


def pages() -> Strategy[pb.Pagination]:
    return build(pb.Pagination, offset=int32s(), limit=int32s(999, 10_000))


COMPONENT_TYPES = enums(list(pb.ComponentType.values()))


def component_type_lists() -> Strategy[list[int]]:
    return usually(st.just([]), st.lists(COMPONENT_TYPES, max_size=4))


def rack_targets(k: Known) -> Strategy[pb.RackTarget]:
    types = component_type_lists()
    return usually(
        build(pb.RackTarget, name=texts(k.rack_names), component_types=types),
        st.one_of(
            build(pb.RackTarget, id=ids(k.rack_ids), component_types=types),
            build(pb.RackTarget, external_id=texts(k.rack_external_ids), component_types=types),
            build(pb.RackTarget, component_types=types),
        ),
    )


def component_targets(k: Known) -> Strategy[pb.ComponentTarget]:
    external = build(pb.ExternalRef, type=COMPONENT_TYPES, id=texts(k.component_external_ids))
    return st.one_of(
        build(pb.ComponentTarget, id=ids(k.component_ids)),
        build(pb.ComponentTarget, external=external),
        st.just(pb.ComponentTarget()),
    )


def domain_targets(k: Known) -> Strategy[pb.NVLDomainTarget]:
    types = component_type_lists()
    return st.one_of(
        build(pb.NVLDomainTarget, id=ids(k.domain_ids), component_types=types),
        build(pb.NVLDomainTarget, name=texts(k.domain_names), component_types=types),
        build(pb.NVLDomainTarget, component_types=types),
    )


def target_specs(k: Known) -> Strategy[pb.OperationTargetSpec]:
    """Mostly racks; up to 4 targets of one kind (the small pools of known values make duplicates
    common), or none."""
    racks = build(pb.RackTargets, targets=st.lists(rack_targets(k), min_size=1, max_size=4))
    components = build(pb.ComponentTargets, targets=st.lists(component_targets(k), max_size=4))
    domains = build(pb.NVLDomainTargets, targets=st.lists(domain_targets(k), max_size=4))
    return usually(
        build(pb.OperationTargetSpec, racks=racks),
        st.one_of(
            st.just(pb.OperationTargetSpec()),
            build(pb.OperationTargetSpec, racks=build(pb.RackTargets)),
            build(pb.OperationTargetSpec, components=components),
            build(pb.OperationTargetSpec, nvl_domains=domains),
        ),
    )


def descriptions() -> Strategy[str]:
    return usually(st.just("fuzz"), garbage_text() | st.integers(1020, 1030).map(lambda n: "d" * n))


def queue_options() -> Strategy[pb.QueueOptions]:
    strategies = enums(list(pb.ConflictStrategy.values()))
    return build(
        pb.QueueOptions,
        conflict_strategy=strategies,
        queue_timeout_seconds=int32s(86400, 86401),
        ignore_windows=st.booleans(),
    )


def operation_request(name: str, k: Known) -> Strategy[Message]:
    """The submit request of operation `name` (`power_on`, …), as its RPC and a schedule take it."""
    common: dict[str, Strategy[Any]] = {
        "target_spec": present(target_specs(k)),
        "description": descriptions(),
        "queue_options": maybe(queue_options()),
    }
    if name in ("power_off", "power_reset"):
        common["forced"] = st.booleans()
    if name == "upgrade_firmware":
        common.update(target_version=texts(), start_time=maybe(timestamps()), end_time=maybe(timestamps()))
    cls = {
        "power_on": pb.PowerOnRackRequest,
        "power_off": pb.PowerOffRackRequest,
        "power_reset": pb.PowerResetRackRequest,
        "bring_up": pb.BringUpRackRequest,
        "ingest": pb.IngestRackRequest,
        "upgrade_firmware": pb.UpgradeFirmwareRequest,
    }[name]
    return build(cls, **common)


def scheduled_operations(k: Known) -> Strategy[pb.ScheduledOperation]:
    one = st.sampled_from(OPERATIONS).flatmap(
        lambda name: operation_request(name, k).map(lambda msg: pb.ScheduledOperation(**{name: msg}))
    )
    return usually(one, st.just(pb.ScheduledOperation()))


def schedule_specs() -> Strategy[pb.ScheduleSpec]:
    """Mostly a valid spec of each type; otherwise any type number with any text and zone."""
    valid = st.sampled_from(
        (
            pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="1h"),
            pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_CRON, spec="0 3 * * *", timezone="Europe/Paris"),
            pb.ScheduleSpec(type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME, spec="2030-01-01T00:00:00Z"),
        )
    )
    spec = (
        st.sampled_from(SPEC_TEXT) | garbage_text() | st.integers(255, 258).map(lambda n: "1" * (n - 1) + "s")
    )
    anything = build(
        pb.ScheduleSpec,
        type=enums(list(pb.ScheduleSpecType.values())),
        spec=spec,
        timezone=usually(st.sampled_from(ZONES), garbage_text()),
    )
    return st.one_of(valid, anything)


def schedule_configs(k: Known) -> Strategy[pb.ScheduleConfig]:
    return build(
        pb.ScheduleConfig,
        name=usually(st.text(alphabet="abcxyz-", min_size=1, max_size=8), texts(k.schedule_names)),
        spec=present(schedule_specs()),
        overlap_policy=enums(list(pb.OverlapPolicy.values())),
        window_policy=enums(list(pb.WindowPolicy.values())),
        rollout=maybe(rollout_policies()),
        approval=maybe(approval_policies()),
        retry=maybe(retry_policies()),
    )


def approval_policies() -> Strategy[pb.ApprovalPolicy]:
    return build(
        pb.ApprovalPolicy,
        required=st.booleans(),
        timeout=st.sampled_from(("", "4h", "0s", "-1h", "800h", "later")) | garbage_text(),
        min_approvers=int32s(3),
    )


def retry_policies() -> Strategy[pb.RetryPolicy]:
    backoffs = usually(
        st.sampled_from(("", "1s", "30s", "10m")), st.sampled_from(("0", "-1s", "48h")) | garbage_text()
    )
    return build(
        pb.RetryPolicy,
        max_attempts=int32s(3),
        initial_backoff=backoffs,
        multiplier=usually(st.sampled_from((0.0, 1.0, 2.0)), st.floats()),
        max_backoff=backoffs,
    )


def rollout_policies() -> Strategy[pb.RolloutPolicy]:
    return build(
        pb.RolloutPolicy,
        max_concurrent_racks=int32s(2),
        max_per_domain=int32s(),
        canary_racks=int32s(),
        bake_time=usually(
            st.sampled_from(("", "15m", "1s")), st.sampled_from(("0", "-1s", "1d")) | garbage_text()
        ),
        halt_after_failures=int32s(),
        halt_after_failure_percent=usually(st.sampled_from((0.0, 10.0, 100.0)), st.floats()),
        pause_on_halt=maybe(st.booleans()),
    )


WINDOW_MASK_PATHS = (
    "window.name", "window.reason", "window.kind", "window.when", "window.racks", "window.nvl_domains",
    "window.operations",
)  # fmt: skip


def window_targets(known_ids: Sequence[str], known_names: Sequence[str]) -> Strategy[pb.WindowTarget]:
    return st.one_of(
        build(pb.WindowTarget, name=texts(known_names)),
        build(pb.WindowTarget, id=ids(known_ids)),
        st.just(pb.WindowTarget()),
    )


def maintenance_windows(k: Known) -> Strategy[pb.MaintenanceWindow]:
    """Mostly a valid recurring or one-off timing; racks and domains known or not; operations."""
    recurring = build(
        pb.RecurringWindow,
        cron=usually(st.sampled_from(("0 22 * * 6", "0 2 * * *", "* * * * *")), st.sampled_from(SPEC_TEXT)),
        duration=usually(st.sampled_from(("6h", "1m", "30m")), st.sampled_from(SPEC_TEXT) | garbage_text()),
        timezone=usually(st.sampled_from(ZONES), garbage_text()),
    )
    one_off = build(pb.OneOffWindow, start=present(timestamps()), end=present(timestamps()))
    return build(
        pb.MaintenanceWindow,
        name=usually(st.text(alphabet="abcxyz-", min_size=1, max_size=8), texts(k.window_names)),
        reason=descriptions(),
        kind=enums(list(pb.WindowKind.values())),
        recurring=maybe(recurring),
        one_off=maybe(one_off),
        racks=st.lists(window_targets(k.rack_ids, k.rack_names), max_size=3),
        nvl_domains=st.lists(window_targets(k.domain_ids, k.domain_names), max_size=2),
        operations=st.lists(usually(st.sampled_from(OPERATIONS), garbage_text()), max_size=3),
    )


BUDGET_MASK_PATHS = (
    "budget.name",
    "budget.operations",
    "budget.max_running",
    "budget.max_running_per_domain",
)


def operation_budgets(k: Known) -> Strategy[pb.OperationBudget]:
    """Mostly known operations and small caps; names new or taken."""
    return build(
        pb.OperationBudget,
        name=usually(st.text(alphabet="abcxyz-", min_size=1, max_size=8), texts(k.budget_names)),
        operations=st.lists(usually(st.sampled_from(OPERATIONS), garbage_text()), max_size=3),
        max_running=int32s(8),
        max_running_per_domain=maybe(int32s(2)),
    )


CHECK_MASK_PATHS = (
    "check.name",
    "check.operations",
    "check.racks",
    "check.nvl_domains",
    "check.kind",
    "check.interval",
    "check.max_wait",
)
DURATIONS = ("", "100ms", "30s", "1h", "0s", "-1s", "99999999h", "soon")


CHANNEL_MASK_PATHS = (
    "channel.name",
    "channel.url",
    "channel.secret",
    "channel.disabled",
    "channel.event_types",
    "channel.schedules",
    "channel.operations",
    "channel.min_severity",
    "channel.rate_per_minute",
    "channel.max_attempts",
)
DELIVERY_STATES = ("pending", "delivered", "dead")
EVENT_TYPES = ("run.halted", "run.halt_cleared", "task.failed", "schedule.paused", "rollout.finished")


def preflight_checks(k: Known) -> Strategy[pb.PreflightCheck]:
    """One kind or none, URLs good or not, secrets as references or not, durations good or not; racks and
    domains known or not."""
    urls = usually(
        st.sampled_from(("http://127.0.0.1:9", "https://am:9093")), st.just("ftp://x") | garbage_text()
    )
    durations = usually(st.sampled_from(DURATIONS[:4]), st.sampled_from(DURATIONS[4:]) | garbage_text())
    operations = st.lists(usually(st.sampled_from(OPERATIONS), garbage_text()), max_size=3)
    return build(
        pb.PreflightCheck,
        name=usually(st.text(alphabet="abcxyz-", min_size=1, max_size=8), texts(k.check_names)),
        operations=operations,
        racks=st.lists(window_targets(k.rack_ids, k.rack_names), max_size=3),
        nvl_domains=st.lists(window_targets(k.domain_ids, k.domain_names), max_size=2),
        alertmanager=maybe(
            build(
                pb.AlertmanagerCheck,
                url=urls,
                matchers=st.lists(texts(plain=('rack="{rack.name}"',)), max_size=2),
            )
        ),
        webhook=maybe(
            build(
                pb.WebhookCheck,
                url=urls,
                secret=usually(st.sampled_from(("", "env:KEY", "file:/k")), garbage_text()),
                timeout=durations,
            )
        ),
        rack_idle=maybe(build(pb.RackIdleCheck, busy_operations=operations, failed_within=durations)),
        interval=durations,
        max_wait=durations,
    )


def notification_channels(k: Known) -> Strategy[pb.NotificationChannel]:
    """Mostly known kinds, event types and severities, loopback URLs; names new or taken."""
    return build(
        pb.NotificationChannel,
        name=usually(st.text(alphabet="abcxyz-", min_size=1, max_size=8), texts(k.channel_names)),
        kind=usually(st.sampled_from(("webhook", "slack", "alertmanager")), garbage_text()),
        url=usually(
            st.sampled_from(("http://127.0.0.1:9/hook", "https://hooks.example.invalid/x")),
            st.sampled_from(("ftp://x", "https://", "http://[::1", "hooks")) | garbage_text(),
        ),
        secret=maybe(usually(st.text(alphabet="abc123", max_size=12), garbage_text())),
        disabled=maybe(st.booleans()),
        event_types=st.lists(usually(st.sampled_from(EVENT_TYPES), garbage_text()), max_size=3),
        schedules=st.lists(texts(k.schedule_names), max_size=2),
        operations=st.lists(usually(st.sampled_from(OPERATIONS), garbage_text()), max_size=3),
        min_severity=maybe(usually(st.sampled_from(("info", "warning", "critical")), garbage_text())),
        rate_per_minute=int32s(60),
        max_attempts=int32s(3, 100, 101),
    )


def component_specs() -> Strategy[pb.ComponentSpec]:
    bmc = build(
        pb.BmcEndpoint,
        url=usually(
            st.sampled_from(("https://10.0.0.5", "http://bmc")),
            st.sampled_from(("ftp://x", "https://", "https://[::1", "https://a:99999")) | garbage_text(),
        ),
        resource=usually(
            st.sampled_from(("Systems/1", "Chassis/PS0", "1")), st.just("../x") | garbage_text()
        ),
        credentials=usually(
            st.just("env:BMC"), st.sampled_from(("file:/etc/bmc", "root:secret", "env:")) | garbage_text()
        ),
    )
    unique = st.text(alphabet="abcdef0123456789", min_size=1, max_size=10)
    return build(
        pb.ComponentSpec,
        type=COMPONENT_TYPES,
        name=usually(unique, garbage_text()),
        external_id=usually(unique, garbage_text()),
        firmware_version=texts(),
        bmc=maybe(bmc),
    )


def requests_by_rpc(k: Known) -> dict[str, Strategy[Message]]:
    """A strategy per RPC name of the `Flow` service."""
    schedule_id, rack_id = ids(k.schedule_ids), ids(k.rack_ids)
    submit = {
        "PowerOnRack": "power_on",
        "PowerOffRack": "power_off",
        "PowerResetRack": "power_reset",
        "BringUpRack": "bring_up",
        "IngestRack": "ingest",
        "UpgradeFirmware": "upgrade_firmware",
    }
    by_schedule_id: dict[str, Callable[..., Message]] = {
        "GetTaskSchedule": pb.GetTaskScheduleRequest,
        "PauseTaskSchedule": pb.PauseTaskScheduleRequest,
        "ResumeTaskSchedule": pb.ResumeTaskScheduleRequest,
        "DeleteTaskSchedule": pb.DeleteTaskScheduleRequest,
        "TriggerTaskSchedule": pb.TriggerTaskScheduleRequest,
    }
    strategies: dict[str, Strategy[Message]] = {
        "CreateRack": build(
            pb.CreateRackRequest,
            name=usually(st.text(alphabet="abcxyz-", min_size=1, max_size=8), texts(k.rack_names)),
            external_id=usually(st.text(alphabet="abcxyz-", max_size=8), texts(k.rack_external_ids)),
            nvl_domain_id=maybe(ids(k.domain_ids)),
            components=st.lists(component_specs(), max_size=4),
        ),
        # By id, or by name (half the time with an id as well, which is refused).
        "GetRack": build(pb.GetRackRequest, id=rack_id)
        | build(pb.GetRackRequest, name=texts(k.rack_names), id=maybe(rack_id)),
        "ListRacks": build(
            pb.ListRacksRequest,
            nvl_domain_id=maybe(ids(k.domain_ids)),
            pagination=maybe(pages()),
            ids=st.lists(rack_id, max_size=5) | st.integers(999, 1002).map(_many_ids),
            view=enums([pb.RACK_VIEW_UNSPECIFIED, pb.RACK_VIEW_BASIC, pb.RACK_VIEW_FULL]),
        ),
        "DeleteRack": build(pb.DeleteRackRequest, id=rack_id),
        "AddComponents": build(
            pb.AddComponentsRequest, rack_id=rack_id, components=st.lists(component_specs(), max_size=4)
        ),
        "RemoveComponent": build(pb.RemoveComponentRequest, id=ids(k.component_ids)),
        "CreateNVLDomain": build(
            pb.CreateNVLDomainRequest,
            name=usually(st.text(alphabet="abcxyz-", min_size=1, max_size=8), texts(k.domain_names)),
            rack_ids=st.lists(rack_id, max_size=4),
        ),
        "ListNVLDomains": build(
            pb.ListNVLDomainsRequest,
            pagination=maybe(pages()),
            ids=st.lists(ids(k.domain_ids), max_size=5) | st.integers(999, 1002).map(_many_ids),
            names=st.lists(texts(k.domain_names), max_size=5),
        ),
        "ListTasks": build(
            pb.ListTasksRequest,
            rack_id=maybe(rack_id),
            active_only=st.booleans(),
            pagination=maybe(pages()),
            schedule_id=maybe(schedule_id),
        ),
        "GetTasksByIDs": build(
            pb.GetTasksByIDsRequest,
            task_ids=st.lists(ids(k.task_ids), max_size=5) | st.integers(999, 1002).map(_many_ids),
        ),
        "CancelTask": build(pb.CancelTaskRequest, task_id=ids(k.task_ids)),
        "CreateTaskSchedule": build(
            pb.CreateTaskScheduleRequest,
            schedule=present(schedule_configs(k)),
            operation=present(scheduled_operations(k)),
        ),
        "ListTaskSchedules": build(
            pb.ListTaskSchedulesRequest,
            rack_id=maybe(rack_id),
            enabled_only=maybe(st.booleans()),
            pagination=maybe(pages()),
        ),
        "UpdateTaskSchedule": build(
            pb.UpdateTaskScheduleRequest,
            id=schedule_id,
            schedule=present(schedule_configs(k)),
            update_mask=usually(
                st.lists(st.sampled_from(MASK_PATHS[:5]), min_size=1, max_size=2, unique=True).map(_mask),
                maybe(st.lists(st.sampled_from(MASK_PATHS) | garbage_text(), max_size=4).map(_mask)),
            ),
        ),
        "AddTaskScheduleScope": build(
            pb.AddTaskScheduleScopeRequest, schedule_id=schedule_id, target_spec=present(target_specs(k))
        ),
        "RemoveTaskScheduleScope": build(pb.RemoveTaskScheduleScopeRequest, scope_id=ids(k.scope_ids)),
        "UpdateTaskScheduleScope": build(
            pb.UpdateTaskScheduleScopeRequest, schedule_id=schedule_id, desired_scope=present(target_specs(k))
        ),
        "ListTaskScheduleScopes": build(
            pb.ListTaskScheduleScopesRequest, schedule_id=schedule_id, pagination=maybe(pages())
        ),
        "CheckScheduleConflicts": build(
            pb.CheckScheduleConflictsRequest,
            operation=present(scheduled_operations(k)),
            exclude_schedule_id=maybe(schedule_id),
        ),
        "PreviewScheduleSpec": build(
            pb.PreviewScheduleSpecRequest,
            spec=present(schedule_specs()),
            after=maybe(timestamps()),
            count=int32s(100, 101),
        ),
        "ListTaskScheduleRuns": build(
            pb.ListTaskScheduleRunsRequest,
            schedule_id=schedule_id,
            pagination=maybe(pages()),
            view=enums(list(pb.TaskScheduleRunView.values())),
        ),
        "GetTaskScheduleRun": build(pb.GetTaskScheduleRunRequest, id=ids()),
        "ResumeTaskScheduleRun": build(pb.ResumeTaskScheduleRunRequest, id=ids()),
        "CancelTaskScheduleRun": build(pb.CancelTaskScheduleRunRequest, id=ids()),
        "ApproveTaskScheduleRun": build(
            pb.ApproveTaskScheduleRunRequest, id=ids(), comment=texts(plain=("", "ok"))
        ),
        "RejectTaskScheduleRun": build(
            pb.RejectTaskScheduleRunRequest, id=ids(), comment=texts(plain=("", "no"))
        ),
        "RetryTaskScheduleRun": build(
            pb.RetryTaskScheduleRunRequest, id=ids(), only_failed=maybe(st.booleans())
        ),
        "ListAuditEvents": build(
            pb.ListAuditEventsRequest,
            since=maybe(timestamps()),
            method=usually(st.sampled_from(("", "CreateRack")), st.just("createrack") | garbage_text()),
            principal=texts(plain=("", "anonymous", "ops")),
            pagination=maybe(pages()),
        ),
    }
    window_id = ids(k.window_ids)
    strategies |= {
        "CreateMaintenanceWindow": build(
            pb.CreateMaintenanceWindowRequest, window=present(maintenance_windows(k))
        ),
        "GetMaintenanceWindow": build(pb.GetMaintenanceWindowRequest, id=window_id),
        "ListMaintenanceWindows": build(pb.ListMaintenanceWindowsRequest, rack_id=maybe(rack_id)),
        "UpdateMaintenanceWindow": build(
            pb.UpdateMaintenanceWindowRequest,
            id=window_id,
            window=present(maintenance_windows(k)),
            update_mask=usually(
                st.lists(st.sampled_from(WINDOW_MASK_PATHS), min_size=1, max_size=3, unique=True).map(_mask),
                maybe(st.lists(st.sampled_from(MASK_PATHS) | garbage_text(), max_size=4).map(_mask)),
            ),
        ),
        "DeleteMaintenanceWindow": build(pb.DeleteMaintenanceWindowRequest, id=window_id),
        "CreateOperationBudget": build(pb.CreateOperationBudgetRequest, budget=present(operation_budgets(k))),
        "GetOperationBudget": build(pb.GetOperationBudgetRequest, id=ids(k.budget_ids)),
        "ListOperationBudgets": st.just(pb.ListOperationBudgetsRequest()),
        "UpdateOperationBudget": build(
            pb.UpdateOperationBudgetRequest,
            id=ids(k.budget_ids),
            budget=present(operation_budgets(k)),
            update_mask=usually(
                st.lists(st.sampled_from(BUDGET_MASK_PATHS), min_size=1, max_size=3, unique=True).map(_mask),
                maybe(st.lists(st.sampled_from(MASK_PATHS) | garbage_text(), max_size=4).map(_mask)),
            ),
        ),
        "DeleteOperationBudget": build(pb.DeleteOperationBudgetRequest, id=ids(k.budget_ids)),
        "CreateNotificationChannel": build(
            pb.CreateNotificationChannelRequest, channel=present(notification_channels(k))
        ),
        "GetNotificationChannel": build(pb.GetNotificationChannelRequest, id=ids(k.channel_ids)),
        "ListNotificationChannels": st.just(pb.ListNotificationChannelsRequest()),
        "UpdateNotificationChannel": build(
            pb.UpdateNotificationChannelRequest,
            id=ids(k.channel_ids),
            channel=present(notification_channels(k)),
            update_mask=usually(
                st.lists(st.sampled_from(CHANNEL_MASK_PATHS), min_size=1, max_size=3, unique=True).map(_mask),
                maybe(st.lists(st.sampled_from(MASK_PATHS) | garbage_text(), max_size=4).map(_mask)),
            ),
        ),
        "DeleteNotificationChannel": build(pb.DeleteNotificationChannelRequest, id=ids(k.channel_ids)),
        "ListNotificationDeliveries": build(
            pb.ListNotificationDeliveriesRequest,
            states=st.lists(
                usually(st.sampled_from(("pending", "delivered", "dead")), garbage_text()), max_size=2
            ),
            channel_id=maybe(ids(k.channel_ids)),
            limit=int32s(1000, 1001),
        ),
        "RedeliverNotifications": build(
            pb.RedeliverNotificationsRequest,
            delivery_ids=st.lists(ids(), max_size=2),
            channel_id=maybe(ids(k.channel_ids)),
        ),
        "CreatePreflightCheck": build(pb.CreatePreflightCheckRequest, check=present(preflight_checks(k))),
        "GetPreflightCheck": build(pb.GetPreflightCheckRequest, id=ids(k.check_ids)),
        "ListPreflightChecks": st.just(pb.ListPreflightChecksRequest()),
        "UpdatePreflightCheck": build(
            pb.UpdatePreflightCheckRequest,
            id=ids(k.check_ids),
            check=present(preflight_checks(k)),
            update_mask=usually(
                st.lists(st.sampled_from(CHECK_MASK_PATHS), min_size=1, max_size=3, unique=True).map(_mask),
                maybe(st.lists(st.sampled_from(MASK_PATHS) | garbage_text(), max_size=4).map(_mask)),
            ),
        ),
        "DeletePreflightCheck": build(pb.DeletePreflightCheckRequest, id=ids(k.check_ids)),
        "OverridePreflightChecks": build(
            pb.OverridePreflightChecksRequest, task_id=ids(k.task_ids), reason=descriptions()
        ),
        "PreviewTaskSchedule": build(
            pb.PreviewTaskScheduleRequest, id=schedule_id, after=maybe(timestamps()), count=int32s(100, 101)
        ),
        "PreviewMaintenanceWindows": build(
            pb.PreviewMaintenanceWindowsRequest,
            rack_id=rack_id,
            after=maybe(timestamps()),
            count=int32s(100, 101),
        ),
    }
    for rpc, name in submit.items():
        strategies[rpc] = operation_request(name, k)
    for rpc, cls in by_schedule_id.items():
        strategies[rpc] = build(cls, id=schedule_id)
    return strategies


def _mask(paths: list[str]) -> FieldMask:
    return FieldMask(paths=paths)


def _many_ids(count: int) -> list[pb.UUID]:
    return [pb.UUID(id=str(uuid.UUID(int=i + 1))) for i in range(count)]
