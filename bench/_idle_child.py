"""`rackflow serve` with connection and statement counters by loop, for bench/idle_cost.py.

    python bench/_idle_child.py COUNTS_FILE SERVE_ARGS…

Counts every connection taken from the pool (`units`) and every statement sent, by the asyncio task that
did it (a loop `rackflow.server` started is named after it; an unnamed task is named by its coroutine), and
writes them to COUNTS_FILE as JSON when sent SIGUSR1. Nothing runs between two signals but the counters.
"""

from __future__ import annotations

import asyncio
import collections
import json
import signal
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

from rackflow.cli.main import main

counts: collections.Counter[str] = collections.Counter()


def who() -> str:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on the event loop's thread
        return threading.current_thread().name
    if task is None:
        return "(no task)"
    name = task.get_name()
    if name.startswith("Task-"):
        coro = task.get_coro()
        name = getattr(coro, "__qualname__", repr(coro))
    return name


def checkout(*_: object) -> None:
    counts[f"units|{who()}"] += 1


def statement(*_: object) -> None:
    counts[f"statements|{who()}"] += 1


def dump(path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"at": time.time(), "counts": dict(counts)}))
    tmp.replace(path)


if __name__ == "__main__":
    counts_path = Path(sys.argv[1])
    event.listen(Pool, "checkout", checkout)
    event.listen(Engine, "before_cursor_execute", statement)
    signal.signal(signal.SIGUSR1, lambda *_: dump(counts_path))
    main(args=["serve", *sys.argv[2:]], prog_name="rackflow")
