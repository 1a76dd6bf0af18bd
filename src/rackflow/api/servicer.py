"""The `Flow` servicer: one class assembled from the per-group RPC mixins; and the interceptors it is
served behind."""

from __future__ import annotations

import grpc

from rackflow.api.audit import AuditInterceptor, AuditRpcs
from rackflow.api.auth import AuthInterceptor
from rackflow.api.budgets import BudgetRpcs
from rackflow.api.checks import CheckRpcs
from rackflow.api.decoding import DecodeInterceptor
from rackflow.api.inventory import InventoryRpcs
from rackflow.api.notifications import NotificationRpcs
from rackflow.api.schedules import ScheduleRpcs
from rackflow.api.tasks import TaskRpcs
from rackflow.api.windows import WindowRpcs
from rackflow.security import TokenTable
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


def interceptors(tokens: TokenTable | None, audit: AuditInterceptor) -> list[grpc.aio.ServerInterceptor]:
    """The server's interceptors, outermost first. Authentication runs first, so a caller without a valid
    token learns nothing of its request and the audit sees the caller's principal (a call its role may not
    make is refused there, and recorded by the audit's `record_refusal`); then a request whose bytes do
    not parse is refused, a mutating RPC's recorded as the parser's reason; then the audit records the
    call."""
    return [AuthInterceptor(tokens, audit.record_refusal), DecodeInterceptor(audit.record_refusal), audit]
