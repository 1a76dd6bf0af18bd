"""Operation budget RPCs: validate, convert, delegate, convert back."""

from __future__ import annotations

from typing import TYPE_CHECKING

from google.protobuf.empty_pb2 import Empty
from grpc.aio import ServicerContext as Context

from rackflow.api.convert import required_uuid
from rackflow.api.convert.budgets import budget_from, budget_to
from rackflow.api.errors import rpc
from rackflow.domain.budgets import OperationBudget
from rackflow.v1 import flow_pb2 as pb

if TYPE_CHECKING:
    from rackflow.services import Services


class BudgetRpcs:
    """The operation-budget part of the `Flow` servicer."""

    services: Services

    @rpc
    async def CreateOperationBudget(
        self, request: pb.CreateOperationBudgetRequest, context: Context
    ) -> pb.OperationBudget:
        return await self._with_usage(await self.services.budgets.create(budget_from(request.budget)))

    @rpc
    async def GetOperationBudget(
        self, request: pb.GetOperationBudgetRequest, context: Context
    ) -> pb.OperationBudget:
        return await self._with_usage(await self.services.budgets.get(required_uuid(request.id, "id")))

    @rpc
    async def ListOperationBudgets(
        self, request: pb.ListOperationBudgetsRequest, context: Context
    ) -> pb.ListOperationBudgetsResponse:
        budgets = await self.services.budgets.with_usage()
        return pb.ListOperationBudgetsResponse(budgets=[budget_to(b, usage) for b, usage in budgets])

    @rpc
    async def UpdateOperationBudget(
        self, request: pb.UpdateOperationBudgetRequest, context: Context
    ) -> pb.OperationBudget:
        budget_id = required_uuid(request.id, "id")
        given = budget_from(request.budget)
        return await self._with_usage(
            await self.services.budgets.update(budget_id, list(request.update_mask.paths), given)
        )

    async def _with_usage(self, budget: OperationBudget) -> pb.OperationBudget:
        """`budget` as returned: with how full it is now."""
        return budget_to(budget, await self.services.budgets.usage(budget))

    @rpc
    async def DeleteOperationBudget(
        self, request: pb.DeleteOperationBudgetRequest, context: Context
    ) -> Empty:
        await self.services.budgets.delete(required_uuid(request.id, "id"))
        return Empty()
