"""Task RPCs: the operation submitters, ListTasks, GetTasksByIDs and CancelTask."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rackflow.services import Services


class TaskRpcs:
    services: Services
