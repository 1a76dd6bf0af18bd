"""The alertmanager pre-flight check against a REAL Alertmanager (Debian's `prometheus-alertmanager`, which
`make tools` installs), started per test on a free loopback port with a temporary config, on both
databases:

* an alert firing for rack A holds A's firmware task, the reason naming the alert, while B's runs;
* the alert resolved (posted again with `endsAt` in the past), A's task starts;
* Alertmanager stopped, a new task on A is held (fail closed), and once the maximum wait is exceeded it
  fails with that reason.

Without the binary these tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rackflow.checks.service import CheckInput
from rackflow.domain.checks import AlertmanagerSettings
from rackflow.domain.inventory import ComponentSpec, ComponentType, Rack
from rackflow.domain.tasks import Operation, OperationKind, Task, TaskStatus
from rackflow.inventory.service import InventoryService
from rackflow.services import Services
from rackflow.store.db import Database
from tests.checks_support import checking
from tests.store.test_executor import CLOCK, eventually, finished, get, submit

BINARY = os.environ.get("RACKFLOW_TEST_ALERTMANAGER", "/usr/bin/prometheus-alertmanager")
CONFIG = 'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'
FIRMWARE = Operation(OperationKind.UPGRADE_FIRMWARE, target_version="2.0")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Alertmanager:
    url: str
    process: subprocess.Popen[bytes]

    def post(self, labels: dict[str, str], *, resolved: bool = False) -> None:
        alert: dict[str, Any] = {"labels": labels}
        if resolved:
            alert["endsAt"] = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps([alert]).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def active(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts?active=true", timeout=10) as answer:
            found: list[dict[str, Any]] = json.load(answer)
            return found

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    if not os.access(BINARY, os.X_OK):
        reason = f"{BINARY} is missing (make tools installs Debian's prometheus-alertmanager)"
        if os.environ.get("CI"):
            pytest.fail(f"Alertmanager tests cannot run under CI: {reason}", pytrace=False)
        pytest.skip(reason)
    config = tmp_path / "alertmanager.yml"
    config.write_text(CONFIG)
    port = _free_port()
    log = (tmp_path / "alertmanager.log").open("wb")
    process = subprocess.Popen(
        [
            BINARY,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    started = Alertmanager(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{started.url}/-/ready", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"alertmanager did not get ready: {(tmp_path / 'alertmanager.log').read_text()}")
        time.sleep(0.1)
    try:
        yield started
    finally:
        if process.poll() is None:
            started.stop()
        log.close()


async def _rack(db: Database, name: str) -> Rack:
    spec = ComponentSpec(
        ComponentType.COMPUTE, "compute-0", external_id=f"{name}-gpu-0", firmware_version="1"
    )
    return await InventoryService(db, CLOCK).create_rack(name, components=[spec])


async def _held_with(db: Database, task: Task, words: str) -> Task:
    async def held() -> bool:
        found = await get(db, task)
        return found.held_by == "preflight" and words in (found.held_reason or "")

    await eventually(held)
    return await get(db, task)


async def test_an_alert_holds_its_rack_until_resolved_and_a_silent_alertmanager_fails_closed(
    db: Database, alertmanager: Alertmanager
) -> None:
    a, b = await _rack(db, "rack-a"), await _rack(db, "rack-b")
    services = Services.build(db, CLOCK)
    check = await services.checks.create(
        CheckInput(
            name="no-alerts",
            operations=(OperationKind.UPGRADE_FIRMWARE,),
            settings=AlertmanagerSettings(
                alertmanager.url, ('rack="{rack.name}"', 'severity=~"critical|warning"'), True
            ),
            interval="200ms",
        )
    )
    overheat = {"alertname": "RackOverheat", "rack": "rack-a", "severity": "critical"}
    alertmanager.post(overheat)
    alertmanager.post({"alertname": "Chatter", "rack": "rack-b", "severity": "info"})  # matches no matcher
    assert len(alertmanager.active()) == 2
    first_a, first_b = await submit(db, a, FIRMWARE), await submit(db, b, FIRMWARE)
    async with checking(db):
        held = await _held_with(db, first_a, "RackOverheat")
        assert held.held_reason == (
            "pre-flight check 'no-alerts': alertmanager: alert "
            'RackOverheat{rack="rack-a",severity="critical"} firing'
        )
        assert (await finished(db, first_b)).status is TaskStatus.COMPLETED
        assert (await get(db, first_a)).status is TaskStatus.PENDING

        alertmanager.post(overheat, resolved=True)
        assert (await finished(db, first_a)).status is TaskStatus.COMPLETED

        alertmanager.stop()
        second_a = await submit(db, a, FIRMWARE)
        await _held_with(db, second_a, "alertmanager: cannot ask")
        assert (await get(db, second_a)).status is TaskStatus.PENDING
        await services.checks.update(check.id, ["check.max_wait"], CheckInput(max_wait="1s"))
        gave_up = await finished(db, second_a)
    assert gave_up.status is TaskStatus.FAILED
    assert gave_up.message.startswith(
        f"pre-flight check 'no-alerts': alertmanager: cannot ask {alertmanager.url}"
    )
    assert gave_up.message.endswith("(pre-flight check 'no-alerts' gave up after 1s)")
