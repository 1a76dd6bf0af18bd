"""`rackflow audit`: who changed what, newest first."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import click
from rich.markup import escape

from rackflow.cli.output import Command, Listing, free_text, pass_session, table, utc_text, when
from rackflow.cli.paging import emit_page, page_options, page_title, searched_on
from rackflow.cli.targets import parse_seconds, parse_time
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


def audit_table(events: Sequence[pb.AuditEvent], title: str) -> Listing:
    result = table("TIME", "PRINCIPAL", "METHOD", "OUTCOME", "TARGETS", free_text("ERROR"), title=title)
    for e in events:
        outcome = e.outcome if e.outcome == "OK" else f"[red]{e.outcome}[/]"
        result.add_row(
            utc_text(when(e.at)), escape(e.principal), e.method, outcome, _targets_text(e), escape(e.error)
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
        session, found, lambda: audit_table(found.events, page_title(len(found.events), found, "events"))
    )
