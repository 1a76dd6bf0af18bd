"""Logging set-up for `rackflow serve`: one readable line per event, or JSON lines for machines."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

from rackflow.config import LogFormat
from rackflow.errors import Unavailable

# Fields a log call may attach with `extra={...}`; they are shown as key=value (text) or keys (JSON).
EVENT_FIELDS = (
    "schedule_id",
    "schedule_name",
    "trigger",
    "submitted",
    "skipped",
    "failed",
    "duration_s",
    "lag_s",
    "run_id",
    "firings",
    "task_id",
    "rack_id",
    "status",
    "instance_id",
    "claimed",
    "listen",
)


def _text(value: object) -> object:
    """A field as the text format shows it: a list (a batch's `firings`) as its items, comma-separated."""
    return ", ".join(map(str, value)) if isinstance(value, list) else value


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"
        # The record's own dict, not hasattr: a missing field would cost hasattr an AttributeError each,
        # and a busy server logs many lines a second (2 % of a draining dispatcher's time went there).
        fields = record.__dict__
        extras = " ".join(f"{k}={_text(fields[k])}" for k in EVENT_FIELDS if k in fields)
        line = f"{stamp} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if extras:
            line += f"  {extras}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = record.__dict__
        data.update({k: fields[k] for k in EVENT_FIELDS if k in fields})
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure(fmt: LogFormat, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if fmt is LogFormat.JSON else _TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Driver chatter is not an operator's event.
    for noisy in ("sqlalchemy", "aiosqlite", "alembic", "grpc"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def failed(log: logging.Logger, message: str, *args: object, then: str = "") -> None:
    """Report, from the `except Exception:` of work that is tried again later (a loop's poll, a task's run,
    a heartbeat), why it failed: an outage (`Unavailable`) as one WARNING line, `<message> (<reason>)<then>`,
    as the dispatcher's `dispatch poll failed (…); retrying`; anything else, a bug, at ERROR with its
    traceback. Through a database outage the executor logged an ERROR with an 80-line traceback at every
    poll (ten in five seconds), and one per task its run cut short, burying the log."""
    failure = sys.exc_info()[1]
    if isinstance(failure, Unavailable):
        log.warning(message + " (%s)" + then, *args, failure)
    else:
        log.exception(message + then, *args)
