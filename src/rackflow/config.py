"""`rackflow serve` settings: one frozen value, validated once, from flags or `RACKFLOW_<NAME>` variables.

Every default a setting has is written here and nowhere else: the flags show these, and the classes that
take a setting (`Database`, `Executor`, `Dispatcher`, `Pruner`) default to them, so a test or a
benchmark that builds one directly runs as `rackflow serve` would.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import timedelta

from rackflow.errors import InvalidArgument
from rackflow.security import ServerTls, TokenTable, check_exposure
from rackflow.timespec import parse_go_duration
from rackflow.timespec.duration import format_go_duration

DEFAULT_DB = "sqlite:///rackflow.db"
DEFAULT_LISTEN = "127.0.0.1:50051"
# The largest gRPC message the server sends or takes, and its client (`RackflowClient`) takes: a page of
# 1,000 GB200 NVL72 racks with their 36 components each is 5 MB, past gRPC's default 4 MiB (which the
# client kept, so `inventory export` and a table naming a thousand racks failed RESOURCE_EXHAUSTED).
GRPC_MESSAGE_BYTES = 64 * 1024 * 1024
# How often the dispatcher polls for due schedules, and how many it claims per poll (a full batch polls
# again at once; docs/PERFORMANCE.md measured 10 as the fastest drain on two cores).
DEFAULT_DISPATCH_INTERVAL = timedelta(seconds=10)
DEFAULT_DISPATCH_BATCH = 10
# While a backlog drains, each full claim doubles the next one's batch up to this (the starting batch if
# larger); a claim that is not full goes back to --dispatch-batch. A larger batch pays a claim's round trips
# and statements for more firings (docs/PERFORMANCE.md: 10 → 100 tripled the drain; a cap of 1,000 drained
# 10,000 schedules 31–50 % faster than one of 200, and 500 in between).
DISPATCH_BATCH_CAP = 1000
# After each poll the dispatcher looks at the failing streaks of the schedules marked since its last look
# (store.streak_checks), at most FAILING_STREAK_LOOK_BATCH of them (the rest at the next polls: a look
# costs about 1 ms a schedule on PostgreSQL, so no poll waits long for it). At its first look, and then
# this often, it marks every schedule that pauses after failures: the bound on a streak whose mark was lost
# (an instance stopped between taking the mark and deciding it) or never made (a write that bypassed
# store.streak_checks' callers). Looking at all of them in one poll took 1 s at 1,000 schedules and 10 s at
# 10,000 (docs/PERFORMANCE.md, issue 27).
FAILING_STREAK_FULL_LOOK = timedelta(hours=1)
FAILING_STREAK_LOOK_BATCH = 200
# The cyclic garbage collector's youngest-generation threshold in a serving process (Python's default: 700
# allocations). A draining dispatcher allocates tens of thousands of short-lived objects a second (rows,
# plans, submissions), and at 700 a collection ran every few firings: 7 % of a drain's samples were in
# the collector (docs/PERFORMANCE.md, "Issue 29"). The objects made at start-up are frozen out of it too.
SERVE_GC_THRESHOLD = 20_000
# The dispatcher's backlog (the gauge, the dashboard) is counted up to this many due schedules, "at least"
# when it reaches it: enough to tell a drain that keeps up from one far behind (fifty of the largest
# claims), without reading every due row of a large backlog once a second while it drains.
DUE_COUNT_CAP = 10_000
# A List RPC's (and a dashboard list's) `total` is counted up to this many matching rows, then "more": an
# exact count reads every matching row, a second or more at ten million tasks (docs/PERFORMANCE.md, issue
# 29), where the page itself reads fifty.
LIST_COUNT_CAP = 10_000
# The most outcomes one page of ListTaskScheduleRuns' FULL view carries when a limit is asked: whole runs
# while they fit, a run of more racks in parts of this many, each on a page of its own. A page of two runs
# of 10,000 racks took 1.0-1.3 s to read, convert and send; 500 outcomes cost 40-80 ms of a List RPC
# page's 100, about 60-80 us each on a two-core machine (docs/PERFORMANCE.md, issue 29).
RUN_OUTCOMES_PER_PAGE = 500
# The name searches (of schedules, racks and NVLink domains) are "name contains text". A text of fewer than
# SHORT_SEARCH_TEXT characters holds no trigram, so PostgreSQL's trigram indexes (migrations 0027, 0056)
# cannot answer it and the search reads names one by one: a rare one read all million schedules' for one
# page, 3 s, and all 100,000 racks' in 0.4-0.8 s (docs/PERFORMANCE.md, issue 29). Such a search walks at
# most SEARCH_WALK rows per page in the list's order and says where it stopped (a page token), so each page
# costs the same bounded walk, found or not, and the next page searches on from there (`store.paging.
# walked`). So does the audit trail filtered by a target id on SQLite, which has no index over a row's ids
# (`store.audit.list_events`).
SHORT_SEARCH_TEXT = 3
SEARCH_WALK = 10_000
# How long an instance's heartbeat stays valid: its tasks and schedule runs are taken over once it is this
# old. Instances renew it every third of this, so a brief stall or database hiccup does not count as death.
DEFAULT_LEASE_TTL = timedelta(seconds=15)
# The least `--dispatch-interval` and `--lease-ttl` taken: `1ms` was, and an idle instance polled for due
# schedules 100 times a second (a core at 87 %), or heartbeated every millisecond and had its tasks taken
# over by another at its first pause of a few milliseconds.
MIN_DISPATCH_INTERVAL = timedelta(milliseconds=100)
MIN_LEASE_TTL = timedelta(seconds=1)
# PostgreSQL connections per process: DEFAULT_DB_POOL_SIZE kept open, plus up to DB_POOL_OVERFLOW opened for
# a burst and closed after it. Four processes at the default need 60 of a server's usual 100
# max_connections. The kept ones cover the steady load (the executor holds at most three however many
# tasks it runs), so bursts beyond them, which cost a connect and a close each, stay rare.
DEFAULT_DB_POOL_SIZE = 10
DB_POOL_OVERFLOW = 5
# The executor: how often it polls for tasks when nothing wakes it, how many tasks one process runs at
# once, and how often it sweeps for what finishing does not catch (expired waiting tasks, dead instances'
# holds); finishing a task promotes its rack at once, so seconds of delay in the sweep are fine.
DEFAULT_EXECUTOR_POLL_INTERVAL = timedelta(milliseconds=500)
DEFAULT_MAX_CONCURRENT_TASKS = 32
DEFAULT_SWEEP_INTERVAL = timedelta(seconds=2)
# A running task's progress message ("powering on 5/36: compute-4") is written with the claim (its first
# batch's), then by the executor's progress tick, every this often (`--progress-interval`), for each task
# whose batch under way is not the one its message names; its end with the outcome. So the message an
# operator reads lags the batch under way by at most this (and a journal round), and a task's row is
# rewritten at most once this often. Written before every batch, it was rewritten 36 times a task on an NVL72
# rack (docs/CAPACITY.md, "Racks of 36 components"); each batch is still fenced in a journal round before it
# starts, which locks the row instead. The least the flag takes: a unit slip (`5ms` for `5s`) would write
# every quick batch's message again, a row version a step, and wake the tick hundreds of times a second. The
# most it takes: the other slip (`5h` for `5s`) would leave a running rack's message naming a batch hours
# behind the one under way, with nothing to tell an operator reading it so.
DEFAULT_PROGRESS_INTERVAL = timedelta(seconds=5)
MIN_PROGRESS_INTERVAL = timedelta(seconds=1)
MAX_PROGRESS_INTERVAL = timedelta(minutes=5)
# How often each instance prunes what a retention (--audit-retention, --run-retention, --task-retention)
# bounds, when it is set.
DEFAULT_PRUNE_INTERVAL = timedelta(hours=1)
# The audit spool (rackflow.audit.spool): where events wait while the database cannot take them (relative to
# the working directory, like the default SQLite file; instances on one host may share it), how big it may
# grow (about 1 KiB an event: some 65,000 events), and how often a non-empty spool is replayed.
DEFAULT_AUDIT_SPOOL = "rackflow-audit.spool"
DEFAULT_AUDIT_SPOOL_MAX_BYTES = 64 * 1024 * 1024
MIN_AUDIT_SPOOL_MAX_BYTES = 64 * 1024
DEFAULT_AUDIT_SPOOL_REPLAY_INTERVAL = timedelta(seconds=5)
# What one audit event may hold (`rackflow.domain.audit.bounded_event`): each JSON document of a row (the
# request, the schedule before and after, `changes`) at most AUDIT_JSON_MAX_BYTES as the API sends it, cut
# past it (long texts and lists shortened, marked, the original size said); a refused call's `target_ids`
# at most AUDIT_REFUSED_TARGET_IDS ids. Why: a caller may send requests up to gRPC's 64 MiB, refused or
# not, and a trail that kept them whole could no longer be read past them. 64 KiB holds a schedule of about
# a thousand racks whole; a larger one's accepted request is cut, its ids all still in `target_ids`.
AUDIT_JSON_MAX_BYTES = 64 * 1024
AUDIT_REFUSED_TARGET_IDS = 1000
# A JSON API call refused by role whose body does not parse records the body as sent (redacted, as text:
# `rackflow.web.bodies.unparsed_body`) up to this many bytes, cut past it and saying so. Why: the row is
# what an auditor has of what was tried; the start of a body shows that, and a body sent to fill the trail
# (the listener takes up to 1 MiB) costs a row of a few KiB, not of AUDIT_JSON_MAX_BYTES.
AUDIT_UNPARSED_BODY_MAX_BYTES = 4 * 1024
# A page of ListAuditEvents ends early, with a token to the rest, once its events would pass this many
# bytes (`rackflow.audit.trail`): well under a default gRPC client's 4 MiB receive limit (the CLI's, and
# most clients') and the server's 64 MiB send limit, whatever old rows kept before the cap hold.
AUDIT_PAGE_MAX_BYTES = 2 * 1024 * 1024
# The HTTP listener (rackflow.web.security): a request body larger than this is refused with 413 while it
# is read. A schedule or window with a few thousand racks is well under 1 MiB of JSON; the floor keeps a
# slip (`1024` meaning KiB) from refusing every write.
DEFAULT_HTTP_MAX_BODY_BYTES = 1024 * 1024
MIN_HTTP_MAX_BODY_BYTES = 1024
# A floor against unit slips (`720m` for `720h`) that would empty a security record, or the history of
# what ran, within the hour.
MIN_RETENTION = timedelta(hours=1)
# A start deadline (a schedule's, or --default-start-deadline) shorter than this would miss firings that
# are merely as late as a dispatcher's poll; the default is unset (a firing starts however late).
MIN_START_DEADLINE = timedelta(seconds=1)
DEFAULT_START_DEADLINE: timedelta | None = None


# Gauges read from the database when /metrics is scraped (the outbox's): a scrape waits this long for the
# read, then shows the last values read; under Prometheus' default scrape timeout (10 s), so a slow database
# costs fresh values, not the scrape.
SCRAPE_READ_TIMEOUT = timedelta(seconds=5)

# Notifications (rackflow.notify, docs/NOTIFICATIONS.md). Every instance's delivery loop looks for work this
# often while deliveries wait (at once again while a round was full); with none waiting it sleeps until a
# write wakes it or the next one is due, looking at least every NOTIFY_IDLE_INTERVAL. A round fans out up
# to NOTIFY_BATCH events and claims up to NOTIFY_SENDS deliveries, all sent at once (one thread each), so
# every claimed send starts at once.
# A send gives up after NOTIFY_SEND_TIMEOUT; its claim lasts DEFAULT_NOTIFY_SEND_LEASE (--notification-send-
# lease), well past the timeout, so only an instance that died mid-send lets another send it again.
NOTIFY_INTERVAL = timedelta(seconds=1)
NOTIFY_IDLE_INTERVAL = timedelta(seconds=5)
NOTIFY_BATCH = 100
NOTIFY_SENDS = 16
NOTIFY_SEND_TIMEOUT = timedelta(seconds=10)
DEFAULT_NOTIFY_SEND_LEASE = timedelta(seconds=60)
# A failed send is tried again after 2 s doubling up to 10 min (times a random 50–100 %, so a receiver that
# comes back is not hit by every instance at once); after a channel's max attempts it is dead.
NOTIFY_RETRY_FIRST = timedelta(seconds=2)
NOTIFY_RETRY_MAX = timedelta(minutes=10)
DEFAULT_NOTIFY_MAX_ATTEMPTS = 10
# Each channel gets at most this many deliveries a minute, from all instances together (Slack takes about one
# message a second per webhook), in bursts of up to NOTIFY_RATE_BURST's worth.
DEFAULT_NOTIFY_RATE_PER_MINUTE = 60
NOTIFY_RATE_BURST = timedelta(seconds=10)
# Events whose deliveries all went through are deleted this long after they happened (--notification-
# retention); pending and dead ones stay until delivered or the channel is deleted.
DEFAULT_NOTIFICATION_RETENTION = timedelta(days=7)
# A task a start gate (freeze, budget, pre-flight check) has held longer than this is reported once per hold
# (`task.held_too_long`, --notification-hold-threshold); every instance looks for such holds, and for the
# end of those reported, every NOTIFY_HOLD_WATCH_INTERVAL (or a quarter of the threshold, if shorter).
DEFAULT_NOTIFICATION_HOLD_THRESHOLD = timedelta(hours=1)
# The shortest threshold `rackflow serve` takes: the watcher looks every quarter of a shorter threshold than
# a minute, so a typo such as `1ms` (for 1m) had every instance query the database about every 250 µs; a
# hold shorter than this is no hold to page about.
MIN_NOTIFICATION_HOLD_THRESHOLD = timedelta(seconds=10)
NOTIFY_HOLD_WATCH_INTERVAL = timedelta(seconds=15)
# An Alertmanager alert for a condition (a halted run, a paused schedule, a task held too long) is sent again
# every DEFAULT_ALERT_RESEND_INTERVAL while the condition is open, as Prometheus
# re-sends its firing alerts: Alertmanager keeps alerts in memory only, and one restarted, or an HA peer that
# missed a post, has them again within an interval. Each send's `endsAt` is ALERT_RESEND_ENDS_AFTER intervals
# on, so an alert rackflow stops sending (its clearing lost, rackflow gone) resolves by itself. An alert for
# a one-off event (a failed task) ends after ALERT_ONE_OFF, and is not sent again.
DEFAULT_ALERT_RESEND_INTERVAL = timedelta(minutes=1)
ALERT_RESEND_ENDS_AFTER = 4
# Each instance's delivery loop looks for re-sends due this many times an interval (one read; a re-send is
# then at most this fraction of an interval late), not every round: the look reads the open conditions.
ALERT_RESEND_LOOKS = 4
ALERT_ONE_OFF = timedelta(hours=1)


class BackendName(enum.StrEnum):
    SIMULATOR = "simulator"
    REDFISH = "redfish"


class LogFormat(enum.StrEnum):
    TEXT = "text"
    JSON = "json"


def duration_text(value: timedelta) -> str:
    """A whole-second duration as a flag takes it (`15s`), for the defaults `--help` shows."""
    return f"{int(value.total_seconds())}s"


def parse_host_port(value: str, flag: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:PORT`); port 0 asks the OS for a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgument(f"{flag}: expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def host_port(host: str, port: int | None) -> str:
    """The `HOST:PORT` that `parse_host_port` reads back (just `HOST` without a port): an IPv6 host in
    brackets, as a URL writes it too."""
    bracketed = f"[{host}]" if ":" in host else host
    return f"{bracketed}:{port}" if port is not None else bracketed


def parse_list(value: str | None) -> tuple[str, ...]:
    """A comma-separated flag (`--http-allowed-hosts a,b`): its items, trimmed, empty ones dropped."""
    return tuple(item.strip() for item in (value or "").split(",") if item.strip())


def parse_interval(
    value: str, flag: str, *, minimum: timedelta | None = None, maximum: timedelta | None = None
) -> timedelta:
    """A positive Go duration, at least `minimum` and at most `maximum` when given (refused naming the flag
    and the text typed)."""
    try:
        ns = parse_go_duration(value)
    except ValueError as exc:
        raise InvalidArgument(f"{flag}: {exc}") from None
    if ns <= 0:
        raise InvalidArgument(f"{flag}: must be positive, got {value!r}")
    interval = timedelta(microseconds=max(1, ns // 1000))
    if minimum is not None and interval < minimum:
        raise InvalidArgument(f"{flag}: must be at least {format_go_duration(minimum)}, got {value!r}")
    if maximum is not None and interval > maximum:
        raise InvalidArgument(f"{flag}: must be at most {format_go_duration(maximum)}, got {value!r}")
    return interval


def parse_retention(value: str, flag: str) -> timedelta | None:
    """A retention flag (`--audit-retention`, `--run-retention`, `--task-retention`): a Go duration of at
    least MIN_RETENTION, or None (keep everything) for an empty value or a zero (`0`, `0s`, `0h`)."""
    try:
        ns = parse_go_duration(value) if value else 0
    except ValueError as exc:
        raise InvalidArgument(f"{flag}: {exc}") from None
    if ns == 0:
        return None
    retention = timedelta(microseconds=ns // 1000)
    if retention < MIN_RETENTION:
        raise InvalidArgument(f"{flag}: must be at least 1h, or 0 to keep everything, got {value!r}")
    return retention


@dataclass(frozen=True)
class ServeConfig:
    db: str = DEFAULT_DB
    listen: str = DEFAULT_LISTEN
    dispatch_interval: timedelta = DEFAULT_DISPATCH_INTERVAL
    dispatch_batch: int = DEFAULT_DISPATCH_BATCH
    dispatcher: bool = True
    backend: BackendName = BackendName.SIMULATOR
    metrics_listen: str | None = None
    migrate: bool = False
    log_format: LogFormat = LogFormat.TEXT
    clock_offset: timedelta = field(default=timedelta(0))
    # How long an instance's heartbeat may be silent before others take its tasks and runs over.
    lease_ttl: timedelta = DEFAULT_LEASE_TTL
    # How often the executor writes its running tasks' progress messages: how far at most they lag.
    progress_interval: timedelta = DEFAULT_PROGRESS_INTERVAL
    # Connections kept open to PostgreSQL (DB_POOL_OVERFLOW more are opened for bursts). Size it so that
    # instances × (pool + overflow) stays under the server's max_connections.
    db_pool_size: int = DEFAULT_DB_POOL_SIZE
    tls: ServerTls | None = None
    tokens: TokenTable | None = field(default=None, repr=False)
    insecure: bool = False
    # Audit events older than this are deleted; None keeps them forever (an operator's explicit choice).
    audit_retention: timedelta | None = None
    # Schedule runs fired, and tasks ended, longer ago than this are deleted; None keeps them forever.
    run_retention: timedelta | None = None
    task_retention: timedelta | None = None
    # The start deadline of a schedule without its own (docs/SAFETY.md); None: none.
    default_start_deadline: timedelta | None = DEFAULT_START_DEADLINE
    # The audit spool file and its bound (rackflow.audit.spool).
    audit_spool: str = DEFAULT_AUDIT_SPOOL
    audit_spool_max_bytes: int = DEFAULT_AUDIT_SPOOL_MAX_BYTES
    # The dashboard and JSON API (rackflow.web) on HOST:PORT; None serves no HTTP at all.
    http_listen: str | None = None
    # Names (besides the listen address and loopback) the HTTP listener answers to in `Host` ("*": any),
    # and origins (scheme://host[:port]) whose pages may send it state-changing requests.
    http_allowed_hosts: tuple[str, ...] = ()
    http_allowed_origins: tuple[str, ...] = ()
    http_max_body_bytes: int = DEFAULT_HTTP_MAX_BODY_BYTES
    # Where operators reach this deployment's dashboard (e.g. https://rackflow.example.com): notifications
    # link to a run's page under it; empty: no links.
    external_url: str = ""
    # Delivered notification events older than this are deleted; None keeps them.
    notification_retention: timedelta | None = DEFAULT_NOTIFICATION_RETENTION
    # A task held by a start gate longer than this is reported (`task.held_too_long`).
    notification_hold_threshold: timedelta = DEFAULT_NOTIFICATION_HOLD_THRESHOLD
    # How long a claimed notification send is left to its instance before another sends it again: the
    # longest a SIGKILLed instance's sends wait. Longer than NOTIFY_SEND_TIMEOUT, or a slow send that is
    # still going would be sent again beside it.
    notification_send_lease: timedelta = DEFAULT_NOTIFY_SEND_LEASE

    @property
    def mutual_tls(self) -> bool:
        """Whether callers must present a client certificate (`--tls-client-ca`)."""
        return self.tls is not None and self.tls.client_ca is not None

    def __post_init__(self) -> None:
        for flag, listen in (("--listen", self.listen), ("--http-listen", self.http_listen)):
            if listen is not None:
                host, _ = parse_host_port(listen, flag)
                check_exposure(
                    host,
                    tls=self.tls is not None,
                    auth=self.tokens is not None or self.mutual_tls,
                    insecure=self.insecure,
                    flag=flag,
                )
        if self.metrics_listen:
            parse_host_port(self.metrics_listen, "--metrics-listen")
        if not 2 <= self.db_pool_size <= 500:
            raise InvalidArgument(f"--db-pool-size: must be 2..500, got {self.db_pool_size}")
        if not self.audit_spool:
            raise InvalidArgument("--audit-spool: must name a file")
        if self.audit_spool_max_bytes < MIN_AUDIT_SPOOL_MAX_BYTES:
            raise InvalidArgument(
                f"--audit-spool-max-bytes: must be at least {MIN_AUDIT_SPOOL_MAX_BYTES},"
                f" got {self.audit_spool_max_bytes}"
            )
        if self.http_max_body_bytes < MIN_HTTP_MAX_BODY_BYTES:
            raise InvalidArgument(
                f"--http-max-body-bytes: must be at least {MIN_HTTP_MAX_BODY_BYTES},"
                f" got {self.http_max_body_bytes}"
            )
        for host in self.http_allowed_hosts:
            # A URL here (`https://portal.lab`) matched no `Host` header ever: every request was refused.
            if any(c in host for c in "/@ ") or not host.strip():
                raise InvalidArgument(
                    "--http-allowed-hosts: expected a host name (rackflow.lab), an address or *,"
                    f" got {host!r}"
                )
        for origin in self.http_allowed_origins:
            scheme, sep, rest = origin.partition("://")
            if scheme not in ("http", "https") or not sep or not rest or "/" in rest.rstrip("/"):
                raise InvalidArgument(
                    f"--http-allowed-origins: expected scheme://host[:port], got {origin!r}"
                )
        if self.external_url and not self.external_url.startswith(("http://", "https://")):
            raise InvalidArgument(
                f"--external-url: must be an http:// or https:// URL, got {self.external_url!r}"
            )
        if self.notification_send_lease <= NOTIFY_SEND_TIMEOUT:
            raise InvalidArgument(
                f"--notification-send-lease: must be longer than a send's timeout,"
                f" {duration_text(NOTIFY_SEND_TIMEOUT)}, got {duration_text(self.notification_send_lease)}"
            )
        if not 1 <= self.dispatch_batch <= 10_000:
            raise InvalidArgument(f"--dispatch-batch: must be 1..10000, got {self.dispatch_batch}")


# Rollouts (rackflow.rollouts): every instance with the dispatcher steps rolling runs this often (a step
# also runs at once after a firing, a resume and a cancel), up to this many runs per transaction; with no
# run rolling anywhere it looks every ROLLOUT_IDLE_INTERVAL, and at once after this process started one.
ROLLOUT_STEP_INTERVAL = timedelta(seconds=1)
ROLLOUT_IDLE_INTERVAL = timedelta(seconds=5)
ROLLOUT_STEP_BATCH = 20

# Retries (RetryPolicy, docs/SAFETY.md): what an unset field of the API's policy means, and the limits.
DEFAULT_RETRY_INITIAL_BACKOFF = timedelta(seconds=30)
DEFAULT_RETRY_MULTIPLIER = 2.0
DEFAULT_RETRY_MAX_BACKOFF = timedelta(minutes=10)
MAX_RETRY_ATTEMPTS = 10
MAX_RETRY_MULTIPLIER = 10.0
MAX_RETRY_BACKOFF = timedelta(hours=24)

# Operation budgets (rackflow.budgets): a task a full budget holds back is claimed again after this long,
# or at once when a budget is raised or deleted (docs/ROLLOUTS.md, "Budgets").
BUDGET_RETRY_DELAY = timedelta(seconds=2)

# Pre-flight checks (rackflow.checks, docs/CHECKS.md). A check's own defaults: asked again every
# interval while it holds a task, which fails after the maximum wait; a webhook's answer is awaited this
# long (at most MAX_WEBHOOK_TIMEOUT), an Alertmanager's ALERTMANAGER_TIMEOUT.
DEFAULT_CHECK_INTERVAL = "30s"
DEFAULT_CHECK_MAX_WAIT = "1h"
MIN_CHECK_INTERVAL = timedelta(milliseconds=100)
DEFAULT_WEBHOOK_TIMEOUT = "10s"
MAX_WEBHOOK_TIMEOUT = timedelta(seconds=60)
ALERTMANAGER_TIMEOUT = timedelta(seconds=10)
# Every instance's checker looks for held tasks whose next round is due this often (and at once when its
# own gate holds a new one), takes up to PREFLIGHT_BATCH of them a look, and asks at most
# PREFLIGHT_CONCURRENCY checks at once. A round's lease outlasts its slowest check by PREFLIGHT_LEASE_SLACK
# (a checker that died mid-round is taken over after that). A task held for its first answer is claimed
# (and gated) again after PREFLIGHT_ANSWER_WAIT if no checker released it sooner.
PREFLIGHT_POLL_INTERVAL = timedelta(seconds=1)
# With no round due within the poll interval the checker sleeps until the first comes due, at most this
# long (also its pause while no task is held); a write that makes a round due now wakes it.
PREFLIGHT_IDLE_INTERVAL = timedelta(seconds=5)
PREFLIGHT_BATCH = 100
PREFLIGHT_CONCURRENCY = 16
# Of those, at most ALERTMANAGER_CONCURRENCY GETs in flight to one Alertmanager (its URL's scheme, host and
# port), shared by every check and poll that asks it: Alertmanager refuses GETs past its
# `--web.get-concurrency` with 503, whose default is GOMAXPROCS but never less than 8, so 8 is what any
# Alertmanager left at its default answers at once (16 at once saw about 4 in 10 refused,
# docs/PERFORMANCE.md). Webhooks keep all of PREFLIGHT_CONCURRENCY.
ALERTMANAGER_CONCURRENCY = 8
PREFLIGHT_LEASE_SLACK = timedelta(seconds=30)
PREFLIGHT_ANSWER_WAIT = timedelta(seconds=30)
# The checker also asks, ahead of the executor's claim, about the tasks next in line whose checks ask over
# HTTP: as many as its process's executor ended in the last PREFLIGHT_LOOK_AHEAD (the slots that will free
# soon at the pace tasks end; at most PREFLIGHT_BATCH), counting those asked and not started yet (issue 26).
PREFLIGHT_LOOK_AHEAD = timedelta(seconds=1)
# While its process's dispatcher fires (schedules claimed and not yet written back, or more due), the
# checker's next poll waits for the firing pass to end, but never longer than PREFLIGHT_YIELD past when it
# would have polled: the checker's rounds and its HTTP looks shared the event loop with the firing pass and
# moved fire lag (issue 26). So checks are slowed during a long drain, never starved.
PREFLIGHT_YIELD = timedelta(seconds=1)
# A rollout's rack claimed while its rollout is at a cap (held by its checks, it did not count against the
# caps, so the rollout started others: `rollouts.gate`) waits this long before its claim looks for room again.
ROLLOUT_CAP_WAIT = timedelta(seconds=2)
# A rollout's rack whose run's row another transaction holds at its claim (a rollout step, resume or cancel, a
# window's change, another claim's gate: the claim never waits for it, `rollouts.gate`) is held this long,
# then claimed again and decided by the run as that transaction left it.
ROLLOUT_BUSY_WAIT = timedelta(seconds=1)
# A halted rollout's rack whose task has not begun is held (`rollouts.gate`) until the run is resumed (which
# releases it at once) or cancelled (which ends it); its claim looks again after this long all the same (a
# run deleted with its schedule leaves nothing to release it).
ROLLOUT_HALT_WAIT = timedelta(minutes=1)
# The furthest ahead a pause may end (`PauseTaskSchedule.resume_at`): past it, resuming computes no next run
# before year 10000.
MAX_PAUSE = timedelta(days=100 * 365)
