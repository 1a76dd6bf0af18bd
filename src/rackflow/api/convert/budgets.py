"""Operation budget messages to domain values and back. Shape is checked here (operation names, ids);
meaning (at least one operation, caps of at least 1) is the service's."""

from __future__ import annotations

from rackflow.api.convert import timestamp_to, uuid_to
from rackflow.api.convert.windows import operations_from
from rackflow.budgets.service import BudgetInput
from rackflow.domain.budgets import BudgetUsage, OperationBudget
from rackflow.v1 import flow_pb2 as pb


def budget_from(msg: pb.OperationBudget, field: str = "budget") -> BudgetInput:
    return BudgetInput(
        name=msg.name,
        operations=operations_from(msg.operations, f"{field}.operations"),
        max_running=msg.max_running,
        max_running_per_domain=msg.max_running_per_domain if msg.HasField("max_running_per_domain") else None,
    )


def budget_to(budget: OperationBudget, usage: BudgetUsage) -> pb.OperationBudget:
    return pb.OperationBudget(
        id=uuid_to(budget.id),
        name=budget.name,
        operations=sorted(op.value for op in budget.operations),
        max_running=budget.max_running,
        max_running_per_domain=budget.max_running_per_domain,
        created_at=timestamp_to(budget.created_at),
        updated_at=timestamp_to(budget.updated_at),
        running=usage.running,
        running_in_fullest_domain=usage.running_in_fullest_domain,
    )
