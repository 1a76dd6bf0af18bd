"""The rollout driver: the loop in every `rackflow serve` with the dispatcher that keeps rolling runs
moving (starts scopes as tasks end and bake times pass, halts, completes).

Every instance runs it; a step takes only runs no other instance is stepping (`FOR UPDATE SKIP LOCKED`),
so instances share the work and a dead one's runs go on at the others' next step. A full batch means more
runs may be rolling: the loop steps again at once instead of sleeping.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from rackflow.clock import sleep_unless_stopped
from rackflow.config import ROLLOUT_STEP_BATCH, ROLLOUT_STEP_INTERVAL
from rackflow.rollouts.service import RolloutService

log = logging.getLogger(__name__)


class RolloutDriver:
    def __init__(
        self,
        rollouts: RolloutService,
        *,
        interval: timedelta = ROLLOUT_STEP_INTERVAL,
        batch: int = ROLLOUT_STEP_BATCH,
    ) -> None:
        self.rollouts = rollouts
        self.interval = interval
        self.batch = batch

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                step = await self.rollouts.advance(limit=self.batch)
            except Exception:  # an outage or a bug: report it and step again next interval
                log.exception("rollout step failed")
            else:
                if step.runs >= self.batch:
                    continue
            await sleep_unless_stopped(stop, self.interval)
