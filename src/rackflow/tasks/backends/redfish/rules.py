"""The decisions of the redfish backend, as plain functions: which Reset to send, which state to wait for,
what proves a restart, which image to flash, which firmware inventory entry is the component's, and how to
read a finished update task. No I/O here, so all of it is tested alone."""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rackflow.domain.inventory import ComponentType, PowerState
from rackflow.domain.tasks import OperationKind
from rackflow.timespec.rfc3339 import format_rfc3339, parse_rfc3339


class PowerAction(enum.Enum):
    ON = "power on"
    GRACEFUL_OFF = "graceful shutdown"
    FORCE_OFF = "forced power off"
    GRACEFUL_RESTART = "graceful restart"
    FORCE_RESTART = "forced restart"


# Redfish ResetType values for each action, best first; a BMC that offers none of them cannot do it.
RESET_TYPES: dict[PowerAction, tuple[str, ...]] = {
    PowerAction.ON: ("On", "ForceOn"),
    PowerAction.GRACEFUL_OFF: ("GracefulShutdown",),
    PowerAction.FORCE_OFF: ("ForceOff",),
    PowerAction.GRACEFUL_RESTART: ("GracefulRestart",),
    PowerAction.FORCE_RESTART: ("ForceRestart", "PowerCycle"),
}


# The actions that end where they began (On): reading On afterwards proves nothing (`restart_seen`).
RESTARTS = frozenset({PowerAction.GRACEFUL_RESTART, PowerAction.FORCE_RESTART})


class Unsupported(ValueError):
    """The BMC does not offer what the step needs."""


def choose_reset_type(action: PowerAction, offered: Collection[str]) -> str:
    """The ResetType to send; `offered` empty means the BMC did not say, so the first choice is tried."""
    choices = RESET_TYPES[action]
    if not offered:
        return choices[0]
    for choice in choices:
        if choice in offered:
            return choice
    hint = " (a forced operation may be offered)" if action.name.startswith("GRACEFUL") else ""
    raise Unsupported(
        f"the BMC offers no ResetType for a {action.value}: wanted {' or '.join(choices)}, "
        f"offered {', '.join(sorted(offered))}{hint}"
    )


@dataclass(frozen=True)
class PowerPlan:
    """What to send (None: already there) and the state that proves it happened."""

    action: PowerAction | None
    wanted: PowerState


def power_plan(kind: OperationKind, *, forced: bool, current: PowerState) -> PowerPlan:
    """Power operations are idempotent: a component already in the wanted state is left alone, and a reset
    of a component that is off powers it on (a restart of something that is off is refused by most BMCs)."""
    if kind is OperationKind.POWER_OFF:
        if current is PowerState.OFF:
            return PowerPlan(None, PowerState.OFF)
        return PowerPlan(PowerAction.FORCE_OFF if forced else PowerAction.GRACEFUL_OFF, PowerState.OFF)
    if kind is OperationKind.POWER_RESET and current is not PowerState.OFF:
        return PowerPlan(PowerAction.FORCE_RESTART if forced else PowerAction.GRACEFUL_RESTART, PowerState.ON)
    if kind in (OperationKind.POWER_ON, OperationKind.POWER_RESET, OperationKind.BRING_UP):
        return PowerPlan(None if current is PowerState.ON else PowerAction.ON, PowerState.ON)
    raise ValueError(f"{kind.value} is not a power operation")


def waits_for_settled_power(kind: OperationKind) -> bool:
    """Whether a step first waits for the component to read On or Off (within the power timeout) before it
    acts. A reset and a bring-up decide from that state what to send (restart or power on; power on or
    nothing), and a restart is proved by seeing the component leave On (`restart_seen`), which only means
    something if it was On. Sending into a transition (PoweringOn, PoweringOff) is also what BMCs refuse.
    Power on and off act at once: their end state is its own proof, and a forced power off is meant for a
    component that may be stuck in between."""
    return kind in (OperationKind.POWER_RESET, OperationKind.BRING_UP)


def power_state_from(redfish_state: str | None) -> PowerState:
    """Redfish PowerState (On, Off, PoweringOn, PoweringOff, Paused) -> ours; in between is unknown."""
    return {"On": PowerState.ON, "Off": PowerState.OFF}.get(redfish_state or "", PowerState.UNKNOWN)


@dataclass(frozen=True)
class PowerReading:
    """One read of a resource's power: our state, the BMC's own word for it (None: it reported none), and
    the ComputerSystem's `LastResetTime` where the BMC keeps one (chassis have none)."""

    state: PowerState
    reported: str | None = None
    last_reset: str | None = None

    def describe(self) -> str:
        return self.reported or "not reported"


# The Redfish PowerState values a restart passes through.
RESTART_STATES = frozenset({"Off", "PoweringOff", "PoweringOn"})


def restart_seen(before: PowerReading, now: PowerReading) -> bool:
    """Whether `now`, read after a restart was sent to a component that read On (`before`), shows that the
    restart happened. A restart ends where it began, so On alone proves nothing: the BMC may not have acted
    yet, or accepted it and done nothing. The proof is a `LastResetTime` other than the one read before it
    was sent, or a state a restart passes through (Off, PoweringOff, PoweringOn; not a PowerState gone
    missing for a read). A warm reset that keeps the power On on a BMC without `LastResetTime` leaves no
    proof (`reset_progress` says what then)."""
    if now.last_reset is not None and now.last_reset != before.last_reset:
        return True
    return now.reported in RESTART_STATES


def restart_record(before: PowerReading, at: datetime) -> dict[str, str]:
    """What a reset step records (`StepState`) at `at`, just before it sends a restart to a component that
    read `before`: the reading `earlier_restart` compares with, should the task be taken over and the step
    repeated, and when, which its repeat counts the wait for the restart from (`recorded_ago`)."""
    record = {"power": before.reported or "", "recorded_at": format_rfc3339(at)}
    if before.last_reset is not None:
        record["last_reset_time"] = before.last_reset
    return record


def recorded_reading(record: Mapping[str, str]) -> PowerReading:
    """The reading a `restart_record` kept."""
    reported = record.get("power") or None
    return PowerReading(power_state_from(reported), reported, record.get("last_reset_time"))


def recorded_ago(record: Mapping[str, str], now: datetime) -> float:
    """Seconds since a `restart_record` was made, as of `now` (never less than 0: the instance that made it
    may have a clock ahead of this one's). 0 for a record made before records kept their time: the wait
    for its restart then starts now, the longest it can be, where an earlier start would give up sooner."""
    recorded_at = record.get("recorded_at")
    if recorded_at is None:
        return 0.0
    return max(0.0, (now - parse_rfc3339(recorded_at)).total_seconds())


class Earlier(enum.Enum):
    """What a repeated reset step (its task taken over) knows of the restart the run before it recorded
    it was about to send."""

    NONE = "no restart recorded"  # the step never got as far as a restart: act as planned
    DONE = "it happened"  # not to be sent again: wait for the power to come back On
    # No proof yet, and none to the contrary: it may be under way (a graceful restart's OS still shutting
    # down reads On, its LastResetTime unmoved), or never have been sent. Watched for, never sent again.
    UNPROVED = "not seen yet"


def earlier_restart(record: Mapping[str, str] | None, now: PowerReading) -> Earlier:
    """Whether the restart an earlier run of this step recorded (`restart_record`) before it would send it
    has been seen to happen, as of the reading `now`: the same proof as `restart_seen` (a `LastResetTime`
    moved since, or a state a restart passes through, Off included), read against the recording. Without
    proof, not even an unmoved `LastResetTime` says it did not happen: a restart is only recorded once it
    is carried out, which a graceful one puts off until the OS has shut down."""
    if record is None:
        return Earlier.NONE
    return Earlier.DONE if restart_seen(recorded_reading(record), now) else Earlier.UNPROVED


class Progress(enum.Enum):
    """Where a Reset stands at a read of the power after it was sent."""

    WAITING = "waiting"
    DONE = "done"
    DONE_UNOBSERVED = "done, restart not observed"  # a restart accepted that the BMC gives no way to see


def reset_progress(
    wanted: PowerState, before: PowerReading, now: PowerReading, *, seen: bool, watched: float, window: float
) -> Progress:
    """Whether a Reset sent to a component that read `before` is done at the read `now`, `watched` seconds
    after it was sent. `seen`: the Reset has been seen to happen; for a restart, a read since it proved it
    (`restart_seen`, this one included), for anything else always (the state it reaches is its proof).

    A Reset is done when the power reads the wanted state and it was seen to happen. Where the BMC keeps a
    `LastResetTime` (one was read before the Reset), every restart moves it: until it moves (or a state a
    restart passes through is read) the restart has not happened, and the step waits to the power timeout,
    then fails. Without one, the only proof is such a state, which a warm restart that keeps the power On,
    or one faster than a poll, never shows, so every reset on that BMC would fail however well it went. So
    after `window` seconds (the proof window, at most the power timeout) without proof, a component that
    reads On counts as restarted, unobserved: not failed, and not retried (a retry would restart it
    again)."""
    if now.state is not wanted:
        return Progress.WAITING
    if seen:
        return Progress.DONE
    if before.last_reset is None and watched >= window:
        return Progress.DONE_UNOBSERVED
    return Progress.WAITING


@dataclass(frozen=True)
class FirmwareImage:
    """The image to flash, and the version the BMC must report afterwards (None: whatever it flashes)."""

    uri: str
    expected_version: str | None


def firmware_image(target_version: str, template: str, component_type: ComponentType) -> FirmwareImage:
    """A target_version with a scheme is the image URI itself; otherwise it is a version, and the image is
    `template` with {version} and {type} filled in. Raises ValueError when neither applies."""
    if "://" in target_version:
        return FirmwareImage(target_version, None)
    if not template:
        raise ValueError(
            f"target_version {target_version!r} is a version, but RACKFLOW_REDFISH_IMAGE_URI (which maps "
            "versions to images) is not set; set it, or give the image URI as the target_version"
        )
    return FirmwareImage(
        template.format(version=target_version, type=component_type.value.lower()), target_version
    )


@dataclass(frozen=True)
class FirmwareEntry:
    """A firmware inventory (SoftwareInventory) entry: its Id, Version, and the @odata.id of each
    RelatedItem (without a trailing slash)."""

    identity: str
    version: str | None
    related: frozenset[str]


class AmbiguousFirmware(Unsupported):
    """Several firmware inventory entries name the component, with different versions."""


def related_firmware(resource_path: str, entries: Iterable[FirmwareEntry]) -> str | None:
    """The version of the firmware inventory entries whose RelatedItem names the resource, None when none
    does. Entries of other resources (another chassis, the BMC) never count, whatever their order; several
    that name the resource must agree, or AmbiguousFirmware is raised: the version an upgrade compares must
    be the component's, not that of whichever device the BMC happens to list first."""
    versions = {e.identity: e.version for e in entries if resource_path in e.related and e.version}
    if len(set(versions.values())) > 1:
        listed = ", ".join(f"{identity} {version}" for identity, version in sorted(versions.items()))
        raise AmbiguousFirmware(
            f"{len(versions)} firmware inventory entries name {resource_path} with different versions "
            f"({listed}): cannot tell which is the component's firmware"
        )
    return next(iter(versions.values()), None)


# TaskState values that end a task without success (Redfish Task schema).
FAILED_TASK_STATES = frozenset({"Exception", "Killed", "Cancelled", "Interrupted", "Suspended"})


def update_failure(task_doc: Mapping[str, Any] | None) -> str | None:
    """Why a finished update task failed, from its JSON; None when it succeeded or said nothing."""
    if not task_doc:
        return None
    state = task_doc.get("TaskState")
    status = task_doc.get("TaskStatus")
    if state not in FAILED_TASK_STATES and status != "Critical":
        return None
    messages = [
        str(m["Message"]) for m in task_doc.get("Messages") or () if isinstance(m, dict) and m.get("Message")
    ]
    detail = f": {'; '.join(messages)}" if messages else ""
    return f"the BMC's update task ended {state or 'with status'} {status or ''}".rstrip() + detail
