"""An upgrade while running (docs/OPERATIONS.md, "Upgrades"): instances of the previous release serve the
previous schema, `rackflow db migrate` brings the database to head while they serve, and they are replaced
by the new release one at a time. Clients must see nothing worse than an UNAVAILABLE from the instance
being restarted (answered on retry by another), and no schedule slot may be lost or fired twice.

One exception comes from gRPC itself: a call that reaches the stopping instance just as its server shuts
down, before a handler has taken it, is answered CANCELLED with the details "CANCELLED"
(grpc/grpc#41785). Its handler never ran, so it is as safe to retry as UNAVAILABLE; a retried CreateRack
would answer ALREADY_EXISTS (and fail the test) if the first attempt had created the rack.

The previous release is this repository's source as it was just before its newest migration was added
(`tests/faults/releases.py`), run from the same virtualenv with PYTHONPATH pointing at it.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import grpc
import pytest

from rackflow.store.migrate import head_revision
from rackflow.v1 import flow_pb2 as pb
from tests.e2e.cluster import ServerProcess, sql, start_server
from tests.e2e.fleet import create_racks, create_schedules, schedule_request, wait_until
from tests.faults.releases import previous_revision, release_at

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ARGS = ["--dispatch-interval", "1s", "--lease-ttl", "3s"]
INTERVAL = timedelta(seconds=2)
# A slot may come this late after the previous one and still count as on time: the interval, a dispatch
# poll, and the few seconds a poll can take on this loaded machine while an instance stops.
MAX_GAP = INTERVAL + timedelta(seconds=4)
RACKS = [f"r{i}" for i in range(4)]
CALLS_SEEN = 20  # answered by the instances of each step of the upgrade
SLOTS_JUDGED = 8  # a schedule's slots at least, among whose gaps a lost one would show


def retryable(exc: grpc.RpcError) -> bool:
    """UNAVAILABLE, or gRPC core's CANCELLED for a call no handler took before shutdown."""
    code = exc.code()
    return code == grpc.StatusCode.UNAVAILABLE or (
        code == grpc.StatusCode.CANCELLED and exc.details() == "CANCELLED"
    )


@dataclass
class Clients:
    """Clients calling the current instances in a loop; a call answered UNAVAILABLE (or shutdown's
    CANCELLED, see `retryable`) is retried once on another instance. Records every first answer, and
    every call that failed even after its retry."""

    servers: list[ServerProcess]
    first: list[grpc.StatusCode] = field(default_factory=list)
    failed: list[tuple[grpc.StatusCode, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        made = 0
        while not self.stop.is_set():
            made += 1
            create = pb.CreateRackRequest(name=f"client-{made}")
            self._call(lambda stub: stub.ListTaskSchedules(pb.ListTaskSchedulesRequest(), timeout=10))
            self._call(lambda stub, create=create: stub.CreateRack(create, timeout=10))
            time.sleep(0.05)

    def _call(self, call: Callable[[object], object]) -> None:
        for attempt in range(2):
            live = [s for s in self.servers if s.proc.poll() is None]
            stub = live[(len(self.first) + attempt) % len(live)].stub()
            try:
                call(stub)
            except grpc.RpcError as exc:
                if attempt == 0:
                    self.first.append(exc.code())
                if not retryable(exc) or attempt == 1:
                    self.failed.append((exc.code(), exc.details() or ""))
                    return
            else:
                if attempt == 0:
                    self.first.append(grpc.StatusCode.OK)
                return


def test_migrate_and_restart_one_by_one_while_serving(pg_db_empty: str, tmp_path: Path) -> None:
    old_src = release_at(previous_revision(), tmp_path / "previous")
    old_env = {"PYTHONPATH": str(old_src)}
    subprocess.run(
        [sys.executable, "-m", "rackflow", "db", "migrate", "--db", pg_db_empty],
        check=True,
        capture_output=True,
        env={**os.environ, **old_env},
    )
    previous_head = sql(pg_db_empty, "SELECT version_num FROM alembic_version")[0][0]
    assert previous_head != head_revision()

    running = [start_server(pg_db_empty, tmp_path, args=ARGS, env=old_env, name=f"old{i}") for i in range(2)]
    every_instance = list(running)  # for the failure message: what each said around a lost slot
    clients = Clients(list(running))
    traffic = threading.Thread(target=clients.run, name="clients")
    try:
        stub = running[0].stub()
        create_racks(stub, RACKS)
        create_schedules(
            stub,
            [
                schedule_request(f"every-2s-{r}", [r], spec_type=pb.SCHEDULE_SPEC_TYPE_INTERVAL, spec="2s")
                for r in RACKS
            ],
        )
        traffic.start()
        serving(clients, pg_db_empty, "the previous release")

        migrated = subprocess.run(
            [sys.executable, "-m", "rackflow", "db", "migrate", "--db", pg_db_empty],
            check=True,
            capture_output=True,
            text=True,
        )
        assert head_revision() in migrated.stdout
        serving(clients, pg_db_empty, "the previous release on the new schema")

        for i, old in enumerate(list(running)):
            new = start_server(pg_db_empty, tmp_path, args=ARGS, name=f"new{i}")
            every_instance.append(new)
            clients.servers.append(new)
            running.append(new)
            assert old.stop() == 0
            clients.servers.remove(old)
            running.remove(old)
            serving(clients, pg_db_empty, f"the instances once old{i} was replaced")
        serving(clients, pg_db_empty, "the new release", slots=SLOTS_JUDGED)
    finally:
        clients.stop.set()
        if traffic.is_alive():
            traffic.join(30)
        for server in running:
            server.stop()

    assert clients.failed == [], clients.failed[:5]
    assert set(clients.first) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
    assert clients.first.count(grpc.StatusCode.OK) > 100

    slots = sql(pg_db_empty, "SELECT schedule_id, scheduled_for, state FROM task_schedule_run ORDER BY 1, 2")
    assert len({(s, t) for s, t, _ in slots}) == len(slots), "a slot fired twice"
    assert {state for _, _, state in slots} == {"completed"}
    by_schedule: dict[object, list[object]] = {}
    for schedule_id, slot, _ in slots:
        by_schedule.setdefault(schedule_id, []).append(slot)
    assert len(by_schedule) == len(RACKS)
    for fired in by_schedule.values():
        for earlier, later in itertools.pairwise(fired):
            gap = later - earlier  # type: ignore[operator]
            assert gap <= MAX_GAP, f"a slot was lost: {gap} after {earlier}\n" + said_around(
                every_instance,
                earlier,  # type: ignore[arg-type]
                later,  # type: ignore[arg-type]
            )


def said_around(servers: list[ServerProcess], start: datetime, end: datetime) -> str:
    """Each instance's log lines stamped from 5 s before `start` to 5 s after `end` (a lost slot's gap),
    and its last lines: what a failure on a loaded machine is diagnosed from once its files are gone."""
    since, until = start - timedelta(seconds=5), end + timedelta(seconds=5)
    said = []
    for server in servers:
        lines = server.output.splitlines()
        stamped = [line for line in lines if since <= _stamp(line, start) <= until]
        said.append(f"--- {server.log_path.name}, {len(stamped)} lines in the gap:")
        said += [*stamped[-200:], "--- its last lines:", *lines[-20:]]
    return "\n".join(said)


def _stamp(line: str, otherwise: datetime) -> datetime:
    """The time a log line starts with (RFC 3339, "…Z"), or `otherwise` for a line that has none."""
    try:
        return datetime.fromisoformat(line.split(" ", 1)[0])
    except ValueError:
        return otherwise - timedelta(days=1)


def serving(clients: Clients, db_url: str, who: str, *, slots: int = 0) -> None:
    """Until `who` (the instances serving now) have answered CALLS_SEEN more calls and fired another slot
    of every schedule (and, with `slots`, every schedule has fired that many): what each step of the
    upgrade is seen doing before the next, however slowly a loaded machine runs it."""
    answered = clients.first.count(grpc.StatusCode.OK)
    ((since,),) = sql(db_url, "SELECT now()")

    def seen() -> bool:
        if clients.first.count(grpc.StatusCode.OK) < answered + CALLS_SEEN:
            return False
        ((fresh, fewest),) = sql(
            db_url,
            """SELECT count(*) FILTER (WHERE newest > %s), coalesce(min(slots), 0) FROM (
                 SELECT max(fired_at) AS newest, count(*) AS slots FROM task_schedule_run GROUP BY schedule_id
               ) AS each_schedule""",
            since,
        )
        return fresh == len(RACKS) and isinstance(fewest, int) and fewest >= slots

    wait_until(seen, timeout=60, what=f"{who} serving calls and firing every schedule")


@pytest.fixture
def pg_db_empty(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL database of its own with no schema (the previous release migrates it)."""
    from tests.conftest import postgres_admin_url
    from tests.e2e.cluster import fresh_postgres_database

    with fresh_postgres_database(postgres_admin_url()) as url:
        yield url
