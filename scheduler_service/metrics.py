"""The scheduler's metrics.

Queue figures come from one grouped query every `metrics_interval` (never per claim) and are
split here into claimable and held work, so a long wait for a cheap window shows as held depth,
not as a backlog: a dashboard or alert on `lowtide_queue_depth` / `lowtide_queue_oldest_pending_age`
never mistakes deferred work for a capacity incident.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta

from opentelemetry.metrics import CallbackOptions, Observation

from lowtide.errors import DatabaseUnavailable
from lowtide.metrics import Metrics
from scheduler_service.cost import CostHolds
from scheduler_service.sessions import Registry
from scheduler_service.store import Store

log = logging.getLogger("lowtide.scheduler.metrics")


@dataclass
class QueueFigures:
    depth: int = 0
    oldest_pending_age: float = 0.0
    held_depth: int = 0
    oldest_held_age: float = 0.0
    running: int = 0


@dataclass
class Snapshot:
    queues: dict[str, QueueFigures] = field(default_factory=dict)


class SchedulerMetrics:
    def __init__(
        self, metrics: Metrics, *, store: Store, registry: Registry, holds: CostHolds, parked: Callable[[], int]
    ) -> None:
        self.metrics = metrics
        self._parked_count = parked
        self._store = store
        self._registry = registry
        self._holds = holds
        self.snapshot = Snapshot()
        meter = metrics.meter
        self.dispatched = meter.create_counter(
            "lowtide.tasks.dispatched", unit="{task}", description="Attempts dispatched to workers"
        )
        self.finished = meter.create_counter(
            "lowtide.tasks.finished", unit="{task}", description="Attempts ended, by what followed (state)"
        )
        self.rejected = meter.create_counter(
            "lowtide.reports.rejected", unit="{report}", description="Worker reports refused as stale"
        )
        gauges = [
            ("lowtide.queue.depth", "{task}", "Pending tasks a worker could claim now (held ones apart)", "depth"),
            ("lowtide.queue.oldest_pending_age", "s", "Age of the oldest claimable pending task", "oldest_pending_age"),
            ("lowtide.queue.held_depth", "{task}", "Pending tasks held by a cost hold", "held_depth"),
            ("lowtide.queue.oldest_held_age", "s", "Age of the oldest held task", "oldest_held_age"),
            ("lowtide.queue.running", "{task}", "Running attempts", "running"),
        ]
        for name, unit, description, attribute in gauges:
            meter.create_observable_gauge(
                name, callbacks=[self._queue_callback(attribute)], unit=unit, description=description
            )
        meter.create_observable_gauge(
            "lowtide.cost_hold", callbacks=[self._cost_hold], unit="1", description="1 while a cost hold is active"
        )
        meter.create_observable_gauge(
            "lowtide.workers.connected", callbacks=[self._workers], unit="{worker}", description="Connected workers"
        )
        meter.create_observable_gauge(
            "lowtide.dispatch.parked",
            callbacks=[self._parked],
            unit="{reference}",
            description="Dispatch references of held types waiting for hold_recheck",
        )

    def _queue_callback(self, attribute: str):  # type: ignore[no-untyped-def]
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for queue, figures in self.snapshot.queues.items():
                yield Observation(getattr(figures, attribute), {"queue": queue})

        return observe

    def _queues_with_holds(self) -> Iterable[str]:
        return set(self.snapshot.queues) | set(self._holds.config.per_queue or {})

    def _cost_hold(self, options: CallbackOptions) -> Iterable[Observation]:
        for queue in sorted(self._queues_with_holds()):
            held = bool(self._holds.config.for_queue(queue)) and self._holds.state.active
            yield Observation(1 if held else 0, {"queue": queue, "signal": self._holds.signal_name})

    def _workers(self, options: CallbackOptions) -> Iterable[Observation]:
        pools: dict[str, int] = {}
        for session in self._registry:
            pools[session.pool] = pools.get(session.pool, 0) + 1
        for pool, count in pools.items():
            yield Observation(count, {"pool": pool})

    def _parked(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._parked_count())

    async def refresh(self) -> None:
        queues: dict[str, QueueFigures] = {}
        running = await self._store.running_by_queue()
        for row in await self._store.pending_by_queue_and_type():
            figures = queues.setdefault(row["queue"], QueueFigures())
            held = row["kind"] == "activity" and row["activity_type"] in self._holds.held_for(row["queue"])
            if held:
                figures.held_depth += row["depth"]
                figures.oldest_held_age = max(figures.oldest_held_age, row["oldest_age"])
            else:
                figures.depth += row["depth"]
                figures.oldest_pending_age = max(figures.oldest_pending_age, row["oldest_age"])
        for queue, count in running.items():
            queues.setdefault(queue, QueueFigures()).running = count
        self.snapshot = Snapshot(queues)

    async def run(self, interval: timedelta) -> None:
        while True:
            try:
                await self.refresh()
            except DatabaseUnavailable as error:
                log.warning("metrics.refresh_failed", extra={"error": str(error)})
            await asyncio.sleep(interval.total_seconds())
