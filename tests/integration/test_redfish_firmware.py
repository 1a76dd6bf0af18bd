"""Firmware upgrades, chassis power and inventory reads through the real sushy path, against a small fake.

sushy-emulator's fake mode cannot flash anything (its SimpleUpdate answers 500 without libvirt) and has no
FirmwareInventory, so this module serves a minimal Redfish service of its own on 127.0.0.1: one system, one
power-shelf chassis with a firmware inventory entry, one manager, an UpdateService whose SimpleUpdate
returns a task monitor that runs for a few polls and then applies the version named in the image file
name. Requests can be made to fail (HTTP status codes, in turn) to exercise the retry policy end to end.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rackflow.domain.inventory import Bmc, Component, ComponentType, PowerState
from rackflow.domain.tasks import OperationKind, Task
from rackflow.tasks.backends.base import StepFailed
from rackflow.tasks.backends.redfish.backend import RedfishBackend
from rackflow.tasks.backends.redfish.config import RedfishConfig
from tests.step_state import Kept
from tests.unit.test_redfish_backend import stored, task

ROOT = "/redfish/v1"
AUTH = "Basic " + base64.b64encode(b"admin:secret").decode()
ENV = {"BMC": "admin:secret"}
_IMAGE_VERSION = re.compile(r"fw-([^/]+)\.bin$")


@dataclass
class FakeBmc:
    """The state behind the fake service; tests read and steer it."""

    bios_version: str = "1.0"
    shelf_version: str = "4.2"
    system_power: str = "On"
    shelf_power: str = "On"
    task_polls: int = 2
    failures: list[int] = field(default_factory=list)  # status codes for the next requests, in turn
    updates: list[dict[str, Any]] = field(default_factory=list)
    pending: tuple[str, str] | None = None  # (target path, version) of the running update
    posts: list[str] = field(default_factory=list)  # every action POSTed, carried out or not
    lost_answers: list[int] = field(default_factory=list)  # statuses for the next actions, carried out
    reset_target: str | None = None  # where node-0's Reset action says it is (default: on this BMC)
    # node-0's LastResetTime; when set, a restart moves it (a warm reset: the power stays On either way)
    last_reset_time: str | None = None
    ignores_restarts: bool = False  # answers 204 to a restart and does nothing
    restart_off_reads: int = 0  # how many reads of node-0 after a restart say Off (a cold restart)
    off_reads_left: int = 0
    # a GracefulRestart leaves the OS shutting down (On, LastResetTime as it was) until `shutdown_done()`
    slow_shutdowns: bool = False
    shutting_down: bool = False
    power_script: list[str] = field(default_factory=list)  # node-0's PowerState for its next reads
    system_reads: int = 0  # reads of node-0 served
    extra_firmware: list[dict[str, Any]] = field(default_factory=list)  # inventory entries listed first
    garbage: dict[str, bytes] = field(default_factory=dict)  # path: the raw body a GET of it answers, 200
    garbled_actions: int = 0  # how many of the next actions are carried out and answered with an HTML page

    def documents(self) -> dict[str, dict[str, Any]]:
        allowed = ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart"]
        reset = {"ResetType@Redfish.AllowableValues": allowed}
        inventory = f"{ROOT}/UpdateService/FirmwareInventory"
        return {
            ROOT: {
                "Id": "RootService",
                "Name": "Fake",
                "RedfishVersion": "1.11.0",
                "Systems": {"@odata.id": f"{ROOT}/Systems"},
                "Chassis": {"@odata.id": f"{ROOT}/Chassis"},
                "Managers": {"@odata.id": f"{ROOT}/Managers"},
                "UpdateService": {"@odata.id": f"{ROOT}/UpdateService"},
            },
            f"{ROOT}/Systems/node-0": {
                "Id": "node-0",
                "Name": "node-0",
                "Model": "GB200",
                "SerialNumber": "SN-1",
                "PowerState": self.system_power,
                "BiosVersion": self.bios_version,
                **({"LastResetTime": self.last_reset_time} if self.last_reset_time else {}),
                "Links": {"Chassis": [{"@odata.id": f"{ROOT}/Chassis/ps-0"}]},
                "Actions": {
                    "#ComputerSystem.Reset": {
                        "target": self.reset_target or f"{ROOT}/Systems/node-0/Actions/Reset",
                        **reset,
                    }
                },
            },
            f"{ROOT}/Chassis/ps-0": {
                "Id": "ps-0",
                "Name": "Power shelf",
                "ChassisType": "PowerEquipment",
                "PowerState": self.shelf_power,
                "Actions": {"#Chassis.Reset": {"target": f"{ROOT}/Chassis/ps-0/Actions/Reset", **reset}},
            },
            f"{ROOT}/Managers/bmc": {"Id": "bmc", "Name": "BMC", "FirmwareVersion": "7.1"},
            f"{ROOT}/UpdateService": {
                "Id": "UpdateService",
                "Name": "Update Service",
                "Actions": {
                    "#UpdateService.SimpleUpdate": {
                        "target": f"{ROOT}/UpdateService/Actions/SimpleUpdate",
                        "TransferProtocol@Redfish.AllowableValues": ["HTTP", "HTTPS"],
                    }
                },
                "FirmwareInventory": {"@odata.id": inventory},
            },
            inventory: {
                "Name": "Firmware",
                "Members": [
                    *({"@odata.id": f"{inventory}/{extra['Id']}"} for extra in self.extra_firmware),
                    {"@odata.id": f"{inventory}/shelf-fw"},
                ],
            },
            **{f"{inventory}/{extra['Id']}": extra for extra in self.extra_firmware},
            f"{inventory}/shelf-fw": {
                "Id": "shelf-fw",
                "Name": "PSU",
                "Version": self.shelf_version,
                "RelatedItem": [{"@odata.id": f"{ROOT}/Chassis/ps-0"}],
            },
        }

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any] | None]:
        self.posts.append(path)
        status, headers, doc = self._carry_out(path, body)
        if self.lost_answers:  # done, but the answer the client gets says otherwise (a 5xx)
            lost = self.lost_answers.pop(0)
            return lost, {}, {"error": {"message": f"injected {lost} after carrying it out"}}
        return status, headers, doc

    def _carry_out(
        self, path: str, body: dict[str, Any]
    ) -> tuple[int, dict[str, str], dict[str, Any] | None]:
        if path.endswith("/Actions/Reset"):
            on = body["ResetType"] in ("On", "GracefulRestart", "ForceRestart")
            if "Restart" in body["ResetType"] and self.ignores_restarts:
                return 204, {}, None
            if path.startswith(f"{ROOT}/Systems/"):
                self.system_power = "On" if on else "Off"
                if body["ResetType"] == "GracefulRestart" and self.slow_shutdowns:
                    self.shutting_down = True  # nothing shows until the OS is down
                elif "Restart" in body["ResetType"]:
                    self._restart()
            else:
                self.shelf_power = "On" if on else "Off"
            return 204, {}, None
        if path == f"{ROOT}/UpdateService/Actions/SimpleUpdate":
            self.updates.append(body)
            match = _IMAGE_VERSION.search(body["ImageURI"])
            self.pending = (body["Targets"][0], match.group(1) if match else "")
            monitor = f"{ROOT}/TaskService/TaskMonitors/1"
            return 202, {"Location": monitor}, {"Id": "1", "Name": "update", "TaskState": "Running"}
        return 404, {}, {"error": {"message": f"no action at {path}"}}

    def _restart(self) -> None:
        self.off_reads_left = self.restart_off_reads
        if self.last_reset_time:
            self.last_reset_time = f"{self.last_reset_time}+"  # any new value records a reset

    def shutdown_done(self) -> None:
        """The OS of a slow graceful restart (`slow_shutdowns`) is down: the machine restarts now."""
        assert self.shutting_down
        self.shutting_down = False
        self._restart()

    def read(self, path: str) -> dict[str, Any] | None:
        doc = self.documents().get(path)
        if doc is not None and path == f"{ROOT}/Systems/node-0":
            self.system_reads += 1
            if self.power_script:
                doc = {**doc, "PowerState": self.power_script.pop(0)}
            elif self.off_reads_left:
                self.off_reads_left -= 1
                doc = {**doc, "PowerState": "Off"}
        return doc

    def monitor(self) -> tuple[int, dict[str, Any]]:
        self.task_polls -= 1
        if self.task_polls >= 0:
            return 202, {"Id": "1", "Name": "update", "TaskState": "Running"}
        assert self.pending is not None
        target, version = self.pending
        if not version:
            messages = [{"Message": "image file name carries no version"}]
            return 200, {"Id": "1", "Name": "update", "TaskState": "Exception", "Messages": messages}
        if target.endswith("/Systems/node-0"):
            self.bios_version = version
        else:
            self.shelf_version = version
        return 200, {"Id": "1", "Name": "update", "TaskState": "Completed", "TaskStatus": "OK"}


def _handler(bmc: FakeBmc) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(
            self, status: int, doc: dict[str, Any] | None, headers: dict[str, str] | None = None
        ) -> None:
            body = json.dumps(doc).encode() if doc is not None else b""
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _refused(self) -> bool:
            if bmc.failures:
                status = bmc.failures.pop(0)
                self._send(status, {"error": {"message": f"injected {status}"}})
                return True
            if self.path.rstrip("/") != ROOT and self.headers.get("Authorization") != AUTH:
                self._send(401, {"error": {"message": "Incorrect username or password"}})
                return True
            return False

        def do_GET(self) -> None:
            if self._refused():
                return
            if (raw := bmc.garbage.get(self.path.rstrip("/"))) is not None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return
            if self.path == f"{ROOT}/TaskService/TaskMonitors/1":
                self._send(*bmc.monitor())
                return
            doc = bmc.read(self.path.rstrip("/"))
            if doc is None:
                self._send(404, {"error": {"message": f"{self.path} not found"}})
            else:
                self._send(200, {"@odata.id": self.path, **doc})

        def do_POST(self) -> None:
            if self._refused():
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            status, headers, doc = bmc.post(self.path, body)
            if bmc.garbled_actions:
                bmc.garbled_actions -= 1
                page = b"<html>Accepted</html>"
                self.send_response(status)
                for name, value in {**headers, "Content-Length": str(len(page))}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(page)
                return
            self._send(status, doc, headers)

    return Handler


@pytest.fixture
def fake_bmc() -> Iterator[tuple[FakeBmc, str]]:
    bmc = FakeBmc()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(bmc))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield bmc, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


CONFIG = RedfishConfig(
    poll_interval=0.01, retry_delay=0.01, image_uri="http://images/{type}/fw-{version}.bin"
)


def component(url: str, resource: str, ctype: ComponentType = ComponentType.COMPUTE) -> Component:
    bmc = Bmc(url, resource, "env:BMC")
    return Component(uuid.uuid4(), uuid.uuid4(), ctype, "c0", "", "old", PowerState.UNKNOWN, bmc)


def backend(config: RedfishConfig = CONFIG) -> RedfishBackend:
    return RedfishBackend(config, env=ENV)


def upgrade(version: str) -> Task:
    return task(OperationKind.UPGRADE_FIRMWARE, target_version=version)


async def test_a_system_is_flashed_with_the_mapped_image_and_the_version_read_back(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    bmc, url = fake_bmc
    node = component(url, "Systems/node-0")
    change = await backend().run_step(upgrade("2.0"), node, Kept())
    assert bmc.updates == [
        {
            "ImageURI": "http://images/compute/fw-2.0.bin",
            "TransferProtocol": "HTTP",
            "Targets": [f"{ROOT}/Systems/node-0"],
        }
    ]
    assert bmc.task_polls < 0  # the task monitor was followed to its end
    assert stored(node, change).firmware_version == "2.0"


async def test_a_chassis_version_is_read_from_the_firmware_inventory(fake_bmc: tuple[FakeBmc, str]) -> None:
    bmc, url = fake_bmc
    shelf = component(url, "Chassis/ps-0", ComponentType.POWERSHELF)
    change = await backend().run_step(upgrade("https://images/psu/fw-4.3.bin"), shelf, Kept())
    assert bmc.updates[0]["TransferProtocol"] == "HTTPS"
    assert stored(shelf, change).firmware_version == "4.3"


async def test_a_failed_update_task_fails_the_step(fake_bmc: tuple[FakeBmc, str]) -> None:
    _, url = fake_bmc
    node = component(url, "Systems/node-0")
    with pytest.raises(StepFailed) as caught:
        await backend().run_step(upgrade("http://images/unversioned.bin"), node, Kept())
    assert str(caught.value) == (
        f"{url}{ROOT}/Systems/node-0: the BMC's update task ended Exception: "
        "image file name carries no version"
    )


async def test_server_errors_are_retried_through_sushy(fake_bmc: tuple[FakeBmc, str]) -> None:
    bmc, url = fake_bmc
    node = component(url, "Systems/node-0")
    bmc.failures = [503, 503, 503]
    change = await backend().run_step(upgrade("2.1"), node, Kept())
    assert stored(node, change).firmware_version == "2.1"


async def test_server_errors_that_persist_fail_after_the_retries(fake_bmc: tuple[FakeBmc, str]) -> None:
    bmc, url = fake_bmc
    node = component(url, "Systems/node-0")
    bmc.failures = [500] * 50
    with pytest.raises(StepFailed) as caught:
        impatient = backend(RedfishConfig(retries=1, retry_delay=0.01))
        await impatient.run_step(task(OperationKind.POWER_ON), node, Kept())
    assert str(caught.value).startswith(f"connecting to {url}{ROOT}/Systems/node-0: HTTP 500: injected 500")
    assert str(caught.value).endswith("(gave up after 2 attempts)")


GARBAGE = {
    "an HTML page": b"<html><body>Please log in</body></html>",
    "truncated JSON": b'{"Id": "node-0", "Power',
    "a JSON list": b"[1, 2, 3]",
    "a malformed Actions": json.dumps(
        {
            "@odata.id": f"{ROOT}/Systems/node-0",
            "Id": "node-0",
            "Name": "n",
            "Actions": {"#ComputerSystem.Reset": "x"},
        }
    ).encode(),
}


# The resource answers each; the service root each but the last (it has no actions to read).
NOT_REDFISH = [
    *(pytest.param("Systems/node-0", body, id=f"resource-{name}") for name, body in GARBAGE.items()),
    *(pytest.param("", body, id=f"service root-{name}") for name, body in list(GARBAGE.items())[:3]),
]


@pytest.mark.parametrize(("where", "body"), NOT_REDFISH)
async def test_an_answer_that_is_not_redfish_fails_the_step_saying_so(
    fake_bmc: tuple[FakeBmc, str], body: bytes, where: str
) -> None:
    """A BMC (or a proxy in front of it) answering an HTML page, cut-off JSON or a document of the wrong
    shape made sushy raise JSONDecodeError or TypeError: the task failed with `unexpected error:
    JSONDecodeError('Expecting value…')`, naming no BMC, and the server logged a traceback as for a bug."""
    bmc, url = fake_bmc
    bmc.garbage[f"{ROOT}/{where}".rstrip("/")] = body
    with pytest.raises(StepFailed) as caught:
        await backend().run_step(task(OperationKind.POWER_OFF), component(url, "Systems/node-0"), Kept())
    what = "reading the power state of" if where else "connecting to"
    assert str(caught.value).startswith(f"{what} {url}{ROOT}/Systems/node-0: the BMC's answer is not ")
    assert str(caught.value).endswith("; not retried")
    assert not caught.value.retryable
    assert bmc.posts == [] and bmc.system_power == "On"


async def test_a_power_state_sushy_does_not_know_is_named_in_the_timeout(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    """A vendor's PowerState outside Redfish's five ("Standby"): sushy maps it to None, and the step's
    timeout said `power still unknown`, hiding what the BMC actually reported."""
    bmc, url = fake_bmc
    bmc.power_script = ["On"] + ["Standby"] * 10_000
    brief = backend(RedfishConfig(poll_interval=0.01, power_timeout=0.2))
    with pytest.raises(StepFailed) as caught:
        await brief.run_step(
            task(OperationKind.POWER_OFF, forced=True), component(url, "Systems/node-0"), Kept()
        )
    assert (
        str(caught.value)
        == f"{url}{ROOT}/Systems/node-0: power still Standby, not off, 0.2s after Reset ForceOff"
    )
    assert caught.value.retryable


async def test_wrong_credentials_fail_without_retrying(fake_bmc: tuple[FakeBmc, str]) -> None:
    bmc, url = fake_bmc
    node = component(url, "Systems/node-0")
    wrong = RedfishBackend(CONFIG, env={"BMC": "admin:wrong"})
    with pytest.raises(StepFailed) as caught:
        await wrong.run_step(task(OperationKind.POWER_OFF), node, Kept())
    assert str(caught.value) == (
        f"reading the power state of {url}{ROOT}/Systems/node-0: the BMC refused the credentials "
        "(HTTP 401: Incorrect username or password); not retried"
    )
    assert bmc.system_power == "On"


async def test_a_chassis_is_powered_through_chassis_reset(fake_bmc: tuple[FakeBmc, str]) -> None:
    bmc, url = fake_bmc
    shelf = component(url, "Chassis/ps-0", ComponentType.POWERSHELF)
    change = await backend().run_step(task(OperationKind.POWER_OFF, forced=True), shelf, Kept())
    assert bmc.shelf_power == "Off"
    assert stored(shelf, change).power_state is PowerState.OFF


async def test_a_manager_has_no_power_control(fake_bmc: tuple[FakeBmc, str]) -> None:
    _, url = fake_bmc
    manager = component(url, "Managers/bmc")
    with pytest.raises(StepFailed, match=r"Managers/bmc is a manager, which has no power control"):
        await backend().run_step(task(OperationKind.POWER_ON), manager, Kept())


async def test_ingest_records_power_and_firmware(fake_bmc: tuple[FakeBmc, str]) -> None:
    bmc, url = fake_bmc
    bmc.system_power = "Off"
    node = component(url, "Systems/node-0")
    change = await backend().run_step(task(OperationKind.INGEST), node, Kept())
    found = stored(node, change)
    assert (found.power_state, found.firmware_version) == (PowerState.OFF, "1.0")


async def test_a_manager_firmware_version_is_ingested(fake_bmc: tuple[FakeBmc, str]) -> None:
    _, url = fake_bmc
    manager = component(url, "Managers/bmc")
    change = await backend().run_step(task(OperationKind.INGEST), manager, Kept())
    assert stored(manager, change).firmware_version == "7.1"


@pytest.fixture
def other_bmc() -> Iterator[tuple[FakeBmc, str]]:
    bmc = FakeBmc()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(bmc))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield bmc, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_an_action_on_another_host_is_not_followed(
    fake_bmc: tuple[FakeBmc, str], other_bmc: tuple[FakeBmc, str]
) -> None:
    """sushy POSTs an action to the URL the BMC names, wherever it points, with this BMC's credentials: a
    misconfigured or hostile BMC could have another machine powered off. Only this BMC's origin is asked."""
    bmc, url = fake_bmc
    other, other_url = other_bmc
    bmc.reset_target = f"{other_url}{ROOT}/Systems/node-0/Actions/Reset"
    brief = backend(RedfishConfig(poll_interval=0.01, power_timeout=1.0))
    with pytest.raises(StepFailed) as caught:
        await brief.run_step(
            task(OperationKind.POWER_OFF, forced=True), component(url, "Systems/node-0"), Kept()
        )
    assert "not followed" in str(caught.value) and not caught.value.retryable
    assert other.posts == [] and other.system_power == "On"


async def test_a_reset_whose_answer_is_lost_is_sent_once_and_its_effect_read(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    """A Reset the BMC carried out and answered 503 (or a timeout): sending it again would restart the
    machine again. It is sent once; the power state says whether it happened."""
    bmc, url = fake_bmc
    node = component(url, "Systems/node-0")
    bmc.lost_answers = [503]
    change = await backend().run_step(task(OperationKind.POWER_OFF, forced=True), node, Kept())
    assert stored(node, change).power_state is PowerState.OFF
    assert bmc.posts == [f"{ROOT}/Systems/node-0/Actions/Reset"]


async def test_a_simple_update_whose_answer_is_lost_is_not_sent_again(fake_bmc: tuple[FakeBmc, str]) -> None:
    """A SimpleUpdate the BMC started and answered 503: a second one would flash the component mid-update.
    The step fails, not retryable, saying so."""
    bmc, url = fake_bmc
    bmc.lost_answers = [503]
    with pytest.raises(StepFailed) as caught:
        await backend().run_step(upgrade("2.0"), component(url, "Systems/node-0"), Kept())
    assert "not sent again" in str(caught.value) and not caught.value.retryable
    assert len(bmc.updates) == 1


async def test_a_simple_update_answered_with_a_page_is_taken_as_started_not_sent_again(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    """The BMC started the update and answered 202 with an HTML page: sushy cannot read the task monitor
    out of it. The update may be flashing: the step fails saying so, and a retry must not send another."""
    bmc, url = fake_bmc
    bmc.garbled_actions = 1
    with pytest.raises(StepFailed) as caught:
        await backend().run_step(upgrade("2.0"), component(url, "Systems/node-0"), Kept())
    assert "the BMC's answer is not JSON" in str(caught.value)
    assert str(caught.value).endswith("not sent again: the BMC may be applying it (see its update service)")
    assert not caught.value.retryable and len(bmc.updates) == 1


async def test_an_update_still_running_at_the_timeout_is_not_retried(fake_bmc: tuple[FakeBmc, str]) -> None:
    """A task retry would send a second SimpleUpdate while the first still flashes."""
    bmc, url = fake_bmc
    bmc.task_polls = 10_000
    impatient = backend(RedfishConfig(poll_interval=0.01, firmware_timeout=0.1, image_uri=CONFIG.image_uri))
    with pytest.raises(StepFailed) as caught:
        await impatient.run_step(upgrade("2.0"), component(url, "Systems/node-0"), Kept())
    assert "still running" in str(caught.value) and not caught.value.retryable


async def test_a_restart_ignored_by_a_bmc_with_last_reset_time_is_not_reported_done(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    """The BMC keeps LastResetTime, answers 204 to ForceRestart and does nothing: the power reads On and
    LastResetTime stays. It would have moved with a restart: rackflow may not say "reset"."""
    bmc, url = fake_bmc
    bmc.last_reset_time, bmc.ignores_restarts = "2025-06-01T11:00:00Z", True
    brief = backend(RedfishConfig(poll_interval=0.01, power_timeout=0.3, restart_proof_window=0.05))
    with pytest.raises(StepFailed) as caught:
        await brief.run_step(
            task(OperationKind.POWER_RESET, forced=True), component(url, "Systems/node-0"), Kept()
        )
    assert str(caught.value).startswith(
        f"{url}{ROOT}/Systems/node-0: no sign that Reset ForceRestart restarted it: power read On throughout "
        "0.3s and its LastResetTime stayed 2025-06-01T11:00:00Z; not retried"
    )
    assert not caught.value.retryable
    assert bmc.posts == [f"{ROOT}/Systems/node-0/Actions/Reset"]


async def test_a_restart_ignored_by_a_bmc_without_last_reset_time_is_done_unverified(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    """Without LastResetTime nothing could tell this from a warm restart that kept the power On: after the
    proof window the reset is done, once, with a note that it was not observed."""
    bmc, url = fake_bmc
    bmc.ignores_restarts = True
    brief = backend(RedfishConfig(poll_interval=0.01, power_timeout=5.0, restart_proof_window=0.2))
    node = component(url, "Systems/node-0")
    change = await brief.run_step(task(OperationKind.POWER_RESET, forced=True), node, Kept())
    assert stored(node, change).power_state is PowerState.ON
    assert change is not None and change.note == (
        f"{url}{ROOT}/Systems/node-0: restart unverified: Reset ForceRestart accepted, but not observed: no "
        "Off, PoweringOff or PoweringOn read in 0.2s, and the BMC keeps no LastResetTime; counted done, not "
        "retried"
    )
    assert bmc.posts == [f"{ROOT}/Systems/node-0/Actions/Reset"]


async def test_a_restart_seen_going_off_on_a_bmc_without_last_reset_time_is_done(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    bmc, url = fake_bmc
    bmc.restart_off_reads = 2
    patient = backend(RedfishConfig(poll_interval=0.01, restart_proof_window=60.0))
    node = component(url, "Systems/node-0")
    change = await patient.run_step(task(OperationKind.POWER_RESET, forced=True), node, Kept())
    assert change is not None and (change.power_state, change.note) == (PowerState.ON, None)
    assert bmc.off_reads_left == 0


async def test_a_warm_restart_is_proved_by_the_systems_last_reset_time(fake_bmc: tuple[FakeBmc, str]) -> None:
    bmc, url = fake_bmc
    bmc.last_reset_time = "2025-06-01T11:00:00Z"
    node = component(url, "Systems/node-0")
    change = await backend().run_step(task(OperationKind.POWER_RESET, forced=True), node, Kept())
    assert stored(node, change).power_state is PowerState.ON
    assert bmc.last_reset_time == "2025-06-01T11:00:00Z+"


def _firmware_entry(identity: str, version: str, *related: str) -> dict[str, Any]:
    links = [{"@odata.id": f"{ROOT}/{r}"} for r in related]
    return {"Id": identity, "Name": identity, "Version": version, "RelatedItem": links}


async def test_a_chassis_version_is_never_read_from_another_devices_entry(
    fake_bmc: tuple[FakeBmc, str],
) -> None:
    """Entries of the BMC and of another shelf, listed first, are not the shelf's firmware."""
    bmc, url = fake_bmc
    bmc.extra_firmware = [
        _firmware_entry("bmc-fw", "4.3", "Managers/bmc"),
        _firmware_entry("other-shelf-fw", "4.3", "Chassis/ps-1"),
    ]
    shelf = component(url, "Chassis/ps-0", ComponentType.POWERSHELF)
    change = await backend().run_step(upgrade("4.3"), shelf, Kept())
    assert len(bmc.updates) == 1  # 4.2 read, not another device's 4.3: flashed
    assert stored(shelf, change).firmware_version == "4.3"


async def test_a_chassis_whose_entries_disagree_is_not_flashed(fake_bmc: tuple[FakeBmc, str]) -> None:
    """Two entries name the shelf: the one listed first already reads 4.3, the shelf's own 4.2. Either
    could be the one an upgrade to 4.3 must check, so rackflow refuses rather than skip (or verify) it."""
    bmc, url = fake_bmc
    bmc.extra_firmware = [_firmware_entry("shelf-cpld", "4.3", "Chassis/ps-0")]
    shelf = component(url, "Chassis/ps-0", ComponentType.POWERSHELF)
    with pytest.raises(StepFailed) as caught:
        await backend().run_step(upgrade("4.3"), shelf, Kept())
    assert str(caught.value) == (
        f"reading the firmware version of {url}{ROOT}/Chassis/ps-0: 2 firmware inventory entries name "
        f"{ROOT}/Chassis/ps-0 with different versions (shelf-cpld 4.3, shelf-fw 4.2): cannot tell which is "
        "the component's firmware"
    )
    assert not caught.value.retryable and bmc.updates == []

    change = await backend().run_step(
        task(OperationKind.INGEST), shelf, Kept()
    )  # power read, firmware not recorded
    assert change is not None and (change.power_state, change.firmware_version) == (PowerState.ON, None)
