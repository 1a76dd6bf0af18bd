"""`rackflow audit`: who changed what, newest first."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import click
from rich.markup import escape

from rackflow.cli.output import Command, Listing, free_text, pass_session, table, utc_text, when
from rackflow.cli.paging import emit_page, page_options, page_title, searched_on
from rackflow.cli.targets import parse_seconds, parse_time
from rackflow.domain.audit import (
    EVENT_FOUND,
    NOT_RECORDED,
    REDECIDE_WINDOW_TASK,
    WINDOW_CREATED,
    WINDOW_DELETED,
    WINDOW_UPDATED,
    WINDOWS_CHANGED_BEFORE_SUBMIT,
)
from rackflow.v1 import flow_pb2 as pb


def parse_since(value: str, now: datetime) -> datetime:
    """An RFC 3339 time, or a duration back from now (`30m`, `24h`)."""
    try:
        return now - timedelta(seconds=parse_seconds(value))
    except ValueError:
        pass
    try:
        return parse_time(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither a duration like 30m or 24h nor an RFC 3339 time like 2026-06-01T04:00:00Z",
            param_hint="--since",
        ) from None


def _targets_text(event: pb.AuditEvent) -> str:
    ids = [i.id for i in event.target_ids]
    if len(ids) <= 1:
        return ids[0] if ids else "-"
    return f"{ids[0]} (+{len(ids) - 1})"


# A window's change that owed a decision, by what it did to the window (`owed_by.change`).
_WINDOW_CHANGED = {WINDOW_CREATED: "created", WINDOW_UPDATED: "updated", WINDOW_DELETED: "deleted"}


def _owed_by_text(owed_by: Mapping[str, Any]) -> str:
    """What made a decision rackflow took by itself owed (docs/SECURITY.md, `owed_by`), in one line: the
    window's change and its caller, or a firing's submit that found the windows changed since its plan, and
    when. The change's event id and the windows' ids are left to `-o json` (the table shows no event's id;
    the targets hold the windows)."""
    change = owed_by["change"]
    since = utc_text(parse_time(owed_by["owed_since"]))
    missing = "; its call's event was not in the trail" if owed_by.get(EVENT_FOUND) is False else ""
    if change in _WINDOW_CHANGED:
        by = f" by {owed_by['principal']}" if "principal" in owed_by else ""
        return f"owed by window {owed_by['window_name']!r} {_WINDOW_CHANGED[change]}{by} at {since}{missing}"
    if change == WINDOWS_CHANGED_BEFORE_SUBMIT:
        planned = utc_text(parse_time(owed_by["planned_at"]))
        return f"owed by windows changed between its firing's plan ({planned}) and submit ({since}){missing}"
    if change == NOT_RECORDED:
        return f"owed since {since} (its cause not recorded: an older release)"
    return f"owed by {change} at {since}{missing}"  # (a cause a newer server records)


def _detail(event: pb.AuditEvent) -> str:
    """The error of a refused call; for a decision rackflow took by itself that a window's change owed,
    what owed it (`_owed_by_text`); else why the call was made, as its request says (`_why`)."""
    if event.error or not event.request_json:
        return event.error
    request = json.loads(event.request_json)
    if not isinstance(request, dict):
        return ""
    if event.method == REDECIDE_WINDOW_TASK:
        owed_by = request.get("owed_by")
        return _owed_by_text(owed_by) if isinstance(owed_by, dict) else ""
    return _why(request)


def _why(request: dict[str, Any]) -> str:
    """Why a call was made, when its request says: a pause's reason (rackflow's own names the failing runs
    or the halt), a rejection's or an approval's comment, an expiry's reason; rackflow's resume at a
    pause's end, whose pause that was and why. "" for a request that says nothing of why."""
    ended = request.get("pause_ended")
    if isinstance(ended, dict):
        by = ended.get("by") or "an anonymous caller"
        reason = ended.get("reason") or ""
        return f"ended the pause by {by} at its end" + (f": {reason}" if reason else "")
    for key in ("reason", "comment"):
        if isinstance(said := request.get(key), str) and said:
            return said
    return ""


def audit_table(events: Sequence[pb.AuditEvent], title: str) -> Listing:
    result = table("TIME", "PRINCIPAL", "METHOD", "OUTCOME", "TARGETS", free_text("DETAIL"), title=title)
    for e in events:
        outcome = e.outcome if e.outcome == "OK" else f"[red]{e.outcome}[/]"
        result.add_row(
            utc_text(when(e.at)), escape(e.principal), e.method, outcome, _targets_text(e), escape(_detail(e))
        )
    return result


@click.command(cls=Command)
@click.option(
    "--since",
    default=None,
    metavar="TIME",
    help="Only events at or after TIME: RFC 3339, or a duration back from now (24h).",
)
@click.option("--method", default="", metavar="RPC", help="Only this RPC, e.g. DeleteRack.")
@click.option("--principal", default="", metavar="NAME", help="Only this caller (token name or cert CN).")
@click.option(
    "--target",
    default="",
    metavar="NAME_OR_ID",
    help="Only the events naming this: what happened to a rack, schedule, task or run (by id), or to the "
    "rack, schedule, window, domain, budget, check or channel of that name.",
)
@page_options(limit=50, noun="events", order="newest first")
@click.pass_context
def audit(
    ctx: click.Context,
    since: str | None,
    method: str,
    principal: str,
    target: str,
    limit: int,
    offset: int,
    page_token: str,
) -> None:
    """The audit trail of changes: who called which mutating RPC, on what, when, and how it ended.

    \b
    Example:
      rackflow audit --since 24h --method DeleteTaskSchedule
      rackflow audit --principal oncall -o json
      rackflow audit --target rack-07
      rackflow audit --target nightly-reset
      rackflow audit --target 0193a5c2-7f1e-7c3a-9d4b-2f6e8a1b3c5d
    """
    session = pass_session(ctx)
    target_id = session.client.resolve_target_id(target) if target else ""
    after = parse_since(since, session.clock.now()) if since else None

    def page(limit: int, page_token: str, offset: int = offset) -> pb.ListAuditEventsResponse:
        return session.client.list_audit_events(
            since=after,
            method=method,
            principal=principal,
            target=target_id,
            offset=offset,
            limit=limit,
            page_token=page_token,
        )

    # By target, a page on SQLite walks a bounded part of the trail: asked on until --limit events.
    found = searched_on(session, page, limit, page_token, "events") if target else page(limit, page_token)
    emit_page(
        session, found, lambda: audit_table(found.events, page_title(len(found.events), found, "event"))
    )
