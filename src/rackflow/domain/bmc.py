"""Where a component's BMC endpoint points: the service root and resource a Redfish call acts on, split the
way sushy wants it, and the one text (`Target.resource_key`) for every spelling of that machine.

Pure rules of the `Bmc` value, below the store: the inventory checks an endpoint with them as it enters
(`inventory.bmc.check_bmc`), the store keys each component by its resource (`components.bmc_resource_key`,
unique: two components never act on one machine), and the Redfish backend connects with them.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import urlsplit

from rackflow.domain.inventory import Bmc
from rackflow.errors import InvalidArgument

DEFAULT_ROOT = "/redfish/v1/"
RESOURCE_COLLECTIONS = ("Systems", "Chassis", "Managers")
DEFAULT_PORTS = {"http": 80, "https": 443}
_RESOURCE_ID = re.compile(r"[A-Za-z0-9._:@~-]+")


@dataclass(frozen=True)
class Target:
    """Where to connect and which resource to act on, split the way sushy wants it."""

    base_url: str  # scheme://host[:port]
    root_prefix: str  # /redfish/v1/
    collection: str  # Systems, Chassis or Managers
    identity: str

    @property
    def path(self) -> str:
        """The resource's @odata.id, e.g. /redfish/v1/Systems/1."""
        return f"{self.root_prefix}{self.collection}/{self.identity}"

    def describe(self) -> str:
        return f"{self.base_url}{self.path}"

    @property
    def resource_key(self) -> str:
        """The machine this target acts on, one text for every spelling of it: the host in lower case (an
        IPv6 address compressed and bracketed, a fully qualified name without its final dot), the port (the
        scheme's default when none is written: `https://bmc` is `bmc:443`, as is `http://bmc:443`) and the
        resource's path (the service root with one trailing slash, a bare id as `Systems/<id>`). Two
        components with one key would act on one machine. A port out of range raises urlsplit's ValueError.

        Stored in `components.bmc_resource_key` (`stored_resource_key`, migration 0039): a change to this
        text needs a migration that computes the stored keys again.
        """
        parts = urlsplit(self.base_url)
        host = (parts.hostname or "").rstrip(".")
        with suppress(ValueError):
            address = ipaddress.ip_address(host)
            host = f"[{address.compressed}]" if address.version == 6 else address.compressed
        port = DEFAULT_PORTS[parts.scheme] if parts.port is None else parts.port
        return f"{host}:{port}{self.path}"


def target_of(bmc: Bmc, field_name: str = "bmc") -> Target:
    """Split `bmc.url` and `bmc.resource` into a connection target."""
    url = bmc.url.strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(f"{field_name}.url: expected http(s)://HOST[:PORT][/redfish/v1], got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument(
            f"{field_name}.url: must not carry credentials; put a reference in {field_name}.credentials"
        )
    if parts.query or parts.fragment:
        raise InvalidArgument(f"{field_name}.url: must not have a query or fragment, got {url!r}")
    root = parts.path.rstrip("/") + "/" if parts.path.strip("/") else DEFAULT_ROOT
    collection, identity = _split_resource(bmc.resource, f"{field_name}.resource")
    return Target(f"{parts.scheme}://{parts.netloc}", root, collection, identity)


def _split_resource(resource: str, field_name: str) -> tuple[str, str]:
    parts = resource.strip().strip("/").split("/")
    if len(parts) == 1 and parts[0] in RESOURCE_COLLECTIONS:  # "Chassis/": the id forgotten, not an id
        raise InvalidArgument(
            f"{field_name}: {resource!r} names a collection, not a resource: expected {parts[0]}/<id>"
        )
    if len(parts) == 1:
        parts = ["Systems", *parts]
    if len(parts) != 2 or parts[0] not in RESOURCE_COLLECTIONS or not _RESOURCE_ID.fullmatch(parts[1]):
        raise InvalidArgument(
            f"{field_name}: expected Systems/<id>, Chassis/<id>, Managers/<id> or a bare system id, "
            f"got {resource!r}"
        )
    return parts[0], parts[1]


def stored_resource_key(bmc: Bmc) -> str:
    """What the store keeps of `bmc`'s resource key (`components.bmc_resource_key`, a unique index): its
    SHA-256 in hex, one width whatever the host's length, as PostgreSQL refuses an index entry over 2.7 kB."""
    return hashlib.sha256(target_of(bmc).resource_key.encode()).hexdigest()
