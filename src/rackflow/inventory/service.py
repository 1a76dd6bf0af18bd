"""Inventory use cases: each request is one transaction."""

from __future__ import annotations

from rackflow.clock import Clock
from rackflow.store.db import Database


class InventoryService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
