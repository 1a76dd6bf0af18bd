"""Inventory use cases: racks, their components and NVLink domains.

Each request is one transaction: input is validated before it opens, uniqueness is pre-checked inside it
so the error names the clashing value, and a refused request writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from rackflow.audit.changes import note_scope_changes
from rackflow.clock import Clock
from rackflow.domain.bmc import stored_resource_key, target_of
from rackflow.domain.inventory import (
    Component,
    ComponentSpec,
    ComponentType,
    ListedDomain,
    NVLDomain,
    Rack,
)
from rackflow.domain.schedules import ScopeChange
from rackflow.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from rackflow.inventory.bmc import check_bmc
from rackflow.inventory.scope_removal import drop_component_from_scopes
from rackflow.retry import Retry, retrying
from rackflow.store import inventory as store
from rackflow.store import rollouts as run_store
from rackflow.store import scope_removals
from rackflow.store.db import Database
from rackflow.store.paging import Listed
from rackflow.validation import check_name, check_text

log = logging.getLogger(__name__)

# DeleteRack and RemoveComponent tried again after the rack changed meanwhile (`_ChangedMeanwhile`): at
# once, a few times.
_CHANGED_MEANWHILE_RETRY = Retry.every(0.0, attempts=3)


class _ChangedMeanwhile(Unavailable):
    """Between DeleteRack's reads and its lock of the rack, a task ran on the rack (the run of that task is
    not locked yet), or a scope entry was added for it (its schedule is not locked yet):
    `InventoryService.delete_rack`; or, between RemoveComponent's stamp and its lock of the rack, a scope
    entry came to name the component alone (`remove_component`)."""


async def _until_unchanged(
    attempt: Callable[[], Awaitable[list[ScopeChange]]], what: str
) -> list[ScopeChange]:
    """`attempt`'s transaction, tried again at once (a few times) while the rack changed between its reads
    and its lock of the rack (`_ChangedMeanwhile`)."""
    return await retrying(
        attempt, _CHANGED_MEANWHILE_RETRY, what=what, retry_if=lambda exc: isinstance(exc, _ChangedMeanwhile)
    )


def check_component_specs(specs: Sequence[ComponentSpec], field: str) -> list[ComponentSpec]:
    """Validate each spec, and refuse two specs that claim the same (type, external_id), or the same BMC
    resource (`Target.resource_key`: any spelling of it): two components acting on one machine (a copied
    line of a fleet file) would power it off for the other's task, and the rack's conflict rules would not
    see it. A resource another component has already is refused in the transaction
    (`_refuse_taken_bmc_resources`)."""
    first_seen: dict[tuple[ComponentType, str], int] = {}
    resources: dict[str, int] = {}
    for index, spec in enumerate(specs):
        item = f"{field}[{index}]"
        if spec.type is ComponentType.UNKNOWN:
            raise InvalidArgument(f"{item}.type: a component type is required (COMPUTE, NVSWITCH, …)")
        check_name(spec.name, f"{item}.name")
        check_text(spec.external_id, f"{item}.external_id", identifier=True)
        check_text(spec.firmware_version, f"{item}.firmware_version")
        if spec.bmc is not None:
            check_bmc(spec.bmc, f"{item}.bmc")
            target = target_of(spec.bmc, f"{item}.bmc")
            resource = target.resource_key
            if resource in resources:
                raise InvalidArgument(
                    f"{item}.bmc: {target.describe()} is also {field}[{resources[resource]}]'s BMC resource "
                    "(two components would act on one machine)"
                )
            resources[resource] = index
        if spec.external_id:
            key = (spec.type, spec.external_id)
            if key in first_seen:
                raise InvalidArgument(
                    f"{item}.external_id: {spec.type.value} external_id {spec.external_id!r} is given twice "
                    f"(also {field}[{first_seen[key]}])"
                )
            first_seen[key] = index
    return list(specs)


class InventoryService:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        # The whole domain list last read (no page, no filter), with the database's `domain_list_token`
        # read before it: answered again while the token is the same (`list_domains`).
        self._whole_domain_list: tuple[str, list[ListedDomain], int] | None = None

    # --- racks -----------------------------------------------------------------------------------

    async def create_rack(
        self,
        name: str,
        external_id: str = "",
        nvl_domain_id: uuid.UUID | None = None,
        components: Sequence[ComponentSpec] = (),
    ) -> Rack:
        check_name(name, "name")
        check_text(external_id, "external_id", identifier=True)
        specs = check_component_specs(components, "components")
        async with self._race_told_precisely(specs, "components"), self.db.transaction() as conn:
            if await store.racks_by_column(conn, "name", [name]):
                raise AlreadyExists("name", name, "a rack named")
            if external_id and await store.racks_by_column(conn, "external_id", [external_id]):
                raise AlreadyExists("external_id", external_id, "a rack with external_id")
            if nvl_domain_id is not None and not await store.domains_by_column(conn, "id", [nvl_domain_id]):
                raise NotFound(f"nvl_domain_id: no NVLink domain with id {nvl_domain_id}")
            await _refuse_taken_external_ids(conn, specs, "components")
            await _refuse_taken_bmc_resources(conn, specs, "components")
            now = self.clock.now()
            rack_id = await store.insert_rack(
                conn, name=name, external_id=external_id, nvl_domain_id=nvl_domain_id, created_at=now
            )
            await _insert_components(conn, rack_id, specs, now)
            rack = await store.get_rack(conn, rack_id)
        assert rack is not None
        return rack

    async def get_rack(self, rack_id: uuid.UUID) -> Rack:
        async with self.db.read() as conn:
            rack = await store.get_rack(conn, rack_id)
        if rack is None:
            raise NotFound(f"id: no rack with id {rack_id}")
        return rack

    async def get_rack_by_name(self, name: str, field: str = "name") -> Rack:
        """The rack called `name`; NotFound naming `field` and the name otherwise (`rack_id_by_name`'s
        refusals, so the CLI and the dashboard say the same)."""
        check_text(name, field, required=True)
        async with self.db.read() as conn:
            rack = await store.get_rack_by_name(conn, name)
        if rack is None:
            raise NotFound(f"{field}: no rack named {name!r}")
        return rack

    async def list_racks(
        self,
        nvl_domain_id: uuid.UUID | None = None,
        offset: int = 0,
        limit: int | None = None,
        after: Sequence[Any] | None = None,
        ids: Collection[uuid.UUID] | None = None,
        name_contains: str = "",
        with_components: bool = True,
    ) -> tuple[list[Rack], Listed]:
        """A page of racks, oldest first (after the `store.RACK_ORDER` key `after`), and what the list says
        besides (`Listed`: how many match in all, counted up to LIST_COUNT_CAP, then more); of those among
        `ids` alone if given, and of those whose name holds `name_contains`, whatever its case, if given
        (of one or two characters, a page walks a bounded part of the list: it may come back short, even
        empty, and say where it stopped, `Listed.searched_to`); without their components unless
        `with_components`."""
        check_text(name_contains, "name_contains")  # no name holds control characters (nor NUL)
        async with self.db.read() as conn:
            if nvl_domain_id is not None and not await store.domains_by_column(conn, "id", [nvl_domain_id]):
                raise NotFound(f"nvl_domain_id: no NVLink domain with id {nvl_domain_id}")
            return await store.list_racks(
                conn,
                nvl_domain_id=nvl_domain_id,
                offset=offset,
                limit=limit,
                after=after,
                ids=ids,
                name_contains=name_contains,
                with_components=with_components,
            )

    async def names_holding(
        self, kind: str, text: str, limit: int, after: str = ""
    ) -> tuple[list[str], str | None]:
        """At most `limit` names of racks or NVLink domains (`kind`: "racks", "nvl_domains") that hold
        `text`, whatever its case: the one that is `text` first, then the others by name, after the name
        `after` if given (a page on); and the name the next page goes on after, None when the search is
        over (`store.names_holding`: a text of one or two characters looks through a bounded part of the
        names a page, so a page short of `limit`, even empty, may still go on). The schedule form's
        picker asks it as the operator types, where the form listed every rack and domain."""
        table = store.NAMED_TABLES.get(kind)
        if table is None:
            raise NotFound(f"kind: no names of {kind!r} to search ({', '.join(store.NAMED_TABLES)})")
        check_text(text, "contains", required=True)
        check_text(after, "after")
        async with self.db.read() as conn:
            return await store.names_holding(conn, table, text, limit, after or None)

    async def rack_id_by_name(self, name: str, field: str = "name") -> uuid.UUID:
        """The id of the rack called `name`; NotFound naming `field` otherwise."""
        check_text(name, field, required=True)
        async with self.db.read() as conn:
            found = await store.racks_by_column(conn, "name", [name])
        if name not in found:
            raise NotFound(f"{field}: no rack named {name!r}")
        return found[name]

    async def rack_names(self, rack_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The name of each rack that still exists among `rack_ids`."""
        async with self.db.read() as conn:
            return await store.rack_names(conn, rack_ids)

    async def delete_rack(self, rack_id: uuid.UUID) -> None:
        """Delete a rack with its components, past tasks and schedule scopes; refused while it has work.
        The scope entries it removed are logged and told to the call's audit event (`_tell`).

        Lock order (atop `rackflow.tasks.executor`): the rows of the runs it writes (its tasks' runs, whose
        kept counts it marks), then its schedules' (the stamp, `scope_removals`, `FOR NO KEY UPDATE`), then
        the rack's (`FOR UPDATE`). A window's change naming the rack locks a run, then the rack: had
        DeleteRack locked its rack before the runs, each would wait for the other
        (tests/store/test_window_lock_order.py); a retry of a run and a rollout's halt lock a run, then its
        schedule, which DeleteRack's stamp once took before the runs; a scope RPC locks the schedule, then
        the racks it names (tests/store/test_schedule_lock_order.py). Whatever holds the rack meanwhile
        and goes on to the schedule (a journal round or CancelTask ending a task there, marking its
        schedule's failing streak) only checks its key (`FOR KEY SHARE`), which the stamp does not block.
        A task that ran on the rack, or a scope entry added for it, between those reads and the rack's lock
        has a run or a schedule not locked yet: rather than wait for that row while it holds the rack, the
        transaction is rolled back and tried again, which locks it before the rack (`_ChangedMeanwhile`).
        So none of the transactions the lock order maps waits for what it holds while holding what it waits
        for, and a deadlock is not tried again here: should one come, UNAVAILABLE ("try again") tells the
        caller, as for any call."""
        scope_changes = await _until_unchanged(lambda: self._delete_rack(rack_id), f"deleting rack {rack_id}")
        _tell(f"rack {rack_id} deleted", scope_changes)

    async def _delete_rack(self, rack_id: uuid.UUID) -> list[ScopeChange]:
        async with self.db.transaction() as conn:
            runs = await store.runs_of_tasks_on(conn, rack_id)
            await run_store.lock_runs(conn, runs)
            # Its scope entries go with it: their schedules are stamped next, their rows locked after the
            # runs' and before the rack's, the order the scope RPCs take them in (`scope_removals`).
            stamped = await scope_removals.stamp_racks(conn, [rack_id])
            # The row lock makes a concurrent task submission for this rack wait, then fail its FK check.
            if not await store.racks_for_update(self.db, conn, [rack_id]):
                raise NotFound(f"id: no rack with id {rack_id}")
            if await store.has_active_tasks(conn, rack_id):
                raise FailedPrecondition(
                    f"id: rack {rack_id} has waiting, pending or running tasks; cancel them or let them end"
                )
            if not await store.runs_of_tasks_on(conn, rack_id) <= runs:
                raise _ChangedMeanwhile(
                    f"id: a task ran on rack {rack_id} while it was being deleted; try again"
                )
            if not await scope_removals.schedules_on_racks(conn, [rack_id]) <= stamped:
                raise _ChangedMeanwhile(
                    f"id: rack {rack_id} was added to a schedule's scope while it was being deleted; "
                    "try again"
                )
            return await store.delete_rack(conn, rack_id)

    # --- components ------------------------------------------------------------------------------

    async def add_components(self, rack_id: uuid.UUID, specs: Sequence[ComponentSpec]) -> list[Component]:
        """Create components (power state unknown) in an existing rack; returned in the order given."""
        if not specs:
            raise InvalidArgument("components: at least one component is required")
        checked = check_component_specs(specs, "components")
        async with self._race_told_precisely(checked, "components"), self.db.transaction() as conn:
            if not await store.rack_exists(conn, rack_id):
                raise NotFound(f"rack_id: no rack with id {rack_id}")
            await _refuse_taken_external_ids(conn, checked, "components")
            await _refuse_taken_bmc_resources(conn, checked, "components")
            return await _insert_components(conn, rack_id, checked, self.clock.now())

    @contextlib.asynccontextmanager
    async def _race_told_precisely(self, specs: Sequence[ComponentSpec], field: str) -> AsyncIterator[None]:
        """A component whose external id or BMC resource another request took between this one's pre-check
        and its insert is refused by the unique index, whose error knows neither the request's field nor
        who holds the value (`external_id: a component of the same type with one of …`): the pre-check,
        run again now the other request has committed, says it as it would have (`components[1].bmc: a
        component acting on '…' already exists: component 'node-0' (…) of rack 'rack-01'`)."""
        try:
            yield
        except _TakenMeanwhile as race:
            async with self.db.read() as conn:
                await _refuse_taken_external_ids(conn, specs, field)
                await _refuse_taken_bmc_resources(conn, specs, field)
            raise race.error from None  # its holder is gone again: the index's own words

    async def remove_component(self, component_id: uuid.UUID) -> None:
        """Delete a component, unless an active task is working on it; schedules stop naming it.

        As DeleteRack removes the rack's scope entries, a scope entry whose component filter names this
        component loses it, and goes when it named no other: an emptied filter must never read as "all
        components", which would power-cycle the whole rack. What it did to scopes is logged and told to
        the call's audit event (`_tell`).

        Lock order, as DeleteRack's (`delete_rack`): the schedules of the entries it empties (stamped),
        then the rack, then those entries' rows; an entry emptied between the stamp and the rack's lock
        makes it roll back and try again rather than lock that schedule while it holds the rack
        (`_ChangedMeanwhile`, tests/store/test_schedule_lock_order.py).
        """
        scope_changes = await _until_unchanged(
            lambda: self._remove_component(component_id), f"removing component {component_id}"
        )
        _tell(f"component {component_id} removed", scope_changes)

    async def _remove_component(self, component_id: uuid.UUID) -> list[ScopeChange]:
        async with self.db.transaction() as conn:
            component = (await store.components_by_ids(conn, [component_id])).get(component_id)
            if component is None:
                raise NotFound(f"id: no component with id {component_id}")
            # The schedules whose scope entry it empties are stamped before the rack is locked, in the
            # order the scope RPCs take them (`scope_removals`; removing an entry stamps it again).
            stamped = await scope_removals.stamp_emptied_by(conn, component.rack_id, component_id)
            # Lock the rack as task submission does, so no task can pick the component up meanwhile.
            await store.racks_for_update(self.db, conn, [component.rack_id])
            active = await store.active_task_component_ids(conn, component.rack_id)
            busy = sorted(str(task_id) for task_id, ids in active.items() if str(component_id) in ids)
            if busy:
                raise FailedPrecondition(f"id: component {component_id} is in use by active task {busy[0]}")
            # An entry a scope RPC narrowed to this component between the stamp and the rack's lock: its
            # schedule is not locked yet, and is not locked while the rack is held (a scope RPC holding it
            # may wait for the rack). Once the rack is held, no entry can come to name it alone.
            if not await scope_removals.emptied_by(conn, component.rack_id, component_id) <= stamped:
                raise _ChangedMeanwhile(
                    f"id: a schedule's scope came to name component {component_id} alone while it was "
                    "being removed; try again"
                )
            scope_changes = await drop_component_from_scopes(self.db, conn, component)
            await store.delete_component(conn, component_id)
        return scope_changes

    # --- NVLink domains --------------------------------------------------------------------------

    async def create_domain(self, name: str, rack_ids: Sequence[uuid.UUID] = ()) -> NVLDomain:
        """Create a domain and move the given racks (none of which may be in a domain yet) into it."""
        check_name(name, "name")
        first_seen: dict[uuid.UUID, int] = {}
        for index, rack_id in enumerate(rack_ids):
            if rack_id in first_seen:
                raise InvalidArgument(
                    f"rack_ids[{index}]: rack {rack_id} is listed twice "
                    f"(also rack_ids[{first_seen[rack_id]}])"
                )
            first_seen[rack_id] = index
        async with self.db.transaction() as conn:
            if await store.domains_by_column(conn, "name", [name]):
                raise AlreadyExists("name", name, "an NVLink domain named")
            current = await store.racks_for_update(self.db, conn, rack_ids)
            for index, rack_id in enumerate(rack_ids):
                if rack_id not in current:
                    raise NotFound(f"rack_ids[{index}]: no rack with id {rack_id}")
                if current[rack_id] is not None:
                    raise FailedPrecondition(
                        f"rack_ids[{index}]: rack {rack_id} is already in NVLink domain {current[rack_id]}"
                    )
            domain_id = await store.insert_domain(conn, name=name, created_at=self.clock.now())
            await store.assign_domain(conn, domain_id, rack_ids)
            domain = await store.get_domain(conn, domain_id)
        assert domain is not None
        return domain

    async def list_domains(
        self,
        offset: int = 0,
        limit: int | None = None,
        after: Sequence[Any] | None = None,
        ids: Collection[uuid.UUID] | None = None,
        names: Collection[str] | None = None,
    ) -> tuple[list[ListedDomain], int]:
        """A page of domains with their racks, oldest first (after the `store.DOMAIN_ORDER` key `after`),
        their ids as text, and how many match in all (counted up to LIST_COUNT_CAP, then more); of those
        among `ids` or `names` alone if given."""
        async with self.db.read() as conn:
            if not store.asks_every_domain(offset=offset, limit=limit, after=after, ids=ids, names=names):
                return await store.list_domains(
                    conn, offset=offset, limit=limit, after=after, ids=ids, names=names
                )
            return await self._whole_domains(conn)

    async def _whole_domains(self, conn: AsyncConnection) -> tuple[list[ListedDomain], int]:
        """Every domain with its racks, read again only when the domains changed. A fleet of NVL72 racks
        has 20,000 domains, which took 134-206 ms to read and answer on a 2-core machine, and they change
        only when a domain is made or a rack joins, leaves or is deleted (docs/PERFORMANCE.md, "The whole
        domain list kept"). The token is read before the list, so a list kept under a token holds at least
        every change that made it; a change committed between the two reads is in the list and replaces
        the token, so the next call reads it all again. Every instance keeps its own list and every change,
        whichever instance or release made it, replaces the token (migration 0059's triggers)."""
        token = await store.domain_list_token(conn)
        kept = self._whole_domain_list
        if kept is not None and token is not None and kept[0] == token:
            return kept[1], kept[2]
        # Let go of the list kept before reading the next: read while it was still held, the next took
        # 30-37 ms more of CPU (20,000 domains), its objects made in new memory rather than the old's.
        self._whole_domain_list = kept = None
        domains, total = await store.list_domains(conn)
        self._whole_domain_list = None if token is None else (token, domains, total)
        return domains, total

    async def domain_id_by_name(self, name: str, field: str = "name") -> uuid.UUID:
        """The id of the domain called `name` (its unique index); NotFound naming `field` otherwise."""
        check_text(name, field, required=True)
        async with self.db.read() as conn:
            found = await store.domains_by_column(conn, "name", [name])
        if name not in found:
            raise NotFound(f"{field}: no NVLink domain named {name!r}")
        return found[name]

    async def domain_names(self, domain_ids: Collection[uuid.UUID]) -> dict[uuid.UUID, str]:
        """The name of each domain that still exists among `domain_ids`: what a page of racks shows, read
        for its own domains rather than with the whole list."""
        async with self.db.read() as conn:
            return await store.domain_names(conn, domain_ids)

    # --- targets ---------------------------------------------------------------------------------


def _tell(what: str, scope_changes: Sequence[ScopeChange]) -> None:
    """Log, with the schedules' names, the scope entries a committed change removed or narrowed, and note
    them for its audit event, which names each schedule: an operator reading a schedule's history sees
    that a rack or component left its scope, and who caused it."""
    if scope_changes:
        log.info("%s: %s", what, "; ".join(change.describe() for change in scope_changes))
        note_scope_changes(scope_changes)


class _TakenMeanwhile(Exception):
    """The components' insert hit a unique index another request filled after the pre-check (`error`):
    raised through the transaction, which rolls back, to `_race_told_precisely`."""

    def __init__(self, error: AlreadyExists) -> None:
        super().__init__(str(error))
        self.error = error


async def _insert_components(
    conn: AsyncConnection, rack_id: uuid.UUID, specs: Sequence[ComponentSpec], created_at: datetime
) -> list[Component]:
    try:
        return await store.insert_components(conn, rack_id, specs, created_at)
    except AlreadyExists as exc:
        raise _TakenMeanwhile(exc) from None


async def _refuse_taken_external_ids(
    conn: AsyncConnection, specs: Sequence[ComponentSpec], field: str
) -> None:
    taken = await store.components_by_external_ids(conn, [s.external_id for s in specs if s.external_id])
    for index, spec in enumerate(specs):
        if any(c.type is spec.type for c in taken.get(spec.external_id, [])):
            raise AlreadyExists(
                f"{field}[{index}].external_id",
                spec.external_id,
                f"a {spec.type.value} component with external_id",
            )


async def _refuse_taken_bmc_resources(
    conn: AsyncConnection, specs: Sequence[ComponentSpec], field: str
) -> None:
    """Refuse a spec whose BMC resource another component, in any rack, acts on already, naming that
    component and its rack: a power operation on either rack would act on the other's machine, unseen by
    both racks' conflict rules. The unique `components.bmc_resource_key` covers the race this misses."""
    named = [(index, spec.bmc) for index, spec in enumerate(specs) if spec.bmc is not None]
    taken = await store.components_by_bmc_resources(conn, [bmc for _, bmc in named])
    if not taken:
        return
    racks = await store.rack_names(conn, {component.rack_id for component in taken.values()})
    for index, bmc in named:
        holder = taken.get(stored_resource_key(bmc))
        if holder is not None:
            raise AlreadyExists(
                f"{field}[{index}].bmc",
                target_of(bmc).describe(),
                "a component acting on",
                f"component {holder.name!r} ({holder.id}) of rack {racks[holder.rack_id]!r}",
            )
