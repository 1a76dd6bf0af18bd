"""`rackflow budget …`: fleet-wide operation budgets (docs/ROLLOUTS.md, "Budgets")."""

from __future__ import annotations

from collections.abc import Sequence

import click
from google.protobuf.empty_pb2 import Empty
from rich.table import Table

from rackflow.cli.output import (
    Group,
    Listing,
    Session,
    details,
    free_text,
    operation_label,
    pass_session,
    table,
    utc_text,
    when,
)
from rackflow.client import OPERATION_RPCS
from rackflow.v1 import flow_pb2 as pb
from rackflow.words import counted

_OPERATIONS = click.Choice([operation_label(o) for o in OPERATION_RPCS])
_ref = click.argument("budget_ref", metavar="NAME_OR_ID")


@click.group(cls=Group)
def budget() -> None:
    """Operation budgets: at most so many tasks of some operations running at once across the fleet,
    whoever submitted them; the rest wait, PENDING, with a message naming the budget."""


def _per_domain(b: pb.OperationBudget) -> str:
    return str(b.max_running_per_domain) if b.HasField("max_running_per_domain") else "-"


def _running(b: pb.OperationBudget) -> str:
    """How full its caps are now: "3 of 8", and the fullest domain's "2 of 2" when it caps domains."""
    fleet = f"{b.running} of {b.max_running}"
    if not b.HasField("max_running_per_domain"):
        return fleet
    return f"{fleet}; {b.running_in_fullest_domain} of {b.max_running_per_domain} in the fullest domain"


def _ops(b: pb.OperationBudget) -> str:
    return ", ".join(operation_label(o) for o in b.operations)


def budgets_table(budgets: Sequence[pb.OperationBudget]) -> Listing:
    result = table(
        "NAME",
        free_text("OPERATIONS"),
        "MAX RUNNING",
        "PER DOMAIN",
        free_text("RUNNING NOW"),
        title=counted(len(budgets), "budget"),
    )
    for b in budgets:
        result.add_row(b.name, _ops(b), str(b.max_running), _per_domain(b), _running(b))
    return result


def budget_view(b: pb.OperationBudget) -> Table:
    return details(
        [
            ("name", b.name),
            ("id", b.id.id),
            ("operations", _ops(b)),
            ("max running", str(b.max_running)),
            ("per domain", _per_domain(b)),
            ("running now", _running(b)),
            ("created", utc_text(when(b.created_at))),
            ("updated", utc_text(when(b.updated_at))),
        ]
    )


def _show(session: Session, found: pb.OperationBudget) -> None:
    session.emit(found, lambda: budget_view(found))


@budget.command()
@click.argument("name")
@click.option(
    "--op",
    "operations",
    multiple=True,
    required=True,
    type=_OPERATIONS,
    help="An operation it counts (repeatable).",
)
@click.option("--max-running", type=int, required=True, help="At most this many running across the fleet.")
@click.option(
    "--max-per-domain", type=int, default=None, help="At most this many running in one NVLink domain."
)
@click.pass_context
def create(
    ctx: click.Context, name: str, operations: tuple[str, ...], max_running: int, max_per_domain: int | None
) -> None:
    """Create a budget. It holds new starts only: tasks running already go on.

    \b
    Example:
      rackflow budget create fw --op upgrade-firmware --max-running 8 --max-per-domain 2
    """
    session = pass_session(ctx)
    _show(session, session.client.create_budget(name, operations, max_running, max_per_domain))


@budget.command()
@_ref
@click.pass_context
def show(ctx: click.Context, budget_ref: str) -> None:
    """Show one budget.

    \b
    Example:
      rackflow budget show fw -o yaml
    """
    session = pass_session(ctx)
    _show(session, session.client.get_budget(budget_ref))


@budget.command(name="list")
@click.pass_context
def list_budgets(ctx: click.Context) -> None:
    """List budgets by name.

    \b
    Example:
      rackflow budget list -o json
    """
    session = pass_session(ctx)
    found = session.client.list_budgets()
    session.emit(found, lambda: budgets_table(found.budgets))


@budget.command()
@_ref
@click.option("--name", default=None, help="A new name.")
@click.option(
    "--op", "operations", multiple=True, type=_OPERATIONS, help="Replaces the operations (repeatable)."
)
@click.option("--max-running", type=int, default=None, help="A new fleet-wide cap.")
@click.option("--max-per-domain", type=int, default=None, help="A new per-domain cap.")
@click.option("--no-per-domain-cap", is_flag=True, help="Remove the per-domain cap.")
@click.pass_context
def update(
    ctx: click.Context,
    budget_ref: str,
    name: str | None,
    operations: tuple[str, ...],
    max_running: int | None,
    max_per_domain: int | None,
    no_per_domain_cap: bool,
) -> None:
    """Change a budget. Tasks it held are looked at again at once.

    \b
    Example:
      rackflow budget update fw --max-running 12
      rackflow budget update fw --no-per-domain-cap
    """
    if max_per_domain is not None and no_per_domain_cap:
        raise click.UsageError("give --max-per-domain or --no-per-domain-cap, not both")
    if (
        name is None
        and not operations
        and max_running is None
        and max_per_domain is None
        and not no_per_domain_cap
    ):
        raise click.UsageError("nothing to change")
    session = pass_session(ctx)
    updated = session.client.update_budget(
        budget_ref,
        name=name,
        operations=operations or None,
        max_running=max_running,
        max_per_domain=max_per_domain,
        no_per_domain_cap=no_per_domain_cap,
    )
    _show(session, updated)


@budget.command()
@_ref
@click.pass_context
def delete(ctx: click.Context, budget_ref: str) -> None:
    """Delete a budget; tasks it held start at the next claim if nothing else holds them.

    \b
    Example:
      rackflow budget delete fw
    """
    session = pass_session(ctx)
    session.client.delete_budget(budget_ref)
    session.emit(Empty(), lambda: f"deleted budget {budget_ref}")
