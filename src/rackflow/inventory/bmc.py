"""A component's BMC endpoint: what the inventory accepts, and where it points.

Checked as it enters the inventory (the API converters at the door, the inventory service for every
caller), so a bad endpoint, or a password where a credentials reference belongs, is refused before anything
is stored. The database holds only the reference (`env:NAME` or `file:/path`); the Redfish backend reads
the secret at use (`tasks.backends.redfish.endpoint`), and splits the endpoint with `target_of`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from rackflow.domain.inventory import Bmc
from rackflow.errors import InvalidArgument

DEFAULT_ROOT = "/redfish/v1/"
RESOURCE_COLLECTIONS = ("Systems", "Chassis", "Managers")
# The widths of the components.bmc_* columns.
MAX_LENGTHS = {"url": 1024, "resource": 255, "credentials": 1024}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESOURCE_ID = re.compile(r"[A-Za-z0-9._:@~-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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


def check_bmc(bmc: Bmc, field_name: str) -> Bmc:
    """The endpoint when it is usable; otherwise InvalidArgument naming the field and the bad value."""
    try:
        return _checked(bmc, field_name)
    except ValueError as exc:  # urlsplit's own refusals, e.g. "Invalid IPv6 URL" for "https://[::1"
        raise InvalidArgument(f"{field_name}.url: cannot parse {bmc.url!r}: {exc}") from None


def _checked(bmc: Bmc, field_name: str) -> Bmc:
    for name, limit in MAX_LENGTHS.items():
        value = getattr(bmc, name)
        if _CONTROL.search(value):
            raise InvalidArgument(f"{field_name}.{name}: must not contain control characters")
        if len(value) > limit:
            raise InvalidArgument(f"{field_name}.{name}: at most {limit} characters, got {len(value)}")
    target_of(bmc, field_name)
    check_credentials_ref(bmc.credentials, f"{field_name}.credentials")
    return bmc


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
    if len(parts) == 1:
        parts = ["Systems", *parts]
    if len(parts) != 2 or parts[0] not in RESOURCE_COLLECTIONS or not _RESOURCE_ID.fullmatch(parts[1]):
        raise InvalidArgument(
            f"{field_name}: expected Systems/<id>, Chassis/<id>, Managers/<id> or a bare system id, "
            f"got {resource!r}"
        )
    return parts[0], parts[1]


def check_credentials_ref(ref: str, field_name: str) -> None:
    """`env:NAME` or `file:/absolute/path`; anything else (a password, say) is refused, not stored."""
    scheme, sep, rest = ref.partition(":")
    if sep and scheme == "env" and _ENV_NAME.fullmatch(rest):
        return
    if sep and scheme == "file" and rest.startswith("/"):
        return
    # The value may be a secret typed in the wrong place: name the rule, not the value.
    raise InvalidArgument(
        f"{field_name}: expected env:NAME or file:/absolute/path (a reference, never the password itself)"
    )
