"""Inventory values: racks, components, NVLink domains, and the target specs that select them; and the name
search's rule for a short text, which the schedules' name search shares."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from rackflow.config import SHORT_SEARCH_TEXT
from rackflow.frozen import quick_init


class ComponentType(enum.StrEnum):
    UNKNOWN = "UNKNOWN"
    COMPUTE = "COMPUTE"
    NVSWITCH = "NVSWITCH"
    POWERSHELF = "POWERSHELF"
    TORSWITCH = "TORSWITCH"
    UMS = "UMS"
    CDU = "CDU"


class PowerState(enum.StrEnum):
    ON = "on"
    OFF = "off"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Bmc:
    """Where a component's BMC answers (Redfish), and a reference to its credentials, never the secret.

    `resource` is the Redfish resource that is this component, relative to the service root
    (`Systems/1`, `Chassis/PS0`, `Managers/BMC`; a bare id means `Systems/<id>`). `credentials` is
    `env:NAME` or `file:/path`, whose value `user:password` is read each time it is used.
    """

    url: str
    resource: str
    credentials: str


@quick_init
@dataclass(frozen=True)
class Component:
    id: uuid.UUID
    rack_id: uuid.UUID
    type: ComponentType
    name: str
    external_id: str
    firmware_version: str
    power_state: PowerState
    bmc: Bmc | None = None


@dataclass(frozen=True)
class Rack:
    id: uuid.UUID
    name: str
    external_id: str
    nvl_domain_id: uuid.UUID | None
    created_at: datetime
    components: tuple[Component, ...] = ()


@dataclass(frozen=True)
class NVLDomain:
    id: uuid.UUID
    name: str
    rack_ids: tuple[uuid.UUID, ...]
    created_at: datetime  # the list's order, with the id (`store.inventory.DOMAIN_ORDER`)


class ListedDomain(NamedTuple):
    """An NVLink domain as ListNVLDomains answers it: its id and its racks' (oldest first) as the text they
    are sent as, read so from the database, as `ListedScope` is. A fleet of NVL72 racks has a domain a
    rack: its list of 20,000 made a `uuid.UUID` of each of 60,000 ids, an `NVLDomain` of each domain and
    `str()` of every id again (docs/PERFORMANCE.md, "Every NVLink domain at once"). A named tuple, the
    cheapest to make."""

    id: str
    name: str
    rack_ids: Sequence[str]
    # The list's order, with the id; read for a page of a limit, whose last domain's is the next page's
    # key (`store.inventory.list_domains`), else None: a list of no limit has no next page.
    created_at: datetime | None


@dataclass(frozen=True)
class ComponentSpec:
    """A component to create."""

    type: ComponentType
    name: str
    external_id: str = ""
    firmware_version: str = ""
    bmc: Bmc | None = None


# --- target specs, as a client states them -------------------------------------------------------


@dataclass(frozen=True)
class RackTarget:
    """Exactly one of id, name, external_id is set. Empty component_types means all components."""

    id: uuid.UUID | None = None
    name: str | None = None
    external_id: str | None = None
    component_types: tuple[ComponentType, ...] = ()


@dataclass(frozen=True)
class ComponentTarget:
    """Exactly one of id or (external_type, external_id) is set."""

    id: uuid.UUID | None = None
    external_type: ComponentType | None = None
    external_id: str | None = None


@dataclass(frozen=True)
class NVLDomainTarget:
    id: uuid.UUID | None = None
    name: str | None = None
    component_types: tuple[ComponentType, ...] = ()


@dataclass(frozen=True)
class TargetSpec:
    """One kind of target list, as in the proto's `OperationTargetSpec` oneof."""

    racks: tuple[RackTarget, ...] = ()
    components: tuple[ComponentTarget, ...] = ()
    nvl_domains: tuple[NVLDomainTarget, ...] = ()


# --- resolved targets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TypesFilter:
    """Only components of these types."""

    types: frozenset[ComponentType]

    def to_json(self) -> dict[str, object]:
        return {"kind": "types", "types": sorted(t.value for t in self.types)}


@dataclass(frozen=True)
class ComponentsFilter:
    """Only these components (by id)."""

    ids: frozenset[uuid.UUID]

    def to_json(self) -> dict[str, object]:
        return {"kind": "components", "components": sorted(str(i) for i in self.ids)}


ComponentFilter = TypesFilter | ComponentsFilter


def filter_from_json(data: dict[str, object] | None) -> ComponentFilter | None:
    """Inverse of `to_json`; `None` means all components."""
    if data is None:
        return None
    if data.get("kind") == "types":
        return TypesFilter(frozenset(ComponentType(t) for t in data["types"]))  # type: ignore[attr-defined]
    if data.get("kind") == "components":
        return ComponentsFilter(frozenset(uuid.UUID(i) for i in data["components"]))  # type: ignore[attr-defined]
    raise ValueError(f"unknown component filter {data!r}")


@quick_init
@dataclass(frozen=True)
class RackSelection:
    """A rack and which of its components a target selects (`filter=None`: all of them)."""

    rack_id: uuid.UUID
    filter: ComponentFilter | None = field(default=None)


def short_search(name_contains: str) -> bool:
    """A name search (of schedules, racks or NVLink domains) that no index answers: the text holds no
    trigram (config.SHORT_SEARCH_TEXT). Each of its pages walks a bounded part of the list and may come
    back short, even empty, before the list's end."""
    return 0 < len(name_contains) < SHORT_SEARCH_TEXT
