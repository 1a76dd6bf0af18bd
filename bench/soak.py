"""soak: many faults at once, for a long time; then a checker proves from the database and the logs that
every promise held (docs/RELIABILITY.md, "The chaos soak").

`--instances` real `rackflow serve` processes (default 3) share one PostgreSQL database, reached through a
loopback TCP proxy (tests/faults/tcp_proxy.py). The load: `--schedules` recurring schedules (default 300)
over `--racks` racks (four in five of them in NVLink domains of five), 40% cron every minute in five zones,
60% intervals of 20–90 s, a quarter of them QUEUE, the rest SKIP; `--rollout-share` of them (default 10%)
roll out (docs/ROLLOUTS.md) over 4–8 racks every minute or every 30–90 s, with drawn caps, canaries, bake
times of seconds and halt limits, some not pausing on a halt; tasks from the simulator with 5% of steps
failing (which halts some rollouts: intended); and a client that keeps calling every live instance
(creating racks, one-time schedules due 10–40 s later, power-on tasks; listing schedules and tasks; as an
operator, resuming or cancelling halted rollouts); schedules with approvals, retries and start deadlines,
each kind on racks of its own, with a driver that approves, rejects, lets expire, pauses and resumes
(bench/soak_safety.py; every call is made with a bearer token); a pre-flight check (docs/CHECKS.md) on a
tenth of the racks (none of them in a rollout) asks a drain hook, served by the soak itself, that flaps
between "ready" and "not ready" every 2–6 s, and another asks a real Alertmanager (Debian's,
`--alertmanager`) that the soak restarts now and then and posts alerts for those racks to (fired, then
resolved). A seeded fault driver, one fault at a time every 10–30 s for `--minutes`:

* `kill`: SIGKILL an instance, start a new one in its place 1–5 s later (same audit spool file);
* `stop`: SIGSTOP an instance for its lease plus 1–4 s, then SIGCONT (others take its work over);
* `drop`: the proxy cuts every database connection and refuses new ones for 1–5 s;
* `delay`: the proxy holds every chunk 50–300 ms each way for 5–15 s;
* `pg-restart`: `pg_ctlcluster <version> <--pg-cluster> restart` (at most `--pg-restarts` times; it restarts
  the whole server, so every other user of it sees the restart too: run the soak on a cluster of its own,
  docs/RELIABILITY.md, or keep it 0).

Then the faults stop, the load keeps going `--settle` seconds, and the checker takes its snapshot: every
schedule's runs must follow its spec exactly (each run's slot is the spec's next time after the previous
firing, a firing skipped because the previous rollout was live included: nothing fired twice, nothing
skipped silently), and no schedule may be overdue, except one that rackflow paused when its rollout
halted (its later slots are not due: listed). Then every schedule is disabled (in the database), the tasks
and rollouts drain, and the checker reads the rest: tasks submitted twice for one rack and firing, tasks
or runs left RUNNING without a live owner, rollouts left rolling without progress, a rollout's tasks
against its record, its caps (from the tasks' start and end times) and its canary gate, that no task on a
checked rack started without its checks or while its hook said "not ready" (its last round passed, before
it started, and the hook's log agrees), that no task belongs to a run never approved, no run fired past
its start deadline and no task went past its max attempts (soak_safety.py), audit rows against the
mutating calls answered OK, the API's answers by code during each fault, and the time to recover after
each. It prints one table (Markdown) and exits 1 if any promise was broken.

    python bench/soak.py --minutes 10 --seed 1 --pg-admin postgresql://postgres@127.0.0.1:5433/postgres \
        --pg-cluster soak                                                      # on a cluster of its own
    python bench/soak.py --minutes 2 --schedules 60 --racks 30 --pg-restarts 0   # what `make test` runs
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import psycopg
import soak_notify
import soak_safety
from _common import code_line, fresh_database, machine_line, percentile
from sqlalchemy.engine import make_url

from rackflow.domain.audit import SYSTEM_PRINCIPAL
from rackflow.timespec import ScheduleSpec, SpecType, parse_spec
from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, free_port, start_server
from tests.e2e.fleet import rfc3339, schedule_request
from tests.faults.tcp_proxy import TcpProxy

ZONES = ("UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Europe/Berlin")
DISPATCH_INTERVAL_S = 2
LEASE_S = 5
CALL_TIMEOUT_S = 10
# How late a due slot may still be unfired without being a miss: three polls and a call's timeout.
DISPATCH_SLACK = timedelta(seconds=DISPATCH_INTERVAL_S * 3 + CALL_TIMEOUT_S)
DOMAIN_SIZE = 5
# From this long on, a soak whose mix produced none of a kind of safe operation fails (soak_safety.check).
LONG_RUN_MINUTES = 5
FAULTS = ("kill", "stop", "drop", "delay", "pg-restart")
MUTATING = (
    "CreateRack",
    "CreateNVLDomain",
    "CreateTaskSchedule",
    "PowerOnRack",
    "ResumeTaskScheduleRun",
    "CancelTaskScheduleRun",
    "CreatePreflightCheck",
    "ApproveTaskScheduleRun",
    "RejectTaskScheduleRun",
    "PauseTaskSchedule",
    "ResumeTaskSchedule",
)
ACTIVE = ("pending", "running", "waiting")


# --- the fleet ---------------------------------------------------------------------------------------


@dataclass
class Slot:
    """One instance position: its process is replaced after a kill, its spool file stays."""

    index: int
    server: ServerProcess
    stopped: bool = False  # SIGSTOPped just now


@dataclass
class Fleet:
    db_url: str
    log_dir: Path
    seed: int
    env: dict[str, str]  # soak_safety.server_env: the tokens and the injected failures
    slots: list[Slot] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, index: int) -> ServerProcess:
        spool = self.log_dir / f"instance{index}.spool"
        env = {
            "RACKFLOW_SIM_STEP_SECONDS": "0.05",
            "RACKFLOW_SIM_FAIL_RATE": "0.05",
            "RACKFLOW_SIM_SEED": str(self.seed * 100 + len(self.logs)),
            "RACKFLOW_AUDIT_SPOOL": str(spool),
            **self.env,
        }
        args = [
            "--dispatch-interval",
            f"{DISPATCH_INTERVAL_S}s",
            "--lease-ttl",
            f"{LEASE_S}s",
            "--db-pool-size",
            "4",
            *soak_notify.SERVE_ARGS,
        ]
        server = start_server(self.db_url, self.log_dir, args=args, env=env, name=f"instance{index}")
        self.logs.append(server.log_path)
        return server

    def live(self) -> list[ServerProcess]:
        with self.lock:
            return [s.server for s in self.slots if s.server.proc.poll() is None and not s.stopped]


# --- the flapping drain hook -------------------------------------------------------------------------


@dataclass
class FlappingHook:
    """A drain hook that flips between ready and not ready every 2–6 s (seeded), and logs every answer it
    gave: (task id, attempt) -> ready. Served on loopback in a thread of the soak."""

    rng: random.Random
    ready: bool = True
    answers: dict[tuple[str, int], list[tuple[float, bool]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    flips: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    url: str = ""

    def start(self) -> None:
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with hook.lock:
                    ready = hook.ready
                    hook.answers[(asked["task_id"], asked["attempt"])].append((time.time(), ready))
                answer = {"ok": True} if ready else {"ok": False, "reason": "draining (soak)"}
                raw = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.url = f"http://127.0.0.1:{server.server_address[1]}/drain"
        threading.Thread(target=server.serve_forever, name="drain hook", daemon=True).start()
        threading.Thread(target=self._flap, name="drain hook flaps", daemon=True).start()

    def _flap(self) -> None:
        while not self.stop.wait(self.rng.uniform(2, 6)):
            with self.lock:
                self.ready = not self.ready
                self.flips += 1

    def settle(self) -> None:
        """Ready from now on (the drain at the end)."""
        self.stop.set()
        with self.lock:
            self.ready = True


@dataclass
class SoakAlertmanager:
    """A real Alertmanager on a free loopback port that the soak restarts (down 1–4 s) and posts alerts
    for the checked racks to (each resolved 3–8 s later), every 5–15 s, seeded."""

    binary: str
    work: Path
    rng: random.Random
    racks: list[str]
    url: str = ""
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    alerts: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    _firing: list[dict[str, str]] = field(default_factory=list)

    def start(self) -> None:
        if not self.url:
            self.url = f"http://127.0.0.1:{free_port()}"
            (self.work / "alertmanager.yml").write_text(
                'route:\n  receiver: "null"\nreceivers:\n  - name: "null"\n'
            )
        log = (self.work / "alertmanager.log").open("ab")
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.work / 'alertmanager.yml'}",
                f"--storage.path={self.work / 'alertmanager'}",
                f"--web.listen-address={self.url.removeprefix('http://')}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise SystemExit(f"alertmanager did not get ready: {(self.work / 'alertmanager.log').read_text()}")

    def down(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def post(self, labels: dict[str, str], *, resolved: bool) -> None:
        alert: dict[str, Any] = {"labels": labels}
        if resolved:
            alert["endsAt"] = rfc3339(datetime.now(UTC) - timedelta(minutes=1))
        request = urllib.request.Request(
            f"{self.url}/api/v2/alerts",
            data=json.dumps([alert]).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=5):
                pass
        except OSError:
            pass  # down just now: a restart forgets its alerts anyway

    def churn(self) -> None:
        while not self.stop.wait(self.rng.uniform(5, 15)):
            if self.rng.random() < 0.4:
                self.down()
                time.sleep(self.rng.uniform(1, 4))
                self.start()
                self.restarts += 1
            else:
                labels = {
                    "alertname": "SoakRackHot",
                    "rack": self.rng.choice(self.racks),
                    "severity": "critical",
                }
                self.post(labels, resolved=False)
                self.alerts += 1
                time.sleep(self.rng.uniform(3, 8))
                self.post(labels, resolved=True)

    def settle(self) -> None:
        """Up, with no alert, from now on (the drain at the end)."""
        self.stop.set()
        if self.process is None or self.process.poll() is not None:
            self.start()
        for rack in self.racks:
            self.post({"alertname": "SoakRackHot", "rack": rack, "severity": "critical"}, resolved=True)


# --- the client ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    method: str
    code: str
    detail: str = ""  # the server's words, for an error


@dataclass
class Client:
    """Calls the live instances in turn; every answer is recorded. Mutating calls are counted per method
    for the audit check. It also plays the operator of the rollout schedules (`rollout_ids`)."""

    fleet: Fleet
    rng: random.Random
    racks: list[str]
    calls: list[Call] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    schedule_ids: list[str] = field(default_factory=list)
    rollout_ids: list[str] = field(default_factory=list)
    _turn: itertools.count[int] = field(default_factory=itertools.count)
    _stubs: dict[str, Any] = field(default_factory=dict)

    def call(self, method: str, request: object) -> Any:
        """As the operator, through the next live instance: the answer, or None."""
        return self.attempt(method, request)[1]

    def attempt(
        self,
        method: str,
        request: object,
        *,
        principal: str = soak_safety.OPERATOR,
        server: ServerProcess | None = None,
    ) -> tuple[str, Any]:
        """One call as `principal` (a token of soak_safety.TOKENS), through `server` or the next live
        instance: the status code's name and the answer (None unless OK)."""
        live = self.fleet.live()
        if server is None and not live:
            self.calls.append(Call(time.time(), time.time(), method, "NO_INSTANCE"))
            return "NO_INSTANCE", None
        server = server or live[next(self._turn) % len(live)]
        started = time.time()
        try:
            stub = self._stubs.get(server.address) or self._stubs.setdefault(server.address, server.stub())
            metadata = soak_safety.metadata(principal)
            answer = getattr(stub, method)(request, timeout=CALL_TIMEOUT_S, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code().name
            self.calls.append(Call(started, time.time(), method, code, exc.details() or ""))
            return code, None
        self.calls.append(Call(started, time.time(), method, "OK"))
        return "OK", answer

    def live(self) -> list[ServerProcess]:
        return self.fleet.live()

    def operate(self) -> None:
        """Look at a rollout schedule's runs and continue its halted rollout (one in ten: cancel it). A
        schedule the halt paused stays paused: resuming it would start its slots afresh from the resume,
        off the chain the slot check follows."""
        schedule = pb.UUID(id=self.rng.choice(self.rollout_ids))
        request = pb.ListTaskScheduleRunsRequest(schedule_id=schedule, pagination=pb.Pagination(limit=100))
        answer = self.call("ListTaskScheduleRuns", request)
        halted = [run.id for run in answer.runs if run.state == "halted"] if answer else []
        if halted:
            method = "CancelTaskScheduleRun" if self.rng.random() < 0.1 else "ResumeTaskScheduleRun"
            self.call(method, getattr(pb, f"{method}Request")(id=halted[0]))

    def run(self) -> None:
        for n in itertools.count():
            if self.stop.is_set():
                return
            kind = n % 6
            if kind == 0:
                self.call("CreateRack", pb.CreateRackRequest(name=f"client-rack-{n}"))
            elif kind == 1:
                at = rfc3339(datetime.now(UTC) + timedelta(seconds=self.rng.uniform(10, 40)))
                request = schedule_request(
                    f"once-{n}",
                    [self.rng.choice(self.racks)],
                    spec_type=pb.SCHEDULE_SPEC_TYPE_ONE_TIME,
                    spec=at,
                )
                self.call("CreateTaskSchedule", request)
            elif kind == 2:
                target = pb.OperationTargetSpec(
                    racks=pb.RackTargets(targets=[pb.RackTarget(name=f"client-rack-{n - 2}")])
                )
                self.call("PowerOnRack", pb.PowerOnRackRequest(target_spec=target))
            elif kind == 3:
                self.call(
                    "ListTaskSchedules", pb.ListTaskSchedulesRequest(pagination=pb.Pagination(limit=50))
                )
            elif n % 12 == 5 and self.rollout_ids:
                self.operate()
            else:
                self.call("ListTasks", pb.ListTasksRequest(active_only=True))
            time.sleep(0.1)


# --- the faults ------------------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    started: float
    ended: float = 0.0
    detail: str = ""


def pg_version(admin_url: str) -> str:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SHOW server_version_num").fetchone()
    assert row is not None
    return str(int(row[0]) // 10000)


def pg_cluster_port(version: str, cluster: str) -> int | None:
    """The port `pg_lsclusters` lists for the cluster, None when there is no such cluster."""
    listed = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True)
    for line in listed.stdout.splitlines():
        ver, name, port, *_ = line.split()
        if (ver, name) == (version, cluster):
            return int(port)
    return None


def drive_faults(
    fleet: Fleet,
    proxy: TcpProxy,
    rng: random.Random,
    until: float,
    pg_restarts: int,
    pg_admin: str,
    pg_cluster: str,
) -> list[Fault]:
    faults: list[Fault] = []
    restarts_left = pg_restarts
    while time.time() < until:
        time.sleep(rng.uniform(10, 30))
        if time.time() >= until:
            break
        kinds = [k for k in FAULTS if k != "pg-restart" or restarts_left > 0]
        kind = rng.choice(kinds)
        fault = Fault(kind, time.time())
        slot = rng.choice(fleet.slots)
        if kind == "kill":
            slot.server.kill()
            time.sleep(rng.uniform(1, 5))
            replacement = fleet.start(slot.index)
            with fleet.lock:
                slot.server = replacement
            fault.detail = f"instance{slot.index}"
        elif kind == "stop":
            with fleet.lock:
                slot.stopped = True
            os.kill(slot.server.proc.pid, signal.SIGSTOP)
            time.sleep(LEASE_S + rng.uniform(1, 4))
            os.kill(slot.server.proc.pid, signal.SIGCONT)
            with fleet.lock:
                slot.stopped = False
            fault.detail = f"instance{slot.index}"
        elif kind == "drop":
            seconds = rng.uniform(1, 5)
            cut = proxy.drop(seconds)
            time.sleep(seconds)
            fault.detail = f"{cut} connections cut, refused {seconds:.1f}s"
        elif kind == "delay":
            delay, seconds = rng.uniform(0.05, 0.3), rng.uniform(5, 15)
            proxy.delay(delay)
            time.sleep(seconds)
            proxy.delay(0)
            fault.detail = f"{delay * 1000:.0f} ms each way for {seconds:.1f}s"
        else:
            restarts_left -= 1
            version = pg_version(pg_admin)
            done = subprocess.run(
                ["pg_ctlcluster", version, pg_cluster, "restart"], capture_output=True, text=True, timeout=120
            )
            fault.detail = (
                f"pg_ctlcluster {version} {pg_cluster} restart: rc {done.returncode} {done.stderr.strip()}"
            )
        fault.ended = time.time()
        faults.append(fault)
        print(f"# fault {fault.kind} {fault.detail} ({fault.ended - fault.started:.1f}s)", flush=True)
    return faults


# --- the checker -----------------------------------------------------------------------------------------


@dataclass
class Verdict:
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def add(self, check: str, value: object, ok: bool = True, note: str = "") -> None:
        self.rows.append(
            (check, str(value), ("ok" if ok else "**VIOLATION**") + (f" {note}" if note else ""))
        )
        if not ok:
            self.violations.append(f"{check}: {value} {note}")


def query(conn: psycopg.Connection[Any], statement: str, *params: object) -> list[tuple[Any, ...]]:
    return conn.execute(statement, params).fetchall()  # type: ignore[arg-type]


def check_slots(conn: psycopg.Connection[Any], horizon: datetime, verdict: Verdict) -> None:
    """Each schedule's runs, in slot order, against its spec: the first run's slot is the first time after
    its creation (recurring: as computed at creation), each next run's slot is the spec's next time after
    the previous firing, and the next after the last firing is not before the horizon.

    A rollout's firing while the schedule's previous rollout is still live is recorded as a `skipped` run:
    that is the slot, recorded once. A schedule that rackflow paused when its rollout halted is not due
    while paused: a next slot after the pause (less the dispatch slack) is listed, not a miss."""
    schedules = query(
        conn, "SELECT id, spec_type, spec, timezone, created_at, paused_by, paused_at FROM task_schedule"
    )
    runs: dict[Any, list[tuple[datetime, datetime, str]]] = defaultdict(list)
    for schedule_id, slot, fired, state in query(
        conn,
        "SELECT schedule_id, scheduled_for, fired_at, state FROM task_schedule_run"
        " WHERE trigger = 'dispatch' ORDER BY schedule_id, scheduled_for",
    ):
        runs[schedule_id].append((slot, fired, state))
    duplicates = query(
        conn,
        "SELECT count(*) FROM (SELECT 1 FROM task_schedule_run WHERE scheduled_for IS NOT NULL"
        " GROUP BY schedule_id, scheduled_for HAVING count(*) > 1) d",
    )[0][0]
    broken: list[str] = []
    coalesced: list[str] = []
    paused: list[str] = []
    due = 0
    states: Counter[str] = Counter()
    lags: list[float] = []
    for schedule_id, spec_type, spec, zone, created, paused_by, paused_at in schedules:
        timing = parse_spec(ScheduleSpec(SpecType(spec_type), spec, zone))
        history = runs.get(schedule_id, [])
        for slot, fired_at, state in history:
            if slot < horizon:
                states[state] += 1
            lags.append((fired_at - slot).total_seconds())
        if spec_type == "one-time":
            at = timing.first_run(created)
            if at < horizon:
                due += 1
                if len(history) != 1:
                    broken.append(f"one-time {schedule_id}: {len(history)} runs")
            continue
        expected: datetime | None = timing.first_run(created)
        for slot, fired_at, _ in history:
            if slot != expected:
                broken.append(f"{schedule_id}: ran slot {slot}, the spec's next was {expected}")
            if spec_type == "cron":  # every calendar slot passed over by a late firing is listed
                skipped = timing.next_after(slot)
                while skipped is not None and skipped <= fired_at:
                    coalesced.append(f"{schedule_id} {skipped} (previous slot fired {fired_at - slot} late)")
                    skipped = timing.next_after(skipped)
            due += slot < horizon
            expected = timing.next_after(fired_at)
        if expected is None or expected >= horizon:
            continue
        if paused_by == SYSTEM_PRINCIPAL and paused_at is not None and expected > paused_at - DISPATCH_SLACK:
            paused.append(f"{schedule_id} from {expected:%H:%M:%S} (paused {paused_at:%H:%M:%S})")
        else:
            broken.append(f"{schedule_id}: slot {expected} not fired by {horizon}")
    fired = sum(states.values())
    verdict.add("due slots (from the specs, up to the horizon)", due)
    verdict.add("runs recorded for them, by state", f"{fired} {dict(sorted(states.items()))}")
    verdict.add("slots fired twice", duplicates, duplicates == 0)
    verdict.add("runs off their spec's chain, or overdue", len(broken), not broken, "; ".join(broken[:3]))
    verdict.add(
        "cron slots passed over by a late firing (listed, not fired)",
        len(coalesced),
        note="; ".join(coalesced[:3]),
    )
    verdict.add(
        "schedules paused by a halted rollout: next slot not due (listed)",
        len(paused),
        note="; ".join(paused[:3]),
    )
    verdict.add(
        "dispatch lag p50 / p99 / max (s)",
        f"{percentile(lags, 50):.2f} / {percentile(lags, 99):.2f} / {max(lags, default=0):.2f}",
    )


def check_work(conn: psycopg.Connection[Any], verdict: Verdict) -> None:
    twice = query(
        conn,
        "SELECT count(*) FROM (SELECT 1 FROM tasks WHERE run_id IS NOT NULL GROUP BY run_id, rack_id"
        " HAVING count(*) > 1) d",
    )[0][0]
    verdict.add("tasks submitted twice for one firing and rack", twice, twice == 0)
    ownerless = (
        "NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = owner_id"
        f" AND i.heartbeat_at > now() - interval '{LEASE_S} seconds')"
    )
    orphans = query(conn, f"SELECT count(*) FROM tasks WHERE status = 'running' AND {ownerless}")[0][0]
    verdict.add("tasks RUNNING past their lease with no live owner", orphans, orphans == 0)
    by_status = dict(query(conn, "SELECT status, count(*) FROM tasks GROUP BY status"))
    active = {s: n for s, n in by_status.items() if s in ACTIVE}
    verdict.add(
        "tasks by status at the end",
        dict(sorted(by_status.items())),
        not active,
        "(active left after the drain)" if active else "",
    )
    taken_over = query(conn, "SELECT count(*) FROM tasks WHERE attempts > 1")[0][0]
    verdict.add("tasks taken over from a dead or stopped instance", taken_over)
    stuck = query(conn, f"SELECT count(*) FROM task_schedule_run WHERE state = 'running' AND {ownerless}")[0][
        0
    ]
    verdict.add("runs left running with no live owner", stuck, stuck == 0)


def print_preflight_story(
    conn: psycopg.Connection[Any], task_id: str, answers: dict[tuple[str, int], list[tuple[float, bool]]]
) -> None:
    """What a task found started against its checks went through: its start, every round recorded for
    it, and every answer the hook gave about it, with times (so a broken promise can be told apart from a
    checker that misread it)."""
    print(f"\npre-flight story of task {task_id}:")
    for row in query(
        conn, "SELECT status, started_at, finished_at, attempts, message FROM tasks WHERE id = %s", task_id
    ):
        print("  task:", row)
    for row in query(conn, "SELECT attempt, checking_until FROM preflight_tasks WHERE task_id = %s", task_id):
        print("  waiting (round, lease):", row)
    for row in query(
        conn,
        "SELECT attempt, check_name, passed, checked_at, reason FROM preflight_results"
        " WHERE task_id = %s ORDER BY attempt, check_name",
        task_id,
    ):
        print("  round:", row)
    for (asked, attempt), given in sorted(answers.items()):
        if asked == task_id:
            times = [(datetime.fromtimestamp(at, UTC).isoformat(), ready) for at, ready in given]
            print(f"  hook answers to round {attempt}:", times)


def check_preflight(
    conn: psycopg.Connection[Any], hook: FlappingHook, checked: list[str], verdict: Verdict
) -> None:
    """No task on a checked rack started without its checks, or on a round that held it: each started
    task's last round passed, was taken before it started, and the hook said "ready" to that round."""
    started = query(
        conn,
        "WITH last AS (SELECT r.task_id, bool_and(r.passed) AS passed, max(r.checked_at) AS at"
        " FROM preflight_results r JOIN preflight_tasks w ON w.task_id = r.task_id AND w.attempt = r.attempt"
        " GROUP BY r.task_id)"
        " SELECT t.id::text, w.attempt, w.override_reason IS NOT NULL, l.passed, l.at <= t.started_at"
        " FROM tasks t JOIN racks k ON k.id = t.rack_id"
        " LEFT JOIN preflight_tasks w ON w.task_id = t.id LEFT JOIN last l ON l.task_id = t.id"
        " WHERE k.name = ANY(%s) AND t.started_at IS NOT NULL"
        " AND NOT (t.status = 'failed' AND t.message LIKE '%%gave up after%%')",
        checked,
    )
    unchecked = [row[0] for row in started if row[1] is None]
    verdict.add("checked racks' tasks that started without their checks", len(unchecked), not unchecked)
    on_a_hold = [row[0] for row in started if row[1] is not None and not row[2] and not (row[3] and row[4])]
    verdict.add(
        "checked racks' tasks started on a round that did not pass before them", len(on_a_hold), not on_a_hold
    )
    with hook.lock:
        answers = dict(hook.answers)
    not_ready = [
        row[0]
        for row in started
        if row[1]
        and not row[2]
        and not all(ready for _, ready in answers.get((row[0], row[1]), [(0, False)]))
    ]
    verdict.add("checked racks' tasks started after the hook said not ready", len(not_ready), not not_ready)
    for task_id in sorted(set(on_a_hold) | set(not_ready)):
        print_preflight_story(conn, task_id, answers)
    held_by = dict(
        query(conn, "SELECT check_name, count(*) FROM preflight_results WHERE NOT passed GROUP BY 1")
    )
    verdict.add("pre-flight rounds that held, by check", dict(sorted(held_by.items())))
    rounds = query(conn, "SELECT count(*), count(*) FILTER (WHERE NOT passed) FROM preflight_results")[0]
    verdict.add(
        "pre-flight: tasks started, rounds asked, rounds that held, hook flips",
        f"{len(started)}, {rounds[0]}, {rounds[1]}, {hook.flips}",
        len(started) > 0 and rounds[1] > 0,
        "" if len(started) > 0 and rounds[1] > 0 else "(the checks were never exercised)",
    )


@dataclass(frozen=True)
class RolloutTask:
    task_id: str
    rack_id: str
    domain: str  # the rack's NVLink domain, or the rack itself: a rack without one is a domain of its own
    status: str
    owner_id: Any
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


def most_at_once(tasks: list[RolloutTask]) -> tuple[int, int]:
    """The most of `tasks` running at once, in all and in one domain, from their start and end times (an
    end at the instant of a start is before it; a task not ended runs on)."""
    events = sorted(
        [(t.started_at, 1, t.domain) for t in tasks if t.started_at is not None]
        + [(t.finished_at, -1, t.domain) for t in tasks if t.started_at is not None and t.finished_at]
    )
    running = most = most_in_domain = 0
    per_domain: Counter[str] = Counter()
    for _, delta, domain in events:
        running += delta
        per_domain[domain] += delta
        most = max(most, running)
        most_in_domain = max(most_in_domain, per_domain[domain])
    return most, most_in_domain


def check_rollouts(conn: psycopg.Connection[Any], verdict: Verdict) -> None:
    """After the drain: every rollout's run ended, halted (waiting for an operator), or still rolling with a
    task a live instance runs; each of its racks started at most once and only as its record says; its caps
    held (from the tasks' start and end times); no rack after the canaries started before they all ended
    well and the bake time passed (unless the operator resumed the run, which passes the gate)."""
    # A run without a policy holds JSON null there, not SQL NULL.
    runs = query(
        conn,
        "SELECT id, state, outcomes, rollout, resumed FROM task_schedule_run"
        " WHERE jsonb_typeof(rollout) = 'object'",
    )
    tasks: dict[Any, list[RolloutTask]] = defaultdict(list)
    for run_id, *row in query(
        conn,
        "SELECT t.run_id, t.id::text, t.rack_id::text, coalesce(r.nvl_domain_id, r.id)::text, t.status,"
        " t.owner_id, t.created_at, t.started_at, t.finished_at FROM tasks t JOIN racks r ON r.id = t.rack_id"
        " JOIN task_schedule_run s ON s.id = t.run_id WHERE jsonb_typeof(s.rollout) = 'object'",
    ):
        tasks[run_id].append(RolloutTask(*row))
    live = {
        row[0]
        for row in query(
            conn, f"SELECT id FROM instances WHERE heartbeat_at > now() - interval '{LEASE_S} seconds'"
        )
    }
    states = Counter(state for _, state, _, _, _ in runs)
    outcomes = Counter(o["outcome"] for _, _, scopes, _, _ in runs for o in scopes)
    resumed = sum(run[4] for run in runs)
    verdict.add("rollout runs by state", dict(sorted(states.items())))
    verdict.add("rollout runs the operator resumed (cancelled: above)", resumed)
    verdict.add("rollout racks by outcome (submitted: started)", dict(sorted(outcomes.items())))
    stuck: list[str] = []
    off_record: list[str] = []
    over_cap: list[str] = []
    early: list[str] = []
    for run_id, state, scopes, policy, was_resumed in runs:
        mine = tasks.get(run_id, [])
        if state == "rolling" and not any(t.status in ACTIVE and t.owner_id in live for t in mine):
            stuck.append(f"{run_id}: {Counter(o['outcome'] for o in scopes)}")
        racks = [o["rack_id"] for o in scopes]
        recorded = sorted((o["rack_id"], o["task_id"]) for o in scopes if o["outcome"] == "submitted")
        started = sorted((t.rack_id, t.task_id) for t in mine)
        if len(set(racks)) != len(racks) or recorded != started:
            off_record.append(f"{run_id}: recorded {len(recorded)} started, {len(started)} tasks")
        most, most_in_domain = most_at_once(mine)
        cap, domain_cap = policy["max_concurrent_racks"], policy["max_per_domain"]
        if (cap and most > cap) or (domain_cap and most_in_domain > domain_cap):
            over_cap.append(
                f"{run_id}: {most} at once (max {cap}), {most_in_domain} in a domain (max {domain_cap})"
            )
        canaries = {o["rack_id"] for o in scopes if o.get("canary")}
        rest = [t for t in mine if t.rack_id not in canaries]
        if canaries and rest and not was_resumed:  # a resume passes the gate
            gate = [t for t in mine if t.rack_id in canaries]
            ends = [t.finished_at for t in gate if t.finished_at is not None]
            opened = max(ends) + timedelta(seconds=policy["bake_seconds"]) if ends else None
            bad = [t for t in gate if t.status != "completed"] + [
                o for o in scopes if o.get("canary") and o["outcome"] == "failed"
            ]
            first = min(t.created_at for t in rest)
            if bad or (opened is not None and first < opened):
                early.append(f"{run_id}: first after the canaries at {first}, gate {opened}, {len(bad)} bad")
    verdict.add(
        "rollouts left rolling without a task a live instance runs",
        len(stuck),
        not stuck,
        "; ".join(stuck[:3]),
    )
    verdict.add(
        "rollout racks started off the run's record (twice, or unrecorded)",
        len(off_record),
        not off_record,
        "; ".join(off_record[:3]),
    )
    verdict.add(
        "rollouts over a cap (tasks' start and end times)",
        len(over_cap),
        not over_cap,
        "; ".join(over_cap[:3]),
    )
    verdict.add("rollouts past their canary gate early", len(early), not early, "; ".join(early[:3]))


def check_audit(conn: psycopg.Connection[Any], calls: list[Call], verdict: Verdict) -> None:
    recorded = dict(
        query(conn, "SELECT method, count(*) FROM audit_events WHERE outcome = 'OK' GROUP BY method")
    )
    answered = Counter(c.method for c in calls if c.method in MUTATING and c.code == "OK")
    lost = {m: n - recorded.get(m, 0) for m, n in answered.items() if recorded.get(m, 0) < n}
    verdict.add(
        "audit rows vs mutating calls answered OK",
        f"{sum(recorded.get(m, 0) for m in answered)} rows / {sum(answered.values())} OK answers",
        not lost,
        f"lost: {lost}" if lost else "",
    )


def check_logs(fleet: Fleet, verdict: Verdict) -> None:
    died = [p.name for p in fleet.logs if "stopped unexpectedly" in p.read_text()]
    verdict.add("instances whose worker died (log)", len(died), not died, ", ".join(died))
    text = "".join(p.read_text() for p in fleet.logs)
    verdict.add(
        "audit events spooled / lost (log)",
        f"{text.count(' spooled to ')} / {text.count('AUDIT WRITE FAILED')}",
        "AUDIT WRITE FAILED" not in text,
    )


def fault_table(faults: list[Fault], calls: list[Call], first_runs: list[float]) -> list[str]:
    lines = [
        "| fault | detail | duration (s) | API answers during it (+10 s) | API back after (s)"
        " | dispatch back after (s) |",
        "|---|---|---|---|---|---|",
    ]
    for fault in faults:
        window = [c for c in calls if fault.started <= c.started <= fault.ended + 10]
        codes = Counter(c.code for c in window)
        shown = ", ".join(f"{code} {n}" for code, n in codes.most_common())
        api_back = next(
            (c.ended - fault.ended for c in calls if c.ended >= fault.ended and c.code == "OK"), None
        )
        fired_back = next((t - fault.ended for t in first_runs if t >= fault.ended), None)
        api = "-" if api_back is None else f"{max(api_back, 0):.1f}"
        dispatch = "-" if fired_back is None else f"{fired_back:.1f}"
        duration = fault.ended - fault.started
        lines.append(f"| {fault.kind} | {fault.detail} | {duration:.1f} | {shown} | {api} | {dispatch} |")
    return lines


# --- the run ---------------------------------------------------------------------------------------------


def rollout_policy(rng: random.Random) -> pb.RolloutPolicy:
    """A drawn policy: caps, canaries with a bake time of seconds (so rollouts progress within minutes),
    a halt limit by count or share, and three in ten go on firing after a halt."""
    canaries = rng.choice((0, 1, 2))
    policy = pb.RolloutPolicy(
        max_concurrent_racks=rng.choice((0, 1, 2, 3)),
        max_per_domain=rng.choice((0, 1, 2)),
        canary_racks=canaries,
        bake_time=rng.choice(("2s", "5s")) if canaries else "",
        pause_on_halt=rng.random() < 0.7,
    )
    if rng.random() < 0.6:
        policy.halt_after_failures = rng.choice((1, 2, 3))
    else:
        policy.halt_after_failure_percent = rng.choice((25.0, 50.0))
    return policy


def create_load(
    client: Client,
    rng: random.Random,
    schedules: int,
    racks: list[str],
    rollout_share: float,
    checked: list[str],
    hook_url: str,
    alertmanager_url: str,
) -> None:
    ids = []
    for name in racks:
        components = [
            pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name=f"{name}-c{i}", external_id=f"{name}-c{i}")
            for i in range(2)
        ]
        rack = client.call("CreateRack", pb.CreateRackRequest(name=name, components=components))
        if rack is None:
            raise SystemExit(f"cannot create rack {name}: {client.calls[-1].code}")
        ids.append(rack.id)
    in_domains = len(ids) * 4 // 5 // DOMAIN_SIZE * DOMAIN_SIZE  # the rest are domains of their own
    for first in range(0, in_domains, DOMAIN_SIZE):
        request = pb.CreateNVLDomainRequest(name=f"nvl-{first}", rack_ids=ids[first : first + DOMAIN_SIZE])
        if client.call("CreateNVLDomain", request) is None:
            raise SystemExit(f"cannot create domain nvl-{first}: {client.calls[-1].code}")
    check = pb.PreflightCheck(
        name="soak-drain",
        operations=["power_on"],
        racks=[pb.WindowTarget(name=name) for name in checked],
        webhook=pb.WebhookCheck(url=hook_url, timeout="2s"),
        interval="2s",
        max_wait="10m",
    )
    alerts = pb.PreflightCheck(
        name="soak-alerts",
        operations=["power_on"],
        racks=[pb.WindowTarget(name=name) for name in checked],
        alertmanager=pb.AlertmanagerCheck(url=alertmanager_url, matchers=['rack="{rack.name}"']),
        interval="2s",
        max_wait="10m",
    )
    for made in ((check, alerts) if alertmanager_url else (check,)) if checked else ():
        if client.call("CreatePreflightCheck", pb.CreatePreflightCheckRequest(check=made)) is None:
            raise SystemExit(f"cannot create the pre-flight check {made.name}: {client.calls[-1].code}")
    unchecked = [name for name in racks if name not in checked]
    requests = []
    for i in range(schedules):
        overlap = pb.OVERLAP_POLICY_QUEUE if rng.random() < 0.25 else pb.OVERLAP_POLICY_SKIP
        if rng.random() < rollout_share:
            scope = rng.sample(unchecked, rng.randint(4, 8))  # held racks would not count against caps
            if rng.random() < 0.5:
                spec_type, spec, zone = pb.SCHEDULE_SPEC_TYPE_CRON, "* * * * *", rng.choice(ZONES)
            else:
                spec_type, spec, zone = pb.SCHEDULE_SPEC_TYPE_INTERVAL, f"{rng.randint(30, 90)}s", ""
            request = schedule_request(
                f"rollout-{i}", scope, spec_type=spec_type, spec=spec, timezone=zone, overlap=overlap
            )
            request.schedule.rollout.CopyFrom(rollout_policy(rng))
            requests.append(request)
            continue
        rack = [rng.choice(racks)]
        if rng.random() < 0.4:
            zone = rng.choice(ZONES)
            requests.append(
                schedule_request(
                    f"cron-{i}",
                    rack,
                    spec_type=pb.SCHEDULE_SPEC_TYPE_CRON,
                    spec="* * * * *",
                    timezone=zone,
                    overlap=overlap,
                )
            )
        else:
            every = f"{rng.randint(20, 90)}s"
            requests.append(
                schedule_request(
                    f"every-{i}", rack, spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec=every, overlap=overlap
                )
            )
    for request in requests:
        answer = client.call("CreateTaskSchedule", request)
        if answer is None:
            raise SystemExit(f"cannot create schedule {request.schedule.name}: {client.calls[-1].code}")
        client.schedule_ids.append(answer.id.id)
        if request.schedule.HasField("rollout"):
            client.rollout_ids.append(answer.id.id)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--alertmanager",
        default="/usr/bin/prometheus-alertmanager",
        help="Debian's Alertmanager (make tools): a pre-flight check asks it while the soak restarts it",
    )
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument(
        "--no-preflight",
        action="store_true",
        help="no pre-flight checks in the mix (to tell their share of a finding from the rest's)",
    )
    parser.add_argument("--schedules", type=int, default=300)
    parser.add_argument("--racks", type=int, default=100)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds of load after the last fault")
    parser.add_argument("--pg-restarts", type=int, default=1, help="at most this many PostgreSQL restarts")
    parser.add_argument(
        "--rollout-share", type=float, default=0.1, help="share of the schedules with a rollout policy"
    )
    parser.add_argument(
        "--safety-per-kind",
        type=int,
        help="schedules with approvals, with retries, with a start deadline: this many of each, besides"
        " --schedules (bench/soak_safety.py; default: a thirtieth of --schedules, at least 3)",
    )
    parser.add_argument(
        "--pg-cluster",
        default="main",
        help="the cluster `pg_ctlcluster` restarts: the one serving --pg-admin (not a shared one)",
    )
    parser.add_argument(
        "--pg-admin",
        default=os.environ.get(
            "RACKFLOW_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    if not 0 <= args.rollout_share <= 1:
        parser.error("--rollout-share: a share from 0 to 1")
    if args.pg_restarts:  # restarting another cluster than the soak's would test nothing and hit its users
        port = make_url(args.pg_admin).port or 5432
        if pg_cluster_port(pg_version(args.pg_admin), args.pg_cluster) != port:
            parser.error(f"--pg-cluster: {args.pg_cluster} is not the cluster serving port {port}")
    per_kind = args.safety_per_kind if args.safety_per_kind is not None else max(3, args.schedules // 30)
    rng = random.Random(args.seed)
    print(machine_line())
    print(code_line())
    print(
        f"# soak minutes={args.minutes} seed={args.seed} instances={args.instances}"
        f" schedules={args.schedules} racks={args.racks} rollout_share={args.rollout_share:g}"
        f" safety_per_kind={per_kind} pg_restarts={args.pg_restarts} pg_cluster={args.pg_cluster}",
        flush=True,
    )
    with fresh_database("postgres", args.pg_admin) as ws:
        direct = make_url(ws.url)
        proxy = TcpProxy(direct.port or 5432)
        proxied = direct.set(port=proxy.start()).render_as_string(hide_password=False)
        fleet = Fleet(proxied, ws.log_dir, args.seed, soak_safety.server_env(per_kind))
        for index in range(args.instances):
            fleet.slots.append(Slot(index, fleet.start(index)))
        racks = [f"rack-{i}" for i in range(args.racks)]
        client = Client(fleet, random.Random(args.seed + 1), racks)
        verdict = Verdict()
        receiver = soak_notify.FailingReceiver(random.Random(args.seed + 4))  # bench/soak_notify.py
        receiver.start()
        soak_notify.subscribe(fleet.live()[0], receiver, soak_safety.metadata(soak_safety.OPERATOR))
        hook = FlappingHook(random.Random(args.seed + 2))
        hook.start()
        checked = [] if args.no_preflight else racks[-max(2, len(racks) // 10) :]  # in no NVLink domain
        alertmanager = None
        if checked and os.access(args.alertmanager, os.X_OK):
            alertmanager = SoakAlertmanager(
                args.alertmanager, ws.log_dir, random.Random(args.seed + 3), checked
            )
            alertmanager.start()
        verdict.add(
            "Alertmanager for the pre-flight check (restarts, alerts: below)",
            args.alertmanager if alertmanager else f"{args.alertmanager} missing (make tools)",
            alertmanager is not None or not checked or not os.environ.get("CI"),
        )
        try:
            create_load(
                client,
                rng,
                args.schedules,
                racks,
                args.rollout_share,
                checked,
                hook.url,
                alertmanager.url if alertmanager else "",
            )
            safety = soak_safety.SafetyDriver(client, random.Random(args.seed + 5), per_kind)
            safety.create()
            if alertmanager is not None:
                threading.Thread(target=alertmanager.churn, name="alertmanager churn", daemon=True).start()
            load = threading.Thread(target=client.run, name="client", daemon=True)
            load.start()
            people = threading.Thread(target=safety.run, name="approvers and pauses", daemon=True)
            people.start()
            started = time.time()
            faults = drive_faults(
                fleet,
                proxy,
                rng,
                started + args.minutes * 60,
                args.pg_restarts,
                args.pg_admin,
                args.pg_cluster,
            )
            time.sleep(args.settle)
            libpq = direct.set(drivername="postgresql").render_as_string(False)
            with psycopg.connect(libpq, autocommit=True) as conn:
                now = query(conn, "SELECT now()")[0][0]
                horizon = now - DISPATCH_SLACK
                check_slots(conn, horizon, verdict)
                first_runs = sorted(
                    r[0].timestamp() for r in query(conn, "SELECT fired_at FROM task_schedule_run")
                )
            client.stop.set()
            load.join(CALL_TIMEOUT_S * 2)
            people.join(CALL_TIMEOUT_S * 4)
            hook.settle()
            if alertmanager is not None:
                alertmanager.settle()
            with psycopg.connect(libpq, autocommit=True) as conn:
                conn.execute(
                    "UPDATE task_schedule SET enabled = false"
                )  # no more firings: let the tasks drain
                deadline = time.time() + 180  # the rollouts' settle time too: they step on disabled
                busy = (
                    f"SELECT (SELECT count(*) FROM tasks WHERE status IN {ACTIVE})"
                    " + (SELECT count(*) FROM task_schedule_run WHERE state = 'rolling')"
                )
                while time.time() < deadline and query(conn, busy)[0][0]:
                    time.sleep(2)
                check_work(conn, verdict)
                check_rollouts(conn, verdict)
                if checked:
                    check_preflight(conn, hook, checked, verdict)
                long_run = args.minutes >= LONG_RUN_MINUTES
                soak_safety.check(conn, verdict.add, long_run=long_run)
                safety.report(verdict.add, long_run=long_run)
                check_audit(conn, client.calls, verdict)
                soak_notify.check(conn, receiver, verdict.add)
        finally:
            for slot in fleet.slots:
                slot.server.stop()
            proxy.stop()
            receiver.stop()
            if alertmanager is not None:
                alertmanager.stop.set()
                alertmanager.down()
                verdict.add(
                    "Alertmanager restarts, alerts fired and resolved",
                    f"{alertmanager.restarts}, {alertmanager.alerts}",
                )
        check_logs(fleet, verdict)
        calls = Counter(c.code for c in client.calls)
        verdict.add("API answers over the whole run", ", ".join(f"{k} {v}" for k, v in calls.most_common()))
        errors = Counter(f"{c.method} {c.code}" for c in client.calls if c.code not in ("OK", "NO_INSTANCE"))
        verdict.add("API errors by method", ", ".join(f"{k} {v}" for k, v in errors.most_common()) or "-")
        internal = Counter(
            f"{c.method}: {c.detail[:200]}" for c in client.calls if c.code in ("INTERNAL", "UNKNOWN")
        )
        for said, count in internal.most_common(5):
            print(f"# INTERNAL or UNKNOWN x{count}: {said}")
        print()
        print(
            f"Seed {args.seed}, {args.minutes:g} min, {args.instances} instances, {args.schedules} schedules,"
            f" {len(faults)} faults"
        )
        print()
        print("| check | value | verdict |")
        print("|---|---|---|")
        for row in verdict.rows:
            print("| " + " | ".join(row) + " |")
        print()
        for line in fault_table(faults, client.calls, first_runs):
            print(line)
        if verdict.violations:
            print("\nVIOLATIONS:\n" + "\n".join(verdict.violations), flush=True)
            return 1
        print("\nsoak: every promise held", flush=True)
        return 0


if __name__ == "__main__":
    sys.exit(main())
