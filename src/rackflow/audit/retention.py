"""`--audit-retention`: every instance prunes the audit events older than the retention, at start-up and
then hourly (the loop is `rackflow.retention.Pruner`; the SQL `store.audit.prune_events`). On PostgreSQL
that drops the weeks' partitions all past the retention and makes the coming weeks' ones
(`store.audit_partitions`); on SQLite it deletes in batches."""

from __future__ import annotations

from datetime import timedelta

from rackflow import metrics
from rackflow.config import DEFAULT_PRUNE_INTERVAL
from rackflow.retention import Pruner
from rackflow.store import audit as store
from rackflow.store.db import Database
from rackflow.store.retention import PRUNE_CHUNK


class AuditPruner(Pruner):
    """Run with `run(stop)` beside the executor and the dispatcher."""

    def __init__(
        self,
        db: Database,
        retention: timedelta,
        *,
        every: timedelta = DEFAULT_PRUNE_INTERVAL,
        chunk: int = PRUNE_CHUNK,
    ) -> None:
        super().__init__(
            db,
            retention,
            name="audit",
            what="events",
            prune=store.prune_events,
            counter=metrics.AUDIT_EVENTS_PRUNED,
            every=every,
            chunk=chunk,
        )
