"""The task manager: turns operations into tasks, applies the conflict rules, queues and cancels."""

from __future__ import annotations

from rackflow.clock import Clock
from rackflow.store.db import Database


class TaskManager:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
