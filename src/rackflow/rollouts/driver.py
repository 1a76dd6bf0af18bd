"""The rollout driver: the loop in every `rackflow serve` with the dispatcher that keeps rolling runs
moving (starts scopes as tasks end and bake times pass, halts, completes).

Every instance runs it; a step takes only runs no other instance is stepping (`FOR UPDATE SKIP LOCKED`),
so instances share the work and a dead one's runs go on at the others' next step. A full batch means more
runs may be rolling: the loop steps again at once instead of sleeping.

With no run rolling anywhere (the usual case) it looks only every `idle_interval`, not every second
(docs/PERFORMANCE.md, "An idle server"): a run starts rolling only in a step of given runs (a firing's
first, a resume: `RolloutService.advance`), which wakes the driver of the process that takes it, so that
driver takes the next steps as at once as before; the others find it at their next idle look, which is
what bounds taking over a rollout whose instance stopped.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from rackflow import logs
from rackflow.clock import sleep_unless_woken
from rackflow.config import ROLLOUT_IDLE_INTERVAL, ROLLOUT_STEP_BATCH, ROLLOUT_STEP_INTERVAL
from rackflow.rollouts.service import RolloutService

log = logging.getLogger(__name__)


class RolloutDriver:
    def __init__(
        self,
        rollouts: RolloutService,
        *,
        interval: timedelta = ROLLOUT_STEP_INTERVAL,
        idle_interval: timedelta = ROLLOUT_IDLE_INTERVAL,
        batch: int = ROLLOUT_STEP_BATCH,
    ) -> None:
        self.rollouts = rollouts
        self.interval = interval
        self.idle_interval = idle_interval
        self.batch = batch
        self._woken = asyncio.Event()

    def wake(self) -> None:
        self._woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        self.rollouts.on_rolling.append(self.wake)
        try:
            while not stop.is_set():
                self._woken.clear()  # a run that starts rolling from now on is seen or wakes the nap
                pause = self.interval
                try:
                    step = await self.rollouts.advance(limit=self.batch)
                except Exception:  # an outage or a bug: report it and step again next interval
                    logs.failed(log, "rollout step failed", then="; retrying")
                else:
                    if step.runs >= self.batch:
                        continue
                    if not step.rolling:
                        pause = self.idle_interval
                await sleep_unless_woken(stop, self._woken, pause.total_seconds())
        finally:
            self.rollouts.on_rolling.remove(self.wake)
