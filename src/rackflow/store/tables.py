"""Every table, as SQLAlchemy Core metadata. Alembic migrations in `migrations/` create exactly these
(tests/store/test_migrations.py compares them)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
    text,
)

from rackflow.store.types import UTCDateTime, json_type

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# A run or task row is written small (no outcomes, no message) and rewritten larger within seconds, by an
# update that is never HOT (its state or status is indexed), so full pages of the history keep a gap that a
# new row fits and a rewritten one does not. Vacuum records those gaps, and PostgreSQL put each new row of a
# firing into one of them: a random page of the whole history read, dirtied and logged whole for every run
# and every task (docs/PERFORMANCE.md, "Inserts into the gaps of old pages"). Filling pages to 90 % keeps
# inserts off any page with less than a tenth free, so they append to the table's newest pages, and leaves
# each row's own rewrite room on its page (migration 0033; PostgreSQL only).
HISTORY_STORAGE = {"fillfactor": 90}
# A task's row is rewritten once a step of its run (its progress message), by a HOT update when the new
# version fits on the row's own page. A task on a GB200 NVL72 rack names its 36 components: a row of about
# 1.75 KB, of which a tenth of a page (0.8 KB) holds no new version, so each rewrite moved the row to
# another page and wrote an entry in every index of `tasks`: 2.5 KB of WAL a step, 101 KB a task. Pages
# filled to 70 % keep room for a version of such a row: 18 KB a task (docs/CAPACITY.md, "Racks of 36
# components"; migration 0057; PostgreSQL only). Inserts still append to the newest pages, as above.
#
# And vacuumed often, its indexes cleaned every time: the executor's claim walks the live tasks in the
# queue's order and reads the pages of every task ended since the last VACUUM, which alone empties them
# (10-13 ms a claim after 541,483 dead rows at full size, 0.48 ms after a VACUUM of 1.31 s); autovacuum's
# defaults wait for a fifth of the table and may then leave the indexes alone (migration 0061).
# The filing time of the tasks made before migration 0062 (`store.task_partitions.LONG_AGO`), the default
# of the columns that hold it: what the release before it writes while a rolling upgrade keeps it serving.
LONG_AGO_LITERAL = "'0001-01-01 00:00:00+00'"

TASK_STORAGE = {
    "fillfactor": 70,
    "vacuum_index_cleanup": "on",
    "autovacuum_vacuum_scale_factor": 0.01,
    "autovacuum_vacuum_threshold": 10000,
}
# A scope row is rewritten by every firing (its `last_task_id`) by a HOT update, which needs room on the
# row's own page: a tenth of each page is kept for it (migration 0034; PostgreSQL only).
SCOPE_STORAGE = {"fillfactor": 90}

nvl_domains = Table(
    "nvl_domains",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False),
    # The domain list's order (`store.inventory.DOMAIN_ORDER`, migration 0055): a page is a range of it,
    # where a page of a fleet's 20,000 domains (one an NVL72 rack) sorted them all.
    Index("ix_nvl_domains_created_at_id", "created_at", "id"),
    # The schedule form's picker (`store.inventory.names_holding`) reads the names' trigrams, as the racks'
    # (below).
    Index(
        "ix_nvl_domains_name_trgm", "name", postgresql_using="gin", postgresql_ops={"name": "gin_trgm_ops"}
    ).ddl_if(dialect="postgresql"),
)

# A token that triggers replace on every change to the NVLink domains or their racks' membership (migration
# 0059, which holds the triggers): `InventoryService` answers the whole domain list again from what it kept
# while the token is the one it read before that list. One row, id 1.
domain_list_version = Table(
    "domain_list_version",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("token", String(36), nullable=False),
)

racks = Table(
    "racks",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("external_id", String(255), nullable=True, unique=True),
    Column("nvl_domain_id", Uuid, ForeignKey("nvl_domains.id", ondelete="SET NULL"), nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    # The rack list's order (`store.inventory.RACK_ORDER`), whole and by NVLink domain (migration 0032): a
    # page is a range of one of these, where PostgreSQL read and sorted every rack for each page.
    Index("ix_racks_created_at_id", "created_at", "id"),
    Index("ix_racks_nvl_domain_id_created_at_id", "nvl_domain_id", "created_at", "id"),
    # The name search (ListRacks' `name_contains`, the schedule form's picker: `name ILIKE '%' || :text ||
    # '%'`) reads the names' trigrams, where it read every name when few matched (migration 0056; the
    # extension `pg_trgm` is 0027's). PostgreSQL only, as the schedules' (`ix_task_schedule_name_trgm`); a
    # text of one or two characters holds no trigram and is spelled so that no plan reads it
    # (`store.dialect.name_holds`).
    Index(
        "ix_racks_name_trgm", "name", postgresql_using="gin", postgresql_ops={"name": "gin_trgm_ops"}
    ).ddl_if(dialect="postgresql"),
)

components = Table(
    "components",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("rack_id", Uuid, ForeignKey("racks.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("type", String(16), nullable=False),
    Column("name", String(255), nullable=False),
    Column("external_id", String(255), nullable=True),
    Column("firmware_version", String(255), nullable=False, server_default=""),
    Column("power_state", String(16), nullable=False, server_default="unknown"),
    Column("created_at", UTCDateTime, nullable=False),
    # The component's BMC (migration 0003): all three set, or none. bmc_credentials is a reference
    # (env:NAME or file:/path), never the secret itself.
    Column("bmc_url", String(1024), nullable=True),
    Column("bmc_resource", String(255), nullable=True),
    Column("bmc_credentials", String(1024), nullable=True),
    # The machine the BMC fields name, one text for every spelling of it (`domain.bmc.stored_resource_key`,
    # migration 0039): unique, so no two components, in one rack or two, act on one machine. NULL without
    # a BMC (NULLs are distinct: any number of components have none).
    Column("bmc_resource_key", String(64), nullable=True),
    UniqueConstraint("type", "external_id"),
    Index("uq_components_bmc_resource_key", "bmc_resource_key", unique=True),
)

# A process that runs tasks or fires schedules; its heartbeat is the lease on everything it owns.
instances = Table(
    "instances",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_at", UTCDateTime, nullable=False),
)

tasks = Table(
    "tasks",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("operation", String(32), nullable=False),
    Column("parameters", json_type(), nullable=False),
    Column("rack_id", Uuid, ForeignKey("racks.id", ondelete="CASCADE"), nullable=False),
    Column("component_ids", json_type(), nullable=False),
    Column("description", Text, nullable=False, server_default=""),
    Column("status", String(16), nullable=False),
    Column("message", Text, nullable=False, server_default=""),
    Column("queue_expires_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=True),
    Column("updated_at", UTCDateTime, nullable=False),
    Column("schedule_id", Uuid, nullable=True),
    Column("owner_id", Uuid, nullable=True),
    Column("attempts", Integer, nullable=False, server_default="0"),
    # The firing that submitted the task (migration 0006). A pruned run leaves its id, which then names no
    # run, as a pruned run's `retry_of` does: on PostgreSQL without a foreign key (migration 0036), so a
    # task's insert does not lock its run nor a run's deletion rewrite its tasks; SQLite keeps the key
    # (ON DELETE SET NULL, below), which costs it little and which it cannot drop without rebuilding `tasks`.
    Column("run_id", Uuid, nullable=True),
    # The typed hold (rackflow.tasks.gates; migrations 0011, 0014): the claim leaves the task until
    # `not_before`, held by `held_by` (a gate's name, or "window": its opening) for `held_reason` since
    # `held_since`; a task not started by `not_after` (its window's end) fails without running.
    Column("not_before", UTCDateTime, nullable=True),
    Column("not_after", UTCDateTime, nullable=True),
    Column("held_by", String(32), nullable=True),
    Column("held_reason", Text, nullable=True),
    Column("held_since", UTCDateTime, nullable=True),
    # Submitted with queue_options.ignore_windows: FREEZE windows do not hold it (migration 0011).
    Column("ignore_windows", Boolean, nullable=False, server_default=text("false")),
    # Retries (migration 0020, docs/SAFETY.md): the schedule's RetryPolicy as submitted (NULL: one
    # attempt), the current attempt (from 1; `attempts` above counts claims within it, for takeovers),
    # and when the current attempt started (`started_at` keeps the first start).
    Column("retry", json_type(), nullable=True),
    Column("attempt", Integer, nullable=False, server_default="1"),
    Column("attempt_started_at", UTCDateTime, nullable=True),
    # A start gate's refusal, written by the claim that consulted the gates (migration 0045; `Task.refusal`):
    # {"reason", "ends_as"}, which a takeover of the task ends it with instead of running it. NULL: none.
    Column("refusal", json_type(), nullable=True),
    # When the task was filed, its partition key on PostgreSQL (migration 0062, `store.task_partitions`): a
    # function of its id, LONG_AGO for the tasks made before it. Written alike on SQLite, never read there.
    Column("filed_at", UTCDateTime, nullable=False, server_default=text(LONG_AGO_LITERAL)),
    CheckConstraint(
        "status IN ('pending', 'running', 'completed', 'failed', 'terminated', 'waiting')", name="status"
    ),
    ForeignKeyConstraint(["run_id"], ["task_schedule_run.id"], ondelete="SET NULL").ddl_if(dialect="sqlite"),
    # One task per rack per firing, whatever code path submits it (and the index the lost-connection
    # recovery looks a firing's tasks up by). A unique index rather than a table constraint, so that
    # migration 0006 need not rebuild the table on SQLite. On PostgreSQL the partitioned table's holds the
    # filing time, as a partitioned unique index must: a run's tasks are all filed at its id's millisecond
    # (`store.task_partitions`), so it holds the same rule (migration 0062; the partition before the weeks
    # keeps the index of (run_id, rack_id) too).
    Index("uq_tasks_run_id_rack_id", "run_id", "rack_id", unique=True).ddl_if(dialect="sqlite"),
    Index("uq_tasks_run_id_rack_id_filed_at", "run_id", "rack_id", "filed_at", unique=True).ddl_if(
        dialect="postgresql"
    ),
    Index("ix_tasks_rack_id_status", "rack_id", "status"),
    # A run's tasks by status, counted from the index alone (the runs grid, a run's page; migration 0024).
    Index("ix_tasks_run_id_status", "run_id", "status"),
    Index("ix_tasks_created_at", "created_at"),
    # A list filtered by schedule or by status, newest first: the filter, then the list's order (migration
    # 0022), so a page and its capped count read only their own rows. The schedule's is keyed by status
    # too (migration 0058), so a list filtered by both reads that status's entries alone (a rare status's
    # count read every entry of a 10,000-rack schedule: 102-123 ms at full size); its list of several
    # statuses, or of all, merges the newest of each (`store.tasks.list_tasks`).
    Index("ix_tasks_schedule_id_status_created_at_id", "schedule_id", "status", "created_at", "id"),
    Index("ix_tasks_status_created_at_id", "status", "created_at", "id"),
    # The live tasks by status (the counts of live work, the waiting tasks' promotion).
    Index(
        "ix_tasks_active",
        "status",
        "created_at",
        postgresql_where=text("status IN ('pending', 'running', 'waiting')"),
        sqlite_where=text("status IN ('pending', 'running', 'waiting')"),
    ),
    # The live tasks in the queue's order (oldest first), which the executor's claim and the checker's look
    # at the queue's head walk and stop once they have their tasks: otherwise PostgreSQL read and sorted
    # every live task at each claim (migration 0030). PostgreSQL only: SQLite, without statistics, prefers
    # the status index whatever the backlog.
    Index(
        "ix_tasks_live_queue",
        "created_at",
        "id",
        postgresql_where=text("status IN ('pending', 'running', 'waiting')"),
    ).ddl_if(dialect="postgresql"),
    # A rack's live tasks (active, or cancelled and still held), which every submission reads for its
    # racks (`store.tasks.blocking_and_waiting`): only those rows, so a lookup reads none of the rack's
    # ended history nor the rest of the fleet's live work (migration 0026). The predicate is the query's.
    # PostgreSQL only: on SQLite it turned the dead-hold sweep away from `ix_tasks_held` (the migration).
    Index(
        "ix_tasks_live_rack_id",
        "rack_id",
        postgresql_where=text("status IN ('pending', 'running', 'waiting') OR owner_id IS NOT NULL"),
    ).ddl_if(dialect="postgresql"),
    # The dead-hold sweep reads only held tasks, not every ended one. The predicate is the sweep's literal
    # `owner_id IS NOT NULL`, not its `status = $1`: once psycopg prepares the statement, PostgreSQL's
    # generic plan cannot prove a predicate from a parameter (migration 0005; tests/store/test_held_index.py).
    Index(
        "ix_tasks_held",
        "owner_id",
        postgresql_where=text("owner_id IS NOT NULL"),
        sqlite_where=text("owner_id IS NOT NULL"),
    ),
    # On PostgreSQL partitioned by week of `filed_at` (migration 0062, store/task_partitions.py; the
    # partitions, each with its key on `id` and TASK_STORAGE, are not metadata). The parent has no key: one
    # must hold `filed_at`.
    postgresql_partition_by="RANGE (filed_at)",
)

# A schedule has an approval policy: its column holds one, neither SQL's NULL nor JSON's null (how a policy
# removed, or never set, is stored). The predicate of `ix_task_schedule_approval_name` and the filter that
# reads it, spelled once.
HAS_APPROVAL_POLICY = "approval IS NOT NULL AND CAST(approval AS TEXT) <> 'null'"

task_schedule = Table(
    "task_schedule",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("spec_type", String(16), nullable=False),
    Column("spec", String(256), nullable=False),
    Column("timezone", String(64), nullable=False, server_default="UTC"),
    Column("operation_template", json_type(), nullable=False),
    Column("overlap_policy", String(8), nullable=False, server_default="skip"),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("next_run_at", UTCDateTime, nullable=True),
    Column("last_run_at", UTCDateTime, nullable=True),
    Column("description", Text, nullable=False, server_default=""),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # Set by PauseTaskSchedule, cleared by a resume (migration 0007).
    Column("pause_reason", Text, nullable=False, server_default=""),
    Column("paused_by", String(255), nullable=False, server_default=""),
    Column("paused_at", UTCDateTime, nullable=True),
    Column("resume_at", UTCDateTime, nullable=True),
    # What a dispatched firing does for a rack its maintenance windows close (migration 0011): "skip" or
    # "defer" (checked by the service: adding a CHECK on SQLite would rebuild the table).
    Column("window_policy", String(8), nullable=False, server_default="skip"),
    # How a firing rolls out (RolloutPolicy.to_json, migration 0012); NULL: every scope at once.
    Column("rollout", json_type(), nullable=True),
    # The approval policy (ApprovalPolicy.to_json, migration 0018; NULL: firings start at once), and who
    # last created, updated or re-scoped the schedule: the two-person rule keeps them from approving.
    Column("approval", json_type(), nullable=True),
    Column("last_edited_by", String(255), nullable=False, server_default=""),
    # How late a dispatched firing may start, in microseconds (migration 0019); NULL: the server's default;
    # 0: none. Pause after this many consecutive failing runs (0: never), counting only the runs fired
    # after `failures_counted_until` (the last streak that paused it).
    Column("start_deadline_us", BigInteger, nullable=True),
    Column("pause_after_failed_runs", Integer, nullable=False, server_default="0"),
    Column("failures_counted_until", UTCDateTime, nullable=True),
    # How its tasks retry retryable failures (RetryPolicy.to_json, migration 0020); NULL: one attempt.
    Column("retry", json_type(), nullable=True),
    # The stamp of its last scope removal (migration 0031), written by every removal of a scope entry in
    # its transaction (`store.scope_removals`): the newest run's `fired_at` then (a run fired later never
    # held a removed rack). NULL: none removed while it had runs. The runs grid reads the racks that left
    # the scope only for pages with a run fired at or before it.
    Column("scope_removed_after", UTCDateTime, nullable=True),
    # How many runs it has, as the run cap counts them (migration 0038): each firing adds its run, and the
    # cap's look at PRUNE_AT takes off those it deleted (`store.runs.cap_runs`), so a firing short of
    # it skips the look. NULL: not known (the schedules 0038 found), counted at the next firing.
    Column("run_count", Integer, nullable=True),
    # No later than the slot of any of its runs that has one (migration 0047): the cap's look and every read
    # of its runs by schedule read the runs' partitions from there on (`store.runs.prune_runs`,
    # `in_their_weeks`); set by its first firing, lowered by an earlier slot, raised by the look. NULL: not
    # known (a schedule from before 0047, until its first look), every partition read.
    Column("runs_since", UTCDateTime, nullable=True),
    CheckConstraint("spec_type IN ('interval', 'cron', 'one-time')", name="spec_type"),
    CheckConstraint("overlap_policy IN ('skip', 'queue')", name="overlap_policy"),
    Index("ix_task_schedule_created_at_id", "created_at", "id"),
    # The list by next or last run (migration 0025): a page is a range of one of these, not a sort of
    # every schedule; each firing, which sets both columns, writes an entry into each.
    Index("ix_task_schedule_next_run_at_created_at_id", "next_run_at", "created_at", "id"),
    Index("ix_task_schedule_last_run_at_created_at_id", "last_run_at", "created_at", "id"),
    # The name search (`name ILIKE '%' || :text || '%'`) reads the names' trigrams, where it read every
    # name (migration 0027, which creates the extension `pg_trgm` it needs). PostgreSQL only: SQLite has
    # no trigram index. Each firing, which updates its schedule's row, writes the name's trigrams again.
    # A text of one or two characters holds no trigram: its pages walk a bounded range of the list's own
    # index instead (config.SEARCH_WALK), its condition spelled so that this index cannot answer it
    # (`store.dialect.name_holds`).
    Index(
        "ix_task_schedule_name_trgm",
        "name",
        postgresql_using="gin",
        postgresql_ops={"name": "gin_trgm_ops"},
    ).ddl_if(dialect="postgresql"),
    # The dispatcher's due scan: only enabled rows with a next run are indexed, in claim order. Both
    # databases match a partial index's predicate by its spelling, so it is spelled exactly as the claim's
    # `enabled.is_(True)` renders (migration 0004; tests/store/test_due_index.py checks the claim uses it).
    Index(
        "ix_task_schedule_due",
        "next_run_at",
        "id",
        postgresql_where=text("enabled IS true AND next_run_at IS NOT NULL"),
        sqlite_where=text("enabled IS 1 AND next_run_at IS NOT NULL"),
    ),
    # Paused schedules (the overview's list by name, the schedule list's "paused" filter and its count):
    # only the few paused rows are indexed, where the filter alone read all of a million (migration 0022).
    # Spelled as `enabled.is_(False)` renders, as the due index is.
    Index(
        "ix_task_schedule_paused",
        "name",
        postgresql_where=text("enabled IS false"),
        sqlite_where=text("enabled IS 0"),
    ),
    # The dispatcher's scan for pauses that have ended: only the few rows with an end are indexed.
    Index(
        "ix_task_schedule_resume_at",
        "resume_at",
        postgresql_where=text("resume_at IS NOT NULL"),
        sqlite_where=text("resume_at IS NOT NULL"),
    ),
    # The dispatcher's scan for failing streaks: only the enabled rows that pause after failures.
    Index(
        "ix_task_schedule_pause_after_failed_runs",
        "id",
        postgresql_where=text("pause_after_failed_runs > 0 AND enabled IS true"),
        sqlite_where=text("pause_after_failed_runs > 0 AND enabled IS 1"),
    ),
    # The schedules with an approval policy, by name, which a server that can count its approvers looks at
    # before it listens (`store.schedules.approval_set_ups`): it read every schedule, a policy removed or
    # never set being JSON's null, which `IS NOT NULL` keeps (344-386 ms at each start over a million;
    # migration 0060). Spelled as that look's filter renders (`HAS_APPROVAL_POLICY`).
    Index(
        "ix_task_schedule_approval_name",
        "name",
        postgresql_where=text(HAS_APPROVAL_POLICY),
        sqlite_where=text(HAS_APPROVAL_POLICY),
    ),
)

# A schedule's operation, as the schedule list's filter by operation (`operation_type`) reads it.
schedule_operation = task_schedule.c.operation_template[("operation", "kind")].as_string()

# The list filtered by operation, in its default order (creation time): a range of this index, where
# PostgreSQL walked the list's order reading every schedule's row to find a rare operation's (1.3 s a page
# over a million schedules; migration 0051). PostgreSQL only, the production database of such fleets: the
# embedded SQLite's are small. Its expression is the filter's, rendered alike, which PostgreSQL matches by
# its spelling. Each firing's update of its schedule (not a HOT
# update: it moves the due index) writes an entry here too (docs/PERFORMANCE.md).
Index(
    "ix_task_schedule_operation_kind", schedule_operation, task_schedule.c.created_at, task_schedule.c.id
).ddl_if(dialect="postgresql")
# The paused schedules' list filtered by operation: a range of the paused alone, where the index above made
# PostgreSQL read every schedule of the operation to find its few paused ones (310 ms an empty page over a
# million schedules; migration 0053). No firing writes here: a schedule that fires is not paused. The
# predicate is the paused filter's `enabled.is_(False)`, spelled as PostgreSQL renders it.
Index(
    "ix_task_schedule_paused_operation_kind",
    schedule_operation,
    task_schedule.c.created_at,
    task_schedule.c.id,
    postgresql_where=text("enabled IS false"),
).ddl_if(dialect="postgresql")

# The cutoff the task prune (--task-retention) last deleted before, raised before it deletes (one row, id 1;
# none until a prune ran): a run fired at or after it, by a margin, has every task it had
# (`store.kept_counts`, migration 0031).
task_prune_horizon = Table(
    "task_prune_horizon",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("pruned_before", UTCDateTime, nullable=False),
)

# Where the tasks' weeks that can hold a live task begin (one row, id 1; PostgreSQL, migration 0062,
# `store.task_partitions.live_weeks`): no task filed in a week (from BOUND on) before `since` is live or
# held. Lowered by the transaction that files a task that far back, raised by every instance's keeper. The
# reads of the live tasks (the executor's claim, a submission's conflicts, the promotion check) read only
# the partition before the weeks and the weeks from there. None: every week.
task_live_weeks = Table(
    "task_live_weeks",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("since", UTCDateTime, nullable=False),
)

# Each week of tasks (its Monday, as the partitions' bounds) that holds a task created at or after the week
# ended, with the latest such creation (PostgreSQL, migration 0063: written by a trigger on `tasks`, for
# every writer; `store.task_partitions.created_since`). A task is filed in its run's week, not its own: a
# rollout's later wave, a run that waited, a retry. A newest-first page of tasks reads the weeks of its
# creation times and these. The week of long ago stands for the partition before the weeks.
task_late_weeks = Table(
    "task_late_weeks",
    metadata,
    Column("week", UTCDateTime, primary_key=True, autoincrement=False),
    Column("last_created_at", UTCDateTime, nullable=False),
)

# The schedules whose failing streak (`pause_after_failed_runs`, docs/SAFETY.md) must be looked at again:
# a write that can change what decides it marked them (store.streak_checks, migration 0023). A row per
# mark, each writer's its own (migration 0029): a look can take only marks whose writers have committed.
failing_streak_checks = Table(
    "failing_streak_checks",
    metadata,
    # BIGINT identity on PostgreSQL; INTEGER PRIMARY KEY (the rowid) on SQLite.
    Column("seq", BigInteger().with_variant(Integer(), "sqlite"), Identity(), primary_key=True),
    Column(
        "schedule_id",
        Uuid,
        ForeignKey("task_schedule.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
)

task_schedule_scope = Table(
    "task_schedule_scope",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("schedule_id", Uuid, ForeignKey("task_schedule.id", ondelete="CASCADE"), nullable=False),
    Column("rack_id", Uuid, ForeignKey("racks.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("component_filter", json_type(), nullable=True),
    # The task this scope submitted at its newest firing, rewritten by every firing. Neither a foreign key
    # nor an index (migration 0034): with none, that rewrite changes no indexed column, so PostgreSQL
    # makes it a HOT update (no index entry written, no key checked); the task prune no longer looks up
    # each deleted task's scopes. A pruned task leaves its id here, as `retry_of` does for runs: the SKIP
    # check finds no such task, so nothing to overlap, exactly as NULL did.
    Column("last_task_id", Uuid, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    UniqueConstraint("schedule_id", "rack_id"),
    postgresql_with=SCOPE_STORAGE,
)

task_schedule_run = Table(
    "task_schedule_run",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("schedule_id", Uuid, ForeignKey("task_schedule.id", ondelete="CASCADE"), nullable=False),
    Column("fired_at", UTCDateTime, nullable=False),
    Column("scheduled_for", UTCDateTime, nullable=True),
    Column("trigger", String(16), nullable=False),
    Column("state", String(32), nullable=False),  # 32 since "awaiting_approval" (migration 0018)
    Column("outcomes", json_type(), nullable=False),
    # How many of its racks had each outcome, without a task and with one (migration 0024): written with
    # the outcomes (`store.schedules.outcome_counts_to_json`), so a run's tally is read without its outcomes.
    Column("outcome_counts", json_type(), nullable=False, server_default=text("'{}'")),
    Column("owner_id", Uuid, nullable=True),
    # A rollout's run (migration 0012): its policy as fired, why it halted or was skipped, and what its
    # last resume excused (the failures before it, and the canary gate).
    Column("rollout", json_type(), nullable=True),
    Column("reason", Text, nullable=False, server_default=""),
    Column("failures_excused", Integer, nullable=False, server_default="0"),
    Column("resumed", Boolean, nullable=False, server_default=text("false")),
    # A run of a schedule that needs approval (migration 0018): its RunApproval.to_json, and while it
    # awaits approval the time it expires (the expiry sweep's column).
    Column("approval", json_type(), nullable=True),
    Column("approval_expires_at", UTCDateTime, nullable=True),
    # A missed run (migration 0019): how long after its slot it was found, in microseconds.
    Column("late_by_us", BigInteger, nullable=True),
    # The run RetryTaskScheduleRun re-ran (migration 0020). No foreign key (adding one rebuilds the table
    # on SQLite): a pruned run leaves the id, which then names no run.
    Column("retry_of", Uuid, nullable=True),
    # Its tasks by status (TaskStatus value → count), kept once they can no longer change, and whether a
    # task of it was deleted with its rack since (never cleared: a kept count is read only while it is not;
    # retention's deletions are told by `task_prune_horizon`): `store.kept_counts`, migration 0031.
    Column("task_counts", json_type(), nullable=True),
    Column("tasks_deleted", Boolean, nullable=True),
    # When a run that awaited approval started (migration 0042): the stuck-run sweep counts its age from
    # here, not from `fired_at` (`store.dispatch.mark_abandoned_runs`). Null: it started as it fired.
    Column("started_at", UTCDateTime, nullable=True),
    # The client's id of the manual trigger or retry that fired it (migration 0049): a call again with it
    # answers this run instead of firing again (`store.runs.run_of_request`). Null: none given, or dispatched.
    Column("request_id", String(64), nullable=True),
    CheckConstraint("trigger IN ('dispatch', 'manual')", name="trigger"),
    CheckConstraint(
        "state IN ('running', 'completed', 'interrupted', 'rolling', 'halted', 'cancelled', 'skipped', "
        "'awaiting_approval', 'expired', 'rejected', 'missed')",
        name="state",
    ),
    Index(
        "ix_task_schedule_run_schedule_id_fired_at",
        "schedule_id",
        "fired_at",
        # On PostgreSQL with each run's slot (migration 0046): the run cap's look, narrowed to the
        # partitions from the schedule's `runs_since` on, reads the index alone (`runs.prune_runs`).
        postgresql_include=["scheduled_for"],
    ),
    # --run-retention takes the oldest runs of every schedule first (migration 0010).
    Index("ix_task_schedule_run_fired_at_id", "fired_at", "id"),
    Index(
        "ix_task_schedule_run_running",
        "owner_id",
        postgresql_where=text("state = 'running'"),
        sqlite_where=text("state = 'running'"),
    ),
    # Exactly once per tick, held by the database: one run per (schedule, slot) it was dispatched for.
    # Manual runs have no slot (NULL) and are not limited (migration 0006). Led by the slot's time, as
    # nothing reads it by schedule: a firing's run goes to the newest leaves, not to a random one among
    # every run kept (migration 0037).
    Index(
        "uq_task_schedule_run_slot_by_time",
        "scheduled_for",
        "schedule_id",
        unique=True,
        postgresql_where=text("scheduled_for IS NOT NULL"),
        sqlite_where=text("scheduled_for IS NOT NULL"),
    ),
    # Never two rollouts of one schedule at once, whatever path fires it (migration 0012): a firing while
    # one is rolling or halted is recorded as "skipped". At most one run of a schedule awaits approval
    # (migration 0018): a firing meanwhile is "skipped". Each is a unique index on SQLite. On PostgreSQL,
    # where the runs are partitioned, the trigger `task_schedule_run_live` holds both
    # (`store.run_partitions`), and the same indexes, not unique, find a schedule's live runs (0046).
    Index(
        "uq_task_schedule_run_live_rollout",
        "schedule_id",
        unique=True,
        sqlite_where=text("state IN ('rolling', 'halted')"),
    ).ddl_if(dialect="sqlite"),
    Index(
        "ix_task_schedule_run_live_rollout",
        "schedule_id",
        postgresql_where=text("state IN ('rolling', 'halted')"),
    ).ddl_if(dialect="postgresql"),
    Index(
        "uq_task_schedule_run_awaiting",
        "schedule_id",
        unique=True,
        sqlite_where=text("state = 'awaiting_approval'"),
    ).ddl_if(dialect="sqlite"),
    Index(
        "ix_task_schedule_run_awaiting",
        "schedule_id",
        postgresql_where=text("state = 'awaiting_approval'"),
    ).ddl_if(dialect="postgresql"),
    # One run per (schedule, request id), held by the database (migration 0049). On PostgreSQL the same
    # partial unique index is the DEFAULT partition's (`uq_task_schedule_run_default_request_id`): a unique
    # index of the partitioned table would have to hold the slot, and only manual runs, which have no slot
    # and so are all in that partition, carry a request id.
    Index(
        "uq_task_schedule_run_request_id",
        "schedule_id",
        "request_id",
        unique=True,
        sqlite_where=text("request_id IS NOT NULL"),
    ).ddl_if(dialect="sqlite"),
    # The expiry sweep of every instance reads the awaiting runs by the time they expire.
    Index(
        "ix_task_schedule_run_approval_expires_at",
        "approval_expires_at",
        postgresql_where=text("state = 'awaiting_approval'"),
        sqlite_where=text("state = 'awaiting_approval'"),
    ),
    # The runs that re-ran a run (`store.rollouts.retried_by`): only retries are indexed (migration 0035).
    # Every run was, with a NULL, twice a firing (its insert, and its completion, which is never HOT).
    Index(
        "ix_task_schedule_run_retries",
        "retry_of",
        postgresql_where=text("retry_of IS NOT NULL"),
        sqlite_where=text("retry_of IS NOT NULL"),
    ),
    # The rollout driver's scan: only rolling runs.
    Index(
        "ix_task_schedule_run_rolling",
        "id",
        postgresql_where=text("state = 'rolling'"),
        sqlite_where=text("state = 'rolling'"),
    ),
    # On PostgreSQL partitioned by week of the slot (migration 0046, store/run_partitions.py; the partitions,
    # each with its key on `id` and HISTORY_STORAGE, and the table of live runs are not metadata). The
    # parent has no key: one must hold `scheduled_for`, which a manual run has not.
    postgresql_partition_by="RANGE (scheduled_for)",
)

# Maintenance windows (migration 0011, docs/WINDOWS.md): either recurring (cron, duration, timezone) or one
# off (start_at, end_at); the racks and domains they cover are rows of the two tables below, so deleting a
# rack or domain removes it from its windows. `all_racks` is stored, not derived from those rows, so a
# window whose racks were all deleted covers nothing rather than everything.
maintenance_windows = Table(
    "maintenance_windows",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("reason", Text, nullable=False, server_default=""),
    Column("kind", String(8), nullable=False),
    Column("cron", String(256), nullable=True),
    Column("duration", String(64), nullable=True),
    Column("timezone", String(64), nullable=True),
    Column("start_at", UTCDateTime, nullable=True),
    Column("end_at", UTCDateTime, nullable=True),
    Column("all_racks", Boolean, nullable=False),
    Column("operations", json_type(), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint("kind IN ('allow', 'freeze')", name="kind"),
    CheckConstraint(
        "(cron IS NOT NULL AND duration IS NOT NULL AND timezone IS NOT NULL"
        " AND start_at IS NULL AND end_at IS NULL)"
        " OR (cron IS NULL AND duration IS NULL AND timezone IS NULL"
        " AND start_at IS NOT NULL AND end_at IS NOT NULL AND end_at > start_at)",
        name="when",
    ),
)

maintenance_window_racks = Table(
    "maintenance_window_racks",
    metadata,
    Column("window_id", Uuid, ForeignKey("maintenance_windows.id", ondelete="CASCADE"), primary_key=True),
    Column("rack_id", Uuid, ForeignKey("racks.id", ondelete="CASCADE"), primary_key=True, index=True),
)

maintenance_window_domains = Table(
    "maintenance_window_domains",
    metadata,
    Column("window_id", Uuid, ForeignKey("maintenance_windows.id", ondelete="CASCADE"), primary_key=True),
    Column("domain_id", Uuid, ForeignKey("nvl_domains.id", ondelete="CASCADE"), primary_key=True, index=True),
)

# The tasks a window's change still owes a decision (migration 0048, `rackflow.tasks.deferrals`): those it
# skipped because a claim held their rows, written in the change's transaction and deleted by the
# transaction that decides them (the change's instance once the claim committed, or any executor's look
# again should it not). No foreign key: its check would lock the task's row, which that claim holds.
window_decisions_owed = Table(
    "window_decisions_owed",
    metadata,
    Column("task_id", Uuid, primary_key=True),
    Column("owed_since", UTCDateTime, nullable=False),
    # What made it owed (migration 0050; NULL: written by a release before it): `store.decisions_owed`.
    Column("cause", json_type(), nullable=True),
)

# Fleet-wide operation budgets (migration 0013): the executor starts no task of `operations` that would
# make more than `max_running` of them run at once (rackflow/budgets/gate.py).
operation_budgets = Table(
    "operation_budgets",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("operations", json_type(), nullable=False),
    Column("max_running", Integer, nullable=False),
    Column("max_running_per_domain", Integer, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    CheckConstraint("max_running >= 1", name="max_running"),
    CheckConstraint(
        "max_running_per_domain IS NULL OR max_running_per_domain >= 1", name="max_running_per_domain"
    ),
)

# Pre-flight checks (migration 0016; rackflow/checks/): what must hold on a rack before a task of
# `operations` starts there. `rack_ids` and `domain_ids` (JSON lists) name what it covers; `all_racks` when
# it named neither. `settings` holds the kind's own (docs/CHECKS.md).
preflight_checks = Table(
    "preflight_checks",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("kind", String(16), nullable=False),
    Column("operations", json_type(), nullable=False),
    Column("all_racks", Boolean, nullable=False),
    Column("rack_ids", json_type(), nullable=False),
    Column("domain_ids", json_type(), nullable=False),
    Column("settings", json_type(), nullable=False),
    Column("interval", String(64), nullable=False),
    Column("max_wait", String(64), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
)

# A task the pre-flight gate has held: rounds of checks done, when the next is due (NULL: now), the lease
# of the checker doing one (`checking_until`), and an operator's override of its checks.
# The five tables whose rows belong to a task: each carries its task's filing time, on PostgreSQL its
# partition key (migration 0062, `store.task_partitions`: each week's partition references the tasks' week,
# and the partition before the weeks the tasks' before them; the partitions are not metadata). SQLite keeps
# the key to `tasks` on the table.


def _task_filed_at() -> Column[datetime]:
    return Column("task_filed_at", UTCDateTime, nullable=False, server_default=text(LONG_AGO_LITERAL))


def _task_key() -> ForeignKeyConstraint:
    return ForeignKeyConstraint(["task_id"], ["tasks.id"], ondelete="CASCADE").ddl_if(dialect="sqlite")


preflight_tasks = Table(
    "preflight_tasks",
    metadata,
    Column("task_id", Uuid, primary_key=True),
    _task_filed_at(),
    _task_key(),
    Column("attempt", Integer, nullable=False),
    Column("next_check_at", UTCDateTime, nullable=True),
    Column("checking_until", UTCDateTime, nullable=True),
    Column("override_reason", Text, nullable=True),
    Column("overridden_at", UTCDateTime, nullable=True),
    postgresql_partition_by="RANGE (task_filed_at)",
)

# What each round of a task's checks found, by check (its name kept: the check may be deleted since).
preflight_results = Table(
    "preflight_results",
    metadata,
    Column("task_id", Uuid, primary_key=True),
    _task_filed_at(),
    _task_key(),
    Column("check_id", Uuid, primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("check_name", String(255), nullable=False),
    Column("passed", Boolean, nullable=False),
    Column("reason", Text, nullable=False),
    Column("checked_at", UTCDateTime, nullable=False),
    Column("recheck_at", UTCDateTime, nullable=False),
    postgresql_partition_by="RANGE (task_filed_at)",
)

# Every ended attempt of a task with retries (migration 0020, docs/SAFETY.md): when it ran, how it ended,
# and whether its failure was retryable. Goes with its task.
task_attempt = Table(
    "task_attempt",
    metadata,
    Column("task_id", Uuid, primary_key=True),
    _task_filed_at(),
    _task_key(),
    Column("attempt", Integer, primary_key=True),
    Column("started_at", UTCDateTime, nullable=True),
    Column("finished_at", UTCDateTime, nullable=False),
    Column("status", String(16), nullable=False),
    Column("message", Text, nullable=False, server_default=""),
    Column("retryable", Boolean, nullable=False, server_default=text("false")),
    postgresql_partition_by="RANGE (task_filed_at)",
)

# What a step recorded before it acted, for a run that takes its task over to read back (migration 0043,
# `tasks.backends.base.StepState`: a redfish restart's power and LastResetTime before the Reset was sent).
# One per component and attempt: a takeover repeats the attempt's steps, a retry's next attempt starts anew.
# Goes with its task.
task_step_state = Table(
    "task_step_state",
    metadata,
    Column("task_id", Uuid, primary_key=True),
    _task_filed_at(),
    _task_key(),
    Column("attempt", Integer, primary_key=True),
    Column("component_id", Uuid, primary_key=True),
    Column("recorded", json_type(), nullable=False),
    postgresql_partition_by="RANGE (task_filed_at)",
)

# One check an operator overrode for one task (the override of all its checks is on `preflight_tasks`;
# migration 0021):
# the gate counts it as passed for that task, and the checker no longer asks it.
preflight_overrides = Table(
    "preflight_overrides",
    metadata,
    Column("task_id", Uuid, primary_key=True),
    _task_filed_at(),
    _task_key(),
    Column("check_id", Uuid, primary_key=True),
    Column("reason", Text, nullable=False),
    Column("overridden_at", UTCDateTime, nullable=False),
    postgresql_partition_by="RANGE (task_filed_at)",
)

# Who changed what, when, with what outcome: one row per action, written after it (rackflow/audit/trail.py).
# On PostgreSQL partitioned by week of `at` (migration 0028, store/audit_partitions.py; the partitions are not
# metadata), so its key holds `at`, as PostgreSQL requires; (id, at) still writes a replayed event once, as a
# replay keeps its `at`. SQLite's table is not partitioned and keeps its key on `id` alone (Alembic does not
# compare keys).
audit_events = Table(
    "audit_events",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("at", UTCDateTime, primary_key=True),
    Column("principal", String(255), nullable=False),
    Column("method", String(64), nullable=False),
    Column("target_ids", json_type(), nullable=False),
    Column("outcome", String(32), nullable=False),
    Column("error", Text, nullable=False, server_default=""),
    Column("request", json_type(), nullable=False),
    Column("schedule_before", json_type(), nullable=True),
    Column("schedule_after", json_type(), nullable=True),
    # What the action changed that its request does not name (migration 0041, rackflow/audit/changes.py).
    Column("changes", json_type(), nullable=True),
    Index("ix_audit_events_at_id", "at", "id"),
    # The trail filtered by principal or by method, newest first (migration 0022).
    Index("ix_audit_events_principal_at_id", "principal", "at", "id"),
    Index("ix_audit_events_method_at_id", "method", "at", "id"),
    # The trail by target, "what happened to this rack / schedule / task" (`target_ids @> '["id"]'`,
    # migration 0044). PostgreSQL only: SQLite has no index over a JSON array's items, and its list by
    # target walks a bounded range of the trail instead (store/audit.py `list_events`).
    Index(
        "ix_audit_events_target_ids",
        "target_ids",
        postgresql_using="gin",
        postgresql_ops={"target_ids": "jsonb_path_ops"},
    ).ddl_if(dialect="postgresql"),
    postgresql_partition_by="RANGE (at)",
)

# Notifications (migration 0015, docs/NOTIFICATIONS.md). The outbox: one row per event, written in the
# transaction of the change it reports (store/outbox.py). No foreign keys: an event outlives the schedule,
# run, rack or task it names, whose names it keeps. `fanned_out` turns true once the delivery loop has made
# its deliveries (one per matching channel).
notification_event = Table(
    "notification_event",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("type", String(64), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("summary", Text, nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("schedule_id", Uuid, nullable=True),
    Column("schedule_name", String(255), nullable=False, server_default=""),
    Column("run_id", Uuid, nullable=True),
    Column("rack_id", Uuid, nullable=True),
    Column("rack_name", String(255), nullable=False, server_default=""),
    Column("task_id", Uuid, nullable=True),
    Column("operation", String(32), nullable=False, server_default=""),
    Column("principal", String(255), nullable=False),
    Column("payload", json_type(), nullable=False),
    Column("fanned_out", Boolean, nullable=False, server_default=text("false")),
    # An event a loop finds (a task held too long) is keyed by what it reports, so instances that find the
    # same thing write it once; `cleared_at` once its condition's clearing is written (migration 0017).
    Column("dedupe_key", String(255), nullable=True),
    Column("cleared_at", UTCDateTime, nullable=True),
    CheckConstraint("severity IN ('info', 'warning', 'critical')", name="severity"),
    # The fan-out's scan: only events not fanned out yet are indexed.
    Index(
        "ix_notification_event_new",
        "at",
        postgresql_where=text("fanned_out IS false"),
        sqlite_where=text("fanned_out IS 0"),
    ),
    Index("ix_notification_event_at_id", "at", "id"),
    Index("uq_notification_event_dedupe_key", "dedupe_key", unique=True),
    # The raises the look for Alertmanager re-sends and the retention's prune ask about (`outbox._open`):
    # those of a condition's types not marked cleared, a range of this index, where the look read every
    # event of the retention's week (migration 0054).
    Index("ix_notification_event_type_cleared_at", "type", "cleared_at"),
    # The conditions still open (a clearing to write when they end): few rows.
    Index(
        "ix_notification_event_open",
        "type",
        postgresql_where=text("dedupe_key IS NOT NULL AND cleared_at IS NULL"),
        sqlite_where=text("dedupe_key IS NOT NULL AND cleared_at IS NULL"),
    ),
)

# Where events go: a webhook, a Slack incoming webhook or an Alertmanager, and what it subscribes to (empty
# lists: everything). `secret` is a webhook's HMAC key, never returned by the API.
notification_channel = Table(
    "notification_channel",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column("name", String(255), nullable=False, unique=True),
    Column("kind", String(16), nullable=False),
    Column("url", String(2048), nullable=False),
    Column("secret", Text, nullable=False, server_default=""),
    Column("enabled", Boolean, nullable=False, server_default=text("true")),
    Column("event_types", json_type(), nullable=False),
    Column("schedules", json_type(), nullable=False),
    Column("operations", json_type(), nullable=False),
    Column("min_severity", String(16), nullable=False),
    Column("rate_per_minute", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    # The channel's token bucket, shared by every instance's claims (NULL: full; migration 0017).
    Column("rate_tokens", Float, nullable=True),
    Column("rate_at", UTCDateTime, nullable=True),
    CheckConstraint("kind IN ('webhook', 'slack', 'alertmanager')", name="kind"),
    CheckConstraint("rate_per_minute >= 1", name="rate_per_minute"),
    CheckConstraint("max_attempts >= 1", name="max_attempts"),
)

# One event to one channel: "pending" until it is delivered, or "dead" after the channel's max_attempts. A
# claim counts the attempt and the claim and moves next_attempt_at past the send's lease, so no other
# instance sends it meanwhile; the result is written only while that claim is still the row's (the fence).
# `claims` counts every claim ever made and is never reset, unlike `attempts`, which a redelivery counts
# from zero again (migration 0040): a claim number is never given twice, an attempt number may be.
notification_delivery = Table(
    "notification_delivery",
    metadata,
    Column("id", Uuid, primary_key=True),
    Column(
        "event_id", Uuid, ForeignKey("notification_event.id", ondelete="CASCADE"), nullable=False, index=True
    ),
    Column("channel_id", Uuid, ForeignKey("notification_channel.id", ondelete="CASCADE"), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    # Pending: when it is tried next. Delivered, to an Alertmanager, of a condition still open: when its alert
    # is sent again (`outbox.claim_resends`).
    Column("next_attempt_at", UTCDateTime, nullable=False),
    Column("last_error", Text, nullable=False, server_default=""),
    Column("delivered_at", UTCDateTime, nullable=True),
    Column("created_at", UTCDateTime, nullable=False),
    Column("claims", Integer, nullable=False, server_default="0"),
    CheckConstraint("state IN ('pending', 'delivered', 'dead')", name="state"),
    UniqueConstraint("event_id", "channel_id"),
    # The claim's scan: a channel's pending deliveries in the order they are due.
    Index(
        "ix_notification_delivery_due",
        "channel_id",
        "next_attempt_at",
        postgresql_where=text("state = 'pending'"),
        sqlite_where=text("state = 'pending'"),
    ),
    Index("ix_notification_delivery_state_created_at", "state", "created_at"),
    # A channel's deliveries by when they went through: the clearings the look for re-sends owes one more
    # resolved alert are among the last few intervals' (`outbox._resendable`; migration 0054).
    Index("ix_notification_delivery_channel_id_delivered_at", "channel_id", "delivered_at"),
)
