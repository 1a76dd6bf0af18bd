"""The redfish backend against a real Redfish service: sushy-tools' `sushy-emulator` in fake mode.

A real `rackflow serve --backend redfish` process powers a rack off, on and reset through the emulator's
HTTP API, and the emulator's own state (read over HTTP, independently of rackflow) confirms each: every
system reaches the state, the power shelf goes down last and comes up first, and a reset is seen going
through off. Racks with wrong credentials and with an unreachable BMC fail with a clear message in the
same request, while the good rack completes.

The emulator's fake driver applies a power change 1-11 s after the request (it imitates hardware), so these
tests take about a minute. Its UpdateService cannot flash anything in fake mode (SimpleUpdate answers 500
there), so firmware upgrades are tested against a small fake service in tests/unit/test_redfish_firmware.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from rackflow.v1 import flow_pb2 as pb
from rackflow.v1 import flow_pb2_grpc
from tests.e2e.cluster import ServerProcess, free_port, start_server

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "redfish-fleet.yaml"
EXAMPLE_URL = "http://127.0.0.1:8000"
USER, PASSWORD = "admin", "secret"
LAB = ("lab-ps-0", "lab-node-0", "lab-node-1", "lab-node-2")  # the example rack's systems
OTHERS = ("other-node-0", "far-node-0")  # the wrong-credentials rack's and the unreachable rack's
COMPONENTS = ("ps-0", "node-0", "node-1", "node-2")  # the example rack's components in rackflow
TASK_TIMEOUT_S = 120.0
STARTUP_TIMEOUT_S = 30.0

_RESET = re.compile(r"POST /redfish/v1/Systems/([0-9a-f-]+)/Actions/ComputerSystem\.Reset HTTP/[\d.]+\S* 204")

EMULATOR_CONFIG = """
SUSHY_EMULATOR_LISTEN_IP = "127.0.0.1"
SUSHY_EMULATOR_AUTH_FILE = {auth!r}
SUSHY_EMULATOR_STATE_DIR = {state!r}
SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}
"""


@dataclass
class Emulator:
    url: str
    systems: dict[str, str]  # name -> uuid
    proc: subprocess.Popen[bytes]
    log_path: Path

    def resets_since(self, offset: int) -> list[str]:
        """The systems sent a Reset after `offset` bytes of the emulator's request log, in arrival order."""
        by_uuid = {u: n for n, u in self.systems.items()}
        log = self.log_path.read_bytes()[offset:].decode(errors="replace")
        return [by_uuid[u] for u in _RESET.findall(log)]

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def power(self, name: str) -> str:
        """The system's PowerState, as the emulator reports it (no rackflow code involved)."""
        response = requests.get(
            f"{self.url}/redfish/v1/Systems/{self.systems[name]}", auth=(USER, PASSWORD), timeout=10
        )
        response.raise_for_status()
        return str(response.json()["PowerState"])


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    home = tmp_path_factory.mktemp("sushy")
    auth = home / "htpasswd"
    auth.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    systems = {name: str(uuid.uuid4()) for name in (*LAB, *OTHERS)}
    fake = [{"uuid": u, "name": n, "power_state": "On", "nics": []} for n, u in systems.items()]
    config = home / "emulator.conf"
    config.write_text(EMULATOR_CONFIG.format(auth=str(auth), state=str(home / "state"), systems=fake))
    port = free_port()
    log_path = home / "emulator.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sushy_tools.emulator.main",
                "--config",
                str(config),
                "--fake",
                "-i",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    running = Emulator(f"http://127.0.0.1:{port}", systems, proc, log_path)
    try:
        _wait_until_serving(running)
        yield running
    finally:
        proc.terminate()
        proc.wait(10)


def _wait_until_serving(emulator: Emulator) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if emulator.proc.poll() is not None:
            raise RuntimeError(f"sushy-emulator exited:\n{emulator.log_path.read_text()}")
        try:
            if requests.get(f"{emulator.url}/redfish/v1/", timeout=1).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"sushy-emulator did not start:\n{emulator.log_path.read_text()}")


@pytest.fixture(scope="module")
def server(emulator: Emulator, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("rackflow")
    env = {
        "BMC_LAB": f"{USER}:{PASSWORD}",
        "BMC_OTHER": f"{USER}:not-the-password",
        "RACKFLOW_REDFISH_POLL_SECONDS": "0.2",
        "RACKFLOW_REDFISH_POWER_TIMEOUT": "45",
        "RACKFLOW_REDFISH_RETRIES": "2",
        "RACKFLOW_REDFISH_RETRY_DELAY": "0.2",
        "RACKFLOW_REDFISH_CONNECT_TIMEOUT": "2",
    }
    proc = start_server(
        f"sqlite:///{home}/rackflow.db", home, args=["--migrate", "--backend", "redfish"], env=env
    )
    try:
        _import_fleet(proc, emulator, home)
        yield proc
    finally:
        assert proc.stop() == 0, proc.output
        assert PASSWORD not in proc.output and "not-the-password" not in proc.output  # never logged


def _import_fleet(server: ServerProcess, emulator: Emulator, home: Path) -> None:
    """The example fleet, pointed at this emulator, plus a wrong-credentials rack and an unreachable one."""
    document = yaml.safe_load(EXAMPLE.read_text().replace(EXAMPLE_URL, emulator.url))
    unreachable = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for rack, url, system, ref in (
        ("other-rack", emulator.url, "other-node-0", "env:BMC_OTHER"),
        ("far-rack", unreachable, "far-node-0", "env:BMC_LAB"),
    ):
        bmc = {"url": url, "resource": f"Systems/{system}", "credentials": ref}
        component = {"type": "COMPUTE", "name": system, "bmc": bmc}
        document["racks"].append({"name": rack, "components": [component]})
    fleet = home / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(document))
    subprocess.run(
        [sys.executable, "-m", "rackflow", "--server", server.address, "inventory", "import", str(fleet)],
        check=True,
        capture_output=True,
        timeout=60,
    )


# --- helpers ---------------------------------------------------------------------------------------


@dataclass
class Watcher:
    """Polls the emulator for the given systems and keeps every state change."""

    emulator: Emulator
    names: tuple[str, ...]
    changes: list[tuple[str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watcher:
        self._last = {name: self.emulator.power(name) for name in self.names}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()  # within a round of polls (each request times out after 10 s)
        # A change made just before the block ended may not have been polled yet (on a loaded machine a
        # round of polls takes longer than the task's last step): one last look records it.
        self._poll()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._poll()

    def _poll(self) -> None:
        for name in self.names:
            state = self.emulator.power(name)
            if state != self._last[name]:
                self._last[name] = state
                self.changes.append((name, state))

    def seen(self, name: str) -> list[str]:
        return [state for n, state in self.changes if n == name]


def racks(*names: str) -> pb.OperationTargetSpec:
    return pb.OperationTargetSpec(racks=pb.RackTargets(targets=[pb.RackTarget(name=n) for n in names]))


def wait_for(stub: flow_pb2_grpc.FlowStub, response: pb.SubmitTaskResponse) -> dict[str, pb.Task]:
    """Every task of a submit, once all are final, by rack name."""
    names = {r.id.id: r.name for r in stub.ListRacks(pb.ListRacksRequest()).racks}
    final = {pb.TASK_STATUS_COMPLETED, pb.TASK_STATUS_FAILED, pb.TASK_STATUS_TERMINATED}
    deadline = time.monotonic() + TASK_TIMEOUT_S
    while time.monotonic() < deadline:
        tasks = stub.GetTasksByIDs(pb.GetTasksByIDsRequest(task_ids=response.task_ids)).tasks
        if all(t.status in final for t in tasks):
            return {names[t.rack_id.id]: t for t in tasks}
        time.sleep(0.2)
    raise AssertionError(f"tasks still running after {TASK_TIMEOUT_S}s: {tasks}")


def component_power(stub: flow_pb2_grpc.FlowStub, rack: str) -> dict[str, str]:
    [found] = [r for r in stub.ListRacks(pb.ListRacksRequest()).racks if r.name == rack]
    return {c.name: c.power_state for c in found.components}


# --- the tests -------------------------------------------------------------------------------------


def test_the_inventory_keeps_the_bmc_reference_not_the_secret(
    server: ServerProcess, emulator: Emulator
) -> None:
    [rack] = [r for r in server.stub().ListRacks(pb.ListRacksRequest()).racks if r.name == "lab-rack-1"]
    bmcs = {c.name: c.bmc for c in rack.components}
    expected = pb.BmcEndpoint(url=emulator.url, resource="Systems/lab-node-1", credentials="env:BMC_LAB")
    assert bmcs["node-1"] == expected


def test_a_rack_is_powered_off_on_and_reset_and_the_emulator_confirms_each(
    server: ServerProcess, emulator: Emulator
) -> None:
    stub = server.stub()

    # Off, in one request with a wrong-credentials rack and an unreachable one.
    log_offset = emulator.log_size()
    with Watcher(emulator, (*LAB, "other-node-0")) as watcher:
        submitted = stub.PowerOffRack(
            pb.PowerOffRackRequest(target_spec=racks("lab-rack-1", "other-rack", "far-rack"))
        )
        tasks = wait_for(stub, submitted)
    lab, other, far = tasks["lab-rack-1"], tasks["other-rack"], tasks["far-rack"]
    assert (lab.status, lab.message) == (pb.TASK_STATUS_COMPLETED, "powered off 4 components")
    assert {name: emulator.power(name) for name in LAB} == dict.fromkeys(LAB, "Off")
    assert component_power(stub, "lab-rack-1") == dict.fromkeys(COMPONENTS, "off")
    assert all(watcher.seen(name) == ["Off"] for name in LAB)
    resets = emulator.resets_since(log_offset)
    assert sorted(resets) == sorted(LAB) and resets[-1] == "lab-ps-0"  # the power shelf last

    assert other.status == pb.TASK_STATUS_FAILED
    assert other.message.startswith("power_off failed on other-node-0 (1/1): reading the power state of ")
    assert "the BMC refused the credentials (HTTP 401" in other.message
    assert other.message.endswith("; not retried")
    assert emulator.power("other-node-0") == "On" and watcher.seen("other-node-0") == []

    assert far.status == pb.TASK_STATUS_FAILED
    assert far.message.startswith("power_off failed on far-node-0 (1/1): connecting to http://127.0.0.1:")
    assert far.message.endswith(": connection refused (gave up after 3 attempts)")

    # On: the shelf first.
    log_offset = emulator.log_size()
    with Watcher(emulator, LAB) as watcher:
        tasks = wait_for(stub, stub.PowerOnRack(pb.PowerOnRackRequest(target_spec=racks("lab-rack-1"))))
    lab = tasks["lab-rack-1"]
    assert (lab.status, lab.message) == (pb.TASK_STATUS_COMPLETED, "powered on 4 components")
    assert {name: emulator.power(name) for name in LAB} == dict.fromkeys(LAB, "On")
    assert all(watcher.seen(name) == ["On"] for name in LAB)
    resets = emulator.resets_since(log_offset)
    assert sorted(resets) == sorted(LAB) and resets[0] == "lab-ps-0"  # the power shelf first

    # A forced reset: every system gets its reset request and is on again afterwards. (The emulator's
    # request log is the witness: a poller can miss its brief Off when the machine is loaded.)
    log_offset = emulator.log_size()
    request = pb.PowerResetRackRequest(target_spec=racks("lab-rack-1"), forced=True)
    tasks = wait_for(stub, stub.PowerResetRack(request))
    lab = tasks["lab-rack-1"]
    assert (lab.status, lab.message) == (pb.TASK_STATUS_COMPLETED, "reset 4 components")
    assert sorted(set(emulator.resets_since(log_offset))) == sorted(LAB)
    assert {name: emulator.power(name) for name in LAB} == dict.fromkeys(LAB, "On")
    assert component_power(stub, "lab-rack-1") == dict.fromkeys(COMPONENTS, "on")


def test_ingest_reads_what_the_bmc_reports(server: ServerProcess, emulator: Emulator) -> None:
    stub = server.stub()
    request = pb.IngestRackRequest(target_spec=racks("lab-rack-1", "other-rack"))
    tasks = wait_for(stub, stub.IngestRack(request))
    assert (tasks["lab-rack-1"].status, tasks["lab-rack-1"].message) == (
        pb.TASK_STATUS_COMPLETED,
        "ingested 4 components",
    )
    assert tasks["other-rack"].status == pb.TASK_STATUS_FAILED
    assert component_power(stub, "lab-rack-1") == dict.fromkeys(("ps-0", "node-0", "node-1", "node-2"), "on")
