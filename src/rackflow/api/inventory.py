"""Inventory RPCs: racks, components and NVLink domains."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rackflow.services import Services


class InventoryRpcs:
    """The inventory part of the `Flow` servicer."""

    services: Services
