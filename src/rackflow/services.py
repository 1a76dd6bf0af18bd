"""The domain services of one rackflow process, built once and shared by the API, executor and dispatcher."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from rackflow.audit.spool import AuditSpool
from rackflow.audit.trail import AuditTrail
from rackflow.budgets.gate import BudgetGate
from rackflow.budgets.service import BudgetService
from rackflow.checks.service import CheckService
from rackflow.clock import Clock
from rackflow.domain.approvals import UNCOUNTED, Approvers
from rackflow.inventory.service import InventoryService
from rackflow.notify.service import NotificationService
from rackflow.rollouts.gate import RolloutGate, hold_stopped
from rackflow.rollouts.service import RolloutService
from rackflow.schedules.approvals import ApprovalService
from rackflow.schedules.service import ScheduleService
from rackflow.store.db import Database
from rackflow.tasks.deferrals import Deferrals
from rackflow.tasks.gates import Gate
from rackflow.tasks.manager import TaskManager
from rackflow.windows.gate import FreezeGate
from rackflow.windows.service import WindowService


@dataclass
class Services:
    db: Database
    clock: Clock
    inventory: InventoryService
    tasks: TaskManager
    schedules: ScheduleService
    rollouts: RolloutService
    approvals: ApprovalService
    audit: AuditTrail
    windows: WindowService
    # What decides again the tasks bound to the windows a change changed; the executor's backstop for the
    # decisions a change still owes (`Deferrals.look_again`).
    deferrals: Deferrals
    budgets: BudgetService
    checks: CheckService
    # The executor's start gates, consulted in this order at each claim (`rackflow.tasks.gates`): a frozen
    # task never takes a budget's room, pre-flight checks ask only about what windows and budgets admit,
    # and a rollout's caps are counted last, over whatever the others let start. A new gate is registered
    # here.
    gates: tuple[Gate, ...]
    notifications: NotificationService

    @property
    def gates_before_checks(self) -> tuple[Gate, ...]:
        """The gates a task passes before the pre-flight gate asks about it: the checker's look ahead asks
        only about tasks these would let start (`rackflow.checks.checker`)."""
        return self.gates[: self.gates.index(self.checks.gate)]

    @classmethod
    def build(
        cls,
        db: Database,
        clock: Clock,
        audit_spool: AuditSpool | None = None,
        *,
        default_start_deadline: timedelta | None = None,
        instance_id: uuid.UUID | None = None,
        approvers: Approvers = UNCOUNTED,
    ) -> Services:
        """The services; `default_start_deadline` (`--default-start-deadline`): the start deadline of a
        schedule without its own; `instance_id`: the process's (its executor's and dispatcher's), whose
        heartbeat vouches for the runs its approvals, manual triggers and retries start; `approvers`: who
        its credentials let approve (`server.approvers_of`; not counted by default). They and `db`
        read one clock: what they stamp and what the database is asked (`Database.now`) must agree, so
        `db` takes `clock` (the server builds both on the same one)."""
        db.clock = clock
        inventory = InventoryService(db, clock)
        tasks = TaskManager(db, clock)
        audit = AuditTrail(db, clock, audit_spool)
        deferrals = Deferrals(tasks, default_start_deadline, hold_stopped)
        windows = WindowService(db, clock, deferrals)
        rollouts = RolloutService(db, clock, tasks, audit)
        schedules = ScheduleService(
            db, clock, tasks, rollouts, default_start_deadline, instance_id, approvers=approvers
        )
        checks = CheckService(db, clock, tasks)
        return cls(
            db=db,
            clock=clock,
            inventory=inventory,
            tasks=tasks,
            schedules=schedules,
            audit=audit,
            windows=windows,
            deferrals=deferrals,
            rollouts=rollouts,
            approvals=ApprovalService(schedules, rollouts),
            budgets=BudgetService(db, clock),
            notifications=NotificationService(db, clock),
            checks=checks,
            gates=(FreezeGate(db), BudgetGate(db), checks.gate, RolloutGate(db)),
        )
