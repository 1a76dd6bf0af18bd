"""The redfish backend's pure decisions, its retry policy, and its settings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sushy import exceptions as sushy_errors  # type: ignore[import-untyped]

from rackflow.domain.inventory import ComponentType, PowerState
from rackflow.domain.tasks import OperationKind
from rackflow.errors import InvalidArgument
from rackflow.tasks.backends.base import StepFailed
from rackflow.tasks.backends.redfish.calls import call, reason
from rackflow.tasks.backends.redfish.config import RedfishConfig
from rackflow.tasks.backends.redfish.rules import (
    AmbiguousFirmware,
    Earlier,
    FirmwareEntry,
    FirmwareImage,
    PowerAction,
    PowerPlan,
    PowerReading,
    Progress,
    Unsupported,
    choose_reset_type,
    earlier_restart,
    firmware_image,
    power_plan,
    power_state_from,
    recorded_ago,
    related_firmware,
    reset_progress,
    restart_record,
    restart_seen,
    update_failure,
    waits_for_settled_power,
)

ON, OFF, UNKNOWN = PowerState.ON, PowerState.OFF, PowerState.UNKNOWN
K = OperationKind


@pytest.mark.parametrize(
    ("kind", "forced", "current", "expected"),
    [
        (K.POWER_ON, False, OFF, PowerPlan(PowerAction.ON, ON)),
        (K.POWER_ON, False, UNKNOWN, PowerPlan(PowerAction.ON, ON)),
        (K.POWER_ON, False, ON, PowerPlan(None, ON)),
        (K.POWER_OFF, False, ON, PowerPlan(PowerAction.GRACEFUL_OFF, OFF)),
        (K.POWER_OFF, True, ON, PowerPlan(PowerAction.FORCE_OFF, OFF)),
        (K.POWER_OFF, True, UNKNOWN, PowerPlan(PowerAction.FORCE_OFF, OFF)),
        (K.POWER_OFF, True, OFF, PowerPlan(None, OFF)),
        (K.POWER_RESET, False, ON, PowerPlan(PowerAction.GRACEFUL_RESTART, ON)),
        (K.POWER_RESET, True, ON, PowerPlan(PowerAction.FORCE_RESTART, ON)),
        (K.POWER_RESET, True, OFF, PowerPlan(PowerAction.ON, ON)),
        (K.BRING_UP, False, OFF, PowerPlan(PowerAction.ON, ON)),
        (K.BRING_UP, False, ON, PowerPlan(None, ON)),
    ],
)
def test_power_plan(kind: OperationKind, forced: bool, current: PowerState, expected: PowerPlan) -> None:
    assert power_plan(kind, forced=forced, current=current) == expected


def test_power_plan_refuses_non_power_operations() -> None:
    with pytest.raises(ValueError, match="ingest is not a power operation"):
        power_plan(K.INGEST, forced=False, current=ON)


@pytest.mark.parametrize(
    ("kind", "waits"),
    [(K.POWER_RESET, True), (K.BRING_UP, True), (K.POWER_ON, False), (K.POWER_OFF, False)],
)
def test_which_steps_wait_for_a_settled_power_state(kind: OperationKind, waits: bool) -> None:
    assert waits_for_settled_power(kind) is waits


T0, T1 = "2025-06-01T11:00:00Z", "2025-06-01T12:00:00Z"


@pytest.mark.parametrize(
    ("before", "now", "seen"),
    [
        (PowerReading(ON, "On"), PowerReading(ON, "On"), False),  # not applied yet, or never
        (PowerReading(ON, "On", T0), PowerReading(ON, "On", T0), False),
        (PowerReading(ON, "On"), PowerReading(OFF, "Off"), True),  # it went down
        (PowerReading(ON, "On"), PowerReading(UNKNOWN, "PoweringOff"), True),  # it is going down
        (PowerReading(ON, "On"), PowerReading(UNKNOWN, "PoweringOn"), True),  # it is coming up
        (PowerReading(ON, "On"), PowerReading(UNKNOWN, None), False),  # a PowerState gone missing
        (PowerReading(ON, "On"), PowerReading(UNKNOWN, "Paused"), False),
        (PowerReading(ON, "On", T0), PowerReading(ON, "On", T1), True),  # a warm reset, recorded
        (PowerReading(ON, "On"), PowerReading(ON, "On", T1), True),  # first recorded now
        (PowerReading(ON, "On", T0), PowerReading(ON, "On"), False),  # a value gone missing is no proof
    ],
)
def test_restart_seen(before: PowerReading, now: PowerReading, seen: bool) -> None:
    assert restart_seen(before, now) is seen


WAITING, DONE, UNOBSERVED = Progress.WAITING, Progress.DONE, Progress.DONE_UNOBSERVED
BARE, STAMPED = PowerReading(ON, "On"), PowerReading(ON, "On", T0)  # before: without, with LastResetTime


@pytest.mark.parametrize(
    ("wanted", "before", "now", "seen", "watched", "progress"),
    [
        # Power on and off: the state reached is the proof.
        (OFF, BARE, PowerReading(ON, "On"), True, 1.0, WAITING),
        (OFF, BARE, PowerReading(OFF, "Off"), True, 1.0, DONE),
        # A restart seen to happen is done once On again, whatever the BMC keeps.
        (ON, BARE, PowerReading(OFF, "Off"), True, 1.0, WAITING),
        (ON, BARE, PowerReading(ON, "On"), True, 1.0, DONE),
        (ON, STAMPED, PowerReading(ON, "On", T1), True, 1.0, DONE),
        # Not seen, with LastResetTime: never done without proof, however long it reads On.
        (ON, STAMPED, PowerReading(ON, "On", T0), False, 1.0, WAITING),
        (ON, STAMPED, PowerReading(ON, "On", T0), False, 30.0, WAITING),
        (ON, STAMPED, PowerReading(ON, "On", T0), False, 300.0, WAITING),
        (ON, STAMPED, PowerReading(ON, "On"), False, 300.0, WAITING),  # it went missing: still no proof
        # Not seen, without LastResetTime: waited for within the window, then done unobserved at On.
        (ON, BARE, PowerReading(ON, "On"), False, 29.9, WAITING),
        (ON, BARE, PowerReading(ON, "On"), False, 30.0, UNOBSERVED),
        (ON, BARE, PowerReading(ON, "On"), False, 300.0, UNOBSERVED),
        (ON, BARE, PowerReading(UNKNOWN, "Paused"), False, 30.0, WAITING),  # not On: not done
        (ON, BARE, PowerReading(UNKNOWN, None), False, 30.0, WAITING),
    ],
)
def test_reset_progress(
    wanted: PowerState,
    before: PowerReading,
    now: PowerReading,
    seen: bool,
    watched: float,
    progress: Progress,
) -> None:
    assert reset_progress(wanted, before, now, seen=seen, watched=watched, window=30.0) is progress


def entry(identity: str, version: str | None, *related: str) -> FirmwareEntry:
    return FirmwareEntry(identity, version, frozenset(related))


SHELF = "/redfish/v1/Chassis/ps-0"


def test_related_firmware_reads_only_the_entries_of_the_resource() -> None:
    entries = [
        entry("other-shelf", "9.9", "/redfish/v1/Chassis/ps-1"),
        entry("bmc", "7.1", "/redfish/v1/Managers/bmc"),
        entry("shelf", "4.2", SHELF),
    ]
    assert related_firmware(SHELF, entries) == "4.2"
    assert related_firmware("/redfish/v1/Chassis/ps-2", entries) is None


def test_related_firmware_entries_that_agree_are_one_version() -> None:
    entries = [entry("psu-0", "4.2", SHELF), entry("psu-1", "4.2", SHELF), entry("cpld", None, SHELF)]
    assert related_firmware(SHELF, entries) == "4.2"


def test_related_firmware_entries_that_disagree_are_refused() -> None:
    entries = [entry("cpld", "0.7", SHELF, "/redfish/v1/Managers/bmc"), entry("shelf", "4.2", SHELF)]
    with pytest.raises(AmbiguousFirmware) as caught:
        related_firmware(SHELF, entries)
    assert str(caught.value) == (
        f"2 firmware inventory entries name {SHELF} with different versions (cpld 0.7, shelf 4.2): cannot "
        "tell which is the component's firmware"
    )


@pytest.mark.parametrize(
    ("action", "offered", "expected"),
    [
        (PowerAction.ON, set(), "On"),
        (PowerAction.ON, {"ForceOn", "ForceOff"}, "ForceOn"),
        (PowerAction.ON, {"On", "ForceOn"}, "On"),
        (PowerAction.FORCE_RESTART, {"PowerCycle"}, "PowerCycle"),
        (PowerAction.GRACEFUL_OFF, {"GracefulShutdown", "ForceOff"}, "GracefulShutdown"),
    ],
)
def test_choose_reset_type(action: PowerAction, offered: set[str], expected: str) -> None:
    assert choose_reset_type(action, offered) == expected


def test_a_reset_the_bmc_does_not_offer_is_refused_with_what_it_offers() -> None:
    with pytest.raises(Unsupported) as caught:
        choose_reset_type(PowerAction.GRACEFUL_OFF, {"On", "ForceOff"})
    assert str(caught.value) == (
        "the BMC offers no ResetType for a graceful shutdown: wanted GracefulShutdown, offered ForceOff, On "
        "(a forced operation may be offered)"
    )


@pytest.mark.parametrize(
    ("redfish", "ours"),
    [("On", ON), ("Off", OFF), ("PoweringOn", UNKNOWN), ("Paused", UNKNOWN), (None, UNKNOWN)],
)
def test_power_state_from(redfish: str | None, ours: PowerState) -> None:
    assert power_state_from(redfish) is ours


def test_a_uri_target_version_is_the_image() -> None:
    assert firmware_image("https://img/fw-2.bin", "", ComponentType.COMPUTE) == FirmwareImage(
        "https://img/fw-2.bin", None
    )


def test_a_version_goes_through_the_template() -> None:
    image = firmware_image("2.5", "http://images/{type}/fw-{version}.bin", ComponentType.NVSWITCH)
    assert image == FirmwareImage("http://images/nvswitch/fw-2.5.bin", "2.5")


def test_a_version_without_a_template_is_refused_with_the_way_out() -> None:
    with pytest.raises(ValueError, match=r"'2.5' is a version, but RACKFLOW_REDFISH_IMAGE_URI"):
        firmware_image("2.5", "", ComponentType.COMPUTE)


@pytest.mark.parametrize(
    ("doc", "failure"),
    [
        (None, None),
        ({}, None),
        ({"TaskState": "Completed", "TaskStatus": "OK"}, None),
        (
            {"TaskState": "Exception", "TaskStatus": "Critical", "Messages": [{"Message": "bad image"}]},
            "the BMC's update task ended Exception Critical: bad image",
        ),
        ({"TaskState": "Killed"}, "the BMC's update task ended Killed"),
        (
            {"TaskState": "Completed", "TaskStatus": "Critical", "Messages": [{"Message": m} for m in "ab"]},
            "the BMC's update task ended Completed Critical: a; b",
        ),
    ],
)
def test_update_failure(doc: dict[str, Any] | None, failure: str | None) -> None:
    assert update_failure(doc) == failure


# --- the retry policy ----------------------------------------------------------------------------


class Response:
    def __init__(self, status: int, message: str = "") -> None:
        self.status_code = status
        self.message = message

    def json(self) -> dict[str, Any]:
        return {"error": {"code": "Base.1.0.GeneralError", "message": self.message}}


def http_error(cls: type[sushy_errors.HTTPError], status: int, message: str = "") -> sushy_errors.HTTPError:
    return cls("GET", "http://bmc/redfish/v1/Systems/1", Response(status, message))


REFUSED = sushy_errors.ConnectionError(
    url="http://bmc/redfish/v1/", error="HTTPConnectionPool(...): [Errno 111] Connection refused"
)


class Script:
    """A BMC call that raises the given errors in turn, then returns "ok"; and a sleep that records."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.slept: list[float] = []

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


CONFIG = RedfishConfig(retries=3, retry_delay=1.0, max_retry_delay=3.0)


async def test_transient_errors_are_retried_with_doubling_capped_delays() -> None:
    fn = Script(REFUSED, http_error(sushy_errors.ServerSideError, 503), REFUSED)
    assert await call(fn, what="x", config=CONFIG, sleep=fn.sleep) == "ok"
    assert (fn.calls, fn.slept) == (4, [1.0, 2.0, 3.0])


async def test_giving_up_says_why_and_after_how_many_attempts() -> None:
    fn = Script(*[REFUSED] * 4)
    with pytest.raises(StepFailed) as caught:
        await call(fn, what="power on of http://bmc/redfish/v1/Systems/1", config=CONFIG, sleep=fn.sleep)
    assert str(caught.value) == (
        "power on of http://bmc/redfish/v1/Systems/1: connection refused (gave up after 4 attempts)"
    )
    assert caught.value.retryable  # a task with a retry policy tries again after its back-off


async def test_a_server_error_that_outlives_the_call_retries_is_retryable() -> None:
    fn = Script(*[http_error(sushy_errors.ServerSideError, 500)] * 4)
    with pytest.raises(StepFailed) as caught:
        await call(fn, what="reading", config=CONFIG, sleep=fn.sleep)
    assert caught.value.retryable


@pytest.mark.parametrize("status", [401, 403])
async def test_refused_credentials_fail_at_once(status: int) -> None:
    fn = Script(http_error(sushy_errors.AccessError, status, "Incorrect username or password"))
    with pytest.raises(StepFailed) as caught:
        await call(fn, what="reading", config=CONFIG, sleep=fn.sleep)
    assert str(caught.value) == (
        f"reading: the BMC refused the credentials (HTTP {status}: Incorrect username or password); "
        "not retried"
    )
    assert (fn.calls, fn.slept) == (1, [])
    assert not caught.value.retryable


async def test_other_bmc_errors_fail_at_once_in_the_bmcs_words() -> None:
    fn = Script(http_error(sushy_errors.ResourceNotFoundError, 404, "Fake system nope was not found"))
    with pytest.raises(StepFailed, match=r"^reading: HTTP 404: Fake system nope was not found$") as caught:
        await call(fn, what="reading", config=CONFIG, sleep=fn.sleep)
    assert fn.calls == 1
    assert not caught.value.retryable  # a 4xx would fail the same way again


async def test_a_bug_is_not_dressed_up_as_a_bmc_failure() -> None:
    fn = Script(KeyError("oops"))
    with pytest.raises(KeyError):
        await call(fn, what="reading", config=CONFIG, sleep=fn.sleep)


@pytest.mark.parametrize(
    ("error", "text"),
    [
        ("Read timed out. (read timeout=60)", "timed out"),
        ("[Errno -2] Name or service not known", "host name not found"),
        ("[SSL: CERTIFICATE_VERIFY_FAILED]", "TLS failure (RACKFLOW_REDFISH_VERIFY_TLS sets the CA bundle)"),
        ("something else", "cannot connect"),
    ],
)
def test_connection_reasons_are_short(error: str, text: str) -> None:
    assert reason(sushy_errors.ConnectionError(url="http://bmc", error=error)) == text


# --- settings --------------------------------------------------------------------------------------


def test_config_from_env(tmp_path: Path) -> None:
    ca = tmp_path / "bmc-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    env = {
        "RACKFLOW_REDFISH_CONCURRENCY": "8",
        "RACKFLOW_REDFISH_POWER_TIMEOUT": "90",
        "RACKFLOW_REDFISH_RETRIES": "0",
        "RACKFLOW_REDFISH_RESTART_PROOF_SECONDS": "5",
        "RACKFLOW_REDFISH_VERIFY_TLS": str(ca),
        "RACKFLOW_REDFISH_IMAGE_URI": "https://img/{type}/{version}.bin",
    }
    config = RedfishConfig.from_env(env)
    assert (config.concurrency, config.power_timeout, config.retries) == (8, 90.0, 0)
    assert (config.restart_proof_window, RedfishConfig().restart_proof_window) == (5.0, 30.0)
    assert config.verify_tls == str(ca)
    assert RedfishConfig.from_env({"RACKFLOW_REDFISH_VERIFY_TLS": str(tmp_path)}).verify_tls == str(tmp_path)
    assert RedfishConfig.from_env({"RACKFLOW_REDFISH_VERIFY_TLS": "false"}).verify_tls is False
    assert RedfishConfig.from_env({}) == RedfishConfig()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("CONCURRENCY", "0", "RACKFLOW_REDFISH_CONCURRENCY: must be 1..256, got 0"),
        ("CONCURRENCY", "many", "RACKFLOW_REDFISH_CONCURRENCY: 'many' is not a whole number"),
        ("POWER_TIMEOUT", "-1", "RACKFLOW_REDFISH_POWER_TIMEOUT: must be a positive number of seconds"),
        ("POLL_SECONDS", "nan", "RACKFLOW_REDFISH_POLL_SECONDS: must be a positive number of seconds"),
        ("RESTART_PROOF_SECONDS", "0", "RACKFLOW_REDFISH_RESTART_PROOF_SECONDS: must be a positive number"),
        ("IMAGE_URI", "https://img/fw.bin", "RACKFLOW_REDFISH_IMAGE_URI: must contain {version}"),
        # Accepted, these failed every upgrade by version (`unexpected error: KeyError('model')`, `Single
        # '}' encountered in format string`), and every step on an https BMC (`unexpected error:
        # OSError('Could not find a suitable TLS CA certificate bundle, invalid path: maybe')`).
        (
            "IMAGE_URI",
            "https://img/{model}/{version}.bin",
            "RACKFLOW_REDFISH_IMAGE_URI: only {version} and {type} are filled in, got",
        ),
        (
            "IMAGE_URI",
            "https://img/{version}}.bin",
            "RACKFLOW_REDFISH_IMAGE_URI: only {version} and {type} are filled in, got",
        ),
        (
            "VERIFY_TLS",
            "maybe",
            "RACKFLOW_REDFISH_VERIFY_TLS: expected true, false or the path of a CA bundle; 'maybe' is none",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        RedfishConfig.from_env({f"RACKFLOW_REDFISH_{name}": value})
    assert str(caught.value).startswith(message)


T0, T1 = "2025-06-01T11:00:00Z", "2025-06-01T11:02:00Z"
AT = datetime(2025, 6, 1, 11, 0, 0, 500000, tzinfo=UTC)


@pytest.mark.parametrize(
    ("before", "now", "earlier"),
    [
        (PowerReading(PowerState.ON, "On", T0), PowerReading(PowerState.ON, "On", T1), Earlier.DONE),
        # LastResetTime unmoved is no proof either way: a graceful restart moves it once the OS is down
        (PowerReading(PowerState.ON, "On", T0), PowerReading(PowerState.ON, "On", T0), Earlier.UNPROVED),
        (
            PowerReading(PowerState.ON, "On", T0),
            PowerReading(PowerState.UNKNOWN, "PoweringOn", T0),
            Earlier.DONE,
        ),
        (PowerReading(PowerState.ON, "On"), PowerReading(PowerState.OFF, "Off"), Earlier.DONE),
        (PowerReading(PowerState.ON, "On"), PowerReading(PowerState.UNKNOWN, None), Earlier.UNPROVED),
        (PowerReading(PowerState.ON, "On"), PowerReading(PowerState.UNKNOWN, "Paused"), Earlier.UNPROVED),
        (PowerReading(PowerState.ON, "On"), PowerReading(PowerState.ON, "On"), Earlier.UNPROVED),
    ],
)
def test_a_repeated_reset_tells_from_its_record_whether_the_restart_happened(
    before: PowerReading, now: PowerReading, earlier: Earlier
) -> None:
    assert earlier_restart(restart_record(before, AT), now) is earlier


def test_a_reset_never_recorded_acts_as_planned() -> None:
    assert earlier_restart(None, PowerReading(PowerState.ON, "On")) is Earlier.NONE


def test_a_restart_record_keeps_the_reading_and_when_it_was_made() -> None:
    record = restart_record(PowerReading(PowerState.ON, "On", T0), AT)
    assert record == {"power": "On", "last_reset_time": T0, "recorded_at": "2025-06-01T11:00:00.500000Z"}
    assert restart_record(PowerReading(PowerState.ON, "On"), AT).keys() == {"power", "recorded_at"}


@pytest.mark.parametrize(
    ("later", "ago"),
    [
        (timedelta(seconds=42.5), 42.5),
        (timedelta(0), 0.0),
        (timedelta(seconds=-3), 0.0),  # its maker's clock was ahead of this one's
    ],
)
def test_a_restart_record_is_counted_from_when_it_was_made(later: timedelta, ago: float) -> None:
    record = restart_record(PowerReading(PowerState.ON, "On", T0), AT)
    assert recorded_ago(record, AT + later) == ago


def test_a_restart_record_from_before_records_kept_their_time_is_counted_from_now() -> None:
    """Made by a release before this one: the wait for its restart starts now, the longest it can be."""
    assert recorded_ago({"power": "On", "last_reset_time": T0}, AT) == 0.0


@pytest.mark.parametrize(
    ("value", "verify"),
    [("off", False), ("no", False), ("0", False), ("on", True), ("TRUE", True), ("", True)],
)
def test_verify_tls_reads_the_booleans_every_variable_reads(value: str, verify: bool) -> None:
    """`off` was taken as the path of a CA bundle named `off` (docs/CONFIGURATION.md: variables read
    1/true/yes/on and 0/false/no/off)."""
    assert RedfishConfig.from_env({"RACKFLOW_REDFISH_VERIFY_TLS": value}).verify_tls is verify
