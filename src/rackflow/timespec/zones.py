"""Schedule time zones, resolved from the `tzdata` package only.

Why not plain `zoneinfo.ZoneInfo(name)`: it reads the operating system's database first, so the same
schedule could fire at different instants on two hosts with different tz releases, a name valid on one
host could be rejected on another, and `Local`-like files (`localtime`) exist only on some. It also treats
the name as a path: `../etc/passwd` or an absolute path raises ValueError or probes the file system.
Here a name is first looked up in the list of keys that `tzdata` ships (which includes the backward-
compatible aliases such as `EST`, `US/Eastern`, `Japan`); only a listed key is then loaded, from the
package's own files. Every rackflow instance therefore agrees on every zone, whatever the host has.
(A zone loaded from a file cannot be pickled; nothing in rackflow needs that.)

`""` means UTC. `Local` is rejected on purpose: a schedule must not depend on the server's zone.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from typing import Final
from zoneinfo import ZoneInfo

_quote = functools.partial(json.dumps, ensure_ascii=False)

_UTC_KEY: Final = "UTC"


def resolve_zone(name: str) -> ZoneInfo:
    """The tz database zone `name` (`""` means UTC), or ValueError naming it if it does not resolve."""
    key = name or _UTC_KEY
    if key == "Local":
        raise ValueError(f"invalid time zone {_quote(name)}: Local is the server's zone; name an IANA zone")
    if key not in _known_keys():
        raise ValueError(f"invalid time zone {_quote(name)}: not in the IANA tz database (e.g. Europe/Paris)")
    return _load(key)


@functools.cache
def _known_keys() -> frozenset[str]:
    """Every key `tzdata` ships, from its own index file."""
    return frozenset(importlib.resources.files("tzdata").joinpath("zones").read_text("utf-8").split())


@functools.cache
def _load(key: str) -> ZoneInfo:
    """Load a listed key from the package (cached: one ZoneInfo per name, so datetimes compare cheaply)."""
    *folders, leaf = key.split("/")
    package = ".".join(["tzdata.zoneinfo", *folders])
    with importlib.resources.files(package).joinpath(leaf).open("rb") as data:
        return ZoneInfo.from_file(data, key=key)
