"""A component's BMC endpoint: what the inventory accepts, and where it points.

Checked as it enters the inventory (the API converters at the door, the inventory service for every
caller), so a bad endpoint, or a password where a credentials reference belongs, is refused before anything
is stored. The database holds only the reference (`env:NAME` or `file:/path`); the Redfish backend reads
the secret at use (`tasks.backends.redfish.endpoint`), and splits the endpoint with `domain.bmc.target_of`.
"""

from __future__ import annotations

import re

from rackflow.domain.bmc import target_of
from rackflow.domain.inventory import Bmc
from rackflow.errors import InvalidArgument

# The widths of the components.bmc_* columns.
MAX_LENGTHS = {"url": 1024, "resource": 255, "credentials": 1024}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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
    # Its resource key is read as a check: urlsplit parses the port only when asked, so an out-of-range one
    # ("https://bmc:99999") is refused here (its ValueError, in check_bmc) rather than stored.
    _ = target_of(bmc, field_name).resource_key
    check_credentials_ref(bmc.credentials, f"{field_name}.credentials")
    return bmc


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
