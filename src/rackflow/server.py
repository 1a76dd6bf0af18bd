"""Wiring of one `rackflow serve` process: database, services, gRPC server, executor, dispatcher (with
the rollout driver), the pre-flight checker, audit spool replay, notification delivery, the pruners of the
retentions, and (with --http-listen) the web dashboard and JSON API.

Every process is a full peer: it serves the API, runs tasks and fires schedules. Several processes may share
one PostgreSQL database; the store's row claims keep them from doing the same work twice.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from rackflow import metrics
from rackflow.api.audit import AuditInterceptor
from rackflow.api.servicer import FlowServicer, interceptors
from rackflow.audit.retention import AuditPruner
from rackflow.audit.spool import AuditSpool
from rackflow.checks.checker import PreflightChecker
from rackflow.clock import Clock, SystemClock
from rackflow.config import (
    GRPC_MESSAGE_BYTES,
    PREFLIGHT_LOOK_AHEAD,
    SERVE_GC_THRESHOLD,
    BackendName,
    ServeConfig,
    host_port,
    parse_host_port,
)
from rackflow.domain.approvals import UNCOUNTED, Approvers
from rackflow.ids import new_id
from rackflow.metrics import serve_metrics
from rackflow.notify.delivery import Deliverer
from rackflow.notify.holds import HoldWatcher
from rackflow.retention import Pruner, ensure_weeks, keep_weeks, run_in_order
from rackflow.rollouts.driver import RolloutDriver
from rackflow.schedules.dispatcher import Dispatcher
from rackflow.security import Role, TokenTable, server_credentials
from rackflow.services import Services
from rackflow.store import outbox
from rackflow.store import runs as run_history
from rackflow.store import tasks as task_store
from rackflow.store.db import Database
from rackflow.store.migrate import migrate, require_migrated
from rackflow.tasks.backends.base import Backend
from rackflow.tasks.backends.simulator import SimulatorBackend, SimulatorConfig
from rackflow.tasks.executor import Executor
from rackflow.v1 import flow_pb2, flow_pb2_grpc

if TYPE_CHECKING:
    from rackflow.web.server import HttpServer

log = logging.getLogger("rackflow.server")

SERVICE_NAME = flow_pb2.DESCRIPTOR.services_by_name["Flow"].full_name
SHUTDOWN_GRACE_SECONDS = 5.0


def build_backend(config: ServeConfig, clock: Clock) -> Backend:
    if config.backend is BackendName.REDFISH:
        from rackflow.tasks.backends.redfish.backend import RedfishBackend  # loads sushy only when used
        from rackflow.tasks.backends.redfish.config import RedfishConfig

        return RedfishBackend(RedfishConfig.from_env(), clock=clock)
    return SimulatorBackend(SimulatorConfig.from_env())


def approvers_of(tokens: TokenTable | None, *, mutual_tls: bool) -> Approvers:
    """Who may approve on a server with these credentials, as `rackflow.api.auth.authenticate` admits
    callers: with tokens, the names of those whose role is approver; without, every client certificate's
    CN under mutual TLS (not counted: the CA may sign any number), else every caller as `anonymous`."""
    if tokens is not None:
        return Approvers(frozenset(e.name for e in tokens.entries if e.role.holds(Role.APPROVER)))
    return UNCOUNTED if mutual_tls else Approvers(anonymous=True)


class RackflowServer:
    """Start with `start()`, then `wait()` until `stop()` (or a signal) ends it."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        # This process's id: its executor registers it and keeps its heartbeat, and the services record it
        # on the runs this process fires (`ScheduleService.instance_id`), whose sweep that heartbeat holds
        # off.
        self.instance_id = new_id()
        self.clock = SystemClock(config.clock_offset)
        self.db = Database(config.db, clock=self.clock, pool_size=config.db_pool_size)
        self.audit_spool = AuditSpool(
            self.db, Path(config.audit_spool), max_bytes=config.audit_spool_max_bytes
        )
        self.services = Services.build(
            self.db,
            self.clock,
            self.audit_spool,
            default_start_deadline=config.default_start_deadline,
            instance_id=self.instance_id,
            approvers=approvers_of(config.tokens, mutual_tls=config.mutual_tls),
        )
        # Records every mutating RPC, over gRPC and through the HTTP API alike, in `services.audit`.
        self.audit = AuditInterceptor(self.services.audit)
        self.grpc: grpc.aio.Server | None = None
        self.health = health.aio.HealthServicer()
        self.address = ""
        self.http_address = ""
        self._stop = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []

    def executor(self, backend: Backend) -> Executor:
        """This process's executor, as the flags configure it (`start` runs it)."""
        return Executor(
            self.db,
            self.clock,
            backend,
            instance_id=self.instance_id,
            manager=self.services.tasks,
            gates=self.services.gates,
            backstops=(self.services.deferrals,),
            lease_ttl=self.config.lease_ttl.total_seconds(),
            default_start_deadline=self.config.default_start_deadline,
            progress_interval=self.config.progress_interval.total_seconds(),
        )

    async def start(self) -> str:
        """Migrate if asked, refuse an unmigrated database, then serve. Returns the bound HOST:PORT."""
        if self.config.migrate:
            revision = await migrate(self.db)
            log.info("database migrated to revision %s", revision)
        await require_migrated(self.db)
        # The tokens were read at start-up: name the stored schedules they leave unapprovable (logged).
        await self.services.schedules.name_unapprovable()
        backend = build_backend(self.config, self.clock)  # bad backend settings fail before we listen
        self.services.tasks.backend = backend  # what it cannot carry out is refused at the submit
        http = self._bind_http()  # a taken HTTP port fails before gRPC listens
        # So does a taken metrics port, before any loop starts (its thread serves the process's life).
        metrics_address = serve_metrics(self.config.metrics_listen) if self.config.metrics_listen else ""

        self.grpc = grpc.aio.server(
            interceptors=interceptors(self.config.tokens, self.audit),
            options=[
                ("grpc.max_receive_message_length", GRPC_MESSAGE_BYTES),
                ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES),
                # gRPC binds with SO_REUSEPORT by default: a second `rackflow serve` on a taken --listen
                # would start, and the kernel would split the clients between the two (and their
                # databases). Without it the bind fails and so does the start (below).
                ("grpc.so_reuseport", 0),
            ],
        )
        flow_pb2_grpc.add_FlowServicer_to_server(FlowServicer(self.services), self.grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.grpc,
        )
        host, port = parse_host_port(self.config.listen, "--listen")
        address = host_port(host, port)
        try:
            if self.config.tls is not None:
                bound = self.grpc.add_secure_port(address, server_credentials(self.config.tls))
            else:
                bound = self.grpc.add_insecure_port(address)
        except RuntimeError as exc:  # grpc's "Failed to bind to address …", the reason only in its own log
            bound = 0
            failure: Exception | None = exc
        else:
            failure = None
        if bound == 0:
            raise OSError(
                f"--listen: cannot listen on {self.config.listen}: the address is in use (another "
                "rackflow serve?) or not one of this host's"
            ) from failure
        self.address = host_port(host, bound)
        await self.grpc.start()

        executor = self.executor(backend)
        self._spawn("executor", executor.run)
        if self.db.is_postgres:
            # The runs' and tasks' coming weeks' partitions before the first firing, then hourly.
            await ensure_weeks(self.db)
            self._spawn("partitions", functools.partial(keep_weeks, self.db))
        dispatcher = (
            Dispatcher(
                self.services.schedules,
                self.services.audit,
                approvals=self.services.approvals,
                interval=self.config.dispatch_interval,
                batch=self.config.dispatch_batch,
                lease_ttl=self.config.lease_ttl,
            )
            if self.config.dispatcher
            else None
        )
        checker = PreflightChecker(
            self.db,
            self.clock,
            self.services.tasks,
            ahead=lambda: executor.ended_within(PREFLIGHT_LOOK_AHEAD.total_seconds()),
            gates=self.services.gates_before_checks,
            # Its polls wait (bounded) while this process's dispatcher fires (issue 26).
            firing=dispatcher.firing if dispatcher is not None else None,
        )
        self.services.checks.gate.on_hold.append(checker.wake)
        executor.on_ended.append(checker.tasks_ended)
        checker.on_answered.append(executor.answered)
        self._spawn("preflight checker", checker.run)
        if dispatcher is not None:
            self._spawn("dispatcher", dispatcher.run)
            self._spawn("rollout driver", RolloutDriver(self.services.rollouts).run)
        self._spawn("audit spool", self.audit_spool.run)
        deliverer = Deliverer(
            self.db, external_url=self.config.external_url, lease=self.config.notification_send_lease
        )
        self._spawn("notifications", deliverer.run)
        holds = HoldWatcher(self.db, threshold=self.config.notification_hold_threshold)
        self._spawn("notification hold watcher", holds.run)
        if self.config.notification_retention is not None:
            delivered = Pruner(
                self.db,
                self.config.notification_retention,
                name="notification",
                what="delivered notification events",
                prune=outbox.prune_delivered,
                counter=metrics.NOTIFICATION_EVENTS_PRUNED,
            )
            self._spawn("notification pruner", delivered.run)
        if self.config.audit_retention is not None:
            self._spawn("audit pruner", AuditPruner(self.db, self.config.audit_retention).run)
        # Tasks before runs, in one loop: see rackflow.retention.
        history = [
            Pruner(self.db, retention, name=name, what=what, prune=prune, counter=counter)
            for retention, name, what, prune, counter in (
                (
                    self.config.task_retention,
                    "task",
                    "ended tasks",
                    task_store.prune_finished_tasks,
                    metrics.TASKS_PRUNED,
                ),
                (
                    self.config.run_retention,
                    "run",
                    "schedule runs",
                    run_history.prune_old_runs,
                    metrics.SCHEDULE_RUNS_PRUNED,
                ),
            )
            if retention is not None
        ]
        if history:
            self._spawn("history pruner", functools.partial(run_in_order, history))
        if http is not None:
            self._spawn("http", http.run)
            log.info(
                "dashboard and JSON API on %s://%s/",
                http.scheme,
                self.http_address,
                extra={"http_listen": self.http_address},
            )
        if metrics_address:
            log.info("metrics on http://%s/metrics", metrics_address)

        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "listening on %s (db %s, dispatcher %s, backend %s)",
            self.address,
            self.db.dialect,
            "on" if self.config.dispatcher else "off",
            self.config.backend.value,
            extra={"instance_id": str(self.instance_id), "listen": self.address},
        )
        log.info(
            "security: TLS %s, client certificates %s, bearer tokens %s",
            "on" if self.config.tls else "off",
            "required" if self.config.tls and self.config.tls.client_ca else "not required",
            f"required ({len(self.config.tokens.entries)})" if self.config.tokens else "off",
        )
        return self.address

    def _bind_http(self) -> HttpServer | None:
        if not self.config.http_listen:
            return None
        from rackflow.web.app import build_app  # loads Starlette and uvicorn only when asked for
        from rackflow.web.security import HttpSecurity
        from rackflow.web.server import HttpServer

        security = HttpSecurity(
            listen_host=parse_host_port(self.config.http_listen, "--http-listen")[0],
            allowed_hosts=self.config.http_allowed_hosts,
            allowed_origins=self.config.http_allowed_origins,
            max_body_bytes=self.config.http_max_body_bytes,
        )
        app = build_app(self.services, self.audit, self.config.tokens, self.clock, security)
        http = HttpServer(app, self.config.http_listen, self.config.tls)
        self.http_address = http.bind()
        return http

    def _spawn(self, name: str, run: Callable[[asyncio.Event], Coroutine[Any, Any, None]]) -> None:
        task = asyncio.create_task(run(self._stop), name=name)
        task.add_done_callback(self._worker_done)
        self._workers.append(task)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s stopped unexpectedly; shutting down", task.get_name(), exc_info=task.exception())
            self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    async def wait(self) -> None:
        """Run until stopped, then shut down cleanly: stop workers, drain RPCs, close the database."""
        await self._stop.wait()
        log.info("shutting down")
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await asyncio.gather(*self._workers, return_exceptions=True)
        if self.grpc is not None:
            await self.grpc.stop(SHUTDOWN_GRACE_SECONDS)
        await self.services.audit.close()  # events of RPCs cut short by the grace period
        await self.db.dispose()
        log.info("stopped")


def tune_gc() -> None:
    """For a process that serves until it stops (`rackflow serve`, once started; not an in-process server
    of the tests, whose objects do not live as long): collect cyclic garbage less often
    (SERVE_GC_THRESHOLD), and leave what start-up made (modules, compiled statements, services) out of every
    collection from now on (`gc.freeze`): it lives as long as the process, and each full collection walked
    all of it again."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(SERVE_GC_THRESHOLD, middle, oldest)
