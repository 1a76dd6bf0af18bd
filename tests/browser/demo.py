"""A small fleet with a history, for screenshots and for looking at the dashboard by hand.

    python -m tests.browser.demo          serves it at http://127.0.0.1:8080/ until Ctrl-C

Twelve racks in two NVLink domains, seven schedules (one paused, one firmware upgrade, one whose rack keeps
failing, one rollout halted by that rack) and a few firings of each, and a task held back by a freeze, so
every page has something to show.
"""

from __future__ import annotations

import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rackflow.client import NewComponent, Operation, RackflowClient, Span, Spec, Targets, Window
from rackflow.v1 import flow_pb2 as pb
from tests.conftest import migrate_with_cli
from tests.e2e.cluster import ServerProcess, start_server

FAILING_RACK = "rack-07"
# Components whose steps fail (the simulator's RACKFLOW_SIM_FAIL_IDS): one compute tray of FAILING_RACK.
FAIL_IDS = f"{FAILING_RACK}-node-2"
ROLLOUT = "gpu-fw-rollout"  # halts when FAILING_RACK fails (the run page's screenshot)


def _components(rack: str) -> list[NewComponent]:
    return [
        NewComponent("POWERSHELF", "ps-0", f"{rack}-ps-0", "1.2.0"),
        *(NewComponent("COMPUTE", f"node-{i}", f"{rack}-node-{i}", "2.4.0") for i in range(4)),
        NewComponent("NVSWITCH", "nvsw-0", f"{rack}-nvsw-0", "3.1.0"),
        NewComponent("NVSWITCH", "nvsw-1", f"{rack}-nvsw-1", "3.1.0"),
        NewComponent("TORSWITCH", "tor-0", f"{rack}-tor-0", "5.0.1"),
    ]


def _racks(names: list[str]) -> Targets:
    return Targets(racks=tuple(names))


def seed(client: RackflowClient) -> None:
    """Racks, domains, schedules, and a few firings whose tasks have ended."""
    names = [f"rack-{i:02d}" for i in range(1, 13)]
    for name in names:
        client.create_rack(name, external_id=f"SN-{1000 + int(name[-2:])}", components=_components(name))
    client.create_domain("nvl-a", names[:6])
    client.create_domain("nvl-b", names[6:])
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).replace(hour=6, minute=0, second=0, microsecond=0)
    schedules = [
        (
            "nightly-reset",
            Spec.cron("0 2 * * *", "Europe/Berlin"),
            Operation("power_reset", _racks(names[:4])),
        ),
        (
            "weekly-firmware",
            Spec.cron("30 3 * * SUN", "America/New_York"),
            Operation("upgrade_firmware", _racks(names[4:8]), version="2.5.0"),
        ),
        ("ingest-every-2h", Spec.interval("2h"), Operation("ingest", _racks(names[8:12]))),
        (
            "drain-weekdays",
            Spec.cron("*/15 * * * MON-FRI", "Asia/Tokyo"),
            Operation("power_off", _racks(names[10:12]), forced=True),
        ),
        (
            "bring-up-rack-12",
            Spec.at(tomorrow.isoformat().replace("+00:00", "Z")),
            Operation("bring_up", _racks(names[11:])),
        ),
        ("power-on-weekends", Spec.cron("0 8 * * SAT,SUN", "UTC"), Operation("power_on", _racks(names[:12]))),
    ]
    for name, spec, operation in schedules:
        client.create_schedule(name, spec, operation)
    client.pause_schedule("power-on-weekends")
    for _ in range(3):
        for name in ("nightly-reset", "weekly-firmware", "ingest-every-2h"):
            client.trigger_schedule(name)
        _wait_idle(client)
    client.power_on(_racks(["rack-09"]), description="after maintenance")
    _wait_idle(client)
    client.create_schedule(
        ROLLOUT,
        Spec.cron("0 4 * * TUE", "Europe/Berlin"),
        Operation("upgrade_firmware", _racks(names[4:12]), version="2.6.0"),
        rollout=pb.RolloutPolicy(max_concurrent_racks=2, halt_after_failures=1),
    )
    client.trigger_schedule(ROLLOUT)
    _wait_halted(client, ROLLOUT)
    now = datetime.now(UTC)
    client.create_window(
        "pdu-work",
        Window(
            "freeze",
            Span(now - timedelta(minutes=5), now + timedelta(hours=3)),
            racks=["rack-03"],
            reason="PDU replacement, INC-5120",
        ),
    )
    client.power_on(_racks(["rack-03"]), description="after the PDU work")  # held back by the freeze
    client.create_budget("firmware", ["upgrade-firmware"], 4, max_per_domain=2)


def _wait_idle(client: RackflowClient, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while client.list_tasks(active_only=True).total and time.monotonic() < deadline:
        time.sleep(0.2)


def _wait_halted(client: RackflowClient, schedule: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while client.list_runs(schedule, limit=1).runs[0].state != "halted" and time.monotonic() < deadline:
        time.sleep(0.2)
    _wait_idle(client)


def start_demo(directory: Path, http_listen: str = "127.0.0.1:0") -> ServerProcess:
    url = f"sqlite:///{directory}/demo.db"
    migrate_with_cli(url)
    server = start_server(
        url,
        directory,
        args=["--http-listen", http_listen],
        env={"RACKFLOW_SIM_STEP_SECONDS": "0.3", "RACKFLOW_SIM_FAIL_IDS": FAIL_IDS},
        name="demo",
    )
    with RackflowClient(server.address) as client:
        seed(client)
        client.trigger_schedule("drain-weekdays")  # still running when the first pictures are taken
    return server


def main() -> None:
    directory = Path(tempfile.mkdtemp(prefix="rackflow-demo-"))
    server = start_demo(directory, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8080")
    print(f"dashboard: {server.http_url}/  (gRPC {server.address}; Ctrl-C stops)")
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
