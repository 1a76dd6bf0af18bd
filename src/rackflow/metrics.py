"""Prometheus metrics, served on `--metrics-listen` (off by default)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rackflow.config import DUE_COUNT_CAP, SCRAPE_READ_TIMEOUT, host_port, parse_host_port

log = logging.getLogger(__name__)

Reader = Callable[[], Coroutine[Any, Any, dict[str, float]]]


class ReadOnScrape(Collector):
    """Gauges read from the database when /metrics is scraped, not by a loop on a timer: an idle server
    then reads nothing for them, and a scrape shows the values of that moment (docs/PERFORMANCE.md, "An
    idle server"). The reader is a coroutine of the process's event loop (`read_with`); the scrape, on the
    metrics server's thread, waits for it at most SCRAPE_READ_TIMEOUT, then shows the last values read, as
    it does without a reader or on the event loop's own thread (a test reading the registry in process)."""

    def __init__(self, gauges: Mapping[str, str]) -> None:
        self._help = dict(gauges)
        self._values = dict.fromkeys(gauges, 0.0)
        self._reader: tuple[asyncio.AbstractEventLoop, Reader] | None = None
        REGISTRY.register(self)

    def read_with(
        self,
        loop: asyncio.AbstractEventLoop | None,
        read: Reader | None,
    ) -> None:
        """Read the gauges with `read` on `loop` from now on (None, None: no more)."""
        self._reader = (loop, read) if loop is not None and read is not None else None

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily(name, text) for name, text in self._help.items()]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        self._refresh()
        return [GaugeMetricFamily(name, text, value=self._values[name]) for name, text in self._help.items()]

    def _refresh(self) -> None:
        if self._reader is None:
            return
        loop, read = self._reader
        try:
            if asyncio.get_running_loop() is loop:
                return  # the loop's own thread cannot wait for the loop
        except RuntimeError:
            pass  # no loop on this thread: the metrics server's
        reading = read()
        try:
            future = asyncio.run_coroutine_threadsafe(reading, loop)
        except RuntimeError:  # the loop is closed
            reading.close()
            return
        try:
            self._values.update(future.result(SCRAPE_READ_TIMEOUT.total_seconds()))
        except Exception as exc:
            future.cancel()
            why = str(exc) or type(exc).__name__  # a timeout says nothing of itself
            log.warning("reading gauges for a scrape failed (%s); showing the last values", why)


FIRINGS = Counter(
    "rackflow_schedule_firings_total", "Schedule firings, by trigger (dispatch or manual).", ["trigger"]
)
SCOPE_OUTCOMES = Counter(
    "rackflow_schedule_scope_outcomes_total", "Per-scope outcomes of firings.", ["outcome"]
)
DISPATCH_LAG = Histogram(
    "rackflow_dispatch_lag_seconds",
    "How late a schedule was claimed: claim time minus its next_run_at.",
    buckets=(0.1, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 900, 3600),
)
POLL_SECONDS = Histogram(
    "rackflow_dispatch_poll_seconds",
    "Duration of one dispatcher poll (claim, submit, write back).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
DUE_BACKLOG = Gauge(
    "rackflow_dispatch_due_backlog",
    f"Schedules due but not yet claimed, counted up to {DUE_COUNT_CAP} (at least that many when it shows "
    f"{DUE_COUNT_CAP}; while draining, counted at most once a second).",
)
ROLLOUT_RACKS_STARTED = Counter(
    "rackflow_rollout_racks_started_total", "Racks a rollout step submitted a task for (docs/ROLLOUTS.md)."
)
ROLLOUT_HALTS = Counter(
    "rackflow_rollout_halts_total", "Rollouts halted by their failure budget or a canary."
)
APPROVAL_DECISIONS = Counter(
    "rackflow_approval_decisions_total",
    "Runs awaiting approval that were approved (and started), rejected or expired (docs/SAFETY.md).",
    ["decision"],
)
BUDGET_HOLDS = Counter(
    "rackflow_budget_holds_total",
    "Task starts an operation budget held back (a task waiting long is counted at each claim).",
    ["budget"],
)
TASK_HOLDS = Counter(
    "rackflow_task_holds_total",
    "Task starts a start gate held back, by gate (a task waiting long is counted at each claim).",
    ["gate"],
)
CHECK_RESULTS = Counter(
    "rackflow_check_results_total",
    "Pre-flight check looks, by check and result (pass, hold), one per task and round (docs/CHECKS.md).",
    ["check", "result"],
)
CHECK_HOLDS = Counter(
    "rackflow_check_holds_total",
    "Rounds of pre-flight checks that held their task, by the check whose reason the task shows.",
    ["check"],
)
CHECK_WAIT = Histogram(
    "rackflow_check_wait_seconds",
    "How long the pre-flight gate held a task before it let it start or failed it.",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200),
)
KEYED_READ_ROUNDS = Counter(
    "rackflow_keyed_read_rounds_total",
    "Queries sent for GetTaskSchedule's keyed reads; callers over rounds is how many each answered.",
)
KEYED_READ_CALLERS = Counter(
    "rackflow_keyed_read_callers_total", "GetTaskSchedule reads answered by the keyed reads' rounds."
)
SCHEDULE_MISSED = Counter(
    "rackflow_schedule_missed_total",
    "Dispatched firings recorded as missed: found past their schedule's start deadline, nothing submitted.",
)
SCHEDULES_PAUSED_AFTER_FAILURES = Counter(
    "rackflow_schedule_paused_after_failures_total",
    "Schedules rackflow paused after pause_after_failed_runs consecutive runs with a failed rack.",
)
TASKS_FINISHED = Counter("rackflow_tasks_finished_total", "Tasks that reached a final status.", ["status"])
TASK_RETRIES = Counter(
    "rackflow_task_retries_total",
    "Task attempts that failed retryably and were sent back for another attempt (docs/SAFETY.md).",
)
AUDIT_WRITE_FAILURES = Counter(
    "rackflow_audit_write_failures_total",
    "Audit events that could not be written (the action's result stands).",
)
AUDIT_EVENTS_SPOOLED = Counter(
    "rackflow_audit_events_spooled_total",
    "Audit events written to the local spool because the database was unavailable (replayed later).",
)
AUDIT_EVENTS_REPLAYED = Counter(
    "rackflow_audit_events_replayed_total", "Spooled audit events written back to the database."
)
AUDIT_EVENTS_LOST = Counter(
    "rackflow_audit_events_lost_total",
    "Audit events neither written nor spooled (spool full or unwritable, or a spooled line unreadable).",
)
AUDIT_SPOOL_BYTES = Gauge(
    "rackflow_audit_spool_bytes",
    "Bytes waiting in this process's audit spool (its file and an unfinished replay's).",
)
AUDIT_EVENTS_PRUNED = Counter(
    "rackflow_audit_events_pruned_total", "Audit events this process deleted as older than --audit-retention."
)

SCHEDULE_RUNS_PRUNED = Counter(
    "rackflow_schedule_runs_pruned_total", "Schedule runs this process deleted as older than --run-retention."
)
TASKS_PRUNED = Counter(
    "rackflow_tasks_pruned_total", "Ended tasks this process deleted as older than --task-retention."
)

NOTIFICATIONS_DELIVERED = Counter(
    "rackflow_notifications_delivered_total", "Notifications a channel accepted, by channel.", ["channel"]
)
NOTIFICATIONS_FAILED = Counter(
    "rackflow_notifications_failed_total",
    "Notification sends that failed (each is tried again, until the channel's attempts), by channel.",
    ["channel"],
)
NOTIFICATIONS_DEAD = Counter(
    "rackflow_notifications_dead_total",
    "Notifications given up on after the channel's attempts (`rackflow notify redeliver`), by channel.",
    ["channel"],
)
OUTBOX_AGE = "rackflow_notification_outbox_age_seconds"
DEAD_DELIVERIES = "rackflow_notification_dead_deliveries"
NOTIFICATION_OUTBOX = ReadOnScrape(
    {
        OUTBOX_AGE: "Age of the oldest event not yet delivered to every enabled channel it goes to (0: "
        "nothing waits; dead ones and disabled channels' excluded).",
        DEAD_DELIVERIES: "Deliveries in the dead-letter state, across every enabled channel.",
    }
)
NOTIFICATION_EVENTS_PRUNED = Counter(
    "rackflow_notification_events_pruned_total",
    "Delivered notification events this process deleted as older than --notification-retention.",
)

# Label values known in advance are series from start-up on, at 0: Prometheus' `increase()` and `rate()`
# start from a series' first sample, so one that first appeared at 1 (an instance's first failed scope
# since it started) raised no `increase(…) > 0` alert (contrib/prometheus/rackflow-alerts.yml). Labels
# whose values are the operator's (a budget, a channel, a check) still appear once they count.
for _counter, _values in (
    (FIRINGS, ("dispatch", "manual")),
    (SCOPE_OUTCOMES, ("submitted", "skipped_overlap", "skipped_window", "failed")),
    (TASKS_FINISHED, ("completed", "failed", "terminated")),
    (APPROVAL_DECISIONS, ("approved", "rejected", "expired")),
):
    for _value in _values:
        _counter.labels(_value)


def serve_metrics(listen: str) -> str:
    """Start the /metrics HTTP endpoint in a background thread; the HOST:PORT it listens on (port 0 in
    `listen` picks a free one, named here, as `--listen` and `--http-listen` do)."""
    host, port = parse_host_port(listen, "--metrics-listen")
    try:
        httpd, _thread = start_http_server(port, addr=host)
    except OSError as exc:  # named as a taken --listen or --http-listen is
        raise OSError(f"--metrics-listen: cannot listen on {host_port(host, port)}: {exc.strerror}") from exc
    return host_port(host, httpd.server_port)
