"""Adaptive concurrency's statements: each replica's samples written per window, the leader's
take of them, and the limits (written by the leader, read by every replica). One statement each,
whatever the number of types or attempts."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from lowtide.db import load_queries
from scheduler_service.domain.adaptive import LimitState, SampleRow, Tally
from scheduler_service.rows.adaptive import LimitRow
from scheduler_service.rows.claims import RunningCount
from scheduler_service.store.base import Q as TASK_QUERIES
from scheduler_service.store.base import StoreBase

Q = load_queries("scheduler_service.sql", "adaptive.sql")


class AdaptiveStore(StoreBase):
    async def write_samples(
        self, scheduler_id: str, start: datetime, end: datetime, tallies: Mapping[str, Tally]
    ) -> None:
        if not tallies:
            return
        names = sorted(tallies)
        params: dict[str, Any] = {
            "scheduler_id": scheduler_id,
            "window_start": start,
            "window_end": end,
            "types": names,
            "succeeded": [tallies[n].succeeded for n in names],
            "failed": [tallies[n].failed for n in names],
            "timed_out": [tallies[n].timed_out for n in names],
            "run_ms": [tallies[n].run_ms for n in names],
            "ok_run_ms": [tallies[n].ok_run_ms for n in names],
        }
        await self.db.execute(Q["insert_adaptive_samples"], params)

    async def take_samples(self) -> list[SampleRow]:
        return await self.db.fetch_as(SampleRow, Q["take_adaptive_samples"])

    async def adaptive_limits(self) -> list[LimitRow]:
        return await self.db.fetch_as(LimitRow, Q["adaptive_limits"])

    async def running_by_type(self, types: list[str]) -> dict[str, int]:
        rows = await self.db.fetch_as(RunningCount, TASK_QUERIES["count_running_by_type"], {"types": types})
        return {r.activity_type: r.running for r in rows}

    async def save_limits(self, states: Mapping[str, LimitState]) -> None:
        if not states:
            return
        names = sorted(states)
        s = [states[n] for n in names]
        params: dict[str, Any] = {
            "types": names,
            "limits": [x.limit for x in s],
            "baselines": [x.baseline_ms for x in s],
            "baseline_ats": [x.baseline_at for x in s],
            "slow_starts": [x.slow_start for x in s],
            "latencies": [x.latency_ms for x in s],
            "failure_rates": [x.failure_rate for x in s],
            "samples": [x.samples for x in s],
            "reasons": [x.reason for x in s],
        }
        await self.db.execute(Q["save_adaptive_limits"], params)
