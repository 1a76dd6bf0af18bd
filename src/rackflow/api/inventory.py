"""Inventory RPCs: convert the request, delegate to the inventory service, convert the answer back."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from google.protobuf.empty_pb2 import Empty
from grpc.aio import ServicerContext as Context

from rackflow.api.convert import next_page_token, page_from, required_uuid, total_to, uuid_from
from rackflow.api.convert.inventory import (
    basic_rack_view_from,
    component_specs_from,
    components_into,
    domain_to,
    listed_domains_into,
    listed_ids_from,
    listed_names_from,
    rack_ref_from,
    rack_to,
    racks_into,
    uuids_from,
)
from rackflow.api.errors import rpc
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:
    from rackflow.services import Services


class InventoryRpcs:
    """The inventory part of the `Flow` servicer."""

    services: Services

    @rpc
    async def CreateRack(self, request: pb.CreateRackRequest, context: Context) -> pb.Rack:
        rack = await self.services.inventory.create_rack(
            name=request.name,
            external_id=request.external_id,
            nvl_domain_id=uuid_from(request.nvl_domain_id, "nvl_domain_id", required=False),
            components=component_specs_from(request.components),
        )
        return rack_to(rack)

    @rpc
    async def GetRack(self, request: pb.GetRackRequest, context: Context) -> pb.Rack:
        ref = rack_ref_from(request)
        if isinstance(ref, str):
            return rack_to(await self.services.inventory.get_rack_by_name(ref))
        return rack_to(await self.services.inventory.get_rack(ref))

    @rpc
    async def ListRacks(self, request: pb.ListRacksRequest, context: Context) -> pb.ListRacksResponse:
        domain_id = (
            required_uuid(request.nvl_domain_id, "nvl_domain_id")
            if request.HasField("nvl_domain_id")
            else None
        )
        page = page_from(request.pagination if request.HasField("pagination") else None, "ListRacks")
        racks, listed = await self.services.inventory.list_racks(
            domain_id,
            page.offset,
            page.limit,
            page.after,
            ids=listed_ids_from(request.ids) or None,
            name_contains=request.name_contains,
            with_components=not basic_rack_view_from(request.view),
        )
        total, capped = total_to(listed.total, bounded=listed.count_bounded)
        response = pb.ListRacksResponse(
            total=total,
            total_capped=capped,
            next_page_token=next_page_token(
                "ListRacks", page.limit, racks, lambda r: (r.created_at, r.id), listed.searched_to
            ),
        )
        racks_into(response.racks, racks)
        return response

    @rpc
    async def DeleteRack(self, request: pb.DeleteRackRequest, context: Context) -> Empty:
        await self.services.inventory.delete_rack(required_uuid(request.id, "id"))
        return Empty()

    @rpc
    async def AddComponents(
        self, request: pb.AddComponentsRequest, context: Context
    ) -> pb.AddComponentsResponse:
        rack_id = required_uuid(request.rack_id, "rack_id")
        added = await self.services.inventory.add_components(
            rack_id, component_specs_from(request.components)
        )
        response = pb.AddComponentsResponse()
        components_into(response.components, rack_id, added)
        return response

    @rpc
    async def RemoveComponent(self, request: pb.RemoveComponentRequest, context: Context) -> Empty:
        await self.services.inventory.remove_component(required_uuid(request.id, "id"))
        return Empty()

    @rpc
    async def CreateNVLDomain(self, request: pb.CreateNVLDomainRequest, context: Context) -> pb.NVLDomain:
        rack_ids = uuids_from(request.rack_ids, "rack_ids")
        return domain_to(await self.services.inventory.create_domain(request.name, rack_ids))

    @rpc
    async def ListNVLDomains(
        self, request: pb.ListNVLDomainsRequest, context: Context
    ) -> pb.ListNVLDomainsResponse:
        page = page_from(request.pagination if request.HasField("pagination") else None, "ListNVLDomains")
        domains, counted = await self.services.inventory.list_domains(
            page.offset,
            page.limit,
            page.after,
            ids=listed_ids_from(request.ids) or None,
            names=listed_names_from(request.names) or None,
        )
        total, capped = total_to(counted)
        response = pb.ListNVLDomainsResponse(
            total=total,
            total_capped=capped,
            next_page_token=next_page_token(
                "ListNVLDomains", page.limit, domains, lambda d: (d.created_at, uuid.UUID(d.id))
            ),
        )
        listed_domains_into(response.domains, domains)
        return response
