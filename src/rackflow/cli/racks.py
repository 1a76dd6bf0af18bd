"""`rackflow rack …`, `rackflow domain …` and `rackflow inventory import|export`."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import click
import yaml
from google.protobuf.empty_pb2 import Empty
from rich.console import Group as Stack
from rich.table import Table

from rackflow.api.convert import MAX_PAGE_SIZE
from rackflow.cli.output import (
    Group,
    Listing,
    Session,
    component_type_name,
    details,
    free_text,
    pass_session,
    table,
    utc_text,
    when,
)
from rackflow.cli.paging import emit_page, every_page, name_filter, page_options, page_title, searched_on
from rackflow.cli.tasks import rack_names
from rackflow.client import NewComponent, RackflowClient, RackflowClientError
from rackflow.domain.inventory import short_search
from rackflow.v1 import flow_pb2 as pb
from rackflow.validation import shown


def parse_component(value: str) -> NewComponent:
    """`TYPE:NAME[:EXTERNAL_ID]` -> a component to create."""
    parts = value.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise click.BadParameter(f"{value!r}: expected TYPE:NAME or TYPE:NAME:EXTERNAL_ID")
    component = NewComponent(*parts)
    try:
        component.to_proto()
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return component


def _components_callback(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> list[NewComponent]:
    return [parse_component(v) for v in values]


_component_option = click.option(
    "--component",
    "components",
    multiple=True,
    metavar="TYPE:NAME[:EXTERNAL_ID]",
    callback=_components_callback,
    help="A component (repeatable); TYPE is COMPUTE, NVSWITCH, POWERSHELF, TORSWITCH, UMS or CDU.",
)


def _type_counts(rack: pb.Rack) -> str:
    counts = Counter(component_type_name(c.type) for c in rack.components)
    return ", ".join(f"{n} {t}" for t, n in sorted(counts.items())) or "-"


def _domain_names(session: Session, racks: Iterable[pb.Rack]) -> dict[str, str]:
    """The names of these racks' domains, by id: a ListNVLDomains by id for each 1,000 of them, where a
    page of racks read every domain (20,000 in a fleet of NVL72 racks)."""
    ids = sorted({r.nvl_domain_id.id for r in racks if r.HasField("nvl_domain_id")})
    names: dict[str, str] = {}
    for start in range(0, len(ids), MAX_PAGE_SIZE):
        asked = ids[start : start + MAX_PAGE_SIZE]
        names.update((d.id.id, d.name) for d in session.client.domains_asked(ids=asked))
    return names


def components_table(components: list[pb.Component]) -> Listing:
    view = table("NAME", "TYPE", "ID", "EXTERNAL ID", "FIRMWARE", "POWER")
    for c in sorted(components, key=lambda c: (component_type_name(c.type), c.name)):
        view.add_row(
            c.name,
            component_type_name(c.type),
            c.id.id,
            c.external_id or "-",
            c.firmware_version or "-",
            c.power_state,
        )
    return view


def rack_view(rack: pb.Rack, domains: dict[str, str]) -> Stack:
    summary = details(
        [
            ("name", rack.name),
            ("id", rack.id.id),
            ("external id", rack.external_id or "-"),
            ("domain", domains.get(rack.nvl_domain_id.id, rack.nvl_domain_id.id or "-")),
            ("created", utc_text(when(rack.created_at))),
            ("components", _type_counts(rack)),
        ]
    )
    return Stack(summary, "", components_table(list(rack.components)))


# --- rack ----------------------------------------------------------------------------------------


@click.group(cls=Group)
def rack() -> None:
    """Racks and their components."""


@rack.command()
@click.argument("name")
@click.option("--external-id", default="", help="The rack's id in your own inventory system.")
@click.option("--domain", default="", metavar="NAME_OR_ID", help="Put the rack in this NVLink domain.")
@_component_option
@click.pass_context
def create(
    ctx: click.Context, name: str, external_id: str, domain: str, components: list[NewComponent]
) -> None:
    """Create a rack, optionally with its components.

    \b
    Example:
      rackflow rack create rack-05 --external-id SN-0005 \\
          --component POWERSHELF:ps-0 --component COMPUTE:node-0:BMC-0042
    """
    session = pass_session(ctx)
    created = session.client.create_rack(name, external_id=external_id, domain=domain, components=components)
    session.emit(created, lambda: rack_view(created, _domain_names(session, [created])))


@rack.command()
@click.argument("rack_ref", metavar="NAME_OR_ID")
@click.pass_context
def show(ctx: click.Context, rack_ref: str) -> None:
    """Show a rack and its components.

    \b
    Example:
      rackflow rack show rack-01 -o yaml
    """
    session = pass_session(ctx)
    found = session.client.get_rack(rack_ref)
    session.emit(found, lambda: rack_view(found, _domain_names(session, [found])))


@rack.command(name="list")
@click.option("--domain", default="", metavar="NAME_OR_ID", help="Only racks in this NVLink domain.")
@name_filter("racks")
@page_options(limit=0, noun="racks", order="oldest first")
@click.pass_context
def list_racks(
    ctx: click.Context, domain: str, name_contains: str, limit: int, offset: int, page_token: str
) -> None:
    """List racks.

    \b
    Example:
      rackflow rack list --domain nvl-a
      rackflow rack list --name-contains gb200 --limit 20
    """
    session = pass_session(ctx)
    walked = short_search(name_contains)  # each page looks through a bounded part of the list: ask on
    # A command that asks for several pages looks the domain up once.
    several = walked or not (limit or offset or page_token)
    domain_ref = session.client.resolve_domain_id(domain) if several and domain else domain

    def page(most: int, token: str, offset: int = offset) -> pb.ListRacksResponse:
        return session.client.list_racks(
            domain=domain_ref, name_contains=name_contains, offset=offset, limit=most, page_token=token
        )

    if walked:
        found = searched_on(session, page, limit, page_token, "racks")
    elif limit or offset or page_token:
        found = page(limit, page_token)
    else:
        found = every_page(session, lambda most, token: page(most, token, 0), "racks", "reading racks")

    def view() -> Listing:
        domains = _domain_names(session, found.racks)
        columns = ("NAME", "ID", "EXTERNAL ID", "DOMAIN", free_text("COMPONENTS"), "CREATED")
        result = table(*columns, title=page_title(len(found.racks), found, "rack"))
        for r in found.racks:
            domain_name = domains.get(r.nvl_domain_id.id, "-")
            created = utc_text(when(r.created_at))
            result.add_row(r.name, r.id.id, r.external_id or "-", domain_name, _type_counts(r), created)
        return result

    emit_page(session, found, view)


@rack.command()
@click.argument("rack_ref", metavar="NAME_OR_ID")
@click.pass_context
def delete(ctx: click.Context, rack_ref: str) -> None:
    """Delete a rack and its components.

    \b
    Example:
      rackflow rack delete rack-05
    """
    session = pass_session(ctx)
    session.client.delete_rack(rack_ref)
    session.emit(Empty(), lambda: f"deleted rack {rack_ref}")


@rack.command(name="add-components")
@click.argument("rack_ref", metavar="NAME_OR_ID")
@_component_option
@click.pass_context
def add_components(ctx: click.Context, rack_ref: str, components: list[NewComponent]) -> None:
    """Add components to a rack.

    \b
    Example:
      rackflow rack add-components rack-01 --component COMPUTE:node-4 --component COMPUTE:node-5
    """
    if not components:
        raise click.UsageError("give at least one --component TYPE:NAME[:EXTERNAL_ID]")
    session = pass_session(ctx)
    added = session.client.add_components(rack_ref, components)
    session.emit(added, lambda: components_table(list(added.components)))


@rack.command(name="remove-component")
@click.argument("component_id", metavar="COMPONENT_ID")
@click.pass_context
def remove_component(ctx: click.Context, component_id: str) -> None:
    """Remove one component (by id) from its rack.

    \b
    Example:
      rackflow rack remove-component 0b6f3c1e-8d2a-4f7e-9c55-3a1d2e4f5a6b
    """
    session = pass_session(ctx)
    session.client.remove_component(component_id)
    session.emit(Empty(), lambda: f"removed component {component_id}")


# --- domain --------------------------------------------------------------------------------------


@click.group(cls=Group)
def domain() -> None:
    """NVLink domains: groups of racks that operations can target together."""


@domain.command(name="create")
@click.argument("name")
@click.option("--rack", "racks", multiple=True, metavar="NAME_OR_ID", help="A member rack (repeatable).")
@click.pass_context
def create_domain(ctx: click.Context, name: str, racks: tuple[str, ...]) -> None:
    """Create an NVLink domain from racks.

    \b
    Example:
      rackflow domain create nvl-b --rack rack-03 --rack rack-04
    """
    session = pass_session(ctx)
    created = session.client.create_domain(name, racks)
    session.emit(created, lambda: domains_table([created], session))


def domains_table(domains: list[pb.NVLDomain], session: Session, title: str | None = None) -> Listing:
    names = rack_names(session, {r.id for d in domains for r in d.rack_ids})
    result = table("NAME", "ID", free_text("RACKS"), title=title)
    for d in domains:
        result.add_row(d.name, d.id.id, ", ".join(names.get(r.id, r.id) for r in d.rack_ids) or "-")
    return result


@domain.command(name="show")
@click.argument("domain_ref", metavar="NAME_OR_ID")
@click.pass_context
def show_domain(ctx: click.Context, domain_ref: str) -> None:
    """Show an NVLink domain and its racks.

    \b
    Example:
      rackflow domain show nvl-a -o json
    """
    session = pass_session(ctx)
    found = session.client.get_domain(domain_ref)
    session.emit(found, lambda: domain_view(found, session))


def domain_view(found: pb.NVLDomain, session: Session) -> Table:
    """Its name, id and racks by name (sorted; an id when the rack is gone)."""
    names = rack_names(session, {r.id for r in found.rack_ids})
    racks = sorted(names.get(r.id, r.id) for r in found.rack_ids)
    return details([("name", found.name), ("id", found.id.id), ("racks", ", ".join(racks) or "-")])


@domain.command(name="list")
@page_options(limit=0, noun="domains", order="oldest first")
@click.pass_context
def list_domains(ctx: click.Context, limit: int, offset: int, page_token: str) -> None:
    """List NVLink domains and their racks.

    \b
    Example:
      rackflow domain list --limit 100 -o json
    """
    session = pass_session(ctx)
    if limit or offset or page_token:
        found = session.client.list_domains(offset=offset, limit=limit, page_token=page_token)
    else:
        found = every_page(
            session,
            lambda most, token: session.client.list_domains(limit=most, page_token=token),
            "domains",
            "reading domains",
        )

    def view() -> Listing:
        shown = list(found.domains)
        return domains_table(shown, session, title=page_title(len(shown), found, "domain"))

    emit_page(session, found, view)


# --- inventory ---------------------------------------------------------------------------------
#
# A fleet file: `domains: [{name}]` and `racks: [{name, external_id?, domain?, components: [{type, name,
# external_id?, firmware_version?, bmc?: {url, resource, credentials}}]}]` (bmc: docs/REDFISH.md). Import
# creates what is missing and skips names that exist, so it can be run again after fixing whatever stopped
# it halfway.

_RACK_KEYS = {"name", "external_id", "domain", "components"}
_COMPONENT_KEYS = {"type", "name", "external_id", "firmware_version", "bmc"}
_BMC_KEYS = ("url", "resource", "credentials")


@dataclass(frozen=True)
class FleetComponent(NewComponent):
    """A fleet file's component: a `NewComponent` that may also name its BMC."""

    bmc: pb.BmcEndpoint | None = None

    def to_proto(self) -> pb.ComponentSpec:
        spec = super().to_proto()
        if self.bmc is not None:
            spec.bmc.CopyFrom(self.bmc)
        return spec


def _bmc(fields: dict[str, Any], where: str) -> pb.BmcEndpoint | None:
    if "bmc" not in fields:
        return None
    entry = _mapping(fields["bmc"], f"{where}.bmc", set(_BMC_KEYS))
    return pb.BmcEndpoint(**{k: _text(entry, k, f"{where}.bmc", required=True) for k in _BMC_KEYS})


@dataclass(frozen=True)
class FleetRack:
    name: str
    external_id: str
    domain: str
    components: tuple[NewComponent, ...]


@dataclass(frozen=True)
class Fleet:
    domains: tuple[str, ...]
    racks: tuple[FleetRack, ...]


def _mapping(value: object, where: str, keys: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r} (expected {', '.join(sorted(keys))})")
    return value


def _text(entry: dict[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = entry.get(key, "")
    if isinstance(value, bool) or not isinstance(value, str | int) or (required and not value):
        wanted = "a non-empty string" if required else "a string (quote numbers like '1.2')"
        raise ValueError(f"{where}.{key}: expected {wanted}, got {value!r}")
    return str(value)


def _list(document: dict[str, Any], key: str) -> list[Any]:
    value = document.get(key) or []
    if not isinstance(value, list):
        raise ValueError(f"{key}: expected a list")
    return value


def parse_fleet(document: object) -> Fleet:
    """Check a whole fleet document before anything is sent; errors name the place (racks[2].name)."""
    top = _mapping(document, "fleet", {"domains", "racks"})
    domains = tuple(
        _text(_mapping(d, f"domains[{i}]", {"name"}), "name", f"domains[{i}]", required=True)
        for i, d in enumerate(_list(top, "domains"))
    )
    racks = []
    for i, item in enumerate(_list(top, "racks")):
        where = f"racks[{i}]"
        entry = _mapping(item, where, _RACK_KEYS)
        components = []
        for j, c in enumerate(entry.get("components") or []):
            spot = f"{where}.components[{j}]"
            fields = _mapping(c, spot, _COMPONENT_KEYS)
            texts = {
                k: _text(fields, k, spot, required=k in ("type", "name"))
                for k in ("type", "name", "external_id", "firmware_version")
            }
            bmc = _bmc(fields, spot)
            component = NewComponent(**texts) if bmc is None else FleetComponent(**texts, bmc=bmc)
            try:
                component.to_proto()
            except ValueError as exc:
                raise ValueError(f"{spot}.type: {exc}") from None
            components.append(component)
        rack_domain = _text(entry, "domain", where)
        if rack_domain and rack_domain not in domains:
            raise ValueError(f"{where}.domain: {rack_domain!r} is not listed under domains")
        name = _text(entry, "name", where, required=True)
        racks.append(FleetRack(name, _text(entry, "external_id", where), rack_domain, tuple(components)))
    for names, kind in ((domains, "domain"), ([r.name for r in racks], "rack")):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"{kind} {repeated[0]!r} is listed twice")
    return Fleet(domains, tuple(racks))


@dataclass
class ImportResult:
    """What an import did; when the server refused a step, which one, why, and the steps never sent, so
    an operator who stops there knows the inventory's state and that re-running the file resumes."""

    created: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # the created steps' names ("rack rack-02"), in order
    refused_step: str = ""
    refused: RackflowClientError | None = None
    not_attempted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"created": self.created, "skipped": self.skipped}
        if self.refused is not None:
            answer["refused"] = {
                "step": self.refused_step,
                "code": self.refused.code.name,
                "message": self.refused.message,
            }
            answer["not_attempted"] = self.not_attempted
        return answer

    def refusal(self) -> str:
        """The lines for stderr: the refused step and why, what was created before it, what was not sent,
        and how to resume."""
        assert self.refused is not None

        def listed(steps: list[str]) -> str:
            kinds = Counter(step.split(" ", 1)[0] for step in steps)
            counts = ", ".join(f"{n} {kind}{'' if n == 1 else 's'}" for kind, n in kinds.items())
            return f"{counts} ({', '.join(steps)})" if steps else "none"

        return shown(
            f"error: {self.refused_step} refused: {self.refused}\n"
            f"created before it: {listed(self.done)}; not attempted: {listed(self.not_attempted)}\n"
            "fix the file or the inventory and run the same import again: what exists by name is skipped"
        )


def _uncounted(_total: int) -> AbstractContextManager[Callable[[int], None]]:
    return nullcontext(lambda _n: None)


def import_fleet(
    plan: Fleet,
    client: RackflowClient,
    progress: Callable[[int], AbstractContextManager[Callable[[int], None]]] = _uncounted,
) -> ImportResult:
    """Create the missing racks, then the missing domains with their member racks; skip existing names.

    Each rack and domain is its own call, so a refusal part-way leaves the earlier ones created: the
    import stops there and the result says what was created, what was refused and what was never sent.
    """
    result = ImportResult()
    rack_ids = {r.name: r.id.id for r in client.all_racks()}
    domain_ids = {d.name: d.id.id for d in client.all_domains()}

    def create_rack(entry: FleetRack) -> str:
        created = client.create_rack(
            entry.name,
            external_id=entry.external_id,
            domain=domain_ids.get(entry.domain, ""),
            components=entry.components,
        )
        rack_ids[entry.name] = created.id.id
        return f"rack {entry.name} ({len(created.components)} components)"

    def create_domain(name: str) -> str:
        members = [rack_ids[r.name] for r in plan.racks if r.domain == name]
        client.create_domain(name, members)
        return f"domain {name} ({len(members)} racks)"

    steps: list[tuple[str, Callable[[], str]]] = []
    for entry in plan.racks:
        if entry.name in rack_ids:
            result.skipped.append(f"rack {entry.name}")
        else:
            steps.append((f"rack {entry.name}", partial(create_rack, entry)))
    for name in plan.domains:
        if name in domain_ids:
            result.skipped.append(f"domain {name}")
        else:
            steps.append((f"domain {name}", partial(create_domain, name)))
    with progress(len(steps)) as advance:
        for i, (step, create) in enumerate(steps):
            try:
                result.created.append(create())
            except RackflowClientError as exc:
                result.refused_step, result.refused = step, exc
                result.not_attempted = [later for later, _ in steps[i + 1 :]]
                break
            result.done.append(step)
            advance(1)
    return result


def export_fleet(client: RackflowClient) -> dict[str, Any]:
    """The fleet as a document `parse_fleet` accepts; empty fields are left out."""
    domains = {d.id.id: d.name for d in client.all_domains()}
    racks = []
    for r in client.all_racks():
        components = [
            {"type": component_type_name(c.type), "name": c.name}
            | ({"external_id": c.external_id} if c.external_id else {})
            | ({"firmware_version": c.firmware_version} if c.firmware_version else {})
            | ({"bmc": {k: getattr(c.bmc, k) for k in _BMC_KEYS}} if c.HasField("bmc") else {})
            for c in r.components
        ]
        entry: dict[str, Any] = {"name": r.name}
        if r.external_id:
            entry["external_id"] = r.external_id
        if r.nvl_domain_id.id in domains:
            entry["domain"] = domains[r.nvl_domain_id.id]
        racks.append(entry | {"components": components})
    return {"domains": [{"name": n} for n in domains.values()], "racks": racks}


@click.group(cls=Group)
def inventory() -> None:
    """Load or save a whole fleet (racks, components, NVLink domains) as YAML or JSON."""


@inventory.command(name="import")
@click.argument("path", metavar="FILE", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def import_command(ctx: click.Context, path: Path) -> None:
    """Create the racks and NVLink domains of a fleet file (YAML or JSON).

    The whole file is checked before anything is created. Safe to run again: a rack or domain whose name
    already exists is skipped with a note (its components are neither compared nor changed).

    Each rack and domain is created on its own. When the server refuses one (a name taken, a BMC
    resource already another component's), the import stops there and exits 1: it lists what was
    created before it, the refused one and why, and what was not attempted. Fix the cause and run the
    same file again to resume; what was created is skipped by name.

    \b
    Example:
      rackflow inventory import examples/fleet.yaml
    """
    session = pass_session(ctx)
    try:
        plan = parse_fleet(yaml.safe_load(path.read_text()))
    except (yaml.YAMLError, ValueError) as exc:
        raise click.BadParameter(str(exc), param_hint=str(path)) from None
    result = import_fleet(plan, session.client, partial(session.progress, "importing racks and domains"))

    def view() -> str:
        lines = [f"created {what}" for what in result.created]
        lines += [f"[dim]skipped {what}: the name exists[/]" for what in result.skipped]
        return shown("\n".join(lines)) or "nothing to import"

    if result.refused is None or result.created or result.skipped or not session.for_people:
        session.emit(result.to_dict(), view)
    if result.refused is not None:
        click.echo(result.refusal(), err=True)
        ctx.exit(1)


@inventory.command(name="export")
@click.pass_context
def export_command(ctx: click.Context) -> None:
    """Print the fleet as YAML (or JSON with -o json), in the format `inventory import` reads.

    \b
    Example:
      rackflow inventory export > fleet-backup.yaml
    """
    session = pass_session(ctx)
    document = export_fleet(session.client)
    if session.output == "json":
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(yaml.safe_dump(document, sort_keys=False), nl=False)
