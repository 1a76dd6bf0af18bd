"""The `Flow` servicer: one class assembled from the per-group RPC mixins."""

from __future__ import annotations

from rackflow.api.audit import AuditRpcs
from rackflow.api.budgets import BudgetRpcs
from rackflow.api.checks import CheckRpcs
from rackflow.api.inventory import InventoryRpcs
from rackflow.api.notifications import NotificationRpcs
from rackflow.api.schedules import ScheduleRpcs
from rackflow.api.tasks import TaskRpcs
from rackflow.api.windows import WindowRpcs
from rackflow.services import Services
from rackflow.v1 import flow_pb2_grpc


class FlowServicer(
    InventoryRpcs,
    TaskRpcs,
    ScheduleRpcs,
    WindowRpcs,
    BudgetRpcs,
    NotificationRpcs,
    CheckRpcs,
    AuditRpcs,
    flow_pb2_grpc.FlowServicer,
):
    def __init__(self, services: Services) -> None:
        self.services = services
