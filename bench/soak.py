"""soak: many faults at once, for a long time; then a checker proves from the database and the logs that
every promise held (docs/RELIABILITY.md, "The chaos soak").

`--instances` real `rackflow serve` processes (default 3) share one PostgreSQL database, reached through a
loopback TCP proxy (tests/faults/tcp_proxy.py). The load: `--schedules` recurring schedules (default 300)
over `--racks` racks, 40% cron every minute in five zones, 60% intervals of 20–90 s, a quarter of them
QUEUE, the rest SKIP; tasks from the simulator with 5% of steps failing; and a client that keeps calling
every live instance (creating racks, one-time schedules due 10–40 s later, power-on tasks; listing
schedules and tasks). A seeded fault driver, one fault at a time every 10–30 s for `--minutes`:

* `kill`: SIGKILL an instance, start a new one in its place 1–5 s later (same audit spool file);
* `stop`: SIGSTOP an instance for its lease plus 1–4 s, then SIGCONT (others take its work over);
* `drop`: the proxy cuts every database connection and refuses new ones for 1–5 s;
* `delay`: the proxy holds every chunk 50–300 ms each way for 5–15 s;
* `pg-restart`: `pg_ctlcluster <version> main restart` (at most `--pg-restarts` times; it restarts the whole
  server, so every other user of it sees the restart too: 0 on a shared machine).

Then the faults stop, the load keeps going `--settle` seconds, and the checker takes its snapshot: every
schedule's runs must follow its spec exactly (each run's slot is the spec's next time after the previous
firing: nothing fired twice, nothing skipped silently), and no schedule may be overdue. Then every schedule
is disabled (in the database), the tasks drain, and the checker reads the rest: tasks submitted twice for
one rack and firing, tasks or runs left RUNNING without a live owner, audit rows against the mutating
calls answered OK, the API's answers by code during each fault, and the time to recover after each. It
prints one table (Markdown) and exits 1 if any promise was broken.

    python bench/soak.py --minutes 10 --seed 1
    python bench/soak.py --minutes 2 --schedules 60 --racks 30 --pg-restarts 0   # what `make test` runs

`--rollout-share` is where rollout schedules (issue 15) join the mix once rollouts exist; until then it
must stay 0.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import psycopg
from _common import code_line, fresh_database, machine_line, percentile
from sqlalchemy.engine import make_url

from rackflow.timespec import ScheduleSpec, SpecType, parse_spec
from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, start_server
from tests.e2e.fleet import rfc3339, schedule_request
from tests.faults.tcp_proxy import TcpProxy

ZONES = ("UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Europe/Berlin")
DISPATCH_INTERVAL_S = 2
LEASE_S = 5
CALL_TIMEOUT_S = 10
FAULTS = ("kill", "stop", "drop", "delay", "pg-restart")
MUTATING = ("CreateRack", "CreateTaskSchedule", "PowerOnRack")


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
        }
        args = [
            "--dispatch-interval",
            f"{DISPATCH_INTERVAL_S}s",
            "--lease-ttl",
            f"{LEASE_S}s",
            "--db-pool-size",
            "4",
        ]
        server = start_server(self.db_url, self.log_dir, args=args, env=env, name=f"instance{index}")
        self.logs.append(server.log_path)
        return server

    def live(self) -> list[ServerProcess]:
        with self.lock:
            return [s.server for s in self.slots if s.server.proc.poll() is None and not s.stopped]


# --- the client ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    started: float
    ended: float
    method: str
    code: str


@dataclass
class Client:
    """Calls the live instances in turn; every answer is recorded. Mutating calls are counted per method
    for the audit check; one-time schedules it creates are remembered for the slot check."""

    fleet: Fleet
    rng: random.Random
    racks: list[str]
    calls: list[Call] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    schedule_ids: list[str] = field(default_factory=list)
    _turn: itertools.count[int] = field(default_factory=itertools.count)
    _stubs: dict[str, Any] = field(default_factory=dict)

    def call(self, method: str, request: object) -> Any:
        live = self.fleet.live()
        if not live:
            self.calls.append(Call(time.time(), time.time(), method, "NO_INSTANCE"))
            return None
        server = live[next(self._turn) % len(live)]
        started = time.time()
        try:
            stub = self._stubs.get(server.address) or self._stubs.setdefault(server.address, server.stub())
            answer = getattr(stub, method)(request, timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            self.calls.append(Call(started, time.time(), method, exc.code().name))
            return None
        self.calls.append(Call(started, time.time(), method, "OK"))
        return answer

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


def drive_faults(
    fleet: Fleet, proxy: TcpProxy, rng: random.Random, until: float, pg_restarts: int, pg_admin: str
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
                ["pg_ctlcluster", version, "main", "restart"], capture_output=True, text=True, timeout=120
            )
            fault.detail = f"pg_ctlcluster {version} main restart: rc {done.returncode} {done.stderr.strip()}"
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
    the previous firing, and the next after the last firing is not before the horizon."""
    schedules = query(conn, "SELECT id, spec_type, spec, timezone, created_at, enabled FROM task_schedule")
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
    due = fired = interrupted = 0
    lags: list[float] = []
    for schedule_id, spec_type, spec, zone, created, _enabled in schedules:
        timing = parse_spec(ScheduleSpec(SpecType(spec_type), spec, zone))
        history = runs.get(schedule_id, [])
        for slot, fired_at, state in history:
            if slot < horizon:
                fired += 1
                interrupted += state == "interrupted"
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
        if expected is not None and expected < horizon:
            broken.append(f"{schedule_id}: slot {expected} not fired by {horizon}")
    verdict.add("due slots (from the specs, up to the horizon)", due)
    verdict.add("runs recorded for them (completed + interrupted)", f"{fired} ({interrupted} interrupted)")
    verdict.add("slots fired twice", duplicates, duplicates == 0)
    verdict.add("runs off their spec's chain, or overdue", len(broken), not broken, "; ".join(broken[:3]))
    verdict.add(
        "cron slots passed over by a late firing (listed, not fired)",
        len(coalesced),
        note="; ".join(coalesced[:3]),
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
    active = {s: n for s, n in by_status.items() if s in ("pending", "running", "waiting")}
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


def create_load(
    client: Client, rng: random.Random, schedules: int, racks: list[str], rollout_share: float
) -> None:
    for name in racks:
        components = [
            pb.ComponentSpec(type=pb.COMPONENT_TYPE_COMPUTE, name=f"{name}-c{i}", external_id=f"{name}-c{i}")
            for i in range(2)
        ]
        if client.call("CreateRack", pb.CreateRackRequest(name=name, components=components)) is None:
            raise SystemExit(f"cannot create rack {name}: {client.calls[-1].code}")
    requests = []
    for i in range(schedules):
        overlap = pb.OVERLAP_POLICY_QUEUE if rng.random() < 0.25 else pb.OVERLAP_POLICY_SKIP
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
    assert rollout_share == 0
    for request in requests:
        answer = client.call("CreateTaskSchedule", request)
        if answer is None:
            raise SystemExit(f"cannot create schedule {request.schedule.name}: {client.calls[-1].code}")
        client.schedule_ids.append(answer.id.id)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--schedules", type=int, default=300)
    parser.add_argument("--racks", type=int, default=100)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds of load after the last fault")
    parser.add_argument("--pg-restarts", type=int, default=1, help="at most this many PostgreSQL restarts")
    parser.add_argument(
        "--rollout-share",
        type=float,
        default=0.0,
        help="share of schedules with a rollout policy (issue 15); 0 until rollouts exist",
    )
    parser.add_argument(
        "--pg-admin",
        default=os.environ.get(
            "RACKFLOW_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    args = parser.parse_args()
    if args.rollout_share:
        parser.error("--rollout-share: rollouts (issue 15) are not in this build; leave it 0")
    rng = random.Random(args.seed)
    print(machine_line())
    print(code_line())
    print(
        f"# soak minutes={args.minutes} seed={args.seed} instances={args.instances}"
        f" schedules={args.schedules} racks={args.racks} pg_restarts={args.pg_restarts}",
        flush=True,
    )
    with fresh_database("postgres", args.pg_admin) as ws:
        direct = make_url(ws.url)
        proxy = TcpProxy(direct.port or 5432)
        proxied = direct.set(port=proxy.start()).render_as_string(hide_password=False)
        fleet = Fleet(proxied, ws.log_dir, args.seed)
        for index in range(args.instances):
            fleet.slots.append(Slot(index, fleet.start(index)))
        racks = [f"rack-{i}" for i in range(args.racks)]
        client = Client(fleet, random.Random(args.seed + 1), racks)
        verdict = Verdict()
        try:
            create_load(client, rng, args.schedules, racks, args.rollout_share)
            load = threading.Thread(target=client.run, name="client", daemon=True)
            load.start()
            started = time.time()
            faults = drive_faults(
                fleet, proxy, rng, started + args.minutes * 60, args.pg_restarts, args.pg_admin
            )
            time.sleep(args.settle)
            libpq = direct.set(drivername="postgresql").render_as_string(False)
            with psycopg.connect(libpq, autocommit=True) as conn:
                now = query(conn, "SELECT now()")[0][0]
                horizon = now - timedelta(seconds=DISPATCH_INTERVAL_S * 3 + CALL_TIMEOUT_S)
                check_slots(conn, horizon, verdict)
                first_runs = sorted(
                    r[0].timestamp() for r in query(conn, "SELECT fired_at FROM task_schedule_run")
                )
            client.stop.set()
            load.join(CALL_TIMEOUT_S * 2)
            with psycopg.connect(libpq, autocommit=True) as conn:
                conn.execute(
                    "UPDATE task_schedule SET enabled = false"
                )  # no more firings: let the tasks drain
                deadline = time.time() + 180
                active = "SELECT count(*) FROM tasks WHERE status IN ('pending', 'running', 'waiting')"
                while time.time() < deadline and query(conn, active)[0][0]:
                    time.sleep(2)
                check_work(conn, verdict)
                check_audit(conn, client.calls, verdict)
        finally:
            for slot in fleet.slots:
                slot.server.stop()
            proxy.stop()
        check_logs(fleet, verdict)
        calls = Counter(c.code for c in client.calls)
        verdict.add("API answers over the whole run", ", ".join(f"{k} {v}" for k, v in calls.most_common()))
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
