"""Paging of the list commands: `--limit`, `--offset` and `--page-token`, the table's title, and the line
that says how to ask for the next page.

A page token continues a list exactly where the last page ended (the server seeks its index; docs/API.md),
so a script paging through ten million tasks neither skips nor repeats rows while new ones arrive, and no
page costs more than the first. `--offset` stays for a quick look a few pages in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

import click
from google.protobuf.message import Message
from rich.console import RenderableType

from rackflow.api.convert import MAX_PAGE_SIZE
from rackflow.cli.output import Session
from rackflow.words import noun_for

F = TypeVar("F", bound=Callable[..., object])
_M = TypeVar("_M", bound=Message)


class Page(Protocol):
    """What every paged List RPC answers besides its rows."""

    total: int
    total_capped: bool
    next_page_token: str


def name_filter(noun: str) -> Callable[[F], F]:
    """`--name-contains TEXT`, the RPCs' `name_contains` (names holding TEXT, any case), for a list of
    `noun`s, given to the command as `name_contains`; `--search`, the name `schedule list` gave the same
    filter before, is taken as its hidden alias, so scripts written with it go on working. One name on
    every list (and in the RPCs and the JSON API), where two had read as two different filters."""

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def with_filter(*args: Any, name_contains: str, search: str | None, **kwargs: Any) -> object:
            if search is not None and name_contains and search != name_contains:
                raise click.UsageError("--search is the old name of --name-contains; give one")
            return command(*args, name_contains=name_contains or search or "", **kwargs)

        hidden = click.option("--search", default=None, hidden=True, help="The old name of --name-contains.")
        shown = click.option(
            "--name-contains",
            default="",
            metavar="TEXT",
            help=f"Only {noun} whose name holds TEXT, any case.",
        )
        return cast(F, shown(hidden(with_filter)))

    return decorate


def page_options(*, limit: int, noun: str, order: str) -> Callable[[F], F]:
    """`--limit` (default `limit`; 0 = all), `--offset` and `--page-token` for a list of `noun`s in
    `order` (e.g. "newest first")."""

    def decorate(command: F) -> F:
        for option in reversed(
            (
                click.option(
                    "--limit",
                    default=limit,
                    show_default=bool(limit),
                    help=f"At most this many {noun}, {order} (0 = all).",
                ),
                click.option("--offset", default=0, help="Skip this many (not with --page-token)."),
                click.option(
                    "--page-token",
                    default="",
                    metavar="TOKEN",
                    help="Continue where the previous page ended (the token its output names).",
                ),
            )
        ):
            command = option(command)
        return command

    return decorate


def page_title(shown: int, page: Page, noun: str, plural: str = "") -> str:
    """`50 of 10,000+ tasks`, `1 of 1 task`: the total is counted up to the server's cap, and the noun
    agrees with it (`noun_for`; a capped total is many)."""
    capped = "+" if page.total_capped else ""
    return f"{shown} of {page.total}{capped} {noun_for(2 if capped else page.total, noun, plural)}"


def emit_page(session: Session, found: Message, view: Callable[[], RenderableType]) -> None:
    """Print a List RPC's answer as `session.emit` does; for people, then say how to get the next page (on
    stderr, so a pipe reading the table sees only the table; JSON and YAML carry `next_page_token`)."""
    session.emit(found, view)
    token = cast(Page, found).next_page_token
    if session.for_people and token:
        click.echo(f"More: add --page-token {token}", err=True)


def every_page(session: Session, page: Callable[[int, str], _M], rows: str, what: str) -> _M:
    """Every row of a list (`--limit 0`), asked for a page of MAX_PAGE_SIZE at a time after the last page's
    token, on a progress bar: the whole list in one answer may pass gRPC's message limit (20,000 racks of
    36 components each are 100 MB), where a page costs the same at any depth. The answer holds every page's
    rows (the field `rows`), the first page's total, and no token. A server of a release before a list's
    pages answers it whole, with no token: one call, as before."""
    found = page(MAX_PAGE_SIZE, "")
    listed = cast(Page, found)
    with session.progress(what, None if listed.total_capped else listed.total) as advance:
        advance(len(getattr(found, rows)))
        token = listed.next_page_token
        while token:
            answer = page(MAX_PAGE_SIZE, token)
            getattr(found, rows).extend(getattr(answer, rows))
            advance(len(getattr(answer, rows)))
            token = cast(Page, answer).next_page_token
    listed.next_page_token = ""
    return found


def searched_on(session: Session, page: Callable[..., _M], limit: int, token: str, rows: str) -> _M:
    """The pages of a list whose each page walks a bounded part of it (a short schedule or rack name
    search; the audit trail by target on SQLite), asked for one after another until `limit` rows (the
    answer's field `rows`) are found (0: every one) or the list ends: a page may find few or none, so one
    page short of `limit` says nothing of the rest. For people, each page that searches on is said on
    stderr. The answer holds every page's rows, the first page's total (of the first walk: capped), or how
    many were found if more, and the last page's token. A list an index answers comes back in one page, as
    asked."""
    found: _M | None = None
    pages = 0
    while True:
        have = 0 if found is None else len(getattr(found, rows))
        wanted = min(limit - have, MAX_PAGE_SIZE) if limit else MAX_PAGE_SIZE
        answer = page(wanted, token) if found is None else page(wanted, token, offset=0)  # then the token
        pages += 1
        if found is None:
            found = answer
        else:
            getattr(found, rows).extend(getattr(answer, rows))
        listed, have = cast(Page, found), len(getattr(found, rows))
        listed.total = max(listed.total, have)  # a lower bound, and at least the found
        listed.next_page_token = token = cast(Page, answer).next_page_token
        if not token or (limit and have >= limit):
            return found
        if session.for_people:
            click.echo(f"searching on: {have} found in {pages} pages so far…", err=True)
