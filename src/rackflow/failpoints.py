"""Failpoints: named pauses that fault-injection tests switch on through the environment.

`RACKFLOW_FAILPOINT_<NAME>=<Go duration>` makes `await pause("<name>")` sleep that long, with a log line the
test waits for before it kills the process. Unset (always, in production), a failpoint costs one dict lookup.
"""

from __future__ import annotations

import asyncio
import logging
import os

from rackflow.timespec import parse_go_duration

log = logging.getLogger(__name__)


async def pause(name: str) -> None:
    value = os.environ.get(f"RACKFLOW_FAILPOINT_{name.upper()}")
    if not value:
        return
    seconds = parse_go_duration(value) / 1e9
    log.warning("failpoint %s: pausing for %ss", name, seconds)
    await asyncio.sleep(seconds)
